//! A deterministic simulator of two rails, driven by a split policy and the real
//! [`RailTelemetry`], for the policy's tests and `cargo run --release --example split_sim`.
//!
//! Each rail is a FIFO server: a chain posted at `t` starts serializing when the rail is
//! free, takes `bytes / rate`, and its completion comes back `latency (+ jitter)` after
//! that, observed at the next poll (the engine reads the clock once per poll batch, so
//! completions arrive in batches with one timestamp). A rate change applies to the bytes
//! not yet serialized, including those of the chain in service. A dead rail fails every
//! chain it holds or gets after a retry timeout; the simulated sender then reposts those
//! bytes on the other rail. The sender keeps `window` sends in flight (NCCL's steps): a
//! send completes when all its chains have, and the next one is posted at that moment,
//! split by the policy from the rails' telemetry as the engine does.

use std::cmp::Reverse;
use std::collections::{BinaryHeap, VecDeque};

use super::{SplitPolicy, active_mask};
use crate::rail::RailMask;
use crate::telemetry::{RailTelemetry, Sample, TelemetryConfig};

/// One simulated rail.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct RailModel {
    /// Serialization rate, bytes per ns (1 B/ns = 8 Gbit/s).
    pub rate: f64,
    /// Round trip of an empty chain (ns): post → completion on an idle rail.
    pub latency_ns: u64,
    /// Each chain's completion is late by a uniform 0..jitter_ns more.
    pub jitter_ns: u64,
    /// Link speed the device reports: the policy's prior.
    pub speed_mbps: u32,
}

impl RailModel {
    /// A rail of `gbps` Gbit/s and `latency_us` µs round trip; the device reports 100 Gbit/s
    /// (as a veth does not know its shaped rate).
    pub fn gbps(gbps: f64, latency_us: f64) -> Self {
        RailModel { rate: gbps / 8.0, latency_ns: (latency_us * 1000.0) as u64, jitter_ns: 0, speed_mbps: 100_000 }
    }
}

/// A change of conditions during a run.
#[derive(Clone, Copy, Debug, PartialEq)]
pub enum RailEvent {
    /// At `at_ns`, `rail` serializes at `rate` bytes/ns from then on.
    SetRate { at_ns: u64, rail: usize, rate: f64 },
    /// At `at_ns`, `rail` dies: everything on it fails after the retry timeout.
    Die { at_ns: u64, rail: usize },
}

/// What to run.
#[derive(Clone, Debug, PartialEq)]
pub struct SimConfig {
    pub rails: [RailModel; 2],
    /// Sizes of successive sends, cycled.
    pub send_sizes: Vec<u64>,
    /// Sends in flight.
    pub window: usize,
    pub duration_ns: u64,
    /// Completions are observed at multiples of this (the poll batching).
    pub poll_ns: u64,
    pub events: Vec<RailEvent>,
    /// After this long a dead rail's chains complete with an error.
    pub retry_timeout_ns: u64,
    /// `MPIB_PROBE_INTERVAL_US` in ns (0 = off).
    pub probe_interval_ns: u64,
    pub alpha: f64,
    pub beta: f64,
    /// Width of a timeline slot (ns).
    pub slot_ns: u64,
}

impl SimConfig {
    /// 512 KiB sends, 8 in flight, 200 ms, completions polled every 2 µs, 1 ms slots.
    pub fn new(rails: [RailModel; 2]) -> Self {
        SimConfig {
            rails,
            send_sizes: vec![512 << 10],
            window: 8,
            duration_ns: 200_000_000,
            poll_ns: 2_000,
            events: Vec::new(),
            retry_timeout_ns: 1_000_000,
            probe_interval_ns: 200_000,
            alpha: 0.125,
            beta: 0.25,
            slot_ns: 1_000_000,
        }
    }
}

/// Bytes per rail in one timeline slot.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct Slot {
    /// Bytes the policy put on each rail (the split decision).
    pub posted: [u64; 2],
    /// Bytes each rail delivered.
    pub delivered: [u64; 2],
    /// Sends posted, and how many of them used both rails.
    pub sends: u32,
    pub split_sends: u32,
}

