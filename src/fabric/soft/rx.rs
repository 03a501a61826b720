//! The receive half of a connection: headers are read in batches into a staging buffer;
//! a payload goes from the socket straight into the target region (`readv` with the region
//! first and the staging buffer after it, so the next headers come in the same call).
//!
//! Responder checks happen on the header, before any byte is placed: an unknown rkey, a
//! range outside the region or a missing right NAKs the request and its payload is read
//! into the staging buffer and dropped. Every placement pins the region (see `mr.rs`).
//!
//! Placement order: for a WRITE of at least 8 bytes that ends 8-aligned, the final 8 bytes
//! are held back and stored last, as one `AtomicU64` store with Release ordering, after all
//! other bytes of the WRITE are in place (`responder.rs`).
//!
//! The receive half works on what its connection lends it for one step ([`RxEnv`]): the
//! link, the requester (responses to its requests), the responder (requests from the peer)
//! and the send half (the responses it queues). What it cannot do itself it reports: a
//! [`Fault`] that moves the QP to the error state, or an RNR notice to send at once.

use std::time::{Duration, Instant};

use super::endpoint::Endpoint;
use super::fault::Fault;
use super::frame::{Frame, HDR_LEN, NakCode, decode};
use super::mr::MrTable;
use super::requester::Requester;
use super::responder::{Responder, final_word_last, store_final_word};
use super::transport::{IovBuf, Link};
use super::tx::{Ctl, Tx};
use crate::fabric::{Access, Completion, MAX_SGE, WcOpcode, WcStatus};

const STAGING: usize = 64 * 1024;
/// Bytes one progress step reads at most, so a busy stream cannot keep a caller forever.
const RX_BUDGET: u64 = 16 << 20;
/// How often an RNR-waiting responder tells the requester it is alive.
const RNR_NOTICE: Duration = Duration::from_millis(20);

#[derive(Clone, Copy, PartialEq, Eq, Debug)]
enum Step {
    /// WRITE_IMM waiting for an SRQ WQE (receiver not ready).
    WaitWqe,
    Payload,
    /// Payload complete; finishing needs CQ room (WRITE_IMM).
    Finish,
}

#[derive(Clone, Copy, Default)]
struct Seg {
    key: u32,
    addr: u64,
    len: u64,
}

/// The frame whose payload is being received.
struct RxFrame {
    seq: u32,
    /// `Write` (WRITE or WRITE_IMM), else a READ response.
    write: bool,
    imm: Option<u32>,
    /// Executed (placed, acked); false = read and dropped.
    execute: bool,
    len: u64,
    done: u64,
    step: Step,
    segs: [Seg; MAX_SGE],
    nseg: usize,
    need: Access,
    /// The final 8 bytes, held back for the Release store.
    tail: [u8; 8],
    tail_on: bool,
    tail_done: bool,
    wqe: bool,
    rnr_at: Option<Instant>,
    /// The region went away under the payload: NAK at the end.
    nak: Option<NakCode>,
}

/// What the receive half works with for one step, lent by its connection.
pub struct RxEnv<'a> {
    pub ep: &'a Endpoint,
    pub link: Option<&'a Link>,
    pub req: &'a mut Requester,
    pub resp: &'a mut Responder,
    pub tx: &'a mut Tx,
}

/// What one receive step did.
pub struct RxStep {
    /// Anything moved.
    pub moved: bool,
    /// An RNR notice was queued while a WRITE_WITH_IMM waits for a WQE: send it now (what
    /// that send moves does not count as the peer moving).
    pub send_now: bool,
}

/// The receive half of one connection (see the module documentation).
pub struct Rx {
    buf: Box<[u8]>,
    start: usize,
    end: usize,
    cur: Option<RxFrame>,
    stalled: bool,
}

enum PlaceFail {
    /// The region went away (dereg) or never allowed this: drop the rest.
    Region,
}

impl Rx {
    pub fn new() -> Rx {
        Rx { buf: vec![0; STAGING].into_boxed_slice(), start: 0, end: 0, cur: None, stalled: false }
    }

    /// A WRITE_IMM in progress consumed an SRQ WQE.
    pub fn wqe_taken(&self) -> bool {
        self.cur.as_ref().is_some_and(|c| c.wqe && c.step != Step::Finish)
    }

    pub fn reset(&mut self) {
        self.cur = None;
        self.start = 0;
        self.end = 0;
        self.stalled = false;
    }

    /// Waiting for an SRQ WQE or CQ room: something no socket event will announce.
    pub fn stalled(&self) -> bool {
        self.stalled
    }

