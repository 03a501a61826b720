//! The two-process mode. The parent (a test, or `mpib-perf` without `--connect`) starts two
//! copies of a rank program ([`child_procs`]): rank 0 binds the control channel on
//! 127.0.0.1:0 and prints its address, the parent then starts rank 1 with that address. Each
//! rank loads the plugin (its own process, its own environment: `MPIB_SPLIT` and friends are
//! read once per process), runs [`rank::run`] and prints its report as one line, which the
//! parent parses.
//!
//! The rank program is `mpib-rank` (the tests), or a tool that calls [`child_main`] first
//! (`mpib-perf` starts itself: a user's copy needs no other program beside it).
//!
//! ```text
//! parent ──spawn──▶ rank 0: NCCLNET-DRIVER-LINK 127.0.0.1:PORT   (stdout)
//!        ──spawn──▶ rank 1 (connects to PORT)
//!                   rank 0 ◀── workload, handles, barrier+reports ──▶ rank 1
//!        ◀──────── NCCLNET-DRIVER-REPORT …   (stdout of each)
//! ```

use std::io::Write;
use std::process::ExitStatus;
use std::time::{Duration, Instant};

pub use child_procs::Program;
use child_procs::{Children, Stream};

use super::kv::{Fields, Writer};
use super::link::{self, Link};
use super::net::Plugin;
use super::rank::{self, PhaseStart};
use super::report::{Failure, RankReport, mono_ns};
use super::spec::Workload;
use super::{Error, Result};

const ENV_RANK: &str = "NCCLNET_DRIVER_RANK";
const ENV_LINK: &str = "NCCLNET_DRIVER_LINK";
const ENV_WORKLOAD: &str = "NCCLNET_DRIVER_WORKLOAD";
const ENV_PLUGIN: &str = "NCCLNET_DRIVER_PLUGIN";
const ENV_ABI: &str = "NCCLNET_DRIVER_ABI";
const LINK_LINE: &str = "NCCLNET-DRIVER-LINK ";
const REPORT_LINE: &str = "NCCLNET-DRIVER-REPORT ";
const KILLED_LINE: &str = "NCCLNET-DRIVER-KILLED ";
const PHASE_LINE: &str = "NCCLNET-DRIVER-PHASE ";

/// The ranks' fabric: the soft fabric over loopback (both rails on 127.0.0.1), or the
/// `NAME=VALUE` list the environment variable `var` holds, e.g. `var="MPIB_FABRIC=verbs
/// MPIB_HCA_SOUT=rxe0 MPIB_HCA_SUP=rxe1"` to run the same thing on Soft-RoCE (the ranks get
/// no other `MPIB_*` variable from the parent, [`PairSpec::env`]).
pub fn fabric_env(var: &str) -> Result<Vec<(String, String)>> {
    let list = std::env::var(var)
        .unwrap_or_else(|_| "MPIB_FABRIC=soft MPIB_SOFT_SOUT_ADDR=127.0.0.1 MPIB_SOFT_SUP_ADDR=127.0.0.1".into());
    list.split_whitespace()
        .map(|kv| match kv.split_once('=') {
            Some((k, v)) => Ok((k.to_string(), v.to_string())),
            None => Err(Error::usage(format!("{var}: {kv:?} is not NAME=VALUE"))),
        })
        .collect()
}

/// A two-rank run.
#[derive(Clone, Debug)]
pub struct PairSpec {
    /// The plugin library, as `NCCL_NET_PLUGIN` names it.
    pub plugin: String,
    /// ABI version per rank (`None` = the newest the library exports).
    pub abi: [Option<u32>; 2],
    /// Environment of both ranks. Every `MPIB_*` variable of the parent is removed first, so
    /// a run depends on nothing but this list.
    pub env: Vec<(String, String)>,
    /// Environment of one rank on top of `env` (a rail on another device, say).
    pub rank_env: [Vec<(String, String)>; 2],
    pub workload: Workload,
    /// The parent kills both ranks after this long.
    pub timeout: Duration,
}

