//! The INFO lines `init` prints once, so that an NCCL log says exactly what ran: the plugin's
//! version and commit, then one line per rail pair in the style of net_ib's
//! `NET/IB : Using [0]mlx5_0:1/RoCE [RO]` — both rails, their link layer, address (GID and
//! its RoCE version, or LID; TCP address on the soft fabric), speed, what their QPs are
//! made with (QPs per connection; traffic classes and service level on verbs), relaxed
//! ordering, rail/plane ids, and which NCCL device(s) it is.

use std::fmt::Write;

/// The plugin's version and the commit it was built from (`build.rs`; "unknown" outside a
/// git checkout).
pub fn version() -> String {
    format!("mpib {} (commit {})", env!("CARGO_PKG_VERSION"), env!("BUILD_GIT_COMMIT"))
}

pub use super::describe::RailDesc;
pub use super::devices::Seen;

/// What the banner says of one rail pair.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct PairDesc {
    pub rails: [RailDesc; 2],
    /// What each rail's QPs are made with: `qps 2, tc 106, cts-tc 106, sl 3` ([`qp_settings`]).
    pub qps: [String; 2],
    pub rail_id: Option<i16>,
    pub plane_id: Option<i16>,
    pub seen: Seen,
}

fn speed(mbps: u32) -> String {
    if mbps >= 1000 && mbps.is_multiple_of(1000) { format!("{} Gb/s", mbps / 1000) } else { format!("{mbps} Mb/s") }
}

/// The header line: version, ABI, fabric, pairs, NCCL's devices, fork safety, relaxed
/// ordering (`None` where the fabric has neither).
pub fn header(
    abi: u32,
    fabric: &str,
    pairs: usize,
    nccl_devices: usize,
    fork: Option<&str>,
    relaxed: Option<&str>,
) -> String {
    let mut s = format!(
        "{} through ncclNet v{abi}: {fabric} fabric, {pairs} rail pair(s), {nccl_devices} NCCL device(s)",
        version()
    );
    if let Some(f) = fork {
        let _ = write!(s, "; fork safety: {f}");
    }
    if let Some(r) = relaxed {
        let _ = write!(s, "; relaxed ordering: {r}");
    }
    s
}

/// `Using [k]SOUT/LINK+SUP/LINK [RO] …` for rail pair `k`.
pub fn pair_line(k: usize, p: &PairDesc) -> String {
    let [a, b] = &p.rails;
    let mut s = format!("Using [{k}]{}/{}+{}/{}", a.label(), a.link(), b.label(), b.link());
    if a.relaxed_ordering == Some(true) && b.relaxed_ordering == Some(true) {
        s.push_str(" [RO]");
    }
    let _ = write!(
        s,
        "; SOUT {} {}, {}; SUP {} {}, {}",
        a.addr,
        speed(a.speed_mbps),
        p.qps[0],
        b.addr,
        speed(b.speed_mbps),
        p.qps[1]
    );
    let id = |v: Option<i16>| v.map_or("-".to_string(), |v| v.to_string());
    if p.rail_id.is_some() || p.plane_id.is_some() {
        let _ = write!(s, "; rail {} plane {}", id(p.rail_id), id(p.plane_id));
    }
    match p.seen {
        Seen::Device(d) => {
            let _ = write!(s, "; NCCL device {d}");
        }
        Seen::Fused(x, y) => {
            let _ = write!(s, "; NCCL devices {x} and {y}, fused by NCCL");
        }
    }
    s
}

