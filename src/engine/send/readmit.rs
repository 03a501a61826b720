//! The sender's side of re-admission (the steps are `engine/failover/readmit.rs`'s): its
//! attempts started and failed, its probes on the new data QPs, its telemetry restarted
//! when the rail is Up again.

use super::SendEngine;
use crate::engine::failover::{Failover, READMIT_PROBES, ReadmitStep};
use crate::engine::{CtlMemory, DownReason, Output, QpRef, RAIL_NAMES, RAILS, RailState, Side, WrKind};
use crate::error::Result;
use crate::fabric::{SendWr, Sge, WrOpcode};

impl SendEngine {
    /// When the sender's next failover round is due, even for a caller whose requests are
    /// all done: the next stall check, a re-admission attempt to start, a drill's drop;
    /// while an attempt is in progress (Rebuilding, Probing) or rail work is due, at once —
    /// its steps come from the peer (the `Rebuilt` in the control ring) and the fabric (the
    /// new QPs connected), which only a round looks at, so waiting for a timer would add it
    /// to every step. `u64::MAX`: none.
    pub(crate) fn failover_timer_ns(&self) -> u64 {
        if self.failover_due() || self.drill.as_ref().is_some_and(|d| d.due) {
            return 0;
        }
        let stall = if self.fo.cfg.enabled && self.fo.cfg.stall_ns != 0 { self.fo.stall_next_ns } else { u64::MAX };
        let stall = if self.fo.cfg.enabled { stall.min(self.fo.silence_next_ns) } else { stall };
        self.fo.readmit_timer_ns().min(stall).min(self.fo.outage_deadline())
    }

    /// Re-admission work of one failover poll: attempts to start or give up, `Rebuild`
    /// messages to write, probes to post.
    pub(super) fn poll_readmit(&mut self, now: u64, mem: &mut impl CtlMemory, out: &mut Output) -> Result<()> {
        if self.fo.cfg.readmit_ns == 0 {
            return Ok(());
        }
        for rail in 0..RAILS {
            if self.fo.start_or_expire_attempt(rail, now, out) {
                self.readmit_failed(rail)?;
            }
        }
        for rail in self.fo.readmit_due.iter() {
            if let ReadmitStep::Probe { epoch } = self.fo.readmit_step(Side::Send, rail, mem, out) {
                self.post_readmit_probes(rail, epoch, out);
            }
        }
        Ok(())
    }

    /// Signalled WRITEs into the receiver's scratch word, spread over the rail's new data
    /// QPs: [`READMIT_PROBES`], or one per QP where the rail has more, so that every QP data
    /// will take has carried a WRITE (on RoCE each QP may take a path of its own).
    fn post_readmit_probes(&mut self, rail: usize, epoch: u32, out: &mut Output) {
        let qps = self.cfg.qps[rail].max(1);
        let probes = READMIT_PROBES.max(qps.min(u8::MAX as u16) as u8);
        for k in 0..probes {
            let qp = QpRef::Data(k as u16 % qps);
            out.push(rail, qp).add(SendWr {
                wr_id: WrKind::ReadmitProbe.id(rail, Failover::probe_tag(epoch)),
                opcode: WrOpcode::Write,
                signaled: true,
                inline: self.cfg.max_inline >= 8,
                num_sge: 1,
                sge: [Sge { addr: self.cfg.sizes_addr, len: 8, lkey: self.cfg.sizes_lkeys[rail] }, Sge::default()],
                remote_addr: self.cfg.scratch_addr,
                rkey: self.cfg.scratch_rkeys[rail],
                ..SendWr::default()
            });
            self.tel[rail].stats().count_post(1, 0, 0, 0);
            self.tel[rail].stats().counters.probes.add(1);
        }
        self.fo.probes_out[rail] = probes;
    }

    /// A re-admission probe completed: the last one makes the rail Up again — the split
    /// and the probes use it from now on, its estimates start afresh.
    pub(super) fn on_readmit_probe(&mut self, rail: usize, tag: usize) {
        if !self.fo.readmit_probe_done(rail, tag) {
            return;
        }
        let now = self.fo.now_ns;
        let outage = self.fo.rail_back_up(rail, now);
        self.tel[rail].readmit(now);
        self.tel[rail].stats().count_readmission();
        self.probe_check_ns = 0;
        log::info!(
            "send: {} rail re-admitted (epoch {}, after {} failed attempts so far); the split uses it again",
            RAIL_NAMES[rail],
            self.fo.epoch[rail],
            self.fo.readmit_failures
        );
        if let Some(took) = outage {
            // What waited goes out at the next round: the replays (`replay_ready`), a held slot.
            log::warn!(
                "send: the connection is back on the {} rail after {} ms without a working rail; what waited is sent again",
                RAIL_NAMES[rail],
                took / 1_000_000
            );
        }
    }

    /// The current attempt failed (the plugin's word, a probe, the time bound). Before
    /// its `Rebuild` was written the receiver knows nothing: back to Failed at the old
    /// epoch, the next attempt after a longer back-off. After, the rail fails at the new
    /// epoch like any failure (fence, `RailDown`; the receiver's `Fenced` then schedules the
    /// next attempt).
    pub(super) fn readmit_failed(&mut self, rail: usize) -> Result<()> {
        if self.fo.unstarted_attempt_back(rail, None) {
            return Ok(());
        }
        match self.fo.state[rail] {
            RailState::Rebuilding { .. } | RailState::Probing { .. } => self.rail_down(rail, DownReason::Port),
            _ => Ok(()),
        }
    }

    /// [`Event::PortDown`]: the attempt never started (its `Rebuild` unwritten, the receiver
    /// knows nothing): Failed at the old epoch again, the next try `MPIB_READMIT_MS` from
    /// now; neither a failed attempt nor a longer back-off. Later (the `Rebuild` written),
    /// a failure like any other.
    ///
    /// [`Event::PortDown`]: crate::engine::Event::PortDown
    pub(super) fn readmit_deferred(&mut self, rail: usize) -> Result<()> {
        if self.fo.unstarted_attempt_back(rail, Some(self.fo.cfg.readmit_ns)) {
            return Ok(());
        }
        self.readmit_failed(rail)
    }
}
