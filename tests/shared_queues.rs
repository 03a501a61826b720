//! The queues a communicator's connections share (`plugin::context`, `plugin::nic_queues`), through
//! the plugin's API in one process on the in-process fabric: one CQ and one SRQ per NIC and
//! context however many connections, a context per v11+ `init` and one default context for
//! older ABIs, connections that outlive their context's `finalize`, a closed connection's
//! late completions counted and never charged to the connection that polls them, and
//! progress threads of a pre-v11 process meeting at a NIC's poll lock without waiting.
//! Each scenario runs in a child process (the configuration is read once per process).

use std::time::{Duration, Instant};

use mpib::fabric::MemTypes;
use mpib::plugin::resources::Resources;
use mpib::plugin::{AbiVersion, BufArg, CommHandle, ContextHandle, RequestHandle};

mod common;

use common::{in_child, is_child};

/// A send and a receive comm on device 0 in context `ctx` (`None`: an older ABI's).
fn pair(abi: AbiVersion, ctx: Option<ContextHandle>) -> (CommHandle, CommHandle) {
    let mut handle = [0u8; 128];
    let listen = mpib::abi::process().listen(abi, ctx, 0, &mut handle).expect("listen");
    let (mut send, mut recv) = (None, None);
    let deadline = Instant::now() + Duration::from_secs(20);
    loop {
        assert!(Instant::now() < deadline, "connect/accept did not finish");
        if send.is_none() {
            send = mpib::abi::process().connect(abi, ctx, 0, &mut handle, None).expect("connect");
        }
        if recv.is_none() {
            recv = mpib::abi::process().accept(listen).expect("accept");
        }
        if let (Some(s), Some(r)) = (send, recv) {
            mpib::abi::process().close_listen(listen).expect("closeListen");
            return (s, r);
        }
    }
}

/// `count` messages of `len` bytes from `send` to `recv`, each checked.
fn exchange(send: CommHandle, recv: CommHandle, count: usize, len: usize) {
    let mut sbuf = vec![0u8; len.max(1)];
    let mut rbuf = vec![0u8; len.max(1)];
    let smr = mpib::abi::process().reg_mr(send, sbuf.as_ptr() as u64, sbuf.len(), MemTypes::HOST).expect("regMr");
    let rmr = mpib::abi::process().reg_mr(recv, rbuf.as_ptr() as u64, rbuf.len(), MemTypes::HOST).expect("regMr");
    for i in 0..count {
        sbuf.fill(i as u8 ^ 0x5a);
        rbuf.fill(0);
        let (ra, rl) = (rbuf.as_ptr() as u64, len);
        let rreq = mpib::abi::process()
            .irecv(recv, 1, |_| Ok(BufArg { addr: ra, size: rl, tag: 1, mh: Some(rmr) }))
            .expect("irecv")
            .expect("a receive request");
        let deadline = Instant::now() + Duration::from_secs(20);
        let sreq: RequestHandle = loop {
            assert!(Instant::now() < deadline, "no CTS");
            if let Some(r) = mpib::abi::process().isend(send, sbuf.as_ptr() as u64, len, 1, smr).expect("isend") {
                break r;
            }
            let _ = mpib::abi::process().test(rreq, &mut [0; 8]).expect("test recv");
        };
        let (mut sd, mut rd) = (false, false);
        let mut sizes = [0u64; 8];
        while !(sd && rd) {
            assert!(Instant::now() < deadline, "message {i} did not complete");
            sd = sd || mpib::abi::process().test(sreq, &mut [0; 8]).expect("test send").is_some();
            rd = rd || mpib::abi::process().test(rreq, &mut sizes).expect("test recv").is_some();
        }
        assert_eq!(sizes[0], len as u64);
        assert!(rbuf[..len].iter().all(|&b| b == i as u8 ^ 0x5a), "message {i}");
    }
    mpib::abi::process().dereg_mr(send, Some(smr)).expect("deregMr");
    mpib::abi::process().dereg_mr(recv, Some(rmr)).expect("deregMr");
}

