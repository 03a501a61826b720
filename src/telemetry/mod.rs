//! Per-rail telemetry from the data path itself (seed 000): RTT samples from post →
//! completion of each signalled chain (and of idle-rail probes), RFC 6298 SRTT/RTTVAR, base
//! latency, delivery rate, bytes in flight and the congestion signal; per-rail counters and
//! latency statistics published for the statistics file and the query function.
//!
//! Sans-IO: every time is an input (`now_ns` from one clock read per post/poll batch, or a
//! device completion timestamp), so tests drive it with a fake clock. One file per concern:
//! `rtt` (SRTT/RTTVAR), `window_min` (base latency), `rate` (delivery rate), `histogram`
//! (latency percentiles), `counter` + `stats` (single-writer published figures), `budget`
//! (the idle-probe budget a NIC's connections share), `registry` (process-wide totals),
//! `export` (the statistics file), `inflight` (the chains on the wire). The registry and
//! the writers belong to a plugin instance, which passes them down: nothing here is a static.
//!
//! How the engine drives it, per rail of each connection (one clock read per batch):
//!
//! ```text
//! connect:   tel[r] = RailTelemetry::registered(TelemetryConfig::from_config(cfg, speed_mbps), registry, r, place)
//!            policy = AnySplit::from_config(cfg)
//! isend:     sout = policy.sout_bytes(size, now, [tel[0].view(), tel[1].view()])
//!            mask = split::active_mask(size, sout)      // then per rail r of the mask:
//!            tel[r].on_post(now, bytes_r)               // estimator: bytes in flight, queue
//!            tel[r].stats().count_post(wrs, imm_wrs, bytes_r, size)   // counters: one doorbell
//! poll:      tel[r].stats().count_cqes(n)
//!            data chain ok:  tel[r].on_complete(Sample { posted_ns, completed_ns: now, bytes })
//!            probe ok:       tel[r].on_probe_complete(now)
//!            any error:      tel[r].on_error(); tel[r].on_abandon(bytes) for each lost chain
//! idle:      if tel[r].idle_probe_due(now, cfg.probe_interval_us * 1000) {
//!                if nic_budget[r].take(now) {       // ProbeBudget: MPIB_PROBE_RATE per NIC
//!                    post a small signalled RDMA WRITE without IMM; tel[r].on_probe_post(now)
//!                } else { tel[r].on_probe_refused(now, interval) } }
//! receiver:  stats = registry.register_at(r, place); stats.count_cqes(n); stats.count_rnr(n)
//! close:     drop the telemetry / handles (figures fold into the totals); export.flush_now()
//! init:      export = StatsExport::start(cfg, registry)    finalize: export.flush_now()
//! ```

mod budget;
mod counter;
mod export;
mod histogram;
mod inflight;
mod prom;
mod rate;
mod registry;
mod rtt;
mod stats;
mod window_min;

pub use budget::ProbeBudget;
pub use counter::Counter;
pub use export::{StatsExport, format_stats, write_atomic};
pub use histogram::{LatencyHistogram, LatencySummary};
pub use prom::format_prometheus;
pub use registry::{NicTotals, PeerTotals, RailTotals, Registry, StatsHandle, StatsView, WORST_PEERS, WorstPeers};
pub use stats::{RailCounters, RailCounts, RailGauges, RailStats, StatsPlace};

use crate::config::Config;
use inflight::{Chain, InflightChains, Occupancy};
use rate::DeliveryRate;
use rtt::RttEstimator;
use window_min::WindowedMin;

/// Base latency is the minimum over this much time: long enough to remember the
/// uncongested path while a queue stands, short enough to follow a route change.
pub const BASE_WINDOW_NS: u64 = 100_000_000;
/// Time constant of the delivery-rate filter over busy time: a step in a rail's rate is
/// followed to within 5 % after 3τ of traffic. Shorter follows faster but lets completion
/// jitter through, and the split multiplies a rate error by the queue it drains.
pub const BW_TAU_NS: u64 = 2_000_000;
/// Idle probes of a rail the split leaves idle back off to at most 2^this times the
/// configured interval (16 ms at `MPIB_PROBE_INTERVAL_US`'s default 1 ms).
pub const PROBE_BACKOFF_MAX: u32 = 4;

