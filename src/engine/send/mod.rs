//! The sender: matches `isend`s to the receiver's CTS entries in posting order, decides the
//! split of each send immediately before posting, emits one chain per active rail (nothing
//! on an inactive rail), and completes sends when every active rail's signalled WR did.

use super::config::SendConfig;
use super::failover::Failover;
use super::layout::{CtsEntry, MAX_RECVS, SLOTS, SendMemory};
use super::slots::{PostedSlot, ReqState, SendReq};
use super::{
    ErrorState, Posts, RAILS, RailCounts, RailMask, Refused, SOUT, SUP, Side, StrayCompletion, Violation, WrKind, cold,
};
use crate::error::{Error, Result};
use crate::fabric::{Completion, WcStatus};
use crate::split::AnySplit;
use crate::telemetry::{RailTelemetry, Sample};

mod drill;
mod failover;
mod post;
mod profile;
mod report;
mod timers;

#[cfg(test)]
pub(crate) use post::stripe;
pub use profile::{PartState, SentPart, SlotView};

use crate::engine::CpuAccess;
pub use timers::CallerWaits;

/// One send as NCCL gave it.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct SendBuf {
    pub addr: u64,
    pub size: u64,
    pub tag: u32,
    pub lkeys: [u32; RAILS],
    /// Whether the CPU may read the buffer (host memory): only then may its bytes be
    /// copied into a WR (posted inline).
    pub cpu: CpuAccess,
}

/// The slot being matched: its CTS entries and which send took each (its request and
/// buffer, kept here until the slot is posted).
#[derive(Clone, Copy, Debug, Default)]
struct Matching {
    n: usize,
    matched: usize,
    entries: [CtsEntry; MAX_RECVS],
    reqs: [Option<u16>; MAX_RECVS],
    bufs: [SendBuf; MAX_RECVS],
}

/// The sending side of one connection.
pub struct SendEngine {
    cfg: SendConfig,
    split: AnySplit,
    tel: [RailTelemetry; RAILS],
    reqs: Box<[SendReq]>,
    free: Vec<u16>,
    slots: Box<[PostedSlot; SLOTS]>,
    /// CTS slots consumed so far; the next slot is `fifo_head % SLOTS`.
    fifo_head: u64,
    /// The slot being matched, when `matching` (kept in place: no copies per send).
    cur: Matching,
    matching: bool,
    /// Round-robin data-QP cursor per rail.
    rr: [u16; RAILS],
    /// A rail stripes its shares over its QPs (`SendConfig::pieces`): the posting path
    /// checks this once per message.
    stripes: bool,
    /// Slots whose signalled WR on the rail has not completed.
    outstanding: [u32; RAILS],
    /// The rails that have carried a transfer of this connection (keepalives go only there).
    carried: RailMask,
    error: ErrorState,
    /// Sends refused for being larger than their receive.
    mismatches: u64,
    /// No probe or keepalive can be due before this time (ns): the earliest end of a rail's
    /// idle interval seen by the last full check. Posts only move those ends later, so it
    /// is a lower bound, and `test` skips the check with one compare until then.
    probe_check_ns: u64,
    /// Sends matched and not complete: NCCL waits on the connection (keepalives).
    pending: u32,
    /// The last `isend` found no CTS: the caller waits for the receiver (keepalives).
    no_cts: bool,
    fo: Failover,
    /// The fault drill's schedule (`MPIB_FAULT_RAIL`), if configured.
    drill: Option<drill::Drill>,
    /// Requests that wait too long make a hang report (`engine/hang.rs`).
    hang: crate::engine::hang::HangWatch,
}

