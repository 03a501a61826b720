//! Unit tests of `config`: one per rule.

use super::*;

fn parse(vars: &[(&str, &str)]) -> std::result::Result<Config, Vec<String>> {
    Config::from_vars(vars.iter().copied())
}

fn one_error(vars: &[(&str, &str)]) -> String {
    let e = parse(vars).expect_err("must be rejected");
    assert_eq!(e.len(), 1, "{e:?}");
    e[0].clone()
}

#[test]
fn defaults_without_variables() {
    let c = parse(&[]).unwrap();
    assert_eq!(c, Config::default());
    assert_eq!(c.fabric, FabricChoice::Auto);
    assert_eq!(c.split, SplitMode::Auto);
    assert_eq!((c.rtt_alpha, c.rtt_beta), (0.125, 0.25));
    assert_eq!(c.srq_depth, 16384);
}

#[test]
fn fabric_words_case_insensitive() {
    assert_eq!(parse(&[("MPIB_FABRIC", "SOFT")]).unwrap().fabric, FabricChoice::Soft);
    assert_eq!(parse(&[("MPIB_FABRIC", "verbs")]).unwrap().fabric, FabricChoice::Verbs);
    let e = one_error(&[("MPIB_FABRIC", "tcp")]);
    assert!(e.contains("MPIB_FABRIC") && e.contains("\"tcp\"") && e.contains("auto, verbs, soft, inproc"), "{e}");
}

#[test]
fn split_values() {
    assert_eq!(parse(&[("MPIB_SPLIT", "sout")]).unwrap().split, SplitMode::Sout);
    assert_eq!(parse(&[("MPIB_SPLIT", "sup")]).unwrap().split, SplitMode::Sup);
    assert_eq!(parse(&[("MPIB_SPLIT", "0")]).unwrap().split, SplitMode::Percent(0));
    assert_eq!(parse(&[("MPIB_SPLIT", "100")]).unwrap().split, SplitMode::Percent(100));
    assert_eq!(parse(&[("MPIB_SPLIT", "37%")]).unwrap().split, SplitMode::Percent(37));
    for bad in ["101", "-1", "half", "", "50.5"] {
        let e = one_error(&[("MPIB_SPLIT", bad)]);
        assert!(e.starts_with("MPIB_SPLIT=") && e.contains("percentage"), "{e}");
    }
}

#[test]
fn hca_lists_pair_up() {
    let c = parse(&[("MPIB_HCA_SOUT", "mlx5_0:1,mlx5_2"), ("MPIB_HCA_SUP", "mlx5_1, mlx5_3:2")]).unwrap();
    assert_eq!(c.hca_sout, vec![HcaSpec { port: Some(1), ..HcaSpec::device("mlx5_0") }, HcaSpec::device("mlx5_2")]);
    assert_eq!(c.hca_sup[1], HcaSpec { port: Some(2), ..HcaSpec::device("mlx5_3") });
    let c = parse(&[("MPIB_HCA_SOUT", "=mlx5_0:1:3:1"), ("MPIB_HCA_SUP", "mlx5_1::4")]).unwrap();
    assert_eq!(c.hca_sout[0], HcaSpec { port: Some(1), rail: Some(3), plane: Some(1), ..HcaSpec::device("mlx5_0") });
    assert_eq!(c.hca_sup[0], HcaSpec { rail: Some(4), ..HcaSpec::device("mlx5_1") });
}

#[test]
fn hca_lists_of_unequal_length_rejected() {
    let e = one_error(&[("MPIB_HCA_SOUT", "a,b"), ("MPIB_HCA_SUP", "c")]);
    assert!(e.contains("equal lengths") && e.contains("2 entries") && e.contains("1 entries"), "{e}");
    let e = one_error(&[("MPIB_HCA_SOUT", "rxe0")]);
    assert!(e.contains("must both be set"), "{e}");
}

#[test]
fn hca_bad_port_or_name_rejected() {
    for bad in ["mlx5_0:0", "mlx5_0:x", "mlx5_0:300", ",", "a b", "dev:1:2:3:4", "dev:1:-2"] {
        let e = parse(&[("MPIB_HCA_SOUT", bad), ("MPIB_HCA_SUP", bad)]).expect_err(bad);
        assert!(e.iter().any(|l| l.contains("device[:port")), "{bad}: {e:?}");
    }
}

