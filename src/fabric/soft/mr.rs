//! The key table of a soft device: memory registrations looked up by key without a lock,
//! and deregistration that waits for the placements in flight.
//!
//! A key is `slot index << GEN_BITS | generation`; lkey and rkey are the same key. A slot's
//! `gate` is one `AtomicU64`: its high half is the slot's key while it is registered (0
//! otherwise), its low half a count of *pins*. Every access to registered memory (a socket
//! read straight into it, a copy into it, a socket write from it) happens while the slot
//! is pinned, one system call or copy at a time:
//!
//! - [`MrTable::pin`] increments the gate (one atomic add, Acquire) and compares the key
//!   half it returned with the key it was given; on a mismatch it decrements and fails,
//!   without reading the slot's address.
//! - [`MrTable::dereg`] clears the key half (one atomic AND), then waits until the count is
//!   0. Both act on the same word, so they are totally ordered: a pin ordered after the
//!   clear fails, and a pin ordered before it is counted, so the wait sees it. From then on
//!   no pin succeeds, and every access made under an earlier pin has finished (Release on
//!   unpin, Acquire in the wait): after `dereg` returns, no peer byte lands in the region.
//!
//! Why the key can stand for a VALID bit: a key names its slot (its index) and the
//! registration in that slot (its generation, never 0). An unregistered slot `i != 0` holds
//! 0, which only a key of index 0 could equal, and such a key looks up slot 0, never slot
//! `i`; slot 0 is never registered and holds a key of another index for good. A slot reused
//! has a new generation, so a stale key fails too.
//!
//! Keys do not come back: a slot whose generations are spent (4,095 registrations) is
//! *retired*, and new chunks serve instead, until the table holds all [`MAX_CHUNKS`]; only
//! then is the longest-retired slot taken again, from generation 1. A key so recurs only
//! after every other key of the device has been handed out: `(2^20 - 1) × 4,095`, about
//! 2^32 registrations, later (a device registering a million regions a second would take
//! 71 minutes to get there). The cost is 32 KiB of slots per ~4 million registrations.
//!
//! The wait is short: a pin lasts one non-blocking `readv`/`writev` or one copy.
//! Slots live in chunks allocated on demand by `reg` (control path) and never freed before
//! the table, so a lookup is two loads. A chunk not allocated yet is [`EMPTY`], a shared
//! chunk of slots that are never registered (key half 0), so a lookup never checks for a
//! missing chunk: a key that lands there fails its key comparison. Chunk 0 is allocated
//! with the table, so the only keys that can land in `EMPTY` have an index of at least
//! `CHUNK_SLOTS`: never 0, never equal to its key half. (Pins that fail there count in its
//! gates' low halves for an instant, as in any slot; nothing else ever writes it.)

use std::collections::VecDeque;
use std::sync::atomic::Ordering;

use parking_lot::Mutex;

use super::spin::wait_while;
use crate::error::{Error, Result};
use crate::fabric::Access;
use crate::sync::{AtomicPtr, AtomicU32, AtomicU64};

#[cfg(not(loom))]
const GEN_BITS: u32 = 12;
#[cfg(not(loom))]
const CHUNK_BITS: u32 = 10;
// Under the model checker, a table it can build in every run: 4 chunks of 4 slots (the
// same arithmetic, other widths).
#[cfg(loom)]
const GEN_BITS: u32 = 28;
#[cfg(loom)]
const CHUNK_BITS: u32 = 2;
const GEN_MASK: u32 = (1 << GEN_BITS) - 1;
const CHUNK_SLOTS: usize = 1 << CHUNK_BITS;
const MAX_CHUNKS: usize = 1 << (32 - GEN_BITS - CHUNK_BITS);
/// Most registrations a soft device holds at once.
pub const MAX_MRS: usize = MAX_CHUNKS * CHUNK_SLOTS;
/// The pin count: the low half of a gate.
const PINS: u64 = u32::MAX as u64;
/// What slot 0 (never registered) holds as its key: no key of index 0 equals it.
const SLOT0_KEY: u32 = u32::MAX;

struct Slot {
    /// Key (high half, 0 when not registered) and pin count (low half).
    gate: AtomicU64,
    addr: AtomicU64,
    len: AtomicU64,
    access: AtomicU32,
}

