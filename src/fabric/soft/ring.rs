//! The completion ring of a soft CQ: many producers (the QPs attached to the CQ, in
//! in-process mode also their peers' threads, in TCP mode the device's helper thread),
//! serialised by one lock; one consumer (the CQ's poller), which takes no lock.
//!
//! The queue is the project's SPSC ring (`sync/spsc.rs`, which says why it is sound); the
//! producers' lock makes them its one producer. Its slots are cells holding a completion,
//! not atomic words, so the poller reads each where it lies (no copy, nothing to decode:
//! words cost `inproc_msgs` ~50 instructions a message); they are sound because this
//! module keeps the ring's protocol (one producer at a time, one consumer: the lock, and
//! the consumer's functions are `unsafe` with that contract) and no other module can reach
//! them. Around it, this ring adds:
//!
//! - **Reservations.** A producer may reserve a slot (a WRITE_WITH_IMM whose payload is
//!   still arriving takes its completion's slot when it takes its SRQ WQE, so its
//!   completion, or its Flushed completion if the QP fails, always has room): plain pushes
//!   need fewer than `limit` completions queued, where `limit` is the capacity less the
//!   slots reserved (one word, so a push reads one value, not two). Only producers, under
//!   the lock, and the consumer growing the ring, with the producers locked out, touch it.
//!   Room seen by a producer never vanishes while it holds the lock: the consumer only
//!   frees slots.
//! - **Growth** (a shared CQ gets more QPs): the consumer, holding the producers' lock,
//!   makes a larger ring holding what is queued at the same counts and swaps it in. No
//!   producer runs (the lock) and the consumer is the one growing, so nobody reads the old
//!   ring then.
//!
//! The producers' lock is a spin lock (`spin.rs`): every section under it is a few loads
//! and stores (a push, a reservation, a retire of a send queue's finished WRs, a grow's
//! copy), with no system call and no other lock taken inside.

use std::sync::atomic::Ordering;

use super::spin::{SpinGuard, SpinMutex};
use crate::fabric::Completion;
use crate::sync::spsc::{self, Ring, Slot};
use crate::sync::{AtomicUsize, UnsafeCell};

/// A slot of the ring: a completion in a cell (its cell private: see the module
/// documentation).
pub struct CqSlot(UnsafeCell<Completion>);

impl Default for CqSlot {
    fn default() -> CqSlot {
        CqSlot(UnsafeCell::new(Completion::default()))
    }
}

// SAFETY: a slot is shared between threads only inside a `CqRing`'s ring, whose protocol
// (one producer under the lock, one consumer) lets one thread at a time write it, and
// nobody read it meanwhile (`sync/spsc.rs`).
unsafe impl Sync for CqSlot {}

impl Slot for CqSlot {
    type Item = Completion;
    type Read<'a> = &'a Completion;

    #[inline(always)]
    fn store(&self, c: Completion) {
        // SAFETY: the ring stores only into a slot outside `[head, tail)`, which the
        // consumer does not read, and only from its one producer (this module's lock), or
        // into a ring that `grown` is making and nobody else sees yet.
        self.0.with_mut(|s| unsafe { *s = c });
    }

    #[inline(always)]
    fn read(&self) -> &Completion {
        // The cell hands out its pointer and the consumer reads outside the closure:
        // `pop_each`'s `f` called inside it was not inlined (+41 instructions a message on
        // `inproc_msgs`). The model checker still sees each access where it starts.
        // SAFETY: the ring reads only a slot inside `[head, tail)`, published, which no
        // producer writes until the consumer has moved `head` past it, after the last use
        // of this reference (`Ring::pop_each`).
        unsafe { &*self.0.with(|c| c) }
    }
}

type Slots = Ring<CqSlot>;

pub struct CqRing {
    /// Replaced (by the consumer, under `producers`) when the ring grows.
    ring: UnsafeCell<Slots>,
    /// The capacity less the slots reserved for completions to come (see the module
    /// documentation): how many completions plain pushes may queue.
    limit: AtomicUsize,
    producers: SpinMutex<()>,
}

// SAFETY: the cell (the only part not already `Sync`) holds a ring that is itself `Sync`;
// it is replaced only by the consumer with the producers locked out, and read meanwhile by
// nobody else (the module documentation).
unsafe impl Sync for CqRing {}

