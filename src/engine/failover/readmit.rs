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
//! Each engine's part is here too, with its state lent for the step: the sender's
//! ([`SendPath`]: its attempts started and failed, its probes on the new data QPs, its
//! telemetry restarted when the rail is Up again) and the receiver's ([`RecvPath`]: its
//! keepalive on the new CTS QP, its counters).
//!
//! [`Event::QpsBuilt`]: crate::engine::Event::QpsBuilt
//! [`Event::QpsConnected`]: crate::engine::Event::QpsConnected

use super::{CtlKind, CtlMsg, Failover, READMIT_ATTEMPT_NS, READMIT_PROBES, READMIT_RESET_NS, other};
use crate::engine::recv_path::RecvPath;
use crate::engine::send_path::SendPath;
use crate::engine::{
    Action, CtlMemory, DownReason, Output, QpRecords, QpRef, RAIL_NAMES, RAILS, RailState, Side, WrKind,
};
use crate::error::Result;
use crate::fabric::{SendWr, Sge, WrOpcode};

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

/// The sender's side of re-admission.
impl Failover {
    /// Sender: re-admission work of one failover poll: attempts to start or give up, `Rebuild`
    /// messages to write, probes to post.
    pub(super) fn sender_readmit_round(
        &mut self,
        p: &mut SendPath<'_>,
        now: u64,
        mem: &mut impl CtlMemory,
        out: &mut Output,
    ) -> Result<()> {
        if self.cfg.readmit_ns == 0 {
            return Ok(());
        }
        for rail in 0..RAILS {
            if self.start_or_expire_attempt(rail, now, out) {
                self.readmit_failed(p, rail)?;
            }
        }
        for rail in self.readmit_due.iter() {
            if let ReadmitStep::Probe { epoch } = self.readmit_step(Side::Send, rail, mem, out) {
                self.post_readmit_probes(p, rail, epoch, out);
            }
        }
        Ok(())
    }

    /// Signalled WRITEs into the receiver's scratch word, spread over the rail's new data
    /// QPs: [`READMIT_PROBES`], or one per QP where the rail has more, so that every QP data
    /// will take has carried a WRITE (on RoCE each QP may take a path of its own).
    fn post_readmit_probes(&mut self, p: &mut SendPath<'_>, rail: usize, epoch: u32, out: &mut Output) {
        let qps = p.cfg.qps[rail].max(1);
        let probes = READMIT_PROBES.max(qps.min(u8::MAX as u16) as u8);
        for k in 0..probes {
            let qp = QpRef::Data(k as u16 % qps);
            out.push(rail, qp).add(SendWr {
                wr_id: WrKind::ReadmitProbe.id(rail, Failover::probe_tag(epoch)),
                opcode: WrOpcode::Write,
                signaled: true,
                inline: p.cfg.max_inline >= 8,
                num_sge: 1,
                sge: [Sge { addr: p.cfg.sizes_addr, len: 8, lkey: p.cfg.sizes_lkeys[rail] }, Sge::default()],
                remote_addr: p.cfg.scratch_addr,
                rkey: p.cfg.scratch_rkeys[rail],
                ..SendWr::default()
            });
            p.tel[rail].stats().count_post(1, 0, 0, 0);
            p.tel[rail].stats().counters.probes.add(1);
        }
        self.probes_out[rail] = probes;
    }

    /// A re-admission probe completed: the last one makes the rail Up again — the split
    /// and the probes use it from now on, its estimates start afresh.
    pub(super) fn on_readmit_probe(&mut self, p: &mut SendPath<'_>, rail: usize, tag: usize) {
        if !self.readmit_probe_done(rail, tag) {
            return;
        }
        let now = self.now_ns;
        let outage = self.rail_back_up(rail, now);
        p.tel[rail].readmit(now);
        p.tel[rail].stats().count_readmission();
        *p.probe_check_ns = 0;
        log::info!(
            "send: {} rail re-admitted (epoch {}, after {} failed attempts so far); the split uses it again",
            RAIL_NAMES[rail],
            self.epoch[rail],
            self.readmit_failures
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
    pub(super) fn readmit_failed(&mut self, p: &mut SendPath<'_>, rail: usize) -> Result<()> {
        if self.unstarted_attempt_back(rail, None) {
            return Ok(());
        }
        match self.state[rail] {
            RailState::Rebuilding { .. } | RailState::Probing { .. } => self.rail_down(p, rail, DownReason::Port),
            _ => Ok(()),
        }
    }

    /// [`Event::PortDown`]: the attempt never started (its `Rebuild` unwritten, the receiver
    /// knows nothing): Failed at the old epoch again, the next try `MPIB_READMIT_MS` from
    /// now; neither a failed attempt nor a longer back-off. Later (the `Rebuild` written),
    /// a failure like any other.
    ///
    /// [`Event::PortDown`]: crate::engine::Event::PortDown
    pub(super) fn readmit_deferred(&mut self, p: &mut SendPath<'_>, rail: usize) -> Result<()> {
        if self.unstarted_attempt_back(rail, Some(self.cfg.readmit_ns)) {
            return Ok(());
        }
        self.readmit_failed(p, rail)
    }
}

/// The receiver's side of re-admission: the sender decides when, the receiver follows; its
/// probe is one keepalive on the new CTS QP, and when that completed CTS writes and
/// keepalives use the rail again. A failure on the way fails the rail at the new epoch as
/// any failure does (fence, then `Fenced`), which tells the sender that the attempt failed.
impl Failover {
    /// Receiver: [`Event::ReadmitFailed`]; the rail fails at its new epoch (fence, then
    /// `Fenced`).
    ///
    /// [`Event::ReadmitFailed`]: crate::engine::Event::ReadmitFailed
    pub(super) fn receiver_readmit_failed(&mut self, p: &mut RecvPath<'_>, rail: usize) -> Result<()> {
        match self.state[rail] {
            RailState::Rebuilding { .. } | RailState::Probing { .. } => {
                self.receiver_rail_down(p, rail, DownReason::Port)
            }
            _ => Ok(()),
        }
    }

    /// Receiver: re-admission work of one poll: `Rebuilt` to write (then connect),
    /// keepalives to post.
    pub(crate) fn receiver_readmit_round(&mut self, p: &mut RecvPath<'_>, mem: &mut impl CtlMemory, out: &mut Output) {
        for rail in self.readmit_due.iter() {
            let ReadmitStep::Probe { epoch } = self.readmit_step(Side::Receive, rail, mem, out) else { continue };
            p.post_scratch_write(rail, WrKind::ReadmitProbe.id(rail, Failover::probe_tag(epoch)), out);
            self.probes_out[rail] = 1;
        }
    }

    /// Receiver: the keepalive on the rebuilt rail completed; the rail is Up here again.
    pub(crate) fn on_receiver_readmit_probe(&mut self, p: &mut RecvPath<'_>, rail: usize, tag: usize) {
        if !self.readmit_probe_done(rail, tag) {
            return;
        }
        let outage = self.rail_back_up(rail, self.now_ns);
        self.live_rails = self.live_rails.with(rail);
        p.stats[rail].count_readmission();
        log::info!("recv: {} rail re-admitted (epoch {}): CTS writes use it again", RAIL_NAMES[rail], self.epoch[rail]);
        if let Some(took) = outage {
            // The CTS writes lost meanwhile go out again (`RecvEngine::repost_cts`).
            log::warn!(
                "recv: the connection is back on the {} rail after {} ms without a working rail",
                RAIL_NAMES[rail],
                took / 1_000_000
            );
        }
    }
}
