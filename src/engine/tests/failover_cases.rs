//! Rail failover, deterministic cases (the random model is `failover.rs`): only the
//! missing parts are replayed, flagged, on the surviving rail; a duplicate replayed part is
//! ignored and counted, a part outside the mask is still a violation; both rails down makes
//! every outstanding and later call fail (no hang), also when the surviving rail dies
//! during the replay; a stall fails the rail; failover off is the old behaviour.

use super::faults::*;
use super::harness::*;
use crate::engine::imm::{Imm, REPLAY_FLAG};
use crate::engine::{Event, RailState, SOUT, SUP, Violation, WrKind};
use crate::error::Cause;
use crate::fabric::{WcStatus, WrOpcode};
use crate::split::{AnySplit, Fixed};

fn pair(percent: u8, stall_ns: u64) -> (Pair, FoOut) {
    let mut p = Pair::new(Opts { split: AnySplit::Fixed(Fixed::percent(percent)), ..Opts::default() });
    enable_failover(&mut p, stall_ns);
    (p, FoOut::default())
}

/// Posts receives of `size` bytes and their sends (CTS delivered, data on the wires):
/// (rid, sid, recv address) each.
fn transfers(p: &mut Pair, size: usize, seeds: &[u64]) -> Vec<(u16, u16, u64)> {
    let recvs: Vec<_> = seeds.iter().map(|_| p.irecv_one(size)).collect();
    while p.step(Dir::ToSend, SOUT, 0) | p.step(Dir::ToSend, SUP, 0) {}
    recvs
        .into_iter()
        .zip(seeds)
        .map(|((rid, ra), &seed)| {
            let sa = p.send_buf(&pattern(seed, size));
            let sid = p.isend(sbuf(sa, size as u64, 0)).unwrap().expect("CTS delivered");
            (rid, sid, ra)
        })
        .collect()
}

fn transfer(p: &mut Pair, size: usize, seed: u64) -> (u16, u16, u64) {
    transfers(p, size, &[seed])[0]
}

/// Runs everything until nothing moves (bounded).
fn settle(p: &mut Pair, fo: &mut FoOut) -> crate::Result<()> {
    for _ in 0..20 {
        p.refill();
        p.deliver_all();
        p.poll_send()?;
        p.poll_recv()?;
        p.pump_failover(fo)?;
    }
    Ok(())
}

fn is_cause(e: &crate::Error, pred: impl Fn(&Cause) -> bool) -> bool {
    pred(&e.root().cause) || matches!(&e.cause, Cause::FailedEarlier(inner) if pred(&inner.root().cause))
}

#[test]
fn only_the_missing_part_is_replayed_flagged_on_the_surviving_rail() {
    let (mut p, mut fo) = pair(50, 0);
    // A: SOUT's part lands but its ACK is lost. B: SOUT's part never lands.
    let v = transfers(&mut p, 4096, &[1, 2]);
    let ((ra_id, sa_id, a_addr), (rb_id, sb_id, b_addr)) = (v[0], v[1]);
    assert!(p.land_then_fail(Dir::ToRecv, SOUT, 0), "A's SOUT part lands, the sender sees an error");
    let first_replay = p.log.len();
    settle(&mut p, &mut fo).unwrap();
    let c = p.s.failover_counts();
    assert_eq!((c.failovers, c.replayed_parts, c.replayed_bytes), (1, 1, 2048), "only B's SOUT half again");
    let replays: Vec<_> = p.log[first_replay..]
        .iter()
        .filter(|(d, _, _, w)| *d == Dir::ToRecv && w.opcode == WrOpcode::WriteImm)
        .collect();
    assert_eq!(replays.len(), 1, "one replayed WRITE_WITH_IMM");
    let (_, rail, _, wr) = replays[0];
    assert_eq!(*rail, SUP, "on the surviving rail");
    assert_eq!((wr.rkey, wr.sge[0].lkey), (62, 72), "with the surviving rail's keys");
    assert_eq!(wr.remote_addr, b_addr, "to the same destination (SOUT's part is the first half)");
    let imm = Imm::decode(wr.imm);
    assert_eq!((imm.slot, imm.mask), (1 | REPLAY_FLAG, RailMask::BOTH), "B's slot, flagged, mask unchanged");
    assert_eq!(WrKind::decode(wr.wr_id), Some((WrKind::ReplaySignal, SOUT, 1)));
    for (rid, sid, addr, seed) in [(ra_id, sa_id, a_addr, 1), (rb_id, sb_id, b_addr, 2)] {
        assert_eq!(p.test_recv(rid).unwrap().unwrap().sizes[0], 4096);
        assert_eq!(p.rs.space.read(addr, 4096), pattern(seed, 4096));
        assert_eq!(p.test_send(sid).unwrap(), Some(4096));
    }
    assert_eq!(p.s.rail_states()[SOUT], RailState::Failed { epoch: 0, fenced: true });
    // New traffic goes on SUP alone.
    let before = p.wrs_on(Dir::ToRecv, SOUT);
    let (rid, sid, addr) = transfer(&mut p, 1000, 3);
    settle(&mut p, &mut fo).unwrap();
    assert_eq!(p.wrs_on(Dir::ToRecv, SOUT), before);
    assert_eq!(p.test_recv(rid).unwrap().unwrap().sizes[0], 1000);
    assert_eq!(p.rs.space.read(addr, 1000), pattern(3, 1000));
    assert_eq!(p.test_send(sid).unwrap(), Some(1000));
}

