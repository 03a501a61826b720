//! Device tests of the verbs provider: real traffic through libibverbs between two active
//! ports. They are `#[ignore]`d because they need RDMA ports; CI runs them in a Soft-RoCE
//! guest (`ci/rxe-test.sh`, suite `verbs-device`). On any RDMA host:
//!
//! ```text
//! MPIB_TEST_DEV0=mlx5_0 MPIB_TEST_DEV1=mlx5_1 cargo test --test verbs_device -- --ignored --test-threads=1
//! ```
//! Ports: `MPIB_TEST_DEV0/1` (`device[:port]`), else the guest's `RXE_DEV0/1`. The expected
//! automatic GID indices `MPIB_TEST_GID_IDX0/1` (else `RXE_GID_IDX0/1`) are optional.
//! `port_down_is_seen_and_skipped` takes a link down and up again and runs only where
//! `MPIB_TEST_LINK_TOGGLE=1` names a throw-away machine (the guest). `peer_child` and
//! `auto_child` are helper processes (they do nothing when run on their own).

mod fabric_checks;

use std::process::Command;
use std::sync::Arc;
use std::time::{Duration, Instant};

use fabric_checks as checks;
use mpib::config::Config;
use mpib::fabric::verbs::{self, GidRule, VerbsDevice, VerbsOptions};
use mpib::fabric::{ConnectParams, Device, LinkLayer, MemTypes, QueuePair, Timestamps, WcOpcode, WcStatus, WrOpcode};
use mpib::plugin::{AbiVersion, discover};

fn env_any(names: &[String]) -> Option<String> {
    names.iter().find_map(|n| std::env::var(n).ok().filter(|v| !v.is_empty()))
}

/// (device, port) of test port `i` (0 or 1).
fn port_spec(i: usize) -> (String, Option<u8>) {
    let v = env_any(&[format!("MPIB_TEST_DEV{i}"), format!("RXE_DEV{i}")]).unwrap_or_else(|| {
        panic!("set MPIB_TEST_DEV{i}=device[:port] (or run in the Soft-RoCE guest: ci/rxe-test.sh)")
    });
    match v.split_once(':') {
        Some((d, p)) => (d.to_string(), Some(p.parse().expect("port number"))),
        None => (v, None),
    }
}

fn expected_gid_index(i: usize) -> Option<u8> {
    env_any(&[format!("MPIB_TEST_GID_IDX{i}"), format!("RXE_GID_IDX{i}")]).map(|v| v.parse().expect("GID index"))
}

fn open(i: usize) -> Arc<VerbsDevice> {
    mpib::abi::logger::install();
    let (d, p) = port_spec(i);
    let opts = VerbsOptions {
        device: d.clone(),
        port: p,
        gid: GidRule::default(),
        pkey_index: 0,
        relaxed_ordering: true,
        dmabuf: true,
    };
    Arc::new(VerbsDevice::open(&opts).unwrap_or_else(|e| panic!("open {d}: {e}")))
}

fn config(vars: &[(&str, &str)]) -> Config {
    Config::from_vars(vars.iter().copied()).expect("valid test configuration")
}

// ---- no device needed -------------------------------------------------------------------

#[test]
fn unavailable_reason_agrees_with_verbs_pairs() {
    match verbs::unavailable_reason() {
        Some(why) => {
            let e = discover::verbs_pairs(&Config::default()).err().expect("unavailable, yet pairs opened");
            assert!(e.msg().contains(&why), "{e} does not say {why}");
        }
        None => assert!(!discover::verbs_pairs(&Config::default()).expect("usable, yet no pairs").is_empty()),
    }
}

// ---- device tests -----------------------------------------------------------------------

#[test]
#[ignore = "needs two RDMA ports (MPIB_TEST_DEV0/1 or the Soft-RoCE guest)"]
fn write_then_read() {
    checks::write_then_read(&open(0), &open(1));
}

#[test]
#[ignore = "needs two RDMA ports (MPIB_TEST_DEV0/1 or the Soft-RoCE guest)"]
fn write_imm_through_srq() {
    checks::write_imm_through_srq(&open(0), &open(1));
}

