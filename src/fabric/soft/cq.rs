//! Completion queue and shared receive queue of the soft fabric.
//!
//! A CQ is a fixed ring of completions plus the list of QPs attached to it: `poll` is where
//! the soft NIC runs, making one progress step on every attached connection (in-process
//! mode: on each one and its peer that has work) before it hands out completions. Connections that
//! find the ring full stop producing completions (they stop reading) until it drains, so a
//! CQ never overflows. The ring's lock is shared only with the device's helper thread.
//!
//! An SRQ is a counter of generic WQEs: posting adds, a WRITE_WITH_IMM takes one.
//!
//! The common poll is cheap: the number of queued completions is mirrored in an atomic
//! (an empty CQ is not locked), and connections are stepped only when the CQ's `work` flag
//! says one may need it (a TCP connection attached, or an in-process connection, or its
//! peer, with WRs waiting or a closed peer: see `direct.rs`).

use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicU32, AtomicU64, AtomicUsize, Ordering};

use parking_lot::{Mutex, MutexGuard};

use super::conn::Conn;
use crate::error::{Error, Result};
use crate::fabric::{Completion, CompletionQueue, SharedRecvQueue};

/// A bounded ring of completions: `tail - head` (wrapping counts of pushes and pops) are
/// queued, at `count & mask` in a power-of-two array, at most `cap` (the depth asked for).
pub struct CqRing {
    q: Box<[Completion]>,
    mask: usize,
    cap: usize,
    head: usize,
    tail: usize,
}

impl CqRing {
    fn new(cap: usize) -> CqRing {
        let slots = cap.next_power_of_two();
        CqRing { q: vec![Completion::default(); slots].into_boxed_slice(), mask: slots - 1, cap, head: 0, tail: 0 }
    }

    /// Completions queued.
    #[inline]
    fn len(&self) -> usize {
        self.tail.wrapping_sub(self.head)
    }

    #[inline]
    pub fn full(&self) -> bool {
        self.len() == self.cap
    }

    /// Appends `c`; `false` when the ring is full.
    #[inline(always)]
    pub fn push(&mut self, c: Completion) -> bool {
        if self.full() {
            return false;
        }
        self.q[self.tail & self.mask] = c;
        self.tail = self.tail.wrapping_add(1);
        true
    }

    /// Moves the oldest completions into `out`; returns how many.
    #[inline]
    fn pop_into(&mut self, out: &mut [Completion]) -> usize {
        let n = out.len().min(self.len());
        let mut head = self.head;
        for o in &mut out[..n] {
            *o = self.q[head & self.mask];
            head = head.wrapping_add(1);
        }
        self.head = head;
        n
    }
}

pub struct CqShared {
    ring: Mutex<CqRing>,
    /// Completions in `ring`, stored under its lock: a poll that reads 0 takes no lock.
    queued: AtomicUsize,
    /// A poll must step the attached connections (see the module documentation): raised
    /// whenever one may have work, cleared by the poll that steps them.
    work: AtomicBool,
    /// QPs attached to this CQ; `generation` changes whenever the list does.
    conns: Mutex<Vec<Arc<Conn>>>,
    generation: AtomicU64,
}

/// The locked ring of a CQ. Every change publishes the completion count (Release: a poll
/// that reads it sees the completions; it locks to take them).
pub struct RingGuard<'a> {
    ring: MutexGuard<'a, CqRing>,
    queued: &'a AtomicUsize,
}

impl std::ops::Deref for RingGuard<'_> {
    type Target = CqRing;
    #[inline]
    fn deref(&self) -> &CqRing {
        &self.ring
    }
}

