//! Completion queue and shared receive queue of the soft fabric.
//!
//! A CQ is a fixed ring of completions (`ring.rs`) plus the list of QPs attached to it,
//! both shared with the connections (`endpoint.rs`). `poll` is where the soft NIC runs,
//! making one progress step on every attached connection
//! (in-process mode: on each one and its peer that has work) before it hands out
//! completions. Connections that find the ring full stop producing completions (they stop
//! reading) until it drains, so a CQ never overflows. Producers (the attached QPs, the
//! device's helper thread, in-process peers) take the ring's lock; the poller takes none.
//!
//! An SRQ is a counter of generic WQEs (`endpoint.rs`): posting adds, a WRITE_WITH_IMM
//! takes one.
//!
//! The common poll is cheap: an empty ring is two loads, and connections are stepped only
//! when the CQ's `work` flag says one may need it (a TCP connection attached, or an
//! in-process connection, or its peer, with WRs waiting or a closed peer: see `direct.rs`).

use std::sync::Arc;
use std::sync::atomic::Ordering;

use super::conn::Conn;
use super::endpoint::{Attached, CqShared, SrqShared};
use crate::error::{Error, Result};
use crate::fabric::{Completion, CompletionQueue, SharedRecvQueue};

/// A soft completion queue.
pub struct SoftCq {
    pub(super) shared: Arc<CqShared>,
    pub(super) attached: Arc<Attached<Conn>>,
    /// This poller's copy of the attached QPs, refreshed when `generation` moves (control path).
    conns: Vec<Arc<Conn>>,
    seen_generation: u64,
    /// A TCP connection is attached: every poll steps (the NIC answers its peer when polled),
    /// so each step raises `work` again for the next.
    any_tcp: bool,
}

impl SoftCq {
    pub(super) fn new(depth: u32) -> SoftCq {
        let shared = CqShared::new(depth);
        let attached = Arc::new(Attached::new(shared.clone()));
        SoftCq { shared, attached, conns: Vec::new(), seen_generation: u64::MAX, any_tcp: false }
    }

    /// Takes a fresh copy of the attached QPs (control path: QPs come and go).
    #[cold]
    fn refresh(&mut self, generation: u64) {
        self.conns = self.attached.snapshot();
        self.seen_generation = generation;
        self.any_tcp = self.conns.iter().any(|c| !c.inproc);
    }

    /// One progress step on the attached connections that may need one.
    #[inline(never)]
    fn step(&mut self) {
        // Cleared first: work raised from now on is seen by the next poll.
        self.shared.take_work();
        let generation = self.attached.generation();
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
    c.progress_inproc(&mut c.st.lock());
}

impl CompletionQueue for SoftCq {
    /// Always inlined into the few drain loops: the common poll is a few loads.
    #[inline(always)]
    fn poll(&mut self, out: &mut [Completion]) -> Result<usize> {
        if self.shared.has_work() {
            self.step();
        }
        // SAFETY: this is the ring's one consumer: a `SoftCq` is the only poller of its
        // `CqShared` (not `Clone`; `poll` takes `&mut self`), and QPs only push.
        Ok(unsafe { self.shared.pop_into(out) })
    }

    /// The completions are read in the ring (the poller routes each without a copy).
    #[inline(always)]
    fn poll_each(&mut self, buf: &mut [Completion], f: impl FnMut(&Completion)) -> Result<usize> {
        if self.shared.has_work() {
            self.step();
        }
        // SAFETY: as in `poll`: this is the ring's one consumer.
        Ok(unsafe { self.shared.pop_each(buf.len(), f) })
    }

    fn resize(&mut self, depth: u32) -> Result<()> {
        // SAFETY: as in `poll`: this is the ring's one consumer, not polling now (`&mut self`).
        unsafe { self.shared.grow(depth) };
        Ok(())
    }
}

/// A soft shared receive queue.
pub struct SoftSrq {
    pub(super) shared: Arc<SrqShared>,
}

impl SoftSrq {
    pub(super) fn new(depth: u32) -> SoftSrq {
        SoftSrq { shared: SrqShared::new(depth) }
    }

    /// WQEs posted and not yet consumed.
    pub fn posted(&self) -> u32 {
        self.shared.posted()
    }
}

impl SharedRecvQueue for SoftSrq {
    fn post_recv(&mut self, count: u32) -> Result<()> {
        let cap = self.shared.cap();
        self.shared
            .post(count)
            .map_err(|n| Error::invalid_usage(format!("SRQ overflow: {n} WQEs posted, {count} more, depth {cap}")))
    }

    fn rnr_events(&self) -> u64 {
        self.shared.rnr_events()
    }
}
