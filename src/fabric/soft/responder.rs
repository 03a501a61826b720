//! The responder half of a connection: which request it executes next, whether it refused
//! one (then every later request of the connection is read and dropped, never executed),
//! whether it waits for a request sent again after a receiver-not-ready refusal (RNR: the
//! requests between are dropped, they come again), which receiver-not-ready wait it
//! counted, and how a WRITE's bytes are placed.
//!
//! Placement order: for a WRITE of at least 8 bytes whose end (`remote_addr + len`) is
//! 8-aligned, the final 8 bytes are stored last, by one `AtomicU64` store with Release
//! ordering, after every other byte of that WRITE. A thread that Acquire-loads that word
//! and sees the new value sees the whole WRITE (what net_ib's CTS FIFO relies on from a
//! NIC's in-order placement).

use std::sync::atomic::{AtomicU64, Ordering};

use super::fault::Fault;

/// The responder state of one connection.
pub struct Responder {
    expect_seq: u32,
    /// A request was refused: later requests are read and dropped, never executed.
    discarding: bool,
    /// The WR whose receiver-not-ready wait was counted.
    rnr_counted: Option<u32>,
    /// TCP: request `seq` was refused with RNR: everything up to its new start is dropped.
    rnr_wait: Option<u32>,
}

/// What to do with a request that arrived.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Verdict {
    Execute,
    /// Read and drop it: a request was refused before (NAK), or it comes before the one
    /// refused with RNR is sent again.
    Drop,
}

impl Responder {
    pub fn new() -> Responder {
        Responder { expect_seq: 0, discarding: false, rnr_counted: None, rnr_wait: None }
    }

    /// Request `seq` arrived: it must be the next in order (or, after an RNR, anything up
    /// to the refused one sent again).
    pub fn next_request(&mut self, seq: u32) -> Result<Verdict, Fault> {
        match self.rnr_wait {
            Some(w) if w != seq => return Ok(Verdict::Drop),
            Some(_) => self.rnr_wait = None,
            None => {}
        }
        if seq != self.expect_seq {
            return Err(Fault::qp(format!("request {seq} out of order (expected {})", self.expect_seq)));
        }
        self.expect_seq = seq.wrapping_add(1);
        Ok(if self.discarding { Verdict::Drop } else { Verdict::Execute })
    }

    /// Request `seq` was refused with RNR: the requester sends it (and what follows) again.
    pub fn rnr(&mut self, seq: u32) {
        self.rnr_wait = Some(seq);
        self.expect_seq = seq;
    }

    /// Whether requests are dropped until one refused with RNR comes again.
    pub fn in_rnr(&self) -> bool {
        self.rnr_wait.is_some()
    }

    /// A request was refused: drop every later one.
    pub fn refuse(&mut self) {
        self.discarding = true;
    }

    /// WR `seq` found the SRQ empty. Whether this wait is new (to be counted once in
    /// `rnr_events`, however often the request comes again).
    pub fn rnr_wait(&mut self, seq: u32) -> bool {
        let new = self.rnr_counted != Some(seq);
        self.rnr_counted = Some(seq);
        new
    }
}

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

/// Places a WRITE of `len` bytes from one contiguous source at `src` to `dst` (the usual
/// case): the final word read first (a loopback WRITE may overlap its source), the body
/// copied, the word stored last when [`final_word_last`] says so.
///
/// # Safety
/// `[src, src + len)` and `[dst, dst + len)` must be valid for the copy (pinned
/// registrations); they may overlap.
#[inline]
pub unsafe fn place_one(src: u64, dst: u64, len: u64) {
    if len < 8 || !(dst + len).is_multiple_of(8) {
        // SAFETY: forwarded from the caller; `ptr::copy` allows overlap.
        unsafe { std::ptr::copy(src as *const u8, dst as *mut u8, len as usize) };
        return;
    }
    // SAFETY: the source holds `len >= 8` valid bytes (caller); unaligned read of 8 of them.
    let w = unsafe { std::ptr::read_unaligned((src + len - 8) as *const u64) };
    if len > 8 {
        // SAFETY: forwarded from the caller; `ptr::copy` allows overlap.
        unsafe { std::ptr::copy(src as *const u8, dst as *mut u8, (len - 8) as usize) };
    }
    // SAFETY: `dst + len - 8` is 8-aligned and lies in the pinned destination (caller).
    unsafe { store_final_word(dst + len - 8, w) };
}
