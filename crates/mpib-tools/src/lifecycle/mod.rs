//! Life-cycle runs: the plugin driven the way NCCL drives it over a job's whole life, not
//! only its data path. Several processes (ranks) load the plugin and run one scenario:
//!
//! ```text
//! churn      threads of each rank listen, connect, accept, carry checked traffic and close,
//!            round after round, with random delays, on one shared `init`, one per thread
//!            or a new one per round: set-up of one connection beside the close of another
//! teardown   a ring of ranks; each closes its receive comm as soon as its last receive
//!            is checked, and its upstream peer tests its last sends only afterwards
//! abort      a connection closed with requests in flight at a random moment on both sides
//!            (ncclCommAbort), while another connection between the same ranks carries on
//! oversize   sends larger than their posted receive: an error each, the connection goes on
//! straggler  a rank that calls connect/accept seconds after its peer: set-up waits for it
//! ```
//!
//! A rank is the program `mpib-lifecycle` (`src/bin/mpib-lifecycle.rs`); [`run`] starts the
//! ranks, tells each where the others listen ([`mesh`]), and collects one result line per
//! rank. Every scenario checks every byte it receives and every size `test` reports.

use std::io::Write;
use std::net::SocketAddr;
use std::path::PathBuf;
use std::time::{Duration, Instant};

use child_procs::{Children, Exit, Program};

use crate::{Error, Result};

mod abort;
mod churn;
mod conn;
pub mod mesh;
mod oversize;
mod straggler;
mod teardown;

const ADDR_LINE: &str = "LIFECYCLE-ADDR ";
const PEERS_LINE: &str = "LIFECYCLE-PEERS ";
const RESULT_LINE: &str = "LIFECYCLE-RESULT ";

/// A scenario and its parameters: `NAME key=value ...` (see each scenario's `Params`).
#[derive(Clone, Debug)]
pub struct Scenario {
    pub name: String,
    pub params: Vec<(String, String)>,
}

impl Scenario {
    pub fn parse(words: &[String]) -> Result<Scenario> {
        let (name, rest) = words.split_first().ok_or_else(|| Error::usage("no scenario named"))?;
        let params = rest
            .iter()
            .map(|w| match w.split_once('=') {
                Some((k, v)) => Ok((k.to_string(), v.to_string())),
                None => Err(Error::usage(format!("scenario parameter {w:?} is not key=value"))),
            })
            .collect::<Result<_>>()?;
        Ok(Scenario { name: name.clone(), params })
    }

    /// The words [`Scenario::parse`] reads back.
    pub fn words(&self) -> Vec<String> {
        std::iter::once(self.name.clone()).chain(self.params.iter().map(|(k, v)| format!("{k}={v}"))).collect()
    }

    /// Parameter `key` as a number, `default` when absent.
    pub fn num(&self, key: &str, default: u64) -> Result<u64> {
        match self.params.iter().rev().find(|(k, _)| k == key) {
            None => Ok(default),
            Some((_, v)) => v.parse().map_err(|_| Error::usage(format!("{}: {key}={v} is not a number", self.name))),
        }
    }

    /// Parameter `key` as a word, `default` when absent.
    pub fn word<'a>(&'a self, key: &str, default: &'a str) -> &'a str {
        self.params.iter().rev().find(|(k, _)| k == key).map_or(default, |(_, v)| v.as_str())
    }
}

/// xorshift64*: a run's seeded choices (sizes, delays, moments), the same on every rank
/// that seeds it alike.
#[derive(Clone, Debug)]
pub struct Rng(u64);

impl Rng {
    pub fn new(seed: u64) -> Rng {
        Rng(crate::pattern::key(seed, 0x11fe, 0, 0) | 1)
    }

    /// A generator for one part of the run (`a`, `b`: thread, round, direction, ...).
    pub fn derive(seed: u64, a: u64, b: u64) -> Rng {
        Rng(crate::pattern::key(seed, 0x11fe, a << 32 ^ b, 1) | 1)
    }

