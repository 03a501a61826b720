//! Behaviour every fabric provider must show, written once over the `Device` trait: the
//! verbs device tests run these against real NICs (Soft-RoCE in CI), and any provider can
//! run them against its own devices. Each check panics with what it saw.
#![allow(dead_code)]

pub mod bounds;

use std::alloc::Layout;
use std::io::Write;
use std::sync::Arc;
use std::time::{Duration, Instant};

use child_procs::{Children, Program};
use mpib::fabric::{
    Access, Completion, CompletionQueue, ConnectParams, Device, MrKeys, QpCaps, QpInfo, QueuePair, SendWr, Sge,
    SharedRecvQueue, Timestamps, WcOpcode, WcStatus, WrOpcode,
};

/// How long any single wait may take (Soft-RoCE under an emulated CPU is slow).
pub const WAIT: Duration = Duration::from_secs(30);

pub fn params() -> ConnectParams {
    ConnectParams { traffic_class: 0, service_level: 0, timeout: 14, retry_cnt: 7 }
}

/// Page-aligned, zeroed memory.
pub struct Buf {
    ptr: *mut u8,
    len: usize,
}

// SAFETY: plain owned memory.
unsafe impl Send for Buf {}

impl Buf {
    pub fn new(len: usize) -> Buf {
        // SAFETY: non-zero size, valid alignment.
        let ptr = unsafe { std::alloc::alloc_zeroed(Layout::from_size_align(len.max(1), 4096).unwrap()) };
        assert!(!ptr.is_null());
        Buf { ptr, len }
    }
    pub fn bytes(&self) -> &[u8] {
        // SAFETY: len bytes owned by self; a NIC may write them concurrently, which the
        // checks only read after the completion that orders it.
        unsafe { std::slice::from_raw_parts(self.ptr, self.len) }
    }
    pub fn bytes_mut(&mut self) -> &mut [u8] {
        // SAFETY: as above.
        unsafe { std::slice::from_raw_parts_mut(self.ptr, self.len) }
    }
}

impl Drop for Buf {
    fn drop(&mut self) {
        // SAFETY: allocated in new with this layout.
        unsafe { std::alloc::dealloc(self.ptr, Layout::from_size_align(self.len.max(1), 4096).unwrap()) };
    }
}

/// A deterministic byte pattern.
pub fn pattern(seed: u8, len: usize) -> Vec<u8> {
    (0..len).map(|i| (i as u8).wrapping_mul(31).wrapping_add(seed) | 1).collect()
}

/// One end of a connection: device, CQ, optional SRQ, QP and a registered buffer.
pub struct End<D: Device> {
    // Declaration order is drop order: the QP goes before its SRQ and CQ.
    pub qp: D::Qp,
    pub srq: Option<D::Srq>,
    pub cq: D::Cq,
    mr: Option<D::Mr>,
    pub buf: Buf,
    pub dev: Arc<D>,
}

impl<D: Device> End<D> {
    pub fn new(dev: &Arc<D>, with_srq: bool, len: usize) -> End<D> {
        End::with_cq(dev, dev.create_cq(1024, Timestamps::Off).expect("create_cq"), with_srq, len)
    }

    pub fn with_cq(dev: &Arc<D>, cq: D::Cq, with_srq: bool, len: usize) -> End<D> {
        let mut buf = Buf::new(len);
        // Relaxed ordering as the plugin asks for it: a hint providers may ignore.
        let access = Access::LOCAL_WRITE | Access::REMOTE_WRITE | Access::REMOTE_READ | Access::RELAXED_ORDERING;
        let mr = dev.reg_mr(buf.bytes_mut().as_mut_ptr(), len, access).expect("reg_mr");
        let srq = with_srq.then(|| dev.create_srq(256).expect("create_srq"));
        let qp = dev.create_qp(&cq, srq.as_ref(), QpCaps { max_send_wr: 256, max_inline: 0 }).expect("create_qp");
        End { qp, srq, cq, mr: Some(mr), buf, dev: dev.clone() }
    }

