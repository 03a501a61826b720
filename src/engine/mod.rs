//! The dual-rail protocol as pure state machines (sans-IO, like quinn-proto and rustls):
//! calls and polled completions come in, work-request chains go out. No syscalls, no verbs,
//! no clock but the `now_ns` the caller passes, no allocation after construction.
//!
//! - [`SendEngine`]: matches sends to the receiver's CTS entries, splits each send between
//!   the rails at post time, emits one chain per active rail, completes sends.
//! - [`RecvEngine`]: posts CTS entries, tracks SRQ credits, decodes IMMs, learns the active
//!   mask, completes receives, and rejects every protocol violation with a precise error.
//! - Errors are typed ([`Violation`], [`CompletionFailed`], [`StrayCompletion`],
//!   [`Refused`]) and displayed as their log lines; a connection keeps its first failure.

mod actions;
pub mod config;
mod error_state;
pub mod failover;
mod hang;
pub mod imm;
pub mod layout;
pub mod place;
mod recv;
mod recv_path;
mod send;
mod send_path;
mod slots;
#[cfg(test)]
mod tests;

pub use crate::error::protocol::{CompletionFailed, Refused, Side, StrayCompletion, Violation, WorkRequest};
pub use actions::{Action, DownReason, Event, Output, QpRecords, RailState};
pub use config::{FailoverConfig, RecvConfig, SendConfig};
pub use failover::{CtlMemory, FailoverCounts, SILENT_FLOOR_NS, STALL_NS_PER_BYTE, SUSPECT_FLOOR_NS};
pub use place::{Place, PlaceRef};
pub use recv::{CTS_SIGNAL_EVERY, FLUSH_ID_BASE, FlushBuf, MAX_FLUSHES, RecvBuf, RecvDone, RecvEngine};
pub use send::{CallerWaits, PartState, SendBuf, SendEngine, SentPart, SlotView};

use crate::fabric::SendWr;
use error_state::ErrorState;

pub use crate::rail::{RAIL_NAMES, RAILS, RailMask, SOUT, SUP};
/// A connection whose caller is waiting (a receive outstanding, a send without its CTS)
/// and that has seen no completion for this long posts a keepalive: a tiny signalled WRITE
/// to the peer's scratch word. RC silently waits for a dead peer that is never written to;
/// the keepalive fails (peer gone, connection reset, retry budget spent) and the error
/// reaches the caller within this interval plus the fabric's own detection time.
pub const KEEPALIVE_NS: u64 = 100_000_000;

/// Whether the CPU may read a registered buffer. An inline WR is copied by the CPU at post
/// time (`IBV_SEND_INLINE` makes the provider `memcpy` the SGE), so a GPU buffer, which only
/// the NIC may read, must never be posted inline: the CPU would dereference a device
/// pointer (a fault, or garbage on the wire).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub enum CpuAccess {
    /// Host memory: small payloads may go inline.
    Readable,
    /// GPU memory (CUDA, DMA-BUF), or not known to be host memory: the NIC reads it.
    #[default]
    NicOnly,
}

/// Most WRs in one chain: one data WRITE per receive plus the signalling WR.
pub const MAX_CHAIN: usize = layout::MAX_RECVS + 1;

/// Which QP of a rail a chain goes on.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Default)]
pub enum QpRef {
    /// Data QP `i` of the rail (chosen round-robin per request, or per piece).
    Data(u16),
    /// The rail's fixed CTS QP (its first QP).
    #[default]
    Cts,
    /// The rail's loopback flush QP.
    Flush,
}

/// One chain of WRs for one QP: posted with one call.
#[derive(Clone, Copy, Debug, Default)]
pub struct Chain {
    pub rail: u8,
    pub qp: QpRef,
    pub len: u8,
    pub wrs: [SendWr; MAX_CHAIN],
}

impl Chain {
    /// The WRs to post.
    #[inline]
    pub fn wrs(&self) -> &[SendWr] {
        &self.wrs[..self.len as usize]
    }
}

/// Most chains one call produces: a chain per rail, or with striping one per piece.
pub const MAX_POSTS: usize = RAILS * imm::MAX_PIECES as usize;

/// The chains one call produced, in posting order (one per rail, or per piece of a
/// striped rail share).
#[derive(Clone, Debug, Default)]
pub struct Posts {
    pub n: u8,
    pub chains: [Chain; MAX_POSTS],
}

impl Posts {
    #[inline]
    pub fn clear(&mut self) {
        self.n = 0;
    }
    #[inline]
    pub fn chains(&self) -> &[Chain] {
        &self.chains[..self.n as usize]
    }
    /// A new chain for `rail` on `qp`; the caller fills its WRs.
    #[inline]
    fn push(&mut self, rail: usize, qp: QpRef) -> &mut Chain {
        let c = &mut self.chains[self.n as usize];
        self.n += 1;
        c.rail = rail as u8;
        c.qp = qp;
        c.len = 0;
        c
    }
}