    pub fn next_u64(&mut self) -> u64 {
        self.0 ^= self.0 >> 12;
        self.0 ^= self.0 << 25;
        self.0 ^= self.0 >> 27;
        self.0.wrapping_mul(0x2545_f491_4f6c_dd1d)
    }

    /// Uniform in `[lo, hi]`.
    pub fn range(&mut self, lo: u64, hi: u64) -> u64 {
        if hi <= lo { lo } else { lo + self.next_u64() % (hi - lo + 1) }
    }

    pub fn coin(&mut self) -> bool {
        self.next_u64() & 1 == 1
    }

    /// Sleeps up to `max_us` microseconds (0 included: often not at all).
    pub fn pause(&mut self, max_us: u64) {
        let us = self.range(0, max_us);
        if us > max_us / 2 {
            std::thread::sleep(Duration::from_micros(us));
        } else if us.is_multiple_of(4) {
            std::thread::yield_now();
        }
    }
}

/// What one rank reported.
#[derive(Debug, Default)]
pub struct RankOutcome {
    /// The rank's result line (after `LIFECYCLE-RESULT `): `ok ...` or `fail ...`.
    pub result: Option<String>,
    pub exit: Option<std::process::ExitStatus>,
    pub stdout: String,
    pub stderr: String,
}

impl RankOutcome {
    pub fn ok(&self) -> bool {
        self.result.as_deref().is_some_and(|r| r.starts_with("ok")) && self.exit.is_some_and(|s| s.success())
    }

    /// Lines of the plugin's log at WARN level (the plugin logs to stderr without NCCL's logger).
    pub fn warn_lines(&self) -> Vec<&str> {
        self.stderr.lines().filter(|l| l.contains(" WARN ")).collect()
    }
}

/// A life-cycle run: `ranks` copies of `program` running `scenario`.
#[derive(Clone, Debug)]
pub struct RunSpec {
    pub program: PathBuf,
    pub plugin: String,
    pub ranks: usize,
    pub scenario: Scenario,
    /// Environment of every rank (the parent's `MPIB_*` variables are removed first).
    pub env: Vec<(String, String)>,
    /// The parent kills every rank after this long.
    pub timeout: Duration,
}

/// Starts the ranks, tells each the others' addresses, and waits for all of them (killing
/// them all at the timeout). The outcome of every rank, in rank order.
pub fn run(spec: &RunSpec) -> Result<Vec<RankOutcome>> {
    let end = Instant::now() + spec.timeout;
    let mut children = Children::new();
    for rank in 0..spec.ranks {
        let program = Program::new(&spec.program)
            .args(["--rank".to_string(), rank.to_string(), "--ranks".to_string(), spec.ranks.to_string()])
            .args(spec.scenario.words())
            .remove_prefix("MPIB_")
            .env("NCCL_NET_PLUGIN", &spec.plugin)
            .envs(spec.env.iter().cloned());
        children.start(&program).map_err(|e| Error::io(e.to_string()))?;
    }
    let mut addrs = Vec::new();
    for rank in 0..spec.ranks {
        match children.line_starting(rank, ADDR_LINE, end) {
            Some(a) => addrs.push(a),
            None => {
                let outcomes = outcomes(children.finish(Instant::now()));
                return Err(Error::io(format!("rank {rank} did not say where it listens: {outcomes:?}")));
            }
        }
    }
    let peers = format!("{PEERS_LINE}{}", addrs.join(" "));
    for rank in 0..spec.ranks {
        // A rank that already exited is told nothing: its outcome says why.
        let _ = children.write_line(rank, &peers);
    }
    Ok(outcomes(children.finish(end)))
}

/// Each rank's result line and exit; a rank killed at the run's timeout failed.
fn outcomes(exits: Vec<Exit>) -> Vec<RankOutcome> {
    exits
        .into_iter()
        .map(|e| {
            let result = e.stdout.lines().find_map(|l| l.strip_prefix(RESULT_LINE)).map(str::to_string);
            let (result, exit) = if e.killed_at_deadline {
                (Some(format!("fail killed at the run's timeout ({result:?})")), None)
            } else {
                (result, e.status)
            };
            RankOutcome { result, exit, stdout: e.stdout.trim_end().to_string(), stderr: e.stderr }
        })
        .collect()
}

