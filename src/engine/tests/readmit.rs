//! Rail re-admission (DESIGN.md "Rail failover", Re-admission), sans-IO: a failed rail is
//! rebuilt (new QPs on both sides, records exchanged over the surviving rail's control
//! ring), probed and used again with exact bytes; a failed attempt backs off, doubling;
//! a rail that flaps (fails during and after its re-admission) stays exact; a message of
//! an attempt given up arrives late and changes nothing.

use super::faults::*;
use super::harness::*;
use crate::engine::{Action, QpRef, RailState, SOUT, SUP, WrKind};
use crate::fabric::{WcStatus, WrOpcode};
use crate::split::{AnySplit, Fixed};

pub(super) const MS: u64 = 1_000_000;

pub(super) fn pair() -> (Pair, FoOut) {
    let mut p = Pair::new(Opts { split: AnySplit::Fixed(Fixed::percent(50)), ..Opts::default() });
    enable_failover(&mut p, 0);
    enable_readmit(&mut p, 100 * MS, 800 * MS);
    (p, FoOut::default())
}

/// One cycle of everything (the plugin's round, every wire but `hold`, CQ polls).
pub(super) fn cycle(p: &mut Pair, fo: &mut FoOut, hold: Option<(Dir, usize)>) {
    p.refill();
    p.pump_failover(fo).expect("failover round");
    deliver(p, hold);
}

/// Every wire but `hold` run dry, then both sides' CQs polled.
pub(super) fn deliver(p: &mut Pair, hold: Option<(Dir, usize)>) {
    loop {
        let mut moved = false;
        for dir in [Dir::ToSend, Dir::ToRecv] {
            for rail in [SOUT, SUP] {
                if hold == Some((dir, rail)) {
                    continue;
                }
                for qp in 0..p.wires[dir as usize][rail].len() {
                    while p.step(dir, rail, qp) {
                        moved = true;
                    }
                }
            }
        }
        if !moved {
            break;
        }
    }
    p.poll_send().expect("sender's completions");
    p.poll_recv().expect("receiver's completions");
}

pub(super) fn settle(p: &mut Pair, fo: &mut FoOut) {
    for _ in 0..20 {
        cycle(p, fo, None);
    }
}

/// `n` transfers of `size` bytes (patterns `seed..`), run to completion with exact bytes
/// and sizes.
pub(super) fn exact_transfers(p: &mut Pair, fo: &mut FoOut, size: usize, seed: u64, n: u64) {
    let recvs: Vec<_> = (0..n).map(|_| p.irecv_one(size)).collect();
    settle(p, fo);
    let sends: Vec<_> = (0..n)
        .map(|i| {
            let sa = p.send_buf(&pattern(seed + i, size));
            p.isend(sbuf(sa, size as u64, 0)).unwrap().expect("CTS delivered")
        })
        .collect();
    settle(p, fo);
    for (i, ((rid, ra), sid)) in recvs.into_iter().zip(sends).enumerate() {
        assert_eq!(p.test_send(sid).unwrap(), Some(size as u64), "send {i}");
        assert_eq!(p.test_recv(rid).unwrap().map(|d| d.sizes[0]), Some(size as u64), "receive {i}");
        assert_eq!(p.rs.space.read(ra, size), pattern(seed + i as u64, size), "bytes of transfer {i}");
    }
}

/// Data WRITE_WITH_IMMs the sender posted on `rail` from log index `from` on.
pub(super) fn data_imms_on(p: &Pair, rail: usize, from: usize) -> usize {
    p.log[from..]
        .iter()
        .filter(|(d, r, _, w)| {
            *d == Dir::ToRecv
                && *r == rail
                && w.opcode == WrOpcode::WriteImm
                && WrKind::decode(w.wr_id).unwrap().0 == WrKind::DataSignal
        })
        .count()
}

/// Fails the sender's SOUT QP with a transfer in flight on it; settles the failover.
fn fail_sout_mid_transfer(p: &mut Pair, fo: &mut FoOut, seed: u64) {
    let size = 8192;
    let (rid, ra) = p.irecv_one(size);
    while p.step(Dir::ToSend, SOUT, 0) | p.step(Dir::ToSend, SUP, 0) {}
    let sa = p.send_buf(&pattern(seed, size));
    let sid = p.isend(sbuf(sa, size as u64, 0)).unwrap().expect("CTS delivered");
    assert!(p.fail_qp(Dir::ToRecv, SOUT, 0, WcStatus::RetryExceeded), "SOUT's part fails");
    settle(p, fo);
    assert_eq!(p.test_send(sid).unwrap(), Some(size as u64), "replayed on SUP");
    assert_eq!(p.test_recv(rid).unwrap().map(|d| d.sizes[0]), Some(size as u64));
    assert_eq!(p.rs.space.read(ra, size), pattern(seed, size));
}

