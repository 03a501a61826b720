//! Unit tests of `RailTelemetry`: the estimators fed from a rail's posts and
//! completions, probes, and what it publishes.

use super::*;

const CFG: TelemetryConfig = TelemetryConfig { alpha: 0.125, beta: 0.25, speed_mbps: 100_000 };

fn tel() -> RailTelemetry {
    RailTelemetry::new(CFG)
}

/// Data chains in the rail's latency statistics.
fn latency_samples(t: &RailTelemetry) -> u64 {
    let mut s = histogram::HistogramSnapshot::default();
    s.add_live(&t.stats().latency);
    s.samples()
}

/// A FIFO rail at `rate` bytes/ns with round trip `lat` ns, driven through a telemetry.
struct Fifo {
    t: RailTelemetry,
    rate: f64,
    lat: u64,
    busy_until: u64,
    /// (posted, completes, bytes) in completion order.
    pending: std::collections::VecDeque<(u64, u64, u64)>,
}

impl Fifo {
    fn new(rate: f64, lat: u64) -> Self {
        Fifo { t: tel(), rate, lat, busy_until: 0, pending: Default::default() }
    }

    fn post(&mut self, now: u64, bytes: u64) {
        self.t.on_post(now, bytes);
        self.busy_until = self.busy_until.max(now) + (bytes as f64 / self.rate) as u64;
        self.pending.push_back((now, self.busy_until + self.lat, bytes));
    }

    /// Completes the oldest chain; returns its completion time.
    fn complete(&mut self) -> u64 {
        let (posted_ns, completed_ns, bytes) = self.pending.pop_front().unwrap();
        self.t.on_complete(Sample { posted_ns, completed_ns, bytes });
        completed_ns
    }

    /// Teaches the telemetry the rail: a long pipelined burst (the rate), then a probe
    /// on the idle rail (the base latency). Returns when the rail is idle again.
    fn learn(&mut self) -> u64 {
        let start = self.busy_until;
        for _ in 0..200 {
            self.post(start, 100_000);
        }
        while !self.pending.is_empty() {
            self.complete();
        }
        let idle = self.busy_until + self.lat + 1_000_000;
        self.t.on_probe_post(idle);
        self.t.on_probe_complete(idle + self.lat);
        self.busy_until = idle + self.lat;
        self.busy_until
    }
}

fn near(got: f64, want: f64) -> bool {
    (got - want).abs() <= 0.02 * want.abs() + 500.0
}

#[test]
fn first_sample_sets_srtt_and_half_rttvar() {
    let mut t = tel();
    t.on_post(0, 100);
    assert_eq!(t.view().inflight_bytes, 100);
    t.on_complete(Sample { posted_ns: 0, completed_ns: 1000, bytes: 100 });
    assert_eq!((t.view().srtt_ns, t.view().rttvar_ns, t.view().inflight_bytes), (1000, 500, 0));
}

#[test]
fn rfc6298_update_and_congestion_signal() {
    let mut t = tel();
    t.on_complete(Sample { posted_ns: 0, completed_ns: 1000, bytes: 0 });
    t.on_complete(Sample { posted_ns: 0, completed_ns: 2000, bytes: 0 });
    // RTTVAR = 0.75*500 + 0.25*|1000-2000| = 625; SRTT = 0.875*1000 + 0.125*2000 = 1125.
    assert_eq!((t.view().srtt_ns, t.view().rttvar_ns), (1125, 625));
    assert!(!t.view().congested, "2000 < 1000 + 4*500");
    t.on_complete(Sample { posted_ns: 0, completed_ns: 10_000, bytes: 0 });
    assert!(t.view().congested, "10000 > 1125 + 4*625");
    assert_eq!(t.view().congestion_events, 1);
    assert_eq!(t.stats().counters.congestion_events.get(), 1);
}

#[test]
fn probes_only_on_idle_healthy_rails_and_never_count_as_data() {
    let mut t = tel();
    assert!(!t.probe_due(1_000_000, 0), "interval 0: probes off");
    assert!(t.probe_due(200_000, 200_000));
    t.on_post(1_000_000, 4096);
    assert!(!t.probe_due(5_000_000, 200_000), "data in flight: the rail is not idle");
    t.on_complete(Sample { posted_ns: 1_000_000, completed_ns: 1_010_000, bytes: 4096 });
    assert!(!t.probe_due(1_100_000, 200_000), "posted 100 us ago");
    assert!(t.probe_due(1_200_000, 200_000));
    t.on_probe_post(1_200_000);
    assert!(t.probe_outstanding() && !t.probe_due(2_000_000, 200_000), "one probe at a time");
    let (bw, latency) = (t.view().bw_bytes_per_s, latency_samples(&t));
    t.on_probe_complete(1_203_000);
    let v = *t.view();
    assert_eq!((v.samples, v.inflight_bytes, v.base_ns), (2, 0, 3_000), "an RTT sample, the base latency");
    assert_eq!(v.bw_bytes_per_s, bw, "no rate sample");
    assert_eq!(latency_samples(&t), latency, "not in the data latency statistics");
    let c = t.stats().counters.load();
    assert_eq!((c.probes, c.rtt_samples, c.bytes, c.wr_posted), (1, 2, 0, 0));
    assert!(!t.probe_due(1_300_000, 200_000), "the probe itself counts as activity");
    assert!(t.probe_due(1_400_000, 200_000));
    t.on_error();
    assert!(!t.probe_due(9_000_000, 200_000), "a failed rail gets no probes");
    assert_eq!(t.stats().counters.errors.get(), 1);
}

