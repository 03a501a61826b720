//! A TCP connection: one QP on the link to its peer's device (`link.rs`, shared with the
//! device's other QPs to that device). Its part on the link (frames in, a turn to send, the
//! link breaking, the QP-level handshake and close) is `station.rs`; this file holds its
//! state and what its caller does: connect, poll for readiness, post, fence, destroy.
//!
//! Locks: the state is locked only while its link's lock is held (link first), so a link's
//! receive and send paths, which lock the QPs they serve, never wait on a thread that holds
//! a QP and wants the link.

use std::sync::Arc;
use std::time::{Duration, Instant};

use super::conn::{Core, Phase, Remote, not_connected};
use super::endpoint::{Attached, Endpoint};
use super::frame::Frame;
use super::hook::Hook;
use super::link::{Io, Link, LinkKey};
use super::port::Port;
use super::progress::{Doorbell, doorbell};
use super::qp_recv::QpRx;
use super::qp_send::QpTx;
use super::responder::imm_completion;
use super::spin::SpinMutex;
use crate::error::{Error, Result};
use crate::fabric::{FaultKind, QpCaps, SendWr, WcStatus};

/// A CONNECT that came before `connect` named the peer: from QP `qpn` (`nonce`) on `link`.
pub struct Parked {
    pub link: Arc<Link<TcpConn>>,
    pub qpn: u32,
    pub nonce: u64,
}

/// Most CONNECTs parked on one QP (a peer that knows the QP's nonce can send more, but
/// not crowd out the one `connect` names beyond this).
pub const MAX_PARKED: usize = 4;

/// A TCP connection (one QP). Shared (`Arc`) by the QP handle (posting), its CQ (polling),
/// its link (frames in and out) and the device's helper thread.
pub struct TcpConn {
    /// This side: QP number, registrations, CQ, SRQ.
    pub ep: Endpoint,
    /// A random u64 that names the QP (a CONNECT quotes it).
    pub nonce: u64,
    /// The device's port: QP table, listener, links.
    pub port: Arc<Port<TcpConn>>,
    /// The connections attached to this QP's CQ (the QP detaches itself when dropped).
    pub attached: Arc<Attached<TcpConn>>,
    /// The state, taken under the link's lock (see the module documentation).
    pub st: SpinMutex<TcpState>,
}

/// The state of a TCP connection, under its lock.
pub struct TcpState {
    pub core: Core,
    /// The link, once `connect` chose it (`None` again while a waiting QP looks for a new
    /// link after its link broke).
    pub link: Option<Arc<Link<TcpConn>>>,
    /// CONNECTs that arrived before `connect` named the peer.
    pub parked: Vec<Parked>,
    pub rx: QpRx,
    pub tx: QpTx,
    /// Frames for this QP dropped in the error state (what a fault hook's test reads).
    pub dropped_late: u64,
}

impl TcpState {
    /// Whether requests wait on the peer for an answer (its silence then counts; not while
    /// a fault hook holds them, `hook.rs`).
    pub fn waiting(&self) -> bool {
        self.core.is_ready() && self.core.req.waiting() && self.tx.hook != Hook::Hold
    }
}

impl TcpConn {
    pub fn new(
        ep: Endpoint,
        nonce: u64,
        port: Arc<Port<TcpConn>>,
        attached: Arc<Attached<TcpConn>>,
        caps: QpCaps,
    ) -> TcpConn {
        let st = TcpState {
            core: Core::new(&caps),
            link: None,
            parked: Vec::new(),
            rx: QpRx::default(),
            tx: QpTx::default(),
            dropped_late: 0,
        };
        TcpConn { ep, nonce, port, attached, st: SpinMutex::new(st) }
    }

    /// Moves the QP to the error state ([`Core::fail`]); a WQE it held for a request being
    /// placed flushes. (The caller sends the CLOSE: [`Self::fail_on_link`].)
    pub fn fail(&self, st: &mut TcpState, at: Option<(u32, WcStatus)>, why: &str, loud: bool) {
        if st.core.is_error() {
            return;
        }
        if st.rx.take_wqe() {
            // Its CQ slot was reserved with the WQE: the Flushed completion has room.
            self.ep.cq.lock().push_reserved(imm_completion(self.ep.qp_num, 0, 0, WcStatus::Flushed));
        }
        st.core.fail(&self.ep, &self.port.warn.qp, at, why, loud);
    }

