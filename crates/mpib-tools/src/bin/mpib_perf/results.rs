//! From the two ranks' reports to what the user sees: the table (one row per size), the
//! rails' counters and RTT statistics, the `--stats` view, the `--json` file and the
//! `--timeline` file.
//!
//! The figures are the sending rank's (rank 1): its time per message, its post-to-
//! completion latencies, its comm's counters per size and its process's rail statistics.
//! `#wrong` counts every wrong byte, wrong size and overwritten canary either rank saw in
//! the size's phase and its warm-up.

use std::fmt::Write as _;
use std::path::Path;

use mpib_tools::net::RailStats;
use mpib_tools::report::{PhaseReport, RankReport, SideStats};
use mpib_tools::stats_view::StatsView;
use serde_json::{Value, json};

use super::opts::{Fabric, Plan, TIMELINE_BIN_NS};

/// One size.
#[derive(Clone, Debug, PartialEq)]
pub struct Row {
    pub size: u64,
    /// Messages measured (warm-up not included).
    pub count: u64,
    pub us_per_msg: f64,
    pub gbps: f64,
    /// `gbps` against the slower rail's line rate (both directions' with `--bidir`), where
    /// the plugin knows both rails' rates.
    pub line_share: Option<f64>,
    pub p50_us: f64,
    pub p99_us: f64,
    /// SOUT's part of the bytes the plugin posted (None: no bytes).
    pub sout_share: Option<f64>,
    pub wrong: u64,
}

/// The whole run.
#[derive(Clone, Debug)]
pub struct Summary {
    pub abi: u32,
    pub fabric: String,
    pub device: String,
    pub rows: Vec<Row>,
    /// Messages the sending rank sent, warm-ups included (what its counters count).
    pub messages: u64,
    /// The sending rank's process statistics per rail (None: not an mpib library).
    pub rails: Option<[RailStats; 2]>,
    /// The line rate of each rail of the sender's device (Mbit/s), where both are known.
    pub line_mbps: Option<[u32; 2]>,
    /// The first thing that was wrong, with its size.
    pub first_wrong: Option<String>,
}

fn wrongs(s: &SideStats) -> u64 {
    s.wrong_bytes + s.wrong_sizes + s.canary_broken
}

/// Every side of phase `i` of both ranks, warm-ups included, with "(warm-up)" for those.
fn sides(reps: [&RankReport; 2], i: usize) -> Vec<(&'static str, &SideStats)> {
    let mut out = Vec::new();
    for r in reps {
        for (k, p) in r.phases[i].with_warmup().enumerate() {
            let what = if k == 0 { "" } else { " (warm-up)" };
            out.extend(p.tx.iter().chain(p.rx.iter()).map(|s| (what, s)));
        }
    }
    out
}

fn fabric_name(plan: &Plan, device: &str) -> String {
    match plan.fabric {
        Fabric::Auto if device.starts_with("soft-") => "soft".into(),
        Fabric::Auto if device.starts_with("inproc-") => "inproc".into(),
        Fabric::Auto => "verbs".into(),
        f => f.name().into(),
    }
}

/// The slower rail's line rate in GB/s, for the share of it a run reached: both directions'
/// with `bidir` (a link carries its rate each way).
fn line_gbps(line_mbps: Option<[u32; 2]>, bidir: bool) -> Option<f64> {
    let slower = line_mbps?.into_iter().min().filter(|&m| m > 0)?;
    Some(slower as f64 / 8e3 * if bidir { 2.0 } else { 1.0 })
}

