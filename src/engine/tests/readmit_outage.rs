//! Re-admission across a real link outage (what Soft-RoCE showed), sans-IO: the
//! SUP link goes down under traffic and stays down through the first re-admission attempt,
//! so both sides' new QPs fail — the receiver's keepalive, the sender's probes, in either
//! order or together — and then the link works again. The rail must come back at a later
//! attempt, with exact bytes before, during and after.

use super::faults::*;
use super::harness::*;
use super::readmit::{MS, data_imms_on, exact_transfers, pair, settle};
use crate::engine::{Action, Event, RailState, SOUT, SUP};
use crate::fabric::WcStatus;

/// Which side's new QPs of the dead rail see their failure first.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Order {
    /// The receiver's keepalive fails, its `Fenced` reaches the sender before the sender's
    /// probes fail (what rxe showed).
    RecvFirst,
    /// The sender's probes fail, its `RailDown` reaches the receiver before the receiver's
    /// keepalive fails.
    SendFirst,
    /// Both in the same round.
    Together,
}

/// The SUP link as the wires see it: the directions whose WRs fail (never placed, retries
/// exhausted) and the one held back (its WRs wait, as a requester still retrying does).
#[derive(Clone, Copy, Default)]
struct Link {
    down: [bool; 2],
    held: Option<Dir>,
}

impl Link {
    const UP: Link = Link { down: [false; 2], held: None };
    const DOWN: Link = Link { down: [true; 2], held: None };
}

/// One cycle: the plugin's round (the sender's gated as with `MPIB_STALL_MS=0`, the rxe
/// suite's setting), then every wire: SUP's as `link` says.
fn cycle(p: &mut Pair, fo: &mut FoOut, link: Link) {
    p.refill();
    let mut next = p.rb.next_round_ns;
    p.pump_failover_gated(fo, Some(&mut next)).expect("failover round");
    p.rb.next_round_ns = next;
    loop {
        let mut moved = false;
        for dir in [Dir::ToSend, Dir::ToRecv] {
            for rail in [SOUT, SUP] {
                let sup = rail == SUP;
                if sup && link.held == Some(dir) {
                    continue;
                }
                for qp in 0..p.wires[dir as usize][rail].len() {
                    if sup && link.down[dir as usize] {
                        moved |= p.fail_qp(dir, rail, qp, WcStatus::RetryExceeded);
                    } else {
                        while p.step(dir, rail, qp) {
                            moved = true;
                        }
                    }
                }
            }
        }
        if !moved {
            break;
        }
    }
    // As the plugin's sender polls on verbs (`SendComm::test`): only the CQs of its busy
    // rails (the receiver polls both).
    for rail in p.s.busy_rails().iter() {
        while let Some(c) = p.cq_s[rail].pop_front() {
            p.s.handle_completion(p.now, rail, &c).expect("sender's completions");
        }
    }
    p.poll_recv().expect("receiver's completions");
}

/// `n` transfers of `size` bytes run through `link` (re-chosen each cycle by `policy`),
/// with exact bytes and sizes.
fn transfers_through(p: &mut Pair, fo: &mut FoOut, seed: u64, n: u64, mut policy: impl FnMut(&Pair) -> Link) {
    let size = 5000;
    let recvs: Vec<_> = (0..n).map(|_| p.irecv_one(size)).collect();
    for _ in 0..10 {
        let link = policy(p);
        cycle(p, fo, link);
    }
    let sends: Vec<_> = (0..n)
        .map(|i| {
            let sa = p.send_buf(&pattern(seed + i, size));
            p.isend(sbuf(sa, size as u64, 0)).unwrap().expect("CTS delivered")
        })
        .collect();
    for _ in 0..30 {
        let link = policy(p);
        cycle(p, fo, link);
        p.now += MS;
    }
    for (i, ((rid, ra), sid)) in recvs.into_iter().zip(sends).enumerate() {
        assert_eq!(p.test_send(sid).unwrap(), Some(size as u64), "send {i}");
        assert_eq!(p.test_recv(rid).unwrap().map(|d| d.sizes[0]), Some(size as u64), "receive {i}");
        assert_eq!(p.rs.space.read(ra, size), pattern(seed + i as u64, size), "bytes of transfer {i}");
    }
}

fn failed_at(s: RailState, e: u32) -> bool {
    matches!(s, RailState::Failed { epoch, .. } if epoch == e)
}

