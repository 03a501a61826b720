//! Re-admission of a failed rail: the steps both engines take, as transitions of the
//! failover state (DESIGN.md "Rail failover", Re-admission). The sender owns rail health:
//! it alone posts data, so it alone decides when a failed rail is tried again, and a single
//! owner cannot race itself. After the rail's fence was settled it waits a back-off
//! (`MPIB_READMIT_MS`, doubling per failed attempt up to `MPIB_READMIT_MAX_MS`, back to the
//! start once the rail stayed Up for [`READMIT_RESET_NS`]), then: new QPs
//! ([`Action::RebuildQps`] → [`Event::QpsBuilt`]), `Rebuild{rail, epoch + 1, records}` over
//! the surviving rail (out of band in an outage), the receiver's new QPs and its
//! `Rebuilt{rail, epoch + 1, records}`, [`Action::ConnectQps`] → [`Event::QpsConnected`] on
//! both sides, probe WRITEs on the new QPs; when they completed the rail is Up at
//! `epoch + 1`. Anything that fails on the way fails the attempt (the rail fails at the new
//! epoch, the receiver fences and reports as for any failure) and the next one waits longer.
//!
//! What only an engine holds stays there (`engine/{send,recv}/readmit.rs`): the probe WRs
//! (its region's addresses and keys), its telemetry, failing a rail.
//!
//! [`Event::QpsBuilt`]: crate::engine::Event::QpsBuilt
//! [`Event::QpsConnected`]: crate::engine::Event::QpsConnected

use super::{CtlKind, CtlMsg, Failover, READMIT_ATTEMPT_NS, READMIT_RESET_NS, other};
use crate::engine::{Action, CtlMemory, Output, QpRecords, RAIL_NAMES, RAILS, RailState, Side};

/// What a rail's due re-admission work came to ([`Failover::readmit_step`]).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum ReadmitStep {
    /// Nothing more for the engine (a message written, or nothing due).
    Done,
    /// The new QPs are connected: the engine posts its probes for `epoch` on them.
    Probe { epoch: u32 },
}

impl Failover {
    /// When the sender's next re-admission step is due: an attempt to start after its
    /// back-off; at once while one is under way (its steps come from the peer and the
    /// fabric, which only a round looks at). `u64::MAX`: none.
    pub(crate) fn readmit_timer_ns(&self) -> u64 {
        (0..RAILS)
            .filter_map(|r| match self.state[r] {
                RailState::Failed { fenced: true, .. } if self.cfg.readmit_ns != 0 => Some(self.readmit_at[r]),
                RailState::Rebuilding { .. } | RailState::Probing { .. } => Some(0),
                _ => None,
            })
            .min()
            .unwrap_or(u64::MAX)
    }

    /// The sender's attempt on `rail` at `now`: one whose back-off ran out starts (new QPs
    /// asked for in `out`) when its `Rebuild` can go out — over the other rail, or out of
    /// band in an outage; whether one under way ran out of time (it has failed).
    pub(crate) fn start_or_expire_attempt(&mut self, rail: usize, now: u64, out: &mut Output) -> bool {
        let due = now >= self.readmit_at[rail];
        match self.state[rail] {
            RailState::Failed { epoch, fenced: true }
                if due && (self.state[other(rail)] == RailState::Up || self.outage_ns != 0) =>
            {
                self.state[rail] = RailState::Rebuilding { epoch: epoch + 1 };
                self.readmit_at[rail] = now + READMIT_ATTEMPT_NS;
                out.actions.push(Action::RebuildQps { rail });
                false
            }
            RailState::Rebuilding { .. } | RailState::Probing { .. } if due => {
                log::debug!("send: re-admission of the {} rail timed out", RAIL_NAMES[rail]);
                true
            }
            _ => false,
        }
    }

    /// The re-admission work due on `rail` (it is in `readmit_due`) for `side`: the
    /// sender's `Rebuild` or the receiver's `Rebuilt` (then its connect) written, or the
    /// probes the engine is to post once the new QPs are connected.
    pub(crate) fn readmit_step(
        &mut self,
        side: Side,
        rail: usize,
        mem: &mut impl CtlMemory,
        out: &mut Output,
    ) -> ReadmitStep {
        match (side, self.state[rail]) {
            (Side::Send, RailState::Rebuilding { epoch }) if self.epoch[rail] != epoch => {
                let msg = CtlMsg::new(CtlKind::Rebuild, rail, epoch).with_records(&self.records[rail]);
                if self.send_ctl(&msg, rail, mem, out) {
                    // From here on the rail's messages are about the new epoch.
                    self.epoch[rail] = epoch;
                    self.readmit_due = self.readmit_due.without(rail);
                }
            }
            (Side::Receive, RailState::Rebuilding { epoch }) => {
                let msg = CtlMsg::new(CtlKind::Rebuilt, rail, epoch).with_records(&self.records[rail]);
                if self.send_ctl(&msg, rail, mem, out) {
                    self.state[rail] = RailState::Probing { epoch };
                    self.readmit_due = self.readmit_due.without(rail);
                    self.connect_wait = self.connect_wait.with(rail);
                    out.actions.push(Action::ConnectQps { rail, records: self.peer_records[rail] });
                }
            }
            (_, RailState::Probing { epoch }) => {
                self.readmit_due = self.readmit_due.without(rail);
                return ReadmitStep::Probe { epoch };
            }
            _ => self.readmit_due = self.readmit_due.without(rail),
        }
        ReadmitStep::Done
    }