pub(super) fn sender_rebuilds(p: &Pair) -> usize {
    p.rb.actions.iter().filter(|(side, a)| *side == SEND_SIDE && matches!(a, Action::RebuildQps { .. })).count()
}

#[test]
fn a_failed_rail_is_readmitted_and_carries_exact_bytes_again() {
    let (mut p, mut fo) = pair();
    exact_transfers(&mut p, &mut fo, 4096, 10, 4);
    fail_sout_mid_transfer(&mut p, &mut fo, 20);
    assert!(matches!(p.s.rail_states()[SOUT], RailState::Failed { epoch: 0, fenced: true }));
    let before = p.log.len();
    exact_transfers(&mut p, &mut fo, 4096, 30, 4);
    assert_eq!(data_imms_on(&p, SOUT, before), 0, "nothing on SOUT while it is down");
    assert_eq!(sender_rebuilds(&p), 0, "not before the back-off");

    p.now += 101 * MS;
    settle(&mut p, &mut fo);
    assert_eq!(p.s.rail_states(), [RailState::Up; 2], "sender: SOUT Up again");
    assert_eq!(p.r.rail_states(), [RailState::Up; 2], "receiver: SOUT Up again");
    let seen: Vec<_> = p.rb.actions.iter().filter(|(_, a)| !matches!(a, Action::FenceQps { .. })).collect();
    let kinds: Vec<_> = seen
        .iter()
        .map(|(side, a)| {
            (*side, matches!(a, Action::RebuildQps { rail: SOUT }), matches!(a, Action::ConnectQps { rail: SOUT, .. }))
        })
        .collect();
    assert_eq!(
        kinds,
        [(SEND_SIDE, true, false), (RECV_SIDE, true, false), (RECV_SIDE, false, true), (SEND_SIDE, false, true)],
        "sender rebuilds, receiver rebuilds and answers, both connect"
    );
    let probes = |dir: Dir| {
        p.log
            .iter()
            .filter(|(d, r, _, w)| {
                *d == dir && *r == SOUT && WrKind::decode(w.wr_id).unwrap().0 == WrKind::ReadmitProbe
            })
            .count()
    };
    assert_eq!((probes(Dir::ToRecv), probes(Dir::ToSend)), (3, 1), "3 probes from the sender, 1 keepalive back");
    for (c, side) in [(p.s.failover_counts(), "send"), (p.r.failover_counts(), "recv")] {
        assert_eq!((c.failovers, c.readmissions, c.readmit_failures), (1, 1, 0), "{side}");
    }
    assert_eq!((p.s.counters()[SOUT].readmissions, p.r.counters()[SOUT].readmissions), (1, 1));
    assert_eq!(p.s.counters()[SUP].readmissions, 0);

    let before = p.log.len();
    exact_transfers(&mut p, &mut fo, 4096, 40, 6);
    assert_eq!(data_imms_on(&p, SOUT, before), 6, "the split uses SOUT again");
    // Those receives' CTS followed the last data (SUP alone); once split data arrived, the
    // CTS alternate again.
    let before = p.log.len();
    exact_transfers(&mut p, &mut fo, 4096, 50, 4);
    let cts_on_sout = p.log[before..]
        .iter()
        .filter(|(d, r, _, w)| *d == Dir::ToSend && *r == SOUT && WrKind::decode(w.wr_id).unwrap().0 == WrKind::Cts)
        .count();
    assert!(cts_on_sout > 0, "the receiver writes CTS on SOUT again");
}

