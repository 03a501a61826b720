//! What one QP does with the frames its link hands it (TCP): the responder's checks and
//! placement decisions for requests, the requester's handling of responses. The link moves
//! the bytes (`link.rs`); this file decides, on each header, where a payload goes, and
//! finishes a transfer when its last segment is in.
//!
//! Responder checks happen on the header, before any byte is placed: an unknown rkey, a
//! range outside the region or a missing right NAKs the request, and its payload is
//! dropped. A WRITE_WITH_IMM takes its SRQ WQE and reserves its completion's slot in the CQ
//! on the header; with no WQE (or no room) it is refused with RNR, its payload dropped, and
//! the requester sends it again later: the link is never held up by one QP's wait, and a
//! WQE taken is always accounted for (completed, given back, or completed `Flushed` in its
//! reserved slot when the QP fails).
//!
//! Placement order: for a WRITE of at least 8 bytes that ends 8-aligned, the final 8 bytes
//! are held back and stored last, as one `AtomicU64` store with Release ordering, after all
//! other bytes of the WRITE are in place (`placement.rs`).
//!
//! Acknowledgements (cumulative), only once the data is placed (the final word stored): a
//! request with ACK_REQ owes one its requester waits for, which leaves with the next frames
//! on the link, at the latest at the caller's next step on it (the poll that placed the
//! data holds it for the reply or CTS the caller posts next: `link.rs`); others owe theirs
//! until then (with the next frame, or the next ACK_REQ's).

use super::endpoint::Endpoint;
use super::fault::Fault;
use super::frame::{Frame, NakCode, SEGMENT};
use super::link::{Dest, Placed, Recv};
use super::placement::{final_word_last, store_final_word};
use super::qp_send::{Ctl, QpTx};
use super::requester::{Requester, segs_of};
use super::responder::{Responder, Verdict, imm_completion};
use crate::fabric::{Access, MAX_SGE, WcStatus};

/// The transfer whose payload is arriving (a WRITE, or a READ's response).
#[derive(Default)]
pub struct RxFrame {
    seq: u32,
    /// A WRITE (or WRITE_IMM); else a READ response.
    write: bool,
    imm: Option<u32>,
    /// Read and dropped; `false`: placed and acknowledged.
    dropped: bool,
    ack_req: bool,
    len: u64,
    /// Payload bytes in so far.
    got: u64,
    segs: [(u32, u64, u64); MAX_SGE],
    nseg: usize,
    need: Access,
    /// The final 8 bytes, held back for the Release store.
    tail: [u8; 8],
    tail_on: bool,
    /// A WQE was taken and a CQ slot reserved for the completion.
    wqe: bool,
    /// The region went away under the payload: NAK at the end.
    nak: Option<NakCode>,
}

impl RxFrame {
    fn new(seq: u32, write: bool, len: u64, need: Access) -> RxFrame {
        RxFrame { seq, write, len, need, ..RxFrame::default() }
    }

    /// Where the next segment goes.
    fn dest(&self) -> Dest {
        let body_end = if self.tail_on { self.len - 8 } else { self.len };
        Dest { segs: self.segs, nseg: self.nseg, need: self.need, off: self.got, body_end }
    }

    /// Length of the next segment.
    fn next_segment(&self) -> u64 {
        (self.len - self.got).min(SEGMENT as u64)
    }
}

/// The receive side of one QP.
#[derive(Default)]
pub struct QpRx {
    cur: Option<RxFrame>,
}

impl QpRx {
    /// A WRITE_WITH_IMM in progress holds an SRQ WQE and a CQ slot: the error state
    /// completes it `Flushed` in that slot.
    pub fn take_wqe(&mut self) -> bool {
        let taken = self.cur.as_ref().is_some_and(|c| c.wqe);
        self.cur = None;
        taken
    }

    /// Whether a transfer is half received (the peer going now loses data).
    pub fn busy(&self) -> bool {
        self.cur.is_some()
    }
}

/// What the receive side works with, lent by its connection.
pub struct RxEnv<'a> {
    pub ep: &'a Endpoint,
    pub req: &'a mut Requester,
    pub resp: &'a mut Responder,
    pub rx: &'a mut QpRx,
    pub tx: &'a mut QpTx,
}

