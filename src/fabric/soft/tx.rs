//! The send half of a connection: a small batch of frames in transmission order, written
//! with one `sendmsg` per batch. Responses (ACK, NAK, READ_RESP, RNR) and the dialer's
//! HELLO go before queued requests. A frame's payload is referenced, not copied: the
//! iovecs point into the registered buffer (pinned for the call) or the WR's inline slot,
//! so many small WRs leave in one system call and a large one goes from its buffer to the
//! socket with only the kernel's copy.
//!
//! The send half works on what its connection lends it for one step ([`TxEnv`]) and
//! reports a [`Fault`] instead of moving the QP to the error state itself.

use std::collections::VecDeque;

use super::fault::Fault;
use super::frame::{Frame, HDR_LEN, NakCode, encode};
use super::mr::MrTable;
use super::requester::{MAX_RD_ATOMIC, Requester};
use super::responder::Responder;
use super::transport::{IovBuf, Link};
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

/// What the send half works with for one step, lent by its connection.
pub struct TxEnv<'a> {
    pub mrs: &'a MrTable,
    pub link: Option<&'a Link>,
    pub req: &'a mut Requester,
    pub resp: &'a mut Responder,
    /// The peer's QP number (0 before it is known).
    pub dst_qpn: u32,
}

/// The send half of one connection (see the module documentation).
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

impl Tx {
    /// Moves responses, then requests, into the batch while it has room.
    fn fill_batch(&mut self, req: &mut Requester, dst_qpn: u32) -> Result<(), Fault> {
        while self.frames.len() < TX_FRAMES {
            if let Some(c) = self.ctl.pop_front() {
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
                self.frames.push_back(f);
                continue;
            }
            let Some(seq) = req.next_unsent() else { break };
            let e = req.entry(seq);
            if e.bad_local {
                return Err(Fault::wr(seq, WcStatus::LocalError, "inline SGE outside any registration".into()));
            }
            let (opcode, len, inline) = (e.wr.opcode, e.wr.bytes(), e.wr.inline);
            if opcode == WrOpcode::Read {
                if req.reads_full() {
                    break;
                }
                req.start_read(seq);
            }
            let hdr = encode(&req.header(seq, dst_qpn));
            let (src, payload) = match opcode {
                WrOpcode::Read => (Src::None, 0),
                _ if len == 0 => (Src::None, 0),
                _ if inline => (Src::Inline(seq), len),
                _ => (Src::Sges(seq), len),
            };
            self.frames.push_back(hdr_frame(hdr, src, Some(seq), payload));
            req.mark_sent(seq);
        }
        Ok(())
    }

    /// Writes what is queued until the socket is full. Returns whether anything moved.
    pub fn flush(&mut self, env: &mut TxEnv<'_>) -> Result<bool, Fault> {
        let mut moved = false;
        loop {
            self.fill_batch(env.req, env.dst_qpn)?;
            if self.frames.is_empty() {
                return Ok(moved);
            }
            let mut buf = IovBuf::new();
            let mut bad: Option<usize> = None;
            let req = &*env.req;
            for (i, f) in self.frames.iter_mut().enumerate() {
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
                        buf.push(req.inline_from(seq, from as usize).as_ptr(), (to - from) as usize);
                        true
                    }
                    Src::Sges(seq) => {
                        let wr = &req.entry(seq).wr;
                        let segs = wr.sge[..wr.num_sge as usize].iter().map(|s| (s.lkey, s.addr, s.len as u64));
                        buf.push_segments(env.mrs, segs, from, to, Access::empty())
                    }
                    Src::ReadResp { rkey, addr } => {
                        buf.push_segments(env.mrs, std::iter::once((rkey, addr, to)), from, to, Access::REMOTE_READ)
                    }
                };
                if !ok {
                    bad = Some(i);
                    break;
                }
            }
            let bytes = buf.bytes();
            if let Some(i) = bad {
                drop(buf);
                self.source_lost(i, env.resp, env.dst_qpn)?;
                continue;
            }
            let Some(link) = env.link else { return Ok(moved) };
            let r = link.writev(buf.iovs());
            drop(buf);
            match r {
                Ok(w) => {
                    moved = true;
                    self.advance(env.req, w as u64);
                    if w < bytes {
                        return Ok(moved);
                    }
                }
                Err(e) if e.kind() == std::io::ErrorKind::WouldBlock => return Ok(moved),
                Err(e) if e.kind() == std::io::ErrorKind::Interrupted => {}
                Err(e) => return Err(Fault::PeerLost(format!("send failed: {e}"))),
            }
        }
    }

    /// Frame `i`'s source memory is no longer registered. A READ response not yet begun
    /// becomes a refusal (and sending goes on); anything else fails the QP.
    fn source_lost(&mut self, i: usize, resp: &mut Responder, dst_qpn: u32) -> Result<(), Fault> {
        let f = &mut self.frames[i];
        match (f.src, f.request) {
            (Src::ReadResp { .. }, _) if f.off == 0 => {
                let seq = u32::from_le_bytes(f.hdr[8..12].try_into().expect("4"));
                *f = hdr_frame(
                    encode(&Frame::ReadResp { dst_qpn, seq, result: Err(NakCode::RemoteAccess) }),
                    Src::None,
                    None,
                    0,
                );
                resp.refuse();
                Ok(())
            }
            (_, Some(seq)) => {
                Err(Fault::wr(seq, WcStatus::LocalError, "local memory of a WR deregistered or out of bounds".into()))
            }
            _ => Err(Fault::qp("memory of a READ response deregistered while it was being sent".into())),
        }
    }

    fn advance(&mut self, req: &mut Requester, mut w: u64) {
        while w > 0 {
            let f = self.frames.front_mut().expect("written bytes belong to queued frames");
            let take = w.min(f.total - f.off);
            f.off += take;
            w -= take;
            if f.off == f.total {
                if let Some(seq) = f.request {
                    req.mark_transmitted(seq);
                }
                self.frames.pop_front();
            }
        }
    }
}
