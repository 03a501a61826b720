//! In-process mode's direct path (`direct.rs`): what it changes against the stream path
//! (WRs execute at post time, CQ-full and not-yet-connected waits, a failed or dropped end
//! seen by its peer, overlapping loopback copies) and the semantics it must keep.

use super::*;

/// An end on `dev` with a CQ of `cq_depth` entries, an SRQ only when `srq` is set.
fn end_with(dev: &Arc<SoftDevice>, len: usize, access: Access, cq_depth: u32, srq: bool) -> End {
    let cq = dev.create_cq(cq_depth, Timestamps::Off).unwrap();
    let s = dev.create_srq(1024).unwrap();
    let caps = QpCaps { max_send_wr: 256, max_inline: 256 };
    let qp = dev.create_qp(&cq, srq.then_some(&s), caps).unwrap();
    let mut buf = vec![0xAAu8; len + 2 * GUARD];
    let mr = dev.reg_mr(buf[GUARD..].as_mut_ptr(), len, access).unwrap();
    End { dev: dev.clone(), cq, srq: s, qp, buf, mr: Some(mr) }
}

fn inproc_devices() -> (Arc<SoftDevice>, Arc<SoftDevice>) {
    devices(Mode::Inproc)
}

const ALL: Access = Access::LOCAL_WRITE.union(Access::REMOTE_WRITE).union(Access::REMOTE_READ);

/// Two connected in-process ends of 4 KiB: requester `a` (every right, CQ of 64, an SRQ)
/// and responder `b` as given.
fn connected(a_access: Access, b_access: Access, b_cq_depth: u32, b_srq: bool) -> (End, End) {
    let p = inproc_devices();
    let mut a = end_with(&p.0, 4096, a_access, 64, true);
    let mut b = end_with(&p.1, 4096, b_access, b_cq_depth, b_srq);
    connect(&mut a, &mut b);
    (a, b)
}

#[test]
fn a_write_is_placed_before_post_send_returns() {
    let (mut a, mut b) = pair(Mode::Inproc, 4096, Access::REMOTE_WRITE);
    fill(a.region(), 5);
    a.qp.post_send(&[write(1, a.sge(0, 100), b.addr() + 8, b.key(), false)]).unwrap();
    let src = a.region()[..100].to_vec();
    assert_eq!(&b.region()[8..108], &src[..], "placed without any poll");
    assert!(b.guards_intact());
    let mut wc = [Completion::default(); 4];
    assert_eq!(a.cq.poll(&mut wc).unwrap(), 0, "an unsignalled WR has no completion");
}

#[test]
fn write_imm_waits_for_room_in_the_responders_cq_and_keeps_order() {
    let (mut a, mut b) = connected(ALL, Access::REMOTE_WRITE, 2, true);
    b.srq.post_recv(8).unwrap();
    fill(a.region(), 3);
    let imm = |i: u64| {
        let mut w = write(i, a.sge(i as usize * 64, 64), b.addr() + i * 64, b.key(), true);
        w.opcode = WrOpcode::WriteImm;
        w.imm = 100 + i as u32;
        w
    };
    let after = write(3, a.sge(3 * 64, 64), b.addr() + 3 * 64, b.key(), true);
    a.qp.post_send(&[imm(0), imm(1), imm(2), after]).unwrap();
    let c = poll_for(&mut a.cq, &mut SoftCq::new(1, false), 4, Duration::from_millis(50));
    assert_eq!(statuses(&c), [(0, WcStatus::Success), (1, WcStatus::Success)], "the third waits for CQ room");
    assert!(b.region()[128..256].iter().all(|x| *x == 0xAA), "nothing placed for the waiting WR or behind it");
    assert_eq!(b.srq.posted(), 6, "a WR waiting for CQ room holds no WQE");
    // Draining B's CQ lets A's WR go on (B's polls step A: no call on A needed).
    let r = poll_n(&mut b.cq, &mut SoftCq::new(1, false), 3);
    assert_eq!(r.iter().map(|c| c.imm).collect::<Vec<_>>(), [100, 101, 102]);
    let src = a.region()[..256].to_vec();
    assert_eq!(&b.region()[..256], &src[..]);
    let c = poll_n(&mut a.cq, &mut SoftCq::new(1, false), 2);
    assert_eq!(statuses(&c), [(2, WcStatus::Success), (3, WcStatus::Success)]);
    assert_eq!(b.srq.rnr_events(), 0);
}