    /// [`Event::QpsBuilt`](crate::engine::Event::QpsBuilt) for `side`: the new QPs'
    /// records are kept, the `Rebuild` (sender, before it was written) or the `Rebuilt`
    /// (receiver) goes out at the next poll.
    pub(crate) fn on_qps_built(&mut self, side: Side, rail: usize, records: QpRecords) {
        let building = match (side, self.state[rail]) {
            (Side::Send, RailState::Rebuilding { epoch }) => self.epoch[rail] != epoch,
            (Side::Receive, RailState::Rebuilding { .. }) => true,
            _ => false,
        };
        if building {
            self.records[rail] = records;
            self.readmit_due = self.readmit_due.with(rail);
        }
    }

    /// The sender's `Rebuild` (at the receiver): build new QPs of the rail, unless the
    /// message is stale (of another epoch, or for a rail that is not failed and reported).
    pub(crate) fn on_rebuild(&mut self, m: &CtlMsg, out: &mut Output) {
        let rail = m.rail as usize;
        match self.state[rail] {
            RailState::Failed { epoch, fenced: true } if m.epoch == epoch.wrapping_add(1) => {
                self.epoch[rail] = m.epoch;
                self.state[rail] = RailState::Rebuilding { epoch: m.epoch };
                self.peer_records[rail] = m.records();
                out.actions.push(Action::RebuildQps { rail });
            }
            _ => log::debug!("recv: stale Rebuild of the {} rail (epoch {}) ignored", RAIL_NAMES[rail], m.epoch),
        }
    }

    /// The receiver's `Rebuilt` (at the sender): connect to its new QPs. One of another
    /// epoch or for a rail not being rebuilt is ignored (a late answer to an attempt given
    /// up).
    pub(crate) fn on_rebuilt(&mut self, m: &CtlMsg, out: &mut Output) {
        let rail = m.rail as usize;
        if self.state[rail] != (RailState::Rebuilding { epoch: m.epoch }) || self.epoch[rail] != m.epoch {
            return;
        }
        self.state[rail] = RailState::Probing { epoch: m.epoch };
        self.connect_wait = self.connect_wait.with(rail);
        out.actions.push(Action::ConnectQps { rail, records: m.records() });
    }

    /// A re-admission probe completed (`tag`: its epoch's); whether it was the attempt's
    /// last, which makes the rail Up again (the engine then calls [`Self::rail_back_up`]).
    pub(crate) fn readmit_probe_done(&mut self, rail: usize, tag: usize) -> bool {
        if !self.probing(rail, tag) || self.probes_out[rail] == 0 {
            return false; // of an attempt given up
        }
        self.probes_out[rail] -= 1;
        self.probes_out[rail] == 0
    }

    /// The rail is Up again at its new epoch (at `now`). When that ends an outage: how long
    /// it lasted, and the next round is due at once (what waited goes out again).
    pub(crate) fn rail_back_up(&mut self, rail: usize, now: u64) -> Option<u64> {
        self.state[rail] = RailState::Up;
        self.down_warned_ns[rail] = 0;
        self.up_since_ns[rail] = now.max(1);
        // New QPs, a new path: not judged by its silence before it completed something.
        self.heard_ns[rail] = 0;
        self.readmissions += 1;
        let took = self.leave_outage(now)?;
        self.timer_ns = 0;
        Some(took)
    }

    /// An attempt whose `Rebuild` was not written yet (the receiver knows nothing) goes
    /// back to Failed at the old epoch; whether it was one. `retry_ns`: the next attempt
    /// that long from now (a port down: not a failed attempt), else after the back-off
    /// grown (a failed attempt).
    pub(crate) fn unstarted_attempt_back(&mut self, rail: usize, retry_ns: Option<u64>) -> bool {
        let RailState::Rebuilding { epoch } = self.state[rail] else { return false };
        if self.epoch[rail] == epoch {
            return false;
        }
        self.state[rail] = RailState::Failed { epoch: self.epoch[rail], fenced: true };
        self.readmit_due = self.readmit_due.without(rail);
        match retry_ns {
            Some(ns) => self.readmit_at[rail] = self.now_ns + ns,
            None => {
                self.readmit_failures += 1;
                self.schedule_readmit(rail);
            }
        }
        true
    }

    /// The rail's fence is settled: the sender's next attempt after the back-off.
    pub(crate) fn schedule_readmit(&mut self, rail: usize) {
        let (base, max) = (self.cfg.readmit_ns, self.cfg.readmit_max_ns.max(self.cfg.readmit_ns));
        if base == 0 {
            return;
        }
        let now = self.now_ns;
        let up = std::mem::take(&mut self.up_since_ns[rail]);
        let b = &mut self.backoff_ns[rail];
        if *b == 0 || (up != 0 && now.saturating_sub(up) >= READMIT_RESET_NS) {
            *b = base;
        }
        self.readmit_at[rail] = now + *b;
        log::debug!("send: {} rail: re-admission attempt in {} ms", RAIL_NAMES[rail], *b / 1_000_000);
        *b = (*b * 2).min(max);
    }
}