macro_rules! new_slot {
    () => {
        Slot { gate: AtomicU64::new(0), addr: AtomicU64::new(0), len: AtomicU64::new(0), access: AtomicU32::new(0) }
    };
}

impl Slot {
    // loom's atomics are not made in a `const fn`.
    #[cfg(not(loom))]
    const fn new() -> Slot {
        new_slot!()
    }
    #[cfg(loom)]
    fn new() -> Slot {
        new_slot!()
    }
}

/// What the chunks not allocated yet point to (see the module documentation). Under the
/// model checker, whose atomics live only in a model's run, each table has its own.
#[cfg(not(loom))]
static EMPTY: Chunk = [const { Slot::new() }; CHUNK_SLOTS];

/// The key half of a gate value.
#[inline]
fn key_of(gate: u64) -> u32 {
    (gate >> 32) as u32
}

type Chunk = [Slot; CHUNK_SLOTS];

struct Alloc {
    /// Free slot indexes, with the generation each will use next.
    free: Vec<(u32, u32)>,
    /// Slots whose generations are spent, oldest first: taken again (from generation 1)
    /// only once every chunk is allocated and no free slot is left.
    retired: VecDeque<u32>,
    chunks: usize,
}

/// Where the next registration goes.
#[derive(Debug, PartialEq)]
enum Next {
    /// A slot index and the generation its key gets.
    Slot(u32, u32),
    /// No free slot: allocate a chunk first.
    NewChunk,
    /// Every slot of every chunk is registered now.
    Full,
}

impl Alloc {
    fn next(&mut self, max_chunks: usize) -> Next {
        if let Some((index, generation)) = self.free.pop() {
            return Next::Slot(index, generation);
        }
        if self.chunks < max_chunks {
            return Next::NewChunk;
        }
        match self.retired.pop_front() {
            Some(index) => Next::Slot(index, 1),
            None => Next::Full,
        }
    }

    /// Slot `index`, registered last with `generation`, is free again.
    fn release(&mut self, index: u32, generation: u32) {
        if generation == GEN_MASK {
            self.retired.push_back(index);
        } else {
            self.free.push((index, generation + 1));
        }
    }
}

/// The registrations of one device.
pub struct MrTable {
    /// Indexed by `key >> (GEN_BITS + CHUNK_BITS)`, which is always in range: no bounds
    /// check on the data path. [`EMPTY`] where no chunk is allocated yet.
    chunks: [AtomicPtr<Chunk>; MAX_CHUNKS],
    alloc: Mutex<Alloc>,
    #[cfg(loom)]
    empty: Box<Chunk>,
}

/// A registration pinned for one access: its memory stays registered until this drops.
pub struct Pinned<'a> {
    slot: &'a Slot,
}

impl Pinned<'_> {
    /// The start of the pinned region.
    #[cfg(test)]
    pub fn addr(&self) -> u64 {
        self.slot.addr.load(Ordering::Relaxed)
    }

    /// The size of the pinned region.
    #[cfg(all(test, loom))]
    pub fn size(&self) -> u64 {
        self.slot.len.load(Ordering::Relaxed)
    }
}

impl Drop for Pinned<'_> {
    #[inline]
    fn drop(&mut self) {
        // Release: the accesses made under this pin happen before dereg's wait sees it gone.
        self.slot.gate.fetch_sub(1, Ordering::Release);
    }
}

impl Default for MrTable {
    fn default() -> Self {
        #[cfg(loom)]
        let empty: Box<Chunk> = Box::new(std::array::from_fn(|_| Slot::new()));
        #[cfg(not(loom))]
        let empty_chunk = &EMPTY as *const Chunk as *mut Chunk;
        #[cfg(loom)]
        let empty_chunk = &*empty as *const Chunk as *mut Chunk;
        let t = MrTable {
            chunks: std::array::from_fn(|_| AtomicPtr::new(empty_chunk)),
            alloc: Mutex::new(Alloc { free: Vec::new(), retired: VecDeque::new(), chunks: 0 }),
            #[cfg(loom)]
            empty,
        };
        // Chunk 0 now: key 0 (index 0) must never land in `EMPTY`, whose key halves are 0.
        t.add_chunk(&mut t.alloc.lock());
        t
    }
}

