//! Measures the soft fabric's progress design: how the helper thread's idle threshold
//! (`HELPER_IDLE`, how long callers must be quiet before it steps in) affects
//! - the round trip of an 8-byte signalled WRITE (post → completion) when the responder
//!   process polls its CQ, and when it makes no calls at all (only its helper serves);
//! - 4 MiB WRITE bandwidth with a polling responder;
//! - the CPU time and wake-ups of the helper threads during the round trips with a polling
//!   responder (both processes' callers busy, as NCCL's proxy threads are).
//!
//! `cargo run --release --example soft_progress [seconds per run, default 0.5]`

#[path = "common/soft_link.rs"]
mod soft_link;

use std::time::{Duration, Instant};

use mpib::fabric::{Completion, CompletionQueue, QueuePair};
use soft_link::{Link, bandwidth, link};

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
        "helper idle | RTT responder idle (med/p99 us) | RTT responder polls | 4 MiB BW, responder polls | helpers during polled RTT: CPU, wake-ups/s"
    );
    for idle_ms in [0u64, 1, 10] {
        let idle = Duration::from_millis(idle_ms);
        let mut small = link(64, idle);
        let idle_rtt = small.with_responder(false, |l| rtt(l, run));
        let (cpu0, sw0) = helper_stats();
        let t = Instant::now();
        let busy_rtt = small.with_responder(true, |l| rtt(l, run));
        let (cpu1, sw1) = helper_stats();
        let el = t.elapsed().as_secs_f64();
        drop(small);
        let mut big = link(4 << 20, idle);
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
