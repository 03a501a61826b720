//! Links shared by QPs (TCP): one socket per device pair, QPs multiplexed over it, each
//! keeping its order, its faults and its receiver-not-ready waits to itself; the link
//! closed when its last QP goes.

use super::*;

const ALL: Access = Access::LOCAL_WRITE.union(Access::REMOTE_WRITE).union(Access::REMOTE_READ);

/// Bug 1: no SRQ WQE is lost when the QP fails while a WRITE_WITH_IMM is in progress
/// (before: one whose payload was placed and waited for CQ room lost its WQE).
#[test]
fn a_wqe_taken_by_a_write_imm_is_never_lost_when_the_qp_fails() {
    let p = devices(Mode::Tcp);
    let mut a = End::new(p.0.clone(), 4096, ALL);
    // The responder's CQ holds one completion.
    let cq = p.1.create_cq(1, Timestamps::Off).unwrap();
    let srq = p.1.create_srq(16).unwrap();
    let qp = p.1.create_qp(&cq, Some(&srq), QpCaps { max_send_wr: 16, max_inline: 0 }).unwrap();
    let mut bbuf = vec![0u8; 4096];
    let bmr = p.1.reg_mr(bbuf.as_mut_ptr(), 4096, Access::REMOTE_WRITE).unwrap();
    let mut b = End { dev: p.1.clone(), cq, srq, qp, buf: vec![0; 2 * GUARD + 8], mr: None };
    connect(&mut a, &mut b);
    b.srq.post_recv(2).unwrap();
    let imm = |i: u64| {
        let mut w = write(i, a.sge(0, 64), bbuf.as_ptr() as u64 + 64 * i, SoftDevice::mr_keys(&bmr).rkey, true);
        w.opcode = WrOpcode::WriteImm;
        w
    };
    a.qp.post_send(&[imm(0), imm(1)]).unwrap();
    // Only the responder's helper serves it (nobody polls its CQ): the first fills the CQ.
    // (Returns at the first completion; the 5 s are for a machine whose cores are busy
    // elsewhere: 500 ms ran out once so.)
    let c = poll_for(&mut a.cq, &mut SoftCq::new(1, false), 1, Duration::from_secs(5));
    assert_eq!(c.first().map(|c| (c.wr_id, c.status)), Some((0, WcStatus::Success)));
    std::thread::sleep(Duration::from_millis(50));
    // The requester goes away; the responder's own request to it then fails, and with it
    // the responder's QP, while the second WRITE_WITH_IMM is not complete.
    let (a_addr, a_key) = (a.addr(), a.key());
    drop(a);
    std::thread::sleep(Duration::from_millis(50));
    let lkey = SoftDevice::mr_keys(&bmr).lkey;
    let own = write(7, Sge { addr: bbuf.as_ptr() as u64, len: 8, lkey }, a_addr, a_key, true);
    let _ = b.qp.post_send(&[own]);
    let t = Instant::now();
    while b.qp.is_ready().is_ok() {
        assert!(t.elapsed() < Duration::from_secs(5), "the responder's QP did not fail");
        std::thread::sleep(Duration::from_millis(5));
    }
    let mut got = Vec::new();
    let mut wc = [Completion::default(); 4];
    let t = Instant::now();
    while t.elapsed() < Duration::from_millis(300) {
        let n = b.cq.poll(&mut wc).unwrap();
        got.extend_from_slice(&wc[..n]);
    }
    let recv: Vec<_> = got.iter().filter(|c| c.opcode == WcOpcode::RecvRdmaWithImm).collect();
    let ok = recv.iter().filter(|c| c.status == WcStatus::Success).count() as u32;
    let flushed = recv.iter().filter(|c| c.status == WcStatus::Flushed).count() as u32;
    let posted = b.srq.posted();
    assert_eq!(ok + flushed + posted, 2, "every WQE completes or stays posted: {got:?}, posted {posted}");
    drop(bmr);
}

