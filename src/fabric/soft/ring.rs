//! The completion ring of a soft CQ: many producers (the QPs attached to the CQ, in
//! in-process mode also their peers' threads, in TCP mode the device's helper thread),
//! serialised by one lock; one consumer (the CQ's poller), which takes no lock.
//!
//! `head` and `tail` are wrapping counts of the completions popped and pushed; those in
//! `[head, tail)` are queued, each at `count & mask` of a power-of-two array, at most `cap`
//! (the depth asked for) at once:
//!
//! - a producer, holding the lock, reads `head` (Acquire), writes the slot at `tail` if
//!   `tail - head < cap`, then stores `tail + 1` (Release);
//! - the consumer reads `tail` (Acquire), copies the slots of `[head, tail)`, then stores
//!   the new `head` (Release).
//!
//! A producer may also *reserve* a slot (a WRITE_WITH_IMM whose payload is still arriving
//! takes its completion's slot when it takes its SRQ WQE, so its completion, or its Flushed
//! completion if the QP fails, always has room): plain pushes need `tail - head < limit`,
//! where `limit` is `cap` less the slots reserved (one word, so a push reads one value, not
//! two). Only producers, under the lock, and the consumer growing the ring, with the
//! producers locked out, touch it.
//!
//! Why no slot is read and written at once: a producer writes only the slot at `tail`,
//! outside `[head, tail)` as it last saw `head`, and only while it holds the lock (no other
//! producer moves `tail`). The consumer reads a slot only after the Release store of `tail`
//! that published it (its Acquire load pairs with it), and a producer rewrites a slot only
//! after the Release store of `head` that freed it (its Acquire load pairs with that), so
//! the consumer's read came first. Room seen by a producer never vanishes while it holds
//! the lock: the consumer only frees slots.
//!
//! Growing (a shared CQ gets more QPs): the consumer, holding the producers' lock, copies
//! `[head, tail)` into a larger array at the same counts and swaps it in. No producer runs
//! (the lock) and the consumer is the one growing, so nobody reads the old array then.
//!
//! The producers' lock is a spin lock (`spin.rs`): every section under it is a few loads
//! and stores (a push, a reservation, a retire of a send queue's finished WRs, a grow's
//! copy), with no system call and no other lock taken inside.

use std::sync::atomic::Ordering;

use super::spin::{SpinGuard, SpinMutex};
use super::sync::{AtomicUsize, UnsafeCell};

use crate::fabric::Completion;

/// The array of a ring: replaced (under the producers' lock, by the consumer) when it grows.
struct Buf {
    slots: Box<[UnsafeCell<Completion>]>,
    mask: usize,
    cap: usize,
}

impl Buf {
    fn new(depth: usize) -> Buf {
        let cap = depth.max(1);
        let n = cap.next_power_of_two();
        Buf { slots: (0..n).map(|_| UnsafeCell::new(Completion::default())).collect(), mask: n - 1, cap }
    }
}

pub struct CqRing {
    buf: UnsafeCell<Buf>,
    /// `cap` less the slots reserved for completions to come (see the module
    /// documentation): how many completions plain pushes may queue.
    limit: AtomicUsize,
    /// Completions popped: stored by the consumer only.
    head: AtomicUsize,
    /// Completions pushed: stored by producers only, under `producers`.
    tail: AtomicUsize,
    producers: SpinMutex<()>,
}

// SAFETY: the slots (the only part not already `Sync`) are shared between threads only as
// the module documentation says: written by one producer at a time, under `producers`,
// while the consumer does not read them; read by the consumer once published; the array
// itself replaced only by the consumer with the producers locked out.
unsafe impl Sync for CqRing {}

impl CqRing {
    pub fn new(depth: usize) -> CqRing {
        CqRing {
            limit: AtomicUsize::new(depth.max(1)),
            buf: UnsafeCell::new(Buf::new(depth)),
            head: AtomicUsize::new(0),
            tail: AtomicUsize::new(0),
            producers: SpinMutex::new(()),
        }
    }

