//! The protocol through the C ABI, as NCCL drives it: the built library is `dlopen`ed by two
//! processes (the program `mpib-rank`, as rank 0 = receiver and rank 1 = sender), which
//! connect over the soft fabric on loopback and run scripted workloads; every byte is checked
//! against a per-message pattern, every reported size against the expected one, and the
//! sender's checksum of what it delivered against the receiver's. See `mpib_tools`.
//!
//! Run alone: `cargo test --test conformance`. A failing seeded test prints its seed;
//! `CONFORMANCE_SEED=<seed>` repeats it. Elsewhere (a Soft-RoCE VM): copy the test binary,
//! `mpib-rank` and the library, then `CONFORMANCE_RANK=/path/mpib-rank
//! NCCL_NET_PLUGIN=/path/libmpib.so CONFORMANCE_ENV="MPIB_FABRIC=verbs MPIB_HCA_SOUT=rxe0
//! MPIB_HCA_SUP=rxe1" ./conformance --test-threads=1`.

mod common;

use common::{pair, plugin_path, run, seed};
use mpib_tools::net::{Plugin, RailCounters};
use mpib_tools::pair::PairOutcome;
use mpib_tools::report::SideStats;
use mpib_tools::spec::{Kill, Phase, RecvSize, Side, Workload};
use mpib_tools::{ErrorKind, code};

const KIB: u64 = 1024;
const MIB: u64 = 1024 * 1024;

fn phase(sizes: &[u64], count: u64, nrecv: usize, inflight: usize) -> Phase {
    Phase { sizes: sizes.to_vec(), count, nrecv, inflight, ..Phase::default() }
}

/// `CONFORMANCE_STALL_MS` raises the no-progress limit on slow fabrics (Soft-RoCE under
/// qemu moves a 512 MiB message in ~30 s, with no completion before its end).
fn workload(phases: Vec<Phase>) -> Workload {
    let mut w = Workload { seed: 0x6d70_6962, phases, ..Workload::default() };
    if let Some(ms) = std::env::var("CONFORMANCE_STALL_MS").ok().and_then(|v| v.parse().ok()) {
        w.stall_ms = ms;
    }
    w
}

fn assert_clean(out: &PairOutcome) {
    if let Err(e) = out.check_clean() {
        panic!("{e}");
    }
}

/// The sender's (rank 1) statistics of phase `p`.
fn sent(out: &PairOutcome, p: usize) -> &SideStats {
    out.ranks[1].report.as_ref().unwrap().phases[p].tx.as_ref().unwrap()
}

fn counters(out: &PairOutcome, p: usize) -> [RailCounters; 2] {
    sent(out, p).counters.expect("mpib exports mpib_comm_counters")
}

// ---- the driver itself, without a fabric --------------------------------------------------

#[test]
fn loads_the_newest_version_or_the_one_asked_for() {
    let lib = plugin_path();
    let p = Plugin::open(&lib, None).unwrap();
    assert_eq!((p.version(), p.name(), p.max_requests()), (12, "MPIB".to_string(), 32));
    assert_eq!(p.exported_versions(), vec![12, 11, 10, 9, 8, 7, 6]);
    assert!(p.has_counters());
    for v in 6..=12 {
        let p = Plugin::open(&lib, Some(v)).unwrap();
        assert_eq!(p.version(), v);
        assert_eq!(p.max_requests(), if v == 6 { 8 } else { 32 });
    }
    let e = Plugin::open(&lib, Some(5)).err().unwrap();
    assert_eq!(e.kind, ErrorKind::Usage, "{e}");
}

#[test]
fn a_missing_library_or_symbol_is_a_clear_load_error() {
    let e = Plugin::open("/nonexistent/libnccl-net-x.so", None).err().unwrap();
    assert_eq!(e.kind, ErrorKind::Load);
    assert!(e.msg.contains("/nonexistent/libnccl-net-x.so"), "{e}");
    // NCCL_NET_PLUGIN=<name>: tried as given, then as libnccl-net-<name>.so.
    let e = Plugin::open("surely-not-installed", None).err().unwrap();
    assert!(e.msg.contains("libnccl-net-surely-not-installed.so"), "{e}");
    // A real library without any ncclNetPlugin_vN.
    let e = Plugin::open("libm.so.6", None).err().unwrap();
    assert!(e.msg.contains("exports no ncclNetPlugin_v6"), "{e}");
    let e = Plugin::open("libm.so.6", Some(9)).err().unwrap();
    assert!(e.msg.contains("does not export ncclNetPlugin_v9"), "{e}");
}

