//! Completion queue and shared receive queue of the soft fabric.
//!
//! A CQ is a fixed ring of completions (`ring.rs`) plus the list of QPs attached to it:
//! `poll` is where the soft NIC runs, making one progress step on every attached connection
//! (in-process mode: on each one and its peer that has work) before it hands out
//! completions. Connections that find the ring full stop producing completions (they stop
//! reading) until it drains, so a CQ never overflows. Producers (the attached QPs, the
//! device's helper thread, in-process peers) take the ring's lock; the poller takes none.
//!
//! An SRQ is a counter of generic WQEs: posting adds, a WRITE_WITH_IMM takes one.
//!
//! The common poll is cheap: an empty ring is two loads, and connections are stepped only
//! when the CQ's `work` flag says one may need it (a TCP connection attached, or an
//! in-process connection, or its peer, with WRs waiting or a closed peer: see `direct.rs`).

use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicU32, AtomicU64, Ordering};

use parking_lot::Mutex;

use super::conn::Conn;
use super::ring::{CqRing, Producer};
use crate::error::{Error, Result};
use crate::fabric::{Completion, CompletionQueue, SharedRecvQueue};

pub struct CqShared {
    ring: CqRing,
    /// A poll must step the attached connections (see the module documentation): raised
    /// whenever one may have work, cleared by the poll that steps them.
    work: AtomicBool,
    /// QPs attached to this CQ; `generation` changes whenever the list does.
    conns: Mutex<Vec<Arc<Conn>>>,
    generation: AtomicU64,
}

impl CqShared {
    pub fn new(depth: u32) -> Arc<CqShared> {
        Arc::new(CqShared {
            ring: CqRing::new(depth as usize),
            work: AtomicBool::new(false),
            conns: Mutex::new(Vec::new()),
            generation: AtomicU64::new(0),
        })
    }

    /// Locks the ring of completions against the other producers.
    #[inline]
    pub fn lock(&self) -> Producer<'_> {
        self.ring.lock()
    }

    /// The next poll steps the attached connections (a connection attached here, or the
    /// peer of one, may have work). Store it after the work itself is visible.
    #[inline]
    pub fn raise_work(&self) {
        self.work.store(true, Ordering::Release);
    }

    pub fn attach(&self, c: Arc<Conn>) {
        self.conns.lock().push(c);
        self.generation.fetch_add(1, Ordering::Release);
        self.raise_work();
    }

    pub fn detach(&self, c: &Arc<Conn>) {
        self.conns.lock().retain(|x| !Arc::ptr_eq(x, c));
        self.generation.fetch_add(1, Ordering::Release);
        // The next poll refreshes its copy (and lets go of `c`).
        self.raise_work();
    }
}

/// A soft completion queue.
pub struct SoftCq {
    pub(super) shared: Arc<CqShared>,
    /// This poller's copy of the attached QPs, refreshed when `generation` moves (control path).
    conns: Vec<Arc<Conn>>,
    seen_generation: u64,
    /// A TCP connection is attached: every poll steps (the NIC answers its peer when polled),
    /// so each step raises `work` again for the next.
    any_tcp: bool,
}

impl SoftCq {
    pub(super) fn new(depth: u32) -> SoftCq {
        SoftCq { shared: CqShared::new(depth), conns: Vec::new(), seen_generation: u64::MAX, any_tcp: false }
    }

    /// Takes a fresh copy of the attached QPs (control path: QPs come and go).
    #[cold]
    fn refresh(&mut self, generation: u64) {
        self.conns = self.shared.conns.lock().clone();
        self.seen_generation = generation;
        self.any_tcp = self.conns.iter().any(|c| !c.inproc);
    }

    /// One progress step on the attached connections that may need one.
    #[inline(never)]
    fn step(&mut self) {
        // Cleared first (a swap reads the latest raise: none is lost): work raised from now
        // on is seen by the next poll. Acquire: the attachments and the work that raised
        // the flag are visible below.
        self.shared.work.swap(false, Ordering::AcqRel);
        let generation = self.shared.generation.load(Ordering::Acquire);
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
    c.direct_progress(&mut c.st.lock());
}

impl CompletionQueue for SoftCq {
    /// Always inlined into the few drain loops: the common poll is a few loads.
    #[inline(always)]
    fn poll(&mut self, out: &mut [Completion]) -> Result<usize> {
        if self.shared.work.load(Ordering::Relaxed) {
            self.step();
        }
        // SAFETY: this is the ring's one consumer: a `SoftCq` is the only poller of its
        // `CqShared` (not `Clone`; `poll` takes `&mut self`), and QPs only push.
        Ok(unsafe { self.shared.ring.pop_into(out) })
    }
}

pub struct SrqShared {
    posted: AtomicU32,
    cap: u32,
    pub rnr: AtomicU64,
}

impl SrqShared {
    /// Takes one WQE; `false` when none is posted (receiver not ready).
    pub fn take(&self) -> bool {
        self.posted.fetch_update(Ordering::AcqRel, Ordering::Acquire, |n| n.checked_sub(1)).is_ok()
    }

    /// Returns a WQE taken for a WRITE_IMM that was then refused.
    pub fn give_back(&self) {
        self.posted.fetch_add(1, Ordering::AcqRel);
    }
}

/// A soft shared receive queue.
pub struct SoftSrq {
    pub(super) shared: Arc<SrqShared>,
}

impl SoftSrq {
    pub(super) fn new(depth: u32) -> SoftSrq {
        SoftSrq { shared: Arc::new(SrqShared { posted: AtomicU32::new(0), cap: depth.max(1), rnr: AtomicU64::new(0) }) }
    }

    /// WQEs posted and not yet consumed.
    pub fn posted(&self) -> u32 {
        self.shared.posted.load(Ordering::Acquire)
    }
}

impl SharedRecvQueue for SoftSrq {
    fn post_recv(&mut self, count: u32) -> Result<()> {
        let cap = self.shared.cap;
        self.shared
            .posted
            .fetch_update(Ordering::AcqRel, Ordering::Acquire, |n| n.checked_add(count).filter(|t| *t <= cap))
            .map(|_| ())
            .map_err(|n| Error::invalid_usage(format!("SRQ overflow: {n} WQEs posted, {count} more, depth {cap}")))
    }

    fn rnr_events(&self) -> u64 {
        self.shared.rnr.load(Ordering::Relaxed)
    }
}
