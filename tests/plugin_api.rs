//! The plugin's Rust API (the one implementation behind every ABI version) driven in one
//! process, the way NCCL drives it: same-thread listen → connect → accept, registration,
//! isend / irecv / test loops, bad handles, close. Each scenario has a configuration of its
//! own: a plugin instance of its own in this process (`common::Instance`), or, for the scenarios
//! that reach the plugin through its exported C functions (which serve the process's one
//! instance, configured from the environment once), a child process of this test binary.

use std::time::{Duration, Instant};

use mpib::abi::query::mpib_device_rails;
use mpib::abi::stats::mpib_dump_state;
use mpib::fabric::MemTypes;
use mpib::plugin::{AbiVersion, BufArg, CommHandle, MemHandle, Process, RequestHandle};
use ncclnet_types::mpib::{MPIB_LINK_TCP, mpib_rail_info_t};
use ncclnet_types::result;

mod common;

use common::{Instance, child_output, in_child, is_child};

/// Connects a send and a receive comm on device 0 of `p` (same thread, non-blocking calls).
fn pair(p: &Process, abi: AbiVersion) -> (CommHandle, CommHandle) {
    pair_on(p, abi, 0)
}

/// Connects a send and a receive comm on device `dev` of `p`.
fn pair_on(p: &Process, abi: AbiVersion, dev: i32) -> (CommHandle, CommHandle) {
    let mut handle = [0u8; 128];
    let listen = p.listen(abi, None, dev, &mut handle).expect("listen");
    let (mut send, mut recv) = (None, None);
    let deadline = Instant::now() + Duration::from_secs(20);
    loop {
        assert!(Instant::now() < deadline, "connect/accept did not finish");
        if send.is_none() {
            send = p.connect(abi, None, dev, &mut handle, None).expect("connect");
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

/// `irecv` of one buffer of `size` bytes at `addr`, tag `tag`, registered as `mh`.
fn irecv1(
    p: &Process,
    comm: CommHandle,
    addr: *const u8,
    size: usize,
    tag: i32,
    mh: MemHandle,
) -> mpib::Result<Option<RequestHandle>> {
    p.irecv(comm, 1, |_| Ok(BufArg { addr: addr as u64, size, tag, mh: Some(mh) }))
}

fn pattern(seed: u64, len: usize) -> Vec<u8> {
    (0..len).map(|i| (seed.wrapping_mul(31).wrapping_add(i as u64 * 7) >> 1) as u8).collect()
}

/// Sends `sizes` one message at a time, checking every byte and the reported sizes.
fn exchange(p: &Process, send: CommHandle, recv: CommHandle, sizes: &[usize]) {
    let max = sizes.iter().copied().max().unwrap_or(1).max(1);
    let mut sbuf = vec![0u8; max];
    let mut rbuf = vec![0u8; max + 64];
    let smr = p.reg_mr(send, sbuf.as_ptr() as u64, sbuf.len(), MemTypes::HOST).expect("regMr send");
    let rmr = p.reg_mr(recv, rbuf.as_ptr() as u64, rbuf.len(), MemTypes::HOST).expect("regMr recv");
    for (i, &len) in sizes.iter().enumerate() {
        let data = pattern(i as u64, len);
        sbuf[..len].copy_from_slice(&data);
        rbuf.fill(0xee);
        let rreq = irecv1(p, recv, rbuf.as_ptr(), max + 64, 3, rmr).expect("irecv").expect("a request");
        let deadline = Instant::now() + Duration::from_secs(20);
        let sreq: RequestHandle = loop {
            assert!(Instant::now() < deadline, "isend never found the CTS");
            if let Some(r) = p.isend(send, sbuf.as_ptr() as u64, len, 3, smr).expect("isend") {
                break r;
            }
            let _ = p.test(rreq, &mut [0; 8]).expect("test recv");
        };
        let (mut sd, mut rd) = (None, None);
        let (mut ssz, mut rsz) = ([u64::MAX; 8], [u64::MAX; 8]);
        while sd.is_none() || rd.is_none() {
            assert!(Instant::now() < deadline, "message {i} of {len} bytes did not complete");
            if sd.is_none() {
                sd = p.test(sreq, &mut ssz).expect("test send");
            }
            if rd.is_none() {
                rd = p.test(rreq, &mut rsz).expect("test recv");
            }
        }
        assert_eq!((sd, ssz[0]), (Some(1), len as u64), "send size");
        assert_eq!((rd, rsz[0]), (Some(1), len as u64), "received size");
        assert_eq!(&rbuf[..len], &data[..], "payload of message {i} ({len} bytes)");
        assert!(rbuf[len..].iter().all(|&b| b == 0xee), "bytes past message {i} untouched");
        // The completed request handle is dead now.
        assert!(p.test(sreq, &mut ssz).is_err(), "testing a completed request is an error");
    }
    p.dereg_mr(send, Some(smr)).expect("deregMr");
    p.dereg_mr(recv, Some(rmr)).expect("deregMr");
}

#[test]
fn inproc_round_trips_every_size() {
    let p = Instance::new(&[("MPIB_FABRIC", "inproc"), ("MPIB_SPLIT", "50")]);
    p.init(AbiVersion::V12).expect("init");
    assert_eq!(p.device_count(AbiVersion::V12).unwrap(), 1);
    let (send, recv) = pair(&p, AbiVersion::V12);
    exchange(&p, send, recv, &[0, 1, 127, 128, 129, 4096, (1 << 20) + 3, 8]);
    let c = p.comm_counters(send).unwrap();
    assert_eq!(c[0].zero_byte_imm + c[1].zero_byte_imm, 0);
    assert!(c[0].bytes > 0 && c[1].bytes > 0, "a 50 % split uses both rails: {c:?}");
    p.close_send(send).unwrap();
    p.close_recv(recv).unwrap();
    assert!(p.close_send(send).is_err(), "a closed comm's handle is stale");
}

#[test]
fn nics_fused_by_make_vdevice_carry_both_rails() {
    let p = Instance::new(&[("MPIB_FABRIC", "inproc"), ("MPIB_NCCL_DEVICES", "nics"), ("MPIB_SPLIT", "50")]);
    // v12 sees the two NICs and is told to fuse them; v8 sees the pair.
    let env = p.init(AbiVersion::V12).expect("init").expect("NCCL_NET_FORCE_MERGE");
    assert_eq!((env.name, env.value.as_str()), ("NCCL_NET_FORCE_MERGE", "inproc-sout:1,inproc-sup:1"));
    assert_eq!(p.init(AbiVersion::V8).expect("init"), None, "v8 cannot fuse");
    assert_eq!((p.device_count(AbiVersion::V12).unwrap(), p.device_count(AbiVersion::V8).unwrap()), (2, 1));
    let fused = p.make_vdevice(&[0, 1]).expect("makeVDevice");
    assert_eq!(fused, 2);
    let props = p.properties(AbiVersion::V12, fused).unwrap();
    assert_eq!((props.name.to_str().unwrap(), props.vdevs.as_slice()), ("inproc-sout+inproc-sup", &[0, 1][..]));
    assert!(p.make_vdevice(&[0, 0]).is_err());
    // The fused device carries both rails; a NIC used alone carries both on itself.
    let (send, recv) = pair_on(&p, AbiVersion::V12, fused);
    exchange(&p, send, recv, &[0, 1, 4096, (1 << 20) + 3]);
    let c = p.comm_counters(send).unwrap();
    assert!(c[0].bytes > 0 && c[1].bytes > 0, "a 50 % split uses both rails: {c:?}");
    p.close_send(send).unwrap();
    p.close_recv(recv).unwrap();
    let (send, recv) = pair_on(&p, AbiVersion::V12, 1);
    exchange(&p, send, recv, &[8, 65536]);
    p.close_send(send).unwrap();
    p.close_recv(recv).unwrap();
    assert_eq!(p.properties(AbiVersion::V12, 1).unwrap().name.to_str().unwrap(), "inproc-sup");
}

#[test]
fn nccl_starts_afresh_after_the_last_finalize() {
    let p = Instance::new(&[("MPIB_FABRIC", "inproc"), ("MPIB_NCCL_DEVICES", "nics")]);
    // NCCL 2.28+ unload the plugin with its last communicator and count its NICs again at
    // the next: the devices makeVDevice made must be gone by then.
    p.init(AbiVersion::V12).expect("init");
    let ctx = p.new_context(1, None).expect("context");
    assert_eq!(p.make_vdevice(&[0, 1]).unwrap(), 2);
    assert_eq!(p.device_count(AbiVersion::V12).unwrap(), 3);
    p.finalize(ctx).unwrap();
    p.init(AbiVersion::V12).expect("init again");
    assert_eq!(p.device_count(AbiVersion::V12).unwrap(), 2);
    assert_eq!(p.make_vdevice(&[1, 0]).unwrap(), 2);
}

#[test]
fn tcp_soft_fabric_round_trips() {
    let p = Instance::new(&[
        ("MPIB_FABRIC", "soft"),
        ("MPIB_SOFT_SOUT_ADDR", "127.0.0.1"),
        ("MPIB_SOFT_SUP_ADDR", "127.0.0.1"),
    ]);
    p.init(AbiVersion::V8).expect("init");
    let (send, recv) = pair(&p, AbiVersion::V8);
    exchange(&p, send, recv, &[0, 1, 129, 65536, 4 << 20]);
    p.close_send(send).unwrap();
    p.close_recv(recv).unwrap();
}

#[test]
fn bad_handles_are_errors_not_crashes() {
    let p = Instance::new(&[("MPIB_FABRIC", "inproc")]);
    p.init(AbiVersion::V12).expect("init");
    let junk = 0xdead_beef_u64;
    assert!(p.test(RequestHandle(junk), &mut [0; 8]).is_err());
    assert!(p.test(RequestHandle(0), &mut [0; 8]).is_err());
    assert!(p.isend(CommHandle(junk), junk, 8, 0, MemHandle(junk)).is_err());
    assert!(p.close_recv(CommHandle(junk)).is_err());
    let (send, recv) = pair(&p, AbiVersion::V12);
    // A receive comm is not a send comm.
    let e = p.isend(recv, junk, 8, 0, MemHandle(junk)).unwrap_err();
    assert!(e.msg().contains("memory handle") || e.msg().contains("not a"), "{}", e.msg());
    assert!(p.properties(AbiVersion::V12, 7).is_err());
    // A released registration is an error at once, even right after calls that used it (a
    // comm's memo of its last registration must not outlive the release).
    let mem = vec![0u8; 4096];
    let data = mem.as_ptr();
    let (smh, rmh) = (
        p.reg_mr(send, data as u64, 4096, MemTypes::HOST).unwrap(),
        p.reg_mr(recv, data as u64, 4096, MemTypes::HOST).unwrap(),
    );
    assert!(p.isend(send, data as u64, 8, 0, smh).is_ok());
    assert!(irecv1(&p, recv, data, 8, 0, rmh).is_ok());
    p.dereg_mr(send, Some(smh)).unwrap();
    p.dereg_mr(recv, Some(rmh)).unwrap();
    let e = p.isend(send, data as u64, 8, 0, smh).unwrap_err();
    assert!(e.msg().contains("stale"), "{}", e.msg());
    let e = irecv1(&p, recv, data, 8, 0, rmh).unwrap_err();
    assert!(e.msg().contains("stale"), "{}", e.msg());
    p.close_send(send).unwrap();
    p.close_recv(recv).unwrap();
}

/// `mpib_device_rails` of device `dev` through ABI `version`: the result code and the two
/// rails' names and link layers.
fn device_rails(version: i32, dev: i32) -> (i32, [mpib_rail_info_t; 2]) {
    let mut out = [mpib_rail_info_t::default(); 2];
    // SAFETY: room for two whole entries.
    let rc = unsafe { mpib_device_rails(version, dev, out.as_mut_ptr(), std::mem::size_of::<mpib_rail_info_t>()) };
    (rc, out)
}

fn c_str(s: &[std::ffi::c_char]) -> String {
    let bytes: Vec<u8> = s.iter().take_while(|&&c| c != 0).map(|&c| c as u8).collect();
    String::from_utf8(bytes).unwrap()
}

#[test]
fn device_rails_name_each_devices_nics_per_abi_version() {
    if !is_child() {
        return in_child(
            "device_rails_name_each_devices_nics_per_abi_version",
            &[
                ("MPIB_FABRIC", "soft"),
                ("MPIB_SOFT_SOUT_ADDR", "127.0.0.1"),
                ("MPIB_SOFT_SUP_ADDR", "127.0.0.1"),
                ("MPIB_NCCL_DEVICES", "nics"),
            ],
        );
    }
    assert_eq!(device_rails(8, 0).0, result::INVALID_USAGE, "before init");
    mpib::abi::init_process(AbiVersion::V12).expect("init");
    // v8: device 0 is the rail pair.
    let (rc, r) = device_rails(8, 0);
    assert_eq!(rc, result::SUCCESS);
    assert_eq!([c_str(&r[0].name), c_str(&r[1].name)], ["soft-sout", "soft-sup"]);
    for x in &r {
        assert_eq!((x.port, x.link_layer, x.gid_index, x.lid), (1, MPIB_LINK_TCP, -1, 0));
        assert!(c_str(&x.address).starts_with("127.0.0.1:"), "{}", c_str(&x.address));
        assert_eq!((x.speed_mbps, x.speed_known), (10_000, 0), "loopback: a nominal speed");
    }
    assert_ne!(c_str(&r[0].address), c_str(&r[1].address), "each rail listens on its own port");
    // v12: the two NICs, each used alone carrying both rails, then the pair NCCL fuses.
    let (rc, sup) = device_rails(12, 1);
    assert_eq!(rc, result::SUCCESS);
    assert_eq!([c_str(&sup[0].name), c_str(&sup[1].name)], ["soft-sup", "soft-sup"]);
    assert_eq!(mpib::abi::process().make_vdevice(&[0, 1]).unwrap(), 2);
    let (rc, fused) = device_rails(12, 2);
    assert_eq!((rc, [c_str(&fused[0].name), c_str(&fused[1].name)]), (0, ["soft-sout".into(), "soft-sup".into()]));
    // A caller built against a shorter struct: only its prefix is written.
    let mut short = [0xffu8; 2 * 68 + 1];
    // SAFETY: 2 × 68 writable bytes and a sentinel.
    let rc = unsafe { mpib_device_rails(8, 0, short.as_mut_ptr().cast(), 68) };
    assert_eq!((rc, &short[68..77]), (result::SUCCESS, &b"soft-sup\0"[..]), "the stride is the caller's size");
    assert_eq!(short[2 * 68], 0xff, "nothing past 2 × 68 bytes");
    // Bad arguments are errors, not crashes.
    assert_eq!(device_rails(5, 0).0, result::INVALID_ARGUMENT);
    assert_eq!(device_rails(8, 1).0, result::INVALID_ARGUMENT, "v8 has one device");
    assert_eq!(device_rails(12, -1).0, result::INVALID_ARGUMENT);
    // SAFETY: NULL is refused before any write.
    assert_eq!(unsafe { mpib_device_rails(8, 0, std::ptr::null_mut(), 424) }, result::INVALID_ARGUMENT);
}

/// A receive whose sender never sends: once it has waited `MPIB_HANG_REPORT_MS` (200 ms
/// here) while NCCL tests it, one hang report names the connection's place and the slot;
/// `mpib_dump_state` returns the same state for both connections, in the caller's buffer
/// (cut to its size, with the size needed).
#[test]
fn a_stuck_receive_is_reported_once_and_mpib_dump_state_returns_the_state() {
    if !is_child() {
        let env = [
            ("MPIB_FABRIC", "soft"),
            ("MPIB_SOFT_SOUT_ADDR", "127.0.0.1"),
            ("MPIB_SOFT_SUP_ADDR", "127.0.0.1"),
            ("MPIB_HANG_REPORT_MS", "200"),
            ("RUST_LOG", "warn"),
        ];
        let out = child_output("a_stuck_receive_is_reported_once_and_mpib_dump_state_returns_the_state", &env);
        let reports: Vec<&str> = out.lines().filter(|l| l.contains("hang report")).collect();
        assert_eq!(reports.len(), 1, "one report for the stuck receive:\n{out}");
        let r = reports[0];
        assert!(r.contains("a request (slot 0) has waited") && r.contains("recv comm"), "{r}");
        assert!(r.contains("SOUT soft-sout:1 127.0.0.1:") && r.contains("; SUP soft-sup:1 127.0.0.1:"), "{r}");
        return;
    }
    mpib::abi::logger::install(); // as every C entry point does: the report is a log line
    mpib::abi::init_process(AbiVersion::V8).expect("init");
    let (send, recv) = pair(mpib::abi::process(), AbiVersion::V8);
    let rbuf = vec![0u8; 4096];
    let rmr = mpib::abi::process().reg_mr(recv, rbuf.as_ptr() as u64, rbuf.len(), MemTypes::HOST).expect("regMr");
    let rreq = irecv1(mpib::abi::process(), recv, rbuf.as_ptr(), 4096, 3, rmr).expect("irecv").expect("a request");
    // NCCL's proxy tests the receive in a loop; the sender never sends.
    let until = Instant::now() + Duration::from_millis(700);
    while Instant::now() < until {
        assert_eq!(mpib::abi::process().test(rreq, &mut [0; 8]).expect("test"), None);
        std::thread::sleep(Duration::from_millis(1));
    }
    let mut needed = 0usize;
    let mut buf = vec![0 as std::ffi::c_char; 64 * 1024];
    // SAFETY: `buf` has `buf.len()` writable bytes; `needed` is writable.
    let rc = unsafe { mpib_dump_state(buf.as_mut_ptr(), buf.len(), &mut needed) };
    assert_eq!(rc, result::SUCCESS);
    let text = c_str(&buf);
    assert_eq!(needed, text.len() + 1, "{text}");
    assert!(text.starts_with("mpib state: 2 connections\n"), "{text}");
    assert!(text.contains("recv comm:") && text.contains("send comm:"), "{text}");
    assert!(text.contains("slot 0 (receive 0): 1 buffers, 4096 bytes; no data yet: waiting for the sender"), "{text}");
    assert!(text.contains("seen waiting for "), "{text}");
    assert!(text.contains("waiting for the receiver's CTS") || text.contains("0 sends NCCL waits on"), "{text}");
    // Cut to a short buffer, NUL-terminated, still saying how much it needs.
    let mut short = [0x55 as std::ffi::c_char; 16];
    let mut again = 0usize;
    // SAFETY: as above, 16 bytes.
    assert_eq!(unsafe { mpib_dump_state(short.as_mut_ptr(), short.len(), &mut again) }, result::SUCCESS);
    assert_eq!((c_str(&short), short[15]), ("mpib state: 2 c".to_string(), 0));
    assert!(again >= needed - 64, "{again} vs {needed}");
    // NULL: logged.
    // SAFETY: NULL buffer and NULL `needed` are allowed.
    assert_eq!(unsafe { mpib_dump_state(std::ptr::null_mut(), 0, std::ptr::null_mut()) }, result::SUCCESS);
    mpib::abi::process().dereg_mr(recv, Some(rmr)).expect("deregMr");
    mpib::abi::process().close_send(send).unwrap();
    mpib::abi::process().close_recv(recv).unwrap();
}
