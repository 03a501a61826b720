//! How a WRITE's bytes land in the responder's memory: the rule the engine relies on, and
//! the in-process copy that keeps it sound in Rust's memory model.
//!
//! - **Placement order.** For a WRITE of at least 8 bytes whose end (`remote_addr + len`) is
//!   8-aligned, the final 8 bytes are stored last, by one `AtomicU64` store with Release
//!   ordering, after every other byte of that WRITE. A thread that Acquire-loads that word
//!   and sees the new value sees the whole WRITE (what net_ib's CTS FIFO relies on from a
//!   NIC's in-order placement).
//! - **Control writes are atomic.** The engine reads its control regions (the CTS FIFO, the
//!   control ring, scratch words) as `AtomicU64` words, and may load a word while the peer
//!   writes it (`poll_cts` looks at entry 0 of a multi-entry CTS, which lies inside the
//!   body, before the final word says the CTS is whole). So a WRITE of at most
//!   [`ATOMIC_MAX`] bytes, the largest a control region takes, stores every byte atomically:
//!   its aligned words as Relaxed `AtomicU64` stores, the bytes before and after them as
//!   `AtomicU8` stores, the final word last (Release). Larger WRITEs (payloads, read only
//!   after their completion) are copied with `ptr::copy`, the final word still last.
//!
//! [`Target`] is the one way the in-process path writes the peer's memory; on TCP the
//! kernel's `readv` places the body (outside the model, as a NIC's DMA) and the link stores
//! the final word with [`store_final_word`].

use std::sync::atomic::{AtomicU8, AtomicU64, Ordering};

/// The largest WRITE whose every byte is stored atomically: larger than any control region
/// a single WRITE fills (a CTS of every FIFO slot, a control ring entry).
pub const ATOMIC_MAX: u64 = 256;

/// Whether a WRITE of `len` bytes at `addr` stores its final 8 bytes last (see the module
/// documentation).
#[inline(always)]
pub fn final_word_last(addr: u64, len: u64) -> bool {
    len >= 8 && (addr + len).is_multiple_of(8)
}

/// Stores a WRITE's final word, after every other byte of it (Release).
///
/// # Safety
/// `word` must be 8-aligned and lie in a registration pinned for the store: memory handed
/// to the NIC, read by others only atomically or after a completion.
#[inline(always)]
pub unsafe fn store_final_word(word: u64, value: u64) {
    // SAFETY: aligned and valid (caller).
    let a = unsafe { AtomicU64::from_ptr(word as *mut u64) };
    a.store(value, Ordering::Release);
}

/// The destination of one in-process WRITE: `len` bytes at `at` in the peer's pinned
/// registration, which the peer's engine may read, as atomics, while they are written.
pub struct Target {
    at: u64,
    len: u64,
}

impl Target {
    /// # Safety
    /// `[at, at + len)` must stay valid for writes while the value lives (a registration
    /// pinned for the WRITE).
    #[inline(always)]
    pub unsafe fn new(at: u64, len: u64) -> Target {
        Target { at, len }
    }

    /// Places the WRITE from one contiguous source at `src` (the usual case).
    ///
    /// # Safety
    /// `[src, src + len)` must be valid for reads; it may overlap the target (a loopback
    /// WRITE within one region).
    #[inline(always)]
    pub unsafe fn place_from(&self, src: u64) {
        let (dst, len) = (self.at, self.len);
        // Whole aligned words, 8 to `ATOMIC_MAX` bytes: every control write.
        if (dst | len).is_multiple_of(8) && len.wrapping_sub(8) < ATOMIC_MAX && src.abs_diff(dst) >= len {
            // SAFETY: the target is valid (`new`), the source too (caller); apart.
            unsafe { store_words(dst, len, src as *const u8) };
            return;
        }
        if len <= ATOMIC_MAX && src.abs_diff(dst) >= len {
            // SAFETY: the target is valid (`new`), the source too (caller); apart.
            unsafe { store_atomic(dst, len, src as *const u8, final_word_last(dst, len)) };
            return;
        }
        // SAFETY: forwarded from the caller; `ptr::copy` allows overlap.
        unsafe { self.place(|from, to, dst| std::ptr::copy((src + from) as *const u8, dst, (to - from) as usize)) }
    }

    /// Places the WRITE, taking its bytes from `gather(from, to, dst)`, which copies bytes
    /// `[from, to)` of the source to `dst` (which may overlap the source).
    ///
    /// # Safety
    /// `gather` must write exactly `to - from` bytes at `dst`, and may be handed the target
    /// itself as `dst`.
    #[inline(never)]
    pub unsafe fn place(&self, gather: impl Fn(u64, u64, *mut u8)) {
        let (dst, len) = (self.at, self.len);
        let last = final_word_last(dst, len);
        if len <= ATOMIC_MAX {
            // Every byte atomic: gathered first (the source may overlap the target), then
            // stored word by word.
            let mut buf = std::mem::MaybeUninit::<[u64; (ATOMIC_MAX / 8) as usize]>::uninit();
            gather(0, len, buf.as_mut_ptr().cast());
            // SAFETY: the target is valid for `len` bytes (`new`); `gather` wrote them to `buf`.
            unsafe { store_atomic(dst, len, buf.as_ptr().cast(), last) };
            return;
        }
        let body = if last { len - 8 } else { len };
        let mut w = [0u8; 8];
        if last {
            // Read before the body is written: a loopback WRITE may overlap its source.
            gather(body, len, w.as_mut_ptr());
        }
        gather(0, body, dst as *mut u8);
        if last {
            // SAFETY: `dst + body` is 8-aligned and lies in the target (`new`).
            unsafe { store_final_word(dst + body, u64::from_ne_bytes(w)) };
        }
    }
}

