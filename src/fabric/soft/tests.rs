//! Tests of the soft fabric inside one process: in-process mode (deterministic, no
//! threads) and TCP over loopback between two devices of this process. Cross-process tests
//! are in `tests/soft_fabric.rs`.

use std::sync::Arc;
use std::time::{Duration, Instant};

use super::*;
use crate::fabric::{
    Access, Completion, CompletionQueue, ConnectParams, Device, FaultKind, QpCaps, QpInfo, QueuePair, SendWr, Sge,
    SharedRecvQueue, Timestamps, WcOpcode, WcStatus, WrOpcode,
};

mod direct;
mod fake;
mod faults;
mod fence;
mod links;

// The default liveness bound (~34 s without a byte from the peer): with 134 ms, a transfer
// fails with RetryExceeded whenever the process waits that long for a core (tests/soft_fabric.rs
// saw it with both cores busy elsewhere).
const PARAMS: ConnectParams = ConnectParams { traffic_class: 0, service_level: 0, timeout: 20, retry_cnt: 7 };
// 4.096 us * 2^14 * 2 = 134 ms: for the fake peer that never answers, whose test waits that long.
const SILENT_PEER_PARAMS: ConnectParams = ConnectParams { timeout: 14, retry_cnt: 1, ..PARAMS };
const GUARD: usize = 64;

/// Which kind of soft device a test runs on.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Mode {
    /// Over TCP on loopback.
    Tcp,
    /// Both ends in this process.
    Inproc,
}

/// Two devices of `mode` (as the plugin opens a rail pair).
fn devices(mode: Mode) -> (Arc<SoftDevice>, Arc<SoftDevice>) {
    let net = InprocNet::new();
    let opts = |name: &str| match mode {
        Mode::Tcp => SoftOptions { connect_timeout: Duration::from_secs(2), ..SoftOptions::tcp(name, LOOPBACK) },
        Mode::Inproc => SoftOptions { connect_timeout: Duration::from_secs(2), ..SoftOptions::inproc(name, &net) },
    };
    (Arc::new(open(&opts("t-sout")).unwrap()), Arc::new(open(&opts("t-sup")).unwrap()))
}

const LOOPBACK: std::net::IpAddr = std::net::IpAddr::V4(std::net::Ipv4Addr::LOCALHOST);

/// One end: a device, its CQ, SRQ, QP and a registered buffer with guard bytes around.
struct End {
    dev: Arc<SoftDevice>,
    cq: SoftCq,
    srq: SoftSrq,
    qp: SoftQp,
    buf: Vec<u8>,
    mr: Option<SoftMr>,
}

impl End {
    fn new(dev: Arc<SoftDevice>, len: usize, access: Access) -> End {
        let cq = dev.create_cq(1024, Timestamps::Off).unwrap();
        let srq = dev.create_srq(1024).unwrap();
        let qp = dev.create_qp(&cq, Some(&srq), QpCaps { max_send_wr: 256, max_inline: 256 }).unwrap();
        let mut buf = vec![0xAAu8; len + 2 * GUARD];
        let mr = dev.reg_mr(buf[GUARD..].as_mut_ptr(), len, access).unwrap();
        End { dev, cq, srq, qp, buf, mr: Some(mr) }
    }

    fn addr(&self) -> u64 {
        self.buf[GUARD..].as_ptr() as u64
    }

    fn key(&self) -> u32 {
        SoftDevice::mr_keys(self.mr.as_ref().unwrap()).rkey
    }

    fn region(&mut self) -> &mut [u8] {
        let n = self.buf.len() - 2 * GUARD;
        &mut self.buf[GUARD..GUARD + n]
    }

    fn guards_intact(&self) -> bool {
        let n = self.buf.len();
        self.buf[..GUARD].iter().chain(&self.buf[n - GUARD..]).all(|b| *b == 0xAA)
    }

    fn sge(&self, off: usize, len: usize) -> Sge {
        Sge { addr: self.addr() + off as u64, len: len as u32, lkey: self.key() }
    }
}

