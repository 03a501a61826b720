//! The sender's replay data: for each slot posted, where its sends' bytes came from and
//! went, the IMM that announced them, and which of its parts are being replayed. Failover
//! reads it to send a lost part again on the surviving rail; the posting path only writes a
//! slot's record (indexed by the slot), and a healthy connection never reads it.

use std::ops::{Index, IndexMut};

use crate::engine::layout::{MAX_RECVS, SLOTS};
use crate::engine::{CpuAccess, RAILS, RailMask};

/// Where one send's bytes came from and went: what a replay re-posts.
#[derive(Clone, Copy, Debug, Default)]
pub(crate) struct PartSrc {
    pub(crate) src: u64,
    pub(crate) lkeys: [u32; RAILS],
    pub(crate) dst: u64,
    pub(crate) rkeys: [u32; RAILS],
    /// Bytes on SOUT (the first part of the buffer); the rest of `size` went on SUP.
    pub(crate) sout: u64,
    pub(crate) size: u64,
    pub(crate) cpu: CpuAccess,
}

/// One slot's replay record.
#[derive(Clone, Copy, Debug, Default)]
pub(crate) struct SlotReplay {
    /// The IMM the slot's chains carried (a replay carries it again, marked replayed).
    pub(crate) imm: u32,
    /// Parts whose replay on the other rail has not completed yet.
    pub(crate) replay: RailMask,
    /// Parts whose replay waits for the slot's own chain on the other rail to complete, so
    /// that a slot never has two chains on one rail (the send queues hold one per slot).
    pub(crate) replay_wait: RailMask,
    /// Its sends, in CTS order.
    pub(crate) parts: [PartSrc; MAX_RECVS],
}

/// The replay records of a sender's slots; none at a receiver (it replays nothing).
#[derive(Debug, Default)]
pub(crate) struct Replays(Box<[SlotReplay]>);

impl Replays {
    /// A record for each of a sender's slots.
    pub(crate) fn for_sender() -> Replays {
        Replays(vec![SlotReplay::default(); SLOTS].into_boxed_slice())
    }
}

impl Index<usize> for Replays {
    type Output = SlotReplay;
    #[inline(always)]
    fn index(&self, slot: usize) -> &SlotReplay {
        &self.0[slot]
    }
}

impl IndexMut<usize> for Replays {
    #[inline(always)]
    fn index_mut(&mut self, slot: usize) -> &mut SlotReplay {
        &mut self.0[slot]
    }
}
