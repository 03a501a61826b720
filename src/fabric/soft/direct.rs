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
//! The two ends share a link (`transport.rs`): when either end goes away or fails, the
//! other sees it at its next step as the TCP path sees EOF (the oldest WR waiting on the
//! peer fails with `RetryExceeded`, the rest flush). Each connection has a `work` flag, set
//! while it has WRs not yet retired (or the peer closed): polls step only connections that
//! have work, so an idle poll costs a few loads.
//!
//! The usual post (one WRITE or WRITE_WITH_IMM of at most one SGE, the connection idle)
//! takes a lean way through the same checks: `Conn::post_inproc` → [`write_now`] (each MR
//! pinned by one lookup that checks key, rights and range) → `Conn::retire_now`.
//!
//! This file executes WRs against the peer's `Endpoint`: it reads the requester's queue
//! and reports a [`Fault`]; the connection (`conn_inproc.rs`) decides what runs when and applies
//! what it reports.

use super::fault::Fault;
use super::frame::MAX_MSG;
use super::mr::{MrTable, Pinned};
use super::placement::Target;
use super::requester::Requester;
use super::responder::{Responder, imm_completion};
use super::transport::DirectEnd;
use crate::fabric::{Access, MAX_SGE, SendWr, WcStatus, WrOpcode};

/// Why a WR failed: its status and the reason logged with the QP's error state.
struct Refused(WcStatus, String);

/// A [`Refused`], built out of the hot path (`why` runs only on failure).
#[cold]
#[inline(never)]
fn refused(status: WcStatus, why: impl FnOnce() -> String) -> Refused {
    Refused(status, why())
}

/// What became of a WR that did not fail.
enum Exec {
    Done,
    /// Receiver not ready or its CQ full: retry at a later step.
    Wait,
}

/// The bytes a WR moves on this side: up to `MAX_SGE` pieces, pinned while they are used.
#[derive(Default)]
struct Pieces<'a> {
    at: [(u64, u64); MAX_SGE],
    n: usize,
    _pins: [Option<Pinned<'a>>; MAX_SGE],
}