/// What a run did.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct SimReport {
    pub duration_ns: u64,
    pub delivered: [u64; 2],
    pub sends: u64,
    /// Sends of more than 0 bytes that used both rails.
    pub split_sends: u64,
    /// Sends of 0 bytes, and whether each used SOUT alone.
    pub empty_sends: u64,
    pub empty_sends_on_sout_alone: u64,
    /// From the rails' real statistics counters.
    pub zero_byte_imm: [u64; 2],
    pub probes: [u64; 2],
    pub congestion_events: [u64; 2],
    pub timeline: Vec<Slot>,
    /// When each rail took an RTT sample (ns).
    pub sample_times: [Vec<u64>; 2],
}

impl SimReport {
    /// Bytes delivered per ns over the run.
    pub fn throughput(&self) -> f64 {
        (self.delivered[0] + self.delivered[1]) as f64 / self.duration_ns as f64
    }

    /// SOUT's part of the bytes posted in `[from_ns, to_ns)` (whole slots).
    pub fn posted_share(&self, from_ns: u64, to_ns: u64, slot_ns: u64) -> f64 {
        let slots =
            &self.timeline[(from_ns / slot_ns) as usize..(to_ns / slot_ns).min(self.timeline.len() as u64) as usize];
        let (a, b) = slots.iter().fold((0u64, 0u64), |(a, b), s| (a + s.posted[0], b + s.posted[1]));
        a as f64 / (a + b).max(1) as f64
    }

    /// After a change at `change_ns`: the new steady share (SOUT's posted share over the
    /// second half of what follows) and how long (ns) until every slot's share stays
    /// within `tol` (relative) of it. Slots in which nothing was posted do not count.
    pub fn settle(&self, change_ns: u64, tol: f64, slot_ns: u64) -> (f64, u64) {
        let steady = self.posted_share(change_ns + (self.duration_ns - change_ns) / 2, self.duration_ns, slot_ns);
        let first = change_ns.div_ceil(slot_ns) as usize;
        let mut settled_at = first;
        for (i, s) in self.timeline.iter().enumerate().skip(first) {
            let total = s.posted[0] + s.posted[1];
            if total > 0 && (s.posted[0] as f64 / total as f64 - steady).abs() > tol * steady {
                settled_at = i + 1;
            }
        }
        (steady, (settled_at as u64 * slot_ns).saturating_sub(change_ns))
    }

    /// The largest relative deviation from `share` of a slot's SOUT share in
    /// `[from_ns, to_ns)` (slots in which something was posted).
    pub fn slot_noise(&self, from_ns: u64, to_ns: u64, share: f64, slot_ns: u64) -> f64 {
        let slots = &self.timeline
            [from_ns.div_ceil(slot_ns) as usize..(to_ns / slot_ns).min(self.timeline.len() as u64) as usize];
        slots
            .iter()
            .filter(|s| s.posted[0] + s.posted[1] > 0)
            .map(|s| (s.posted[0] as f64 / (s.posted[0] + s.posted[1]) as f64 - share).abs() / share)
            .fold(0.0, f64::max)
    }

    /// RTT samples `rail` took in `[from_ns, to_ns)`.
    pub fn samples_between(&self, rail: usize, from_ns: u64, to_ns: u64) -> usize {
        self.sample_times[rail].iter().filter(|&&t| t >= from_ns && t < to_ns).count()
    }
}

#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord)]
struct Chain {
    posted_ns: u64,
    bytes: u64,
    /// Index into the sender's send slots; `usize::MAX` for a probe.
    send: usize,
}

const PROBE: usize = usize::MAX;

#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord)]
enum Ev {
    /// The rail's chain in service finishes serializing (stale unless `epoch` matches).
    ServiceEnd { rail: usize, epoch: u64 },
    /// A completion is polled.
    Complete { rail: usize, chain: Chain, ok: bool },
    /// `SimConfig::events[i]` happens.
    Change(usize),
}

struct Rail {
    model: RailModel,
    rate: f64,
    dead: bool,
    queue: VecDeque<Chain>,
    /// The chain in service and when it finishes serializing.
    serving: Option<(Chain, f64)>,
    /// When the serving estimate was last brought up to date (for rate changes).
    epoch: u64,
}

struct Sim<'a, P: SplitPolicy> {
    cfg: &'a SimConfig,
    policy: &'a mut P,
    tel: [RailTelemetry; 2],
    rails: [Rail; 2],
    heap: BinaryHeap<Reverse<(u64, u64, Ev)>>,
    seq: u64,
    /// Chains outstanding per send slot.
    pending: Vec<u32>,
    next_size: usize,
    rng: u64,
    report: SimReport,
}

