//! `regMr` with what cannot be registered: a range whose end wraps
//! around the address space, memory that is not mapped, or not writable (peers write into
//! registrations). Each is refused with an error at `regMr` — never another registration's
//! keys, never a SIGSEGV when a peer's data arrives later. Through the exported C table, in
//! a child process (soft fabric on loopback).

mod hostile_common;

use std::ffi::c_void;
use std::time::{Duration, Instant};

use hostile_common::abi::{Handle, Net};
use hostile_common::{in_child, is_child};
use ncclnet_types::result::INVALID_ARGUMENT;

const PAGE: usize = 4096;

/// A connected send and receive comm on device 0 (same thread, as `plugin_api` does).
fn comms(net: &Net) -> (Handle, Handle) {
    let (mut handle, listen) = net.listen(0);
    let (mut send, mut recv) = (None, None);
    let t0 = Instant::now();
    while send.is_none() || recv.is_none() {
        assert!(t0.elapsed() < Duration::from_secs(60), "set-up did not finish");
        if send.is_none() {
            send = net.connect(0, &mut handle).expect("connect");
        }
        if recv.is_none() {
            recv = net.accept(listen).expect("accept");
        }
    }
    net.close_listen(listen);
    (send.unwrap(), recv.unwrap())
}

/// `n` fresh pages mapped with `prot`.
fn map(n: usize, prot: i32) -> u64 {
    // SAFETY: an anonymous private mapping at an address the kernel picks.
    let p = unsafe { libc::mmap(std::ptr::null_mut(), n * PAGE, prot, libc::MAP_PRIVATE | libc::MAP_ANONYMOUS, -1, 0) };
    assert_ne!(p, libc::MAP_FAILED);
    p as u64
}

/// Sends `size` bytes from a registered buffer of this process into `dst` (registered as
/// `dst_mh`): what a peer's data arriving there does.
fn receive_into(net: &Net, send: Handle, recv: Handle, dst: u64, dst_mh: Handle, size: usize) {
    let src = vec![0x42u8; size];
    let smh = net.reg_mr(send, src.as_ptr() as u64, size).expect("regMr of the source");
    let t0 = Instant::now();
    let rreq = loop {
        if let Some(r) = net.irecv(recv, dst, size as i32, 1, dst_mh).expect("irecv") {
            break r;
        }
    };
    let sreq = loop {
        assert!(t0.elapsed() < Duration::from_secs(60));
        if let Some(r) = net.isend(send, src.as_ptr() as u64, size as i32, 1, smh).expect("isend") {
            break r;
        }
        let _ = net.test(rreq);
    };
    let (mut sd, mut rd) = (None, None);
    while sd.is_none() || rd.is_none() {
        assert!(t0.elapsed() < Duration::from_secs(60));
        if sd.is_none() {
            sd = net.test(sreq).expect("test send");
        }
        if rd.is_none() {
            rd = net.test(rreq).expect("test recv");
        }
    }
}

#[test]
fn ranges_that_wrap_are_refused_not_given_another_registrations_keys() {
    if !is_child() {
        in_child("ranges_that_wrap_are_refused_not_given_another_registrations_keys", &[]);
        return;
    }
    let net = Net::init();
    let (send, recv) = comms(&net);
    let buf = vec![0u8; 4 * PAGE];
    let data = buf.as_ptr() as u64;
    // A real registration first: the cache then has an entry whose keys a wrapped range
    // must not get.
    let good = net.reg_mr(recv, data, buf.len()).expect("regMr of a real buffer");
    for (what, addr, size) in [
        ("regMr(buf, SIZE_MAX)", data, usize::MAX),
        ("regMr(-4096, 8192)", 4096u64.wrapping_neg(), 8192),
        ("regMr(buf, 2^63)", data, 1usize << 63),
        ("regMr(NULL, 8)", 0, 8),
    ] {
        match net.reg_mr(recv, addr, size) {
            Err(code) => assert_eq!(code, INVALID_ARGUMENT, "{what}"),
            Ok(_) => panic!("{what} succeeded"),
        }
    }
    // An empty registration is fine (NCCL may register an empty buffer), and costs nothing.
    let empty = net.reg_mr(recv, data, 0).expect("regMr of 0 bytes");
    net.dereg_mr(recv, empty).unwrap();
    receive_into(&net, send, recv, data, good, 3 * PAGE + 5);
    assert!(buf[..3 * PAGE + 5].iter().all(|&b| b == 0x42));
    net.dereg_mr(recv, good).unwrap();
}