    pub fn keys(&self) -> MrKeys {
        D::mr_keys(self.mr.as_ref().unwrap())
    }
    pub fn addr(&self, off: usize) -> u64 {
        self.buf.bytes().as_ptr() as u64 + off as u64
    }
    pub fn sge(&self, off: usize, len: u32) -> Sge {
        Sge { addr: self.addr(off), len, lkey: self.keys().lkey }
    }
    pub fn info(&self) -> QpInfo {
        self.qp.local_info()
    }
}

impl<D: Device> Drop for End<D> {
    fn drop(&mut self) {
        if let Some(mr) = self.mr.take() {
            self.dev.dereg_mr(mr).expect("dereg_mr");
        }
    }
}

/// Connects two ends to each other and waits until both are ready.
pub fn connect<D: Device>(a: &mut End<D>, b: &mut End<D>) {
    let (ia, ib) = (a.info(), b.info());
    a.qp.connect(&ib, &params()).expect("connect a");
    b.qp.connect(&ia, &params()).expect("connect b");
    let t0 = Instant::now();
    // Both asked on every round: a provider may do its part of the connection inside
    // `is_ready` (the soft fabric's dialing QP), so `&&` must not skip the second.
    while !(a.qp.is_ready().unwrap() & b.qp.is_ready().unwrap()) {
        assert!(t0.elapsed() < WAIT, "connection not ready after {WAIT:?}");
        let mut out = [Completion::default(); 4];
        a.cq.poll(&mut out).unwrap();
        b.cq.poll(&mut out).unwrap();
        std::thread::sleep(Duration::from_millis(1));
    }
}

/// A WR of one SGE.
pub fn wr(op: WrOpcode, wr_id: u64, sge: Option<Sge>, remote_addr: u64, rkey: u32, imm: u32, signaled: bool) -> SendWr {
    let mut w = SendWr { wr_id, opcode: op, signaled, remote_addr, rkey, imm, ..Default::default() };
    if let Some(s) = sge {
        w.num_sge = 1;
        w.sge[0] = s;
    }
    w
}

/// Polls every CQ (so that providers that progress in poll make progress on all ends) until
/// CQ i has `want[i]` completions; panics after [`WAIT`] with what it got.
pub fn poll_until<C: CompletionQueue>(cqs: &mut [&mut C], want: &[usize]) -> Vec<Vec<Completion>> {
    poll_until_for(cqs, want, WAIT)
}

pub fn poll_until_for<C: CompletionQueue>(cqs: &mut [&mut C], want: &[usize], limit: Duration) -> Vec<Vec<Completion>> {
    let mut got: Vec<Vec<Completion>> = vec![Vec::new(); cqs.len()];
    let t0 = Instant::now();
    let mut out = [Completion::default(); 8];
    loop {
        for (i, cq) in cqs.iter_mut().enumerate() {
            let n = cq.poll(&mut out).expect("poll");
            got[i].extend_from_slice(&out[..n]);
        }
        if got.iter().zip(want).all(|(g, w)| g.len() >= *w) {
            return got;
        }
        assert!(
            t0.elapsed() < limit,
            "after {limit:?} got {:?} completions, wanted {want:?}: {got:?}",
            got.iter().map(Vec::len).collect::<Vec<_>>()
        );
        std::thread::yield_now();
    }
}

/// Polls every CQ for `d` and asserts that nothing completes.
pub fn assert_quiet<C: CompletionQueue>(cqs: &mut [&mut C], d: Duration, what: &str) {
    let t0 = Instant::now();
    let mut out = [Completion::default(); 4];
    while t0.elapsed() < d {
        for cq in cqs.iter_mut() {
            let n = cq.poll(&mut out).expect("poll");
            assert_eq!(n, 0, "{what}: unexpected completion {:?}", &out[..n]);
        }
        std::thread::sleep(Duration::from_millis(1));
    }
}