#[test]
fn a_failing_init_is_reported_by_both_ranks() {
    let mut spec = pair(workload(vec![phase(&[8], 1, 1, 1)]));
    spec.env.push(("MPIB_SPLIT".into(), "sideways".into()));
    let out = run("failing init", &spec);
    assert!(!out.timed_out, "{}", out.describe());
    for r in &out.ranks {
        let f = r.failure().unwrap_or_else(|| panic!("init should fail:\n{}", out.describe()));
        assert_eq!(
            (f.error.kind.clone(), f.error.call, f.error.code),
            (ErrorKind::Call, "init", code::INVALID_ARGUMENT)
        );
        assert!(r.stderr.contains("MPIB_SPLIT"), "the plugin's WARN names the variable:\n{}", r.stderr);
        assert!(r.status.is_some_and(|s| s.success()));
    }
}

#[test]
fn the_plugin_is_found_by_its_nccl_name() {
    let dir = common::tmpdir("nccl-name");
    let link = dir.join("libnccl-net-mpibconf.so");
    let _ = std::fs::remove_file(&link);
    std::os::unix::fs::symlink(plugin_path(), &link).unwrap();
    let mut spec = pair(workload(vec![phase(&[8], 1, 1, 1)]));
    spec.plugin = "mpibconf".into();
    spec.env.push(("LD_LIBRARY_PATH".into(), dir.to_string_lossy().into_owned()));
    spec.env.push(("MPIB_SPLIT".into(), "sideways".into()));
    let out = run("by name", &spec);
    for r in &out.ranks {
        let rep = r.report.as_ref().expect("report");
        assert_eq!(rep.plugin, "MPIB", "{}", out.describe());
        assert_eq!(rep.failure.as_ref().unwrap().error.call, "init");
    }
}

// ---- the protocol ------------------------------------------------------------------------

#[test]
fn sizes_from_zero_to_64_mib() {
    let small = [0, 1, 127, 128, 129, 4 * KIB, MIB + 3];
    let out =
        run("sizes", &pair(workload(vec![phase(&small, 3 * small.len() as u64, 1, 4), phase(&[64 * MIB], 2, 1, 2)])));
    assert_clean(&out);
    assert_eq!(sent(&out, 0).messages, 21);
    assert_eq!(sent(&out, 1).bytes, 128 * MIB);
}

#[test]
fn one_message_over_512_mib_takes_the_sentinel_path() {
    // size_q has 22 bits of 128-byte units: above (2^22 - 2) * 128 bytes the IMM carries the
    // sentinel and the size travels in the completion record.
    let size = (1u64 << 22) * 128 + 4097;
    // Without failover's stall check: a debug build on a loaded host can move the 512 MiB
    // slower than its bound, and the failover that follows (correct: the bytes still arrive
    // exactly) replays a part, which the exact counters below would count twice.
    let mut spec = pair(workload(vec![phase(&[size], 1, 1, 1)]));
    spec.env.push(("MPIB_STALL_MS".into(), "0".into()));
    let out = run("sentinel", &spec);
    assert_clean(&out);
    let c = counters(&out, 0);
    // A replayed part (a failover, false on a loaded host) would count twice.
    assert_eq!(c[0].bytes + c[1].bytes, size, "{c:?}\n{}", out.describe());
    // Not the fast path: a signalling WR follows the data on each active rail.
    assert!(c[0].wr_posted + c[1].wr_posted > c[0].imm_sent + c[1].imm_sent, "{c:?}");
}

#[test]
fn multi_receives_of_1_to_8_buffers_matched_by_tag() {
    let sizes = [0, 1, 129, 4 * KIB, 64 * KIB + 5, 3];
    let phases = (1..=8).map(|n| phase(&sizes, 24, n, 8)).collect();
    let out = run("nrecv 1..8", &pair(workload(phases)));
    assert_clean(&out);
    for n in 1..=8 {
        assert_eq!(sent(&out, n - 1).messages, 24 * n as u64);
    }
}

