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
//! other bytes of the WRITE are in place.

use std::sync::atomic::{AtomicU64, Ordering};
use std::time::{Duration, Instant};

use super::conn::{Conn, ConnState, MAX_RD_ATOMIC, seq_lt};
use super::frame::{Frame, HDR_LEN, NakCode, decode};
use super::link::IovBuf;
use super::mr::MrTable;
use super::tx::Ctl;
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

impl Conn {
    /// Reads and executes what arrived. Returns whether anything moved.
    pub(super) fn pump_rx(&self, st: &mut ConnState) -> bool {
        let mut moved = false;
        let mut budget = RX_BUDGET;
        st.rx.stalled = false;
        loop {
            if st.is_error() {
                return moved;
            }
            if let Some(step) = st.rx.cur.as_ref().map(|c| c.step) {
                let progressed = match step {
                    Step::WaitWqe => self.take_wqe(st),
                    Step::Payload => match self.rx_payload(st, &mut budget) {
                        Some(p) => p,
                        None => return moved,
                    },
                    Step::Finish => self.finish_frame(st),
                };
                if !progressed {
                    return moved;
                }
                moved = true;
                continue;
            }
            if budget == 0 {
                return moved;
            }
            if st.rx.avail() >= HDR_LEN {
                if st.tx.ctl_room() < 2 {
                    // Responses wait for the socket: read on once they are out.
                    return moved;
                }
                let at = st.rx.start;
                let hdr: [u8; HDR_LEN] = st.rx.buf[at..at + HDR_LEN].try_into().expect("HDR_LEN bytes");
                st.rx.start += HDR_LEN;
                match decode(&hdr) {
                    Ok(f) => self.on_header(st, f),
                    Err(e) => self.fail(st, None, &format!("malformed frame from the peer: {e}")),
                }
                moved = true;
                continue;
            }
            match self.read_staging(st) {
                Some(n) => {
                    budget = budget.saturating_sub(n as u64);
                    moved = true;
                }
                None => return moved,
            }
        }
    }

    /// Reads more bytes into the staging buffer; `None` when nothing came (or the link failed).
    fn read_staging(&self, st: &mut ConnState) -> Option<usize> {
        let rx = &mut st.rx;
        if rx.start == rx.end {
            rx.start = 0;
            rx.end = 0;
        } else if rx.buf.len() - rx.end < HDR_LEN {
            rx.buf.copy_within(rx.start..rx.end, 0);
            rx.end -= rx.start;
            rx.start = 0;
        }
        let free = &mut rx.buf[rx.end..];
        let iov = [libc::iovec { iov_base: free.as_mut_ptr().cast(), iov_len: free.len() }];
        let r = st.link.as_ref()?.readv(&iov);
        self.after_read(st, r).inspect(|&n| st.rx.end += n)
    }

    /// Handles a read's result: EOF and errors fail the link.
    fn after_read(&self, st: &mut ConnState, r: std::io::Result<usize>) -> Option<usize> {
        match r {
            Ok(0) => {
                self.fail_link(st, "the peer closed the connection");
                None
            }
            Ok(n) => Some(n),
            Err(e) if e.kind() == std::io::ErrorKind::WouldBlock => None,
            Err(e) if e.kind() == std::io::ErrorKind::Interrupted => None,
            Err(e) => {
                self.fail_link(st, &format!("receive failed: {e}"));
                None
            }
        }
    }

    fn take_wqe(&self, st: &mut ConnState) -> bool {
        let srq = self.srq.as_ref().expect("WaitWqe only with an SRQ");
        let cur = st.rx.cur.as_mut().expect("frame in progress");
        if srq.take() {
            cur.wqe = true;
            cur.step = if cur.len == 0 { Step::Finish } else { Step::Payload };
            return true;
        }
        let now = Instant::now();
        let notice = match cur.rnr_at {
            None => {
                srq.rnr.fetch_add(1, Ordering::Relaxed);
                true
            }
            Some(t) => now.duration_since(t) >= RNR_NOTICE,
        };
        let seq = cur.seq;
        if notice && st.tx.ctl_room() >= 2 {
            st.rx.cur.as_mut().expect("frame in progress").rnr_at = Some(now);
            st.push_ctl(Ctl::Rnr(seq));
            self.flush_tx(st);
        }
        st.rx.stalled = true;
        false
    }