fn outage(order: Order) {
    let (mut p, mut fo) = pair();
    exact_transfers(&mut p, &mut fo, 4096, 1, 4);
    // The link goes down with a transfer in flight; both ports report it.
    let (rid, ra) = p.irecv_one(8192);
    while p.step(Dir::ToSend, SOUT, 0) | p.step(Dir::ToSend, SUP, 0) {}
    let sa = p.send_buf(&pattern(2, 8192));
    let sid = p.isend(sbuf(sa, 8192, 0)).unwrap().expect("CTS delivered");
    p.s.handle_event(p.now, Event::RailDown { rail: SUP }).unwrap();
    p.r.handle_event(Event::RailDown { rail: SUP }).unwrap();
    for _ in 0..20 {
        cycle(&mut p, &mut fo, Link::DOWN);
    }
    assert_eq!(p.test_send(sid).unwrap(), Some(8192));
    assert_eq!(p.test_recv(rid).unwrap().map(|d| d.sizes[0]), Some(8192));
    assert_eq!(p.rs.space.read(ra, 8192), pattern(2, 8192));
    assert_eq!(p.s.rail_states()[SUP], RailState::Failed { epoch: 0, fenced: true });

    // The first attempt, the link still down: it fails on both sides in the order given.
    p.now += 101 * MS;
    let policy = |p: &Pair| match order {
        Order::Together => Link::DOWN,
        // The sender's probes wait (retrying) until the receiver's report has reached it.
        Order::RecvFirst if !failed_at(p.s.rail_states()[SUP], 1) => Link { held: Some(Dir::ToRecv), ..Link::DOWN },
        Order::SendFirst if !failed_at(p.r.rail_states()[SUP], 1) => Link { held: Some(Dir::ToSend), ..Link::DOWN },
        _ => Link::DOWN,
    };
    transfers_through(&mut p, &mut fo, 10, 6, policy);
    let (s, r) = (p.s.rail_states()[SUP], p.r.rail_states()[SUP]);
    assert!(failed_at(s, 1) && failed_at(r, 1), "{order:?}: the attempt at epoch 1 failed on both sides: {s:?} {r:?}");
    assert!(p.s.failover_counts().readmit_failures >= 1);

    // The link is up again: a later attempt brings SUP back.
    let mut back_ms = None;
    for ms in 0..3000 {
        p.now += MS;
        cycle(&mut p, &mut fo, Link::UP);
        if p.s.rail_states() == [RailState::Up; 2] && p.r.rail_states() == [RailState::Up; 2] {
            back_ms = Some(ms);
            break;
        }
    }
    assert!(
        back_ms.is_some_and(|ms| ms <= 800),
        "{order:?}: SUP re-admitted within the back-off after the link came up: {back_ms:?} ms; {:?} {:?}",
        p.s.rail_states(),
        p.r.rail_states()
    );
    settle(&mut p, &mut fo);
    let (s, r) = (p.s.failover_counts(), p.r.failover_counts());
    assert_eq!((s.readmissions, r.readmissions), (1, 1), "{order:?}");
    assert_eq!(s.failovers, 1, "{order:?}: one failover, then failed attempts");
    let before = p.log.len();
    exact_transfers(&mut p, &mut fo, 4096, 30, 6);
    assert_eq!(data_imms_on(&p, SUP, before), 6, "{order:?}: the split uses SUP again");
}

#[test]
fn readmitted_after_an_outage_the_receiver_noticed_first() {
    outage(Order::RecvFirst);
}

#[test]
fn readmitted_after_an_outage_the_sender_noticed_first() {
    outage(Order::SendFirst);
}

#[test]
fn readmitted_after_an_outage_both_noticed_at_once() {
    outage(Order::Together);
}

/// Verbs knows the port is down (PORT_ERR, no PORT_ACTIVE yet): the sender's attempts are
/// deferred at `MPIB_READMIT_MS` without a `Rebuild`, a failure or a longer back-off, and
/// the first one after the port is active again re-admits the rail.
#[test]
fn attempts_wait_for_the_port_and_readmit_soon_after_it_is_up() {
    let (mut p, mut fo) = pair();
    exact_transfers(&mut p, &mut fo, 4096, 40, 2);
    p.rb.port_down[SUP] = true;
    p.s.handle_event(p.now, Event::RailDown { rail: SUP }).unwrap();
    p.r.handle_event(Event::RailDown { rail: SUP }).unwrap();
    for _ in 0..1500 {
        p.now += MS;
        cycle(&mut p, &mut fo, Link::DOWN);
    }
    let deferred = p.rb.actions.iter().filter(|(side, a)| *side == SEND_SIDE && *a == Action::RebuildQps { rail: SUP });
    let n = deferred.count();
    assert!((13..=16).contains(&n), "an attempt every 100 ms while the port is down: {n}");
    assert_eq!(p.rb.built, [[0; 2]; 2], "no QPs built on a dead port");
    assert_eq!(p.r.rail_states()[SUP], RailState::Failed { epoch: 0, fenced: true }, "no Rebuild reached it");
    assert_eq!(p.s.failover_counts().readmit_failures, 0);
    p.rb.port_down[SUP] = false;
    let mut back_ms = None;
    for ms in 0..1000 {
        p.now += MS;
        cycle(&mut p, &mut fo, Link::UP);
        if p.s.rail_states() == [RailState::Up; 2] && p.r.rail_states() == [RailState::Up; 2] {
            back_ms = Some(ms);
            break;
        }
    }
    assert!(back_ms.is_some_and(|ms| ms <= 101), "the next try after the port is up re-admits: {back_ms:?} ms");
    let before = p.log.len();
    exact_transfers(&mut p, &mut fo, 4096, 50, 4);
    assert_eq!(data_imms_on(&p, SUP, before), 4);
}
