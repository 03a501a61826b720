//! Cross-process tests of the soft fabric over loopback. The responder is a child process:
//! this test binary re-executed to run the ignored test `child_agent` (`child_procs`), which
//! serves line commands on stdin. Between commands the child makes no
//! fabric call, so everything it does as a responder is done by its helper thread.

mod fabric_checks;

use std::io::{BufRead, Write};

use child_procs::{Children, Program};
use std::sync::Arc;
use std::time::{Duration, Instant};

use mpib::fabric::soft::{self, SoftCq, SoftDevice, SoftMr, SoftOptions, SoftQp, SoftSrq};
use mpib::fabric::{
    Access, Completion, CompletionQueue, ConnectParams, Device, QP_INFO_LEN, QpCaps, QpInfo, QueuePair, SendWr, Sge,
    SharedRecvQueue, Timestamps, WcStatus, WrOpcode,
};

// The default liveness bound (MPIB_TIMEOUT 20, MPIB_RETRY_CNT 7: ~34 s without a byte from
// the peer). With the silent-peer test's 134 ms, a 64 MiB WRITE failed with RetryExceeded
// while both processes waited that long for a core (both cores busy elsewhere).
const PARAMS: ConnectParams = ConnectParams { traffic_class: 0, service_level: 0, timeout: 20, retry_cnt: 7 };
// 4.096 us * 2^14 * 2 = 134 ms: the silent-peer test waits that long rather than 34 s.
const SILENT_PEER_PARAMS: ConnectParams = ConnectParams { timeout: 14, retry_cnt: 1, ..PARAMS };
const GUARD: usize = 4096;
const FILL: u8 = 0xAA;

const LOOPBACK: std::net::IpAddr = std::net::IpAddr::V4(std::net::Ipv4Addr::LOCALHOST);

/// Counts this process's log records (the soft fabric's warnings are what the hostile-input
/// tests look at); installed once per process.
struct Counting(std::sync::Mutex<Vec<(log::Level, String)>>);

impl log::Log for Counting {
    fn enabled(&self, _: &log::Metadata<'_>) -> bool {
        true
    }
    fn log(&self, r: &log::Record<'_>) {
        if r.target().starts_with("mpib") {
            self.0.lock().unwrap().push((r.level(), r.args().to_string()));
        }
    }
    fn flush(&self) {}
}

static LOGS: Counting = Counting(std::sync::Mutex::new(Vec::new()));

fn count_logs() {
    if log::set_logger(&LOGS).is_ok() {
        log::set_max_level(log::LevelFilter::Debug);
    }
}

/// Warnings (and errors) logged so far whose text contains `what`.
fn warnings(what: &str) -> usize {
    LOGS.0.lock().unwrap().iter().filter(|(l, m)| *l <= log::Level::Warn && m.contains(what)).count()
}

/// Open file descriptors of this process (`usize::MAX` when none is left to look).
fn open_fds() -> usize {
    std::fs::read_dir("/proc/self/fd").map_or(usize::MAX, |d| d.count())
}

fn pattern(seed: u64, i: usize) -> u8 {
    ((i as u64).wrapping_mul(131).wrapping_add(seed * 7) ^ (i as u64 >> 9)) as u8
}

fn hex(b: &[u8]) -> String {
    b.iter().map(|x| format!("{x:02x}")).collect()
}

fn unhex(s: &str) -> Vec<u8> {
    (0..s.len()).step_by(2).map(|i| u8::from_str_radix(&s[i..i + 2], 16).unwrap()).collect()
}

/// A process's side: device, CQ, SRQ, one QP, a registered region with guards around it.
struct Side {
    dev: Arc<SoftDevice>,
    cq: SoftCq,
    srq: SoftSrq,
    qp: SoftQp,
    buf: Vec<u8>,
    mr: SoftMr,
}

