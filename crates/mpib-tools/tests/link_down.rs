//! Rail failover on real verbs (issue 19), in the Soft-RoCE guest only: while checksummed
//! traffic streams over both rails, the SUP rail's netdev is taken down, and up again 1.5 s
//! later. rxe raises a port-down async event on both ranks' SUP device; each comm feeds it
//! to its engine at its next call that waits, and the connection goes on over SOUT; once
//! the port is active again the sender's re-admission attempts rebuild SUP. The run must
//! end clean: every byte as the pattern says, every size exact, no error code on either
//! rank, each rank's `mpib_rail_stats` counting one failover on SUP and none on SOUT, and
//! the sender's timeline showing SUP flat during the outage, then SUP re-admitted on both
//! ranks and carrying bytes again before the stream ends. (Until the sender and the
//! receiver took a re-admission's steps at once — they waited for a periodic round each —
//! 3 runs of 7 never re-admitted SUP within the 17 s left, the others 1.8–6.4 s after
//! link-up; since, 5 of 5 runs 97–204 ms after it.)
//!
//! `ci/rxe-test.sh link-down` runs it (`MPIB_TEST_LINK_TOGGLE=1`, `RXE_NETDEV1`, the verbs
//! environment in `CONFORMANCE_ENV`); anywhere else it is ignored.

mod common;

use std::process::Command;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use common::{RANK_ENTRY, pair};
use mpib_tools::pair::{Launcher, child_main, run_pair_observed};
use mpib_tools::rank::PhaseStart;
use mpib_tools::spec::{Phase, Workload};

const KIB: u64 = 1024;
const MIB: u64 = 1024 * 1024;

/// Re-executed as a rank by the two-process test (see `common::RANK_ENTRY`).
#[test]
fn rank_child() {
    child_main();
}

fn ip_link(netdev: &str, state: &str) {
    let ok = Command::new("/usr/bin/ip").args(["link", "set", netdev, state]).status().is_ok_and(|s| s.success());
    assert!(ok, "ip link set {netdev} {state}");
}

/// Brings the link up again however the test ends.
struct LinkUp(String);

impl Drop for LinkUp {
    fn drop(&mut self) {
        ip_link(&self.0, "up");
    }
}

#[test]
#[ignore = "takes a netdev down: only in the Soft-RoCE guest (ci/rxe-test.sh link-down)"]
fn sup_link_down_mid_stream_loses_nothing_and_reports_nothing() {
    if std::env::var("MPIB_TEST_LINK_TOGGLE").as_deref() != Ok("1") {
        eprintln!("MPIB_TEST_LINK_TOGGLE is not 1: skipped");
        return;
    }
    let netdev = std::env::var("RXE_NETDEV1").expect("RXE_NETDEV1");
    let _up = LinkUp(netdev.clone());
    // Long enough under qemu that the link goes down and comes back well inside it.
    let phase = Phase {
        sizes: vec![4 * KIB, MIB + 7, 64 * KIB, 256 * KIB + 3],
        count: 1500,
        nrecv: 1,
        inflight: 4,
        warmup: 4,
        timeline_us: 20_000,
        ..Phase::default()
    };
    let w = Workload { seed: 19, stall_ms: 120_000, phases: vec![phase], ..Workload::default() };
    let mut spec = pair(w);
    spec.env.push(("MPIB_SPLIT".into(), "50".into()));
    spec.env.push(("RUST_LOG".into(), "mpib=info".into())); // the re-admission's INFO line
    // 1.5 s into the sender's measured phase (after its warm-up), from a thread: the
    // observer runs in the parent's event loop.
    let mut triggered = false;
    // When the link came up, in ms after the parent saw the sender's phase start.
    let up_ms = Arc::new(Mutex::new(None::<u64>));
    let mut observer = |rank: usize, p: &PhaseStart| {
        if rank != 1 || p.warmup || triggered {
            return;
        }
        triggered = true;
        let (netdev, up_ms) = (netdev.clone(), up_ms.clone());
        std::thread::spawn(move || {
            let start = Instant::now();
            std::thread::sleep(Duration::from_millis(1500));
            ip_link(&netdev, "down");
            eprintln!("link_down: {netdev} down");
            std::thread::sleep(Duration::from_millis(1500));
            ip_link(&netdev, "up");
            *up_ms.lock().unwrap() = Some(start.elapsed().as_millis() as u64);
            eprintln!("link_down: {netdev} up");
        });
    };
    let t0 = Instant::now();
    let out = run_pair_observed(&spec, &Launcher::test_binary(RANK_ENTRY), &mut observer).expect("start the ranks");
    eprintln!("link down mid-stream: {:.2} s", t0.elapsed().as_secs_f64());
    if let Err(e) = out.check_clean() {
        panic!("{e}");
    }
    for rank in 0..2 {
        let rails = out.ranks[rank].report.as_ref().and_then(|rep| rep.rails).expect("mpib_rail_stats");
        assert_eq!(
            (rails[0].failovers, rails[1].failovers),
            (0, 1),
            "rank {rank}: SUP failed over once, SOUT never (was the link taken down before the stream ended?)\n{}",
            out.describe()
        );
    }
    let sender = &out.ranks[1].stderr;
    assert!(sender.contains("port is down (async event)"), "the port-down event did not start the failover\n{sender}");
    let readmitted: Vec<u64> = out
        .ranks
        .iter()
        .map(|r| r.report.as_ref().and_then(|rep| rep.rails).map_or(0, |x| x[1].readmissions))
        .collect();
    let rep = out.ranks[1].report.as_ref().expect("sender's report");
    let tl = &rep.phases[0].tx.as_ref().expect("sender's side").timeline;
    let flat = tl.windows(6).position(|w| w.iter().all(|e| e[2] == w[0][2]) && w[5][1] > w[0][1]);
    let back = flat.and_then(|f| tl[f..].iter().find(|e| e[2] > tl[f][2]).map(|e| e[0] / 1_000_000));
    for (rank, who) in [(0, "receiver"), (1, "sender")] {
        for line in out.ranks[rank].stderr.lines().filter(|l| l.contains("SUP") || l.contains("re-admission")) {
            eprintln!("link_down: {who}: {line}");
        }
    }
    let up = *up_ms.lock().unwrap();
    eprintln!(
        "link_down: SUP flat from {:?} ms, link up at {up:?} ms, carrying again at {back:?} ms ({:?} ms after the link \
         came up); readmissions (receiver, sender) {readmitted:?}",
        flat.map(|f| tl[f][0] / 1_000_000),
        up.zip(back).map(|(u, b)| b as i64 - u as i64)
    );
    assert!(flat.is_some(), "the sender's timeline shows no outage of SUP\n{}", out.describe());
    assert_eq!(readmitted, [1, 1], "SUP re-admitted once on each rank (receiver, sender)\n{}", out.describe());
    assert!(back.is_some(), "SUP carries bytes again after the outage\n{}", out.describe());
}
