//! Latency statistics of a rail: a fixed-size log-linear histogram (as HdrHistogram):
//! values below 128 ns have a bucket each; above, every power of two is cut into 64 equal
//! buckets, so a bucket is at most 1/64 of its lower bound wide and its midpoint is within
//! 1/128 (0.8 %) of any value in it. Up to 2^40 ns (18 minutes); longer values land in the
//! last bucket. Recording is a bucket index (one `leading_zeros`) and four single-writer
//! counter updates: no lock, and an allocation only for a power of two's first value (its
//! 64 buckets come into being then: a rail's latencies span a few powers of two, so a live
//! histogram holds a few hundred bytes of its 17.5 KiB range). Histograms add bucket by
//! bucket, so live and closed connections fold into one process-wide picture.

use std::sync::OnceLock;

use super::counter::Counter;

/// Values below this have a bucket of their own.
const LINEAR: u64 = 128;
/// log2 of the buckets per power of two above [`LINEAR`].
const SUB_BITS: u32 = 6;
/// Values of 2^MAX_EXP ns and more share the last bucket.
const MAX_EXP: u32 = 40;
/// Number of buckets.
pub const BUCKETS: usize = LINEAR as usize + ((MAX_EXP - 7) << SUB_BITS) as usize;
/// Buckets per group, the unit a live histogram allocates: a power of two's buckets (the
/// linear ones make two groups).
const GROUP: usize = 1 << SUB_BITS;
/// Number of groups.
const GROUPS: usize = BUCKETS / GROUP;
// `bucket_of` takes the linear range for two groups (its index is HdrHistogram's).
const _: () = assert!(LINEAR == 2 << SUB_BITS && BUCKETS.is_multiple_of(GROUP));

/// The bucket holding `v`, without a branch (HdrHistogram's index): `b` is 0 below
/// [`LINEAR`], else how far the value's top 7 bits lie above bit 0 (`v >> b` is then in
/// 64..128, the upper half of the linear range); values of 2^MAX_EXP and more clamp to the
/// last bucket.
#[inline]
fn bucket_of(v: u64) -> usize {
    let b = 63 - SUB_BITS - (v | (LINEAR - 1)).leading_zeros();
    (((b as usize) << SUB_BITS) + (v >> b) as usize).min(BUCKETS - 1)
}

/// The values `[lo, hi)` that land in bucket `i`.
fn bucket_range(i: usize) -> (u64, u64) {
    if i < LINEAR as usize {
        return (i as u64, i as u64 + 1);
    }
    let k = i - LINEAR as usize;
    let e = 7 + (k >> SUB_BITS) as u32;
    let sub = (k & ((1 << SUB_BITS) - 1)) as u64;
    let shift = e - SUB_BITS;
    let lo = ((1 << SUB_BITS) + sub) << shift;
    (lo, lo + (1 << shift))
}

/// The live histogram of one rail of one connection: written by its data path only
/// ([`Counter`]'s single-writer rule), read by anyone. A group of buckets exists once a
/// value landed in it (none: all its counts are 0).
#[derive(Debug)]
pub struct LatencyHistogram {
    groups: [OnceLock<Box<[Counter; GROUP]>>; GROUPS],
    sum: Counter,
    min: Counter,
    max: Counter,
}

impl Default for LatencyHistogram {
    fn default() -> Self {
        LatencyHistogram {
            groups: std::array::from_fn(|_| OnceLock::new()),
            sum: Counter::default(),
            min: Counter::new(u64::MAX),
            max: Counter::default(),
        }
    }
}

impl LatencyHistogram {
    /// Records one latency (single writer).
    #[inline]
    pub fn record(&self, ns: u64) {
        let i = bucket_of(ns);
        // The slow path starts over from `ns`, so that nothing else is kept across the
        // branch (registers the data path around this needs).
        let Some(group) = self.groups[i / GROUP].get() else { return self.record_first_in_group(ns) };
        group[i % GROUP].add(1);
        self.record_rest(ns);
    }