/// An idle rail whose smoothed RTT is within 1/this of the best other rail's (or not yet
/// measured) is probed at the configured interval: the split's choice may turn on it.
const PROBE_CLOSE: u64 = 8;

/// Restores the probe interval of every rail whose estimate came near the best other
/// rail's (see [`RailTelemetry::idle_probe_due`]): the backoff holds only while the rail
/// is clearly the worse choice. Call it before the idle-probe checks.
pub fn refresh_probe_backoff(tel: &mut [RailTelemetry]) {
    for r in 0..tel.len() {
        if tel[r].probe_backoff == 0 {
            continue;
        }
        let best_other = (0..tel.len())
            .filter(|&o| o != r && !tel[o].view.failed && tel[o].view.samples > 0)
            .map(|o| tel[o].view.srtt_ns)
            .min();
        let mine = tel[r].view.srtt_ns;
        if best_other.is_none_or(|b| mine - mine / PROBE_CLOSE <= b) {
            tel[r].probe_sooner();
        }
    }
}

/// The congestion signal's floor on its 4·RTTVAR margin, as a fraction of the smoothed
/// delay (RFC 6298's clock granularity G): on a jitter-free path RTTVAR decays to ~0 and
/// nanoseconds of noise would otherwise read as congestion.
const CONGESTION_MIN_MARGIN: f64 = 1.0 / 8.0;

/// `x as f64` through the signed conversion: one instruction where the unsigned one is a
/// dozen, and the same value for every `x` below 2^63, which times (ns) and byte counts
/// always are (2^63 ns is 292 years).
#[inline(always)]
pub(crate) fn f64_of(x: u64) -> f64 {
    debug_assert!(x < 1 << 63, "{x} ns or bytes");
    x as i64 as f64
}

/// `f as u64` through the signed conversion: the same value for every `f` in [0, 2^63) and
/// for NaN (0); callers pass non-negative times and rates, far below 2^63.
#[inline(always)]
pub(crate) fn u64_of(f: f64) -> u64 {
    debug_assert!(f >= 0.0 || f.is_nan(), "{f}");
    f as i64 as u64
}

/// What the split policy sees of one rail.
#[derive(Clone, Copy, Debug, Default, PartialEq)]
pub struct RailView {
    /// Link speed from the device (Mbit/s): the prior before any sample.
    pub speed_mbps: u32,
    /// Smoothed RTT (ns) of data chains and probes; 0 before the first sample.
    pub srtt_ns: u64,
    /// RTT variation (ns).
    pub rttvar_ns: u64,
    /// Base latency (ns): the minimum over [`BASE_WINDOW_NS`] of the RTT, less its own
    /// serialization at the estimated rate, of probes and of chains posted on an idle rail
    /// (a queued chain's RTT includes its wait, which cannot be told apart from latency).
    /// Kept while a busy rail gives no such sample. 0 before the first.
    pub base_ns: u64,
    /// Delivery-rate estimate (bytes/s); the link speed until traffic replaces it.
    pub bw_bytes_per_s: u64,
    /// Bytes posted on the rail whose completion has not been seen.
    pub inflight_bytes: u64,
    /// The in-flight bytes are expected to have all completed at
    /// `drain_start_ns + inflight_bytes / rate`: the last data completion while the rail
    /// stays busy (the next chain has been on the wire since), or post time + base
    /// latency when a chain lands on an idle rail. Lets the policy see how far the
    /// chain in service has got instead of a staircase that drops a whole chain at a time.
    pub drain_start_ns: u64,
    /// Bytes of the oldest chain in flight (the one on the wire): how much progress since
    /// `drain_start_ns` is plausible before a silent rail counts as stalled. 0 when none.
    pub head_chain_bytes: u64,
    /// When a completion last gave the delivery rate a sample (ns; 0: never). Chains alone
    /// on an idle rail that are mostly latency give none, so a rail that only ever gets
    /// those, or nothing, has no measured rate: the split does not trust it for long.
    pub rate_sample_ns: u64,
    /// RTT samples taken so far (data chains and probes).
    pub samples: u64,
    /// The congestion signal of seed 000, RTT > SRTT + 4·RTTVAR, on the part of the last
    /// RTT sample that the rail's known queue and rate do not explain (its RTT less the
    /// wait expected when it was posted, less its own serialization), against the
    /// SRTT/RTTVAR of those same parts before it; with RFC 6298's granularity floor G =
    /// SRTT/8 on the 4·RTTVAR margin. So the queue the split itself builds, and chains
    /// of different sizes, do not read as congestion; a rail that slows down or queues
    /// someone else's traffic does.
    pub congested: bool,
    /// Samples so far that were congested; the policy backs off once per new event.
    pub congestion_events: u64,
    /// A completion on this rail failed: it gets no new traffic.
    pub failed: bool,
}

