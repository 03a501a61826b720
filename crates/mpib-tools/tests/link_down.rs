//! Rail failover on real verbs, in the Soft-RoCE guest only: while checksummed
//! traffic streams over both rails, the SUP rail's netdev is taken down, and up again 1.5 s
//! later. rxe raises a port-down async event on both ranks' SUP device; each comm feeds it
//! to its engine at its next call that waits, and the connection goes on over SOUT; once
//! the port is active again the sender's re-admission attempts rebuild SUP. The run must
//! end clean: every byte as the pattern says, every size exact, no error code on either
//! rank, each rank's `mpib_rail_stats` counting one failover on SUP and none on SOUT, and
//! the sender's timeline showing SUP flat during the outage, then SUP re-admitted on both
//! ranks and carrying bytes again before the stream ends (it prints how long after link-up).
//!
//! `ci/rxe-test.sh link-down` runs it (`MPIB_TEST_LINK_TOGGLE=1`, `RXE_NETDEV1`, the verbs
//! environment in `CONFORMANCE_ENV`); anywhere else it is ignored.
//!
//! `sup_gid_change_mid_stream_readmits_with_the_new_gid` changes SUP's RoCE GID table under
//! the same kind of stream instead, the link staying up: rxe1's IP address is removed and
//! added again (its GID is re-added at another index while the failed QPs still hold the
//! old entry), then removed and replaced by another address (a GID of another value). Each
//! time SUP fails over (rxe fails the WRs of a QP whose source GID is gone), re-admission
//! waits while the port has no usable GID, and the rail comes back on the GID as it is
//! then: found again at its new index, then chosen anew and carried to the peer in the
//! re-admission exchange. `ci/rxe-test.sh gid-change` runs it.

mod common;

use std::process::Command;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use common::pair;
use mpib_tools::pair::run_pair_observed;
use mpib_tools::rank::PhaseStart;
use mpib_tools::spec::{Phase, Workload};

const KIB: u64 = 1024;
const MIB: u64 = 1024 * 1024;

fn ip_link(netdev: &str, state: &str) {
    ip(&["link", "set", netdev, state]);
}

/// iproute2's `ip ARGS` (the guest's busybox `ip` cannot do all of it), which must succeed.
fn ip(args: &[&str]) {
    let ok = Command::new("/usr/bin/ip").args(args).status().is_ok_and(|s| s.success());
    assert!(ok, "ip {}", args.join(" "));
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
    sup_link_down_mid_stream(&[]);
}

/// The same with 4 QPs on each rail, each rail's share of a request striped over them
/// (`MPIB_QP=4 MPIB_QP_STRIPE=1`): pieces in flight on SUP when its link goes down are
/// replayed whole on SOUT; SUP's four QPs rebuilt on both ranks, their records exchanged
/// over SOUT, each probed, SUP carrying bytes again.
#[test]
#[ignore = "takes a netdev down: only in the Soft-RoCE guest (ci/rxe-test.sh link-down-striped)"]
fn sup_link_down_with_4_striped_qps_per_rail_is_readmitted() {
    sup_link_down_mid_stream(&[("MPIB_QP", "4"), ("MPIB_QP_STRIPE", "1")]);
}

