//! In-process mode's direct path. Both ends of an in-process connection live in this
//! process, so a posted WR needs no stream: it is executed at once against the peer's
//! registration, with the checks and the ordering the TCP path gives:
//!
//! - local SGEs are checked first (inline ones were checked and copied at post time), then
//!   the rkey, bounds and rights at the responder, then (WRITE_WITH_IMM) the responder's SRQ;
//!   a refusal fails the WR with the status the TCP path reports and puts the QP in the
//!   error state (later WRs `Flushed`);
//! - a WRITE of at least 8 bytes whose end is 8-aligned stores its final 8 bytes last, with
//!   one Release `AtomicU64` store;
//! - a WRITE_WITH_IMM takes one SRQ WQE and pushes one `RecvRdmaWithImm` completion to the
//!   responder's CQ after placement. With the SRQ empty (counted once in `rnr_events`) or
//!   the responder's CQ full, the WR waits with everything behind it, and is retried when
//!   either side polls a CQ of the connection;
//! - WRs complete in order, signalled ones (and failed ones) with a completion queued for
//!   the requester's next `poll`.
//!
//! The two ends share a [`DirectLink`]: when either end goes away or fails, the other sees
//! it at its next step as the TCP path sees EOF (the oldest WR waiting on the peer fails
//! with `RetryExceeded`, the rest flush). Each connection has a `work` flag, set while it has
//! WRs not yet retired (or the peer closed): polls step only connections that have work, so
//! an idle poll costs a few loads.
//!
//! The usual post (one WRITE or WRITE_WITH_IMM of at most one SGE, the connection idle)
//! takes a lean way through the same checks: `direct_post` → `write_now` (each MR pinned
//! by one lookup that checks key, rights and range) → `retire_now`.

use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicU8, AtomicU64, Ordering};

use super::conn::{Conn, ConnState, Phase, SqEntry};
use super::cq::{CqShared, SrqShared};
use super::device::DevShared;
use super::frame::MAX_MSG;
use super::link::Link;
use super::mr::Pinned;
use crate::fabric::{Access, Completion, MAX_SGE, SendWr, WcOpcode, WcStatus, WrOpcode};

/// What both ends of one in-process connection share: [`READY`] once both ends are
/// connected (WRs may execute), `| CLOSED` once an end went away (dropped, or its QP went to
/// the error state). One word, so a post checks both with one load.
#[derive(Default)]
struct DirectLink {
    state: AtomicU8,
}

const READY: u8 = 1;
const CLOSED: u8 = 2;

/// One end's view of an in-process connection: what it needs of its peer (the responder
/// of its WRs) to execute them.
pub struct DirectEnd {
    link: Arc<DirectLink>,
    peer_dev: Arc<DevShared>,
    peer_cq: Arc<CqShared>,
    peer_srq: Option<Arc<SrqShared>>,
    peer_qpn: u32,
    /// Both `work` flags, this end's first: closing or becoming ready wakes both.
    work: [Arc<AtomicBool>; 2],
    /// Both ends' CQs, whose polls step the two connections.
    cqs: [Arc<CqShared>; 2],
}

impl DirectEnd {
    /// The two ends of a connection between `a` and `b` (`a`'s first).
    pub fn pair(a: &Conn, b: &Conn) -> (DirectEnd, DirectEnd) {
        let link = Arc::new(DirectLink::default());
        let end = |me: &Conn, peer: &Conn| DirectEnd {
            link: link.clone(),
            peer_dev: peer.dev.clone(),
            peer_cq: peer.cq.clone(),
            peer_srq: peer.srq.clone(),
            peer_qpn: peer.qp_num,
            work: [me.work.clone(), peer.work.clone()],
            cqs: [me.cq.clone(), peer.cq.clone()],
        };
        (end(a, b), end(b, a))
    }

    /// Both ends are connected: queued WRs run at the next step of either side.
    pub fn set_ready(&self) {
        self.link.state.fetch_or(READY, Ordering::Release);
        self.wake();
    }

    /// This end is gone: the peer fails at its next step.
    pub fn close(&self) {
        self.link.state.fetch_or(CLOSED, Ordering::Release);
        self.wake();
    }

    fn wake(&self) {
        for w in &self.work {
            w.store(true, Ordering::Release);
        }
        for cq in &self.cqs {
            cq.raise_work();
        }
    }
}

impl Drop for DirectEnd {
    fn drop(&mut self) {
        self.close();
    }
}

/// Why a WR failed: its status and the reason logged with the QP's error state.
struct Refused(WcStatus, String);