    /// Runs `f` on the state under the link's lock (link first: no frame of the link is being
    /// delivered to this QP meanwhile), then settles the QP on its link and (`send`) lets
    /// the link send. `None`: the QP is on no link.
    fn on_link<R>(self: &Arc<Self>, send: bool, f: impl FnOnce(&mut TcpState, &mut Io<'_, TcpConn>) -> R) -> Option<R> {
        let link = self.st.lock().link.clone()?;
        let mut ls = link.lock();
        let r = self.settled(&mut ls.io(&link), f);
        if send {
            self.port.step_tx(&link, &mut ls);
        }
        Some(r)
    }

    pub(super) fn connect_frame(&self, r: Remote) -> Frame {
        Frame::Connect { dst_qpn: r.qpn, src_qpn: self.ep.qp_num, dst_nonce: r.nonce, src_nonce: self.nonce }
    }

    /// The link to `r`'s device: dialed by the device with the smaller identity (a QP pair
    /// within one device: by the QPs' order, each QP on its own end).
    fn link_key(&self, r: &Remote) -> LinkKey {
        let me = self.port.dev_id;
        let dials = if r.dev != me { me < r.dev } else { (self.nonce, self.ep.qp_num) < (r.nonce, r.qpn) };
        LinkKey { remote: r.dev, dials }
    }

    /// `connect`: the QP waits for its peer's CONNECT from now on.
    pub fn connect(self: &Arc<Self>, r: Remote, bound: Duration) -> Result<()> {
        {
            let mut st = self.st.lock();
            st.core.connect(self.ep.qp_num, r, bound)?;
            st.core.phase = Phase::Waiting { deadline: Instant::now() + self.port.connect_timeout };
        }
        self.relink()
    }
    /// Puts a waiting QP without a link on one to its peer's device (the link a parked
    /// CONNECT came on, else the port's) and sends its CONNECT.
    pub fn relink(self: &Arc<Self>) -> Result<()> {
        let (r, parked) = {
            let st = self.st.lock();
            if !matches!(st.core.phase, Phase::Waiting { .. }) || st.link.is_some() {
                return Ok(());
            }
            let r = st.core.remote.expect("waiting QPs know their peer");
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
                if !matches!(st.core.phase, Phase::Waiting { .. }) || st.link.is_some() {
                    return Ok(());
                }
                ls.attach(self.ep.qp_num, self, st.core.bound);
                let mut io = ls.io(&link);
                st.link = Some(link.clone());
                let mut released = Vec::new();
                for p in std::mem::take(&mut st.parked) {
                    if Arc::ptr_eq(&p.link, &link) {
                        *io.parked -= 1;
                        if p.qpn == r.qpn && p.nonce == r.nonce {
                            st.core.phase = Phase::Ready;
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

    /// `is_ready`: the peer's CONNECT came; an error once the deadline passed.
    pub fn is_ready(self: &Arc<Self>) -> Result<bool> {
        let (readiness, link) = {
            let st = self.st.lock();
            (st.core.readiness(self.ep.qp_num), st.link.clone())
        };
        if readiness?.is_none() {
            return Ok(true);
        }
        if link.is_none() {
            self.relink()?;
        }
        self.port.drive_accept();
        let link = self.st.lock().link.clone();
        if let Some(link) = link {
            let _ = self.port.step_locked(&link, &mut link.lock(), true);
        }
        let why = not_connected(self.port.connect_timeout);
        let timed_out = |st: &mut TcpState, io: Option<&mut Io<'_, TcpConn>>| -> Result<bool> {
            let Some(deadline) = st.core.readiness(self.ep.qp_num)? else { return Ok(true) };
            if Instant::now() < deadline {
                return Ok(false);
            }
            match io {
                Some(io) => self.fail_on_link(st, io, None, &why, true, true),
                None => self.fail(st, None, &why, true),
            }
            Err(Error::remote(format!("soft fabric QP {}: {why}", self.ep.qp_num)))
        };
        match self.on_link(true, |st, io| timed_out(st, Some(io))) {
            Some(r) => r,
            None => timed_out(&mut self.st.lock(), None),
        }
    }

    /// `post_send`: queued, and sent at once as far as the socket takes it, or held for the
    /// link's next frames (a chain nobody here waits for: `progress::doorbell`).
    pub fn post(self: &Arc<Self>, chain: &[SendWr]) -> Result<()> {
        let link = self.st.lock().link.clone();
        let Some(link) = link else { return self.st.lock().core.post(&self.ep, chain) };
        let mut ls = link.lock();
        self.settled(&mut ls.io(&link), |st, _| st.core.post(&self.ep, chain))?;
        link.caller_epoch.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
        match doorbell(chain, ls.phase == super::link::Phase::Up) {
            Doorbell::Ring => self.port.step_tx(&link, &mut ls),
            Doorbell::Hold => self.port.hold(&link),
        }
        Ok(())
    }

    /// A CQ poll retires what found the CQ full before.
    pub fn retire_blocked(self: &Arc<Self>) {
        self.on_link(false, |_, _| ());
    }

    /// The QP is destroyed: the peer QP hears of it (CLOSE), a WQE held is given back, the
    /// QP leaves its link (the last one leaving closes it) and lets go of parked CONNECTs.
    pub fn destroy(self: &Arc<Self>) {
        let late = self.st.lock().dropped_late;
        if late > 0 {
            // What a drill's hold (`MPIB_FAULT_RAIL=..:hold`) shows through the C ABI.
            log::info!("soft fabric: QP {}: {late} frames came after its error state, dropped", self.ep.qp_num);
        }
        self.attached.detach(self);
        self.port.qps.remove(self.ep.qp_num);
        let (link, parked) = {
            let mut st = self.st.lock();
            (st.link.clone(), std::mem::take(&mut st.parked))
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
                if !st.core.is_error() {
                    st.core.phase = Phase::Error;
                    io.purge(self.ep.qp_num, false);
                    let close =
                        st.core.remote.map(|r| Frame::Close { dst_qpn: r.qpn, src_qpn: self.ep.qp_num, error: false });
                    st.tx.close_after_ack(close);
                }
                io.qps.remove(&self.ep.qp_num);
                io.waiting(-(w0 as isize));
                if st.tx.wants(&st.core.req, false) && !st.tx.listed {
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

    /// To the error state now (a fence, or the fault drill that imitates a lost link). `lost`:
    /// as a lost link would (the oldest WR not acknowledged fails with `RetryExceeded`, a
    /// warning); else every WR not completed flushes. The peer QP is told (CLOSE with the
    /// error bit), and every later frame for the QP is dropped (`station.rs` delivers
    /// frames only to a `Ready` QP), so both directions of the QP are gone.
    pub fn to_error(self: &Arc<Self>, lost: bool, why: &str) {
        let at = |st: &TcpState| if lost { st.core.oldest(WcStatus::RetryExceeded) } else { None };
        let on_link = self.on_link(true, |st, io| self.fail_on_link(st, io, at(st), why, lost, true));
        if on_link.is_none() {
            let mut st = self.st.lock();
            let at = at(&st);
            self.fail(&mut st, at, why, lost);
        }
    }

    /// Arms the fault hook `kind` (`hook.rs`; not `LinkLoss`: [`Self::to_error`] with `lost`
    /// does that at once).
    #[cold]
    pub fn arm(self: &Arc<Self>, kind: FaultKind) -> bool {
        let hook = match kind {
            FaultKind::LinkLoss => return false,
            FaultKind::DropImm => Hook::DropImm,
            FaultKind::DropAck => Hook::DropAck,
            FaultKind::HoldPastFence => Hook::Hold,
        };
        if self.on_link(false, |st, _| st.tx.hook = hook).is_none() {
            // Not on a link (yet): nothing counts it as waiting.
            self.st.lock().tx.hook = hook;
        }
        true
    }
}
