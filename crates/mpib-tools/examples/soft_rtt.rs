//! The 8-byte round trip between two processes: a raw TCP ping-pong (busy-polled
//! non-blocking socket) against the same ping-pong through the plugin's C ABI
//! (`isend`/`irecv`/`test`, as NCCL's proxy calls them), in one run, rounds interleaved.
//!
//! Rank 0 sends a ping and measures until the pong is back: the time from the `isend` (its
//! `irecv` for the pong posted before) to both requests tested done; rank 1 posts the next
//! `irecv` as soon as a ping arrived, then sends the pong. Every payload is checked. With
//! `perf` on the path (and the right to use it), each rank counts its own system calls
//! during the measured loops (`perf stat --control`, enabled only while a loop runs), and
//! the run prints them per round trip, both processes together.
//!
//! ```text
//! cargo build --release -p mpib --lib
//! cargo run --release -p mpib-tools --example soft_rtt -- [ITERS=20000] [ROUNDS=5]
//! ```
//! The plugin is the one `mpib-perf` would pick (`NCCL_NET_PLUGIN`, else the `libmpib.so`
//! next to this binary). Both rails run the soft fabric on 127.0.0.1 unless
//! `MPIB_SOFT_SOUT_ADDR` / `MPIB_SOFT_SUP_ADDR` / `MPIB_FABRIC` / `MPIB_SPLIT` say otherwise.
//! The last line is `rtt_ratio: <mpib median / raw median> p99 <mpib p99 / raw p99>`.
//! `SOFT_RTT_PIN=1` pins rank 0 to CPU 0 and rank 1 to CPU 1 (with the helper threads
//! they start). `SOFT_RTT_DUMP=DIR` writes every round trip of each round, in order (µs), to
//! `DIR/raw.N` and `DIR/mpib.N`.

use std::io::{BufRead, BufReader, Read, Write};
use std::net::{TcpListener, TcpStream};
use std::process::{Child, Command, ExitCode, Stdio};
use std::time::{Duration, Instant};

use mpib_tools::link::{self, Link};
use mpib_tools::net::RecvBuf;
use mpib_tools::{Arena, Error, Plugin, Result, default_plugin};

const WARMUP: usize = 1000;
const TIMEOUT: Duration = Duration::from_secs(60);

/// The syscall counters, as `perf stat -e` names them; the EAGAIN ones are exits filtered
/// on the return value.
const EVENTS: &[(&str, Option<&str>, &str)] = &[
    ("raw_syscalls:sys_enter", None, "all"),
    ("syscalls:sys_enter_sendmsg", None, "sendmsg"),
    ("syscalls:sys_enter_write", None, "write"),
    ("syscalls:sys_enter_readv", None, "readv"),
    ("syscalls:sys_exit_readv", Some("ret == -11"), "readv_eagain"),
    ("syscalls:sys_enter_read", None, "read"),
    ("syscalls:sys_exit_read", Some("ret == -11"), "read_eagain"),
    ("syscalls:sys_enter_recvfrom", None, "recvfrom"),
    ("syscalls:sys_exit_recvfrom", Some("ret == -11"), "recvfrom_eagain"),
    ("syscalls:sys_enter_sendto", None, "sendto"),
    ("syscalls:sys_enter_epoll_wait", None, "epoll_wait"),
    ("syscalls:sys_enter_epoll_ctl", None, "epoll_ctl"),
];

fn payload(i: u64, rank: u64) -> u64 {
    (i ^ rank << 60 ^ 0x7274_7400).wrapping_mul(0x9e37_79b9_7f4a_7c15)
}

/// `perf stat` attached to this process, counting only while enabled.
struct Perf {
    child: Child,
    ctl: std::fs::File,
    ack: BufReader<std::fs::File>,
    out: std::path::PathBuf,
    dir: std::path::PathBuf,
}

