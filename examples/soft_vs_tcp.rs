//! Bandwidth of 4 MiB RDMA WRITEs through the soft fabric against raw TCP, over loopback,
//! one socket each, in the same run. Prints the figures and, last, `soft_vs_tcp: <ratio>`
//! (soft with a polling receiver, as NCCL's proxy thread polls, over raw TCP).
//!
//! `cargo run --release --example soft_vs_tcp [seconds per run, default 1] [rounds, default 3]`
//! (rounds interleave the modes so load from other processes hits them alike; medians).

use std::io::{Read, Write};
use std::net::{TcpListener, TcpStream};
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::{Duration, Instant};

use mpib::config::{Config, FabricChoice, RailAddr};
use mpib::fabric::soft::{SoftDevice, open_rail_pairs};
use mpib::fabric::{
    Access, Completion, CompletionQueue, ConnectParams, Device, QpCaps, QueuePair, SendWr, Sge, WcStatus, WrOpcode,
};

const SIZE: usize = 4 << 20;
const WINDOW: usize = 4;

fn gbps(bytes: u64, t: Duration) -> f64 {
    bytes as f64 / t.as_secs_f64() / 1e9
}

fn raw_tcp(run: Duration) -> f64 {
    let l = TcpListener::bind("127.0.0.1:0").unwrap();
    let addr = l.local_addr().unwrap();
    let rx = std::thread::spawn(move || {
        let (mut s, _) = l.accept().unwrap();
        s.set_nodelay(true).unwrap();
        let mut buf = vec![0u8; SIZE];
        let mut total = 0u64;
        let mut start = None;
        loop {
            match s.read(&mut buf) {
                Ok(0) | Err(_) => break,
                Ok(n) => {
                    start.get_or_insert_with(Instant::now);
                    total += n as u64;
                }
            }
        }
        (total, start.map_or(Duration::ZERO, |s| s.elapsed()))
    });
    let mut s = TcpStream::connect(addr).unwrap();
    s.set_nodelay(true).unwrap();
    let buf = vec![7u8; SIZE];
    let t = Instant::now();
    while t.elapsed() < run {
        s.write_all(&buf).unwrap();
    }
    drop(s);
    let (bytes, took) = rx.join().unwrap();
    gbps(bytes, took)
}

fn soft(run: Duration, receiver_polls: bool) -> f64 {
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
    let mut src = vec![7u8; SIZE];
    let mut dst = vec![0u8; SIZE];
    let (mut acq, mut bcq) = (a.create_cq(256, false).unwrap(), b.create_cq(256, false).unwrap());
    let bsrq = b.create_srq(16).unwrap();
    let mut aqp = a.create_qp(&acq, None, caps).unwrap();
    let mut bqp = b.create_qp(&bcq, Some(&bsrq), caps).unwrap();
    let amr = a.reg_mr(src.as_mut_ptr(), SIZE, Access::LOCAL_WRITE).unwrap();
    let bmr = b.reg_mr(dst.as_mut_ptr(), SIZE, Access::REMOTE_WRITE | Access::LOCAL_WRITE).unwrap();
    let (ia, ib) = (aqp.local_info(), bqp.local_info());
    aqp.connect(&ib, &params).unwrap();
    bqp.connect(&ia, &params).unwrap();
    while !(aqp.is_ready().unwrap() & bqp.is_ready().unwrap()) {}
    let stop = Arc::new(AtomicBool::new(false));
    let stop2 = stop.clone();
    let receiver = std::thread::spawn(move || {
        let mut wc = [Completion::default(); 16];
        while !stop2.load(Ordering::Relaxed) {
            if receiver_polls {
                bcq.poll(&mut wc).unwrap();
            } else {
                std::thread::sleep(Duration::from_millis(10));
            }
        }
        (bcq, bqp)
    });
    let mut sge = [Sge::default(); 2];
    sge[0] = Sge { addr: src.as_ptr() as u64, len: SIZE as u32, lkey: SoftDevice::mr_keys(&amr).lkey };
    let wr = SendWr {
        opcode: WrOpcode::Write,
        signaled: true,
        num_sge: 1,
        sge,
        remote_addr: dst.as_ptr() as u64,
        rkey: SoftDevice::mr_keys(&bmr).rkey,
        ..SendWr::default()
    };
    let mut wc = [Completion::default(); 16];
    let (mut posted, mut done) = (0usize, 0usize);
    let t = Instant::now();
    while t.elapsed() < run || done < posted {
        while posted - done < WINDOW && t.elapsed() < run {
            aqp.post_send(&[wr]).unwrap();
            posted += 1;
        }
        let n = acq.poll(&mut wc).unwrap();
        for c in &wc[..n] {
            assert_eq!(c.status, WcStatus::Success);
        }
        done += n;
    }
    let took = t.elapsed();
    stop.store(true, Ordering::Relaxed);
    let _keep = receiver.join().unwrap();
    assert!(dst.iter().all(|b| *b == 7));
    gbps((done * SIZE) as u64, took)
}

fn median(mut v: Vec<f64>) -> f64 {
    v.sort_by(f64::total_cmp);
    v[v.len() / 2]
}

fn main() {
    let secs: f64 = std::env::args().nth(1).and_then(|s| s.parse().ok()).unwrap_or(1.0);
    let rounds: usize = std::env::args().nth(2).and_then(|s| s.parse().ok()).unwrap_or(3);
    let run = Duration::from_secs_f64(secs);
    println!("4 MiB writes over loopback, one socket each; {rounds} interleaved rounds of {secs} s per mode, medians");
    let (mut tcp, mut polled, mut idle) = (Vec::new(), Vec::new(), Vec::new());
    for r in 0..rounds {
        tcp.push(raw_tcp(run));
        polled.push(soft(run, true));
        idle.push(soft(run, false));
        println!(
            "round {r}: raw TCP {:.2} GB/s, soft polled {:.2} GB/s, soft idle {:.2} GB/s",
            tcp[r], polled[r], idle[r]
        );
    }
    let (tcp, polled, idle) = (median(tcp), median(polled), median(idle));
    println!("raw TCP:                              {tcp:.2} GB/s");
    println!("soft, receiver polls its CQ:          {polled:.2} GB/s");
    println!("soft, receiver idle (helper serves):  {idle:.2} GB/s");
    println!("soft_vs_tcp: {:.2}", polled / tcp);
}
