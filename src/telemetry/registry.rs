//! A registry of rail statistics: every live connection's [`RailStats`], plus what closed
//! connections left behind, so figures are summed over the whole run. Each plugin instance
//! owns one (`plugin::InstanceState`); the process's is reached from the ABI edge.
//!
//! Its lock is taken only on the control path (a connection registering or closing, the
//! statistics writer, the query function); the data path writes its own `RailStats`
//! through its handle without it. A closing connection removes its block and folds it
//! into the closed totals under one lock, so a reader sees its counts exactly once.

use std::collections::BTreeMap;
use std::ops::Deref;
use std::sync::Arc;

use parking_lot::Mutex;

use super::histogram::{HistogramSnapshot, LatencySummary};
use super::stats::{RailCounts, RailStats, StatsPlace};

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

/// One NIC's figures on one rail (`name:port`; a NIC both rails use has two), over the
/// whole run: what the per-NIC view shows.
#[derive(Clone, Debug, PartialEq)]
pub struct NicTotals {
    pub nic: Arc<str>,
    pub rail: usize,
    /// `share` is this NIC's and rail's part of the payload bytes of every row.
    pub totals: RailTotals,
}

/// One peer address as one local NIC reaches it on one rail: counters over the whole run,
/// latency and estimates of the live connections (a closed connection leaves its counters
/// only, so that a job with thousands of peers keeps no histogram per closed peer).
#[derive(Clone, Debug, PartialEq)]
pub struct PeerTotals {
    pub peer: Arc<str>,
    pub nic: Arc<str>,
    pub rail: usize,
    pub counts: RailCounts,
    pub latency: LatencySummary,
    /// Mean over live connections with RTT samples, else 0.
    pub srtt_ns: u64,
    pub live: u64,
}

impl PeerTotals {
    /// What the error ranking counts: error completions, failovers and silent-rail suspicions.
    pub fn trouble(&self) -> u64 {
        self.counts.errors + self.counts.failovers + self.counts.suspects
    }
}

/// How many peers each ranking of the per-peer view lists.
pub const WORST_PEERS: usize = 8;

/// The worst peers, worst first: by data-chain latency of live connections (p99, then
/// SRTT) and by trouble ([`PeerTotals::trouble`], then errors) over the whole run. Peers
/// without latency samples or without trouble are not ranked.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct WorstPeers {
    pub by_latency: Vec<PeerTotals>,
    pub by_errors: Vec<PeerTotals>,
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

    /// The mean of the live rails' estimates that have samples, if any has.
    fn mean<'a>(live: impl Iterator<Item = &'a RailStats>) -> Option<Gauges> {
        let (mut sum, mut n) = (Gauges::default(), 0u64);
        for g in live.filter_map(Gauges::of) {
            sum.srtt_ns += g.srtt_ns;
            sum.rttvar_ns += g.rttvar_ns;
            sum.base_ns += g.base_ns;
            sum.bw_bytes_per_s += g.bw_bytes_per_s;
            n += 1;
        }
        (n > 0).then(|| Gauges {
            srtt_ns: sum.srtt_ns / n,
            rttvar_ns: sum.rttvar_ns / n,
            base_ns: sum.base_ns / n,
            bw_bytes_per_s: sum.bw_bytes_per_s / n,
        })
    }
}

/// What closed connections left on one NIC and rail.
#[derive(Clone, Default)]
struct Closed {
    counts: RailCounts,
    latency: HistogramSnapshot,
    /// The estimates of the last one closed with samples, and when (retirement order).
    last_gauges: Option<(u64, Gauges)>,
}

impl Closed {
    fn add(&mut self, o: &Closed) {
        self.counts.add(&o.counts);
        self.latency.add(&o.latency);
        if o.last_gauges.map(|g| g.0) > self.last_gauges.map(|g| g.0) {
            self.last_gauges = o.last_gauges;
        }
    }
}

type PeerKey = (Arc<str>, Arc<str>, usize);