/// WRITE (2 WRs, unsignaled) then READ back (signaled) on one QP: data lands, only the
/// signaled WR completes, the READ sees the writes before it (RC ordering).
pub fn write_then_read<D: Device>(da: &Arc<D>, db: &Arc<D>) {
    let (mut a, mut b) = (End::new(da, false, 1 << 16), End::new(db, false, 1 << 16));
    connect(&mut a, &mut b);
    let data = pattern(7, 40_000);
    a.buf.bytes_mut()[..40_000].copy_from_slice(&data);
    let (rk, raddr) = (b.keys().rkey, b.addr(0));
    let chain = [
        wr(WrOpcode::Write, 1, Some(a.sge(0, 32_768)), raddr, rk, 0, false),
        wr(WrOpcode::Write, 2, Some(a.sge(32_768, 40_000 - 32_768)), raddr + 32_768, rk, 0, false),
        wr(WrOpcode::Read, 3, Some(a.sge(45_056, 4096)), raddr + 30_000, rk, 0, true),
    ];
    a.qp.post_send(&chain).expect("post_send");
    let got = poll_until(&mut [&mut a.cq, &mut b.cq], &[1, 0]);
    let c = got[0][0];
    assert_eq!((c.wr_id, c.status, c.opcode), (3, WcStatus::Success, WcOpcode::RdmaRead), "{c:?}");
    assert_eq!(c.byte_len, 4096, "{c:?}");
    assert_eq!(c.qp_num, a.qp.qp_num());
    assert_eq!(&b.buf.bytes()[..40_000], &data[..], "written data at the target");
    assert_eq!(&a.buf.bytes()[45_056..45_056 + 4096], &data[30_000..34_096], "READ returns what the WRITEs put there");
    assert_quiet(&mut [&mut a.cq, &mut b.cq], Duration::from_millis(50), "after the signaled READ");
}

/// WRITE_WITH_IMM through an SRQ: each consumes one WQE, the receiver learns the immediate
/// (host order), the byte count and its QP; 0-byte IMMs work; data of a plain WRITE before
/// it in the chain is visible when the IMM completes.
pub fn write_imm_through_srq<D: Device>(da: &Arc<D>, db: &Arc<D>) {
    let (mut a, mut b) = (End::new(da, false, 1 << 16), End::new(db, true, 1 << 16));
    write_imm_on(&mut a, &mut b);
}

/// The body of [`write_imm_through_srq`] on ends the caller made (e.g. with other CQs).
pub fn write_imm_on<D: Device>(a: &mut End<D>, b: &mut End<D>) {
    connect(a, b);
    b.srq.as_mut().unwrap().post_recv(4).expect("post_recv");
    let data = pattern(3, 8192);
    a.buf.bytes_mut()[..8192].copy_from_slice(&data);
    let (rk, raddr) = (b.keys().rkey, b.addr(0));
    a.qp.post_send(&[
        wr(WrOpcode::Write, 10, Some(a.sge(0, 5000)), raddr, rk, 0, false),
        wr(WrOpcode::WriteImm, 11, Some(a.sge(5000, 3192)), raddr + 5000, rk, 0xa5a5_0001, true),
    ])
    .expect("post chain");
    a.qp.post_send(&[wr(WrOpcode::WriteImm, 12, None, raddr, rk, 0xffff_ffff, true)]).expect("post 0-byte IMM");
    let got = poll_until(&mut [&mut a.cq, &mut b.cq], &[2, 2]);
    let sends: Vec<(u64, WcStatus)> = got[0].iter().map(|c| (c.wr_id, c.status)).collect();
    assert_eq!(sends, [(11, WcStatus::Success), (12, WcStatus::Success)]);
    assert!(got[0].iter().all(|c| c.opcode == WcOpcode::RdmaWrite), "{:?}", got[0]);
    let recv: Vec<(WcOpcode, u32, u32, u32, WcStatus)> =
        got[1].iter().map(|c| (c.opcode, c.imm, c.byte_len, c.qp_num, c.status)).collect();
    let q = b.qp.qp_num();
    assert_eq!(
        recv,
        [
            (WcOpcode::RecvRdmaWithImm, 0xa5a5_0001, 3192, q, WcStatus::Success),
            (WcOpcode::RecvRdmaWithImm, 0xffff_ffff, 0, q, WcStatus::Success),
        ]
    );
    assert_eq!(&b.buf.bytes()[..8192], &data[..], "the plain WRITE and the IMM's data");
}

