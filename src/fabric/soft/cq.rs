//! Completion queue and shared receive queue of the soft fabric.
//!
//! A CQ is a fixed ring of completions (`ring.rs`) plus the list of QPs attached to it,
//! both shared with the connections (`endpoint.rs`). `poll` is where the soft NIC runs
//! before it hands out completions:
//!
//! - TCP: it steps links, not QPs, so its cost does not grow with the QPs attached. A CQ
//!   whose QPs are all on one link (one peer) steps that link (one `readv` when nothing
//!   came), or, once the link has been cold for a few polls, asks the readiness set first
//!   (`progress::COLD_STEPS`); one whose QPs use several asks the device's readiness set which
//!   links moved (one non-blocking `epoll_wait`) and steps those, and the links queued to be
//!   stepped again. QPs whose completions found the ring full are retired again by the next polls.
//! - In-process mode: it steps each attached connection, and its peer, that has work.
//!
//! A CQ never overflows: requesters whose completions find it full keep them until it
//! drains; a WRITE_WITH_IMM reserves its slot before it is accepted (else RNR). Producers
//! (the attached QPs, the device's helper thread, in-process peers) take the ring's lock;
//! the poller takes none.
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
use super::link::Link;
use super::port::Port;
use super::progress::CqPace;
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
    /// TCP: the device, and the distinct links of the attached QPs.
    port: Option<Arc<Port<Conn>>>,
    links: Vec<Arc<Link<Conn>>>,
    events: Box<[libc::epoll_event; 64]>,
    /// When a poll tells the helper's clock callers poll, whether the one link is cold
    /// (`progress.rs`).
    pace: CqPace,
}

impl SoftCq {
    pub(super) fn new(depth: u32) -> SoftCq {
        let shared = CqShared::new(depth);
        let attached = Arc::new(Attached::new(shared.clone()));
        SoftCq {
            shared,
            attached,
            conns: Vec::new(),
            seen_generation: u64::MAX,
            any_tcp: false,
            port: None,
            links: Vec::new(),
            events: Box::new([libc::epoll_event { events: 0, u64: 0 }; 64]),
            pace: CqPace::default(),
        }
    }

    /// Takes a fresh copy of the attached QPs (control path: QPs come and go, and move to
    /// links).
    #[cold]
    fn refresh(&mut self, generation: u64) {
        self.conns = self.attached.snapshot();
        self.seen_generation = generation;
        self.any_tcp = self.conns.iter().any(|c| !c.inproc);
        self.links.clear();
        for c in self.conns.iter().filter(|c| !c.inproc) {
            self.port.get_or_insert_with(|| c.port.clone());
            if let Some(l) = c.st.lock().link()
                && !self.links.iter().any(|x| Arc::ptr_eq(x, l))
            {
                self.links.push(l.clone());
            }
        }
        // Only the in-process connections are stepped one by one.
        self.conns.retain(|c| c.inproc);
    }

    /// TCP: steps the links of the attached QPs (see the module documentation).
    #[inline(never)]
    fn step_tcp(&mut self) {
        let Some(port) = &self.port else { return };
        if self.pace.report_poll() {
            port.caller_polled();
        }
        match self.links.as_slice() {
            [] => {}
            [one] => {
                let queued = port.step_again(Some(one));
                let moved = if !queued && self.pace.cold() {
                    // Cold: only the links whose sockets moved are stepped.
                    port.step_moved(&mut self.events[..], Some(one))
                } else {
                    port.step_try(one, false)
                };
                self.pace.stepped(moved);
            }
            _ => port.poll_ready(&mut self.events[..]),
        }
        for c in self.attached.take_blocked() {
            c.retire_blocked();
        }
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
            self.step_tcp();
        }
        for c in &self.conns {
            step_direct(c);
        }
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
