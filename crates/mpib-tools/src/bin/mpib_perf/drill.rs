//! `--fail-rail`: the failure drill. The sender's plugin drops one rail's connections at
//! chosen times (`MPIB_FAULT_RAIL=RAIL:@AT:FOR[:EVERY]`, soft fabric) while one size streams
//! as with `--timeline`; the figures come from the sender's timeline: its per-rail bytes,
//! its process's failover counters (`mpib_rail_stats`: failovers, re-admissions, replayed
//! bytes) and, per failover, when every send posted before it completed.
//!
//! Per injection k (the k-th failover the counters show):
//! - recovery: from the last sample before the failover showed to the completion of every
//!   send posted before it showed: an upper bound of "detection to the last replayed byte
//!   delivered" (a send completes when all its parts, replayed ones too, were acknowledged);
//! - replayed bytes: the counter's growth until the next injection;
//! - outage throughput: both rails' bytes from the failover to the re-admission, against
//!   the surviving rail alone (a short run with `MPIB_SPLIT` on it before the drill);
//! - return: from the rail working again (the failover's sample + --fail-for: the soft
//!   drill fails its oldest WR at once, so the failover shows within a sample) to the first
//!   sample where the rail's own bytes grow again.

use std::fmt::Write as _;
use std::time::Duration;

use mpib_tools::report::PhaseReport;
use serde_json::{Value, json};

/// The drill's goals: recovery, throughput while a rail is down, return.
const RECOVERY_GOAL_MS: f64 = 5.0;
const OUTAGE_GOAL: f64 = 0.9;
const RETURN_GOAL_MS: f64 = 1000.0;

#[derive(Clone, Debug, PartialEq)]
pub struct Drill {
    /// 0 SOUT, 1 SUP.
    pub rail: usize,
    pub at: Duration,
    pub down: Duration,
    pub every: Duration,
    pub injections: u64,
}

const NAMES: [&str; 2] = ["SOUT", "SUP"];

impl Drill {
    /// The stream's length when --duration is not given: the last injection gets its period,
    /// then a quarter more and a second (the stream's count is chosen from its warm-up's
    /// rate: 20 drops of 1 MiB sends once ended after 16 at a load of 4; the plugin drops
    /// no more than `injections` times).
    pub fn duration(&self) -> Duration {
        (self.at + self.every * self.injections as u32).mul_f64(1.25) + Duration::from_secs(1)
    }

    /// `MPIB_FAULT_RAIL` for the sender's plugin.
    pub fn env(&self) -> String {
        let ms = |d: Duration| d.as_millis();
        let rail = NAMES[self.rail].to_ascii_lowercase();
        let mut v = format!("{rail}:@{}:{}", ms(self.at), ms(self.down));
        if self.injections > 1 {
            let _ = write!(v, ":{}:{}", ms(self.every), self.injections);
        }
        v
    }

    /// The rail that carries the stream while the other is down (for the baseline run).
    pub fn surviving(&self) -> &'static str {
        ["sup", "sout"][self.rail]
    }
}

/// The drill's figures.
#[derive(Clone, Debug, Default)]
pub struct Figures {
    pub seen: u64,
    pub readmitted: u64,
    pub recovery_ms: Vec<f64>,
    pub replayed: Vec<u64>,
    pub outage_bytes: u64,
    pub outage_ns: u64,
    pub return_ms: Vec<f64>,
    /// The surviving rail alone, GB/s (None: the baseline did not run).
    pub alone_gbps: Option<f64>,
}

fn pct(v: &[f64], p: f64) -> f64 {
    let mut s = v.to_vec();
    s.sort_by(f64::total_cmp);
    if s.is_empty() {
        return f64::NAN;
    }
    // Nearest rank: with 20 values p99 is the largest.
    s[((p * s.len() as f64).ceil() as usize).clamp(1, s.len()) - 1]
}

impl Figures {
    pub fn outage_gbps(&self) -> f64 {
        if self.outage_ns == 0 { f64::NAN } else { self.outage_bytes as f64 / self.outage_ns as f64 }
    }

    pub fn ratio(&self) -> Option<f64> {
        self.alone_gbps.map(|a| self.outage_gbps() / a)
    }
}

/// The figures of `d` from the sender's measured phase.
pub fn figures(d: &Drill, tx: &PhaseReport, alone_gbps: Option<f64>) -> Figures {
    let s = tx.tx.clone().unwrap_or_default();
    let (ev, tl) = (&s.failover_events, &s.timeline);
    let mut f = Figures { alone_gbps, ..Figures::default() };
    let first = |pred: &dyn Fn(&[u64; 5]) -> bool| ev.iter().find(|e| pred(e)).copied();
    let replayed_before = |t: u64| ev.iter().take_while(|e| e[0] < t).last().map_or(0, |e| e[3]);
    let total = ev.last().map_or(0, |e| e[1]);
    f.seen = total;
    let detections: Vec<u64> = (1..=total).filter_map(|k| first(&|e| e[1] >= k).map(|e| e[0])).collect();
    for (i, &t) in detections.iter().enumerate() {
        let next = detections.get(i + 1).copied().unwrap_or(u64::MAX);
        f.replayed.push(replayed_before(next).saturating_sub(replayed_before(t)));
        let Some(up) = first(&|e| e[2] > i as u64).map(|e| e[0]) else { continue };
        f.readmitted += 1;
        // Outage: samples from the failover to the re-admission, both rails' bytes.
        let at = |t: u64| tl.iter().position(|x| x[0] >= t).unwrap_or(tl.len().saturating_sub(1));
        let (a, b) = (at(t), at(up));
        if b > a {
            f.outage_bytes += (tl[b][1] + tl[b][2]) - (tl[a][1] + tl[a][2]);
            f.outage_ns += tl[b][0] - tl[a][0];
        }
        // Return: the rail's own bytes grow again.
        let col = 1 + d.rail;
        let carry = (b.max(1)..tl.len()).find(|&j| tl[j][col] > tl[j - 1][col]).map(|j| tl[j][0]);
        if let Some(c) = carry {
            let back = t + d.down.as_nanos() as u64;
            f.return_ms.push((c as f64 - back as f64) / 1e6);
        }
    }
    f.recovery_ms = s.recoveries.iter().map(|[a, b]| (b - a) as f64 / 1e6).collect();
    f
}

