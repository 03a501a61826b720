//! A total outage (DESIGN.md "Rail failover", Outage), sans-IO: both rails' links go
//! down with transfers in flight, on both rails, in both directions. Within the grace
//! nothing errors: control messages go over the set-up channel (the harness relays
//! [`Action::ControlOob`] at once), re-admission is tried while the ports are down, and
//! when the links come back the first rail re-admitted carries everything that was
//! missing — exact bytes, every request completed. Past the grace every request fails.

use super::faults::*;
use super::harness::*;
use super::readmit::{MS, exact_transfers};
use crate::engine::{Action, Event, RailState, SOUT, SUP};
use crate::fabric::WcStatus;
use crate::split::{AnySplit, Fixed};

const GRACE_MS: u64 = 2_000;

fn pair(grace_ms: u64) -> (Pair, FoOut) {
    let mut p = Pair::new(Opts { split: AnySplit::Fixed(Fixed::percent(50)), ..Opts::default() });
    enable_failover(&mut p, 0);
    enable_readmit(&mut p, 100 * MS, 400 * MS);
    p.s.failover_config_mut().outage_grace_ns = grace_ms * MS;
    p.r.failover_config_mut().outage_grace_ns = grace_ms * MS;
    (p, FoOut::default())
}

/// One round of the plugin, then every wire: the rails in `down` fail whatever they carry
/// (their link is gone: retries exhausted), and their ports refuse re-admission.
fn cycle(p: &mut Pair, fo: &mut FoOut, down: [bool; 2]) -> crate::Result<()> {
    cycle_holding(p, fo, down, |_| None)
}