#[test]
fn receives_larger_than_the_send_report_the_real_size() {
    let sizes = [0, 1, 127, 4 * KIB, MIB + 3];
    let w = workload(vec![
        Phase { recv: RecvSize::Plus(4096), ..phase(&sizes, 20, 1, 8) },
        Phase { recv: RecvSize::Fixed(2 * MIB), ..phase(&sizes, 20, 3, 4) },
    ]);
    assert_clean(&run("recv larger", &pair(w)));
}

#[test]
fn a_send_larger_than_its_receive_is_refused_with_invalid_usage_as_net_ib_does() {
    // NCCL's collectives never do it; a user's mismatched sizes do, and net_ib answers
    // "collective mismatch" with ncclInvalidUsage from isend. The receiver's stall bound
    // ends its side (nothing is sent for its receive).
    let sizes = [0, 1, 999, 1000, 1001, 4 * KIB, MIB];
    let p = Phase { recv: RecvSize::Minus(1000), ..phase(&sizes, 14, 1, 4) };
    let w = Workload { stall_ms: 3_000, ..workload(vec![p]) };
    let out = run("oversized send", &pair(w));
    assert!(!out.timed_out, "{}", out.describe());
    let f = out.ranks[1].failure().unwrap_or_else(|| panic!("the sender did not fail\n{}", out.describe()));
    assert_eq!(
        (f.error.kind.clone(), f.error.call, f.error.code),
        (ErrorKind::Call, "isend", code::INVALID_USAGE),
        "{}",
        out.describe()
    );
    assert!(out.ranks[1].stderr.contains("collective mismatch"), "the WARN says what:\n{}", out.ranks[1].stderr);
}

#[test]
fn thirty_two_receives_in_flight_and_256_sends() {
    let w = workload(vec![phase(&[4 * KIB, 64 * KIB], 1000, 1, 32), phase(&[0, 8, 4 * KIB], 200, 8, 32)]);
    assert_clean(&run("32 in flight", &pair(w)));
}

#[test]
fn a_hundred_thousand_small_messages_checksummed() {
    let w = workload(vec![phase(&[8, 1, 64, 0, 200, 128], 100_000, 1, 32)]);
    let out = run("100k messages", &pair(w));
    assert_clean(&out);
    let (tx, rx) = (sent(&out, 0), out.ranks[0].report.as_ref().unwrap().phases[0].rx.as_ref().unwrap());
    assert_eq!((tx.messages, rx.messages, rx.wrong_bytes), (100_000, 100_000, 0));
    eprintln!("100k messages: {:.2} us per message at the receiver", rx.elapsed_ns as f64 / 1e3 / 1e5);
}

#[test]
fn bidirectional_traffic() {
    let w = Workload { bidir: true, ..workload(vec![phase(&[0, 1, 4 * KIB, MIB + 3], 40, 2, 8)]) };
    let out = run("bidir", &pair(w));
    assert_clean(&out);
    for r in &out.ranks {
        let p = &r.report.as_ref().unwrap().phases[0];
        assert!(p.tx.is_some() && p.rx.is_some());
    }
}

#[test]
fn a_corrupted_byte_is_caught() {
    // Proof that the checks can fail: the sender flips one byte of send #5 after checksumming.
    let w = workload(vec![Phase { corrupt: Some(5), ..phase(&[4 * KIB], 10, 1, 4) }]);
    let out = run("corruption", &pair(w));
    let e = out.check_clean().expect_err("one flipped byte must fail the run");
    assert!(e.msg.contains("receive #5 tag 1 (4096 bytes): 1 wrong bytes, first at offset 2048"), "{e}");
    let rx = out.ranks[0].report.as_ref().unwrap().phases[0].rx.as_ref().unwrap();
    assert_eq!((rx.wrong_bytes, rx.wrong_sizes, rx.canary_broken), (1, 0, 0));
    assert_ne!(rx.checksum, sent(&out, 0).checksum);
}