impl SendEngine {
    /// The sending side of a connection that came up at `now_ns` (idle rails are probed,
    /// and kept alive, from then on).
    pub fn new(cfg: SendConfig, split: AnySplit, mut tel: [RailTelemetry; RAILS], now_ns: u64) -> Self {
        assert!(cfg.qps.iter().all(|&q| q >= 1), "each rail needs at least one QP");
        for r in 0..RAILS {
            let most = cfg.qps[r].min(super::imm::MAX_PIECES as u16) as u8;
            assert!((1..=most).contains(&cfg.pieces[r]), "a rail's pieces go on distinct QPs, at most 4");
        }
        let n = cfg.max_requests.clamp(1, SLOTS * MAX_RECVS);
        for t in &mut tel {
            t.start(now_ns);
        }
        let fo = Failover::new(cfg.failover.clone(), now_ns).with_replays();
        let drill = cfg.failover.drill.map(drill::Drill::new);
        SendEngine {
            split,
            tel,
            reqs: vec![SendReq::default(); n].into_boxed_slice(),
            free: (0..n as u16).rev().collect(),
            slots: Box::new([PostedSlot::default(); SLOTS]),
            fifo_head: 0,
            cur: Matching::default(),
            matching: false,
            rr: [0; RAILS],
            stripes: cfg.pieces.iter().any(|&p| p > 1),
            outstanding: [0; RAILS],
            carried: RailMask::NONE,
            error: ErrorState::default(),
            mismatches: 0,
            probe_check_ns: 0,
            pending: 0,
            no_cts: false,
            fo,
            drill,
            hang: crate::engine::hang::HangWatch::new(0),
            cfg,
        }
    }

    /// Where the connection is: its log lines about a rail end with the rail's place, the
    /// errors it reports with the connection's.
    pub fn set_place(&mut self, place: crate::engine::PlaceRef) {
        self.error.place = place;
    }