/// A frame for this QP (the connection handled CONNECT and CLOSE): where its payload goes.
pub fn on_frame(env: &mut RxEnv<'_>, f: &Frame) -> Result<Recv, Fault> {
    match *f {
        Frame::Write { seq, addr, rkey, len, imm, ack_req, .. } => {
            on_write(env, seq, addr, rkey, len as u64, imm, ack_req)
        }
        Frame::ReadReq { seq, addr, rkey, len, .. } => {
            if env.resp.next_request(seq)? == Verdict::Execute {
                let len = len as u64;
                if len > 0 && env.ep.mrs.pin_range(rkey, addr, len, Access::REMOTE_READ).is_none() {
                    env.tx.push(Ctl::ReadRespErr(seq, NakCode::RemoteAccess))?;
                    env.resp.refuse();
                } else {
                    env.tx.read_response(seq, rkey, addr, len)?;
                }
            }
            Ok(Recv::Skip)
        }
        Frame::ReadResp { seq, result, .. } => {
            let wr = env.req.on_read_resp(seq, result)?;
            let mut c = RxFrame::new(seq, false, wr.bytes(), Access::LOCAL_WRITE);
            (c.segs, c.nseg) = (segs_of(&wr), wr.num_sge as usize);
            start(env, c)
        }
        Frame::Data { seq, len, .. } => {
            let Some(c) = env.rx.cur.as_mut() else {
                if env.resp.in_rnr() {
                    return Ok(Recv::Skip); // the rest of a request refused with RNR
                }
                return Err(Fault::qp(format!("DATA of {seq} with no transfer in progress")));
            };
            if c.seq != seq || len as u64 != c.next_segment() {
                let want = c.next_segment();
                return Err(Fault::qp(format!("DATA {seq} of {len} bytes, expected {} of {want}", c.seq)));
            }
            if !c.dropped && c.nak.is_none() {
                return Ok(Recv::Place(c.dest()));
            }
            c.got += len as u64;
            finish_if_done(env)?;
            Ok(Recv::Skip)
        }
        Frame::Ack { seq, .. } => {
            env.req.on_ack(seq)?;
            env.tx.acked();
            Ok(Recv::Skip)
        }
        Frame::Nak { seq, code, .. } => Err(env.req.on_nak(seq, code)),
        Frame::Rnr { seq, .. } => {
            env.req.on_rnr(seq)?;
            env.tx.rnr();
            Ok(Recv::Skip)
        }
        Frame::Hello { .. } | Frame::Connect { .. } | Frame::Close { .. } => Ok(Recv::Skip),
    }
}

fn on_write(
    env: &mut RxEnv<'_>,
    seq: u32,
    addr: u64,
    rkey: u32,
    len: u64,
    imm: Option<u32>,
    ack_req: bool,
) -> Result<Recv, Fault> {
    if env.rx.cur.is_some() {
        return Err(Fault::qp(format!("request {seq} before the payload of the one in progress")));
    }
    let mut c = RxFrame::new(seq, true, len, Access::REMOTE_WRITE);
    (c.imm, c.ack_req) = (imm, ack_req);
    match env.resp.next_request(seq)? {
        Verdict::Drop if env.resp.in_rnr() => return Ok(Recv::Skip),
        Verdict::Drop => c.dropped = true,
        Verdict::Execute => {
            // As verbs: a 0-byte WRITE checks no rkey.
            let refused = if len > 0 && env.ep.mrs.pin_range(rkey, addr, len, Access::REMOTE_WRITE).is_none() {
                Some(NakCode::RemoteAccess)
            } else if imm.is_some() && env.ep.srq.is_none() {
                Some(NakCode::InvalidRequest)
            } else {
                None
            };
            if let Some(code) = refused {
                env.tx.push(Ctl::Nak(seq, code))?;
                env.resp.refuse();
                c.dropped = true;
            } else if imm.is_some() && !take_wqe(env, seq) {
                env.tx.push(Ctl::Rnr(seq))?;
                env.resp.rnr(seq);
                return Ok(Recv::Skip);
            } else {
                c.wqe = imm.is_some();
                (c.segs[0], c.nseg) = ((rkey, addr, len), (len > 0) as usize);
                c.tail_on = final_word_last(addr, len);
            }
        }
    }
    start(env, c)
}

