//! What one QP sends on its link (TCP), a turn at a time (`link.rs` takes the turns): its
//! CONNECT, its responses (NAK, RNR, READ refusals, the cumulative ACK), its CLOSE, and at
//! most one payload segment: the next of a transfer under way, else the first of a READ
//! response or of the next request. Responses go before requests.
//!
//! Requests after an RNR wait: the requester goes back to the refused one and sends again
//! from there after a delay that doubles (from [`RNR_FIRST`] to [`RNR_MAX`]) while the
//! receiver stays not ready, and starts again at [`RNR_FIRST`] after an acknowledgement.
//!
//! Every response this side can owe is bounded by what the peer may have outstanding, so
//! the queues have fixed bounds and a peer that goes beyond them breaks the protocol (the
//! QP fails) instead of growing them: one NAK (after it every request is dropped), one RNR
//! per request sent again, one READ refusal or response per READ (at most
//! [`MAX_RD_ATOMIC`] outstanding), one cumulative ACK.

use std::collections::VecDeque;
use std::sync::Arc;
use std::time::{Duration, Instant};

use super::fault::Fault;
use super::frame::{Frame, NakCode, SEGMENT, encode};
use super::hook::{self, Held, Hook};
use super::link::{Filler, Src, Station};
use super::requester::{MAX_RD_ATOMIC, Requester, segs_of};
use crate::fabric::{Access, MAX_SGE, WcStatus, WrOpcode};

/// The first delay before requests refused with RNR go again, and the longest.
pub const RNR_FIRST: Duration = Duration::from_micros(100);
pub const RNR_MAX: Duration = Duration::from_millis(10);
/// Responses other than READ responses and the ACK waiting to go out, at most.
const CTL_CAP: usize = MAX_RD_ATOMIC + 4;

/// A response waiting to go out.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Ctl {
    Nak(u32, NakCode),
    Rnr(u32),
    ReadRespErr(u32, NakCode),
}

/// A payload being sent a segment at a time.
#[derive(Clone, Copy)]
enum Out {
    Request { seq: u32, off: u64 },
    ReadResp { seq: u32, rkey: u32, addr: u64, len: u64, off: u64 },
}

/// The send side of one QP.
#[derive(Default)]
pub struct QpTx {
    /// In the link's ready list, owed-ACK list, timer list.
    pub listed: bool,
    pub owe_listed: bool,
    pub timer_listed: bool,
    connect: Option<Frame>,
    close: Option<Frame>,
    ctl: VecDeque<Ctl>,
    /// The cumulative ACK to send, and whether the requester waits for it (ACK_REQ: it goes
    /// with the next frames on the link, at the latest at the caller's next step on it or
    /// the helper's next sweep: `link.rs`).
    ack: Option<u32>,
    ack_urgent: bool,
    reads: VecDeque<(u32, u32, u64, u64)>,
    cur: Option<Out>,
    /// Requests wait until then (RNR).
    pub rnr_until: Option<Instant>,
    /// RNRs in a row: the next RNR waits RNR_FIRST doubled this many times (at most
    /// RNR_MAX).
    rnrs: u32,
    /// The link must drop this QP's requests not begun (RNR).
    pub purge_requests: bool,
    /// A fault hook armed, not fired yet (`hook.rs`).
    pub hook: Hook,
    /// Requests a `Hold` hook kept, to go after the error state (`hook.rs`).
    pub released: Vec<Held>,
}

/// The bits of a requester generation a note keeps.
pub const GEN_MASK: u32 = 0x1FFF_FFFF;

/// A note for [`Station::sent`] and `source_lost`: a segment of request `seq` (of
/// generation `round`), its `last`, or of the response to READ `seq` (`read`).
pub fn note(seq: u32, round: u32, last: bool, read: bool) -> u64 {
    1 << 63 | (last as u64) << 62 | (read as u64) << 61 | ((round & GEN_MASK) as u64) << 32 | seq as u64
}

/// A note's request, generation, last-segment and READ-response bits.
pub fn of_note(note: u64) -> (u32, u32, bool, bool) {
    (note as u32, (note >> 32) as u32 & GEN_MASK, note >> 62 & 1 == 1, note >> 61 & 1 == 1)
}

impl QpTx {
    /// The QP's CONNECT, first.
    pub fn connect(&mut self, f: Frame) {
        self.connect = Some(f);
    }

    /// The error state or a close: nothing goes any more but `close` (if the peer is to
    /// hear of it) and the requests a hook released.
    pub fn reset(&mut self, close: Option<Frame>) {
        let (listed, owe_listed, timer_listed) = (self.listed, self.owe_listed, self.timer_listed);
        let released = std::mem::take(&mut self.released);
        *self = QpTx { listed, owe_listed, timer_listed, close, released, ..QpTx::default() };
    }