    fn avail(&self) -> usize {
        self.end - self.start
    }
}

impl RxFrame {
    fn new(seq: u32, write: bool, imm: Option<u32>, len: u64, need: Access) -> RxFrame {
        RxFrame {
            seq,
            write,
            imm,
            execute: true,
            len,
            done: 0,
            step: if len == 0 { Step::Finish } else { Step::Payload },
            segs: [Seg::default(); MAX_SGE],
            nseg: 0,
            need,
            tail: [0; 8],
            tail_on: false,
            tail_done: false,
            wqe: false,
            rnr_at: None,
            nak: None,
        }
    }

    /// Adds the destinations of payload bytes `[from, to)`, pinning each region touched;
    /// the held-back final word goes to `tail`.
    fn dest_iovs<'a>(&mut self, mrs: &'a MrTable, from: u64, to: u64, buf: &mut IovBuf<'a>) -> Result<(), PlaceFail> {
        let body_end = if self.tail_on { self.len - 8 } else { self.len };
        let segs = self.segs[..self.nseg].iter().map(|s| (s.key, s.addr, s.len));
        if !buf.push_segments(mrs, segs, from, to.min(body_end), self.need) {
            return Err(PlaceFail::Region);
        }
        if self.tail_on && to > body_end {
            let (lo, hi) = (from.max(body_end) - body_end, to - body_end);
            // The staging copy and readv write the held-back bytes here, not into the region.
            buf.push(self.tail[lo as usize..].as_mut_ptr(), (hi - lo) as usize);
        }
        Ok(())
    }
}

impl Rx {
    /// Reads and executes what arrived.
    pub fn pump(&mut self, env: &mut RxEnv<'_>) -> Result<RxStep, Fault> {
        let mut step = RxStep { moved: false, send_now: false };
        let mut budget = RX_BUDGET;
        self.stalled = false;
        loop {
            if let Some(s) = self.cur.as_ref().map(|c| c.step) {
                let progressed = match s {
                    Step::WaitWqe => self.take_wqe(env, &mut step.send_now),
                    Step::Payload => match self.payload(env, &mut budget)? {
                        Some(p) => p,
                        None => return Ok(step),
                    },
                    Step::Finish => self.finish_frame(env),
                };
                if !progressed {
                    return Ok(step);
                }
                step.moved = true;
                continue;
            }
            if budget == 0 {
                return Ok(step);
            }
            if self.avail() >= HDR_LEN {
                if env.tx.ctl_room() < 2 {
                    // Responses wait for the socket: read on once they are out.
                    return Ok(step);
                }
                let at = self.start;
                let hdr: [u8; HDR_LEN] = self.buf[at..at + HDR_LEN].try_into().expect("HDR_LEN bytes");
                self.start += HDR_LEN;
                match decode(&hdr) {
                    Ok(f) => self.on_header(env, f)?,
                    Err(e) => return Err(Fault::qp(format!("malformed frame from the peer: {e}"))),
                }
                step.moved = true;
                continue;
            }
            match self.read_staging(env.link)? {
                Some(n) => {
                    budget = budget.saturating_sub(n as u64);
                    step.moved = true;
                }
                None => return Ok(step),
            }
        }
    }

    /// Reads more bytes into the staging buffer; `None` when nothing came (or no link).
    fn read_staging(&mut self, link: Option<&Link>) -> Result<Option<usize>, Fault> {
        if self.start == self.end {
            self.start = 0;
            self.end = 0;
        } else if self.buf.len() - self.end < HDR_LEN {
            self.buf.copy_within(self.start..self.end, 0);
            self.end -= self.start;
            self.start = 0;
        }
        let free = &mut self.buf[self.end..];
        let iov = [libc::iovec { iov_base: free.as_mut_ptr().cast(), iov_len: free.len() }];
        let Some(link) = link else { return Ok(None) };
        let n = after_read(link.readv(&iov))?;
        if let Some(n) = n {
            self.end += n;
        }
        Ok(n)
    }

    fn take_wqe(&mut self, env: &mut RxEnv<'_>, send_now: &mut bool) -> bool {
        let srq = env.ep.srq.as_ref().expect("WaitWqe only with an SRQ");
        let cur = self.cur.as_mut().expect("frame in progress");
        if srq.take() {
            cur.wqe = true;
            cur.step = if cur.len == 0 { Step::Finish } else { Step::Payload };
            return true;
        }
        let now = Instant::now();
        let notice = match cur.rnr_at {
            None => {
                srq.count_rnr();
                true
            }
            Some(t) => now.duration_since(t) >= RNR_NOTICE,
        };
        if notice && env.tx.ctl_room() >= 2 {
            cur.rnr_at = Some(now);
            env.tx.push_ctl(Ctl::Rnr(cur.seq));
            *send_now = true;
        }
        self.stalled = true;
        false
    }