/// 32 WRITE_WITH_IMMs in flight against 32 WQEs posted with one call: every immediate
/// arrives once, in order, with the right data.
pub fn many_in_flight<D: Device>(da: &Arc<D>, db: &Arc<D>) {
    let (mut a, mut b) = (End::new(da, false, 1 << 17), End::new(db, true, 1 << 17));
    connect(&mut a, &mut b);
    b.srq.as_mut().unwrap().post_recv(32).expect("post_recv(32)");
    for i in 0..32usize {
        a.buf.bytes_mut()[i * 4096..(i + 1) * 4096].copy_from_slice(&pattern(i as u8, 4096));
    }
    let (rk, raddr) = (b.keys().rkey, b.addr(0));
    for i in 0..32usize {
        let w = wr(
            WrOpcode::WriteImm,
            i as u64,
            Some(a.sge(i * 4096, 4096)),
            raddr + (i * 4096) as u64,
            rk,
            1000 + i as u32,
            true,
        );
        a.qp.post_send(&[w]).expect("post");
    }
    let got = poll_until(&mut [&mut a.cq, &mut b.cq], &[32, 32]);
    assert_eq!(got[0].iter().map(|c| c.wr_id).collect::<Vec<_>>(), (0..32).collect::<Vec<u64>>());
    assert_eq!(got[1].iter().map(|c| c.imm).collect::<Vec<_>>(), (1000..1032).collect::<Vec<u32>>());
    assert!(got.iter().flatten().all(|c| c.status == WcStatus::Success));
    assert_eq!(&b.buf.bytes()[..32 * 4096], &a.buf.bytes()[..32 * 4096]);
}

/// A WRITE with a wrong rkey, and one past the end of the target region, fail with a
/// remote access error and leave the target untouched; WRs after the error are flushed.
pub fn bad_rkey_is_a_remote_access_error<D: Device>(da: &Arc<D>, db: &Arc<D>) {
    for case in ["wrong rkey", "out of bounds"] {
        let (mut a, mut b) = (End::new(da, false, 1 << 16), End::new(db, false, 1 << 16));
        connect(&mut a, &mut b);
        a.buf.bytes_mut().copy_from_slice(&pattern(9, 1 << 16));
        let (rk, raddr) = (b.keys().rkey, b.addr(0));
        let bad = match case {
            "wrong rkey" => wr(WrOpcode::Write, 1, Some(a.sge(0, 4096)), raddr, rk ^ 0x00ff_ff00, 0, true),
            _ => wr(WrOpcode::Write, 1, Some(a.sge(0, 4096)), raddr + (1 << 16) - 100, rk, 0, true),
        };
        a.qp.post_send(&[bad]).expect("post");
        let got = poll_until(&mut [&mut a.cq, &mut b.cq], &[1, 0]);
        assert_eq!((got[0][0].wr_id, got[0][0].status), (1, WcStatus::RemoteAccessError), "{case}: {:?}", got[0]);
        assert!(b.buf.bytes().iter().all(|x| *x == 0), "{case}: the target was written");
        // The QP is in error now: a later WR is flushed (or refused at post time).
        if a.qp.post_send(&[wr(WrOpcode::Write, 2, Some(a.sge(0, 64)), raddr, rk, 0, true)]).is_ok() {
            let got = poll_until(&mut [&mut a.cq, &mut b.cq], &[1, 0]);
            assert_eq!((got[0][0].wr_id, got[0][0].status), (2, WcStatus::Flushed), "{case}");
        }
        assert!(b.buf.bytes().iter().all(|x| *x == 0), "{case}: the target was written after the error");
    }
}

