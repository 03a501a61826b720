//! Memory that a plugin reads and writes behind Rust's back: the buffers given to `regMr`,
//! `isend` and `irecv`. Page-aligned (as NCCL's staging buffers are) and zero-filled.
//!
//! The plugin (its NIC, or the soft fabric's helper thread) may write into a range while a
//! receive is in flight there, so handing out `&[u8]` is only sound for ranges that no
//! request is using: the accessors are `unsafe` with that contract, and the workload loops
//! uphold it (they touch a slot only before posting it and after `test` said done).

use super::{Error, Result};

const PAGE: usize = 4096;

/// Page-aligned, zeroed memory from an anonymous private mapping (the kernel backs pages as
/// they are touched, so a large arena costs only what is used), with byte access for the
/// workload loops. The mapping never moves and is unmapped on drop.
pub struct Arena {
    ptr: *mut u8,
    len: usize,
}

// SAFETY: the mapping is plain memory owned by this value; shared access to its bytes goes
// through the `unsafe` accessors below, whose contract rules out concurrent writers.
unsafe impl Send for Arena {}
// SAFETY: as above.
unsafe impl Sync for Arena {}

impl Arena {
    /// `len` bytes (rounded up to whole pages, at least one), zero-filled.
    pub fn new(len: usize) -> Result<Arena> {
        let len = len.max(1).div_ceil(PAGE) * PAGE;
        // SAFETY: an anonymous private mapping at an address the kernel picks; no fd.
        let ptr = unsafe {
            libc::mmap(
                std::ptr::null_mut(),
                len,
                libc::PROT_READ | libc::PROT_WRITE,
                libc::MAP_PRIVATE | libc::MAP_ANONYMOUS,
                -1,
                0,
            )
        };
        if ptr == libc::MAP_FAILED {
            let e = std::io::Error::last_os_error();
            return Err(Error::io(format!("buffer of {len} bytes: {e}")));
        }
        Ok(Arena { ptr: ptr.cast(), len })
    }

    pub fn len(&self) -> usize {
        self.len
    }

    pub fn is_empty(&self) -> bool {
        self.len == 0
    }

    /// The address of byte `off` (for the plugin).
    pub fn addr(&self, off: usize) -> *mut u8 {
        assert!(off <= self.len(), "offset {off} beyond the {}-byte arena", self.len());
        self.ptr.wrapping_add(off)
    }

    /// Whether `[off, off + len)` lies inside the arena.
    pub fn contains(&self, off: usize, len: usize) -> bool {
        off.checked_add(len).is_some_and(|end| end <= self.len())
    }

    /// The bytes `[off, off + len)`.
    ///
    /// # Safety
    /// No request may be in flight on the range, and no `bytes_mut` borrow of it may be live.
    pub unsafe fn bytes(&self, off: usize, len: usize) -> &[u8] {
        assert!(self.contains(off, len), "[{off}, +{len}) outside the {}-byte arena", self.len());
        // SAFETY: in bounds (checked) of memory that lives as long as `self`; the caller
        // guarantees nobody writes the range meanwhile.
        unsafe { std::slice::from_raw_parts(self.addr(off), len) }
    }

    /// The bytes `[off, off + len)`, writable.
    ///
    /// # Safety
    /// No request may be in flight on the range, and no other borrow of it may be live.
    #[allow(clippy::mut_from_ref)]
    pub unsafe fn bytes_mut(&self, off: usize, len: usize) -> &mut [u8] {
        assert!(self.contains(off, len), "[{off}, +{len}) outside the {}-byte arena", self.len());
        // SAFETY: in bounds (checked) of memory that lives as long as `self`; the caller
        // guarantees exclusive access to the range.
        unsafe { std::slice::from_raw_parts_mut(self.addr(off), len) }
    }
}

impl Drop for Arena {
    fn drop(&mut self) {
        // SAFETY: unmaps exactly the mapping `new` made, once; no borrow outlives `self`.
        unsafe { libc::munmap(self.ptr.cast(), self.len) };
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn page_aligned_zeroed_and_bounds_checked() {
        let a = Arena::new(10_000).unwrap();
        assert_eq!(a.len(), 12_288);
        assert_eq!(a.addr(0) as usize % 4096, 0);
        assert!(a.contains(12_000, 288) && !a.contains(12_000, 289) && !a.contains(usize::MAX, 2));
        // SAFETY: no plugin touches this arena.
        unsafe {
            assert!(a.bytes(0, a.len()).iter().all(|&b| b == 0));
            a.bytes_mut(100, 3).copy_from_slice(b"abc");
            assert_eq!(a.bytes(99, 5), b"\0abc\0");
        }
    }
}
