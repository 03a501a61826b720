//! Failed completions of every kind of WR the engines post (data, signalling, CTS, probe,
//! flush) and a flushed IMM receive: the engine reports the rail, the WR and the status as
//! a Remote error, marks the rail failed in its telemetry (sender), breaks the connection,
//! and never completes a request whose data did not all land. Also the flush path itself.

use super::broken::*;
use super::harness::*;
use crate::engine::imm::Imm;
use crate::engine::{CompletionFailed, FlushBuf, QpRef, Refused, SOUT, SUP, WorkRequest, WrKind};
use crate::error::{Cause, Error};
use crate::fabric::{WcOpcode, WcStatus, WrOpcode};
use crate::split::{AnySplit, Fixed};

fn opts(percent: u8) -> Opts {
    Opts { split: AnySplit::Fixed(Fixed::percent(percent)), ..Opts::default() }
}

/// Posts one receive of `sizes` (tags 0..n) and the matching sends; delivers the CTS only.
/// Returns (receive id, send ids).
fn posted_transfer(p: &mut Pair, sizes: &[usize]) -> (u16, Vec<u16>) {
    let bufs: Vec<_> = sizes.iter().enumerate().map(|(i, &s)| rbuf(p.recv_buf(s), s as u64, i as u32)).collect();
    let rid = p.irecv(&bufs).unwrap();
    p.deliver_all();
    let sids = sizes
        .iter()
        .enumerate()
        .map(|(i, &s)| {
            let sa = p.send_buf(&pattern(i as u64, s));
            p.isend(sbuf(sa, s as u64, i as u32)).unwrap().expect("CTS delivered")
        })
        .collect();
    (rid, sids)
}

/// The completion of the WR `what` of `slot` failed on `rail` with `status` (on the QP the
/// harness numbers 0: SOUT's first).
fn failed_wr(rail: usize, what: WorkRequest, slot: Option<usize>, status: WcStatus) -> CompletionFailed {
    CompletionFailed { rail, what, slot, status, qp_num: 0, vendor_err: 0 }
}

#[test]
fn failed_data_write_breaks_the_sender_and_fails_its_rail() {
    let mut p = Pair::new(opts(50));
    let (rid, sids) = posted_transfer(&mut p, &[4096, 4096]);
    // SOUT's chain: two data WRITEs and the signalling WR. The first WRITE fails.
    let wr = p.fail_head(Dir::ToRecv, SOUT, 0, WcStatus::RemoteAccessError);
    assert_eq!((wr.opcode, wr.signaled), (WrOpcode::Write, false));
    p.deliver_all(); // SUP's chain goes through
    let e = rejected(p.poll_send(), failed_wr(SOUT, WorkRequest::DataWrite, Some(0), WcStatus::RemoteAccessError));
    assert_eq!(p.s.failed_rails(), RailMask::SOUT, "only the rail that failed is marked");
    assert_send_broken(&mut p, &e);
    assert!(sids.iter().all(|&id| p.s.is_live(id)), "no send completes");
    // The receiver got SUP's IMM only: the receive waits, it never completes half-written.
    p.poll_recv().unwrap();
    assert_eq!(p.r.test(rid).unwrap(), None);
}

#[test]
fn failed_signalling_write_breaks_the_sender_and_fails_its_rail() {
    // Multi-receive at 100 %: SOUT carries two data WRITEs, then the signalling WR.
    let mut p = Pair::new(opts(100));
    let (rid, _) = posted_transfer(&mut p, &[4096, 100]);
    assert!(p.step(Dir::ToRecv, SOUT, 0) && p.step(Dir::ToRecv, SOUT, 0));
    let wr = p.fail_head(Dir::ToRecv, SOUT, 0, WcStatus::RetryExceeded);
    assert_eq!((wr.opcode, wr.num_sge), (WrOpcode::WriteImm, 1), "the leader's signalling WR");
    let e = rejected(p.poll_send(), failed_wr(SOUT, WorkRequest::WriteWithImm, Some(0), WcStatus::RetryExceeded));
    assert_eq!(p.s.failed_rails(), RailMask::SOUT);
    assert_send_broken(&mut p, &e);
    // The data landed but no IMM came: the receive is not complete.
    p.poll_recv().unwrap();
    assert_eq!(p.r.test(rid).unwrap(), None);
}

#[test]
fn failed_fast_path_write_on_sup_fails_sup() {
    let mut p = Pair::new(opts(0));
    posted_transfer(&mut p, &[8192]);
    let wr = p.fail_head(Dir::ToRecv, SUP, 0, WcStatus::RemoteOpError);
    assert_eq!((wr.opcode, wr.bytes()), (WrOpcode::WriteImm, 8192));
    let e = rejected(
        p.poll_send(),
        CompletionFailed { qp_num: 100, ..failed_wr(SUP, WorkRequest::WriteWithImm, Some(0), WcStatus::RemoteOpError) },
    );
    assert_eq!(p.s.failed_rails(), RailMask::SUP);
    assert_send_broken(&mut p, &e);
}

