//! Completion queue and shared receive queue of the soft fabric.
//!
//! A CQ is a fixed ring of completions plus the list of QPs attached to it: `poll` is where
//! the soft NIC runs, making one progress step on every attached connection (and, in
//! in-process mode, on each one's peer) before it hands out completions. Connections that
//! find the ring full stop producing completions (they stop reading) until it drains, so a
//! CQ never overflows. The ring's lock is shared only with the device's helper thread.
//!
//! An SRQ is a counter of generic WQEs: posting adds, a WRITE_WITH_IMM takes one.

use std::collections::VecDeque;
use std::sync::Arc;
use std::sync::atomic::{AtomicU32, AtomicU64, Ordering};

use parking_lot::Mutex;

use super::conn::Conn;
use crate::error::{Error, Result};
use crate::fabric::{Completion, CompletionQueue, SharedRecvQueue};

/// A bounded ring of completions.
pub struct CqRing {
    q: VecDeque<Completion>,
    cap: usize,
}

impl CqRing {
    /// Appends `c`; `false` when the ring is full.
    pub fn push(&mut self, c: Completion) -> bool {
        if self.q.len() == self.cap {
            return false;
        }
        self.q.push_back(c);
        true
    }
}

pub struct CqShared {
    pub ring: Mutex<CqRing>,
    /// QPs attached to this CQ; `generation` changes whenever the list does.
    conns: Mutex<Vec<Arc<Conn>>>,
    generation: AtomicU64,
}

impl CqShared {
    pub fn new(depth: u32) -> Arc<CqShared> {
        let cap = depth.max(1) as usize;
        Arc::new(CqShared {
            ring: Mutex::new(CqRing { q: VecDeque::with_capacity(cap), cap }),
            conns: Mutex::new(Vec::new()),
            generation: AtomicU64::new(0),
        })
    }

    pub fn attach(&self, c: Arc<Conn>) {
        self.conns.lock().push(c);
        self.generation.fetch_add(1, Ordering::Release);
    }

    pub fn detach(&self, c: &Arc<Conn>) {
        self.conns.lock().retain(|x| !Arc::ptr_eq(x, c));
        self.generation.fetch_add(1, Ordering::Release);
    }
}

/// A soft completion queue.
pub struct SoftCq {
    pub(super) shared: Arc<CqShared>,
    /// This poller's copy of the attached QPs, refreshed when `generation` moves (control path).
    conns: Vec<Arc<Conn>>,
    seen_generation: u64,
}

impl SoftCq {
    pub(super) fn new(depth: u32) -> SoftCq {
        SoftCq { shared: CqShared::new(depth), conns: Vec::new(), seen_generation: u64::MAX }
    }
}

/// One progress step on `c` from a caller; in-process mode also steps its peer, which has
/// no NIC of its own, until neither side moves.
pub fn step_conn(c: &Conn) {
    let peer = c.inproc_peer.get().and_then(|w| w.upgrade());
    for _ in 0..1024 {
        let mut moved = match c.st.try_lock() {
            Some(mut st) => c.progress(&mut st, true),
            None => false,
        };
        let Some(p) = peer.as_ref() else { return };
        if let Some(mut ps) = p.st.try_lock() {
            moved |= p.progress(&mut ps, false);
        }
        if !moved {
            return;
        }
    }
}

impl CompletionQueue for SoftCq {
    fn poll(&mut self, out: &mut [Completion]) -> Result<usize> {
        let generation = self.shared.generation.load(Ordering::Acquire);
        if generation != self.seen_generation {
            self.conns = self.shared.conns.lock().clone();
            self.seen_generation = generation;
        }
        for c in &self.conns {
            step_conn(c);
        }
        let mut ring = self.shared.ring.lock();
        let n = out.len().min(ring.q.len());
        for (o, c) in out.iter_mut().zip(ring.q.drain(..n)) {
            *o = c;
        }
        Ok(n)
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
