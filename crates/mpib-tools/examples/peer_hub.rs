//! One hub process and N peer processes through the plugin (ci/netem-peers.sh runs each
//! peer in a network namespace of its own, one of them slowed with tc): the hub connects to
//! every peer on one `init`, sends the same checked stream to each at once, and prints its
//! per-NIC and per-peer view (`mpib-perf --stats`'s) while every connection is still open,
//! then one `HUB-SLOW <rank> <peer> <nic> <rail> <p99 ns>` line per peer of its latency
//! ranking, worst first.
//!
//! ```text
//! peer_hub hub --plugin LIB --listen ADDR:PORT --peers N [--size BYTES] [--count N]
//! peer_hub peer --plugin LIB --connect ADDR:PORT [--size BYTES] [--count N]
//! ```
//! The plugin's environment (MPIB_FABRIC, MPIB_SOFT_SOUT_ADDR, ...) comes from the caller.
//! Exit status: 0 when every byte arrived intact and the hub saw every peer, 1 otherwise,
//! 2 on bad arguments.

use std::net::TcpListener;
use std::process::ExitCode;
use std::sync::{Condvar, Mutex};
use std::time::{Duration, Instant};

use mpib_tools::link::Link;
use mpib_tools::net::Plugin;
use mpib_tools::rank::{self, PhaseStart, Preset};
use mpib_tools::report::RankReport;
use mpib_tools::stats_view::StatsView;
use mpib_tools::{Phase, Workload};

/// How long anything (a peer's control connection, the others reaching the gate) may take.
const WAIT: Duration = Duration::from_secs(60);

struct Args {
    role: String,
    plugin: String,
    addr: String,
    peers: usize,
    size: u64,
    count: u64,
}

fn args() -> Result<Args, String> {
    let mut it = std::env::args().skip(1);
    let role = it.next().filter(|r| r == "hub" || r == "peer").ok_or("the first argument is hub or peer")?;
    let mut a = Args { role, plugin: String::new(), addr: String::new(), peers: 0, size: 16 << 10, count: 200 };
    while let Some(k) = it.next() {
        let v = it.next().ok_or(format!("{k} needs a value"))?;
        let num = |v: &str| v.parse::<u64>().map_err(|_| format!("{k} {v:?}: not a number"));
        match k.as_str() {
            "--plugin" => a.plugin = v,
            "--listen" | "--connect" => a.addr = v,
            "--peers" => a.peers = num(&v)? as usize,
            "--size" => a.size = num(&v)?,
            "--count" => a.count = num(&v)?,
            _ => return Err(format!("unknown option {k}")),
        }
    }
    if a.plugin.is_empty() || a.addr.is_empty() || (a.role == "hub" && a.peers == 0) {
        return Err("needs --plugin, --listen (hub, with --peers N) or --connect (peer)".into());
    }
    Ok(a)
}

/// The hub (rank 1) streams `count` messages of `size` to each peer (rank 0), then one
/// tiny message: the start of that second phase is where the hub's threads meet to take the
/// view, every peer's stream done and no connection closed yet.
fn workload(a: &Args) -> Workload {
    let stream = Phase { sizes: vec![a.size], count: a.count, inflight: 8, ..Phase::default() };
    Workload { seed: 0x0068_7562, stall_ms: 30_000, phases: vec![stream, Phase::default()], ..Workload::default() }
}

/// Where the hub's threads wait for each other; the last to come takes the view.
struct Gate {
    state: Mutex<(usize, Option<StatsView>, bool)>,
    all_here: Condvar,
    of: usize,
}