fn close(pairs: &[(CommHandle, CommHandle)]) {
    for &(s, r) in pairs {
        mpib::abi::process().close_send(s).expect("closeSend");
        mpib::abi::process().close_recv(r).expect("closeRecv");
    }
}

/// What a process holds: shared queues, CQs, SRQs, comms.
fn held(r: &Resources) -> [u64; 5] {
    [r.nic_queues, r.cqs, r.srqs, r.send_comms, r.recv_comms]
}

#[test]
fn a_communicator_has_one_cq_and_one_srq_per_nic_however_many_connections() {
    if !is_child() {
        return in_child(
            "a_communicator_has_one_cq_and_one_srq_per_nic_however_many_connections",
            &[("MPIB_FABRIC", "inproc"), ("MPIB_SPLIT", "50")],
        );
    }
    mpib::abi::init_process(AbiVersion::V12).expect("init");
    let a = mpib::abi::process().new_context(1, None).expect("context");
    let pairs: Vec<_> = (0..8).map(|_| pair(AbiVersion::V12, Some(a))).collect();
    // Two NICs (SOUT, SUP): one CQ and one SRQ each, for 8 send and 8 receive comms.
    assert_eq!(held(&mpib::abi::process().resources()), [2, 2, 2, 8, 8], "{:?}", mpib::abi::process().resources());
    for &(s, r) in &pairs {
        exchange(s, r, 40, 4096);
    }
    // A second communicator has queues of its own.
    mpib::abi::init_process(AbiVersion::V12).expect("init");
    let b = mpib::abi::process().new_context(2, None).expect("context");
    let other = pair(AbiVersion::V12, Some(b));
    assert_eq!(held(&mpib::abi::process().resources()), [4, 4, 4, 9, 9], "{:?}", mpib::abi::process().resources());
    exchange(other.0, other.1, 40, 100);
    // The CQ grew with the connections; every send queue and SRQ WQE has room in it.
    let r = mpib::abi::process().resources();
    assert!(r.cq_entries >= r.qp_send_wrs + r.srq_posted, "{r:?}");
    close(&pairs);
    close(&[other]);
    assert_eq!(
        held(&mpib::abi::process().resources()),
        [0; 5],
        "everything goes with the last connection: {:?}",
        mpib::abi::process().resources()
    );
    mpib::abi::process().finalize(a).expect("finalize");
    mpib::abi::process().finalize(b).expect("finalize");
    let r = mpib::abi::process().resources();
    assert_eq!((r.contexts, r.cq_entries, r.qps, r.srq_posted, r.inbox_entries, r.control_bytes), (0, 0, 0, 0, 0, 0));
}

#[test]
fn older_abis_share_one_default_context() {
    if !is_child() {
        return in_child("older_abis_share_one_default_context", &[("MPIB_FABRIC", "inproc")]);
    }
    mpib::abi::init_process(AbiVersion::V8).expect("init");
    let pairs: Vec<_> = (0..3).map(|_| pair(AbiVersion::V8, None)).collect();
    let v6 = pair(AbiVersion::V6, None);
    assert_eq!(held(&mpib::abi::process().resources()), [2, 2, 2, 4, 4], "{:?}", mpib::abi::process().resources());
    assert_eq!(mpib::abi::process().resources().contexts, 1, "the default context");
    for &(s, r) in pairs.iter().chain([&v6]) {
        exchange(s, r, 20, 8);
    }
    close(&pairs);
    close(&[v6]);
    assert_eq!(held(&mpib::abi::process().resources()), [0; 5]);
}

