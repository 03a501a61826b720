//! The process-wide registry of rail statistics: every live connection's [`RailStats`],
//! plus what closed connections left behind, so figures are summed over the whole run.
//!
//! Its lock is taken only on the control path (a connection registering or closing, the
//! statistics writer, the query function); the data path writes its own `RailStats`
//! through its handle without it. A closing connection removes its block and folds it
//! into the closed totals under one lock, so a reader sees its counts exactly once.

use std::ops::Deref;
use std::sync::{Arc, LazyLock};

use parking_lot::Mutex;

use super::histogram::{HistogramSnapshot, LatencySummary};
use super::stats::{RailCounts, RailStats};

/// Per-rail figures over the whole process: every counter summed over live and closed
/// connections, their latency statistics, and the current estimates.
#[derive(Clone, Copy, Debug, Default, PartialEq)]
pub struct RailTotals {
    pub counts: RailCounts,
    pub latency: LatencySummary,
    /// This rail's part of the payload bytes of both rails (0 when none were sent).
    pub share: f64,
    /// Mean over live connections with RTT samples; without any, the last closed one's.
    pub srtt_ns: u64,
    pub rttvar_ns: u64,
    pub base_ns: u64,
    pub bw_bytes_per_s: u64,
    /// Live connections with statistics on this rail.
    pub live: u64,
    /// Live connections whose side of this rail is failed now (failover).
    pub failed: u64,
}

#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
struct Gauges {
    srtt_ns: u64,
    rttvar_ns: u64,
    base_ns: u64,
    bw_bytes_per_s: u64,
}

impl Gauges {
    fn of(s: &RailStats) -> Option<Gauges> {
        (s.counters.rtt_samples.get() > 0).then(|| Gauges {
            srtt_ns: s.gauges.srtt_ns.get(),
            rttvar_ns: s.gauges.rttvar_ns.get(),
            base_ns: s.gauges.base_ns.get(),
            bw_bytes_per_s: s.gauges.bw_bytes_per_s.get(),
        })
    }
}

#[derive(Default)]
struct Closed {
    counts: RailCounts,
    latency: HistogramSnapshot,
    last_gauges: Option<Gauges>,
}

#[derive(Default)]
struct Inner {
    live: Vec<Arc<RailStats>>,
    closed: [Closed; 2],
}

/// A set of rail statistics; the process has one ([`global`]).
#[derive(Default)]
pub struct Registry {
    inner: Mutex<Inner>,
}

impl Registry {
    /// A new block for rail `rail` of a new connection, live until the handle drops.
    pub fn register(&'static self, rail: usize) -> StatsHandle {
        let stats = Arc::new(RailStats::new(rail));
        self.inner.lock().live.push(stats.clone());
        StatsHandle { stats, registry: Some(self) }
    }

    fn retire(&self, stats: &Arc<RailStats>) {
        let mut inner = self.inner.lock();
        if let Some(i) = inner.live.iter().position(|s| Arc::ptr_eq(s, stats)) {
            inner.live.swap_remove(i);
        }
        let closed = &mut inner.closed[stats.rail()];
        closed.counts.add(&stats.counters.load());
        closed.latency.add_live(&stats.latency);
        if let Some(g) = Gauges::of(stats) {
            closed.last_gauges = Some(g);
        }
    }

    /// Both rails' figures, summed over live and closed connections.
    pub fn totals(&self) -> [RailTotals; 2] {
        let inner = self.inner.lock();
        let mut out = [RailTotals::default(); 2];
        for (rail, t) in out.iter_mut().enumerate() {
            let closed = &inner.closed[rail];
            let mut counts = closed.counts;
            let mut latency = closed.latency.clone();
            let (mut gauge_sum, mut with_samples) = (Gauges::default(), 0u64);
            for s in inner.live.iter().filter(|s| s.rail() == rail) {
                t.live += 1;
                t.failed += s.gauges.failed.get();
                counts.add(&s.counters.load());
                latency.add_live(&s.latency);
                if let Some(g) = Gauges::of(s) {
                    gauge_sum.srtt_ns += g.srtt_ns;
                    gauge_sum.rttvar_ns += g.rttvar_ns;
                    gauge_sum.base_ns += g.base_ns;
                    gauge_sum.bw_bytes_per_s += g.bw_bytes_per_s;
                    with_samples += 1;
                }
            }
            let g = match with_samples {
                0 => closed.last_gauges.unwrap_or_default(),
                n => Gauges {
                    srtt_ns: gauge_sum.srtt_ns / n,
                    rttvar_ns: gauge_sum.rttvar_ns / n,
                    base_ns: gauge_sum.base_ns / n,
                    bw_bytes_per_s: gauge_sum.bw_bytes_per_s / n,
                },
            };
            t.counts = counts;
            t.latency = latency.summary();
            (t.srtt_ns, t.rttvar_ns, t.base_ns, t.bw_bytes_per_s) =
                (g.srtt_ns, g.rttvar_ns, g.base_ns, g.bw_bytes_per_s);
        }
        let all = out[0].counts.bytes + out[1].counts.bytes;
        if all > 0 {
            for t in out.iter_mut() {
                t.share = t.counts.bytes as f64 / all as f64;
            }
        }
        out
    }
}