#[test]
fn integers_checked_against_range() {
    assert_eq!(parse(&[("MPIB_SOUT_QP", "4")]).unwrap().rails[0].qps, 4);
    let e = one_error(&[("MPIB_SOUT_QP", "0")]);
    assert!(e.contains("from 1 to 16"), "{e}");
    let e = one_error(&[("MPIB_SUP_QP", "17")]);
    assert!(e.contains("MPIB_SUP_QP"), "{e}");
    let e = one_error(&[("MPIB_TIMEOUT", "32")]);
    assert!(e.contains("from 1 to 31"), "{e}");
    let e = one_error(&[("MPIB_RETRY_CNT", "eight")]);
    assert!(e.contains("from 0 to 7"), "{e}");
    let e = one_error(&[("MPIB_SL", "16")]);
    assert!(e.contains("MPIB_SL"), "{e}");
    let e = one_error(&[("MPIB_TC", "256")]);
    assert!(e.contains("MPIB_TC"), "{e}");
    let e = one_error(&[("MPIB_STATS_INTERVAL_MS", "5")]);
    assert!(e.contains("from 10"), "{e}");
    let e = one_error(&[("MPIB_PROBE_INTERVAL_US", "1e3")]);
    assert!(e.contains("integer"), "{e}");
    assert_eq!(parse(&[]).unwrap().probe_rate, 10_000);
    assert_eq!(parse(&[("MPIB_PROBE_RATE", "0")]).unwrap().probe_rate, 0);
    let e = one_error(&[("MPIB_PROBE_RATE", "-1")]);
    assert!(e.contains("MPIB_PROBE_RATE") && e.contains("from 0 to 10000000"), "{e}");
}

#[test]
fn gid_index_auto_or_value() {
    assert_eq!(parse(&[("MPIB_GID_INDEX", "-1")]).unwrap().rails[0].gid.index, None);
    assert_eq!(parse(&[("MPIB_GID_INDEX", "3")]).unwrap().rails[1].gid.index, Some(3));
    one_error(&[("MPIB_GID_INDEX", "-2")]);
    one_error(&[("MPIB_GID_INDEX", "256")]);
}

#[test]
fn srq_depth_in_range() {
    assert_eq!(parse(&[("MPIB_SRQ_DEPTH", "64")]).unwrap().srq_depth, 64);
    assert_eq!(parse(&[("MPIB_SRQ_DEPTH", "1048576")]).unwrap().srq_depth, 1 << 20);
    let e = one_error(&[("MPIB_SRQ_DEPTH", "63")]);
    assert!(e.contains("MPIB_SRQ_DEPTH"), "{e}");
    one_error(&[("MPIB_SRQ_DEPTH", "1048577")]);
}

#[test]
fn rtt_gains_in_unit_interval() {
    let c = parse(&[("MPIB_RTT_ALPHA", "0.5"), ("MPIB_RTT_BETA", "1")]).unwrap();
    assert_eq!((c.rtt_alpha, c.rtt_beta), (0.5, 1.0));
    for bad in ["0", "1.5", "-0.1", "x", "NaN"] {
        let e = one_error(&[("MPIB_RTT_ALPHA", bad)]);
        assert!(e.contains("0 < g <= 1"), "{e}");
    }
}

#[test]
fn soft_addresses_ip_or_interface() {
    let c = parse(&[("MPIB_SOFT_SOUT_ADDR", "10.0.0.1"), ("MPIB_SOFT_SUP_ADDR", "veth1")]).unwrap();
    assert_eq!(c.soft_sout_addr, Some(RailAddr::Ip("10.0.0.1".parse().unwrap())));
    assert_eq!(c.soft_sup_addr, Some(RailAddr::Interface("veth1".into())));
    let c = parse(&[("MPIB_SOFT_SOUT_ADDR", "fe80::1")]).unwrap();
    assert!(matches!(c.soft_sout_addr, Some(RailAddr::Ip(IpAddr::V6(_)))));
    one_error(&[("MPIB_SOFT_SUP_ADDR", "not an if")]);
    one_error(&[("MPIB_SOFT_SUP_ADDR", "averyveryverylongname0")]);
}

#[test]
fn every_bad_variable_reported_at_once() {
    let e = parse(&[("MPIB_FABRIC", "x"), ("MPIB_SPLIT", "y"), ("MPIB_TIMEOUT", "0")]).unwrap_err();
    assert_eq!(e.len(), 3, "{e:?}");
}

