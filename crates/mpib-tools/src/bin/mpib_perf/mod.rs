//! mpib-perf's parts: `opts` (the command line and what it means), `run` (the ways two
//! ranks run), `token` (`--listen`'s token), `progress` (what is printed while they run),
//! `results` (table, `--stats` view, JSON, timeline), `list` (`--list`: what the plugin would
//! use).

pub mod drill;
pub mod list;
pub mod opts;
pub mod progress;
pub mod results;
pub mod run;
pub mod token;

use std::io::Write;
use std::process::ExitCode;

use clap::{CommandFactory, Parser};
use mpib_tools::pair::check_reports;
use mpib_tools::report::{Failure, RankReport};
use mpib_tools::{ErrorKind, code_name};

use opts::{Mode, Opts, Plan};
use progress::Progress;
use run::Outcome;

/// An error the user can act on: one line (exit code 1), then perhaps the plugin's own
/// log lines.
#[derive(Debug)]
pub struct Fail {
    pub line: String,
    pub detail: Vec<String>,
}

impl Fail {
    pub fn new(line: impl Into<String>) -> Fail {
        Fail { line: line.into(), detail: Vec::new() }
    }

    /// `init` failed in this process: the plugin logged why on stderr just before.
    pub fn init(msg: impl std::fmt::Display) -> Fail {
        Fail::new(format!("the plugin's init failed: {msg} (its log lines above say why)"))
    }
}

pub fn main() -> ExitCode {
    let plan = match Plan::new(Opts::parse()) {
        Ok(p) => p,
        Err(msg) => Opts::command().error(clap::error::ErrorKind::ArgumentConflict, msg).exit(),
    };
    match go(&plan) {
        Ok(()) => ExitCode::SUCCESS,
        Err(f) => {
            let _ = std::io::stdout().flush();
            let mut err = std::io::stderr().lock();
            let _ = writeln!(err, "mpib-perf: {}", f.line);
            for d in &f.detail {
                let _ = writeln!(err, "  {d}");
            }
            ExitCode::from(1)
        }
    }
}

fn go(plan: &Plan) -> Result<(), Fail> {
    if plan.mode != Mode::Local {
        run::ensure_env(plan)?;
    }
    let (lib, plugin) = run::load_plugin(plan)?;
    if plan.mode == Mode::List {
        print!("{}", list::list(&lib, &plugin)?);
        return Ok(());
    }
    if plan.opts.inflight as usize > plugin.max_requests() {
        return Err(Fail::new(format!(
            "--inflight {}: with ABI v{} NCCL keeps at most {} requests in flight per comm",
            plan.opts.inflight,
            plugin.version(),
            plugin.max_requests()
        )));
    }
    let alone = match &plan.drill {
        Some(d) => Some(baseline(plan, d, &lib)?),
        None => None,
    };
    let load = drill::load_average();
    let mut progress = Progress::new(&plan.sizes, plan.opts.quiet, plan.opts.timeline.is_some());
    let out = run::run(plan, &lib, &plugin, &mut progress);
    progress.done();
    let out = out?;
    let reps = reports(&out)?;
    let summary = results::summarize(plan, reps);
    let figures = plan.drill.as_ref().map(|d| (d, drill::figures(d, &reps[1].phases[0], alone)));
    if !plan.opts.quiet {
        print!("{}", results::table(plan, &summary));
        if let Some((d, f)) = &figures {
            let wrong = summary.rows.iter().map(|r| r.wrong).sum();
            print!("{}", drill::text(d, f, wrong, &load));
        }
    }
    let views = plan.opts.stats.then(|| results::views(reps, out.ran_here));
    if let Some(v) = &views
        && !plan.opts.quiet
    {
        print!("{}", results::views_text(v, plan.opts.bidir));
    }
    if let Some(path) = &plan.opts.json {
        let mut doc = results::json(&summary);
        if let Some((d, f)) = &figures {
            doc["drill"] = drill::json(d, f, &load);
        }
        if let Some(v) = &views {
            doc["stats"] = results::views_json(v);
        }
        write_json(path, &doc)?;
    }
    if let Some(path) = &plan.opts.timeline {
        write_json(path, &results::timeline(plan, &summary, &reps[1].phases[0]))?;
    }
    if let Some(w) = &summary.first_wrong {
        return Err(Fail::new(format!("data mismatch at {w}")));
    }
    check_reports(reps).map_err(|e| Fail::new(format!("data mismatch: {}", e.msg)))?;
    match &figures {
        Some((d, f)) => drill::check(d, f).map_err(Fail::new),
        None => Ok(()),
    }
}