    /// An orderly close: the acknowledgement owed still goes, then `close`, and nothing
    /// else. RC acknowledges a request once it executed; a peer must not take a WRITE that
    /// landed for lost because the QP went away before its ACK left (a NIC sends it on
    /// arrival, long before the application can close).
    pub fn close_after_ack(&mut self, close: Option<Frame>) {
        let ack = self.ack.take();
        self.reset(close);
        self.ack = ack;
    }

    /// The link went down: no list holds this QP any more.
    pub fn unlisted(&mut self) {
        (self.listed, self.owe_listed, self.timer_listed) = (false, false, false);
        self.cur = None;
    }

    /// Queues a response; a peer that provokes more than the bound breaks the protocol.
    pub fn push(&mut self, c: Ctl) -> Result<(), Fault> {
        if self.ctl.len() == CTL_CAP {
            return Err(Fault::qp(format!("the peer provoked more than {CTL_CAP} responses without reading them")));
        }
        self.ctl.push_back(c);
        Ok(())
    }

    /// Queues the response to READ `seq`.
    pub fn read_response(&mut self, seq: u32, rkey: u32, addr: u64, len: u64) -> Result<(), Fault> {
        let inflight = self.reads.len() + matches!(self.cur, Some(Out::ReadResp { .. })) as usize;
        if inflight == MAX_RD_ATOMIC {
            return Err(Fault::qp(format!("the peer has more than {MAX_RD_ATOMIC} READs outstanding")));
        }
        self.reads.push_back((seq, rkey, addr, len));
        Ok(())
    }

    /// Request `seq` was executed: acknowledge it (cumulatively); `urgent`: the requester
    /// waits for it (ACK_REQ).
    pub fn ack(&mut self, seq: u32, urgent: bool) {
        self.ack = Some(seq);
        self.ack_urgent |= urgent;
    }

    /// The peer acknowledged something: a later RNR waits the shortest delay again.
    pub fn acked(&mut self) {
        self.rnrs = 0;
    }

    /// The peer refused a request with RNR: requests wait, then go again from it.
    pub fn rnr(&mut self) {
        self.rnr_until = Some(Instant::now() + (RNR_FIRST * (1 << self.rnrs.min(16))).min(RNR_MAX));
        self.rnrs = self.rnrs.saturating_add(1);
        self.purge_requests = true;
        if matches!(self.cur, Some(Out::Request { .. })) {
            self.cur = None;
        }
    }

    /// The RNR delay is over.
    pub fn rnr_over(&mut self, now: Instant) -> bool {
        match self.rnr_until {
            Some(t) if t <= now => {
                self.rnr_until = None;
                true
            }
            _ => false,
        }
    }

    /// Something must go now (`ready`: the QP is connected, requests may go).
    pub fn wants(&self, req: &Requester, ready: bool) -> bool {
        self.connect.is_some()
            || self.close.is_some()
            || !self.ctl.is_empty()
            || ready && (self.cur.is_some() || !self.reads.is_empty() || self.request_due(req))
            || !ready && !self.released.is_empty()
    }

    /// An acknowledgement waits for other frames (see `link.rs` for how long).
    pub fn owes(&self) -> bool {
        self.ack.is_some()
    }

    /// The acknowledgement owed is one the requester waits for.
    pub fn owes_urgent(&self) -> bool {
        self.ack_urgent
    }

    fn request_due(&self, req: &Requester) -> bool {
        self.rnr_until.is_none()
            && self.hook != Hook::Hold
            && req.next_unsent().is_some_and(|seq| req.entry(seq).wr.opcode != WrOpcode::Read || !req.reads_full())
    }

    /// Pushes the owed acknowledgement only.
    pub fn fill_ack<S: Station>(&mut self, me: &Arc<S>, dst_qpn: u32, out: &mut Filler<'_, S>) {
        if let Some(seq) = self.ack.take() {
            self.ack_urgent = false;
            out.push(me, encode(&Frame::Ack { dst_qpn, seq }), Src::None, 0, 0, false);
        }
    }