fn write(wr_id: u64, src: Sge, dst: u64, rkey: u32, signaled: bool) -> SendWr {
    let mut sge = [Sge::default(); 2];
    sge[0] = src;
    SendWr { wr_id, opcode: WrOpcode::Write, signaled, num_sge: 1, sge, remote_addr: dst, rkey, ..SendWr::default() }
}

fn connect(a: &mut End, b: &mut End) {
    let (ia, ib): (QpInfo, QpInfo) = (a.qp.local_info(), b.qp.local_info());
    a.qp.connect(&ib, &PARAMS).unwrap();
    b.qp.connect(&ia, &PARAMS).unwrap();
    let t = Instant::now();
    while !(a.qp.is_ready().unwrap() & b.qp.is_ready().unwrap()) {
        assert!(t.elapsed() < Duration::from_secs(5), "connection not established");
        std::thread::yield_now();
    }
}

/// Two connected ends (requester `a`, responder `b`) of `len`-byte buffers.
fn pair(mode: Mode, len: usize, b_access: Access) -> (End, End) {
    let p = devices(mode);
    let all = Access::LOCAL_WRITE | Access::REMOTE_WRITE | Access::REMOTE_READ;
    let (mut a, mut b) = (End::new(p.0.clone(), len, all), End::new(p.1.clone(), len, b_access));
    connect(&mut a, &mut b);
    (a, b)
}

/// Polls `cq` (and steps `other`) until `n` completions came or 5 s passed.
fn poll_n(cq: &mut SoftCq, other: &mut SoftCq, n: usize) -> Vec<Completion> {
    poll_for(cq, other, n, Duration::from_secs(5))
}

/// Polls `cq` (and steps `other`) until `n` completions came or `limit` passed.
fn poll_for(cq: &mut SoftCq, other: &mut SoftCq, n: usize, limit: Duration) -> Vec<Completion> {
    let mut out = Vec::new();
    let mut wc = [Completion::default(); 16];
    let t = Instant::now();
    while out.len() < n && t.elapsed() < limit {
        let k = cq.poll(&mut wc).unwrap();
        out.extend_from_slice(&wc[..k]);
        other.poll(&mut []).unwrap();
    }
    out
}

/// Each completion as (wr_id, status).
fn statuses(c: &[Completion]) -> Vec<(u64, WcStatus)> {
    c.iter().map(|c| (c.wr_id, c.status)).collect()
}

fn fill(buf: &mut [u8], seed: u8) {
    for (i, b) in buf.iter_mut().enumerate() {
        *b = (i as u8).wrapping_mul(31).wrapping_add(seed) | 1;
    }
}

fn writes_land_exactly(mode: Mode) {
    let len = 3 << 20;
    let (mut a, mut b) = pair(mode, len + 16, Access::REMOTE_WRITE | Access::LOCAL_WRITE);
    fill(a.region(), 7);
    for (i, size) in [0usize, 1, 7, 8, 9, 4095, 65536 + 3, len].into_iter().enumerate() {
        b.region().fill(0x55);
        let off = i; // unaligned destinations too
        let wr = write(i as u64, a.sge(0, size), b.addr() + off as u64, b.key(), true);
        a.qp.post_send(&[wr]).unwrap();
        let c = poll_n(&mut a.cq, &mut b.cq, 1);
        assert_eq!(c.len(), 1, "size {size}");
        assert_eq!((c[0].wr_id, c[0].status, c[0].opcode), (i as u64, WcStatus::Success, WcOpcode::RdmaWrite));
        let src = a.region()[..size].to_vec();
        let r = b.region();
        assert!(r[..off].iter().all(|x| *x == 0x55), "size {size}: bytes before the target changed");
        assert!(r[off..off + size] == src[..], "size {size}: data differs");
        assert!(r[off + size..].iter().all(|x| *x == 0x55), "size {size}: bytes after the target changed");
        assert!(b.guards_intact());
    }
}

#[test]
fn inproc_writes_land_exactly() {
    writes_land_exactly(Mode::Inproc);
}

#[test]
fn tcp_writes_land_exactly() {
    writes_land_exactly(Mode::Tcp);
}

