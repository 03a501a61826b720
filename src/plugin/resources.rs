//! What a plugin instance holds right now (the process's, for NCCL): comms, contexts, fabric objects (CQs and
//! their entries, SRQs and their WQEs, QPs and their send-queue depth) and registered
//! control memory. Tools read it through `mpib_resource_stats` (the scale benchmark, the
//! leak checks of the many-connections test) instead of reaching into internals.
//!
//! Every amount is held by a [`Held`] that the object owning the resource keeps and that
//! gives the amount back when dropped, so the figures cannot drift from what exists: a
//! leaked object shows as a figure that does not return to its earlier value.

use std::sync::atomic::{AtomicU64, Ordering};

/// What an amount counts.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Res {
    /// Plugin contexts: v11+ one per NCCL communicator (`init`), older ABIs one per process.
    Contexts,
    SendComms,
    RecvComms,
    ListenComms,
    /// Shared queues of one NIC for one context (a CQ, perhaps an SRQ, the routes).
    NicQueues,
    Cqs,
    /// Entries of those CQs (their depth as created or resized).
    CqEntries,
    Srqs,
    /// Depth of those SRQs.
    SrqWqes,
    /// WQEs posted in them now (as far as the plugin knows).
    SrqPosted,
    Qps,
    /// Sum of the QPs' send-queue depths.
    QpSendWrs,
    /// Bytes of the comms' control regions (CTS FIFO, completion records, scratch),
    /// counted once per NIC registration of them.
    ControlBytes,
    /// Capacity, in completions, of the per-connection completion inboxes.
    InboxEntries,
}

const N: usize = Res::InboxEntries as usize + 1;

#[allow(clippy::declare_interior_mutable_const)]
const ZERO: AtomicU64 = AtomicU64::new(0);

/// The amounts one plugin instance holds (`plugin::Process`; the process's is at the ABI
/// edge), and the completions it polled that no live connection claims.
#[derive(Debug)]
pub struct Counts {
    amounts: [AtomicU64; N],
    /// Completions polled from a shared CQ that no live connection claims (a closed
    /// connection's late ones): counted and dropped.
    unrouted: AtomicU64,
}

impl Default for Counts {
    fn default() -> Self {
        Counts::new()
    }
}

impl Counts {
    pub const fn new() -> Counts {
        Counts { amounts: [ZERO; N], unrouted: AtomicU64::new(0) }
    }

    /// Holds `n` of `what` until the returned [`Held`] is dropped.
    pub fn hold(&'static self, what: Res, n: u64) -> Held {
        self.amounts[what as usize].fetch_add(n, Ordering::Relaxed);
        Held { counts: self, what, n }
    }

    /// One completion no live connection claims.
    #[cold]
    pub fn count_unrouted(&self, n: u64) {
        self.unrouted.fetch_add(n, Ordering::Relaxed);
    }

    /// The figures now.
    pub fn snapshot(&self) -> Resources {
        let g = |r: Res| self.amounts[r as usize].load(Ordering::Relaxed);
        Resources {
            contexts: g(Res::Contexts),
            send_comms: g(Res::SendComms),
            recv_comms: g(Res::RecvComms),
            listen_comms: g(Res::ListenComms),
            nic_queues: g(Res::NicQueues),
            cqs: g(Res::Cqs),
            cq_entries: g(Res::CqEntries),
            srqs: g(Res::Srqs),
            srq_wqes: g(Res::SrqWqes),
            srq_posted: g(Res::SrqPosted),
            qps: g(Res::Qps),
            qp_send_wrs: g(Res::QpSendWrs),
            control_bytes: g(Res::ControlBytes),
            inbox_entries: g(Res::InboxEntries),
            unrouted_completions: self.unrouted.load(Ordering::Relaxed),
        }
    }
}

/// An amount of one resource, given back when dropped.
#[derive(Debug)]
pub struct Held {
    counts: &'static Counts,
    what: Res,
    n: u64,
}

impl Held {
    /// The amount held now becomes `n` (a CQ resized, WQEs posted or consumed).
    pub fn set(&mut self, n: u64) {
        let c = &self.counts.amounts[self.what as usize];
        if n >= self.n {
            c.fetch_add(n - self.n, Ordering::Relaxed);
        } else {
            c.fetch_sub(self.n - n, Ordering::Relaxed);
        }
        self.n = n;
    }

    pub fn get(&self) -> u64 {
        self.n
    }
}

impl Drop for Held {
    fn drop(&mut self) {
        self.counts.amounts[self.what as usize].fetch_sub(self.n, Ordering::Relaxed);
    }
}

/// The figures now.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct Resources {
    pub contexts: u64,
    pub send_comms: u64,
    pub recv_comms: u64,
    pub listen_comms: u64,
    pub nic_queues: u64,
    pub cqs: u64,
    pub cq_entries: u64,
    pub srqs: u64,
    pub srq_wqes: u64,
    pub srq_posted: u64,
    pub qps: u64,
    pub qp_send_wrs: u64,
    pub control_bytes: u64,
    pub inbox_entries: u64,
    pub unrouted_completions: u64,
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_held_amount_follows_set_and_is_given_back_when_dropped() {
        static COUNTS: Counts = Counts::new();
        let mut a = COUNTS.hold(Res::SrqPosted, 10);
        assert_eq!(COUNTS.snapshot().srq_posted, 10);
        a.set(3);
        assert_eq!((a.get(), COUNTS.snapshot().srq_posted), (3, 3));
        a.set(40);
        assert_eq!((a.get(), COUNTS.snapshot().srq_posted), (40, 40));
        let b = COUNTS.hold(Res::Qps, 2);
        COUNTS.count_unrouted(1);
        drop(a);
        assert_eq!(COUNTS.snapshot().srq_posted, 0, "given back");
        assert_eq!((COUNTS.snapshot().qps, COUNTS.snapshot().unrouted_completions), (2, 1));
        drop(b);
        assert_eq!(COUNTS.snapshot().qps, 0);
    }
}
