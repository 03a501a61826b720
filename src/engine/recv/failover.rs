//! The receiver's calls into its failover sub-state machine (`engine/failover/`, DESIGN.md
//! "Rail failover"): events from the plugin, the failover part of a round, failed
//! completions, a re-admission's probe. Each lends failover the hot path's state
//! ([`RecvPath`]) for the step. What stays here is what only the engine can do: re-post a
//! CTS lost with its rail (the CTS WRITE the receive path builds) and accept a replayed
//! part (the IMM path's checks and its `accept`). Replayed parts arrive flagged; a
//! duplicate is ignored and counted.

use super::RecvEngine;
use crate::engine::failover::{Failover, FailoverCounts, other};
use crate::engine::imm::{Imm, PIECES_BITS, REPLAY_FLAG, SIZEQ_SENTINEL, SLOT_BITS};
use crate::engine::layout::{RecvMemory, SLOTS};
use crate::engine::recv_path::RecvPath;
use crate::engine::slots::RecvState;
use crate::engine::{CtlMemory, Event, Output, QpRef, RAILS, RailState, Violation, WrKind};
use crate::error::Result;
use crate::fabric::Completion;

impl RecvEngine {
    #[cfg(test)]
    pub(crate) fn failover_config_mut(&mut self) -> &mut crate::engine::FailoverConfig {
        self.fo.timer_ns = 0;
        &mut self.fo.cfg
    }

    /// Each rail's failover state.
    pub fn rail_states(&self) -> [RailState; RAILS] {
        self.fo.state
    }

    pub fn failover_counts(&self) -> FailoverCounts {
        self.fo.counts()
    }

    /// Whether [`Self::poll_failover`] has something to emit now (it must also be called
    /// regularly to read the control ring).
    pub(crate) fn failover_due(&self) -> bool {
        // (In an outage, every round reads the set-up channel: what comes back comes there.)
        self.fo.rail_work_due() || self.fo.cts_redo != 0 || self.fo.outage_ns != 0
    }

    /// Failover and the hot-path state it works on, borrowed apart.
    fn failover_parts(&mut self) -> (&mut Failover, RecvPath<'_>) {
        let path = RecvPath {
            stats: &self.stats,
            error: &mut self.error,
            keepalive: &mut self.keepalive,
            keepalive_abandoned: &mut self.keepalive_abandoned,
            fifo_tail: self.fifo_tail,
            cfg: &self.cfg,
            slots: &mut self.slots,
        };
        (&mut self.fo, path)
    }

    /// What the plugin saw (a port down) or did (an action performed). What follows from it
    /// is emitted by the next [`Self::handle_timeout`] (due at once).
    pub fn handle_event(&mut self, ev: Event) -> Result<()> {
        self.error.check()?;
        let (fo, mut path) = self.failover_parts();
        fo.on_receiver_event(&mut path, ev)
    }

    /// The failover work of one call: fences to ask for, lost CTS writes to re-post,
    /// `Fenced` reports to write, the sender's control messages to read.
    pub(crate) fn poll_failover(&mut self, mem: &mut (impl RecvMemory + CtlMemory), out: &mut Output) -> Result<()> {
        self.error.check()?;
        if !self.fo.cfg.enabled {
            return Ok(());
        }
        let (fo, mut path) = self.failover_parts();
        if fo.outage_ns != 0 {
            fo.receiver_outage_round(&mut path, mem, out)?;
        }
        fo.read_receiver_ctl(&mut path, mem, out)?;
        fo.emit_fences(out);
        self.repost_cts(out);
        let (fo, mut path) = self.failover_parts();
        fo.write_fenced_reports(&path, mem, out);
        fo.receiver_readmit_round(&mut path, mem, out);
        Ok(())
    }

    /// Re-posts, on the surviving rail's CTS QP, the CTS of each slot whose CTS WRITE died
    /// with its rail while the slot's receive still waits for data (its entries are still
    /// in the local source). Identical content: if the first copy did land, the sender's
    /// sequence check ignores the second. Later CTS writes of the slot go on the same QP,
    /// after this one.
    fn repost_cts(&mut self, out: &mut Output) {
        let Some(rail) = self.fo.live_rails.first() else { return };
        while self.fo.cts_redo != 0 {
            let slot = self.fo.cts_redo.trailing_zeros() as usize;
            self.fo.cts_redo &= self.fo.cts_redo - 1;
            let s = &mut self.slots[slot];
            if s.state != RecvState::Posted || s.data_done {
                continue;
            }
            // Signalled: the slot is done only once this copy is placed.
            s.cts_pending = true;
            let n = s.n as usize;
            let wr = self.cts_wr(rail, slot, n, true);
            out.push(rail, QpRef::Cts).add(wr);
            self.stats[rail].count_post(1, 0, 0, 0);
            self.fo.cts_reposts += 1;
        }
    }