    /// Locks out the other producers.
    #[inline]
    pub fn lock(&self) -> Producer<'_> {
        Producer { _lock: self.producers.lock(), ring: self }
    }

    /// Moves the oldest completions into `out`; returns how many. An empty ring costs two
    /// loads.
    ///
    /// # Safety
    /// One consumer: no other thread may be in `pop_into`/`pop_each` on this ring at the
    /// same time.
    #[inline]
    pub unsafe fn pop_into(&self, out: &mut [Completion]) -> usize {
        let mut n = 0;
        // SAFETY: the caller is the one consumer (this function's own contract).
        unsafe {
            self.pop_each(out.len(), |c| {
                out[n] = *c;
                n += 1;
            })
        }
    }

    /// Hands up to `max` of the oldest completions to `f` where they lie (no copy); returns
    /// how many. They are released (`head` moves past them) after the last `f` returns.
    ///
    /// # Safety
    /// One consumer: no other thread may be in `pop_into`/`pop_each` on this ring at the
    /// same time.
    #[inline(always)]
    pub unsafe fn pop_each(&self, max: usize, mut f: impl FnMut(&Completion)) -> usize {
        let tail = self.tail.load(Ordering::Acquire);
        let head = self.head.load(Ordering::Relaxed);
        if tail == head {
            return 0;
        }
        let n = max.min(tail.wrapping_sub(head));
        // The cells hand out their pointers and `f` runs outside their closures: called
        // inside them it was not inlined (+41 instructions a message on `inproc_msgs`). The
        // model checker still sees each access where it starts (`with` records it).
        // SAFETY: only the consumer (the caller) replaces the array.
        let buf = unsafe { &*self.buf.with(|buf| buf) };
        for i in 0..n {
            // SAFETY: `& mask` is below the array's length (a power of two, `mask + 1`).
            let slot = unsafe { buf.slots.get_unchecked(head.wrapping_add(i) & buf.mask) };
            // SAFETY: `head + i` lies in `[head, tail)`: published before the Acquire load of
            // `tail`, and no producer writes it until `head` moves past it (below, after `f`
            // is done with it).
            f(unsafe { &*slot.with(|c| c) });
        }
        self.head.store(head.wrapping_add(n), Ordering::Release);
        n
    }

    /// Makes room for `depth` completions (never shrinks), keeping those queued.
    ///
    /// # Safety
    /// One consumer: only the ring's consumer calls this, never while in `pop_into`.
    pub unsafe fn grow(&self, depth: usize) {
        let _producers = self.lock();
        self.buf.with_mut(|buf| {
            // SAFETY: the producers are locked out and the caller is the consumer: nobody
            // else reads or writes the array until this returns.
            let buf = unsafe { &mut *buf };
            if depth <= buf.cap {
                return;
            }
            let new = Buf::new(depth);
            // The reserved slots stay reserved: the limit grows by the slots added.
            self.limit.fetch_add(new.cap - buf.cap, Ordering::Relaxed);
            let (head, tail) = (self.head.load(Ordering::Relaxed), self.tail.load(Ordering::Relaxed));
            let mut c = head;
            while c != tail {
                let (from, to) = (&buf.slots[c & buf.mask], &new.slots[c & new.mask]);
                // SAFETY: as above; `c` lies in `[head, tail)`, published; `to` is not
                // shared yet.
                from.with(|from| to.with_mut(|to| unsafe { *to = *from }));
                c = c.wrapping_add(1);
            }
            *buf = new;
        })
    }

    /// Completions queued now (tests).
    #[cfg(all(test, not(loom)))]
    pub fn len(&self) -> usize {
        self.tail.load(Ordering::Acquire).wrapping_sub(self.head.load(Ordering::Acquire))
    }
}

