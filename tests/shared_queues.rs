//! The queues a communicator's connections share (`plugin::context`, `plugin::nic_queues`), through
//! the plugin's API in one process on the in-process fabric: one CQ and one SRQ per NIC and
//! context however many connections, a context per v11+ `init` and one default context for
//! older ABIs, connections that outlive their context's `finalize`, a closed connection's
//! late completions counted and never charged to the connection that polls them, and
//! progress threads of a pre-v11 process meeting at a NIC's poll lock without waiting.
//! Each scenario has a plugin instance of its own, configured by the test (`common::Instance`).

use std::time::{Duration, Instant};

use mpib::fabric::MemTypes;
use mpib::plugin::resources::Resources;
use mpib::plugin::{AbiVersion, BufArg, CommHandle, ContextHandle, Process, RequestHandle};

mod common;

use common::Instance;

/// A send and a receive comm on device 0 in context `ctx` (`None`: an older ABI's).
fn pair(p: &Process, abi: AbiVersion, ctx: Option<ContextHandle>) -> (CommHandle, CommHandle) {
    let mut handle = [0u8; 128];
    let listen = p.listen(abi, ctx, 0, &mut handle).expect("listen");
    let (mut send, mut recv) = (None, None);
    let deadline = Instant::now() + Duration::from_secs(20);
    loop {
        assert!(Instant::now() < deadline, "connect/accept did not finish");
        if send.is_none() {
            send = p.connect(abi, ctx, 0, &mut handle, None).expect("connect");
        }
        if recv.is_none() {
            recv = p.accept(listen).expect("accept");
        }
        if let (Some(s), Some(r)) = (send, recv) {
            p.close_listen(listen).expect("closeListen");
            return (s, r);
        }
    }
}

/// `count` messages of `len` bytes from `send` to `recv`, each checked.
fn exchange(p: &Process, send: CommHandle, recv: CommHandle, count: usize, len: usize) {
    let mut sbuf = vec![0u8; len.max(1)];
    let mut rbuf = vec![0u8; len.max(1)];
    let smr = p.reg_mr(send, sbuf.as_ptr() as u64, sbuf.len(), MemTypes::HOST).expect("regMr");
    let rmr = p.reg_mr(recv, rbuf.as_ptr() as u64, rbuf.len(), MemTypes::HOST).expect("regMr");
    for i in 0..count {
        sbuf.fill(i as u8 ^ 0x5a);
        rbuf.fill(0);
        let (ra, rl) = (rbuf.as_ptr() as u64, len);
        let rreq = p
            .irecv(recv, 1, |_| Ok(BufArg { addr: ra, size: rl, tag: 1, mh: Some(rmr) }))
            .expect("irecv")
            .expect("a receive request");
        let deadline = Instant::now() + Duration::from_secs(20);
        let sreq: RequestHandle = loop {
            assert!(Instant::now() < deadline, "no CTS");
            if let Some(r) = p.isend(send, sbuf.as_ptr() as u64, len, 1, smr).expect("isend") {
                break r;
            }
            let _ = p.test(rreq, &mut [0; 8]).expect("test recv");
        };
        let (mut sd, mut rd) = (false, false);
        let mut sizes = [0u64; 8];
        while !(sd && rd) {
            assert!(Instant::now() < deadline, "message {i} did not complete");
            sd = sd || p.test(sreq, &mut [0; 8]).expect("test send").is_some();
            rd = rd || p.test(rreq, &mut sizes).expect("test recv").is_some();
        }
        assert_eq!(sizes[0], len as u64);
        assert!(rbuf[..len].iter().all(|&b| b == i as u8 ^ 0x5a), "message {i}");
    }
    p.dereg_mr(send, Some(smr)).expect("deregMr");
    p.dereg_mr(recv, Some(rmr)).expect("deregMr");
}

fn close(p: &Process, pairs: &[(CommHandle, CommHandle)]) {
    for &(s, r) in pairs {
        p.close_send(s).expect("closeSend");
        p.close_recv(r).expect("closeRecv");
    }
}

/// What a process holds: shared queues, CQs, SRQs, comms.
fn held(r: &Resources) -> [u64; 5] {
    [r.nic_queues, r.cqs, r.srqs, r.send_comms, r.recv_comms]
}

#[test]
fn a_communicator_has_one_cq_and_one_srq_per_nic_however_many_connections() {
    let p = Instance::new(&[("MPIB_FABRIC", "inproc"), ("MPIB_SPLIT", "50")]);
    p.init(AbiVersion::V12).expect("init");
    let a = p.new_context(1, None).expect("context");
    let pairs: Vec<_> = (0..8).map(|_| pair(&p, AbiVersion::V12, Some(a))).collect();
    // Two NICs (SOUT, SUP): one CQ and one SRQ each, for 8 send and 8 receive comms.
    assert_eq!(held(&p.resources()), [2, 2, 2, 8, 8], "{:?}", p.resources());
    for &(s, r) in &pairs {
        exchange(&p, s, r, 40, 4096);
    }
    // A second communicator has queues of its own.
    p.init(AbiVersion::V12).expect("init");
    let b = p.new_context(2, None).expect("context");
    let other = pair(&p, AbiVersion::V12, Some(b));
    assert_eq!(held(&p.resources()), [4, 4, 4, 9, 9], "{:?}", p.resources());
    exchange(&p, other.0, other.1, 40, 100);
    // The CQ grew with the connections; every send queue and SRQ WQE has room in it.
    let r = p.resources();
    assert!(r.cq_entries >= r.qp_send_wrs + r.srq_posted, "{r:?}");
    close(&p, &pairs);
    close(&p, &[other]);
    assert_eq!(held(&p.resources()), [0; 5], "everything goes with the last connection: {:?}", p.resources());
    p.finalize(a).expect("finalize");
    p.finalize(b).expect("finalize");
    let r = p.resources();
    assert_eq!((r.contexts, r.cq_entries, r.qps, r.srq_posted, r.inbox_entries, r.control_bytes), (0, 0, 0, 0, 0, 0));
}

