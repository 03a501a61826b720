//! What one side of a connection executes against: its QP number, its device's
//! registrations (the protection domain), the producer side of its CQ and its SRQ. The
//! connection holds its own [`Endpoint`]; an in-process connection's link holds the peer's,
//! so a WR executes against the peer's memory, SRQ and CQ without reaching its connection.
//!
//! A CQ here is the ring of completions (`ring.rs`), the `work` flag that tells its poll to
//! step the attached connections, and the list of those ([`Attached`], generic over the
//! connection type: what a step is, is the poller's business, `cq.rs`). An SRQ is a counter
//! of generic WQEs: posting adds, a WRITE_WITH_IMM takes one.

use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicU32, AtomicU64, Ordering};

use parking_lot::Mutex;

use super::mr::MrTable;
use super::ring::CqRing;

/// One side of a connection (see the module documentation).
#[derive(Clone)]
pub struct Endpoint {
    pub qp_num: u32,
    pub mrs: Arc<MrTable>,
    pub cq: Arc<CqShared>,
    /// `None`: the QP receives no WRITE_WITH_IMM (refused with `RemoteOpError`).
    pub srq: Option<Arc<SrqShared>>,
}

/// The part of a CQ its producers share: the ring and the poll's `work` flag.
pub struct CqShared {
    ring: CqRing,
    /// A poll must step the attached connections: raised whenever one may have work,
    /// cleared by the poll that steps them.
    work: AtomicBool,
}

impl CqShared {
    pub fn new(depth: u32) -> Arc<CqShared> {
        Arc::new(CqShared { ring: CqRing::new(depth as usize), work: AtomicBool::new(false) })
    }

    /// The next poll steps the attached connections (a connection attached here, or the
    /// peer of one, may have work). Store it after the work itself is visible.
    #[inline]
    pub fn raise_work(&self) {
        self.work.store(true, Ordering::Release);
    }

    /// Whether a poll should step the attached connections (the poll's first load).
    #[inline(always)]
    pub fn has_work(&self) -> bool {
        self.work.load(Ordering::Relaxed)
    }

    /// Clears the flag before the attached connections are stepped. A swap reads the
    /// latest raise (none is lost): work raised from now on is seen by the next poll.
    /// Acquire: the attachments and the work that raised the flag are visible after it.
    #[inline]
    pub fn take_work(&self) {
        self.work.swap(false, Ordering::AcqRel);
    }
}

/// The ring: its producers lock it (`lock`), its one poller pops from it (`pop_into`,
/// `pop_each`, `grow`, `unsafe`: see `ring.rs`).
impl std::ops::Deref for CqShared {
    type Target = CqRing;
    #[inline(always)]
    fn deref(&self) -> &CqRing {
        &self.ring
    }
}

/// The connections attached to a CQ: its poll steps them. Held by the CQ and by each
/// connection (which detaches itself when its QP is dropped).
pub struct Attached<C> {
    cq: Arc<CqShared>,
    conns: Mutex<Vec<Arc<C>>>,
    /// Changes whenever `conns` does, or a connection's transport does.
    generation: AtomicU64,
    /// TCP connections whose completions found the CQ full: the CQ's polls retire them.
    blocked: Mutex<Vec<Arc<C>>>,
    any_blocked: AtomicBool,
}

impl<C> Attached<C> {
    pub fn new(cq: Arc<CqShared>) -> Attached<C> {
        Attached {
            cq,
            conns: Mutex::new(Vec::new()),
            generation: AtomicU64::new(0),
            blocked: Mutex::new(Vec::new()),
            any_blocked: AtomicBool::new(false),
        }
    }

    /// A connection changed in a way the poller's copy must see (its transport).
    pub fn bump(&self) {
        self.generation.fetch_add(1, Ordering::Release);
        self.cq.raise_work();
    }

    /// `c` has completions waiting for room in the CQ: the CQ's polls retire them.
    pub fn block(&self, c: &Arc<C>) {
        let mut b = self.blocked.lock();
        if !b.iter().any(|x| Arc::ptr_eq(x, c)) {
            b.push(c.clone());
        }
        self.any_blocked.store(true, Ordering::Release);
    }

    /// The connections waiting for room (emptied; each blocks itself again if it must).
    pub fn take_blocked(&self) -> Vec<Arc<C>> {
        if !self.any_blocked.load(Ordering::Acquire) {
            return Vec::new();
        }
        self.any_blocked.store(false, Ordering::Release);
        std::mem::take(&mut *self.blocked.lock())
    }

    pub fn attach(&self, c: Arc<C>) {
        self.conns.lock().push(c);
        self.generation.fetch_add(1, Ordering::Release);
        self.cq.raise_work();
    }

    pub fn detach(&self, c: &Arc<C>) {
        self.conns.lock().retain(|x| !Arc::ptr_eq(x, c));
        self.blocked.lock().retain(|x| !Arc::ptr_eq(x, c));
        self.generation.fetch_add(1, Ordering::Release);
        // The next poll refreshes its copy (and lets go of `c`).
        self.cq.raise_work();
    }

    /// The list's generation now (Acquire: the list as of that generation is visible).
    #[inline]
    pub fn generation(&self) -> u64 {
        self.generation.load(Ordering::Acquire)
    }

    /// A copy of the list (control path: connections come and go).
    pub fn snapshot(&self) -> Vec<Arc<C>> {
        self.conns.lock().clone()
    }
}

/// The generic WQEs of a shared receive queue.
pub struct SrqShared {
    posted: AtomicU32,
    cap: u32,
    rnr: AtomicU64,
}

impl SrqShared {
    pub fn new(depth: u32) -> Arc<SrqShared> {
        Arc::new(SrqShared { posted: AtomicU32::new(0), cap: depth.max(1), rnr: AtomicU64::new(0) })
    }

    /// Takes one WQE; `false` when none is posted (receiver not ready).
    #[inline]
    pub fn take(&self) -> bool {
        self.posted.fetch_update(Ordering::AcqRel, Ordering::Acquire, |n| n.checked_sub(1)).is_ok()
    }

    /// Returns a WQE taken for a WRITE_IMM that was then refused.
    pub fn give_back(&self) {
        self.posted.fetch_add(1, Ordering::AcqRel);
    }

    /// Posts `count` WQEs; `Err(posted)` when that would exceed the depth.
    pub fn post(&self, count: u32) -> Result<(), u32> {
        let cap = self.cap;
        self.posted
            .fetch_update(Ordering::AcqRel, Ordering::Acquire, |n| n.checked_add(count).filter(|t| *t <= cap))?;
        Ok(())
    }

    pub fn cap(&self) -> u32 {
        self.cap
    }

    /// WQEs posted and not yet consumed.
    pub fn posted(&self) -> u32 {
        self.posted.load(Ordering::Acquire)
    }

    /// A WRITE_WITH_IMM found the SRQ empty and waits (counted once per wait).
    pub fn count_rnr(&self) {
        self.rnr.fetch_add(1, Ordering::Relaxed);
    }

    /// Receiver-not-ready waits so far.
    pub fn rnr_events(&self) -> u64 {
        self.rnr.load(Ordering::Relaxed)
    }
}
