//! Host memory that NICs read and write: page-aligned, zeroed, registered by the plugin.
//! The only way the layers above touch memory a peer writes into: word loads with the
//! ordering the protocol needs, and stores of the local sources of small writes.

use std::alloc::{Layout, alloc_zeroed, dealloc};
use std::sync::atomic::{AtomicU64, Ordering};

use crate::error::{Error, Result};

const PAGE: usize = 4096;

/// A page-aligned, zero-initialised host buffer whose address never changes.
pub struct HostRegion {
    ptr: *mut u8,
    len: usize,
}

// SAFETY: the region is plain memory owned by this value; concurrent access by a NIC or a
// peer-serving thread goes through the atomic and volatile accessors below.
unsafe impl Send for HostRegion {}
// SAFETY: as above; `&HostRegion` only allows atomic loads/stores and volatile reads.
unsafe impl Sync for HostRegion {}

impl HostRegion {
    /// `len` bytes (rounded up to whole pages), zeroed.
    pub fn new(len: usize) -> Result<Self> {
        let len = len.max(8).div_ceil(PAGE) * PAGE;
        let layout = Layout::from_size_align(len, PAGE).map_err(|e| Error::internal(format!("region layout: {e}")))?;
        // SAFETY: the layout has a non-zero size.
        let ptr = unsafe { alloc_zeroed(layout) };
        if ptr.is_null() {
            return Err(Error::system(format!("cannot allocate a {len}-byte registered region")));
        }
        Ok(HostRegion { ptr, len })
    }

    pub fn addr(&self) -> u64 {
        self.ptr as u64
    }

    pub fn as_mut_ptr(&self) -> *mut u8 {
        self.ptr
    }

    pub fn len(&self) -> usize {
        self.len
    }

    pub fn is_empty(&self) -> bool {
        self.len == 0
    }

    fn word(&self, off: usize) -> &AtomicU64 {
        assert!(off.is_multiple_of(8) && off + 8 <= self.len, "word offset {off} outside a {}-byte region", self.len);
        // SAFETY: in bounds and 8-aligned (the base is page-aligned); the memory lives as
        // long as `self`, and all concurrent accesses to it are atomic or by the NIC.
        unsafe { AtomicU64::from_ptr(self.ptr.add(off).cast::<u64>()) }
    }

    /// Acquire load of the word at `off`: pairs with the placement of a peer's WRITE
    /// whose last word this is (the fabric stores it last, with Release).
    /// The `N` words from byte `off` on, bounds-checked once (a CTS entry is eight).
    #[inline]
    fn words<const N: usize>(&self, off: usize) -> &[AtomicU64; N] {
        assert!(
            off.is_multiple_of(8) && off <= self.len && self.len - off >= 8 * N,
            "{N} words at offset {off} outside a {}-byte region",
            self.len
        );
        // SAFETY: in bounds and 8-aligned (the base is page-aligned); the memory lives as
        // long as `self`, and all concurrent accesses to it are atomic or by the NIC.
        unsafe { &*self.ptr.add(off).cast::<[AtomicU64; N]>() }
    }

    /// Relaxed loads of the `N` words from byte `off` on.
    #[inline]
    pub fn load_words<const N: usize>(&self, off: usize) -> [u64; N] {
        self.words::<N>(off).each_ref().map(|w| w.load(Ordering::Relaxed))
    }

    /// Relaxed stores of `v` into the words from byte `off` on, in order.
    #[inline]
    pub fn store_words<const N: usize>(&self, off: usize, v: &[u64; N]) {
        for (w, &x) in self.words::<N>(off).iter().zip(v) {
            w.store(x, Ordering::Relaxed);
        }
    }

    #[inline]
    pub fn load_acquire(&self, off: usize) -> u64 {
        self.word(off).load(Ordering::Acquire)
    }

    /// Relaxed load of the word at `off` (after an acquire load that ordered it).
    #[inline]
    pub fn load(&self, off: usize) -> u64 {
        self.word(off).load(Ordering::Relaxed)
    }

    /// Store of the word at `off` (a local source of a later WRITE; the post orders it).
    #[inline]
    pub fn store(&self, off: usize, v: u64) {
        self.word(off).store(v, Ordering::Relaxed)
    }
}

impl Drop for HostRegion {
    fn drop(&mut self) {
        // SAFETY: allocated in `new` with exactly this layout.
        unsafe { dealloc(self.ptr, Layout::from_size_align_unchecked(self.len, PAGE)) }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn zeroed_page_aligned_words() {
        let r = HostRegion::new(100).unwrap();
        assert_eq!(r.len(), 4096);
        assert_eq!(r.addr() % 4096, 0);
        assert_eq!(r.load(0), 0);
        r.store(4088, 7);
        assert_eq!(r.load_acquire(4088), 7);
    }

    #[test]
    fn words_round_trip_and_are_checked_as_a_whole() {
        let r = HostRegion::new(100).unwrap();
        r.store_words(4096 - 64, &[1, 2, 3, 4, 5, 6, 7, 8]);
        assert_eq!(r.load_words::<8>(4096 - 64), [1, 2, 3, 4, 5, 6, 7, 8]);
        assert_eq!(r.load(4088), 8);
        let past_end = std::panic::catch_unwind(|| r.load_words::<8>(4096 - 56));
        assert!(past_end.is_err(), "the last word lies past the region");
        assert!(std::panic::catch_unwind(|| r.load_words::<2>(4)).is_err(), "unaligned");
    }

    #[test]
    #[should_panic(expected = "outside")]
    fn out_of_bounds_word_panics_not_corrupts() {
        HostRegion::new(8).unwrap().load(4096);
    }
}
