//! The opened context of a verbs port and its protection domain: what every verbs object
//! (MR, CQ, SRQ, QP) holds alive, so that the device is closed only after the last of them.
//! Below every object made on a port: they import it, it imports none of them.

use std::sync::Arc;

use rdma_mummy_sys as ibv;

use super::events::{EventThread, Health};
use super::sys;
use crate::error::Error;

/// How an extended CQ is polled.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum PollBatches {
    /// Every completion there is in one `ibv_start_poll` / `ibv_next_poll`… / `ibv_end_poll`
    /// batch (up to the caller's buffer), as the man page describes.
    Many,
    /// One completion per start/end pair, never `ibv_next_poll`: rxe before rdma-core 59
    /// ends the batch itself when `ibv_next_poll` finds the queue empty, so the
    /// `ibv_end_poll` the man page asks for after it skips a completion slot and unlocks
    /// twice (rdma-core 5e7aa4102, "rxe: Fix double unlock in cq_ex polling"; caught by the
    /// Soft-RoCE tests). Correct on every provider; one uncontended lock pair each.
    One,
}

/// The opened context and its PD, shared (Arc) by the device and every object made on it,
/// so that it is closed only after the last of them is gone.
pub struct Ctx {
    pub(super) raw: *mut ibv::ibv_context,
    pub(super) pd: *mut ibv::ibv_pd,
    name: String,
    port: u8,
    pub(super) health: Arc<Health>,
    /// How this device's extended CQs are polled (a provider quirk, see [`PollBatches`]).
    pub(super) poll_batches: PollBatches,
    events: Option<EventThread>,
}

// SAFETY: libibverbs contexts and PDs may be used from any thread (the verbs used here are
// thread-safe); the raw pointers have no thread affinity.
unsafe impl Send for Ctx {}
// SAFETY: as above; nothing here is mutated through a shared reference.
unsafe impl Sync for Ctx {}

impl Ctx {
    /// Takes ownership of an opened context and its PD (closed on drop, after `events`).
    pub fn new(
        raw: *mut ibv::ibv_context,
        pd: *mut ibv::ibv_pd,
        name: &str,
        port: u8,
        health: Arc<Health>,
        poll_batches: PollBatches,
        events: Option<EventThread>,
    ) -> Ctx {
        Ctx { raw, pd, name: name.to_string(), port, health, poll_batches, events }
    }

    /// `device:port`, for messages.
    pub fn label(&self) -> String {
        format!("{}:{}", self.name, self.port)
    }

    /// Whether a thread reads this port's async events (a fence waits for one only then).
    pub fn reads_events(&self) -> bool {
        self.events.is_some()
    }

    /// The error for a failed verbs call on this port.
    pub fn failed(&self, call: &str, code: i32) -> Error {
        sys::call_failed(call, &self.name, self.port, code)
    }
}

impl Drop for Ctx {
    fn drop(&mut self) {
        // The event thread uses the context: stop it first.
        drop(self.events.take());
        // SAFETY: every MR, CQ, SRQ and QP holds an Arc of this object, so none is left;
        // the PD and the context are released once.
        unsafe {
            let ret = ibv::ibv_dealloc_pd(self.pd);
            if ret != 0 {
                log::warn!("ibv_dealloc_pd on {}: {}", self.label(), sys::strerror(sys::ret_errno(ret)));
            }
            ibv::ibv_close_device(self.raw);
        }
    }
}