/// A [`Refused`], built out of the hot path (`why` runs only on failure).
#[cold]
#[inline(never)]
fn refused(status: WcStatus, why: impl FnOnce() -> String) -> Refused {
    Refused(status, why())
}

enum Exec {
    Done,
    /// Receiver not ready or its CQ full: retry at a later step.
    Wait,
}

/// The bytes a WR moves on this side: up to `MAX_SGE` pieces, pinned while they are used.
struct Pieces<'a> {
    at: [(u64, u64); MAX_SGE],
    n: usize,
    _pins: [Option<Pinned<'a>>; MAX_SGE],
}

impl<'a> Pieces<'a> {
    #[inline]
    fn new() -> Pieces<'a> {
        Pieces { at: [(0, 0); MAX_SGE], n: 0, _pins: [None, None] }
    }

    /// Adds `len` bytes at `addr` this QP owns (its inline slot).
    #[inline]
    fn add_own(&mut self, addr: u64, len: u64) {
        if len > 0 {
            self.at[self.n] = (addr, len);
            self.n += 1;
        }
    }

    /// Adds the WR's SGEs, each pinned in `dev`'s table for `need`; `false` if one is not
    /// registered so.
    #[inline]
    fn add_sges(&mut self, dev: &'a DevShared, wr: &SendWr, need: Access) -> bool {
        for s in &wr.sge[..wr.num_sge as usize] {
            if s.len == 0 {
                continue;
            }
            let Some(pin) = dev.mrs.pin_range(s.lkey, s.addr, s.len as u64, need) else { return false };
            self._pins[self.n] = Some(pin);
            self.at[self.n] = (s.addr, s.len as u64);
            self.n += 1;
        }
        true
    }

    /// Copies bytes `[from, to)` of the pieces, laid end to end, to `dst` (or from `dst`
    /// into them when `into` is set).
    ///
    /// # Safety
    /// Every piece and `[dst, dst + to - from)` must be valid for the copy (pinned
    /// registrations or this QP's inline slot); they may overlap.
    unsafe fn copy(&self, from: u64, to: u64, dst: *mut u8, into: bool) {
        let mut off = 0u64;
        for &(addr, len) in &self.at[..self.n] {
            let (lo, hi) = (from.max(off), to.min(off + len));
            if lo < hi {
                let p = (addr + (lo - off)) as *mut u8;
                // SAFETY: both ranges lie in memory the caller guarantees; `ptr::copy`
                // allows overlap (a loopback QP may move bytes within one region).
                unsafe {
                    let d = dst.add((lo - from) as usize);
                    if into {
                        std::ptr::copy(d, p, (hi - lo) as usize)
                    } else {
                        std::ptr::copy(p, d, (hi - lo) as usize)
                    }
                }
            }
            off += len;
        }
    }
}

/// Where a WRITE's payload comes from.
#[derive(Clone, Copy)]
enum Src {
    /// The WR's SGEs, checked now (a WR executed as it is posted).
    Sges,
    /// The WR's inline slot (copied at post time) at this address.
    Inline(u64),
    /// The inline SGEs were outside any registration at post time.
    BadLocal,
}

impl Conn {
    /// `post_send` in in-process mode: a connection with nothing queued executes the chain
    /// as it is, with no copy into the send queue; whatever must wait, fails, or cannot
    /// complete into a full CQ is queued (from that WR on) and goes the queued way.
    #[inline]
    pub(super) fn direct_post(&self, st: &mut ConnState, chain: &[SendWr]) -> crate::error::Result<()> {
        // The usual post (every protocol post): one WRITE or WRITE_WITH_IMM of at most one
        // SGE on an idle connection. Idle means `Ready` with nothing queued, so of
        // `check_chain`'s checks only the WR's own remain (`lean_len`); a WR that fails
        // them takes the general way below, which refuses it with the precise error.
        if let [wr] = chain
            && let Some(end) = self.idle_end(st)
            && let Some(len) = lean_len(wr, st.max_inline)
        {
            if self.write_now(end, wr, len) {
                if self.retire_now(st, wr, len) {
                    return Ok(());
                }
            } else {
                // It waits or fails: the queued way decides, with its checks and messages.
                self.enqueue(st, chain);
            }
            self.direct_progress(st);
            return Ok(());
        }
        self.direct_post_chain(st, chain)
    }

    /// [`Self::direct_post`] of any chain.
    #[inline(never)]
    fn direct_post_chain(&self, st: &mut ConnState, chain: &[SendWr]) -> crate::error::Result<()> {
        self.check_chain(st, chain)?;
        let mut k = 0;
        if self.idle_end(st).is_some() {
            while k < chain.len() && st.head == st.tail && self.run_now(st, &chain[k]) {
                k += 1;
            }
        }
        if k < chain.len() {
            self.enqueue(st, &chain[k..]);
        }
        if st.head != st.tail {
            self.direct_progress(st);
        }
        Ok(())
    }

