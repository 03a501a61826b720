//! Many connections on one NCCL communicator, through the C ABI between two processes:
//! each rank opens N send and N receive comms (N = 512 by default, `MANY_COMMS=N` to change)
//! over one `init`, runs checksummed traffic on all of them at once, closes them, and does
//! it twice more. Every byte is checked (patterns of each connection's own, so a byte
//! delivered to the wrong connection is caught), and after each round what the plugin holds
//! (`mpib_resource_stats`), the process's file descriptors and threads are back where they
//! were before the first connection.
//!
//! The shared-queue goal is checked on the open connections: at most one CQ and one SRQ per
//! rail NIC of the communicator, CQ entries at least 10× below the per-connection queues of
//! before (4,624 + 1,536 per comm and rail), and registered control memory at most a comm's
//! 4-page region per comm and rail (16 KiB: CTS FIFO, records, scratch, the control ring of
//! 256-byte entries and its source; 148 KiB of before).
//!
//! The soft fabric still opens a TCP socket per QP, so the ranks raise their open-files
//! limit to the hard limit (`mpib-rank --raise-fd-limit`) until its shared links land.
//! Elsewhere: `CONFORMANCE_ENV="MPIB_FABRIC=verbs MPIB_HCA_SOUT=rxe0 MPIB_HCA_SUP=rxe1"
//! MANY_COMMS=64 ./many_connections --test-threads=1` (`MANY_ROUNDS=N`: N rounds instead of 3).

mod common;

use common::{pair, rank_program, run_with};
use mpib_tools::net::Resources;
use mpib_tools::report::{RankReport, Snapshot};
use mpib_tools::spec::{Phase, Workload};

const KIB: u64 = 1024;

fn comms() -> u32 {
    std::env::var("MANY_COMMS").ok().and_then(|v| v.parse().ok()).unwrap_or(512)
}

/// Every plugin figure that must come back when everything opened was closed.
fn held(r: &Resources) -> [(&'static str, u64); 14] {
    [
        ("contexts", r.contexts),
        ("send_comms", r.send_comms),
        ("recv_comms", r.recv_comms),
        ("listen_comms", r.listen_comms),
        ("nic_queues", r.nic_queues),
        ("cqs", r.cqs),
        ("cq_entries", r.cq_entries),
        ("srqs", r.srqs),
        ("srq_wqes", r.srq_wqes),
        ("srq_posted", r.srq_posted),
        ("qps", r.qps),
        ("qp_send_wrs", r.qp_send_wrs),
        ("control_bytes", r.control_bytes),
        ("inbox_entries", r.inbox_entries),
    ]
}

fn res(s: &Snapshot, what: &str) -> Resources {
    s.res.unwrap_or_else(|| panic!("{what}: the library exports no mpib_resource_stats"))
}

/// The shared-queue goal on `n` send and `n` receive comms of one communicator.
fn check_shared_queues(rank: u32, n: u64, r: &Resources) {
    let ctx = r.contexts.max(1);
    // Two rails, each its own NIC here (soft-sout, soft-sup; rxe0, rxe1).
    assert!(r.cqs <= 2 * ctx, "rank {rank}: {} CQs for {ctx} context(s): {r:?}", r.cqs);
    assert!(r.srqs <= 2 * ctx, "rank {rank}: {} SRQs for {ctx} context(s): {r:?}", r.srqs);
    // Before: per comm and rail a CQ of 4,624 (send) or 1,536 (receive) entries and a
    // 148 KiB control region.
    let before_cqe = n * 2 * (4624 + 1536);
    let region_bytes = n * 2 * 2 * 16 * KIB;
    assert!(r.cq_entries * 10 <= before_cqe, "rank {rank}: {} CQ entries, before {before_cqe}: {r:?}", r.cq_entries);
    assert!(
        r.control_bytes <= region_bytes,
        "rank {rank}: {} bytes of control regions, more than 16 KiB per comm and rail ({region_bytes}): {r:?}",
        r.control_bytes
    );
}

fn check_rank(rep: &RankReport, n: u64, rounds: usize) {
    let rank = rep.rank;
    assert_eq!(rep.rounds.len(), rounds, "rank {rank}: rounds");
    let base = res(&rep.base, "base");
    for (i, round) in rep.rounds.iter().enumerate() {
        let open = res(&round.open, "open");
        eprintln!(
            "rank {rank} round {i}: set-up {:.2} ms/comm; open: {open:?}; fds {} (base {}), threads {}, RSS {} MiB",
            round.setup_ns as f64 / 1e6 / (2 * n) as f64,
            round.open.fds,
            rep.base.fds,
            round.open.threads,
            round.open.rss_kib / 1024
        );
        assert_eq!((open.send_comms, open.recv_comms), (base.send_comms + n, base.recv_comms + n), "rank {rank}");
        check_shared_queues(rank, n, &open);
        let closed = res(&round.closed, "closed");
        for ((name, was), (_, now)) in held(&base).into_iter().zip(held(&closed)) {
            assert_eq!(now, was, "rank {rank} round {i}: {name} after closing everything: {closed:?}");
        }
        assert!(
            round.closed.fds <= rep.base.fds,
            "rank {rank} round {i}: {} fds open after closing, {} before",
            round.closed.fds,
            rep.base.fds
        );
        assert_eq!(round.closed.threads, rep.base.threads, "rank {rank} round {i}: threads");
    }
    // Resident memory is printed, not checked: glibc keeps freed chunks of the first rounds
    // (16 comms each way: 15, 38, 51, 51, 49, 49, 49, 52 MiB after rounds 1-8), so it says
    // little about leaks; the plugin's own figures above and tests/leaks.rs (memcheck) do.
    let rss: Vec<u64> = rep.rounds.iter().map(|r| r.closed.rss_kib / 1024).collect();
    eprintln!("rank {rank}: RSS after each round (MiB): {rss:?}");
}

#[test]
fn many_connections_each_way_on_one_communicator_then_closed_and_reopened_twice() {
    let n = comms();
    let rounds = std::env::var("MANY_ROUNDS").ok().and_then(|v| v.parse().ok()).unwrap_or(3);
    let phases = vec![
        Phase { sizes: vec![0, 8, 1000, 16 * KIB + 5], count: 6, nrecv: 1, inflight: 4, ..Phase::default() },
        Phase { sizes: vec![1, 4 * KIB], count: 2, nrecv: 3, inflight: 2, ..Phase::default() },
    ];
    let w =
        Workload { seed: 0x6d61_6e79, comms: n, rounds, bidir: true, stall_ms: 120_000, phases, ..Workload::default() };
    let mut spec = pair(w);
    spec.timeout = std::time::Duration::from_secs(1800);
    // The soft fabric opens a socket per QP: the ranks raise their open-files limit.
    let out = run_with(&format!("{n} connections each way"), &spec, &rank_program().arg("--raise-fd-limit"));
    if let Err(e) = out.check_clean() {
        panic!("{e}");
    }
    for r in &out.ranks {
        let rep = r.report.as_ref().expect("report");
        let p = &rep.phases;
        assert_eq!(p.len(), 2 * rounds as usize);
        for (i, ph) in p.iter().enumerate() {
            let tx = ph.tx.as_ref().expect("both ranks send");
            // 6 receives of 1 buffer, then 2 of 3 buffers: 6 messages a connection either way.
            assert_eq!(tx.messages, 6 * n as u64, "rank {} phase {i}", rep.rank);
        }
        check_rank(rep, n as u64, rounds as usize);
    }
}