/// A producer of a [`CqRing`], the others locked out until it drops.
pub struct Producer<'a> {
    _lock: SpinGuard<'a, ()>,
    ring: &'a CqRing,
}

impl Producer<'_> {
    /// Room for one completion (held as long as this producer holds the lock), or `None`
    /// when the ring is full.
    #[inline(always)]
    pub fn room(&mut self) -> Option<Room<'_>> {
        let ring = self.ring;
        // Relaxed: only producers store `tail` and `limit`, under the lock this one holds
        // (and the consumer growing the ring, with the lock held too).
        let tail = ring.tail.load(Ordering::Relaxed);
        let limit = ring.limit.load(Ordering::Relaxed);
        (tail.wrapping_sub(ring.head.load(Ordering::Acquire)) < limit).then_some(Room { ring, tail })
    }

    /// Reserves a slot for a later [`Self::push_reserved`]; `false` when the ring is full.
    pub fn reserve(&mut self) -> bool {
        if self.room().is_none() {
            return false;
        }
        // Never below 0: a slot is reserved only where there was room.
        self.ring.limit.fetch_sub(1, Ordering::Relaxed);
        true
    }

    /// Gives a reserved slot back unused.
    pub fn unreserve(&mut self) {
        self.ring.limit.fetch_add(1, Ordering::Relaxed);
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
        match self.room() {
            Some(room) => {
                room.push(c);
                true
            }
            None => false,
        }
    }
}

/// The free slot at `tail` of a locked ring.
pub struct Room<'a> {
    ring: &'a CqRing,
    tail: usize,
}

impl Room<'_> {
    /// Fills the slot and publishes it.
    #[inline(always)]
    pub fn push(self, c: Completion) {
        let ring = self.ring;
        ring.buf.with(|buf| {
            // SAFETY: no other producer replaces the array while this one holds the lock
            // (`Room` borrows the `Producer`), and the consumer replaces it only under it.
            let buf = unsafe { &*buf };
            // SAFETY: `& mask` is below the array's length (a power of two, `mask + 1`).
            let slot = unsafe { buf.slots.get_unchecked(self.tail & buf.mask) };
            // SAFETY: the slot at `tail` lies outside `[head, tail)` (`room` checked it, and
            // the consumer only moves `head` on): the consumer does not read it, and no
            // other producer writes it while this one holds the lock.
            slot.with_mut(|s| unsafe { *s = c });
        });
        ring.tail.store(self.tail.wrapping_add(1), Ordering::Release);
    }
}

#[cfg(all(test, not(loom)))]
mod tests {
    use super::*;

    fn c(wr_id: u64) -> Completion {
        Completion { wr_id, ..Completion::default() }
    }

    /// A depth that is not a power of two is full at that depth (the array is larger), and
    /// completions come out in order across many wrap-arounds of the array.
    #[test]
    fn ring_is_full_at_its_depth_and_keeps_order_across_wraps() {
        let r = CqRing::new(3);
        let mut out = [Completion::default(); 2];
        let (mut pushed, mut popped) = (0u64, 0u64);
        for round in 0..50 {
            while r.lock().push(c(pushed)) {
                pushed += 1;
            }
            assert_eq!(r.len(), 3, "round {round}: full at the depth asked for");
            assert!(r.lock().room().is_none());
            // SAFETY: this thread is the only consumer.
            let n = unsafe { r.pop_into(&mut out[..1 + round % 2]) };
            for o in &out[..n] {
                assert_eq!(o.wr_id, popped);
                popped += 1;
            }
        }
        while r.len() > 0 {
            // SAFETY: as above.
            let n = unsafe { r.pop_into(&mut out) };
            for o in &out[..n] {
                assert_eq!(o.wr_id, popped);
                popped += 1;
            }
        }
        assert_eq!(popped, pushed);
        // SAFETY: as above.
        assert_eq!(unsafe { r.pop_into(&mut out) }, 0);
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
