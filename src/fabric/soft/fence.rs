//! Moving a QP to the error state on command: rail failover's fence (a quiet error state:
//! every WR not completed flushes) and the fault drill that imitates a lost link (the
//! oldest WR not acknowledged fails with `RetryExceeded`). Either way the responder drops
//! every later frame for the QP (`station.rs` delivers frames only to a `Ready` QP; in-process,
//! the peer's end sees the link closed before it executes anything more) and the peer QP
//! is told (TCP: CLOSE with the error bit; in-process: the closed end), so both directions
//! of the QP are gone. Also: arming a fault hook (`hook.rs`).

use std::sync::Arc;

use super::conn::Conn;
use super::hook::Hook;
use crate::fabric::{FaultKind, WcStatus};

impl Conn {
    /// To the error state now. `lost`: as a lost link would (the oldest WR not acknowledged
    /// fails with `RetryExceeded`, a warning); else every WR not completed flushes.
    pub fn to_error(self: &Arc<Self>, lost: bool, why: &str) {
        let link = if self.inproc { None } else { self.st.lock().link().cloned() };
        let Some(link) = link else {
            let mut st = self.st.lock();
            let at = if lost { st.req.oldest_unacked().map(|s| (s, WcStatus::RetryExceeded)) } else { None };
            self.fail(&mut st, at, why, lost);
            return;
        };
        // Link first, then the QP (the lock order of `conn.rs`): no frame of the link is
        // being delivered to this QP while it changes state.
        let mut ls = link.lock();
        {
            let mut st = self.st.lock();
            let w0 = st.waiting();
            let mut io = ls.io(&link);
            let at = if lost { st.req.oldest_unacked().map(|s| (s, WcStatus::RetryExceeded)) } else { None };
            self.fail_tcp(&mut st, &mut io, at, why, lost, true);
            self.settle(&mut st, &mut io, w0);
        }
        self.port.step_tx(&link, &mut ls);
    }

    /// Arms `kind` (not `LinkLoss`: [`Self::to_error`] with `lost` does that at once). `false`: in-process mode
    /// (no wire to lose a frame on).
    #[cold]
    pub fn arm(self: &Arc<Self>, kind: FaultKind) -> bool {
        let hook = match kind {
            FaultKind::LinkLoss => return false,
            FaultKind::DropImm => Hook::DropImm,
            FaultKind::DropAck => Hook::DropAck,
            FaultKind::HoldPastFence => Hook::Hold,
        };
        if self.inproc {
            return false;
        }
        let link = self.st.lock().link().cloned();
        let Some(link) = link else {
            // Not on a link (yet): nothing counts it as waiting.
            self.st.lock().tx.hook = hook;
            return true;
        };
        let mut ls = link.lock();
        let mut st = self.st.lock();
        let w0 = st.waiting();
        st.tx.hook = hook;
        self.settle(&mut st, &mut ls.io(&link), w0);
        true
    }
}