#[test]
#[ignore = "needs two RDMA ports (MPIB_TEST_DEV0/1 or the Soft-RoCE guest)"]
fn write_imm_through_srq_with_extended_cqs() {
    let (d0, d1) = (open(0), open(1));
    let (ca, cb) = (d0.create_cq_extended(1024).expect("cq_ex"), d1.create_cq_extended(1024).expect("cq_ex"));
    assert!(ca.is_extended() && cb.is_extended());
    let (mut a, mut b) = (checks::End::with_cq(&d0, ca, false, 1 << 16), checks::End::with_cq(&d1, cb, true, 1 << 16));
    checks::write_imm_on(&mut a, &mut b);
    // Many completions, polled as they trickle in: every one exactly once, then nothing.
    let (rk, raddr) = (b.keys().rkey, b.addr(0));
    for i in 0..64 {
        a.qp.post_send(&[checks::wr(WrOpcode::Write, 100 + i, Some(a.sge(0, 256)), raddr, rk, 0, true)]).unwrap();
    }
    let got = checks::poll_until(&mut [&mut a.cq, &mut b.cq], &[64, 0]);
    assert_eq!(got[0].iter().map(|c| c.wr_id).collect::<Vec<_>>(), (100..164).collect::<Vec<u64>>());
    assert!(got[0].iter().all(|c| c.status == WcStatus::Success && c.opcode == WcOpcode::RdmaWrite));
    checks::assert_quiet(&mut [&mut a.cq, &mut b.cq], Duration::from_millis(200), "after the last completion");
}

/// Rail failover's fence on verbs: moving an SRQ-attached responder to the error state
/// (`to_error`) returns at once (it never sleeps in the caller's thread); `fence_settled`
/// says yes only once the device raised its `IBV_EVENT_QP_LAST_WQE_REACHED`, so the receives
/// it completed are final when the caller drains its CQ; a device that never raises it is
/// waited for once, for the bound, and not again; a second fence is a no-op; the WQEs still
/// on the SRQ complete nothing on the fenced side. (What the peer's later WRITEs do is the
/// peer's business: with the suites' retry count rxe retries them for ever.)
#[test]
#[ignore = "needs two RDMA ports (MPIB_TEST_DEV0/1 or the Soft-RoCE guest)"]
fn fence_settles_at_last_wqe_and_nothing_lands_after_it() {
    let (d0, d1) = (open(0), open(1));
    let (mut a, mut b) = (checks::End::new(&d0, false, 1 << 16), checks::End::new(&d1, true, 1 << 16));
    checks::write_imm_on(&mut a, &mut b);
    mpib::fabric::SharedRecvQueue::post_recv(b.srq.as_mut().unwrap(), 4).expect("post_recv");
    let before = d1.last_wqe_events();
    let t0 = Instant::now();
    b.qp.to_error().expect("fence");
    let returned = t0.elapsed();
    let settled = loop {
        if b.qp.fence_settled() {
            break t0.elapsed();
        }
        assert!(t0.elapsed() < Duration::from_secs(10), "the fence never settled");
        std::thread::sleep(Duration::from_millis(1));
    };
    eprintln!("fence: to_error returned after {returned:?}, settled after {settled:?}");
    if d1.last_wqe_missing() {
        // The device raised no event within the bound (Soft-RoCE on Linux 6.1): the fence
        // settled at the bound once and the device is marked, so no later fence waits.
        assert_eq!(d1.last_wqe_events(), before, "marked missing although the event came");
        assert!(settled >= Duration::from_millis(100), "gave up early: {settled:?}");
        let (mut p, mut c) = (checks::End::new(&d0, false, 4096), checks::End::new(&d1, true, 4096));
        checks::connect(&mut p, &mut c);
        c.qp.to_error().expect("fence on a marked device");
        assert!(c.qp.fence_settled(), "a marked device's fence settles at once");
    } else {
        assert_eq!(d1.last_wqe_events(), before + 1, "settled before LAST_WQE_REACHED ({settled:?})");
    }
    b.qp.to_error().expect("a second fence");
    assert!(b.qp.fence_settled(), "a second fence is a no-op");
    checks::assert_quiet(&mut [&mut b.cq], Duration::from_millis(200), "on the fenced side");
}