#[test]
fn a_time_budget_sizes_the_phase_from_its_warmup_and_the_sender_samples_a_timeline() {
    // What mpib-perf runs: a warm-up (checked, reported apart), after which rank 0 picks
    // the count that fills the budget and tells rank 1; the sender samples its counters.
    let p = Phase { warmup: 16, budget_ms: 300, timeline_us: 500, ..phase(&[64 * KIB], 1_000_000, 1, 8) };
    let out = run("budget", &pair(workload(vec![p])));
    assert_clean(&out);
    let (tx, report) = (sent(&out, 0), out.ranks[1].report.as_ref().unwrap());
    let rx = out.ranks[0].report.as_ref().unwrap().phases[0].rx.as_ref().unwrap();
    // The count depends on the fabric's speed (tens under qemu's Soft-RoCE): not 1,000,000.
    assert!(tx.messages >= 1 && tx.messages < 1_000_000 && rx.messages == tx.messages, "{}", tx.messages);
    assert!(tx.elapsed_ns < 10_000_000_000, "a 300 ms budget took {} ms", tx.elapsed_ns / 1_000_000);
    let warm = report.phases[0].warmup.as_ref().expect("the warm-up's report");
    assert_eq!(warm.tx.as_ref().unwrap().messages, 16);
    assert!(report.phases[0].start_ns > 0);
    // Sampled at the first step, every 500 us after it when the sender's loop runs, and when
    // the last send completed. How often the loop runs is the machine's business (7 samples
    // in 107 ms under qemu on a loaded host), so only what cannot depend on speed is checked:
    // both ends, and never more often than the interval.
    let tl = &tx.timeline;
    assert!(tl.len() >= 2, "{tl:?}");
    let span_ns = tl[tl.len() - 1][0] - tl[0][0];
    assert!(tl.len() as u64 <= span_ns / 500_000 + 2, "{} samples in {span_ns} ns: {tl:?}", tl.len());
    assert!(tl.windows(2).all(|w| w[1][0] > w[0][0] && w[1][1] >= w[0][1] && w[1][2] >= w[0][2]), "{tl:?}");
    let last = tl.last().unwrap();
    assert_eq!(last[1] + last[2], tx.bytes, "the last sample is taken when the last send completed");
    let rails = report.rails.expect("mpib exports mpib_rail_stats");
    assert!(rails[0].counters.bytes + rails[1].counters.bytes >= tx.bytes + 16 * 64 * KIB, "{rails:?}");
    assert!(rails.iter().any(|r| r.latency_samples > 0 && r.srtt_ns > 0), "{rails:?}");
}

// ---- splits and the per-rail counters -----------------------------------------------------

/// A run with `MPIB_SPLIT=split` and probes off, so the sender's counters hold data WRs and
/// keepalives only.
fn split_run(split: &str, sizes: &[u64]) -> (PairOutcome, [RailCounters; 2], u64, u64) {
    let mut spec = pair(workload(vec![phase(sizes, 10 * sizes.len() as u64, 1, 8)]));
    spec.env.push(("MPIB_SPLIT".into(), split.into()));
    spec.env.push(("MPIB_PROBE_INTERVAL_US".into(), "0".into()));
    let out = run(&format!("split {split}"), &spec);
    assert_clean(&out);
    let c = counters(&out, 0);
    let (msgs, bytes) = (sent(&out, 0).messages, sent(&out, 0).bytes);
    // n = 1 is the fast path: exactly one WRITE_WITH_IMM per active rail and message, one
    // post each; no rail ever sends an IMM without bytes.
    // Probes are off, but a sender waiting on an idle rail that carries its transfers still
    // sends a keepalive every 100 ms (slow fabrics, e.g. Soft-RoCE under qemu, see a few).
    let keepalives = keepalive_bound(&out);
    for (r, x) in c.iter().enumerate() {
        let data = x.wr_posted - x.probes;
        assert_eq!((data, x.doorbells - x.probes), (x.imm_sent, x.imm_sent), "rail {r}: {x:?}");
        assert_eq!(x.zero_byte_imm, 0, "rail {r}: {x:?}");
        assert!(x.probes <= keepalives, "rail {r}: more than one keepalive per 100 ms: {x:?}");
    }
    assert_eq!(c[0].bytes + c[1].bytes, bytes, "{c:?}");
    assert!((msgs..=2 * msgs).contains(&(c[0].imm_sent + c[1].imm_sent)), "{c:?}");
    (out, c, msgs, bytes)
}

/// The most keepalives one rail may send in a run: one per 100 ms of its wall time, plus one.
fn keepalive_bound(out: &PairOutcome) -> u64 {
    out.elapsed.as_millis() as u64 / 100 + 1
}

