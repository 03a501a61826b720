//! A hostile peer's RDMA against a running receiver: the key a peer
//! receives in a CTS covers exactly `[data, data + size)` of what NCCL registered, so a
//! WRITE or READ a byte outside it completes with a remote access error, and not one byte
//! around the buffer changes (canaries on every side).
//!
//! Two processes: the victim (this test binary started on its test `victim`) drives the
//! plugin through its exported C table as NCCL would — `listen`, `accept`, `regMr` of a
//! buffer in the middle of a page of canaries, `irecv`, `test` — on the soft fabric over
//! loopback. This process is
//! the hostile peer: it speaks the set-up protocol (`plugin::setup_msg`) and the soft fabric's
//! wire (the fabric's own QPs) itself, learns the buffer's address and rkeys from the CTS
//! the victim writes into its FIFO, and then aims WRITEs and READs at and around the buffer.

mod hostile_common;

use std::io::{BufRead, Write};
use std::net::{IpAddr, Ipv4Addr};
use std::sync::Arc;
use std::time::{Duration, Instant};

use child_procs::Children;
use hostile_common::abi::Net;
use hostile_common::{child_program, hex, unhex};
use mpib::engine::layout::CtsEntry;
use mpib::fabric::mem::HostRegion;
use mpib::fabric::soft::{self, SoftCq, SoftDevice, SoftMr, SoftOptions, SoftQp};
use mpib::fabric::{
    Access, Completion, CompletionQueue, ConnectParams, Device, QpCaps, QueuePair, SendWr, Sge, Timestamps, WcStatus,
    WrOpcode,
};
use mpib::plugin::listen_handle::read_handle;
use mpib::plugin::oob::{OobAddr, OobConn};
use mpib::plugin::region::SEND_SCRATCH_OFF;
use mpib::plugin::setup::FabricKind;
use mpib::plugin::setup_msg::{self, Hello, Msg};

const WAIT: Duration = Duration::from_secs(60);
const CANARY: u8 = 0xC5;
/// The victim's buffer: `SIZE` bytes at `OFFSET` into the second of three pages, so that a
/// registration rounded out to pages would cover bytes on both sides of it.
const PAGE: usize = 4096;
const OFFSET: usize = PAGE + 100;
const SIZE: usize = 1000;
/// What the hostile peer's in-bounds WRITE puts at the start of the buffer.
const MARK: u8 = 0x3C;
const PARAMS: ConnectParams = ConnectParams { traffic_class: 0, service_level: 0, timeout: 14, retry_cnt: 1 };

// ---- the victim -------------------------------------------------------------------------

/// Page-aligned memory filled with canaries, never freed (the process exits).
fn canary_pages(n: usize) -> &'static mut [u8] {
    let layout = std::alloc::Layout::from_size_align(n * PAGE, PAGE).unwrap();
    // SAFETY: a non-zero size and a valid alignment; leaked on purpose (a NIC may write it
    // until the process exits).
    let p = unsafe { std::alloc::alloc(layout) };
    assert!(!p.is_null());
    // SAFETY: just allocated, `n * PAGE` bytes, owned by this function's caller from now on.
    let b = unsafe { std::slice::from_raw_parts_mut(p, n * PAGE) };
    b.fill(CANARY);
    b
}

/// The victim process of `a_peer_reaches_exactly_the_registered_bytes`, which starts it.
#[test]
#[ignore = "the child process of a_peer_reaches_exactly_the_registered_bytes"]
fn victim() {
    child_procs::expect_test_child("victim");
    let net = Net::init();
    let (handle, listen) = net.listen(0);
    println!("HANDLE {}", hex(&handle));
    let t0 = Instant::now();
    let recv = loop {
        assert!(t0.elapsed() < WAIT, "the hostile peer did not connect");
        if let Some(c) = net.accept(listen).expect("accept") {
            break c;
        }
    };
    let mem = canary_pages(3);
    let data = mem.as_ptr() as u64 + OFFSET as u64;
    let mh = net.reg_mr(recv, data, SIZE).expect("regMr");
    let req = loop {
        if let Some(r) = net.irecv(recv, data, SIZE as i32, 7, mh).expect("irecv") {
            break r;
        }
    };
    println!("POSTED {data} {SIZE}");
    // NCCL's proxy tests the receive until it completes (never, here: the peer sends no
    // message); the peer's WRITEs and READs are served meanwhile.
    let lines = std::sync::mpsc::channel();
    std::thread::spawn(move || {
        for l in std::io::stdin().lock().lines() {
            let _ = lines.0.send(l.unwrap());
        }
    });
    loop {
        assert!(t0.elapsed() < 2 * WAIT, "no CHECK from the hostile peer");
        assert_eq!(net.test(req).expect("test: the receive comm survives the hostile peer"), None);
        if let Ok(l) = lines.1.try_recv() {
            assert_eq!(l, "CHECK");
            break;
        }
    }
    let changed: Vec<usize> =
        (0..mem.len()).filter(|&i| !(OFFSET..OFFSET + SIZE).contains(&i) && mem[i] != CANARY).collect();
    let first = changed.first().map_or(String::new(), |&i| format!(" first at buffer{:+}", i as i64 - OFFSET as i64));
    println!("CANARIES {}{first}", changed.len());
    println!("INSIDE {}", hex(&mem[OFFSET..OFFSET + 64]));
    std::io::stdout().flush().unwrap();
}

