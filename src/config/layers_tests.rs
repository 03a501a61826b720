//! Unit tests of the layered settings: per rail, and NCCL's variables as defaults.

use super::*;
use crate::fabric::verbs::{AddrFamily, AddrRange, GidType};

fn parse(vars: &[(&str, &str)]) -> std::result::Result<Config, Vec<String>> {
    Config::from_vars(vars.iter().copied())
}

fn ok(vars: &[(&str, &str)]) -> Config {
    parse(vars).unwrap_or_else(|e| panic!("{vars:?}: {e:?}"))
}

fn one_error(vars: &[(&str, &str)]) -> String {
    let e = parse(vars).expect_err("must be rejected");
    assert_eq!(e.len(), 1, "{e:?}");
    e[0].clone()
}

/// One setting that follows an NCCL variable: its `VARS` name, its NCCL variable, a value of
/// each that is valid and what it gives (as the INFO line shows it), a value of each that is
/// not.
struct Case {
    setting: &'static str,
    nccl: &'static str,
    nccl_value: &'static str,
    mpib_value: &'static str,
    bad_nccl: &'static str,
    bad_mpib: &'static str,
    /// The effective value for `rail` (2: the plugin-wide one), as text.
    get: fn(&Config, usize) -> String,
}

fn opt(v: Option<u8>) -> String {
    v.map_or("none".to_string(), |v| v.to_string())
}

fn cases() -> Vec<Case> {
    vec![
        Case {
            setting: "MPIB_QP",
            nccl: "NCCL_IB_QPS_PER_CONNECTION",
            nccl_value: "4",
            mpib_value: "2",
            bad_nccl: "17",
            bad_mpib: "0",
            get: |c, r| c.rails[r].qps.to_string(),
        },
        Case {
            setting: "MPIB_QP_STRIPE",
            nccl: "NCCL_IB_SPLIT_DATA_ON_QPS",
            nccl_value: "1",
            mpib_value: "0",
            bad_nccl: "on",
            bad_mpib: "2",
            get: |c, r| (c.rails[r].stripe as u8).to_string(),
        },
        Case {
            setting: "MPIB_TC",
            nccl: "NCCL_IB_TC",
            nccl_value: "106",
            mpib_value: "41",
            bad_nccl: "256",
            bad_mpib: "0x10",
            get: |c, r| opt(c.rails[r].tc),
        },
        Case {
            setting: "MPIB_CTS_TC",
            nccl: "NCCL_IB_FIFO_TC",
            nccl_value: "0xd0",
            mpib_value: "208",
            bad_nccl: "high",
            bad_mpib: "-2",
            get: |c, r| opt(c.rails[r].cts_tc),
        },
        Case {
            setting: "MPIB_SL",
            nccl: "NCCL_IB_SL",
            nccl_value: "3",
            mpib_value: "5",
            bad_nccl: "16",
            bad_mpib: "16",
            get: |c, r| opt(c.rails[r].sl),
        },
        Case {
            setting: "MPIB_GID_INDEX",
            nccl: "NCCL_IB_GID_INDEX",
            nccl_value: "3",
            mpib_value: "7",
            bad_nccl: "256",
            bad_mpib: "x",
            get: |c, r| opt(c.rails[r].gid.index),
        },
        Case {
            setting: "MPIB_ROCE_VERSION",
            nccl: "NCCL_IB_ROCE_VERSION_NUM",
            nccl_value: "1",
            mpib_value: "2",
            bad_nccl: "3",
            bad_mpib: "v2",
            get: |c, r| format!("{:?}", c.rails[r].gid.version),
        },
        Case {
            setting: "MPIB_ADDR_FAMILY",
            nccl: "NCCL_IB_ADDR_FAMILY",
            nccl_value: "AF_INET6",
            mpib_value: "af_inet",
            bad_nccl: "af_inet6",
            bad_mpib: "ipv6",
            get: |c, r| c.rails[r].gid.family.name().to_string(),
        },
        Case {
            setting: "MPIB_ADDR_RANGE",
            nccl: "NCCL_IB_ADDR_RANGE",
            nccl_value: "10.1.0.0/16",
            mpib_value: "192.0.2.0/24",
            bad_nccl: "10.1.0.0",
            bad_mpib: "10.0.0.0/33",
            get: |c, r| c.rails[r].gid.range.map_or("any".into(), |a| a.to_string()),
        },
        Case {
            setting: "MPIB_TIMEOUT",
            nccl: "NCCL_IB_TIMEOUT",
            nccl_value: "22",
            mpib_value: "18",
            bad_nccl: "0",
            bad_mpib: "32",
            get: |c, _| c.timeout.to_string(),
        },
        Case {
            setting: "MPIB_RETRY_CNT",
            nccl: "NCCL_IB_RETRY_CNT",
            nccl_value: "5",
            mpib_value: "3",
            bad_nccl: "8",
            bad_mpib: "seven",
            get: |c, _| c.retry_cnt.to_string(),
        },
        Case {
            setting: "MPIB_PCI_RELAXED_ORDERING",
            nccl: "NCCL_IB_PCI_RELAXED_ORDERING",
            nccl_value: "0",
            mpib_value: "1",
            bad_nccl: "3",
            bad_mpib: "on",
            get: |c, _| format!("{:?}", c.relaxed_ordering),
        },
        Case {
            setting: "MPIB_DMABUF",
            nccl: "NCCL_DMABUF_ENABLE",
            nccl_value: "0",
            mpib_value: "1",
            bad_nccl: "no",
            bad_mpib: "2",
            get: |c, _| c.dmabuf.to_string(),
        },
        Case {
            setting: "MPIB_PKEY",
            nccl: "NCCL_IB_PKEY",
            nccl_value: "0x2",
            mpib_value: "3",
            bad_nccl: "65536",
            bad_mpib: "-1",
            get: |c, _| c.pkey_index.to_string(),
        },
    ]
}