impl CqRing {
    pub fn new(depth: usize) -> CqRing {
        let ring = Ring::new(depth);
        CqRing { limit: AtomicUsize::new(ring.capacity()), ring: UnsafeCell::new(ring), producers: SpinMutex::new(()) }
    }

    /// Locks out the other producers.
    #[inline]
    pub fn lock(&self) -> Producer<'_> {
        let lock = self.producers.lock();
        // SAFETY: the ring is replaced only under the lock just taken (by the consumer, in
        // `grow`), and the reference lives no longer than the guard beside it.
        let ring = unsafe { &*self.ring.with(|r| r) };
        Producer { _lock: lock, ring, limit: &self.limit }
    }

    /// The ring, to its consumer.
    ///
    /// # Safety
    /// The caller is the one consumer: only it replaces the ring (`grow`), so the ring
    /// stays while it uses it.
    #[inline(always)]
    unsafe fn consumer(&self) -> &Slots {
        // SAFETY: only the consumer (the caller, by this function's contract) replaces it.
        unsafe { &*self.ring.with(|r| r) }
    }

    /// Moves the oldest completions into `out`; returns how many. An empty ring costs two
    /// loads.
    ///
    /// # Safety
    /// One consumer: no other thread may be in `pop_into`/`pop_each`/`grow` on this ring at
    /// the same time.
    #[inline]
    pub unsafe fn pop_into(&self, out: &mut [Completion]) -> usize {
        let mut n = 0;
        // SAFETY: the caller is the one consumer (this function's own contract).
        let ring = unsafe { self.consumer() };
        ring.pop_each(out.len(), |c| {
            out[n] = *c;
            n += 1;
        })
    }

    /// Hands up to `max` of the oldest completions to `f` where they lie (no copy); returns
    /// how many. They are released (`head` moves past them) after the last `f` returns.
    ///
    /// # Safety
    /// One consumer: no other thread may be in `pop_into`/`pop_each`/`grow` on this ring at
    /// the same time.
    #[inline(always)]
    pub unsafe fn pop_each(&self, max: usize, f: impl FnMut(&Completion)) -> usize {
        // SAFETY: the caller is the one consumer (this function's own contract).
        let ring = unsafe { self.consumer() };
        ring.pop_each(max, f)
    }

    /// Makes room for `depth` completions (never shrinks), keeping those queued.
    ///
    /// # Safety
    /// One consumer: only the ring's consumer calls this, never while in `pop_into`.
    pub unsafe fn grow(&self, depth: usize) {
        let _producers = self.producers.lock();
        self.ring.with_mut(|ring| {
            // SAFETY: the producers are locked out and the caller is the consumer: nobody
            // else reads or writes the ring until this returns.
            let ring = unsafe { &mut *ring };
            if depth <= ring.capacity() {
                return;
            }
            let new = ring.grown(depth);
            // The reserved slots stay reserved: the limit grows by the slots added.
            self.limit.fetch_add(new.capacity() - ring.capacity(), Ordering::Relaxed);
            *ring = new;
        })
    }

    /// Completions queued now (tests).
    #[cfg(all(test, not(loom)))]
    pub fn len(&self) -> usize {
        // SAFETY: tests call this from the consumer's thread.
        unsafe { self.consumer() }.len()
    }
}

/// A producer of a [`CqRing`], the others locked out until it drops.
pub struct Producer<'a> {
    _lock: SpinGuard<'a, ()>,
    ring: &'a Slots,
    limit: &'a AtomicUsize,
}

/// The free slot at `tail` of a locked ring: `push` fills and publishes it.
pub type Room<'a> = spsc::Room<'a, CqSlot>;

impl Producer<'_> {
    /// Room for one completion (held as long as this producer holds the lock), or `None`
    /// when the ring is full.
    #[inline(always)]
    pub fn room(&mut self) -> Option<Room<'_>> {
        // Relaxed: only producers store `limit`, under the lock this one holds (and the
        // consumer growing the ring, with the lock held too).
        self.ring.room(self.limit.load(Ordering::Relaxed))
    }

    /// Reserves a slot for a later [`Self::push_reserved`]; `false` when the ring is full.
    pub fn reserve(&mut self) -> bool {
        if self.room().is_none() {
            return false;
        }
        // Never below 0: a slot is reserved only where there was room.
        self.limit.fetch_sub(1, Ordering::Relaxed);
        true
    }

    /// Gives a reserved slot back unused.
    pub fn unreserve(&mut self) {
        self.limit.fetch_add(1, Ordering::Relaxed);
    }

    /// Appends `c` into a slot [`Self::reserve`] took (never full).
    pub fn push_reserved(&mut self, c: Completion) {
        self.unreserve();
        let room = self.room();
        debug_assert!(room.is_some(), "a reserved slot is always free");
        if let Some(room) = room {
            room.push(c);
        }
    }

    /// Appends `c`; `false` when the ring is full.
    #[inline(always)]
    pub fn push(&mut self, c: Completion) -> bool {
        self.room().map(|room| room.push(c)).is_some()
    }
}