/// [`cycle`], the wires of the rail `hold` names after the round left as they are (their
/// WRs in flight).
fn cycle_holding(
    p: &mut Pair,
    fo: &mut FoOut,
    down: [bool; 2],
    hold: impl Fn(&Pair) -> Option<usize>,
) -> crate::Result<()> {
    p.rb.port_down = down;
    p.refill();
    p.pump_failover(fo)?;
    let hold = hold(p);
    loop {
        let mut moved = false;
        for dir in [Dir::ToSend, Dir::ToRecv] {
            for rail in [SOUT, SUP] {
                if hold == Some(rail) {
                    continue;
                }
                for qp in 0..p.wires[dir as usize][rail].len() {
                    if down[rail] {
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
    p.poll_send()?;
    p.poll_recv()
}

/// Transfers posted with both rails carrying parts, then both links cut before any of
/// them ran: (receive id, buffer, send id, pattern seed) of each.
fn cut_mid_transfers(p: &mut Pair, fo: &mut FoOut, n: u64, size: usize) -> Vec<(u16, u64, u16, u64)> {
    let recvs: Vec<_> = (0..n).map(|_| p.irecv_one(size)).collect();
    cycle(p, fo, [false; 2]).unwrap();
    let mut out = Vec::new();
    for (i, (rid, ra)) in recvs.into_iter().enumerate() {
        let seed = 100 + i as u64;
        let sa = p.send_buf(&pattern(seed, size));
        let sid = p.isend(sbuf(sa, size as u64, 0)).unwrap().expect("CTS delivered");
        out.push((rid, ra, sid, seed));
    }
    out
}

fn both_failed(s: [RailState; 2]) -> bool {
    s.iter().all(|r| *r != RailState::Up)
}

#[test]
fn both_links_down_within_the_grace_loses_nothing_and_errors_nothing() {
    let (mut p, mut fo) = pair(GRACE_MS);
    exact_transfers(&mut p, &mut fo, 4096, 1, 4);
    let size = 10_000;
    let xfers = cut_mid_transfers(&mut p, &mut fo, 3, size);
    // 1.5 s without a working rail, in rounds 10 ms apart: requests wait, nothing fails.
    for _ in 0..150 {
        cycle(&mut p, &mut fo, [true; 2]).expect("no error within the grace");
        p.now += 10 * MS;
    }
    assert!(both_failed(p.s.rail_states()) && both_failed(p.r.rail_states()));
    for &(rid, _, sid, _) in &xfers {
        assert_eq!(p.test_send(sid).unwrap(), None, "sends wait");
        assert_eq!(p.test_recv(rid).unwrap(), None, "receives wait");
    }
    let oob = p.rb.actions.iter().filter(|(_, a)| matches!(a, Action::ControlOob { .. })).count();
    assert!(oob >= 4, "reports and re-admission went over the set-up channel ({oob} messages)");
    // A send matched meanwhile is held, and posted once a rail is back.
    let (rid, ra) = p.irecv_one(size);
    let sa = p.send_buf(&pattern(9, size));
    // (The receiver's CTS is lost with the rails: it is re-posted once one is back.)
    assert_eq!(p.isend(sbuf(sa, size as u64, 0)).unwrap(), None, "no CTS reached the sender");
    // The links come back: the first rail re-admitted carries what was missing.
    for _ in 0..100 {
        cycle(&mut p, &mut fo, [false; 2]).expect("no error after the outage");
        p.now += 10 * MS;
    }
    let sid = p.isend(sbuf(sa, size as u64, 0)).unwrap().expect("the CTS came again");
    for _ in 0..20 {
        cycle(&mut p, &mut fo, [false; 2]).unwrap();
        p.now += 10 * MS;
    }
    for &(rid, ra, sid, seed) in xfers.iter().chain([(rid, ra, sid, 9)].iter()) {
        assert_eq!(p.test_send(sid).unwrap(), Some(size as u64), "send of pattern {seed}");
        assert_eq!(p.test_recv(rid).unwrap().map(|d| d.sizes[0]), Some(size as u64));
        assert_eq!(p.rs.space.read(ra, size), pattern(seed, size), "bytes of pattern {seed}");
    }
    assert_eq!(p.s.rail_states(), [RailState::Up; 2], "both rails re-admitted");
    assert_eq!(p.r.rail_states(), [RailState::Up; 2]);
    assert!(p.s.failover_counts().replayed_parts >= 3, "the missing parts were sent again");
    exact_transfers(&mut p, &mut fo, 6000, 40, 4);
}

#[test]
fn past_the_grace_every_request_fails_and_later_calls_too() {
    let (mut p, mut fo) = pair(500);
    let xfers = cut_mid_transfers(&mut p, &mut fo, 2, 8192);
    let mut failed = None;
    for i in 0..200 {
        if let Err(e) = cycle(&mut p, &mut fo, [true; 2]) {
            failed = Some((i, e));
            break;
        }
        p.now += 10 * MS;
    }
    let (i, e) = failed.expect("the connection fails past the grace");
    assert!((45..=60).contains(&i), "failed after {i} rounds of 10 ms for a 500 ms grace");
    assert!(e.to_string().contains("both rails have failed"), "{e}");
    for &(rid, _, sid, _) in &xfers {
        let es = p.test_send(sid).expect_err("the send fails");
        let er = p.test_recv(rid);
        assert!(es.to_string().contains("both rails"), "{es}");
        assert!(er.is_err() || p.r.error().is_none(), "the receive fails once its side sees the grace out");
    }
    assert!(p.isend(sbuf(0, 8, 0)).is_err(), "a later isend fails");
}

#[test]
fn with_no_grace_both_rails_down_fails_at_once() {
    let (mut p, mut fo) = pair(0);
    let _ = cut_mid_transfers(&mut p, &mut fo, 2, 8192);
    let e = (0..10).find_map(|_| cycle(&mut p, &mut fo, [true; 2]).err()).expect("fails");
    assert!(e.to_string().contains("both rails have failed"), "{e}");
    assert!(!p.rb.actions.iter().any(|(_, a)| matches!(a, Action::ControlOob { .. })), "no outage without a grace");
}

#[test]
fn a_peer_that_closes_its_end_during_an_outage_fails_the_connection_at_once() {
    let (mut p, mut fo) = pair(60_000);
    let xfers = cut_mid_transfers(&mut p, &mut fo, 1, 8192);
    for _ in 0..10 {
        cycle(&mut p, &mut fo, [true; 2]).unwrap();
        p.now += 10 * MS;
    }
    // The receiving process is gone: its end of the set-up channel closed.
    let e = p.s.handle_event(p.now, Event::PeerGone).expect_err("fails at once");
    assert!(e.to_string().contains("closed the connection while both rails were down"), "{e}");
    assert!(p.test_send(xfers[0].2).is_err());
}

#[test]
fn a_peer_closing_its_end_while_a_rail_works_is_no_news() {
    let (mut p, mut fo) = pair(60_000);
    p.s.handle_event(p.now, Event::PeerGone).unwrap();
    p.r.handle_event(Event::PeerGone).unwrap();
    exact_transfers(&mut p, &mut fo, 4096, 3, 2);
}

#[test]
fn a_replay_on_the_rail_that_fails_second_is_settled_by_its_report() {
    // SOUT fails first; its parts are replayed on SUP; SUP fails with those replays in
    // flight: SUP's report says which replayed parts arrived (the other part's bitmap), the
    // rest wait for a rail and go out once SOUT is back.
    let (mut p, mut fo) = pair(GRACE_MS);
    let size = 10_000;
    let xfers = cut_mid_transfers(&mut p, &mut fo, 3, size);
    // SUP's wires are held from the round that posts the replays on.
    let replaying = |p: &Pair| (p.s.failover_counts().replayed_parts > 0).then_some(SUP);
    for _ in 0..8 {
        cycle_holding(&mut p, &mut fo, [true, false], replaying).unwrap();
    }
    let replays = p.s.failover_counts().replayed_parts;
    assert!(replays >= 1, "SOUT's parts replayed on SUP");
    assert!(p.wire_any(Dir::ToRecv, |rail, _| rail == SUP), "the replays are in flight on SUP");
    for _ in 0..100 {
        cycle(&mut p, &mut fo, [true; 2]).expect("within the grace");
        p.now += 10 * MS;
    }
    for _ in 0..100 {
        cycle(&mut p, &mut fo, [false; 2]).expect("after the outage");
        p.now += 10 * MS;
    }
    for &(rid, ra, sid, seed) in &xfers {
        assert_eq!(p.test_send(sid).unwrap(), Some(size as u64));
        assert_eq!(p.test_recv(rid).unwrap().map(|d| d.sizes[0]), Some(size as u64));
        assert_eq!(p.rs.space.read(ra, size), pattern(seed, size), "bytes of pattern {seed}");
    }
}
