//! A connection on its link (TCP): the [`Station`] the link drives (frames in, a turn to
//! send, the link breaking), and the QP-level handshake and close.
//!
//! - **Handshake.** `connect` (`conn_tcp.rs`) puts the QP on the link to its peer's device (dialing or
//!   awaiting it: `port.rs`) and sends a CONNECT naming both QPs and quoting the peer's
//!   nonce; the QP is ready when the peer's CONNECT arrives. A CONNECT for a QP that has
//!   not called `connect` yet is parked on it (at most [`MAX_PARKED`]; the one `connect`
//!   names is used, the others let go), so a later one never displaces the right one.
//! - **Close.** A QP destroyed sends the ACK it owes, then CLOSE (what it executed stays
//!   acknowledged, as a NIC acknowledges on arrival); one that fails sends CLOSE with the
//!   error bit. The peer QP goes to the error state, quietly for an orderly close (what
//!   that costs the work outstanding is the engine's to say).
//! - **Link down.** A ready QP fails (`RetryExceeded` for the oldest WR waiting on the peer,
//!   the rest flushed); a QP still waiting for its peer's CONNECT looks for a new link
//!   (nothing was exchanged yet).
//!
//! Every callback ends in [`TcpConn::settle`]: the QP joins the link's lists it now belongs to
//! (something to send, an ACK owed, an RNR timer), completions are retired, and the link's
//! count of QPs waiting on the peer is kept.

use std::sync::Arc;
use std::time::Instant;

use super::conn::{Core, Phase, Remote};
use super::conn_tcp::{MAX_PARKED, Parked, TcpConn, TcpState};
use super::endpoint::Endpoint;
use super::fault::Fault;
use super::frame::{Frame, HDR_LEN};
use super::hook::{self, Hook};
use super::link::{Filler, Io, Placed, Recv, Station};
use super::qp_recv::{self, RxEnv};
use super::qp_send::{GEN_MASK, of_note};
use crate::fabric::WcStatus;

/// The receive side's view of a connection's state.
fn rx_env<'a>(st: &'a mut TcpState, ep: &'a Endpoint) -> RxEnv<'a> {
    let TcpState { core: Core { req, resp, .. }, rx, tx, .. } = st;
    RxEnv { ep, req, resp, rx, tx }
}

impl Station for TcpConn {
    fn qpn(&self) -> u32 {
        self.ep.qp_num
    }

    fn on_frame(self: &Arc<Self>, f: &Frame, io: &mut Io<'_, Self>) -> Recv {
        self.settled(io, |st, io| match *f {
            Frame::Connect { src_qpn, dst_nonce, src_nonce, .. } => {
                self.on_connect(st, io, src_qpn, dst_nonce, src_nonce);
                Recv::Skip
            }
            Frame::Close { src_qpn, error, .. } => {
                self.on_close(st, io, src_qpn, error);
                Recv::Skip
            }
            _ if !st.core.is_ready() || !st.link.as_ref().is_some_and(|l| Arc::ptr_eq(l, io.link)) => {
                st.dropped_late += st.core.is_error() as u64;
                Recv::Skip
            }
            _ => {
                let r = qp_recv::on_frame(&mut rx_env(st, &self.ep), f);
                self.or_fault(st, io, r, Recv::Skip)
            }
        })
    }

    fn on_segment(self: &Arc<Self>, placed: Placed, io: &mut Io<'_, Self>) {
        self.settled(io, |st, io| {
            if st.core.is_ready() {
                let r = qp_recv::on_segment(&mut rx_env(st, &self.ep), placed);
                self.or_fault(st, io, r, ());
            }
        })
    }

    fn places(&self) -> bool {
        self.st.lock().core.is_ready()
    }

    fn fill(self: &Arc<Self>, out: &mut Filler<'_, Self>) -> bool {
        let mut st = self.st.lock();
        let w0 = st.waiting();
        st.tx.listed = false;
        let ready = st.core.is_ready();
        let dst = st.core.remote.map_or(0, |r| r.qpn);
        let TcpState { core: Core { req, .. }, tx, .. } = &mut *st;
        let r = tx.fill(self, req, dst, ready, out);
        let more = self.or_fault(&mut st, &mut out.io, r, false);
        st.tx.listed = more;
        self.settle(&mut st, &mut out.io, w0);
        more
    }