    /// Moves payload bytes: from the staging buffer first, else straight from the socket.
    /// `None`: nothing more can move now.
    fn payload(&mut self, env: &mut RxEnv<'_>, budget: &mut u64) -> Result<Option<bool>, Fault> {
        let avail = self.avail();
        let Rx { buf: staging, start, end, cur, .. } = self;
        let cur = cur.as_mut().expect("frame in progress");
        let remaining = cur.len - cur.done;
        let mut buf = IovBuf::new();
        let (from, to) =
            if avail > 0 { (cur.done, cur.done + remaining.min(avail as u64)) } else { (cur.done, cur.len) };
        let placed =
            if cur.nseg == 0 || cur.nak.is_some() { Ok(()) } else { cur.dest_iovs(&env.ep.mrs, from, to, &mut buf) };
        if placed.is_err() {
            drop(buf);
            return lost_region(cur, env.ep.qp_num).map(Some);
        }
        if avail > 0 {
            // Scatter the staged bytes into the iovecs (none when dropping them).
            let mut src = *start;
            for v in buf.iovs() {
                // SAFETY: each iovec is a pinned, bounds-checked range of a registration
                // (or this frame's tail buffer); the source lies in the staging buffer.
                unsafe { std::ptr::copy_nonoverlapping(staging.as_ptr().add(src), v.iov_base as *mut u8, v.iov_len) };
                src += v.iov_len;
            }
            let moved = (to - from) as usize;
            *start += moved;
            cur.done += moved as u64;
            *budget = budget.saturating_sub(moved as u64);
        } else {
            if buf.iovs().is_empty() {
                // Dropped payload: read it into the staging buffer and skip it there.
                drop(buf);
                return Ok(self.read_staging(env.link)?.map(|_| true));
            }
            let dest = buf.bytes();
            if *start == *end {
                *start = 0;
                *end = 0;
            }
            let free = &mut staging[*end..];
            if !free.is_empty() {
                buf.push(free.as_mut_ptr(), free.len());
            }
            let Some(link) = env.link else { return Ok(None) };
            let r = link.readv(buf.iovs());
            drop(buf);
            let Some(got) = after_read(r)? else { return Ok(None) };
            let into_dest = got.min(dest);
            cur.done += into_dest as u64;
            *end += got - into_dest;
            *budget = budget.saturating_sub(got as u64);
        }
        if cur.done == cur.len {
            cur.step = Step::Finish;
        }
        Ok(Some(true))
    }

    fn on_header(&mut self, env: &mut RxEnv<'_>, f: Frame) -> Result<(), Fault> {
        let qp_num = env.ep.qp_num;
        if f.dst_qpn() != qp_num {
            return Err(Fault::qp(format!("frame for QP {} arrived on QP {qp_num}", f.dst_qpn())));
        }
        if let Frame::Write { seq, .. } | Frame::ReadReq { seq, .. } = f {
            env.resp.next_request(seq)?;
        }
        match f {
            Frame::Write { seq, addr, rkey, len, imm, .. } => {
                let len = len as u64;
                let mut frame = RxFrame::new(seq, true, imm, len, Access::REMOTE_WRITE);
                frame.execute = !env.resp.discarding();
                if frame.execute {
                    // As verbs: a 0-byte WRITE checks no rkey.
                    let refused = if len > 0 && env.ep.mrs.pin_range(rkey, addr, len, Access::REMOTE_WRITE).is_none() {
                        Some(NakCode::RemoteAccess)
                    } else if imm.is_some() && env.ep.srq.is_none() {
                        Some(NakCode::InvalidRequest)
                    } else {
                        None
                    };
                    if let Some(code) = refused {
                        env.tx.push_ctl(Ctl::Nak(seq, code));
                        env.resp.refuse();
                        frame.execute = false;
                    } else {
                        frame.segs[0] = Seg { key: rkey, addr, len };
                        frame.nseg = (len > 0) as usize;
                        frame.tail_on = final_word_last(addr, len);
                        if imm.is_some() {
                            frame.step = Step::WaitWqe;
                        }
                    }
                }
                self.cur = Some(frame);
            }
            Frame::ReadReq { seq, addr, rkey, len, .. } => {
                if env.resp.discarding() {
                    return Ok(());
                }
                let len = len as u64;
                if len > 0 && env.ep.mrs.pin_range(rkey, addr, len, Access::REMOTE_READ).is_none() {
                    env.tx.push_ctl(Ctl::ReadRespErr(seq, NakCode::RemoteAccess));
                    env.resp.refuse();
                } else {
                    env.tx.push_ctl(Ctl::ReadResp { seq, rkey, addr, len });
                }
            }
            Frame::ReadResp { seq, result, .. } => {
                let wr = env.req.on_read_resp(seq, result)?;
                let mut frame = RxFrame::new(seq, false, None, wr.bytes(), Access::LOCAL_WRITE);
                frame.nseg = wr.num_sge as usize;
                for (d, s) in frame.segs.iter_mut().zip(&wr.sge[..wr.num_sge as usize]) {
                    *d = Seg { key: s.lkey, addr: s.addr, len: s.len as u64 };
                }
                self.cur = Some(frame);
            }
            Frame::Ack { seq, .. } => env.req.on_ack(seq)?,
            Frame::Nak { seq, code, .. } => return Err(env.req.on_nak(seq, code)),
            Frame::Rnr { seq, .. } => env.req.on_rnr(seq)?,
            Frame::Hello { .. } => return Err(Fault::qp("HELLO on an established connection".into())),
        }
        Ok(())
    }