/// A WRITE_WITH_IMM that finds the SRQ empty waits (receiver not ready) instead of
/// failing, and completes on both sides once a WQE is posted.
pub fn rnr_with_empty_srq_recovers<D: Device>(da: &Arc<D>, db: &Arc<D>) {
    let (mut a, mut b) = (End::new(da, false, 1 << 16), End::new(db, true, 1 << 16));
    connect(&mut a, &mut b);
    a.buf.bytes_mut()[..1000].copy_from_slice(&pattern(5, 1000));
    let (rk, raddr) = (b.keys().rkey, b.addr(0));
    a.qp.post_send(&[wr(WrOpcode::WriteImm, 7, Some(a.sge(0, 1000)), raddr, rk, 42, true)]).expect("post");
    assert_quiet(&mut [&mut a.cq, &mut b.cq], Duration::from_millis(500), "no WQE posted yet");
    b.srq.as_mut().unwrap().post_recv(1).expect("post_recv");
    let got = poll_until(&mut [&mut a.cq, &mut b.cq], &[1, 1]);
    assert_eq!((got[0][0].wr_id, got[0][0].status), (7, WcStatus::Success), "{:?}", got[0]);
    assert_eq!((got[1][0].imm, got[1][0].byte_len, got[1][0].status), (42, 1000, WcStatus::Success));
    assert_eq!(&b.buf.bytes()[..1000], &pattern(5, 1000)[..]);
}

/// A QP connected to itself (the plugin's flush): a 1-byte READ and a WRITE within one
/// buffer.
pub fn loopback_qp<D: Device>(d: &Arc<D>) {
    let mut a = End::new(d, false, 1 << 16);
    let me = a.info();
    a.qp.connect(&me, &params()).expect("connect to itself");
    let t0 = Instant::now();
    while !a.qp.is_ready().unwrap() {
        assert!(t0.elapsed() < WAIT);
        let mut out = [Completion::default(); 1];
        a.cq.poll(&mut out).unwrap();
    }
    a.buf.bytes_mut()[..4096].copy_from_slice(&pattern(1, 4096));
    let rk = a.keys().rkey;
    let chain = [
        wr(WrOpcode::Read, 1, Some(a.sge(8192, 1)), a.addr(100), rk, 0, true),
        wr(WrOpcode::Write, 2, Some(a.sge(0, 4096)), a.addr(16_384), rk, 0, true),
    ];
    a.qp.post_send(&chain).expect("post");
    let got = poll_until(&mut [&mut a.cq], &[2]);
    let ids: Vec<(u64, WcStatus, WcOpcode)> = got[0].iter().map(|c| (c.wr_id, c.status, c.opcode)).collect();
    assert_eq!(ids, [(1, WcStatus::Success, WcOpcode::RdmaRead), (2, WcStatus::Success, WcOpcode::RdmaWrite)]);
    assert_eq!(a.buf.bytes()[8192], pattern(1, 4096)[100], "the flush READ copied the byte");
    assert_eq!(&a.buf.bytes()[16_384..16_384 + 4096], &pattern(1, 4096)[..]);
}

/// Role of the second process in [`peer_killed_mid_transfer`]: a target QP that connects,
/// says READY, and then waits to be killed.
pub fn peer_child<D: Device>(d: &Arc<D>) {
    let mut b = End::new(d, false, 8 << 20);
    let mut line = String::new();
    std::io::stdin().read_line(&mut line).expect("read parent's QP info");
    let parent = decode_info(line.trim().strip_prefix("QP ").expect("QP line"));
    b.qp.connect(&parent, &params()).expect("child connect");
    println!("READY {} {} {}", encode_info(&b.info()), b.addr(0), b.keys().rkey);
    std::io::stdout().flush().unwrap();
    // Keep everything alive until the parent kills this process.
    let mut rest = String::new();
    let _ = std::io::stdin().read_line(&mut rest);
}