/// The rails a case's setting applies to: both, or the plugin (2).
fn rails_of(c: &Case) -> Vec<usize> {
    if vars::doc(c.setting).rails.is_some() { vec![0, 1] } else { vec![2] }
}

#[test]
fn every_followed_variable_nccls_alone_mpibs_alone_both_and_bad_values() {
    let cases = cases();
    // Every setting VARS says follows an NCCL variable is a case here (MPIB_HCA and the soft
    // addresses have tests of their own).
    for v in VARS.iter().filter(|v| !v.nccl.is_empty()) {
        let covered = cases.iter().any(|c| c.setting == v.name && c.nccl == v.nccl);
        let own = ["MPIB_HCA", "MPIB_SOFT_SOUT_ADDR", "MPIB_SOFT_SUP_ADDR"].contains(&v.name);
        assert!(covered || own, "{} follows {} and has no case", v.name, v.nccl);
    }
    for c in &cases {
        let extra: &[(&str, &str)] = &[];
        let default = Config::default();
        for rail in rails_of(c) {
            let at = |cfg: &Config| (c.get)(cfg, rail.min(1));
            let origin = |cfg: &Config| cfg.origin(c.setting, rail);
            // NCCL's alone: its value, from it.
            let with = |vars: &[(&'static str, &'static str)]| ok(&[extra, vars].concat());
            let n = with(&[(c.nccl, c.nccl_value)]);
            assert_ne!(at(&n), at(&default), "{}={} changes nothing", c.nccl, c.nccl_value);
            assert_eq!(origin(&n), c.nccl, "{}", c.setting);
            // mpib's alone.
            let m = with(&[(c.setting, c.mpib_value)]);
            assert_eq!(origin(&m), c.setting);
            // Both: mpib's wins, in either order.
            let b = with(&[(c.nccl, c.nccl_value), (c.setting, c.mpib_value)]);
            assert_eq!((at(&b), origin(&b)), (at(&m), c.setting), "{} wins over {}", c.setting, c.nccl);
            let b = with(&[(c.setting, c.mpib_value), (c.nccl, c.nccl_value)]);
            assert_eq!(origin(&b), c.setting);
            // Neither: the default.
            assert_eq!((at(&ok(extra)), origin(&ok(extra))), (at(&default), "default"));
            // NCCL's empty value is unset, as NCCL reads it.
            assert_eq!(origin(&with(&[(c.nccl, "")])), "default");
        }
        // A bad value of either is an error naming it; a bad NCCL value also says what
        // overrides it. Under a valid mpib value a bad NCCL value is not used: no error.
        let e = one_error(&[(c.nccl, c.bad_nccl)]);
        assert!(e.starts_with(&format!("{}=\"{}\" is not valid for mpib: accepted", c.nccl, c.bad_nccl)), "{e}");
        assert!(e.contains(&format!("set {}", c.setting)) || e.contains(&format!("or {}", c.setting)), "{e}");
        let e = one_error(&[(c.setting, c.bad_mpib)]);
        assert!(e.starts_with(&format!("{}=\"{}\" is not valid: accepted", c.setting, c.bad_mpib)), "{e}");
        ok(&[(c.nccl, c.bad_nccl), (c.setting, c.mpib_value)]);
    }
}

