//! One QP's connection: the state machine that makes a byte stream (or an in-process peer)
//! behave as an RC queue pair. Shared (`Arc<Conn>`) by the QP handle (posting), its CQ
//! (polling) and the device's helper thread; whoever holds `st` makes progress.
//!
//! The state is made of parts that each own their rules: the requester (send queue,
//! completions in order), the responder (request order, refusals, placement), the silent-
//! peer timer, the link (TCP socket or in-process peer), and the TCP receive and send
//! halves. The parts never reach into each other or into the connection: the receive and
//! send halves and the in-process executor take the parts they need and report a [`Fault`]
//! when the QP must go to the error state. This file wires them: posting, one progress
//! step, retiring, and the error state.

use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, OnceLock, Weak};
use std::time::Instant;

use parking_lot::Mutex;

use super::direct;
use super::endpoint::{Attached, Endpoint};
use super::fault::Fault;
use super::frame::Frame;
use super::liveness::Liveness;
use super::port::{Accept, Port};
use super::requester::Requester;
use super::responder::Responder;
use super::rx::{Rx, RxEnv};
use super::transport::{CLOSED, DirectEnd, Link, READY};
use super::tx::{Ctl, Tx, TxEnv};
use super::watch::Watcher;
use crate::error::Result;
use crate::fabric::{Completion, QpCaps, SendWr, WcOpcode, WcStatus, WrOpcode};

/// Where a connection is in its life.
pub enum Phase {
    /// Created; `connect` not called yet.
    Created,
    /// TCP dialer: non-blocking connect under way; re-dialed after a refusal.
    Dialing {
        deadline: Instant,
        retry_at: Option<Instant>,
    },
    /// Acceptor: waiting for the dialer's HELLO.
    Waiting {
        deadline: Instant,
    },
    Ready,
    Error,
}

/// The peer, as its `QpInfo` says.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Remote {
    pub qpn: u32,
    pub nonce: u64,
    pub addr: Option<std::net::SocketAddr>,
}

/// A connection (one QP).
pub struct Conn {
    /// This side: QP number, registrations, CQ, SRQ.
    pub ep: Endpoint,
    /// A random u64 that names the QP (the HELLO quotes it; in-process QPs are found by it).
    pub nonce: u64,
    /// The device's port: QP table, listener, the helper's epoll set (where a TCP
    /// connection arms and forgets its socket).
    pub port: Arc<Port<Conn>>,
    /// The connections attached to this QP's CQ (the QP detaches itself when dropped).
    pub attached: Arc<Attached<Conn>>,
    pub st: Mutex<ConnState>,
    /// Bumped by every progress step a caller (not the helper) makes on this connection:
    /// the helper steps in only when it stops moving.
    pub caller_epoch: AtomicU64,
    /// In-process mode (no stream: WRs execute directly, see `direct.rs`).
    pub inproc: bool,
    /// In-process mode: set while WRs wait to execute or retire, or once the peer closed;
    /// a poll steps only connections (and peers) with this set.
    pub work: Arc<AtomicBool>,
    /// In-process mode: the peer's connection and its `work` flag, stepped from this side's
    /// polls (its WRs may wait on this side's SRQ or CQ).
    pub inproc_peer: OnceLock<(Weak<Conn>, Arc<AtomicBool>)>,
}

/// The state of a connection, under its lock.
pub struct ConnState {
    pub phase: Phase,
    /// The link to the peer, once there is one (set up by `qp.rs`, or by a dialer's HELLO:
    /// [`Accept`] below).
    pub link: Option<Link>,
    /// Acceptor: a dialer's link that arrived before `connect` named its peer.
    pub parked: Option<(Link, u32, u64)>,
    pub remote: Option<Remote>,
    req: Requester,
    resp: Responder,
    rx: Rx,
    tx: Tx,
    live: Liveness,
    /// Error state: the WR that failed, with its status.
    fail_at: Option<(u32, WcStatus)>,
    /// Error state: a WQE consumed by a half-received WRITE_WITH_IMM, to complete `Flushed`.
    recv_flush: bool,
}

impl ConnState {
    fn new(max_send_wr: u32, max_inline: usize) -> ConnState {
        ConnState {
            phase: Phase::Created,
            link: None,
            parked: None,
            remote: None,
            req: Requester::new(max_send_wr, max_inline),
            resp: Responder::new(),
            rx: Rx::new(),
            tx: Tx::new(),
            live: Liveness::new(),
            fail_at: None,
            recv_flush: false,
        }
    }

    pub fn is_error(&self) -> bool {
        matches!(self.phase, Phase::Error)
    }

    /// Whether requests wait on the peer (posted and not yet executed).
    fn waiting_on_peer(&self) -> bool {
        self.req.oldest_unacked().is_some() && matches!(self.phase, Phase::Ready)
    }

