//! A connection on its link (TCP): the [`Station`] the link drives (frames in, a turn to
//! send, the link breaking), and the QP-level handshake and close.
//!
//! - **Handshake.** `connect` puts the QP on the link to its peer's device (dialing or
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
//! Every callback ends in [`Conn::settle`]: the QP joins the link's lists it now belongs to
//! (something to send, an ACK owed, an RNR timer), completions are retired, and the link's
//! count of QPs waiting on the peer is kept.

use std::sync::Arc;
use std::time::{Duration, Instant};

use super::conn::{Conn, ConnState, MAX_PARKED, Parked, Phase, Remote, Wire};
use super::fault::Fault;
use super::frame::{Frame, HDR_LEN};
use super::hook::{self, Hook};
use super::link::{Filler, Io, LinkKey, Placed, Recv, Station};
use super::progress::{Doorbell, doorbell};
use super::qp_recv::{self, RxEnv};
use super::qp_send::{GEN_MASK, of_note};
use crate::error::{Error, Result};
use crate::fabric::{SendWr, WcStatus};

impl Station for Conn {
    fn qpn(&self) -> u32 {
        self.ep.qp_num
    }

    fn on_frame(self: &Arc<Self>, f: &Frame, io: &mut Io<'_, Self>) -> Recv {
        let mut st = self.st.lock();
        let w0 = st.waiting();
        let r = match *f {
            Frame::Connect { src_qpn, dst_nonce, src_nonce, .. } => {
                self.on_connect(&mut st, io, src_qpn, dst_nonce, src_nonce);
                Recv::Skip
            }
            Frame::Close { src_qpn, error, .. } => {
                self.on_close(&mut st, io, src_qpn, error);
                Recv::Skip
            }
            _ if !matches!(st.phase, Phase::Ready) || !st.link().is_some_and(|l| Arc::ptr_eq(l, io.link)) => {
                st.dropped_late += st.is_error() as u64;
                Recv::Skip
            }
            _ => {
                let ConnState { req, resp, rx, tx, .. } = &mut *st;
                match qp_recv::on_frame(&mut RxEnv { ep: &self.ep, req, resp, rx, tx }, f) {
                    Ok(r) => r,
                    Err(fault) => {
                        self.fault(&mut st, io, fault);
                        Recv::Skip
                    }
                }
            }
        };
        self.settle(&mut st, io, w0);
        r
    }

    fn on_segment(self: &Arc<Self>, placed: Placed, io: &mut Io<'_, Self>) {
        let mut st = self.st.lock();
        let w0 = st.waiting();
        if matches!(st.phase, Phase::Ready) {
            let ConnState { req, resp, rx, tx, .. } = &mut *st;
            if let Err(fault) = qp_recv::on_segment(&mut RxEnv { ep: &self.ep, req, resp, rx, tx }, placed) {
                self.fault(&mut st, io, fault);
            }
        }
        self.settle(&mut st, io, w0);
    }

    fn places(&self) -> bool {
        matches!(self.st.lock().phase, Phase::Ready)
    }

    fn fill(self: &Arc<Self>, out: &mut Filler<'_, Self>) -> bool {
        let mut st = self.st.lock();
        let w0 = st.waiting();
        st.tx.listed = false;
        let ready = matches!(st.phase, Phase::Ready);
        let dst = st.remote.map_or(0, |r| r.qpn);
        let ConnState { req, tx, .. } = &mut *st;
        let more = match tx.fill(self, req, dst, ready, out) {
            Ok(more) => more,
            Err(fault) => {
                self.fault(&mut st, &mut out.io, fault);
                false
            }
        };
        st.tx.listed = more;
        self.settle(&mut st, &mut out.io, w0);
        more
    }

    fn fill_ack(self: &Arc<Self>, out: &mut Filler<'_, Self>) {
        let mut st = self.st.lock();
        st.tx.owe_listed = false;
        let dst = st.remote.map_or(0, |r| r.qpn);
        st.tx.fill_ack(self, dst, out);
    }

    fn sent(self: &Arc<Self>, note: u64) {
        let (seq, round, last, read) = of_note(note);
        let mut st = self.st.lock();
        if last && !read && round == st.req.round() & GEN_MASK {
            st.req.mark_transmitted(seq);
        }
    }

    fn source_lost(self: &Arc<Self>, note: u64, _started: bool, io: &mut Io<'_, Self>) -> Option<[u8; HDR_LEN]> {
        let (seq, _, _, read) = of_note(note);
        let mut st = self.st.lock();
        let w0 = st.waiting();
        let fault = if read || note == 0 {
            Fault::qp("memory of a READ response deregistered while it was being sent".into())
        } else {
            Fault::wr(seq, WcStatus::LocalError, "local memory of a WR deregistered or out of bounds".into())
        };
        self.fault(&mut st, io, fault);
        self.settle(&mut st, io, w0);
        None
    }