/// Takes an SRQ WQE and reserves the completion's CQ slot; `false` (nothing taken): the
/// receiver is not ready (an empty SRQ counts once per request in `rnr_events`).
fn take_wqe(env: &mut RxEnv<'_>, seq: u32) -> bool {
    let srq = env.ep.srq.as_ref().expect("checked: the QP has an SRQ");
    let mut ring = env.ep.cq.lock();
    if !ring.reserve() {
        return false;
    }
    if srq.take() {
        return true;
    }
    ring.unreserve();
    if env.resp.rnr_wait(seq) {
        srq.count_rnr();
    }
    false
}

/// A transfer starts: its first segment is placed, or (nothing to place) dropped.
fn start(env: &mut RxEnv<'_>, c: RxFrame) -> Result<Recv, Fault> {
    let place = !c.dropped && c.len > 0;
    let first = c.next_segment();
    env.rx.cur = Some(c);
    if place {
        return Ok(Recv::Place(env.rx.cur.as_ref().expect("set").dest()));
    }
    if let Some(c) = env.rx.cur.as_mut() {
        c.got += first;
    }
    finish_if_done(env)?;
    Ok(Recv::Skip)
}

/// A segment placed for [`Recv::Place`] is in.
pub fn on_segment(env: &mut RxEnv<'_>, p: Placed) -> Result<(), Fault> {
    let c = env.rx.cur.as_mut().expect("a segment belongs to a transfer");
    c.got += c.next_segment();
    if p.lo < p.hi {
        c.tail[p.lo..p.hi].copy_from_slice(&p.tail[p.lo..p.hi]);
    }
    if !p.ok {
        if !c.write {
            let why = "READ response: local SGE not registered with LOCAL_WRITE";
            return Err(Fault::wr(c.seq, WcStatus::LocalError, why.into()));
        }
        log::warn!("soft fabric: QP {}: region of rkey {:#x} went away under a WRITE", env.ep.qp_num, c.segs[0].0);
        c.nak = Some(NakCode::RemoteAccess);
    }
    finish_if_done(env)
}

fn finish_if_done(env: &mut RxEnv<'_>) -> Result<(), Fault> {
    match env.rx.cur.as_ref() {
        Some(c) if c.got == c.len => finish(env),
        _ => Ok(()),
    }
}

/// Completes a transfer: the held-back word, the receive completion, the acknowledgement.
fn finish(env: &mut RxEnv<'_>) -> Result<(), Fault> {
    let mut c = env.rx.cur.take().expect("transfer in progress");
    if !c.write {
        env.req.read_placed(c.seq);
        env.tx.acked();
        return Ok(());
    }
    if c.dropped {
        return Ok(());
    }
    if c.nak.is_none() && c.tail_on {
        let (key, addr, len) = c.segs[0];
        let word = addr + len - 8;
        match env.ep.mrs.pin_range(key, word, 8, Access::REMOTE_WRITE) {
            Some(_pin) => {
                // SAFETY: `word` is 8-aligned (checked when the frame was accepted) and lies
                // in a registration pinned for this store.
                unsafe { store_final_word(word, u64::from_ne_bytes(c.tail)) };
            }
            None => c.nak = Some(NakCode::RemoteAccess),
        }
    }
    if let Some(code) = c.nak {
        if c.wqe {
            env.ep.srq.as_ref().expect("WQE taken from the SRQ").give_back();
            env.ep.cq.lock().unreserve();
        }
        env.tx.push(Ctl::Nak(c.seq, code))?;
        env.resp.refuse();
        return Ok(());
    }
    if let Some(imm) = c.imm {
        env.ep.cq.lock().push_reserved(imm_completion(env.ep.qp_num, c.len, imm, WcStatus::Success));
    }
    env.tx.ack(c.seq, c.ack_req);
    Ok(())
}