#[test]
fn a_duplicate_replayed_part_is_ignored_and_a_part_outside_the_mask_is_a_violation() {
    let (mut p, mut fo) = pair(50, 0);
    p.r.handle_event(Event::RailDown { rail: SOUT }).unwrap();
    settle(&mut p, &mut fo).unwrap();
    let (rid, ra) = p.irecv_one(256);
    p.poll_recv().unwrap();
    // SOUT's part (128 B) replayed over SUP, twice; then SUP's own part.
    let replay = Imm::replayed(Imm { slot: 0, mask: RailMask::BOTH, size_q: 2 }.encode());
    let cqe = |imm: u32, len: u32| crate::fabric::Completion { imm, ..imm_cqe(Imm::decode(0), len) };
    p.inject_recv(SUP, cqe(replay, 128)).unwrap();
    p.inject_recv(SUP, cqe(replay, 128)).unwrap();
    assert_eq!(p.r.failover_counts().duplicates, 1);
    assert_eq!(p.r.test(rid).unwrap(), None, "SUP's own part is still missing");
    p.inject_recv(SUP, imm_cqe(Imm { slot: 0, mask: RailMask::BOTH, size_q: 2 }, 128)).unwrap();
    let done = p.r.test(rid).unwrap().unwrap();
    assert_eq!(done.sizes[0], 256, "each part counted once");
    let _ = ra;
    // A replay of SOUT's part for a slot whose mask names SUP alone: a violation.
    let _ = p.irecv_one(64);
    let bad = Imm::replayed(Imm { slot: 1, mask: RailMask::SUP, size_q: 1 }.encode());
    let e = p.inject_recv(SUP, cqe(bad, 64)).unwrap_err();
    assert!(
        is_cause(&e, |c| matches!(c, Cause::Violation(Violation::MaskOmitsRail { rail: SOUT, slot: 1, .. }))),
        "{e}"
    );
}

#[test]
fn a_replay_flag_with_failover_off_is_a_violation() {
    let mut p = Pair::new(Opts::default());
    let _ = p.irecv_one(64);
    let bad = Imm::replayed(Imm { slot: 0, mask: RailMask::BOTH, size_q: 1 }.encode());
    let c = crate::fabric::Completion { imm: bad, ..imm_cqe(Imm::decode(0), 64) };
    let e = p.inject_recv(SUP, c).unwrap_err();
    assert!(is_cause(&e, |c| matches!(c, Cause::Violation(Violation::NoReceiveWaiting { .. }))), "{e}");
}

#[test]
fn both_rails_down_fails_every_outstanding_and_later_call() {
    let (mut p, mut fo) = pair(50, 0);
    let reqs = transfers(&mut p, 4096, &[0, 1, 2]);
    assert!(p.fail_qp(Dir::ToRecv, SOUT, 0, WcStatus::RetryExceeded));
    // Run the failover one WR at a time until the replays are posted; then SUP dies too.
    for _ in 0..50 {
        if p.s.failover_counts().replayed_parts > 0 {
            break;
        }
        for (d, r) in [(Dir::ToSend, SOUT), (Dir::ToSend, SUP), (Dir::ToRecv, SUP)] {
            p.step(d, r, 0);
        }
        p.poll_send().unwrap();
        p.poll_recv().unwrap();
        p.pump_failover(&mut fo).unwrap();
    }
    assert_eq!(p.s.failover_counts().replayed_parts, 3, "every SOUT part is missing");
    p.fenced[Dir::ToRecv as usize][SUP] = true; // the replays die with SUP
    let e = settle(&mut p, &mut fo).unwrap_err();
    assert!(is_cause(&e, |c| matches!(c, Cause::BothRailsFailed)), "{e}");
    // A port-down on the receiver's last rail is left to RC (below); it learns the end from
    // its own keepalive on SUP, whose peer is in the error state.
    p.r.handle_event(Event::RailDown { rail: SUP }).expect("a port-down on the last rail waits");
    p.fence(SEND_SIDE, SUP);
    p.fence(RECV_SIDE, SUP);
    for _ in 0..4 {
        p.now += crate::engine::KEEPALIVE_NS + 1;
        p.keepalive();
        let _ = p.poll_recv();
        let _ = p.pump_failover(&mut fo);
    }
    for &(rid, sid, _) in &reqs {
        assert!(p.s.test(sid).is_err(), "send {sid}");
        assert!(p.r.test(rid).is_err(), "receive {rid}");
    }
    assert!(p.s.isend(p.now, sbuf(0, 8, 0), &mut p.ss, &mut p.posts).is_err());
    assert!(p.r.irecv(&[rbuf(0, 8, 0)], &mut p.rs, &mut p.posts).is_err());
}

