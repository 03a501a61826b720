//! One QP's connection: the state machine that makes a byte stream behave as an RC queue
//! pair. Shared (`Arc<Conn>`) by the QP handle (posting), its CQ (polling) and the device's
//! helper thread; whoever holds `st` makes progress. The receive half is in `rx.rs`, the
//! send half in `tx.rs`; this file holds the state, posting, retiring and the error state.
//!
//! Sequence numbers are send-queue positions: the n-th WR ever posted on a QP is request
//! `seq == n` (wrapping `u32`), so `head ≤ tx_done ≤ sent ≤ tail` are all request numbers
//! and `acked` says every request below it was executed by the peer.

use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, OnceLock, Weak};
use std::time::{Duration, Instant};

use parking_lot::Mutex;

use super::cq::{CqShared, SrqShared};
use super::device::DevShared;
use super::frame::{Frame, MAX_MSG, NakCode};
use super::link::Link;
use super::rx::Rx;
use super::tx::{Ctl, Tx};
use crate::error::{Error, Result};
use crate::fabric::{Access, Completion, SendWr, WcOpcode, WcStatus, WrOpcode};

/// Most READs a requester has outstanding (verbs' `max_rd_atomic`).
pub const MAX_RD_ATOMIC: usize = 16;

/// `a < b` in wrapping sequence space.
pub fn seq_lt(a: u32, b: u32) -> bool {
    (a.wrapping_sub(b) as i32) < 0
}

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

pub struct SqEntry {
    pub wr: SendWr,
    /// The local memory of the WR failed its check at post time (inline copy).
    pub bad_local: bool,
    /// READ: the response was placed.
    pub read_done: bool,
}

/// A connection (one QP).
pub struct Conn {
    pub qp_num: u32,
    pub nonce: u64,
    pub dev: Arc<DevShared>,
    pub cq: Arc<CqShared>,
    pub srq: Option<Arc<SrqShared>>,
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

pub struct ConnState {
    pub phase: Phase,
    pub link: Option<Link>,
    /// Acceptor: a dialer's link that arrived before `connect` named its peer.
    pub parked: Option<(Link, u32, u64)>,
    pub remote: Option<Remote>,
    // Requester.
    pub sq: Box<[SqEntry]>,
    pub inline: Box<[u8]>,
    pub max_inline: usize,
    pub head: u32,
    pub tx_done: u32,
    pub sent: u32,
    pub tail: u32,
    pub acked: u32,
    /// Transmitted READs still waiting for their response, oldest first.
    pub reads: [u32; MAX_RD_ATOMIC],
    pub reads_len: usize,
    pub reads_head: usize,
    // Responder.
    pub expect_seq: u32,
    /// A NAK was sent: later requests are read and dropped, never executed.
    pub discarding: bool,
    pub rx: Rx,
    pub tx: Tx,
    // Error state: the WR that failed, with its status; a consumed SRQ WQE to flush.
    pub fail_at: Option<(u32, WcStatus)>,
    pub recv_flush: bool,
    // Liveness: an error when requests wait on a peer that moves no byte for `bound`.
    pub bound: Duration,
    pub idle_since: Option<Instant>,
    /// The socket's token in the helper's epoll set, and whether `EPOLLOUT` is armed.
    pub helper_token: Option<usize>,
    pub out_armed: bool,
    /// In-process mode: the WR whose receiver-not-ready wait was counted.
    pub direct_rnr: Option<u32>,
}

impl ConnState {
    pub fn new(max_send_wr: u32, max_inline: usize) -> ConnState {
        let cap = max_send_wr.max(1) as usize;
        ConnState {
            phase: Phase::Created,
            link: None,
            parked: None,
            remote: None,
            sq: (0..cap).map(|_| SqEntry { wr: SendWr::default(), bad_local: false, read_done: false }).collect(),
            inline: vec![0; cap * max_inline].into_boxed_slice(),
            max_inline,
            head: 0,
            tx_done: 0,
            sent: 0,
            tail: 0,
            acked: 0,
            reads: [0; MAX_RD_ATOMIC],
            reads_len: 0,
            reads_head: 0,
            expect_seq: 0,
            discarding: false,
            rx: Rx::new(),
            tx: Tx::new(),
            fail_at: None,
            recv_flush: false,
            bound: Duration::from_secs(30),
            idle_since: None,
            helper_token: None,
            out_armed: false,
            direct_rnr: None,
        }
    }

    pub fn cap(&self) -> u32 {
        self.sq.len() as u32
    }

    pub fn entry(&self, seq: u32) -> &SqEntry {
        &self.sq[(seq % self.cap()) as usize]
    }

    pub fn entry_mut(&mut self, seq: u32) -> &mut SqEntry {
        let cap = self.cap();
        &mut self.sq[(seq % cap) as usize]
    }

    pub fn is_error(&self) -> bool {
        matches!(self.phase, Phase::Error)
    }

