//! The `mpib-perf --timeline` document and what ci/netem-rails.sh reads from it: rolling-window
//! SOUT shares, the steady share before and after a change, and how long the split took to
//! settle on the new one.
//!
//! Definitions (docs/testing.md, "Emulated rails"):
//! - A *window* is `window_ms` consecutive 1 ms bins starting at bin `s`; its share is SOUT's
//!   part of the bytes posted in it. Per-ms bins alone are too lumpy to judge (the sender posts
//!   a 256 KiB send every ~0.4 ms and the split corrects queue imbalances send by send), so
//!   every figure is over windows; a window in which nothing was posted is skipped.
//! - The *new steady share* is SOUT's part of the bytes posted over the second half of what
//!   follows the change (the last bin, partial, left out); the old one over the second half of
//!   what precedes it.
//! - A window is *within tolerance* when its share is within `tol` (relative) of the new steady
//!   share.
//! - *Settled* at `s`: every window starting in `[s, s + hold_ms)` is within tolerance, and so
//!   `settle_ms` = the first such `s` (a whole bin at or after the change) less the change time.
//!   Holding for `hold_ms` rather than to the end of the run keeps a scheduling stall of the
//!   shared CI machine long after the change from counting as the reaction to it; the strict
//!   form (every later window, to the end) is reported too.

use serde_json::Value;

/// The sender's bytes posted per rail, per millisecond, from `start_mono_ns`.
#[derive(Clone, Debug, PartialEq)]
pub struct Timeline {
    pub size: u64,
    pub start_mono_ns: u64,
    /// `[SOUT, SUP]` bytes posted in each 1 ms bin.
    pub bins: Vec<[u64; 2]>,
}

impl Timeline {
    /// Reads the `--timeline` JSON (`samples[i].sout_bytes`, `.sup_bytes`, 1 ms apart).
    pub fn from_json(v: &Value) -> Result<Self, String> {
        let num = |v: &Value, k: &str| v.get(k).and_then(Value::as_u64).ok_or_else(|| format!("timeline: no `{k}`"));
        if v.get("interval_ms").and_then(Value::as_u64) != Some(1) {
            return Err("timeline: expected 1 ms bins (`interval_ms`: 1)".into());
        }
        let samples = v.get("samples").and_then(Value::as_array).ok_or("timeline: no `samples`")?;
        let bins = samples
            .iter()
            .map(|s| Ok([num(s, "sout_bytes")?, num(s, "sup_bytes")?]))
            .collect::<Result<Vec<_>, String>>()?;
        if bins.is_empty() {
            return Err("timeline: no samples".into());
        }
        Ok(Timeline { size: num(v, "size")?, start_mono_ns: num(v, "start_mono_ns")?, bins })
    }

    /// Bins that count: all but the last, which the end of the stream cuts short.
    pub fn full_bins(&self) -> usize {
        self.bins.len().saturating_sub(1)
    }

    /// SOUT's share of the bytes posted in bins `[from, to)`; None when nothing was.
    pub fn share(&self, from: usize, to: usize) -> Option<f64> {
        let to = to.min(self.bins.len());
        let (a, b) = self.bins[from.min(to)..to].iter().fold((0u64, 0u64), |(a, b), x| (a + x[0], b + x[1]));
        (a + b > 0).then(|| a as f64 / (a + b) as f64)
    }

    /// Bytes per ns posted on each rail in bins `[from, to)`.
    pub fn rates(&self, from: usize, to: usize) -> [f64; 2] {
        let to = to.min(self.bins.len());
        let n = to.saturating_sub(from).max(1) as f64 * 1e6;
        let (a, b) = self.bins[from.min(to)..to].iter().fold((0u64, 0u64), |(a, b), x| (a + x[0], b + x[1]));
        [a as f64 / n, b as f64 / n]
    }
}