/// Both rails' links down together for 2 s mid-stream (both netdevs; a switch reboot): rxe
/// fails every posted WR of both rails at once, so the connection is in an outage at once;
/// the control messages that rebuild a rail go over the set-up connection (between the
/// ranks' local addresses, which stay reachable on the host with the links down), and once
/// the links are up the first rail re-admitted carries what was missing. Clean: every byte
/// exact, no error code on either rank, both rails failed over and re-admitted.
#[test]
#[ignore = "takes netdevs down: only in the Soft-RoCE guest (ci/rxe-test.sh both-links-down)"]
fn both_links_down_2s_mid_stream_are_ridden_out() {
    if std::env::var("MPIB_TEST_LINK_TOGGLE").as_deref() != Ok("1") {
        eprintln!("MPIB_TEST_LINK_TOGGLE is not 1: skipped");
        return;
    }
    let netdevs = ["RXE_NETDEV0", "RXE_NETDEV1"].map(|v| std::env::var(v).expect(v));
    let _up = netdevs.clone().map(LinkUp);
    let phase = Phase {
        sizes: vec![4 * KIB, MIB + 7, 64 * KIB, 256 * KIB + 3],
        count: 1500,
        nrecv: 1,
        inflight: 4,
        warmup: 4,
        ..Phase::default()
    };
    let w = Workload { seed: 23, stall_ms: 120_000, phases: vec![phase], ..Workload::default() };
    let mut spec = pair(w);
    spec.env.push(("MPIB_SPLIT".into(), "50".into()));
    // The suites' MPIB_TIMEOUT=16 makes the automatic grace 2 s: give the outage room.
    spec.env.push(("MPIB_OUTAGE_GRACE_MS".into(), "30000".into()));
    spec.env.push(("RUST_LOG".into(), "mpib=info".into()));
    let mut triggered = false;
    let mut observer = |rank: usize, p: &PhaseStart| {
        if rank != 1 || p.warmup || triggered {
            return;
        }
        triggered = true;
        let netdevs = netdevs.clone();
        std::thread::spawn(move || {
            std::thread::sleep(Duration::from_millis(1500));
            for n in &netdevs {
                ip_link(n, "down");
            }
            eprintln!("link_down: {netdevs:?} down");
            std::thread::sleep(Duration::from_millis(2000));
            for n in &netdevs {
                ip_link(n, "up");
            }
            eprintln!("link_down: {netdevs:?} up");
        });
    };
    let t0 = Instant::now();
    let out = run_pair_observed(&spec, &common::rank_program(), &mut observer).expect("start the ranks");
    eprintln!("both links down mid-stream: {:.2} s", t0.elapsed().as_secs_f64());
    for (rank, who) in [(0, "receiver"), (1, "sender")] {
        for line in out.ranks[rank].stderr.lines().filter(|l| l.contains("outage") || l.contains("back on")) {
            eprintln!("link_down: {who}: {line}");
        }
    }
    if let Err(e) = out.check_clean() {
        panic!("{e}");
    }
    for rank in 0..2 {
        let rails = out.ranks[rank].report.as_ref().and_then(|rep| rep.rails).expect("mpib_rail_stats");
        assert!(
            rails.iter().all(|r| r.failovers >= 1 && r.readmissions >= 1),
            "rank {rank}: both rails failed over and came back (was the stream over before the links went down?)\n{}",
            out.describe()
        );
    }
    let sender = &out.ranks[1].stderr;
    assert!(sender.contains("the connection is back on"), "the sender never left the outage\n{sender}");
}

