//! Rail failover through the C ABI, two processes on the soft fabric: the sender
//! drops one rail's QP connections (both directions, `MPIB_FAULT_RAIL`) at a seeded random
//! isend while checksummed traffic streams over both rails. The run must end clean: every
//! byte as the pattern says, every size exact, no error code seen by either rank, and the
//! failover visibly taken (the drill fired, the receiver's report replayed or confirmed
//! the dead rail's parts). Both rails dropped: both ranks get an error code within a bound.
//!
//! `CONFORMANCE_SEED=<seed>` repeats a run; `FAILOVER_SEEDS` sets how many seeds (24).

mod common;

use std::time::Duration;

use common::{pair, run, seed};
use mpib_tools::ErrorKind;
use mpib_tools::pair::PairOutcome;
use mpib_tools::spec::{Phase, Workload};

const KIB: u64 = 1024;
const MIB: u64 = 1024 * 1024;

/// xorshift64*: the seeded choices of one run.
struct Rng(u64);

impl Rng {
    fn next(&mut self) -> u64 {
        self.0 ^= self.0 >> 12;
        self.0 ^= self.0 << 25;
        self.0 ^= self.0 >> 27;
        self.0.wrapping_mul(0x2545_f491_4f6c_dd1d)
    }
    fn below(&mut self, n: u64) -> u64 {
        self.next() % n
    }
}

/// One run: `count` receives of `nrecv` buffers, sizes mixed so that both rails carry
/// parts (the split is 50 % or auto), the chosen rail(s) dropped at isend `at`.
fn run_with_fault(name: &str, s: u64, rails: &str, stall_ms: u64) -> (PairOutcome, u64) {
    run_with_hook(name, s, rails, "", stall_ms, &[])
}

/// [`run_with_fault`] with a fault kind (`:drop-imm`, `:drop-ack`, `:hold`; "" for a lost
/// link) and more variables for the ranks.
fn run_with_hook(
    name: &str,
    s: u64,
    rails: &str,
    kind: &str,
    stall_ms: u64,
    env: &[(&str, &str)],
) -> (PairOutcome, u64) {
    let mut rng = Rng(s | 1);
    let count = 40 + rng.below(40);
    let nrecv = 1 + rng.below(2) as usize;
    let sizes = vec![4 * KIB, MIB + 7, 64 * KIB, 3 * MIB, 1, 256 * KIB + 3, 16 * MIB + 5];
    // In the first three quarters of the stream: a receiver learns of a rail the sender
    // dropped at its next call that waits (a test not done, an irecv answering "not now"),
    // and one whose last receives all completed makes no more calls (DESIGN.md "Rail
    // failover", what is left). Every other run drops it right after posting a 16 MiB send
    // (message `at - 1`), whose part on the dropped rail cannot all have arrived: the
    // replay path, not only the confirmation of parts that arrived.
    let sends = count * nrecv as u64 * 3 / 4;
    let at = if rng.below(2) == 0 {
        let n = sizes.len() as u64;
        n * rng.below(sends / n) + n // message n·k + n − 1: the 16 MiB one
    } else {
        1 + rng.below(sends)
    };
    let phase = Phase { sizes, count, nrecv, inflight: 1 + rng.below(4) as usize, ..Phase::default() };
    let w = Workload { seed: s, stall_ms, phases: vec![phase], ..Workload::default() };
    let mut spec = pair(w);
    let split = if rng.below(2) == 0 { "50" } else { "auto" };
    spec.env.push(("MPIB_SPLIT".into(), split.into()));
    spec.env.push(("MPIB_FAULT_RAIL".into(), format!("{rails}:{at}{kind}")));
    spec.env.extend(env.iter().map(|(k, v)| (k.to_string(), v.to_string())));
    let out = run(&format!("{name} (seed {s}, {rails}{kind} at isend {at}, split {split})"), &spec);
    (out, at)
}

