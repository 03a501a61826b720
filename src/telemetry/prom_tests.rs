//! Unit tests of `prom.rs`: the exposition format's rules, and the fixture the Python
//! tests parse with a real Prometheus parser (`ci/tests/test_prom_textfile.py`).

use std::collections::BTreeSet;
use std::sync::Arc;

use super::*;
use crate::telemetry::{LatencySummary, RailTotals, WorstPeers};

const FIXTURE: &str = concat!(env!("CARGO_MANIFEST_DIR"), "/tests/fixtures/prom/mpib.prom");

fn peer(peer: &str, nic: &str, rail: usize) -> PeerTotals {
    PeerTotals {
        peer: peer.into(),
        nic: nic.into(),
        rail,
        counts: RailCounts::default(),
        latency: LatencySummary::default(),
        srtt_ns: 0,
        live: 1,
    }
}

/// Two NICs (one per rail), a slow peer and a peer with errors.
pub(crate) fn sample_view() -> StatsView {
    let mut sout =
        RailTotals { live: 2, share: 0.75, srtt_ns: 21_000, bw_bytes_per_s: 12_500_000_000, ..Default::default() };
    sout.counts =
        RailCounts { wr_posted: 30, doorbells: 10, bytes: 3 << 20, imm_sent: 10, cqe: 10, ..Default::default() };
    sout.latency = LatencySummary {
        samples: 10,
        min_ns: 1000,
        avg_ns: 1500,
        median_ns: 1400,
        p95_ns: 2500,
        p99_ns: 2900,
        max_ns: 3000,
    };
    let mut sup = RailTotals { live: 2, failed: 1, share: 0.25, ..Default::default() };
    sup.counts = RailCounts { bytes: 1 << 20, errors: 2, failovers: 1, ..Default::default() };
    let nics = vec![
        NicTotals { nic: Arc::from("mlx5_0:1"), rail: 0, totals: sout },
        NicTotals { nic: Arc::from("mlx5_1:1"), rail: 1, totals: sup },
    ];
    let mut slow = peer("GID fe80::b", "mlx5_0:1", 0);
    (slow.latency.samples, slow.latency.p99_ns, slow.srtt_ns) = (4, 250_000, 180_000);
    let mut fast = peer("GID fe80::a", "mlx5_0:1", 0);
    (fast.latency.samples, fast.latency.p99_ns, fast.srtt_ns) = (6, 2_000, 1_500);
    let mut bad = peer("GID fe80::c", "mlx5_1:1", 1);
    (bad.counts.errors, bad.counts.failovers) = (2, 1);
    StatsView { rails: [sout, sup], nics, worst: WorstPeers { by_latency: vec![slow, fast], by_errors: vec![bad] } }
}

#[test]
fn the_fixture_is_what_the_exporter_writes() {
    let text = format_prometheus(&sample_view());
    if std::env::var_os("MPIB_WRITE_FIXTURES").is_some() {
        std::fs::write(FIXTURE, &text).unwrap();
    }
    let fixture = std::fs::read_to_string(FIXTURE).unwrap_or_default();
    assert!(
        fixture == text,
        "{FIXTURE} differs from format_prometheus(sample_view()): rewrite it with \
         `MPIB_WRITE_FIXTURES=1 cargo test --lib prom` (the Python tests parse it)\n{text}"
    );
}

#[test]
fn every_family_has_help_and_type_before_its_samples_and_counters_end_in_total() {
    let text = format_prometheus(&sample_view());
    let (mut helped, mut typed) = (BTreeSet::new(), BTreeSet::<(String, String)>::new());
    for line in text.lines() {
        if let Some(rest) = line.strip_prefix("# HELP ") {
            helped.insert(rest.split_once(' ').unwrap().0.to_string());
        } else if let Some(rest) = line.strip_prefix("# TYPE ") {
            let (name, kind) = rest.split_once(' ').unwrap();
            assert_eq!(name.ends_with("_total"), kind == "counter", "{line}");
            assert!(["counter", "gauge", "summary"].contains(&kind), "{line}");
            assert!(helped.contains(name), "HELP before TYPE: {line}");
            typed.insert((name.to_string(), kind.to_string()));
        } else {
            let name = line.split_once('{').unwrap_or_else(|| panic!("a sample with labels: {line}")).0;
            let family = typed
                .iter()
                .find(|(f, k)| {
                    name == f
                        || (k == "summary" && [format!("{f}_sum"), format!("{f}_count")].contains(&name.to_string()))
                })
                .unwrap_or_else(|| panic!("a sample before its TYPE: {line}"));
            assert!(name.starts_with("mpib_"), "{line}");
            let value = line.rsplit_once(' ').unwrap().1;
            value.parse::<f64>().unwrap_or_else(|e| panic!("{line}: {e} ({family:?})"));
        }
    }
    assert!(text.contains("mpib_rail_bytes_total{nic=\"mlx5_0:1\",rail=\"sout\"} 3145728\n"), "{text}");
    assert!(text.contains("mpib_rail_errors_total{nic=\"mlx5_1:1\",rail=\"sup\"} 2\n"), "{text}");
    assert!(text.contains("mpib_rail_latency_seconds{nic=\"mlx5_0:1\",rail=\"sout\",quantile=\"0.99\"} 0.0000029\n"));
    assert!(
        text.contains("mpib_peer_latency_p99_seconds{peer=\"GID fe80::b\",nic=\"mlx5_0:1\",rail=\"sout\"} 0.00025\n")
    );
    assert!(text.contains("mpib_peer_failovers_total{peer=\"GID fe80::c\",nic=\"mlx5_1:1\",rail=\"sup\"} 1\n"));
    for (key, _) in RailCounts::default().fields() {
        assert_ne!(help_of(key), help_of("no such counter"), "{key} has its own HELP text");
    }
}

#[test]
fn label_values_are_escaped() {
    assert_eq!(escape(r#"a"b\c"#), r#"a\"b\\c"#);
    assert_eq!(escape("a\nb"), "a\\nb");
    let mut v = sample_view();
    v.worst.by_latency[0].peer = Arc::from("x\"y");
    assert!(format_prometheus(&v).contains("peer=\"x\\\"y\""));
}

#[test]
fn an_empty_view_still_declares_every_family() {
    let text = format_prometheus(&StatsView::default());
    assert!(text.contains("# TYPE mpib_rail_bytes_total counter\n"));
    assert!(text.contains("# TYPE mpib_peer_errors_total counter\n"));
    assert!(text.lines().all(|l| l.starts_with("# ")), "{text}");
}
