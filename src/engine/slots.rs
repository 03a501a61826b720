//! The engines' per-slot and per-request state: the sender's posted slots and requests, the
//! receiver's slots. The hot path owns them (`send/`, `recv/`); failover (`failover/`) is
//! lent them for a step through the views in `send_path.rs` and `recv_path.rs`. Here, below
//! both, so that neither the engines nor failover import the other's types.

use super::layout::MAX_RECVS;
use super::{RAILS, RailMask};

/// Where a send request is.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub(crate) enum ReqState {
    #[default]
    Free,
    /// Matched to a CTS entry, waiting for the other sends of its slot or its completion.
    Pending,
    Done,
}

/// A send request: its state and size.
#[derive(Clone, Copy, Debug, Default)]
pub(crate) struct SendReq {
    pub(crate) state: ReqState,
    /// Bytes actually sent (clamped to the posted receive).
    pub(crate) size: u64,
}

/// A slot whose chains are posted and not yet complete (failover settles its parts).
#[derive(Clone, Copy, Debug, Default)]
pub(crate) struct PostedSlot {
    pub(crate) n: u8,
    pub(crate) reqs: [u16; MAX_RECVS],
    /// Rails whose signalled WR has not completed yet.
    pub(crate) pending: RailMask,
    pub(crate) posted_ns: [u64; RAILS],
    pub(crate) bytes: [u64; RAILS],
    /// Pieces of a striped rail share whose signalled WR is out, beyond the last one (the
    /// rail stays in `pending` until that one completes).
    pub(crate) extra_pieces: [u8; RAILS],
    /// The receive sequence number (0-based) of the slot's CTS (hang reports, the profiler,
    /// failover's reports name it).
    pub(crate) seq: u64,
}

/// Where a receive slot is.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub(crate) enum RecvState {
    #[default]
    Free,
    Posted,
    Done,
}

/// A receive slot: the receives posted in it and what of their data arrived.
#[derive(Clone, Copy, Debug, Default)]
pub(crate) struct RecvSlot {
    pub(crate) state: RecvState,
    pub(crate) n: u8,
    pub(crate) posted: [u64; MAX_RECVS],
    /// Learned from the first IMM; empty until then.
    pub(crate) expected: RailMask,
    pub(crate) seen: RailMask,
    pub(crate) size_q: u32,
    pub(crate) byte_sum: u64,
    /// Striped rail shares: the pieces each rail announced, how many arrived (valid once
    /// `pieces_seen` is not 0), and their bytes; a rail's part is seen when all are in.
    pub(crate) pieces: [u8; RAILS],
    pub(crate) pieces_seen: [u8; RAILS],
    pub(crate) part_bytes: [u64; RAILS],
    /// The signalled CTS WRITE of this slot has not completed yet.
    pub(crate) cts_pending: bool,
    pub(crate) data_done: bool,
    pub(crate) sizes: [u64; MAX_RECVS],
}