    /// The peer's end when the connection is idle: nothing queued, the peer there and
    /// connected. (`Ready` also means nothing to flush: `recv_flush` is set only on the way
    /// to the error state.)
    #[inline(always)]
    fn idle_end<'a>(&self, st: &'a ConnState) -> Option<&'a DirectEnd> {
        match &st.link {
            Some(Link::Direct(e))
                if st.head == st.tail
                    && matches!(st.phase, Phase::Ready)
                    && e.link.state.load(Ordering::Acquire) == READY =>
            {
                debug_assert!(!st.recv_flush);
                Some(e)
            }
            _ => None,
        }
    }

    /// Executes `wr` of a chain being posted and completes it. `false`: it was not executed
    /// (it waits or fails: the queued way decides, with its checks and messages).
    fn run_now(&self, st: &mut ConnState, wr: &SendWr) -> bool {
        let Some(Link::Direct(end)) = &st.link else { return false };
        let done = matches!(self.run_wr(end, wr, Src::Sges, None), Ok(Exec::Done));
        if done {
            let _ = self.retire_now(st, wr, wr.bytes());
        }
        done
    }

    /// Completes `wr`, executed as it was posted: its completion (if signalled) goes to
    /// this side's CQ, or, with the CQ full, the WR is queued as executed and retires the
    /// queued way (then `false`).
    #[inline(always)]
    fn retire_now(&self, st: &mut ConnState, wr: &SendWr, len: u64) -> bool {
        if !wr.signaled {
            return true;
        }
        let c = Completion {
            wr_id: wr.wr_id,
            opcode: if wr.opcode == WrOpcode::Read { WcOpcode::RdmaRead } else { WcOpcode::RdmaWrite },
            byte_len: len as u32,
            qp_num: self.qp_num,
            ..Completion::default()
        };
        if !self.cq.lock().push(c) {
            let seq = st.tail;
            *st.entry_mut(seq) = SqEntry { wr: *wr, bad_local: false, read_done: true };
            let next = seq.wrapping_add(1);
            (st.tail, st.acked, st.sent, st.tx_done) = (next, next, next, next);
            return false;
        }
        true
    }

    /// The usual WR executed as it is posted: a WRITE or WRITE_WITH_IMM of at most one SGE
    /// (all the protocol posts) of `len` bytes, with [`Self::run_wr`]'s checks and
    /// placement but none of its general machinery. `false` (nothing happened): it must
    /// wait or it fails; the queued way runs it again and decides, with the precise status
    /// and message.
    #[inline(always)]
    fn write_now(&self, end: &DirectEnd, wr: &SendWr, len: u64) -> bool {
        let s = &wr.sge[0];
        // As verbs: a 0-byte WRITE checks neither memory nor rkey. The pins last until the
        // placement is done (end of this function).
        let _pins = if len > 0 {
            let Some(local) = self.dev.mrs.pin_range(s.lkey, s.addr, len, Access::empty()) else { return false };
            let Some(remote) = end.peer_dev.mrs.pin_range(wr.rkey, wr.remote_addr, len, Access::REMOTE_WRITE) else {
                return false;
            };
            Some((local, remote))
        } else {
            None
        };
        if wr.opcode == WrOpcode::Write {
            // SAFETY: both ranges are pinned registrations (or empty).
            unsafe { place_one(s.addr, wr.remote_addr, len) };
            return true;
        }
        let Some(srq) = end.peer_srq.as_ref() else { return false };
        // The CQ stays locked from the room check to the push: nothing else fills it between.
        let mut ring = end.peer_cq.lock();
        let Some(room) = ring.room() else { return false };
        if !srq.take() {
            return false;
        }
        // SAFETY: as above.
        unsafe { place_one(s.addr, wr.remote_addr, len) };
        room.push(imm_completion(end, wr, len));
        true
    }

    /// One step of an in-process connection: notice a closed peer, execute what is queued,
    /// retire what completed. Returns whether anything moved.
    pub(super) fn direct_progress(&self, st: &mut ConnState) -> bool {
        let mut moved = false;
        if matches!(st.phase, Phase::Ready)
            && let Some(Link::Direct(end)) = &st.link
        {
            let state = end.link.state.load(Ordering::Acquire);
            if state & CLOSED != 0 {
                self.fail_link(st, "the peer closed the connection");
                moved = true;
            } else if state & READY != 0 {
                moved |= self.execute(st);
            }
        }
        moved |= self.retire(st);
        let work = st.head != st.tail || st.recv_flush;
        // Stored only when it changes: the flag is read by both sides' polls, and a WR
        // that waits is stepped at every poll.
        if self.work.load(Ordering::Relaxed) != work {
            self.work.store(work, Ordering::Release);
        }
        if work {
            // Polls of this side's CQ and of the peer's step this connection again.
            self.cq.raise_work();
            if let Some(Link::Direct(end)) = &st.link {
                end.peer_cq.raise_work();
            }
        }
        moved
    }

    /// Executes queued WRs in order until one must wait or fails.
    fn execute(&self, st: &mut ConnState) -> bool {
        let mut moved = false;
        while st.acked != st.tail {
            let seq = st.acked;
            let ConnState { sq, inline, max_inline, link, direct_rnr, .. } = &mut *st;
            let Some(Link::Direct(end)) = link.as_ref() else { break };
            let i = (seq % sq.len() as u32) as usize;
            let e = &mut sq[i];
            let src = match (e.wr.inline, e.bad_local) {
                (false, _) => Src::Sges,
                (true, false) => Src::Inline(inline.as_ptr() as u64 + (i * *max_inline) as u64),
                (true, true) => Src::BadLocal,
            };
            match self.run_wr(end, &e.wr, src, Some((direct_rnr, seq))) {
                Ok(Exec::Done) => {
                    e.read_done = e.wr.opcode == WrOpcode::Read;
                    let next = seq.wrapping_add(1);
                    (st.acked, st.sent, st.tx_done) = (next, next, next);
                    moved = true;
                }
                Ok(Exec::Wait) => break,
                Err(Refused(status, why)) => {
                    self.fail(st, Some((seq, status)), &why);
                    return true;
                }
            }
        }
        moved
    }

    /// Executes one WR against the peer. `rnr`: where the queued way remembers which WR's
    /// receiver-not-ready wait was counted, and this WR's sequence number.
    fn run_wr(
        &self,
        end: &DirectEnd,
        wr: &SendWr,
        src: Src,
        rnr: Option<(&mut Option<u32>, u32)>,
    ) -> Result<Exec, Refused> {
        let seq = rnr.as_ref().map_or(0, |r| r.1);
        let len = wr.bytes();
        let peer_mrs = &end.peer_dev.mrs;
        if wr.opcode == WrOpcode::Read {
            let remote =
                if len > 0 { peer_mrs.pin_range(wr.rkey, wr.remote_addr, len, Access::REMOTE_READ) } else { None };
            if len > 0 && remote.is_none() {
                return Err(refused(WcStatus::RemoteAccessError, || format!("peer refused READ {seq}: RemoteAccess")));
            }
            let mut local = Pieces::new();
            if !local.add_sges(&self.dev, wr, Access::LOCAL_WRITE) {
                let why = "READ response: local SGE not registered with LOCAL_WRITE";
                return Err(refused(WcStatus::LocalError, || why.into()));
            }
            // SAFETY: the local SGEs and the remote range are pinned registrations.
            unsafe { local.copy(0, len, wr.remote_addr as *mut u8, true) };
            return Ok(Exec::Done);
        }
        let mut local = Pieces::new();
        match src {
            Src::Sges if !local.add_sges(&self.dev, wr, Access::empty()) => {
                let why = "local memory of a WR deregistered or out of bounds";
                return Err(refused(WcStatus::LocalError, || why.into()));
            }
            Src::Sges => {}
            Src::Inline(at) => local.add_own(at, len),
            Src::BadLocal => {
                return Err(refused(WcStatus::LocalError, || "inline SGE outside any registration".into()));
            }
        }
        // As verbs: a 0-byte WRITE checks no rkey.
        let remote =
            if len > 0 { peer_mrs.pin_range(wr.rkey, wr.remote_addr, len, Access::REMOTE_WRITE) } else { None };
        if len > 0 && remote.is_none() {
            return Err(refused(WcStatus::RemoteAccessError, || format!("peer refused request {seq}: RemoteAccess")));
        }
        if wr.opcode == WrOpcode::Write {
            // SAFETY: `local` and the remote range are pinned (or the inline slot).
            unsafe { place(&local, wr.remote_addr, len) };
            return Ok(Exec::Done);
        }
        let Some(srq) = end.peer_srq.as_ref() else {
            return Err(refused(WcStatus::RemoteOpError, || format!("peer refused request {seq}: InvalidRequest")));
        };
        // The CQ stays locked from the room check to the push: nothing else fills it between.
        let mut ring = end.peer_cq.lock();
        let Some(room) = ring.room() else { return Ok(Exec::Wait) };
        if !srq.take() {
            if let Some((counted, seq)) = rnr
                && *counted != Some(seq)
            {
                *counted = Some(seq);
                srq.rnr.fetch_add(1, Ordering::Relaxed);
            }
            return Ok(Exec::Wait);
        }
        // SAFETY: as above.
        unsafe { place(&local, wr.remote_addr, len) };
        room.push(imm_completion(end, wr, len));
        Ok(Exec::Done)
    }
}