/// The summary of two ranks' reports (`reps[0]` received, `reps[1]` sent; both with
/// `--bidir`), which must have one phase per size.
pub fn summarize(plan: &Plan, reps: [&RankReport; 2]) -> Summary {
    let (r0, r1) = (reps[0], reps[1]);
    let mut rows = Vec::new();
    let mut first_wrong = None;
    let mut messages = 0;
    let empty = SideStats::default();
    let line_mbps = match r1.line_mbps {
        [Some(a), Some(b)] => Some([a, b]),
        _ => None,
    };
    let line = line_gbps(line_mbps, plan.opts.bidir);
    for (i, &size) in plan.sizes.iter().enumerate() {
        let tx = r1.phases.get(i).and_then(|p| p.tx.as_ref()).unwrap_or(&empty);
        let back = r0.phases.get(i).and_then(|p| p.tx.as_ref());
        let both = r0.phases.len() > i && r1.phases.len() > i;
        let wrong: u64 = if both { sides(reps, i).iter().map(|(_, s)| wrongs(s)).sum() } else { 0 };
        if first_wrong.is_none() && wrong > 0 {
            let (what, s) = sides(reps, i).into_iter().find(|(_, s)| wrongs(s) > 0).expect("a side with wrongs");
            first_wrong = Some(format!("size {size}{what}: {}", s.first_wrong));
        }
        messages +=
            r1.phases.get(i).map_or(0, |p| p.with_warmup().filter_map(|q| q.tx.as_ref()).map(|s| s.messages).sum());
        let elapsed = tx.elapsed_ns.max(back.map_or(0, |b| b.elapsed_ns)).max(1) as f64;
        let bytes = tx.bytes + back.map_or(0, |b| b.bytes);
        let sout_share = tx.counters.and_then(|c| {
            let all = c[0].bytes + c[1].bytes;
            (all > 0).then(|| c[0].bytes as f64 / all as f64)
        });
        let gbps = bytes as f64 / elapsed;
        rows.push(Row {
            size,
            count: tx.messages,
            us_per_msg: tx.elapsed_ns as f64 / 1e3 / tx.messages.max(1) as f64,
            gbps,
            line_share: line.map(|l| gbps / l),
            p50_us: tx.lat_p50_ns as f64 / 1e3,
            p99_us: tx.lat_p99_ns as f64 / 1e3,
            sout_share,
            wrong,
        });
    }
    Summary {
        abi: r1.abi,
        fabric: fabric_name(plan, &r1.device),
        device: r1.device.clone(),
        rows,
        messages,
        rails: r1.rails,
        line_mbps,
        first_wrong,
    }
}

fn share_text(s: Option<f64>) -> String {
    s.map_or("-".into(), |s| format!("{:.1}", s * 100.0))
}

/// `400 Gb/s`, `2.5 Gb/s`, `100 Mb/s`.
pub fn speed_text(mbps: u32) -> String {
    if mbps >= 1000 {
        let g = mbps as f64 / 1000.0;
        if mbps.is_multiple_of(1000) { format!("{g:.0} Gb/s") } else { format!("{g} Gb/s") }
    } else {
        format!("{mbps} Mb/s")
    }
}

/// What `%line` is measured against, in words.
fn line_text(s: &Summary, bidir: bool) -> String {
    match s.line_mbps {
        Some([a, b]) => format!(
            "# line rate: SOUT {}, SUP {}; %line is of the slower rail's{}",
            speed_text(a),
            speed_text(b),
            if bidir { " (both directions: twice it)" } else { "" }
        ),
        None => "# line rate: unknown (the NICs report no speed, e.g. loopback): no %line".to_string(),
    }
}

/// The table and the rail lines, as printed.
pub fn table(plan: &Plan, s: &Summary) -> String {
    let mut t = String::new();
    let o = &plan.opts;
    let how = if plan.opts.bidir { "both directions" } else { "rank 1 sends, rank 0 receives" };
    let _ = writeln!(
        t,
        "# mpib-perf: ncclNetPlugin_v{}, device {}: {} ({} fabric), {how}, inflight {}, nrecv {}, split {}, check {}",
        s.abi,
        o.dev,
        s.device,
        s.fabric,
        o.inflight,
        o.nrecv,
        o.split.as_deref().unwrap_or("auto"),
        if plan.workload.check { "every byte" } else { "sizes only" },
    );
    let _ = writeln!(t, "{}", line_text(s, plan.opts.bidir));
    let _ = writeln!(
        t,
        "# {:>10} {:>9} {:>10} {:>8} {:>8} {:>6} {:>9} {:>9} {:>6} {:>7}",
        "size", "count", "us/msg", "GB/s", "Gb/s", "%line", "p50 us", "p99 us", "SOUT%", "#wrong"
    );
    for r in &s.rows {
        let _ = writeln!(
            t,
            "  {:>10} {:>9} {:>10.2} {:>8.3} {:>8.2} {:>6} {:>9.1} {:>9.1} {:>6} {:>7}",
            r.size,
            r.count,
            r.us_per_msg,
            r.gbps,
            r.gbps * 8.0,
            share_text(r.line_share),
            r.p50_us,
            r.p99_us,
            share_text(r.sout_share),
            r.wrong
        );
    }
    match &s.rails {
        Some(rails) => {
            for (name, r) in ["SOUT", "SUP"].iter().zip(rails) {
                let c = &r.counters;
                let _ = writeln!(
                    t,
                    "# {name:<4} WRs {} doorbells {} IMMs {} CQEs {} RNR {} 0-byte IMMs {} bytes {} | RTT samples {} median {:.1} us p99 {:.1} us srtt {:.1} us",
                    c.wr_posted,
                    c.doorbells,
                    c.imm_sent,
                    c.cqe,
                    c.rnr,
                    c.zero_byte_imm,
                    c.bytes,
                    r.latency_samples,
                    r.latency_median_ns as f64 / 1e3,
                    r.latency_p99_ns as f64 / 1e3,
                    r.srtt_ns as f64 / 1e3,
                );
            }
        }
        None => t.push_str("# rails: the library does not export mpib_rail_stats\n"),
    }
    let wrong: u64 = s.rows.iter().map(|r| r.wrong).sum();
    let _ = writeln!(t, "# {} sizes, {} messages sent (warm-ups included), {wrong} wrong", s.rows.len(), s.messages);
    t
}