    /// The silent-peer bound (see `liveness.rs`).
    pub fn bound(&self) -> std::time::Duration {
        self.live.bound()
    }

    pub fn set_bound(&mut self, bound: std::time::Duration) {
        self.live.set_bound(bound);
    }

    /// Dialer: the HELLO goes first on the new link.
    pub fn queue_hello(&mut self, hello: Frame) {
        self.tx.push_ctl(Ctl::Hello(hello));
    }

    /// Whether bytes wait for room in the socket.
    pub fn wants_write(&self) -> bool {
        self.tx.pending() || self.req.next_unsent().is_some()
    }

    /// Whether the helper should revisit this connection on a timer even without socket
    /// events: it waits for an SRQ WQE or for CQ room, which no socket event announces.
    pub fn needs_timer(&self) -> bool {
        matches!(self.phase, Phase::Ready) && self.rx.stalled()
    }

    /// [`Requester::enqueue`], out of line and called with the state: the in-process post
    /// calls it only when a WR must wait, and a call with a pointer into the state makes
    /// the compiler compute that pointer on the usual way too.
    #[inline(never)]
    fn enqueue(&mut self, mrs: &super::mr::MrTable, chain: &[SendWr]) {
        self.req.enqueue(mrs, chain);
    }

    /// [`Requester::push_executed`], out of line for the same reason as [`Self::enqueue`].
    #[cold]
    #[inline(never)]
    fn push_executed(&mut self, wr: &SendWr) {
        self.req.push_executed(wr);
    }

    /// The peer's end when the connection is idle: nothing queued, the peer there and
    /// connected. (`Ready` also means nothing to flush: `recv_flush` is set only on the way
    /// to the error state.)
    #[inline(always)]
    fn idle_end(&self) -> Option<&DirectEnd> {
        match &self.link {
            Some(Link::Direct(e)) if self.req.idle() && matches!(self.phase, Phase::Ready) && e.state() == READY => {
                debug_assert!(!self.recv_flush);
                Some(e)
            }
            _ => None,
        }
    }
}

impl Conn {
    /// A connection for QP `ep` on `port` (in-process mode when the port has no TCP side),
    /// to be attached to its CQ's list `attached`.
    pub fn new(ep: Endpoint, nonce: u64, port: Arc<Port<Conn>>, attached: Arc<Attached<Conn>>, caps: QpCaps) -> Conn {
        Conn {
            ep,
            nonce,
            inproc: port.net.is_none(),
            port,
            attached,
            st: Mutex::new(ConnState::new(caps.max_send_wr, caps.max_inline as usize)),
            caller_epoch: Default::default(),
            work: Default::default(),
            inproc_peer: OnceLock::new(),
        }
    }

    pub fn qp_num(&self) -> u32 {
        self.ep.qp_num
    }

    /// TCP: the helper's epoll set.
    fn watcher(&self) -> Option<&Watcher<Conn>> {
        self.port.net.as_ref().map(|n| &n.watcher)
    }

    /// Validates and queues a chain; nothing is queued when it fails.
    pub fn post(&self, st: &mut ConnState, chain: &[SendWr]) -> Result<()> {
        st.req.check_chain(matches!(st.phase, Phase::Created), chain, self.ep.qp_num)?;
        st.req.enqueue(&self.ep.mrs, chain);
        Ok(())
    }

    /// The connection is established on `link`.
    pub fn attach(self: &Arc<Self>, st: &mut ConnState, mut link: Link) {
        if let (Some(w), Link::Tcp(t)) = (self.watcher(), &mut link) {
            t.set_user_timeout(st.live.bound());
            let (token, added) = w.add(self, self.caller_epoch.load(Ordering::Relaxed), t.raw_fd(), true);
            if let Err(e) = added {
                log::warn!(
                    "soft fabric: QP {}: epoll_ctl ADD failed ({e}); served by its callers only",
                    self.ep.qp_num
                );
            }
            t.token = Some(token);
            t.out_armed = true;
        }
        if let Link::Direct(end) = &link {
            end.set_ready();
        }
        st.link = Some(link);
        st.phase = Phase::Ready;
    }

    /// One progress step: read and execute what arrived, send what is queued, retire what
    /// completed. Returns whether anything moved.
    pub fn progress(&self, st: &mut ConnState, by_caller: bool) -> bool {
        if self.inproc {
            return self.progress_inproc(st);
        }
        if by_caller {
            self.caller_epoch.fetch_add(1, Ordering::Relaxed);
        }
        let mut moved = false;
        if matches!(st.phase, Phase::Ready) {
            moved |= self.pump_rx(st);
            if !st.is_error() {
                moved |= self.flush_tx(st);
            }
            if by_caller {
                self.want_write(st);
            }
            if moved {
                st.live.moved();
            } else if st.waiting_on_peer()
                && let Some(why) = st.live.idle()
            {
                self.fail_link(st, &why);
            }
        }
        moved |= self.retire(st);
        moved
    }