/// One idle probe of `t`, posted when due at `interval` after `from` and answered in `rtt`;
/// returns when it completed.
fn probe_when_due(t: &mut RailTelemetry, from: u64, interval: u64, rtt: u64) -> u64 {
    let mut at = from;
    while !t.idle_probe_due(at, interval) {
        at += 1_000;
    }
    t.on_probe_post(at);
    t.on_probe_complete(at + rtt);
    at + rtt
}

#[test]
fn a_rail_left_idle_is_probed_less_often_until_data_or_a_close_rtt_restores_the_interval() {
    let mut t = tel();
    let iv = 100_000;
    // Each probe answered while nothing is sent on the rail doubles the interval, up to
    // 2^PROBE_BACKOFF_MAX times it.
    let (mut at, mut gaps) = (0, vec![]);
    for _ in 0..7 {
        let done = probe_when_due(&mut t, at, iv, 2_000);
        gaps.push(done - at - 2_000);
        at = done - 2_000;
    }
    assert_eq!(gaps, [100_000, 200_000, 400_000, 800_000, 1_600_000, 1_600_000, 1_600_000]);
    assert!(t.probe_due(at + iv, iv), "keepalives keep their own bound");
    // Data on the rail restores the interval.
    t.on_post(at + 10_000, 64);
    t.on_complete(Sample { posted_ns: at + 10_000, completed_ns: at + 15_000, bytes: 64 });
    assert!(t.idle_probe_due(at + 15_000 + iv, iv));
    // A probe answered while data was posted does not back off.
    let mut u = tel();
    u.on_probe_post(iv);
    u.on_post(iv + 500, 64);
    u.on_complete(Sample { posted_ns: iv + 500, completed_ns: iv + 1_500, bytes: 64 });
    u.on_probe_complete(iv + 2_000);
    assert!(u.idle_probe_due(iv + 1_500 + iv, iv));
}

#[test]
fn the_probe_backoff_holds_only_while_the_idle_rail_is_clearly_slower() {
    // Rail 0 carries data at ~10 us, rail 1 is probed at ~30 us and backs off.
    let mut tel = [tel(), tel()];
    tel[0].on_post(0, 64);
    tel[0].on_complete(Sample { posted_ns: 0, completed_ns: 10_000, bytes: 64 });
    let iv = 100_000;
    let mut at = 0;
    for _ in 0..3 {
        at = probe_when_due(&mut tel[1], at, iv, 30_000) - 30_000;
    }
    refresh_probe_backoff(&mut tel);
    assert!(!tel[1].idle_probe_due(at + iv, iv), "backed off: 30 us against 10 us");
    // The carrying rail slows to within an eighth of the idle one's: probes come at the
    // configured interval again.
    for i in 1..40u64 {
        let p = i * 1_000_000;
        tel[0].on_post(p, 64);
        tel[0].on_complete(Sample { posted_ns: p, completed_ns: p + 28_000, bytes: 64 });
    }
    assert!(tel[0].view().srtt_ns > 30_000 * 7 / 8, "{:?}", tel[0].view());
    refresh_probe_backoff(&mut tel);
    assert!(tel[1].idle_probe_due(at + iv, iv), "close RTTs: the configured interval");
    assert!(tel[0].idle_probe_due(40_000_000 + iv, iv), "the carrying rail was never backed off");
}

#[test]
fn base_latency_comes_from_chains_alone_on_the_rail() {
    // 1 B/ns, 10 us round trip. Teach the rate first (a pipelined burst of 20 ms), so
    // that serialization is subtracted right; the burst's chains waited, so they say
    // nothing of the latency but the first (alone on the rail, against the prior rate).
    let mut f = Fifo::new(1.0, 10_000);
    for _ in 0..200 {
        f.post(0, 100_000);
    }
    while !f.pending.is_empty() {
        f.complete();
    }
    let rate = f.t.view().bw_bytes_per_s as f64 / 1e9;
    assert!((rate - 1.0).abs() < 0.02, "{rate}");
    assert!(
        f.t.view().base_ns > 100_000,
        "{}: the first chain, less 100 KB at the prior 12.5 B/ns",
        f.t.view().base_ns
    );
    // A chain alone on the idle rail: RTT = 10 us + 50 us of its own serialization.
    let t0 = f.busy_until + 1_000_000;
    f.post(t0, 50_000);
    f.complete();
    assert!(f.t.view().base_ns.abs_diff(10_000) < 1_500, "{}", f.t.view().base_ns);
    // Chains queued behind others wait long; that is not latency.
    let base = f.t.view().base_ns;
    let t1 = f.busy_until + 1_000_000;
    for _ in 0..8 {
        f.post(t1, 200_000);
    }
    while !f.pending.is_empty() {
        f.complete();
    }
    assert_eq!(f.t.view().base_ns, base);
}