    /// Whether requests wait on the peer (posted and not yet executed).
    pub fn waiting_on_peer(&self) -> bool {
        seq_lt(self.acked, self.tail) && matches!(self.phase, Phase::Ready)
    }

    pub fn push_ctl(&mut self, c: Ctl) -> bool {
        self.tx.push_ctl(c)
    }
}

impl Conn {
    /// Validates and queues a chain; nothing is queued when it fails.
    pub fn post(&self, st: &mut ConnState, chain: &[SendWr]) -> Result<()> {
        self.check_chain(st, chain)?;
        self.enqueue(st, chain);
        Ok(())
    }

    /// What `post_send` refuses: before `connect`, a full send queue, a malformed WR.
    #[inline]
    pub fn check_chain(&self, st: &ConnState, chain: &[SendWr]) -> Result<()> {
        let free = st.cap() - st.tail.wrapping_sub(st.head);
        let mut ok = !matches!(st.phase, Phase::Created) && chain.len() as u64 <= free as u64;
        for wr in chain {
            let n = wr.num_sge as usize;
            // SGE lengths are u32: two of them never overflow a u64.
            let bytes = wr.sge[0].len as u64 * (n > 0) as u64 + wr.sge[1].len as u64 * (n > 1) as u64;
            ok &= n <= crate::fabric::MAX_SGE
                && bytes <= MAX_MSG as u64
                && (!wr.inline || (bytes as usize <= st.max_inline && wr.opcode != WrOpcode::Read));
        }
        if ok { Ok(()) } else { Err(self.chain_error(st, chain)) }
    }

    /// Why [`Self::check_chain`] refused `chain`: the first problem, precisely.
    #[cold]
    fn chain_error(&self, st: &ConnState, chain: &[SendWr]) -> Error {
        if matches!(st.phase, Phase::Created) {
            return Error::invalid_usage(format!("QP {}: post_send before connect", self.qp_num));
        }
        let free = st.cap() - st.tail.wrapping_sub(st.head);
        if chain.len() as u64 > free as u64 {
            return Error::invalid_usage(format!(
                "QP {}: send queue full ({} WRs posted, room for {free} of the chain of {})",
                self.qp_num,
                st.cap() - free,
                chain.len()
            ));
        }
        for wr in chain {
            if wr.num_sge as usize > crate::fabric::MAX_SGE {
                return Error::invalid_argument(format!("QP {}: WR with {} SGEs", self.qp_num, wr.num_sge));
            }
            let bytes = wr.bytes();
            if bytes > MAX_MSG as u64 {
                return Error::invalid_argument(format!("QP {}: WR of {bytes} bytes", self.qp_num));
            }
            if wr.inline && (bytes as usize > st.max_inline || wr.opcode == WrOpcode::Read) {
                return Error::invalid_argument(format!(
                    "QP {}: inline {:?} of {} bytes (max_inline {})",
                    self.qp_num, wr.opcode, bytes, st.max_inline
                ));
            }
        }
        Error::internal(format!("QP {}: chain refused for no reason found", self.qp_num))
    }

    /// Queues a checked chain (inline payloads are copied now).
    pub fn enqueue(&self, st: &mut ConnState, chain: &[SendWr]) {
        for wr in chain {
            let seq = st.tail;
            let mut bad_local = false;
            if wr.inline {
                let at = (seq % st.cap()) as usize * st.max_inline;
                let mut off = at;
                for sge in &wr.sge[..wr.num_sge as usize] {
                    match self.dev.mrs.pin_range(sge.lkey, sge.addr, sge.len as u64, Access::empty()) {
                        Some(_pin) => {
                            // SAFETY: the range lies inside a registration pinned for this
                            // copy; the destination is this QP's inline slot for `seq`.
                            unsafe {
                                std::ptr::copy_nonoverlapping(
                                    sge.addr as *const u8,
                                    st.inline.as_mut_ptr().add(off),
                                    sge.len as usize,
                                )
                            };
                            off += sge.len as usize;
                        }
                        None => bad_local = true,
                    }
                }
            }
            *st.entry_mut(seq) = SqEntry { wr: *wr, bad_local, read_done: false };
            st.tail = seq.wrapping_add(1);
        }
    }

    /// One progress step: read and execute what arrived, send what is queued, retire what
    /// completed. Returns whether anything moved.
    pub fn progress(&self, st: &mut ConnState, by_caller: bool) -> bool {
        if self.inproc {
            return self.direct_progress(st);
        }
        if by_caller {
            self.caller_epoch.fetch_add(1, Ordering::Relaxed);
        }
        let mut moved = false;
        if matches!(st.phase, Phase::Ready) {
            moved |= self.pump_rx(st);
            moved |= self.flush_tx(st);
            if by_caller && !st.out_armed && Conn::wants_write(st) {
                // The socket is full: let the helper finish sending should callers stop
                // (once per helper visit, so a busy caller pays one epoll_ctl, not one a poll).
                self.dev.helper_want_write(st);
            }
            if moved {
                st.idle_since = None;
            } else if st.waiting_on_peer() {
                self.check_liveness(st);
            }
        }
        moved |= self.retire(st);
        moved
    }