impl Perf {
    fn start(tag: &str) -> Option<Perf> {
        if std::env::var_os("SOFT_RTT_NO_PERF").is_some() {
            return None;
        }
        let dir = std::env::temp_dir().join(format!("soft_rtt.{}.{tag}", std::process::id()));
        let _ = std::fs::remove_dir_all(&dir);
        std::fs::create_dir_all(&dir).ok()?;
        let (ctl, ack, out) = (dir.join("ctl"), dir.join("ack"), dir.join("out"));
        for f in [&ctl, &ack] {
            let c = std::ffi::CString::new(f.to_str()?).ok()?;
            // SAFETY: a NUL-terminated path.
            if unsafe { libc::mkfifo(c.as_ptr(), 0o600) } != 0 {
                return None;
            }
        }
        let mut cmd = Command::new("perf");
        cmd.args(["stat", "-x", ",", "-D", "-1", "-o"]).arg(&out);
        cmd.arg("--control").arg(format!("fifo:{},{}", ctl.display(), ack.display()));
        for (ev, filter, _) in EVENTS {
            cmd.args(["-e", ev]);
            if let Some(f) = filter {
                cmd.args(["--filter", f]);
            }
        }
        cmd.args(["-p", &std::process::id().to_string()]).stdout(Stdio::null()).stderr(Stdio::null());
        let child = cmd.spawn().ok()?;
        // Read-write: opening a FIFO so does not wait for perf to open the other end.
        let rw = || std::fs::OpenOptions::new().read(true).write(true).clone();
        let ctl_f = rw().open(&ctl).ok()?;
        let ack_f = BufReader::new(rw().open(&ack).ok()?);
        Some(Perf { child, ctl: ctl_f, ack: ack_f, out, dir })
    }

    fn command(&mut self, c: &str) {
        let _ = writeln!(self.ctl, "{c}");
        let _ = self.ctl.flush();
        let mut l = String::new();
        let _ = self.ack.read_line(&mut l);
    }

    /// Stops perf; the counts in `EVENTS` order.
    fn finish(mut self) -> Option<Vec<u64>> {
        // SAFETY: plain syscall on our own child's pid.
        unsafe { libc::kill(self.child.id() as i32, libc::SIGINT) };
        let _ = self.child.wait();
        let text = std::fs::read_to_string(&self.out).ok()?;
        let _ = std::fs::remove_dir_all(&self.dir);
        let mut counts = vec![0u64; EVENTS.len()];
        for l in text.lines() {
            let f: Vec<&str> = l.split(',').collect();
            if f.len() < 3 {
                continue;
            }
            if let Some(i) = EVENTS.iter().position(|e| e.0 == f[2]) {
                counts[i] += f[0].parse::<u64>().unwrap_or(0);
            }
        }
        Some(counts)
    }
}

/// Both ranks reach this point before either goes on.
fn barrier(ctl: &mut Link) -> Result<()> {
    ctl.send("barrier", &[])?;
    ctl.expect("barrier", TIMEOUT)?;
    Ok(())
}

fn stats(v: &mut [f64]) -> (f64, f64) {
    v.sort_by(f64::total_cmp);
    (v[v.len() / 2], v[(v.len() * 99 / 100).min(v.len() - 1)])
}

fn median(mut v: Vec<f64>) -> f64 {
    v.sort_by(f64::total_cmp);
    v[v.len() / 2]
}

/// Raw TCP: `n` ping-pongs of 8 bytes on a non-blocking socket, both sides spinning on
/// `read`. Rank 0 returns the round trips in µs.
fn raw_pingpong(s: &mut TcpStream, rank: u64, n: usize) -> Result<Vec<f64>> {
    let mut rtt = Vec::with_capacity(n);
    let io = |e: std::io::Error| Error::io(format!("raw TCP: {e}"));
    let recv = |s: &mut TcpStream| -> Result<u64> {
        let mut b = [0u8; 8];
        let mut got = 0;
        while got < 8 {
            match s.read(&mut b[got..]) {
                Ok(0) => return Err(Error::io("raw TCP: peer closed")),
                Ok(k) => got += k,
                Err(e) if e.kind() == std::io::ErrorKind::WouldBlock => {}
                Err(e) => return Err(io(e)),
            }
        }
        Ok(u64::from_le_bytes(b))
    };
    for i in 0..n as u64 {
        if rank == 0 {
            let t = Instant::now();
            s.write_all(&payload(i, 0).to_le_bytes()).map_err(io)?;
            let got = recv(s)?;
            rtt.push(t.elapsed().as_secs_f64() * 1e6);
            if got != payload(i, 1) {
                return Err(Error::data(format!("raw TCP: pong {i} wrong")));
            }
        } else {
            if recv(s)? != payload(i, 0) {
                return Err(Error::data(format!("raw TCP: ping {i} wrong")));
            }
            s.write_all(&payload(i, 1).to_le_bytes()).map_err(io)?;
        }
    }
    Ok(rtt)
}