    /// Completes the frame: the held-back word, the receive completion, the ACK.
    /// `false`: the CQ is full, try again later.
    fn finish_frame(&mut self, env: &mut RxEnv<'_>) -> bool {
        let cur = self.cur.as_mut().expect("frame in progress");
        if !cur.write {
            env.req.read_placed(cur.seq);
            self.cur = None;
            return true;
        }
        if !cur.execute {
            self.cur = None;
            return true;
        }
        let seq = cur.seq;
        if cur.nak.is_none() && cur.tail_on && !cur.tail_done {
            let s = cur.segs[0];
            let word = s.addr + s.len - 8;
            match env.ep.mrs.pin_range(s.key, word, 8, Access::REMOTE_WRITE) {
                Some(_pin) => {
                    // SAFETY: `word` is 8-aligned (checked when the frame was accepted) and
                    // lies in a registration pinned for this store.
                    unsafe { store_final_word(word, u64::from_ne_bytes(cur.tail)) };
                    cur.tail_done = true;
                }
                None => cur.nak = Some(NakCode::RemoteAccess),
            }
        }
        if let Some(code) = cur.nak {
            if cur.wqe {
                env.ep.srq.as_ref().expect("WQE taken from the SRQ").give_back();
            }
            self.cur = None;
            env.tx.push_ctl(Ctl::Nak(seq, code));
            env.resp.refuse();
            return true;
        }
        if let Some(imm) = cur.imm {
            let c = Completion {
                wr_id: 0,
                status: WcStatus::Success,
                opcode: WcOpcode::RecvRdmaWithImm,
                byte_len: cur.len as u32,
                imm,
                qp_num: env.ep.qp_num,
                timestamp_ns: 0,
            };
            if !env.ep.cq.lock().push(c) {
                self.stalled = true;
                return false;
            }
        }
        self.cur = None;
        env.tx.push_ack(seq);
        true
    }
}

/// A read's result: EOF and errors mean the peer is lost; `None`: nothing yet.
fn after_read(r: std::io::Result<usize>) -> Result<Option<usize>, Fault> {
    match r {
        Ok(0) => Err(Fault::PeerLost("the peer closed the connection".into())),
        Ok(n) => Ok(Some(n)),
        Err(e) if e.kind() == std::io::ErrorKind::WouldBlock => Ok(None),
        Err(e) if e.kind() == std::io::ErrorKind::Interrupted => Ok(None),
        Err(e) => Err(Fault::PeerLost(format!("receive failed: {e}"))),
    }
}

/// The region under a payload went away (deregistered) or a READ's local SGE is bad.
/// A WRITE reads on and is refused at its end; a READ fails the QP.
fn lost_region(cur: &mut RxFrame, qp_num: u32) -> Result<bool, Fault> {
    if cur.write {
        log::warn!("soft fabric: QP {qp_num}: region of rkey {:#x} went away under a WRITE", cur.segs[0].key);
        cur.nak = Some(NakCode::RemoteAccess);
        cur.nseg = 0;
        Ok(true)
    } else {
        let why = "READ response: local SGE not registered with LOCAL_WRITE";
        Err(Fault::wr(cur.seq, WcStatus::LocalError, why.into()))
    }
}