/// Runs `cfg` with `policy` and returns what happened.
pub fn run<P: SplitPolicy>(policy: &mut P, cfg: &SimConfig) -> SimReport {
    let tel = |m: &RailModel| {
        RailTelemetry::new(TelemetryConfig { alpha: cfg.alpha, beta: cfg.beta, speed_mbps: m.speed_mbps })
    };
    let rail =
        |m: &RailModel| Rail { model: *m, rate: m.rate, dead: false, queue: VecDeque::new(), serving: None, epoch: 0 };
    let mut sim = Sim {
        cfg,
        policy,
        tel: [tel(&cfg.rails[0]), tel(&cfg.rails[1])],
        rails: [rail(&cfg.rails[0]), rail(&cfg.rails[1])],
        heap: BinaryHeap::new(),
        seq: 0,
        pending: vec![0; cfg.window],
        next_size: 0,
        rng: 0x853c49e6748fea9b,
        report: SimReport {
            duration_ns: cfg.duration_ns,
            timeline: vec![Slot::default(); (cfg.duration_ns / cfg.slot_ns + 1) as usize],
            ..SimReport::default()
        },
    };
    for (i, e) in cfg.events.iter().enumerate() {
        let (RailEvent::SetRate { at_ns, .. } | RailEvent::Die { at_ns, .. }) = *e;
        sim.push(at_ns, Ev::Change(i));
    }
    for slot in 0..cfg.window {
        sim.send(0, slot);
    }
    while let Some(Reverse((t, _, ev))) = sim.heap.pop() {
        if t > cfg.duration_ns {
            break;
        }
        sim.step(t, ev);
        crate::telemetry::refresh_probe_backoff(&mut sim.tel);
        for r in 0..2 {
            if sim.tel[r].idle_probe_due(t, cfg.probe_interval_ns) {
                sim.tel[r].on_probe_post(t);
                sim.report.probes[r] += 1;
                sim.enqueue(t, r, Chain { posted_ns: t, bytes: 0, send: PROBE });
            }
        }
    }
    for r in 0..2 {
        sim.report.zero_byte_imm[r] = sim.tel[r].stats().counters.zero_byte_imm.get();
        sim.report.congestion_events[r] = sim.tel[r].view().congestion_events;
    }
    sim.report
}

