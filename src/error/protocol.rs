//! The engine's errors, typed: what went wrong is a value that failover and tests match,
//! and its `Display` is the log line it always was.
//!
//! - [`Violation`]: the peer broke the dual-rail protocol (a bad IMM, a bad CTS entry). The
//!   connection is broken; its rails may be fine.
//! - [`CompletionFailed`]: a work request failed on a rail: that rail's failure, with the
//!   WR and the fabric's status.
//! - [`StrayCompletion`]: a completion the engine cannot account for: a bug here or in the
//!   fabric. The connection is broken.
//! - [`Refused`]: a call the engine refuses (NCCL's misuse); the connection goes on.
//!
//! Each converts into [`crate::Error`] with its `ncclResult_t` class. They are built only on
//! failure, in cold code (`engine::cold`): a `Result` of the data path stays one pointer.
//!
//! A leaf beside `Error`: the engine (which makes them) and every layer that reads them
//! depend on this module, which depends only on the rail names and the completion status.

use std::fmt;

use super::{Cause, Error, ErrorKind};
use crate::fabric::status::WcStatus;
use crate::rail::{RAIL_NAMES, RailMask};

/// Most buffers one receive groups (the engine's `layout::MAX_RECVS`, checked equal there).
pub const MAX_RECVS: usize = 8;
/// Bytes one unit of an IMM's `size_q` stands for (the engine's `imm::SIZE_GRANULE`,
/// checked equal there).
pub const SIZE_GRANULE: u64 = 128;

/// The peer broke the protocol. `rail`: the rail the offending IMM arrived on; `slot`: the
/// CTS slot it names.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Violation {
    /// An IMM whose rail mask is empty or names a rail this device lacks (`rails`).
    BadMask { rail: usize, slot: usize, imm: u32, mask: RailMask, rails: RailMask },
    /// An IMM that arrived on a rail its own mask does not name.
    MaskOmitsRail { rail: usize, slot: usize, mask: RailMask },
    /// An IMM for a slot with no receive waiting for data: none posted, or its data
    /// already arrived (a duplicate, or the slot's reuse before its receive completed).
    NoReceiveWaiting { rail: usize, slot: usize },
    /// An IMM whose mask differs from the one an earlier IMM of the slot announced.
    MaskChanged { rail: usize, slot: usize, mask: RailMask, earlier: RailMask },
    /// A second IMM for the slot from the same rail.
    DuplicateImm { rail: usize, slot: usize },
    /// An IMM whose `size_q` differs from an earlier IMM's of the slot.
    SizeQChanged { rail: usize, slot: usize, size_q: u32, earlier: u32 },
    /// An IMM announcing `pieces` pieces of a striped rail share where the sender stripes
    /// over at most `most` (its Hello; 1 for a replay, which re-sends a part whole).
    BadPieces { rail: usize, slot: usize, pieces: u8, most: u8 },
    /// A piece announcing `pieces` pieces where an earlier piece of the rail's share
    /// announced `earlier`.
    PiecesChanged { rail: usize, slot: usize, pieces: u8, earlier: u8 },
    /// An IMM encoding a size (not the sentinel) for a slot of `n` > 1 receives.
    SizeForMultiRecv { rail: usize, slot: usize, n: usize },
    /// Fast path: the `bytes` that arrived on the slot's rails do not round to `size_q`, or
    /// exceed the `posted` receive.
    BytesMismatch { rail: usize, slot: usize, bytes: u64, size_q: u32, posted: u64 },
    /// Completion record `index` of the slot claims more bytes than its `posted` receive.
    RecordTooLarge { rail: usize, slot: usize, index: usize, claimed: u64, posted: u64 },
    /// A CTS slot announcing `n` receives, outside `1..=MAX_RECVS` (sender).
    CtsBadCount { slot: usize, n: usize },
    /// Entry `entry` of a CTS slot whose control word or count differs from the slot's
    /// first word `expected_word` and count `expected_n` (sender).
    CtsInconsistent { slot: usize, entry: usize, word: u64, nreqs: u32, expected_word: u64, expected_n: usize },
    /// Control-ring message number `seq` does not decode, or says what its receiver can
    /// never be told (failover).
    BadControl { seq: u64, word0: u64 },
}