/// A chain `ibv_post_send` refuses part-way (the send queue full) says how many of its WRs
/// were posted, and exactly those complete (flushed, once the QP is moved to the error
/// state): what `QueuePair::post_send` promises.
#[test]
#[ignore = "needs two RDMA ports (MPIB_TEST_DEV0/1 or the Soft-RoCE guest)"]
fn a_chain_refused_part_way_says_what_was_posted() {
    let (d0, d1) = (open(0), open(1));
    let (mut a, mut b) = (checks::End::new(&d0, false, 1 << 16), checks::End::new(&d1, false, 1 << 16));
    checks::connect(&mut a, &mut b);
    // The responder refuses everything: the WRITEs stay in the send queue, retried (rxe
    // reads retry_cnt 7 as "for ever"), until the queue is full.
    b.qp.to_error().expect("fence b");
    let (rk, raddr) = (b.keys().rkey, b.addr(0));
    let chain: Vec<_> = (0..verbs::MAX_CHAIN as u64)
        .map(|i| checks::wr(WrOpcode::Write, i, Some(a.sge(0, 8)), raddr, rk, 0, true))
        .collect();
    let mut posted = 0usize;
    let e = loop {
        match a.qp.post_send(&chain) {
            Ok(()) => posted += chain.len(),
            Err(e) => break e,
        }
        assert!(posted < 1 << 16, "the send queue never filled");
    };
    let msg = e.msg();
    let prefix = if msg.contains("none of them was posted") {
        0
    } else {
        let at = msg.find("WRs 0-").unwrap_or_else(|| panic!("the error does not say what was posted: {msg}"));
        let end: String = msg[at + 6..].chars().take_while(|c| c.is_ascii_digit()).collect();
        end.parse::<usize>().expect("a WR number") + 1
    };
    println!("{}: send queue full after {posted} + {prefix} WRs: {msg}", d0.attrs().name);
    assert!(msg.contains(&format!("a chain of {} WRs", chain.len())), "{msg}");
    a.qp.to_error().expect("fence a");
    let got = checks::poll_until(&mut [&mut a.cq], &[posted + prefix]);
    assert!(got[0].iter().all(|c| c.status == WcStatus::Flushed || c.status == WcStatus::Success), "{:?}", got[0]);
    checks::assert_quiet(&mut [&mut a.cq], Duration::from_millis(200), "beyond the WRs the error said were posted");
}

#[test]
#[ignore = "needs two RDMA ports (MPIB_TEST_DEV0/1 or the Soft-RoCE guest)"]
fn many_in_flight() {
    checks::many_in_flight(&open(0), &open(1));
}

#[test]
#[ignore = "needs two RDMA ports (MPIB_TEST_DEV0/1 or the Soft-RoCE guest)"]
fn shared_cq_grows_and_keeps_its_completions() {
    checks::shared_cq_grows_and_keeps_its_completions(&open(0), &open(1));
}

#[test]
#[ignore = "needs two RDMA ports (MPIB_TEST_DEV0/1 or the Soft-RoCE guest)"]
fn drain_marker_comes_last() {
    checks::drain_marker_comes_last(&open(0), &open(1));
}

#[test]
#[ignore = "needs two RDMA ports (MPIB_TEST_DEV0/1 or the Soft-RoCE guest)"]
fn bad_rkey_is_a_remote_access_error() {
    checks::bad_rkey_is_a_remote_access_error(&open(0), &open(1));
}

#[test]
#[ignore = "needs two RDMA ports (MPIB_TEST_DEV0/1 or the Soft-RoCE guest)"]
fn registrations_are_exact() {
    checks::bounds::registrations_are_exact(&open(0), &open(1));
}

#[test]
#[ignore = "needs two RDMA ports (MPIB_TEST_DEV0/1 or the Soft-RoCE guest)"]
fn unwritable_memory_is_refused() {
    checks::bounds::unwritable_memory_is_refused(&open(0));
}