/// The bytes of `wr` when [`Conn::write_now`] may run it: a WRITE or WRITE_WITH_IMM of at
/// most one SGE that `check_chain` accepts on its own (size, inline size); `None` otherwise.
#[inline(always)]
fn lean_len(wr: &SendWr, max_inline: usize) -> Option<u64> {
    let len = if wr.num_sge == 1 { wr.sge[0].len as u64 } else { 0 };
    let ok = wr.opcode != WrOpcode::Read
        && wr.num_sge <= 1
        && len <= MAX_MSG as u64
        && (!wr.inline || len as usize <= max_inline);
    ok.then_some(len)
}

/// The completion the peer's CQ gets for a WRITE_WITH_IMM of `len` bytes that consumed one
/// of its SRQ WQEs.
#[inline]
fn imm_completion(end: &DirectEnd, wr: &SendWr, len: u64) -> Completion {
    Completion {
        wr_id: 0,
        status: WcStatus::Success,
        opcode: WcOpcode::RecvRdmaWithImm,
        byte_len: len as u32,
        imm: wr.imm,
        qp_num: end.peer_qpn,
        timestamp_ns: 0,
    }
}

/// Places a WRITE's `len` bytes from `src` at `dst`: the final 8 bytes last, as one Release
/// store, when the WRITE has at least 8 bytes and ends 8-aligned.
///
/// # Safety
/// `src` and `[dst, dst + len)` must be valid for the copy (pinned registrations).
unsafe fn place(src: &Pieces<'_>, dst: u64, len: u64) {
    let tail = len >= 8 && (dst + len).is_multiple_of(8);
    if tail && src.n == 1 {
        // SAFETY: forwarded from the caller (one piece of `len` bytes).
        unsafe { place_one(src.at[0].0, dst, len) };
        return;
    }
    let body = if tail { len - 8 } else { len };
    let mut w = [0u8; 8];
    if tail {
        // Read before the body is written: a loopback WRITE may overlap its source.
        // SAFETY: `w` is 8 writable bytes; the source pieces are valid (caller).
        unsafe { src.copy(body, len, w.as_mut_ptr(), false) };
    }
    // SAFETY: forwarded from the caller.
    unsafe { src.copy(0, body, dst as *mut u8, false) };
    if tail {
        // SAFETY: `dst + body` is 8-aligned and lies in the pinned destination; the region
        // is memory handed to the NIC, read by others only atomically or after a completion.
        let word = unsafe { AtomicU64::from_ptr((dst + body) as *mut u64) };
        word.store(u64::from_ne_bytes(w), Ordering::Release);
    }
}

