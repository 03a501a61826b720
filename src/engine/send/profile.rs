//! What the sender's posted slots say to a profiler: which sends a slot carries and how
//! each was split (read once the slot is posted), and whether a rail's part of a slot is
//! still outstanding, being replayed on the other rail (failover), or done. Read-only
//! views of the engine's own records, for the plugin's profiler events: the engine does
//! no work for a profiler and knows nothing of one.

use super::SendEngine;
use crate::engine::layout::{MAX_RECVS, SLOTS};
use crate::engine::{RailMask, SOUT};

/// One send of a posted slot.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct SentPart {
    /// The send's request id (what `isend` returned).
    pub req: u16,
    /// Its bytes, and those of them on SOUT (the rest went on SUP).
    pub size: u64,
    pub sout: u64,
}

impl SentPart {
    /// The send's bytes on `rail`.
    pub fn on(&self, rail: usize) -> u64 {
        if rail == SOUT { self.sout } else { self.size - self.sout }
    }
}

/// A posted slot: its sends and the rails its chains went on.
#[derive(Clone, Copy, Debug, Default)]
pub struct SlotView {
    pub slot: usize,
    /// The slot's sequence number (tells its uses apart).
    pub seq: u64,
    pub rails: RailMask,
    pub n: usize,
    pub parts: [SentPart; MAX_RECVS],
}

/// Where a rail's part of a posted slot is.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum PartState {
    /// Posted on its rail, not yet complete.
    Outstanding,
    /// Its rail failed: it is (or will be) re-sent on the other rail.
    Replaying,
    /// Complete (or the slot has been used again since).
    Done,
}

impl SendEngine {
    /// The slot posted last: read right after the `isend` that posted it (before any
    /// completion, its `rails` are those its chains went on).
    pub fn last_posted(&self) -> SlotView {
        let slot = (self.fifo_head.wrapping_sub(1) % SLOTS as u64) as usize;
        let s = &self.slots[slot];
        let mut out = SlotView { slot, seq: s.seq, rails: s.pending, n: s.n as usize, ..SlotView::default() };
        for i in 0..out.n {
            let src = &self.fo.replays[slot].parts[i];
            out.parts[i] = SentPart { req: s.reqs[i], size: src.size, sout: src.sout };
        }
        out
    }

    /// Where `rail`'s part of use `seq` of `slot` is.
    pub fn part_state(&self, slot: usize, seq: u64, rail: usize) -> PartState {
        let s = &self.slots[slot % SLOTS];
        if s.seq != seq || !s.pending.contains(rail) {
            PartState::Done
        } else if (self.fo.replays[slot].replay | self.fo.replays[slot].replay_wait).contains(rail) {
            PartState::Replaying
        } else {
            PartState::Outstanding
        }
    }
}
