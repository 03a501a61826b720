//! A peer that dies, vanishes, closes or floods the port, and many QPs between two
//! processes: part of `tests/soft_fabric.rs` (same child agent, same helpers).

use std::net::TcpStream;
use std::time::{Duration, Instant};

use mpib::fabric::{QueuePair, Sge, WcStatus, WrOpcode};

use super::{
    PARAMS, Peer, RW, SILENT_PEER_PARAMS, Side, connected, connected_with, count_logs, hex, statuses, warnings, wr,
};

#[test]
fn killed_peer_fails_the_waiting_wr_and_flushes_the_rest() {
    let (mut me, peer) = connected(4096, RW);
    let local = Sge { addr: me.addr(), len: 8, lkey: me.key() };
    let imm = wr(1, WrOpcode::WriteImm, local, peer.addr, peer.rkey, false); // waits: no WQE
    me.qp.post_send(&[imm, wr(2, WrOpcode::Write, local, peer.addr, peer.rkey, true)]).unwrap();
    assert!(me.poll(1, Duration::from_millis(100)).is_empty());
    peer.signal(libc::SIGKILL);
    let c = me.poll(2, Duration::from_secs(5));
    assert_eq!(statuses(&c), [(1, WcStatus::RetryExceeded), (2, WcStatus::Flushed)]);
}

#[test]
fn silently_vanished_peer_gives_an_error_within_the_bound() {
    let (mut me, peer) = connected_with(4096, RW, &SILENT_PEER_PARAMS);
    peer.signal(libc::SIGSTOP); // no RST, no FIN: the kernel still acknowledges TCP
    let local = Sge { addr: me.addr(), len: 8, lkey: me.key() };
    me.qp.post_send(&[wr(1, WrOpcode::Write, local, peer.addr, peer.rkey, true)]).unwrap();
    let t = Instant::now();
    let c = me.poll(1, Duration::from_secs(5));
    let bound = mpib::fabric::soft::silent_peer_bound(&SILENT_PEER_PARAMS);
    assert_eq!(statuses(&c), [(1, WcStatus::RetryExceeded)]);
    // Never before the bound; after it, within a margin that a busy machine's scheduling
    // cannot exhaust (the default bound is ~34 s: 2 s more still proves it is this one).
    let took = t.elapsed();
    assert!(took >= bound && took < bound + Duration::from_secs(2), "{took:?} for a bound of {bound:?}");
    peer.signal(libc::SIGKILL);
}

/// A peer that closes its QP in order is not a warning, whether or not requests of this side
/// wait on it: those fail (their completions say so), and whether that matters (a request
/// NCCL posted, or only mpib's own probe) is the engine's to say, not the fabric's.
#[test]
fn an_orderly_close_is_not_a_warning_and_fails_what_waited_on_the_peer() {
    count_logs();
    let (mut me, mut peer) = connected(4096, RW);
    let before = warnings("to error state");
    assert_eq!(peer.cmd("drop_qp"), "ok");
    let t = Instant::now();
    while me.qp.is_ready().is_ok() {
        assert!(t.elapsed() < Duration::from_secs(10), "the peer's close was not seen");
        me.poll(0, Duration::from_millis(1));
    }
    assert_eq!(warnings("to error state"), before, "an orderly close logged a warning");
    // Requests waiting on a peer that closes: they fail, without a warning of the fabric's.
    let (mut me, mut peer) = connected(4096, RW);
    let local = Sge { addr: me.addr(), len: 8, lkey: me.key() };
    let imm = wr(1, WrOpcode::WriteImm, local, peer.addr, peer.rkey, true); // waits: no WQE
    me.qp.post_send(&[imm]).unwrap();
    assert!(me.poll(1, Duration::from_millis(100)).is_empty());
    let before = warnings("to error state");
    assert_eq!(peer.cmd("drop_qp"), "ok");
    let c = me.poll(1, Duration::from_secs(10));
    assert_eq!(statuses(&c).len(), 1);
    assert_eq!(c[0].status, WcStatus::RetryExceeded, "the request that waited on the peer failed");
    assert_eq!(warnings("to error state"), before, "an orderly close is no warning of the fabric's");
}