/// A sender whose requests are always done when it tests them makes no call that waits:
/// only its timer runs a round (the plugin's successful isend). Once an attempt started,
/// the timer says "now" until it ends, so the attempt's steps (the receiver's `Rebuilt`,
/// the connected QPs, the probes) are taken at once, not each at a later timer (the drill's
/// returns took 270-520 ms, one round of `MPIB_STALL_MS / 4` per step, before).
#[test]
fn a_sender_that_never_waits_readmits_without_time_passing() {
    let (mut p, mut fo) = pair();
    exact_transfers(&mut p, &mut fo, 4096, 10, 2);
    fail_sout_mid_transfer(&mut p, &mut fo, 20);
    p.rb.sender_never_waits = true;
    p.now += 101 * MS;
    let mut next = 0;
    for _ in 0..20 {
        p.refill();
        p.pump_failover_gated(&mut fo, Some(&mut next)).expect("failover round");
        deliver(&mut p, None);
    }
    assert_eq!(p.s.rail_states(), [RailState::Up; 2], "sender: SOUT Up again, the clock unmoved");
    assert_eq!(p.r.rail_states(), [RailState::Up; 2], "receiver: SOUT Up again");
    assert_eq!(p.s.failover_timer_ns(), u64::MAX, "no round due once the rail is Up");
    exact_transfers(&mut p, &mut fo, 4096, 30, 4);
}

#[test]
fn a_failed_readmission_backs_off_doubling_and_retries() {
    let (mut p, mut fo) = pair();
    exact_transfers(&mut p, &mut fo, 1000, 1, 2);
    p.rb.refuse[SOUT] = 3; // the rail stays down for three attempts
    let t0 = p.now;
    fail_sout_mid_transfer(&mut p, &mut fo, 2);
    let mut starts = Vec::new();
    for _ in 0..400 {
        p.now += 5 * MS;
        let n = sender_rebuilds(&p);
        cycle(&mut p, &mut fo, None);
        if sender_rebuilds(&p) > n {
            starts.push((p.now - t0) / MS);
        }
    }
    // Attempts at ~100, +200, +400, +800 (the cap) ms after the fence.
    assert_eq!(starts.len(), 4, "three refused, the fourth re-admits: {starts:?}");
    let gaps: Vec<_> = starts.windows(2).map(|w| w[1] - w[0]).collect();
    assert!((100..=110).contains(&starts[0]), "first after MPIB_READMIT_MS: {starts:?}");
    for (gap, want) in gaps.iter().zip([200, 400, 800]) {
        assert!((want..want + 10).contains(gap), "back-off doubles to the cap: {gaps:?}");
    }
    assert_eq!(p.s.rail_states()[SOUT], RailState::Up);
    assert_eq!(p.r.rail_states()[SOUT], RailState::Up);
    let c = p.s.failover_counts();
    assert_eq!((c.readmissions, c.readmit_failures), (1, 3));
    assert_eq!(p.r.failover_counts().readmit_failures, 0, "refused before the receiver heard of them");
    let before = p.log.len();
    exact_transfers(&mut p, &mut fo, 1000, 3, 4);
    assert_eq!(data_imms_on(&p, SOUT, before), 4);
}

#[test]
fn a_flapping_rail_stays_exact() {
    let (mut p, mut fo) = pair();
    exact_transfers(&mut p, &mut fo, 3000, 100, 3);
    fail_sout_mid_transfer(&mut p, &mut fo, 101);
    // The first attempt fails while probing: a probe WRITE of the new QPs fails.
    p.now += 101 * MS;
    let mut failed_probe = false;
    for _ in 0..20 {
        p.refill();
        p.pump_failover(&mut fo).unwrap();
        let probe_queued = p.wires[Dir::ToRecv as usize][SOUT][0]
            .q
            .front()
            .is_some_and(|(_, w)| WrKind::decode(w.wr_id).unwrap().0 == WrKind::ReadmitProbe);
        if probe_queued {
            assert!(p.fail_qp(Dir::ToRecv, SOUT, 0, WcStatus::RetryExceeded));
            failed_probe = true;
            break;
        }
        deliver(&mut p, None);
    }
    assert!(failed_probe, "the attempt reached its probes");
    settle(&mut p, &mut fo);
    assert!(matches!(p.s.rail_states()[SOUT], RailState::Failed { epoch: 1, fenced: true }), "{:?}", p.s.rail_states());
    assert!(matches!(p.r.rail_states()[SOUT], RailState::Failed { epoch: 1, fenced: true }), "{:?}", p.r.rail_states());
    exact_transfers(&mut p, &mut fo, 3000, 110, 3);
    // The next attempt waits twice as long, then succeeds at epoch 2.
    p.now += 150 * MS;
    settle(&mut p, &mut fo);
    assert!(matches!(p.s.rail_states()[SOUT], RailState::Failed { .. }), "not before 200 ms");
    p.now += 60 * MS;
    settle(&mut p, &mut fo);
    assert_eq!(p.s.rail_states(), [RailState::Up; 2]);
    assert_eq!(p.r.rail_states(), [RailState::Up; 2]);
    // It fails again with traffic on it, and comes back again.
    exact_transfers(&mut p, &mut fo, 3000, 120, 3);
    fail_sout_mid_transfer(&mut p, &mut fo, 130);
    exact_transfers(&mut p, &mut fo, 3000, 140, 3);
    p.now += 500 * MS;
    settle(&mut p, &mut fo);
    assert_eq!(p.s.rail_states(), [RailState::Up; 2]);
    assert_eq!(p.r.rail_states(), [RailState::Up; 2]);
    let before = p.log.len();
    exact_transfers(&mut p, &mut fo, 3000, 150, 4);
    assert_eq!(data_imms_on(&p, SOUT, before), 4);
    let (s, r) = (p.s.failover_counts(), p.r.failover_counts());
    assert_eq!((s.failovers, s.readmissions, s.readmit_failures), (2, 2, 1));
    // The receiver's keepalive on the new QPs had completed before the sender's probe
    // failed: for it the rail was Up at epoch 1, and then failed like any rail.
    assert_eq!((r.failovers, r.readmissions, r.readmit_failures), (3, 3, 0));
    assert_eq!((p.s.counters()[SOUT].failovers, p.s.counters()[SOUT].readmissions), (2, 2));
}

