//! The outage drill of ci/netem-rails.sh: one rail's veth taken down and up again during an
//! `auto --timeline` run. From the timeline (per-ms bytes per rail, the sender's failover
//! counters when they changed, and per failover when every send posted before it completed)
//! and the times the script took the link down and up (CLOCK_MONOTONIC), per outage:
//! - suspect: from the link going down to the sender's suspect counter moving (the rail
//!   left by new sends: it completed nothing for long while the other rail completed);
//! - failover: from the link going down to the sender's failover counter moving (the sample
//!   that showed it), and to the dead rail's last posted bytes (negative: it had stopped
//!   posting before, its sends stalled behind the link);
//! - recovery: from the last sample before the failover showed to every send posted before
//!   it complete (an upper bound of "detection to the last replayed byte delivered");
//! - outage throughput: both rails' bytes from the failover to the re-admission, against
//!   the surviving rail alone (its median from the script's single-rail runs);
//! - return: from the link up to the re-admission counter moving, and to the first
//!   millisecond the rail posts bytes again.

use plotters::prelude::*;
use serde_json::Value;

use super::timeline::Timeline;

const SOUT: RGBColor = RGBColor(31, 119, 180);
const SUP: RGBColor = RGBColor(255, 127, 14);
const DOWN: RGBColor = RGBColor(214, 39, 40);
const UP: RGBColor = RGBColor(44, 160, 44);

/// One outage's figures (ms; None: not seen in the run).
#[derive(Clone, Debug, Default, PartialEq)]
pub struct Outage {
    pub down_ms: f64,
    pub up_ms: f64,
    pub suspect_ms: Option<f64>,
    pub failover_ms: Option<f64>,
    pub last_bytes_ms: Option<f64>,
    pub recovery_ms: Option<f64>,
    pub readmit_ms: Option<f64>,
    pub carry_ms: Option<f64>,
    /// Both rails' bytes per ns from the failover to the re-admission.
    pub outage_rate: Option<f64>,
}

/// `[t_ms, failovers, readmissions, suspects]` of the timeline's `failover_events`, and its
/// `recoveries` as `[from_ms, done_ms]`.
pub fn events(v: &Value) -> (Vec<[f64; 4]>, Vec<[f64; 2]>) {
    let f = |e: &Value, k: &str| e.get(k).and_then(Value::as_f64).unwrap_or(f64::NAN);
    let ev = v.get("failover_events").and_then(Value::as_array).cloned().unwrap_or_default();
    let rec = v.get("recoveries").and_then(Value::as_array).cloned().unwrap_or_default();
    (
        ev.iter().map(|e| [f(e, "t_ms"), f(e, "failovers"), f(e, "readmissions"), f(e, "suspects")]).collect(),
        rec.iter().map(|e| [f(e, "from_ms"), f(e, "done_ms")]).collect(),
    )
}

/// The figures of each outage `[down_ns, up_ns]` of `rail` (0 SOUT, 1 SUP, 2 both: bytes of
/// either count).
pub fn analyse(t: &Timeline, v: &Value, rail: usize, spans: &[[u64; 2]]) -> Vec<Outage> {
    let (ev, rec) = events(v);
    let ms = |ns: u64| (ns as f64 - t.start_mono_ns as f64) / 1e6;
    let carries = |i: usize| t.bins.get(i).is_some_and(|b| if rail == 2 { b[0] + b[1] > 0 } else { b[rail] > 0 });
    let mut out = Vec::new();
    for (k, &[down, up]) in spans.iter().enumerate() {
        let n = (k + 1) as f64;
        let mut o = Outage { down_ms: ms(down), up_ms: ms(up), ..Outage::default() };
        if o.up_ms >= t.full_bins() as f64 {
            println!("outage {}: after the stream's end ({} ms): not counted", k + 1, t.full_bins());
            continue;
        }
        // The k-th failover and re-admission the counters show, after the link went down.
        let fo = ev.iter().find(|e| e[1] >= n && e[0] >= o.down_ms).map(|e| e[0]);
        let ra = ev.iter().find(|e| e[2] >= n && e[0] >= o.down_ms).map(|e| e[0]);
        o.failover_ms = fo.map(|f| f - o.down_ms);
        // The first suspicion after the link went down (the counter above its value then).
        let before = ev.iter().take_while(|e| e[0] < o.down_ms).last().map_or(0.0, |e| e[3]);
        o.suspect_ms = ev.iter().find(|e| e[0] >= o.down_ms && e[3] > before).map(|e| e[0] - o.down_ms);
        o.readmit_ms = ra.map(|r| r - o.up_ms);
        let end = ra.map_or(t.bins.len(), |r| r as usize);
        // Searched from the start: a rail whose sends stall behind the dead link stops
        // posting before it goes down (a negative figure).
        o.last_bytes_ms = (0..end.min(t.bins.len())).rev().find(|&i| carries(i)).map(|i| i as f64 + 1.0 - o.down_ms);
        let from = ra.unwrap_or(o.up_ms).max(o.up_ms) as usize;
        o.carry_ms = (from..t.full_bins()).find(|&i| carries(i)).map(|i| i as f64 - o.up_ms);
        if let Some(f) = fo {
            o.recovery_ms = rec.iter().find(|r| r[0] <= f && r[1] >= f - 1.0).map(|r| r[1] - r[0]);
        }
        if let (Some(f), Some(r)) = (fo, ra)
            && r as usize > f as usize + 1
        {
            let rates = t.rates(f as usize + 1, r as usize);
            o.outage_rate = Some(rates[0] + rates[1]);
        }
        out.push(o);
    }
    out
}