#[test]
#[ignore = "needs two RDMA ports (MPIB_TEST_DEV0/1 or the Soft-RoCE guest)"]
fn rnr_with_empty_srq_recovers() {
    checks::rnr_with_empty_srq_recovers(&open(0), &open(1));
}

#[test]
#[ignore = "needs two RDMA ports (MPIB_TEST_DEV0/1 or the Soft-RoCE guest)"]
fn loopback_qp() {
    checks::loopback_qp(&open(0));
    checks::loopback_qp(&open(1));
}

#[test]
#[ignore = "needs two RDMA ports (MPIB_TEST_DEV0/1 or the Soft-RoCE guest)"]
fn peer_killed_mid_transfer() {
    let child = child_procs::Program::this_test("peer_child").arg("--ignored");
    // 4.096 µs × 2^12 ≈ 17 ms ACK timeout, 2 retries: the error is due well under a second.
    let conn = ConnectParams { traffic_class: 0, service_level: 0, timeout: 12, retry_cnt: 2 };
    checks::peer_killed_mid_transfer(&open(0), child, conn, Duration::from_secs(20));
}

/// The second process of `peer_killed_mid_transfer` (fails when run on its own).
#[test]
#[ignore = "helper process of peer_killed_mid_transfer"]
fn peer_child() {
    child_procs::expect_test_child("peer_child");
    checks::peer_child(&open(1));
}

#[test]
#[ignore = "needs two RDMA ports (MPIB_TEST_DEV0/1 or the Soft-RoCE guest)"]
fn attributes_and_completion_timestamps() {
    let d = open(0);
    let a = d.attrs();
    assert!(a.mtu >= 256 && a.speed_mbps >= 2500 && a.max_qp > 0 && a.max_srq_wr > 0 && a.max_sge >= 2, "{a:?}");
    assert!(a.mem_types.contains(MemTypes::HOST), "{a:?}");
    if a.name.starts_with("rxe") {
        assert_eq!(a.link_layer, LinkLayer::Ethernet);
        assert_eq!(a.pci_path, None, "a virtual device has no PCI path");
        assert!(!a.mem_types.contains(MemTypes::DMABUF), "rxe has no DMA-BUF: {a:?}");
    }
    if let Some(p) = &a.pci_path {
        assert!(p.starts_with("/sys/devices/"), "{p}");
    }
    // Timestamps when the device has them; otherwise create_cq(.., Timestamps::Wanted) still works.
    let (mut x, mut y) = (
        checks::End::with_cq(&d, d.create_cq(64, Timestamps::Wanted).expect("cq"), false, 1 << 16),
        checks::End::with_cq(&d, d.create_cq(64, Timestamps::Wanted).expect("cq"), false, 1 << 16),
    );
    checks::connect(&mut x, &mut y);
    let t0 = std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).unwrap().as_nanos() as u64;
    for i in 0..2 {
        let w = checks::wr(WrOpcode::Write, i, Some(x.sge(0, 64)), y.addr(0), y.keys().rkey, 0, true);
        x.qp.post_send(&[w]).unwrap();
    }
    let got = checks::poll_until(&mut [&mut x.cq], &[2]);
    let ts: Vec<u64> = got[0].iter().map(|c| c.timestamp_ns).collect();
    println!("{}: completion timestamps {:?} (clock {})", a.name, ts, d.clock().describe());
    if a.completion_timestamps {
        assert!(ts[0] > 0 && ts[1] >= ts[0], "{ts:?}");
        if d.clock() == verbs::TsClock::Wallclock {
            assert!(ts[0] >= t0, "wallclock ns, not before the post: {ts:?} < {t0}");
        }
    } else {
        assert_eq!(ts, [0, 0], "no timestamps without device support");
    }
}

