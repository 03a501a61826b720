//! The send half of a connection: a small batch of frames in transmission order, written
//! with one `sendmsg` per batch. Responses (ACK, NAK, READ_RESP, RNR) and the dialer's
//! HELLO go before queued requests. A frame's payload is referenced, not copied: the
//! iovecs point into the registered buffer (pinned for the call) or the WR's inline slot,
//! so many small WRs leave in one system call and a large one goes from its buffer to the
//! socket with only the kernel's copy.

use std::collections::VecDeque;

use super::conn::{Conn, ConnState, MAX_RD_ATOMIC};
use super::frame::{Frame, HDR_LEN, NakCode, encode};
use super::link::IovBuf;
use crate::fabric::{Access, MAX_SGE, WcStatus, WrOpcode};

/// Frames in one transmission batch.
const TX_FRAMES: usize = 32;
/// Responses waiting to be sent.
const CTL_CAP: usize = 2 * MAX_RD_ATOMIC + 8;

/// A response or connection frame waiting to go out.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Ctl {
    Hello(Frame),
    Ack(u32),
    Nak(u32, NakCode),
    ReadResp { seq: u32, rkey: u32, addr: u64, len: u64 },
    ReadRespErr(u32, NakCode),
    Rnr(u32),
}

#[derive(Clone, Copy, PartialEq, Eq)]
enum Src {
    None,
    /// Payload from the WR's SGEs (registered memory).
    Sges(u32),
    /// Payload from the WR's inline slot.
    Inline(u32),
    /// READ response payload from this side's registered memory.
    ReadResp {
        rkey: u32,
        addr: u64,
    },
}

struct TxFrame {
    hdr: [u8; HDR_LEN],
    src: Src,
    /// The request (send-queue position) this frame carries, if it is one.
    request: Option<u32>,
    total: u64,
    off: u64,
}

pub struct Tx {
    ctl: VecDeque<Ctl>,
    frames: VecDeque<TxFrame>,
}

impl Tx {
    pub fn new() -> Tx {
        Tx { ctl: VecDeque::with_capacity(CTL_CAP), frames: VecDeque::with_capacity(TX_FRAMES) }
    }

    pub fn reset(&mut self) {
        self.ctl.clear();
        self.frames.clear();
    }

    pub fn ctl_room(&self) -> usize {
        CTL_CAP - self.ctl.len()
    }

    /// Queues a response; `false` when full (the receive path checks room first).
    pub fn push_ctl(&mut self, c: Ctl) -> bool {
        if self.ctl.len() == CTL_CAP {
            return false;
        }
        self.ctl.push_back(c);
        true
    }

    /// Queues an ACK, folding it into a queued ACK: ACKs are cumulative.
    pub fn push_ack(&mut self, seq: u32) {
        if let Some(Ctl::Ack(s)) = self.ctl.back_mut() {
            *s = seq;
        } else {
            self.push_ctl(Ctl::Ack(seq));
        }
    }

    /// Bytes wait to be written.
    pub fn pending(&self) -> bool {
        !self.frames.is_empty() || !self.ctl.is_empty()
    }
}

fn hdr_frame(hdr: [u8; HDR_LEN], src: Src, request: Option<u32>, payload: u64) -> TxFrame {
    TxFrame { hdr, src, request, total: HDR_LEN as u64 + payload, off: 0 }
}

impl Conn {
    /// Moves responses, then requests, into the batch while it has room.
    fn fill_batch(&self, st: &mut ConnState) {
        let dst_qpn = st.remote.map_or(0, |r| r.qpn);
        while st.tx.frames.len() < TX_FRAMES {
            if let Some(c) = st.tx.ctl.pop_front() {
                let f = match c {
                    Ctl::Hello(f) => hdr_frame(encode(&f), Src::None, None, 0),
                    Ctl::Ack(seq) => hdr_frame(encode(&Frame::Ack { dst_qpn, seq }), Src::None, None, 0),
                    Ctl::Nak(seq, code) => hdr_frame(encode(&Frame::Nak { dst_qpn, seq, code }), Src::None, None, 0),
                    Ctl::Rnr(seq) => hdr_frame(encode(&Frame::Rnr { dst_qpn, seq }), Src::None, None, 0),
                    Ctl::ReadRespErr(seq, code) => {
                        hdr_frame(encode(&Frame::ReadResp { dst_qpn, seq, result: Err(code) }), Src::None, None, 0)
                    }
                    Ctl::ReadResp { seq, rkey, addr, len } => {
                        let hdr = encode(&Frame::ReadResp { dst_qpn, seq, result: Ok(len as u32) });
                        let src = if len > 0 { Src::ReadResp { rkey, addr } } else { Src::None };
                        hdr_frame(hdr, src, None, len)
                    }
                };
                st.tx.frames.push_back(f);
                continue;
            }
            if st.sent == st.tail {
                break;
            }
            let seq = st.sent;
            let e = st.entry(seq);
            if e.bad_local {
                self.fail(st, Some((seq, WcStatus::LocalError)), "inline SGE outside any registration");
                return;
            }
            let (opcode, len, inline) = (e.wr.opcode, e.wr.bytes(), e.wr.inline);
            if opcode == WrOpcode::Read {
                if st.reads_len == MAX_RD_ATOMIC {
                    break;
                }
                let at = (st.reads_head + st.reads_len) % MAX_RD_ATOMIC;
                st.reads[at] = seq;
                st.reads_len += 1;
            }
            let hdr = encode(&self.request_header(st, seq));
            let (src, payload) = match opcode {
                WrOpcode::Read => (Src::None, 0),
                _ if len == 0 => (Src::None, 0),
                _ if inline => (Src::Inline(seq), len),
                _ => (Src::Sges(seq), len),
            };
            st.tx.frames.push_back(hdr_frame(hdr, src, Some(seq), payload));
            st.sent = seq.wrapping_add(1);
        }
    }

