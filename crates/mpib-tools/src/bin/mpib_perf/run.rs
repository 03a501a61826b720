//! The ways two ranks run: two local processes (the default), two threads of this process
//! (`--fabric inproc`), or one rank here and one on another host (`--listen` / `--connect`
//! / `--rendezvous`). Each ends in an [`Outcome`]: both ranks' reports where they exist.

use std::io::{ErrorKind as IoKind, Write};
use std::net::{SocketAddr, TcpListener, ToSocketAddrs};
use std::os::unix::process::CommandExt;
use std::process::Command;
use std::time::Duration;

use mpib_tools::link::{self, Link};
use mpib_tools::net::Plugin;
use mpib_tools::pair::{PairSpec, Program, run_pair_observed};
use mpib_tools::rank::{self, PhaseStart, Preset};
use mpib_tools::report::{RankReport, mono_ns};
use mpib_tools::{Library, default_plugin};

use super::Fail;
use super::opts::{Mode, Plan, differences};
use super::progress::Progress;
use super::token::{Token, advertised};

/// What came back from the ranks.
#[derive(Debug, Default)]
pub struct Outcome {
    pub reports: [Option<RankReport>; 2],
    /// The stderr of ranks that ran as child processes (the plugin's log lines).
    pub stderr: [String; 2],
    /// A local rank that exited without a report: its exit status.
    pub lost: [Option<String>; 2],
    pub timed_out: bool,
    /// The ranks this run of the tool ran (both, or one with a peer on another host).
    pub ran_here: [bool; 2],
}

/// Loads the plugin as the ranks will (a pre-flight check with one clear error): `--plugin`,
/// else `NCCL_NET_PLUGIN`, else the library built next to this binary, else
/// `libnccl-net-mpib.so` from the library path. Returns the name that loaded.
pub fn load_plugin(plan: &Plan) -> Result<(String, Plugin), Fail> {
    let found = plan.opts.plugin.clone().unwrap_or_else(default_plugin);
    let candidates =
        if plan.opts.plugin.is_none() && found == "libmpib.so" { vec![found, "mpib".to_string()] } else { vec![found] };
    let mut errors = Vec::new();
    for name in &candidates {
        match Library::open_nccl_style(name) {
            Ok(lib) => {
                let plugin = Plugin::from_library(lib, plan.opts.abi).map_err(|e| Fail::new(e.msg))?;
                return Ok((name.clone(), plugin));
            }
            Err(e) => errors.push(e.msg),
        }
    }
    Err(Fail::new(format!(
        "plugin library not found: {} (build it with `cargo build --release`, or pass --plugin PATH)",
        errors.join("; ")
    )))
}

/// The plugin reads its configuration from the environment once; where this process runs a
/// rank itself, it re-executes itself with the environment the options ask for (no
/// `set_var` in a process that may already have threads).
pub fn ensure_env(plan: &Plan) -> Result<(), Fail> {
    let env = plan.plugin_env();
    if env.iter().all(|(k, v)| std::env::var(k).is_ok_and(|cur| cur == *v)) {
        return Ok(());
    }
    let exe = std::env::current_exe().map_err(|e| Fail::new(format!("cannot find this program to restart it: {e}")))?;
    let e = Command::new(exe).args(std::env::args_os().skip(1)).envs(env).exec();
    Err(Fail::new(format!("cannot restart with the plugin's environment: {e}")))
}

/// Two processes on this host: this program, re-executed as rank 0 and rank 1.
pub fn local(plan: &Plan, lib: &str, progress: &mut Progress) -> Result<Outcome, Fail> {
    let mut env: Vec<(String, String)> = std::env::vars().filter(|(k, _)| k.starts_with("MPIB_")).collect();
    for (k, v) in plan.plugin_env() {
        env.retain(|(have, _)| *have != k);
        env.push((k, v));
    }
    let timeout = match plan.duration {
        Some(d) => d * 3 + Duration::from_secs(120),
        None => Duration::from_secs(3600),
    };
    let spec = PairSpec {
        plugin: lib.to_string(),
        abi: [plan.opts.abi; 2],
        env,
        rank_env: Default::default(),
        workload: plan.workload.clone(),
        timeout,
    };
    let out = run_pair_observed(&spec, &Program::this_program(), &mut |r, p| {
        // Both ranks tell; the sender's notes carry the stream's start.
        if r == 1 {
            progress.phase(true, p)
        }
    })
    .map_err(|e| Fail::new(e.msg))?;
    let mut o = Outcome { timed_out: out.timed_out, ran_here: [true; 2], ..Outcome::default() };
    for (i, r) in out.ranks.into_iter().enumerate() {
        if r.report.is_none() {
            o.lost[i] = Some(r.status.map_or("no exit status".into(), |s| s.to_string()));
        }
        o.reports[i] = r.report;
        o.stderr[i] = r.stderr;
    }
    Ok(o)
}