fn write_imm_takes_one_wqe(mode: Mode) {
    let (mut a, mut b) = pair(mode, 4096, Access::REMOTE_WRITE);
    b.srq.post_recv(3).unwrap();
    let mut wr = write(9, a.sge(0, 100), b.addr(), b.key(), true);
    wr.opcode = WrOpcode::WriteImm;
    wr.imm = 0xDEAD_BEEF;
    let mut zero = wr;
    zero.num_sge = 0;
    zero.rkey = 0;
    zero.remote_addr = 0;
    zero.imm = 5;
    zero.wr_id = 10;
    a.qp.post_send(&[wr, zero]).unwrap();
    let c = poll_n(&mut a.cq, &mut b.cq, 2);
    assert_eq!(
        c.iter().map(|c| (c.wr_id, c.status)).collect::<Vec<_>>(),
        [(9, WcStatus::Success), (10, WcStatus::Success)]
    );
    let r = poll_n(&mut b.cq, &mut a.cq, 2);
    assert_eq!(r.len(), 2);
    assert_eq!(
        (r[0].opcode, r[0].imm, r[0].byte_len, r[0].qp_num),
        (WcOpcode::RecvRdmaWithImm, 0xDEAD_BEEF, 100, b.qp.qp_num())
    );
    assert_eq!((r[1].imm, r[1].byte_len, r[1].status), (5, 0, WcStatus::Success));
    assert_eq!(b.srq.posted(), 1, "exactly one WQE per WRITE_WITH_IMM");
    assert_eq!(b.srq.rnr_events(), 0);
}

#[test]
fn inproc_write_imm_takes_one_wqe() {
    write_imm_takes_one_wqe(Mode::Inproc);
}

#[test]
fn tcp_write_imm_takes_one_wqe() {
    write_imm_takes_one_wqe(Mode::Tcp);
}

#[test]
fn inproc_rnr_waits_keeps_order_and_resumes() {
    let (mut a, mut b) = pair(Mode::Inproc, 4096, Access::REMOTE_WRITE);
    fill(a.region(), 1);
    let mut imm = write(1, a.sge(0, 64), b.addr(), b.key(), true);
    imm.opcode = WrOpcode::WriteImm;
    imm.imm = 77;
    let after = write(2, a.sge(64, 64), b.addr() + 64, b.key(), true);
    a.qp.post_send(&[imm, after]).unwrap();
    let none = poll_for(&mut a.cq, &mut b.cq, 1, Duration::from_millis(200));
    assert!(none.is_empty(), "nothing completes while the SRQ is empty");
    assert_eq!(b.srq.rnr_events(), 1, "one RNR event, however long the wait");
    assert!(b.region()[64..128].iter().all(|x| *x == 0xAA), "the WR behind the waiting one did not run");
    b.srq.post_recv(1).unwrap();
    let c = poll_n(&mut a.cq, &mut b.cq, 2);
    assert_eq!(c.iter().map(|c| c.wr_id).collect::<Vec<_>>(), [1, 2]);
    assert_eq!(poll_n(&mut b.cq, &mut a.cq, 1)[0].imm, 77);
    let src = a.region()[..128].to_vec();
    assert_eq!(&b.region()[..128], &src[..]);
}

