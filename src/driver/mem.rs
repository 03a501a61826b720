//! Memory that a plugin reads and writes behind Rust's back: the buffers given to `regMr`,
//! `isend` and `irecv`. Page-aligned (as NCCL's staging buffers are), zero-filled, mapped
//! lazily by the kernel so a 600 MiB arena costs nothing until touched.
//!
//! The plugin (its NIC, or the soft fabric's helper thread) may write into a range while a
//! receive is in flight there, so handing out `&[u8]` is only sound for ranges that no
//! request is using: the accessors are `unsafe` with that contract, and the workload loops
//! uphold it (they touch a slot only before posting it and after `test` said done).

use std::ptr::NonNull;

use super::{Error, Result};

/// An anonymous private mapping.
pub struct Arena {
    ptr: NonNull<u8>,
    len: usize,
}

// SAFETY: the arena is plain memory; who may touch which range is the accessors' contract.
unsafe impl Send for Arena {}
// SAFETY: as above.
unsafe impl Sync for Arena {}

impl Arena {
    /// `len` bytes (at least one page), zero-filled.
    pub fn new(len: usize) -> Result<Arena> {
        let len = len.max(1).next_multiple_of(4096);
        // SAFETY: an anonymous private mapping with no address hint; the result is checked.
        let p = unsafe {
            libc::mmap(
                std::ptr::null_mut(),
                len,
                libc::PROT_READ | libc::PROT_WRITE,
                libc::MAP_PRIVATE | libc::MAP_ANONYMOUS | libc::MAP_NORESERVE,
                -1,
                0,
            )
        };
        if p == libc::MAP_FAILED {
            return Err(Error::io(format!("mmap of {len} bytes: {}", std::io::Error::last_os_error())));
        }
        Ok(Arena { ptr: NonNull::new(p.cast()).expect("mmap never returns NULL on success"), len })
    }

    pub fn len(&self) -> usize {
        self.len
    }

    pub fn is_empty(&self) -> bool {
        self.len == 0
    }

    /// The address of byte `off` (for the plugin).
    pub fn addr(&self, off: usize) -> *mut u8 {
        assert!(off <= self.len, "offset {off} beyond the {}-byte arena", self.len);
        // SAFETY: `off` is within the mapping (or one past its end).
        unsafe { self.ptr.as_ptr().add(off) }
    }

    /// Whether `[off, off + len)` lies inside the arena.
    pub fn contains(&self, off: usize, len: usize) -> bool {
        off.checked_add(len).is_some_and(|end| end <= self.len)
    }

    /// The bytes `[off, off + len)`.
    ///
    /// # Safety
    /// No request may be in flight on the range, and no `bytes_mut` borrow of it may be live.
    pub unsafe fn bytes(&self, off: usize, len: usize) -> &[u8] {
        assert!(self.contains(off, len), "[{off}, +{len}) outside the {}-byte arena", self.len);
        // SAFETY: in bounds (checked); the caller guarantees nobody writes the range.
        unsafe { std::slice::from_raw_parts(self.ptr.as_ptr().add(off), len) }
    }

    /// The bytes `[off, off + len)`, writable.
    ///
    /// # Safety
    /// No request may be in flight on the range, and no other borrow of it may be live.
    #[allow(clippy::mut_from_ref)]
    pub unsafe fn bytes_mut(&self, off: usize, len: usize) -> &mut [u8] {
        assert!(self.contains(off, len), "[{off}, +{len}) outside the {}-byte arena", self.len);
        // SAFETY: in bounds (checked); the caller guarantees exclusive access to the range.
        unsafe { std::slice::from_raw_parts_mut(self.ptr.as_ptr().add(off), len) }
    }
}

impl Drop for Arena {
    fn drop(&mut self) {
        // SAFETY: the mapping made in `new`, unmapped once. Registrations borrow the arena,
        // so they were deregistered before this runs.
        unsafe { libc::munmap(self.ptr.as_ptr().cast(), self.len) };
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
