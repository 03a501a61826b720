//! The project's bounded single-producer single-consumer ring: one producer at a time
//! pushes (producers that take turns under a lock of their own count as one), one consumer
//! pops, and neither takes a lock. The soft CQ's completion ring (`fabric/soft/ring.rs`:
//! producers under a spin lock, reservations, growth) and a connection's completion inbox
//! (`plugin/inbox.rs`: producers under the NIC's poll lock, an overflow flag) are this ring
//! with their extras around it.
//!
//! `head` and `tail` are wrapping counts of the items popped and pushed; those in
//! `[head, tail)` are queued, each in the slot at `count & (len - 1)` of a power-of-two
//! array:
//!
//! - the producer reads `head` (Acquire), and if `tail - head` is below its limit (at most
//!   the capacity asked for) writes the slot at `tail`, then stores `tail + 1` (Release);
//! - the consumer reads `tail` (Acquire), reads the slots of `[head, tail)`, then stores the
//!   new `head` (Release).
//!
//! Why no slot is read and written at once: the producer writes only the slot at `tail`,
//! outside `[head, tail)` as it last saw `head`. The consumer reads a slot only after the
//! Release store of `tail` that published it (its Acquire load pairs with it), and the
//! producer rewrites a slot only after the Release store of `head` that freed it (its
//! Acquire load pairs with that), so the consumer's read came first. Room seen by the
//! producer never vanishes: the consumer only frees slots.
//!
//! What a slot holds is the caller's ([`Slot`]). Slots of atomic words, stored and loaded
//! Relaxed (`tail` and `head` order them), keep the ring safe code: a caller that broke the
//! one-producer rule would get a wrong item, never undefined behaviour (on x86 a Relaxed
//! word is a plain move). A slot that hands the consumer a reference into itself instead
//! (no copy, for a ring on the hot path) is a cell, sound only under the protocol above, so
//! it must stay private to a module that keeps one producer and one consumer.
//!
//! Model-checked (`loom_models` below, and the CQ ring's in `fabric/soft/loom_models.rs`):
//! a `tail` stored without Release fails the models here (a torn or stale slot), a `head`
//! stored without Release fails the CQ ring's (its cell slots make the producer's rewrite
//! a race loom sees; with atomic words it would take a load reading a later store, which
//! loom does not model).

use std::borrow::Borrow;
use std::sync::atomic::Ordering;

use super::AtomicUsize;

/// What a ring slot holds. The ring calls `store` (the producer's write) only on a slot
/// outside `[head, tail)`, and `read` (the consumer's) only on one inside it, published.
pub trait Slot: Default {
    type Item;
    /// What the consumer gets: the item itself (read out of atomic words) or a reference
    /// into the slot.
    type Read<'a>: Borrow<Self::Item>
    where
        Self: 'a;
    fn store(&self, item: Self::Item);
    fn read(&self) -> Self::Read<'_>;
}

/// The ring (see the module documentation).
pub struct Ring<S> {
    slots: Box<[S]>,
    /// How many items may be queued at once (the depth asked for; the array is larger when
    /// that is not a power of two).
    cap: usize,
    /// Items popped: stored by the consumer only.
    head: AtomicUsize,
    /// Items pushed: stored by the producer only.
    tail: AtomicUsize,
}

impl<S: Slot> Ring<S> {
    /// A ring for `cap` items (at least 1).
    pub fn new(cap: usize) -> Ring<S> {
        Ring::at(cap, 0)
    }

    /// An empty ring for `cap` items whose counts start at `count`.
    fn at(cap: usize, count: usize) -> Ring<S> {
        let cap = cap.max(1);
        let n = cap.next_power_of_two();
        Ring {
            slots: (0..n).map(|_| S::default()).collect(),
            cap,
            head: AtomicUsize::new(count),
            tail: AtomicUsize::new(count),
        }
    }

    /// The slot of count `c`. (The array's length less one is the mask, rather than a
    /// field: the compiler then sees the index is in bounds once the length is not 0, a
    /// check it makes once per call instead of once per slot.)
    #[inline(always)]
    fn slot(&self, c: usize) -> &S {
        &self.slots[c & (self.slots.len() - 1)]
    }

    /// How many items may be queued at once.
    #[inline]
    pub fn capacity(&self) -> usize {
        self.cap
    }