impl RingGuard<'_> {
    /// Appends `c`; `false` when the ring is full.
    #[inline(always)]
    pub fn push(&mut self, c: Completion) -> bool {
        let pushed = self.ring.push(c);
        self.queued.store(self.ring.len(), Ordering::Release);
        pushed
    }

    /// Appends `c` to a ring found not [`CqRing::full`] under this same lock.
    #[inline(always)]
    pub fn push_room(&mut self, c: Completion) {
        debug_assert!(!self.ring.full());
        let ring = &mut *self.ring;
        ring.q[ring.tail & ring.mask] = c;
        ring.tail = ring.tail.wrapping_add(1);
        self.queued.store(ring.len(), Ordering::Release);
    }

    /// Moves the oldest completions into `out`; returns how many.
    #[inline]
    fn pop_into(&mut self, out: &mut [Completion]) -> usize {
        let n = self.ring.pop_into(out);
        self.queued.store(self.ring.len(), Ordering::Release);
        n
    }
}

impl CqShared {
    pub fn new(depth: u32) -> Arc<CqShared> {
        let cap = depth.max(1) as usize;
        Arc::new(CqShared {
            ring: Mutex::new(CqRing::new(cap)),
            queued: AtomicUsize::new(0),
            work: AtomicBool::new(false),
            conns: Mutex::new(Vec::new()),
            generation: AtomicU64::new(0),
        })
    }

    /// Locks the ring of completions.
    #[inline]
    pub fn lock(&self) -> RingGuard<'_> {
        RingGuard { ring: self.ring.lock(), queued: &self.queued }
    }

    /// The next poll steps the attached connections (a connection attached here, or the
    /// peer of one, may have work). Store it after the work itself is visible.
    #[inline]
    pub fn raise_work(&self) {
        self.work.store(true, Ordering::Release);
    }

    pub fn attach(&self, c: Arc<Conn>) {
        self.conns.lock().push(c);
        self.generation.fetch_add(1, Ordering::Release);
        self.raise_work();
    }

    pub fn detach(&self, c: &Arc<Conn>) {
        self.conns.lock().retain(|x| !Arc::ptr_eq(x, c));
        self.generation.fetch_add(1, Ordering::Release);
        // The next poll refreshes its copy (and lets go of `c`).
        self.raise_work();
    }
}

/// A soft completion queue.
pub struct SoftCq {
    pub(super) shared: Arc<CqShared>,
    /// This poller's copy of the attached QPs, refreshed when `generation` moves (control path).
    conns: Vec<Arc<Conn>>,
    seen_generation: u64,
    /// A TCP connection is attached: every poll steps (the NIC answers its peer when polled),
    /// so each step raises `work` again for the next.
    any_tcp: bool,
}

impl SoftCq {
    pub(super) fn new(depth: u32) -> SoftCq {
        SoftCq { shared: CqShared::new(depth), conns: Vec::new(), seen_generation: u64::MAX, any_tcp: false }
    }

    /// Takes a fresh copy of the attached QPs (control path: QPs come and go).
    #[cold]
    fn refresh(&mut self, generation: u64) {
        self.conns = self.shared.conns.lock().clone();
        self.seen_generation = generation;
        self.any_tcp = self.conns.iter().any(|c| !c.inproc);
    }

    /// One progress step on the attached connections that may need one.
    #[inline(never)]
    fn step(&mut self) {
        // Cleared first (a swap reads the latest raise: none is lost): work raised from now
        // on is seen by the next poll. Acquire: the attachments and the work that raised
        // the flag are visible below.
        self.shared.work.swap(false, Ordering::AcqRel);
        let generation = self.shared.generation.load(Ordering::Acquire);
        if generation != self.seen_generation {
            self.refresh(generation);
        }
        if self.any_tcp {
            self.shared.raise_work();
        }
        for c in &self.conns {
            if c.inproc { step_direct(c) } else { step_conn(c) }
        }
    }
}

/// One progress step on TCP connection `c` from a caller (skipped while the helper or
/// another caller holds it: they make the same progress).
#[inline(never)]
pub fn step_conn(c: &Conn) {
    if let Some(mut st) = c.st.try_lock() {
        c.progress(&mut st, true);
    }
}

