//! The receiver: posts CTS entries (one RDMA WRITE into the sender's FIFO on the fixed CTS
//! QP of the rail the last data came on, or of rail `slot % 2` after split data; every
//! [`CTS_SIGNAL_EVERY`]-th of a rail signalled), and completes a
//! receive when every rail named in the IMM's active mask has delivered exactly one IMM
//! (mask learning, seed 003 §2.3). The shared receive queues its IMMs consume are the
//! plugin's: kept stocked per NIC for every receive the connections may have outstanding.

use super::config::RecvConfig;
use super::failover::Failover;
use super::layout::{CTS_ENTRY_BYTES, CTS_SLOT_BYTES, CtsEntry, MAX_RECVS, RecvMemory, SLOTS};
use super::slots::{RecvSlot, RecvState};
use super::{
    ErrorState, Posts, QpRef, RAILS, RailCounts, RailMask, Refused, SOUT, SUP, Side, StrayCompletion, Violation,
    WorkRequest, WrKind, cold, failure,
};
use crate::error::{Error, Result};
use crate::fabric::{Completion, SendWr, Sge, WcOpcode, WcStatus, WrOpcode};
use crate::telemetry::StatsHandle;

mod arrival;
mod failover;
mod flush;
mod pieces;
mod report;
mod timers;

pub use flush::FlushBuf;
use flush::FlushReq;

/// One receive buffer as NCCL gave it.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct RecvBuf {
    pub addr: u64,
    pub size: u64,
    pub tag: u32,
    pub rkeys: [u32; RAILS],
}

/// The sizes of a completed receive.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct RecvDone {
    pub n: usize,
    pub sizes: [u64; MAX_RECVS],
}

/// Flush requests in flight at once.
pub const MAX_FLUSHES: usize = 32;
/// Request ids from here on are flush requests.
pub const FLUSH_ID_BASE: u16 = SLOTS as u16;

/// The receiving side of one connection.
pub struct RecvEngine {
    cfg: RecvConfig,
    stats: [StatsHandle; RAILS],
    slots: Box<[RecvSlot; SLOTS]>,
    /// Receives posted so far; the next slot is `fifo_tail % SLOTS`.
    fifo_tail: u64,
    outstanding: usize,
    flushes: [FlushReq; MAX_FLUSHES],
    error: ErrorState,
    /// A completion or a post happened since the last keepalive check. A flag, not a time:
    /// the data path reads no clock for it (two clock reads a message, ~35 instructions);
    /// the next check that finds it set starts the quiet period then.
    active: bool,
    /// When the current quiet period started (ns): the first keepalive check after activity.
    quiet_since_ns: u64,
    /// The rail a keepalive is in flight on, if any.
    keepalive: Option<usize>,
    /// Rails whose keepalive was left in flight when the rail failed: its completion
    /// (success or flush) still comes and is dropped, not taken for a stray.
    keepalive_abandoned: RailMask,
    /// Keepalives sent so far (they alternate rails).
    keepalives: u64,
    /// Failover, with the rails that have not failed (CTS writes and keepalives go there:
    /// `fo.live_rails`) and the CTS writes to post again (`fo.cts_redo`).
    fo: Failover,
    /// The rails the last data IMM named (its mask): where the next CTS goes (`cts_rail`).
    data_rails: RailMask,
    /// CTS WRITEs on each rail since its last signalled one.
    cts_run: [u8; RAILS],
    /// Striped shares replayed whole after some of their pieces had arrived (failover).
    partial_parts: u64,
    /// Receives that wait too long make a hang report (`engine/hang.rs`).
    hang: crate::engine::hang::HangWatch,
}

/// Every this many CTS WRITEs on a rail, one is signalled (its completion retires the
/// earlier ones from the CTS QP's send queue; `plugin/rail.rs` sizes the queue from it).
pub const CTS_SIGNAL_EVERY: u8 = (SLOTS / 2) as u8;
const _: () = assert!(CTS_SIGNAL_EVERY.is_power_of_two(), "the run counter wraps with a mask");

