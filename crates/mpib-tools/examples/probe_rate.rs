//! Idle-rail probes against connections: for 1, 16, 256 and 1,024 comms (or the counts given)
//! two processes connect through the C ABI (rank 1 opens N send comms to rank 0, all on one
//! `init`, as one NCCL communicator's channels and peers would) and stream checked 8-byte
//! messages on all of them at once, one in flight each, for `--secs` (2). Small sends keep to
//! SOUT (the auto split's home rail), so SUP carries nothing on any comm and lives on probes:
//! each comm's SUP is probed every `MPIB_PROBE_INTERVAL_US` (backed off while clearly slower),
//! and the NIC's probe budget (`MPIB_PROBE_RATE`) caps what all of them send together.
//!
//! Each count runs twice, back to back: with the default configuration and with the budget
//! off (`MPIB_PROBE_RATE=0`), and prints the sender's messages and probes per second and the
//! ratio of the two probe rates. A benchmark, not a test: it prints figures.
//!
//! ```text
//! cargo run --release -p mpib-tools --example probe_rate -- [N ...] [--secs S]
//! ```
//! The fabric is the soft fabric on loopback unless `PROBE_RATE_ENV` says otherwise (as
//! `many_comms`'s `MANY_COMMS_ENV`).

use std::process::ExitCode;
use std::time::Duration;

use mpib_tools::pair::{PairSpec, Program, child_main, fabric_env, run_pair};
use mpib_tools::report::SideStats;
use mpib_tools::spec::{Phase, Workload};
use mpib_tools::{default_plugin, raise_fd_limit};

/// The sender's figures of one run: messages/s, SOUT probes/s, SUP probes/s.
fn run(plugin: &str, env: &[(String, String)], comms: u32, secs: f64) -> Result<(f64, f64, f64), String> {
    let phase = Phase {
        sizes: vec![8],
        count: u64::MAX / 2,
        inflight: 1,
        warmup: 200,
        budget_ms: (secs * 1000.0) as u64,
        ..Phase::default()
    };
    let w = Workload { comms, stall_ms: 300_000, phases: vec![phase], ..Workload::default() };
    let spec = PairSpec {
        plugin: plugin.into(),
        abi: [None, None],
        env: env.to_vec(),
        rank_env: Default::default(),
        workload: w,
        timeout: Duration::from_secs(1800),
    };
    let out = run_pair(&spec, &Program::this_program()).map_err(|e| e.to_string())?;
    out.check_clean().map_err(|e| e.to_string())?;
    let tx: Option<&SideStats> =
        out.ranks.iter().filter_map(|r| r.report.as_ref()).find_map(|r| r.phases.first().and_then(|p| p.tx.as_ref()));
    let tx = tx.ok_or("no sender report")?;
    let c = tx.counters.ok_or("the library has no counters")?;
    let s = tx.elapsed_ns.max(1) as f64 / 1e9;
    Ok((tx.messages as f64 / s, c[0].probes as f64 / s, c[1].probes as f64 / s))
}

fn main() -> ExitCode {
    raise_fd_limit();
    child_main();
    let mut counts = Vec::new();
    let mut secs = 2.0;
    let mut args = std::env::args().skip(1);
    while let Some(a) = args.next() {
        match (a.as_str(), a.parse::<u32>()) {
            ("--secs", _) => match args.next().and_then(|s| s.parse::<f64>().ok()) {
                Some(s) if s > 0.0 => secs = s,
                _ => {
                    eprintln!("probe_rate: --secs takes a positive number");
                    return ExitCode::from(2);
                }
            },
            (_, Ok(n)) if n > 0 => counts.push(n),
            _ => {
                eprintln!("usage: probe_rate [N ...] [--secs S]");
                return ExitCode::from(2);
            }
        }
    }
    if counts.is_empty() {
        counts = vec![1, 16, 256, 1024];
    }
    let plugin = default_plugin();
    let env = match fabric_env("PROBE_RATE_ENV") {
        Ok(e) => e,
        Err(e) => {
            eprintln!("probe_rate: {e}");
            return ExitCode::from(2);
        }
    };
    let mut off = env.clone();
    off.push(("MPIB_PROBE_RATE".into(), "0".into()));
    println!("# probe_rate: {plugin}; {}", env.iter().map(|(k, v)| format!("{k}={v}")).collect::<Vec<_>>().join(" "));
    println!("# 8-byte messages, one in flight per comm, {secs} s per run; the sender's figures per second");
    println!(
        "# {:>4} {:>8} {:>10} {:>10} {:>10} {:>10} {:>10} {:>10} {:>7}",
        "comms", "", "msgs/s", "SOUT pr/s", "SUP pr/s", "off msgs/s", "off SOUT", "off SUP", "probes"
    );
    let mut failed = false;
    for &n in &counts {
        let figures = run(&plugin, &env, n, secs).and_then(|d| Ok((d, run(&plugin, &off, n, secs)?)));
        match figures {
            Ok(((m, p0, p1), (om, o0, o1))) => {
                let ratio = if o0 + o1 > 0.0 { (p0 + p1) / (o0 + o1) } else { f64::NAN };
                println!(
                    "{n:>6} {:>8} {m:>10.0} {p0:>10.0} {p1:>10.0} {om:>10.0} {o0:>10.0} {o1:>10.0} {ratio:>7.3}",
                    "default"
                );
            }
            Err(e) => {
                eprintln!("probe_rate: {n} comms: {e}");
                failed = true;
            }
        }
    }
    if failed { ExitCode::FAILURE } else { ExitCode::SUCCESS }
}