    /// [`Self::record`] of a value whose group does not exist yet: allocates it (a group's
    /// first value only, out of line).
    #[cold]
    #[inline(never)]
    fn record_first_in_group(&self, ns: u64) {
        let i = bucket_of(ns);
        let group = self.groups[i / GROUP].get_or_init(|| Box::new(std::array::from_fn(|_| Counter::default())));
        group[i % GROUP].add(1);
        self.record_rest(ns);
    }

    /// The sum, minimum and maximum of a value recorded.
    #[inline(always)]
    fn record_rest(&self, ns: u64) {
        self.sum.add(ns);
        if ns < self.min.get() {
            self.min.set(ns);
        }
        if ns > self.max.get() {
            self.max.set(ns);
        }
    }
}

/// A plain copy of histograms, summed; what summaries are computed from.
#[derive(Clone, Debug, PartialEq)]
pub struct HistogramSnapshot {
    buckets: Box<[u64]>,
    sum: u64,
    min: u64,
    max: u64,
}

impl Default for HistogramSnapshot {
    fn default() -> Self {
        HistogramSnapshot { buckets: vec![0; BUCKETS].into_boxed_slice(), sum: 0, min: u64::MAX, max: 0 }
    }
}

/// Latency statistics as the statistics file shows them (ns; all 0 without samples).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct LatencySummary {
    pub samples: u64,
    pub min_ns: u64,
    pub avg_ns: u64,
    pub median_ns: u64,
    pub p95_ns: u64,
    pub p99_ns: u64,
    pub max_ns: u64,
}

impl HistogramSnapshot {
    /// Adds a live histogram's current counts.
    pub fn add_live(&mut self, h: &LatencyHistogram) {
        for (into, group) in self.buckets.chunks_exact_mut(GROUP).zip(&h.groups) {
            let Some(from) = group.get() else { continue };
            for (into, from) in into.iter_mut().zip(from.iter()) {
                *into += from.get();
            }
        }
        self.sum += h.sum.get();
        self.min = self.min.min(h.min.get());
        self.max = self.max.max(h.max.get());
    }

    /// Adds another snapshot's counts.
    pub fn add(&mut self, o: &HistogramSnapshot) {
        for (into, from) in self.buckets.iter_mut().zip(o.buckets.iter()) {
            *into += from;
        }
        self.sum += o.sum;
        self.min = self.min.min(o.min);
        self.max = self.max.max(o.max);
    }

    pub fn samples(&self) -> u64 {
        self.buckets.iter().sum()
    }

    /// The nearest-rank `q`-quantile (`0 < q <= 1`): the smallest recorded value with at
    /// least `ceil(q·n)` values at or below it, as the midpoint of its bucket (kept within
    /// the exact minimum and maximum). `None` without samples.
    pub fn quantile(&self, q: f64) -> Option<u64> {
        let n = self.samples();
        if n == 0 {
            return None;
        }
        let rank = ((q * n as f64).ceil() as u64).clamp(1, n);
        let mut seen = 0;
        for (i, &c) in self.buckets.iter().enumerate() {
            seen += c;
            if seen >= rank {
                let (lo, hi) = bucket_range(i);
                let mid = lo + (hi - 1 - lo) / 2;
                return Some(mid.clamp(self.min, self.max.max(self.min)));
            }
        }
        Some(self.max)
    }