fn order_read_and_chains(mode: Mode) {
    let (mut a, mut b) = pair(mode, 1 << 16, Access::REMOTE_WRITE | Access::REMOTE_READ);
    // 100 WRs, only the last signalled: exactly one completion. Every WR writes its index
    // to the same 8 bytes: in-order execution leaves the last one.
    for i in 0..100u64 {
        a.region()[(i * 8) as usize..][..8].copy_from_slice(&i.to_le_bytes());
    }
    let chain: Vec<SendWr> = (0..100).map(|i| write(i, a.sge(i as usize * 8, 8), b.addr(), b.key(), i == 99)).collect();
    a.qp.post_send(&chain).unwrap();
    let c = poll_for(&mut a.cq, &mut b.cq, 2, Duration::from_millis(300));
    assert_eq!(c.len(), 1);
    assert_eq!((c[0].wr_id, c[0].status), (99, WcStatus::Success));
    assert_eq!(u64::from_le_bytes(b.region()[..8].try_into().unwrap()), 99);
    // READ back 32 KiB of the peer into two SGEs.
    fill(&mut b.region()[1000..1000 + 32768], 3);
    let mut rd = write(7, a.sge(4096, 20000), b.addr() + 1000, b.key(), true);
    rd.opcode = WrOpcode::Read;
    rd.num_sge = 2;
    rd.sge[1] = a.sge(30000, 12768);
    a.qp.post_send(&[rd]).unwrap();
    let c = poll_n(&mut a.cq, &mut b.cq, 1);
    assert_eq!(
        (c[0].wr_id, c[0].status, c[0].opcode, c[0].byte_len),
        (7, WcStatus::Success, WcOpcode::RdmaRead, 32768)
    );
    let want = b.region()[1000..1000 + 32768].to_vec();
    assert_eq!(&a.region()[4096..24096], &want[..20000]);
    assert_eq!(&a.region()[30000..42768], &want[20000..]);
}

#[test]
fn inproc_order_read_and_chains() {
    order_read_and_chains(Mode::Inproc);
}

#[test]
fn tcp_order_read_and_chains() {
    order_read_and_chains(Mode::Tcp);
}

fn refused(mode: Mode, b_access: Access, bad: impl Fn(&End, SendWr) -> SendWr) {
    let (mut a, mut b) = pair(mode, 4096, b_access);
    fill(a.region(), 9);
    let before = b.buf.clone();
    let mut first = write(0, a.sge(0, 0), b.addr(), b.key(), true);
    first.num_sge = 0;
    let wr = bad(&b, write(1, a.sge(0, 64), b.addr(), b.key(), false));
    let next = write(2, a.sge(0, 64), b.addr(), b.key(), false);
    a.qp.post_send(&[first, wr, next]).unwrap();
    let c = poll_n(&mut a.cq, &mut b.cq, 3);
    assert_eq!(
        c.iter().map(|c| (c.wr_id, c.status)).collect::<Vec<_>>(),
        [(0, WcStatus::Success), (1, WcStatus::RemoteAccessError), (2, WcStatus::Flushed)],
        "what executed before the refusal succeeds; unsignalled WRs complete when they fail"
    );
    assert!(b.buf == before, "not one byte written");
    let post_after = a.qp.post_send(&[write(3, a.sge(0, 8), b.addr(), b.key(), true)]);
    assert!(post_after.is_ok());
    assert_eq!(poll_n(&mut a.cq, &mut b.cq, 1)[0].status, WcStatus::Flushed);
}

#[test]
fn inproc_bad_rkey_out_of_bounds_and_missing_access_are_refused() {
    let rw = Access::REMOTE_WRITE | Access::REMOTE_READ;
    refused(Mode::Inproc, rw, |_, mut w| {
        w.rkey ^= 0x40;
        w
    });
    refused(Mode::Inproc, rw, |_, mut w| {
        w.remote_addr += 4096 - 63;
        w
    });
    refused(Mode::Inproc, rw, |_, mut w| {
        w.remote_addr -= 1;
        w
    });
    refused(Mode::Inproc, Access::REMOTE_READ, |_, w| w);
    refused(Mode::Inproc, Access::REMOTE_WRITE, |_, mut w| {
        w.opcode = WrOpcode::Read;
        w
    });
}

#[test]
fn tcp_bad_rkey_is_refused() {
    refused(Mode::Tcp, Access::REMOTE_WRITE, |_, mut w| {
        w.rkey ^= 0x40;
        w
    });
}