#[test]
fn one_rail_dropped_mid_stream_loses_nothing_and_reports_nothing() {
    let base = seed("failover");
    let n: u64 = std::env::var("FAILOVER_SEEDS").ok().and_then(|v| v.parse().ok()).unwrap_or(24);
    let (mut replayed_or_confirmed, mut replayed) = (0, 0u64);
    for i in 0..n {
        let s = base.wrapping_add(i.wrapping_mul(0x9e37_79b9_7f4a_7c15));
        let rail = if s % 2 == 0 { "sout" } else { "sup" };
        let (out, at) = run_with_fault("one rail dropped", s, rail, 20_000);
        if let Err(e) = out.check_clean() {
            panic!(
                "seed {s} ({rail} dropped at isend {at}; repeat with CONFORMANCE_SEED={base} and this index {i}): {e}"
            );
        }
        let sender = &out.ranks[1].stderr;
        if std::env::var_os("FAILOVER_SHOW").is_some() {
            eprintln!("--- sender:\n{sender}--- receiver:\n{}", out.ranks[0].stderr);
        }
        assert!(sender.contains("MPIB_FAULT_RAIL: dropping"), "seed {s}: the drill never fired\n{}", out.describe());
        // The sender applied the receiver's report (or nothing of the rail was outstanding:
        // then it only stopped using it).
        if sender.contains("fenced by the receiver") {
            replayed_or_confirmed += 1;
        }
        replayed += sender.lines().filter_map(replayed_parts).sum::<u64>();
        // mpib_rail_stats: both sides counted the failure of the dropped rail.
        let r = if rail == "sout" { 0 } else { 1 };
        for rank in 0..2 {
            let rails = out.ranks[rank].report.as_ref().and_then(|rep| rep.rails).expect("mpib_rail_stats");
            assert_eq!((rails[r].failovers, rails[1 - r].failovers), (1, 0), "seed {s}, rank {rank}");
        }
    }
    assert!(replayed_or_confirmed > 0, "no run went through the fence-and-report path");
    eprintln!(
        "{replayed_or_confirmed} of {n} runs settled parts through the receiver's report, {replayed} parts replayed"
    );
    if n >= 16 {
        // Half the runs drop a rail right after posting a 16 MiB send.
        assert!(replayed > 0, "no part was ever replayed: the replay path was not exercised");
    }
}