/// Whether `v <= goal` (or `>=`), as the line's verdict.
fn verdict(ok: bool) -> &'static str {
    if ok { "met" } else { "MISSED" }
}

/// The drill's lines for the table's end.
pub fn text(d: &Drill, f: &Figures, wrong: u64, load: &str) -> String {
    let mut o = String::new();
    let (rail, other) = (NAMES[d.rail], NAMES[1 - d.rail]);
    let _ = writeln!(
        o,
        "# drill: {rail} dropped {} times from {:.2} s, every {:.2} s, down {:.2} s each (MPIB_FAULT_RAIL={}); load average {load}",
        d.injections,
        d.at.as_secs_f64(),
        d.every.as_secs_f64(),
        d.down.as_secs_f64(),
        d.env()
    );
    let short =
        if f.seen < d.injections { " (the stream ended first, or a drop found the rail still down)" } else { "" };
    let _ = writeln!(o, "# drill: failovers seen {} of {}{short}, re-admitted {}", f.seen, d.injections, f.readmitted);
    let (m, p) = (pct(&f.recovery_ms, 0.5), pct(&f.recovery_ms, 0.99));
    let _ = writeln!(
        o,
        "# drill: detection -> last replayed byte delivered (bound: every send in flight done), {} failovers: median {m:.2} ms, p99 {p:.2} ms (goal <= {RECOVERY_GOAL_MS} ms: {})",
        f.recovery_ms.len(),
        verdict(p <= RECOVERY_GOAL_MS)
    );
    let rep: u64 = f.replayed.iter().sum();
    let med = pct(&f.replayed.iter().map(|&b| b as f64).collect::<Vec<_>>(), 0.5);
    let _ = writeln!(o, "# drill: bytes replayed {rep} in all, median {med:.0} per failover");
    match f.ratio() {
        Some(r) => {
            let _ = writeln!(
                o,
                "# drill: throughput during the outages {:.3} GB/s, {other} alone {:.3} GB/s: {r:.2} (goal >= {OUTAGE_GOAL}: {})",
                f.outage_gbps(),
                f.alone_gbps.unwrap_or(0.0),
                verdict(r >= OUTAGE_GOAL)
            );
        }
        None => {
            let _ = writeln!(o, "# drill: throughput during the outages {:.3} GB/s", f.outage_gbps());
        }
    }
    let (m, p) = (pct(&f.return_ms, 0.5), pct(&f.return_ms, 0.99));
    let _ = writeln!(
        o,
        "# drill: {rail} working again -> both rails carrying, {} returns: median {m:.1} ms, p99 {p:.1} ms (goal <= {RETURN_GOAL_MS} ms: {})",
        f.return_ms.len(),
        verdict(p <= RETURN_GOAL_MS)
    );
    let _ = writeln!(o, "# drill: wrong bytes {wrong}, errors seen by the caller 0");
    o
}

/// The drill's figures for `--json`.
pub fn json(d: &Drill, f: &Figures, load: &str) -> Value {
    json!({
        "rail": NAMES[d.rail],
        "fault_rail": d.env(),
        "injections": d.injections,
        "failovers_seen": f.seen,
        "readmitted": f.readmitted,
        "recovery_ms": f.recovery_ms,
        "recovery_median_ms": pct(&f.recovery_ms, 0.5),
        "recovery_p99_ms": pct(&f.recovery_ms, 0.99),
        "replayed_bytes": f.replayed,
        "outage_gbps": f.outage_gbps(),
        "alone_gbps": f.alone_gbps,
        "outage_ratio": f.ratio(),
        "return_ms": f.return_ms,
        "return_median_ms": pct(&f.return_ms, 0.5),
        "return_p99_ms": pct(&f.return_ms, 0.99),
        "load_average": load,
    })
}

/// `/proc/loadavg`'s three averages.
pub fn load_average() -> String {
    std::fs::read_to_string("/proc/loadavg")
        .map(|s| s.split_whitespace().take(3).collect::<Vec<_>>().join(" "))
        .unwrap_or_else(|_| "?".into())
}

/// Why the drill failed although every byte was right: no failover at all, or a rail not
/// re-admitted. (Fewer failovers than drops is printed, not fatal: a stream that ended
/// early, or a drop while the rail was still down, as --fail-every shorter than the
/// re-admission back-off makes it.)
pub fn check(d: &Drill, f: &Figures) -> Result<(), String> {
    if f.seen == 0 {
        return Err(format!("drill: no drop of the {} rail was seen as a failover", NAMES[d.rail]));
    }
    if f.readmitted < f.seen {
        return Err(format!(
            "drill: the {} rail was re-admitted after {} of {} failovers",
            NAMES[d.rail], f.readmitted, f.seen
        ));
    }
    Ok(())
}
