//! The log text of every typed engine error, pinned: its `Display` is the message the
//! engine logged before its errors were typed (operators and scripts grep for it), and its
//! class is the `ncclResult_t` NCCL gets.

use crate::engine::imm::Imm;
use crate::engine::{
    CompletionFailed, RailMask, Refused, SOUT, SUP, Side, StrayCompletion, Violation, WorkRequest, WrKind,
};
use crate::error::{Cause, Error, ErrorKind};
use crate::fabric::WcStatus;

#[track_caller]
fn says(e: impl Into<Error>, kind: ErrorKind, text: &str) {
    let e = e.into();
    assert_eq!((e.kind, e.to_string()), (kind, text.to_string()));
    assert_eq!(e.msg(), text);
}

#[test]
fn violations_say_what_the_peer_broke_on_which_rail() {
    let imm = Imm { slot: 0, mask: RailMask::NONE, size_q: 1 }.encode();
    let on = |rail: &str, what: &str| format!("protocol violation on the {rail} rail: {what}");
    for (v, text) in [
        (
            Violation::BadMask { rail: SOUT, slot: 0, imm, mask: RailMask::NONE, rails: RailMask::BOTH },
            on("SOUT", "IMM 0x00000400 for slot 0 has rail mask 0b0; this device's rails are 0b11"),
        ),
        (
            Violation::MaskOmitsRail { rail: SUP, slot: 0, mask: RailMask::SOUT },
            on("SUP", "IMM for slot 0 arrived on a rail its mask 0b1 does not name"),
        ),
        (
            Violation::NoReceiveWaiting { rail: SOUT, slot: 7 },
            on("SOUT", "IMM for slot 7, which has no receive waiting for data"),
        ),
        (
            Violation::MaskChanged { rail: SUP, slot: 0, mask: RailMask::SUP, earlier: RailMask::BOTH },
            on("SUP", "IMM for slot 0 has mask 0b10, but an earlier IMM announced 0b11"),
        ),
        (Violation::DuplicateImm { rail: SUP, slot: 0 }, on("SUP", "a second IMM for slot 0 from the same rail")),
        (
            Violation::SizeQChanged { rail: SUP, slot: 0, size_q: 3, earlier: 2 },
            on("SUP", "IMM for slot 0 has size_q 3, an earlier IMM had 2"),
        ),
        (
            Violation::SizeForMultiRecv { rail: SOUT, slot: 0, n: 2 },
            on("SOUT", "IMM encodes a size for slot 0, a multi-receive of 2"),
        ),
        (
            Violation::BytesMismatch { rail: SOUT, slot: 0, bytes: 100, size_q: 2, posted: 512 },
            on("SOUT", "slot 0: 100 bytes arrived, the IMM announced size_q 2 (x128) for a 512-byte receive"),
        ),
        (
            Violation::RecordTooLarge { rail: SOUT, slot: 0, index: 1, claimed: 5000, posted: 1000 },
            on("SOUT", "slot 0: completion record 1 claims 5000 bytes for a 1000-byte receive"),
        ),
        (
            Violation::CtsBadCount { slot: 3, n: 9 },
            "protocol violation: CTS slot 3 announces 9 receives (1..8 allowed)".to_string(),
        ),
        (
            Violation::CtsInconsistent {
                slot: 0,
                entry: 1,
                word: 0x102,
                nreqs: 3,
                expected_word: 0x102,
                expected_n: 2,
            },
            "protocol violation: CTS slot 0 entry 1 is inconsistent (word 0x102, nreqs 3, expected 0x102, 2)"
                .to_string(),
        ),
    ] {
        says(v, ErrorKind::Remote, &text);
    }
}

