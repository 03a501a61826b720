//! The fault hooks (`QueuePair::inject_fault`, `hook.rs`), TCP: each fires once, on the WR
//! it names, and the responder sees exactly what a link lost at that moment would leave:
//! bytes without their IMM (drop-imm), a WR executed in full whose requester saw it fail
//! (drop-ack), requests that arrive only after its QP's error state and are dropped (hold).

use super::*;

/// A signalled WRITE_WITH_IMM of `len` bytes from `a`'s offset `off` to the same offset at `b`.
fn write_imm(wr_id: u64, a: &End, b: &End, off: usize, len: usize, imm: u32) -> SendWr {
    let mut wr = write(wr_id, a.sge(off, len), b.addr() + off as u64, b.key(), true);
    wr.opcode = WrOpcode::WriteImm;
    wr.imm = imm;
    wr
}

/// Everything `cq` holds after stepping both sides for `ms`.
fn drain(cq: &mut SoftCq, other: &mut SoftCq, ms: u64) -> Vec<Completion> {
    poll_for(cq, other, usize::MAX, Duration::from_millis(ms))
}

/// `b`'s QP reaches the error state (its peer's CLOSE), within 5 s.
fn wait_error(b: &mut End, a: &mut End) {
    let t = Instant::now();
    while b.qp.is_ready().is_ok() {
        assert!(t.elapsed() < Duration::from_secs(5), "the responder's QP never went to the error state");
        a.cq.poll(&mut []).unwrap();
        b.cq.poll(&mut []).unwrap();
        std::thread::yield_now();
    }
}

/// Steps both sides until `b`'s QP dropped `n` frames in its error state, or something of
/// `a`'s landed at `b` (a responder that accepts after its fence), or 5 s; then what `b`'s
/// CQ holds.
fn until_dropped(b: &mut End, a: &mut End, n: u64) -> Vec<Completion> {
    let t = Instant::now();
    let mut seen = Vec::new();
    while b.qp.dropped_late() < n && b.region().iter().all(|x| *x == 0xAA) && imms(&seen).is_empty() {
        if t.elapsed() > Duration::from_secs(5) {
            break;
        }
        seen.extend(drain(&mut b.cq, &mut a.cq, 1));
    }
    seen.extend(drain(&mut b.cq, &mut a.cq, 50));
    seen
}

fn imms(c: &[Completion]) -> Vec<u32> {
    c.iter().filter(|c| c.opcode == WcOpcode::RecvRdmaWithImm && c.status == WcStatus::Success).map(|c| c.imm).collect()
}

#[test]
fn tcp_drop_imm_places_the_bytes_and_loses_the_imm() {
    let (mut a, mut b) = pair(Mode::Tcp, 8192, Access::REMOTE_WRITE | Access::LOCAL_WRITE);
    b.srq.post_recv(8).unwrap();
    fill(a.region(), 5);
    // Before the hook: one IMM delivered as usual.
    a.qp.post_send(&[write_imm(1, &a, &b, 0, 512, 1)]).unwrap();
    assert_eq!(poll_n(&mut a.cq, &mut b.cq, 1)[0].status, WcStatus::Success);
    assert!(a.qp.inject_fault(FaultKind::DropImm).unwrap());
    // A plain WRITE does not match; the WRITE_WITH_IMM after it does.
    let plain = write(2, a.sge(1024, 256), b.addr() + 1024, b.key(), true);
    a.qp.post_send(&[plain, write_imm(3, &a, &b, 2048, 3000, 7)]).unwrap();
    let c = poll_n(&mut a.cq, &mut b.cq, 2);
    assert_eq!(statuses(&c), [(2, WcStatus::Success), (3, WcStatus::RetryExceeded)]);
    wait_error(&mut b, &mut a);
    let at_b = drain(&mut b.cq, &mut a.cq, 100);
    assert_eq!(imms(&at_b), [1], "the IMM after the hook is never delivered: {at_b:?}");
    assert!(at_b.iter().all(|c| c.status == WcStatus::Success), "no WQE half-consumed: {at_b:?}");
    let (src, dst) = (a.region()[2048..5048].to_vec(), &b.region()[2048..5048]);
    assert_eq!(dst, &src[..], "the bytes of the WRITE_WITH_IMM landed");
    assert_eq!(&b.region()[1024..1280], &a.region()[1024..1280]);
    assert!(a.qp.is_ready().is_err(), "the requester's QP is in the error state");
}

