//! Tests of `cq.rs`: status and opcode mapping, timestamps, and the extended-CQ poll
//! against a fake `ibv_cq_ex` that checks the batch discipline.

use super::*;
use ibv::ibv_wc_opcode as o;
use ibv::ibv_wc_status as s;

fn wc(status: u32, opcode: u32, flags: u32, imm_be: u32) -> ibv::ibv_wc {
    // SAFETY: all-zero is a valid ibv_wc.
    let mut w: ibv::ibv_wc = unsafe { std::mem::zeroed() };
    w.wr_id = 0xfeed;
    w.status = status;
    w.opcode = opcode;
    w.wc_flags = flags;
    w.byte_len = 4096;
    w.qp_num = 17;
    w.imm_data_invalidated_rkey_union.imm_data = imm_be;
    w
}

#[test]
fn error_statuses_map_and_keep_unknown_codes() {
    assert_eq!(map_status(s::IBV_WC_SUCCESS), WcStatus::Success);
    assert_eq!(map_status(s::IBV_WC_LOC_LEN_ERR), WcStatus::LocalError);
    assert_eq!(map_status(s::IBV_WC_LOC_PROT_ERR), WcStatus::LocalError);
    assert_eq!(map_status(s::IBV_WC_REM_ACCESS_ERR), WcStatus::RemoteAccessError);
    assert_eq!(map_status(s::IBV_WC_REM_INV_REQ_ERR), WcStatus::RemoteOpError);
    assert_eq!(map_status(s::IBV_WC_REM_OP_ERR), WcStatus::RemoteOpError);
    assert_eq!(map_status(s::IBV_WC_RETRY_EXC_ERR), WcStatus::RetryExceeded);
    assert_eq!(map_status(s::IBV_WC_RNR_RETRY_EXC_ERR), WcStatus::RnrRetryExceeded);
    assert_eq!(map_status(s::IBV_WC_WR_FLUSH_ERR), WcStatus::Flushed);
    assert_eq!(map_status(s::IBV_WC_FATAL_ERR), WcStatus::Other(s::IBV_WC_FATAL_ERR));
    assert_eq!(map_status(s::IBV_WC_GENERAL_ERR), WcStatus::Other(21));
    assert_eq!(map_status(s::IBV_WC_LOC_QP_OP_ERR), WcStatus::LocalQpError);
    for st in [
        WcStatus::RemoteAccessError,
        WcStatus::RetryExceeded,
        WcStatus::Flushed,
        WcStatus::LocalQpError,
        WcStatus::Other(19),
    ] {
        assert_eq!(map_status(status_code(st)), st, "round trip of {st:?}");
    }
}

#[test]
fn immediate_data_is_converted_from_network_order() {
    let c = from_wc(&wc(
        s::IBV_WC_SUCCESS,
        o::IBV_WC_RECV_RDMA_WITH_IMM,
        ibv::ibv_wc_flags::IBV_WC_WITH_IMM.0,
        0x0102_0304u32.to_be(),
    ));
    assert_eq!(c.opcode, WcOpcode::RecvRdmaWithImm);
    assert_eq!(c.imm, 0x0102_0304);
    assert_eq!((c.wr_id, c.byte_len, c.qp_num, c.status), (0xfeed, 4096, 17, WcStatus::Success));
    // Without the WITH_IMM flag the union holds no immediate.
    let c = from_wc(&wc(s::IBV_WC_SUCCESS, o::IBV_WC_RDMA_WRITE, 0, 0xdead_beef));
    assert_eq!((c.opcode, c.imm), (WcOpcode::RdmaWrite, 0));
    assert_eq!(from_wc(&wc(s::IBV_WC_SUCCESS, o::IBV_WC_RDMA_READ, 0, 0)).opcode, WcOpcode::RdmaRead);
}

