//! `QueuePair::to_error` (rail failover's fence) and `inject_fault(LinkLoss)` (the fault drill):
//! after either, nothing more lands at the QP's responder, the peer's WRs fail, and the
//! QP's own outstanding WRs complete in error.

use super::*;

/// `b` fenced: `a`'s later WRITE_WITH_IMM fails and neither its bytes nor its IMM land.
fn fenced_responder_accepts_nothing(mode: Mode) {
    let (mut a, mut b) = pair(mode, 4096, Access::REMOTE_WRITE | Access::LOCAL_WRITE);
    b.srq.post_recv(4).unwrap();
    fill(a.region(), 3);
    b.qp.to_error().unwrap();
    b.qp.to_error().unwrap(); // idempotent
    let mut wr = write(5, a.sge(0, 256), b.addr(), b.key(), true);
    wr.opcode = WrOpcode::WriteImm;
    wr.imm = 9;
    a.qp.post_send(&[wr]).unwrap();
    let c = poll_n(&mut a.cq, &mut b.cq, 1);
    assert_eq!(c.len(), 1, "the WR completes (in error), it does not hang");
    assert_ne!(c[0].status, WcStatus::Success, "{c:?}");
    // Give a stray frame time to land if it could.
    let late = poll_for(&mut b.cq, &mut a.cq, 1, Duration::from_millis(100));
    assert!(late.iter().all(|c| c.status != WcStatus::Success), "no IMM after the fence: {late:?}");
    assert!(b.region()[..256].iter().all(|x| *x == 0xAA), "no byte after the fence");
    assert!(b.qp.is_ready().is_err(), "the fenced QP reports its error state");
}

#[test]
fn inproc_a_fenced_responder_accepts_nothing() {
    fenced_responder_accepts_nothing(Mode::Inproc);
}

#[test]
fn tcp_a_fenced_responder_accepts_nothing() {
    fenced_responder_accepts_nothing(Mode::Tcp);
}

/// The drill: `a` loses its link with work outstanding; its oldest WR fails with
/// `RetryExceeded` or flushes, and `b`'s QP goes to the error state too.
fn link_loss_fails_both_ends(mode: Mode) {
    let (mut a, mut b) = pair(mode, 1 << 20, Access::REMOTE_WRITE | Access::LOCAL_WRITE);
    assert!(a.qp.inject_fault(FaultKind::LinkLoss).unwrap());
    let wr = write(1, a.sge(0, 1 << 20), b.addr(), b.key(), true);
    a.qp.post_send(&[wr]).unwrap();
    let c = poll_n(&mut a.cq, &mut b.cq, 1);
    assert_eq!(c.len(), 1);
    assert_ne!(c[0].status, WcStatus::Success);
    let t = Instant::now();
    while b.qp.is_ready().is_ok() {
        assert!(t.elapsed() < Duration::from_secs(5), "the peer QP never heard of the loss");
        b.cq.poll(&mut []).unwrap();
        std::thread::yield_now();
    }
}

#[test]
fn inproc_link_loss_fails_both_ends() {
    link_loss_fails_both_ends(Mode::Inproc);
}

#[test]
fn tcp_link_loss_fails_both_ends() {
    link_loss_fails_both_ends(Mode::Tcp);
}
