//! What the receiver does on its own schedule, behind [`RecvEngine::poll_timeout`]: the
//! keepalive of a receiver waiting in silence, and, with failover, fences, reports, CTS
//! re-posts, the sender's control messages and re-admission steps. The plugin calls
//! [`RecvEngine::handle_timeout`] from a call that waits when the time it names has come,
//! or when the sender wrote a control message ([`RecvEngine::control_waiting`]).

use super::RecvEngine;
use crate::engine::actions::Output;
use crate::engine::layout::RecvMemory;
use crate::engine::{CtlMemory, KEEPALIVE_NS, RAILS, RailMask, SOUT, WrKind};
use crate::error::Result;

impl RecvEngine {
    /// The earliest time (ns) at which [`Self::handle_timeout`] has work: a keepalive due
    /// (0 right after activity: the quiet period starts at the next look), a failover step
    /// (0: at once). `u64::MAX`: nothing scheduled. Read by calls that wait only: the
    /// receiver's data path reads no clock.
    #[inline]
    pub fn poll_timeout(&self) -> u64 {
        let keepalive = if self.outstanding == 0 || self.keepalive.is_some() || self.error.is_set() {
            u64::MAX
        } else if self.active {
            0
        } else {
            self.quiet_since_ns.saturating_add(KEEPALIVE_NS)
        };
        keepalive.min(self.fo.timer_ns)
    }

    /// Runs what is due at `now_ns` (see the module doc); chains and actions go into `out`
    /// (the plugin posts, performs and answers with [`Self::handle_event`]). After the
    /// connection failed nothing more is posted, and nothing is reported here.
    pub fn handle_timeout(
        &mut self,
        now_ns: u64,
        mem: &mut (impl RecvMemory + CtlMemory),
        out: &mut Output,
    ) -> Result<()> {
        if self.error.is_set() {
            self.fo.timer_ns = u64::MAX;
            return Ok(());
        }
        self.fo.now_ns = now_ns;
        self.fo.stamp_outage(now_ns);
        self.poll_keepalive(now_ns, out);
        let r = self.poll_failover(mem, out);
        self.watch_hang(now_ns, out);
        self.fo.timer_ns = if self.failover_due() { 0 } else { self.hang.next_ns.min(self.fo.outage_deadline()) };
        r
    }

    /// Whether failover work waits to be emitted whatever the time (a fence, a report, a
    /// CTS re-post, a re-admission step): a caller that never waits (its receives are done
    /// when it tests them) runs a round for it every few `irecv`s.
    #[inline]
    pub fn has_work(&self) -> bool {
        self.fo.timer_ns == 0
    }

    /// Whether the sender wrote a control message not yet read (one load, one compare):
    /// the plugin checks it where a call waits (and every few `irecv`s), and then calls
    /// [`Self::handle_timeout`]. Failover off: never.
    #[inline]
    pub fn control_waiting(&self, mem: &impl CtlMemory) -> bool {
        self.fo.cfg.enabled && self.fo.ctl.waiting(mem)
    }

    /// Whether a control message that came out of band waits (the plugin runs a round
    /// after the one that read it; tests ask).
    pub fn oob_waiting(&self) -> bool {
        self.fo.ctl.has_oob()
    }

    /// While receives wait and nothing has completed for [`KEEPALIVE_NS`](crate::engine::KEEPALIVE_NS),
    /// a tiny signalled WRITE to the sender's scratch word (alternating rails, one at a time):
    /// RC gives a receiver whose sender died no completion at all, the keepalive fails.
    ///
    /// The silence is timed from the first call after the last activity (a receive posted,
    /// a completion), not from the activity itself: the data path records activity as a
    /// flag, without reading the clock. A caller that waits calls this at once (NCCL polls
    /// `test` in a loop), so the period starts within one poll of the activity.
    pub(crate) fn poll_keepalive(&mut self, now_ns: u64, out: &mut Output) {
        if std::mem::take(&mut self.active) {
            self.quiet_since_ns = now_ns;
        }
        if self.error.is_set() || self.outstanding == 0 || self.keepalive.is_some() {
            return;
        }
        if now_ns.saturating_sub(self.quiet_since_ns) < crate::engine::KEEPALIVE_NS {
            return;
        }
        let rails = self.fo.live_rails;
        let rail = if rails == RailMask::BOTH {
            (self.keepalives % RAILS as u64) as usize
        } else {
            rails.first().unwrap_or(SOUT)
        };
        self.post_scratch_write(rail, WrKind::Probe.id(rail, 0), out);
        self.keepalive = Some(rail);
        self.keepalives += 1;
        self.quiet_since_ns = now_ns;
    }

    /// A keepalive: the scratch WRITE of `recv_path::scratch_write` on `rail`.
    fn post_scratch_write(&mut self, rail: usize, wr_id: u64, out: &mut Output) {
        crate::engine::recv_path::scratch_write(&self.cfg, &self.stats, rail, wr_id, out);
    }
}