/// Continuous 1 MiB WRITEs into a peer process that is then killed: the initiator gets an
/// error completion within `bound` of the kill (not a hang), the WRs after it are flushed,
/// and every posted WR completes.
pub fn peer_killed_mid_transfer<D: Device>(da: &Arc<D>, child: Program, conn: ConnectParams, bound: Duration) {
    let mut a = End::new(da, false, 1 << 20);
    // The peer process, killed and reaped however the test ends.
    let mut peer = Children::new();
    peer.start(&child).expect("spawn the peer process");
    peer.write_line(0, &format!("QP {}", encode_info(&a.info()))).unwrap();
    // A peer that never says READY cannot hang this test.
    let Some(rest) = peer.line_starting(0, "READY ", Instant::now() + WAIT) else {
        panic!("the peer process did not say READY within {WAIT:?}:\n{}", peer.output(0));
    };
    let f: Vec<String> = rest.split(' ').map(String::from).collect();
    let (info, addr, rkey) = (decode_info(&f[0]), f[1].parse::<u64>().unwrap(), f[2].parse::<u32>().unwrap());
    a.qp.connect(&info, &conn).expect("connect to the peer");
    let (mut posted, mut done, mut ok) = (0u64, 0u64, 0u64);
    let mut first_error: Option<(Completion, Duration)> = None;
    let mut killed_at: Option<Instant> = None;
    let t0 = Instant::now();
    let mut cqe = [Completion::default(); 16];
    loop {
        // Up to 8 WRITEs of 1 MiB outstanding (8 MiB target region, offset by slot).
        while first_error.is_none() && posted - done < 8 {
            let off = (posted % 8) << 20;
            a.qp.post_send(&[wr(WrOpcode::Write, posted, Some(a.sge(0, 1 << 20)), addr + off, rkey, 0, true)])
                .expect("post");
            posted += 1;
        }
        let n = a.cq.poll(&mut cqe).expect("poll");
        for c in &cqe[..n] {
            done += 1;
            match (c.status, &first_error) {
                (WcStatus::Success, None) => ok += 1,
                (WcStatus::Success, Some(_)) => panic!("success after the first error: {c:?}"),
                (_, None) => {
                    let since = killed_at.expect("an error completion before the peer was killed").elapsed();
                    first_error = Some((*c, since));
                }
                (s, Some(_)) => assert_eq!(s, WcStatus::Flushed, "after the first error: {c:?}"),
            }
        }
        if killed_at.is_none() && ok >= 2 {
            peer.kill(0).unwrap();
            killed_at = Some(Instant::now());
        }
        if first_error.is_some() && done == posted {
            break;
        }
        if let Some(k) = killed_at {
            assert!(
                k.elapsed() < bound,
                "no error completion {bound:?} after the peer was killed ({done}/{posted} done)"
            );
        }
        assert!(t0.elapsed() < WAIT + bound, "transfer never got going: {ok} of {posted} done");
        std::thread::sleep(Duration::from_micros(200));
    }
    let (c, since) = first_error.unwrap();
    println!(
        "peer killed after {ok} writes: first error {:?} after {since:?}, {} WRs flushed",
        c.status,
        posted - ok - 1
    );
    assert_ne!(c.status, WcStatus::Flushed, "the first error names the cause, not a flush: {c:?}");
}

pub fn encode_info(q: &QpInfo) -> String {
    q.0.iter().map(|b| format!("{b:02x}")).collect()
}

pub fn decode_info(s: &str) -> QpInfo {
    let mut q = QpInfo::default();
    for (i, b) in q.0.iter_mut().enumerate() {
        *b = u8::from_str_radix(&s[2 * i..2 * i + 2], 16).expect("hex QP info");
    }
    q
}