#[test]
fn connections_outlive_the_finalize_of_their_context() {
    if !is_child() {
        return in_child("connections_outlive_the_finalize_of_their_context", &[("MPIB_FABRIC", "inproc")]);
    }
    mpib::abi::init_process(AbiVersion::V12).expect("init");
    mpib::abi::init_process(AbiVersion::V12).expect("init");
    let keep = mpib::abi::process().new_context(1, None).expect("context");
    let ctx = mpib::abi::process().new_context(2, None).expect("context");
    let (s, r) = pair(AbiVersion::V12, Some(ctx));
    mpib::abi::process().finalize(ctx).expect("finalize");
    let mut h = [0u8; 128];
    let e = mpib::abi::process().listen(AbiVersion::V12, Some(ctx), 0, &mut h).unwrap_err();
    assert!(e.msg().contains("unknown plugin context"), "{}", e.msg());
    // NCCL may close comms after finalizing their communicator: they still work until then.
    exchange(s, r, 20, 512);
    close(&[(s, r)]);
    assert_eq!(held(&mpib::abi::process().resources()), [0; 5]);
    mpib::abi::process().finalize(keep).expect("finalize");
}

#[test]
fn a_closed_connections_late_completions_are_counted_and_never_fail_the_poller() {
    if !is_child() {
        return in_child(
            "a_closed_connections_late_completions_are_counted_and_never_fail_the_poller",
            // Probes off: an idle rail's probe, due by the time of the isend, would be a
            // third late completion.
            &[("MPIB_FABRIC", "inproc"), ("MPIB_SPLIT", "sout"), ("MPIB_PROBE_INTERVAL_US", "0")],
        );
    }
    mpib::abi::init_process(AbiVersion::V12).expect("init");
    let ctx = mpib::abi::process().new_context(1, None).expect("context");
    let (s1, r1) = pair(AbiVersion::V12, Some(ctx));
    let (s2, r2) = pair(AbiVersion::V12, Some(ctx));
    // The in-process fabric executes a WR as it is posted: after this irecv and isend the
    // shared CQ holds the IMM and the send's completion (the CTS is unsignalled: a rail's
    // 16th is), and nobody has polled.
    let buf = [0u8; 64];
    let (smr, rmr) = (
        mpib::abi::process().reg_mr(s1, buf.as_ptr() as u64, 64, MemTypes::HOST).unwrap(),
        mpib::abi::process().reg_mr(r1, buf.as_ptr() as u64, 64, MemTypes::HOST).unwrap(),
    );
    let a = buf.as_ptr() as u64;
    mpib::abi::process()
        .irecv(r1, 1, |_| Ok(BufArg { addr: a, size: 64, tag: 1, mh: Some(rmr) }))
        .unwrap()
        .expect("irecv");
    mpib::abi::process().isend(s1, a, 64, 1, smr).unwrap().expect("the CTS is there (in-process)");
    let before = mpib::abi::process().resources().unrouted_completions;
    close(&[(s1, r1)]);
    mpib::abi::process().dereg_mr(s1, Some(smr)).unwrap();
    mpib::abi::process().dereg_mr(r1, Some(rmr)).unwrap();
    // The other connection polls them: counted, dropped, and its own traffic is fine.
    exchange(s2, r2, 10, 64);
    let unrouted = mpib::abi::process().resources().unrouted_completions - before;
    assert_eq!(unrouted, 2, "the IMM and the send completion of the closed pair");
    close(&[(s2, r2)]);
    mpib::abi::process().finalize(ctx).expect("finalize");
}

#[test]
fn progress_threads_of_an_older_abi_meet_at_the_poll_lock_without_waiting() {
    if !is_child() {
        return in_child(
            "progress_threads_of_an_older_abi_meet_at_the_poll_lock_without_waiting",
            &[("MPIB_FABRIC", "inproc"), ("MPIB_SPLIT", "50")],
        );
    }
    // Before v11 every communicator of the process shares the default context: here four
    // threads drive a pair each, all on the same NICs' queues. Each thread's completions
    // are often polled by another (and reach it through its inbox); every byte is checked.
    mpib::abi::init_process(AbiVersion::V8).expect("init");
    let pairs: Vec<_> = (0..4).map(|_| pair(AbiVersion::V8, None)).collect();
    let threads: Vec<_> = pairs
        .iter()
        .enumerate()
        .map(|(k, &(s, r))| std::thread::spawn(move || exchange(s, r, 1000, 8 + k * 1000)))
        .collect();
    for t in threads {
        t.join().expect("a progress thread failed");
    }
    assert_eq!(mpib::abi::process().resources().cqs, 2);
    close(&pairs);
}