    /// A failed completion on `rail` (failover on): `wr` is the WR it names, if any.
    #[cold]
    #[inline(never)]
    pub(super) fn on_rail_error(&mut self, rail: usize, wr: Option<(WrKind, usize)>, c: &Completion) -> Result<()> {
        let (fo, mut path) = self.failover_parts();
        fo.on_receiver_error(&mut path, rail, wr, c)
    }

    /// The keepalive on a rebuilt rail completed.
    pub(super) fn on_readmit_probe(&mut self, rail: usize, tag: usize) {
        let (fo, mut path) = self.failover_parts();
        fo.on_receiver_readmit_probe(&mut path, rail, tag);
    }

    /// An IMM whose slot byte is not a slot: a piece of a striped rail share (bits 6:5,
    /// `pieces.rs`), a replay (bit 7) when failover is on, a violation otherwise.
    #[cold]
    #[inline(never)]
    pub(super) fn on_odd_imm(&mut self, rail: usize, imm: u32, byte_len: u64, mem: &impl RecvMemory) -> Result<()> {
        let Imm { slot, mask, size_q } = Imm::decode(imm);
        if slot & REPLAY_FLAG == 0 && slot & PIECES_BITS != 0 {
            return self.on_piece(rail, imm, byte_len, mem);
        }
        if slot & REPLAY_FLAG != 0 && slot & PIECES_BITS != 0 {
            // A replay re-sends a part whole.
            let (pieces, slot) = (Imm::pieces_of(slot), (slot & SLOT_BITS) as usize);
            return Err(self.violation(move || Violation::BadPieces { rail, slot, pieces, most: 1 }));
        }
        let (slot, replay) = ((slot & !REPLAY_FLAG) as usize, slot & REPLAY_FLAG != 0);
        if !self.fo.cfg.enabled || !replay || slot >= SLOTS {
            let slot = slot | if replay { REPLAY_FLAG as usize } else { 0 };
            return Err(self.violation(move || Violation::NoReceiveWaiting { rail, slot }));
        }
        let part = other(rail);
        let rails = self.cfg.rails_mask;
        if mask.is_empty() || !mask.is_subset(rails) {
            return Err(self.violation(move || Violation::BadMask { rail, slot, imm, mask, rails }));
        }
        if !mask.contains(part) || self.fo.state[part] == RailState::Up && self.fo.epoch[part] == 0 {
            // A part outside the mask, or the replay of a part whose rail never failed here
            // (a rail Up at a later epoch failed once: a replay of its earlier life may
            // still arrive after its re-admission).
            return Err(self.violation(move || Violation::MaskOmitsRail { rail: part, slot, mask }));
        }
        let s = &self.slots[slot];
        let (state, data_done, expected, seen, prev_q, n) = (s.state, s.data_done, s.expected, s.seen, s.size_q, s.n);
        if state == RecvState::Free {
            return Err(self.violation(move || Violation::NoReceiveWaiting { rail, slot }));
        }
        if seen.contains(part) && expected == mask {
            // Delivered already: ignored, counted, never a second completion.
            self.fo.duplicates += 1;
            return Ok(());
        }
        if data_done {
            return Err(self.violation(move || Violation::NoReceiveWaiting { rail, slot }));
        }
        if !expected.is_empty() && expected != mask {
            return Err(self.violation(move || Violation::MaskChanged { rail, slot, mask, earlier: expected }));
        }
        if !expected.is_empty() && prev_q != size_q {
            return Err(self.violation(move || Violation::SizeQChanged { rail, slot, size_q, earlier: prev_q }));
        }
        if size_q != SIZEQ_SENTINEL && n != 1 {
            let n = n as usize;
            return Err(self.violation(move || Violation::SizeForMultiRecv { rail, slot, n }));
        }
        if s.pieces_seen[part] > 0 {
            // A striped share of which some pieces arrived: the replay carries it whole, and
            // only its bytes count (the pieces' were never added).
            self.partial_parts += 1;
        }
        self.accept(rail, part, slot, mask, size_q, byte_len, mem)
    }
}