fn pct(v: &[f64], p: f64) -> Option<f64> {
    let mut s: Vec<f64> = v.iter().copied().filter(|x| x.is_finite()).collect();
    s.sort_by(f64::total_cmp);
    (!s.is_empty()).then(|| s[((p * s.len() as f64).ceil() as usize).clamp(1, s.len()) - 1])
}

fn stat(v: &[Option<f64>]) -> String {
    let s: Vec<f64> = v.iter().flatten().copied().collect();
    match (pct(&s, 0.5), pct(&s, 0.99)) {
        (Some(m), Some(p)) => format!("median {m:.1} ms, p99 {p:.1} ms ({} of {})", s.len(), v.len()),
        _ => format!("never (0 of {})", v.len()),
    }
}

/// Prints the outages' figures; `alone`: the surviving rail's median bytes/ns alone. Returns
/// whether every goal was met (suspect <= 50 ms and the last replayed byte <= 100 ms after
/// the link went down, recovery <= 5 ms, outage >= 0.9 x alone, return <= 1 s; p99).
pub fn report(os: &[Outage], rail: &str, alone: f64) -> bool {
    if rail == "BOTH" {
        return report_both(os);
    }
    for (k, o) in os.iter().enumerate() {
        let f = |v: Option<f64>| v.map_or("never".into(), |x| format!("{x:+.1} ms"));
        println!(
            "outage {}: {rail} down at {:.1} ms, up at {:.1} ms; failover counter {}, {rail}'s last bytes {}; \
             recovery {}; re-admission counter {} after up, {rail} carrying {} after up; outage {}; suspect counter {}",
            k + 1,
            o.down_ms,
            o.up_ms,
            f(o.failover_ms),
            f(o.last_bytes_ms),
            o.recovery_ms.map_or("-".into(), |x| format!("{x:.2} ms")),
            f(o.readmit_ms),
            f(o.carry_ms),
            o.outage_rate.map_or("-".into(), |r| format!("{:.2} Gbit/s", r * 8.0)),
            f(o.suspect_ms),
        );
    }
    let col = |g: fn(&Outage) -> Option<f64>| os.iter().map(g).collect::<Vec<_>>();
    println!("outage summary over {} outages of {rail}:", os.len());
    println!("  link down -> suspect counter: {}", stat(&col(|o| o.suspect_ms)));
    println!("  link down -> failover counter: {}", stat(&col(|o| o.failover_ms)));
    let rec = col(|o| o.recovery_ms);
    println!("  detection -> every send in flight done (bound of the last replayed byte): {}", stat(&rec));
    let delivered = col(|o| Some(o.failover_ms? + o.recovery_ms?));
    println!("  link down -> last replayed byte delivered (bound): {}", stat(&delivered));
    let (mut bytes, mut ns) = (0.0, 0.0);
    for o in os {
        if let (Some(f), Some(r), Some(rate)) = (o.failover_ms, o.readmit_ms, o.outage_rate) {
            let d = (o.up_ms + r) - (o.down_ms + f);
            bytes += rate * d;
            ns += d;
        }
    }
    let ratio = if ns > 0.0 && alone > 0.0 { bytes / ns / alone } else { f64::NAN };
    println!(
        "  throughput during the outages {:.2} Gbit/s, the other rail alone {:.2} Gbit/s: {ratio:.2}",
        if ns > 0.0 { bytes / ns * 8.0 } else { f64::NAN },
        alone * 8.0
    );
    let ret = col(|o| o.carry_ms);
    println!("  link up -> {rail} carrying again: {}", stat(&ret));
    let flat = |v: &[Option<f64>]| v.iter().map(|x| x.unwrap_or(f64::INFINITY)).collect::<Vec<_>>();
    let p99 = |v: &[Option<f64>]| pct(&flat(v), 0.99).unwrap_or(f64::INFINITY);
    let goals = [
        ("suspect_p99_ms <= 50", p99(&col(|o| o.suspect_ms)) <= 50.0),
        ("delivered_p99_ms <= 100", p99(&delivered) <= 100.0),
        ("recovery_p99_ms <= 5", p99(&rec) <= 5.0),
        ("outage_vs_alone >= 0.9", ratio >= 0.9),
        ("return_p99_ms <= 1000", p99(&ret) <= 1000.0),
    ];
    let line: Vec<String> = goals.iter().map(|(g, ok)| format!("{g} {}", if *ok { "met" } else { "MISSED" })).collect();
    println!("outage goals: {}", line.join(", "));
    goals.iter().all(|(_, ok)| *ok)
}