impl RailView {
    /// The rail's rate (bytes/ns): the estimate, else the link speed.
    #[inline]
    pub fn rate_bytes_per_ns(&self) -> f64 {
        let bps = if self.bw_bytes_per_s > 0 { self.bw_bytes_per_s } else { self.speed_mbps as u64 * 125_000 };
        f64_of(bps.max(1)) * 1e-9
    }

    /// How long (ns from `now_ns`) until the rail is done with what it holds, at `rate`
    /// bytes/ns: its in-flight bytes from `drain_start_ns`, crediting at most the oldest
    /// chain's worth of progress since (a rail silent for longer is late, not draining),
    /// and never less than the base latency (what an idle rail still costs).
    #[inline]
    pub fn drain_ns(&self, now_ns: u64, rate: f64) -> f64 {
        let base = f64_of(self.base_ns);
        if self.inflight_bytes == 0 {
            return base;
        }
        let elapsed = f64_of(now_ns) - f64_of(self.drain_start_ns);
        let credit = elapsed.min(f64_of(self.head_chain_bytes) / rate);
        (f64_of(self.inflight_bytes) / rate - credit).max(base)
    }
}

/// Estimator parameters (`MPIB_RTT_ALPHA`, `MPIB_RTT_BETA`) and the link speed.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct TelemetryConfig {
    pub alpha: f64,
    pub beta: f64,
    pub speed_mbps: u32,
}

impl TelemetryConfig {
    /// The gains from the configuration, for a rail whose link runs at `speed_mbps`.
    pub fn from_config(cfg: &Config, speed_mbps: u32) -> Self {
        TelemetryConfig { alpha: cfg.rtt_alpha, beta: cfg.rtt_beta, speed_mbps }
    }
}

/// One RTT sample: a signalled chain posted at `posted_ns`, completed at `completed_ns`,
/// that carried `bytes`.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Sample {
    pub posted_ns: u64,
    pub completed_ns: u64,
    pub bytes: u64,
}

/// The telemetry of one rail of one connection. Owned by the data path: no locks. Not
/// `Clone`: its statistics block has a single writer.
#[derive(Debug)]
pub struct RailTelemetry {
    cfg: TelemetryConfig,
    view: RailView,
    last_post_ns: u64,
    /// Raw RTT of chains and probes: what `srtt_ns`/`rttvar_ns` report.
    rtt: RttEstimator,
    /// The part of each RTT that the rail's known queue and rate do not explain (RTT less
    /// the expected wait when it was posted, less its own serialization): about the base
    /// latency when all is well, whatever the chain size and however much the split
    /// itself has queued on the rail. The congestion signal watches this.
    delay: RttEstimator,
    base: WindowedMin,
    rate: DeliveryRate,
    chains: InflightChains,
    /// Post time of the outstanding probe.
    probe_posted_ns: Option<u64>,
    last_probe_ns: u64,
    /// A rail left idle is probed every `interval << probe_backoff` ([`Self::idle_probe_due`]).
    probe_backoff: u32,
    /// The NIC's probe budget refused an idle probe: the next is not due before this.
    probe_deferred_ns: u64,
    stats: StatsHandle,
}

impl RailTelemetry {
    /// Telemetry whose statistics are kept but published nowhere (tests, tools).
    pub fn new(cfg: TelemetryConfig) -> Self {
        Self::with_stats(cfg, StatsHandle::detached(0))
    }

