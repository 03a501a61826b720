//! The node-exporter textfile (`MPIB_PROM_FILE`): the per-NIC and per-peer views in
//! Prometheus' text exposition format, for the textfile collector to scrape. Metric names
//! are `mpib_rail_*` (labels `nic`, `rail`) and `mpib_peer_*` (labels `peer`, `nic`,
//! `rail`); counters end in `_total`, times are in seconds, and every family has its HELP
//! and TYPE lines. Written by the statistics writer (`export.rs`), atomically.

use std::fmt::Write as _;

use super::registry::StatsView;
use super::registry::{NicTotals, PeerTotals};
use super::stats::RailCounts;

/// `rail` label values, by rail index.
const RAIL_LABELS: [&str; 2] = ["sout", "sup"];

/// HELP text of each counter of [`super::RailCounts::fields`], by key.
const COUNTER_HELP: &[(&str, &str)] = &[
    ("wr_posted", "Work requests posted (data, metadata, CTS writes and probes)."),
    ("doorbells", "Post calls, one per chain."),
    ("bytes", "Payload bytes posted."),
    ("imm_sent", "WRITE_WITH_IMM work requests posted."),
    ("cqe", "Completions polled."),
    ("rnr", "Receiver-not-ready events."),
    ("zero_byte_imm", "IMMs posted on a rail that carried no byte of a non-empty transfer (always 0)."),
    ("errors", "Completions with an error status."),
    ("probes", "Idle-rail probes posted."),
    ("rtt_samples", "RTT samples taken (data chains and probes)."),
    ("congestion_events", "RTT samples above SRTT + 4 RTTVAR."),
    ("failovers", "Failures of this rail that its connections survived on the other rail."),
    ("replayed_bytes", "Bytes of this rail's parts re-sent on the other rail after it failed."),
    ("readmissions", "Times this rail was re-admitted after a failure."),
    ("suspects", "Times this rail was suspected silent."),
];

fn help_of(key: &str) -> &'static str {
    COUNTER_HELP.iter().find(|(k, _)| *k == key).map_or("An mpib rail counter.", |(_, h)| h)
}

/// A label value with `\`, `"` and newlines escaped.
fn escape(v: &str) -> String {
    v.replace('\\', "\\\\").replace('"', "\\\"").replace('\n', "\\n")
}

fn seconds(ns: u64) -> f64 {
    ns as f64 / 1e9
}

fn nic_labels(n: &NicTotals) -> String {
    format!("nic=\"{}\",rail=\"{}\"", escape(&n.nic), RAIL_LABELS[n.rail])
}

fn peer_labels(p: &PeerTotals) -> String {
    format!("peer=\"{}\",nic=\"{}\",rail=\"{}\"", escape(&p.peer), escape(&p.nic), RAIL_LABELS[p.rail])
}

/// One metric family: HELP, TYPE and one sample per row.
fn family<T>(s: &mut String, name: &str, kind: &str, help: &str, rows: &[T], sample: impl Fn(&T) -> (String, f64)) {
    let _ = writeln!(s, "# HELP {name} {help}");
    let _ = writeln!(s, "# TYPE {name} {kind}");
    for r in rows {
        let (labels, v) = sample(r);
        let _ = writeln!(s, "{name}{{{labels}}} {v}");
    }
}

/// A per-NIC gauge's value.
type Gauge = fn(&NicTotals) -> f64;

/// The textfile's text.
pub fn format_prometheus(view: &StatsView) -> String {
    let mut s = String::with_capacity(8192);
    let nics = &view.nics[..];
    for (key, _) in RailCounts::default().fields() {
        let name = format!("mpib_rail_{key}_total");
        family(&mut s, &name, "counter", help_of(key), nics, |n| {
            let v = n.totals.counts.fields().find(|(k, _)| *k == key).map_or(0, |(_, v)| v);
            (nic_labels(n), v as f64)
        });
    }
    let name = "mpib_rail_latency_seconds";
    let _ = writeln!(s, "# HELP {name} Latency of data chains, post to signalled completion (_sum is mean x count).");
    let _ = writeln!(s, "# TYPE {name} summary");
    for n in nics {
        let (l, labels) = (&n.totals.latency, nic_labels(n));
        for (q, v) in [("0.5", l.median_ns), ("0.95", l.p95_ns), ("0.99", l.p99_ns)] {
            let _ = writeln!(s, "{name}{{{labels},quantile=\"{q}\"}} {}", seconds(v));
        }
        let _ = writeln!(s, "{name}_sum{{{labels}}} {}", seconds(l.avg_ns.saturating_mul(l.samples)));
        let _ = writeln!(s, "{name}_count{{{labels}}} {}", l.samples);
    }
    let gauges: [(&str, &str, Gauge); 7] = [
        ("mpib_rail_srtt_seconds", "Smoothed RTT (RFC 6298), mean over live connections.", |n| {
            seconds(n.totals.srtt_ns)
        }),
        ("mpib_rail_rttvar_seconds", "RTT variation (RFC 6298), mean over live connections.", |n| {
            seconds(n.totals.rttvar_ns)
        }),
        ("mpib_rail_base_latency_seconds", "RTT of an empty chain on an idle rail.", |n| seconds(n.totals.base_ns)),
        ("mpib_rail_delivery_rate_bytes_per_second", "Delivery-rate estimate.", |n| n.totals.bw_bytes_per_s as f64),
        ("mpib_rail_share_ratio", "This NIC's and rail's part of all payload bytes (0-1).", |n| n.totals.share),
        ("mpib_rail_live_connections", "Connections open now with statistics here.", |n| n.totals.live as f64),
        ("mpib_rail_failed_connections", "Connections open now whose side of this rail is failed.", |n| {
            n.totals.failed as f64
        }),
    ];
    for (name, help, value) in gauges {
        family(&mut s, name, "gauge", help, nics, |n| (nic_labels(n), value(n)));
    }
    let slow = &view.worst.by_latency[..];
    family(
        &mut s,
        "mpib_peer_latency_p99_seconds",
        "gauge",
        "p99 latency of data chains to the slowest peers (live connections).",
        slow,
        |p| (peer_labels(p), seconds(p.latency.p99_ns)),
    );
    family(
        &mut s,
        "mpib_peer_srtt_seconds",
        "gauge",
        "Smoothed RTT to the slowest peers (live connections).",
        slow,
        |p| (peer_labels(p), seconds(p.srtt_ns)),
    );
    let bad = &view.worst.by_errors[..];
    family(
        &mut s,
        "mpib_peer_errors_total",
        "counter",
        "Error completions with the peers that had the most trouble.",
        bad,
        |p| (peer_labels(p), p.counts.errors as f64),
    );
    family(
        &mut s,
        "mpib_peer_failovers_total",
        "counter",
        "Rail failovers with the peers that had the most trouble.",
        bad,
        |p| (peer_labels(p), p.counts.failovers as f64),
    );
    family(
        &mut s,
        "mpib_peer_suspects_total",
        "counter",
        "Silent-rail suspicions with the peers that had the most trouble.",
        bad,
        |p| (peer_labels(p), p.counts.suspects as f64),
    );
    s
}

#[cfg(test)]
#[path = "prom_tests.rs"]
pub(crate) mod tests;