/// Both rails down together: no rail to fail over to, so no failover and no error while RC's
/// grace lasts; the stream stalls and goes on once the links are back.
fn report_both(os: &[Outage]) -> bool {
    let f = |v: Option<f64>| v.map_or("never".into(), |x| format!("{x:+.1} ms"));
    for (k, o) in os.iter().enumerate() {
        println!(
            "outage {}: both rails down at {:.1} ms, up at {:.1} ms; failover counter {}, suspect counter {}; \
             carrying again {} after up",
            k + 1,
            o.down_ms,
            o.up_ms,
            f(o.failover_ms),
            f(o.suspect_ms),
            f(o.carry_ms)
        );
    }
    let quiet = os.iter().all(|o| o.failover_ms.is_none() && o.suspect_ms.is_none());
    let back = os.iter().all(|o| o.carry_ms.is_some());
    println!(
        "outage goals: no failover or suspicion while both are down {}, carrying again after {}",
        if quiet { "met" } else { "MISSED" },
        if back { "met" } else { "MISSED" }
    );
    quiet && back
}

/// The outage run as a picture: both rails' Gbit/s in 10 ms windows, each outage's down (red)
/// and up (green) moments, and where the counters saw the failover and the re-admission.
pub fn draw(path: &str, t: &Timeline, os: &[Outage], rail: &str) -> Result<(), Box<dyn std::error::Error>> {
    let root = SVGBackend::new(path, (1100, 420)).into_drawing_area();
    root.fill(&WHITE)?;
    let w = 10;
    let n = t.full_bins();
    let pts: Vec<(f64, [f64; 2])> = (0..n.saturating_sub(w)).map(|s| (s as f64, t.rates(s, s + w))).collect();
    let ymax = pts.iter().map(|(_, r)| (r[0] + r[1]) * 8.0).fold(0.5, f64::max) * 1.15;
    let mut ch = ChartBuilder::on(&root)
        .caption(format!("mpib rail failover on emulated rails: {rail}'s veth down and up again"), ("sans-serif", 20))
        .margin(12)
        .x_label_area_size(36)
        .y_label_area_size(56)
        .build_cartesian_2d(0f64..n as f64, 0f64..ymax)?;
    ch.configure_mesh()
        .x_desc("ms since TIMELINE-START")
        .y_desc(format!("Gbit/s posted ({w} ms windows)"))
        .light_line_style(WHITE)
        .draw()?;
    for (i, (name, color)) in [("SOUT", SOUT), ("SUP", SUP)].into_iter().enumerate() {
        ch.draw_series(LineSeries::new(pts.iter().map(|(x, r)| (*x, r[i] * 8.0)), color.stroke_width(1)))?
            .label(name)
            .legend(move |(x, y)| PathElement::new(vec![(x, y), (x + 20, y)], color.stroke_width(2)));
    }
    let vl = |x: f64, c: RGBColor| PathElement::new(vec![(x, 0.0), (x, ymax)], c.stroke_width(2));
    ch.draw_series(os.iter().map(|o| vl(o.down_ms, DOWN)))?
        .label("link down")
        .legend(|(x, y)| PathElement::new(vec![(x, y), (x + 20, y)], DOWN.stroke_width(2)));
    ch.draw_series(os.iter().map(|o| vl(o.up_ms, UP)))?
        .label("link up")
        .legend(|(x, y)| PathElement::new(vec![(x, y), (x + 20, y)], UP.stroke_width(2)));
    let mark = |x: f64, c: RGBColor| TriangleMarker::new((x, ymax * 0.95), 6, c.filled());
    ch.draw_series(os.iter().filter_map(|o| o.failover_ms.map(|f| mark(o.down_ms + f, DOWN))))?
        .label("failover (counter)")
        .legend(|(x, y)| TriangleMarker::new((x + 10, y), 5, DOWN.filled()));
    ch.draw_series(os.iter().filter_map(|o| o.readmit_ms.map(|r| mark(o.up_ms + r, UP))))?
        .label("re-admitted (counter)")
        .legend(|(x, y)| TriangleMarker::new((x + 10, y), 5, UP.filled()));
    ch.configure_series_labels()
        .position(SeriesLabelPosition::LowerRight)
        .border_style(BLACK)
        .background_style(WHITE.mix(0.9))
        .draw()?;
    root.present()?;
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    /// 400 ms of 1 ms bins from `start` (1 s): SUP carries nothing from 100 to 250 ms.
    fn run() -> (Timeline, Value) {
        let bins = (0..400).map(|i| [1000, if (100..250).contains(&i) { 0 } else { 500 }]).collect();
        let t = Timeline { size: 262144, start_mono_ns: 1_000_000_000, bins };
        let ev = |t_ms: f64, f: u64, r: u64, s: u64| serde_json::json!({"t_ms": t_ms, "failovers": f, "readmissions": r, "replayed_bytes": 0, "suspects": s});
        let v = serde_json::json!({
            "failover_events": [ev(0.0, 0, 0, 0), ev(50.0, 0, 0, 1), ev(60.0, 0, 0, 1), ev(122.0, 0, 0, 2),
                                ev(152.0, 1, 0, 2), ev(251.0, 1, 1, 2)],
            "recoveries": [{"from_ms": 151.0, "done_ms": 154.0}],
        });
        (t, v)
    }

    #[test]
    fn an_outage_is_measured_from_the_link_going_down() {
        let (t, v) = run();
        // Down at 100 ms, up at 240 ms (CLOCK_MONOTONIC, the timeline starting at 1 s).
        let os = analyse(&t, &v, 1, &[[1_100_000_000, 1_240_000_000]]);
        assert_eq!(os.len(), 1);
        let o = &os[0];
        // The suspicion before the outage (50 ms) is not this one's: the next, at 122 ms.
        assert_eq!(o.suspect_ms, Some(22.0));
        assert_eq!(o.failover_ms, Some(52.0));
        assert_eq!(o.recovery_ms, Some(3.0));
        assert_eq!(o.readmit_ms, Some(11.0));
        assert_eq!(o.carry_ms, Some(11.0), "from the re-admission on: its first bin with bytes");
        assert!(report(&os, "SUP", 1000.0 / 1e6), "every goal met: {o:?}");
    }

    #[test]
    fn both_rails_down_wants_no_failover_and_traffic_after() {
        let (t, v) = run();
        // Both "down" from 100 to 240 ms: either rail's bytes count as carrying.
        let quiet = serde_json::json!({"failover_events": [], "recoveries": []});
        let os = analyse(&t, &quiet, 2, &[[1_100_000_000, 1_240_000_000]]);
        assert_eq!((os[0].failover_ms, os[0].suspect_ms, os[0].carry_ms), (None, None, Some(0.0)));
        assert!(report(&os, "BOTH", 0.0));
        let blamed = analyse(&t, &v, 2, &[[1_100_000_000, 1_240_000_000]]);
        assert!(!report(&blamed, "BOTH", 0.0), "a failover while both were down is a missed goal");
    }
}
