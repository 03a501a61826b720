//! Cost per message through the C ABI: N 8-byte messages between a send comm and a receive
//! comm in ONE process on the in-process fabric (`MPIB_FABRIC=inproc`: no threads, no
//! sockets), each checked on arrival. The plugin is `dlopen`ed and driven through
//! `ncclNetPlugin_v12` exactly as NCCL would (same-thread listen → connect → accept, then
//! irecv / isend / test), so the figure is the plugin's own cost per isend + irecv + test
//! round, both sides together, plus a thin driver.
//!
//! ```text
//! cargo run --release --example inproc_msgs -- [N=200000] [WINDOW=1]
//! ```
//! The last line is `ns_per_msg: <x>`. Instructions per message (the goal is ≤ 3,000):
//! ```text
//! cargo build --release --example inproc_msgs
//! valgrind --tool=callgrind --callgrind-out-file=cg.20k target/release/examples/inproc_msgs 20000
//! valgrind --tool=callgrind --callgrind-out-file=cg.40k target/release/examples/inproc_msgs 40000
//! # (Ir of cg.40k - Ir of cg.20k) / 20000, Ir from the "summary:" line of each file
//! ```

use std::collections::VecDeque;
use std::process::ExitCode;
use std::time::{Duration, Instant};

use mpib::driver::net::{RecvBuf, Request};
use mpib::driver::{Arena, Plugin, Result, default_plugin};

/// The 8 bytes of message `i`.
#[inline]
fn payload(i: u64) -> u64 {
    (i ^ 0x6d70_6962_0000_0000).wrapping_mul(0x9e37_79b9_7f4a_7c15)
}

fn run(n: u64, window: usize) -> Result<()> {
    let plugin = Plugin::open(&default_plugin(), None)?;
    let net = plugin.init()?;
    eprintln!("{} through ncclNetPlugin_v{}, device {:?}", plugin.library(), plugin.version(), net.properties(0)?.name);

    // The same-thread loop NCCL's GDR check does: connect and accept must interleave.
    let mut listen = net.listen(0)?;
    let mut connector = net.connector(0, listen.handle());
    let (mut send, mut recv) = (None, None);
    let end = Instant::now() + Duration::from_secs(10);
    while send.is_none() || recv.is_none() {
        if send.is_none() {
            send = connector.poll()?;
        }
        if recv.is_none() {
            recv = listen.accept()?;
        }
        if Instant::now() > end {
            return Err(mpib::driver::Error::timeout("in-process connect/accept did not finish in 10 s"));
        }
    }
    listen.close()?;
    let (send, recv) = (send.expect("connected"), recv.expect("accepted"));

    let (sa, ra) = (Arena::new(8 * window)?, Arena::new(8 * window)?);
    let (smr, rmr) = (send.reg_mr(&sa)?, recv.reg_mr(&ra)?);
    let mut inflight: VecDeque<(u64, Request<'_>, Option<Request<'_>>)> = VecDeque::with_capacity(window);
    let (mut posted, mut wrong) = (0u64, 0u64);
    let start = Instant::now();
    while posted < n || !inflight.is_empty() {
        // Post: the receive, then its send (a NULL request means "retry later").
        if posted < n && inflight.len() < window {
            let off = (posted as usize % window) * 8;
            // SAFETY: this slot's previous message completed (fewer than `window` in flight).
            unsafe { sa.bytes_mut(off, 8) }.copy_from_slice(&payload(posted).to_le_bytes());
            if let Some(r) = recv.irecv(&[RecvBuf { mr: &rmr, off, len: 8, tag: 1 }])? {
                inflight.push_back((posted, r, None));
                posted += 1;
            }
        }
        for (i, _, s) in inflight.iter_mut().filter(|(_, _, s)| s.is_none()) {
            *s = send.isend(&smr, (*i as usize % window) * 8, 8, 1)?;
            if s.is_none() {
                break;
            }
        }
        // Test the oldest message: its send, then its receive.
        let Some((i, r, s)) = inflight.front_mut() else { continue };
        let Some(sreq) = s.as_mut() else { continue };
        if sreq.test()?.is_none() {
            // NCCL tests one request per step; so does this.
            continue;
        }
        let i = *i;
        let done = loop {
            if let Some(sizes) = r.test()? {
                break sizes;
            }
        };
        let off = (i as usize % window) * 8;
        // SAFETY: the receive completed: the plugin no longer writes this slot.
        let got = u64::from_le_bytes(unsafe { ra.bytes(off, 8) }.try_into().expect("8 bytes"));
        wrong += u64::from(done.sizes[0] != 8 || got != payload(i));
        inflight.pop_front();
    }
    let ns = start.elapsed().as_nanos() as f64 / n.max(1) as f64;
    drop(inflight);
    let c = send.counters()?;
    smr.dereg()?;
    rmr.dereg()?;
    send.close()?;
    recv.close()?;
    net.finalize()?;
    if let Some(c) = c {
        eprintln!(
            "sender rails: SOUT wr={} bytes={}  SUP wr={} bytes={}",
            c[0].wr_posted, c[0].bytes, c[1].wr_posted, c[1].bytes
        );
    }
    println!("messages: {n}  window: {window}  wrong: {wrong}");
    println!("ns_per_msg: {ns:.1}");
    if wrong > 0 {
        return Err(mpib::driver::Error::data(format!("{wrong} of {n} messages arrived wrong")));
    }
    Ok(())
}

fn main() -> ExitCode {
    let arg = |i: usize, default: u64| std::env::args().nth(i).map_or(Ok(default), |a| a.parse::<u64>());
    let (Ok(n), Ok(window)) = (arg(1, 200_000), arg(2, 1)) else {
        eprintln!("usage: inproc_msgs [N=200000] [WINDOW=1]");
        return ExitCode::from(2);
    };
    if std::env::var_os("MPIB_FABRIC").is_none() {
        // SAFETY: nothing else runs yet (no threads), and the plugin reads its environment
        // at init, after this.
        unsafe { std::env::set_var("MPIB_FABRIC", "inproc") };
    }
    match run(n, window.clamp(1, 32) as usize) {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("inproc_msgs: {e}");
            ExitCode::FAILURE
        }
    }
}