impl Side {
    fn new(len: usize, access: Access) -> Side {
        let dev = Arc::new(soft::open(&SoftOptions::tcp("t", LOOPBACK)).unwrap());
        let cq = dev.create_cq(4096, Timestamps::Off).unwrap();
        let srq = dev.create_srq(4096).unwrap();
        let qp = dev.create_qp(&cq, Some(&srq), QpCaps { max_send_wr: 1024, max_inline: 0 }).unwrap();
        let mut buf = vec![FILL; len + 2 * GUARD];
        let mr = dev.reg_mr(buf[GUARD..].as_mut_ptr(), len, access).unwrap();
        Side { dev, cq, srq, qp, buf, mr }
    }

    fn addr(&self) -> u64 {
        self.buf[GUARD..].as_ptr() as u64
    }

    fn key(&self) -> u32 {
        SoftDevice::mr_keys(&self.mr).lkey
    }

    fn len(&self) -> usize {
        self.buf.len() - 2 * GUARD
    }

    fn wait_ready(&mut self) {
        let t = Instant::now();
        while !self.qp.is_ready().unwrap() {
            assert!(t.elapsed() < Duration::from_secs(10), "not connected");
            std::thread::sleep(Duration::from_micros(200));
        }
    }

    fn poll(&mut self, n: usize, timeout: Duration) -> Vec<Completion> {
        let mut out = Vec::new();
        let mut wc = [Completion::default(); 32];
        let t = Instant::now();
        while out.len() < n && t.elapsed() < timeout {
            let k = self.cq.poll(&mut wc).unwrap();
            out.extend_from_slice(&wc[..k]);
        }
        out
    }
}

// ---- the child -------------------------------------------------------------------------