#[test]
fn own_queue_and_chain_size_are_not_congestion_but_a_slower_rail_is() {
    let mut f = Fifo::new(0.5, 50_000);
    let mut now = 0;
    // Warm up with a steady pipeline of 256 KiB chains, 4 in flight.
    for _ in 0..4 {
        f.post(now, 256 << 10);
    }
    for _ in 0..100 {
        now = f.complete();
        f.post(now, 256 << 10);
    }
    let events = f.t.view().congestion_events;
    // The split piles more onto the rail (8 then 12 chains in flight) and mixes sizes:
    // the RTT doubles, but all of it is the known queue and the chains' own size.
    for i in 0..200u64 {
        now = f.complete();
        let bytes = if i % 3 == 0 { 1 << 20 } else { 64 << 10 };
        f.post(now, bytes);
        if i < 8 {
            f.post(now, 256 << 10);
        }
    }
    assert_eq!(f.t.view().congestion_events, events, "the rail's own queue read as congestion");
    // Now the rail serves at half the rate: the next completions come late.
    f.rate = 0.25;
    f.busy_until = f.pending.iter_mut().fold(now, |start, c| {
        let end = start + ((c.2 as f64) / 0.25) as u64;
        c.1 = end + 50_000;
        end
    });
    let mut flagged_after = None;
    for i in 0..4 {
        now = f.complete();
        f.post(now, 256 << 10);
        if f.t.view().congested && flagged_after.is_none() {
            flagged_after = Some(i + 1);
        }
    }
    assert!(flagged_after.is_some_and(|n| n <= 2), "flagged after {flagged_after:?} samples");
}

#[test]
fn drain_follows_the_chain_on_the_wire_and_distrusts_a_silent_rail() {
    let mut f = Fifo::new(1.0, 10_000);
    let t0 = f.learn();
    let base = f.t.view().base_ns as f64;
    assert!(near(base, 10_000.0), "{base}");
    f.post(t0, 100_000);
    f.post(t0, 100_000);
    let v = *f.t.view();
    assert_eq!((v.drain_start_ns, v.head_chain_bytes), (t0 + v.base_ns, 100_000));
    // Just posted on an idle rail: latency plus both chains.
    assert!(near(v.drain_ns(t0, 1.0), 210_000.0), "{}", v.drain_ns(t0, 1.0));
    // Half-way through the first chain.
    assert!(near(v.drain_ns(t0 + 60_000, 1.0), 150_000.0));
    let c = f.complete(); // 110 us after t0
    let v = *f.t.view();
    assert_eq!((v.drain_start_ns, v.inflight_bytes, v.head_chain_bytes), (c, 100_000, 100_000));
    assert!(near(v.drain_ns(c + 40_000, 1.0), 60_000.0));
    // Long past when the second chain should have completed, the rail is late, not
    // empty: at most one chain of progress is credited, and never below the base latency.
    assert!(near(v.drain_ns(c + 5_000_000, 1.0), v.base_ns as f64));
    f.post(c + 5_000_000, 300_000);
    let d = f.t.view().drain_ns(c + 5_000_000, 1.0);
    assert!(near(d, 300_000.0), "{d}: the new chain is not credited away");
    f.t.on_abandon(300_000);
    f.t.on_abandon(100_000);
    let v = *f.t.view();
    assert_eq!((v.inflight_bytes, v.head_chain_bytes), (0, 0));
    assert_eq!(v.drain_ns(c + 6_000_000, 1.0), v.base_ns as f64);
}

#[test]
fn registered_telemetry_is_in_its_registrys_totals_until_and_after_it_closes() {
    let registry: &'static Registry = Box::leak(Box::default());
    let before = registry.totals()[1];
    let mut t = RailTelemetry::registered(
        TelemetryConfig::from_config(&crate::config::Config::default(), 100_000),
        registry,
        1,
        StatsPlace::default(),
    );
    t.on_post(0, 8192);
    t.stats().count_post(2, 1, 8192, 16384);
    t.on_complete(Sample { posted_ns: 0, completed_ns: 7_000, bytes: 8192 });
    t.stats().count_cqes(1);
    let live = registry.totals()[1];
    assert!(live.live > before.live);
    assert!(live.counts.bytes >= before.counts.bytes + 8192);
    assert!(live.latency.samples > before.latency.samples);
    assert!(live.srtt_ns > 0 && live.bw_bytes_per_s > 0);
    drop(t);
    let after = registry.totals()[1];
    assert!(after.counts.bytes >= live.counts.bytes && after.counts.cqe > before.counts.cqe);
    assert!(after.latency.samples >= live.latency.samples, "closed connections stay in the totals");
}