struct Inner {
    live: Vec<Arc<RailStats>>,
    /// By NIC and rail.
    closed: BTreeMap<(Arc<str>, usize), Closed>,
    /// By peer, NIC and rail: counters only (a map made in a `const fn`, so that the
    /// instance holding the registry can be a static at the ABI edge).
    closed_peers: BTreeMap<PeerKey, RailCounts>,
    retired: u64,
}

/// The figures of one group: what closed connections left plus the live ones.
fn aggregate<'a>(closed: Option<&Closed>, live: impl Iterator<Item = &'a RailStats> + Clone) -> RailTotals {
    let mut t = RailTotals::default();
    let mut counts = closed.map(|c| c.counts).unwrap_or_default();
    let mut latency = closed.map(|c| c.latency.clone()).unwrap_or_default();
    for s in live.clone() {
        t.live += 1;
        t.failed += s.gauges.failed.get();
        counts.add(&s.counters.load());
        latency.add_live(&s.latency);
    }
    let g = Gauges::mean(live).or(closed.and_then(|c| c.last_gauges.map(|g| g.1))).unwrap_or_default();
    t.counts = counts;
    t.latency = latency.summary();
    (t.srtt_ns, t.rttvar_ns, t.base_ns, t.bw_bytes_per_s) = (g.srtt_ns, g.rttvar_ns, g.base_ns, g.bw_bytes_per_s);
    t
}

/// Sets each row's `share` to its part of the payload bytes of all rows.
fn set_shares(mut rows: Vec<&mut RailTotals>) {
    let all: u64 = rows.iter().map(|t| t.counts.bytes).sum();
    if all > 0 {
        for t in rows.iter_mut() {
            t.share = t.counts.bytes as f64 / all as f64;
        }
    }
}

/// A set of rail statistics; each plugin instance has one.
pub struct Registry {
    inner: Mutex<Inner>,
}

impl Default for Registry {
    fn default() -> Self {
        Registry::new()
    }
}

impl Registry {
    pub const fn new() -> Registry {
        let inner = Inner { live: Vec::new(), closed: BTreeMap::new(), closed_peers: BTreeMap::new(), retired: 0 };
        Registry { inner: Mutex::new(inner) }
    }

    /// A new block for rail `rail` of a new connection, live until the handle drops.
    pub fn register(&'static self, rail: usize) -> StatsHandle {
        self.register_at(rail, StatsPlace::default())
    }

    /// A new block for rail `rail` of a new connection running at `place`.
    pub fn register_at(&'static self, rail: usize, place: StatsPlace) -> StatsHandle {
        let stats = Arc::new(RailStats::at(rail, place));
        self.inner.lock().live.push(stats.clone());
        StatsHandle { stats, registry: Some(self) }
    }

    fn retire(&self, stats: &Arc<RailStats>) {
        let mut inner = self.inner.lock();
        if let Some(i) = inner.live.iter().position(|s| Arc::ptr_eq(s, stats)) {
            inner.live.swap_remove(i);
        }
        inner.retired += 1;
        let seq = inner.retired;
        let (place, rail, counts) = (stats.place(), stats.rail(), stats.counters.load());
        let closed = inner.closed.entry((place.nic.clone(), rail)).or_default();
        closed.counts.add(&counts);
        closed.latency.add_live(&stats.latency);
        if let Some(g) = Gauges::of(stats) {
            closed.last_gauges = Some((seq, g));
        }
        inner.closed_peers.entry((place.peer.clone(), place.nic.clone(), rail)).or_default().add(&counts);
    }

    /// Both rails' figures, summed over live and closed connections.
    pub fn totals(&self) -> [RailTotals; 2] {
        let inner = self.inner.lock();
        let mut out: [RailTotals; 2] = std::array::from_fn(|rail| {
            let mut closed = Closed::default();
            for (_, c) in inner.closed.iter().filter(|((_, r), _)| *r == rail) {
                closed.add(c);
            }
            aggregate(Some(&closed), inner.live.iter().map(|s| &**s).filter(|s| s.rail() == rail))
        });
        set_shares(out.iter_mut().collect());
        out
    }