/// What one rank did.
#[derive(Debug, Default)]
pub struct RankOutcome {
    pub report: Option<RankReport>,
    pub status: Option<ExitStatus>,
    /// When the rank killed itself ([`super::spec::Kill`]), from its last line.
    pub killed_at_ns: Option<u64>,
    pub stdout: String,
    pub stderr: String,
}

impl RankOutcome {
    /// The rank's failure, if its report has one.
    pub fn failure(&self) -> Option<&Failure> {
        self.report.as_ref().and_then(|r| r.failure.as_ref())
    }

    /// Whether the process died of SIGKILL.
    pub fn was_killed(&self) -> bool {
        use std::os::unix::process::ExitStatusExt;
        self.status.is_some_and(|s| s.signal() == Some(libc::SIGKILL))
    }
}

/// What both ranks did.
#[derive(Debug, Default)]
pub struct PairOutcome {
    pub ranks: [RankOutcome; 2],
    pub timed_out: bool,
    pub elapsed: Duration,
}

impl PairOutcome {
    /// Everything about the run, for a failure message: exit statuses, report summaries,
    /// the last lines of each rank's stderr.
    pub fn describe(&self) -> String {
        let mut s = String::new();
        if self.timed_out {
            s.push_str("TIMED OUT: the parent killed both ranks\n");
        }
        for (i, r) in self.ranks.iter().enumerate() {
            s.push_str(&format!("--- rank {i}: status {:?}\n", r.status));
            match &r.report {
                Some(rep) => {
                    if let Some(f) = &rep.failure {
                        s.push_str(&format!("error: {}\n", f.error));
                    }
                    s.push_str(&format!("report: {}\n", rep.to_line()));
                }
                None => s.push_str("no report\n"),
            }
            let tail = |t: &str| t[t.len().saturating_sub(6000)..].to_string();
            s.push_str(&format!("stdout (tail):\n{}\nstderr (tail):\n{}\n", tail(&r.stdout), tail(&r.stderr)));
        }
        s
    }

    /// Checks a run that should have worked: no timeout, both ranks exited 0 with a report
    /// and no error, and [`check_reports`].
    pub fn check_clean(&self) -> Result<()> {
        let fail = |m: String| Err(Error::data(format!("{m}\n{}", self.describe())));
        if self.timed_out {
            return fail("the run timed out".into());
        }
        let mut reps = Vec::new();
        for (i, r) in self.ranks.iter().enumerate() {
            let Some(rep) = &r.report else { return fail(format!("rank {i} gave no report")) };
            if let Some(f) = &rep.failure {
                return fail(format!("rank {i} failed: {}", f.error));
            }
            if !r.status.is_some_and(|s| s.success()) {
                return fail(format!("rank {i} exited with {:?}", r.status));
            }
            reps.push(rep);
        }
        check_reports([reps[0], reps[1]]).or_else(|e| fail(e.msg))
    }
}