#[test]
fn inproc_peer_gone_fails_outstanding_and_flushes_the_rest() {
    let (mut a, b) = pair(Mode::Inproc, 4096, Access::REMOTE_WRITE);
    let mut imm = write(1, a.sge(0, 8), b.addr(), b.key(), false);
    imm.opcode = WrOpcode::WriteImm; // waits: the SRQ is empty
    a.qp.post_send(&[imm, write(2, a.sge(0, 8), b.addr(), b.key(), true)]).unwrap();
    drop(b);
    let mut other = SoftCq::new(1, false);
    let c = poll_n(&mut a.cq, &mut other, 2);
    assert_eq!(
        c.iter().map(|c| (c.wr_id, c.status)).collect::<Vec<_>>(),
        [(1, WcStatus::RetryExceeded), (2, WcStatus::Flushed)]
    );
    assert!(a.qp.is_ready().is_err());
}

#[test]
fn dereg_waits_for_placement_and_nothing_lands_after() {
    let len = 16 << 20;
    let (mut a, mut b) = pair(Mode::Tcp, len, Access::REMOTE_WRITE);
    let (addr, key) = (b.addr(), b.key());
    let chain: Vec<SendWr> = (0..8).map(|i| write(i, a.sge(0, len), addr, key, i == 7)).collect();
    a.qp.post_send(&chain).unwrap();
    let t = std::thread::spawn(move || {
        let c = poll_n(&mut a.cq, &mut SoftCq::new(1, false), 1);
        (a, c)
    });
    // The responder's helper thread places while this thread deregisters.
    std::thread::sleep(Duration::from_millis(5));
    let mr = b.mr.take().unwrap();
    b.dev.dereg_mr(mr).unwrap();
    b.region().fill(0xEE);
    let (_a, c) = t.join().unwrap();
    assert!(matches!(c.first().map(|c| c.status), Some(WcStatus::Success | WcStatus::RemoteAccessError)), "{c:?}");
    std::thread::sleep(Duration::from_millis(20));
    assert!(b.region().iter().all(|x| *x == 0xEE), "a byte landed after dereg_mr returned");
}

#[test]
fn final_word_is_stored_last_with_release() {
    // The responder's helper thread places while this thread spins on the word.
    final_word_is_stored_last(Mode::Tcp);
}

/// 1 MiB WRITEs, each posted from another thread while this one spins on the WRITE's final
/// word as the engine spins on a CTS entry: once it is there, so is every other byte.
fn final_word_is_stored_last(mode: Mode) {
    let len = 1 << 20;
    let (mut a, mut b) = pair(mode, len, Access::REMOTE_WRITE);
    let (addr, key) = (b.addr(), b.key());
    let word = unsafe_word(addr + len as u64 - 8);
    for round in 1..=20u8 {
        fill(a.region(), round);
        let expect_last = u64::from_ne_bytes(a.region()[len - 8..].try_into().unwrap());
        let expect = a.region().to_vec();
        let poster = std::thread::spawn(move || {
            a.qp.post_send(&[write(round as u64, a.sge(0, len), addr, key, true)]).unwrap();
            a
        });
        let t = Instant::now();
        while word.load(std::sync::atomic::Ordering::Acquire) != expect_last {
            assert!(t.elapsed() < Duration::from_secs(5));
            std::hint::spin_loop();
        }
        // SAFETY-free check through the Vec: every other byte is already there.
        assert!(b.region() == &expect[..], "round {round}: the final word was visible before the rest");
        a = poster.join().unwrap();
        poll_n(&mut a.cq, &mut b.cq, 1);
    }
}

fn unsafe_word(addr: u64) -> &'static std::sync::atomic::AtomicU64 {
    // SAFETY: test-only: `addr` is an 8-aligned word of a buffer that outlives the test body
    // (leaked through 'static only for the duration of the test).
    unsafe { std::sync::atomic::AtomicU64::from_ptr(addr as *mut u64) }
}

#[test]
fn a_peer_that_never_connects_times_out() {
    let opts = SoftOptions { connect_timeout: Duration::from_millis(150), ..SoftOptions::tcp("t-sout", LOOPBACK) };
    let mut e = End::new(Arc::new(open(&opts).unwrap()), 64, Access::REMOTE_WRITE);
    let mut info = [0u8; 48];
    info[..2].copy_from_slice(&[2, 4]);
    info[16..20].copy_from_slice(&[127, 0, 0, 1]); // nonce 0: this QP waits for the dialer
    e.qp.connect(&QpInfo(info), &PARAMS).unwrap();
    let t = Instant::now();
    let err = loop {
        match e.qp.is_ready() {
            Ok(false) => std::thread::sleep(Duration::from_millis(5)),
            Ok(true) => panic!("ready without a peer"),
            Err(err) => break err,
        }
    };
    assert!(t.elapsed() >= Duration::from_millis(150), "{err}");
    assert!(err.msg().contains("did not connect"), "{err}");
}

