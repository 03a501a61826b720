//! One QP's connection: the state machine that makes a TCP link (shared with the device's
//! other QPs to the same peer device) or an in-process peer behave as an RC queue pair.
//! Shared (`Arc<Conn>`) by the QP handle (posting), its CQ (polling), its link (frames in and
//! out) and, in TCP mode, the device's helper thread.
//!
//! The state is made of parts that each own their rules: the requester (send queue,
//! completions in order), the responder (request order, refusals, placement), the receive
//! and send sides of the QP on its link, the transport ([`Wire`]: a link, or an in-process
//! peer). The parts never reach into each other or into the connection: they take the parts
//! they need and report a [`Fault`] when the QP must go to the error state. This file wires
//! them: posting, retiring, the error state, and in-process progress; the QP's part on its
//! link is `station.rs`.
//!
//! Locks: a TCP connection's state is locked only while its link's lock is held (link
//! first), so a link's receive and send paths, which lock the QPs they serve, never wait on
//! a thread that holds a QP and wants the link.

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, OnceLock, Weak};
use std::time::{Duration, Instant};

use super::direct;
use super::endpoint::{Attached, Endpoint};
use super::fault::Fault;
use super::hook::Hook;
use super::link::Link;
use super::port::Port;
use super::qp_recv::QpRx;
use super::qp_send::QpTx;
use super::requester::Requester;
use super::responder::Responder;
use super::spin::SpinMutex;
use super::transport::{CLOSED, DirectEnd, READY};
use crate::error::Result;
use crate::fabric::{Completion, QpCaps, SendWr, WcOpcode, WcStatus, WrOpcode};

/// Where a connection is in its life.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Phase {
    /// Created; `connect` not called yet.
    Created,
    /// `connect` called: waiting for the peer QP's CONNECT (TCP) or for the peer to
    /// connect (in-process); fails at the deadline.
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
    /// The peer device's identity (its links' key).
    pub dev: u64,
}

/// A CONNECT that came before `connect` named the peer: from QP `qpn` (`nonce`) on `link`.
pub struct Parked {
    pub link: Arc<Link<Conn>>,
    pub qpn: u32,
    pub nonce: u64,
}

/// Most CONNECTs parked on one QP (a peer that knows the QP's nonce can send more, but
/// not crowd out the one `connect` names beyond this).
pub const MAX_PARKED: usize = 4;

/// What carries a connection's WRs. An explicit tag (`u8`): `Some(Wire::Direct(_))`, what
/// every in-process post checks, is then one byte comparison (without it, the compiler
/// told `Tcp` from `Direct` by a null niche in `DirectEnd`: a second load and test).
#[repr(u8)]
pub enum Wire {
    /// The link to the peer's device (TCP).
    Tcp(Arc<Link<Conn>>),
    /// In-process mode: no stream, WRs execute directly (see `direct.rs`).
    Direct(DirectEnd),
}

/// A connection (one QP).
pub struct Conn {
    /// This side: QP number, registrations, CQ, SRQ.
    pub ep: Endpoint,
    /// A random u64 that names the QP (a CONNECT quotes it; in-process QPs are found by it).
    pub nonce: u64,
    /// The device's port: QP table, listener, links.
    pub port: Arc<Port<Conn>>,
    /// The connections attached to this QP's CQ (the QP detaches itself when dropped).
    pub attached: Arc<Attached<Conn>>,
    /// The state; the TCP path takes it under its link's lock (see the module docs).
    pub st: SpinMutex<ConnState>,
    /// In-process mode (no stream: WRs execute directly, see `direct.rs`).
    pub inproc: bool,
    /// In-process mode: set while WRs wait to execute or retire, or once the peer closed;
    /// a poll steps only connections (and peers) with this set.
    pub work: Arc<AtomicBool>,
    /// In-process mode: the peer's connection and its `work` flag, stepped from this side's
    /// polls (its WRs may wait on this side's SRQ or CQ).
    pub inproc_peer: OnceLock<(Weak<Conn>, Arc<AtomicBool>)>,
    /// In-process mode: the size limits of the lean post ([`direct::lean_caps`]).
    lean_caps: [u64; 2],
}

/// The state of a connection, under its lock.
pub struct ConnState {
    pub phase: Phase,
    /// What carries the WRs, once `connect` chose it (TCP: `None` again while a waiting QP
    /// looks for a new link after its link broke).
    pub wire: Option<Wire>,
    /// TCP: CONNECTs that arrived before `connect` named the peer.
    pub parked: Vec<Parked>,
    /// In-process: the dialer's end, when it connected before `connect` named it.
    pub direct_parked: Option<(DirectEnd, u32, u64)>,
    pub remote: Option<Remote>,
    pub req: Requester,
    pub resp: Responder,
    pub rx: QpRx,
    pub tx: QpTx,
    /// Error state: the WR that failed, with its status.
    pub fail_at: Option<(u32, WcStatus)>,
    /// How long a silent peer is given (from `ConnectParams`).
    pub bound: Duration,
    /// Frames for this QP dropped in the error state (TCP; what a fault hook's test reads).
    pub dropped_late: u64,
}

impl ConnState {
    fn new(max_send_wr: u32, max_inline: usize) -> ConnState {
        ConnState {
            phase: Phase::Created,
            wire: None,
            parked: Vec::new(),
            direct_parked: None,
            remote: None,
            req: Requester::new(max_send_wr, max_inline),
            resp: Responder::new(),
            rx: QpRx::default(),
            tx: QpTx::default(),
            fail_at: None,
            bound: Duration::from_secs(30),
            dropped_late: 0,
        }
    }