#[test]
fn unexpected_opcodes_are_errors_and_failed_opcodes_are_ignored() {
    let c = from_wc(&wc(s::IBV_WC_SUCCESS, o::IBV_WC_RECV, 0, 0));
    assert_eq!(c.status, WcStatus::Other(UNEXPECTED_OPCODE | o::IBV_WC_RECV));
    assert!(wc_status_str(c.status).contains("unexpected completion opcode"));
    // A flushed WR reports garbage as opcode: the status stays the flush.
    let c = from_wc(&wc(s::IBV_WC_WR_FLUSH_ERR, 0x7777, 0, 0));
    assert_eq!(c.status, WcStatus::Flushed);
}

/// A fake extended CQ: `items` are its completions (wr_id, imm), `avail` how many of them
/// the "NIC" has written so far; it records every poll call, and checks the batch
/// discipline the man page sets (end_poll once per successful start_poll, nothing after
/// an ENOENT of next_poll but end_poll).
#[repr(C)]
struct FakeCq {
    ex: ibv::ibv_cq_ex,
    items: Vec<(u64, u32)>,
    avail: usize,
    /// The next completion to hand out, and the current one.
    next: usize,
    cur: usize,
    in_batch: bool,
    dry: bool,
    calls: Vec<&'static str>,
}

unsafe fn fake<'a>(cq: *mut ibv::ibv_cq_ex) -> &'a mut FakeCq {
    // SAFETY: every ibv_cq_ex handed to these functions is the first field of a FakeCq.
    unsafe { &mut *(cq as *mut FakeCq) }
}

unsafe extern "C" fn start(cq: *mut ibv::ibv_cq_ex, _: *mut ibv::ibv_poll_cq_attr) -> i32 {
    // SAFETY: see `fake`.
    let f = unsafe { fake(cq) };
    f.calls.push("start");
    assert!(!f.in_batch, "start_poll inside a batch");
    if f.next == f.avail {
        return libc::ENOENT;
    }
    (f.in_batch, f.dry) = (true, false);
    f.take()
}

unsafe extern "C" fn next(cq: *mut ibv::ibv_cq_ex) -> i32 {
    // SAFETY: see `fake`.
    let f = unsafe { fake(cq) };
    f.calls.push("next");
    assert!(f.in_batch && !f.dry, "next_poll outside a batch, or after ENOENT");
    if f.next == f.avail {
        f.dry = true;
        return libc::ENOENT;
    }
    f.take()
}

unsafe extern "C" fn end(cq: *mut ibv::ibv_cq_ex) {
    // SAFETY: see `fake`.
    let f = unsafe { fake(cq) };
    f.calls.push("end");
    assert!(f.in_batch, "end_poll without a batch");
    f.in_batch = false;
}

unsafe extern "C" fn opcode(_: *mut ibv::ibv_cq_ex) -> u32 {
    o::IBV_WC_RECV_RDMA_WITH_IMM
}
unsafe extern "C" fn byte_len(_: *mut ibv::ibv_cq_ex) -> u32 {
    64
}
unsafe extern "C" fn imm(cq: *mut ibv::ibv_cq_ex) -> u32 {
    // SAFETY: see `fake`.
    let f = unsafe { fake(cq) };
    f.items[f.cur].1.to_be()
}
unsafe extern "C" fn qp_num(_: *mut ibv::ibv_cq_ex) -> u32 {
    5
}
unsafe extern "C" fn wc_flags(_: *mut ibv::ibv_cq_ex) -> u32 {
    ibv::ibv_wc_flags::IBV_WC_WITH_IMM.0
}

impl FakeCq {
    fn new(n: usize) -> Box<FakeCq> {
        // SAFETY: all-zero is a valid ibv_cq_ex (NULL pointers, no functions, zeroes).
        let mut ex: ibv::ibv_cq_ex = unsafe { std::mem::zeroed() };
        ex.start_poll = Some(start);
        ex.next_poll = Some(next);
        ex.end_poll = Some(end);
        ex.read_opcode = Some(opcode);
        ex.read_byte_len = Some(byte_len);
        ex.read_imm_data = Some(imm);
        ex.read_qp_num = Some(qp_num);
        ex.read_wc_flags = Some(wc_flags);
        let items = (0..n as u64).map(|i| (1000 + i, 0xa000 + i as u32)).collect();
        Box::new(FakeCq { ex, items, avail: 0, next: 0, cur: 0, in_batch: false, dry: false, calls: Vec::new() })
    }

