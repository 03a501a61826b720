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

use super::conn_inproc::InprocConn;
use super::conn_tcp::TcpConn;
use super::endpoint::{Attached, CqShared, SrqShared};
use super::link::Link;
use super::port::Port;
use super::progress::CqPace;
use crate::error::{Error, Result};
use crate::fabric::{Completion, CompletionQueue, SharedRecvQueue};

/// A soft completion queue: its ring, and what its poll steps (of the device's kind).
pub struct SoftCq {
    pub(super) shared: Arc<CqShared>,
    pub(super) conns: Conns,
}

/// The connections a CQ's poll steps, with the poller's copy of the list.
pub(super) enum Conns {
    Tcp(Box<TcpPoll>),
    Inproc(InprocPoll),
}

/// What a TCP CQ's poll steps: the links of its connections.
pub(super) struct TcpPoll {
    pub attached: Arc<Attached<TcpConn>>,
    seen_generation: u64,
    /// The device's port, once a connection is attached.
    port: Option<Arc<Port<TcpConn>>>,
    links: Vec<Arc<Link<TcpConn>>>,
    events: [libc::epoll_event; 64],
    pace: CqPace,
}

/// What an in-process CQ's poll steps: its connections (and their peers).
pub(super) struct InprocPoll {
    pub attached: Arc<Attached<InprocConn>>,
    seen_generation: u64,
    conns: Vec<Arc<InprocConn>>,
}

impl SoftCq {
    /// A CQ of `depth` completions, for a TCP device's QPs or (`tcp` false) in-process ones.
    pub(super) fn new(depth: u32, tcp: bool) -> SoftCq {
        let shared = CqShared::new(depth);
        let conns = if tcp {
            Conns::Tcp(Box::new(TcpPoll {
                attached: Arc::new(Attached::new(shared.clone())),
                seen_generation: u64::MAX,
                port: None,
                links: Vec::new(),
                events: [libc::epoll_event { events: 0, u64: 0 }; 64],
                pace: CqPace::default(),
            }))
        } else {
            Conns::Inproc(InprocPoll {
                attached: Arc::new(Attached::new(shared.clone())),
                seen_generation: u64::MAX,
                conns: Vec::new(),
            })
        };
        SoftCq { shared, conns }
    }

    /// Steps what may have work (the `work` flag was up).
    #[inline(never)]
    fn step(&mut self) {
        self.shared.take_work();
        match &mut self.conns {
            Conns::Tcp(t) => t.step(&self.shared),
            Conns::Inproc(d) => {
                let generation = d.attached.generation();
                if generation != d.seen_generation {
                    d.conns = d.attached.snapshot();
                    d.seen_generation = generation;
                }
                for c in &d.conns {
                    c.step();
                }
            }
        }
    }
}

impl TcpPoll {
    /// Takes the attached connections' links again (they came, went or moved).
    #[cold]
    fn refresh(&mut self, generation: u64) {
        self.seen_generation = generation;
        self.links.clear();
        let conns = self.attached.snapshot();
        self.port = conns.first().map(|c| c.port.clone());
        for c in conns {
            if let Some(l) = &c.st.lock().link
                && !self.links.iter().any(|x| Arc::ptr_eq(x, l))
            {
                self.links.push(l.clone());
            }
        }
    }

    /// Steps the links (see the module documentation); keeps the CQ's `work` flag up while
    /// a connection is attached, so every poll steps.
    fn step(&mut self, shared: &CqShared) {
        let generation = self.attached.generation();
        if generation != self.seen_generation {
            self.refresh(generation);
        }
        let Some(port) = &self.port else { return };
        shared.raise_work();
        if self.pace.report_poll() {
            port.caller_polled();
        }
        match self.links.as_slice() {
            [] => {}
            [one] => {
                let queued = port.step_again(Some(one));
                let moved = if !queued && self.pace.cold() {
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
        unsafe { self.shared.grow(depth as usize) };
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