const SPLIT_SIZES: [u64; 5] = [0, 1, 128, 4 * KIB, MIB + 3];

#[test]
fn split_sout_sends_nothing_on_sup() {
    let (_, c, msgs, bytes) = split_run("sout", &SPLIT_SIZES);
    assert_eq!((c[0].imm_sent, c[0].bytes), (msgs, bytes));
    assert_eq!(c[1], RailCounters::default(), "an inactive rail posts nothing at all, not even a keepalive");
}

#[test]
fn split_sup_sends_only_empty_transfers_on_sout() {
    let (_, c, msgs, bytes) = split_run("sup", &SPLIT_SIZES);
    // A transfer whose size is 0 goes on SOUT alone, everything else on SUP alone.
    let empty = msgs / SPLIT_SIZES.len() as u64;
    assert_eq!((c[0].imm_sent, c[0].bytes), (empty, 0), "{c:?}");
    assert_eq!((c[1].imm_sent, c[1].bytes), (msgs - empty, bytes), "{c:?}");
}

#[test]
fn split_50_uses_both_rails_for_every_message() {
    let (_, c, msgs, bytes) = split_run("50", &[4 * KIB, 64 * KIB + 3, MIB + 3]);
    assert_eq!((c[0].imm_sent, c[1].imm_sent), (msgs, msgs), "{c:?}");
    // Shares are 128-byte aligned: each message is within 64 bytes of half.
    assert!(c[0].bytes.abs_diff(bytes / 2) <= 64 * msgs, "{c:?}");
}

#[test]
fn nics_fused_by_nccl_carry_both_rails() {
    // MPIB_NCCL_DEVICES=nics: through v12 the plugin shows its two NICs and names them in
    // NCCL_NET_FORCE_MERGE; the driver fuses them with makeVDevice, as NCCL's topology step
    // does, and runs on the fused device. A v8 peer sees the same rails as one device.
    for abi in [[None, None], [Some(8), None], [Some(9), Some(11)]] {
        let mut spec = pair(workload(vec![phase(&[4 * KIB, MIB + 3], 10, 1, 8)]));
        spec.abi = abi;
        spec.env.push(("MPIB_NCCL_DEVICES".into(), "nics".into()));
        spec.env.push(("MPIB_SPLIT".into(), "50".into()));
        let out = run(&format!("fused NICs, ABI {abi:?}"), &spec);
        assert_clean(&out);
        for r in &out.ranks {
            let device = &r.report.as_ref().unwrap().device;
            assert!(device.contains('+'), "rank on a rail pair, not one NIC: {device}\n{}", out.describe());
        }
        let c = counters(&out, 0);
        assert!(c[0].bytes > 0 && c[1].bytes > 0, "both rails carry data: {c:?}");
    }
}

#[test]
fn split_random_percentage() {
    let p = seed("split percentage") % 101;
    eprintln!("MPIB_SPLIT={p}");
    let (_, c, _, bytes) = split_run(&p.to_string(), &SPLIT_SIZES);
    match p {
        0 => assert_eq!(c[0].bytes, 0, "{c:?}"),
        100 => assert_eq!(c[1], RailCounters::default(), "{c:?}"),
        _ => {
            let want = bytes as f64 * p as f64 / 100.0;
            assert!((c[0].bytes as f64 - want).abs() <= 128.0 * 50.0, "{p}%: {c:?}");
        }
    }
}

// ---- every ABI version --------------------------------------------------------------------

#[test]
fn every_abi_version_v6_to_v12_and_mixed_pairs() {
    let s = seed("abi workload");
    // (receiver, sender): each version against itself, then the oldest against the newest.
    let pairs = [(6, 6), (7, 7), (8, 8), (9, 9), (10, 10), (11, 11), (12, 12), (6, 12), (12, 6), (9, 11)];
    for (rv, sv) in pairs {
        let inflight = if rv == 6 || sv == 6 { 8 } else { 32 };
        let sizes = [0, 1, 129, 4 * KIB, 256 * KIB + 7];
        let w = Workload {
            seed: s,
            ..workload(vec![
                Phase { flush: true, ..phase(&sizes, 2 * inflight as u64, 1, inflight) },
                Phase { recv: RecvSize::Plus(100), ..phase(&sizes, 2 * inflight as u64, 4, inflight) },
            ])
        };
        let mut spec = pair(w);
        spec.abi = [Some(rv), Some(sv)];
        let out = run(&format!("abi v{rv} <- v{sv}"), &spec);
        assert_clean(&out);
        for (r, v) in [(0, rv), (1, sv)] {
            assert_eq!(out.ranks[r].report.as_ref().unwrap().abi, v);
        }
    }
}