/// The rank program's `main`: `--rank R --ranks N SCENARIO key=value ...`. Listens, says
/// where, learns the others' addresses from stdin, runs the scenario and prints its result
/// line. Exit code 0 when the scenario passed, 1 when it failed, 2 for a usage error.
pub fn rank_main(args: &[String]) -> i32 {
    let (rank, ranks, scenario) = match parse_args(args) {
        Ok(v) => v,
        Err(e) => {
            eprintln!("mpib-lifecycle: {e}");
            eprintln!("usage: mpib-lifecycle --rank R --ranks N SCENARIO [key=value ...] (started by lifecycle::run)");
            return 2;
        }
    };
    let r = (|| {
        let (listener, addr) = crate::link::bind("127.0.0.1:0")?;
        println!("{ADDR_LINE}{addr}");
        std::io::stdout().flush().map_err(|e| Error::io(format!("stdout: {e}")))?;
        let mut line = String::new();
        std::io::stdin().read_line(&mut line).map_err(|e| Error::io(format!("stdin: {e}")))?;
        let peers = line
            .trim()
            .strip_prefix(PEERS_LINE.trim_end())
            .ok_or_else(|| Error::io(format!("expected the peers' addresses, got {line:?}")))?
            .split_whitespace()
            .map(|a| a.parse::<SocketAddr>().map_err(|_| Error::io(format!("bad address {a:?}"))))
            .collect::<Result<Vec<_>>>()?;
        if peers.len() != ranks {
            return Err(Error::io(format!("{} addresses for {ranks} ranks", peers.len())));
        }
        let mesh = mesh::Mesh::new(rank, peers, listener);
        let plugin = crate::net::Plugin::open(&crate::default_plugin(), abi(&scenario)?)?;
        match scenario.name.as_str() {
            "churn" => churn::run(&plugin, &mesh, &scenario),
            "teardown" => teardown::run(&plugin, &mesh, &scenario),
            "abort" => abort::run(&plugin, &mesh, &scenario),
            "oversize" => oversize::run(&plugin, &mesh, &scenario),
            "straggler" => straggler::run(&plugin, &mesh, &scenario),
            other => Err(Error::usage(format!("no scenario {other:?} (churn, teardown, abort, oversize, straggler)"))),
        }
    })();
    let code = match &r {
        Ok(summary) => {
            println!("{RESULT_LINE}ok {summary}");
            0
        }
        Err(e) => {
            println!("{RESULT_LINE}fail rank {rank}: {e}");
            1
        }
    };
    let _ = std::io::stdout().flush();
    code
}

/// The ABI version the scenario asks for (`abi=N`), else the newest.
fn abi(s: &Scenario) -> Result<Option<u32>> {
    match s.num("abi", 0)? {
        0 => Ok(None),
        v => Ok(Some(v as u32)),
    }
}

fn parse_args(args: &[String]) -> Result<(usize, usize, Scenario)> {
    let mut it = args.iter();
    let (mut rank, mut ranks, mut rest) = (None, None, Vec::new());
    while let Some(a) = it.next() {
        let mut value = |name: &str| -> Result<usize> {
            it.next().and_then(|v| v.parse().ok()).ok_or_else(|| Error::usage(format!("{name} needs a number")))
        };
        match a.as_str() {
            "--rank" => rank = Some(value("--rank")?),
            "--ranks" => ranks = Some(value("--ranks")?),
            _ => rest.push(a.clone()),
        }
    }
    let (rank, ranks) = match (rank, ranks) {
        (Some(r), Some(n)) if r < n => (r, n),
        _ => return Err(Error::usage("--rank R --ranks N with R < N")),
    };
    Ok((rank, ranks, Scenario::parse(&rest)?))
}