/// What rail `rc`'s QPs are made with, for its banner entry: QPs per connection (`striped`
/// when each request's share is striped over up to 4 of them), and on
/// verbs (`qos`) the traffic classes and the service level ("comm's": the communicator's
/// traffic class decides, else 0).
pub fn qp_settings(rc: &crate::config::RailConfig, qos: bool) -> String {
    let mut s = format!("qps {}", rc.qps);
    if rc.stripe && rc.qps > 1 {
        s.push_str(" striped");
    }
    if qos {
        let class = |v: Option<u8>| v.map_or("comm's".to_string(), |v| v.to_string());
        let cts = rc.cts_tc.map_or_else(|| class(rc.tc), |v| v.to_string());
        let _ = write!(s, ", tc {}, cts-tc {cts}, sl {}", class(rc.tc), class(rc.sl));
    }
    s
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::fabric::LinkLayer;

    #[test]
    fn a_striped_rail_says_so() {
        let rc = crate::config::RailConfig { qps: 4, stripe: true, ..Default::default() };
        assert_eq!(qp_settings(&rc, false), "qps 4 striped");
        let one = crate::config::RailConfig { qps: 1, stripe: true, ..Default::default() };
        assert_eq!(qp_settings(&one, false), "qps 1", "one QP: nothing to stripe over");
    }

    fn rail(name: &str, link_layer: LinkLayer, addr: &str, speed_mbps: u32, ro: Option<bool>) -> RailDesc {
        RailDesc {
            name: name.into(),
            port: 1,
            link_layer,
            addr: addr.into(),
            gid: None,
            lid: None,
            speed_mbps,
            speed_known: true,
            relaxed_ordering: ro,
            pci_path: None,
        }
    }

    fn roce(name: &str, gid: &str, ro: bool) -> RailDesc {
        rail(name, LinkLayer::Ethernet, &format!("GID 3 {gid}"), 400_000, Some(ro))
    }

    #[test]
    fn a_verbs_pair_reads_like_net_ibs_line() {
        let p = PairDesc {
            rails: [roce("mlx5_0", "::ffff:10.0.0.1", true), roce("mlx5_1", "::ffff:10.1.0.1", true)],
            qps: ["qps 1, tc 106, cts-tc 106, sl 3".into(), "qps 1, tc 106, cts-tc 106, sl 3".into()],
            rail_id: Some(2),
            plane_id: None,
            seen: Seen::Fused(0, 1),
        };
        assert_eq!(
            pair_line(0, &p),
            "Using [0]mlx5_0:1/RoCE+mlx5_1:1/RoCE [RO]; SOUT GID 3 ::ffff:10.0.0.1 400 Gb/s, qps 1, tc 106, cts-tc 106, sl 3; \
             SUP GID 3 ::ffff:10.1.0.1 400 Gb/s, qps 1, tc 106, cts-tc 106, sl 3; rail 2 plane -; NCCL devices 0 and 1, fused by NCCL"
        );
        let no_ro = PairDesc { rails: [p.rails[0].clone(), roce("mlx5_1", "x", false)], ..p.clone() };
        assert!(!pair_line(0, &no_ro).contains("[RO]"), "[RO] only when both rails have it");
    }

    #[test]
    fn a_soft_pair_names_its_tcp_addresses() {
        let tcp = |n: &str, a: &str| rail(n, LinkLayer::Tcp, a, 10_000, None);
        let p = PairDesc {
            rails: [tcp("soft-sout", "127.0.0.1:40001"), tcp("soft-sup", "127.0.0.1:40002")],
            qps: ["qps 1".into(), "qps 1".into()],
            rail_id: None,
            plane_id: None,
            seen: Seen::Device(0),
        };
        assert_eq!(
            pair_line(0, &p),
            "Using [0]soft-sout:1/TCP+soft-sup:1/TCP; SOUT 127.0.0.1:40001 10 Gb/s, qps 1; SUP 127.0.0.1:40002 10 Gb/s, qps 1; NCCL device 0"
        );
    }

    #[test]
    fn rail_settings_in_words() {
        let mut rc = crate::config::RailConfig::default();
        assert_eq!(qp_settings(&rc, false), "qps 1", "the soft fabric has no traffic classes");
        assert_eq!(qp_settings(&rc, true), "qps 1, tc comm's, cts-tc comm's, sl comm's");
        (rc.qps, rc.tc, rc.sl) = (4, Some(106), Some(3));
        assert_eq!(qp_settings(&rc, true), "qps 4, tc 106, cts-tc 106, sl 3", "the CTS class is tc's unless set");
        rc.cts_tc = Some(96);
        assert_eq!(qp_settings(&rc, true), "qps 4, tc 106, cts-tc 96, sl 3");
    }

    #[test]
    fn the_header_carries_version_commit_fork_and_relaxed_ordering() {
        let h = header(12, "verbs", 2, 6, Some("ibv_fork_init done"), Some("on"));
        assert!(h.starts_with(&format!("mpib {} (commit ", env!("CARGO_PKG_VERSION"))), "{h}");
        assert!(h.ends_with(
            "through ncclNet v12: verbs fabric, 2 rail pair(s), 6 NCCL device(s); fork safety: ibv_fork_init done; relaxed ordering: on"
        ), "{h}");
        assert!(!env!("BUILD_GIT_COMMIT").is_empty());
        assert!(!header(8, "soft", 1, 1, None, None).contains("fork"), "the soft fabric has no fork or RO state");
    }
}