impl MrTable {
    /// [`EMPTY`] as a chunk pointer (never written through: only its atomics change).
    fn empty(&self) -> *mut Chunk {
        #[cfg(not(loom))]
        let p: *const Chunk = &EMPTY;
        #[cfg(loom)]
        let p: *const Chunk = &*self.empty;
        p as *mut Chunk
    }

    /// The key the first registration of a table gets (slot 1, generation 1).
    #[cfg(all(test, loom))]
    pub fn first_key() -> u32 {
        1 << GEN_BITS | 1
    }

    #[inline(always)]
    fn slot(&self, index: u32) -> &Slot {
        let chunk = self.chunks[index as usize >> CHUNK_BITS].load(Ordering::Acquire);
        // SAFETY: a chunk pointer is `EMPTY` (a static, or the table's own) or was published (Release) by
        // `add_chunk` from a live Box, freed only in `Drop`, which has `&mut self`; so it is
        // never null either (said to the compiler, which otherwise checks the `Pinned` built
        // from it for null where a caller matches the `Option`).
        let chunk = unsafe {
            std::hint::assert_unchecked(!chunk.is_null());
            &*chunk
        };
        &chunk[index as usize & (CHUNK_SLOTS - 1)]
    }

    /// Allocates the next chunk and puts its slots on the free list (`alloc` locked).
    fn add_chunk(&self, a: &mut Alloc) {
        let chunk: Box<Chunk> = Box::new(std::array::from_fn(|_| Slot::new()));
        if a.chunks == 0 {
            chunk[0].gate.store((SLOT0_KEY as u64) << 32, Ordering::Relaxed);
        }
        let base = (a.chunks * CHUNK_SLOTS) as u32;
        self.chunks[a.chunks].store(Box::into_raw(chunk), Ordering::Release);
        a.chunks += 1;
        // Slot 0 is never used, so no key is 0. Reverse: pop takes the lowest first.
        a.free.extend((base..base + CHUNK_SLOTS as u32).rev().filter(|i| *i != 0).map(|i| (i, 1)));
    }

    /// Registers `[addr, addr + len)` and returns its key (never 0).
    pub fn reg(&self, addr: u64, len: u64, access: Access) -> Result<u32> {
        if addr.checked_add(len).is_none() {
            return Err(Error::invalid_argument(format!("memory region {addr:#x}+{len} wraps around")));
        }
        let mut a = self.alloc.lock();
        let (index, generation) = loop {
            match a.next(MAX_CHUNKS) {
                Next::Slot(index, generation) => break (index, generation),
                Next::NewChunk => self.add_chunk(&mut a),
                Next::Full => {
                    return Err(Error::system(format!("soft fabric: more than {MAX_MRS} memory registrations")));
                }
            }
        };
        drop(a);
        let slot = self.slot(index);
        let key = index << GEN_BITS | generation;
        slot.addr.store(addr, Ordering::Relaxed);
        slot.len.store(len, Ordering::Relaxed);
        slot.access.store(access.bits(), Ordering::Relaxed);
        // Release: a pin that sees the key sees the fields above. The key half is 0 here
        // (pins that fail may be counting in the low half).
        slot.gate.fetch_or((key as u64) << 32, Ordering::Release);
        Ok(key)
    }

    /// Deregisters `key`; returns when no access under an earlier pin is still running.
    pub fn dereg(&self, key: u32) -> Result<()> {
        let index = key >> GEN_BITS;
        let slot = Some(self.slot(index)).filter(|s| index != 0 && key_of(s.gate.load(Ordering::Relaxed)) == key);
        let Some(slot) = slot else {
            return Err(Error::invalid_argument(format!("soft fabric: deregistering unknown key {key:#x}")));
        };
        let prev = slot.gate.fetch_and(PINS, Ordering::AcqRel);
        if key_of(prev) != key {
            return Err(Error::invalid_argument(format!("soft fabric: key {key:#x} deregistered twice")));
        }
        wait_while(|| slot.gate.load(Ordering::Acquire) & PINS != 0);
        self.alloc.lock().release(index, key & GEN_MASK);
        Ok(())
    }