impl Violation {
    /// The rail the violation arrived on: the IMM's; `None` for a CTS entry (read from
    /// memory the receiver wrote, on either rail).
    pub fn rail(&self) -> Option<usize> {
        use Violation::*;
        match *self {
            BadMask { rail, .. }
            | MaskOmitsRail { rail, .. }
            | NoReceiveWaiting { rail, .. }
            | MaskChanged { rail, .. }
            | DuplicateImm { rail, .. }
            | SizeQChanged { rail, .. }
            | BadPieces { rail, .. }
            | PiecesChanged { rail, .. }
            | SizeForMultiRecv { rail, .. }
            | BytesMismatch { rail, .. }
            | RecordTooLarge { rail, .. } => Some(rail),
            CtsBadCount { .. } | CtsInconsistent { .. } | BadControl { .. } => None,
        }
    }
}

impl fmt::Display for Violation {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        use Violation::*;
        match self.rail() {
            Some(rail) => write!(f, "protocol violation on the {} rail: ", RAIL_NAMES[rail])?,
            None => f.write_str("protocol violation: ")?,
        }
        match *self {
            BadMask { slot, imm, mask, rails, .. } => {
                write!(f, "IMM {imm:#010x} for slot {slot} has rail mask {mask:#b}; this device's rails are {rails:#b}")
            }
            MaskOmitsRail { slot, mask, .. } => {
                write!(f, "IMM for slot {slot} arrived on a rail its mask {mask:#b} does not name")
            }
            NoReceiveWaiting { slot, .. } => write!(f, "IMM for slot {slot}, which has no receive waiting for data"),
            MaskChanged { slot, mask, earlier, .. } => {
                write!(f, "IMM for slot {slot} has mask {mask:#b}, but an earlier IMM announced {earlier:#b}")
            }
            DuplicateImm { slot, .. } => write!(f, "a second IMM for slot {slot} from the same rail"),
            SizeQChanged { slot, size_q, earlier, .. } => {
                write!(f, "IMM for slot {slot} has size_q {size_q}, an earlier IMM had {earlier}")
            }
            BadPieces { slot, pieces, most, .. } => write!(
                f,
                "IMM for slot {slot} announces {pieces} pieces of the rail's share; the sender stripes over at most {most} here"
            ),
            PiecesChanged { slot, pieces, earlier, .. } => {
                write!(
                    f,
                    "IMM for slot {slot} announces {pieces} pieces, an earlier piece of the rail announced {earlier}"
                )
            }
            SizeForMultiRecv { slot, n, .. } => write!(f, "IMM encodes a size for slot {slot}, a multi-receive of {n}"),
            BytesMismatch { slot, bytes, size_q, posted, .. } => write!(
                f,
                "slot {slot}: {bytes} bytes arrived, the IMM announced size_q {size_q} (x{}) for a {posted}-byte receive",
                SIZE_GRANULE
            ),
            RecordTooLarge { slot, index, claimed, posted, .. } => {
                write!(f, "slot {slot}: completion record {index} claims {claimed} bytes for a {posted}-byte receive")
            }
            CtsBadCount { slot, n } => {
                write!(f, "CTS slot {slot} announces {n} receives (1..{MAX_RECVS} allowed)")
            }
            CtsInconsistent { slot, entry, word, nreqs, expected_word, expected_n } => write!(
                f,
                "CTS slot {slot} entry {entry} is inconsistent (word {word:#x}, nreqs {nreqs}, expected {expected_word:#x}, {expected_n})"
            ),
            BadControl { seq, word0 } => write!(f, "control message {seq} is not one mpib writes (word 0 {word0:#x})"),
        }
    }
}

/// The work request a completion names.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum WorkRequest {
    /// The signalled WRITE_WITH_IMM that ends a data chain.
    WriteWithImm,
    /// An unsignalled data WRITE.
    DataWrite,
    /// A CTS WRITE (receiver).
    CtsWrite,
    /// A probe or keepalive WRITE.
    ProbeWrite,
    /// A flush READ (receiver).
    FlushRead,
    /// A control-ring WRITE (failover).
    ControlWrite,
    /// A receive WQE a WRITE_WITH_IMM consumed (receiver): which slot, it does not say.
    ImmReceive,
    /// A WR whose `wr_id` mpib never made (a flushed generic SRQ WQE).
    Unknown,
}