#[test]
fn a_late_rebuilt_of_an_attempt_given_up_changes_nothing() {
    let (mut p, mut fo) = pair();
    exact_transfers(&mut p, &mut fo, 2048, 200, 2);
    fail_sout_mid_transfer(&mut p, &mut fo, 201);
    p.now += 101 * MS;
    // The receiver's control writes travel on its SUP CTS QP: hold them, so that its
    // Rebuilt never reaches the sender in time.
    let hold = Some((Dir::ToSend, SUP));
    for _ in 0..10 {
        cycle(&mut p, &mut fo, hold);
    }
    assert!(matches!(p.s.rail_states()[SOUT], RailState::Rebuilding { epoch: 1 }));
    assert!(matches!(p.r.rail_states()[SOUT], RailState::Probing { epoch: 1 }), "{:?}", p.r.rail_states());
    // The attempt times out at the sender: SOUT fails at epoch 1 (RailDown{1} goes out).
    p.now += 10_001 * MS;
    for _ in 0..5 {
        cycle(&mut p, &mut fo, hold);
    }
    assert!(matches!(p.s.rail_states()[SOUT], RailState::Failed { epoch: 1, fenced: false }));
    let connects = |p: &Pair| {
        p.rb.actions.iter().filter(|(s, a)| *s == SEND_SIDE && matches!(a, Action::ConnectQps { .. })).count()
    };
    // Now the late Rebuilt{1} arrives, then the receiver's Fenced{1}: the first is ignored
    // (no connect to the given-up QPs), the second settles the failure.
    settle(&mut p, &mut fo);
    assert_eq!(connects(&p), 0, "a late Rebuilt connects nothing");
    assert!(matches!(p.s.rail_states()[SOUT], RailState::Failed { epoch: 1, fenced: true }));
    assert!(matches!(p.r.rail_states()[SOUT], RailState::Failed { epoch: 1, fenced: true }));
    exact_transfers(&mut p, &mut fo, 2048, 210, 3);
    p.now += 201 * MS;
    settle(&mut p, &mut fo);
    assert_eq!(p.s.rail_states(), [RailState::Up; 2]);
    assert_eq!(p.r.rail_states(), [RailState::Up; 2]);
    assert_eq!(connects(&p), 1);
    let before = p.log.len();
    exact_transfers(&mut p, &mut fo, 2048, 220, 4);
    assert_eq!(data_imms_on(&p, SOUT, before), 4);
}

#[test]
fn the_surviving_rail_failing_during_a_readmission_fails_the_connection() {
    let (mut p, mut fo) = pair();
    exact_transfers(&mut p, &mut fo, 2048, 300, 2);
    fail_sout_mid_transfer(&mut p, &mut fo, 301);
    p.now += 101 * MS;
    p.refill();
    p.pump_failover(&mut fo).unwrap();
    assert!(matches!(p.s.rail_states()[SOUT], RailState::Rebuilding { .. }));
    let (rid, _) = p.irecv_one(100);
    // SUP's port going down is left to RC: SUP is all there is.
    p.r.handle_event(crate::engine::Event::RailDown { rail: SUP }).expect("receiver: waits for RC");
    p.s.handle_event(p.now, crate::engine::Event::RailDown { rail: SUP }).expect("sender: waits for RC");
    assert_eq!(p.s.rail_states()[SUP], RailState::Up);
    assert_eq!(p.r.rail_states()[SUP], RailState::Up);
    // It stays down: RC errors SUP's QPs; the receiver's next keepalive fails on them.
    p.fence(SEND_SIDE, SUP);
    p.fence(RECV_SIDE, SUP);
    let mut failed = false;
    for _ in 0..6 {
        p.now += crate::engine::KEEPALIVE_NS + 1;
        p.keepalive();
        failed |= p.poll_recv().is_err() | p.pump_failover(&mut fo).is_err();
    }
    assert!(failed, "the receiver learns that SUP is gone");
    assert!(p.test_recv(rid).is_err(), "every later call fails, no hang");
}

