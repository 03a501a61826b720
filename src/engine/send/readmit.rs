//! The sender's side of re-admission (DESIGN.md "Rail failover", Re-admission).
//! The sender owns rail health: it alone posts data, so it alone decides when a failed rail
//! is tried again, and a single owner cannot race itself. After the rail's fence was
//! settled it waits a back-off (`MPIB_READMIT_MS`, doubling per failed attempt up to
//! `MPIB_READMIT_MAX_MS`, back to the start once the rail stayed Up for
//! [`READMIT_RESET_NS`]), then: new QPs ([`Action::RebuildQps`] → [`Event::QpsBuilt`]),
//! `Rebuild{rail, epoch + 1, records}` over the surviving rail, the receiver's
//! `Rebuilt{rail, epoch + 1, records}`, [`Action::ConnectQps`] → [`Event::QpsConnected`],
//! probe WRITEs on the new data QPs ([`READMIT_PROBES`], at least one on each); when they
//! all completed the rail is Up at `epoch + 1`, its telemetry restarts and the split uses
//! it again. Anything that fails on the way fails the attempt (the rail fails at the new
//! epoch, the receiver fences and reports as for any failure) and the next one waits longer.

use super::SendEngine;
use crate::engine::failover::{CtlKind, CtlMsg, Failover, READMIT_ATTEMPT_NS, READMIT_PROBES, READMIT_RESET_NS, other};
use crate::engine::{Action, CtlMemory, DownReason, Output, QpRecords, QpRef, RAIL_NAMES, RAILS, RailState, WrKind};
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
        (0..RAILS)
            .filter_map(|r| match self.fo.state[r] {
                RailState::Failed { fenced: true, .. } if self.fo.cfg.readmit_ns != 0 => Some(self.fo.readmit_at[r]),
                RailState::Rebuilding { .. } | RailState::Probing { .. } => Some(0),
                _ => None,
            })
            .min()
            .unwrap_or(u64::MAX)
            .min(stall)
            .min(self.fo.outage_deadline())
    }

    /// Re-admission work of one failover poll: attempts to start or give up, `Rebuild`
    /// messages to write, probes to post.
    pub(super) fn poll_readmit(&mut self, now: u64, mem: &mut impl CtlMemory, out: &mut Output) -> Result<()> {
        if self.fo.cfg.readmit_ns == 0 {
            return Ok(());
        }
        for (rail, name) in RAIL_NAMES.iter().enumerate() {
            let due = now >= self.fo.readmit_at[rail];
            match self.fo.state[rail] {
                // The `Rebuild` goes over the other rail, or out of band in an outage.
                RailState::Failed { epoch, fenced: true }
                    if due && (self.fo.state[other(rail)] == RailState::Up || self.fo.outage_ns != 0) =>
                {
                    self.fo.state[rail] = RailState::Rebuilding { epoch: epoch + 1 };
                    self.fo.readmit_at[rail] = now + READMIT_ATTEMPT_NS;
                    out.actions.push(Action::RebuildQps { rail });
                }
                RailState::Rebuilding { .. } | RailState::Probing { .. } if due => {
                    log::debug!("send: re-admission of the {name} rail timed out");
                    self.readmit_failed(rail)?;
                }
                _ => {}
            }
        }
        for rail in self.fo.readmit_due.iter() {
            match self.fo.state[rail] {
                RailState::Rebuilding { epoch } if self.fo.epoch[rail] != epoch => {
                    let msg = CtlMsg::new(CtlKind::Rebuild, rail, epoch).with_records(&self.fo.records[rail]);
                    if self.fo.send_ctl(&msg, rail, mem, out) {
                        // From here on the rail's messages are about the new epoch.
                        self.fo.epoch[rail] = epoch;
                        self.fo.readmit_due = self.fo.readmit_due.without(rail);
                    }
                }
                RailState::Probing { epoch } => {
                    self.post_readmit_probes(rail, epoch, out);
                    self.fo.readmit_due = self.fo.readmit_due.without(rail);
                }
                _ => self.fo.readmit_due = self.fo.readmit_due.without(rail),
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

    /// [`Event::QpsBuilt`]: the `Rebuild` is written at the next poll.
    pub(super) fn on_qps_built(&mut self, rail: usize, records: QpRecords) {
        if matches!(self.fo.state[rail], RailState::Rebuilding { epoch } if self.fo.epoch[rail] != epoch) {
            self.fo.records[rail] = records;
            self.fo.readmit_due = self.fo.readmit_due.with(rail);
        }
    }

    /// The receiver's `Rebuilt`: connect to its new QPs. One of another epoch or for a
    /// rail not being rebuilt is ignored (a late answer to an attempt given up).
    pub(super) fn on_rebuilt(&mut self, m: &CtlMsg, out: &mut Output) {
        let rail = m.rail as usize;
        if self.fo.state[rail] != (RailState::Rebuilding { epoch: m.epoch }) || self.fo.epoch[rail] != m.epoch {
            return;
        }
        self.fo.state[rail] = RailState::Probing { epoch: m.epoch };
        self.fo.connect_wait = self.fo.connect_wait.with(rail);
        out.actions.push(Action::ConnectQps { rail, records: m.records() });
    }

    /// A re-admission probe completed: the last one makes the rail Up again.
    pub(super) fn on_readmit_probe(&mut self, rail: usize, tag: usize) {
        if !self.fo.probing(rail, tag) || self.fo.probes_out[rail] == 0 {
            return; // of an attempt given up
        }
        self.fo.probes_out[rail] -= 1;
        if self.fo.probes_out[rail] == 0 {
            self.rail_up(rail);
        }
    }

    /// The rail is Up again at its new epoch: the split and the probes use it from now on.
    #[cold]
    fn rail_up(&mut self, rail: usize) {
        let now = self.fo.now_ns;
        self.fo.state[rail] = RailState::Up;
        self.fo.down_warned_ns[rail] = 0;
        self.fo.up_since_ns[rail] = now.max(1);
        // New QPs, a new path: not judged by its silence before it completed something.
        self.fo.heard_ns[rail] = 0;
        self.fo.readmissions += 1;
        self.tel[rail].readmit(now);
        self.tel[rail].stats().count_readmission();
        self.probe_check_ns = 0;
        log::info!(
            "send: {} rail re-admitted (epoch {}, after {} failed attempts so far); the split uses it again",
            RAIL_NAMES[rail],
            self.fo.epoch[rail],
            self.fo.readmit_failures
        );
        if let Some(took) = self.fo.leave_outage(now) {
            // What waited goes out at the next round: the replays (`replay_ready`), a held slot.
            self.fo.timer_ns = 0;
            log::warn!(
                "send: the connection is back on the {} rail after {} ms without a working rail; what waited is sent again",
                RAIL_NAMES[rail],
                took / 1_000_000
            );
        }
    }

    /// The current attempt failed (the plugin's word, a probe, the time bound). Before
    /// its `Rebuild` was written the receiver knows nothing: back to Failed at the old
    /// epoch. After, the rail fails at the new epoch like any failure (fence, `RailDown`;
    /// the receiver's `Fenced` then schedules the next attempt).
    pub(super) fn readmit_failed(&mut self, rail: usize) -> Result<()> {
        match self.fo.state[rail] {
            RailState::Rebuilding { epoch } if self.fo.epoch[rail] != epoch => {
                self.fo.state[rail] = RailState::Failed { epoch: self.fo.epoch[rail], fenced: true };
                self.fo.readmit_due = self.fo.readmit_due.without(rail);
                self.fo.readmit_failures += 1;
                self.schedule_readmit(rail);
                Ok(())
            }
            RailState::Rebuilding { .. } | RailState::Probing { .. } => self.rail_down(rail, DownReason::Port),
            _ => Ok(()),
        }
    }

    /// [`Event::PortDown`]: the attempt never started (its `Rebuild` unwritten, the receiver
    /// knows nothing): Failed at the old epoch again, the next try `MPIB_READMIT_MS` from
    /// now; neither a failed attempt nor a longer back-off. Later (the `Rebuild` written),
    /// a failure like any other.
    pub(super) fn readmit_deferred(&mut self, rail: usize) -> Result<()> {
        match self.fo.state[rail] {
            RailState::Rebuilding { epoch } if self.fo.epoch[rail] != epoch => {
                self.fo.state[rail] = RailState::Failed { epoch: self.fo.epoch[rail], fenced: true };
                self.fo.readmit_due = self.fo.readmit_due.without(rail);
                self.fo.readmit_at[rail] = self.fo.now_ns + self.fo.cfg.readmit_ns;
                Ok(())
            }
            _ => self.readmit_failed(rail),
        }
    }

    /// The rail's fence is settled: the next attempt after the back-off.
    pub(super) fn schedule_readmit(&mut self, rail: usize) {
        let (base, max) = (self.fo.cfg.readmit_ns, self.fo.cfg.readmit_max_ns.max(self.fo.cfg.readmit_ns));
        if base == 0 {
            return;
        }
        let now = self.fo.now_ns;
        let up = std::mem::take(&mut self.fo.up_since_ns[rail]);
        let b = &mut self.fo.backoff_ns[rail];
        if *b == 0 || (up != 0 && now.saturating_sub(up) >= READMIT_RESET_NS) {
            *b = base;
        }
        self.fo.readmit_at[rail] = now + *b;
        log::debug!("send: {} rail: re-admission attempt in {} ms", RAIL_NAMES[rail], *b / 1_000_000);
        *b = (*b * 2).min(max);
    }
}
