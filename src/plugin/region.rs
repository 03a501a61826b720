//! A comm's control region: what lies where in it, and the engine's views of it
//! ([`SendMem`], [`RecvMem`]: the CTS FIFO, the completion records, the control ring).
//!
//! A send comm's region: the CTS FIFO the receiver writes, the sizes records it reads, the
//! scratch words (probe and keepalive targets), then the control ring the receiver writes
//! ([`CTL_RING_BYTES`]) and the source of the messages this side writes (as many bytes). A
//! receive comm's: the CTS source, the records the sender writes, the scratch words (and
//! the flush target), then its control ring and message source the same way. The peer's
//! ring is at its exchanged scratch address + [`SCRATCH_BYTES`], under the rkeys exchanged
//! with it.

use crate::engine::CtlMemory;
use crate::engine::failover::{CTL_ENTRY_BYTES, CTL_RING_BYTES, CTL_WORDS};
use crate::engine::layout::{
    CTS_ENTRY_BYTES, CTS_ENTRY_WORDS, CTS_FIFO_BYTES, CTS_SLOT_BYTES, CTS_WORD_OFFSET, CtsEntry, RECORD_SLOT_BYTES,
    RecvMemory, SendMemory,
};
use crate::fabric::mem::HostRegion;

/// Offsets inside a send comm's control region: the FIFO, then the sizes source, then a
/// scratch word (the receiver's keepalives land there).
pub const SEND_SIZES_OFF: usize = CTS_FIFO_BYTES;
pub const SEND_SCRATCH_OFF: usize = SEND_SIZES_OFF + crate::engine::layout::RECORDS_BYTES;
/// Offsets inside a receive comm's control region: CTS source, records, scratch words.
pub const RECV_RECORDS_OFF: usize = CTS_FIFO_BYTES;
pub const RECV_SCRATCH_OFF: usize = RECV_RECORDS_OFF + crate::engine::layout::RECORDS_BYTES;
/// The flush READs land here (away from the probe word).
pub const RECV_FLUSH_OFF: usize = RECV_SCRATCH_OFF + 64;
/// Bytes after the scratch offset: the probe word, and the flush/keepalive word at +64.
pub const SCRATCH_BYTES: usize = 128;

/// Offsets of the control ring (in) and of the outgoing messages' source in a send comm's
/// region, and the region's size.
pub const SEND_CTL_OFF: usize = SEND_SCRATCH_OFF + SCRATCH_BYTES;
pub const SEND_REGION_BYTES: usize = SEND_CTL_OFF + 2 * CTL_RING_BYTES;
/// The same in a receive comm's region.
pub const RECV_CTL_OFF: usize = RECV_SCRATCH_OFF + SCRATCH_BYTES;
pub const RECV_REGION_BYTES: usize = RECV_CTL_OFF + 2 * CTL_RING_BYTES;

/// The sender's control region as the engine sees it.
pub(super) struct SendMem<'a>(pub(super) &'a HostRegion);

impl SendMemory for SendMem<'_> {
    #[inline]
    fn fifo_word(&self, slot: usize, i: usize) -> u64 {
        self.0.load_acquire(slot * CTS_SLOT_BYTES + i * CTS_ENTRY_BYTES + CTS_WORD_OFFSET)
    }
    #[inline]
    fn fifo_entry(&self, slot: usize, i: usize) -> CtsEntry {
        let base = slot * CTS_SLOT_BYTES + i * CTS_ENTRY_BYTES;
        CtsEntry::from_words(&self.0.load_words::<CTS_ENTRY_WORDS>(base))
    }
    #[inline]
    fn write_sizes(&mut self, slot: usize, sizes: &[u64]) {
        for (i, &s) in sizes.iter().enumerate() {
            self.0.store(SEND_SIZES_OFF + slot * RECORD_SLOT_BYTES + i * 8, s);
        }
    }
}

/// The receiver's control region as the engine sees it.
pub(super) struct RecvMem<'a>(pub(super) &'a HostRegion);

impl RecvMemory for RecvMem<'_> {
    #[inline]
    fn write_cts(&mut self, slot: usize, i: usize, e: &CtsEntry) {
        self.0.store_words(slot * CTS_SLOT_BYTES + i * CTS_ENTRY_BYTES, &e.to_words());
    }
    #[inline]
    fn record(&self, slot: usize, i: usize) -> u64 {
        self.0.load_acquire(RECV_RECORDS_OFF + slot * RECORD_SLOT_BYTES + i * 8)
    }
}

macro_rules! ctl_memory {
    ($t:ident, $off:expr) => {
        impl CtlMemory for $t<'_> {
            #[inline]
            fn ctl_seq(&self, i: usize) -> u64 {
                self.0.load_acquire($off + i * CTL_ENTRY_BYTES + (CTL_WORDS - 1) * 8)
            }
            fn ctl_entry(&self, i: usize) -> [u64; CTL_WORDS] {
                self.0.load_words::<CTL_WORDS>($off + i * CTL_ENTRY_BYTES)
            }
            fn write_ctl_out(&mut self, i: usize, words: &[u64; CTL_WORDS]) {
                self.0.store_words($off + CTL_RING_BYTES + i * CTL_ENTRY_BYTES, words);
            }
            fn ctl_out_entry(&self, i: usize) -> [u64; CTL_WORDS] {
                self.0.load_words::<CTL_WORDS>($off + CTL_RING_BYTES + i * CTL_ENTRY_BYTES)
            }
        }
    };
}
ctl_memory!(SendMem, SEND_CTL_OFF);
ctl_memory!(RecvMem, RECV_CTL_OFF);

#[cfg(test)]
mod tests {
    use super::*;

    /// What a comm's region holds: the CTS FIFO (8 KiB), the completion records (2 KiB), the
    /// scratch words, then the control ring and the outgoing messages' source (8 entries of
    /// 256 bytes each): 14,464 bytes, 4 pages allocated and registered per comm.
    #[test]
    fn a_comms_region_holds_its_two_control_rings_in_four_pages() {
        assert_eq!(CTL_RING_BYTES, 2048);
        assert_eq!((SEND_REGION_BYTES, RECV_REGION_BYTES), (14_464, 14_464));
        assert_eq!(SEND_REGION_BYTES.div_ceil(4096), 4);
        // Each entry's sequence word is 8-byte aligned (loaded with Acquire).
        assert_eq!((SEND_CTL_OFF % 8, RECV_CTL_OFF % 8, CTL_ENTRY_BYTES % 8), (0, 0, 0));
    }
}
