//! An in-process connection: both QPs in this process, no stream. A posted WR executes at
//! once against the peer's endpoint (`direct.rs`); what must wait (an empty SRQ, a full CQ)
//! is queued and stepped by either side's CQ polls. The two ends share a [`DirectEnd`] pair
//! (`transport.rs`): an end closing is what EOF is to a link.
//!
//! Found by nonce: a QP connects to the peer its `QpInfo` names through the registry of the
//! in-process network its device is on ([`InprocNet`]); the QP that dials (the smaller nonce
//! and number) builds the pair and hands the peer its end, parked on it if the peer has not
//! called `connect` yet.

use std::collections::HashMap;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, OnceLock, Weak};
use std::time::Instant;

use parking_lot::Mutex;

use super::conn::{Core, Phase, Remote, not_connected};
use super::direct;
use super::endpoint::{Attached, Endpoint};
use super::port::Port;
use super::requester::wr_completion;
use super::spin::SpinMutex;
use super::transport::{CLOSED, DirectEnd, READY};
use crate::error::{Error, Result};
use crate::fabric::{QpCaps, SendWr, WcStatus};

/// The network in-process devices are on, as a switch is to NICs: its QPs by nonce, how a
/// QP finds the peer its `QpInfo` names. Whoever opens the devices owns it (a plugin
/// instance has one), so QPs reach exactly the QPs of devices opened on the same network.
#[derive(Default)]
pub struct InprocNet {
    qps: Mutex<HashMap<u64, Weak<InprocConn>>>,
}

impl InprocNet {
    /// A network of its own, for the devices opened on it.
    pub fn new() -> std::sync::Arc<InprocNet> {
        std::sync::Arc::default()
    }
}

impl std::fmt::Debug for InprocNet {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "InprocNet({} QPs)", self.qps.lock().len())
    }
}

/// The same network (identity, not contents).
impl PartialEq for InprocNet {
    fn eq(&self, other: &Self) -> bool {
        std::ptr::eq(self, other)
    }
}

impl Eq for InprocNet {}

/// An in-process connection (one QP). Shared (`Arc`) by the QP handle, its CQ's polls and
/// the peer's (which step it: its WRs may wait on the peer's SRQ or CQ).
pub struct InprocConn {
    /// This side: QP number, registrations, CQ, SRQ.
    pub ep: Endpoint,
    /// A random u64 that names the QP (the registry's key).
    pub nonce: u64,
    /// The network the QP is registered on (its device's).
    net: Arc<InprocNet>,
    pub port: Arc<Port<InprocConn>>,
    /// The connections attached to this QP's CQ (the QP detaches itself when dropped).
    pub attached: Arc<Attached<InprocConn>>,
    pub st: SpinMutex<InprocState>,
    /// Set while WRs wait to execute or retire, or once the peer closed; a poll steps only
    /// connections (and peers) with this set.
    pub work: Arc<AtomicBool>,
    /// The peer's connection and its `work` flag, stepped from this side's polls.
    pub peer: OnceLock<(Weak<InprocConn>, Arc<AtomicBool>)>,
    /// The size limits of the lean post ([`direct::lean_caps`]).
    lean_caps: [u64; 2],
}

/// The state of an in-process connection, under its lock.
pub struct InprocState {
    pub core: Core,
    /// This side's end, there exactly while the phase is `Ready` (let go when the QP fails
    /// or drops, so the peer sees it closed).
    end: Option<DirectEnd>,
    /// The dialer's end, when it connected before `connect` named it: (end, QP, nonce).
    parked: Option<(DirectEnd, u32, u64)>,
}

impl InprocState {
    /// [`Requester::enqueue`](super::requester::Requester::enqueue), out of line and called
    /// with the state: the post calls it only when a WR must wait, and a call with a pointer
    /// into the state makes the compiler compute that pointer on the usual way too.
    #[inline(never)]
    fn enqueue(&mut self, mrs: &super::mr::MrTable, chain: &[SendWr]) {
        self.core.req.enqueue(mrs, chain);
    }

    /// [`Requester::push_executed`](super::requester::Requester::push_executed), out of line
    /// for the same reason as [`Self::enqueue`].
    #[cold]
    #[inline(never)]
    fn push_executed(&mut self, wr: &SendWr) {
        self.core.req.push_executed(wr);
    }

    /// The peer's end when the connection is idle: `Ready`, nothing queued, the peer there
    /// and connected (the end is there exactly while the phase is `Ready`).
    #[inline(always)]
    fn idle_end(&self) -> Option<&DirectEnd> {
        match &self.end {
            Some(e) if self.core.req.idle() && e.state() == READY => {
                debug_assert!(self.core.is_ready());
                Some(e)
            }
            _ => None,
        }
    }

    /// Connected on `end`.
    fn attach(&mut self, end: DirectEnd) {
        end.set_ready();
        self.end = Some(end);
        self.core.phase = Phase::Ready;
    }
}

