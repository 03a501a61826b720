//! Ranks leave independently (the normal end of every NCCL job): a request that completed
//! stays completed whatever its connection does next, a failure is reported for the
//! requests it left incomplete and for later calls that need the peer, and what the
//! transport delivered before a failure still counts when it is polled after it. With
//! failover on and off.

use super::faults::enable_failover;
use super::harness::*;
use crate::engine::{SOUT, SUP, WrKind};
use crate::error::{Cause, Error, ErrorKind};
use crate::fabric::WcStatus;

fn pair(failover: bool) -> Pair {
    let mut p = Pair::new(Opts::default());
    if failover {
        enable_failover(&mut p, 0);
    }
    p
}

/// One 4096-byte send and its receive, posted; the CTS delivered.
fn posted(p: &mut Pair) -> (u16, u16) {
    let (rid, _) = p.irecv_one(4096);
    p.deliver_all();
    p.poll_recv().unwrap();
    let sa = p.send_buf(&pattern(7, 4096));
    let sid = p.isend(sbuf(sa, 4096, 0)).unwrap().expect("CTS delivered");
    (rid, sid)
}

/// The peer went away: a probe (or keepalive) WRITE fails on each rail, as it does once the
/// peer's QPs are gone. The last failure breaks the connection.
fn rails_fail(p: &mut Pair, send_side: bool) -> Error {
    let mut last = Ok(());
    for rail in [SOUT, SUP] {
        let c = wr_cqe(WrKind::Probe.id(rail, 0), WcStatus::RetryExceeded);
        let r = if send_side { p.inject_send(rail, c) } else { p.inject_recv(rail, c) };
        if r.is_err() {
            last = r;
        }
    }
    last.expect_err("the connection fails when its last rail does")
}

fn failed_earlier(e: &Error) -> Error {
    Error::from_cause(e.kind, Cause::FailedEarlier(e.root().clone()))
}

#[test]
fn a_send_completed_before_both_rails_fail_is_reported_complete() {
    for failover in [false, true] {
        let mut p = pair(failover);
        let (rid, sid) = posted(&mut p);
        p.deliver_all();
        p.poll_send().unwrap();
        p.poll_recv().unwrap();
        // The receiver takes its data and leaves; the sender tests only now.
        assert_eq!(p.test_recv(rid).unwrap().map(|d| d.sizes[0]), Some(4096));
        let e = rails_fail(&mut p, true);
        assert_eq!(p.test_send(sid).unwrap(), Some(4096), "failover {failover}: a done send stays done");
        // What needs the peer reports the failure.
        let sa = p.send_buf(&[1; 8]);
        assert_eq!(p.isend(sbuf(sa, 8, 1)).unwrap_err(), failed_earlier(&e));
        assert_eq!(e.kind, ErrorKind::Remote);
    }
}

#[test]
fn a_send_still_outstanding_when_both_rails_fail_reports_the_failure() {
    for failover in [false, true] {
        let mut p = pair(failover);
        let (_, sid) = posted(&mut p);
        // Nothing delivered: the data never reached the receiver.
        let e = rails_fail(&mut p, true);
        assert_eq!(p.test_send(sid).unwrap_err(), failed_earlier(&e), "failover {failover}");
        assert!(p.s.is_live(sid), "an errored send is not handed back as done");
    }
}

#[test]
fn a_data_completion_polled_after_the_failure_still_completes_its_send() {
    for failover in [false, true] {
        let mut p = pair(failover);
        let (_, sid) = posted(&mut p);
        p.deliver_all();
        // The acknowledgements are in the CQ, but the failures are polled first (another
        // thread polled them into this connection's inbox in that order, say).
        let acks: Vec<_> =
            (0..2).flat_map(|r| std::mem::take(&mut p.cq_s[r]).into_iter().map(move |c| (r, c))).collect();
        assert!(!acks.is_empty());
        rails_fail(&mut p, true);
        for (rail, c) in acks {
            p.inject_send(rail, c).expect("a completion after the failure is taken without an error");
        }
        assert_eq!(p.test_send(sid).unwrap(), Some(4096), "failover {failover}");
    }
}

#[test]
fn a_receive_completed_before_the_sender_left_is_reported_complete() {
    for failover in [false, true] {
        let mut p = pair(failover);
        let (rid, _) = posted(&mut p);
        // A second receive, posted and waiting when the sender goes.
        let (rid2, _) = p.irecv_one(64);
        p.deliver_all();
        p.poll_recv().unwrap();
        let e = rails_fail(&mut p, false);
        assert_eq!(p.test_recv(rid).unwrap().map(|d| d.sizes[0]), Some(4096), "failover {failover}");
        assert_eq!(p.test_recv(rid2).unwrap_err(), failed_earlier(&e), "the waiting receive reports it");
        let ra = p.recv_buf(64);
        assert_eq!(p.r.irecv(&[rbuf(ra, 64, 0)], &mut p.rs, &mut p.posts).unwrap_err(), failed_earlier(&e));
    }
}

#[test]
fn an_imm_polled_after_a_transport_failure_completes_its_receive() {
    for failover in [false, true] {
        let mut p = pair(failover);
        let (rid, _) = posted(&mut p);
        p.deliver_all();
        let imms: Vec<_> =
            (0..2).flat_map(|r| std::mem::take(&mut p.cq_r[r]).into_iter().map(move |c| (r, c))).collect();
        rails_fail(&mut p, false);
        for (rail, c) in imms {
            p.inject_recv(rail, c).expect("taken without an error");
        }
        assert_eq!(p.test_recv(rid).unwrap().map(|d| d.sizes[0]), Some(4096), "failover {failover}");
    }
}