    /// Telemetry of rail `rail` (0 = SOUT, 1 = SUP) of a new connection, its statistics
    /// in `registry` (its plugin instance's: statistics file, `mpib_rail_stats`) until it
    /// drops, under its NIC and peer (`place`) in the per-NIC and per-peer views.
    pub fn registered(cfg: TelemetryConfig, registry: &'static Registry, rail: usize, place: StatsPlace) -> Self {
        Self::with_stats(cfg, registry.register_at(rail, place))
    }

    pub fn with_stats(cfg: TelemetryConfig, stats: StatsHandle) -> Self {
        let bw = cfg.speed_mbps as f64 * 1e6 / 8.0 / 1e9;
        let rate = DeliveryRate::new(bw);
        RailTelemetry {
            cfg,
            view: RailView { speed_mbps: cfg.speed_mbps, bw_bytes_per_s: rate.bytes_per_s(), ..RailView::default() },
            last_post_ns: 0,
            rtt: RttEstimator::default(),
            delay: RttEstimator::default(),
            base: WindowedMin::default(),
            rate,
            chains: InflightChains::default(),
            probe_posted_ns: None,
            last_probe_ns: 0,
            probe_backoff: 0,
            probe_deferred_ns: 0,
            stats,
        }
    }

    /// A chain carrying `bytes` of payload was posted on the rail at `now_ns`. (Count the
    /// post call itself with [`RailStats::count_post`] on [`stats`](Self::stats).)
    #[inline]
    pub fn on_post(&mut self, now_ns: u64, bytes: u64) {
        let v = &mut self.view;
        let alone = v.inflight_bytes == 0;
        // On an idle rail the drain time is the base latency: no wait (and no arithmetic).
        let wait =
            if alone { 0 } else { u64_of((v.drain_ns(now_ns, v.rate_bytes_per_ns()) - f64_of(v.base_ns)).max(0.0)) };
        if alone {
            v.drain_start_ns = now_ns + v.base_ns;
        }
        v.inflight_bytes += bytes;
        let occupancy = if alone { Occupancy::Alone } else { Occupancy::Queued };
        self.chains.push(Chain { posted_ns: now_ns, bytes, wait_ns: wait, occupancy });
        v.head_chain_bytes = self.chains.oldest_bytes();
        self.last_post_ns = now_ns;
        self.probe_backoff = 0;
    }

    /// A signalled chain completed; `sample.bytes` leave the in-flight count.
    #[inline]
    pub fn on_complete(&mut self, sample: Sample) {
        let v = &mut self.view;
        v.inflight_bytes = v.inflight_bytes.saturating_sub(sample.bytes);
        v.drain_start_ns = v.drain_start_ns.max(sample.completed_ns);
        // A chain the ring could not hold (more than its capacity in flight) counts as
        // queued with no expected wait: a late sample at worst, never a base latency.
        let chain = self.chains.remove(sample.posted_ns, sample.bytes).unwrap_or_default();
        v.head_chain_bytes = self.chains.oldest_bytes();
        let rtt = sample.completed_ns.saturating_sub(sample.posted_ns);
        self.stats.latency.record(rtt);
        self.on_rtt(sample.completed_ns, rtt, sample.bytes, chain.wait_ns, chain.occupancy);
        let base = self.base.get().unwrap_or(0);
        let sampled = self.rate.samples();
        self.rate.on_chain(sample.posted_ns, sample.completed_ns, sample.bytes, base, BW_TAU_NS);
        if self.rate.samples() > sampled {
            self.view.rate_sample_ns = sample.completed_ns;
        }
        self.view.bw_bytes_per_s = self.rate.bytes_per_s();
        self.stats.gauges.bw_bytes_per_s.set(self.view.bw_bytes_per_s);
    }

