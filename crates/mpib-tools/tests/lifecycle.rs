//! The plugin over a job's life, as NCCL drives it (`mpib_tools::lifecycle`): connections set
//! up and closed from many threads and contexts at once, ranks that leave independently, a
//! ring of ranks, aborts with requests in flight, sends larger than their receive. Each run
//! is 2 or 4 processes (`mpib-lifecycle`), every byte checked, over many seeds.
//!
//! Seeds: `LIFECYCLE_SEED=<seed>` starts every sweep there (the seed of a failing run is in
//! its message). `CONFORMANCE_ENV` names the fabric as for the conformance suite (the soft
//! fabric on loopback by default; Soft-RoCE in `ci/rxe-test.sh`); `LIFECYCLE_RANK` the rank
//! program when the test binary runs away from `target/` (a VM); `LIFECYCLE_SEEDS` scales
//! the number of seeds of each sweep (a percentage, 100 by default).

mod common;

use std::time::Duration;

use mpib_tools::lifecycle::{RankOutcome, RunSpec, Scenario, run};

fn rank_program() -> std::path::PathBuf {
    match std::env::var("LIFECYCLE_RANK") {
        Ok(p) if !p.is_empty() => p.into(),
        _ => env!("CARGO_BIN_EXE_mpib-lifecycle").into(),
    }
}

fn timeout() -> Duration {
    let s = std::env::var("CONFORMANCE_TIMEOUT_S").ok().and_then(|v| v.parse().ok()).unwrap_or(120);
    Duration::from_secs(s)
}

/// The first seed of a sweep: `LIFECYCLE_SEED`, else the clock (printed).
fn first_seed(what: &str) -> u64 {
    let s = std::env::var("LIFECYCLE_SEED").ok().and_then(|v| v.parse().ok()).unwrap_or_else(|| {
        std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).unwrap().as_nanos() as u64 % 1_000_000_007
    });
    eprintln!("{what}: first seed {s} (LIFECYCLE_SEED={s} repeats the sweep)");
    s
}

/// `n` scaled by `LIFECYCLE_SEEDS` percent (at least 1).
fn seeds(n: u64) -> u64 {
    let pct = std::env::var("LIFECYCLE_SEEDS").ok().and_then(|v| v.parse::<u64>().ok()).unwrap_or(100);
    (n * pct / 100).max(1)
}

/// Runs `words` on `ranks` ranks with `extra` environment; panics with every rank's output
/// when a rank failed.
fn run_ok(ranks: usize, words: &[String], extra: &[(&str, &str)]) -> Vec<RankOutcome> {
    let mut env = common::fabric_env();
    env.extend(extra.iter().map(|(k, v)| (k.to_string(), v.to_string())));
    let spec = RunSpec {
        program: rank_program(),
        plugin: common::plugin_path(),
        ranks,
        scenario: Scenario::parse(words).unwrap(),
        env,
        timeout: timeout(),
    };
    let t = std::time::Instant::now();
    let out = run(&spec).unwrap_or_else(|e| panic!("{}: {e}", words.join(" ")));
    if !out.iter().all(RankOutcome::ok) {
        let mut msg = format!("{} (env {extra:?}) failed:\n", words.join(" "));
        for (r, o) in out.iter().enumerate() {
            msg += &format!(
                "--- rank {r}: {:?} exit {:?}\n{}\n--- stderr:\n{}\n",
                o.result,
                o.exit,
                o.stdout,
                tail(&o.stderr)
            );
        }
        panic!("{msg}");
    }
    eprintln!("{} ({:.2} s): {}", words.join(" "), t.elapsed().as_secs_f64(), out[0].result.as_deref().unwrap_or(""));
    out
}

fn tail(s: &str) -> String {
    let lines: Vec<&str> = s.lines().collect();
    lines[lines.len().saturating_sub(60)..].join("\n")
}

fn words(s: &str, seed: u64) -> Vec<String> {
    s.split_whitespace().map(str::to_string).chain([format!("seed={seed}")]).collect()
}

/// Idle-rail probes as fast as the plugin allows, unbudgeted: what makes mpib's own traffic
/// most likely to meet a peer's close.
const FAST_PROBES: [(&str, &str); 2] = [("MPIB_PROBE_INTERVAL_US", "1"), ("MPIB_PROBE_RATE", "0")];