/// What [`settle`] found.
#[derive(Clone, Debug, PartialEq)]
pub struct Settle {
    /// The change, in ms after the timeline's start.
    pub change_ms: f64,
    pub before: f64,
    pub after: f64,
    /// ms from the change until settled (held for `hold_ms`); None: never.
    pub settle_ms: Option<f64>,
    /// ms until every later window to the end is within tolerance; None: never.
    pub strict_ms: Option<f64>,
    /// Windows within tolerance of their steady share: over the second half before the
    /// change, and after settling.
    pub within_before: f64,
    pub within_after: f64,
}

/// Analysis parameters.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct Criteria {
    pub window_ms: usize,
    pub tol: f64,
    pub hold_ms: usize,
}

fn within(share: f64, steady: f64, tol: f64) -> bool {
    (share - steady).abs() <= tol * steady
}

/// The fraction of the windows starting in `[from, to)` (those with bytes) within `tol` of `steady`.
fn fraction_within(t: &Timeline, from: usize, to: usize, steady: f64, c: Criteria) -> f64 {
    let shares: Vec<f64> = (from..to).filter_map(|s| t.share(s, s + c.window_ms)).collect();
    shares.iter().filter(|&&x| within(x, steady, c.tol)).count() as f64 / shares.len().max(1) as f64
}