#[test]
fn followed_values_mean_what_they_mean_to_nccl() {
    let c = ok(&[("NCCL_IB_TC", "0x6a"), ("NCCL_IB_GID_INDEX", "-1"), ("NCCL_IB_SL", "-1")]);
    assert_eq!(c.rails[0].tc, Some(106), "hex, as strtoll(…, 0) reads it");
    assert_eq!(c.rails[1].gid.index, None, "-1: automatic, from NCCL_IB_GID_INDEX");
    assert_eq!(c.origin("MPIB_GID_INDEX", 1), "NCCL_IB_GID_INDEX");
    assert_eq!(c.rails[0].sl, None);
    // NCCL_IB_GID_INDEX is a RoCE setting (net_ib's IB ports ignore it); mpib's is for both.
    let c = ok(&[("NCCL_IB_GID_INDEX", "3"), ("MPIB_SUP_GID_INDEX", "2")]);
    assert_eq!((c.rails[0].gid.index, c.rails[0].gid.index_on_ib), (Some(3), false));
    assert_eq!((c.rails[1].gid.index, c.rails[1].gid.index_on_ib), (Some(2), true));
    // MPIB_GID_INDEX=-1 takes NCCL's index back to automatic.
    let c = ok(&[("NCCL_IB_GID_INDEX", "3"), ("MPIB_GID_INDEX", "-1")]);
    assert_eq!((c.rails[0].gid.index, c.origin("MPIB_GID_INDEX", 0)), (None, "MPIB_GID_INDEX"));
    assert_eq!(ok(&[("NCCL_IB_ROCE_VERSION_NUM", "1")]).rails[0].gid.version, GidType::IbRoceV1);
    assert!(ok(&[("NCCL_DMABUF_ENABLE", "7")]).dmabuf, "NCCL turns DMA-BUF off for 0 only");
    assert_eq!(ok(&[("NCCL_IB_PCI_RELAXED_ORDERING", "1")]).relaxed_ordering, RelaxedOrdering::On);
    let r = ok(&[("NCCL_IB_ADDR_FAMILY", "AF_INET6"), ("NCCL_IB_ADDR_RANGE", "fd00::/8")]).rails[1].gid;
    assert_eq!((r.family, r.range), (AddrFamily::V6, Some(AddrRange { addr: "fd00::".parse().unwrap(), prefix: 8 })));
}

#[test]
fn each_rail_has_its_own_settings_over_the_shared_one() {
    let c = ok(&[
        ("NCCL_IB_TC", "106"),
        ("MPIB_SUP_TC", "41"),
        ("MPIB_SL", "2"),
        ("MPIB_SOUT_SL", "4"),
        ("MPIB_SUP_CTS_TC", "208"),
        ("MPIB_SOUT_GID_INDEX", "3"),
        ("MPIB_SUP_ADDR_RANGE", "192.0.2.0/24"),
        ("MPIB_SUP_QP", "2"),
    ]);
    let [s, u] = c.rails;
    assert_eq!((s.tc, u.tc), (Some(106), Some(41)));
    assert_eq!((c.origin("MPIB_TC", 0), c.origin("MPIB_TC", 1)), ("NCCL_IB_TC", "MPIB_SUP_TC"));
    assert_eq!((s.sl, u.sl), (Some(4), Some(2)));
    assert_eq!((c.origin("MPIB_SL", 0), c.origin("MPIB_SL", 1)), ("MPIB_SOUT_SL", "MPIB_SL"));
    assert_eq!((s.cts_tc, u.cts_tc), (None, Some(208)));
    assert_eq!((s.gid.index, u.gid.index), (Some(3), None));
    assert_eq!((s.gid.range, u.gid.range.map(|r| r.to_string())), (None, Some("192.0.2.0/24".into())));
    assert_eq!((s.qps, u.qps), (1, 2));
    // The INFO line: one value where the rails agree, each rail's where they do not.
    let line = c.to_string();
    for want in [
        "tc=sout:106 (NCCL_IB_TC),sup:41 (MPIB_SUP_TC)",
        "sl=sout:4 (MPIB_SOUT_SL),sup:2 (MPIB_SL)",
        "cts_tc=sout:as-tc (default),sup:208 (MPIB_SUP_CTS_TC)",
        "qps=sout:1 (default),sup:2 (MPIB_SUP_QP)",
        "roce_version=2 (default)",
        "addr_family=AF_INET (default)",
        "timeout=20 (default) retry_cnt=7 (default)",
        "dmabuf=1 (default)",
    ] {
        assert!(line.contains(want), "{want:?} not in {line}");
    }
    // A rail's bad value names that rail's variable, even where it is hidden by nothing.
    let e = one_error(&[("MPIB_SUP_SL", "16")]);
    assert!(e.starts_with("MPIB_SUP_SL=\"16\" is not valid: accepted an integer from -1 to 15"), "{e}");
    // A bad shared value is an error even where both rails' own variables hide it.
    let e = one_error(&[("MPIB_TC", "300"), ("MPIB_SOUT_TC", "1"), ("MPIB_SUP_TC", "2")]);
    assert!(e.starts_with("MPIB_TC=\"300\""), "{e}");
    // A bad NCCL value used by one rail only is reported once, naming the variables over it.
    let e = one_error(&[("NCCL_IB_SL", "99"), ("MPIB_SOUT_SL", "1")]);
    assert!(e.contains("NCCL_IB_SL=\"99\"") && e.contains("set MPIB_SUP_SL or MPIB_SL to override it"), "{e}");
}