    /// Pushes this QP's frames for one turn (see the module documentation); `ready`: the
    /// QP is connected. Returns whether more could go now.
    pub fn fill<S: Station>(
        &mut self,
        me: &Arc<S>,
        req: &mut Requester,
        dst_qpn: u32,
        ready: bool,
        out: &mut Filler<'_, S>,
    ) -> Result<bool, Fault> {
        let hdr = |f: Frame| encode(&f);
        if let Some(f) = self.connect.take() {
            out.push(me, hdr(f), Src::None, 0, 0, false);
        }
        while let Some(c) = self.ctl.pop_front() {
            let f = match c {
                Ctl::Nak(seq, code) => Frame::Nak { dst_qpn, seq, code },
                Ctl::Rnr(seq) => Frame::Rnr { dst_qpn, seq },
                Ctl::ReadRespErr(seq, code) => Frame::ReadResp { dst_qpn, seq, result: Err(code) },
            };
            out.push(me, hdr(f), Src::None, 0, 0, false);
        }
        self.fill_ack(me, dst_qpn, out);
        if let Some(f) = self.close.take() {
            out.push(me, hdr(f), Src::None, 0, 0, false);
            return Ok(self.release(me, out));
        }
        if !ready {
            return Ok(self.release(me, out));
        }
        if !out.room() {
            return Ok(self.cur.is_some() || !self.reads.is_empty() || self.request_due(req));
        }
        if let Some(o) = self.cur {
            self.next_segment(o, me, req, dst_qpn, out);
        } else if let Some((seq, rkey, addr, len)) = self.reads.pop_front() {
            let seg = len.min(SEGMENT as u64);
            let src = Src::Mem { segs: one(rkey, addr, len), nseg: 1, base: 0, need: Access::REMOTE_READ };
            let n = note(seq, 0, seg == len, true);
            out.push(me, hdr(Frame::ReadResp { dst_qpn, seq, result: Ok(len as u32) }), src, seg, n, false);
            if seg < len {
                self.cur = Some(Out::ReadResp { seq, rkey, addr, len, off: seg });
            }
        } else if self.request_due(req) {
            let seq = req.next_unsent().expect("due");
            self.start_request(seq, me, req, dst_qpn, out)?;
        }
        Ok(self.cur.is_some() || !self.reads.is_empty() || self.request_due(req))
    }

    /// Queues the requests a hook held, if any (the QP is in the error state). `false`.
    fn release<S: Station>(&mut self, me: &Arc<S>, out: &mut Filler<'_, S>) -> bool {
        if !self.released.is_empty() {
            hook::release(me, std::mem::take(&mut self.released), out);
        }
        false
    }

    fn start_request<S: Station>(
        &mut self,
        seq: u32,
        me: &Arc<S>,
        req: &mut Requester,
        dst_qpn: u32,
        out: &mut Filler<'_, S>,
    ) -> Result<(), Fault> {
        let e = req.entry(seq);
        if e.bad_local {
            return Err(Fault::wr(seq, WcStatus::LocalError, "inline SGE outside any registration".into()));
        }
        if self.hook != Hook::None {
            hook::on_start(&mut self.hook, req, seq);
        }
        let e = req.entry(seq);
        let (opcode, len, inline) = (e.wr.opcode, e.wr.bytes(), e.wr.inline);
        let segs = segs_of(&e.wr);
        if opcode == WrOpcode::Read {
            req.start_read(seq);
        }
        let h = encode(&req.header(seq, dst_qpn));
        let seg = len.min(SEGMENT as u64);
        let n = note(seq, req.round(), seg == len, false);
        req.mark_sent(seq);
        if opcode == WrOpcode::Read || len == 0 {
            out.push(me, h, Src::None, 0, n, true);
        } else if inline {
            out.push_bytes(me, h, req.inline_of(seq), n, true);
        } else {
            out.push(me, h, Src::Mem { segs, nseg: MAX_SGE, base: 0, need: Access::empty() }, seg, n, true);
            if seg < len {
                self.cur = Some(Out::Request { seq, off: seg });
            }
        }
        Ok(())
    }

    fn next_segment<S: Station>(
        &mut self,
        o: Out,
        me: &Arc<S>,
        req: &Requester,
        dst_qpn: u32,
        out: &mut Filler<'_, S>,
    ) {
        let (seq, len, off, src, read) = match o {
            Out::Request { seq, off } => {
                let len = req.entry(seq).wr.bytes();
                (
                    seq,
                    len,
                    off,
                    Src::Mem { segs: segs_of(&req.entry(seq).wr), nseg: MAX_SGE, base: off, need: Access::empty() },
                    false,
                )
            }
            Out::ReadResp { seq, rkey, addr, len, off } => (
                seq,
                len,
                off,
                Src::Mem { segs: one(rkey, addr, len), nseg: 1, base: off, need: Access::REMOTE_READ },
                true,
            ),
        };
        let seg = (len - off).min(SEGMENT as u64);
        let last = off + seg == len;
        let f = Frame::Data { dst_qpn, seq, len: seg as u32 };
        out.push(me, encode(&f), src, seg, note(seq, req.round(), last, read), !read);
        self.cur = match o {
            _ if last => None,
            Out::Request { seq, .. } => Some(Out::Request { seq, off: off + seg }),
            Out::ReadResp { seq, rkey, addr, len, .. } => Some(Out::ReadResp { seq, rkey, addr, len, off: off + seg }),
        };
    }
}

fn one(key: u32, addr: u64, len: u64) -> [(u32, u64, u64); MAX_SGE] {
    let mut s = [(0, 0, 0); MAX_SGE];
    s[0] = (key, addr, len);
    s
}