/// The process's registry.
pub fn global() -> &'static Registry {
    static GLOBAL: LazyLock<Registry> = LazyLock::new(Registry::default);
    &GLOBAL
}

/// Both rails' figures for the whole process, summed over the run (live connections and
/// everything closed ones left behind): what the `mpib_*` query function returns.
pub fn process_totals() -> [RailTotals; 2] {
    global().totals()
}

/// One connection's statistics block for one rail. Its owner (the connection's data path)
/// is the only writer; dropping it (connection close) folds its figures into the totals.
/// Not `Clone`: two writers would lose updates.
#[derive(Debug)]
pub struct StatsHandle {
    stats: Arc<RailStats>,
    registry: Option<&'static Registry>,
}

impl StatsHandle {
    /// Statistics of rail `rail` of a new connection in the process registry.
    pub fn register(rail: usize) -> StatsHandle {
        global().register(rail)
    }

    /// Statistics kept but published nowhere (tests, tools).
    pub fn detached(rail: usize) -> StatsHandle {
        StatsHandle { stats: Arc::new(RailStats::new(rail)), registry: None }
    }
}

impl Deref for StatsHandle {
    type Target = RailStats;
    fn deref(&self) -> &RailStats {
        &self.stats
    }
}

impl Drop for StatsHandle {
    fn drop(&mut self) {
        if let Some(r) = self.registry {
            r.retire(&self.stats);
        }
    }
}

impl std::fmt::Debug for Registry {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Registry").field("live", &self.inner.lock().live.len()).finish()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn registry() -> &'static Registry {
        Box::leak(Box::default())
    }

    #[test]
    fn closed_connections_stay_in_the_totals() {
        let r = registry();
        let a = r.register(0);
        let b = r.register(1);
        a.count_post(2, 1, 3000, 4000);
        b.count_post(2, 1, 1000, 4000);
        a.latency.record(1000);
        a.latency.record(3000);
        let before = r.totals();
        assert_eq!((before[0].live, before[1].live), (1, 1));
        assert_eq!((before[0].share, before[1].share), (0.75, 0.25));
        drop(a);
        let after = r.totals();
        assert_eq!(after[0].live, 0);
        assert_eq!(after[0].counts, before[0].counts, "the closed connection's counts remain");
        assert_eq!(after[0].latency, before[0].latency);
        assert_eq!(after[0].latency.samples, 2);
        // A later connection adds to what the closed one left.
        let c = r.register(0);
        c.count_post(1, 1, 1000, 2000);
        c.latency.record(2000);
        let t = r.totals();
        assert_eq!((t[0].counts.bytes, t[0].counts.doorbells, t[0].latency.samples), (4000, 2, 3));
        // The median of {1000, 2000, 3000}, within the histogram's 1/128 bucket error.
        assert!(t[0].latency.median_ns.abs_diff(2000) <= 2000 / 128, "{}", t[0].latency.median_ns);
        assert_eq!(t[0].share, 0.8);
    }

    #[test]
    fn estimates_are_the_mean_of_live_rails_then_the_last_closed_one() {
        let r = registry();
        let a = r.register(1);
        let b = r.register(1);
        let idle = r.register(1); // a receive side: counters but never an RTT sample
        for (h, srtt) in [(&a, 1000), (&b, 3000)] {
            h.counters.rtt_samples.add(1);
            h.gauges.srtt_ns.set(srtt);
            h.gauges.bw_bytes_per_s.set(srtt * 1000);
        }
        let t = r.totals()[1];
        assert_eq!((t.srtt_ns, t.bw_bytes_per_s, t.live), (2000, 2_000_000, 3));
        drop(a);
        drop(b);
        drop(idle);
        let t = r.totals()[1];
        assert_eq!((t.srtt_ns, t.live), (3000, 0), "the last closed rail with samples");
        assert_eq!(r.totals()[0], RailTotals::default());
    }

    #[test]
    fn detached_handles_publish_nothing() {
        let h = StatsHandle::detached(0);
        h.count_post(1, 1, 10, 10);
        assert_eq!(h.counters.bytes.get(), 10);
        drop(h);
    }
}