    /// Each NIC's figures per rail, summed over live and closed connections, by NIC name.
    pub fn nic_totals(&self) -> Vec<NicTotals> {
        let inner = self.inner.lock();
        let mut groups: BTreeMap<(Arc<str>, usize), Vec<&RailStats>> =
            inner.closed.keys().map(|k| (k.clone(), Vec::new())).collect();
        for s in &inner.live {
            groups.entry((s.place().nic.clone(), s.rail())).or_default().push(s);
        }
        let mut out: Vec<NicTotals> = groups
            .into_iter()
            .map(|(key, live)| {
                let totals = aggregate(inner.closed.get(&key), live.into_iter());
                NicTotals { nic: key.0, rail: key.1, totals }
            })
            .collect();
        set_shares(out.iter_mut().map(|n| &mut n.totals).collect());
        out
    }

    /// Every peer as each local NIC and rail reaches it.
    pub fn peer_totals(&self) -> Vec<PeerTotals> {
        let inner = self.inner.lock();
        let mut groups: BTreeMap<PeerKey, Vec<&RailStats>> =
            inner.closed_peers.keys().map(|k| (k.clone(), Vec::new())).collect();
        for s in &inner.live {
            groups.entry((s.place().peer.clone(), s.place().nic.clone(), s.rail())).or_default().push(s);
        }
        groups
            .into_iter()
            .map(|(key, live)| {
                let mut counts = inner.closed_peers.get(&key).copied().unwrap_or_default();
                let mut latency = HistogramSnapshot::default();
                for s in &live {
                    counts.add(&s.counters.load());
                    latency.add_live(&s.latency);
                }
                let srtt_ns = Gauges::mean(live.iter().copied()).map_or(0, |g| g.srtt_ns);
                let (peer, nic, rail) = key;
                PeerTotals { peer, nic, rail, counts, latency: latency.summary(), srtt_ns, live: live.len() as u64 }
            })
            .collect()
    }

    /// The `n` worst peers by latency and by errors ([`WorstPeers`]).
    pub fn worst_peers(&self, n: usize) -> WorstPeers {
        worst_peers(self.peer_totals(), n)
    }
}

/// Ranks `peers` ([`WorstPeers`]); ties keep the order given (by peer address).
pub fn worst_peers(peers: Vec<PeerTotals>, n: usize) -> WorstPeers {
    let mut by_latency: Vec<_> = peers.iter().filter(|p| p.latency.samples > 0 || p.srtt_ns > 0).cloned().collect();
    by_latency.sort_by_key(|p| std::cmp::Reverse((p.latency.p99_ns, p.srtt_ns)));
    by_latency.truncate(n);
    let mut by_errors: Vec<_> = peers.into_iter().filter(|p| p.trouble() > 0).collect();
    by_errors.sort_by_key(|p| std::cmp::Reverse((p.trouble(), p.counts.errors)));
    by_errors.truncate(n);
    WorstPeers { by_latency, by_errors }
}

/// What the statistics file and the Prometheus textfile show: the per-rail totals, the
/// per-NIC rows and the worst peers.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct StatsView {
    pub rails: [RailTotals; 2],
    pub nics: Vec<NicTotals>,
    pub worst: WorstPeers,
}

impl StatsView {
    /// `registry`'s view now.
    pub fn of(registry: &Registry) -> StatsView {
        StatsView { rails: registry.totals(), nics: registry.nic_totals(), worst: registry.worst_peers(WORST_PEERS) }
    }
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

    fn at(nic: &str, peer: &str) -> StatsPlace {
        StatsPlace::new(nic, peer)
    }

