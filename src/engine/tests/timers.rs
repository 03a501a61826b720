//! The engines' own schedule, driven by a fake clock through their public timer interface
//! (`poll_timeout`, `handle_timeout`): an idle-rail probe, a keepalive (sender and
//! receiver), a stall and a re-admission attempt each happen at the time `poll_timeout`
//! names, and a call before it does nothing.

use super::faults::*;
use super::harness::*;
use super::readmit::{MS, settle};
use crate::engine::{Action, Event, KEEPALIVE_NS, Output, RailState, SOUT, SUP, WrKind};
use crate::split::{AnySplit, Fixed};

/// What the sender's `handle_timeout` at `now` emits: the (rail, kind) of each WR of its
/// chains (put on the wires) and its actions.
fn send_round(p: &mut Pair, now: u64) -> (Vec<(usize, WrKind)>, Vec<Action>) {
    p.now = now;
    let mut out = Output::default();
    p.s.handle_timeout(now, &mut p.ss, &mut out).expect("handle_timeout");
    p.enqueue_chains(Dir::ToRecv, &out.chains);
    (kinds(&out), out.actions)
}

fn recv_round(p: &mut Pair, now: u64) -> Vec<(usize, WrKind)> {
    p.now = now;
    let mut out = Output::default();
    p.r.handle_timeout(now, &mut p.rs, &mut out).expect("handle_timeout");
    p.enqueue_chains(Dir::ToSend, &out.chains);
    assert!(out.actions.is_empty());
    kinds(&out)
}

fn kinds(out: &Output) -> Vec<(usize, WrKind)> {
    out.chains
        .iter()
        .flat_map(|c| c.wrs().iter().map(move |w| (c.rail as usize, WrKind::decode(w.wr_id).expect("ours").0)))
        .collect()
}

/// The sender's deadline after a first look at `now` (a new engine's is 0: at once).
fn first_deadline(p: &mut Pair, now: u64) -> u64 {
    assert_eq!(p.s.poll_timeout(), 0, "a new connection looks at once");
    assert_eq!(send_round(p, now), (vec![], vec![]), "nothing is due at its start");
    p.s.poll_timeout()
}

/// Calls before `deadline` (its last nanosecond included) emit nothing.
fn nothing_before(p: &mut Pair, from: u64, deadline: u64) {
    for now in [from, from + (deadline - from) / 3, (from + deadline) / 2, deadline - 1] {
        assert_eq!(send_round(p, now), (vec![], vec![]), "at {now}, before the deadline {deadline}");
    }
}

#[test]
fn an_idle_probe_goes_exactly_when_poll_timeout_says() {
    const INTERVAL: u64 = 10_000;
    let mut p = Pair::new(Opts { probe_ns: INTERVAL, ..Opts::default() });
    let deadline = first_deadline(&mut p, 1);
    assert_eq!(deadline, INTERVAL, "idle since the start: an interval later");
    nothing_before(&mut p, 2, deadline);
    assert_eq!(send_round(&mut p, deadline).0, vec![(SOUT, WrKind::Probe), (SUP, WrKind::Probe)]);
    assert!(p.s.poll_timeout() > deadline, "one probe per rail in flight: the next deadline is later");
}

#[test]
fn a_waiting_senders_keepalive_goes_exactly_when_poll_timeout_says() {
    // Probes off. A send without its CTS makes the caller wait: SOUT (before any transfer)
    // is kept alive every KEEPALIVE_NS of silence.
    let mut p = Pair::new(Opts::default());
    let sa = p.send_buf(&[3; 64]);
    assert_eq!(p.isend(sbuf(sa, 64, 0)).unwrap(), None, "no receive posted: no CTS");
    let deadline = first_deadline(&mut p, 1);
    assert_eq!(deadline, KEEPALIVE_NS);
    nothing_before(&mut p, 2, deadline);
    assert_eq!(send_round(&mut p, deadline).0, vec![(SOUT, WrKind::Probe)]);
    // A caller that does not wait gets none, however long the silence.
    let mut q = Pair::new(Opts::default());
    first_deadline(&mut q, 1);
    for now in [KEEPALIVE_NS, 10 * KEEPALIVE_NS, 1000 * KEEPALIVE_NS] {
        assert_eq!(send_round(&mut q, now), (vec![], vec![]), "nobody waits at {now}: no keepalive");
    }
}

#[test]
fn a_waiting_receivers_keepalive_goes_exactly_when_poll_timeout_says() {
    let mut p = Pair::new(Opts::default());
    assert_eq!(p.r.poll_timeout(), u64::MAX, "no receive outstanding: nothing scheduled");
    p.irecv_one(64);
    assert_eq!(p.r.poll_timeout(), 0, "a receive was posted: the quiet period starts at the next look");
    let t0 = 5 * MS;
    assert_eq!(recv_round(&mut p, t0), vec![]);
    let deadline = p.r.poll_timeout();
    assert_eq!(deadline, t0 + KEEPALIVE_NS);
    for now in [t0 + 1, deadline - 1] {
        assert_eq!(recv_round(&mut p, now), vec![], "at {now}, before the deadline");
    }
    assert_eq!(recv_round(&mut p, deadline), vec![(SOUT, WrKind::Probe)], "one keepalive, SOUT first");
    assert_eq!(p.r.poll_timeout(), u64::MAX, "one keepalive in flight at a time");
}