#[test]
fn unknown_names_warned_not_fatal() {
    let c =
        parse(&[("MPIB_SPLTI", "sout"), ("MPIB_FABRIC", "soft"), ("OTHER", "1"), ("MPIB_TEST_MEMLOCK", "1")]).unwrap();
    assert_eq!(c.unknown, vec!["MPIB_SPLTI".to_string()], "the test suites' MPIB_TEST_* switches are not warned");
    let w = c.unknown_warning().unwrap();
    assert!(w.contains("MPIB_SPLTI") && w.contains("MPIB_SPLIT") && w.contains("MPIB_FABRIC"), "{w}");
    assert!(parse(&[]).unwrap().unknown_warning().is_none());
}

#[test]
fn socket_ifname_honoured() {
    let c = parse(&[("NCCL_SOCKET_IFNAME", "eth1")]).unwrap();
    assert_eq!(c.socket_ifname.as_deref(), Some("eth1"));
}

#[test]
fn every_parsed_variable_is_documented() {
    // Each name the parser accepts must be in VARS (README's table), and vice versa.
    for name in known_names() {
        let c = parse(&[(name, "definitely-not-valid-%%")]);
        let unknown = c.as_ref().map(|c| c.unknown.contains(&name.to_string())).unwrap_or(false);
        assert!(!unknown, "{name} is documented but not parsed");
        if name != "MPIB_STATS_FILE" && name != "MPIB_PROM_FILE" {
            let e = c.expect_err(name);
            assert!(e.iter().any(|l| l.starts_with(&format!("{name}="))), "a bad value names {name}: {e:?}");
        }
    }
}

#[test]
fn display_shows_effective_values() {
    let c = parse(&[("MPIB_SPLIT", "30"), ("MPIB_FABRIC", "soft")]).unwrap();
    let s = c.to_string();
    assert!(s.contains("fabric=Soft") && s.contains("split=30%") && s.contains("stats_file=off"), "{s}");
    let c = parse(&[("MPIB_PROM_FILE", "/var/lib/node_exporter/mpib-%p.prom")]).unwrap();
    assert_eq!(c.prom_file.as_deref(), Some("/var/lib/node_exporter/mpib-%p.prom"));
    assert!(c.to_string().contains("prom_file=/var/lib/node_exporter/mpib-%p.prom"), "{c}");
}

#[test]
fn nic_filter_from_mpib_hca_or_nccls_own_variable() {
    assert_eq!(parse(&[]).unwrap().hca_filter, None);
    let c = parse(&[("MPIB_HCA", "^mlx5_2,mlx5_3")]).unwrap();
    let f = c.hca_filter.as_ref().unwrap();
    assert!(f.exclude && !f.exact && f.entries.len() == 2);
    assert_eq!(c.hca_filter_var, "MPIB_HCA");
    let c = parse(&[("NCCL_IB_HCA", "=mlx5_0:1")]).unwrap();
    assert_eq!((c.hca_filter.as_ref().unwrap().to_string(), c.hca_filter_var), ("=mlx5_0:1".into(), "NCCL_IB_HCA"));
    let c = parse(&[("NCCL_IB_HCA", "mlx5_0"), ("MPIB_HCA", "mlx5_1")]).unwrap();
    assert_eq!((c.hca_filter.unwrap().to_string(), c.hca_filter_var), ("mlx5_1".into(), "MPIB_HCA"), "MPIB_HCA wins");
    // mpib's own variable must be right; NCCL's is only warned about when mpib cannot read it.
    let e = one_error(&[("MPIB_HCA", "mlx5_0:0")]);
    assert!(e.starts_with("MPIB_HCA=") && e.contains("NCCL_IB_HCA syntax"), "{e}");
    let c = parse(&[("NCCL_IB_HCA", "mlx5_0:x")]).unwrap();
    assert_eq!(c.hca_filter, None);
    assert!(c.ignored[0].contains("NCCL_IB_HCA=\"mlx5_0:x\" is not understood"), "{:?}", c.ignored);
}