    /// Moves payload bytes: from the staging buffer first, else straight from the socket.
    /// `None`: nothing more can move now.
    fn rx_payload(&self, st: &mut ConnState, budget: &mut u64) -> Option<bool> {
        let avail = st.rx.avail();
        let ConnState { rx, link, .. } = st;
        let cur = rx.cur.as_mut().expect("frame in progress");
        let remaining = cur.len - cur.done;
        let mut buf = IovBuf::new();
        let (from, to) =
            if avail > 0 { (cur.done, cur.done + remaining.min(avail as u64)) } else { (cur.done, cur.len) };
        let placed =
            if cur.nseg == 0 || cur.nak.is_some() { Ok(()) } else { cur.dest_iovs(&self.dev.mrs, from, to, &mut buf) };
        if placed.is_err() {
            drop(buf);
            return Some(self.lost_region(st));
        }
        if avail > 0 {
            // Scatter the staged bytes into the iovecs (none when dropping them).
            let mut src = rx.start;
            for v in buf.iovs() {
                // SAFETY: each iovec is a pinned, bounds-checked range of a registration
                // (or this frame's tail buffer); the source lies in the staging buffer.
                unsafe { std::ptr::copy_nonoverlapping(rx.buf.as_ptr().add(src), v.iov_base as *mut u8, v.iov_len) };
                src += v.iov_len;
            }
            let moved = (to - from) as usize;
            rx.start += moved;
            cur.done += moved as u64;
            *budget = budget.saturating_sub(moved as u64);
        } else {
            if buf.iovs().is_empty() {
                // Dropped payload: read it into the staging buffer and skip it there.
                drop(buf);
                return self.read_staging(st).map(|_| true);
            }
            let dest = buf.bytes();
            if rx.start == rx.end {
                rx.start = 0;
                rx.end = 0;
            }
            let free = &mut rx.buf[rx.end..];
            if !free.is_empty() {
                buf.push(free.as_mut_ptr(), free.len());
            }
            let r = link.as_ref()?.readv(buf.iovs());
            drop(buf);
            let got = self.after_read(st, r)?;
            let cur = st.rx.cur.as_mut().expect("frame in progress");
            let into_dest = got.min(dest);
            cur.done += into_dest as u64;
            st.rx.end += got - into_dest;
            *budget = budget.saturating_sub(got as u64);
        }
        let cur = st.rx.cur.as_mut().expect("frame in progress");
        if cur.done == cur.len {
            cur.step = Step::Finish;
        }
        Some(true)
    }

    /// The region under a payload went away (deregistered) or a READ's local SGE is bad.
    fn lost_region(&self, st: &mut ConnState) -> bool {
        let cur = st.rx.cur.as_mut().expect("frame in progress");
        if cur.write {
            log::warn!(
                "soft fabric: QP {}: region of rkey {:#x} went away under a WRITE",
                self.qp_num,
                cur.segs[0].key
            );
            cur.nak = Some(NakCode::RemoteAccess);
            cur.nseg = 0;
            true
        } else {
            let seq = cur.seq;
            self.fail(
                st,
                Some((seq, WcStatus::LocalError)),
                "READ response: local SGE not registered with LOCAL_WRITE",
            );
            false
        }
    }