#[test]
fn threads_set_up_and_close_connections_beside_each_other_on_one_context() {
    let s0 = first_seed("churn, one context");
    for s in s0..s0 + seeds(30) {
        run_ok(2, &words("churn threads=4 rounds=3 contexts=shared", s), &FAST_PROBES);
    }
}

#[test]
fn threads_set_up_and_close_connections_on_contexts_of_their_own() {
    let s0 = first_seed("churn, a context per thread / per round");
    for s in s0..s0 + seeds(10) {
        run_ok(2, &words("churn threads=4 rounds=3 contexts=thread", s), &[]);
        run_ok(2, &words("churn threads=3 rounds=3 contexts=round", s), &FAST_PROBES);
    }
}

#[test]
fn threads_set_up_and_close_connections_through_an_older_abi() {
    // v8: one process-wide context, as NCCL 2.19 … 2.23 use it.
    let s0 = first_seed("churn, ABI v8");
    for s in s0..s0 + seeds(6) {
        run_ok(2, &words("churn threads=4 rounds=2 contexts=shared abi=8", s), &FAST_PROBES);
    }
}

#[test]
fn a_sender_tests_its_last_sends_after_the_receiver_closed() {
    let s0 = first_seed("teardown, 2 ranks");
    for s in s0..s0 + seeds(24) {
        // Single receives, then grouped receives of 1 … 8 buffers of mixed sizes and tags.
        run_ok(2, &words("teardown max_n=1 groups=12", s), &FAST_PROBES);
        run_ok(2, &words("teardown max_n=8", s), &FAST_PROBES);
    }
}

#[test]
fn one_listen_comm_accepts_several_connections_that_then_leave_independently() {
    let s0 = first_seed("teardown, 3 connections through one listen comm");
    for s in s0..s0 + seeds(8) {
        run_ok(2, &words("teardown conns=3 groups=12", s), &FAST_PROBES);
    }
}

#[test]
fn a_ring_of_four_ranks_leaves_independently() {
    let s0 = first_seed("teardown, ring of 4");
    for s in s0..s0 + seeds(6) {
        run_ok(4, &words("teardown max_n=8 groups=16", s), &FAST_PROBES);
    }
}

#[test]
fn an_abort_with_requests_in_flight_leaves_the_other_connection_and_no_resource() {
    let s0 = first_seed("abort");
    for s in s0..s0 + seeds(8) {
        run_ok(2, &words("abort who=both", s), &FAST_PROBES);
    }
    // One side aborts alone: the other's calls on that connection end in an error, not a hang.
    run_ok(2, &words("abort who=0", s0), &FAST_PROBES);
    run_ok(2, &words("abort who=1 abort_max_ms=5", s0), &[]);
}

#[test]
fn oversized_sends_fail_one_by_one_and_cost_a_few_warnings() {
    let out = run_ok(2, &words("oversize count=1000 size=4096", first_seed("oversize")), &[]);
    for (r, o) in out.iter().enumerate() {
        let w = o.warn_lines();
        assert!(w.len() <= 4, "rank {r} logged {} WARN lines for 1000 oversized sends:\n{}", w.len(), w.join("\n"));
    }
    assert!(
        out[1].result.as_deref().is_some_and(|r| r.contains("1000 oversized sends refused")),
        "{:?}",
        out[1].result
    );
}

#[test]
fn a_rank_that_comes_late_to_set_up_is_waited_for() {
    // With a set-up deadline shorter than the lateness, the old behaviour: the on-time
    // rank's connect fails. Without one (the default), both complete. (The plugin's own
    // unit tests simulate a peer 45 s late.)
    let out = run_ok(2, &words("straggler late_ms=3000", first_seed("straggler")), &[]);
    assert!(out[1].result.as_deref().is_some_and(|r| r.contains("on time")), "{:?}", out[1].result);
    let mut env = common::fabric_env();
    env.push(("MPIB_CONNECT_TIMEOUT_MS".into(), "1000".into()));
    let spec = RunSpec {
        program: rank_program(),
        plugin: common::plugin_path(),
        ranks: 2,
        scenario: Scenario::parse(&words("straggler late_ms=3000", 1)).unwrap(),
        env,
        timeout: timeout(),
    };
    let out = run(&spec).unwrap();
    assert!(
        out[1].result.as_deref().is_some_and(|r| r.contains("fail") && r.contains("connect"))
            && out[1].stderr.contains("MPIB_CONNECT_TIMEOUT_MS"),
        "a configured deadline still holds: {:?}\n{}",
        out[1].result,
        out[1].stderr
    );
}