/// The `--json` document (its schema is stable: other tools read it).
pub fn json(s: &Summary) -> Value {
    let rows: Vec<Value> = s
        .rows
        .iter()
        .map(|r| {
            json!({
                "size": r.size, "count": r.count, "us_per_msg": r.us_per_msg, "gbps": r.gbps,
                "gbits_per_s": r.gbps * 8.0, "line_share": r.line_share,
                "p50_us": r.p50_us, "p99_us": r.p99_us, "sout_share": r.sout_share, "wrong": r.wrong,
            })
        })
        .collect();
    let rails: Vec<Value> = s
        .rails
        .iter()
        .flatten()
        .zip(["SOUT", "SUP"])
        .map(|(r, name)| {
            let c = &r.counters;
            json!({
                "name": name, "wr_posted": c.wr_posted, "doorbells": c.doorbells, "bytes": c.bytes,
                "imm_sent": c.imm_sent, "cqe": c.cqe, "rnr": c.rnr, "zero_byte_imm": c.zero_byte_imm,
                "latency_samples": r.latency_samples, "latency_median_ns": r.latency_median_ns,
                "latency_p99_ns": r.latency_p99_ns, "srtt_ns": r.srtt_ns,
            })
        })
        .collect();
    json!({
        "abi": format!("v{}", s.abi), "fabric": s.fabric, "rows": rows, "messages": s.messages, "rails": rails,
        "line_mbps": s.line_mbps,
    })
}

/// One rank's `--stats` view (None: the library does not export the calls).
pub struct RankView<'a> {
    pub rank: usize,
    pub view: Option<&'a StatsView>,
}

/// The views of the ranks this run ran (each host prints its own rank's).
pub fn views(reps: [&RankReport; 2], ran_here: [bool; 2]) -> Vec<RankView<'_>> {
    (0..2).filter(|&r| ran_here[r]).map(|rank| RankView { rank, view: reps[rank].view.as_ref() }).collect()
}

fn role(rank: usize, bidir: bool) -> &'static str {
    match (bidir, rank) {
        (true, _) => "sends and receives",
        (false, 0) => "receives",
        _ => "sends",
    }
}