impl WorkRequest {
    /// The request in words, for messages.
    pub fn words(self) -> &'static str {
        match self {
            WorkRequest::WriteWithImm => "a WRITE_WITH_IMM",
            WorkRequest::DataWrite => "a data WRITE",
            WorkRequest::CtsWrite => "a CTS WRITE",
            WorkRequest::ProbeWrite => "a probe WRITE",
            WorkRequest::FlushRead => "a flush READ",
            WorkRequest::ControlWrite => "a control-ring WRITE",
            WorkRequest::ImmReceive => "an IMM receive",
            WorkRequest::Unknown => "a work request",
        }
    }
}

/// A work request failed on `rail` with `status`: the rail's failure. `slot`: the CTS slot
/// of a data or CTS WR, the flush index of a flush READ; `None` where the WR names none.
/// `qp_num`: the local QP the completion names (0: not known, as for one another caller
/// polled); `vendor_err`: the NIC's syndrome (0: none, as on the soft fabric).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct CompletionFailed {
    pub rail: usize,
    pub what: WorkRequest,
    pub slot: Option<usize>,
    pub status: WcStatus,
    pub qp_num: u32,
    pub vendor_err: u32,
}

impl fmt::Display for CompletionFailed {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{} rail: ", RAIL_NAMES[self.rail])?;
        let slot = Slot(self.slot);
        match self.what {
            WorkRequest::WriteWithImm => write!(f, "the WRITE_WITH_IMM of slot {slot}"),
            WorkRequest::DataWrite => write!(f, "a data WRITE of slot {slot}"),
            WorkRequest::CtsWrite => write!(f, "the CTS WRITE of slot {slot}"),
            WorkRequest::ProbeWrite => f.write_str("a probe WRITE"),
            WorkRequest::FlushRead => write!(f, "the READ of flush {slot}"),
            WorkRequest::ControlWrite => f.write_str("a control-ring WRITE"),
            WorkRequest::ImmReceive => f.write_str("receiving an IMM"),
            WorkRequest::Unknown => f.write_str("a work request"),
        }?;
        write!(f, " failed: {} ({}", self.status, self.status.name())?;
        if self.vendor_err != 0 {
            write!(f, ", vendor_err {:#x}", self.vendor_err)?;
        }
        if self.qp_num != 0 {
            write!(f, ", QP {}", self.qp_num)?;
        }
        f.write_str(")")
    }
}

/// A slot number, `?` when unknown.
struct Slot(Option<usize>);

impl fmt::Display for Slot {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self.0 {
            Some(s) => s.fmt(f),
            None => f.write_str("?"),
        }
    }
}

/// Which engine a completion reached.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Side {
    Send,
    Receive,
}

/// A successful completion the engine cannot account for.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum StrayCompletion {
    /// Its `wr_id` names no WR mpib makes.
    UnknownWrId { rail: usize, wr_id: u64 },
    /// The signalled data WR of a slot that has none outstanding on the rail (sender).
    NoneOutstanding { rail: usize, slot: usize },
    /// A probe's, with no probe in flight on the rail (sender).
    NoProbeInFlight { rail: usize },
    /// A WR of a kind this side never posts (or, a keepalive, not in flight).
    Unexpected { rail: usize, what: WorkRequest, side: Side },
    /// A CTS WRITE's, for a slot whose CTS completion is not awaited (receiver).
    CtsNotAwaited { slot: usize },
    /// A flush READ's, for a flush not in flight on the rail (receiver).
    FlushNotInFlight { rail: usize, flush: usize },
}

impl fmt::Display for StrayCompletion {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        use StrayCompletion::*;
        let name = |rail: usize| RAIL_NAMES[rail];
        match *self {
            UnknownWrId { rail, wr_id } => {
                write!(f, "{} rail: completion with an unknown wr_id {wr_id:#x}", name(rail))
            }
            NoneOutstanding { rail, slot } => {
                write!(f, "{} rail: completion for slot {slot}, which has none outstanding", name(rail))
            }
            NoProbeInFlight { rail } => write!(f, "{} rail: probe completion, but no probe is in flight", name(rail)),
            Unexpected { rail, what, side } => {
                let side = if side == Side::Send { "send" } else { "receive" };
                write!(f, "{} rail: unexpected completion of {} on a {side} connection", name(rail), what.words())
            }
            CtsNotAwaited { slot } => write!(f, "CTS completion for slot {slot}, which awaits none"),
            FlushNotInFlight { rail, flush } => write!(
                f,
                "{} rail: flush completion for flush {flush}, which is not in flight on this rail",
                name(rail)
            ),
        }
    }
}