#[test]
fn relaxed_ordering_and_nccl_devices_words() {
    let c = parse(&[]).unwrap();
    assert_eq!((c.relaxed_ordering, c.nccl_devices), (RelaxedOrdering::Auto, NcclDevices::Auto), "net_ib's default: 2");
    assert_eq!(parse(&[("MPIB_PCI_RELAXED_ORDERING", "0")]).unwrap().relaxed_ordering, RelaxedOrdering::Off);
    assert_eq!(parse(&[("MPIB_PCI_RELAXED_ORDERING", "1")]).unwrap().relaxed_ordering, RelaxedOrdering::On);
    assert!(one_error(&[("MPIB_PCI_RELAXED_ORDERING", "3")]).contains("0, 1, 2"));
    assert_eq!(parse(&[("MPIB_NCCL_DEVICES", "PAIRS")]).unwrap().nccl_devices, NcclDevices::Pairs);
    assert_eq!(parse(&[("MPIB_NCCL_DEVICES", "nics")]).unwrap().nccl_devices, NcclDevices::Nics);
    assert!(one_error(&[("MPIB_NCCL_DEVICES", "fused")]).contains("auto, pairs, nics"));
    let s = parse(&[("MPIB_HCA", "^mlx5_4")]).unwrap().to_string();
    assert!(
        s.contains("hca=^mlx5_4 (MPIB_HCA)")
            && s.contains("nccl_devices=Auto")
            && s.contains("relaxed_ordering=2 (default)"),
        "{s}"
    );
}

#[test]
fn the_silent_rail_floor_is_longer_on_the_soft_fabric_unless_set() {
    let d = parse(&[]).unwrap();
    assert_eq!((d.silent, d.silent_floor_ms(false), d.silent_floor_ms(true)), (None, 50, 1000));
    let c = parse(&[("MPIB_SILENT_MS", "80")]).unwrap();
    assert_eq!((c.silent_floor_ms(false), c.silent_floor_ms(true)), (80, 80), "set: the same on every fabric");
    assert_eq!(parse(&[("MPIB_SILENT_MS", "0")]).unwrap().silent_floor_ms(true), 0, "0: the check is off");
    assert_eq!(parse(&[("MPIB_SILENT_MS", "Auto")]).unwrap().silent, None);
    let e = one_error(&[("MPIB_SILENT_MS", "fast")]);
    assert!(e.contains("MPIB_SILENT_MS") && e.contains("auto or an integer from 0 to 600000"), "{e}");
}

#[test]
fn the_outage_grace_is_rcs_retry_budget_unless_set() {
    let d = parse(&[]).unwrap();
    // 4.096 µs × 2^20 × 8 = 34.4 s, to the second above.
    assert_eq!((d.outage_grace, d.outage_grace_ms()), (None, 35_000));
    let c = parse(&[("MPIB_TIMEOUT", "16"), ("MPIB_RETRY_CNT", "6")]).unwrap();
    assert_eq!(c.outage_grace_ms(), 2_000, "4.096 µs × 2^16 × 7 = 1.9 s");
    let c = parse(&[("NCCL_IB_TIMEOUT", "22")]).unwrap();
    assert_eq!(c.outage_grace_ms(), 138_000, "NCCL's variable moves it too: 137.4 s");
    assert_eq!(parse(&[("MPIB_OUTAGE_GRACE_MS", "0")]).unwrap().outage_grace_ms(), 0, "0: no outage ridden out");
    assert_eq!(parse(&[("MPIB_OUTAGE_GRACE_MS", "1500")]).unwrap().outage_grace_ms(), 1500);
    assert_eq!(parse(&[("MPIB_OUTAGE_GRACE_MS", "AUTO")]).unwrap().outage_grace, None);
    let e = one_error(&[("MPIB_OUTAGE_GRACE_MS", "-1")]);
    assert!(e.contains("MPIB_OUTAGE_GRACE_MS") && e.contains("auto or an integer from 0 to 3600000"), "{e}");
    assert!(d.to_string().contains("outage_grace_ms=35000 (auto)"), "{d}");
}