    /// Writes what is queued until the socket is full. Returns whether anything moved.
    pub(super) fn flush_tx(&self, st: &mut ConnState) -> bool {
        let mut moved = false;
        loop {
            self.fill_batch(st);
            if st.is_error() || st.tx.frames.is_empty() {
                return moved;
            }
            let mut buf = IovBuf::new();
            let mut bad: Option<usize> = None;
            let ConnState { tx, sq, inline, max_inline, .. } = &mut *st;
            let cap = sq.len() as u32;
            for (i, f) in tx.frames.iter_mut().enumerate() {
                if buf.room() < 1 + MAX_SGE {
                    break;
                }
                if f.off < HDR_LEN as u64 {
                    let h = &f.hdr[f.off as usize..];
                    buf.push(h.as_ptr(), h.len());
                }
                let (from, to) = (f.off.saturating_sub(HDR_LEN as u64), f.total - HDR_LEN as u64);
                let ok = match f.src {
                    Src::None => true,
                    Src::Inline(seq) => {
                        let at = (seq % cap) as usize * *max_inline;
                        buf.push(inline[at + from as usize..].as_ptr(), (to - from) as usize);
                        true
                    }
                    Src::Sges(seq) => {
                        let wr = &sq[(seq % cap) as usize].wr;
                        let segs = wr.sge[..wr.num_sge as usize].iter().map(|s| (s.lkey, s.addr, s.len as u64));
                        buf.push_segments(&self.dev.mrs, segs, from, to, Access::empty())
                    }
                    Src::ReadResp { rkey, addr } => buf.push_segments(
                        &self.dev.mrs,
                        std::iter::once((rkey, addr, to)),
                        from,
                        to,
                        Access::REMOTE_READ,
                    ),
                };
                if !ok {
                    bad = Some(i);
                    break;
                }
            }
            let bytes = buf.bytes();
            if let Some(i) = bad {
                drop(buf);
                if !self.source_lost(st, i) {
                    return true;
                }
                continue;
            }
            let Some(link) = st.link.as_ref() else { return moved };
            let r = link.writev(buf.iovs());
            drop(buf);
            match r {
                Ok(w) => {
                    moved = true;
                    self.advance(st, w as u64);
                    if w < bytes {
                        return moved;
                    }
                }
                Err(e) if e.kind() == std::io::ErrorKind::WouldBlock => return moved,
                Err(e) if e.kind() == std::io::ErrorKind::Interrupted => {}
                Err(e) => {
                    self.fail_link(st, &format!("send failed: {e}"));
                    return true;
                }
            }
        }
    }

    /// Frame `i`'s source memory is no longer registered. A READ response not yet begun
    /// becomes a refusal; anything else moves the QP to the error state. Returns whether
    /// sending can go on.
    fn source_lost(&self, st: &mut ConnState, i: usize) -> bool {
        let f = &mut st.tx.frames[i];
        match (f.src, f.request) {
            (Src::ReadResp { .. }, _) if f.off == 0 => {
                let (dst_qpn, seq) =
                    (st.remote.map_or(0, |r| r.qpn), u32::from_le_bytes(f.hdr[8..12].try_into().expect("4")));
                *f = hdr_frame(
                    encode(&Frame::ReadResp { dst_qpn, seq, result: Err(NakCode::RemoteAccess) }),
                    Src::None,
                    None,
                    0,
                );
                st.discarding = true;
                true
            }
            (_, Some(seq)) => {
                self.fail(st, Some((seq, WcStatus::LocalError)), "local memory of a WR deregistered or out of bounds");
                false
            }
            _ => {
                self.fail(st, None, "memory of a READ response deregistered while it was being sent");
                false
            }
        }
    }

    fn advance(&self, st: &mut ConnState, mut w: u64) {
        while w > 0 {
            let f = st.tx.frames.front_mut().expect("written bytes belong to queued frames");
            let take = w.min(f.total - f.off);
            f.off += take;
            w -= take;
            if f.off == f.total {
                if let Some(seq) = f.request {
                    st.tx_done = seq.wrapping_add(1);
                }
                st.tx.frames.pop_front();
            }
        }
    }
}