    fn fill_ack(self: &Arc<Self>, out: &mut Filler<'_, Self>) {
        let mut st = self.st.lock();
        st.tx.owe_listed = false;
        let dst = st.core.remote.map_or(0, |r| r.qpn);
        st.tx.fill_ack(self, dst, out);
    }

    fn sent(self: &Arc<Self>, note: u64) {
        let (seq, round, last, read) = of_note(note);
        let mut st = self.st.lock();
        if last && !read && round == st.core.req.round() & GEN_MASK {
            st.core.req.mark_transmitted(seq);
        }
    }

    fn source_lost(self: &Arc<Self>, note: u64, _started: bool, io: &mut Io<'_, Self>) -> Option<[u8; HDR_LEN]> {
        let (seq, _, _, read) = of_note(note);
        let fault = if read || note == 0 {
            Fault::qp("memory of a READ response deregistered while it was being sent".into())
        } else {
            Fault::wr(seq, WcStatus::LocalError, "local memory of a WR deregistered or out of bounds".into())
        };
        self.settled(io, |st, io| self.or_fault(st, io, Err(fault), None))
    }

    fn link_down(self: &Arc<Self>, why: &str, io: &mut Io<'_, Self>) {
        let mut st = self.st.lock();
        let w0 = st.waiting();
        st.tx.unlisted();
        match st.core.phase {
            Phase::Ready => {
                let at = st.core.oldest(WcStatus::RetryExceeded);
                let loud = !st.core.req.idle() || st.rx.busy();
                self.fail(&mut st, at, why, loud);
                st.tx.reset(None);
            }
            Phase::Waiting { .. } => {
                // Nothing was exchanged yet: `is_ready` looks for another link.
                log::debug!("soft fabric: QP {}: link down while connecting ({why}); trying again", self.ep.qp_num);
                st.link = None;
                io.qps.remove(&self.ep.qp_num);
            }
            Phase::Created => {
                let before = st.parked.len();
                st.parked.retain(|p| !Arc::ptr_eq(&p.link, io.link));
                *io.parked -= before - st.parked.len();
            }
            Phase::Error => {}
        }
        io.waiting(st.waiting() as isize - w0 as isize);
    }

    fn timer(self: &Arc<Self>, now: Instant, io: &mut Io<'_, Self>) {
        self.settled(io, |st, _| {
            st.tx.timer_listed = false;
            st.tx.rnr_over(now);
        });
    }
}

impl TcpConn {
    /// After every change under the link's lock: the link's lists and counts follow the
    /// QP's state, finished WRs retire (`w0`: whether the QP waited on the peer before).
    pub fn settle(self: &Arc<Self>, st: &mut TcpState, io: &mut Io<'_, Self>, w0: bool) {
        let ready = st.core.is_ready();
        if st.tx.purge_requests {
            st.tx.purge_requests = false;
            io.purge(self.ep.qp_num, true);
        }
        if st.tx.wants(&st.core.req, ready) {
            if !st.tx.listed {
                st.tx.listed = true;
                io.ready(self);
            }
        } else if st.tx.owes() {
            if !st.tx.owe_listed {
                st.tx.owe_listed = true;
                io.owe(self);
            }
            if st.tx.owes_urgent() {
                io.owe_urgent();
            }
        }
        if let Some(at) = st.tx.rnr_until
            && !st.tx.timer_listed
        {
            st.tx.timer_listed = true;
            io.timer(self, at);
        }
        st.core.retire(&self.ep);
        if st.core.req.blocked() {
            self.attached.block(self);
        }
        io.waiting(st.waiting() as isize - w0 as isize);
    }