#[test]
fn write_imm_to_a_qp_without_srq_is_refused_and_the_peer_fails_too() {
    let (mut a, mut b) = connected(ALL, ALL, 64, false);
    let before = b.buf.clone();
    let mut wr = write(1, a.sge(0, 64), b.addr(), b.key(), true);
    wr.opcode = WrOpcode::WriteImm;
    a.qp.post_send(&[wr, write(2, a.sge(0, 8), b.addr(), b.key(), true)]).unwrap();
    let c = poll_n(&mut a.cq, &mut b.cq, 2);
    assert_eq!(statuses(&c), [(1, WcStatus::RemoteOpError), (2, WcStatus::Flushed)]);
    assert!(b.buf == before, "not one byte written");
    assert!(a.qp.is_ready().is_err(), "the requester is in the error state");
    // As over TCP, where the failed requester closes the stream: the responder saw the
    // peer go at its first poll, and fails what it posts later.
    assert!(b.qp.is_ready().is_err());
    b.qp.post_send(&[write(7, b.sge(0, 8), a.addr(), a.key(), true)]).unwrap();
    assert_eq!(statuses(&poll_n(&mut b.cq, &mut a.cq, 1)), [(7, WcStatus::Flushed)]);
}

#[test]
fn a_request_waiting_when_the_peer_fails_is_retry_exceeded() {
    let (mut a, mut b) = connected(ALL, ALL, 64, true);
    // B's WRITE_WITH_IMM waits for A's empty SRQ; A then fails on a refused WRITE.
    let mut waiting = write(5, b.sge(0, 8), a.addr(), a.key(), true);
    waiting.opcode = WrOpcode::WriteImm;
    b.qp.post_send(&[waiting, write(6, b.sge(0, 8), a.addr(), a.key(), true)]).unwrap();
    let mut bad = write(1, a.sge(0, 8), b.addr(), b.key() ^ 0x40, true);
    bad.wr_id = 1;
    a.qp.post_send(&[bad]).unwrap();
    assert_eq!(statuses(&poll_n(&mut a.cq, &mut SoftCq::new(1, false), 1)), [(1, WcStatus::RemoteAccessError)]);
    let c = poll_n(&mut b.cq, &mut SoftCq::new(1, false), 2);
    assert_eq!(statuses(&c), [(5, WcStatus::RetryExceeded), (6, WcStatus::Flushed)]);
    assert_eq!(a.srq.rnr_events(), 1);
}

#[test]
fn local_memory_errors_fail_the_wr_before_anything_moves() {
    // (a's access, WR made bad) → LocalError, nothing written at b.
    type Bad = fn(&End, &End) -> SendWr;
    let cases: [(Access, Bad); 3] = [
        (ALL, |a, b| {
            let mut w = write(1, a.sge(0, 64), b.addr(), b.key(), false);
            w.sge[0].lkey ^= 0x40;
            w
        }),
        (ALL, |a, b| {
            let mut w = write(1, a.sge(4090, 64), b.addr(), b.key(), false);
            w.inline = true; // outside the registration: caught at post time, failed in order
            w
        }),
        (Access::REMOTE_READ, |a, b| {
            let mut w = write(1, a.sge(0, 64), b.addr(), b.key(), true);
            w.opcode = WrOpcode::Read; // the READ lands in a region without LOCAL_WRITE
            w
        }),
    ];
    for (i, (access, bad)) in cases.into_iter().enumerate() {
        let (mut a, mut b) = connected(access, ALL, 64, true);
        fill(b.region(), 2);
        let (b_before, a_before) = (b.buf.clone(), a.buf.clone());
        let ok = write(0, a.sge(0, 8), b.addr() + 1024, b.key(), true);
        let mut ok_before = b_before.clone();
        ok_before[GUARD + 1024..GUARD + 1032].copy_from_slice(&a.region()[..8]);
        a.qp.post_send(&[ok, bad(&a, &b), write(2, a.sge(0, 8), b.addr(), b.key(), false)]).unwrap();
        let c = poll_n(&mut a.cq, &mut b.cq, 3);
        assert_eq!(
            statuses(&c),
            [(0, WcStatus::Success), (1, WcStatus::LocalError), (2, WcStatus::Flushed)],
            "case {i}"
        );
        assert!(b.buf == ok_before, "case {i}: only the WR before the bad one wrote");
        assert!(a.buf == a_before, "case {i}: the failed READ placed nothing");
    }
}