    #[test]
    fn counters_are_grouped_by_nic_and_rail_over_live_and_closed_connections() {
        let r = registry();
        let a = r.register_at(0, at("mlx5_0:1", "GID a"));
        let b = r.register_at(0, at("mlx5_1:1", "GID b"));
        let c = r.register_at(1, at("mlx5_0:1", "GID c")); // the same NIC on the other rail
        let d = r.register_at(0, at("mlx5_0:1", "GID d"));
        for (h, bytes) in [(&a, 1000), (&b, 4000), (&c, 2000), (&d, 3000)] {
            h.count_post(1, 1, bytes, bytes);
        }
        a.latency.record(1000);
        d.latency.record(5000);
        b.counters.errors.add(3);
        drop(d); // closed: its figures stay under its NIC
        let nics = r.nic_totals();
        let keys: Vec<_> = nics.iter().map(|n| (&*n.nic, n.rail)).collect();
        assert_eq!(keys, [("mlx5_0:1", 0), ("mlx5_0:1", 1), ("mlx5_1:1", 0)]);
        let of = |i: usize| &nics[i].totals;
        assert_eq!([of(0).counts.bytes, of(1).counts.bytes, of(2).counts.bytes], [4000, 2000, 4000]);
        assert_eq!([of(0).live, of(1).live, of(2).live], [1, 1, 1]);
        assert_eq!([of(0).latency.samples, of(1).latency.samples, of(2).latency.samples], [2, 0, 0]);
        assert_eq!((of(0).latency.max_ns, of(2).counts.errors), (5000, 3));
        assert_eq!([of(0).share, of(1).share, of(2).share], [0.4, 0.2, 0.4]);
        // The rails' totals are the sums of their NICs' rows.
        let t = r.totals();
        assert_eq!(t[0].counts.bytes, of(0).counts.bytes + of(2).counts.bytes);
        assert_eq!((t[0].counts.errors, t[0].latency.samples, t[1].counts.bytes), (3, 2, 2000));
        drop((a, b, c));
        let after = r.nic_totals();
        assert_eq!(
            after.iter().map(|n| n.totals.counts).collect::<Vec<_>>(),
            nics.iter().map(|n| n.totals.counts).collect::<Vec<_>>()
        );
        assert!(after.iter().all(|n| n.totals.live == 0));
    }

    #[test]
    fn the_worst_peers_come_first_by_latency_and_by_errors() {
        let r = registry();
        // Ten peers, peer i's chains taking (i + 1) µs; two connections to peer 9.
        let mut live: Vec<StatsHandle> = (0..10)
            .map(|i| {
                let h = r.register_at(0, at("mlx5_0:1", &format!("GID ::{i}")));
                h.latency.record((i + 1) * 1000);
                h
            })
            .collect();
        let twin = r.register_at(0, at("mlx5_0:1", "GID ::9"));
        twin.latency.record(50_000);
        live[3].counters.errors.add(5);
        live[7].counters.failovers.add(1);
        live[7].counters.suspects.add(1);
        live[5].counters.errors.add(1);
        // A closed connection's errors count; its latency does not (live connections only).
        let gone = r.register_at(1, at("mlx5_1:1", "GID ::gone"));
        gone.latency.record(1_000_000);
        gone.counters.errors.add(2);
        drop(gone);
        let w = r.worst_peers(WORST_PEERS);
        let names = |v: &[PeerTotals]| v.iter().map(|p| p.peer.to_string()).collect::<Vec<_>>();
        let expect: Vec<_> = (2..10).rev().map(|i| format!("GID ::{i}")).collect();
        assert_eq!(names(&w.by_latency), expect, "slowest first, 8 of them");
        assert_eq!((w.by_latency[0].live, w.by_latency[0].latency.samples), (2, 2), "both connections to GID ::9");
        assert!(w.by_latency[0].latency.p99_ns.abs_diff(50_000) <= 50_000 / 64);
        assert_eq!(names(&w.by_errors), ["GID ::3", "GID ::gone", "GID ::7", "GID ::5"]);
        assert_eq!((w.by_errors[1].nic.as_ref(), w.by_errors[1].rail, w.by_errors[1].live), ("mlx5_1:1", 1, 0));
        assert_eq!(r.worst_peers(2).by_errors.len(), 2);
        live.clear();
        drop(twin);
        assert!(r.worst_peers(8).by_latency.is_empty(), "no live connection, no latency ranking");
        assert_eq!(r.worst_peers(8).by_errors.len(), 4, "errors stay over the run");
    }

    #[test]
    fn detached_handles_publish_nothing() {
        let h = StatsHandle::detached(0);
        h.count_post(1, 1, 10, 10);
        assert_eq!(h.counters.bytes.get(), 10);
        drop(h);
    }
}