/// A rail of many QPs comes back whole: its records (26 words here, what 16 QPs take) cross
/// the control ring intact (the plugin's connect checks them), every new data QP is probed
/// before the rail is Up, and data uses all of them again with exact bytes.
#[test]
fn a_rail_of_many_qps_is_readmitted_with_every_data_qp_probed() {
    for qps in [[4, 4], [16, 2]] {
        let mut p = Pair::new(Opts { qps, ..Opts::default() });
        enable_failover(&mut p, 0);
        enable_readmit(&mut p, 100 * MS, 800 * MS);
        let mut fo = FoOut::default();
        exact_transfers(&mut p, &mut fo, 4096, 10, 3);
        // A transfer in flight on whichever SOUT QP it took, that QP failing under it.
        let size = 8192;
        let (rid, ra) = p.irecv_one(size);
        while p.step(Dir::ToSend, SOUT, 0) | p.step(Dir::ToSend, SUP, 0) {}
        let sa = p.send_buf(&pattern(20, size));
        let sid = p.isend(sbuf(sa, size as u64, 0)).unwrap().expect("CTS delivered");
        let qp = (0..qps[SOUT] as usize).find(|&q| !p.wires[Dir::ToRecv as usize][SOUT][q].q.is_empty());
        assert!(p.fail_qp(Dir::ToRecv, SOUT, qp.expect("SOUT carries a part"), WcStatus::RetryExceeded));
        settle(&mut p, &mut fo);
        assert_eq!(p.test_send(sid).unwrap(), Some(size as u64), "{qps:?}: replayed on SUP");
        assert_eq!(p.test_recv(rid).unwrap().map(|d| d.sizes[0]), Some(size as u64));
        assert_eq!(p.rs.space.read(ra, size), pattern(20, size));
        assert!(matches!(p.s.rail_states()[SOUT], RailState::Failed { epoch: 0, fenced: true }), "{qps:?}");

        let before = p.log.len();
        p.now += 101 * MS;
        settle(&mut p, &mut fo);
        assert_eq!(p.s.rail_states(), [RailState::Up; 2], "{qps:?}: sender: SOUT Up again");
        assert_eq!(p.r.rail_states(), [RailState::Up; 2], "{qps:?}: receiver: SOUT Up again");
        let mut probed: Vec<_> = p.log[before..]
            .iter()
            .filter(|(d, r, _, w)| {
                *d == Dir::ToRecv && *r == SOUT && WrKind::decode(w.wr_id).unwrap().0 == WrKind::ReadmitProbe
            })
            .map(|(_, _, q, _)| *q)
            .collect();
        probed.dedup();
        let all: Vec<_> = (0..qps[SOUT]).map(QpRef::Data).collect();
        assert_eq!(probed, all, "{qps:?}: every new data QP probed once at least");

        let before = p.log.len();
        let n = 2 * qps[SOUT] as u64;
        exact_transfers(&mut p, &mut fo, 4096, 30, n);
        assert_eq!(data_imms_on(&p, SOUT, before), n as usize, "{qps:?}: SOUT carries its parts again");
        let mut used: Vec<_> = p.log[before..]
            .iter()
            .filter(|(d, r, _, w)| {
                *d == Dir::ToRecv && *r == SOUT && WrKind::decode(w.wr_id).unwrap().0 == WrKind::DataSignal
            })
            .map(|(_, _, q, _)| *q)
            .collect();
        used.sort_by_key(|q| match q {
            QpRef::Data(i) => *i,
            _ => u16::MAX,
        });
        used.dedup();
        assert_eq!(used, all, "{qps:?}: data on every rebuilt QP");
        let (s, r) = (p.s.failover_counts(), p.r.failover_counts());
        assert_eq!((s.failovers, s.readmissions, r.readmissions), (1, 1, 1), "{qps:?}");
    }
}