impl RecvEngine {
    /// A receiver publishing its counters into `stats` (SOUT, SUP).
    pub fn new(mut cfg: RecvConfig, stats: [StatsHandle; RAILS]) -> Self {
        cfg.max_requests = cfg.max_requests.clamp(1, SLOTS);
        RecvEngine {
            fo: Failover { live_rails: cfg.rails_mask, ..Failover::new(cfg.failover.clone(), 0) },
            data_rails: RailMask::NONE,
            cts_run: [0; RAILS],
            partial_parts: 0,
            cfg,
            stats,
            slots: Box::new([RecvSlot::default(); SLOTS]),
            fifo_tail: 0,
            outstanding: 0,
            flushes: [FlushReq::default(); MAX_FLUSHES],
            error: ErrorState::default(),
            active: false,
            quiet_since_ns: 0,
            keepalive: None,
            keepalive_abandoned: RailMask::NONE,
            keepalives: 0,
            hang: crate::engine::hang::HangWatch::new(0),
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
        [self.stats[0].counters.load(), self.stats[1].counters.load()]
    }

    /// `n` more receiver-not-ready waits the fabric saw on `rail`.
    pub fn count_rnr(&self, rail: usize, n: u64) {
        self.stats[rail].count_rnr(n);
    }

    pub fn error(&self) -> Option<&Error> {
        self.error.get()
    }

    /// A failure outside the engine (a post or poll the fabric refused) breaks the
    /// connection: the receives it leaves incomplete and every later call report it.
    /// Returns `e` placed, for the caller to report.
    pub fn fail(&mut self, e: Error) -> Error {
        self.error.fail(e)
    }

    /// Records and returns the protocol violation `v` makes (`v`: a `move` closure, see
    /// [`cold`]).
    fn violation(&mut self, v: impl FnOnce() -> Violation) -> Error {
        self.error.fail(cold(move || v().into()))
    }

    /// `irecv`: writes the CTS entries into `mem` and appends the CTS chain to `out`.
    /// Inlined into the comm's `irecv`, its one caller (saves a frame on every receive).
    #[inline(always)]
    pub fn irecv(&mut self, bufs: &[RecvBuf], mem: &mut impl RecvMemory, out: &mut Posts) -> Result<Option<u16>> {
        self.error.check()?;
        let n = bufs.len();
        if n == 0 || n > MAX_RECVS {
            return Err(cold(move || Refused::RecvCount { n }.into()));
        }
        if self.outstanding >= self.cfg.max_requests {
            return Err(cold(move || Refused::TooManyRecvs { max: self.cfg.max_requests }.into()));
        }
        // One OR over the sizes (no early exit: a branch per buffer costs more than it saves).
        if bufs.iter().fold(0, |m, b| m | b.size) > u32::MAX as u64 {
            return Err(cold(|| too_large(bufs)));
        }
        let slot = (self.fifo_tail % SLOTS as u64) as usize;
        if self.slots[slot].state != RecvState::Free {
            // The receive posted SLOTS receives ago is still outstanding (NCCL tested later
            // ones first): not now. NCCL retries, and tests that older one meanwhile.
            return Ok(None);
        }
        let word = CtsEntry::word_for(self.fifo_tail, n);
        let rail = self.cts_rail(slot);
        let run = self.cts_run[rail];
        let signaled = run == CTS_SIGNAL_EVERY - 1;
        self.cts_run[rail] = (run + 1) % CTS_SIGNAL_EVERY;
        // Filled in place (only what this receive uses: `sizes` is written when it completes).
        let s = &mut self.slots[slot];
        (s.state, s.n, s.expected, s.seen, s.size_q, s.byte_sum) =
            (RecvState::Posted, n as u8, RailMask::NONE, RailMask::NONE, 0, 0);
        (s.cts_pending, s.data_done, s.pieces_seen) = (signaled, false, [0; RAILS]);
        for (i, b) in bufs.iter().enumerate() {
            let e = CtsEntry { addr: b.addr, size: b.size, rkeys: b.rkeys, tag: b.tag, nreqs: n as u32, word };
            mem.write_cts(slot, i, &e);
            s.posted[i] = b.size;
        }
        let wr = self.cts_wr(rail, slot, n, signaled);
        out.push(rail, QpRef::Cts).push(wr);
        self.stats[rail].count_post(1, 0, 0, 0);
        self.fifo_tail += 1;
        self.outstanding += 1;
        self.active = true;
        Ok(Some(slot as u16))
    }

    /// The WRITE of `slot`'s CTS entries (`n` of them) from this side's copy to the
    /// sender's FIFO on `rail` (also what a failover re-posts).
    #[inline(always)]
    pub(super) fn cts_wr(&self, rail: usize, slot: usize, n: usize, signaled: bool) -> SendWr {
        let len = (n * CTS_ENTRY_BYTES) as u32;
        let off = (slot * CTS_SLOT_BYTES) as u64;
        SendWr {
            wr_id: WrKind::Cts.id(rail, slot),
            opcode: WrOpcode::Write,
            signaled,
            // Signalled only to retire the CTS QP's slots: the proxy's next post or poll
            // may carry it (the soft fabric then sends it with the reply's frames).
            deferrable: true,
            inline: len <= self.cfg.max_inline,
            num_sge: 1,
            sge: [Sge { addr: self.cfg.cts_addr + off, len, lkey: self.cfg.cts_lkeys[rail] }, Sge::default()],
            remote_addr: self.cfg.fifo_addr + off,
            rkey: self.cfg.fifo_rkeys[rail],
            imm: 0,
        }
    }

    /// The rail whose fixed CTS QP carries `slot`'s CTS: the rail the last data came on
    /// when it came on one (small sends stay on one rail), so the CTS travels with that
    /// rail's traffic — on the soft fabric it rides in the same `sendmsg` as the reply, and
    /// the sender's poll of that one link finds both (alternating, a CTS on the other rail
    /// left alone: 2.6-2.7x a raw TCP ping-pong, against 1.5-1.9x on one rail); after a
    /// split transfer, or before any data, alternating by slot as net_ib alternates devices.
    #[inline]
    fn cts_rail(&self, slot: usize) -> usize {
        let live = self.fo.live_rails;
        if live != RailMask::BOTH {
            return live.first().unwrap_or(SOUT);
        }
        match self.data_rails {
            RailMask::SOUT => SOUT,
            RailMask::SUP => SUP,
            _ => slot % RAILS,
        }
    }

    /// A completion polled from `rail`'s CQ.
    pub fn handle_completion(&mut self, rail: usize, c: &Completion, mem: &impl RecvMemory) -> Result<()> {
        self.stats[rail].count_cqes(1);
        self.active = true;
        let imm_recv = c.opcode == WcOpcode::RecvRdmaWithImm;
        if self.error.is_set() {
            return self.after_failure(rail, c, mem);
        }
        if imm_recv {
            if c.status != WcStatus::Success {
                if self.fo.cfg.enabled {
                    return self.on_rail_error(rail, None, c);
                }
                return Err(self.error.fail(cold(move || failure(rail, WorkRequest::ImmReceive, None, c).into())));
            }
            return self.on_imm(rail, c.imm, c.byte_len as u64, mem);
        }
        let Some((kind, wr_rail, slot)) = WrKind::decode(c.wr_id) else {
            if c.status != WcStatus::Success {
                if self.fo.cfg.enabled {
                    return self.on_rail_error(rail, None, c);
                }
                // A flushed SRQ WQE or an unknown WR: report the status, it is the cause.
                return Err(self.error.fail(cold(move || failure(rail, WorkRequest::Unknown, None, c).into())));
            }
            return Err(self.error.unknown_wr_id(rail, c.wr_id));
        };
        if c.status != WcStatus::Success {
            // A flush READ goes on the rail's loopback QP: its failure is not the link's.
            if self.fo.cfg.enabled && kind != WrKind::Flush {
                return self.on_rail_error(rail, Some((kind, slot)), c);
            }
            let e = self.error.fail(cold(move || kind.failed(wr_rail, slot, c).into()));
            // A receive whose data is all in completes though its CTS WRITE's
            // acknowledgement was lost: the sender had the CTS (it sent the data).
            return self.after_failure(rail, c, mem).and(Err(e));
        }
        match kind {
            WrKind::Cts => {
                let Some(s) = self.slots.get_mut(slot).filter(|s| s.state == RecvState::Posted && s.cts_pending) else {
                    return Err(self.error.fail(cold(move || StrayCompletion::CtsNotAwaited { slot }.into())));
                };
                s.cts_pending = false;
                if s.data_done {
                    s.state = RecvState::Done;
                }
                Ok(())
            }
            WrKind::Flush => match self.flushes.get_mut(slot) {
                Some(f) if f.live && f.pending.contains(wr_rail) => {
                    f.pending = f.pending.without(wr_rail);
                    Ok(())
                }
                // Never credit another flush with it: that flush would complete early.
                _ => Err(self
                    .error
                    .fail(cold(move || StrayCompletion::FlushNotInFlight { rail: wr_rail, flush: slot }.into()))),
            },
            WrKind::Probe if self.keepalive == Some(wr_rail) => {
                self.keepalive = None;
                Ok(())
            }
            WrKind::Probe if self.keepalive_abandoned.contains(wr_rail) => {
                self.keepalive_abandoned = self.keepalive_abandoned.without(wr_rail);
                Ok(())
            }
            WrKind::Control if self.fo.cfg.enabled => Ok(()),
            WrKind::ReadmitProbe if self.fo.cfg.enabled => {
                self.on_readmit_probe(wr_rail, slot);
                Ok(())
            }
            _ => Err(self.error.fail(cold(move || {
                StrayCompletion::Unexpected { rail: wr_rail, what: kind.request(), side: Side::Receive }.into()
            }))),
        }
    }

    /// A completion polled after the connection failed. When the transport failed (not the
    /// peer's protocol), what it delivered before still counts: an IMM completes its
    /// receive, a CTS WRITE acknowledged (or flushed once its receive's data is all in)
    /// lets that receive complete. Everything else is dropped without a word.
    #[cold]
    #[inline(never)]
    fn after_failure(&mut self, rail: usize, c: &Completion, mem: &impl RecvMemory) -> Result<()> {
        if !self.error.trusts_completions() {
            return Ok(());
        }
        if c.opcode == WcOpcode::RecvRdmaWithImm {
            if c.status != WcStatus::Success {
                return Ok(());
            }
            // A violation found here poisons the connection: later IMMs are not believed.
            return self.on_imm(rail, c.imm, c.byte_len as u64, mem);
        }
        if let Some((WrKind::Cts, _, slot)) = WrKind::decode(c.wr_id)
            && let Some(s) = self.slots.get_mut(slot).filter(|s| s.state == RecvState::Posted && s.cts_pending)
            && (c.status == WcStatus::Success || s.data_done)
        {
            s.cts_pending = false;
            if s.data_done {
                s.state = RecvState::Done;
            }
        }
        Ok(())
    }

    /// `test`: the sizes once request `id` is complete (then `id` is free again).
    pub fn test(&mut self, id: u16) -> Result<Option<RecvDone>> {
        let mut sizes = [0; MAX_RECVS];
        Ok(self.test_n(id)?.map(|n| {
            sizes[..n].copy_from_slice(self.done_sizes(id, n));
            RecvDone { n, sizes }
        }))
    }

    /// [`Self::test`] returning only the number of sizes, `n` (0 for a flush); they are
    /// then read in place with [`Self::done_sizes`]: no copy on the data path. Inlined
    /// into the comm's `test`.
    ///
    /// A receive that completed stays completed whatever happened to the connection since
    /// (its sender may close right after its last send); one that had not reports the
    /// connection's failure.
    #[inline(always)]
    pub fn test_n(&mut self, id: u16) -> Result<Option<usize>> {
        if id >= FLUSH_ID_BASE {
            let Some(f) = self.flushes.get_mut((id - FLUSH_ID_BASE) as usize).filter(|f| f.live) else {
                return Err(cold(move || Refused::FlushNotInFlight { id }.into()));
            };
            if f.pending.is_empty() {
                *f = FlushReq::default();
                return Ok(Some(0));
            }
            self.error.check()?;
            return Ok(None);
        }
        let Some(s) = self.slots.get_mut(id as usize) else {
            return Err(cold(move || Refused::NoSuchRecv { id }.into()));
        };
        match s.state {
            RecvState::Done => {
                let n = s.n as usize;
                // The next irecv of this slot sets every field it reads; until then the
                // sizes stay for `done_sizes`.
                s.state = RecvState::Free;
                self.outstanding -= 1;
                Ok(Some(n))
            }
            RecvState::Posted => {
                self.error.check()?;
                Ok(None)
            }
            RecvState::Free => Err(cold(move || Refused::RecvNotInFlight { id }.into())),
        }
    }

    /// The `n` sizes of receive `id`, which [`Self::test_n`] just found done (`n` as it
    /// returned; empty for a flush), read before the next `irecv`.
    #[inline(always)]
    pub fn done_sizes(&self, id: u16, n: usize) -> &[u64] {
        match self.slots.get(id as usize) {
            Some(s) => &s.sizes[..n.min(MAX_RECVS)],
            None => &[],
        }
    }

    /// Whether request `id` is in flight.
    pub fn is_live(&self, id: u16) -> bool {
        if id >= FLUSH_ID_BASE {
            return self.flushes.get((id - FLUSH_ID_BASE) as usize).is_some_and(|f| f.live);
        }
        self.slots.get(id as usize).is_some_and(|s| s.state != RecvState::Free)
    }

    /// Receives in flight.
    pub fn outstanding(&self) -> usize {
        self.outstanding
    }
}

/// The refusal of a receive with a buffer beyond `u32::MAX` bytes (the first such one).
fn too_large(bufs: &[RecvBuf]) -> Error {
    let size = bufs.iter().map(|b| b.size).find(|&s| s > u32::MAX as u64).unwrap_or(0);
    Refused::RecvTooLarge { size }.into()
}