/// The soft fabric's fault hooks through the C ABI (`MPIB_FAULT_RAIL=RAIL:N:KIND`, armed by
/// the sender on the rail's QPs at isend N, firing on the next matching WR), a few seeds
/// each (`FAILOVER_HOOK_SEEDS`, 3; `FAILOVER_HOOKS=drop-ack,hold` runs only those): every run clean (exact bytes, no error code), one
/// failover on the rail and none on the other, on both ranks, and the receiver's report
/// settling what the fault left as the design says:
/// - drop-imm: the part's bytes landed without its IMM: the report does not count it as
///   arrived, so it is replayed (every run: parts replayed > 0);
/// - drop-ack: the part's IMM was delivered but the sender saw its WR fail: the report
///   counts it as arrived (every run: confirmed > 0), so it is not sent again (a replay
///   would be a flagged duplicate, ignored by the receiver: the bytes would not show it,
///   the count does);
/// - hold: the requests held from the drill on reach the receiver only after its QP's error
///   state (the sender detects the stall, fences its QPs, the held frames follow the CLOSE)
///   and are dropped there; the report does not count them, so they are replayed (every
///   run: parts replayed > 0).
#[test]
fn each_fault_hook_mid_stream_loses_nothing() {
    let base = seed("fault hooks");
    let n: u64 = std::env::var("FAILOVER_HOOK_SEEDS").ok().and_then(|v| v.parse().ok()).unwrap_or(3);
    let only = std::env::var("FAILOVER_HOOKS").unwrap_or_default();
    for kind in ["drop-imm", "drop-ack", "hold"].into_iter().filter(|k| only.is_empty() || only.contains(k)) {
        let (mut confirmed, mut replayed) = (0u64, 0u64);
        for i in 0..n {
            let s = base.wrapping_add(i.wrapping_mul(0x9e37_79b9_7f4a_7c15));
            let rail = if i % 2 == 0 { "sout" } else { "sup" };
            // Hold is seen by the sender's stall check only (nothing fails): 1 s, well above
            // what a debug build's surviving rail takes for a 16 MiB part on a busy host.
            // With hold, the receiver's soft fabric says (INFO) how many frames its QPs
            // dropped after their error state: the held requests reached it.
            let env: &[(&str, &str)] =
                if kind == "hold" { &[("MPIB_STALL_MS", "1000"), ("RUST_LOG", "mpib=info")] } else { &[] };
            let (out, at) = run_with_hook(kind, s, rail, &format!(":{kind}"), 20_000, env);
            let what = format!("seed {s} ({rail}:{kind} at isend {at}; CONFORMANCE_SEED={base}, index {i})");
            if let Err(e) = out.check_clean() {
                panic!("{what}: {e}");
            }
            let sender = &out.ranks[1].stderr;
            if std::env::var_os("FAILOVER_SHOW").is_some() {
                eprintln!("--- sender:\n{sender}--- receiver:\n{}", out.ranks[0].stderr);
            }
            assert!(sender.contains("MPIB_FAULT_RAIL: arming"), "{what}: never armed\n{}", out.describe());
            let r = if rail == "sout" { 0 } else { 1 };
            for rank in 0..2 {
                let rails = out.ranks[rank].report.as_ref().and_then(|rep| rep.rails).expect("mpib_rail_stats");
                let f = (rails[r].failovers, rails[1 - r].failovers);
                assert_eq!(f, (1, 0), "{what}, rank {rank}: the hook fired once, on its rail\n{}", out.describe());
            }
            let (c, p) = sender.lines().filter_map(report_counts).fold((0, 0), |a, b| (a.0 + b.0, a.1 + b.1));
            eprintln!("{what}: the report confirmed {c} parts, {p} replayed");
            (confirmed, replayed) = (confirmed + c, replayed + p);
            if kind == "hold" {
                let late: u64 = out.ranks[0].stderr.lines().filter_map(late_frames).sum();
                eprintln!("{what}: the receiver dropped {late} frames after its QPs' error state");
                assert!(late > 0, "{what}: no held frame reached the receiver (and was dropped)\n{}", out.describe());
            }
            match kind {
                "drop-ack" => {
                    assert!(c > 0, "{what}: the part whose ACK was lost was not confirmed\n{}", out.describe())
                }
                _ => assert!(p > 0, "{what}: the part the receiver never got was not replayed\n{}", out.describe()),
            }
        }
        eprintln!("{kind}: {n} runs clean, {confirmed} parts confirmed by the receiver's report, {replayed} replayed");
    }
}

/// The soft fabric's INFO at a QP's destruction: "QP N: K frames came after its error state".
fn late_frames(line: &str) -> Option<u64> {
    let head =
        line.split(" frames came after its error state").next().filter(|_| line.contains("error state, dropped"))?;
    head.rsplit(' ').next()?.parse().ok()
}

/// The sender's WARN after the receiver's report: (parts confirmed, parts replayed).
fn report_counts(line: &str) -> Option<(u64, u64)> {
    let tail = line.split("fenced by the receiver: ").nth(1)?;
    let confirmed = tail.split(' ').next()?.parse().ok()?;
    Some((confirmed, replayed_parts(line)?))
}

/// The sender's WARN after the receiver's report: "..., N replayed on RAIL".
fn replayed_parts(line: &str) -> Option<u64> {
    let head = line.split(" replayed on ").next().filter(|_| line.contains("fenced by the receiver"))?;
    head.rsplit(' ').next()?.parse().ok()
}

/// The longest either rank may take to return an error once the other did, both rails
/// gone: the receiver hears of it from its keepalive (engine::KEEPALIVE_NS) or a failed
/// completion, and each side's grace starts when it sees its last rail fail.
const BOTH_DOWN_BOUND: Duration = Duration::from_secs(10);