/// Two threads of this process (`--fabric inproc`: the fabric's two ends must share it).
/// Each opens the (already loaded) library for itself: a plugin's tables are not `Sync`.
pub fn threads(plan: &Plan, lib: &str, progress: &mut Progress) -> Result<Outcome, Fail> {
    let (l, addr) = link::bind("127.0.0.1:0").map_err(|e| Fail::new(e.msg))?;
    let (w, abi) = (&plan.workload, plan.opts.abi);
    let (r0, r1) = std::thread::scope(|s| {
        let receiver = s.spawn(|| {
            let plugin = Plugin::open(lib, abi)?;
            let mut link = Link::accept(&l, Duration::from_secs(10))?;
            Ok::<_, mpib_tools::Error>(rank::run(&plugin, &mut link, 0, w).0)
        });
        let sender = s.spawn(|| {
            let plugin = Plugin::open(lib, abi)?;
            let mut link = Link::connect(&addr.to_string(), Duration::from_secs(10))?;
            let mut obs = |p: &PhaseStart| progress.phase(true, p);
            Ok::<_, mpib_tools::Error>(rank::run_observed(&plugin, &mut link, 1, w, &mut obs).0)
        });
        (receiver.join(), sender.join())
    });
    let take = |r: std::thread::Result<mpib_tools::Result<RankReport>>| match r {
        Ok(Ok(rep)) => Ok(rep),
        Ok(Err(e)) => Err(Fail::new(e.msg)),
        Err(_) => Err(Fail::new("a rank's thread panicked")),
    };
    Ok(Outcome { reports: [Some(take(r0)?), Some(take(r1)?)], ran_here: [true; 2], ..Outcome::default() })
}

/// `--listen ADDR`'s socket address: `[HOST][:PORT]`, every address and any port by default.
fn listen_addr(spec: &str) -> Result<SocketAddr, Fail> {
    let full = match spec {
        "" => "0.0.0.0:0".to_string(),
        s if s.starts_with(':') => format!("0.0.0.0{s}"),
        s if s.parse::<std::net::IpAddr>().is_ok() && s.contains(':') => format!("[{s}]:0"),
        s if !s.contains(':') => format!("{s}:0"),
        s => s.to_string(),
    };
    full.to_socket_addrs()
        .ok()
        .and_then(|mut a| a.next())
        .ok_or_else(|| Fail::new(format!("--listen {spec:?}: not an address to listen on ([HOST][:PORT])")))
}