#[test]
#[ignore = "the responder process of the other tests; runs only when they start it"]
fn child_agent() {
    child_procs::expect_test_child("child_agent");
    let len = std::env::var("SOFT_CHILD_LEN").unwrap();
    count_logs();
    let access = std::env::var("SOFT_CHILD_ACCESS").unwrap().parse::<u32>().unwrap();
    let mut s = Side::new(len.parse().unwrap(), Access::from_bits_retain(access));
    let mut many: Vec<SoftQp> = Vec::new();
    let out = std::io::stdout();
    let say = |line: String| {
        let mut o = out.lock();
        writeln!(o, "{line}").unwrap();
        o.flush().unwrap();
    };
    say(format!("info {} {} {} {}", hex(&s.qp.local_info().0), s.addr(), s.key(), s.qp.qp_num()));
    for line in std::io::stdin().lock().lines() {
        let line = line.unwrap();
        let w: Vec<&str> = line.split_whitespace().collect();
        let num = |i: usize| w[i].parse::<u64>().unwrap();
        let reply = match w[0] {
            "connect" => {
                let info = QpInfo(unhex(w[1]).try_into().unwrap());
                s.qp.connect(&info, &PARAMS).unwrap();
                s.wait_ready();
                "ok".to_string()
            }
            "fill" => {
                let seed = num(1);
                let n = s.len();
                for (i, b) in s.buf[GUARD..GUARD + n].iter_mut().enumerate() {
                    *b = pattern(seed, i);
                }
                "ok".to_string()
            }
            "check" => {
                // Bytes [off, off + len) must be pattern(seed) from 0; the guards and every
                // other byte within 64 KiB of the target must still be FILL.
                let (off, n, seed) = (num(1) as usize, num(2) as usize, num(3));
                let (lo, hi) = (off.saturating_sub(1 << 16), (off + n + (1 << 16)).min(s.len()));
                let window = (0..GUARD).chain(GUARD + lo..GUARD + hi).chain(GUARD + s.len()..s.buf.len());
                let bad = window.into_iter().find_map(|i| {
                    let in_target = i >= GUARD + off && i < GUARD + off + n;
                    let want = if in_target { pattern(seed, i - GUARD - off) } else { FILL };
                    (s.buf[i] != want).then(|| format!("bad {i} {} {want}", s.buf[i]))
                });
                bad.unwrap_or_else(|| "ok".to_string())
            }
            "reset" => {
                s.buf.fill(FILL);
                "ok".to_string()
            }
            "post_recv" => {
                s.srq.post_recv(num(1) as u32).unwrap();
                "ok".to_string()
            }
            "srq" => format!("srq {}", s.srq.rnr_events()),
            "port" => {
                let info = s.qp.local_info().0;
                format!("port {}", u16::from_le_bytes([info[2], info[3]]))
            }
            // Lowers the open-file limit to the descriptors open now plus `extra`.
            "limit_fds" => {
                let lim = (open_fds() + num(1) as usize) as libc::rlim_t;
                let r = libc::rlimit { rlim_cur: lim, rlim_max: lim };
                // SAFETY: plain syscall with a valid struct.
                assert_eq!(unsafe { libc::setrlimit(libc::RLIMIT_NOFILE, &r) }, 0);
                "ok".to_string()
            }
            "fds" => format!("fds {}", open_fds()),
            "warnings" => format!("warnings {}", warnings(w[1])),
            "wait_error" => {
                let t = Instant::now();
                while s.qp.is_ready().is_ok() {
                    assert!(t.elapsed() < Duration::from_secs(10), "the QP did not fail");
                    let mut wc = [Completion::default(); 4];
                    s.cq.poll(&mut wc).unwrap();
                }
                "ok".to_string()
            }
            "poll" => {
                let c = s.poll(num(1) as usize, Duration::from_millis(num(2)));
                let items: Vec<String> =
                    c.iter().map(|c| format!("{:?}:{}:{}:{}", c.status, c.imm, c.byte_len, c.qp_num)).collect();
                format!("cqes {}", items.join(" "))
            }
            "drop_qp" => {
                let other = s.dev.create_qp(&s.cq, Some(&s.srq), QpCaps { max_send_wr: 4, max_inline: 0 }).unwrap();
                drop(std::mem::replace(&mut s.qp, other));
                "ok".to_string()
            }
            // `many N`: N more QPs; their infos, comma-separated.
            "many" => {
                many = (0..num(1)).map(|_| many_qp(&s)).collect();
                let infos: Vec<String> = many.iter().map(|q| hex(&q.local_info().0)).collect();
                format!("many {}", infos.join(","))
            }
            "many_connect" => {
                connect_all(&mut many, w[1]);
                "ok".to_string()
            }
            // `many_write FROM TO ADDR RKEY`: an 8-byte WRITE on each of the QPs FROM..TO, the
            // k-th of them from offset 8 × k of this side's region to ADDR + 8 × its index;
            // "ok" when every one completed successfully.
            "many_write" => {
                let (from, to, addr, rkey) = (num(1) as usize, num(2) as usize, num(3), num(4) as u32);
                for (i, q) in many.iter_mut().enumerate().take(to).skip(from) {
                    let local = Sge { addr: s.addr() + 8 * (i - from) as u64, len: 8, lkey: s.key() };
                    q.post_send(&[wr(i as u64, WrOpcode::Write, local, addr + 8 * i as u64, rkey, true)]).unwrap();
                }
                let c = s.poll(to - from, Duration::from_secs(30));
                let ok = c.len() == to - from && c.iter().all(|c| c.status == WcStatus::Success);
                if ok { "ok".to_string() } else { format!("failed {:?}", statuses(&c)) }
            }
            "exit" => return,
            other => panic!("unknown command {other}"),
        };
        say(reply);
    }
}

fn many_qp(s: &Side) -> SoftQp {
    s.dev.create_qp(&s.cq, Some(&s.srq), QpCaps { max_send_wr: 4, max_inline: 0 }).unwrap()
}

/// Connects `qps[i]` to the `i`-th of the comma-separated hex infos and waits until all are up.
fn connect_all(qps: &mut [SoftQp], infos: &str) {
    let infos: Vec<&str> = infos.split(',').collect();
    assert_eq!(infos.len(), qps.len());
    for (q, info) in qps.iter_mut().zip(infos) {
        q.connect(&QpInfo(unhex(info).try_into().unwrap()), &PARAMS).unwrap();
    }
    let t = Instant::now();
    while !qps.iter_mut().all(|q| q.is_ready().unwrap()) {
        assert!(t.elapsed() < Duration::from_secs(30), "not connected");
        std::thread::sleep(Duration::from_millis(1));
    }
}

