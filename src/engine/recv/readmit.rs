//! The receiver's side of re-admission (the steps are `engine/failover/readmit.rs`'s): the
//! sender decides when, the receiver follows; its probe is one keepalive on the new CTS QP,
//! and when that completed CTS writes and keepalives use the rail again. A failure on the
//! way fails the rail at the new epoch as any failure does (fence, then `Fenced`), which
//! tells the sender that the attempt failed.

use super::RecvEngine;
use crate::engine::failover::{Failover, ReadmitStep};
use crate::engine::layout::RecvMemory;
use crate::engine::{CtlMemory, DownReason, Output, RAIL_NAMES, RailState, Side, WrKind};
use crate::error::Result;

impl RecvEngine {
    /// [`Event::ReadmitFailed`]: the rail fails at its new epoch (fence, then `Fenced`).
    ///
    /// [`Event::ReadmitFailed`]: crate::engine::Event::ReadmitFailed
    pub(super) fn readmit_failed(&mut self, rail: usize) -> Result<()> {
        match self.fo.state[rail] {
            RailState::Rebuilding { .. } | RailState::Probing { .. } => self.rail_down(rail, DownReason::Port),
            _ => Ok(()),
        }
    }

    /// Re-admission work of one poll: `Rebuilt` to write (then connect), keepalives to post.
    pub(super) fn poll_readmit(&mut self, mem: &mut (impl RecvMemory + CtlMemory), out: &mut Output) {
        for rail in self.fo.readmit_due.iter() {
            let ReadmitStep::Probe { epoch } = self.fo.readmit_step(Side::Receive, rail, mem, out) else { continue };
            self.post_scratch_write(rail, WrKind::ReadmitProbe.id(rail, Failover::probe_tag(epoch)), out);
            self.fo.probes_out[rail] = 1;
        }
    }

    /// The keepalive on the rebuilt rail completed: the rail is Up here again.
    pub(super) fn on_readmit_probe(&mut self, rail: usize, tag: usize) {
        if !self.fo.readmit_probe_done(rail, tag) {
            return;
        }
        let outage = self.fo.rail_back_up(rail, self.fo.now_ns);
        self.fo.live_rails = self.fo.live_rails.with(rail);
        self.stats[rail].count_readmission();
        log::info!(
            "recv: {} rail re-admitted (epoch {}): CTS writes use it again",
            RAIL_NAMES[rail],
            self.fo.epoch[rail]
        );
        if let Some(took) = outage {
            // The CTS writes lost meanwhile go out again (`repost_cts`).
            log::warn!(
                "recv: the connection is back on the {} rail after {} ms without a working rail",
                RAIL_NAMES[rail],
                took / 1_000_000
            );
        }
    }
}