/// A random-enough nonce naming this `--listen` run.
fn nonce() -> u64 {
    let mut x = mono_ns() ^ (std::process::id() as u64) << 40 ^ 0x6d70_6962_7065_7266;
    x = (x ^ (x >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
    (x ^ (x >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb)
}

/// Both sides send their nonce and options; both check them (so both say what differs).
fn hello(link: &mut Link, plan: &Plan, nonce: u64, wait: Duration) -> Result<(), Fail> {
    let ours = plan.agreed_line();
    let mut body = nonce.to_be_bytes().to_vec();
    body.extend_from_slice(ours.as_bytes());
    link.send("hello", &body).map_err(|e| Fail::new(format!("peer unreachable: {}", e.msg)))?;
    let got = link.expect("hello", wait).map_err(|e| Fail::new(format!("peer unreachable: {}", e.msg)))?;
    if got.len() < 8 {
        return Err(Fail::new("the peer is not mpib-perf (a short hello on the control channel)"));
    }
    let (theirs_nonce, theirs) = got.split_at(8);
    if theirs_nonce != nonce.to_be_bytes() {
        return Err(Fail::new(
            "the peer's token is not from this --listen run (an earlier run's token, or another listener on that port)",
        ));
    }
    let diff = differences(&ours, &String::from_utf8_lossy(theirs));
    if !diff.is_empty() {
        return Err(Fail::new(format!("options differ from the peer's: {}", diff.join(", "))));
    }
    Ok(())
}

/// The report of the rank run here and its peer's, in rank order.
fn both(rank: u32, mine: RankReport, peer: Option<RankReport>) -> Outcome {
    let mut o = Outcome::default();
    o.ran_here[rank as usize] = true;
    o.reports[rank as usize] = Some(mine);
    o.reports[1 - rank as usize] = peer;
    o
}

/// `--listen`: rank 0. Listens with the plugin first, so its handle goes into the token.
pub fn listen(plan: &Plan, spec: &str, plugin: &Plugin, progress: &mut Progress) -> Result<Outcome, Fail> {
    let addr = listen_addr(spec)?;
    let net = plugin.init().map_err(|e| Fail::init(e.msg))?;
    let dev = net.nccl_device(plan.workload.dev).map_err(|e| Fail::new(e.msg))?;
    let comm = net.listen(dev).map_err(|e| Fail::new(format!("the plugin's listen failed: {}", e.msg)))?;
    let l = TcpListener::bind(addr).map_err(|e| Fail::new(format!("cannot listen on {addr}: {e}")))?;
    let bound = l.local_addr().map_err(|e| Fail::new(format!("cannot listen on {addr}: {e}")))?;
    let token = Token { nonce: nonce(), addrs: advertised(bound), handle: *comm.handle() };
    {
        let mut out = std::io::stdout().lock();
        if !plan.opts.quiet {
            let _ = writeln!(out, "# mpib-perf: listening on {bound}; on the peer host run (with the same options):");
        }
        let _ = writeln!(out, "mpib-perf --connect {}", token.encode());
        let _ = out.flush();
    }
    let mut link = Link::accept(&l, plan.opts.timeout).map_err(|e| {
        Fail::new(format!("peer unreachable: no peer connected within {:?} ({})", plan.opts.timeout, e.msg))
    })?;
    hello(&mut link, plan, token.nonce, plan.opts.timeout)?;
    let preset = Preset { listen: Some(comm), peer_handle: None };
    let (mine, peer) = rank::run_on(&net, preset, &mut link, 0, &plan.workload, &mut |p| progress.phase(false, p));
    let _ = net.finalize();
    Ok(both(0, mine, peer))
}

/// `--connect TOKEN`: rank 1.
pub fn connect(plan: &Plan, token: &str, plugin: &Plugin, progress: &mut Progress) -> Result<Outcome, Fail> {
    let token = Token::decode(token).map_err(|e| Fail::new(format!("--connect: {e}")))?;
    let mut link = Link::connect_any(&token.addrs, plan.opts.timeout)
        .map_err(|e| Fail::new(format!("peer unreachable: {}", e.msg)))?;
    hello(&mut link, plan, token.nonce, plan.opts.timeout)?;
    let net = plugin.init().map_err(|e| Fail::init(e.msg))?;
    let preset = Preset { listen: None, peer_handle: Some(token.handle) };
    let (mine, peer) = rank::run_on(&net, preset, &mut link, 1, &plan.workload, &mut |p| progress.phase(true, p));
    let _ = net.finalize();
    Ok(both(1, mine, peer))
}

/// `--rendezvous HOST:PORT`: whoever can bind it is rank 0 (unless `--rank` says).
pub fn rendezvous(
    plan: &Plan,
    addr: &str,
    forced: Option<u32>,
    plugin: &Plugin,
    progress: &mut Progress,
) -> Result<Outcome, Fail> {
    let wait = plan.opts.timeout;
    let sock = addr
        .to_socket_addrs()
        .map_err(|e| Fail::new(format!("--rendezvous {addr}: {e}")))?
        .next()
        .ok_or_else(|| Fail::new(format!("--rendezvous {addr}: resolves to no address")))?;
    let bound = match forced {
        Some(1) => None,
        _ => match TcpListener::bind(sock) {
            Ok(l) => Some(l),
            // Another process here has it, or it is the other host's address: connect.
            Err(e) if forced.is_none() && matches!(e.kind(), IoKind::AddrInUse | IoKind::AddrNotAvailable) => None,
            Err(e) => return Err(Fail::new(format!("--rendezvous: cannot listen on {sock}: {e}"))),
        },
    };
    let rank = if bound.is_some() { 0 } else { 1 };
    let mut link = match &bound {
        Some(l) => Link::accept(l, wait)
            .map_err(|e| Fail::new(format!("peer unreachable: nobody came to {sock} within {wait:?} ({})", e.msg)))?,
        None => Link::connect_any(&[sock], wait).map_err(|e| Fail::new(format!("peer unreachable: {}", e.msg)))?,
    };
    drop(bound);
    hello(&mut link, plan, 0, wait)?;
    let (mine, peer) =
        rank::run_observed(plugin, &mut link, rank, &plan.workload, &mut |p| progress.phase(rank == 1, p));
    Ok(both(rank, mine, peer))
}

/// Runs the plan's mode.
pub fn run(plan: &Plan, lib: &str, plugin: &Plugin, progress: &mut Progress) -> Result<Outcome, Fail> {
    match &plan.mode {
        Mode::Local => local(plan, lib, progress),
        Mode::Threads => threads(plan, lib, progress),
        Mode::Listen(a) => listen(plan, a, plugin, progress),
        Mode::Connect(t) => connect(plan, t, plugin, progress),
        Mode::Rendezvous(a, r) => rendezvous(plan, a, *r, plugin, progress),
        Mode::List => Err(Fail::new("--list runs no ranks")),
    }
}