/// Checks the reports of two ranks that ran without error: every phase (and warm-up)
/// complete with nothing wrong, no 0-byte IMM, and what the senders delivered (messages,
/// bytes, checksum) is what the receivers got.
pub fn check_reports(reps: [&RankReport; 2]) -> Result<()> {
    let fail = |m: String| Err(Error::data(m));
    let phases = reps[0].phases.len();
    if reps[1].phases.len() != phases {
        return fail("the ranks ran different numbers of phases".into());
    }
    for p in 0..phases {
        for (from, to) in [(1usize, 0usize), (0, 1)] {
            let (sent, got) = (&reps[from].phases[p], &reps[to].phases[p]);
            let runs = [("", Some(sent), Some(got)), (" (warm-up)", sent.warmup.as_deref(), got.warmup.as_deref())];
            for (what, sent, got) in runs {
                let (Some(tx), Some(rx)) = (sent.and_then(|s| s.tx.as_ref()), got.and_then(|g| g.rx.as_ref())) else {
                    continue;
                };
                for (who, s) in [(from, tx), (to, rx)] {
                    if s.wrong_bytes + s.wrong_sizes + s.canary_broken > 0 {
                        return fail(format!("phase {p}{what}, rank {who}: {}", s.first_wrong));
                    }
                }
                // mpib's counters, when the library has them: no rail ever sends an IMM
                // without bytes of a non-empty transfer.
                if let Some(c) = &tx.counters
                    && c.iter().any(|r| r.zero_byte_imm != 0)
                {
                    return fail(format!("phase {p}{what}, rank {from}: 0-byte IMMs posted: {c:?}"));
                }
                if (tx.messages, tx.bytes, tx.checksum) != (rx.messages, rx.bytes, rx.checksum) {
                    return fail(format!(
                        "phase {p}{what}: rank {from} sent {} messages / {} bytes (checksum {:#x}), rank {to} received {} / {} ({:#x})",
                        tx.messages, tx.bytes, tx.checksum, rx.messages, rx.bytes, rx.checksum
                    ));
                }
            }
        }
    }
    Ok(())
}

/// `program` as rank `rank` of `spec`, its control channel `link`.
fn rank_program(program: &Program, spec: &PairSpec, rank: usize, link: &str) -> Program {
    program
        .clone()
        .remove_prefix("MPIB_")
        .remove_prefix("NCCLNET_DRIVER_")
        .envs(spec.env.iter().chain(&spec.rank_env[rank]).cloned())
        .env(ENV_RANK, rank.to_string())
        .env(ENV_LINK, link)
        .env(ENV_WORKLOAD, spec.workload.to_line())
        .env(ENV_PLUGIN, &spec.plugin)
        .env(ENV_ABI, spec.abi[rank].map(|v| v.to_string()).unwrap_or_default())
}

fn start(children: &mut Children, program: &Program, spec: &PairSpec, rank: usize, link: &str) -> Result<()> {
    children
        .start(&rank_program(program, spec, rank, link))
        .map(|_| ())
        .map_err(|e| Error::io(format!("starting rank {rank}: {e}")))
}

/// Runs `spec` as two processes of `program`; returns when both exited (or were killed at
/// the timeout).
pub fn run_pair(spec: &PairSpec, program: &Program) -> Result<PairOutcome> {
    run_pair_observed(spec, program, &mut |_, _| {})
}

fn phase_line(p: &PhaseStart) -> String {
    let mut w = Writer::new();
    w.put("index", p.index).put("warmup", p.warmup as u8).put("count", p.count).put("at_ns", p.at_ns);
    w.finish()
}

fn parse_phase_line(line: &str) -> Result<PhaseStart> {
    let f = Fields::parse(line)?;
    Ok(PhaseStart {
        index: f.get("index")?,
        warmup: f.get::<u8>("warmup")? != 0,
        count: f.get("count")?,
        at_ns: f.get("at_ns")?,
    })
}