#[test]
#[ignore = "needs two RDMA ports (MPIB_TEST_DEV0/1 or the Soft-RoCE guest)"]
fn automatic_gid_choice() {
    for i in 0..2 {
        let d = open(i);
        if d.attrs().link_layer != LinkLayer::Ethernet {
            continue;
        }
        let g = d.gid();
        assert!(g[0] != 0xfe, "automatic choice is never link-local: {g:?}");
        if let Some(want) = expected_gid_index(i) {
            assert_eq!(d.gid_index(), want, "{}: the RoCE v2 IPv4-mapped GID", d.attrs().name);
            assert_eq!(&g[..12], &[0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0xff, 0xff], "IPv4-mapped");
        }
    }
}

#[test]
#[ignore = "needs two RDMA ports (MPIB_TEST_DEV0/1 or the Soft-RoCE guest)"]
fn gid_index_override_through_config() {
    let (d0, d1) = (port_spec(0).0, port_spec(1).0);
    let auto = open(0).gid_index();
    let idx = auto.to_string();
    let cfg = config(&[("MPIB_HCA_SOUT", &d0), ("MPIB_HCA_SUP", &d1), ("MPIB_GID_INDEX", &idx)]);
    let pairs = discover::verbs_pairs(&cfg).expect("verbs_pairs");
    assert_eq!(pairs.len(), 1);
    assert_eq!((pairs[0].sout.attrs().name.as_str(), pairs[0].sup.attrs().name.as_str()), (d0.as_str(), d1.as_str()));
    assert_eq!(pairs[0].sout.gid_index(), auto);
    assert_eq!(pairs[0].sup.gid_index(), auto);
    checks::write_imm_through_srq(&pairs[0].sout, &pairs[0].sup);
    if open(0).attrs().link_layer == LinkLayer::Ethernet {
        // Index 0 holds the link-local GID, never chosen automatically: the override wins.
        let cfg = config(&[("MPIB_HCA_SOUT", &d0), ("MPIB_HCA_SUP", &d0), ("MPIB_GID_INDEX", "0")]);
        let pairs = discover::verbs_pairs(&cfg).expect("MPIB_GID_INDEX=0");
        assert_eq!(pairs[0].sout.gid_index(), 0);
        assert!(Arc::ptr_eq(&pairs[0].sout, &pairs[0].sup), "one port in both rails is opened once");
        let cfg = config(&[("MPIB_HCA_SOUT", &d0), ("MPIB_HCA_SUP", &d1), ("MPIB_GID_INDEX", "200")]);
        let e = discover::verbs_pairs(&cfg).err().expect("an empty GID slot must be refused");
        assert!(e.msg().contains("MPIB_GID_INDEX=200") && e.msg().contains("no GID at index 200"), "{e}");
    }
}

#[test]
#[ignore = "needs two RDMA ports (MPIB_TEST_DEV0/1 or the Soft-RoCE guest)"]
fn pairing_through_config() {
    let (d0, d1) = (port_spec(0).0, port_spec(1).0);
    let pairs = discover::verbs_pairs(&Config::default()).expect("automatic pairing");
    assert!(!pairs.is_empty());
    if d0.starts_with("rxe") && d1.starts_with("rxe") {
        let names: Vec<(String, String)> =
            pairs.iter().map(|p| (p.sout.attrs().name.clone(), p.sup.attrs().name.clone())).collect();
        assert_eq!(names, [(d0.clone(), d1.clone())], "the guest's two rxe ports pair by name");
    }
    let e = discover::verbs_pairs(&config(&[("MPIB_HCA_SOUT", "nosuchdev"), ("MPIB_HCA_SUP", &d1)])).err().unwrap();
    assert!(
        e.msg().contains("MPIB_HCA_SOUT entry 0 (nosuchdev): device nosuchdev not found") && e.msg().contains(&d0),
        "{e}"
    );
    let e =
        discover::verbs_pairs(&config(&[("MPIB_HCA_SOUT", &d0), ("MPIB_HCA_SUP", &format!("{d1}:9"))])).err().unwrap();
    assert!(e.msg().contains("has no port 9"), "{e}");
}

/// Log records, kept for the memlock test (the plugin logs through the `log` crate).
struct Capture(std::sync::Mutex<Vec<(log::Level, String)>>);

