//! What the `loom` models of the ring (`spsc.rs`) and of the soft fabric
//! (`fabric/soft/loom_models.rs`) share. Built only with `--cfg loom`:
//!
//! ```text
//! RUSTFLAGS="--cfg loom" cargo test --release --lib loom_models
//! ```
//!
//! The ring models' threads never wait on each other's progress through a ring (a
//! producer gives up when the ring is full, the consumer pops a bounded number of times
//! before it joins them and drains): two waiters that spin for each other make runs loom
//! cannot end. The consumer does wait, boundedly, for a producer's Relaxed word (`pushed`,
//! no happens-before) before some pops: loom does not reorder a load before a store that
//! follows a load by the storing thread (tokio-rs/loom#392), so without it the consumer
//! would never pop while the producers push, and a missing Release on `tail` went unseen.

use loom::sync::atomic::{AtomicUsize, Ordering};
use loom::thread;

/// Runs `f` under loom with at most 3 preemptions per run (`LOOM_MAX_PREEMPTIONS` sets
/// another bound): every model passes unbounded in under a second, but a broken one (a
/// lock removed) can make the unbounded search run for many minutes, where a bound of 2
/// finds the race at once.
pub fn model(f: impl Fn() + Sync + Send + 'static) {
    let mut b = loom::model::Builder::new();
    b.preemption_bound.get_or_insert(3);
    b.check(f);
}

/// Waits a little for `pushed` (Relaxed: it orders nothing) to reach `n` (a bounded wait:
/// a producer may be waiting for another's lock meanwhile).
pub fn wait_for(pushed: &AtomicUsize, n: usize) {
    for _ in 0..3 {
        if pushed.load(Ordering::Relaxed) >= n {
            return;
        }
        thread::yield_now();
    }
}