    pub fn is_error(&self) -> bool {
        matches!(self.phase, Phase::Error)
    }

    /// TCP: whether requests wait on the peer for an answer (its silence then counts; not
    /// while a fault hook holds them, `hook.rs`).
    pub fn waiting(&self) -> bool {
        matches!(self.phase, Phase::Ready) && self.req.waiting() && self.tx.hook != Hook::Hold
    }

    /// The connection's link, if it is on one.
    pub fn link(&self) -> Option<&Arc<Link<Conn>>> {
        match &self.wire {
            Some(Wire::Tcp(l)) => Some(l),
            _ => None,
        }
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

    /// The peer's end when the connection is idle: `Ready`, nothing queued, the peer there
    /// and connected. (A direct wire is there exactly while the phase is `Ready`: set
    /// together when the connection is made, the wire let go when the QP fails or drops; so
    /// the phase needs no check of its own.)
    #[inline(always)]
    fn idle_end(&self) -> Option<&DirectEnd> {
        match &self.wire {
            Some(Wire::Direct(e)) if self.req.idle() && e.state() == READY => {
                debug_assert!(matches!(self.phase, Phase::Ready));
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
            st: SpinMutex::new(ConnState::new(caps.max_send_wr, caps.max_inline as usize)),
            work: Default::default(),
            inproc_peer: OnceLock::new(),
            lean_caps: direct::lean_caps(caps.max_inline as usize),
        }
    }

    pub fn qp_num(&self) -> u32 {
        self.ep.qp_num
    }

    /// Validates and queues a chain; nothing is queued when it fails.
    pub fn post(&self, st: &mut ConnState, chain: &[SendWr]) -> Result<()> {
        st.req.check_chain(matches!(st.phase, Phase::Created), chain, self.ep.qp_num)?;
        st.req.enqueue(&self.ep.mrs, chain);
        Ok(())
    }

    /// In-process mode: the connection is established on `end`.
    pub fn attach_direct(&self, st: &mut ConnState, end: DirectEnd) {
        end.set_ready();
        st.wire = Some(Wire::Direct(end));
        st.phase = Phase::Ready;
    }

    /// In-process mode: moves the QP to the error state for `fault`.
    fn apply_inproc(&self, st: &mut ConnState, fault: Fault) {
        let Fault::Qp { at, why } = fault;
        self.fail(st, at, &why, true);
    }

    /// Moves the QP to the error state: `at` fails with its status, every other WR not
    /// yet completed flushes, the transport is let go so the peer learns of it (TCP: the
    /// caller sends the CLOSE, `station.rs`). `loud`: work was lost (a warning, else a debug
    /// line: an orderly close is not a warning).
    pub fn fail(&self, st: &mut ConnState, at: Option<(u32, WcStatus)>, why: &str, loud: bool) {
        if st.is_error() {
            return;
        }
        if loud {
            let qpn = self.ep.qp_num;
            self.port.warn.qp.warn(|| format!("soft fabric: QP {qpn} to error state: {why}"));
        } else {
            log::debug!("soft fabric: QP {} to error state: {why}", self.ep.qp_num);
        }
        st.phase = Phase::Error;
        st.fail_at = at;
        if st.rx.take_wqe() {
            // Its CQ slot was reserved with the WQE: the Flushed completion has room.
            let c = Completion {
                status: WcStatus::Flushed,
                opcode: WcOpcode::RecvRdmaWithImm,
                qp_num: self.ep.qp_num,
                ..Completion::default()
            };
            self.ep.cq.lock().push_reserved(c);
        }
        st.req.clear_reads();
        if matches!(st.wire, Some(Wire::Direct(_))) {
            // The in-process peer sees its end closed.
            st.wire = None;
        }
        self.retire(st);
    }

    /// Completes finished WRs in order (and, in the error state, flushes the rest) while
    /// the CQ has room; a TCP connection whose completions found the CQ full is retired
    /// again by the CQ's polls.
    pub fn retire(&self, st: &mut ConnState) -> bool {
        if st.req.idle() {
            return false;
        }
        let mut ring = self.ep.cq.lock();
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
        let Some(Wire::Direct(end)) = &st.wire else { return false };
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
            && let Some(Wire::Direct(end)) = &st.wire
        {
            let state = end.state();
            if state & CLOSED != 0 {
                let loud = !st.req.idle();
                self.fail(
                    st,
                    st.req.oldest_unacked().map(|s| (s, WcStatus::RetryExceeded)),
                    "the peer closed the connection",
                    loud,
                );
                moved = true;
            } else if state & READY != 0 {
                moved |= self.execute(st);
            }
        }
        moved |= self.retire(st);
        let work = !st.req.idle();
        // Stored only when it changes: the flag is read by both sides' polls, and a WR
        // that waits is stepped at every poll.
        if self.work.load(Ordering::Relaxed) != work {
            self.work.store(work, Ordering::Release);
        }
        if work {
            // Polls of this side's CQ and of the peer's step this connection again.
            self.ep.cq.raise_work();
            if let Some(Wire::Direct(end)) = &st.wire {
                end.peer().cq.raise_work();
            }
        }
        moved
    }

    /// Executes queued WRs in order until one must wait or fails.
    fn execute(&self, st: &mut ConnState) -> bool {
        let ConnState { wire: Some(Wire::Direct(end)), req, resp, .. } = st else { return false };
        match direct::execute(req, resp, &self.ep.mrs, end) {
            Ok(moved) => moved,
            Err(fault) => {
                self.apply_inproc(st, fault);
                true
            }
        }
    }
}