// ---- what NCCL users hit when things go wrong ---------------------------------------------

#[test]
fn bad_handles_give_error_codes_not_crashes() {
    let w = Workload { bad_handles: true, ..workload(vec![phase(&[8, 4 * KIB], 10, 1, 4)]) };
    let out = run("bad handles", &pair(w));
    // The connection still works after every probe: the phase runs clean.
    assert_clean(&out);
    for r in &out.ranks {
        let rep = r.report.as_ref().unwrap();
        assert!(rep.bad_handles.len() >= 12, "{:?}", rep.bad_handles);
        for (what, c) in &rep.bad_handles {
            eprintln!("rank {}: {what} -> {c}", rep.rank);
            assert!(
                (2..=6).contains(c),
                "rank {}: {what} returned {c}, expected an error code\n{}",
                rep.rank,
                r.stderr
            );
        }
    }
}

/// The longest a survivor may take to report a dead peer.
const DEAD_PEER_BOUND_MS: u64 = 10_000;

/// `victim` SIGKILLs itself after its 3rd completed request, with `inflight` requests of
/// `size` bytes allowed in flight; the survivor must get an error code from the plugin
/// within [`DEAD_PEER_BOUND_MS`] and exit normally.
fn peer_killed(victim: Side, size: u64, inflight: usize) {
    let kill = Some(Kill { side: victim, after: 3 });
    let p = Phase { kill, ..phase(&[size], 400, 1, inflight) };
    let w = Workload { stall_ms: 3 * DEAD_PEER_BOUND_MS, ..workload(vec![p]) };
    let out = run(&format!("{} killed", victim.name()), &pair(w));
    let (v, s) = if victim == Side::Send { (1, 0) } else { (0, 1) };
    assert!(out.ranks[v].was_killed(), "the victim should have died of SIGKILL\n{}", out.describe());
    let died = out.ranks[v].killed_at_ns.expect("the victim's last line");
    let f = out.ranks[s].failure().unwrap_or_else(|| panic!("the survivor did not fail\n{}", out.describe()));
    assert_eq!(f.error.kind, ErrorKind::Call, "an error code from the plugin, not a hang:\n{}", out.describe());
    let ms = f.at_ns.saturating_sub(died) / 1_000_000;
    eprintln!("{} killed: the survivor's {} returned {} after {ms} ms", victim.name(), f.error.call, f.error.code);
    assert!(ms <= DEAD_PEER_BOUND_MS, "detected after {ms} ms\n{}", out.describe());
    assert!(out.ranks[s].status.is_some_and(|st| st.success()), "{}", out.describe());
}

// 16 MiB messages, eight in flight: when the victim dies, 100+ MiB are posted and the
// fabric is in the middle of one of them (a socket buffer's worth moves without the
// sender's progress calls).

#[test]
fn a_sender_killed_mid_transfer_fails_the_receiver_in_bounded_time() {
    peer_killed(Side::Send, 16 * MIB, 8);
}

#[test]
fn a_receiver_killed_mid_transfer_fails_the_sender_in_bounded_time() {
    peer_killed(Side::Recv, 16 * MIB, 8);
}

// One request in flight: the victim dies between two messages, with nothing of the next one
// on the wire, so only a plugin that notices the dead connection by itself reports it: RC
// gives a waiting receiver no completion at all, and a sender whose isend answers NULL has
// nothing outstanding. mpib's keepalives (engine::KEEPALIVE_NS) turn that into an error.

#[test]
fn a_sender_killed_between_messages_fails_the_receiver_in_bounded_time() {
    peer_killed(Side::Send, 4 * KIB, 1);
}

#[test]
fn a_receiver_killed_between_messages_fails_the_sender_in_bounded_time() {
    peer_killed(Side::Recv, 4 * KIB, 1);
}
