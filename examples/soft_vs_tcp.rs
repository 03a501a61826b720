//! Bandwidth of RDMA WRITEs (4 MiB unless told) through the soft fabric against raw TCP, over loopback,
//! one socket each, in the same run. Prints the figures and, last, `soft_vs_tcp: <ratio>`
//! (soft with a polling receiver, as NCCL's proxy thread polls, over raw TCP).
//!
//! `cargo run --release --example soft_vs_tcp [seconds per run, default 1] [rounds, default 3] [MiB per write, default 4]`
//! (rounds interleave the modes so load from other processes hits them alike; medians).

use std::io::{Read, Write};
use std::net::{TcpListener, TcpStream};
#[path = "common/soft_link.rs"]
mod soft_link;

use std::time::{Duration, Instant};

use soft_link::{bandwidth, link};

fn gbps(bytes: u64, t: Duration) -> f64 {
    bytes as f64 / t.as_secs_f64() / 1e9
}

fn raw_tcp(run: Duration, size: usize) -> f64 {
    let l = TcpListener::bind("127.0.0.1:0").unwrap();
    let addr = l.local_addr().unwrap();
    let rx = std::thread::spawn(move || {
        let (mut s, _) = l.accept().unwrap();
        s.set_nodelay(true).unwrap();
        let mut buf = vec![0u8; size];
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
    let buf = vec![7u8; size];
    let t = Instant::now();
    while t.elapsed() < run {
        s.write_all(&buf).unwrap();
    }
    drop(s);
    let (bytes, took) = rx.join().unwrap();
    gbps(bytes, took)
}

fn soft(run: Duration, receiver_polls: bool, size: usize) -> f64 {
    let mut l = link(size, mpib::fabric::soft::HELPER_IDLE);
    l.src.fill(7);
    let bw = l.with_responder(receiver_polls, |l| bandwidth(l, run));
    assert!(l.dst.iter().all(|b| *b == 7), "the data arrived");
    bw
}

fn median(mut v: Vec<f64>) -> f64 {
    v.sort_by(f64::total_cmp);
    v[v.len() / 2]
}

fn main() {
    let secs: f64 = std::env::args().nth(1).and_then(|s| s.parse().ok()).unwrap_or(1.0);
    let rounds: usize = std::env::args().nth(2).and_then(|s| s.parse().ok()).unwrap_or(3);
    let mib: usize = std::env::args().nth(3).and_then(|s| s.parse().ok()).unwrap_or(4);
    let size = mib << 20;
    let run = Duration::from_secs_f64(secs);
    println!(
        "{mib} MiB writes over loopback, one socket each; {rounds} interleaved rounds of {secs} s per mode, medians"
    );
    let (mut tcp, mut polled, mut idle) = (Vec::new(), Vec::new(), Vec::new());
    for r in 0..rounds {
        tcp.push(raw_tcp(run, size));
        polled.push(soft(run, true, size));
        idle.push(soft(run, false, size));
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