/// Both rails dropped for good (`MPIB_FAULT_RAIL=both:N`): the connection rides the outage
/// out for its grace (`MPIB_OUTAGE_GRACE_MS=1000` here), then both ranks get an error code,
/// close together: never a hang.
#[test]
fn both_rails_dropped_for_good_fail_both_ranks_past_the_grace() {
    let base = seed("both rails");
    let grace = [("MPIB_OUTAGE_GRACE_MS", "1000")];
    for i in 0..3u64 {
        let s = base.wrapping_add(i.wrapping_mul(0x9e37_79b9_7f4a_7c15));
        let (out, _) = run_with_hook("both rails dropped", s, "both", "", 60_000, &grace);
        assert!(!out.timed_out, "seed {s}: a rank hung\n{}", out.describe());
        let sender = &out.ranks[1].stderr;
        assert!(sender.contains("MPIB_FAULT_RAIL: dropping"), "seed {s}: the drill never fired\n{}", out.describe());
        let mut at = Vec::new();
        for r in 0..2 {
            let f =
                out.ranks[r].failure().unwrap_or_else(|| panic!("seed {s}: rank {r} did not fail\n{}", out.describe()));
            assert_eq!(f.error.kind, ErrorKind::Call, "an error code from the plugin, not a hang:\n{}", out.describe());
            at.push(f.at_ns);
        }
        let spread = Duration::from_nanos(at[0].abs_diff(at[1]));
        eprintln!("seed {s}: both ranks failed, {spread:?} apart");
        assert!(spread <= BOTH_DOWN_BOUND, "seed {s}: {spread:?} between the two ranks' errors\n{}", out.describe());
        // Each rank writes the wait as a WARN while NCCL waits on it (INFO otherwise: a
        // sender whose sends had all completed before the drop).
        let waited = out.ranks.iter().any(|r| r.stderr.contains("wait up to 1000 ms (MPIB_OUTAGE_GRACE_MS)"));
        let gave_up = out.ranks.iter().any(|r| r.stderr.contains("no rail came back within 1000 ms"));
        assert!(waited && gave_up, "seed {s}: the outage was not ridden for its grace\n{}", out.describe());
    }
}

/// Both rails dropped for 300 ms mid-stream (`MPIB_FAULT_RAIL=both:N:300`), within the
/// default grace: the control messages go over the set-up channel, a rail is re-admitted,
/// what was missing is sent again. Clean: every byte exact, no error code on either rank.
#[test]
fn both_rails_dropped_briefly_are_ridden_out_exactly() {
    let base = seed("outage");
    for i in 0..3u64 {
        let s = base.wrapping_add(i.wrapping_mul(0x9e37_79b9_7f4a_7c15));
        let (out, at) = run_with_hook("both rails dropped for 300 ms", s, "both", ":300", 60_000, &[]);
        if let Err(e) = out.check_clean() {
            panic!("seed {s} (both dropped at isend {at}; repeat with CONFORMANCE_SEED={base}, index {i}): {e}");
        }
        let sender = &out.ranks[1].stderr;
        assert!(sender.contains("MPIB_FAULT_RAIL: dropping"), "seed {s}: the drill never fired\n{}", out.describe());
        let back = |r: usize| {
            out.ranks[r].stderr.lines().find(|l| l.contains("the connection is back on")).map(str::to_string)
        };
        let (sb, rb) = (back(1), back(0));
        eprintln!("seed {s}: sender: {sb:?}; receiver: {rb:?}");
        assert!(sb.is_some(), "seed {s}: the sender never left the outage\n{}", out.describe());
        for rank in 0..2 {
            let rails = out.ranks[rank].report.as_ref().and_then(|rep| rep.rails).expect("mpib_rail_stats");
            assert!(rails.iter().all(|r| r.failovers >= 1), "seed {s}, rank {rank}: both rails failed over");
            assert!(rails.iter().any(|r| r.readmissions >= 1), "seed {s}, rank {rank}: a rail came back");
        }
    }
}

