//! What the sender's failover (`engine/failover/`) gets of the hot path: borrows of the
//! posted slots, the requests they complete, the chains in flight per rail, the rails'
//! telemetry and the connection's settings. Failover runs in its own rounds and on failed
//! completions; a view made there costs the posting path nothing.

use super::config::SendConfig;
use super::slots::{PostedSlot, ReqState, SendReq};
use crate::engine::layout::SLOTS;
use crate::engine::place::At;
use crate::engine::{ErrorState, QpRef, RAILS};
use crate::telemetry::RailTelemetry;

/// The sender's hot-path state, borrowed for one failover step.
pub(crate) struct SendPath<'a> {
    pub(crate) cfg: &'a SendConfig,
    pub(crate) slots: &'a mut [PostedSlot; SLOTS],
    pub(crate) outstanding: &'a mut [u32; RAILS],
    pub(crate) tel: &'a mut [RailTelemetry; RAILS],
    pub(crate) error: &'a mut ErrorState,
    /// The next idle-probe check (a re-admitted rail is looked at again at once).
    pub(crate) probe_check_ns: &'a mut u64,
    pub(crate) reqs: &'a mut [SendReq],
    pub(crate) pending: &'a mut u32,
    pub(crate) rr: &'a mut [u16; RAILS],
}

impl SendPath<'_> {
    /// Every send of `slot` is complete.
    pub(crate) fn complete_slot(&mut self, slot: usize) {
        complete(&self.slots[slot], self.reqs, self.pending);
    }

    /// The next data QP of `rail` (round robin, shared with the posting path).
    pub(crate) fn next_qp(&mut self, rail: usize) -> QpRef {
        next_qp(self.rr, &self.cfg.qps, rail)
    }

    /// ` [the place of rail]`, for the end of a log line.
    pub(crate) fn at(&self, rail: usize) -> At<'_> {
        self.error.place.at(rail)
    }

    /// A rail's failure is a warning while NCCL waits on the connection; with nothing of
    /// NCCL's outstanding (a peer that closed after its last receive looks the same to a
    /// probe) it is information, and the next call that needs the peer reports it.
    pub(crate) fn failure_level(&self) -> log::Level {
        if nccl_waits(self.reqs) { log::Level::Warn } else { log::Level::Info }
    }
}

/// Marks the sends of a completed slot done.
#[inline]
pub(crate) fn complete(s: &PostedSlot, reqs: &mut [SendReq], pending: &mut u32) {
    for &id in &s.reqs[..s.n as usize] {
        reqs[id as usize].state = ReqState::Done;
    }
    *pending -= s.n as u32;
}

/// The next data QP of `rail` of `qps`, round robin from `rr`.
#[inline]
pub(crate) fn next_qp(rr: &mut [u16; RAILS], qps: &[u16; RAILS], rail: usize) -> QpRef {
    let qp = rr[rail];
    // Kept below the QP count: no division per post.
    rr[rail] = if qp + 1 >= qps[rail] { 0 } else { qp + 1 };
    QpRef::Data(qp)
}

/// Whether a send NCCL posted is not complete yet: a failure now costs NCCL something
/// (a warning), where a failure with nothing posted (a peer that closed, seen through a
/// probe) is news only for the next call that needs the peer (information).
#[cold]
#[inline(never)]
fn nccl_waits(reqs: &[SendReq]) -> bool {
    reqs.iter().any(|r| r.state == ReqState::Pending)
}