    fn take(&mut self) -> i32 {
        self.cur = self.next;
        self.next += 1;
        (self.ex.wr_id, self.ex.status) = (self.items[self.cur].0, s::IBV_WC_SUCCESS);
        0
    }

    fn poll(&mut self, batches: PollBatches, out: &mut [Completion]) -> usize {
        self.calls.clear();
        // SAFETY: a FakeCq with every function poll_ex uses.
        let n = unsafe { poll_ex(&mut self.ex, TsClock::None, batches, out) }.expect("poll");
        assert!(!self.in_batch, "poll_ex returned inside a batch: {:?}", self.calls);
        n
    }
}

#[test]
fn extended_cqs_are_polled_in_batches_each_completion_once() {
    let mut cq = FakeCq::new(40);
    let mut out = [Completion::default(); 16];
    let mut got = Vec::new();
    // 10 written: one batch takes them all (start, 9 next, the 10th next finds none, end).
    cq.avail = 10;
    let n = cq.poll(PollBatches::Many, &mut out);
    got.extend_from_slice(&out[..n]);
    assert_eq!(n, 10);
    assert_eq!(cq.calls.iter().filter(|c| **c == "start").count(), 1, "{:?}", cq.calls);
    assert_eq!(cq.calls.last(), Some(&"end"));
    // 30 more: the buffer (16) ends a batch; the next poll call takes the rest.
    cq.avail = 40;
    let n = cq.poll(PollBatches::Many, &mut out);
    got.extend_from_slice(&out[..n]);
    assert_eq!((n, cq.calls.iter().filter(|c| **c == "next").count()), (16, 15), "{:?}", cq.calls);
    let n = cq.poll(PollBatches::Many, &mut out);
    got.extend_from_slice(&out[..n]);
    assert_eq!(n, 14);
    // Empty: one start_poll that finds nothing, no end_poll.
    assert_eq!(cq.poll(PollBatches::Many, &mut out), 0);
    assert_eq!(cq.calls, ["start"]);
    assert_eq!(got.iter().map(|c| c.wr_id).collect::<Vec<_>>(), (1000..1040).collect::<Vec<u64>>());
    assert!(got.iter().enumerate().all(|(i, c)| c.imm == 0xa000 + i as u32
        && c.opcode == WcOpcode::RecvRdmaWithImm
        && (c.byte_len, c.qp_num, c.status) == (64, 5, WcStatus::Success)));
}

#[test]
fn one_completion_per_batch_never_calls_next_poll() {
    let mut cq = FakeCq::new(5);
    cq.ex.next_poll = None;
    cq.avail = 5;
    let mut out = [Completion::default(); 16];
    assert_eq!(cq.poll(PollBatches::One, &mut out), 5);
    let want: Vec<&str> = (0..5).flat_map(|_| ["start", "end"]).chain(["start"]).collect();
    assert_eq!(cq.calls, want);
    assert_eq!(out[..5].iter().map(|c| c.wr_id).collect::<Vec<_>>(), [1000, 1001, 1002, 1003, 1004]);
}

#[test]
fn timestamp_clocks() {
    assert_eq!(TsClock::None.to_ns(123), 0);
    assert_eq!(TsClock::Wallclock.to_ns(123_456), 123_456);
    let c = TsClock::raw(1_000_000); // 1 GHz: 1 tick = 1 ns
    assert_eq!(c.to_ns(5_000_000_000), 5_000_000_000);
    let c = TsClock::raw(156_250); // 156.25 MHz: 6.4 ns per tick
    assert_eq!(c.to_ns(1_000), 6_400);
    assert_eq!(c.to_ns(1 << 60), ((1u128 << 60) * 64 / 10) as u64, "no overflow on large counters");
    assert_eq!(TsClock::raw(0), TsClock::Raw { khz: 1 }, "never divides by 0");
}