// ---- the hostile peer -------------------------------------------------------------------

/// The victim process (killed when dropped).
struct Victim(Children);

impl Victim {
    fn start() -> Victim {
        let mut c = Children::new();
        c.start(&child_program("victim", &[]).arg("--ignored")).expect("start the victim");
        Victim(c)
    }

    /// The next line starting with `word`, split after it.
    fn expect(&mut self, word: &str) -> Vec<String> {
        let until = Instant::now() + 3 * WAIT;
        loop {
            let Some(line) = self.0.line_from(0, until) else {
                panic!("the victim exited or fell silent before {word}:\n{}", self.0.output(0));
            };
            // (The test harness may have printed "test victim ... " in front of it.)
            if let Some(at) = line.find(word) {
                return line[at + word.len()..].split_whitespace().map(str::to_string).collect();
            }
        }
    }
}

/// The hostile side: one soft device carrying both of its "rails", four QPs per rail.
struct Hostile {
    _dev: Arc<SoftDevice>,
    cq: SoftCq,
    qps: Vec<SoftQp>,
    fifo: HostRegion,
    _fifo_mr: SoftMr,
    local: HostRegion,
    local_key: u32,
    _local_mr: SoftMr,
}

const QPS: u16 = 4;

impl Hostile {
    /// Connects to the victim's listen handle as a connector would.
    fn connect(handle: &[u8; 128]) -> Hostile {
        let dev = Arc::new(soft::open(&SoftOptions::tcp("hostile", IpAddr::V4(Ipv4Addr::LOCALHOST))).unwrap());
        let cq = dev.create_cq(4096, Timestamps::Off).unwrap();
        let caps = QpCaps { max_send_wr: 64, max_inline: 0 };
        let mut qps: Vec<SoftQp> = (0..2 * QPS).map(|_| dev.create_qp(&cq, None, caps).unwrap()).collect();
        let all = Access::LOCAL_WRITE | Access::REMOTE_WRITE | Access::REMOTE_READ;
        let fifo = HostRegion::new(SEND_SCRATCH_OFF + PAGE).unwrap();
        let fifo_mr = dev.reg_mr(fifo.as_mut_ptr(), fifo.len(), all).unwrap();
        let local = HostRegion::new(PAGE).unwrap();
        let local_mr = dev.reg_mr(local.as_mut_ptr(), local.len(), all).unwrap();
        let (fk, local_key) = (SoftDevice::mr_keys(&fifo_mr).rkey, SoftDevice::mr_keys(&local_mr).lkey);
        let hello = Hello {
            kind: FabricKind::Soft as u8,
            pieces: [1, 1],
            qps: [QPS, QPS],
            fifo_addr: fifo.addr(),
            fifo_rkeys: [fk, fk],
            scratch_addr: fifo.addr() + SEND_SCRATCH_OFF as u64,
            qps_info: qps.iter().map(|q| q.local_info()).collect(),
        };
        let addr = read_handle(handle, FabricKind::Soft).unwrap();
        assert!(matches!(addr, OobAddr::Tcp(_)));
        let mut conn = OobConn::connect(addr, &mpib::plugin::oob::InprocListeners::new()).unwrap();
        conn.send(&hello.encode());
        let t0 = Instant::now();
        let reply = loop {
            assert!(t0.elapsed() < WAIT, "no Reply");
            if let Some(m) = conn.poll().unwrap() {
                match setup_msg::decode(&m).unwrap() {
                    Msg::Reply(r) => break r,
                    m => panic!("{m:?}"),
                }
            }
        };
        for (q, info) in qps.iter_mut().zip(&reply.qps_info) {
            q.connect(info, &PARAMS).unwrap();
        }
        while !qps.iter_mut().all(|q| q.is_ready().unwrap()) {
            assert!(t0.elapsed() < WAIT, "QPs not ready");
            conn.poll().unwrap();
        }
        conn.send(&setup_msg::ready());
        while !conn.flushed() {
            let _ = conn.poll();
        }
        Hostile { _dev: dev, cq, qps, fifo, _fifo_mr: fifo_mr, local, local_key, _local_mr: local_mr }
    }

