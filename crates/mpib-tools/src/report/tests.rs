use super::*;

#[test]
fn report_round_trips() {
    let c = RailCounters { wr_posted: 3, bytes: 99, probes: 1, ..RailCounters::default() };
    let s = SideStats {
        requests: 4,
        messages: 8,
        bytes: 1 << 30,
        first_wrong: "group 3 buffer 1: size 5, expected 6".into(),
        counters: Some([c, RailCounters::default()]),
        timeline: vec![[1_000_000, 5, 7], [2_000_123, 4096, 0]],
        failover_events: vec![[1, 0, 0, 0, 0], [900, 1, 0, 4096, 1]],
        recoveries: vec![[900, 1500]],
        ..SideStats::default()
    };
    let warm = PhaseReport { tx: Some(SideStats { requests: 2, ..SideStats::default() }), ..Default::default() };
    let rails = RailStats { counters: c, latency_p99_ns: 12_345, share: 0.625, ..RailStats::default() };
    let r = RankReport {
        rank: 1,
        abi: 12,
        plugin: "MPIB".into(),
        device: "soft0+soft1".into(),
        phases: vec![
            PhaseReport { tx: Some(s.clone()), rx: None, start_ns: 5, warmup: Some(Box::new(warm)) },
            PhaseReport { tx: None, rx: Some(s), ..PhaseReport::default() },
        ],
        bad_handles: vec![("test(garbage)".into(), 4)],
        rails: Some([rails, RailStats { share: 0.375, ..rails }]),
        view: Some(StatsView::default()),
        line_mbps: [Some(400_000), None],
        failure: Some(Failure { error: Error::call("test", 6), at_ns: 12345 }),
        base: Snapshot { fds: 9, threads: 3, rss_kib: 1000, res: None },
        rounds: vec![RoundReport {
            setup_ns: 77,
            open: Snapshot {
                res: Some(Resources { cqs: 2, control_bytes: 4096, ..Resources::default() }),
                ..Snapshot::default()
            },
            ..RoundReport::default()
        }],
        ..RankReport::default()
    };
    assert_eq!(RankReport::from_line(&r.to_line()).unwrap(), r);
    assert!(mono_ns() > 0);
    assert_eq!(r.phases[0].with_warmup().count(), 2);
    assert!(rows::<3>("1:2").is_err() && rows::<3>("1:2:3:4").is_err() && rows::<3>("a:2:3").is_err());
}