    /// ` [the place of rail]`, for the end of a log line.
    pub(crate) fn at(&self, rail: usize) -> crate::engine::place::At<'_> {
        self.error.place.at(rail)
    }

    /// The counters of both rails, now.
    pub fn counters(&self) -> [RailCounts; RAILS] {
        [self.tel[SOUT].stats().counters.load(), self.tel[SUP].stats().counters.load()]
    }

    pub fn telemetry(&self) -> &[RailTelemetry; RAILS] {
        &self.tel
    }

    /// Sends refused so far for being larger than the receive posted for them.
    pub fn mismatches(&self) -> u64 {
        self.mismatches
    }

    /// A send larger than its receive: refused (ncclInvalidUsage), as net_ib does; the CTS
    /// entry stays for a send that fits. NCCL never does this; a user's mismatched
    /// collectives do, and then every send may: the engine does not log it (the ABI edge
    /// logs the error, rate-limited).
    #[cold]
    #[inline(never)]
    fn mismatch(&mut self, buf: &SendBuf, posted: u64) -> Error {
        self.mismatches += 1;
        let slot = (self.fifo_head % SLOTS as u64) as usize;
        Refused::LargerThanReceive { size: buf.size, posted, tag: buf.tag, slot }.into()
    }

    /// The error that broke this connection, if any.
    pub fn error(&self) -> Option<&Error> {
        self.error.get()
    }

    /// Rails with signalled WRs in flight (the CQs worth polling): data, idle probes, and
    /// a re-admission's probes (a rebuilt rail carries no data until they completed, so
    /// without them its CQ would never be polled where only busy rails are: verbs).
    pub fn busy_rails(&self) -> RailMask {
        let busy = RailMask::from_fn(|r| self.outstanding[r] > 0 || self.tel[r].probe_outstanding());
        // (Both rails' probe counts in one compare: the common case costs one.)
        if self.fo.probes_out == [0; RAILS] {
            return busy;
        }
        busy | RailMask::from_fn(|r| self.fo.probes_out[r] != 0)
    }

    /// Rails whose completions have failed (they get no new traffic).
    #[inline]
    pub fn failed_rails(&self) -> RailMask {
        RailMask::from_fn(|r| self.tel[r].view().failed)
    }

    /// A failure outside the engine (a post or poll the fabric refused) breaks the
    /// connection: the requests it leaves incomplete and every later call report it.
    /// Returns `e` placed, for the caller to report.
    pub fn fail(&mut self, e: Error) -> Error {
        self.error.fail(e)
    }

    /// Reads the next CTS slot if the receiver has written all of it.
    fn poll_cts(&mut self, mem: &impl SendMemory) -> Result<bool> {
        let slot = (self.fifo_head % SLOTS as u64) as usize;
        if !self.slots[slot].pending.is_empty() {
            // The slot's previous use still awaits completions (the receiver freed the slot
            // when the IMMs landed; acks can come later). Completions name only (rail, slot):
            // taking the slot now would let a late one complete the new send early and leave
            // the old one pending forever. Not now: NCCL's test on the old sends polls them.
            return Ok(false);
        }
        let w0 = mem.fifo_word(slot, 0);
        if w0 >> 8 != self.fifo_head + 1 {
            return Ok(false);
        }
        let n = (w0 & 0xff) as usize;
        if n == 0 || n > MAX_RECVS {
            return Err(self.error.fail(cold(move || Violation::CtsBadCount { slot, n }.into())));
        }
        // The last word of the slot's WRITE is placed last: when it is fresh, all is.
        if n > 1 && mem.fifo_word(slot, n - 1) != w0 {
            return Ok(false);
        }
        for i in 0..n {
            let e = mem.fifo_entry(slot, i);
            if e.word != w0 || e.nreqs as usize != n {
                return Err(self.error.fail(cold(move || {
                    let (word, nreqs) = (e.word, e.nreqs);
                    Violation::CtsInconsistent { slot, entry: i, word, nreqs, expected_word: w0, expected_n: n }.into()
                })));
            }
            self.cur.entries[i] = e;
        }
        let m = &mut self.cur;
        (m.n, m.matched) = (n, 0);
        m.reqs = [None; MAX_RECVS];
        self.matching = true;
        Ok(true)
    }

    /// `isend`: `Ok(None)` when the matching receive is not posted yet, or its CTS slot's
    /// previous use still awaits completions (NCCL retries; polling the CQs of
    /// [`Self::busy_rails`] frees the slot).
    /// When this send completes its slot, the slot's chains are appended to `out`.
    pub fn isend(
        &mut self,
        now_ns: u64,
        buf: SendBuf,
        mem: &mut impl SendMemory,
        out: &mut Posts,
    ) -> Result<Option<u16>> {
        self.error.check()?;
        if !self.matching && !self.poll_cts(mem)? {
            self.no_cts = true;
            return Ok(None);
        }
        self.no_cts = false;
        let m = &self.cur;
        // Tags select the buffer within the slot, first unmatched one first.
        let Some(i) = (0..m.n).find(|&i| m.reqs[i].is_none() && m.entries[i].tag == buf.tag) else {
            // Not for this slot: net_ib also answers "not now"; NCCL matches in order.
            return Ok(None);
        };
        let posted = m.entries[i].size;
        if buf.size > posted {
            return Err(self.mismatch(&buf, posted));
        }
        let Some(id) = self.free.pop() else {
            return Err(cold(move || Refused::TooManySends { max: self.reqs.len() }.into()));
        };
        let size = buf.size;
        self.reqs[id as usize] = SendReq { state: ReqState::Pending, size };
        self.pending += 1;
        let m = &mut self.cur;
        m.reqs[i] = Some(id);
        m.bufs[i] = buf;
        m.matched += 1;
        if m.matched == m.n {
            self.matching = false;
            self.post_slot(now_ns, mem, out)?;
        }
        if self.drill.is_some() {
            self.drill_isend(now_ns);
        }
        Ok(Some(id))
    }

    /// A completion polled from `rail`'s CQ. `now_ns` is used when it has no timestamp.
    pub fn handle_completion(&mut self, now_ns: u64, rail: usize, c: &Completion) -> Result<()> {
        self.tel[rail].stats().count_cqes(1);
        if self.error.is_set() {
            return self.after_failure(rail, c);
        }
        let Some((kind, wr_rail, slot)) = WrKind::decode(c.wr_id) else {
            return Err(self.error.unknown_wr_id(rail, c.wr_id));
        };
        let t = if c.timestamp_ns != 0 { c.timestamp_ns } else { now_ns };
        if c.status != WcStatus::Success {
            if self.fo.cfg.enabled {
                // The rail of the CQ: a replay's wr_id names the part, not the rail.
                return self.on_rail_error(rail, kind, slot, c);
            }
            self.tel[wr_rail].on_error();
            return Err(self.error.fail(cold(move || kind.failed(wr_rail, slot, c).into())));
        }
        match kind {
            WrKind::DataSignal => {
                // (A slot beyond the window: a wr_id the provider made up.)
                if slot >= SLOTS || !self.slots[slot].pending.contains(wr_rail) {
                    return self.stray_signal(wr_rail, slot);
                }
                let s = &mut self.slots[slot];
                if s.extra_pieces[wr_rail] > 0 {
                    // A striped share: complete once its last piece is.
                    s.extra_pieces[wr_rail] -= 1;
                    self.fo.heard_ns[wr_rail] = t;
                    return Ok(());
                }
                s.pending = s.pending.without(wr_rail);
                self.outstanding[wr_rail] -= 1;
                let sample = Sample { posted_ns: s.posted_ns[wr_rail], completed_ns: t, bytes: s.bytes[wr_rail] };
                let done = s.pending.is_empty();
                self.tel[wr_rail].on_complete(sample);
                self.fo.heard_ns[wr_rail] = t; // the silent-rail check's (`silence.rs`)
                if done {
                    self.complete_slot(slot);
                }
                Ok(())
            }
            WrKind::Probe => {
                if !self.tel[wr_rail].probe_outstanding() {
                    return Err(self
                        .error
                        .fail(cold(move || StrayCompletion::NoProbeInFlight { rail: wr_rail }.into())));
                }
                self.tel[wr_rail].on_probe_complete(t);
                self.fo.heard_ns[wr_rail] = t;
                Ok(())
            }
            WrKind::ReplaySignal | WrKind::Control | WrKind::ReadmitProbe if self.fo.cfg.enabled => {
                self.on_failover_completion(rail, kind, wr_rail, slot)
            }
            _ => Err(self.error.fail(cold(move || {
                StrayCompletion::Unexpected { rail: wr_rail, what: kind.request(), side: Side::Send }.into()
            }))),
        }
    }

    /// A completion polled after the connection failed: a data part that the transport
    /// delivered before still completes its sends (they stay completed); everything else
    /// (flushed WRs, probes) is dropped without a word: the failure was reported once.
    #[cold]
    #[inline(never)]
    fn after_failure(&mut self, rail: usize, c: &Completion) -> Result<()> {
        if c.status != WcStatus::Success || !self.error.trusts_completions() {
            return Ok(());
        }
        let Some((kind, part, slot)) = WrKind::decode(c.wr_id) else { return Ok(()) };
        let original = kind == WrKind::DataSignal && part == rail;
        let replay = kind == WrKind::ReplaySignal && slot < SLOTS && self.fo.replays[slot].replay.contains(part);
        if slot >= SLOTS || !self.slots[slot].pending.contains(part) || !(original || replay) {
            return Ok(());
        }
        let s = &mut self.slots[slot];
        if original && s.extra_pieces[part] > 0 {
            s.extra_pieces[part] -= 1;
            return Ok(());
        }
        s.pending = s.pending.without(part);
        let r = &mut self.fo.replays[slot];
        r.replay = r.replay.without(part);
        self.outstanding[rail] = self.outstanding[rail].saturating_sub(1);
        if s.pending.is_empty() {
            self.complete_slot(slot);
        }
        Ok(())
    }

    /// Every send of `slot` is complete.
    #[inline]
    fn complete_slot(&mut self, slot: usize) {
        crate::engine::send_path::complete(&self.slots[slot], &mut self.reqs, &mut self.pending);
    }

    /// A data completion for a part that is not outstanding: after a failover, the dead
    /// rail's late acknowledgements of parts the receiver's report already settled;
    /// otherwise a completion the engine never asked for.
    #[cold]
    #[inline(never)]
    fn stray_signal(&mut self, rail: usize, slot: usize) -> Result<()> {
        if self.fo.cfg.enabled && self.fo.failed().contains(rail) {
            return Ok(());
        }
        Err(self.error.fail(StrayCompletion::NoneOutstanding { rail, slot }.into()))
    }

    /// `test`: the bytes sent once request `id` is complete (then `id` is free again).
    /// Inlined into the comm's `test`, its one caller.
    /// A send that completed stays completed whatever happened to the connection since (a
    /// peer that closed right after its last receive is the normal end of a job); one that
    /// had not reports the connection's failure.
    #[inline(always)]
    pub fn test(&mut self, id: u16) -> Result<Option<u64>> {
        let Some(r) = self.reqs.get_mut(id as usize) else {
            return Err(cold(move || Refused::NoSuchSend { id }.into()));
        };
        match r.state {
            ReqState::Done => {
                let size = r.size;
                *r = SendReq::default();
                self.free.push(id);
                Ok(Some(size))
            }
            ReqState::Pending => {
                self.error.check()?;
                Ok(None)
            }
            ReqState::Free => Err(cold(move || Refused::SendNotInFlight { id }.into())),
        }
    }

    /// Whether request `id` is in flight (allocated and not yet returned by `test`).
    pub fn is_live(&self, id: u16) -> bool {
        self.reqs.get(id as usize).is_some_and(|r| r.state != ReqState::Free)
    }
}