/// A CQ's one link that stayed quiet for many polls goes cold (its polls ask the readiness
/// set instead of reading: `cq.rs`, `COLD_STEPS`); what then arrives is still stepped at
/// once, WRITE_WITH_IMM, its acknowledgement and READ replies, round after round.
#[test]
fn a_cold_link_is_stepped_when_its_socket_moves() {
    let (mut a, mut b) = pair(Mode::Tcp, 4096, ALL);
    b.srq.post_recv(64).unwrap();
    fill(a.region(), 3);
    for round in 0..20u64 {
        // Long enough quiet on both sides for both links to go cold.
        for _ in 0..100 {
            assert_eq!(a.cq.poll(&mut []).unwrap(), 0);
            assert_eq!(b.cq.poll(&mut []).unwrap(), 0);
        }
        let off = round as usize * 8;
        let mut wr = write(round, a.sge(off, 8), b.addr() + off as u64, b.key(), true);
        wr.opcode = WrOpcode::WriteImm;
        wr.imm = round as u32;
        a.qp.post_send(&[wr]).unwrap();
        let r = poll_n(&mut b.cq, &mut a.cq, 1);
        assert_eq!(statuses(&r), [(0, WcStatus::Success)], "round {round}: the WRITE_WITH_IMM arrived");
        assert_eq!(r[0].imm, round as u32);
        let c = poll_n(&mut a.cq, &mut b.cq, 1);
        assert_eq!(statuses(&c), [(round, WcStatus::Success)], "round {round}: acknowledged");
        let mut read = write(100 + round, a.sge(2048 + off, 8), b.addr() + off as u64, b.key(), true);
        read.opcode = WrOpcode::Read;
        a.qp.post_send(&[read]).unwrap();
        let c = poll_n(&mut a.cq, &mut b.cq, 1);
        assert_eq!(statuses(&c), [(100 + round, WcStatus::Success)], "round {round}: the READ's reply");
        let expect = a.region()[off..off + 8].to_vec();
        assert_eq!(a.region()[2048 + off..2048 + off + 8], expect[..], "round {round}: the bytes read");
    }
}

/// Two cold CQs of one device, each with its own link: the edge of one's socket taken by
/// the other's readiness check is served by the one that took it (else the first CQ would
/// never hear of its data: its own checks find the edge gone).
#[test]
fn an_edge_taken_by_another_cold_cq_of_the_device_is_served() {
    let p = devices(Mode::Tcp);
    let third = Arc::new(
        open(&SoftOptions { connect_timeout: Duration::from_secs(2), ..SoftOptions::tcp("t-c", LOOPBACK) }).unwrap(),
    );
    // Device p.0 has two CQs: `one` talks to p.1, `two` to `third` (two links).
    let (mut one, mut b) = (End::new(p.0.clone(), 4096, ALL), End::new(p.1.clone(), 4096, ALL));
    let (mut two, mut c) = (End::new(p.0.clone(), 4096, ALL), End::new(third.clone(), 4096, ALL));
    connect(&mut one, &mut b);
    connect(&mut two, &mut c);
    two.srq.post_recv(8).unwrap();
    for round in 0..5u64 {
        for _ in 0..100 {
            for cq in [&mut one.cq, &mut two.cq, &mut b.cq, &mut c.cq] {
                assert_eq!(cq.poll(&mut []).unwrap(), 0);
            }
        }
        let mut wr = write(round, c.sge(0, 8), two.addr(), two.key(), true);
        wr.opcode = WrOpcode::WriteImm;
        c.qp.post_send(&[wr]).unwrap();
        // `one` polls first and takes the edge of `two`'s link.
        let t = Instant::now();
        while t.elapsed() < Duration::from_millis(20) {
            assert_eq!(one.cq.poll(&mut []).unwrap(), 0);
        }
        let r = poll_n(&mut two.cq, &mut c.cq, 1);
        assert_eq!(statuses(&r), [(0, WcStatus::Success)], "round {round}: the WRITE_WITH_IMM reached its CQ");
        let done = poll_n(&mut c.cq, &mut two.cq, 1);
        assert_eq!(statuses(&done), [(round, WcStatus::Success)], "round {round}: acknowledged");
    }
}