// ---- the parent ------------------------------------------------------------------------

/// How long the child may take to answer a command (a 64 MiB WRITE on a loaded host).
const REPLY_WAIT: Duration = Duration::from_secs(300);

/// The responder process (killed when dropped).
struct Peer {
    proc: Children,
    info: QpInfo,
    addr: u64,
    rkey: u32,
    qpn: u32,
}

impl Peer {
    fn spawn(len: usize, access: Access) -> Peer {
        let mut proc = Children::new();
        let agent = Program::this_test("child_agent")
            .arg("--ignored")
            .env("SOFT_CHILD_LEN", len.to_string())
            .env("SOFT_CHILD_ACCESS", access.bits().to_string());
        proc.start(&agent).expect("start the child");
        let Some(line) = proc.line_starting(0, "info ", Instant::now() + REPLY_WAIT) else {
            panic!("child exited before its info line:\n{}", proc.output(0));
        };
        let w: Vec<&str> = line.split_whitespace().collect();
        let info: [u8; QP_INFO_LEN] = unhex(w[0]).try_into().unwrap();
        Peer {
            proc,
            info: QpInfo(info),
            addr: w[1].parse().unwrap(),
            rkey: w[2].parse().unwrap(),
            qpn: w[3].parse().unwrap(),
        }
    }

    fn send(&mut self, c: &str) {
        self.proc.write_line(0, c).unwrap();
    }

    fn reply(&mut self) -> String {
        match self.proc.line_from(0, Instant::now() + REPLY_WAIT) {
            Some(l) => l.trim().to_string(),
            None => panic!("no reply from the child:\n{}", self.proc.output(0)),
        }
    }

    fn cmd(&mut self, c: &str) -> String {
        self.send(c);
        self.reply()
    }

    fn check(&mut self, off: usize, len: usize, seed: u64) {
        assert_eq!(self.cmd(&format!("check {off} {len} {seed}")), "ok", "write of {len} bytes at {off}");
    }

    fn signal(&self, sig: i32) {
        // SAFETY: plain syscall on our own child's pid.
        assert_eq!(unsafe { libc::kill(self.proc.pid(0) as i32, sig) }, 0);
        if sig == libc::SIGSTOP {
            // kill() returns before the child is stopped: wait until every thread is (state
            // T), or a WRITE posted next may still be served and the test races.
            let deadline = Instant::now() + Duration::from_secs(5);
            let task_dir = format!("/proc/{}/task", self.proc.pid(0));
            loop {
                let all_stopped = std::fs::read_dir(&task_dir).unwrap().all(|t| {
                    let stat = std::fs::read_to_string(t.unwrap().path().join("stat")).unwrap_or_default();
                    stat.rsplit(')').next().is_some_and(|rest| rest.trim_start().starts_with('T'))
                });
                if all_stopped {
                    break;
                }
                assert!(Instant::now() < deadline, "the peer did not stop");
                std::thread::sleep(Duration::from_millis(1));
            }
        }
    }
}

/// This process's side, connected to a child responder with a `len`-byte region.
fn connected(len: usize, child_access: Access) -> (Side, Peer) {
    connected_with(len, child_access, &PARAMS)
}

fn connected_with(len: usize, child_access: Access, params: &ConnectParams) -> (Side, Peer) {
    let mut me = Side::new(len, Access::LOCAL_WRITE | Access::REMOTE_WRITE | Access::REMOTE_READ);
    let mut peer = Peer::spawn(len, child_access);
    me.qp.connect(&peer.info, params).unwrap();
    let info = hex(&me.qp.local_info().0);
    peer.send(&format!("connect {info}"));
    me.wait_ready();
    assert_eq!(peer.reply(), "ok");
    (me, peer)
}