    fn check_liveness(&self, st: &mut ConnState) {
        let now = Instant::now();
        match st.idle_since {
            None => st.idle_since = Some(now),
            Some(t) if now.duration_since(t) > st.bound => {
                let msg = format!("no byte from the peer for {:?} with requests outstanding", st.bound);
                self.fail_link(st, &msg);
            }
            Some(_) => {}
        }
    }

    /// The peer is gone (closed, reset, silent): the oldest WR waiting on it fails with
    /// `RetryExceeded` (what a NIC reports when acknowledgements stop), the rest flush.
    pub fn fail_link(&self, st: &mut ConnState, why: &str) {
        let at = seq_lt(st.acked, st.tail).then_some((st.acked, WcStatus::RetryExceeded));
        self.fail(st, at, why);
    }

    /// Moves the QP to the error state: `at` fails with its status, every other WR not
    /// yet completed flushes, the stream is closed so the peer learns of it.
    pub fn fail(&self, st: &mut ConnState, at: Option<(u32, WcStatus)>, why: &str) {
        if st.is_error() {
            return;
        }
        log::warn!("soft fabric: QP {} to error state: {why}", self.qp_num);
        st.phase = Phase::Error;
        st.fail_at = at;
        st.recv_flush = st.rx.wqe_taken();
        st.rx.reset();
        st.tx.reset();
        st.reads_len = 0;
        if let Some(link) = st.link.take() {
            link.shutdown();
            if let Some(fd) = link.fd() {
                self.dev.helper_forget(fd);
            }
        }
        st.parked = None;
        self.retire(st);
    }

    /// Completes finished WRs in order (and, in the error state, flushes the rest) while
    /// the CQ has room.
    pub fn retire(&self, st: &mut ConnState) -> bool {
        let error = st.is_error();
        if st.head == st.tail && !st.recv_flush {
            return false;
        }
        let mut ring = self.cq.lock();
        let mut moved = false;
        if st.recv_flush {
            let c = Completion {
                status: WcStatus::Flushed,
                opcode: WcOpcode::RecvRdmaWithImm,
                qp_num: self.qp_num,
                ..Completion::default()
            };
            if !ring.push(c) {
                return false;
            }
            st.recv_flush = false;
        }
        while st.head != st.tail {
            let seq = st.head;
            let e = st.entry(seq);
            let done = match e.wr.opcode {
                WrOpcode::Read => e.read_done,
                _ => seq_lt(seq, st.acked),
            };
            let status = match st.fail_at {
                _ if done => WcStatus::Success,
                Some((s, status)) if error && s == seq => status,
                _ if error => WcStatus::Flushed,
                _ => break,
            };
            if e.wr.signaled || status != WcStatus::Success {
                let opcode = if e.wr.opcode == WrOpcode::Read { WcOpcode::RdmaRead } else { WcOpcode::RdmaWrite };
                let c = Completion {
                    wr_id: e.wr.wr_id,
                    status,
                    opcode,
                    byte_len: e.wr.bytes() as u32,
                    qp_num: self.qp_num,
                    ..Completion::default()
                };
                if !ring.push(c) {
                    break;
                }
            }
            st.head = seq.wrapping_add(1);
            moved = true;
        }
        moved
    }

    /// The frame header of request `seq` (`len` and `imm` from its WR).
    pub fn request_header(&self, st: &ConnState, seq: u32) -> Frame {
        let wr = &st.entry(seq).wr;
        let dst_qpn = st.remote.map_or(0, |r| r.qpn);
        let len = wr.bytes() as u32;
        match wr.opcode {
            WrOpcode::Write => Frame::Write { dst_qpn, seq, addr: wr.remote_addr, rkey: wr.rkey, len, imm: None },
            WrOpcode::WriteImm => {
                Frame::Write { dst_qpn, seq, addr: wr.remote_addr, rkey: wr.rkey, len, imm: Some(wr.imm) }
            }
            WrOpcode::Read => Frame::ReadReq { dst_qpn, seq, addr: wr.remote_addr, rkey: wr.rkey, len },
        }
    }

    /// The status a requester reports for a responder's refusal.
    pub fn nak_status(code: NakCode) -> WcStatus {
        match code {
            NakCode::RemoteAccess => WcStatus::RemoteAccessError,
            NakCode::InvalidRequest => WcStatus::RemoteOpError,
        }
    }

    /// Whether the helper should revisit this connection on a timer even without socket
    /// events: it waits for an SRQ WQE or for CQ room, which no socket event announces.
    pub fn needs_timer(st: &ConnState) -> bool {
        matches!(st.phase, Phase::Ready) && st.rx.stalled()
    }

    /// Whether bytes wait for room in the socket.
    pub fn wants_write(st: &ConnState) -> bool {
        st.tx.pending() || st.sent != st.tail
    }
}
