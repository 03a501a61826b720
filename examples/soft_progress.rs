//! Measures the soft fabric's progress design: how the helper thread's idle threshold
//! (`HELPER_IDLE`, how long callers must be quiet before it steps in) affects
//! - the round trip of an 8-byte signalled WRITE (post → completion) when the responder
//!   process polls its CQ, and when it makes no calls at all (only its helper serves);
//! - 4 MiB WRITE bandwidth with a polling responder;
//! - the CPU time and wake-ups of the helper threads during the round trips with a polling
//!   responder (both processes' callers busy, as NCCL's proxy threads are).
//!
//! `cargo run --release --example soft_progress [seconds per run, default 0.5]`

use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::{Duration, Instant};

use mpib::config::{Config, FabricChoice, RailAddr};
use mpib::fabric::soft::{SoftCq, SoftDevice, SoftMr, SoftQp, open_rail_pairs, set_helper_idle};
use mpib::fabric::{
    Access, Completion, CompletionQueue, ConnectParams, Device, QpCaps, QueuePair, SendWr, Sge, WrOpcode,
};

struct Link {
    acq: SoftCq,
    aqp: SoftQp,
    _bqp: SoftQp,
    bcq: Option<SoftCq>,
    src: Vec<u8>,
    dst: Vec<u8>,
    mrs: (SoftMr, SoftMr),
    _devs: (Arc<SoftDevice>, Arc<SoftDevice>),
}

fn link(size: usize) -> Link {
    let cfg = Config {
        fabric: FabricChoice::Soft,
        soft_sout_addr: Some(RailAddr::Ip("127.0.0.1".parse().unwrap())),
        soft_sup_addr: Some(RailAddr::Ip("127.0.0.1".parse().unwrap())),
        ..Config::default()
    };
    let a = open_rail_pairs(&cfg).unwrap().pop().unwrap().sout;
    let b = open_rail_pairs(&cfg).unwrap().pop().unwrap().sout;
    let params = ConnectParams { traffic_class: 0, service_level: 0, timeout: 20, retry_cnt: 7 };
    let caps = QpCaps { max_send_wr: 64, max_inline: 0 };
    let (acq, bcq) = (a.create_cq(256, false).unwrap(), b.create_cq(256, false).unwrap());
    let mut aqp = a.create_qp(&acq, None, caps).unwrap();
    let mut bqp = b.create_qp(&bcq, None, caps).unwrap();
    let (mut src, mut dst) = (vec![1u8; size], vec![0u8; size]);
    let amr = a.reg_mr(src.as_mut_ptr(), size, Access::LOCAL_WRITE).unwrap();
    let bmr = b.reg_mr(dst.as_mut_ptr(), size, Access::REMOTE_WRITE).unwrap();
    let (ia, ib) = (aqp.local_info(), bqp.local_info());
    aqp.connect(&ib, &params).unwrap();
    bqp.connect(&ia, &params).unwrap();
    while !(aqp.is_ready().unwrap() & bqp.is_ready().unwrap()) {}
    Link { acq, aqp, _bqp: bqp, bcq: Some(bcq), src, dst, mrs: (amr, bmr), _devs: (a, b) }
}

impl Link {
    fn wr(&self, len: usize) -> SendWr {
        let mut sge = [Sge::default(); 2];
        sge[0] = Sge { addr: self.src.as_ptr() as u64, len: len as u32, lkey: SoftDevice::mr_keys(&self.mrs.0).lkey };
        SendWr {
            opcode: WrOpcode::Write,
            signaled: true,
            num_sge: 1,
            sge,
            remote_addr: self.dst.as_ptr() as u64,
            rkey: SoftDevice::mr_keys(&self.mrs.1).rkey,
            ..SendWr::default()
        }
    }

