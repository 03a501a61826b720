//! Lock-free building blocks shared by the layers, and the atomics they are made of.
//!
//! ```text
//! spsc   the bounded single-producer single-consumer ring: the soft CQ's completion ring
//!        (`fabric/soft/ring.rs`) and a connection's completion inbox (`plugin/inbox.rs`)
//! model  what the loom models share (built under `--cfg loom`)
//! ```
//!
//! The atomics, the cell and the spin-wait calls here are the standard library's normally,
//! `loom`'s under `--cfg loom`, so the model checker runs the code that ships: the ring, and
//! the soft fabric's spin lock, CQ ring and key table's gates (the models: `spsc.rs` and
//! `fabric/soft/loom_models.rs`; DESIGN.md "The soft fabric" says how to run them).
//!
//! The only difference in shape is the cell: loom's hands out its pointer through a closure
//! so it can see where each access starts and ends; the shim below has the same shape and
//! compiles to a plain `std::cell::UnsafeCell` access.

#[cfg(all(test, loom))]
pub mod model;
pub mod spsc;

#[cfg(not(loom))]
pub use std::hint::spin_loop;
#[cfg(not(loom))]
pub use std::sync::atomic::{AtomicBool, AtomicPtr, AtomicU32, AtomicU64, AtomicUsize};
#[cfg(not(loom))]
pub use std::thread::yield_now;

#[cfg(loom)]
pub use loom::hint::spin_loop;
#[cfg(loom)]
pub use loom::sync::atomic::{AtomicBool, AtomicPtr, AtomicU32, AtomicU64, AtomicUsize};
#[cfg(loom)]
pub use loom::thread::yield_now;

#[cfg(loom)]
pub use loom::cell::UnsafeCell;

/// A cell whose accesses go through closures, as `loom::cell::UnsafeCell`'s do.
#[cfg(not(loom))]
pub struct UnsafeCell<T>(std::cell::UnsafeCell<T>);

#[cfg(not(loom))]
impl<T> UnsafeCell<T> {
    #[inline(always)]
    pub fn new(value: T) -> UnsafeCell<T> {
        UnsafeCell(std::cell::UnsafeCell::new(value))
    }

    /// Runs `f` with a pointer for reading the value.
    #[inline(always)]
    pub fn with<R>(&self, f: impl FnOnce(*const T) -> R) -> R {
        f(self.0.get())
    }

    /// Runs `f` with a pointer for writing the value.
    #[inline(always)]
    pub fn with_mut<R>(&self, f: impl FnOnce(*mut T) -> R) -> R {
        f(self.0.get())
    }
}