    /// One RTT sample of a chain of `bytes` (0 for a probe) completed at `now_ns`, that
    /// was expected to wait `wait_ns` for the rail; [`Occupancy::Alone`]: it had the rail
    /// to itself (a probe, or a chain posted on an idle rail).
    #[inline]
    fn on_rtt(&mut self, now_ns: u64, rtt: u64, bytes: u64, wait_ns: u64, occupancy: Occupancy) {
        let (alpha, beta) = (self.cfg.alpha, self.cfg.beta);
        let own_ns = f64_of(bytes) / self.rate.bytes_per_ns().max(1e-9);
        let delay = u64_of((f64_of(rtt) - f64_of(wait_ns) - own_ns).max(0.0));
        let margin = CONGESTION_MIN_MARGIN * self.delay.srtt();
        let congested = self.delay.exceeds(delay, margin);
        self.delay.update(delay, alpha, beta);
        self.rtt.update(rtt, alpha, beta);
        let base = match occupancy {
            Occupancy::Alone => self.base.update(now_ns, delay, BASE_WINDOW_NS),
            Occupancy::Queued => self.base.get().unwrap_or(0),
        };
        let v = &mut self.view;
        v.srtt_ns = self.rtt.srtt_ns();
        v.rttvar_ns = self.rtt.rttvar_ns();
        v.base_ns = base;
        v.samples += 1;
        v.congested = congested;
        v.congestion_events += congested as u64;
        let s = &self.stats;
        s.counters.rtt_samples.add(1);
        s.counters.congestion_events.add(congested as u64);
        s.gauges.srtt_ns.set(v.srtt_ns);
        s.gauges.rttvar_ns.set(v.rttvar_ns);
        s.gauges.base_ns.set(base);
    }

    /// A completion on this rail failed: no new traffic, no probes.
    pub fn on_error(&mut self) {
        self.view.failed = true;
        self.stats.counters.errors.add(1);
    }

    /// Failover's silent-rail check suspects the rail (`true`), or no longer (`false`):
    /// while suspect it gets no new traffic and no probes, as a failed rail (its work out
    /// completes or fails as it will). Never called on a rail that has failed.
    pub fn set_suspect(&mut self, on: bool) {
        self.view.failed = on;
    }

    /// The rail was re-admitted after a failure (failover) at `now_ns`: new traffic and
    /// probes again, its estimates started afresh (its QPs are new; what they measured of
    /// the old ones, and the bytes the old ones had in flight, no longer hold).
    pub fn readmit(&mut self, now_ns: u64) {
        let rate = DeliveryRate::new(self.cfg.speed_mbps as f64 * 1e6 / 8.0 / 1e9);
        self.view =
            RailView { speed_mbps: self.cfg.speed_mbps, bw_bytes_per_s: rate.bytes_per_s(), ..RailView::default() };
        (self.rtt, self.delay, self.base, self.rate) =
            (RttEstimator::default(), RttEstimator::default(), WindowedMin::default(), rate);
        (self.chains, self.probe_posted_ns, self.last_probe_ns) = (InflightChains::default(), None, 0);
        self.last_post_ns = now_ns;
        self.probe_backoff = 0;
    }

    /// Forget `bytes` in flight without a sample (e.g. a flushed chain).
    pub fn on_abandon(&mut self, bytes: u64) {
        self.view.inflight_bytes = self.view.inflight_bytes.saturating_sub(bytes);
        self.chains.remove_bytes(bytes);
        self.view.head_chain_bytes = self.chains.oldest_bytes();
    }

    /// The connection came up at `now_ns`: idle time (probes, keepalives) counts from here.
    pub fn start(&mut self, now_ns: u64) {
        self.last_post_ns = self.last_post_ns.max(now_ns);
    }

    /// Since when the rail has carried neither data nor a probe (ns): its next probe or
    /// keepalive is due an interval after this.
    #[inline]
    pub fn idle_since_ns(&self) -> u64 {
        self.last_post_ns.max(self.last_probe_ns)
    }

    /// When the rail last carried a post (ns), for probes.
    pub fn last_post_ns(&self) -> u64 {
        self.last_post_ns
    }