/// [`store_atomic`] for whole aligned words (`dst` and `len` multiples of 8, `len >= 8`):
/// the words Relaxed, the final one last with Release, without the edge-byte logic.
///
/// # Safety
/// As [`store_atomic`]; `dst` 8-aligned, `len` a multiple of 8 and at least 8.
#[inline(always)]
unsafe fn store_words(dst: u64, len: u64, src: *const u8) {
    let last = dst + len - 8;
    let mut at = dst;
    while at < last {
        // SAFETY: `[at, at + 8)` lies in the target (aligned) and the same offsets in the
        // source (caller).
        unsafe {
            let word = src.add((at - dst) as usize).cast::<u64>().read_unaligned();
            AtomicU64::from_ptr(at as *mut u64).store(word, Ordering::Relaxed);
        }
        at += 8;
    }
    // SAFETY: the final word, aligned, in both ranges.
    unsafe { store_final_word(last, src.add((len - 8) as usize).cast::<u64>().read_unaligned()) };
}

/// Stores `len` bytes from `src` at `dst` atomically: the bytes before the first aligned
/// word and after the last by `AtomicU8`, the aligned words by Relaxed `AtomicU64`, and
/// (`last`) the final word last, Release.
///
/// # Safety
/// `[dst, dst + len)` valid for writes, `[src, src + len)` for reads, not overlapping.
#[inline(always)]
unsafe fn store_atomic(dst: u64, len: u64, src: *const u8, last: bool) {
    let word = |at: u64| {
        // SAFETY: `[at, at + 8)` lies in the target, so the same offsets lie in the source.
        unsafe { std::ptr::read_unaligned(src.add((at - dst) as usize).cast::<u64>()) }
    };
    let store = |at: u64| {
        // SAFETY: `at` is 8-aligned and `[at, at + 8)` lies in the target (the loop below).
        unsafe { AtomicU64::from_ptr(at as *mut u64).store(word(at), Ordering::Relaxed) }
    };
    let byte = |at: u64| {
        // SAFETY: `at` lies in the target, the same offset in the source.
        unsafe { AtomicU8::from_ptr(at as *mut u8).store(*src.add((at - dst) as usize), Ordering::Relaxed) }
    };
    let end = dst + len;
    let mut at = dst;
    while !at.is_multiple_of(8) && at < end {
        byte(at);
        at += 1;
    }
    // With `last`, `end` is aligned and at least 8 past `dst`: the head stops short of it.
    let words_end = (end & !7) - ((last as u64) << 3);
    while at < words_end {
        store(at);
        at += 8;
    }
    if last {
        // SAFETY: `at == end - 8`, aligned, in the target.
        unsafe { store_final_word(at, word(at)) };
        return;
    }
    while at < end {
        byte(at);
        at += 1;
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Every length and alignment up to and past `ATOMIC_MAX`, overlapping or not: the bytes
    /// land exactly, nothing around them changes.
    #[test]
    fn places_every_length_and_alignment_exactly() {
        for len in [0u64, 1, 7, 8, 9, 15, 16, 63, 64, 65, 255, 256, 257, 300] {
            for off in 0..9u64 {
                for shift in [None, Some(0i64), Some(3), Some(-5), Some(8)] {
                    let mut mem = vec![0u64; 128];
                    let base = mem.as_mut_ptr() as u64;
                    let bytes = |m: &Vec<u64>| -> Vec<u8> { m.iter().flat_map(|w| w.to_ne_bytes()).collect() };
                    let src_vec: Vec<u8> = (0..len).map(|i| (i * 7 + 1) as u8).collect();
                    let dst = base + 400 + off;
                    let src = match shift {
                        None => src_vec.as_ptr() as u64,
                        Some(s) => {
                            // A loopback WRITE: the source lies in the same region.
                            let at = (dst as i64 + s) as u64;
                            // SAFETY: within `mem` (400 ± 8 + 300 < 1024).
                            unsafe { std::ptr::copy(src_vec.as_ptr(), at as *mut u8, len as usize) };
                            at
                        }
                    };
                    let mut want = bytes(&mem);
                    want[(400 + off) as usize..(400 + off + len) as usize].copy_from_slice(&src_vec);
                    // SAFETY: both ranges lie in `mem` or `src_vec`.
                    unsafe { Target::new(dst, len).place_from(src) };
                    assert_eq!(bytes(&mem), want, "len {len} off {off} shift {shift:?}");
                }
            }
        }
    }
}