#[test]
fn failed_cts_write_breaks_the_receiver() {
    // Before any data the CTS alternate rails by slot: slot 30's is SOUT's 16th, signalled
    // (CTS_SIGNAL_EVERY); slot 0's is not, yet RC reports its failure all the same.
    for slot in [0u16, 30] {
        let mut p = Pair::new(Opts::default());
        for s in 0..slot {
            p.irecv_one(64);
            assert!(p.step(Dir::ToSend, s as usize % 2, 0));
        }
        assert_eq!(p.irecv_one(64).0, slot);
        let wr = p.fail_head(Dir::ToSend, SOUT, 0, WcStatus::RemoteAccessError);
        assert_eq!(wr.signaled, slot == 30);
        let want = failed_wr(SOUT, WorkRequest::CtsWrite, Some(slot as usize), WcStatus::RemoteAccessError);
        let e = rejected(p.poll_recv(), want);
        assert_recv_broken(&mut p, &e);
    }
}

#[test]
fn failed_probe_breaks_the_sender_and_fails_its_rail() {
    let mut p = Pair::new(Opts { probe_ns: 10_000, ..Opts::default() });
    p.now = 50_000;
    p.probes();
    assert_eq!(p.wires_len(), 2, "one probe per idle rail");
    let wr = p.fail_head(Dir::ToRecv, SUP, 0, WcStatus::RetryExceeded);
    assert_eq!(WrKind::decode(wr.wr_id).map(|k| k.0), Some(WrKind::Probe));
    p.deliver_all();
    // SOUT's probe completes fine; SUP's fails.
    let e = rejected(
        p.poll_send(),
        CompletionFailed { qp_num: 100, ..failed_wr(SUP, WorkRequest::ProbeWrite, None, WcStatus::RetryExceeded) },
    );
    assert_eq!(p.s.failed_rails(), RailMask::SUP);
    assert_send_broken(&mut p, &e);
}

#[test]
fn flushed_imm_receive_breaks_the_receiver() {
    let mut p = Pair::new(Opts::default());
    let (rid, _) = p.irecv_one(64);
    let c = crate::fabric::Completion {
        status: WcStatus::Flushed,
        opcode: WcOpcode::RecvRdmaWithImm,
        ..crate::fabric::Completion::default()
    };
    let e = rejected(p.inject_recv(SUP, c), failed_wr(SUP, WorkRequest::ImmReceive, None, WcStatus::Flushed));
    assert_recv_broken(&mut p, &e);
    assert!(p.r.is_live(rid));
}

#[test]
fn failed_receive_with_an_undefined_opcode_breaks_the_receiver() {
    // verbs leaves opcode undefined in an error completion: the generic SRQ WQE's wr_id
    // (0) and the status are all there is, and the status is the cause.
    let mut p = Pair::new(Opts::default());
    p.irecv_one(64);
    let e = rejected(
        p.inject_recv(SOUT, wr_cqe(0, WcStatus::Flushed)),
        failed_wr(SOUT, WorkRequest::Unknown, None, WcStatus::Flushed),
    );
    assert_recv_broken(&mut p, &e);
}

/// The receiver's flush posts, taken from `p.posts` (the harness has no flush QP).
fn flush_posts(p: &mut Pair) -> Vec<(usize, crate::fabric::SendWr)> {
    let v = p.posts.chains().iter().map(|c| (c.rail as usize, c.qp, c.wrs().to_vec())).collect::<Vec<_>>();
    p.posts.clear();
    v.into_iter()
        .map(|(rail, qp, wrs)| {
            assert_eq!((qp, wrs.len()), (QpRef::Flush, 1));
            (rail, wrs[0])
        })
        .collect()
}

#[test]
fn flush_reads_one_byte_per_rail_and_completes_when_all_did() {
    for (rails, want) in [(RailMask::BOTH, vec![SOUT, SUP]), (RailMask::SUP, vec![SUP])] {
        let mut p = Pair::new(Opts { rails_mask: rails, ..Opts::default() });
        let buf = FlushBuf { addr: 0x5000, rkeys: [81, 82] };
        let id = p.r.iflush(buf, &mut p.posts).unwrap().unwrap();
        let posts = flush_posts(&mut p);
        assert_eq!(posts.iter().map(|x| x.0).collect::<Vec<_>>(), want);
        for &(rail, wr) in &posts {
            assert_eq!(
                (wr.opcode, wr.signaled, wr.bytes(), wr.remote_addr, wr.rkey),
                (WrOpcode::Read, true, 1, 0x5000, 81 + rail as u32)
            );
        }
        for (k, &(rail, wr)) in posts.iter().enumerate() {
            assert_eq!(p.r.test(id).unwrap(), None, "flush done before its READ on rail {rail}");
            p.inject_recv(rail, wr_cqe(wr.wr_id, WcStatus::Success)).unwrap();
            if k + 1 == posts.len() {
                assert!(p.r.test(id).unwrap().is_some());
                assert!(!p.r.is_live(id), "the flush request is free again");
            }
        }
    }
}