#[test]
fn attrs_of_soft_devices() {
    let p = devices(Mode::Tcp);
    let a = p.0.attrs();
    assert_eq!(
        (a.name.as_str(), a.link_layer, a.mem_types),
        ("t-sout", crate::fabric::LinkLayer::Tcp, crate::fabric::MemTypes::HOST)
    );
    assert!(!a.completion_timestamps);
    assert_eq!(a.progress, crate::fabric::Progress::OnPoll, "polls move a TCP soft NIC's data");
    assert_eq!(devices(Mode::Inproc).0.attrs().progress, crate::fabric::Progress::Autonomous);
    assert_eq!((a.speed_mbps, a.speed_known), (NOMINAL_SPEED_MBPS, false), "loopback has no sysfs speed");
    assert_ne!(a.guid, p.1.attrs().guid);
    let again = devices(Mode::Tcp);
    assert_eq!(again.0.attrs().guid, a.guid, "stable guid");
    assert!(p.0.reg_dmabuf_mr(3, 0, 64, 0, Access::REMOTE_WRITE).is_err());
}

#[test]
fn helpers_finish_a_transfer_when_neither_side_calls() {
    let len = 16 << 20;
    let (mut a, mut b) = pair(Mode::Tcp, len, Access::REMOTE_WRITE);
    fill(a.region(), 4);
    a.qp.post_send(&[write(1, a.sge(0, len), b.addr(), b.key(), true)]).unwrap();
    // Nobody polls: A's helper sends what did not fit the socket (16 MiB is more than the
    // socket buffers hold), B's places it. The final word is stored last (Release).
    let src = a.region().to_vec();
    let last = u64::from_ne_bytes(src[len - 8..].try_into().unwrap());
    let word = unsafe_word(b.addr() + len as u64 - 8);
    let t = Instant::now();
    while word.load(std::sync::atomic::Ordering::Acquire) != last {
        assert!(t.elapsed() < Duration::from_secs(5), "the transfer stalled without callers");
        std::thread::sleep(Duration::from_millis(5));
    }
    assert!(b.region() == &src[..]);
    let c = poll_n(&mut a.cq, &mut b.cq, 1);
    assert_eq!((c[0].wr_id, c[0].status), (1, WcStatus::Success));
}

/// In-process devices reach the QPs of their own network only: a QP on another network
/// (another plugin instance's) is not found, and the same QPs on one network connect.
#[test]
fn inproc_qps_reach_only_their_own_networks_qps() {
    let all = Access::LOCAL_WRITE | Access::REMOTE_WRITE | Access::REMOTE_READ;
    let on = |name: &str, net: &Arc<InprocNet>| Arc::new(open(&SoftOptions::inproc(name, net)).unwrap());
    let (n1, n2) = (InprocNet::new(), InprocNet::new());
    let (mut a, mut b) = (End::new(on("n1", &n1), 64, all), End::new(on("n2", &n2), 64, all));
    let (ia, ib) = (a.qp.local_info(), b.qp.local_info());
    // The dialer (smaller nonce) looks its peer up at once; the other side waits for it.
    let errs: Vec<String> = [a.qp.connect(&ib, &PARAMS), b.qp.connect(&ia, &PARAMS)]
        .into_iter()
        .filter_map(|r| r.err())
        .map(|e| e.to_string())
        .collect();
    assert_eq!(errs.len(), 1, "{errs:?}");
    assert!(errs[0].contains("on this device's network"), "{errs:?}");
    let (mut a, mut b) = (End::new(on("n1a", &n1), 64, all), End::new(on("n1b", &n1), 64, all));
    connect(&mut a, &mut b);
}
