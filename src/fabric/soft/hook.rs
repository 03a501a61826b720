//! Fault hooks a test or the drill arms on a QP (`QueuePair::inject_fault`, TCP mode, armed
//! in `conn_tcp.rs`; see `FaultKind`), each firing once. They live on the requester (the
//! side that posts the WRs they hit), so a sender can arm them on its own QPs; what they
//! make the responder see travels on the wire as it would when a real link dies:
//!
//! - `DropImm`: the next WRITE_WITH_IMM started goes as a plain WRITE (bytes placed, no
//!   WQE, no IMM) with ACK_REQ; its ACK is taken as the moment the link died: the WR fails
//!   `RetryExceeded` and the peer gets a CLOSE with the error bit.
//! - `DropAck`: the next WRITE_WITH_IMM started goes with ACK_REQ, otherwise unchanged; the
//!   ACK that covers it is dropped the same way (the WRs before it complete, it fails, the
//!   rest flush). A WRITE_WITH_IMM, not any signalled WR: the plugin's signalled probes
//!   would take it, and the drill is about a part the receiver got and the sender lost.
//! - `Hold`: requests are not started (the QP does not count as waiting on its peer, so the
//!   link's silent-peer timer leaves it alone); when the QP goes to the error state (its
//!   own fence or fault, or the peer's CLOSE) the held requests (header and first segment)
//!   are queued after the CLOSE, so they reach the responder after its error state.
//!
//! The cost when nothing is armed: a byte compare where a request starts (`qp_send.rs`), where
//! `ConnState::waiting` reads the QP, an `Option` test where an ACK is taken (`requester.rs`),
//! and nothing on the send path of a ready QP (the release is looked at only when not ready).

use std::sync::Arc;

use super::frame::{HDR_LEN, SEGMENT, encode};
use super::link::{Filler, Src, Station};
use super::requester::{Requester, segs_of};
use crate::fabric::{Access, MAX_SGE, WrOpcode};

/// A hook armed on a QP's send side, not fired yet.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub enum Hook {
    #[default]
    None,
    DropImm,
    DropAck,
    Hold,
}

/// A held request, released after the error state: its header and first segment.
pub struct Held {
    hdr: [u8; HDR_LEN],
    inline: Option<Vec<u8>>,
    src: Src,
    seg: u64,
}

/// Request `seq` starts: a `DropImm` or `DropAck` hook that matches it fires.
#[cold]
#[inline(never)]
pub fn on_start(hook: &mut Hook, req: &mut Requester, seq: u32) {
    let wr = req.entry(seq).wr;
    match *hook {
        Hook::DropImm | Hook::DropAck if wr.opcode == WrOpcode::WriteImm => req.doom(seq, *hook == Hook::DropImm),
        _ => return,
    }
    *hook = Hook::None;
}

/// The requests a `Hold` hook kept from the wire, as they would have gone (READs, which
/// place nothing at the responder, are left out), for [`release`] after the error state.
/// `dst`: the peer QP.
#[cold]
pub fn held(req: &mut Requester, dst: u32) -> Vec<Held> {
    let Some(first) = req.next_unsent() else { return Vec::new() };
    let mut out = Vec::new();
    for seq in (0..req.unsent()).map(|i| first.wrapping_add(i)) {
        let e = req.entry(seq);
        if e.wr.opcode == WrOpcode::Read || e.bad_local {
            continue;
        }
        let (len, inline) = (e.wr.bytes(), e.wr.inline);
        let hdr = encode(&req.header(seq, dst));
        let seg = len.min(SEGMENT as u64);
        let inline = inline.then(|| req.inline_of(seq).to_vec());
        let src = Src::Mem { segs: segs_of(&req.entry(seq).wr), nseg: MAX_SGE, base: 0, need: Access::empty() };
        out.push(Held { hdr, inline, src: if seg == 0 { Src::None } else { src }, seg });
    }
    out
}

/// Queues the held requests (after the CLOSE, when this side sends one).
#[cold]
pub fn release<S: Station>(me: &Arc<S>, held: Vec<Held>, out: &mut Filler<'_, S>) {
    log::debug!("soft fabric: QP {}: {} held requests released after the error state", me.qpn(), held.len());
    for h in held {
        match &h.inline {
            Some(b) => out.push_bytes(me, h.hdr, b, 0, true),
            None => out.push(me, h.hdr, h.src, h.seg, 0, true),
        }
    }
}