#[test]
fn tcp_drop_ack_executes_the_wr_and_fails_it_at_the_requester() {
    let (mut a, mut b) = pair(Mode::Tcp, 8192, Access::REMOTE_WRITE | Access::LOCAL_WRITE);
    b.srq.post_recv(8).unwrap();
    fill(a.region(), 9);
    assert!(a.qp.inject_fault(FaultKind::DropAck).unwrap());
    // A plain WRITE does not match (signalled or not); the WRITE_WITH_IMM does.
    // Unsignalled, as the plugin posts its data: the ACK is asked for all the same, and
    // the WR's failure completes it.
    let plain = write(1, a.sge(0, 256), b.addr(), b.key(), true);
    let imm = SendWr { signaled: false, ..write_imm(2, &a, &b, 1024, 4000, 42) };
    a.qp.post_send(&[plain, imm]).unwrap();
    let c = poll_n(&mut a.cq, &mut b.cq, 2);
    assert_eq!(statuses(&c), [(1, WcStatus::Success), (2, WcStatus::RetryExceeded)]);
    wait_error(&mut b, &mut a);
    let at_b = drain(&mut b.cq, &mut a.cq, 100);
    assert_eq!(imms(&at_b), [42], "the responder executed the WR in full: {at_b:?}");
    assert_eq!(&b.region()[1024..5024], &a.region()[1024..5024]);
    assert_eq!(&b.region()[..256], &a.region()[..256]);
}

#[test]
fn tcp_hold_delivers_nothing_and_the_fenced_responder_drops_it_all() {
    let (mut a, mut b) = pair(Mode::Tcp, 1 << 20, Access::REMOTE_WRITE | Access::LOCAL_WRITE);
    b.srq.post_recv(8).unwrap();
    fill(a.region(), 3);
    assert!(a.qp.inject_fault(FaultKind::HoldPastFence).unwrap());
    let big = write(1, a.sge(0, 600 << 10), b.addr(), b.key(), false);
    let mut inline = write(2, a.sge(700 << 10, 64), b.addr() + (700 << 10), b.key(), false);
    inline.inline = true;
    a.qp.post_send(&[big, inline, write_imm(3, &a, &b, 800 << 10, 1000, 77)]).unwrap();
    // Held: nothing completes, nothing lands, and the link is not taken for dead (the
    // requester does not wait on a peer it keeps silent).
    let early = poll_for(&mut a.cq, &mut b.cq, 1, Duration::from_millis(300));
    assert!(early.is_empty(), "{early:?}");
    assert!(drain(&mut b.cq, &mut a.cq, 10).is_empty());
    assert!(b.region().iter().all(|x| *x == 0xAA), "a byte landed while held");
    assert!(a.qp.is_ready().unwrap() && b.qp.is_ready().unwrap());
    // The fence: the held requests go now, after the responder's error state.
    b.qp.to_error().unwrap();
    // Every WR completes in error (unsignalled ones too, as in verbs).
    let c = poll_n(&mut a.cq, &mut b.cq, 3);
    assert_eq!(c.len(), 3, "{c:?}");
    assert!(c.iter().all(|c| c.status != WcStatus::Success), "{c:?}");
    let late = until_dropped(&mut b, &mut a, 3);
    assert!(imms(&late).is_empty(), "no IMM after the fence: {late:?}");
    assert!(b.region().iter().all(|x| *x == 0xAA), "no byte after the fence");
    assert!(b.guards_intact());
    assert_eq!(b.qp.dropped_late(), 3, "the three held requests reached the responder, dropped");
}

/// The requester fences itself first (as a sender that saw its rail stall): the CLOSE goes
/// out, then the held requests, which reach a responder already in the error state.
#[test]
fn tcp_hold_released_by_the_requesters_own_fence_is_dropped_too() {
    let (mut a, mut b) = pair(Mode::Tcp, 8192, Access::REMOTE_WRITE | Access::LOCAL_WRITE);
    b.srq.post_recv(8).unwrap();
    fill(a.region(), 1);
    assert!(a.qp.inject_fault(FaultKind::HoldPastFence).unwrap());
    a.qp.post_send(&[write_imm(1, &a, &b, 0, 4096, 5), write_imm(2, &a, &b, 4096, 16, 6)]).unwrap();
    assert!(poll_for(&mut a.cq, &mut b.cq, 1, Duration::from_millis(100)).is_empty());
    a.qp.to_error().unwrap();
    let c = poll_n(&mut a.cq, &mut b.cq, 2);
    assert!(c.iter().all(|c| c.status == WcStatus::Flushed), "{c:?}");
    let late = until_dropped(&mut b, &mut a, 2);
    assert!(imms(&late).is_empty(), "no IMM after the error state: {late:?}");
    assert!(b.region().iter().all(|x| *x == 0xAA), "no byte after the error state");
    assert_eq!(b.qp.dropped_late(), 2, "the two held requests reached the responder, dropped");
}

/// Each hook fires once: after a drop-ack on a new pair, the hook is gone (the QP is in
/// error anyway); in-process mode has no wire to lose a frame on and says so.
#[test]
fn inproc_hooks_are_refused_and_link_loss_is_not() {
    let (mut a, _b) = pair(Mode::Inproc, 4096, Access::REMOTE_WRITE);
    for k in [FaultKind::DropImm, FaultKind::DropAck, FaultKind::HoldPastFence] {
        assert!(!a.qp.inject_fault(k).unwrap(), "{k:?}");
    }
    assert!(a.qp.inject_fault(FaultKind::LinkLoss).unwrap());
}