    /// Runs `f` while another thread polls the responder's CQ (if `poll`).
    fn with_responder<T>(&mut self, poll: bool, f: impl FnOnce(&mut Link) -> T) -> T {
        let stop = Arc::new(AtomicBool::new(false));
        let (s2, mut cq) = (stop.clone(), self.bcq.take().unwrap());
        let t = std::thread::spawn(move || {
            let mut wc = [Completion::default(); 16];
            while !s2.load(Ordering::Relaxed) {
                if poll {
                    cq.poll(&mut wc).unwrap();
                } else {
                    std::thread::sleep(Duration::from_millis(5));
                }
            }
            cq
        });
        let r = f(self);
        stop.store(true, Ordering::Relaxed);
        self.bcq = Some(t.join().unwrap());
        r
    }
}

/// (median, p99) round trip of 8-byte WRITEs in µs.
fn rtt(l: &mut Link, run: Duration) -> (f64, f64) {
    let wr = l.wr(8);
    let mut wc = [Completion::default(); 4];
    let mut s = Vec::new();
    let t = Instant::now();
    while t.elapsed() < run {
        let p = Instant::now();
        l.aqp.post_send(&[wr]).unwrap();
        while l.acq.poll(&mut wc).unwrap() == 0 {}
        s.push(p.elapsed().as_secs_f64() * 1e6);
    }
    s.sort_by(f64::total_cmp);
    (s[s.len() / 2], s[s.len() * 99 / 100])
}

fn bandwidth(l: &mut Link, run: Duration) -> f64 {
    let wr = l.wr(l.src.len());
    let mut wc = [Completion::default(); 16];
    let (mut posted, mut done) = (0usize, 0usize);
    let t = Instant::now();
    while t.elapsed() < run || done < posted {
        while posted - done < 4 && t.elapsed() < run {
            l.aqp.post_send(&[wr]).unwrap();
            posted += 1;
        }
        done += l.acq.poll(&mut wc).unwrap();
    }
    (done * l.src.len()) as f64 / t.elapsed().as_secs_f64() / 1e9
}

/// CPU ns and voluntary context switches (wake-ups) of this process's helper threads.
fn helper_stats() -> (u64, u64) {
    let (mut ns, mut sw) = (0, 0);
    for t in std::fs::read_dir("/proc/self/task").unwrap().flatten() {
        let p = t.path();
        if !std::fs::read_to_string(p.join("comm")).unwrap_or_default().starts_with("mpib-") {
            continue;
        }
        let sched = std::fs::read_to_string(p.join("schedstat")).unwrap_or_default();
        ns += sched.split_whitespace().next().and_then(|v| v.parse::<u64>().ok()).unwrap_or(0);
        let status = std::fs::read_to_string(p.join("status")).unwrap_or_default();
        sw += status
            .lines()
            .find(|l| l.starts_with("voluntary_ctxt_switches"))
            .and_then(|l| l.split_whitespace().nth(1)?.parse::<u64>().ok())
            .unwrap_or(0);
    }
    (ns, sw)
}

fn main() {
    let secs: f64 = std::env::args().nth(1).and_then(|s| s.parse().ok()).unwrap_or(0.5);
    let run = Duration::from_secs_f64(secs);
    println!(
        "helper idle | RTT responder idle (med/p99 us) | RTT responder polls | 4 MiB BW, responder polls | helper CPU, wake-ups/s while it polls"
    );
    for idle_ms in [0u64, 1, 10] {
        set_helper_idle(Duration::from_millis(idle_ms));
        let mut small = link(64);
        let idle_rtt = small.with_responder(false, |l| rtt(l, run));
        let (cpu0, sw0) = helper_stats();
        let t = Instant::now();
        let busy_rtt = small.with_responder(true, |l| rtt(l, run));
        let (cpu1, sw1) = helper_stats();
        let el = t.elapsed().as_secs_f64();
        drop(small);
        let mut big = link(4 << 20);
        let bw = big.with_responder(true, |l| bandwidth(l, run));
        println!(
            "{idle_ms:>8} ms | {:>8.1} / {:>8.1} | {:>7.1} / {:>7.1} | {bw:>6.2} GB/s | {:>5.1}% CPU, {:>7.0}/s",
            idle_rtt.0,
            idle_rtt.1,
            busy_rtt.0,
            busy_rtt.1,
            (cpu1 - cpu0) as f64 / 1e9 / el * 100.0,
            (sw1 - sw0) as f64 / el
        );
    }
}