/// A flood of connections that never say who they are neither exhausts
/// the rail's descriptors nor floods the log, and a real connection still comes up.
#[test]
fn a_flood_of_silent_connections_is_bounded_and_quiet() {
    let mut me = Side::new(4096, RW);
    let mut peer = Peer::spawn(4096, RW);
    let port: u16 = peer.cmd("port").strip_prefix("port ").unwrap().parse().unwrap();
    assert_eq!(peer.cmd("limit_fds 100"), "ok");
    let base: usize = peer.cmd("fds").strip_prefix("fds ").unwrap().parse().unwrap();
    let flood: Vec<TcpStream> = (0..300).filter_map(|_| TcpStream::connect(("127.0.0.1", port)).ok()).collect();
    assert!(flood.len() > 150, "the kernel's backlog took {}", flood.len());
    std::thread::sleep(Duration::from_millis(1500));
    let fds: usize = peer.cmd("fds").strip_prefix("fds ").unwrap().parse().unwrap();
    let warned: usize = peer.cmd("warnings accept").strip_prefix("warnings ").unwrap().parse().unwrap();
    assert!(warned <= 3, "{warned} warnings about accepting in 1.5 s");
    assert!(fds <= base + 70, "{fds} descriptors open (MAX: none left), {base} before the flood");
    // A real connection while the flood holds on.
    me.qp.connect(&peer.info, &PARAMS).unwrap();
    peer.send(&format!("connect {}", hex(&me.qp.local_info().0)));
    me.wait_ready();
    assert_eq!(peer.reply(), "ok");
    let local = Sge { addr: me.addr(), len: 64, lkey: me.key() };
    me.qp.post_send(&[wr(1, WrOpcode::Write, local, peer.addr, peer.rkey, true)]).unwrap();
    assert_eq!(statuses(&me.poll(1, Duration::from_secs(5))), [(1, WcStatus::Success)]);
    drop(flood);
}

/// 1,024 QP connections in each direction between two processes' rails (2,048 QP
/// pairs; one process writes through the first half, the other through the second) share
/// one TCP link: each process keeps a bounded number of descriptors (the goal: at most 64 at
/// 1,024 comms). Both ends are children, so no other test's sockets are counted; the count
/// is printed for the note (`--nocapture`).
#[test]
fn two_thousand_qps_between_two_processes_share_one_socket() {
    const N: usize = 2048;
    let fds = |p: &mut Peer| -> usize { p.cmd("fds").strip_prefix("fds ").unwrap().parse().unwrap() };
    let (mut a, mut b) = (Peer::spawn(8 * N, RW), Peer::spawn(8 * N, RW));
    let (a0, b0) = (fds(&mut a), fds(&mut b));
    let infos_a = a.cmd(&format!("many {N}")).strip_prefix("many ").unwrap().to_string();
    let infos_b = b.cmd(&format!("many {N}")).strip_prefix("many ").unwrap().to_string();
    // Both connect at once (each waits until its QPs are up, which needs the other's).
    for (p, infos) in [(&mut a, &infos_b), (&mut b, &infos_a)] {
        p.send(&format!("many_connect {infos}"));
    }
    for p in [&mut a, &mut b] {
        assert_eq!(p.reply(), "ok");
    }
    assert_eq!(a.cmd("fill 7"), "ok");
    assert_eq!(a.cmd(&format!("many_write 0 {} {} {}", N / 2, b.addr, b.rkey)), "ok");
    assert_eq!(b.cmd(&format!("check 0 {} 7", 4 * N)), "ok");
    assert_eq!(b.cmd("fill 9"), "ok");
    assert_eq!(a.cmd("reset"), "ok");
    assert_eq!(b.cmd(&format!("many_write {} {N} {} {}", N / 2, a.addr, a.rkey)), "ok");
    assert_eq!(a.cmd(&format!("check {} {} 9", 4 * N, 4 * N)), "ok");
    let (a1, b1) = (fds(&mut a), fds(&mut b));
    println!("soft_fabric_fds: {N} QP pairs between two processes: {a0} -> {a1} and {b0} -> {b1} descriptors");
    assert!(a1 <= 64 && b1 <= 64, "{a1} and {b1} descriptors open with {N} QPs");
    assert!(a1 <= a0 + 2 && b1 <= b0 + 2, "QPs opened sockets: {a0} -> {a1}, {b0} -> {b1}");
}