/// Settling after a change at `change_ns` (CLOCK_MONOTONIC, as `start_mono_ns`).
pub fn settle(t: &Timeline, change_ns: u64, c: Criteria) -> Result<Settle, String> {
    let change_ms = (change_ns as f64 - t.start_mono_ns as f64) / 1e6;
    let n = t.full_bins();
    if change_ms < 2.0 * c.window_ms as f64 || change_ms + 4.0 * (c.window_ms + c.hold_ms) as f64 > n as f64 {
        return Err(format!("the change at {change_ms:.1} ms leaves too little of the {n} ms timeline on either side"));
    }
    let first = change_ms.ceil() as usize;
    let before_end = change_ms.floor() as usize;
    let before = t.share(before_end / 2, before_end).ok_or("nothing posted before the change")?;
    let after = t.share(first + (n - first) / 2, n).ok_or("nothing posted after the change")?;
    // Windows that start at or after the change and end within the full bins.
    let last = n - c.window_ms;
    let ok: Vec<Option<bool>> =
        (first..=last).map(|s| t.share(s, s + c.window_ms).map(|x| within(x, after, c.tol))).collect();
    let bad = |i: usize| ok[i] == Some(false);
    let hold = c.hold_ms.max(1);
    let settled = (0..ok.len().saturating_sub(hold)).find(|&i| !(i..i + hold).any(bad));
    let strict = match (0..ok.len()).rev().find(|&i| bad(i)) {
        None => Some(0),
        Some(i) if i + 1 < ok.len() => Some(i + 1),
        Some(_) => None,
    };
    let ms = |i: usize| (first + i) as f64 - change_ms;
    let within_after = settled.map_or(0.0, |i| fraction_within(t, first + i, last + 1, after, c));
    let within_before = fraction_within(t, before_end / 2, before_end.saturating_sub(c.window_ms), before, c);
    Ok(Settle {
        change_ms,
        before,
        after,
        settle_ms: settled.map(ms),
        strict_ms: strict.map(ms),
        within_before,
        within_after,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    const C: Criteria = Criteria { window_ms: 5, tol: 0.05, hold_ms: 50 };

    /// `ms` bins of 1 MB each, SOUT's share from `share(ms)`, starting at 1 s.
    fn timeline(ms: usize, share: impl Fn(usize) -> f64) -> Timeline {
        let bins = (0..ms)
            .map(|i| {
                let a = (share(i) * 1e6) as u64;
                [a, 1_000_000 - a]
            })
            .collect();
        Timeline { size: 262144, start_mono_ns: 1_000_000_000, bins }
    }

    fn at(ms: f64) -> u64 {
        1_000_000_000 + (ms * 1e6) as u64
    }

    #[test]
    fn reads_the_mpib_perf_document() {
        let v = serde_json::json!({"size": 262144, "interval_ms": 1, "start_mono_ns": 5,
            "samples": [{"t_ms": 0, "sout_bytes": 3, "sup_bytes": 1, "sout_share": 0.75},
                        {"t_ms": 1, "sout_bytes": 0, "sup_bytes": 0, "sout_share": null}]});
        let t = Timeline::from_json(&v).unwrap();
        assert_eq!((t.size, t.start_mono_ns, t.bins.clone()), (262144, 5, vec![[3, 1], [0, 0]]));
        assert_eq!((t.share(0, 1), t.share(1, 2), t.full_bins()), (Some(0.75), None, 1));
        let bad = serde_json::json!({"size": 1, "interval_ms": 2, "start_mono_ns": 5, "samples": []});
        assert!(Timeline::from_json(&bad).unwrap_err().contains("1 ms bins"));
    }

    #[test]
    fn a_step_settles_at_once_and_a_ramp_when_it_ends() {
        // A clean step at 300.4 ms: the first whole bin after it is already at the new share.
        let t = timeline(1000, |i| if i < 300 { 2.0 / 3.0 } else { 0.5 });
        let s = settle(&t, at(300.4), C).unwrap();
        assert!((s.before - 2.0 / 3.0).abs() < 1e-6 && (s.after - 0.5).abs() < 1e-6, "{s:?}");
        assert!((s.settle_ms.unwrap() - 0.6).abs() < 1e-9, "{s:?}");
        assert_eq!(s.settle_ms, s.strict_ms);
        assert_eq!((s.within_before, s.within_after), (1.0, 1.0));
        // A linear ramp over 20 ms: within 5 % of 0.5 once the ramp is below 0.525 (from
        // 0.667 at 300 ms), i.e. after 17 ms; a window of 5 bins starting at s holds bins up
        // to s + 4, so it is within once its mean is.
        let ramp = timeline(1000, |i| match i {
            ..300 => 2.0 / 3.0,
            300..320 => 2.0 / 3.0 - (i - 300) as f64 / 20.0 / 6.0,
            _ => 0.5,
        });
        let s = settle(&ramp, at(300.0), C).unwrap();
        let got = s.settle_ms.unwrap();
        assert!((13.0..=17.0).contains(&got), "{s:?}");
    }

    #[test]
    fn a_late_outlier_breaks_only_the_strict_form_and_noise_within_tolerance_is_fine() {
        // ±2 % noise around the shares (alternating), one bad 5 ms stretch 600 ms later.
        let t = timeline(1500, |i| {
            let noise = if i % 2 == 0 { 1.02 } else { 0.98 };
            match i {
                ..300 => 2.0 / 3.0 * noise,
                900..905 => 0.9,
                _ => 0.5 * noise,
            }
        });
        let s = settle(&t, at(300.0), C).unwrap();
        assert!(s.settle_ms.unwrap() < 1.0, "{s:?}");
        assert!((s.strict_ms.unwrap() - 605.0).abs() < 1e-9, "{s:?}");
        assert!(s.within_after > 0.98 && s.within_after < 1.0, "{s:?}");
    }

    #[test]
    fn a_split_that_never_settles_says_so() {
        // Swings of ±20 % every 10 ms: no 50 ms stretch is ever within 5 %.
        let t = timeline(1000, |i| {
            if i < 300 {
                0.6
            } else if (i / 10) % 2 == 0 {
                0.4
            } else {
                0.6
            }
        });
        let s = settle(&t, at(300.0), C).unwrap();
        assert_eq!((s.settle_ms, s.strict_ms), (None, None), "{s:?}");
        assert!(settle(&t, at(995.0), C).unwrap_err().contains("too little"));
    }

    #[test]
    fn idle_windows_neither_pass_nor_fail() {
        let mut t = timeline(1000, |i| if i < 300 { 0.7 } else { 0.5 });
        for b in &mut t.bins[400..420] {
            *b = [0, 0];
        }
        let s = settle(&t, at(300.0), C).unwrap();
        assert_eq!(s.strict_ms, Some(0.0), "{s:?}");
        assert_eq!(t.rates(400, 420), [0.0, 0.0]);
        let r = t.rates(0, 10);
        assert!((r[0] - 0.7).abs() < 1e-5 && (r[1] - 0.3).abs() < 1e-5, "{r:?}");
    }
}