impl Chain {
    #[inline]
    fn push(&mut self, wr: SendWr) {
        self.wrs[self.len as usize] = wr;
        self.len += 1;
    }
}

/// A snapshot of one rail's counters (the live ones are published through
/// `telemetry::RailStats`, read by the statistics file and `mpib_comm_counters`).
pub use crate::telemetry::RailCounts;

/// What a `wr_id` says about the WR it belongs to: kind (top 4 bits), rail, slot, extra.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum WrKind {
    /// The signalled last WR of a data chain.
    DataSignal,
    /// An unsignalled data WR (completes only on error).
    Data,
    /// A CTS WRITE (receiver).
    Cts,
    /// An idle-rail probe.
    Probe,
    /// A flush READ (receiver); `slot` is the flush request index.
    Flush,
    /// A control-ring WRITE (failover); `slot` is the ring entry.
    Control,
    /// The signalled last WR of a replayed part (failover); `rail` is the PART it delivers,
    /// the CQ it completes on is the surviving rail's.
    ReplaySignal,
    /// A re-admission probe (failover): a WRITE on a rebuilt QP; `slot` is the epoch's
    /// low byte.
    ReadmitProbe,
}

// The error messages' copies of the engine's limits.
const _: () = assert!(crate::error::protocol::MAX_RECVS == layout::MAX_RECVS);
const _: () = assert!(crate::error::protocol::SIZE_GRANULE == imm::SIZE_GRANULE);

impl WrKind {
    /// The work request a `wr_id` of this kind names, for error messages.
    pub(crate) fn request(self) -> WorkRequest {
        match self {
            WrKind::DataSignal | WrKind::ReplaySignal => WorkRequest::WriteWithImm,
            WrKind::Data => WorkRequest::DataWrite,
            WrKind::Cts => WorkRequest::CtsWrite,
            WrKind::Probe | WrKind::ReadmitProbe => WorkRequest::ProbeWrite,
            WrKind::Flush => WorkRequest::FlushRead,
            WrKind::Control => WorkRequest::ControlWrite,
        }
    }

    /// The failure of a WR of this kind for `slot` on `rail`, as completion `c` reports it.
    pub(crate) fn failed(self, rail: usize, slot: usize, c: &crate::fabric::Completion) -> CompletionFailed {
        let slot = if self == WrKind::Probe { None } else { Some(slot) };
        failure(rail, self.request(), slot, c)
    }

    #[inline]
    pub(crate) fn id(self, rail: usize, slot: usize) -> u64 {
        let k = match self {
            WrKind::DataSignal => 1u64,
            WrKind::Data => 2,
            WrKind::Cts => 3,
            WrKind::Probe => 4,
            WrKind::Flush => 5,
            WrKind::Control => 6,
            WrKind::ReplaySignal => 7,
            WrKind::ReadmitProbe => 8,
        };
        k << 60 | (rail as u64) << 8 | slot as u64
    }

    /// Decodes a `wr_id` into (kind, rail, slot); None for an id mpib never made.
    #[inline]
    pub(crate) fn decode(id: u64) -> Option<(WrKind, usize, usize)> {
        let kind = match id >> 60 {
            1 => WrKind::DataSignal,
            2 => WrKind::Data,
            3 => WrKind::Cts,
            4 => WrKind::Probe,
            5 => WrKind::Flush,
            6 => WrKind::Control,
            7 => WrKind::ReplaySignal,
            8 => WrKind::ReadmitProbe,
            _ => return None,
        };
        let rail = ((id >> 8) & 0xff) as usize;
        if rail >= RAILS {
            return None;
        }
        Some((kind, rail, (id & 0xff) as usize))
    }
}

/// The failure of `what` (for `slot`) on `rail`, as completion `c` reports it: its status,
/// QP and vendor error.
pub(crate) fn failure(
    rail: usize,
    what: WorkRequest,
    slot: Option<usize>,
    c: &crate::fabric::Completion,
) -> CompletionFailed {
    CompletionFailed { rail, what, slot, status: c.status, qp_num: c.qp_num, vendor_err: c.vendor_err() }
}

/// Builds an error out of the hot path: `make` runs only on failure, in a function of its
/// own, so the callers' common path carries none of it. Pass a `move` closure: it copies the
/// error's (small, `Copy`) fields on failure only, where one capturing by reference makes
/// the hot path keep each of them in a stack slot for it (the receiver's IMM checks cost
/// 14 instructions more per message that way).
#[cold]
#[inline(never)]
pub fn cold(make: impl FnOnce() -> crate::Error) -> crate::Error {
    make()
}