impl Gate {
    fn arrive(&self, plugin: &Plugin) {
        let mut s = self.state.lock().unwrap();
        s.0 += 1;
        if s.0 == self.of {
            s.1 = StatsView::take(plugin).unwrap_or_else(|e| {
                eprintln!("peer_hub hub: the per-peer view: {}", e.msg);
                None
            });
            self.all_here.notify_all();
            return;
        }
        let end = Instant::now() + WAIT;
        while s.0 < self.of {
            let left = end.saturating_duration_since(Instant::now());
            if left.is_zero() {
                // A peer failed or hangs: its own error says why; the view is not taken.
                s.2 = true;
                return;
            }
            s = self.all_here.wait_timeout(s, left).unwrap().0;
        }
    }
}

fn hub(a: &Args, w: &Workload) -> Result<(), String> {
    let plugin = Plugin::open(&a.plugin, None).map_err(|e| e.msg)?;
    let net = plugin.init().map_err(|e| format!("init: {}", e.msg))?;
    let l = TcpListener::bind(&a.addr).map_err(|e| format!("cannot listen on {}: {e}", a.addr))?;
    println!("HUB-LISTENING {}", a.addr);
    let links: Vec<Link> = (0..a.peers).map(|_| Link::accept(&l, WAIT)).collect::<Result<_, _>>().map_err(|e| e.msg)?;
    let gate = Gate { state: Mutex::new((0, None, false)), all_here: Condvar::new(), of: a.peers };
    let reports: Vec<(RankReport, Option<RankReport>)> = std::thread::scope(|s| {
        let (net, gate) = (&net, &gate);
        let threads: Vec<_> = links
            .into_iter()
            .map(|mut link| {
                s.spawn(move || {
                    let mut obs = |p: &PhaseStart| {
                        if p.index == 1 {
                            gate.arrive(net.plugin());
                        }
                    };
                    rank::run_on(net, Preset::default(), &mut link, 1, w, &mut obs)
                })
            })
            .collect();
        threads.into_iter().map(|t| t.join().expect("a hub thread panicked")).collect()
    });
    net.finalize().map_err(|e| format!("finalize: {}", e.msg))?;
    for (i, (mine, peer)) in reports.iter().enumerate() {
        if let Some(f) = mine.failure.as_ref().or(peer.as_ref().and_then(|p| p.failure.as_ref())) {
            return Err(format!("connection {i}: {}", f.error.msg));
        }
        let sent: u64 = mine.phases.iter().filter_map(|p| p.tx.as_ref()).map(|s| s.bytes).sum();
        println!("HUB-SENT {i} {sent}");
    }
    let (_, view, late) = gate.state.into_inner().unwrap();
    let view = match view {
        Some(v) => v,
        None if late => return Err("the connections did not all reach the end of their stream".into()),
        None => return Err("the library does not export mpib_nic_stats / mpib_worst_peers".into()),
    };
    print!("{}", view.text(&format!("hub (pid {}, {} peers)", std::process::id(), a.peers)));
    for (i, p) in view.slow.iter().enumerate() {
        println!(
            "HUB-SLOW {i} {} {} {} {}",
            p.peer,
            p.nic,
            ["SOUT", "SUP"].get(p.rail).unwrap_or(&"?"),
            p.latency_p99_ns
        );
    }
    Ok(())
}

fn peer(a: &Args, w: &Workload) -> Result<(), String> {
    let plugin = Plugin::open(&a.plugin, None).map_err(|e| e.msg)?;
    let mut link = Link::connect(&a.addr, WAIT).map_err(|e| e.msg)?;
    let (mine, _) = rank::run(&plugin, &mut link, 0, w);
    match mine.failure {
        Some(f) => Err(f.error.msg),
        None => Ok(()),
    }
}

fn main() -> ExitCode {
    let a = match args() {
        Ok(a) => a,
        Err(e) => {
            eprintln!("peer_hub: {e}");
            return ExitCode::from(2);
        }
    };
    let w = workload(&a);
    let r = if a.role == "hub" { hub(&a, &w) } else { peer(&a, &w) };
    match r {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("peer_hub {}: {e}", a.role);
            ExitCode::FAILURE
        }
    }
}