/// Two connections whose QPs on device `a` share one small CQ: it is grown (`resize`)
/// while it holds completions, which it keeps, in order, and it then takes more than its
/// first depth.
pub fn shared_cq_grows_and_keeps_its_completions<D: Device>(da: &Arc<D>, db: &Arc<D>) {
    let cq = da.create_cq(16, Timestamps::Off).expect("create_cq");
    let mut a1 = End::with_cq(da, cq, false, 1 << 16);
    let mut b1 = End::new(db, false, 1 << 16);
    connect(&mut a1, &mut b1);
    // The second connection's QP on the same CQ.
    let mut a2 = End::new(da, false, 1 << 16);
    let mut b2 = End::new(db, false, 1 << 16);
    a2.qp = da.create_qp(&a1.cq, None, QpCaps { max_send_wr: 256, max_inline: 0 }).expect("create_qp on the shared CQ");
    connect(&mut a2, &mut b2);
    let post = |a: &mut End<D>, b: &End<D>, ids: std::ops::Range<u64>| {
        for i in ids {
            let w = wr(WrOpcode::Write, i, Some(a.sge(0, 64)), b.addr(0), b.keys().rkey, 0, true);
            a.qp.post_send(&[w]).expect("post");
        }
    };
    post(&mut a1, &b1, 0..6);
    post(&mut a2, &b2, 1000..1006);
    // Let them complete (into the CQ) before it grows.
    std::thread::sleep(Duration::from_millis(200));
    a1.cq.resize(512).expect("resize");
    post(&mut a1, &b1, 6..100);
    post(&mut a2, &b2, 1006..1100);
    let got = poll_until(&mut [&mut a1.cq, &mut b1.cq, &mut b2.cq], &[200, 0, 0]).swap_remove(0);
    assert!(got.iter().all(|c| c.status == WcStatus::Success), "{got:?}");
    let q1: Vec<u64> = got.iter().filter(|c| c.qp_num == a1.qp.qp_num()).map(|c| c.wr_id).collect();
    let q2: Vec<u64> = got.iter().filter(|c| c.qp_num == a2.qp.qp_num()).map(|c| c.wr_id).collect();
    assert_eq!(q1, (0..100).collect::<Vec<_>>(), "connection 1 in order");
    assert_eq!(q2, (1000..1100).collect::<Vec<_>>(), "connection 2 in order");
}

/// A QP that is closed while others keep polling its CQ: `drain_marker` puts it in the
/// error state and posts a marker that completes after every earlier WR. (A provider that
/// answers `false` posts nothing: nothing to check.)
pub fn drain_marker_comes_last<D: Device>(da: &Arc<D>, db: &Arc<D>) {
    let (mut a, mut b) = (End::new(da, false, 1 << 16), End::new(db, false, 1 << 16));
    connect(&mut a, &mut b);
    for i in 0..8u64 {
        let w = wr(WrOpcode::Write, i, Some(a.sge(0, 4096)), b.addr(0), b.keys().rkey, 0, i % 2 == 1);
        a.qp.post_send(&[w]).expect("post");
    }
    const MARKER: u64 = 0xf << 60;
    if !a.qp.drain_marker(MARKER).expect("drain_marker") {
        return;
    }
    let t0 = Instant::now();
    let mut got = Vec::new();
    let mut out = [Completion::default(); 8];
    while !got.iter().any(|c: &Completion| c.wr_id == MARKER) {
        assert!(t0.elapsed() < WAIT, "no marker after {WAIT:?}: {got:?}");
        let n = a.cq.poll(&mut out).expect("poll");
        got.extend_from_slice(&out[..n]);
        b.cq.poll(&mut out).expect("poll");
    }
    let last = got.last().unwrap();
    assert_eq!((last.wr_id, last.status), (MARKER, WcStatus::Flushed), "the marker comes last, flushed: {got:?}");
    // Before it: the signalled WRs (done or flushed) and any unsignalled one that was
    // flushed, each once, in posting order.
    let ids: Vec<u64> = got[..got.len() - 1].iter().map(|c| c.wr_id).collect();
    assert!(ids.windows(2).all(|w| w[0] < w[1]) && ids.iter().all(|&i| i < 8), "{got:?}");
    for i in [1u64, 3, 5, 7] {
        assert!(ids.contains(&i), "signalled WR {i} completed before the marker: {got:?}");
    }
    assert_quiet(&mut [&mut a.cq], Duration::from_millis(100), "after the marker");
}