/// [`run_pair`], telling `obs` (rank, phase) as each rank starts each phase, while the
/// ranks run.
pub fn run_pair_observed(
    spec: &PairSpec,
    program: &Program,
    obs: &mut dyn FnMut(usize, &PhaseStart),
) -> Result<PairOutcome> {
    spec.workload.check()?;
    let start_at = Instant::now();
    let end = start_at + spec.timeout;
    let mut out = PairOutcome::default();
    let mut children = Children::new();
    start(&mut children, program, spec, 0, "listen:127.0.0.1:0")?;
    let mut both_started = false;
    while let Some(line) = children.next(end) {
        let (r, l) = (line.child, line.text);
        if line.stream == Stream::Stderr {
            continue;
        }
        if let Some(addr) = l.strip_prefix(LINK_LINE)
            && r == 0
            && !both_started
        {
            start(&mut children, program, spec, 1, &format!("connect:{addr}"))?;
            both_started = true;
        } else if let Some(p) = l.strip_prefix(PHASE_LINE) {
            obs(r, &parse_phase_line(p)?);
        } else if let Some(rep) = l.strip_prefix(REPORT_LINE) {
            out.ranks[r].report = Some(RankReport::from_line(rep)?);
        } else if let Some(k) = l.strip_prefix(KILLED_LINE) {
            out.ranks[r].killed_at_ns =
                k.split_whitespace().find_map(|f| f.strip_prefix("at_ns=")).and_then(|v| v.parse().ok());
        }
    }
    out.timed_out = children.streams_open();
    let exits = children.finish(if out.timed_out { Instant::now() } else { end });
    for (r, e) in exits.into_iter().enumerate() {
        (out.ranks[r].status, out.ranks[r].stdout, out.ranks[r].stderr) = (e.status, e.stdout, e.stderr);
    }
    out.elapsed = start_at.elapsed();
    Ok(out)
}

/// In a process started as a rank ([`run_pair`]'s variables set): runs the rank, prints its
/// report and returns the exit code the process should end with (0, or 3 when the rank could
/// not run: a missing variable, a control channel that did not connect). Elsewhere: `None`.
pub fn rank_from_env() -> Option<i32> {
    let rank = std::env::var(ENV_RANK).ok()?;
    let code = match run_child(&rank) {
        Ok(()) => 0,
        Err(e) => {
            eprintln!("ncclnet driver rank {rank}: {e}");
            3
        }
    };
    let _ = std::io::stdout().flush();
    Some(code)
}

/// For a tool that is its own rank program (`mpib-perf`, started by [`Program::this_program`]):
/// in a process started as a rank, runs the rank and exits ([`rank_from_env`]). Elsewhere:
/// returns at once.
pub fn child_main() {
    if let Some(code) = rank_from_env() {
        std::process::exit(code);
    }
}

fn run_child(rank: &str) -> Result<()> {
    let env = |k: &str| std::env::var(k).map_err(|_| Error::usage(format!("{k} is not set")));
    let rank: u32 = rank.parse().map_err(|_| Error::usage(format!("{ENV_RANK}={rank:?}")))?;
    let workload = Workload::from_line(&env(ENV_WORKLOAD)?)?;
    let abi = match env(ENV_ABI)?.as_str() {
        "" => None,
        v => Some(v.parse().map_err(|_| Error::usage(format!("{ENV_ABI}={v:?}")))?),
    };
    let link_spec = env(ENV_LINK)?;
    let wait = Duration::from_millis(workload.stall_ms.max(10_000));
    let mut link = match link_spec.split_once(':') {
        Some(("listen", addr)) => {
            let (l, bound) = link::bind(addr)?;
            let mut o = std::io::stdout().lock();
            let _ = writeln!(o, "{LINK_LINE}{bound}");
            let _ = o.flush();
            Link::accept(&l, wait)?
        }
        Some(("connect", addr)) => Link::connect(addr, wait)?,
        _ => return Err(Error::usage(format!("{ENV_LINK}={link_spec:?}: listen:ADDR or connect:ADDR"))),
    };
    let mut tell = |p: &PhaseStart| {
        let mut o = std::io::stdout().lock();
        let _ = writeln!(o, "{PHASE_LINE}{}", phase_line(p));
        let _ = o.flush();
    };
    let report = match Plugin::open(&env(ENV_PLUGIN)?, abi) {
        Ok(p) => rank::run_observed(&p, &mut link, rank, &workload, &mut tell).0,
        Err(error) => RankReport { rank, failure: Some(Failure { error, at_ns: mono_ns() }), ..RankReport::default() },
    };
    let mut o = std::io::stdout().lock();
    let _ = writeln!(o, "{REPORT_LINE}{}", report.to_line());
    let _ = o.flush();
    Ok(())
}