/// A call the engine refuses without breaking the connection: NCCL's misuse.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Refused {
    /// An `isend` beyond the `max` send requests in flight.
    TooManySends { max: usize },
    /// A `test` of a send request that does not exist.
    NoSuchSend { id: u16 },
    /// A `test` of a send request not in flight (tested after done?).
    SendNotInFlight { id: u16 },
    /// An `irecv` of `n` receives, outside `1..=MAX_RECVS`.
    RecvCount { n: usize },
    /// An `irecv` beyond the `max` receives in flight.
    TooManyRecvs { max: usize },
    /// An `irecv` buffer larger than a CTS entry carries (32 bits; NCCL's sizes are int).
    RecvTooLarge { size: u64 },
    /// An `iflush` beyond the `max` flushes in flight.
    TooManyFlushes { max: usize },
    /// A `test` of a flush request not in flight.
    FlushNotInFlight { id: u16 },
    /// A `test` of a receive request that does not exist.
    NoSuchRecv { id: u16 },
    /// A `test` of a receive request not in flight (tested after done?).
    RecvNotInFlight { id: u16 },
    /// An `isend` of more bytes than the receive posted for it: the user's collectives do
    /// not match (net_ib's "collective mismatch"); the receive stays for the right send.
    LargerThanReceive { size: u64, posted: u64, tag: u32, slot: usize },
}

impl Refused {
    /// Its `ncclResult_t` class: a bad argument, or NCCL's misuse.
    pub fn kind(&self) -> ErrorKind {
        match self {
            Refused::RecvCount { .. } | Refused::RecvTooLarge { .. } => ErrorKind::InvalidArgument,
            Refused::LargerThanReceive { .. } => ErrorKind::InvalidUsage,
            _ => ErrorKind::Internal,
        }
    }
}

impl fmt::Display for Refused {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        use Refused::*;
        match *self {
            TooManySends { max } => {
                write!(f, "too many send requests in flight (at most {max}): NCCL must test and complete earlier ones")
            }
            NoSuchSend { id } => write!(f, "send request {id} does not exist"),
            SendNotInFlight { id } => write!(f, "send request {id} is not in flight (tested after done?)"),
            RecvCount { n } => write!(f, "{n} receives in one irecv (1..{MAX_RECVS} allowed)"),
            TooManyRecvs { max } => {
                write!(f, "too many receives in flight (at most {max}): NCCL must test and complete earlier ones")
            }
            RecvTooLarge { size } => write!(f, "a receive buffer of {size} bytes (at most {} per buffer)", u32::MAX),
            TooManyFlushes { max } => write!(f, "too many flushes in flight (at most {max})"),
            FlushNotInFlight { id } => write!(f, "flush request {id} is not in flight"),
            NoSuchRecv { id } => write!(f, "receive request {id} does not exist"),
            RecvNotInFlight { id } => write!(f, "receive request {id} is not in flight (tested after done?)"),
            LargerThanReceive { size, posted, tag, slot } => write!(
                f,
                "collective mismatch: isend of {size} bytes (tag {tag}) to a receive of {posted} bytes (slot {slot}); \
                 the send is refused, the receive waits for a send that fits"
            ),
        }
    }
}

impl From<Violation> for Error {
    fn from(v: Violation) -> Error {
        Error::from_cause(ErrorKind::Remote, Cause::Violation(v))
    }
}

impl From<CompletionFailed> for Error {
    fn from(c: CompletionFailed) -> Error {
        Error::from_cause(ErrorKind::Remote, Cause::CompletionFailed(c))
    }
}

impl From<StrayCompletion> for Error {
    fn from(s: StrayCompletion) -> Error {
        Error::from_cause(ErrorKind::Internal, Cause::StrayCompletion(s))
    }
}

impl From<Refused> for Error {
    fn from(r: Refused) -> Error {
        Error::from_cause(r.kind(), Cause::Refused(r))
    }
}