#[test]
fn older_abis_share_one_default_context() {
    let p = Instance::new(&[("MPIB_FABRIC", "inproc")]);
    p.init(AbiVersion::V8).expect("init");
    let pairs: Vec<_> = (0..3).map(|_| pair(&p, AbiVersion::V8, None)).collect();
    let v6 = pair(&p, AbiVersion::V6, None);
    assert_eq!(held(&p.resources()), [2, 2, 2, 4, 4], "{:?}", p.resources());
    assert_eq!(p.resources().contexts, 1, "the default context");
    for &(s, r) in pairs.iter().chain([&v6]) {
        exchange(&p, s, r, 20, 8);
    }
    close(&p, &pairs);
    close(&p, &[v6]);
    assert_eq!(held(&p.resources()), [0; 5]);
}

#[test]
fn connections_outlive_the_finalize_of_their_context() {
    let p = Instance::new(&[("MPIB_FABRIC", "inproc")]);
    p.init(AbiVersion::V12).expect("init");
    p.init(AbiVersion::V12).expect("init");
    let keep = p.new_context(1, None).expect("context");
    let ctx = p.new_context(2, None).expect("context");
    let (s, r) = pair(&p, AbiVersion::V12, Some(ctx));
    p.finalize(ctx).expect("finalize");
    let mut h = [0u8; 128];
    let e = p.listen(AbiVersion::V12, Some(ctx), 0, &mut h).unwrap_err();
    assert!(e.msg().contains("unknown plugin context"), "{}", e.msg());
    // NCCL may close comms after finalizing their communicator: they still work until then.
    exchange(&p, s, r, 20, 512);
    close(&p, &[(s, r)]);
    assert_eq!(held(&p.resources()), [0; 5]);
    p.finalize(keep).expect("finalize");
}

#[test]
fn a_closed_connections_late_completions_are_counted_and_never_fail_the_poller() {
    // Probes off: an idle rail's probe, due by the time of the isend, would be a
    // third late completion.
    let p = Instance::new(&[("MPIB_FABRIC", "inproc"), ("MPIB_SPLIT", "sout"), ("MPIB_PROBE_INTERVAL_US", "0")]);
    p.init(AbiVersion::V12).expect("init");
    let ctx = p.new_context(1, None).expect("context");
    let (s1, r1) = pair(&p, AbiVersion::V12, Some(ctx));
    let (s2, r2) = pair(&p, AbiVersion::V12, Some(ctx));
    // The in-process fabric executes a WR as it is posted: after this irecv and isend the
    // shared CQ holds the IMM and the send's completion (the CTS is unsignalled: a rail's
    // 16th is), and nobody has polled.
    let buf = [0u8; 64];
    let (smr, rmr) = (
        p.reg_mr(s1, buf.as_ptr() as u64, 64, MemTypes::HOST).unwrap(),
        p.reg_mr(r1, buf.as_ptr() as u64, 64, MemTypes::HOST).unwrap(),
    );
    let a = buf.as_ptr() as u64;
    p.irecv(r1, 1, |_| Ok(BufArg { addr: a, size: 64, tag: 1, mh: Some(rmr) })).unwrap().expect("irecv");
    p.isend(s1, a, 64, 1, smr).unwrap().expect("the CTS is there (in-process)");
    let before = p.resources().unrouted_completions;
    close(&p, &[(s1, r1)]);
    p.dereg_mr(s1, Some(smr)).unwrap();
    p.dereg_mr(r1, Some(rmr)).unwrap();
    // The other connection polls them: counted, dropped, and its own traffic is fine.
    exchange(&p, s2, r2, 10, 64);
    let unrouted = p.resources().unrouted_completions - before;
    assert_eq!(unrouted, 2, "the IMM and the send completion of the closed pair");
    close(&p, &[(s2, r2)]);
    p.finalize(ctx).expect("finalize");
}

#[test]
fn progress_threads_of_an_older_abi_meet_at_the_poll_lock_without_waiting() {
    let p = Instance::new(&[("MPIB_FABRIC", "inproc"), ("MPIB_SPLIT", "50")]);
    // Before v11 every communicator of the process shares the default context: here four
    // threads drive a pair each, all on the same NICs' queues. Each thread's completions
    // are often polled by another (and reach it through its inbox); every byte is checked.
    p.init(AbiVersion::V8).expect("init");
    let pairs: Vec<_> = (0..4).map(|_| pair(&p, AbiVersion::V8, None)).collect();
    let threads: Vec<_> = pairs
        .iter()
        .enumerate()
        .map(|(k, &(s, r))| {
            let p: &'static Process = p.p;
            std::thread::spawn(move || exchange(p, s, r, 1000, 8 + k * 1000))
        })
        .collect();
    for t in threads {
        t.join().expect("a progress thread failed");
    }
    assert_eq!(p.resources().cqs, 2);
    close(&p, &pairs);
}