/// The switch: with `MPIB_FAILOVER=0` a dropped rail fails the connection (as a single-rail
/// transport would), which also shows the drill really breaks a rail.
#[test]
fn with_failover_off_a_dropped_rail_fails_the_connection() {
    let s = seed("failover off");
    let mut rng = Rng(s | 1);
    let at = 5 + rng.below(20);
    let phase = Phase { sizes: vec![MIB + 7, 64 * KIB], count: 60, nrecv: 1, inflight: 4, ..Phase::default() };
    let w = Workload { seed: s, stall_ms: 60_000, phases: vec![phase], ..Workload::default() };
    let mut spec = pair(w);
    spec.env.push(("MPIB_SPLIT".into(), "50".into()));
    spec.env.push(("MPIB_FAILOVER".into(), "0".into()));
    spec.env.push(("MPIB_FAULT_RAIL".into(), format!("sup:{at}")));
    let out = run("failover off", &spec);
    assert!(!out.timed_out, "{}", out.describe());
    let f = out.ranks[1].failure().unwrap_or_else(|| panic!("the sender did not fail\n{}", out.describe()));
    assert_eq!(f.error.kind, ErrorKind::Call, "{}", out.describe());
    // The error NCCL's log shows names the connection: both rails' NICs and the comm.
    let failed = out.ranks[1].stderr.lines().find(|l| l.contains("mpib::abi::guard") && l.contains(": SUP rail: "));
    assert!(
        failed.is_some_and(|l| l.contains(" [SOUT soft-sout:1 ")
            && l.contains("; SUP soft-sup:1 ")
            && l.contains("send comm")),
        "{}",
        out.describe()
    );
}

/// Striped rails (`MPIB_QP=4`, `MPIB_QP_STRIPE=1`): each rail's share of a request in up to
/// 4 pieces on 4 QPs, one rail dropped mid-stream. Nothing is lost, sizes are exact, and the
/// surviving rail's IMMs show the pieces (more than two a receive on average: most shares
/// are well over 4 × 128 bytes).
#[test]
fn a_striped_rail_dropped_mid_stream_loses_nothing() {
    let base = seed("striped-failover");
    let striped = [("MPIB_QP", "4"), ("MPIB_QP_STRIPE", "1")];
    for i in 0..4u64 {
        let s = base.wrapping_add(i.wrapping_mul(0x9e37_79b9_7f4a_7c15));
        let r = (s % 2) as usize;
        let rail = ["sout", "sup"][r];
        let (out, at) = run_with_hook("striped rail dropped", s, rail, "", 20_000, &striped);
        if let Err(e) = out.check_clean() {
            panic!("seed {s} ({rail} dropped at isend {at}; repeat with CONFORMANCE_SEED={base}, index {i}): {e}");
        }
        assert!(out.ranks[1].stderr.contains("MPIB_FAULT_RAIL: dropping"), "seed {s}: the drill never fired");
        // `run_with_hook`'s first draw: the receives of the run.
        let receives = 40 + Rng(s | 1).below(40);
        let sender = out.ranks[1].report.as_ref().and_then(|rep| rep.rails).expect("mpib_rail_stats");
        let (dropped, kept) = (&sender[r], &sender[1 - r]);
        assert_eq!((dropped.failovers, kept.failovers), (1, 0), "seed {s}");
        let imms = kept.counters.imm_sent;
        eprintln!("seed {s}: {rail} dropped at isend {at}; {receives} receives, {imms} IMMs on the other rail");
        assert!(imms > 2 * receives, "seed {s}: {imms} IMMs for {receives} receives: shares not striped");
        assert_eq!(kept.counters.zero_byte_imm, 0, "seed {s}: an empty piece");
    }
}

/// Re-admission: SOUT dropped mid-stream and refusing to come back for 150 ms
/// (`MPIB_FAULT_RAIL=sout:N:150`), then rebuilt and probed: no wrong byte, no error, both
/// sides count one re-admission, and the sender's per-rail byte timeline shows the outage
/// (SOUT flat while SUP carries on) and the return (SOUT grows again afterwards).
#[test]
fn a_dropped_rail_comes_back_and_carries_bytes_again() {
    let base = seed("readmission");
    for i in 0..2u64 {
        readmission_run("readmission", base, i, &[]);
    }
}