impl<P: SplitPolicy> Sim<'_, P> {
    fn push(&mut self, t: u64, ev: Ev) {
        self.seq += 1;
        self.heap.push(Reverse((t, self.seq, ev)));
    }

    fn slot(&mut self, t: u64) -> &mut Slot {
        let i = ((t / self.cfg.slot_ns) as usize).min(self.report.timeline.len() - 1);
        &mut self.report.timeline[i]
    }

    /// The next completion-poll instant at or after `t`.
    fn polled(&self, t: u64) -> u64 {
        t.div_ceil(self.cfg.poll_ns.max(1)) * self.cfg.poll_ns.max(1)
    }

    /// Posts a new send in `slot` at `t`, split by the policy.
    fn send(&mut self, t: u64, slot: usize) {
        let size = self.cfg.send_sizes[self.next_size % self.cfg.send_sizes.len()];
        self.next_size += 1;
        let sout = self.policy.sout_bytes(size, t, [self.tel[0].view(), self.tel[1].view()]).min(size);
        let mask = active_mask(size, sout);
        self.report.sends += 1;
        self.slot(t).sends += 1;
        self.slot(t).split_sends += (mask == RailMask::BOTH) as u32;
        if size == 0 {
            self.report.empty_sends += 1;
            self.report.empty_sends_on_sout_alone += (mask == RailMask::SOUT) as u64;
        } else if mask == RailMask::BOTH {
            self.report.split_sends += 1;
        }
        for (r, bytes) in [(0, sout), (1, size - sout)] {
            if mask.contains(r) {
                self.post(t, r, bytes, size, slot);
            }
        }
    }

    /// Posts one chain (one doorbell: the data WRITE_WITH_IMM) of `bytes` of a `size`-byte send.
    fn post(&mut self, t: u64, r: usize, bytes: u64, size: u64, slot: usize) {
        self.tel[r].on_post(t, bytes);
        self.tel[r].stats().count_post(1, 1, bytes, size);
        self.slot(t).posted[r] += bytes;
        self.pending[slot] += 1;
        self.enqueue(t, r, Chain { posted_ns: t, bytes, send: slot });
    }

    fn enqueue(&mut self, t: u64, r: usize, chain: Chain) {
        if self.rails[r].dead {
            let at = self.polled(t + self.cfg.retry_timeout_ns);
            self.push(at, Ev::Complete { rail: r, chain, ok: false });
            return;
        }
        self.rails[r].queue.push_back(chain);
        if self.rails[r].serving.is_none() {
            self.start_next(t, r);
        }
    }

    fn start_next(&mut self, t: u64, r: usize) {
        let rail = &mut self.rails[r];
        if let Some(c) = rail.queue.pop_front() {
            let end = t as f64 + c.bytes as f64 / rail.rate;
            rail.serving = Some((c, end));
            rail.epoch += 1;
            let epoch = rail.epoch;
            self.push(end.ceil() as u64, Ev::ServiceEnd { rail: r, epoch });
        }
    }

    fn step(&mut self, t: u64, ev: Ev) {
        match ev {
            Ev::ServiceEnd { rail: r, epoch } => {
                if epoch != self.rails[r].epoch {
                    return;
                }
                let Some((chain, _)) = self.rails[r].serving.take() else { return };
                self.rng ^= self.rng << 13;
                self.rng ^= self.rng >> 7;
                self.rng ^= self.rng << 17;
                let m = self.rails[r].model;
                let jitter = if m.jitter_ns > 0 { self.rng % m.jitter_ns } else { 0 };
                let at = self.polled(t + m.latency_ns + jitter);
                self.push(at, Ev::Complete { rail: r, chain, ok: true });
                self.start_next(t, r);
            }
            Ev::Complete { rail: r, chain, ok } => self.complete(t, r, chain, ok),
            Ev::Change(i) => match self.cfg.events[i] {
                RailEvent::SetRate { rail: r, rate, .. } => {
                    let rail = &mut self.rails[r];
                    if let Some((c, end)) = rail.serving {
                        // The bytes not yet serialized go at the new rate.
                        let left = (end - t as f64).max(0.0) * rail.rate;
                        let end = t as f64 + left / rate;
                        rail.serving = Some((c, end));
                        rail.epoch += 1;
                        let epoch = rail.epoch;
                        self.push(end.ceil() as u64, Ev::ServiceEnd { rail: r, epoch });
                    }
                    self.rails[r].rate = rate;
                }
                RailEvent::Die { rail: r, .. } => {
                    let rail = &mut self.rails[r];
                    rail.dead = true;
                    rail.epoch += 1;
                    let lost: Vec<Chain> =
                        rail.serving.take().map(|(c, _)| c).into_iter().chain(rail.queue.drain(..)).collect();
                    let at = self.polled(t + self.cfg.retry_timeout_ns);
                    for chain in lost {
                        self.push(at, Ev::Complete { rail: r, chain, ok: false });
                    }
                }
            },
        }
    }

    fn complete(&mut self, t: u64, r: usize, chain: Chain, ok: bool) {
        let tel = &mut self.tel[r];
        tel.stats().count_cqes(1);
        if chain.send == PROBE {
            if ok {
                tel.on_probe_complete(t);
                self.report.sample_times[r].push(t);
            } else {
                tel.on_error();
            }
            return;
        }
        if !ok {
            // The sender's recovery: the bytes go again on the other rail.
            tel.on_error();
            tel.on_abandon(chain.bytes);
            self.pending[chain.send] -= 1;
            self.post(t, 1 - r, chain.bytes, chain.bytes, chain.send);
            return;
        }
        tel.on_complete(Sample { posted_ns: chain.posted_ns, completed_ns: t, bytes: chain.bytes });
        self.report.sample_times[r].push(t);
        self.report.delivered[r] += chain.bytes;
        self.slot(t).delivered[r] += chain.bytes;
        self.pending[chain.send] -= 1;
        if self.pending[chain.send] == 0 {
            self.send(t, chain.send);
        }
    }
}

#[cfg(test)]
#[path = "sim_tests.rs"]
mod tests;