    /// Runs the receive half; applies what it reports.
    fn pump_rx(&self, st: &mut ConnState) -> bool {
        let ConnState { link, req, resp, rx, tx, .. } = st;
        match rx.pump(&mut RxEnv { ep: &self.ep, link: link.as_ref(), req, resp, tx }) {
            Ok(step) => {
                if step.send_now {
                    // An RNR notice: out at once, and not counted as the peer moving.
                    self.flush_tx(st);
                }
                step.moved
            }
            Err(fault) => {
                self.apply(st, fault);
                true
            }
        }
    }

    /// Runs the send half; applies what it reports.
    fn flush_tx(&self, st: &mut ConnState) -> bool {
        let dst_qpn = st.remote.map_or(0, |r| r.qpn);
        let ConnState { link, req, resp, tx, .. } = st;
        match tx.flush(&mut TxEnv { mrs: &self.ep.mrs, link: link.as_ref(), req, resp, dst_qpn }) {
            Ok(moved) => moved,
            Err(fault) => {
                self.apply(st, fault);
                true
            }
        }
    }

    /// A caller's step left bytes waiting for room in the socket: let the helper finish
    /// sending should callers stop (armed once per helper visit, so a busy caller pays one
    /// `epoll_ctl`, not one a poll).
    fn want_write(&self, st: &mut ConnState) {
        let ConnState { link, tx, req, .. } = st;
        if let (Some(w), Some(Link::Tcp(t))) = (self.watcher(), link.as_mut())
            && !t.out_armed
            && (tx.pending() || req.next_unsent().is_some())
            && let Some(token) = t.token
        {
            w.rearm(t.raw_fd(), token, true);
            t.out_armed = true;
        }
    }

    /// Moves the QP to the error state for `fault`.
    fn apply(&self, st: &mut ConnState, fault: Fault) {
        match fault {
            Fault::PeerLost(why) => self.fail_link(st, &why),
            Fault::Qp { at, why } => self.fail(st, at, &why),
        }
    }

    /// The peer is gone (closed, reset, silent): the oldest WR waiting on it fails with
    /// `RetryExceeded` (what a NIC reports when acknowledgements stop), the rest flush.
    pub fn fail_link(&self, st: &mut ConnState, why: &str) {
        let at = st.req.oldest_unacked().map(|seq| (seq, WcStatus::RetryExceeded));
        self.fail(st, at, why);
    }

    /// Moves the QP to the error state: `at` fails with its status, every other WR not
    /// yet completed flushes, the link is closed so the peer learns of it.
    pub fn fail(&self, st: &mut ConnState, at: Option<(u32, WcStatus)>, why: &str) {
        if st.is_error() {
            return;
        }
        log::warn!("soft fabric: QP {} to error state: {why}", self.ep.qp_num);
        st.phase = Phase::Error;
        st.fail_at = at;
        st.recv_flush = st.rx.wqe_taken();
        st.rx.reset();
        st.tx.reset();
        st.req.clear_reads();
        self.close_link(st);
        st.parked = None;
        self.retire(st);
    }

    /// Closes the link (the peer sees EOF, or the in-process peer its end closed) and takes
    /// its socket out of the helper's set first.
    pub fn close_link(&self, st: &mut ConnState) {
        if let Some(link) = st.link.take() {
            link.shutdown();
            if let (Some(fd), Some(w)) = (link.fd(), self.watcher()) {
                w.forget(fd);
            }
        }
    }

    /// Completes finished WRs in order (and, in the error state, flushes the rest) while
    /// the CQ has room.
    pub fn retire(&self, st: &mut ConnState) -> bool {
        if st.req.idle() && !st.recv_flush {
            return false;
        }
        let mut ring = self.ep.cq.lock();
        if st.recv_flush {
            let c = Completion {
                status: WcStatus::Flushed,
                opcode: WcOpcode::RecvRdmaWithImm,
                qp_num: self.ep.qp_num,
                ..Completion::default()
            };
            if !ring.push(c) {
                return false;
            }
            st.recv_flush = false;
        }
        let failed = st.is_error().then_some(st.fail_at);
        st.req.retire(&mut ring, self.ep.qp_num, failed)
    }

    // In-process mode (see `direct.rs`).