/// [`place`] from one contiguous source at `src` (the usual case): the final word read
/// first (a loopback WRITE may overlap its source), the body copied, the word stored last.
///
/// # Safety
/// `[src, src + len)` and `[dst, dst + len)` must be valid for the copy (pinned
/// registrations); they may overlap.
#[inline]
unsafe fn place_one(src: u64, dst: u64, len: u64) {
    if len < 8 || !(dst + len).is_multiple_of(8) {
        // SAFETY: forwarded from the caller; `ptr::copy` allows overlap.
        unsafe { std::ptr::copy(src as *const u8, dst as *mut u8, len as usize) };
        return;
    }
    // SAFETY: the source holds `len >= 8` valid bytes (caller); unaligned read of 8 of them.
    let w = unsafe { std::ptr::read_unaligned((src + len - 8) as *const u64) };
    if len > 8 {
        // SAFETY: forwarded from the caller; `ptr::copy` allows overlap.
        unsafe { std::ptr::copy(src as *const u8, dst as *mut u8, (len - 8) as usize) };
    }
    // SAFETY: `dst + len - 8` is 8-aligned and lies in the pinned destination; the region
    // is memory handed to the NIC, read by others only atomically or after a completion.
    let word = unsafe { AtomicU64::from_ptr((dst + len - 8) as *mut u64) };
    word.store(w, Ordering::Release);
}