    /// The producer's free slot, if fewer than `limit` (at most [`Self::capacity`]) items
    /// are queued. Only the producer calls this; the room stays while it does not push.
    #[inline(always)]
    pub fn room(&self, limit: usize) -> Option<Room<'_, S>> {
        debug_assert!(limit <= self.cap);
        let tail = self.tail.load(Ordering::Relaxed);
        (tail.wrapping_sub(self.head.load(Ordering::Acquire)) < limit).then_some(Room { ring: self, tail })
    }

    /// Queues `item`; `false` when [`Self::capacity`] items are queued. Only the producer
    /// calls this.
    #[inline(always)]
    pub fn push(&self, item: S::Item) -> bool {
        self.room(self.cap).map(|room| room.push(item)).is_some()
    }

    /// Whether nothing is queued (the consumer's quick check).
    #[inline(always)]
    pub fn is_empty(&self) -> bool {
        self.tail.load(Ordering::Acquire) == self.head.load(Ordering::Relaxed)
    }

    /// Hands up to `max` of the oldest items to `f`, oldest first, and frees their slots
    /// after the last `f` returns; returns how many. An empty ring costs two loads. Only the
    /// consumer calls this.
    #[inline(always)]
    pub fn pop_each(&self, max: usize, mut f: impl FnMut(&S::Item)) -> usize {
        let tail = self.tail.load(Ordering::Acquire);
        let head = self.head.load(Ordering::Relaxed);
        if tail == head {
            return 0;
        }
        let n = max.min(tail.wrapping_sub(head));
        for i in 0..n {
            f(self.slot(head.wrapping_add(i)).read().borrow());
        }
        self.head.store(head.wrapping_add(n), Ordering::Release);
        n
    }

    /// A ring for `cap` items (never fewer than this one's) holding what this one queues, at
    /// the same counts. Only with both ends stopped: the consumer calls it, the producer
    /// locked out until the new ring has replaced this one.
    pub fn grown(&self, cap: usize) -> Ring<S>
    where
        S::Item: Clone,
    {
        let (head, tail) = (self.head.load(Ordering::Acquire), self.tail.load(Ordering::Acquire));
        let new = Ring::<S>::at(cap.max(self.cap), head);
        let mut c = head;
        while c != tail {
            new.slot(c).store(self.slot(c).read().borrow().clone());
            c = c.wrapping_add(1);
        }
        new.tail.store(tail, Ordering::Relaxed);
        new
    }

    /// Items queued now (tests).
    #[cfg(test)]
    pub fn len(&self) -> usize {
        self.tail.load(Ordering::Acquire).wrapping_sub(self.head.load(Ordering::Acquire))
    }
}

/// The producer's free slot at `tail`.
pub struct Room<'a, S> {
    ring: &'a Ring<S>,
    tail: usize,
}

impl<S: Slot> Room<'_, S> {
    /// Fills the slot and publishes it.
    #[inline(always)]
    pub fn push(self, item: S::Item) {
        let ring = self.ring;
        ring.slot(self.tail).store(item);
        ring.tail.store(self.tail.wrapping_add(1), Ordering::Release);
    }
}

#[cfg(test)]
pub mod tests {
    use super::super::AtomicU64;
    use super::*;

    /// A slot of two words, the second derived from the first, so a torn read shows.
    #[derive(Default)]
    pub struct Pair([AtomicU64; 2]);

    impl Slot for Pair {
        type Item = u64;
        type Read<'a> = u64;
        fn store(&self, v: u64) {
            self.0[0].store(v, Ordering::Relaxed);
            self.0[1].store(!v, Ordering::Relaxed);
        }
        fn read(&self) -> u64 {
            let (v, w) = (self.0[0].load(Ordering::Relaxed), self.0[1].load(Ordering::Relaxed));
            assert_eq!(w, !v, "a torn slot");
            v
        }
    }

    /// Pops up to `max` into a vector.
    pub fn pop(r: &Ring<Pair>, max: usize) -> Vec<u64> {
        let mut got = Vec::new();
        r.pop_each(max, |v| got.push(*v));
        got
    }

    /// A depth that is not a power of two is full at that depth (the array is larger), and
    /// items come out in order across many wraps of the array.
    #[cfg(not(loom))]
    #[test]
    fn full_at_its_depth_and_in_order_across_wraps() {
        let r = Ring::<Pair>::new(3);
        let (mut pushed, mut popped) = (0u64, 0u64);
        for round in 0..50 {
            while r.push(pushed) {
                pushed += 1;
            }
            assert_eq!(r.len(), 3, "round {round}: full at the depth asked for");
            assert!(r.room(3).is_none() && r.room(2).is_none());
            for v in pop(&r, 1 + round % 2) {
                assert_eq!(v, popped);
                popped += 1;
            }
            assert!(r.room(3).is_some(), "room again");
        }
        for v in pop(&r, usize::MAX) {
            assert_eq!(v, popped);
            popped += 1;
        }
        assert_eq!(popped, pushed);
        assert!(r.is_empty());
        assert_eq!(r.pop_each(8, |_| panic!("empty")), 0);
    }

