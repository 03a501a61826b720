//! Moving a QP to the error state on command: rail failover's fence (a quiet error state:
//! every WR not completed flushes) and the fault drill that imitates a lost link (the
//! oldest WR not acknowledged fails with `RetryExceeded`). Either way the responder drops
//! every later frame for the QP (`wire.rs` delivers frames only to a `Ready` QP; in-process,
//! the peer's end sees the link closed before it executes anything more) and the peer QP
//! is told (TCP: CLOSE with the error bit; in-process: the closed end), so both directions
//! of the QP are gone.

use std::sync::Arc;

use super::conn::Conn;
use crate::fabric::WcStatus;

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
}
