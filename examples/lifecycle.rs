//! A whole plugin lifecycle in one process, for leak checking under valgrind
//! (`tests/leaks.rs`): init, listen → connect → accept, registrations, messages, then close
//! every comm with requests still outstanding, deregister, close again, finalize.
//!
//! `cargo run --example lifecycle [ROUNDS]` (set MPIB_FABRIC=inproc or soft).

use std::time::{Duration, Instant};

use mpib::fabric::MemTypes;
use mpib::plugin::{AbiVersion, BufArg, CommHandle, ContextHandle};

/// A send and a receive comm of the communicator of `ctx`.
fn pair(abi: AbiVersion, ctx: ContextHandle) -> (CommHandle, CommHandle) {
    let mut handle = [0u8; 128];
    let listen = mpib::abi::process().listen(abi, Some(ctx), 0, &mut handle).expect("listen");
    let (mut send, mut recv) = (None, None);
    let deadline = Instant::now() + Duration::from_secs(60);
    loop {
        assert!(Instant::now() < deadline, "set-up did not finish");
        if send.is_none() {
            send = mpib::abi::process().connect(abi, Some(ctx), 0, &mut handle, None).expect("connect");
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

fn main() {
    let rounds: usize = std::env::args().nth(1).and_then(|a| a.parse().ok()).unwrap_or(3);
    // Messages to stderr at the level RUST_LOG names, as the C ABI does before NCCL's logger.
    mpib::abi::logger::install();
    let ctx = {
        mpib::abi::init_process(AbiVersion::V12).expect("init");
        mpib::abi::process().new_context(7, Some(-1)).expect("context")
    };
    for round in 0..rounds {
        let (send, recv) = pair(AbiVersion::V12, ctx);
        let mut sbuf = vec![7u8; 1 << 16];
        let mut rbuf = vec![0u8; 1 << 16];
        let smr =
            mpib::abi::process().reg_mr(send, sbuf.as_mut_ptr() as u64, sbuf.len(), MemTypes::HOST).expect("regMr");
        let rmr =
            mpib::abi::process().reg_mr(recv, rbuf.as_mut_ptr() as u64, rbuf.len(), MemTypes::HOST).expect("regMr");
        let (raddr, rlen) = (rbuf.as_ptr() as u64, rbuf.len());
        let rarg = move |_| Ok(BufArg { addr: raddr, size: rlen, tag: 1, mh: Some(rmr) });
        // A few complete messages.
        for msg in 0..4 {
            let r = mpib::abi::process().irecv(recv, 1, rarg).expect("irecv").expect("a receive is never refused");
            let deadline = Instant::now() + Duration::from_secs(60);
            // The receiving side is driven while the sender waits for its CTS, as the peer's
            // progress thread tests its receives: a CTS to redo (after a failover, which a
            // slow valgrind run may provoke) goes out from the receiver's calls.
            let mut rd = false;
            let s = loop {
                assert!(Instant::now() < deadline, "round {round} message {msg}: no CTS");
                if let Some(s) = mpib::abi::process().isend(send, sbuf.as_ptr() as u64, 4096, 1, smr).expect("isend") {
                    break s;
                }
                rd = mpib::abi::process().test(r, &mut [0; 8]).expect("test").is_some();
                assert!(!rd, "round {round} message {msg}: a receive completed before its send");
            };
            let mut sd = false;
            while !(sd && rd) {
                assert!(Instant::now() < deadline, "round {round} message {msg}: no completion");
                sd = sd || mpib::abi::process().test(s, &mut [0; 8]).expect("test").is_some();
                rd = rd || mpib::abi::process().test(r, &mut [0; 8]).expect("test").is_some();
            }
        }
        // Requests left outstanding on purpose: receives without sends.
        for _ in 0..3 {
            mpib::abi::process().irecv(recv, 1, rarg).expect("irecv");
        }
        mpib::abi::process().close_send(send).expect("closeSend");
        mpib::abi::process().close_recv(recv).expect("closeRecv");
        // NCCL may deregister after closing the comm: the registration is still released.
        mpib::abi::process().dereg_mr(send, Some(smr)).expect("deregMr after closeSend");
        mpib::abi::process().dereg_mr(recv, Some(rmr)).expect("deregMr after closeRecv");
        mpib::abi::process().dereg_mr(recv, Some(rmr)).expect_err("a second deregMr of one handle is an error");
        println!("round {round}: closed with 3 receives outstanding");
    }
    mpib::abi::process().finalize(ctx).expect("finalize");
    println!("lifecycle: done");
}