/// The drill's baseline: the same stream for a second on the surviving rail alone
/// (`--split` on it, no drill); its GB/s.
fn baseline(plan: &Plan, d: &drill::Drill, lib: &str) -> Result<f64, Fail> {
    let mut o = plan.opts.clone();
    (o.fail_rail, o.split, o.timeline, o.json) = (None, Some(d.surviving().into()), None, None);
    o.duration = Some(std::time::Duration::from_secs(1));
    o.sizes = Some(opts::Sizes { list: plan.sizes.clone(), text: plan.sizes[0].to_string() });
    let p = Plan::new(o).map_err(Fail::new)?;
    let mut progress = Progress::new(&p.sizes, true, false);
    let out = run::local(&p, lib, &mut progress)?;
    let reps = reports(&out)?;
    let s = results::summarize(&p, reps);
    check_reports(reps).map_err(|e| Fail::new(format!("data mismatch in the drill's baseline: {}", e.msg)))?;
    Ok(s.rows.first().map_or(0.0, |r| r.gbps))
}

fn write_json(path: &str, v: &serde_json::Value) -> Result<(), Fail> {
    if path == "-" {
        println!("{}", serde_json::to_string_pretty(v).unwrap_or_default());
        return Ok(());
    }
    results::write_json(path, v).map_err(Fail::new)
}

/// Both ranks' reports, or the one line that says why there are none.
fn reports(out: &Outcome) -> Result<[&RankReport; 2], Fail> {
    let tail = |i: usize| -> Vec<String> {
        let lines: Vec<&str> = out.stderr[i].lines().collect();
        lines[lines.len().saturating_sub(20)..].iter().map(|l| format!("rank {i}: {l}")).collect()
    };
    if out.timed_out {
        let mut f = Fail::new("the ranks did not finish in time and were killed");
        f.detail = tail(0).into_iter().chain(tail(1)).collect();
        return Err(f);
    }
    let failures: Vec<(usize, &Failure)> =
        (0..2).filter_map(|i| out.reports[i].as_ref().and_then(|r| r.failure.as_ref()).map(|f| (i, f))).collect();
    // The cause, not its echo: a rank whose peer failed sees the control channel close.
    let cause = failures.iter().min_by_key(|(_, f)| (matches!(f.error.kind, ErrorKind::Io), f.at_ns));
    if let Some(&(i, f)) = cause {
        let mut fail = Fail::new(describe(i, f));
        if f.error.kind == ErrorKind::Call && f.error.call == "init" {
            fail.detail = tail(i);
        }
        return Err(fail);
    }
    for i in 0..2 {
        if let Some(status) = &out.lost[i] {
            let mut f = Fail::new(format!("rank {i} exited ({status}) without a report"));
            f.detail = tail(i);
            return Err(f);
        }
    }
    match (&out.reports[0], &out.reports[1]) {
        (Some(a), Some(b)) => Ok([a, b]),
        _ => Err(Fail::new("the peer's report did not arrive")),
    }
}

/// One line for a rank's first error.
fn describe(rank: usize, f: &Failure) -> String {
    let e = &f.error;
    match (&e.kind, e.call) {
        (ErrorKind::Load, _) => e.msg.clone(),
        (ErrorKind::Call, "init") => {
            format!("the plugin's init failed on rank {rank}: {} ({}); the plugin said:", code_name(e.code), e.code)
        }
        (ErrorKind::Call, "listen" | "connect" | "accept") => {
            format!("peer unreachable through the plugin (rank {rank}): {}", e.msg)
        }
        (ErrorKind::Timeout, _) if e.msg.contains("connection set-up") => {
            format!("peer unreachable through the plugin (rank {rank}): {}", e.msg)
        }
        (ErrorKind::Usage, _) if e.msg.contains("workloads differ") => format!("options differ: {}", e.msg),
        (ErrorKind::Usage, _) if e.msg.starts_with("device ") && e.msg.contains("does not exist") => {
            format!("--dev: {} on rank {rank} (mpib-perf --list numbers them)", e.msg)
        }
        (ErrorKind::Data, _) => format!("data mismatch: {}", e.msg),
        _ => format!("rank {rank} failed: {}", e.msg),
    }
}