impl<'a> Pieces<'a> {
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
    fn add_sges(&mut self, mrs: &'a MrTable, wr: &SendWr, need: Access) -> bool {
        for s in &wr.sge[..wr.num_sge as usize] {
            if s.len == 0 {
                continue;
            }
            let Some(pin) = mrs.pin_range(s.lkey, s.addr, s.len as u64, need) else { return false };
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

/// The usual WR executed as it is posted: a WRITE or WRITE_WITH_IMM of at most one SGE
/// (all the protocol posts) of `len` bytes from this side's registrations `mrs`, with
/// [`run_wr`]'s checks and placement but none of its general machinery. `false` (nothing
/// happened): it must wait or it fails; the queued way runs it again and decides, with the
/// precise status and message.
#[inline(always)]
pub fn write_now(mrs: &MrTable, end: &DirectEnd, wr: &SendWr, len: u64) -> bool {
    let s = &wr.sge[0];
    let peer = end.peer();
    // As verbs: a 0-byte WRITE checks neither memory nor rkey. The pins last until the
    // placement is done (end of this function).
    let _pins = if len > 0 {
        let Some(local) = mrs.pin_range(s.lkey, s.addr, len, Access::empty()) else { return false };
        let Some(remote) = peer.mrs.pin_range(wr.rkey, wr.remote_addr, len, Access::REMOTE_WRITE) else {
            return false;
        };
        Some((local, remote))
    } else {
        None
    };
    if wr.opcode == WrOpcode::Write {
        // SAFETY: both ranges are pinned registrations (or empty).
        unsafe { Target::new(wr.remote_addr, len).place_from(s.addr) };
        return true;
    }
    let Some(srq) = peer.srq.as_ref() else { return false };
    // The CQ stays locked from the room check to the push: nothing else fills it between.
    let mut ring = peer.cq.lock();
    let Some(room) = ring.room() else { return false };
    if !srq.take() {
        return false;
    }
    // SAFETY: as above.
    unsafe { Target::new(wr.remote_addr, len).place_from(s.addr) };
    room.push(imm_completion(peer.qp_num, len, wr.imm, WcStatus::Success));
    true
}

/// Executes `wr` of a chain being posted (its SGEs checked now). `false`: it was not
/// executed (it waits or fails: the queued way decides, with its checks and messages).
pub fn run_posted(mrs: &MrTable, end: &DirectEnd, wr: &SendWr) -> bool {
    matches!(run_wr(mrs, end, wr, Src::Sges, None), Ok(Exec::Done))
}

/// Executes the requester's queued WRs in order until one must wait or fails. Returns
/// whether one was executed.
pub fn execute(req: &mut Requester, resp: &mut Responder, mrs: &MrTable, end: &DirectEnd) -> Result<bool, Fault> {
    let mut moved = false;
    while let Some(seq) = req.next_unexecuted() {
        let e = req.entry(seq);
        let src = match (e.wr.inline, e.bad_local) {
            (false, _) => Src::Sges,
            (true, false) => Src::Inline(req.inline_addr(seq)),
            (true, true) => Src::BadLocal,
        };
        match run_wr(mrs, end, &e.wr, src, Some((&mut *resp, seq))) {
            Ok(Exec::Done) => {
                req.executed(seq);
                moved = true;
            }
            Ok(Exec::Wait) => break,
            Err(Refused(status, why)) => return Err(Fault::wr(seq, status, why)),
        }
    }
    Ok(moved)
}

/// Executes one WR of this side (registrations `mrs`) against the peer. `rnr`: the
/// responder state that remembers which WR's receiver-not-ready wait was counted, and this
/// WR's sequence number (the queued way).
fn run_wr(
    mrs: &MrTable,
    end: &DirectEnd,
    wr: &SendWr,
    src: Src,
    rnr: Option<(&mut Responder, u32)>,
) -> Result<Exec, Refused> {
    let seq = rnr.as_ref().map_or(0, |r| r.1);
    let len = wr.bytes();
    let peer = end.peer();
    let peer_mrs = &peer.mrs;
    if wr.opcode == WrOpcode::Read {
        let remote = if len > 0 { peer_mrs.pin_range(wr.rkey, wr.remote_addr, len, Access::REMOTE_READ) } else { None };
        if len > 0 && remote.is_none() {
            return Err(refused(WcStatus::RemoteAccessError, || format!("peer refused READ {seq}: RemoteAccess")));
        }
        let mut local = Pieces::default();
        if !local.add_sges(mrs, wr, Access::LOCAL_WRITE) {
            let why = "READ response: local SGE not registered with LOCAL_WRITE";
            return Err(refused(WcStatus::LocalError, || why.into()));
        }
        // SAFETY: the local SGEs and the remote range are pinned registrations.
        unsafe { local.copy(0, len, wr.remote_addr as *mut u8, true) };
        return Ok(Exec::Done);
    }
    let mut local = Pieces::default();
    match src {
        Src::Sges if !local.add_sges(mrs, wr, Access::empty()) => {
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
    let remote = if len > 0 { peer_mrs.pin_range(wr.rkey, wr.remote_addr, len, Access::REMOTE_WRITE) } else { None };
    if len > 0 && remote.is_none() {
        return Err(refused(WcStatus::RemoteAccessError, || format!("peer refused request {seq}: RemoteAccess")));
    }
    if wr.opcode == WrOpcode::Write {
        // SAFETY: `local` and the remote range are pinned (or the inline slot).
        unsafe { place(&local, wr.remote_addr, len) };
        return Ok(Exec::Done);
    }
    let Some(srq) = peer.srq.as_ref() else {
        return Err(refused(WcStatus::RemoteOpError, || format!("peer refused request {seq}: InvalidRequest")));
    };
    // The CQ stays locked from the room check to the push: nothing else fills it between.
    let mut ring = peer.cq.lock();
    let Some(room) = ring.room() else { return Ok(Exec::Wait) };
    if !srq.take() {
        if let Some((resp, seq)) = rnr
            && resp.rnr_wait(seq)
        {
            srq.count_rnr();
        }
        return Ok(Exec::Wait);
    }
    // SAFETY: as above.
    unsafe { place(&local, wr.remote_addr, len) };
    room.push(imm_completion(peer.qp_num, len, wr.imm, WcStatus::Success));
    Ok(Exec::Done)
}

/// The bytes of `wr` when [`write_now`] may run it: a WRITE or WRITE_WITH_IMM of at
/// most one SGE that `check_chain` accepts on its own (size, inline size); `None` otherwise.
/// `caps`: [`lean_caps`] of the QP, so the size checks are one comparison.
#[inline(always)]
pub fn lean_len(wr: &SendWr, caps: &[u64; 2]) -> Option<u64> {
    let len = if wr.num_sge == 1 { wr.sge[0].len as u64 } else { 0 };
    let ok = wr.opcode != WrOpcode::Read && wr.num_sge <= 1 && len <= caps[wr.inline as usize];
    ok.then_some(len)
}

/// The most bytes [`lean_len`] lets through, indexed by the WR's `inline` flag: `MAX_MSG`
/// (a WR's limit), and for an inline WR also `max_inline`.
pub fn lean_caps(max_inline: usize) -> [u64; 2] {
    [MAX_MSG as u64, (max_inline as u64).min(MAX_MSG as u64)]
}

/// Places a WRITE's `len` bytes from the pieces `src` at `dst` (`placement.rs`).
///
/// # Safety
/// `src` and `[dst, dst + len)` must be valid for the copy (pinned registrations).
unsafe fn place(src: &Pieces<'_>, dst: u64, len: u64) {
    // SAFETY: the target is pinned (caller); `copy` writes exactly `to - from` bytes from
    // valid pieces, and allows overlap.
    unsafe { Target::new(dst, len).place(|from, to, at| src.copy(from, to, at, false)) }
}
