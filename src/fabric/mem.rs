//! Host memory that NICs read and write: page-aligned, zeroed, registered by the plugin.
//! The only way the layers above touch memory a peer writes into: word loads with the
//! ordering the protocol needs, and stores of the local sources of small writes.

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
    /// `len` bytes (rounded up to whole pages), zeroed. Mapped from the kernel, not the
    /// heap: a page nobody wrote yet (a control ring of a connection that never failed
    /// over) takes no memory, and no heap data shares a registered page.
    pub fn new(len: usize) -> Result<Self> {
        let len = len.max(8).div_ceil(PAGE) * PAGE;
        // SAFETY: an anonymous private mapping at an address the kernel picks; no other
        // memory is touched. The result is checked before use.
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
            return Err(Error::system(format!(
                "cannot map a {len}-byte registered region: {}",
                std::io::Error::last_os_error()
            )));
        }
        Ok(HostRegion { ptr: ptr.cast(), len })
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
        // SAFETY: mapped in `new` with exactly this length; nothing refers to it any more
        // (the region is dropped after its registrations).
        unsafe { libc::munmap(self.ptr.cast(), self.len) };
    }
}

/// Checks that every byte of `[addr, addr + len)` is mapped in this process, readable, and
/// writable when `write`: what the kernel's pinning checks when a verbs NIC registers
/// memory, for a fabric whose "NIC" is the CPU (the soft fabric), which would otherwise
/// take a SIGSEGV when a peer's data arrives. Reads `/proc/self/maps`: registration is
/// rare, and a process has thousands of mappings at most. A mapping changed after the
/// check (memory freed while registered) is the application's error, as with verbs.
pub fn check_mapped(addr: u64, len: u64, write: bool) -> Result<()> {
    if len == 0 {
        return Ok(());
    }
    let maps = std::fs::read_to_string("/proc/self/maps").map_err(|e| Error::io("read /proc/self/maps", &e))?;
    check_maps(&maps, addr, len, write)
}

/// [`check_mapped`] against a `/proc/<pid>/maps` text (ascending, one mapping per line:
/// `start-end perms ...`).
fn check_maps(maps: &str, addr: u64, len: u64, write: bool) -> Result<()> {
    let what = |why: String| Error::invalid_argument(format!("{len} bytes at {addr:#x} cannot be registered: {why}"));
    let end = addr.checked_add(len).ok_or_else(|| what("the range wraps around".into()))?;
    let mut at = addr;
    for line in maps.lines() {
        let mut f = line.split_whitespace();
        let (Some(range), Some(perms)) = (f.next(), f.next()) else { continue };
        let Some((s, e)) = range.split_once('-') else { continue };
        let (Ok(s), Ok(e)) = (u64::from_str_radix(s, 16), u64::from_str_radix(e, 16)) else { continue };
        if e <= at {
            continue;
        }
        if s > at {
            break; // a hole at `at`
        }
        let p = perms.as_bytes();
        if p.first() != Some(&b'r') || (write && p.get(1) != Some(&b'w')) {
            let how = if write { "readable and writable (peers write into registered memory)" } else { "readable" };
            return Err(what(format!("the mapping at {s:#x} ({perms}) is not {how}")));
        }
        at = e;
        if at >= end {
            return Ok(());
        }
    }
    Err(what(format!("nothing is mapped at {at:#x}")))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn mappings_must_cover_the_range_with_the_rights_asked() {
        let maps = "\
1000-3000 rw-p 00000000 00:00 0
3000-4000 r--p 00000000 00:00 0   /lib/x.so
5000-6000 rw-s 00000000 00:00 0   [shared]
6000-7000 ---p 00000000 00:00 0
";
        let ok = |a, l, w| check_maps(maps, a, l, w).is_ok();
        assert!(ok(0x1000, 0x2000, true) && ok(0x1fff, 1, true));
        assert!(ok(0x2000, 0x2000, false), "read-only is enough to be read");
        assert!(!ok(0x2000, 0x1001, true), "a read-only page in the range");
        let e = check_maps(maps, 0x3800, 0x1000, false).unwrap_err();
        assert!(e.msg().contains("nothing is mapped at 0x4000"), "{e}");
        assert!(ok(0x5000, 0x1000, true), "a shared writable mapping");
        let e = check_maps(maps, 0x6000, 8, false).unwrap_err();
        assert!(e.msg().contains("(---p) is not readable"), "{e}");
        assert!(!ok(0x800, 0x1000, false), "starts in a hole");
        assert!(!ok(0x6ff0, 0x20, false));
        assert!(!ok(u64::MAX - 4, 8, false), "wraps");
    }

    #[test]
    fn this_process_heap_is_mapped_and_a_freed_page_is_not() {
        let r = HostRegion::new(3 * PAGE).unwrap();
        assert!(check_mapped(r.addr() + 5, 2 * PAGE as u64, true).is_ok());
        assert!(check_mapped(0, 0, true).is_ok(), "nothing to check");
        assert!(check_mapped(8, 8, false).is_err(), "page 0 is never mapped");
    }

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
