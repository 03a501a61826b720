//! What the receiver's failover (`engine/failover/`) gets of the hot path: borrows of the
//! receive slots, the keepalive in flight, the rails' counters and the connection's
//! settings. Failover runs in its own rounds and on failed completions; a view made there
//! costs the receive path nothing.

use super::actions::Output;
use super::config::RecvConfig;
use super::slots::{RecvSlot, RecvState};
use crate::engine::layout::SLOTS;
use crate::engine::place::At;
use crate::engine::{ErrorState, QpRef, RAILS, RailMask};
use crate::fabric::{SendWr, Sge, WrOpcode};
use crate::telemetry::StatsHandle;

/// The receiver's hot-path state, borrowed for one failover step.
pub(crate) struct RecvPath<'a> {
    pub(crate) stats: &'a [StatsHandle; RAILS],
    pub(crate) error: &'a mut ErrorState,
    /// The rail a keepalive is in flight on, if any.
    pub(crate) keepalive: &'a mut Option<usize>,
    /// Rails whose keepalive was left in flight when the rail failed.
    pub(crate) keepalive_abandoned: &'a mut RailMask,
    /// Receives posted so far: the end of the window a `Fenced` report covers.
    pub(crate) fifo_tail: u64,
    pub(crate) cfg: &'a RecvConfig,
    pub(crate) slots: &'a mut [RecvSlot; SLOTS],
}

impl RecvPath<'_> {
    /// ` [the place of rail]`, for the end of a log line.
    pub(crate) fn at(&self, rail: usize) -> At<'_> {
        self.error.place.at(rail)
    }

    /// A rail's failure is a warning while NCCL waits on a receive; with none outstanding
    /// (a sender that closed after its last send looks the same) it is information.
    pub(crate) fn failure_level(&self) -> log::Level {
        if nccl_waits(self.slots) { log::Level::Warn } else { log::Level::Info }
    }

    /// Whether part `rail` of receive `seq` arrived: a receive whose data is all in, or
    /// that completed, has every part.
    pub(crate) fn part_arrived(&self, seq: u64, rail: usize) -> bool {
        let s = &self.slots[(seq % SLOTS as u64) as usize];
        s.state != RecvState::Posted || s.data_done || s.seen.contains(rail)
    }

    /// `slot`'s CTS WRITE died with its rail: no completion will follow, so the slot no
    /// longer waits for one.
    pub(crate) fn cts_lost(&mut self, slot: usize) {
        let s = &mut self.slots[slot];
        if s.state == RecvState::Posted && s.cts_pending {
            s.cts_pending = false;
            if s.data_done {
                s.state = RecvState::Done;
            }
        }
    }

    /// A re-admission's probe of the rebuilt `rail` (`wr_id`), as a keepalive is posted.
    pub(crate) fn post_scratch_write(&mut self, rail: usize, wr_id: u64, out: &mut Output) {
        scratch_write(self.cfg, self.stats, rail, wr_id, out);
    }
}

/// A signalled 8-byte WRITE into the sender's scratch word on `rail`'s CTS QP, counted as a
/// probe: a keepalive, or a re-admission's probe of the rebuilt rail (`wr_id` says which).
pub(crate) fn scratch_write(cfg: &RecvConfig, stats: &[StatsHandle; RAILS], rail: usize, wr_id: u64, out: &mut Output) {
    out.push(rail, QpRef::Cts).add(SendWr {
        wr_id,
        opcode: WrOpcode::Write,
        signaled: true,
        deferrable: false,
        inline: cfg.max_inline >= 8,
        num_sge: 1,
        sge: [Sge { addr: cfg.flush_addr, len: 8, lkey: cfg.flush_lkeys[rail] }, Sge::default()],
        remote_addr: cfg.scratch_addr,
        rkey: cfg.scratch_rkeys[rail],
        imm: 0,
    });
    stats[rail].count_post(1, 0, 0, 0);
    stats[rail].counters.probes.add(1);
}

/// Whether a receive NCCL posted is still waiting for data.
#[cold]
#[inline(never)]
fn nccl_waits(slots: &[RecvSlot; SLOTS]) -> bool {
    slots.iter().any(|s| s.state == RecvState::Posted && !s.data_done)
}