impl InprocConn {
    /// A connection for QP `ep` on `port`, to be attached to its CQ's list `attached`;
    /// registered on `net` under its nonce.
    pub fn new(
        ep: Endpoint,
        nonce: u64,
        net: &Arc<InprocNet>,
        port: Arc<Port<InprocConn>>,
        attached: Arc<Attached<InprocConn>>,
        caps: QpCaps,
    ) -> Arc<InprocConn> {
        let st = InprocState { core: Core::new(&caps), end: None, parked: None };
        let lean_caps = direct::lean_caps(caps.max_inline as usize);
        let c = Arc::new(InprocConn {
            ep,
            nonce,
            net: net.clone(),
            port,
            attached,
            st: SpinMutex::new(st),
            work: Default::default(),
            peer: OnceLock::new(),
            lean_caps,
        });
        net.qps.lock().insert(nonce, Arc::downgrade(&c));
        c
    }

    /// `connect` to `r`: the dialer builds the pair of ends and hands the peer its end; the
    /// other side takes the end parked on it, or waits for it.
    pub fn connect(self: &Arc<Self>, r: Remote, bound: std::time::Duration) -> Result<()> {
        let mut st = self.st.lock();
        st.core.connect(self.ep.qp_num, r, bound)?;
        if (self.nonce, self.ep.qp_num) < (r.nonce, r.qpn) {
            return self.dial(&mut st, r);
        }
        match st.parked.take() {
            Some((end, qpn, nonce)) if qpn == r.qpn && nonce == r.nonce => st.attach(end),
            _ => st.core.phase = Phase::Waiting { deadline: Instant::now() + self.port.connect_timeout },
        }
        Ok(())
    }

    /// The dialer: builds the pair and hands the peer its end.
    fn dial(self: &Arc<Self>, st: &mut InprocState, remote: Remote) -> Result<()> {
        let peer = self.net.qps.lock().get(&remote.nonce).and_then(Weak::upgrade).ok_or_else(|| {
            Error::invalid_argument(format!("soft fabric (in-process): no QP {} on this device's network", remote.qpn))
        })?;
        let (mine, theirs) = DirectEnd::pair((&self.ep, &self.work), (&peer.ep, &peer.work));
        {
            let mut ps = peer.st.lock();
            let me = (self.ep.qp_num, self.nonce);
            match ps.core.phase {
                Phase::Created => ps.parked = Some((theirs, me.0, me.1)),
                Phase::Waiting { .. } if ps.core.remote.map(|r| (r.qpn, r.nonce)) == Some(me) => ps.attach(theirs),
                _ => crate::bail!(InvalidUsage, "soft fabric (in-process): QP {} is connected elsewhere", remote.qpn),
            }
        }
        let _ = peer.peer.set((Arc::downgrade(self), self.work.clone()));
        let _ = self.peer.set((Arc::downgrade(&peer), peer.work.clone()));
        // Ready on this side; WRs execute once the peer connects too (its end sets READY).
        st.end = Some(mine);
        st.core.phase = Phase::Ready;
        Ok(())
    }

    /// `is_ready`: the peer has connected; an error once the deadline passed.
    pub fn is_ready(&self) -> Result<bool> {
        let mut st = self.st.lock();
        match st.core.readiness(self.ep.qp_num)? {
            None => Ok(true),
            Some(deadline) if Instant::now() < deadline => Ok(false),
            Some(_) => {
                let why = not_connected(self.port.connect_timeout);
                self.fail(&mut st, None, &why, true);
                Err(Error::remote(format!("soft fabric QP {}: {why}", self.ep.qp_num)))
            }
        }
    }

    /// To the error state now (a fence; `lost`: as a lost link would, the oldest WR not
    /// acknowledged fails with `RetryExceeded`): the peer sees its end closed.
    pub fn to_error(&self, lost: bool, why: &str) {
        let mut st = self.st.lock();
        let at = if lost { st.core.oldest(WcStatus::RetryExceeded) } else { None };
        self.fail(&mut st, at, why, lost);
    }

    /// The QP is destroyed: off its CQ, out of the registry, its end let go (the peer sees
    /// it closed).
    pub fn destroy(self: &Arc<Self>) {
        self.attached.detach(self);
        self.port.qps.remove(self.ep.qp_num);
        self.net.qps.lock().remove(&self.nonce);
        let mut st = self.st.lock();
        st.core.phase = Phase::Error;
        st.parked = None;
        st.end = None;
    }

    /// Moves the QP to the error state ([`Core::fail`]); the end is let go, so the peer
    /// sees it closed.
    fn fail(&self, st: &mut InprocState, at: Option<(u32, WcStatus)>, why: &str, loud: bool) {
        if st.core.fail(&self.ep, &self.port.warn.qp, at, why, loud) {
            st.end = None;
        }
    }