/// The same with several QPs on each rail: 4 on both (`MPIB_QP=4`), then 16 on SOUT, the
/// most a rail takes (its re-admission records fill a control entry), 2 on SUP. The rebuilt
/// QPs all connect, are probed and carry SOUT's bytes again, exactly.
#[test]
fn a_dropped_rail_of_many_qps_comes_back_and_carries_bytes_again() {
    let base = seed("readmission-qps");
    readmission_run("readmission, 4 QPs per rail", base, 0, &[("MPIB_QP", "4")]);
    readmission_run("readmission, 16 + 2 QPs", base, 1, &[("MPIB_SOUT_QP", "16"), ("MPIB_SUP_QP", "2")]);
}

/// One run of the re-admission check, seed `base` + `i` (see above), `env` added.
fn readmission_run(name: &str, base: u64, i: u64, env: &[(&str, &str)]) {
    let s = base.wrapping_add(i.wrapping_mul(0x9e37_79b9_7f4a_7c15));
    let mut rng = Rng(s | 1);
    let at = 20 + rng.below(20);
    let sizes = vec![64 * KIB, MIB + 7, 256 * KIB + 3, 4 * KIB];
    let phase = Phase { sizes, count: 1500, nrecv: 1, inflight: 2, timeline_us: 10_000, ..Phase::default() };
    let w = Workload { seed: s, stall_ms: 20_000, phases: vec![phase], ..Workload::default() };
    let mut spec = pair(w);
    spec.env.push(("MPIB_SPLIT".into(), "50".into()));
    spec.env.push(("MPIB_FAULT_RAIL".into(), format!("sout:{at}:150")));
    spec.env.push(("RUST_LOG".into(), "mpib=info".into())); // the re-admission's INFO line
    spec.env.extend(env.iter().map(|(k, v)| (k.to_string(), v.to_string())));
    let out = run(&format!("{name} (seed {s}, SOUT dropped at isend {at} for 150 ms, {env:?})"), &spec);
    if let Err(e) = out.check_clean() {
        panic!("{name}: seed {s} (repeat with CONFORMANCE_SEED={base}, index {i}): {e}");
    }
    let (sender, receiver) = (&out.ranks[1].stderr, &out.ranks[0].stderr);
    if std::env::var_os("FAILOVER_SHOW").is_some() {
        eprintln!("--- sender:\n{sender}--- receiver:\n{receiver}");
    }
    assert!(sender.contains("MPIB_FAULT_RAIL: dropping"), "seed {s}: the drill never fired\n{}", out.describe());
    assert!(sender.contains("SOUT rail re-admitted"), "seed {s}: no re-admission\n{}", out.describe());
    assert!(receiver.contains("SOUT rail re-admitted"), "seed {s}: receiver\n{}", out.describe());
    for rank in 0..2 {
        let rails = out.ranks[rank].report.as_ref().and_then(|rep| rep.rails).expect("mpib_rail_stats");
        assert_eq!((rails[0].failovers, rails[0].readmissions), (1, 1), "seed {s}, rank {rank}: SOUT");
        assert_eq!((rails[1].failovers, rails[1].readmissions), (0, 0), "seed {s}, rank {rank}: SUP");
    }
    // The timeline: an outage (SOUT flat over 5+ samples while SUP grows), then SOUT
    // carrying again.
    let rep = out.ranks[1].report.as_ref().expect("sender's report");
    let tl = &rep.phases[0].tx.as_ref().expect("sender's side").timeline;
    let flat = tl.windows(6).position(|w| w.iter().all(|e| e[1] == w[0][1]) && w[5][2] > w[0][2]);
    let flat = flat.unwrap_or_else(|| panic!("seed {s}: no outage in the timeline {tl:?}"));
    let sout_then = tl[flat][1];
    let last = tl.last().expect("samples");
    let back = tl[flat..].iter().find(|e| e[1] > sout_then).map_or(0, |e| e[0] / 1_000_000);
    eprintln!(
        "{name}: seed {s}: SOUT flat at {sout_then} bytes from {} ms, carrying again at {back} ms, {} bytes at the \
         end ({} ms)",
        tl[flat][0] / 1_000_000,
        last[1],
        last[0] / 1_000_000
    );
    assert!(last[1] > sout_then, "seed {s}: SOUT never carried bytes again: {tl:?}");
}