#[test]
fn failover_switch_and_timings() {
    let d = parse(&[]).unwrap();
    assert_eq!((d.failover, d.stall_ms, d.readmit_ms, d.readmit_max_ms), (true, 0, 100, 1000), "on by default");
    let c = parse(&[("MPIB_FAILOVER", "0"), ("MPIB_STALL_MS", "0"), ("MPIB_READMIT_MS", "250")]).unwrap();
    assert_eq!((c.failover, c.stall_ms, c.readmit_ms), (false, 0, 250));
    let e = one_error(&[("MPIB_FAILOVER", "yes")]);
    assert!(e.contains("accepted 0, 1"), "{e}");
    let e = one_error(&[("MPIB_READMIT_MAX_MS", "50")]);
    assert!(e.contains("from 100 to 600000"), "{e}");
    assert_eq!(d.fault_rail, None, "no drill by default");
    let drill = |mask, at, for_ms, every_ms| {
        Some(FaultDrill { mask, at, for_ms, every_ms, count: None, kind: FaultKind::LinkLoss })
    };
    let get = |v: &str| parse(&[("MPIB_FAULT_RAIL", v)]).unwrap().fault_rail;
    assert_eq!(get("SUP:7"), drill(2, FaultAt::Isend(7), None, None));
    assert_eq!(get("both:1"), drill(3, FaultAt::Isend(1), None, None));
    assert_eq!(get("sout:9:250"), drill(1, FaultAt::Isend(9), Some(250), None));
    assert_eq!(get("sup:@1000"), drill(2, FaultAt::Ms(1000), None, None));
    assert_eq!(get("sup:@1000:500:2000"), drill(2, FaultAt::Ms(1000), Some(500), Some(2000)));
    let five = FaultDrill { count: Some(5), ..drill(1, FaultAt::Ms(0), Some(10), Some(20)).unwrap() };
    assert_eq!(get("sout:@0:10:20:5"), Some(five));
    assert!(parse(&[("MPIB_FAULT_RAIL", "sout:9:x")]).is_err());
    // The fault, last: every form above takes one.
    let kind = |v: &str| get(v).map(|d| (d.mask, d.at, d.for_ms, d.kind));
    assert_eq!(kind("sup:7:drop-imm"), Some((2, FaultAt::Isend(7), None, FaultKind::DropImm)));
    assert_eq!(kind("sout:9:250:DROP-ACK"), Some((1, FaultAt::Isend(9), Some(250), FaultKind::DropAck)));
    assert_eq!(kind("both:@5:hold"), Some((3, FaultAt::Ms(5), None, FaultKind::HoldPastFence)));
    let hold = get("sout:@0:10:20:5:hold").unwrap();
    assert_eq!((hold.count, hold.kind), (Some(5), FaultKind::HoldPastFence));
    // A repetition needs a time form, a positive period and a rail that comes back.
    for bad in
        ["sup", "sup:0", "up:3", "sout:x", "sup:7:5:100", "sup:@10:5:0", "sup:@x", "sup:@1:2:3:0", "sup:@1:2:3:4:5"]
            .into_iter()
            .chain(["sup:hold", "sup:3:drop", "sup:3:hold:5", "sup:3:hold:hold", "sup:3:link"])
    {
        assert!(one_error(&[("MPIB_FAULT_RAIL", bad)]).contains("sout:N, sup:N or both:N"), "{bad}");
    }
}

#[test]
fn a_huge_value_is_cut_in_its_warn_line() {
    let huge = "x".repeat(100 * 1024);
    let e = one_error(&[("MPIB_SPLIT", huge.as_str())]);
    assert!(e.len() < 300, "{} bytes of WARN line", e.len());
    assert!(e.starts_with("MPIB_SPLIT=\"xxxx") && e.contains("(102400 bytes)"), "{e}");
    // Multi-byte characters are cut at a character boundary.
    let wide = "é".repeat(50_000);
    let e = one_error(&[("MPIB_FABRIC", wide.as_str())]);
    assert!(e.len() < 300 && e.contains("(100000 bytes)"), "{e}");
    // NCCL's own variable, ignored with a WARN, and a long unknown name.
    let name = format!("MPIB_{}", "Y".repeat(100_000));
    let bad_hca = format!("{huge}:port");
    let c = parse(&[("NCCL_IB_HCA", bad_hca.as_str()), (name.as_str(), "1")]).unwrap();
    assert_eq!(c.ignored.len(), 1);
    assert!(c.ignored[0].len() < 400 && c.ignored[0].contains("(102405 bytes)"), "{}", c.ignored[0].len());
    let w = c.unknown_warning().unwrap();
    assert!(w.len() < 1200 && w.contains("MPIB_YYYY") && w.contains("(100005 bytes)"), "{} bytes", w.len());
    assert!(cut("short") == "short" && cut(&huge).ends_with("… (102400 bytes)"));
    // A short value is shown whole, as before.
    assert!(one_error(&[("MPIB_SPLIT", "half")]).contains("MPIB_SPLIT=\"half\" is not valid"));
}
