//! Layout of the two small regions the peers write into each other, and the traits through
//! which the sans-IO engine reads and writes them (the plugin backs them with registered
//! memory, tests with arrays).
//!
//! Both are sized by what can be outstanding: NCCL keeps at most 32 receives in flight per
//! comm (`NCCL_NET_MAX_REQUESTS`), so [`SLOTS`] = 32 (net_ib keeps 256 rows, 32 × 8, for the
//! same window).
//!
//! **CTS FIFO** (sender's memory, written by the receiver): 32 slots × 8 entries × 32 B.
//! ```text
//!  @0  addr   u64     receive buffer address
//!  @8  size   u32     posted size (NCCL reports sizes as int: at most i32::MAX)
//!  @12 tag    u32     NCCL tag (selects the buffer within a multi-receive)
//!  @16 rkey   u32 × 2 buffer's rkey on SOUT, on SUP
//!  @24 word   u64     (seq << 8) | nreqs, seq = 1 + index of the irecv on this connection
//! ```
//! The receiver writes a slot's `n` entries with ONE RDMA WRITE; the sender accepts the
//! slot when entry 0's word and entry `n-1`'s word (the last 8 bytes of that WRITE) both
//! show the expected `seq`. Fabrics place the last 8 bytes of a WRITE last (a NIC's
//! in-order placement; the soft fabric's Release store), so that is a complete, fresh slot.
//!
//! **Completion records** (receiver's memory, written by the sender's leader rail):
//! 32 slots × 8 sizes × u64 — the exact byte count of each buffer of a multi-receive, or of a
//! single receive larger than `size_q` can encode.
//!
//! A slot is reused 32 receives later. The receiver reuses it only once its receive was
//! tested done, and the sender takes a fresh CTS for it only once the slot's previous chains
//! completed (`SendEngine::poll_cts`): with 32 slots that wait happens more often than with
//! 256, as back-pressure (isend answers "not now" while the acknowledgements of data the
//! receiver already has are on their way), never a deadlock: nothing the old chains wait for
//! depends on the new send.

/// Slots of the FIFO and of the records: the request window (the IMM's 8-bit slot field
/// could address 256).
pub const SLOTS: usize = 32;
/// Receives per slot (`maxRecvs`).
pub const MAX_RECVS: usize = 8;
/// Bytes of one CTS entry.
pub const CTS_ENTRY_BYTES: usize = 32;
/// Bytes of one FIFO slot (8 entries).
pub const CTS_SLOT_BYTES: usize = CTS_ENTRY_BYTES * MAX_RECVS;
/// Bytes of the whole FIFO.
pub const CTS_FIFO_BYTES: usize = CTS_SLOT_BYTES * SLOTS;
/// Offset of the control word in an entry.
pub const CTS_WORD_OFFSET: usize = 24;
/// 64-bit words of one CTS entry.
pub const CTS_ENTRY_WORDS: usize = CTS_ENTRY_BYTES / 8;
/// Bytes of one slot of completion records.
pub const RECORD_SLOT_BYTES: usize = 8 * MAX_RECVS;
/// Bytes of all completion records.
pub const RECORDS_BYTES: usize = RECORD_SLOT_BYTES * SLOTS;

/// One CTS entry (decoded).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct CtsEntry {
    pub addr: u64,
    /// At most `u32::MAX` (32 bits on the wire).
    pub size: u64,
    pub rkeys: [u32; 2],
    pub tag: u32,
    /// The receives of the slot: the low byte of `word` (not written apart).
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

    /// The entry as four little-endian 64-bit words, in memory order (`nreqs` travels in
    /// `word`; `size` must fit 32 bits).
    #[inline]
    pub fn to_words(&self) -> [u64; CTS_ENTRY_WORDS] {
        debug_assert!(self.size <= u32::MAX as u64);
        [
            self.addr,
            self.size & 0xffff_ffff | (self.tag as u64) << 32,
            self.rkeys[0] as u64 | (self.rkeys[1] as u64) << 32,
            self.word,
        ]
    }

    #[inline]
    pub fn from_words(w: &[u64; CTS_ENTRY_WORDS]) -> Self {
        CtsEntry {
            addr: w[0],
            size: w[1] & 0xffff_ffff,
            tag: (w[1] >> 32) as u32,
            rkeys: [w[2] as u32, (w[2] >> 32) as u32],
            nreqs: (w[3] & 0xff) as u32,
            word: w[3],
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

// The control ring (each side has one, written by its peer): one RDMA WRITE per control
// message of rail failover (`engine/failover/`).

/// Entries of a control ring (each side has one, written by its peer).
pub const CTL_ENTRIES: usize = 8;
/// Bytes of one control-ring entry: the header word, `base_seq`, bitmap and ack,
/// [`CTL_PAYLOAD_WORDS`] payload words, then the sequence word. Sized so that one
/// `Rebuild`/`Rebuilt` describes a rail of 16 QPs (`plugin/readmit.rs`); still one packet
/// at the smallest RDMA MTU (256 bytes).
pub const CTL_ENTRY_BYTES: usize = 256;
/// 64-bit words of one entry.
pub const CTL_WORDS: usize = CTL_ENTRY_BYTES / 8;
/// Payload words of one entry: all but the header, `base_seq`, bitmap/ack and sequence words.
pub const CTL_PAYLOAD_WORDS: usize = CTL_WORDS - 4;
/// Bytes of a control ring.
pub const CTL_RING_BYTES: usize = CTL_ENTRIES * CTL_ENTRY_BYTES;
/// Messages a side may have written that its peer has not yet acknowledged: the protocol
/// never has more than two outstanding per rail and side (DESIGN.md), half the ring.
/// Every send queue that carries control writes holds this many more WRs.
pub const CTL_MAX_UNACKED: u64 = (2 * crate::rail::RAILS) as u64;
/// 64-bit words of QP records one `Rebuild`/`Rebuilt` carries: the entry's payload.
pub const QP_RECORD_WORDS: usize = CTL_PAYLOAD_WORDS;

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn entry_words_round_trip_and_word_is_last() {
        let e = CtsEntry {
            addr: 0x1122_3344_5566_7788,
            size: i32::MAX as u64,
            rkeys: [7, 0xdead_beef],
            tag: 0xffff_fffe,
            nreqs: 8,
            word: CtsEntry::word_for(41, 8),
        };
        let w = e.to_words();
        assert_eq!(CtsEntry::from_words(&w), e);
        assert_eq!(w[CTS_WORD_OFFSET / 8], (42 << 8) | 8);
        assert_eq!(CTS_WORD_OFFSET + 8, CTS_ENTRY_BYTES, "the word ends the entry");
        // 32 receives in flight of up to 8 buffers: 8 KiB of FIFO, 2 KiB of records.
        assert_eq!(CTS_FIFO_BYTES, 8 * 1024);
        assert_eq!(RECORDS_BYTES, 2 * 1024);
    }
}