#[test]
fn memory_that_is_not_mapped_writable_is_refused_at_registration() {
    if !is_child() {
        in_child("memory_that_is_not_mapped_writable_is_refused_at_registration", &[]);
        return;
    }
    let net = Net::init();
    let (send, recv) = comms(&net);
    let read_only = map(2, libc::PROT_READ);
    let none = map(2, libc::PROT_NONE);
    for (what, addr, size) in [("a read-only mapping", read_only + 100, PAGE), ("a PROT_NONE mapping", none, 64)] {
        refused(&net, send, recv, what, addr, size);
    }
    // An unmapped page is a hole another thread's mmap may fill at any moment (the plugin's
    // own threads allocate): a registration that succeeded over a hole that is no longer
    // one was right to, and the case is made again with a fresh hole.
    for attempt in 0.. {
        assert!(attempt < 20, "another thread's mappings kept filling the hole");
        let hole = map(3, libc::PROT_READ | libc::PROT_WRITE);
        unmap(hole + PAGE as u64); // the middle page
        let tail = map(4, libc::PROT_READ | libc::PROT_WRITE);
        unmap(tail + 3 * PAGE as u64); // the last page
        let mut redo = false;
        for (what, addr, size, gap) in [
            ("a range with an unmapped page in it", hole + 8, 2 * PAGE, hole + PAGE as u64),
            ("a range running off the end of a mapping", tail + 2 * PAGE as u64, 2 * PAGE, tail + 3 * PAGE as u64),
        ] {
            match net.reg_mr(recv, addr, size) {
                Err(code) => assert_eq!(code, INVALID_ARGUMENT, "{what}"),
                Ok(mh) if !is_unmapped(gap) => {
                    net.dereg_mr(recv, mh).unwrap();
                    redo = true;
                }
                Ok(mh) => {
                    receive_into(&net, send, recv, addr, mh, size);
                    panic!("{what} was registered (and survived a receive into it)");
                }
            }
        }
        if !redo {
            // The writable parts of the same mappings register.
            let ok = net.reg_mr(recv, hole, PAGE).expect("the mapped page before the hole");
            net.dereg_mr(recv, ok).unwrap();
            let ok = net.reg_mr(recv, tail, 3 * PAGE).expect("the mapped pages before the end");
            net.dereg_mr(recv, ok).unwrap();
            break;
        }
    }
}

/// `regMr(addr, size)` fails with ncclInvalidArgument; a success is tried for real first.
fn refused(net: &Net, send: Handle, recv: Handle, what: &str, addr: u64, size: usize) {
    match net.reg_mr(recv, addr, size) {
        Err(code) => assert_eq!(code, INVALID_ARGUMENT, "{what}"),
        Ok(mh) => {
            // Registered, the peer's data arriving there would kill the process.
            receive_into(net, send, recv, addr, mh, size);
            panic!("{what} was registered (and survived a receive into it)");
        }
    }
}

/// Unmaps the page at `addr` (of a mapping this test made).
fn unmap(addr: u64) {
    // SAFETY: a page of a mapping this test just made and nothing else uses.
    assert_eq!(unsafe { libc::munmap(addr as *mut c_void, PAGE) }, 0);
}

/// Whether the page at `addr` is mapped by nobody (msync answers ENOMEM for such a page).
fn is_unmapped(addr: u64) -> bool {
    // SAFETY: msync only inspects the mapping at this page-aligned address; nothing is
    // read or written.
    let r = unsafe { libc::msync(addr as *mut c_void, PAGE, libc::MS_ASYNC) };
    r != 0 && std::io::Error::last_os_error().raw_os_error() == Some(libc::ENOMEM)
}