/// In-process mode: steps `c` and its peer, each only if it has work (WRs waiting on this
/// side's SRQ or CQ, completions not yet retired, a closed peer).
fn step_direct(c: &Conn) {
    if c.work.load(Ordering::Acquire) {
        direct_step(c);
    }
    if let Some((peer, work)) = c.inproc_peer.get()
        && work.load(Ordering::Acquire)
        && let Some(p) = peer.upgrade()
    {
        direct_step(&p);
    }
}

/// Out of line: the common poll finds no work and should not pay for its registers.
#[inline(never)]
fn direct_step(c: &Conn) {
    c.direct_progress(&mut c.st.lock());
}

impl CompletionQueue for SoftCq {
    /// Always inlined into the few drain loops: the common poll is a few loads.
    #[inline(always)]
    fn poll(&mut self, out: &mut [Completion]) -> Result<usize> {
        if self.shared.work.load(Ordering::Relaxed) {
            self.step();
        }
        if self.shared.queued.load(Ordering::Acquire) == 0 {
            return Ok(0);
        }
        Ok(self.shared.lock().pop_into(out))
    }
}

pub struct SrqShared {
    posted: AtomicU32,
    cap: u32,
    pub rnr: AtomicU64,
}

impl SrqShared {
    /// Takes one WQE; `false` when none is posted (receiver not ready).
    pub fn take(&self) -> bool {
        self.posted.fetch_update(Ordering::AcqRel, Ordering::Acquire, |n| n.checked_sub(1)).is_ok()
    }

    /// Returns a WQE taken for a WRITE_IMM that was then refused.
    pub fn give_back(&self) {
        self.posted.fetch_add(1, Ordering::AcqRel);
    }
}

/// A soft shared receive queue.
pub struct SoftSrq {
    pub(super) shared: Arc<SrqShared>,
}

impl SoftSrq {
    pub(super) fn new(depth: u32) -> SoftSrq {
        SoftSrq { shared: Arc::new(SrqShared { posted: AtomicU32::new(0), cap: depth.max(1), rnr: AtomicU64::new(0) }) }
    }

    /// WQEs posted and not yet consumed.
    pub fn posted(&self) -> u32 {
        self.shared.posted.load(Ordering::Acquire)
    }
}

impl SharedRecvQueue for SoftSrq {
    fn post_recv(&mut self, count: u32) -> Result<()> {
        let cap = self.shared.cap;
        self.shared
            .posted
            .fetch_update(Ordering::AcqRel, Ordering::Acquire, |n| n.checked_add(count).filter(|t| *t <= cap))
            .map(|_| ())
            .map_err(|n| Error::invalid_usage(format!("SRQ overflow: {n} WQEs posted, {count} more, depth {cap}")))
    }

    fn rnr_events(&self) -> u64 {
        self.shared.rnr.load(Ordering::Relaxed)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn c(wr_id: u64) -> Completion {
        Completion { wr_id, ..Completion::default() }
    }

    /// A depth that is not a power of two is full at that depth (the array is larger), and
    /// completions come out in order across many wrap-arounds of the array.
    #[test]
    fn ring_is_full_at_its_depth_and_keeps_order_across_wraps() {
        let mut r = CqRing::new(3);
        let mut out = [Completion::default(); 2];
        let (mut pushed, mut popped) = (0u64, 0u64);
        for round in 0..50 {
            while r.push(c(pushed)) {
                pushed += 1;
            }
            assert_eq!(r.len(), 3, "round {round}: full at the depth asked for");
            assert!(r.full());
            let n = r.pop_into(&mut out[..1 + round % 2]);
            for o in &out[..n] {
                assert_eq!(o.wr_id, popped);
                popped += 1;
            }
        }
        while r.len() > 0 {
            let n = r.pop_into(&mut out);
            for o in &out[..n] {
                assert_eq!(o.wr_id, popped);
                popped += 1;
            }
        }
        assert_eq!(popped, pushed);
        assert_eq!(r.pop_into(&mut out), 0);
    }
}