    /// Pins the registration of `key` for one access, or `None` when no such key is
    /// registered now.
    #[inline(always)]
    pub fn pin(&self, key: u32) -> Option<Pinned<'_>> {
        let slot = self.slot(key >> GEN_BITS);
        // Acquire: a key seen here was published with the fields `pin_range` reads.
        let gate = slot.gate.fetch_add(1, Ordering::Acquire);
        // Dropping `pinned` unpins, whichever way this goes.
        let pinned = Pinned { slot };
        (key_of(gate) == key).then_some(pinned)
    }

    /// Pins `key` for an access to `[addr, addr + len)` that needs `need`: one lookup that
    /// validates the key, the rights and the range, and pins.
    #[inline(always)]
    pub fn pin_range(&self, key: u32, addr: u64, len: u64, need: Access) -> Option<Pinned<'_>> {
        let pinned = self.pin(key)?;
        let s = pinned.slot;
        let (start, size) = (s.addr.load(Ordering::Relaxed), s.len.load(Ordering::Relaxed));
        // (`need` is a constant at every call: a local SGE needs no right, and no load.)
        let rights = need.is_empty() || s.access.load(Ordering::Relaxed) & need.bits() == need.bits();
        // `addr + len <= start + size` without overflow (`start + size` does not wrap: `reg`).
        let inside = addr >= start && len <= size && addr - start <= size - len;
        (rights && inside).then_some(pinned)
    }
}

impl Drop for MrTable {
    fn drop(&mut self) {
        for c in self.chunks.iter() {
            let p = c.load(Ordering::Acquire);
            if p != self.empty() {
                // SAFETY: published from Box::into_raw in `add_chunk`, freed only here, once.
                drop(unsafe { Box::from_raw(p) });
            }
        }
    }
}

#[cfg(all(test, not(loom)))]
mod tests {
    use super::*;

    #[test]
    fn keys_check_range_access_and_generation() {
        let t = MrTable::default();
        let k = t.reg(0x1000, 0x100, Access::REMOTE_WRITE).unwrap();
        assert_ne!(k, 0);
        assert!(t.pin_range(k, 0x1000, 0x100, Access::REMOTE_WRITE).is_some());
        assert!(t.pin_range(k, 0x10ff, 1, Access::REMOTE_WRITE).is_some());
        assert!(t.pin_range(k, 0x10ff, 2, Access::REMOTE_WRITE).is_none());
        assert!(t.pin_range(k, 0xfff, 1, Access::REMOTE_WRITE).is_none());
        assert!(t.pin_range(k, u64::MAX, 2, Access::REMOTE_WRITE).is_none());
        assert!(t.pin_range(k, 0x1000, 1, Access::REMOTE_READ).is_none());
        assert!(t.pin(k ^ 1).is_none());
        // Slot 0 is never registered: no key of index 0 pins, 0 included.
        for k0 in [0, 1, GEN_MASK, SLOT0_KEY] {
            assert!(t.pin(k0).is_none(), "key {k0:#x}");
        }
        // A slot never registered holds key 0, which its keys never equal.
        assert!(t.pin(k + (1 << GEN_BITS)).is_none());
        t.dereg(k).unwrap();
        assert!(t.pin(k).is_none());
        assert!(t.dereg(k).is_err());
        let k2 = t.reg(0x2000, 8, Access::REMOTE_READ).unwrap();
        assert_eq!(k2 >> GEN_BITS, k >> GEN_BITS, "the slot is reused");
        assert_ne!(k2, k, "with a new generation");
        assert!(t.pin(k).is_none());
        assert_eq!(t.pin(k2).unwrap().addr(), 0x2000);
    }