#[test]
fn wrs_posted_before_the_peer_connects_wait_for_it() {
    let p = inproc_devices();
    let mut a = end_with(&p.0, 4096, ALL, 64, true);
    let mut b = end_with(&p.1, 4096, Access::REMOTE_WRITE, 64, true);
    let (ia, ib) = (a.qp.local_info(), b.qp.local_info());
    a.qp.connect(&ib, &PARAMS).unwrap();
    fill(a.region(), 8);
    a.qp.post_send(&[write(1, a.sge(0, 64), b.addr(), b.key(), true)]).unwrap();
    assert!(poll_for(&mut a.cq, &mut b.cq, 1, Duration::from_millis(50)).is_empty());
    assert!(b.region().iter().all(|x| *x == 0xAA), "nothing lands before the responder connects");
    b.qp.connect(&ia, &PARAMS).unwrap();
    assert!(b.qp.is_ready().unwrap() && a.qp.is_ready().unwrap());
    let c = poll_n(&mut a.cq, &mut b.cq, 1);
    assert_eq!(statuses(&c), [(1, WcStatus::Success)]);
    let src = a.region()[..64].to_vec();
    assert_eq!(&b.region()[..64], &src[..]);
}

#[test]
fn a_dropped_peer_fails_an_idle_qp_at_its_next_poll() {
    let (mut a, b) = pair(Mode::Inproc, 4096, Access::REMOTE_WRITE);
    let (addr, key) = (b.addr(), b.key());
    drop(b);
    let mut wc = [Completion::default(); 4];
    assert_eq!(a.cq.poll(&mut wc).unwrap(), 0, "nothing was outstanding: no completion");
    assert!(a.qp.is_ready().is_err(), "but the QP saw its peer go");
    a.qp.post_send(&[write(1, a.sge(0, 8), addr, key, true)]).unwrap();
    let c = poll_n(&mut a.cq, &mut SoftCq::new(1, false), 1);
    assert_eq!(statuses(&c), [(1, WcStatus::Flushed)]);
}

#[test]
fn loopback_writes_within_one_region_and_gathers_land_exactly() {
    let p = inproc_devices();
    // Two QPs of one device and one CQ, connected to each other (as the flush QP is).
    let mut a = end_with(&p.0, 4096, ALL, 64, true);
    let mut qp2 = p.0.create_qp(&a.cq, None, QpCaps { max_send_wr: 16, max_inline: 0 }).unwrap();
    let (ia, ib) = (a.qp.local_info(), qp2.local_info());
    a.qp.connect(&ib, &PARAMS).unwrap();
    qp2.connect(&ia, &PARAMS).unwrap();
    assert!(a.qp.is_ready().unwrap() && qp2.is_ready().unwrap());
    fill(a.region(), 6);
    let orig = a.region()[..320].to_vec();
    // Overlapping source and destination in one region, ending 8-aligned (the final word
    // is held back): the bytes as they were at post.
    let at = ((a.addr() + 300).next_multiple_of(8) - 200 - a.addr()) as usize;
    a.qp.post_send(&[write(1, a.sge(0, 200), a.addr() + at as u64, a.key(), true)]).unwrap();
    assert_eq!(statuses(&poll_n(&mut a.cq, &mut SoftCq::new(1, false), 1)), [(1, WcStatus::Success)]);
    assert_eq!(&a.region()[at..at + 200], &orig[..200]);
    // Two SGEs gathered into one 8-aligned range: the final word (made of both) last.
    let dst = (a.addr() + 2048).next_multiple_of(8);
    let mut g = write(2, a.sge(3, 5), dst, a.key(), true);
    g.num_sge = 2;
    g.sge[1] = a.sge(1001, 11);
    a.qp.post_send(&[g]).unwrap();
    assert_eq!(statuses(&poll_n(&mut a.cq, &mut SoftCq::new(1, false), 1)), [(2, WcStatus::Success)]);
    let off = (dst - a.addr()) as usize;
    let want = [a.region()[3..8].to_vec(), a.region()[1001..1012].to_vec()].concat();
    assert_eq!(&a.region()[off..off + 16], &want[..]);
    assert!(a.guards_intact());
}