    pub fn summary(&self) -> LatencySummary {
        let samples = self.samples();
        if samples == 0 {
            return LatencySummary::default();
        }
        let q = |q| self.quantile(q).unwrap_or(0);
        LatencySummary {
            samples,
            min_ns: self.min,
            avg_ns: self.sum / samples,
            median_ns: q(0.5),
            p95_ns: q(0.95),
            p99_ns: q(0.99),
            max_ns: self.max,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The exact nearest-rank quantile of sorted values.
    fn exact(sorted: &[u64], q: f64) -> u64 {
        let rank = ((q * sorted.len() as f64).ceil() as usize).clamp(1, sorted.len());
        sorted[rank - 1]
    }

    fn live(values: &[u64]) -> LatencyHistogram {
        let h = LatencyHistogram::default();
        for &v in values {
            h.record(v);
        }
        h
    }

    fn snapshot(values: &[u64]) -> HistogramSnapshot {
        let mut s = HistogramSnapshot::default();
        s.add_live(&live(values));
        s
    }

    #[test]
    fn buckets_tile_the_range_without_gaps() {
        let mut next = 0;
        for i in 0..BUCKETS {
            let (lo, hi) = bucket_range(i);
            assert_eq!(lo, next, "bucket {i}");
            assert!(hi > lo);
            assert!((hi - lo) as f64 <= lo.max(64) as f64 / 64.0, "bucket {i} [{lo},{hi}) too wide");
            assert_eq!(bucket_of(lo), i);
            assert_eq!(bucket_of(hi - 1), i);
            next = hi;
        }
        assert_eq!(next, 1 << MAX_EXP);
        assert_eq!(bucket_of(u64::MAX), BUCKETS - 1);
    }

    #[test]
    fn small_values_are_exact() {
        let s = snapshot(&[3, 1, 2, 100, 7]).summary();
        assert_eq!(
            s,
            LatencySummary { samples: 5, min_ns: 1, avg_ns: 22, median_ns: 3, p95_ns: 100, p99_ns: 100, max_ns: 100 }
        );
    }

    #[test]
    fn percentiles_within_one_percent_of_exact() {
        // Latency-like data: a log-normal-ish body from 2 µs up, and a heavy tail.
        let mut x = 0x2545f4914f6cdd1du64;
        let mut values: Vec<u64> = (0..100_000)
            .map(|i| {
                x ^= x << 13;
                x ^= x >> 7;
                x ^= x << 17;
                let body = 2_000 + (x % 1000) * (x % 997) / 7;
                if i % 97 == 0 { body * 40 } else { body }
            })
            .collect();
        let s = snapshot(&values);
        values.sort_unstable();
        for q in [0.01, 0.25, 0.5, 0.9, 0.95, 0.99, 0.999, 1.0] {
            let (got, want) = (s.quantile(q).unwrap(), exact(&values, q));
            let err = got.abs_diff(want) as f64 / want as f64;
            assert!(err <= 0.01, "q={q}: {got} vs exact {want} ({:.3} %)", err * 100.0);
        }
        let sum = s.summary();
        assert_eq!((sum.min_ns, sum.max_ns, sum.samples), (values[0], values[values.len() - 1], 100_000));
        assert_eq!(sum.avg_ns, values.iter().sum::<u64>() / values.len() as u64, "the average is exact");
    }

    #[test]
    fn merged_histograms_equal_one_histogram_of_all_values() {
        let a: Vec<u64> = (0..5000).map(|i| 1000 + i * 3).collect();
        let b: Vec<u64> = (0..3000).map(|i| 50_000 + i * 101).collect();
        let mut merged = snapshot(&a);
        merged.add_live(&live(&b));
        let all: Vec<u64> = a.iter().chain(&b).copied().collect();
        assert_eq!(merged, snapshot(&all));
    }

    #[test]
    fn empty_and_huge() {
        assert_eq!(HistogramSnapshot::default().summary(), LatencySummary::default());
        assert_eq!(HistogramSnapshot::default().quantile(0.5), None);
        let s = snapshot(&[u64::MAX / 2]);
        assert_eq!(s.summary().p99_ns, u64::MAX / 2, "clamped to the exact maximum");
    }

    #[test]
    fn a_live_histogram_holds_only_the_groups_it_recorded_into() {
        let h = LatencyHistogram::default();
        assert!(h.groups.iter().all(|g| g.get().is_none()), "a new histogram holds no buckets");
        for v in [5, 3_000, 3_100, 1 << 30, 3_000] {
            h.record(v);
        }
        let held: Vec<usize> = (0..GROUPS).filter(|&g| h.groups[g].get().is_some()).collect();
        assert_eq!(held, [0, bucket_of(3_000) / GROUP, bucket_of(1 << 30) / GROUP]);
        let mut s = HistogramSnapshot::default();
        s.add_live(&h);
        assert_eq!((s.buckets[5], s.buckets[bucket_of(3_000)], s.buckets[bucket_of(3_100)]), (1, 2, 1));
        assert_eq!(s.buckets[bucket_of(1 << 30)], 1);
        assert_eq!(s.samples(), 5);
    }
}
