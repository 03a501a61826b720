//! Assertions shared by the suites: exactly the error a call must give (its typed cause and
//! its class), and a connection that stays broken after its first failure.

use super::harness::*;
use crate::engine::imm::Imm;
use crate::engine::layout::SLOTS;
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

/// Whether the connection's failure leaves completions believable (a transport failure)
/// or not (the peer broke the protocol, a completion made no sense).
fn trusted(first: &Error) -> bool {
    !matches!(first.cause, Cause::Violation(_) | Cause::StrayCompletion(_))
}

/// Every later call on the receiver that needs the peer answers with the first cause, so
/// does the `test` of every receive left waiting (one that had completed stays completed),
/// and nothing is posted. After a violation nothing more from the peer is believed: a
/// well-formed IMM for a waiting receive is dropped without completing it.
#[track_caller]
pub fn assert_recv_broken(p: &mut Pair, first: &Error) {
    let want = failed_earlier(first);
    let ra = p.recv_buf(64);
    let errs = [
        p.r.irecv(&[rbuf(ra, 64, 0)], &mut p.rs, &mut p.posts).unwrap_err(),
        p.r.iflush(FlushBuf { addr: ra, rkeys: [61, 62] }, &mut p.posts).unwrap_err(),
    ];
    if !trusted(first) {
        p.inject_recv(SOUT, imm_cqe(Imm { slot: 0, mask: RailMask::SOUT, size_q: 1 }, 64))
            .expect("a completion after the failure is dropped, not an error");
    }
    let waiting: Vec<u16> = (0..SLOTS as u16).filter(|&id| p.r.is_live(id)).collect();
    let tests: Vec<_> = waiting.iter().map(|&id| (id, p.r.test(id))).collect();
    for e in errs.into_iter().chain(tests.into_iter().filter_map(|(id, r)| match r {
        Ok(None) => panic!("receive {id} waits on a broken connection without reporting it"),
        // It completed before the failure (a test finds it done either way).
        Ok(Some(_)) => None,
        Err(e) => Some(e),
    })) {
        assert_eq!(e, want);
        assert_eq!(e.root(), first, "the first failure, typed, behind every later error");
    }
    assert_eq!(p.posts.n, 0, "a broken connection posts nothing");
    assert_eq!(p.r.error(), Some(first));
}

/// Every later call on the sender that needs the peer answers with the first cause, so does
/// the `test` of every send left incomplete, and nothing is posted, probes included.
#[track_caller]
pub fn assert_send_broken(p: &mut Pair, first: &Error) {
    let want = failed_earlier(first);
    let sa = p.send_buf(&[1; 64]);
    let mut errs = vec![p.s.isend(p.now, sbuf(sa, 64, 0), &mut p.ss, &mut p.posts).unwrap_err()];
    if !trusted(first) {
        p.inject_send(SOUT, wr_cqe(WrKind::DataSignal.id(SOUT, 0), WcStatus::Success))
            .expect("a completion after the failure is dropped, not an error");
    }
    let live: Vec<u16> = (0..512u16).filter(|&id| p.s.is_live(id)).collect();
    for id in live {
        match p.s.test(id) {
            Ok(None) => panic!("send {id} waits on a broken connection without reporting it"),
            Ok(Some(_)) => {} // completed before the failure
            Err(e) => errs.push(e),
        }
    }
    for e in errs {
        assert_eq!(e, want);
        assert_eq!(e.root(), first, "the first failure, typed, behind every later error");
    }
    p.now += 1 << 40;
    let mut out = crate::engine::Output::default();
    p.s.handle_timeout(p.now, &mut p.ss, &mut out).unwrap();
    assert!(out.chains.is_empty() && out.actions.is_empty(), "a broken connection posts nothing, probes included");
    assert_eq!(p.s.poll_timeout(), u64::MAX, "and schedules nothing");
    assert_eq!(p.s.error(), Some(first));
}