impl log::Log for Capture {
    fn enabled(&self, _: &log::Metadata) -> bool {
        true
    }
    fn log(&self, r: &log::Record) {
        eprintln!("[{}] {}", r.level(), r.args());
        self.0.lock().unwrap().push((r.level(), r.args().to_string()));
    }
    fn flush(&self) {}
}

/// A job whose locked memory is limited (not root, `ulimit -l 64`): `init` WARNs with the
/// `ulimit -l` advice, and what fails for lack of it fails with an error that names the
/// limit, not a bare "Cannot allocate memory" and not a crash. `ci/rxe-test.sh memlock`
/// runs it as `nobody` with the limit set and the verbs environment given.
#[test]
#[ignore = "needs a locked-memory limit that applies: ci/rxe-test.sh memlock (MPIB_TEST_MEMLOCK=1)"]
fn a_small_memlock_limit_is_warned_and_named_in_errors() {
    if std::env::var("MPIB_TEST_MEMLOCK").as_deref() != Ok("1") {
        eprintln!("MPIB_TEST_MEMLOCK is not 1: skipped");
        return;
    }
    let m = verbs::memlock::locked_memory();
    assert_eq!(m.applies(), Some(64 << 10), "run without CAP_IPC_LOCK under `ulimit -l 64`: {m:?}");
    let capture: &'static Capture = Box::leak(Box::new(Capture(std::sync::Mutex::new(Vec::new()))));
    log::set_logger(capture).expect("the first logger");
    log::set_max_level(log::LevelFilter::Info);
    use mpib::plugin::AbiVersion;
    mpib::abi::init_process(AbiVersion::V8).expect("init works: only pinning needs the limit");
    let warned: Vec<String> = capture
        .0
        .lock()
        .unwrap()
        .iter()
        .filter(|(l, m)| *l == log::Level::Warn && m.contains("RLIMIT_MEMLOCK"))
        .map(|(_, m)| m.clone())
        .collect();
    assert_eq!(warned.len(), 1, "one WARN about the limit at init");
    assert!(warned[0].contains("64 KiB (ulimit -l 64)") && warned[0].contains("ulimit -l unlimited"), "{}", warned[0]);
    // A connection, then NCCL's buffer: whatever fails first says why.
    let named = |e: &mpib::Error| {
        let msg = e.msg();
        assert!(
            msg.contains("Cannot allocate memory") && msg.contains("RLIMIT_MEMLOCK) is 64 KiB"),
            "not named: {msg}"
        );
        println!("memlock: the error: {msg}");
    };
    let mut handle = [0u8; 128];
    let listen = mpib::abi::process().listen(AbiVersion::V8, None, 0, &mut handle).expect("listen");
    let (mut send, mut recv) = (None, None);
    let t0 = Instant::now();
    while send.is_none() || recv.is_none() {
        assert!(t0.elapsed() < checks::WAIT, "connect/accept did not finish");
        if send.is_none() {
            match mpib::abi::process().connect(AbiVersion::V8, None, 0, &mut handle, None) {
                Ok(s) => send = s,
                Err(e) => return named(&e),
            }
        }
        if recv.is_none() {
            match mpib::abi::process().accept(listen) {
                Ok(r) => recv = r,
                Err(e) => return named(&e),
            }
        }
    }
    let buf = vec![0u8; 4 << 20];
    let e = mpib::abi::process()
        .reg_mr(send.unwrap(), buf.as_ptr() as u64, buf.len(), MemTypes::HOST)
        .expect_err("4 MiB cannot be pinned under a 64 KiB limit");
    named(&e);
}

