//! The simulated memory of the two engines under test (`harness.rs`): a byte address space
//! per side and the control regions the engines read and write through `SendMemory` and
//! `RecvMemory`.

use crate::engine::layout::{
    CTS_ENTRY_BYTES, CTS_ENTRY_WORDS, CTS_SLOT_BYTES, CTS_WORD_OFFSET, CtsEntry, RecvMemory, SendMemory,
};

/// A region base: region `i` lives at `i << 40` in the simulated address space.
pub const fn base(i: u64) -> u64 {
    i << 40
}

/// A simulated address space: regions of bytes at fixed bases. A virtual region has a
/// length but no bytes (reads give zeros, writes are bounds-checked and dropped), for
/// transfers too large to hold in a unit test.
#[derive(Default)]
pub struct Space {
    pub regions: Vec<Vec<u8>>,
    pub virtual_len: Vec<usize>,
}

impl Space {
    pub fn add(&mut self, len: usize) -> u64 {
        self.regions.push(vec![0; len]);
        self.virtual_len.push(0);
        base(self.regions.len() as u64 - 1)
    }
    pub fn add_virtual(&mut self, len: usize) -> u64 {
        self.regions.push(Vec::new());
        self.virtual_len.push(len);
        base(self.regions.len() as u64 - 1)
    }
    fn split(addr: u64) -> (usize, usize) {
        ((addr >> 40) as usize, (addr & ((1 << 40) - 1)) as usize)
    }
    fn at(&mut self, addr: u64, len: usize) -> &mut [u8] {
        let (r, off) = Self::split(addr);
        &mut self.regions[r][off..off + len]
    }
    pub(super) fn is_virtual(&self, addr: u64, len: usize) -> bool {
        let (r, off) = Self::split(addr);
        let v = self.virtual_len[r];
        if v > 0 {
            assert!(off + len <= v, "access beyond a virtual region");
        }
        v > 0
    }
    pub fn read(&mut self, addr: u64, len: usize) -> Vec<u8> {
        if self.is_virtual(addr, len) {
            return vec![0; len.min(1 << 20)];
        }
        self.at(addr, len).to_vec()
    }
    pub fn write(&mut self, addr: u64, data: &[u8]) {
        if self.is_virtual(addr, data.len()) {
            return;
        }
        self.at(addr, data.len()).copy_from_slice(data);
    }
}

/// Fixed region numbers.
pub const FIFO: u64 = base(0);
pub const SIZES: u64 = base(1);
pub const CTS: u64 = base(0);
pub const RECORDS: u64 = base(1);
pub const SCRATCH: u64 = base(2);
/// The sender's scratch word (target of the receiver's keepalives).
pub const SEND_SCRATCH: u64 = base(2);

pub struct SendSide {
    pub space: Space,
}
impl SendMemory for SendSide {
    fn fifo_word(&self, slot: usize, i: usize) -> u64 {
        let off = slot * CTS_SLOT_BYTES + i * CTS_ENTRY_BYTES + CTS_WORD_OFFSET;
        u64::from_le_bytes(self.space.regions[0][off..off + 8].try_into().unwrap())
    }
    fn fifo_entry(&self, slot: usize, i: usize) -> CtsEntry {
        let off = slot * CTS_SLOT_BYTES + i * CTS_ENTRY_BYTES;
        let mut w = [0u64; CTS_ENTRY_WORDS];
        for (k, x) in w.iter_mut().enumerate() {
            *x = u64::from_le_bytes(self.space.regions[0][off + 8 * k..off + 8 * k + 8].try_into().unwrap());
        }
        CtsEntry::from_words(&w)
    }
    fn write_sizes(&mut self, slot: usize, sizes: &[u64]) {
        for (i, s) in sizes.iter().enumerate() {
            self.space.write(SIZES + (slot * 64 + i * 8) as u64, &s.to_le_bytes());
        }
    }
}

pub struct RecvSide {
    pub space: Space,
}
impl RecvMemory for RecvSide {
    fn write_cts(&mut self, slot: usize, i: usize, e: &CtsEntry) {
        let bytes: Vec<u8> = e.to_words().iter().flat_map(|w| w.to_le_bytes()).collect();
        self.space.write(CTS + (slot * CTS_SLOT_BYTES + i * CTS_ENTRY_BYTES) as u64, &bytes);
    }
    fn record(&self, slot: usize, i: usize) -> u64 {
        let off = slot * 64 + i * 8;
        u64::from_le_bytes(self.space.regions[1][off..off + 8].try_into().unwrap())
    }
}