/// Pins this process (and the threads it starts later) to CPU `cpu`: `SOFT_RTT_PIN=1`
/// puts rank 0 on CPU 0 and rank 1 on CPU 1, so that the rounds do not differ by where
/// the scheduler happened to put the two busy-polling ranks.
fn pin_to(cpu: usize) -> Result<()> {
    // SAFETY: a zeroed cpu_set_t is a valid empty set; CPU_SET writes inside it; the call
    // reads `size_of::<cpu_set_t>()` bytes of it.
    let rc = unsafe {
        let mut set: libc::cpu_set_t = std::mem::zeroed();
        libc::CPU_SET(cpu, &mut set);
        libc::sched_setaffinity(0, std::mem::size_of::<libc::cpu_set_t>(), &set)
    };
    if rc != 0 {
        return Err(Error::io(format!("pinning to CPU {cpu}: {}", std::io::Error::last_os_error())));
    }
    Ok(())
}

fn rank_main(rank: u64, ctl_addr: Option<String>, iters: usize, rounds: usize) -> Result<()> {
    if std::env::var("SOFT_RTT_PIN").is_ok_and(|v| v == "1") {
        pin_to(rank as usize)?;
    }
    let mut ctl = match &ctl_addr {
        None => {
            let (l, a) = link::bind("127.0.0.1:0")?;
            println!("ctl {a}");
            let _ = std::io::stdout().flush();
            Link::accept(&l, TIMEOUT)?
        }
        Some(a) => Link::connect(a, TIMEOUT)?,
    };
    let bad = |what: &str| Error::io(format!("control channel: {what}"));
    // Raw TCP socket between the ranks.
    let mut raw = if rank == 0 {
        let l = TcpListener::bind("127.0.0.1:0").map_err(|e| Error::io(e.to_string()))?;
        ctl.send("raw", l.local_addr().map_err(|e| Error::io(e.to_string()))?.to_string().as_bytes())?;
        l.accept().map_err(|e| Error::io(e.to_string()))?.0
    } else {
        let body = ctl.expect("raw", TIMEOUT)?;
        TcpStream::connect(String::from_utf8_lossy(&body).as_ref()).map_err(|e| Error::io(e.to_string()))?
    };
    raw.set_nodelay(true).map_err(|e| Error::io(e.to_string()))?;
    raw.set_nonblocking(true).map_err(|e| Error::io(e.to_string()))?;

    // The plugin: one send comm and one receive comm each way, on device 0.
    let plugin = Plugin::open(&default_plugin(), None)?;
    let net = plugin.init()?;
    let listen = net.listen(0)?;
    ctl.send("handle", listen.handle())?;
    let peer: [u8; mpib_tools::net::HANDLE_BYTES] =
        ctl.expect("handle", TIMEOUT)?.try_into().map_err(|_| bad("handle size"))?;
    let (send, recv) = mpib_tools::net::connect_same_thread(&mut net.connector(0, &peer), listen, TIMEOUT)?;
    let (sa, ra) = (Arena::new(4096)?, Arena::new(4096)?);
    let (smr, rmr) = (send.reg_mr(&sa)?, recv.reg_mr(&ra)?);
    if rank == 0 {
        let p = net.properties(0)?;
        eprintln!("{} (ncclNetPlugin_v{}), device {}", plugin.library(), plugin.version(), p.name);
    }

    let irecv = || -> Result<mpib_tools::Request<'_>> {
        loop {
            if let Some(r) = recv.irecv(&[RecvBuf { mr: &rmr, off: 0, len: 8, tag: 1 }])? {
                return Ok(r);
            }
        }
    };
    let isend = || -> Result<mpib_tools::Request<'_>> {
        loop {
            if let Some(r) = send.isend(&smr, 0, 8, 1)? {
                return Ok(r);
            }
        }
    };
    let wait = |r: &mut mpib_tools::Request<'_>| -> Result<()> {
        while r.test()?.is_none() {}
        Ok(())
    };
    let got = || -> u64 {
        // SAFETY: the receive completed: the plugin no longer writes the buffer.
        unsafe { ra.addr(0).cast::<u64>().read_unaligned() }
    };
    let put = |v: u64| {
        // SAFETY: no send from the buffer is in flight.
        unsafe { sa.addr(0).cast::<u64>().write_unaligned(v) }
    };
    let mpib_pingpong = |n: usize, base: u64| -> Result<Vec<f64>> {
        let mut rtt = Vec::with_capacity(n);
        if rank == 0 {
            for i in base..base + n as u64 {
                put(payload(i, 0));
                let mut r = irecv()?;
                let t = Instant::now();
                let mut s = isend()?;
                let (mut sd, mut rd) = (false, false);
                while !(sd && rd) {
                    sd = sd || s.test()?.is_some();
                    rd = rd || r.test()?.is_some();
                }
                rtt.push(t.elapsed().as_secs_f64() * 1e6);
                if got() != payload(i, 1) {
                    return Err(Error::data(format!("mpib: pong {i} wrong")));
                }
            }
        } else {
            let end = base + n as u64;
            let mut r = Some(irecv()?);
            for i in base..end {
                let mut cur = r.take().expect("posted");
                wait(&mut cur)?;
                if got() != payload(i, 0) {
                    return Err(Error::data(format!("mpib: ping {i} wrong")));
                }
                // The next ping's receive (its CTS) goes out before the pong, as NCCL's
                // proxy posts receives ahead.
                if i + 1 < end {
                    r = Some(irecv()?);
                }
                put(payload(i, 1));
                let mut s = isend()?;
                wait(&mut s)?;
            }
        }
        Ok(rtt)
    };

    let (mut perf_raw, mut perf_mpib) = (Perf::start("raw"), Perf::start("mpib"));
    let (mut raw_med, mut raw_p99, mut mpib_med, mut mpib_p99) = (vec![], vec![], vec![], vec![]);
    let mut base = 0u64;
    for round in 0..rounds {
        barrier(&mut ctl)?;
        raw_pingpong(&mut raw, rank, WARMUP)?;
        barrier(&mut ctl)?;
        if let Some(p) = perf_raw.as_mut() {
            p.command("enable");
        }
        let mut r = raw_pingpong(&mut raw, rank, iters)?;
        if let Some(p) = perf_raw.as_mut() {
            p.command("disable");
        }
        barrier(&mut ctl)?;
        // Rank 1's receive for the first ping is posted inside: one receive per ping.
        mpib_pingpong(WARMUP, base)?;
        base += WARMUP as u64;
        barrier(&mut ctl)?;
        if let Some(p) = perf_mpib.as_mut() {
            p.command("enable");
        }
        let mut m = mpib_pingpong(iters, base)?;
        base += iters as u64;
        if let Some(p) = perf_mpib.as_mut() {
            p.command("disable");
        }
        if rank == 0
            && let Ok(dir) = std::env::var("SOFT_RTT_DUMP")
        {
            // Every round trip of the round in order (µs), for a look at the tail.
            let text = |v: &[f64]| v.iter().map(|x| format!("{x:.3}\n")).collect::<String>();
            for (what, v) in [("raw", &r), ("mpib", &m)] {
                let path = std::path::Path::new(&dir).join(format!("{what}.{round}"));
                std::fs::write(&path, text(v)).map_err(|e| Error::io(format!("{}: {e}", path.display())))?;
            }
        }
        if rank == 0 {
            let (a, b) = stats(&mut r);
            let (c, d) = stats(&mut m);
            println!(
                "round {round}: raw TCP {a:6.1} / {b:6.1} us   mpib {c:6.1} / {d:6.1} us   (median / p99)   ratio {:.2} / {:.2}",
                c / a,
                d / b
            );
            raw_med.push(a);
            raw_p99.push(b);
            mpib_med.push(c);
            mpib_p99.push(d);
        }
    }
    barrier(&mut ctl)?;
    let counts = [perf_raw.and_then(Perf::finish), perf_mpib.and_then(Perf::finish)];
    let line = |c: &Option<Vec<u64>>| c.as_ref().map(|v| v.iter().map(u64::to_string).collect::<Vec<_>>().join(" "));
    if rank == 1 {
        let body = format!("{}|{}", line(&counts[0]).unwrap_or_default(), line(&counts[1]).unwrap_or_default());
        ctl.send("counts", body.as_bytes())?;
    } else {
        let body = String::from_utf8_lossy(&ctl.expect("counts", TIMEOUT)?).into_owned();
        let theirs: Vec<Vec<u64>> =
            body.split('|').map(|s| s.split_whitespace().filter_map(|x| x.parse().ok()).collect()).collect();
        let trips = (iters * rounds) as f64;
        for (k, name) in ["raw TCP", "mpib"].into_iter().enumerate() {
            let (Some(mine), Some(other)) = (&counts[k], theirs.get(k).filter(|v| v.len() == EVENTS.len())) else {
                println!("syscalls per round trip ({name}): n/a (perf stat not available)");
                continue;
            };
            let per: Vec<String> = EVENTS
                .iter()
                .enumerate()
                .filter(|(i, _)| mine[*i] + other[*i] > 0)
                .map(|(i, e)| format!("{} {:.1}", e.2, (mine[i] + other[i]) as f64 / trips))
                .collect();
            println!("syscalls per round trip ({name}, both processes): {}", per.join(", "));
        }
        let (rm, rp, mm, mp) = (median(raw_med), median(raw_p99), median(mpib_med), median(mpib_p99));
        println!("raw TCP 8-byte round trip:  median {rm:.1} us, p99 {rp:.1} us (median of {rounds} rounds)");
        println!("mpib 8-byte round trip:     median {mm:.1} us, p99 {mp:.1} us");
        println!("rtt_ratio: {:.2} p99 {:.2}", mm / rm, mp / rp);
    }
    barrier(&mut ctl)?;
    smr.dereg()?;
    rmr.dereg()?;
    send.close()?;
    recv.close()?;
    net.finalize()?;
    Ok(())
}