#[test]
fn duplicate_flush_completion_breaks_the_receiver() {
    let mut p = Pair::new(Opts::default());
    let a = p.r.iflush(FlushBuf { addr: 0x5000, rkeys: [81, 82] }, &mut p.posts).unwrap().unwrap();
    let fa = flush_posts(&mut p);
    let b = p.r.iflush(FlushBuf { addr: 0x6000, rkeys: [81, 82] }, &mut p.posts).unwrap().unwrap();
    flush_posts(&mut p);
    p.inject_recv(SOUT, wr_cqe(fa[0].1.wr_id, WcStatus::Success)).unwrap();
    // The same completion again must not count for SUP's READ, nor for another flush.
    let e = rejected(
        p.inject_recv(SOUT, wr_cqe(fa[0].1.wr_id, WcStatus::Success)),
        crate::engine::StrayCompletion::FlushNotInFlight { rail: SOUT, flush: 0 },
    );
    assert_recv_broken(&mut p, &e);
    assert!(p.r.is_live(a) && p.r.is_live(b));
}

#[test]
fn failed_flush_read_breaks_the_receiver() {
    let mut p = Pair::new(Opts::default());
    p.r.iflush(FlushBuf { addr: 0x5000, rkeys: [81, 82] }, &mut p.posts).unwrap().unwrap();
    let posts = flush_posts(&mut p);
    let e = rejected(
        p.inject_recv(SUP, wr_cqe(posts[1].1.wr_id, WcStatus::LocalError)),
        failed_wr(SUP, WorkRequest::FlushRead, Some(0), WcStatus::LocalError),
    );
    assert_recv_broken(&mut p, &e);
}

#[test]
fn too_many_flushes_are_refused() {
    let mut p = Pair::new(Opts::default());
    for _ in 0..32 {
        p.r.iflush(FlushBuf { addr: 0x5000, rkeys: [81, 82] }, &mut p.posts).unwrap().unwrap();
        p.posts.clear();
    }
    let e = p.r.iflush(FlushBuf { addr: 0x5000, rkeys: [81, 82] }, &mut p.posts);
    rejected(e, Refused::TooManyFlushes { max: 32 });
    assert_eq!(p.posts.n, 0);
    assert!(p.r.error().is_none());
}

#[test]
fn an_imm_delivered_before_a_transport_failure_still_completes_its_receive() {
    // SUP's part arrives, then the SOUT rail fails (failover off: the connection breaks),
    // then SOUT's IMM, delivered before the failure, is polled: every part of the receive
    // landed (RC), so it completes with its exact size. The connection stays broken.
    let mut p = Pair::new(opts(50));
    let (rid, _) = posted_transfer(&mut p, &[4096]);
    p.deliver_all();
    let sout = p.cq_r[SOUT].pop_front().unwrap();
    p.inject_recv(SUP, p.cq_r[SUP][0]).unwrap();
    let e = rejected(
        p.inject_recv(SOUT, wr_cqe(0, WcStatus::RetryExceeded)),
        failed_wr(SOUT, WorkRequest::Unknown, None, WcStatus::RetryExceeded),
    );
    assert_eq!(Imm::decode(sout.imm).slot, 0);
    p.inject_recv(SOUT, sout).unwrap();
    assert_eq!(p.r.test(rid).unwrap().map(|d| d.sizes[0]), Some(4096), "a receive all of whose parts landed");
    assert_recv_broken(&mut p, &e);
}

#[test]
fn an_imm_after_a_violation_is_not_interpreted() {
    // The peer broke the protocol: a later IMM, well-formed or not (as a buggy or
    // malicious peer might still send), completes nothing.
    let mut p = Pair::new(opts(50));
    let (rid, _) = posted_transfer(&mut p, &[4096]);
    p.deliver_all();
    let sout = p.cq_r[SOUT].pop_front().unwrap();
    let sup = p.cq_r[SUP].pop_front().unwrap();
    p.inject_recv(SUP, sup).unwrap();
    let e = p.inject_recv(SUP, sup).unwrap_err();
    assert!(matches!(e.cause, Cause::Violation(_)), "{e}");
    p.inject_recv(SOUT, sout).expect("dropped without a word");
    let earlier = Error::from_cause(e.kind, Cause::FailedEarlier(e.clone()));
    rejected(p.r.test(rid), earlier);
    assert_recv_broken(&mut p, &e);
}
