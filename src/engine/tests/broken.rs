//! Assertions shared by the suites: exactly the error a call must give (its typed cause and
//! its class), and a connection that stays broken after its first failure.

use super::harness::*;
use crate::engine::imm::Imm;
use crate::engine::{FlushBuf, SOUT, WrKind};
use crate::error::{Cause, Error};
use crate::fabric::WcStatus;

/// The error of `r`, which must be `want` (a typed engine error) with its class.
#[track_caller]
pub fn rejected<T: std::fmt::Debug>(r: crate::Result<T>, want: impl Into<Error>) -> Error {
    let e = r.expect_err("must be rejected");
    assert_eq!(e, want.into(), "{e}");
    e
}

/// What every call of a connection that failed with `first` reports.
fn failed_earlier(first: &Error) -> Error {
    Error::from_cause(first.kind, Cause::FailedEarlier(first.clone()))
}

/// Every later call on the receiver answers with the first cause and posts nothing.
#[track_caller]
pub fn assert_recv_broken(p: &mut Pair, first: &Error) {
    let want = failed_earlier(first);
    let ra = p.recv_buf(64);
    let errs = [
        p.r.irecv(&[rbuf(ra, 64, 0)], &mut p.rs, &mut p.posts).unwrap_err(),
        p.r.test(0).unwrap_err(),
        p.r.iflush(FlushBuf { addr: ra, rkeys: [61, 62] }, &mut p.posts).unwrap_err(),
        // A well-formed IMM for the posted slot is no longer interpreted.
        p.inject_recv(SOUT, imm_cqe(Imm { slot: 0, mask: RailMask::SOUT, size_q: 1 }, 64)).unwrap_err(),
    ];
    for e in errs {
        assert_eq!(e, want);
        assert_eq!(e.root(), first, "the first failure, typed, behind every later error");
    }
    assert_eq!(p.posts.n, 0, "a broken connection posts nothing");
    assert_eq!(p.r.error(), Some(first));
}

/// Every later call on the sender answers with the first cause and posts nothing.
#[track_caller]
pub fn assert_send_broken(p: &mut Pair, first: &Error) {
    let want = failed_earlier(first);
    let sa = p.send_buf(&[1; 64]);
    let errs = [
        p.s.isend(p.now, sbuf(sa, 64, 0), &mut p.ss, &mut p.posts).unwrap_err(),
        p.s.test(0).unwrap_err(),
        p.inject_send(SOUT, wr_cqe(WrKind::DataSignal.id(SOUT, 0), WcStatus::Success)).unwrap_err(),
    ];
    for e in errs {
        assert_eq!(e, want);
        assert_eq!(e.root(), first, "the first failure, typed, behind every later error");
    }
    p.now += 1 << 40;
    p.s.poll_probes(p.now, CallerWaits::No, &mut p.posts);
    assert_eq!(p.posts.n, 0, "a broken connection posts nothing, probes included");
    assert_eq!(p.s.error(), Some(first));
}
