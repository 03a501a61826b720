//! Set-up: the per-rail connection parameters and the silent-peer bound.

use super::*;

#[test]
fn a_waiting_set_up_says_so_at_doubling_intervals_and_fails_only_past_a_deadline() {
    let t0 = Instant::now();
    let s = |n: u64| t0 + Duration::from_secs(n);
    let mut w = WaitNote::new(t0);
    let what = || "the peer has not completed set-up".to_string();
    let notes = [(29, 30), (30, 90), (91, 211), (119, 211), (211, 451), (3600, 4080), (4080, 4680), (4680, 5280)];
    for (at, next) in notes {
        w.check(s(at), None, "connect", what).unwrap();
        assert_eq!(w.next, s(next), "after a check at {at} s");
    }
    let mut w = WaitNote::new(t0);
    w.check(s(10), Some(Duration::from_secs(10)), "connect", what).unwrap();
    let e = w.check(s(11), Some(Duration::from_secs(10)), "connect", what).unwrap_err();
    assert_eq!(e.msg(), "the peer has not completed set-up within 10000 ms (MPIB_CONNECT_TIMEOUT_MS)");
}

fn cfg_leak() -> &'static Config {
    Box::leak(Box::default())
}

#[test]
fn each_rails_qps_get_that_rails_settings_and_receive_comms_the_control_class() {
    let vars = [
        ("MPIB_SOUT_TC", "106"),
        ("MPIB_SUP_TC", "41"),
        ("MPIB_SUP_CTS_TC", "208"),
        ("NCCL_IB_SL", "3"),
        ("MPIB_SUP_QP", "2"),
        ("NCCL_IB_TIMEOUT", "18"),
    ];
    let cfg: &'static Config = Box::leak(Box::new(Config::from_vars(vars).unwrap()));
    let p = Params::new(cfg, FabricKind::Verbs, AbiVersion::V12, Some(72));
    assert_eq!(p.qps, [1, 2]);
    let of = |c: [ConnectParams; RAILS]| c.map(|c| (c.traffic_class, c.service_level, c.timeout, c.retry_cnt));
    assert_eq!(of(p.send), [(106, 3, 18, 7), (41, 3, 18, 7)]);
    assert_eq!(of(p.recv), [(106, 3, 18, 7), (208, 3, 18, 7)], "SUP's receive QPs: MPIB_SUP_CTS_TC");
    // Nothing set: the communicator's class, and as the SL where it is one (net_ib).
    let p = Params::new(cfg_leak(), FabricKind::Verbs, AbiVersion::V12, Some(72));
    assert_eq!(of(p.send), [(72, 0, 20, 7); 2]);
    let p = Params::new(cfg_leak(), FabricKind::Verbs, AbiVersion::V12, Some(5));
    assert_eq!((p.send[1].traffic_class, p.send[1].service_level, p.recv[0].traffic_class), (5, 5, 5));
    let p = Params::new(cfg_leak(), FabricKind::Soft, AbiVersion::V12, None);
    assert_eq!(of(p.recv), [(0, 0, 20, 7); 2], "the defaults on every rail (above the soft fabric's floor)");
}

#[test]
fn a_silent_peer_is_reported_within_the_ack_timeout_budget_and_a_keepalive() {
    let p = |timeout, retry_cnt| ConnectParams { traffic_class: 0, service_level: 0, timeout, retry_cnt };
    // NCCL's settings (MPIB_TIMEOUT=20, MPIB_RETRY_CNT=7): 4.096 µs × 2^20 × 8 + 100 ms.
    let cfg = Config::default();
    assert_eq!((cfg.timeout, cfg.retry_cnt), (20, 7), "the defaults: NCCL's (both rails may be silent ~34 s)");
    assert_eq!(silent_peer_bound(&p(14, 6)), Duration::from_nanos(4096 * (1 << 14) * 7 + 100_000_000));
    assert_eq!(silent_peer_bound(&p(20, 7)), Duration::from_nanos(4096 * (1 << 20) * 8 + 100_000_000));
    assert_eq!(format!("{:.1?}", silent_peer_bound(&p(20, 7))), "34.5s");
    // The Soft-RoCE suites' settings: 4.096 µs × 2^16 × 7 + 100 ms ≈ 2.0 s.
    assert_eq!(silent_peer_bound(&p(16, 6)), Duration::from_nanos(4096 * (1 << 16) * 7 + 100_000_000));
    // The soft fabric's timeout is at least 16 (its budget times the peer process);
    // verbs keeps what the configuration says; a larger value is kept.
    let q = |t| ConnectParams { traffic_class: 0, service_level: 0, timeout: t, retry_cnt: 6 };
    assert_eq!(soft_floor(FabricKind::Soft, q(14)).timeout, 16);
    assert_eq!(soft_floor(FabricKind::Inproc, q(14)).timeout, 16);
    assert_eq!(soft_floor(FabricKind::Verbs, q(14)).timeout, 14);
    assert_eq!(soft_floor(FabricKind::Soft, q(18)).timeout, 18);
    let soft = Params::new(cfg_leak(), FabricKind::Soft, AbiVersion::V12, None);
    assert_eq!(format!("{:.1?}", silent_peer_bound(&soft.send[0])), "34.5s", "the default on the soft fabric too");
    // Tiny budgets: the soft fabric's 100 ms floor.
    assert_eq!(silent_peer_bound(&p(1, 0)), Duration::from_millis(200));
}

#[test]
fn a_rail_stripes_over_at_most_four_of_its_qps_and_only_when_asked() {
    let params = |vars: &[(&str, &str)]| {
        let cfg: &'static Config = Box::leak(Box::new(Config::from_vars(vars.iter().copied()).unwrap()));
        let p = Params::new(cfg, FabricKind::Soft, AbiVersion::V12, None);
        (p.qps, p.pieces)
    };
    assert_eq!(params(&[]), ([1, 1], [1, 1]));
    assert_eq!(params(&[("MPIB_QP", "4")]), ([4, 4], [1, 1]), "round-robin unless asked");
    assert_eq!(params(&[("MPIB_QP", "3"), ("MPIB_QP_STRIPE", "1")]), ([3, 3], [3, 3]));
    assert_eq!(params(&[("MPIB_QP", "16"), ("MPIB_SUP_QP_STRIPE", "1")]), ([16, 16], [1, 4]), "4 at most");
    assert_eq!(params(&[("MPIB_QP_STRIPE", "1")]), ([1, 1], [1, 1]), "one QP: nothing to stripe over");
    let nccl = [("NCCL_IB_QPS_PER_CONNECTION", "2"), ("NCCL_IB_SPLIT_DATA_ON_QPS", "1")];
    assert_eq!(params(&nccl), ([2, 2], [2, 2]), "NCCL's settings as defaults");
    let over = [nccl[0], nccl[1], ("MPIB_QP_STRIPE", "0")];
    assert_eq!(params(&over), ([2, 2], [1, 1]), "MPIB_QP_STRIPE overrides");
    assert_eq!(super::super::rail::send_qp_depth(4, 1, false), 8 * 9 + 1);
    assert_eq!(super::super::rail::send_qp_depth(4, 4, false), 32 * 9 + 1, "a QP may hold a piece of every slot");
}