fn parent(iters: usize, rounds: usize) -> Result<()> {
    let exe = std::env::current_exe().map_err(|e| Error::io(e.to_string()))?;
    let spawn = |rank: u32, ctl: Option<&str>| -> Result<Child> {
        let mut c = Command::new(&exe);
        c.args([iters.to_string(), rounds.to_string()]).env("SOFT_RTT_RANK", rank.to_string());
        if let Some(a) = ctl {
            c.env("SOFT_RTT_CTL", a);
        }
        for (k, v) in
            [("MPIB_FABRIC", "soft"), ("MPIB_SOFT_SOUT_ADDR", "127.0.0.1"), ("MPIB_SOFT_SUP_ADDR", "127.0.0.1")]
        {
            if std::env::var_os(k).is_none() {
                c.env(k, v);
            }
        }
        c.stdout(Stdio::piped()).spawn().map_err(|e| Error::io(e.to_string()))
    };
    let mut r0 = spawn(0, None)?;
    let mut out0 = BufReader::new(r0.stdout.take().expect("piped"));
    let mut l = String::new();
    out0.read_line(&mut l).map_err(|e| Error::io(e.to_string()))?;
    let addr = l.trim().strip_prefix("ctl ").ok_or_else(|| Error::io(format!("rank 0 said {l:?}")))?.to_string();
    let mut r1 = spawn(1, Some(&addr))?;
    for l in out0.lines() {
        println!("{}", l.map_err(|e| Error::io(e.to_string()))?);
    }
    let (s0, s1) = (r0.wait(), r1.wait());
    if !(s0.is_ok_and(|s| s.success()) && s1.is_ok_and(|s| s.success())) {
        return Err(Error::io("a rank failed"));
    }
    Ok(())
}

fn main() -> ExitCode {
    let arg = |i: usize, d: usize| std::env::args().nth(i).and_then(|a| a.parse().ok()).unwrap_or(d);
    let (iters, rounds) = (arg(1, 20_000).max(100), arg(2, 5).max(1));
    let r = match std::env::var("SOFT_RTT_RANK").ok().and_then(|r| r.parse::<u64>().ok()) {
        Some(rank) => rank_main(rank, std::env::var("SOFT_RTT_CTL").ok(), iters, rounds),
        None => {
            println!("8-byte ping-pong between two processes, {rounds} interleaved rounds of {iters} round trips each");
            parent(iters, rounds)
        }
    };
    match r {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("soft_rtt: {e}");
            ExitCode::FAILURE
        }
    }
}