    /// `post_send`: a connection with nothing queued executes the chain as it is, with no
    /// copy into the send queue; whatever must wait, fails, or cannot complete into a full
    /// CQ is queued (from that WR on) and goes the queued way.
    #[inline]
    pub fn post(&self, st: &mut InprocState, chain: &[SendWr]) -> Result<()> {
        // The usual post (every protocol post): one WRITE or WRITE_WITH_IMM of at most one
        // SGE on an idle connection. Idle means `Ready` with nothing queued, so of
        // `check_chain`'s checks only the WR's own remain (`lean_len`); a WR that fails
        // them takes the general way below, which refuses it with the precise error.
        if let [wr] = chain
            && let Some(end) = st.idle_end()
            && let Some(len) = direct::lean_len(wr, &self.lean_caps)
        {
            if direct::write_now(&self.ep.mrs, end, wr, len) {
                if self.retire_now(st, wr, len) {
                    return Ok(());
                }
            } else {
                // It waits or fails: the queued way decides, with its checks and messages.
                st.enqueue(&self.ep.mrs, chain);
            }
            self.progress(st);
            return Ok(());
        }
        self.post_chain(st, chain)
    }

    /// [`Self::post`] of any chain.
    #[inline(never)]
    fn post_chain(&self, st: &mut InprocState, chain: &[SendWr]) -> Result<()> {
        st.core.req.check_chain(matches!(st.core.phase, Phase::Created), chain, self.ep.qp_num)?;
        let mut k = 0;
        while k < chain.len() && st.idle_end().is_some() && self.run_now(st, &chain[k]) {
            k += 1;
        }
        if k < chain.len() {
            st.core.req.enqueue(&self.ep.mrs, &chain[k..]);
        }
        if !st.core.req.idle() {
            self.progress(st);
        }
        Ok(())
    }

    /// Executes `wr` of a chain being posted and completes it. `false`: it was not executed
    /// (it waits or fails: the queued way decides, with its checks and messages).
    fn run_now(&self, st: &mut InprocState, wr: &SendWr) -> bool {
        let Some(end) = &st.end else { return false };
        let done = direct::run_posted(&self.ep.mrs, end, wr);
        if done {
            let _ = self.retire_now(st, wr, wr.bytes());
        }
        done
    }

    /// Completes `wr`, executed as it was posted: its completion (if signalled) goes to
    /// this side's CQ, or, with the CQ full, the WR is queued as executed and retires the
    /// queued way (then `false`).
    #[inline(always)]
    fn retire_now(&self, st: &mut InprocState, wr: &SendWr, len: u64) -> bool {
        if !wr.signaled {
            return true;
        }
        if !self.ep.cq.lock().push(wr_completion(wr, len, WcStatus::Success, self.ep.qp_num)) {
            st.push_executed(wr);
            return false;
        }
        true
    }

    /// A CQ poll's step: this connection and its peer, each if it has work.
    pub fn step(&self) {
        if self.work.load(Ordering::Acquire) {
            self.progress(&mut self.st.lock());
        }
        if let Some((peer, work)) = self.peer.get()
            && work.load(Ordering::Acquire)
            && let Some(p) = peer.upgrade()
        {
            p.progress(&mut p.st.lock());
        }
    }

    /// One step: notice a closed peer, execute what is queued, retire what completed.
    /// Returns whether anything moved.
    #[inline(never)]
    fn progress(&self, st: &mut InprocState) -> bool {
        let mut moved = false;
        if let Some(end) = &st.end {
            let state = end.state();
            if state & CLOSED != 0 {
                let loud = !st.core.req.idle();
                let at = st.core.oldest(WcStatus::RetryExceeded);
                self.fail(st, at, "the peer closed the connection", loud);
                moved = true;
            } else if state & READY != 0 {
                moved |= self.execute(st);
            }
        }
        moved |= st.core.retire(&self.ep);
        let work = !st.core.req.idle();
        // Stored only when it changes: the flag is read by both sides' polls, and a WR
        // that waits is stepped at every poll.
        if self.work.load(Ordering::Relaxed) != work {
            self.work.store(work, Ordering::Release);
        }
        if work {
            // Polls of this side's CQ and of the peer's step this connection again.
            self.ep.cq.raise_work();
            if let Some(end) = &st.end {
                end.peer().cq.raise_work();
            }
        }
        moved
    }

    /// Executes queued WRs in order until one must wait or fails.
    fn execute(&self, st: &mut InprocState) -> bool {
        let InprocState { end: Some(end), core, .. } = st else { return false };
        match direct::execute(&mut core.req, &mut core.resp, &self.ep.mrs, end) {
            Ok(moved) => moved,
            Err(super::fault::Fault::Qp { at, why }) => {
                self.fail(st, at, &why, true);
                true
            }
        }
    }
}
