//! The receiver's side of re-admission (DESIGN.md "Rail failover", Re-admission). The
//! sender decides when; the receiver follows: on the sender's
//! `Rebuild{rail, epoch + 1, records}` for a rail it has fenced and reported at `epoch`, it
//! builds new QPs of that rail ([`Action::RebuildQps`] → [`Event::QpsBuilt`]), answers
//! `Rebuilt{rail, epoch + 1, records}`, connects them to the sender's
//! ([`Action::ConnectQps`] → [`Event::QpsConnected`]) and posts one keepalive on the new
//! CTS QP; when it completed the rail is Up here again: CTS writes and keepalives use it.
//! A failure on the way fails the rail at the new epoch as any failure does (fence, then
//! `Fenced`), which tells the sender that the attempt failed.

use super::RecvEngine;
use crate::engine::failover::{CtlKind, CtlMsg, Failover};
use crate::engine::layout::RecvMemory;
use crate::engine::{Action, CtlMemory, DownReason, Output, QpRecords, QpRef, RAIL_NAMES, RailState, WrKind};
use crate::error::Result;
use crate::fabric::{SendWr, Sge, WrOpcode};

impl RecvEngine {
    /// The sender's `Rebuild`: build new QPs of the rail, unless the message is stale (of
    /// another epoch, or for a rail that is not failed and reported here).
    pub(super) fn on_rebuild(&mut self, m: &CtlMsg, out: &mut Output) {
        let rail = m.rail as usize;
        match self.fo.state[rail] {
            RailState::Failed { epoch, fenced: true } if m.epoch == epoch.wrapping_add(1) => {
                self.fo.epoch[rail] = m.epoch;
                self.fo.state[rail] = RailState::Rebuilding { epoch: m.epoch };
                self.fo.peer_records[rail] = m.records();
                out.actions.push(Action::RebuildQps { rail });
            }
            _ => log::debug!("recv: stale Rebuild of the {} rail (epoch {}) ignored", RAIL_NAMES[rail], m.epoch),
        }
    }

    /// [`Event::QpsBuilt`]: `Rebuilt` is written and the QPs connected at the next poll.
    pub(super) fn on_qps_built(&mut self, rail: usize, records: QpRecords) {
        if matches!(self.fo.state[rail], RailState::Rebuilding { .. }) {
            self.fo.records[rail] = records;
            self.fo.readmit_due = self.fo.readmit_due.with(rail);
        }
    }

    /// [`Event::ReadmitFailed`]: the rail fails at its new epoch (fence, then `Fenced`).
    pub(super) fn readmit_failed(&mut self, rail: usize) -> Result<()> {
        match self.fo.state[rail] {
            RailState::Rebuilding { .. } | RailState::Probing { .. } => self.rail_down(rail, DownReason::Port),
            _ => Ok(()),
        }
    }

    /// Re-admission work of one poll: `Rebuilt` to write (then connect), keepalives to post.
    pub(super) fn poll_readmit(&mut self, mem: &mut (impl RecvMemory + CtlMemory), out: &mut Output) {
        for rail in self.fo.readmit_due.iter() {
            match self.fo.state[rail] {
                RailState::Rebuilding { epoch } => {
                    let msg = CtlMsg::new(CtlKind::Rebuilt, rail, epoch).with_records(&self.fo.records[rail]);
                    if self.fo.send_ctl(&msg, rail, mem, out) {
                        self.fo.state[rail] = RailState::Probing { epoch };
                        self.fo.readmit_due = self.fo.readmit_due.without(rail);
                        self.fo.connect_wait = self.fo.connect_wait.with(rail);
                        out.actions.push(Action::ConnectQps { rail, records: self.fo.peer_records[rail] });
                    }
                }
                RailState::Probing { epoch } => {
                    self.fo.readmit_due = self.fo.readmit_due.without(rail);
                    out.push(rail, QpRef::Cts).add(SendWr {
                        wr_id: WrKind::ReadmitProbe.id(rail, Failover::probe_tag(epoch)),
                        opcode: WrOpcode::Write,
                        signaled: true,
                        deferrable: false,
                        inline: self.cfg.max_inline >= 8,
                        num_sge: 1,
                        sge: [
                            Sge { addr: self.cfg.flush_addr, len: 8, lkey: self.cfg.flush_lkeys[rail] },
                            Sge::default(),
                        ],
                        remote_addr: self.cfg.scratch_addr,
                        rkey: self.cfg.scratch_rkeys[rail],
                        imm: 0,
                    });
                    self.stats[rail].count_post(1, 0, 0, 0);
                    self.stats[rail].counters.probes.add(1);
                    self.fo.probes_out[rail] = 1;
                }
                _ => self.fo.readmit_due = self.fo.readmit_due.without(rail),
            }
        }
    }

    /// The keepalive on the rebuilt rail completed: the rail is Up here again.
    pub(super) fn on_readmit_probe(&mut self, rail: usize, tag: usize) {
        if !self.fo.probing(rail, tag) || self.fo.probes_out[rail] == 0 {
            return; // of an attempt given up
        }
        self.fo.probes_out[rail] = 0;
        self.fo.state[rail] = RailState::Up;
        self.fo.down_warned_ns[rail] = 0;
        self.fo.readmissions += 1;
        self.fo.live_rails = self.fo.live_rails.with(rail);
        self.stats[rail].count_readmission();
        log::info!(
            "recv: {} rail re-admitted (epoch {}): CTS writes use it again",
            RAIL_NAMES[rail],
            self.fo.epoch[rail]
        );
        if let Some(took) = self.fo.leave_outage(self.fo.now_ns) {
            self.fo.timer_ns = 0; // the CTS writes lost meanwhile go out again (`repost_cts`)
            log::warn!(
                "recv: the connection is back on the {} rail after {} ms without a working rail",
                RAIL_NAMES[rail],
                took / 1_000_000
            );
        }
    }
}