    /// `post_send` in in-process mode: a connection with nothing queued executes the chain
    /// as it is, with no copy into the send queue; whatever must wait, fails, or cannot
    /// complete into a full CQ is queued (from that WR on) and goes the queued way.
    #[inline]
    pub fn post_inproc(&self, st: &mut ConnState, chain: &[SendWr]) -> Result<()> {
        // The usual post (every protocol post): one WRITE or WRITE_WITH_IMM of at most one
        // SGE on an idle connection. Idle means `Ready` with nothing queued, so of
        // `check_chain`'s checks only the WR's own remain (`lean_len`); a WR that fails
        // them takes the general way below, which refuses it with the precise error.
        if let [wr] = chain
            && let Some(end) = st.idle_end()
            && let Some(len) = direct::lean_len(wr, st.req.max_inline())
        {
            if direct::write_now(&self.ep.mrs, end, wr, len) {
                if self.retire_now(st, wr, len) {
                    return Ok(());
                }
            } else {
                // It waits or fails: the queued way decides, with its checks and messages.
                st.enqueue(&self.ep.mrs, chain);
            }
            self.progress_inproc(st);
            return Ok(());
        }
        self.post_inproc_chain(st, chain)
    }

    /// [`Self::post_inproc`] of any chain.
    #[inline(never)]
    fn post_inproc_chain(&self, st: &mut ConnState, chain: &[SendWr]) -> Result<()> {
        st.req.check_chain(matches!(st.phase, Phase::Created), chain, self.ep.qp_num)?;
        let mut k = 0;
        if st.idle_end().is_some() {
            while k < chain.len() && st.req.idle() && self.run_now(st, &chain[k]) {
                k += 1;
            }
        }
        if k < chain.len() {
            st.req.enqueue(&self.ep.mrs, &chain[k..]);
        }
        if !st.req.idle() {
            self.progress_inproc(st);
        }
        Ok(())
    }

    /// Executes `wr` of a chain being posted and completes it. `false`: it was not executed
    /// (it waits or fails: the queued way decides, with its checks and messages).
    fn run_now(&self, st: &mut ConnState, wr: &SendWr) -> bool {
        let Some(Link::Direct(end)) = &st.link else { return false };
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
    fn retire_now(&self, st: &mut ConnState, wr: &SendWr, len: u64) -> bool {
        if !wr.signaled {
            return true;
        }
        let c = Completion {
            wr_id: wr.wr_id,
            opcode: if wr.opcode == WrOpcode::Read { WcOpcode::RdmaRead } else { WcOpcode::RdmaWrite },
            byte_len: len as u32,
            qp_num: self.ep.qp_num,
            ..Completion::default()
        };
        if !self.ep.cq.lock().push(c) {
            st.push_executed(wr);
            return false;
        }
        true
    }

    /// One step of an in-process connection: notice a closed peer, execute what is queued,
    /// retire what completed. Returns whether anything moved.
    pub fn progress_inproc(&self, st: &mut ConnState) -> bool {
        let mut moved = false;
        if matches!(st.phase, Phase::Ready)
            && let Some(Link::Direct(end)) = &st.link
        {
            let state = end.state();
            if state & CLOSED != 0 {
                self.fail_link(st, "the peer closed the connection");
                moved = true;
            } else if state & READY != 0 {
                moved |= self.execute(st);
            }
        }
        moved |= self.retire(st);
        let work = !st.req.idle() || st.recv_flush;
        // Stored only when it changes: the flag is read by both sides' polls, and a WR
        // that waits is stepped at every poll.
        if self.work.load(Ordering::Relaxed) != work {
            self.work.store(work, Ordering::Release);
        }
        if work {
            // Polls of this side's CQ and of the peer's step this connection again.
            self.ep.cq.raise_work();
            if let Some(Link::Direct(end)) = &st.link {
                end.peer().cq.raise_work();
            }
        }
        moved
    }

    /// Executes queued WRs in order until one must wait or fails.
    fn execute(&self, st: &mut ConnState) -> bool {
        let ConnState { link: Some(Link::Direct(end)), req, resp, .. } = st else { return false };
        match direct::execute(req, resp, &self.ep.mrs, end) {
            Ok(moved) => moved,
            Err(fault) => {
                self.apply(st, fault);
                true
            }
        }
    }
}

impl Accept for Conn {
    fn nonce(&self) -> u64 {
        self.nonce
    }

    /// A dialer's link: parked until `connect` names the peer, attached if it is the peer
    /// this QP waits for, refused otherwise.
    fn accept(self: &Arc<Self>, link: Link, src_qpn: u32, src_nonce: u64) -> bool {
        let mut st = self.st.lock();
        match st.phase {
            Phase::Created => st.parked = Some((link, src_qpn, src_nonce)),
            Phase::Waiting { .. } if st.remote.is_some_and(|r| r.qpn == src_qpn && r.nonce == src_nonce) => {
                self.attach(&mut st, link)
            }
            _ => return false,
        }
        true
    }
}