    fn link_down(self: &Arc<Self>, why: &str, io: &mut Io<'_, Self>) {
        let mut st = self.st.lock();
        let w0 = st.waiting();
        st.tx.unlisted();
        match st.phase {
            Phase::Ready => {
                let at = st.req.oldest_unacked().map(|s| (s, WcStatus::RetryExceeded));
                let loud = !st.req.idle() || st.rx.busy();
                self.fail(&mut st, at, why, loud);
                st.tx.reset(None);
            }
            Phase::Waiting { .. } => {
                // Nothing was exchanged yet: `is_ready` looks for another link.
                log::debug!("soft fabric: QP {}: link down while connecting ({why}); trying again", self.ep.qp_num);
                st.wire = None;
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
        let mut st = self.st.lock();
        let w0 = st.waiting();
        st.tx.timer_listed = false;
        st.tx.rnr_over(now);
        self.settle(&mut st, io, w0);
    }
}

impl Conn {
    /// After every change under the link's lock: the link's lists and counts follow the
    /// QP's state, finished WRs retire (`w0`: whether the QP waited on the peer before).
    pub fn settle(self: &Arc<Self>, st: &mut ConnState, io: &mut Io<'_, Self>, w0: bool) {
        let ready = matches!(st.phase, Phase::Ready);
        if st.tx.purge_requests {
            st.tx.purge_requests = false;
            io.purge(self.ep.qp_num, true);
        }
        if st.tx.wants(&st.req, ready) {
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
        self.retire(st);
        if st.req.blocked() {
            self.attached.block(self);
        }
        io.waiting(st.waiting() as isize - w0 as isize);
    }

    /// Moves the QP to the error state for `fault` and tells the peer QP (CLOSE).
    fn fault(self: &Arc<Self>, st: &mut ConnState, io: &mut Io<'_, Self>, fault: Fault) {
        let Fault::Qp { at, why } = fault;
        self.fail_tcp(st, io, at, &why, true, true);
    }

    /// The error state on a link: the QP's frames not begun are dropped (one begun goes on
    /// to its end: `Io::purge`), and the peer QP is told (`close`: CLOSE, with the error bit
    /// when `error`).
    pub(super) fn fail_tcp(
        self: &Arc<Self>,
        st: &mut ConnState,
        io: &mut Io<'_, Self>,
        at: Option<(u32, WcStatus)>,
        why: &str,
        loud: bool,
        error: bool,
    ) {
        if st.is_error() {
            return;
        }
        let dst = st.remote.map_or(0, |r| r.qpn);
        let held = if st.tx.hook == Hook::Hold { hook::held(&mut st.req, dst) } else { Vec::new() };
        self.fail(st, at, why, loud);
        io.purge(self.ep.qp_num, false);
        let close = st.remote.map(|r| Frame::Close { dst_qpn: r.qpn, src_qpn: self.ep.qp_num, error });
        st.tx.reset(close);
        st.tx.released = held;
    }

    fn stray(&self, what: impl FnOnce() -> String) {
        let name = &self.port.name;
        self.port.warn.stray.warn(|| format!("soft fabric {name}: QP {}: {}; ignored", self.ep.qp_num, what()));
    }

    fn on_connect(
        self: &Arc<Self>,
        st: &mut ConnState,
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
        match st.phase {
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
            Phase::Waiting { .. } if from_peer(st.remote) => match st.link() {
                Some(l) if Arc::ptr_eq(l, io.link) => st.phase = Phase::Ready,
                Some(_) => self.stray(|| format!("CONNECT from QP {src_qpn} on another link than this QP's")),
                None => {
                    // Its link broke while it waited: the peer's new link will do.
                    io.qps.insert(self.ep.qp_num, self.clone());
                    st.wire = Some(Wire::Tcp(io.link.clone()));
                    st.tx.connect(self.connect_frame(st.remote.expect("waiting QPs know their peer")));
                    st.phase = Phase::Ready;
                    self.attached.bump();
                }
            },
            Phase::Ready if from_peer(st.remote) => {}
            Phase::Error => {}
            _ => self.stray(|| format!("unexpected CONNECT from QP {src_qpn}")),
        }
    }

    fn on_close(self: &Arc<Self>, st: &mut ConnState, io: &mut Io<'_, Self>, src_qpn: u32, error: bool) {
        match st.phase {
            Phase::Created => {
                let before = st.parked.len();
                st.parked.retain(|p| !(p.qpn == src_qpn && Arc::ptr_eq(&p.link, io.link)));
                *io.parked -= before - st.parked.len();
            }
            Phase::Waiting { .. } | Phase::Ready
                if st.remote.is_some_and(|r| r.qpn == src_qpn)
                    && st.link().is_some_and(|l| Arc::ptr_eq(l, io.link)) =>
            {
                let status = if error { WcStatus::RemoteOpError } else { WcStatus::RetryExceeded };
                let at = st.req.oldest_unacked().map(|s| (s, status));
                // An orderly close is no warning here: what it costs the work outstanding
                // (if any was NCCL's) is the engine's to say.
                let loud = error && (!st.req.idle() || st.rx.busy());
                let why = if error { "the peer's QP failed" } else { "the peer closed its QP" };
                self.fail_tcp(st, io, at, why, loud, false);
                st.tx.reset(None);
            }
            _ => {}
        }
    }

    fn connect_frame(&self, r: Remote) -> Frame {
        Frame::Connect { dst_qpn: r.qpn, src_qpn: self.ep.qp_num, dst_nonce: r.nonce, src_nonce: self.nonce }
    }

    /// The link to `r`'s device: dialed by the device with the smaller identity (a QP pair
    /// within one device: by the QPs' order, each QP on its own end).
    fn link_key(&self, r: &Remote) -> LinkKey {
        let me = self.port.dev_id;
        let dials = if r.dev != me { me < r.dev } else { (self.nonce, self.ep.qp_num) < (r.nonce, r.qpn) };
        LinkKey { remote: r.dev, dials }
    }

    /// `connect` (TCP): the QP waits for its peer's CONNECT from now on.
    pub fn connect_tcp(self: &Arc<Self>, r: Remote, bound: Duration) -> Result<()> {
        {
            let mut st = self.st.lock();
            if !matches!(st.phase, Phase::Created) {
                crate::bail!(InvalidUsage, "soft fabric QP {}: connect called twice", self.ep.qp_num);
            }
            st.remote = Some(r);
            st.bound = bound;
            st.phase = Phase::Waiting { deadline: Instant::now() + self.port.connect_timeout };
        }
        self.relink()
    }

    /// Puts a waiting QP without a link on one to its peer's device (the link a parked
    /// CONNECT came on, else the port's) and sends its CONNECT.
    pub fn relink(self: &Arc<Self>) -> Result<()> {
        let (r, parked) = {
            let st = self.st.lock();
            if !matches!(st.phase, Phase::Waiting { .. }) || st.wire.is_some() {
                return Ok(());
            }
            let r = st.remote.expect("waiting QPs know their peer");
            let p = st.parked.iter().find(|p| p.qpn == r.qpn && p.nonce == r.nonce && p.link.key.remote == r.dev);
            (r, p.map(|p| p.link.clone()))
        };
        let Some(addr) = r.addr else { crate::bail!(InvalidArgument, "soft fabric: TCP peer without an address") };
        for _ in 0..2 {
            let link = match &parked {
                Some(l) => l.clone(),
                None => self.port.link_for(self.link_key(&r), addr)?,
            };
            let mut ls = link.lock();
            if ls.phase == super::link::Phase::Down {
                continue;
            }
            let released = {
                let mut st = self.st.lock();
                if !matches!(st.phase, Phase::Waiting { .. }) || st.wire.is_some() {
                    return Ok(());
                }
                ls.attach(self.ep.qp_num, self, st.bound);
                let mut io = ls.io(&link);
                st.wire = Some(Wire::Tcp(link.clone()));
                let mut released = Vec::new();
                for p in std::mem::take(&mut st.parked) {
                    if Arc::ptr_eq(&p.link, &link) {
                        *io.parked -= 1;
                        if p.qpn == r.qpn && p.nonce == r.nonce {
                            st.phase = Phase::Ready;
                        }
                    } else {
                        released.push(p);
                    }
                }
                st.tx.connect(self.connect_frame(r));
                self.settle(&mut st, &mut io, false);
                released
            };
            self.attached.bump();
            self.port.step_tx(&link, &mut ls);
            drop(ls);
            for p in released {
                self.port.unpark(&p.link);
            }
            return Ok(());
        }
        Err(Error::remote(format!("soft fabric QP {}: no link to the peer's device", self.ep.qp_num)))
    }

    /// `is_ready` (TCP).
    pub fn is_ready_tcp(self: &Arc<Self>) -> Result<bool> {
        let (phase, link) = {
            let st = self.st.lock();
            (st.phase, st.link().cloned())
        };
        let deadline = match phase {
            Phase::Ready => return Ok(true),
            Phase::Error => {
                return Err(Error::remote(format!("soft fabric QP {}: in the error state", self.ep.qp_num)));
            }
            Phase::Created => {
                crate::bail!(InvalidUsage, "soft fabric QP {}: is_ready before connect", self.ep.qp_num)
            }
            Phase::Waiting { deadline } => deadline,
        };
        if link.is_none() {
            self.relink()?;
        }
        self.port.drive_accept();
        let link = self.st.lock().link().cloned();
        if let Some(link) = &link {
            let mut ls = link.lock();
            let _ = self.port.step_locked(link, &mut ls, true);
            let mut st = self.st.lock();
            match st.phase {
                Phase::Ready => return Ok(true),
                Phase::Error => {
                    return Err(Error::remote(format!("soft fabric QP {}: in the error state", self.ep.qp_num)));
                }
                _ if Instant::now() < deadline => return Ok(false),
                _ => {
                    let why = format!("the peer did not connect within {:?}", self.port.connect_timeout);
                    let mut io = ls.io(link);
                    self.fail_tcp(&mut st, &mut io, None, &why, true, true);
                    self.settle(&mut st, &mut io, false);
                    drop(st);
                    self.port.step_tx(link, &mut ls);
                    return Err(Error::remote(format!("soft fabric QP {}: {why}", self.ep.qp_num)));
                }
            }
        }
        if Instant::now() < deadline {
            return Ok(false);
        }
        let why = format!("the peer did not connect within {:?}", self.port.connect_timeout);
        self.fail(&mut self.st.lock(), None, &why, true);
        Err(Error::remote(format!("soft fabric QP {}: {why}", self.ep.qp_num)))
    }

    /// `post_send` (TCP): queued, and sent at once as far as the socket takes it, or held
    /// for the link's next frames (a chain nobody here waits for: `progress::doorbell`).
    pub fn post_tcp(self: &Arc<Self>, chain: &[SendWr]) -> Result<()> {
        let link = self.st.lock().link().cloned();
        let Some(link) = link else { return self.post(&mut self.st.lock(), chain) };
        let mut ls = link.lock();
        {
            let mut st = self.st.lock();
            let w0 = st.waiting();
            self.post(&mut st, chain)?;
            self.settle(&mut st, &mut ls.io(&link), w0);
        }
        link.caller_epoch.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
        match doorbell(chain, ls.phase == super::link::Phase::Up) {
            Doorbell::Ring => self.port.step_tx(&link, &mut ls),
            Doorbell::Hold => self.port.hold(&link),
        }
        Ok(())
    }

    /// A CQ poll retires what found the CQ full before.
    pub fn retire_blocked(self: &Arc<Self>) {
        let link = self.st.lock().link().cloned();
        let Some(link) = link else { return };
        let mut ls = link.lock();
        let mut st = self.st.lock();
        let w0 = st.waiting();
        self.settle(&mut st, &mut ls.io(&link), w0);
    }

    /// The QP is destroyed: the peer QP hears of it (CLOSE), a WQE held is given back, the
    /// QP leaves its link (the last one leaving closes it) and lets go of parked CONNECTs.
    pub fn destroy_tcp(self: &Arc<Self>) {
        let (link, parked) = {
            let mut st = self.st.lock();
            (st.link().cloned(), std::mem::take(&mut st.parked))
        };
        if let Some(link) = link {
            let mut ls = link.lock();
            {
                let mut st = self.st.lock();
                let w0 = st.waiting();
                let mut io = ls.io(&link);
                if st.rx.take_wqe() {
                    self.ep.srq.as_ref().expect("a WQE came from the SRQ").give_back();
                    self.ep.cq.lock().unreserve();
                }
                if !st.is_error() {
                    st.phase = Phase::Error;
                    io.purge(self.ep.qp_num, false);
                    let close =
                        st.remote.map(|r| Frame::Close { dst_qpn: r.qpn, src_qpn: self.ep.qp_num, error: false });
                    st.tx.close_after_ack(close);
                }
                io.qps.remove(&self.ep.qp_num);
                io.waiting(-(w0 as isize));
                if st.tx.wants(&st.req, false) && !st.tx.listed {
                    st.tx.listed = true;
                    io.ready(self);
                }
            }
            self.port.step_tx(&link, &mut ls);
        }
        for p in parked {
            self.port.unpark(&p.link);
        }
    }
}