    /// Runs `f` on the state, then settles the QP on its link ([`Self::settle`]).
    pub(super) fn settled<R>(
        self: &Arc<Self>,
        io: &mut Io<'_, Self>,
        f: impl FnOnce(&mut TcpState, &mut Io<'_, Self>) -> R,
    ) -> R {
        let mut st = self.st.lock();
        let w0 = st.waiting();
        let r = f(&mut st, io);
        self.settle(&mut st, io, w0);
        r
    }

    /// `r`'s value; on a fault, `on_fault`, the QP moved to the error state and the peer
    /// QP told (CLOSE).
    fn or_fault<T>(self: &Arc<Self>, st: &mut TcpState, io: &mut Io<'_, Self>, r: Result<T, Fault>, on_fault: T) -> T {
        r.unwrap_or_else(|Fault::Qp { at, why }| {
            self.fail_on_link(st, io, at, &why, true, true);
            on_fault
        })
    }

    /// The error state on a link: the QP's frames not begun are dropped (one begun goes on
    /// to its end: `Io::purge`), and the peer QP is told (`close`: CLOSE, with the error bit
    /// when `error`).
    pub(super) fn fail_on_link(
        self: &Arc<Self>,
        st: &mut TcpState,
        io: &mut Io<'_, Self>,
        at: Option<(u32, WcStatus)>,
        why: &str,
        loud: bool,
        error: bool,
    ) {
        if st.core.is_error() {
            return;
        }
        let dst = st.core.remote.map_or(0, |r| r.qpn);
        let held = if st.tx.hook == Hook::Hold { hook::held(&mut st.core.req, dst) } else { Vec::new() };
        self.fail(st, at, why, loud);
        io.purge(self.ep.qp_num, false);
        let close = st.core.remote.map(|r| Frame::Close { dst_qpn: r.qpn, src_qpn: self.ep.qp_num, error });
        st.tx.reset(close);
        st.tx.released = held;
    }

    fn stray(&self, what: impl FnOnce() -> String) {
        let name = &self.port.name;
        self.port.warn.stray.warn(|| format!("soft fabric {name}: QP {}: {}; ignored", self.ep.qp_num, what()));
    }

    fn on_connect(
        self: &Arc<Self>,
        st: &mut TcpState,
        io: &mut Io<'_, Self>,
        src_qpn: u32,
        dst_nonce: u64,
        src_nonce: u64,
    ) {
        if dst_nonce != self.nonce {
            return self.stray(|| format!("CONNECT from QP {src_qpn} quoting another nonce"));
        }
        let from_peer = |r: Option<Remote>| {
            r.is_some_and(|r| r.qpn == src_qpn && r.nonce == src_nonce && r.dev == io.link.key.remote)
        };
        match st.core.phase {
            Phase::Created => {
                let same = |p: &Parked| p.qpn == src_qpn && p.nonce == src_nonce && Arc::ptr_eq(&p.link, io.link);
                if st.parked.iter().any(same) {
                    return;
                }
                if st.parked.len() == MAX_PARKED {
                    return self.stray(|| format!("CONNECT from QP {src_qpn}: {MAX_PARKED} already wait for connect"));
                }
                st.parked.push(Parked { link: io.link.clone(), qpn: src_qpn, nonce: src_nonce });
                *io.parked += 1;
            }
            Phase::Waiting { .. } if from_peer(st.core.remote) => match st.link.as_ref() {
                Some(l) if Arc::ptr_eq(l, io.link) => st.core.phase = Phase::Ready,
                Some(_) => self.stray(|| format!("CONNECT from QP {src_qpn} on another link than this QP's")),
                None => {
                    // Its link broke while it waited: the peer's new link will do.
                    io.qps.insert(self.ep.qp_num, self.clone());
                    st.link = Some(io.link.clone());
                    st.tx.connect(self.connect_frame(st.core.remote.expect("waiting QPs know their peer")));
                    st.core.phase = Phase::Ready;
                    self.attached.bump();
                }
            },
            Phase::Ready if from_peer(st.core.remote) => {}
            Phase::Error => {}
            _ => self.stray(|| format!("unexpected CONNECT from QP {src_qpn}")),
        }
    }

    fn on_close(self: &Arc<Self>, st: &mut TcpState, io: &mut Io<'_, Self>, src_qpn: u32, error: bool) {
        match st.core.phase {
            Phase::Created => {
                let before = st.parked.len();
                st.parked.retain(|p| !(p.qpn == src_qpn && Arc::ptr_eq(&p.link, io.link)));
                *io.parked -= before - st.parked.len();
            }
            Phase::Waiting { .. } | Phase::Ready
                if st.core.remote.is_some_and(|r| r.qpn == src_qpn)
                    && st.link.as_ref().is_some_and(|l| Arc::ptr_eq(l, io.link)) =>
            {
                let status = if error { WcStatus::RemoteOpError } else { WcStatus::RetryExceeded };
                let at = st.core.oldest(status);
                // An orderly close is no warning here: what it costs the work outstanding
                // (if any was NCCL's) is the engine's to say.
                let loud = error && (!st.core.req.idle() || st.rx.busy());
                let why = if error { "the peer's QP failed" } else { "the peer closed its QP" };
                self.fail_on_link(st, io, at, why, loud, false);
                st.tx.reset(None);
            }
            _ => {}
        }
    }
}