#[test]
fn failed_completions_say_the_rail_the_wr_and_the_status() {
    use WcStatus::*;
    use WorkRequest::*;
    for (rail, what, slot, status, text) in [
        (
            SOUT,
            DataWrite,
            Some(0),
            RemoteAccessError,
            "SOUT rail: a data WRITE of slot 0 failed: remote access error (REM_ACCESS_ERR)",
        ),
        (
            SOUT,
            WriteWithImm,
            Some(0),
            RetryExceeded,
            "SOUT rail: the WRITE_WITH_IMM of slot 0 failed: transport retry counter exceeded (RETRY_EXC_ERR)",
        ),
        (
            SOUT,
            CtsWrite,
            Some(2),
            RemoteAccessError,
            "SOUT rail: the CTS WRITE of slot 2 failed: remote access error (REM_ACCESS_ERR)",
        ),
        (
            SUP,
            ProbeWrite,
            None,
            RetryExceeded,
            "SUP rail: a probe WRITE failed: transport retry counter exceeded (RETRY_EXC_ERR)",
        ),
        (
            SUP,
            FlushRead,
            Some(0),
            LocalError,
            "SUP rail: the READ of flush 0 failed: local length/protection error (LOC_PROT_ERR)",
        ),
        (
            SUP,
            ImmReceive,
            None,
            Flushed,
            "SUP rail: receiving an IMM failed: work request flushed (QP in error state) (WR_FLUSH_ERR)",
        ),
        (
            SOUT,
            Unknown,
            None,
            Flushed,
            "SOUT rail: a work request failed: work request flushed (QP in error state) (WR_FLUSH_ERR)",
        ),
        (SUP, DataWrite, None, Other(99), "SUP rail: a data WRITE of slot ? failed: completion error 99 (OTHER)"),
    ] {
        says(CompletionFailed { rail, what, slot, status, qp_num: 0, vendor_err: 0 }, ErrorKind::Remote, text);
    }
    // The QP and the NIC's syndrome where the completion names them.
    says(
        CompletionFailed {
            rail: SUP,
            what: WriteWithImm,
            slot: Some(3),
            status: RemoteAccessError,
            qp_num: 0x1a2,
            vendor_err: 0x88,
        },
        ErrorKind::Remote,
        "SUP rail: the WRITE_WITH_IMM of slot 3 failed: remote access error (REM_ACCESS_ERR, vendor_err 0x88, QP 418)",
    );
    // From a wr_id: a probe's carries no slot; the status, QP and vendor error come from
    // the completion (a failed one's vendor error where its immediate data would be).
    let c = |status| crate::fabric::Completion { status, qp_num: 7, imm: 0x51, ..Default::default() };
    let probe = WrKind::Probe.failed(SUP, 0, &c(RetryExceeded));
    assert_eq!((probe.what, probe.slot, probe.qp_num, probe.vendor_err), (ProbeWrite, None, 7, 0x51));
    let cts = WrKind::Cts.failed(SOUT, 5, &c(Flushed));
    assert_eq!((cts.what, cts.slot, cts.status), (CtsWrite, Some(5), Flushed));
    assert_eq!(c(Success).vendor_err(), 0, "a successful completion's word is its immediate data");
}

#[test]
fn stray_completions_say_what_nothing_awaited() {
    use StrayCompletion::*;
    for (s, text) in [
        (UnknownWrId { rail: SUP, wr_id: 0xdead }, "SUP rail: completion with an unknown wr_id 0xdead"),
        (NoneOutstanding { rail: SUP, slot: 9 }, "SUP rail: completion for slot 9, which has none outstanding"),
        (NoProbeInFlight { rail: SOUT }, "SOUT rail: probe completion, but no probe is in flight"),
        (
            Unexpected { rail: SOUT, what: WorkRequest::CtsWrite, side: Side::Send },
            "SOUT rail: unexpected completion of a CTS WRITE on a send connection",
        ),
        (
            Unexpected { rail: SUP, what: WorkRequest::WriteWithImm, side: Side::Receive },
            "SUP rail: unexpected completion of a WRITE_WITH_IMM on a receive connection",
        ),
        (CtsNotAwaited { slot: 2 }, "CTS completion for slot 2, which awaits none"),
        (
            FlushNotInFlight { rail: SOUT, flush: 0 },
            "SOUT rail: flush completion for flush 0, which is not in flight on this rail",
        ),
    ] {
        says(s, ErrorKind::Internal, text);
    }
}

#[test]
fn refused_calls_say_what_nccl_did_wrong() {
    use Refused::*;
    for (r, text) in [
        (
            TooManySends { max: 2 },
            "too many send requests in flight (at most 2): NCCL must test and complete earlier ones",
        ),
        (NoSuchSend { id: 40 }, "send request 40 does not exist"),
        (SendNotInFlight { id: 3 }, "send request 3 is not in flight (tested after done?)"),
        (
            TooManyRecvs { max: 32 },
            "too many receives in flight (at most 32): NCCL must test and complete earlier ones",
        ),
        (TooManyFlushes { max: 32 }, "too many flushes in flight (at most 32)"),
        (FlushNotInFlight { id: 300 }, "flush request 300 is not in flight"),
        (NoSuchRecv { id: 999 }, "receive request 999 does not exist"),
        (RecvNotInFlight { id: 5 }, "receive request 5 is not in flight (tested after done?)"),
    ] {
        says(r, ErrorKind::Internal, text);
    }
    says(RecvCount { n: 9 }, ErrorKind::InvalidArgument, "9 receives in one irecv (1..8 allowed)");
    says(
        RecvTooLarge { size: 1 << 32 },
        ErrorKind::InvalidArgument,
        "a receive buffer of 4294967296 bytes (at most 4294967295 per buffer)",
    );
}

#[test]
fn a_broken_connection_repeats_its_first_failure() {
    let first: Error = Violation::DuplicateImm { rail: SUP, slot: 4 }.into();
    let later = Error::from_cause(first.kind, Cause::FailedEarlier(first.clone()));
    says(
        later.clone(),
        ErrorKind::Remote,
        "connection failed earlier: protocol violation on the SUP rail: a second IMM for slot 4 from the same rail",
    );
    assert_eq!(later.root(), &first);
    says(Error::from_cause(ErrorKind::Remote, Cause::BothRailsFailed), ErrorKind::Remote, "both rails have failed");
}