    /// Whether the rail should get a probe now: probes on (`interval_ns > 0`), the rail
    /// healthy, nothing in flight, no probe outstanding, and neither data nor a probe
    /// posted for `interval_ns`. The engine then posts one small signalled RDMA WRITE
    /// without IMM (it never touches the peer's SRQ) into a scratch region, calls
    /// [`on_probe_post`](Self::on_probe_post), and feeds its completion to
    /// [`on_probe_complete`](Self::on_probe_complete).
    #[inline]
    pub fn probe_due(&self, now_ns: u64, interval_ns: u64) -> bool {
        interval_ns != 0
            && !self.view.failed
            && self.view.inflight_bytes == 0
            && self.probe_posted_ns.is_none()
            && now_ns.saturating_sub(self.idle_since_ns()) >= interval_ns
    }

    /// [`Self::probe_due`] for the probes of a rail left idle: the interval doubles with
    /// each probe the rail answers while nothing is sent on it, up to
    /// 2^[`PROBE_BACKOFF_MAX`] times `interval_ns`; data posted on the rail, or
    /// [`Self::probe_sooner`], restore it. On an idle rail the split keeps choosing against,
    /// probes are what its estimate lives on, and every probe costs both ends a doorbell
    /// and a completion in the middle of the other rail's traffic (on the soft fabric two
    /// `sendmsg` and two reads, which stall a round trip between busy-polling processes
    /// sharing cores). Keepalives use [`Self::probe_due`] (their bound is fixed).
    /// A probe the NIC's budget refused ([`Self::on_probe_refused`]) is tried again no
    /// sooner than an interval later.
    #[inline]
    pub fn idle_probe_due(&self, now_ns: u64, interval_ns: u64) -> bool {
        now_ns >= self.probe_deferred_ns && self.probe_due(now_ns, self.backed_off(interval_ns))
    }

    /// When the rail's next idle probe is due (ns), with the interval it backed off to.
    pub fn idle_probe_at(&self, interval_ns: u64) -> u64 {
        self.idle_since_ns().saturating_add(self.backed_off(interval_ns)).max(self.probe_deferred_ns)
    }

    /// The NIC's probe budget ([`ProbeBudget`]) refused the idle probe due at `now_ns`: the
    /// next is tried an interval (as backed off) later. Keepalives are not deferred: their
    /// bound stands on the rail's idle time alone.
    pub fn on_probe_refused(&mut self, now_ns: u64, interval_ns: u64) {
        self.probe_deferred_ns = now_ns.saturating_add(self.backed_off(interval_ns));
    }

    /// `interval_ns` backed off: times 2^`probe_backoff`.
    #[inline]
    fn backed_off(&self, interval_ns: u64) -> u64 {
        interval_ns.saturating_mul(1 << self.probe_backoff)
    }

    /// The rail's idle probes go at the configured interval again (the other rails' RTTs
    /// came near this one's: see [`refresh_probe_backoff`]).
    pub fn probe_sooner(&mut self) {
        self.probe_backoff = 0;
    }

    /// A probe was posted at `now_ns`. Probes are not data: they count in `probes`, not in
    /// the data counters, bytes in flight or the latency statistics.
    pub fn on_probe_post(&mut self, now_ns: u64) {
        self.probe_posted_ns = Some(now_ns);
        self.last_probe_ns = now_ns;
        self.stats.counters.probes.add(1);
    }

    /// The outstanding probe completed at `completed_ns`: an RTT sample of an empty
    /// chain (SRTT/RTTVAR, base latency, congestion signal; not the delivery rate).
    pub fn on_probe_complete(&mut self, completed_ns: u64) {
        if let Some(posted) = self.probe_posted_ns.take() {
            self.on_rtt(completed_ns, completed_ns.saturating_sub(posted), 0, 0, Occupancy::Alone);
            if self.last_post_ns <= posted {
                self.probe_backoff = (self.probe_backoff + 1).min(PROBE_BACKOFF_MAX);
            }
        }
    }

    /// Whether a probe is outstanding (its completion not yet fed back).
    pub fn probe_outstanding(&self) -> bool {
        self.probe_posted_ns.is_some()
    }

    pub fn view(&self) -> &RailView {
        &self.view
    }

    /// The published statistics block: count post calls, CQEs and RNR events here.
    pub fn stats(&self) -> &RailStats {
        &self.stats
    }
}

#[cfg(test)]
#[path = "rail_tests.rs"]
mod tests;
