//! What connections cost: for 1, 64 and 1,024 comms (or the counts given) two processes
//! connect through the C ABI (rank 1 opens N send comms to rank 0's N receive comms, all on
//! one `init`, as one NCCL communicator's channels and peers would), send one checked
//! message on each, and each rank reports what it holds with its comms open: set-up time
//! per comm, registered control memory, CQs and their entries, SRQs and their WQEs, QPs and
//! their send-queue depth (`mpib_resource_stats`), and the process's file descriptors,
//! threads and resident memory. `KiB/comm`: resident memory grown over the set-up, per
//! comm; `used`: the same once each comm carried its messages (pages first written by
//! traffic count there). A benchmark, not a test: it prints figures.
//!
//! ```text
//! cargo run --release -p mpib-tools --example many_comms -- [N ...] [--bidir] [--msgs=M]
//! ```
//! `--bidir`: each rank holds N/2 send and N/2 receive comms (an NCCL rank's mix).
//! `--msgs=M`: each comm carries M messages (1 unless given) before `used` is taken.
//! The fabric is the soft fabric on loopback unless `MANY_COMMS_ENV` says otherwise, e.g.
//! `MANY_COMMS_ENV="MPIB_FABRIC=verbs MPIB_HCA_SOUT=rxe0 MPIB_HCA_SUP=rxe1"`.

use std::process::ExitCode;
use std::time::Duration;

use mpib_tools::pair::{PairSpec, Program, child_main, fabric_env, run_pair};
use mpib_tools::report::RankReport;
use mpib_tools::spec::{Phase, Workload};
use mpib_tools::{default_plugin, raise_fd_limit};

fn row(n: u32, bidir: bool, rep: &RankReport) -> String {
    let side = if bidir {
        "both"
    } else if rep.rank == 0 {
        "recv"
    } else {
        "send"
    };
    let Some(round) = rep.rounds.first() else { return format!("{n:>6} {:>4} {side:>5}  (no round)", rep.rank) };
    let comms = if bidir { n as u64 / 2 * 2 } else { n as u64 };
    let o = &round.open;
    let r = o.res.unwrap_or_default();
    let per = |x: u64| x as f64 / comms.max(1) as f64;
    format!(
        "{n:>6} {:>4} {side:>5} {:>10.2} {:>10.1} {:>5} {:>10} {:>5} {:>9} {:>6} {:>9} {:>6} {:>7} {:>8.1} {:>9.1} {:>6.1}",
        rep.rank,
        round.setup_ns as f64 / 1e6 / comms.max(1) as f64,
        r.control_bytes as f64 / 1024.0,
        r.cqs,
        r.cq_entries,
        r.srqs,
        r.srq_wqes,
        r.qps,
        r.qp_send_wrs,
        o.fds,
        o.threads,
        o.rss_kib as f64 / 1024.0,
        per(o.rss_kib.saturating_sub(rep.base.rss_kib)),
        per(round.used.rss_kib.saturating_sub(rep.base.rss_kib)),
    )
}

fn main() -> ExitCode {
    raise_fd_limit();
    child_main();
    let mut counts = Vec::new();
    let mut bidir = false;
    let mut msgs = 1;
    for a in std::env::args().skip(1) {
        let usage = || {
            eprintln!("usage: many_comms [N ...] [--bidir] [--msgs=M]");
            ExitCode::from(2)
        };
        if let Some(m) = a.strip_prefix("--msgs=") {
            match m.parse::<u64>() {
                Ok(m) if m > 0 => msgs = m,
                _ => return usage(),
            }
            continue;
        }
        match a.as_str() {
            "--bidir" => bidir = true,
            _ => match a.parse::<u32>() {
                Ok(n) if n > 0 => counts.push(n),
                _ => return usage(),
            },
        }
    }
    if counts.is_empty() {
        counts = vec![1, 64, 1024];
    }
    let plugin = default_plugin();
    let env = match fabric_env("MANY_COMMS_ENV") {
        Ok(e) => e,
        Err(e) => {
            eprintln!("many_comms: {e}");
            return ExitCode::from(2);
        }
    };
    println!("# many_comms: {plugin}; {}", env.iter().map(|(k, v)| format!("{k}={v}")).collect::<Vec<_>>().join(" "));
    println!(
        "# {:>4} {:>4} {:>5} {:>10} {:>10} {:>5} {:>10} {:>5} {:>9} {:>6} {:>9} {:>6} {:>7} {:>8} {:>9} {:>6}",
        "comms",
        "rank",
        "side",
        "setup ms",
        "ctrl KiB",
        "CQs",
        "CQ entries",
        "SRQs",
        "SRQ WQEs",
        "QPs",
        "QP SQ WRs",
        "fds",
        "threads",
        "RSS MiB",
        "KiB/comm",
        "used"
    );
    let mut failed = false;
    for &n in &counts {
        let per_dir = if bidir { (n / 2).max(1) } else { n };
        let phase = Phase { sizes: vec![8], count: msgs, nrecv: 1, inflight: 1, ..Phase::default() };
        let w = Workload { comms: per_dir, bidir, stall_ms: 300_000, phases: vec![phase], ..Workload::default() };
        let spec = PairSpec {
            plugin: plugin.clone(),
            abi: [None, None],
            env: env.clone(),
            rank_env: Default::default(),
            workload: w,
            timeout: Duration::from_secs(1800),
        };
        let out = match run_pair(&spec, &Program::this_program()) {
            Ok(o) => o,
            Err(e) => {
                eprintln!("many_comms: {n} comms: {e}");
                return ExitCode::FAILURE;
            }
        };
        if let Err(e) = out.check_clean() {
            eprintln!("many_comms: {n} comms failed: {e}");
            failed = true;
            continue;
        }
        for r in &out.ranks {
            println!("{}", row(n, bidir, r.report.as_ref().expect("clean run has reports")));
        }
    }
    if failed { ExitCode::FAILURE } else { ExitCode::SUCCESS }
}