/// `--stats` as printed: each rank's per-NIC and per-peer view.
pub fn views_text(views: &[RankView<'_>], bidir: bool) -> String {
    let mut t = String::new();
    for v in views {
        let who = format!("rank {} ({})", v.rank, role(v.rank, bidir));
        match v.view {
            Some(view) => t.push_str(&view.text(&who)),
            None => {
                let _ = writeln!(t, "# {who}: the library does not export mpib_nic_stats / mpib_worst_peers");
            }
        }
    }
    t
}

/// `--stats` in the `--json` document: one entry per rank this run ran.
pub fn views_json(views: &[RankView<'_>]) -> Value {
    Value::Array(
        views
            .iter()
            .map(|v| {
                let mut o = v.view.map_or_else(|| json!({}), StatsView::json);
                o["rank"] = v.rank.into();
                o
            })
            .collect(),
    )
}

/// Bytes the sender posted on (SOUT, SUP) in each millisecond ([`TIMELINE_BIN_NS`]) of the stream, from its
/// samples (`[ns since start, SOUT bytes, SUP bytes]`, cumulative): what was posted between
/// two samples counts in the millisecond of the later one (the sender posts and samples in
/// the same loop, so posts happen at its steps, not spread over a gap between samples).
pub fn per_ms(samples: &[[u64; 3]]) -> Vec<[u64; 2]> {
    let Some(last) = samples.last() else { return Vec::new() };
    let mut slots = vec![[0u64; 2]; (last[0] / TIMELINE_BIN_NS + 1) as usize];
    for w in samples.windows(2) {
        let ([_, a0, b0], [t, a1, b1]) = (w[0], w[1]);
        let slot = &mut slots[(t / TIMELINE_BIN_NS) as usize];
        slot[0] += a1 - a0;
        slot[1] += b1 - b0;
    }
    slots
}

/// The `--timeline` document: the sender's bytes posted per rail in each millisecond
/// `[t_ms, t_ms + 1)` of the measured stream, counted from `start_mono_ns` (the sender's
/// CLOCK_MONOTONIC when the stream began, as `TIMELINE-START` printed it).
pub fn timeline(plan: &Plan, s: &Summary, sender: &PhaseReport) -> Value {
    let tx = sender.tx.clone().unwrap_or_default();
    let samples: Vec<Value> = per_ms(&tx.timeline)
        .into_iter()
        .enumerate()
        .map(|(ms, [sout, sup])| {
            let share = (sout + sup > 0).then(|| sout as f64 / (sout + sup) as f64);
            json!({ "t_ms": ms, "sout_bytes": sout, "sup_bytes": sup, "sout_share": share })
        })
        .collect();
    let row = s.rows.first();
    json!({
        "size": plan.sizes[0],
        "interval_ms": TIMELINE_BIN_NS / 1_000_000,
        "start_mono_ns": sender.start_ns,
        "duration_ms": tx.elapsed_ns as f64 / 1e6,
        "messages": tx.messages,
        "split": plan.opts.split.as_deref().unwrap_or("auto"),
        "gbps": row.map(|r| r.gbps),
        "sout_share": row.and_then(|r| r.sout_share),
        "samples": samples,
        // The sender process's failover counters whenever they changed (ms since the start,
        // both rails summed), and per failover the sample before it showed and when every
        // send posted before then had completed (ms).
        "failover_events": tx.failover_events.iter().map(|[t, f, r, b, s]| json!({
            "t_ms": *t as f64 / 1e6, "failovers": f, "readmissions": r, "replayed_bytes": b, "suspects": s,
        })).collect::<Vec<_>>(),
        "recoveries": tx.recoveries.iter().map(|[a, b]| json!({
            "from_ms": *a as f64 / 1e6, "done_ms": *b as f64 / 1e6,
        })).collect::<Vec<_>>(),
    })
}

/// Writes `v` to `path` (pretty, atomically: a reader sees the old file or the new one).
pub fn write_json(path: &str, v: &Value) -> Result<(), String> {
    let text = serde_json::to_string_pretty(v).map_err(|e| format!("{path}: {e}"))? + "\n";
    let path = Path::new(path);
    // A temporary name in the same directory, renamed over the target: rename is atomic.
    let tmp = path.with_file_name(format!(
        ".{}.tmp{}",
        path.file_name().map(|n| n.to_string_lossy()).unwrap_or_default(),
        std::process::id()
    ));
    std::fs::write(&tmp, text).and_then(|()| std::fs::rename(&tmp, path)).map_err(|e| {
        let _ = std::fs::remove_file(&tmp);
        format!("cannot write {}: {e}", path.display())
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_line_rate_is_the_slower_rails_and_twice_it_both_ways() {
        assert_eq!(line_gbps(Some([400_000, 200_000]), false), Some(25.0));
        assert_eq!(line_gbps(Some([400_000, 200_000]), true), Some(50.0));
        assert_eq!(line_gbps(None, false), None);
        assert_eq!(line_gbps(Some([0, 100_000]), false), None, "a rail of speed 0 gives no rate");
        assert_eq!(
            [speed_text(400_000), speed_text(2_500), speed_text(100)],
            ["400 Gb/s", "2.5 Gb/s", "100 Mb/s"].map(String::from)
        );
    }

    #[test]
    fn per_ms_puts_each_interval_in_the_millisecond_it_ended() {
        let ms = 1_000_000;
        let s = [[10, 0, 0], [ms - 1, 100, 0], [ms + 5, 150, 40], [4 * ms + 2, 150, 90]];
        assert_eq!(per_ms(&s), vec![[100, 0], [50, 40], [0, 0], [0, 0], [0, 50]]);
        assert!(per_ms(&[]).is_empty());
        assert_eq!(per_ms(&[[0, 0, 0]]), vec![[0, 0]]);
    }
}