    /// The first CTS the victim writes into the FIFO.
    fn cts(&mut self) -> CtsEntry {
        let t0 = Instant::now();
        let mut wc = [Completion::default(); 16];
        while self.fifo.load_acquire(mpib::engine::layout::CTS_WORD_OFFSET) == 0 {
            assert!(t0.elapsed() < WAIT, "no CTS");
            self.cq.poll(&mut wc).unwrap();
        }
        CtsEntry::from_words(&self.fifo.load_words::<4>(0))
    }

    /// Posts one signalled WR on QP `qp` and returns its completion status.
    fn run(&mut self, qp: usize, opcode: WrOpcode, len: u32, remote_addr: u64, rkey: u32) -> WcStatus {
        let wr_id = 1000 + qp as u64;
        let sge = Sge { addr: self.local.addr(), len, lkey: self.local_key };
        let wr = SendWr {
            wr_id,
            opcode,
            signaled: true,
            num_sge: 1,
            sge: [sge, Sge::default()],
            remote_addr,
            rkey,
            ..SendWr::default()
        };
        self.qps[qp].post_send(&[wr]).unwrap();
        let t0 = Instant::now();
        let mut wc = [Completion::default(); 16];
        loop {
            assert!(t0.elapsed() < WAIT, "no completion for the WR on QP {qp}");
            let n = self.cq.poll(&mut wc).unwrap();
            if let Some(c) = wc[..n].iter().find(|c| c.wr_id == wr_id) {
                return c.status;
            }
        }
    }

    fn local_bytes(&self, n: usize) -> Vec<u8> {
        (0..n / 8).flat_map(|i| self.local.load(i * 8).to_le_bytes()).collect()
    }

    fn fill_local(&self, b: u8) {
        for i in 0..PAGE / 8 {
            self.local.store(i * 8, u64::from_le_bytes([b; 8]));
        }
    }
}

#[test]
fn a_peer_reaches_exactly_the_registered_bytes() {
    let mut v = Victim::start();
    let handle: [u8; 128] = unhex(&v.expect("HANDLE")[0]).try_into().unwrap();
    let mut h = Hostile::connect(&handle);
    let posted = v.expect("POSTED");
    let (data, size): (u64, u64) = (posted[0].parse().unwrap(), posted[1].parse().unwrap());
    let cts = h.cts();
    assert_eq!((cts.addr, cts.size), (data, size), "the CTS names the posted buffer");
    let [k0, k1] = cts.rkeys;
    let end = data + size;
    use WcStatus::{RemoteAccessError as Refused, Success};
    // Each attack on a QP of its own: a refused one puts its connection in the error state.
    h.fill_local(MARK);
    let mut seen = vec![
        ("in-bounds WRITE of 64 B at the start (control)", h.run(1, WrOpcode::Write, 64, data, k0), Success),
        ("64-byte WRITE at end - 8", h.run(2, WrOpcode::Write, 64, end - 8, k0), Refused),
        ("16-byte WRITE before the start", h.run(3, WrOpcode::Write, 16, data - 16, k0), Refused),
        ("1-byte WRITE just past the end (SUP key)", h.run(usize::from(QPS) + 3, WrOpcode::Write, 1, end, k1), Refused),
    ];
    h.fill_local(0x11);
    seen.push((
        "64-byte READ at end - 8 (SUP key)",
        h.run(usize::from(QPS) + 1, WrOpcode::Read, 64, end - 8, k1),
        Refused,
    ));
    let leaked = h.local_bytes(64);
    seen.push(("in-bounds READ of 64 B (control)", h.run(usize::from(QPS) + 2, WrOpcode::Read, 64, data, k1), Success));
    let read_back = h.local_bytes(64);
    v.0.write_line(0, "CHECK").unwrap();
    let canaries = v.expect("CANARIES").join(" ");
    let inside = unhex(&v.expect("INSIDE")[0]);
    let wrong: Vec<String> = seen
        .iter()
        .filter(|(_, got, want)| got != want)
        .map(|(what, got, want)| format!("{what}: {got} (expected {want})"))
        .collect();
    assert!(wrong.is_empty(), "{}\ncanaries changed: {canaries}", wrong.join("\n"));
    assert_eq!(canaries, "0", "bytes around the buffer changed");
    assert!(leaked.iter().all(|&b| b == 0x11), "a refused READ delivered bytes: {leaked:02x?}");
    assert_eq!(inside, vec![MARK; 64], "the in-bounds WRITE landed");
    assert_eq!(read_back, vec![MARK; 64], "the in-bounds READ returned it");
}