fn wr(wr_id: u64, opcode: WrOpcode, local: Sge, remote_addr: u64, rkey: u32, signaled: bool) -> SendWr {
    let mut sge = [Sge::default(); 2];
    sge[0] = local;
    SendWr { wr_id, opcode, signaled, num_sge: (local.len > 0) as u8, sge, remote_addr, rkey, ..SendWr::default() }
}

fn statuses(c: &[Completion]) -> Vec<(u64, WcStatus)> {
    c.iter().map(|c| (c.wr_id, c.status)).collect()
}

const RW: Access = Access::REMOTE_WRITE.union(Access::REMOTE_READ).union(Access::LOCAL_WRITE);

#[test]
fn writes_from_0_bytes_to_64_mib_land_exactly() {
    let len = 64 << 20;
    let (mut me, mut peer) = connected(len + 64, RW);
    let seed = 5;
    for (i, b) in me.buf[GUARD..GUARD + len].iter_mut().enumerate() {
        *b = pattern(seed, i);
    }
    for (k, size) in [0usize, 1, 7, 8, 13, 4096 + 5, (1 << 20) + 3, len].into_iter().enumerate() {
        let off = k % 8;
        let local = Sge { addr: me.addr(), len: size as u32, lkey: me.key() };
        me.qp.post_send(&[wr(k as u64, WrOpcode::Write, local, peer.addr + off as u64, peer.rkey, true)]).unwrap();
        let c = me.poll(1, Duration::from_secs(20));
        assert_eq!(statuses(&c), [(k as u64, WcStatus::Success)], "write of {size} bytes");
        peer.check(off, size, seed);
        assert_eq!(peer.cmd("reset"), "ok");
    }
}

#[test]
fn write_with_imm_takes_one_wqe_waits_when_none_and_keeps_order() {
    let (mut me, mut peer) = connected(4096, RW);
    let seed = 9;
    for (i, b) in me.buf[GUARD..GUARD + 4096].iter_mut().enumerate() {
        *b = pattern(seed, i);
    }
    let local = Sge { addr: me.addr(), len: 100, lkey: me.key() };
    let mut imm = wr(1, WrOpcode::WriteImm, local, peer.addr, peer.rkey, true);
    imm.imm = 0x1234_5678;
    let after = wr(
        2,
        WrOpcode::Write,
        Sge { addr: me.addr() + 100, len: 28, lkey: me.key() },
        peer.addr + 100,
        peer.rkey,
        true,
    );
    me.qp.post_send(&[imm, after]).unwrap();
    // The SRQ is empty: the request waits, and so does the one behind it.
    assert!(me.poll(1, Duration::from_millis(300)).is_empty(), "completed without a receive WQE");
    assert_eq!(peer.cmd("srq"), "srq 1", "one RNR event");
    assert_eq!(peer.cmd("check 0 0 0"), "ok", "nothing placed while waiting");
    assert_eq!(peer.cmd("post_recv 2"), "ok");
    let c = me.poll(2, Duration::from_secs(5));
    assert_eq!(statuses(&c), [(1, WcStatus::Success), (2, WcStatus::Success)]);
    let cqes = peer.cmd("poll 2 500");
    assert_eq!(cqes, format!("cqes Success:{}:100:{}", 0x1234_5678u32, peer.qpn), "exactly one receive completion");
    peer.check(0, 128, seed);
}