/// Where a rail failed, in the words an operator looks for: a rail dropped on the soft
/// fabric makes the sender's WARN name the NIC and port, its local and the peer's address
/// (`IP:port`) and the QP numbers, and the NCCL communicator; the receiver's line about the
/// same rail names the same two ends the other way round, and the QP the soft fabric moved
/// to the error state is one the sender's line names.
#[test]
fn a_failed_rails_warning_names_the_nic_the_addresses_and_the_qps() {
    let s = seed("where");
    let (out, _) = run_with_hook("place", s, "sup", "", 20_000, &[("RUST_LOG", "info")]);
    if let Err(e) = out.check_clean() {
        panic!("seed {s}: {e}");
    }
    let (sender, receiver) = (&out.ranks[1].stderr, &out.ranks[0].stderr);
    let warn = sender
        .lines()
        .find(|l| l.starts_with("mpib WARN") && l.contains("send: SUP rail failed"))
        .unwrap_or_else(|| panic!("no WARN of the failed rail\n{}", out.describe()));
    let place = Place::parse(warn).unwrap_or_else(|| panic!("the WARN does not say where: {warn}"));
    assert_eq!(place.nic, "soft-sup:1", "{warn}");
    assert!(place.comm.starts_with("send comm of NCCL comm 0x"), "{warn}");
    for a in [&place.local, &place.peer] {
        assert!(a.parse::<std::net::SocketAddr>().is_ok(), "not an IP:port: {a} in {warn}");
    }
    // The soft fabric's own line names the QP it moved to the error state (the drill's).
    let errored: Vec<u32> = sender
        .lines()
        .filter_map(|l| l.split("soft fabric: QP ").nth(1)?.split(" to error state").next()?.parse().ok())
        .collect();
    assert!(!errored.is_empty() && errored.iter().all(|q| place.qps.contains(q)), "{errored:?} vs {warn}");
    // The receiver's line about SUP: the same connection seen from the other end.
    let theirs = receiver
        .lines()
        .filter(|l| l.contains("recv: SUP rail"))
        .find_map(Place::parse)
        .unwrap_or_else(|| panic!("no line of the receiver places its SUP rail\n{}", out.describe()));
    assert_eq!((theirs.local, theirs.peer), (place.peer.clone(), place.local.clone()), "{warn}");
    assert_eq!((theirs.qps, theirs.peer_qps), (place.peer_qps, place.qps), "{warn}");
    assert!(theirs.comm.starts_with("recv comm"), "{warn}");
}

/// The place at the end of a line: `[NIC LOCAL QP(s) N[,M] -> peer PEER QP(s) N[,M]; COMM]`.
#[derive(Debug)]
struct Place {
    nic: String,
    local: String,
    qps: Vec<u32>,
    peer: String,
    peer_qps: Vec<u32>,
    comm: String,
}

impl Place {
    fn parse(line: &str) -> Option<Place> {
        let inner = line.rsplit_once(" [")?.1.strip_suffix(']')?;
        let (rail, comm) = inner.split_once("; ")?;
        let (mine, theirs) = rail.split_once(" -> peer ")?;
        let end = |s: &str| -> Option<(String, Vec<u32>)> {
            let (addr, qps) = s.split_once(" QP")?;
            let qps = qps.trim_start_matches('s').trim().split(',').map(|q| q.parse().ok()).collect::<Option<_>>()?;
            Some((addr.to_string(), qps))
        };
        let (nic, mine) = mine.split_once(' ')?;
        let (local, qps) = end(mine)?;
        let (peer, peer_qps) = end(theirs)?;
        Some(Place { nic: nic.into(), local, qps, peer, peer_qps, comm: comm.into() })
    }
}