#[test]
fn traffic_class_and_service_level_from_the_communicator_as_net_ib() {
    let rc = RailConfig::default();
    assert_eq!((rc.traffic_class(None), rc.service_level(None), rc.cts_traffic_class(None)), (0, 0, 0));
    assert_eq!((rc.traffic_class(Some(106)), rc.cts_traffic_class(Some(106))), (106, 106));
    assert_eq!(rc.service_level(Some(106)), 0, "a class that is no service level: 0");
    assert_eq!(rc.service_level(Some(5)), 5, "net_ib: the communicator's class is the SL when NCCL_IB_SL is unset");
    assert_eq!(rc.traffic_class(Some(-1)), 0, "NCCL's undefined class");
    let rc = RailConfig { tc: Some(41), sl: Some(2), cts_tc: Some(208), ..RailConfig::default() };
    assert_eq!((rc.traffic_class(Some(106)), rc.service_level(Some(5)), rc.cts_traffic_class(Some(106))), (41, 2, 208));
}

#[test]
fn an_address_range_must_be_of_the_rails_family() {
    let e = one_error(&[("MPIB_SUP_ADDR_RANGE", "fd00::/8")]);
    assert!(
        e.contains(
            "MPIB_SUP_ADDR_RANGE=fd00::/8 is an IPv6 range, but the SUP rail's address family is AF_INET (default)"
        ) && e.contains("MPIB_SUP_ADDR_FAMILY"),
        "{e}"
    );
    let e = one_error(&[("NCCL_IB_ADDR_RANGE", "10.0.0.0/8"), ("NCCL_IB_ADDR_FAMILY", "AF_INET6")]);
    assert!(
        e.contains("NCCL_IB_ADDR_RANGE=10.0.0.0/8 is an IPv4 range") && e.contains("AF_INET6 (NCCL_IB_ADDR_FAMILY)"),
        "{e}"
    );
    ok(&[("MPIB_SOUT_ADDR_FAMILY", "AF_INET6"), ("MPIB_SOUT_ADDR_RANGE", "fd00::/8")]);
}

#[test]
fn nccl_variables_not_followed_are_warned_about_or_noted() {
    let c = ok(&[
        ("NCCL_IB_ADAPTIVE_ROUTING", "1"),
        ("NCCL_IB_OOO_RQ", "0"),
        ("NCCL_IB_DISABLE", "1"),
        ("NCCL_IB_FOO", "1"),
        ("NCCL_DEBUG", "INFO"),
    ]);
    assert_eq!(c.ignored.len(), 2, "{:?}", c.ignored);
    assert!(c.ignored[0].starts_with("NCCL_IB_ADAPTIVE_ROUTING=\"1\" is not followed by mpib"), "{:?}", c.ignored);
    assert!(c.ignored[1].starts_with("NCCL_IB_FOO=\"1\" is not known to mpib"), "{:?}", c.ignored);
    assert_eq!(c.not_applicable.len(), 1);
    assert!(c.not_applicable[0].starts_with("NCCL_IB_DISABLE=\"1\" does not apply to mpib"));
    // A followed variable is neither.
    let c = ok(&[("NCCL_IB_TC", "106"), ("NCCL_IB_HCA", "mlx5_0")]);
    assert!(c.ignored.is_empty() && c.not_applicable.is_empty(), "{:?} {:?}", c.ignored, c.not_applicable);
}
