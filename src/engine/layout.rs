//! Layout of the two small regions the peers write into each other, and the traits through
//! which the sans-IO engine reads and writes them (the plugin backs them with registered
//! memory, tests with arrays).
//!
//! **CTS FIFO** (sender's memory, written by the receiver): 256 slots × 8 entries × 64 B.
//! ```text
//!  @0  addr   u64     receive buffer address
//!  @8  size   u64     posted size
//!  @16 rkey   u32 × 2 buffer's rkey on SOUT, on SUP
//!  @24 tag    u32     NCCL tag (selects the buffer within a multi-receive)
//!  @28 nreqs  u32     number of receives in this slot
//!  @32 —      24 B    zero
//!  @56 word   u64     (seq << 8) | nreqs, seq = 1 + index of the irecv on this connection
//! ```
//! The receiver writes a slot's `n` entries with ONE RDMA WRITE; the sender accepts the
//! slot when entry 0's word and entry `n-1`'s word (the last 8 bytes of that WRITE) both
//! show the expected `seq`. Fabrics place the last 8 bytes of a WRITE last (a NIC's in-order
//! placement; the soft fabric's Release store), so that is a complete, fresh slot.
//!
//! **Completion records** (receiver's memory, written by the sender's leader rail):
//! 256 slots × 8 sizes × u64 — the exact byte count of each buffer of a multi-receive, or of a
//! single receive larger than `size_q` can encode.

/// Slots of the FIFO and of the records (the IMM's 8-bit slot field).
pub const SLOTS: usize = 256;
/// Receives per slot (`maxRecvs`).
pub const MAX_RECVS: usize = 8;
/// Bytes of one CTS entry.
pub const CTS_ENTRY_BYTES: usize = 64;
/// Bytes of one FIFO slot (8 entries).
pub const CTS_SLOT_BYTES: usize = CTS_ENTRY_BYTES * MAX_RECVS;
/// Bytes of the whole FIFO.
pub const CTS_FIFO_BYTES: usize = CTS_SLOT_BYTES * SLOTS;
/// Offset of the control word in an entry.
pub const CTS_WORD_OFFSET: usize = 56;
/// Bytes of one slot of completion records.
pub const RECORD_SLOT_BYTES: usize = 8 * MAX_RECVS;
/// Bytes of all completion records.
pub const RECORDS_BYTES: usize = RECORD_SLOT_BYTES * SLOTS;

/// One CTS entry (decoded).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct CtsEntry {
    pub addr: u64,
    pub size: u64,
    pub rkeys: [u32; 2],
    pub tag: u32,
    pub nreqs: u32,
    /// `(seq << 8) | nreqs`.
    pub word: u64,
}

impl CtsEntry {
    /// The control word for receive number `index` (0-based) of a slot with `n` receives.
    #[inline]
    pub fn word_for(index: u64, n: usize) -> u64 {
        ((index + 1) << 8) | n as u64
    }

    /// The entry as eight little-endian 64-bit words, in memory order.
    #[inline]
    pub fn to_words(&self) -> [u64; 8] {
        [
            self.addr,
            self.size,
            self.rkeys[0] as u64 | (self.rkeys[1] as u64) << 32,
            self.tag as u64 | (self.nreqs as u64) << 32,
            0,
            0,
            0,
            self.word,
        ]
    }

    #[inline]
    pub fn from_words(w: &[u64; 8]) -> Self {
        CtsEntry {
            addr: w[0],
            size: w[1],
            rkeys: [w[2] as u32, (w[2] >> 32) as u32],
            tag: w[3] as u32,
            nreqs: (w[3] >> 32) as u32,
            word: w[7],
        }
    }
}

/// The sender's view of its regions.
pub trait SendMemory {
    /// Acquire-load of the control word of FIFO entry `(slot, i)`.
    fn fifo_word(&self, slot: usize, i: usize) -> u64;
    /// FIFO entry `(slot, i)`; called only after its slot's last word was seen.
    fn fifo_entry(&self, slot: usize, i: usize) -> CtsEntry;
    /// Writes a slot's sizes into the local source of the completion-record write.
    fn write_sizes(&mut self, slot: usize, sizes: &[u64]);
}

/// The receiver's view of its regions.
pub trait RecvMemory {
    /// Writes entry `i` of a slot's CTS entries into the local source of the CTS write.
    fn write_cts(&mut self, slot: usize, i: usize, entry: &CtsEntry);
    /// Size `i` of the completion records of `slot`; called after the slot's IMMs.
    fn record(&self, slot: usize, i: usize) -> u64;
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn entry_words_round_trip_and_word_is_last() {
        let e = CtsEntry {
            addr: 0x1122_3344_5566_7788,
            size: 1 << 33,
            rkeys: [7, 0xdead_beef],
            tag: 0xffff_fffe,
            nreqs: 8,
            word: CtsEntry::word_for(41, 8),
        };
        let w = e.to_words();
        assert_eq!(CtsEntry::from_words(&w), e);
        assert_eq!(w[CTS_WORD_OFFSET / 8], (42 << 8) | 8);
        assert_eq!(CTS_FIFO_BYTES, 128 * 1024);
        assert_eq!(RECORDS_BYTES, 16 * 1024);
    }
}