    fn on_header(&self, st: &mut ConnState, f: Frame) {
        if f.dst_qpn() != self.qp_num {
            let msg = format!("frame for QP {} arrived on QP {}", f.dst_qpn(), self.qp_num);
            return self.fail(st, None, &msg);
        }
        let request_seq = match f {
            Frame::Write { seq, .. } | Frame::ReadReq { seq, .. } => Some(seq),
            _ => None,
        };
        if let Some(seq) = request_seq {
            if seq != st.expect_seq {
                let msg = format!("request {seq} out of order (expected {})", st.expect_seq);
                return self.fail(st, None, &msg);
            }
            st.expect_seq = seq.wrapping_add(1);
        }
        match f {
            Frame::Write { seq, addr, rkey, len, imm, .. } => {
                let len = len as u64;
                let mut frame = RxFrame::new(seq, true, imm, len, Access::REMOTE_WRITE);
                frame.execute = !st.discarding;
                if frame.execute {
                    // As verbs: a 0-byte WRITE checks no rkey.
                    let refused = if len > 0 && self.dev.mrs.pin_range(rkey, addr, len, Access::REMOTE_WRITE).is_none()
                    {
                        Some(NakCode::RemoteAccess)
                    } else if imm.is_some() && self.srq.is_none() {
                        Some(NakCode::InvalidRequest)
                    } else {
                        None
                    };
                    if let Some(code) = refused {
                        st.push_ctl(Ctl::Nak(seq, code));
                        st.discarding = true;
                        frame.execute = false;
                    } else {
                        frame.segs[0] = Seg { key: rkey, addr, len };
                        frame.nseg = (len > 0) as usize;
                        frame.tail_on = len >= 8 && (addr + len).is_multiple_of(8);
                        if imm.is_some() {
                            frame.step = Step::WaitWqe;
                        }
                    }
                }
                st.rx.cur = Some(frame);
            }
            Frame::ReadReq { seq, addr, rkey, len, .. } => {
                if st.discarding {
                    return;
                }
                let len = len as u64;
                if len > 0 && self.dev.mrs.pin_range(rkey, addr, len, Access::REMOTE_READ).is_none() {
                    st.push_ctl(Ctl::ReadRespErr(seq, NakCode::RemoteAccess));
                    st.discarding = true;
                } else {
                    st.push_ctl(Ctl::ReadResp { seq, rkey, addr, len });
                }
            }
            Frame::ReadResp { seq, result, .. } => {
                let oldest = (st.reads_len > 0).then(|| st.reads[st.reads_head]);
                if oldest != Some(seq) {
                    let msg = format!("READ response {seq}, expected {oldest:?}");
                    return self.fail(st, None, &msg);
                }
                match result {
                    Err(code) => {
                        let msg = format!("peer refused READ {seq}: {code:?}");
                        self.fail(st, Some((seq, Conn::nak_status(code))), &msg)
                    }
                    Ok(len) => {
                        let wr = st.entry(seq).wr;
                        if len as u64 != wr.bytes() {
                            let msg = format!("READ response {seq} of {len} bytes for a READ of {}", wr.bytes());
                            return self.fail(st, None, &msg);
                        }
                        let mut frame = RxFrame::new(seq, false, None, len as u64, Access::LOCAL_WRITE);
                        frame.nseg = wr.num_sge as usize;
                        for (d, s) in frame.segs.iter_mut().zip(&wr.sge[..wr.num_sge as usize]) {
                            *d = Seg { key: s.lkey, addr: s.addr, len: s.len as u64 };
                        }
                        st.rx.cur = Some(frame);
                    }
                }
            }
            Frame::Ack { seq, .. } => {
                let next = seq.wrapping_add(1);
                let read_before = st.reads_len > 0 && seq_lt(st.reads[st.reads_head], next);
                if seq_lt(next, st.acked) || seq_lt(st.tx_done, next) || read_before {
                    let msg = format!("ACK {seq} outside the requests in flight [{}, {})", st.acked, st.tx_done);
                    return self.fail(st, None, &msg);
                }
                st.acked = next;
            }
            // NAK and RNR may come while the request's payload is still being sent (the
            // responder decides on the header): bound them by what was started, not sent.
            Frame::Nak { seq, code, .. } => {
                if seq_lt(seq, st.acked) || !seq_lt(seq, st.sent) {
                    let msg = format!("NAK {seq} outside the requests in flight [{}, {})", st.acked, st.sent);
                    return self.fail(st, None, &msg);
                }
                st.acked = seq;
                let msg = format!("peer refused request {seq}: {code:?}");
                self.fail(st, Some((seq, Conn::nak_status(code))), &msg);
            }
            Frame::Rnr { seq, .. } => {
                if seq_lt(seq, st.acked) || !seq_lt(seq, st.sent) {
                    let msg = format!("RNR {seq} outside the requests in flight [{}, {})", st.acked, st.sent);
                    self.fail(st, None, &msg);
                }
            }
            Frame::Hello { .. } => self.fail(st, None, "HELLO on an established connection"),
        }
    }

    /// Completes the frame: the held-back word, the receive completion, the ACK.
    /// `false`: the CQ is full, try again later.
    fn finish_frame(&self, st: &mut ConnState) -> bool {
        let cur = st.rx.cur.as_mut().expect("frame in progress");
        if !cur.write {
            let seq = cur.seq;
            st.entry_mut(seq).read_done = true;
            if seq_lt(st.acked, seq.wrapping_add(1)) {
                st.acked = seq.wrapping_add(1);
            }
            st.reads_head = (st.reads_head + 1) % MAX_RD_ATOMIC;
            st.reads_len -= 1;
            st.rx.cur = None;
            return true;
        }
        if !cur.execute {
            st.rx.cur = None;
            return true;
        }
        let seq = cur.seq;
        if cur.nak.is_none() && cur.tail_on && !cur.tail_done {
            let s = cur.segs[0];
            let word = s.addr + s.len - 8;
            match self.dev.mrs.pin_range(s.key, word, 8, Access::REMOTE_WRITE) {
                Some(_pin) => {
                    // SAFETY: `word` is 8-aligned (checked when the frame was accepted) and
                    // lies in a registration pinned for this store; the region is memory the
                    // application handed to the NIC, accessed by others only atomically or
                    // after a completion.
                    let a = unsafe { AtomicU64::from_ptr(word as *mut u64) };
                    a.store(u64::from_ne_bytes(cur.tail), Ordering::Release);
                    cur.tail_done = true;
                }
                None => cur.nak = Some(NakCode::RemoteAccess),
            }
        }
        if let Some(code) = cur.nak {
            if cur.wqe {
                self.srq.as_ref().expect("WQE taken from the SRQ").give_back();
            }
            st.rx.cur = None;
            st.push_ctl(Ctl::Nak(seq, code));
            st.discarding = true;
            return true;
        }
        if let Some(imm) = cur.imm {
            let c = Completion {
                wr_id: 0,
                status: WcStatus::Success,
                opcode: WcOpcode::RecvRdmaWithImm,
                byte_len: cur.len as u32,
                imm,
                qp_num: self.qp_num,
                timestamp_ns: 0,
            };
            if !self.cq.lock().push(c) {
                st.rx.stalled = true;
                return false;
            }
        }
        st.rx.cur = None;
        st.tx.push_ack(seq);
        true
    }
}
