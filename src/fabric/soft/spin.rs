//! A spin lock for the soft fabric's short critical sections: a connection's state and a
//! CQ ring's producers. A section under one is a few loads and stores, a bounded walk of a
//! send queue, or a frame's bookkeeping; none waits for another thread (the TCP path's
//! socket calls run under its link's lock, a parking mutex, not under these; at worst a
//! connection's state is held while its error state writes a rate-limited log line), and
//! locks nest in one order (link, connection, the in-process peer's connection, CQ ring).
//! So a waiter spins a few dozen times, then yields the CPU (the holder may be off it: more
//! threads than cores). It is taken with one swap and released with one store, where
//! `parking_lot`'s release is a compare-and-swap: every in-process post takes one for its
//! connection and one per completion it pushes (`SoftQp::post_send` per call, `inproc_msgs`
//! callgrind: 185.0 instructions with `parking_lot` for the connection, 177.5 with this).

use std::cell::UnsafeCell;
use std::ops::{Deref, DerefMut};
use std::sync::atomic::Ordering;

use crate::sync::{AtomicBool, spin_loop, yield_now};

/// A value behind a spin lock.
pub struct SpinMutex<T> {
    locked: AtomicBool,
    value: UnsafeCell<T>,
}

// SAFETY: the value is reached only through a guard, and one guard exists at a time (the
// swap in `lock`); moving the guard's access to another thread needs `T: Send`.
unsafe impl<T: Send> Sync for SpinMutex<T> {}

impl<T> SpinMutex<T> {
    pub fn new(value: T) -> SpinMutex<T> {
        SpinMutex { locked: AtomicBool::new(false), value: UnsafeCell::new(value) }
    }

    /// Waits for the lock (see the module documentation).
    #[inline(always)]
    pub fn lock(&self) -> SpinGuard<'_, T> {
        if !self.try_take() {
            self.lock_contended();
        }
        SpinGuard { m: self }
    }

    /// Takes the lock if it is free: one swap. Acquire: what the previous holder did under
    /// the lock is visible.
    #[inline(always)]
    fn try_take(&self) -> bool {
        #[cfg(not(loom))]
        let taken = !self.locked.swap(true, Ordering::Acquire);
        // The same step for the model checker, as a compare-and-swap: a swap that finds
        // the lock held writes `true` over `true`, and loom leaves that store unordered
        // against the holder's release, so the spinning loads may read it for ever (loom
        // stops the run as a livelock). A failed compare-and-swap stores nothing; either
        // way the lock's value is unchanged and the taker gets no ordering.
        #[cfg(loom)]
        let taken = self.locked.compare_exchange(false, true, Ordering::Acquire, Ordering::Relaxed).is_ok();
        taken
    }

    #[cold]
    #[inline(never)]
    fn lock_contended(&self) {
        loop {
            wait_while(|| self.locked.load(Ordering::Relaxed));
            if self.try_take() {
                return;
            }
        }
    }
}

/// Waits while `busy()` says so: spinning a while, then yielding the CPU at each look.
pub fn wait_while(busy: impl Fn() -> bool) {
    let mut spins = 0u32;
    while busy() {
        spins += 1;
        if spins < 64 {
            spin_loop();
        } else {
            yield_now();
        }
    }
}

/// The lock held: the value, until this drops.
pub struct SpinGuard<'a, T> {
    m: &'a SpinMutex<T>,
}

impl<T> Deref for SpinGuard<'_, T> {
    type Target = T;
    #[inline(always)]
    fn deref(&self) -> &T {
        // SAFETY: this guard holds the lock: no other reference to the value exists.
        unsafe { &*self.m.value.get() }
    }
}

impl<T> DerefMut for SpinGuard<'_, T> {
    #[inline(always)]
    fn deref_mut(&mut self) -> &mut T {
        // SAFETY: as in `deref`; `&mut self` makes this the only reference through the guard.
        unsafe { &mut *self.m.value.get() }
    }
}

impl<T> Drop for SpinGuard<'_, T> {
    #[inline(always)]
    fn drop(&mut self) {
        // Release: what this holder did under the lock is visible to the next.
        self.m.locked.store(false, Ordering::Release);
    }
}

#[cfg(all(test, not(loom)))]
mod tests {
    use super::*;

    /// Threads (more than this machine may have cores) adding under the lock lose nothing.
    #[test]
    fn threads_adding_under_the_lock_lose_nothing() {
        let m = std::sync::Arc::new(SpinMutex::new(0u64));
        let ts: Vec<_> = (0..4)
            .map(|_| {
                let m = m.clone();
                std::thread::spawn(move || {
                    for _ in 0..100_000 {
                        *m.lock() += 1;
                    }
                })
            })
            .collect();
        for t in ts {
            t.join().unwrap();
        }
        assert_eq!(*m.lock(), 400_000);
    }
}