#[test]
fn chain_of_100_with_only_the_last_signalled_gives_one_completion_in_order() {
    let (mut me, peer) = connected(4096, RW);
    for i in 0..100usize {
        me.buf[GUARD + i * 8..][..8].copy_from_slice(&(i as u64).to_le_bytes());
    }
    let chain: Vec<SendWr> = (0..100)
        .map(|i| {
            let local = Sge { addr: me.addr() + i * 8, len: 8, lkey: me.key() };
            wr(i, WrOpcode::Write, local, peer.addr, peer.rkey, i == 99)
        })
        .collect();
    me.qp.post_send(&chain).unwrap();
    let c = me.poll(2, Duration::from_millis(500));
    assert_eq!(statuses(&c), [(99, WcStatus::Success)]);
    // READ the word back: the last WRITE (99) is what executed last.
    let dst = Sge { addr: me.addr() + 2048, len: 8, lkey: me.key() };
    me.qp.post_send(&[wr(7, WrOpcode::Read, dst, peer.addr, peer.rkey, true)]).unwrap();
    assert_eq!(statuses(&me.poll(1, Duration::from_secs(5))), [(7, WcStatus::Success)]);
    assert_eq!(u64::from_le_bytes(me.buf[GUARD + 2048..][..8].try_into().unwrap()), 99);
}

#[test]
fn read_returns_the_peers_bytes() {
    let len = 8 << 20;
    let (mut me, mut peer) = connected(len, RW);
    assert_eq!(peer.cmd("fill 3"), "ok");
    let dst = Sge { addr: me.addr(), len: len as u32, lkey: me.key() };
    me.qp.post_send(&[wr(1, WrOpcode::Read, dst, peer.addr, peer.rkey, true)]).unwrap();
    let c = me.poll(1, Duration::from_secs(20));
    assert_eq!(statuses(&c), [(1, WcStatus::Success)]);
    assert_eq!(c[0].byte_len as usize, len);
    assert!(me.buf[GUARD..GUARD + len].iter().enumerate().all(|(i, b)| *b == pattern(3, i)));
    assert!(me.buf[..GUARD].iter().chain(&me.buf[GUARD + len..]).all(|b| *b == FILL));
}

fn refused(child_access: Access, opcode: WrOpcode, remote: impl Fn(&Peer) -> (u64, u32)) {
    let (mut me, mut peer) = connected(4096, child_access);
    let (addr, rkey) = remote(&peer);
    let local = Sge { addr: me.addr(), len: 64, lkey: me.key() };
    let next = wr(2, WrOpcode::Write, local, peer.addr, peer.rkey, false);
    me.qp.post_send(&[wr(1, opcode, local, addr, rkey, false), next]).unwrap();
    let c = me.poll(2, Duration::from_secs(5));
    assert_eq!(statuses(&c), [(1, WcStatus::RemoteAccessError), (2, WcStatus::Flushed)]);
    // Not one byte written, inside the region or around it.
    assert_eq!(peer.cmd("check 0 0 0"), "ok");
}

#[test]
fn bad_rkey_is_refused_and_nothing_is_written() {
    refused(RW, WrOpcode::Write, |p| (p.addr, p.rkey ^ 0x10));
}

#[test]
fn out_of_bounds_is_refused_and_nothing_is_written() {
    refused(RW, WrOpcode::Write, |p| (p.addr + 4096 - 63, p.rkey));
    refused(RW, WrOpcode::Write, |p| (p.addr - 8, p.rkey));
}

#[test]
fn missing_access_is_refused_and_nothing_is_written() {
    refused(Access::REMOTE_READ, WrOpcode::Write, |p| (p.addr, p.rkey));
    refused(Access::REMOTE_WRITE, WrOpcode::Read, |p| (p.addr, p.rkey));
}

// ---- a peer that dies, vanishes, closes or floods: soft_fabric_peers/

mod soft_fabric_peers;

// ---- the provider-independent checks, on two TCP soft devices -------------------------------

fn tcp_pair() -> (Arc<SoftDevice>, Arc<SoftDevice>) {
    let open = |n: &str| Arc::new(soft::open(&SoftOptions::tcp(n, LOOPBACK)).unwrap());
    (open("a"), open("b"))
}

#[test]
fn registrations_through_the_plugin_cache_are_exact() {
    let (a, b) = tcp_pair();
    fabric_checks::bounds::registrations_are_exact(&a, &b);
}

#[test]
fn unwritable_memory_is_refused_at_registration() {
    fabric_checks::bounds::unwritable_memory_is_refused(&tcp_pair().0);
}
