//! What the two kinds of connection (one QP each) share: the TCP connection
//! (`conn_tcp.rs`, on a link to the peer's device) and the in-process one (`conn_inproc.rs`,
//! WRs executed against the peer at post time). Both keep, under their lock, a [`Core`]:
//! where the QP is in its life, its peer, its requester (send queue, completions in order)
//! and responder (request order, refusals), and the error state's first failure. The parts
//! never reach into each other or into the connection: they take the parts they need and
//! report a [`Fault`](super::fault::Fault) when the QP must go to the error state.

use std::time::{Duration, Instant};

use super::endpoint::Endpoint;
use super::logs::Limited;
use super::requester::Requester;
use super::responder::Responder;
use crate::error::{Error, Result};
use crate::fabric::{QpCaps, SendWr, WcStatus};

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

/// The state both kinds of connection keep under their lock.
pub struct Core {
    pub phase: Phase,
    pub remote: Option<Remote>,
    pub req: Requester,
    pub resp: Responder,
    /// Error state: the WR that failed, with its status.
    pub fail_at: Option<(u32, WcStatus)>,
    /// How long a silent peer is given (from `ConnectParams`).
    pub bound: Duration,
}

impl Core {
    pub fn new(caps: &QpCaps) -> Core {
        Core {
            phase: Phase::Created,
            remote: None,
            req: Requester::new(caps.max_send_wr, caps.max_inline as usize),
            resp: Responder::default(),
            fail_at: None,
            bound: Duration::from_secs(30),
        }
    }

    pub fn is_error(&self) -> bool {
        matches!(self.phase, Phase::Error)
    }

    pub fn is_ready(&self) -> bool {
        matches!(self.phase, Phase::Ready)
    }

    /// `connect` to `r`, which is given `bound` when silent: only once.
    pub fn connect(&mut self, qpn: u32, r: Remote, bound: Duration) -> Result<()> {
        if !matches!(self.phase, Phase::Created) {
            crate::bail!(InvalidUsage, "soft fabric QP {qpn}: connect called twice");
        }
        self.remote = Some(r);
        self.bound = bound;
        Ok(())
    }

    /// `is_ready` as the phase says: `Ok(None)` ready, `Ok(Some(deadline))` waiting for the
    /// peer until `deadline`.
    pub fn readiness(&self, qpn: u32) -> Result<Option<Instant>> {
        match self.phase {
            Phase::Ready => Ok(None),
            Phase::Error => Err(Error::remote(format!("soft fabric QP {qpn}: in the error state"))),
            Phase::Created => Err(Error::invalid_usage(format!("soft fabric QP {qpn}: is_ready before connect"))),
            Phase::Waiting { deadline } => Ok(Some(deadline)),
        }
    }

    /// The oldest WR waiting on the peer, failed with `status` (a peer lost or gone).
    pub fn oldest(&self, status: WcStatus) -> Option<(u32, WcStatus)> {
        self.req.oldest_unacked().map(|s| (s, status))
    }

    /// Validates and queues a chain; nothing is queued when it fails.
    pub fn post(&mut self, ep: &Endpoint, chain: &[SendWr]) -> Result<()> {
        self.req.check_chain(matches!(self.phase, Phase::Created), chain, ep.qp_num)?;
        self.req.enqueue(&ep.mrs, chain);
        Ok(())
    }

    /// Moves the QP to the error state: `at` fails with its status, every other WR not yet
    /// completed flushes (as the CQ has room). `loud`: work was lost (a warning on `warn`,
    /// else a debug line: an orderly close is not a warning). `false`: it was in the error
    /// state already.
    pub fn fail(&mut self, ep: &Endpoint, warn: &Limited, at: Option<(u32, WcStatus)>, why: &str, loud: bool) -> bool {
        if self.is_error() {
            return false;
        }
        let qpn = ep.qp_num;
        if loud {
            warn.warn(|| format!("soft fabric: QP {qpn} to error state: {why}"));
        } else {
            log::debug!("soft fabric: QP {qpn} to error state: {why}");
        }
        self.phase = Phase::Error;
        self.fail_at = at;
        self.req.clear_reads();
        self.retire(ep);
        true
    }

    /// Completes finished WRs in order (and, in the error state, flushes the rest) while
    /// the CQ has room.
    pub fn retire(&mut self, ep: &Endpoint) -> bool {
        if self.req.idle() {
            return false;
        }
        let failed = self.is_error().then_some(self.fail_at);
        self.req.retire(&mut ep.cq.lock(), ep.qp_num, failed)
    }
}

/// Why a QP waiting for its peer failed at its deadline.
pub fn not_connected(timeout: Duration) -> String {
    format!("the peer did not connect within {timeout:?}")
}