    /// Keys of chunks not allocated yet land in `EMPTY` and fail every way (a 0-byte range
    /// at the slot's address 0 included), and deregistering them leaves `EMPTY` as it was.
    #[test]
    fn keys_of_unallocated_chunks_fail() {
        let t = MrTable::default();
        let k = t.reg(0, 64, Access::REMOTE_WRITE).unwrap();
        for bogus in [1 << (GEN_BITS + CHUNK_BITS), (5000 << GEN_BITS) | 1, u32::MAX, u32::MAX - GEN_MASK] {
            assert!(t.pin(bogus).is_none(), "key {bogus:#x}");
            assert!(t.pin_range(bogus, 0, 0, Access::empty()).is_none(), "key {bogus:#x}");
            assert!(t.dereg(bogus).is_err(), "key {bogus:#x}");
        }
        assert!(EMPTY.iter().all(|s| key_of(s.gate.load(Ordering::Relaxed)) == 0), "EMPTY is never registered");
        assert!(t.pin_range(k, 0, 64, Access::REMOTE_WRITE).is_some());
    }

    #[test]
    fn dereg_waits_for_pins() {
        let t = std::sync::Arc::new(MrTable::default());
        let k = t.reg(0, 64, Access::REMOTE_WRITE).unwrap();
        let released = std::sync::Arc::new(std::sync::atomic::AtomicBool::new(false));
        let p = t.pin(k).unwrap();
        let (t2, r2) = (t.clone(), released.clone());
        let h = std::thread::spawn(move || {
            t2.dereg(k).unwrap();
            r2.load(Ordering::Acquire)
        });
        std::thread::sleep(std::time::Duration::from_millis(50));
        released.store(true, Ordering::Release);
        drop(p);
        assert!(h.join().unwrap(), "dereg returned while a pin was held");
    }

    /// A slot registered and deregistered 4,095 times has spent its generations: the next
    /// registration goes elsewhere, and none of the old keys (its first included) pins.
    #[test]
    fn a_spent_slot_is_retired_and_its_keys_never_match_again() {
        let t = MrTable::default();
        let first = t.reg(0x1000, 64, Access::REMOTE_WRITE).unwrap();
        let slot = first >> GEN_BITS;
        let mut keys = vec![first];
        t.dereg(first).unwrap();
        for _ in 1..GEN_MASK {
            let k = t.reg(0x1000, 64, Access::REMOTE_WRITE).unwrap();
            assert_eq!(k >> GEN_BITS, slot, "the slot is reused while it has generations");
            keys.push(k);
            t.dereg(k).unwrap();
        }
        assert_eq!(keys.len(), GEN_MASK as usize);
        let next = t.reg(0x1000, 64, Access::REMOTE_WRITE).unwrap();
        assert_ne!(next >> GEN_BITS, slot, "the spent slot is retired");
        for _ in 0..2 * CHUNK_SLOTS {
            let k = t.reg(0x2000, 64, Access::REMOTE_WRITE).unwrap();
            assert!(!keys.contains(&k), "key {k:#x} came back");
            t.dereg(k).unwrap();
        }
        assert!(keys.iter().all(|k| t.pin(*k).is_none()), "a stale key pins");
    }

    /// Retired slots are taken again, oldest first and from generation 1, only when every
    /// chunk is allocated and no slot is free.
    #[test]
    fn retired_slots_come_back_only_when_the_table_is_full() {
        let mut a = Alloc { free: vec![(9, 3)], retired: VecDeque::from([5, 7]), chunks: 2 };
        assert_eq!(a.next(4), Next::Slot(9, 3));
        assert_eq!(a.next(4), Next::NewChunk, "a new chunk before a retired slot");
        a.chunks = 4;
        assert_eq!(a.next(4), Next::Slot(5, 1), "the longest retired first");
        a.release(5, GEN_MASK - 1);
        assert_eq!(a.free, vec![(5, GEN_MASK)]);
        assert_eq!(a.next(4), Next::Slot(5, GEN_MASK));
        a.release(5, GEN_MASK);
        assert_eq!(a.next(4), Next::Slot(7, 1));
        assert_eq!(a.next(4), Next::Slot(5, 1));
        assert_eq!(a.next(4), Next::Full);
    }

    #[test]
    fn many_registrations_grow_the_table() {
        let t = MrTable::default();
        let keys: Vec<u32> = (0..3000).map(|i| t.reg(i * 16, 16, Access::LOCAL_WRITE).unwrap()).collect();
        for (i, k) in keys.iter().enumerate() {
            assert_eq!(t.pin(*k).unwrap().addr(), i as u64 * 16);
        }
        for k in keys {
            t.dereg(k).unwrap();
        }
    }
}
