//! A counter with one writer (the connection's data path) and any number of readers (the
//! statistics writer, the query function).
//!
//! The writer adds with a relaxed load and a relaxed store, not a read-modify-write: on
//! x86 that is two plain `mov`s where `fetch_add` would be a `lock xadd` (about 20 cycles,
//! and it owns the cache line). It is correct only because nobody else writes the value;
//! readers see every value the writer stored, never a torn one, and at worst one update
//! late. The type is `Sync` so readers can share it, but [`Counter::add`] must only ever
//! be called from the one owning thread at a time: mpib's data path owns each
//! connection's state and moves it between threads only with a synchronising hand-off.

use std::sync::atomic::{AtomicU64, Ordering::Relaxed};

#[derive(Debug, Default)]
pub struct Counter(AtomicU64);

impl Counter {
    pub const fn new(v: u64) -> Self {
        Counter(AtomicU64::new(v))
    }

    /// Adds `n` (single writer: see the module comment).
    #[inline]
    pub fn add(&self, n: u64) {
        self.0.store(self.0.load(Relaxed).wrapping_add(n), Relaxed);
    }

    /// Replaces the value (single writer).
    #[inline]
    pub fn set(&self, v: u64) {
        self.0.store(v, Relaxed);
    }

    #[inline]
    pub fn get(&self) -> u64 {
        self.0.load(Relaxed)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::sync::Arc;

    #[test]
    fn one_writer_many_readers_see_monotonic_values_and_the_final_sum() {
        let c = Arc::new(Counter::default());
        let readers: Vec<_> = (0..2)
            .map(|_| {
                let c = c.clone();
                std::thread::spawn(move || {
                    let mut last = 0;
                    while last < 2_000_000 {
                        let v = c.get();
                        assert!(v >= last, "went back from {last} to {v}");
                        assert_eq!(v % 2, 0, "a reader saw a value the writer never stored");
                        last = v;
                    }
                })
            })
            .collect();
        for _ in 0..1_000_000 {
            c.add(2);
        }
        for r in readers {
            r.join().unwrap();
        }
        assert_eq!(c.get(), 2_000_000);
    }
}
