//! A whole plugin lifecycle in one process, for leak checking under valgrind
//! (`tests/leaks.rs`): init, listen → connect → accept, registrations, messages, then close
//! every comm with requests still outstanding, deregister, close again, finalize.
//!
//! `cargo run --example lifecycle [ROUNDS]` (set MPIB_FABRIC=inproc or soft).

use std::ffi::c_void;
use std::time::{Duration, Instant};

use mpib::plugin::{self, AbiVersion};

fn pair(abi: AbiVersion, ctx_tc: Option<i32>) -> (*mut c_void, *mut c_void) {
    let mut handle = [0u8; 128];
    let listen = plugin::listen(abi, 0, &mut handle).expect("listen");
    let (mut send, mut recv): (*mut c_void, *mut c_void) = (std::ptr::null_mut(), std::ptr::null_mut());
    let deadline = Instant::now() + Duration::from_secs(60);
    while send.is_null() || recv.is_null() {
        assert!(Instant::now() < deadline, "set-up did not finish");
        if send.is_null() {
            send = plugin::connect(abi, 0, &mut handle, ctx_tc).expect("connect");
        }
        if recv.is_null() {
            recv = plugin::accept(listen).expect("accept");
        }
    }
    plugin::close_listen(listen).expect("closeListen");
    (send, recv)
}

fn main() {
    let rounds: usize = std::env::args().nth(1).and_then(|a| a.parse().ok()).unwrap_or(3);
    let ctx = {
        plugin::init(AbiVersion::V12).expect("init");
        plugin::new_context(7, Some(-1))
    };
    for round in 0..rounds {
        let (send, recv) = pair(AbiVersion::V12, None);
        let mut sbuf = vec![7u8; 1 << 16];
        let mut rbuf = vec![0u8; 1 << 16];
        let smr = plugin::reg_mr(send, sbuf.as_mut_ptr().cast(), sbuf.len(), 1).expect("regMr");
        let rmr = plugin::reg_mr(recv, rbuf.as_mut_ptr().cast(), rbuf.len(), 1).expect("regMr");
        // A few complete messages.
        for _ in 0..4 {
            let r = plugin::irecv(recv, &[rbuf.as_mut_ptr().cast()], &[rbuf.len()], &[1], &[rmr]).expect("irecv");
            let mut s: *mut c_void = std::ptr::null_mut();
            let deadline = Instant::now() + Duration::from_secs(60);
            while s.is_null() {
                assert!(Instant::now() < deadline, "no CTS");
                s = plugin::isend(send, sbuf.as_mut_ptr().cast(), 4096, 1, smr).expect("isend");
            }
            let (mut sd, mut rd) = (false, false);
            while !(sd && rd) {
                assert!(Instant::now() < deadline, "no completion");
                sd = sd || plugin::test(s, &mut [0; 8]).expect("test").is_some();
                rd = rd || plugin::test(r, &mut [0; 8]).expect("test").is_some();
            }
        }
        // Requests left outstanding on purpose: receives without sends.
        for _ in 0..3 {
            plugin::irecv(recv, &[rbuf.as_mut_ptr().cast()], &[rbuf.len()], &[1], &[rmr]).expect("irecv");
        }
        plugin::close_send(send).expect("closeSend");
        plugin::close_recv(recv).expect("closeRecv");
        // NCCL may deregister after closing the comm: the registration is still released.
        plugin::dereg_mr(send, smr).expect("deregMr after closeSend");
        plugin::dereg_mr(recv, rmr).expect("deregMr after closeRecv");
        plugin::dereg_mr(recv, rmr).expect_err("a second deregMr of one handle is an error");
        println!("round {round}: closed with 3 receives outstanding");
    }
    plugin::finalize(ctx).expect("finalize");
    println!("lifecycle: done");
}