/// A device whose one caller asked the readiness set and then went hot on its own link (a
/// busy proxy on one communicator): a request that arrives on another link of the device,
/// whose CQ nobody polls (an idle communicator's probe), is acknowledged by the helper at
/// once (mostly), not left to its next sweep (up to `MAX_DEFER`, 100 ms, while the hot
/// caller keeps putting the sweep off).
#[test]
fn a_link_nobody_polls_is_served_while_another_cq_of_the_device_is_hot() {
    let p = devices(Mode::Tcp);
    let third = Arc::new(
        open(&SoftOptions { connect_timeout: Duration::from_secs(2), ..SoftOptions::tcp("t-q", LOOPBACK) }).unwrap(),
    );
    // Device p.0 has two CQs: `one` streams to p.1, `two` (never polled) is written by `third`.
    let (mut one, mut b) = (End::new(p.0.clone(), 1 << 20, ALL), End::new(p.1.clone(), 1 << 20, ALL));
    let (mut two, mut c) = (End::new(p.0.clone(), 4096, ALL), End::new(third.clone(), 4096, ALL));
    connect(&mut one, &mut b);
    connect(&mut two, &mut c);
    let mut wc = [Completion::default(); 16];
    let mut waits = Vec::new();
    for round in 0..9u64 {
        // `one` goes cold: its polls ask the device's readiness set.
        for _ in 0..100 {
            assert_eq!(one.cq.poll(&mut []).unwrap(), 0);
            assert_eq!(b.cq.poll(&mut []).unwrap(), 0);
        }
        // Then hot: 64 KiB WRITEs, four in flight, keep its steps moving.
        let big = |one: &End, b: &End, i: u64| write(1000 + i, one.sge(0, 65536), b.addr(), b.key(), true);
        let mut posted = 0u64;
        let mut done = 0u64;
        let keep_hot = |one: &mut End, b: &mut End, posted: &mut u64, done: &mut u64, wc: &mut [Completion]| {
            while *posted - *done < 4 {
                one.qp.post_send(&[big(one, b, *posted)]).unwrap();
                *posted += 1;
            }
            let n = one.cq.poll(wc).unwrap();
            assert!(wc[..n].iter().all(|c| c.status == WcStatus::Success));
            *done += n as u64;
            assert_eq!(b.cq.poll(&mut []).unwrap(), 0);
        };
        for _ in 0..200 {
            keep_hot(&mut one, &mut b, &mut posted, &mut done, &mut wc);
        }
        let src = c.sge(0, 8);
        let sweeps = p.0.helper_sweeps();
        c.qp.post_send(&[write(round, src, two.addr(), two.key(), true)]).unwrap();
        let t = Instant::now();
        loop {
            keep_hot(&mut one, &mut b, &mut posted, &mut done, &mut wc);
            let mut got = [Completion::default(); 1];
            if c.cq.poll(&mut got).unwrap() == 1 {
                assert_eq!(statuses(&got), [(round, WcStatus::Success)], "round {round}");
                break;
            }
            assert!(t.elapsed() < Duration::from_secs(5), "round {round}: no acknowledgement");
        }
        waits.push(p.0.helper_sweeps() - sweeps);
        while done < posted {
            let n = one.cq.poll(&mut wc).unwrap();
            done += n as u64;
            assert_eq!(b.cq.poll(&mut []).unwrap(), 0);
        }
    }
    // Left to the helper's sweeps (every 100 ms here, put off by the hot caller), every round
    // waits for one (96–198 ms); served at once (~0.3 ms), a round is mostly over before
    // the next sweep. Counted in sweeps, not in time, so a loaded machine that slows both
    // alike does not fail it. Three rounds of nine: a round that waits for a sweep still
    // happens (1 or 2 in 20 here, more on a busy machine), and a sweep may fall in a round
    // served at once. (Who serves a link after ASK_AGAIN: `progress::Looks::verdict`.)
    let unswept = waits.iter().filter(|&&n| n == 0).count();
    assert!(unswept >= 3, "sweeps of p.0's helper during each round: {waits:?}");
}

/// A responder whose callers are quiet (nobody polls its CQ) is streamed to: its helper
/// asks once whether callers serve the link, then serves each of its events at once while
/// neither the link's nor the device's caller epoch moves (before: a 100 µs wait on every
/// event, ~12 % of an idle responder's bandwidth in `soft_vs_tcp`).
#[test]
fn a_helper_streaming_for_quiet_callers_does_not_ask_again_per_event() {
    let len = 1 << 20;
    let (mut a, b) = pair(Mode::Tcp, len, ALL);
    fill(a.region(), 9);
    let src = a.region().to_vec();
    let asks0 = b.dev.helper_asks();
    let mut wc = [Completion::default(); 16];
    let (mut posted, mut done) = (0u64, 0u64);
    let t = Instant::now();
    // 128 MiB, four 1 MiB WRITEs in flight: each is acknowledged by B's helper.
    while done < 128 {
        while posted < 128 && posted - done < 4 {
            a.qp.post_send(&[write(posted, a.sge(0, len), b.addr(), b.key(), true)]).unwrap();
            posted += 1;
        }
        let n = a.cq.poll(&mut wc).unwrap();
        assert!(wc[..n].iter().all(|c| c.status == WcStatus::Success));
        done += n as u64;
        assert!(t.elapsed() < Duration::from_secs(30), "the stream stalled at {done} of 128");
    }
    let asks = b.dev.helper_asks() - asks0;
    assert!(b.buf[GUARD..GUARD + len] == src[..] && b.guards_intact());
    // Before: one ask per event, several hundred here. A few stay possible (a sweep's look).
    assert!(asks <= 4, "B's helper asked {asks} times");
}