#[test]
fn a_stall_fails_the_rail_and_the_transfer_completes_on_the_other() {
    let (mut p, mut fo) = pair(50, 1_000_000);
    let (rid, sid, addr) = transfer(&mut p, 4096, 9);
    // SUP delivers; SOUT's WR sits on its wire (a silent link).
    while p.step(Dir::ToRecv, SUP, 0) {}
    p.poll_send().unwrap();
    p.pump_failover(&mut fo).unwrap();
    assert_eq!(p.s.rail_states()[SOUT], RailState::Up, "not stalled yet");
    p.now += 2_000_000;
    p.pump_failover(&mut fo).unwrap();
    assert_eq!(p.s.rail_states()[SOUT], RailState::Failed { epoch: 0, fenced: false });
    settle(&mut p, &mut fo).unwrap();
    assert_eq!(p.test_recv(rid).unwrap().unwrap().sizes[0], 4096);
    assert_eq!(p.rs.space.read(addr, 4096), pattern(9, 4096));
    assert_eq!(p.test_send(sid).unwrap(), Some(4096));
    assert_eq!(p.r.rail_states()[SOUT], RailState::Failed { epoch: 0, fenced: true });
}

#[test]
fn a_port_down_on_the_last_rail_waits_for_rc_and_a_port_back_in_time_carries_on() {
    let (mut p, mut fo) = pair(50, 0);
    let reqs = transfers(&mut p, 4096, &[0, 1]);
    assert!(p.fail_qp(Dir::ToRecv, SOUT, 0, WcStatus::RetryExceeded));
    settle(&mut p, &mut fo).unwrap();
    for (seed, &(rid, sid, addr)) in reqs.iter().enumerate() {
        assert_eq!(p.test_send(sid).unwrap(), Some(4096));
        assert_eq!(p.test_recv(rid).unwrap().unwrap().sizes[0], 4096);
        assert_eq!(p.rs.space.read(addr, 4096), pattern(seed as u64, 4096));
    }
    assert!(matches!(p.s.rail_states()[SOUT], RailState::Failed { .. }));
    // A leaf switch reboots: SUP's port goes down on both sides while SOUT is still down.
    p.s.handle_event(p.now, Event::RailDown { rail: SUP }).expect("the sender waits for RC");
    p.r.handle_event(Event::RailDown { rail: SUP }).expect("the receiver waits for RC");
    let (rid, sid, addr) = transfer(&mut p, 8192, 7);
    settle(&mut p, &mut fo).unwrap();
    assert_eq!(p.s.rail_states()[SUP], RailState::Up, "SUP was not failed");
    assert_eq!(p.r.rail_states()[SUP], RailState::Up);
    assert_eq!(p.test_send(sid).unwrap(), Some(8192), "the port came back: nothing errored");
    assert_eq!(p.test_recv(rid).unwrap().unwrap().sizes[0], 8192);
    assert_eq!(p.rs.space.read(addr, 8192), pattern(7, 8192));
    assert!(p.s.error().is_none() && p.r.error().is_none());
}

#[test]
fn with_failover_off_a_port_down_is_left_to_rc_and_an_error_fails_the_connection() {
    let mut p = Pair::new(Opts::default());
    // No other rail may take the traffic: RC's retries decide, as with NCCL's IB transport.
    p.s.handle_event(p.now, Event::RailDown { rail: SUP }).expect("the sender waits");
    p.r.handle_event(Event::RailDown { rail: SOUT }).expect("the receiver waits");
    assert!(p.s.error().is_none() && p.r.error().is_none());
    let mut fo = FoOut::default();
    let (rid, sid, addr) = transfer(&mut p, 4096, 3);
    settle(&mut p, &mut fo).unwrap();
    assert_eq!(p.test_send(sid).unwrap(), Some(4096), "the port came back: traffic carries on");
    assert_eq!(p.test_recv(rid).unwrap().unwrap().sizes[0], 4096);
    assert_eq!(p.rs.space.read(addr, 4096), pattern(3, 4096));
    // A port that stays down errors the rail's QPs: that fails the connection.
    let (_, sid, _) = transfer(&mut p, 4096, 4);
    let failed = [SUP, SOUT].into_iter().find(|&r| p.fail_qp(Dir::ToRecv, r, 0, WcStatus::RetryExceeded));
    assert!(failed.is_some(), "a data WRITE on the wire");
    let e = settle(&mut p, &mut fo).unwrap_err();
    assert!(e.to_string().contains("RETRY_EXC_ERR"), "{e}");
    assert!(p.test_send(sid).is_err());
}