/// One link-down run (see the module doc), `env` added to the ranks' variables.
fn sup_link_down_mid_stream(env: &[(&str, &str)]) {
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
    spec.env.extend(env.iter().map(|(k, v)| (k.to_string(), v.to_string())));
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
    let out = run_pair_observed(&spec, &common::rank_program(), &mut observer).expect("start the ranks");
    eprintln!("link down mid-stream ({env:?}): {:.2} s", t0.elapsed().as_secs_f64());
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
    if env.contains(&("MPIB_QP_STRIPE", "1")) {
        // Striped: the banner says so, and SOUT, which
        // carried on alone through the outage, sent several pieces a request.
        assert!(sender.contains("qps 4 striped"), "the banner does not show the striping\n{sender}");
        let rails = out.ranks[1].report.as_ref().and_then(|rep| rep.rails).expect("mpib_rail_stats");
        let (imms, receives) = (rails[0].counters.imm_sent, 1500 + 4);
        eprintln!("link_down: striped: {imms} IMMs on SOUT for {receives} receives");
        assert!(imms > 2 * receives, "{imms} IMMs on SOUT for {receives} receives: not striped");
    }
    // The WARN says where: SUP's NIC and port, both ends' GIDs and QP numbers, the comm.
    let dev = std::env::var("RXE_DEV1").expect("RXE_DEV1");
    let placed = |l: &&str| {
        l.contains(&format!(" [{dev}:1 GID "))
            && l.contains(" -> peer GID ")
            && (l.contains(" QP ") || l.contains(" QPs "))
            && l.contains("send comm")
    };
    let down: Vec<&str> = sender.lines().filter(|l| l.contains("port is down (async event)")).collect();
    assert!(!down.is_empty() && down.iter().all(placed), "the port-down WARN does not say where: {down:?}");
    let failed = sender.lines().find(|l| l.contains("send: SUP rail failed"));
    assert!(failed.as_ref().is_some_and(placed), "the rail's failure does not say where: {failed:?}");
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

/// Gives rxe1's netdev its address back however the test ends: the guest's rig (its policy
/// route from rxe1's address to rxe0's, which went with the address) as it was.
struct AddressBack {
    netdev: String,
    ip: String,
    peer_ip: String,
}

impl Drop for AddressBack {
    fn drop(&mut self) {
        let out = Command::new("/usr/bin/ip").args(["-4", "-o", "addr", "show", "dev", &self.netdev]).output();
        let have = out.map(|o| String::from_utf8_lossy(&o.stdout).into_owned()).unwrap_or_default();
        for word in have.split_whitespace().filter(|w| w.contains('/') && w.contains('.')) {
            if !word.starts_with(&format!("{}/", self.ip)) {
                let _ = Command::new("/usr/bin/ip").args(["addr", "del", word, "dev", &self.netdev]).status();
            }
        }
        if !have.contains(&format!("inet {}/", self.ip)) {
            let _ = Command::new("/usr/bin/ip")
                .args(["addr", "add", &format!("{}/24", self.ip), "dev", &self.netdev])
                .status();
        }
        let route = ["route", "replace", &self.peer_ip, "dev", &self.netdev, "src", &self.ip, "table", "101"];
        let _ = Command::new("/usr/bin/ip").args(route).status();
    }
}

#[test]
#[ignore = "changes a netdev's address: only in the Soft-RoCE guest (ci/rxe-test.sh gid-change)"]
fn sup_gid_change_mid_stream_readmits_with_the_new_gid() {
    if std::env::var("MPIB_TEST_LINK_TOGGLE").as_deref() != Ok("1") {
        eprintln!("MPIB_TEST_LINK_TOGGLE is not 1: skipped");
        return;
    }
    let var = |n: &str| std::env::var(n).unwrap_or_else(|_| panic!("{n}"));
    let (netdev, ip1, ip0) = (var("RXE_NETDEV1"), var("RXE_IP1"), var("RXE_IP0"));
    // Another address in the rig's subnet for the second change.
    let other = {
        let (net, last) = ip1.rsplit_once('.').expect("an IPv4 address");
        format!("{net}.{}", last.parse::<u8>().expect("a byte").wrapping_add(10))
    };
    let _back = AddressBack { netdev: netdev.clone(), ip: ip1.clone(), peer_ip: ip0 };
    let phase = Phase {
        sizes: vec![4 * KIB, MIB + 7, 64 * KIB, 256 * KIB + 3],
        count: 1500,
        nrecv: 1,
        inflight: 4,
        warmup: 4,
        timeline_us: 20_000,
        ..Phase::default()
    };
    let w = Workload { seed: 38, stall_ms: 120_000, phases: vec![phase], ..Workload::default() };
    let mut spec = pair(w);
    spec.env.push(("MPIB_SPLIT".into(), "50".into()));
    spec.env.push(("RUST_LOG".into(), "mpib=info".into())); // the GID and re-admission INFO lines
    let mut triggered = false;
    let mut observer = |rank: usize, p: &PhaseStart| {
        if rank != 1 || p.warmup || triggered {
            return;
        }
        triggered = true;
        let (netdev, ip1, other) = (netdev.clone(), ip1.clone(), other.clone());
        std::thread::spawn(move || {
            let at = |s: &str| format!("{s}/24");
            std::thread::sleep(Duration::from_millis(1500));
            ip(&["addr", "del", &at(&ip1), "dev", &netdev]);
            eprintln!("gid_change: {ip1} removed from {netdev}");
            std::thread::sleep(Duration::from_millis(1500));
            ip(&["addr", "add", &at(&ip1), "dev", &netdev]);
            eprintln!("gid_change: {ip1} added to {netdev} again");
            std::thread::sleep(Duration::from_millis(5000));
            ip(&["addr", "del", &at(&ip1), "dev", &netdev]);
            std::thread::sleep(Duration::from_millis(1500));
            ip(&["addr", "add", &at(&other), "dev", &netdev]);
            eprintln!("gid_change: {netdev} now has {other} instead of {ip1}");
        });
    };
    let t0 = Instant::now();
    let out = run_pair_observed(&spec, &common::rank_program(), &mut observer).expect("start the ranks");
    eprintln!("GID changes mid-stream: {:.2} s", t0.elapsed().as_secs_f64());
    for (rank, who) in [(0, "receiver"), (1, "sender")] {
        for line in out.ranks[rank].stderr.lines().filter(|l| {
            l.contains("SUP") || l.contains("re-admission") || l.contains("GID") || l.contains("address on the rail")
        }) {
            eprintln!("gid_change: {who}: {line}");
        }
    }
    if let Err(e) = out.check_clean() {
        panic!("{e}");
    }
    let stats: Vec<_> =
        out.ranks.iter().map(|r| r.report.as_ref().and_then(|rep| rep.rails).expect("mpib_rail_stats")).collect();
    let (failovers, readmitted): (Vec<_>, Vec<_>) =
        stats.iter().map(|x| ((x[0].failovers, x[1].failovers), x[1].readmissions)).unzip();
    eprintln!("gid_change: failovers (SOUT, SUP) per rank {failovers:?}, SUP readmissions {readmitted:?}");
    assert_eq!(failovers, [(0, 2), (0, 2)], "SUP failed over at each change, SOUT never\n{}", out.describe());
    assert_eq!(readmitted, [2, 2], "SUP re-admitted after each change on each rank\n{}", out.describe());
    let logs = format!("{}{}", out.ranks[0].stderr, out.ranks[1].stderr);
    assert!(logs.contains("RoCE GID now index"), "no GID re-read logged\n{}", out.describe());
    assert!(logs.contains(&format!("::ffff:{other}")), "the new address's GID was never chosen\n{}", out.describe());
    assert!(
        logs.contains("the peer's address on the rail changed"),
        "the new GID did not reach the peer in the re-admission exchange\n{}",
        out.describe()
    );
}