#[test]
fn final_word_is_stored_last_with_release_in_process() {
    // The placement runs in the posting thread while this one spins on the word.
    final_word_is_stored_last(Mode::Inproc);
}

/// The two ends driven by two threads, as two comms of one process may be: the requester
/// posts signalled WRITE_WITH_IMMs as fast as it can (executed at post time, or queued
/// when the responder's SRQ is empty or its CQ of 3 is full, then run by either side's
/// polls), the responder polls, checks and hands WQEs back. Every message arrives once,
/// in order, with its bytes; every WR completes once, in order.
#[test]
fn two_threads_on_the_two_ends_lose_nothing_and_keep_order() {
    const N: u64 = 20_000;
    const SLOTS: u64 = 4; // WQEs, and message slots in the responder's region
    const MSG: usize = 64;
    let p = inproc_devices();
    let mut a = end_with(&p.0, 256 * MSG, ALL, 64, true);
    let mut b = end_with(&p.1, SLOTS as usize * MSG, Access::REMOTE_WRITE, 3, true);
    connect(&mut a, &mut b);
    b.srq.post_recv(SLOTS as u32).unwrap();
    let byte = |i: u64, k: usize| (i.wrapping_mul(31) as usize + k * 7) as u8;
    let (b_addr, b_key) = (b.addr(), b.key());
    let limit = Duration::from_secs(60);
    let responder = std::thread::spawn(move || {
        let mut wc = [Completion::default(); 16];
        let (mut next, t) = (0u64, Instant::now());
        while next < N {
            assert!(t.elapsed() < limit, "responder stuck at message {next}");
            let n = b.cq.poll(&mut wc).unwrap();
            for c in &wc[..n] {
                assert_eq!((c.status, c.opcode, c.imm as u64), (WcStatus::Success, WcOpcode::RecvRdmaWithImm, next));
                let at = (next % SLOTS) as usize * MSG;
                let got = &b.region()[at..at + MSG];
                assert!(got.iter().enumerate().all(|(k, x)| *x == byte(next, k)), "message {next}: {got:?}");
                next += 1;
                // The slot is read: its WQE goes back (the requester's next WRITE into it
                // takes that WQE first).
                b.srq.post_recv(1).unwrap();
            }
        }
        assert!(b.guards_intact());
        b
    });
    let mut wc = [Completion::default(); 16];
    let (mut posted, mut done, t) = (0u64, 0u64, Instant::now());
    while done < N {
        assert!(t.elapsed() < limit, "requester stuck: {posted} posted, {done} completed");
        // At most 200 outstanding (the send queue holds 256), so a source slot is reused
        // only once its WR completed.
        if posted < N && posted - done < 200 {
            let at = (posted % 256) as usize * MSG;
            for (k, x) in a.region()[at..at + MSG].iter_mut().enumerate() {
                *x = byte(posted, k);
            }
            let mut w = write(posted, a.sge(at, MSG), b_addr + (posted % SLOTS) * MSG as u64, b_key, true);
            w.opcode = WrOpcode::WriteImm;
            w.imm = posted as u32;
            a.qp.post_send(&[w]).unwrap();
            posted += 1;
        }
        let n = a.cq.poll(&mut wc).unwrap();
        for c in &wc[..n] {
            assert_eq!((c.wr_id, c.status), (done, WcStatus::Success));
            done += 1;
        }
    }
    let b = responder.join().unwrap();
    assert_eq!(b.srq.posted(), SLOTS as u32, "every WQE taken once and handed back");
}