#[test]
fn a_stalled_rail_fails_at_the_first_check_past_the_stall_bound_and_not_before() {
    const STALL: u64 = 4 * MS;
    let sout_only = AnySplit::Fixed(Fixed::percent(100));
    let mut p = Pair::new(Opts { split: sout_only, ..Opts::default() });
    enable_failover(&mut p, STALL);
    p.irecv_one(4096);
    p.deliver_all();
    p.poll_recv().unwrap();
    let t0 = 10 * MS;
    p.now = t0;
    let sa = p.send_buf(&pattern(1, 4096));
    p.isend(sbuf(sa, 4096, 0)).unwrap().expect("CTS delivered");
    // Its WRITE never completes (nothing is delivered). The stall bound: STALL plus 32 ns a
    // byte; the sender checks every STALL / 4 from its first look.
    let bound = STALL + 4096 * crate::engine::STALL_NS_PER_BYTE;
    let mut now = t0;
    let mut checks = 0;
    loop {
        let (wrs, actions) = send_round(&mut p, now);
        let deadline = p.s.poll_timeout();
        if !actions.is_empty() {
            assert_eq!(actions, vec![Action::FenceQps { rail: SOUT }]);
            assert_eq!(wrs, vec![(SUP, WrKind::Control)], "the receiver is told on the other rail (RailDown)");
            assert!(now - t0 > bound, "failed at {} ns, within the bound {bound}", now - t0);
            assert!(now - t0 - STALL / 4 <= bound, "the check before this one was past the bound already");
            break;
        }
        assert!(wrs.is_empty(), "probes off, nobody else writes: {wrs:?} at {now}");
        checks += 1;
        assert!(checks < 100, "no stall detected");
        assert!(deadline > now && deadline - now <= STALL / 4, "the next check: {deadline} after {now}");
        if deadline - now > 1 {
            assert_eq!(send_round(&mut p, deadline - 1), (vec![], vec![]), "between checks: nothing");
        }
        now = deadline;
    }
    assert_eq!(p.s.rail_states()[SOUT], RailState::Failed { epoch: 0, fenced: false });
}

#[test]
fn a_readmission_attempt_starts_exactly_when_poll_timeout_says() {
    let mut p = Pair::new(Opts::default());
    enable_failover(&mut p, 0);
    enable_readmit(&mut p, 5 * MS, 40 * MS);
    let mut fo = FoOut::default();
    p.now = MS;
    p.s.handle_event(p.now, Event::RailDown { rail: SUP }).unwrap();
    settle(&mut p, &mut fo);
    assert_eq!(p.s.rail_states()[SUP], RailState::Failed { epoch: 0, fenced: true }, "fenced and settled");
    // The fence settled at `p.now`: the attempt is due MPIB_READMIT_MS later.
    let fenced_at = p.now;
    assert_eq!(send_round(&mut p, fenced_at), (vec![], vec![]));
    let deadline = p.s.poll_timeout();
    assert_eq!(deadline, fenced_at + 5 * MS);
    nothing_before(&mut p, fenced_at + 1, deadline);
    assert_eq!(send_round(&mut p, deadline), (vec![], vec![Action::RebuildQps { rail: SUP }]));
    assert_eq!(p.s.poll_timeout(), 0, "an attempt under way: its steps are taken at once");
}

#[test]
fn a_fence_is_a_state_the_receiver_waits_in_until_the_plugin_answers() {
    let mut p = Pair::new(Opts::default());
    enable_failover(&mut p, 0);
    p.irecv_one(4096);
    p.r.handle_event(Event::RailDown { rail: SUP }).unwrap();
    let round = |p: &mut Pair| {
        let mut out = Output::default();
        p.r.handle_timeout(p.now, &mut p.rs, &mut out).unwrap();
        (kinds(&out), out.actions)
    };
    assert_eq!(p.r.poll_timeout(), 0);
    let t0 = p.now;
    assert_eq!(round(&mut p), (vec![], vec![Action::FenceQps { rail: SUP }]), "the fence is asked for");
    // The plugin has not answered (its QPs' error state is not final yet, or the NIC's poll
    // lock was taken): the engine keeps its rounds coming and reports nothing meanwhile.
    for _ in 0..3 {
        p.now += 10 * MS;
        assert_eq!(p.r.poll_timeout(), 0, "a fence under way: at once");
        assert_eq!(round(&mut p), (vec![], vec![]), "no report before the fence is done");
    }
    p.r.handle_event(Event::FenceDone { rail: SUP }).unwrap();
    assert_eq!(round(&mut p), (vec![(SOUT, WrKind::Control)], vec![]), "then the Fenced report, on SOUT");
    assert_eq!(p.r.poll_timeout(), t0 + KEEPALIVE_NS, "nothing more but the waiting receive's keepalive");
}