    /// A limit below the capacity holds the rest back; a grown ring keeps what is queued,
    /// in order across the old array's wrap, and takes more.
    #[cfg(not(loom))]
    #[test]
    fn a_limit_holds_back_and_growth_keeps_the_queue() {
        let r = Ring::<Pair>::new(4);
        for i in 0..3 {
            assert!(r.push(i));
        }
        assert_eq!(pop(&r, 3), [0, 1, 2]);
        for i in 3..5 {
            assert!(r.push(i));
        }
        assert!(r.room(2).is_none(), "two queued: none below a limit of 2");
        r.room(4).unwrap().push(5);
        r.room(4).unwrap().push(6);
        assert!(!r.push(7), "full at 4");
        let g = r.grown(10);
        assert_eq!(g.capacity(), 10);
        for i in 7..13 {
            assert!(g.push(i), "room for 10 after growing");
        }
        assert!(!g.push(13), "full at 10");
        assert_eq!(g.grown(5).capacity(), 10, "never shrinks");
        assert_eq!(pop(&g, usize::MAX), (3..13).collect::<Vec<_>>());
    }

    /// A producer and a consumer on other threads: every item once, in order, whole.
    #[cfg(not(loom))]
    #[test]
    fn a_producer_and_a_consumer_on_two_threads_lose_nothing() {
        const N: u64 = 200_000;
        let r = std::sync::Arc::new(Ring::<Pair>::new(5));
        let p = {
            let r = r.clone();
            std::thread::spawn(move || {
                for i in 0..N {
                    while !r.push(i) {
                        std::thread::yield_now();
                    }
                }
            })
        };
        let mut want = 0;
        while want < N {
            let n = r.pop_each(4, |&v| {
                assert_eq!(v, want);
                want += 1;
            });
            if n == 0 {
                std::thread::yield_now();
            }
        }
        p.join().unwrap();
        assert!(r.is_empty());
    }
}

/// Models of the ring for the `loom` model checker (`--cfg loom`; `model.rs` says how they
/// run): every interleaving of a producer and a consumer, every value a load may return. A
/// slot read before the Release of `tail` that published it shows as a torn
/// [`tests::Pair`], a slot rewritten before the consumer freed it as a lost item.
#[cfg(all(test, loom))]
mod loom_models {
    use loom::sync::Arc;
    use loom::sync::atomic::{AtomicUsize, Ordering};
    use loom::thread;

    use super::super::model::{model, wait_for};
    use super::Ring;
    use super::tests::{Pair, pop};

    /// A ring of 2 (an array of 2): the producer pushes 4 items, giving up on each it finds
    /// no room for, while the consumer pops twice: the items come out once, whole and in
    /// order, across the array's wrap, and a push fails only when 2 are queued.
    #[test]
    fn loom_spsc_push_pop_wrap_full() {
        model(|| {
            let r = Arc::new(Ring::<Pair>::new(2));
            let pushed = Arc::new(AtomicUsize::new(0));
            let p = {
                let (r, pushed) = (r.clone(), pushed.clone());
                thread::spawn(move || {
                    let mut done = Vec::new();
                    for i in 1..=4u64 {
                        let queued = r.len();
                        if r.push(i) {
                            done.push(i);
                        } else {
                            assert_eq!(queued, 2, "a push failed with room");
                        }
                        pushed.store(i as usize, Ordering::Relaxed);
                    }
                    done
                })
            };
            wait_for(&pushed, 1);
            let mut got = pop(&r, 1);
            wait_for(&pushed, 3);
            got.extend(pop(&r, 2));
            let done = p.join().unwrap();
            got.extend(pop(&r, usize::MAX));
            assert_eq!(got, done, "each item pushed comes out once, in order");
            assert!(done.len() >= 2, "two fit in an empty ring");
        });
    }

    /// Growth with the producer stopped (joined; in the CQ ring: locked out) between two
    /// pushes, the consumer popping on both sides of it: nothing queued is lost.
    #[test]
    fn loom_spsc_grown_keeps_the_queue() {
        model(|| {
            let r = Arc::new(Ring::<Pair>::new(1));
            let p = {
                let r = r.clone();
                thread::spawn(move || r.push(1))
            };
            let mut got = pop(&r, 1);
            assert!(p.join().unwrap(), "room in an empty ring");
            let g = Arc::new(r.grown(2));
            let p = {
                let g = g.clone();
                thread::spawn(move || g.push(2) && g.push(3))
            };
            got.extend(pop(&g, 1));
            let both = p.join().unwrap();
            got.extend(pop(&g, usize::MAX));
            assert_eq!(got, if both { vec![1, 2, 3] } else { vec![1, 2] });
        });
    }
}