#[cfg(all(test, not(loom)))]
mod tests {
    use super::*;

    fn c(wr_id: u64) -> Completion {
        Completion { wr_id, ..Completion::default() }
    }

    /// Growing keeps what is queued, in order, across the array's wrap; the new depth holds.
    #[test]
    fn a_grown_ring_keeps_its_completions_and_takes_more() {
        let r = CqRing::new(4);
        let mut out = [Completion::default(); 8];
        // Wrap the array once so the queued completions straddle its end.
        for i in 0..3 {
            assert!(r.lock().push(c(i)));
        }
        // SAFETY: this thread is the only consumer.
        assert_eq!(unsafe { r.pop_into(&mut out[..3]) }, 3);
        for i in 3..7 {
            assert!(r.lock().push(c(i)));
        }
        assert!(r.lock().room().is_none(), "full at 4");
        // SAFETY: as above.
        unsafe { r.grow(10) };
        for i in 7..13 {
            assert!(r.lock().push(c(i)), "room for 10 after growing");
        }
        assert!(r.lock().room().is_none(), "full at 10");
        // SAFETY: as above.
        unsafe { r.grow(5) };
        assert!(r.lock().room().is_none(), "never shrinks");
        let mut got = Vec::new();
        loop {
            // SAFETY: as above.
            let n = unsafe { r.pop_into(&mut out) };
            if n == 0 {
                break;
            }
            got.extend(out[..n].iter().map(|o| o.wr_id));
        }
        assert_eq!(got, (3..13).collect::<Vec<_>>());
    }

    /// Three producers and one consumer: every completion once, each producer's in order.
    #[test]
    fn producers_and_a_consumer_on_other_threads_lose_nothing() {
        const PER: u64 = 50_000;
        let r = std::sync::Arc::new(CqRing::new(5));
        let producers: Vec<_> = (0..3u64)
            .map(|p| {
                let r = r.clone();
                std::thread::spawn(move || {
                    for i in 0..PER {
                        while !r.lock().push(Completion { wr_id: p << 32 | i, ..Completion::default() }) {
                            std::thread::yield_now();
                        }
                    }
                })
            })
            .collect();
        let mut next = [0u64; 3];
        let mut out = [Completion::default(); 4];
        while next.iter().sum::<u64>() < 3 * PER {
            // SAFETY: this thread is the only consumer.
            let n = unsafe { r.pop_into(&mut out) };
            for o in &out[..n] {
                let (p, i) = ((o.wr_id >> 32) as usize, o.wr_id & 0xFFFF_FFFF);
                assert_eq!(i, next[p], "producer {p}");
                next[p] += 1;
            }
            if n == 0 {
                std::thread::yield_now();
            }
        }
        for t in producers {
            t.join().unwrap();
        }
        assert_eq!(r.len(), 0);
    }

    /// A reserved slot is not room for others, and is there when its completion comes.
    #[test]
    fn a_reserved_slot_is_kept_for_its_completion() {
        let r = CqRing::new(2);
        assert!(r.lock().reserve());
        assert!(r.lock().push(c(1)));
        assert!(!r.lock().push(c(2)), "the reserved slot is not free for others");
        assert!(!r.lock().reserve());
        r.lock().push_reserved(c(3));
        assert_eq!(r.len(), 2);
        let mut out = [Completion::default(); 2];
        // SAFETY: this thread is the only consumer.
        assert_eq!(unsafe { r.pop_into(&mut out) }, 2);
        assert!(r.lock().reserve());
        r.lock().unreserve();
        assert!(r.lock().push(c(4)) && r.lock().push(c(5)), "given back");
    }
}