#[test]
#[ignore = "takes a link down: only on a throw-away machine with MPIB_TEST_LINK_TOGGLE=1 (the guest)"]
fn port_down_is_seen_and_skipped() {
    if std::env::var("MPIB_TEST_LINK_TOGGLE").as_deref() != Ok("1") {
        eprintln!("MPIB_TEST_LINK_TOGGLE is not 1: skipped");
        return;
    }
    let netdev = std::env::var("RXE_NETDEV1").expect("RXE_NETDEV1");
    let (d0, d1) = (port_spec(0).0, port_spec(1).0);
    let dev1 = open(1);
    let ip = |state: &str| {
        let ok = Command::new("/usr/bin/ip").args(["link", "set", &netdev, state]).status().unwrap().success();
        assert!(ok, "ip link set {netdev} {state}");
    };
    let wait_for = |what: &str, f: &dyn Fn() -> bool| {
        let t0 = Instant::now();
        while !f() {
            assert!(t0.elapsed() < checks::WAIT, "{what}");
            std::thread::sleep(Duration::from_millis(20));
        }
    };
    ip("down");
    wait_for("no PORT_ERR async event after the link went down", &|| !dev1.port_active());
    assert!(dev1.async_events() >= 1);
    let pairs = discover::verbs_pairs(&Config::default()).expect("the other port still pairs");
    let names: Vec<(String, String)> =
        pairs.iter().map(|p| (p.sout.attrs().name.clone(), p.sup.attrs().name.clone())).collect();
    assert_eq!(names, [(d0.clone(), d0.clone())], "the down port is skipped, the odd one rails with itself");
    let e = discover::verbs_pairs(&config(&[("MPIB_HCA_SOUT", &d0), ("MPIB_HCA_SUP", &d1)])).err().unwrap();
    assert!(e.msg().contains("no usable rail pair"), "{e}");
    ip("up");
    wait_for("no PORT_ACTIVE async event after the link came back", &|| dev1.port_active());
}

// ---- the rails' settings, applied: verbs_rail_settings/

mod verbs_rail_settings;

/// `MPIB_FABRIC=auto` on a host whose RDMA device fails set-up: `init` fails (NCCL then uses
/// its own transports) with a WARN naming the device; the soft fabric is not opened. The
/// failure: a GID range that the SUP port has no address in. Runs `auto_child` in a process
/// of its own (the configuration is read once per process).
#[test]
#[ignore = "needs two RDMA ports (MPIB_TEST_DEV0/1 or the Soft-RoCE guest)"]
fn auto_with_a_failing_device_fails_init_and_never_uses_tcp() {
    let (d0, d1) = (port_spec(0).0, port_spec(1).0);
    let child = child_procs::Program::this_test("auto_child")
        .arg("--ignored")
        .env("MPIB_FABRIC", "auto")
        .env("MPIB_HCA_SOUT", &d0)
        .env("MPIB_HCA_SUP", &d1)
        .env("MPIB_SUP_ADDR_RANGE", "198.51.100.0/24");
    let out = child_procs::Children::run(&child, Duration::from_secs(300)).expect("run the child");
    let (stdout, stderr) = (&out.stdout, &out.stderr);
    assert!(out.success(), "child failed ({:?}): {stdout}\n{stderr}", out.status);
    assert!(stdout.contains("auto_child: init failed:"), "init must fail: {stdout}\n{stderr}");
    let warn =
        stderr.lines().find(|l| l.contains("RDMA devices are present but could not be used")).unwrap_or_else(|| {
            panic!("no WARN: {stderr}");
        });
    assert!(warn.contains(&format!("{d1}:1")) && warn.contains("MPIB_SUP_ADDR_RANGE"), "{warn}");
    assert!(warn.contains("NCCL uses its own transports"), "{warn}");
    assert!(!stderr.contains("soft fabric:") && !stdout.contains("soft"), "the soft fabric was opened: {stderr}");
}

/// The child of `auto_with_a_failing_device_fails_init_and_never_uses_tcp` (fails when run
/// on its own).
#[test]
#[ignore = "helper process of auto_with_a_failing_device_fails_init_and_never_uses_tcp"]
fn auto_child() {
    child_procs::expect_test_child("auto_child");
    mpib::abi::logger::install();
    match mpib::abi::init_process(AbiVersion::V8) {
        Ok(_) => println!(
            "auto_child: init succeeded with {:?} device(s)",
            mpib::abi::process().device_count(AbiVersion::V8)
        ),
        Err(e) => {
            println!("auto_child: init failed: {e}");
            assert!(mpib::abi::process().device_count(AbiVersion::V8).is_err(), "no fabric is active");
        }
    }
}
