//! Silent-rail detection (sender): a rail with work outstanding that completes nothing for
//! long against its own round trips, while the other rail completes work, is suspect (new
//! sends leave it), then failed (fenced, reported, its parts replayed); one that completes
//! again before that is used again, without a failover; both rails silent together is
//! nobody's failure. Driven through the public timer interface with a fake clock.

use super::faults::*;
use super::harness::*;
use super::readmit::MS;
use crate::engine::{Action, Output, RailState, SILENT_FLOOR_NS, SOUT, SUP, SUSPECT_FLOOR_NS, WrKind};

/// A 50/50 pair with failover on (no stall bound, no probes) and a few transfers done.
fn warm() -> Pair {
    let mut p = Pair::new(Opts::default());
    enable_failover(&mut p, 0);
    for i in 0..4 {
        one_transfer(&mut p, i);
    }
    p
}

fn one_transfer(p: &mut Pair, seed: u64) -> (u16, u16) {
    let (rid, _) = p.irecv_one(8192);
    p.deliver_all();
    p.poll_recv().unwrap();
    let sa = p.send_buf(&pattern(seed, 8192));
    let sid = p.isend(sbuf(sa, 8192, 0)).unwrap().expect("CTS delivered");
    p.deliver_all();
    p.poll_send().unwrap();
    p.poll_recv().unwrap();
    (rid, sid)
}

/// The sender's round at `now` (chains put on the wires): its WRs by (rail, kind), actions.
fn round(p: &mut Pair, now: u64) -> (Vec<(usize, WrKind)>, Vec<Action>) {
    p.now = now;
    let mut out = Output::default();
    p.s.handle_timeout(now, &mut p.ss, &mut out).expect("handle_timeout");
    p.enqueue_chains(Dir::ToRecv, &out.chains);
    let wrs = out
        .chains
        .iter()
        .flat_map(|c| c.wrs().iter().map(move |w| (c.rail as usize, WrKind::decode(w.wr_id).unwrap().0)))
        .collect();
    (wrs, out.actions)
}

fn suspects(p: &Pair, rail: usize) -> u64 {
    p.s.counters()[rail].suspects
}

#[test]
fn a_silent_rail_is_suspected_then_failed_while_its_partner_completes() {
    let mut p = warm();
    p.hold_acks(SUP, 0); // SUP's link goes silent: nothing of it completes any more
    let t0 = p.now + MS;
    p.now = t0;
    let (_, _) = one_transfer(&mut p, 10); // SUP's part lands, its ACK never comes; SOUT's does
    // SOUT keeps completing (its part of the next transfer, a millisecond later).
    p.now = t0 + MS;
    let (rid2, _) = p.irecv_one(8192);
    p.deliver_all();
    p.poll_recv().unwrap();
    let sa = p.send_buf(&pattern(11, 8192));
    p.isend(sbuf(sa, 8192, 0)).unwrap().expect("CTS");
    p.deliver_all();
    p.poll_send().unwrap();
    let mut now = p.now;
    round(&mut p, now); // the first look sets the timers
    let (mut suspected_at, mut failed_at) = (None, None);
    while failed_at.is_none() {
        let deadline = p.s.poll_timeout();
        assert!(deadline > now && deadline - now <= 5 * MS, "checked every 5 ms while work is out: {deadline} {now}");
        now = deadline;
        let (wrs, actions) = round(&mut p, now);
        if suspected_at.is_none() && suspects(&p, SUP) == 1 {
            suspected_at = Some(now - t0);
        }
        if p.s.rail_states()[SUP] != RailState::Up {
            assert!(wrs.contains(&(SOUT, WrKind::Control)), "the receiver is told on SOUT");
            assert!(!actions.contains(&Action::FenceQps { rail: SUP }), "its QPs run until the receiver's report");
            failed_at = Some(now - t0);
        }
        assert!(now - t0 < SILENT_FLOOR_NS + 20 * MS, "not failed by {} ms", (now - t0) / MS);
    }
    let (s, f) = (suspected_at.expect("suspected first"), failed_at.unwrap());
    assert!(s > SUSPECT_FLOOR_NS && s <= SUSPECT_FLOOR_NS + 10 * MS, "suspected after {} ms", s / MS);
    assert!(f > SILENT_FLOOR_NS && f <= SILENT_FLOOR_NS + 10 * MS, "failed after {} ms", f / MS);
    assert_eq!(p.s.rail_states()[SUP], RailState::Failed { epoch: 0, fenced: false });
    assert_eq!(p.s.counters()[SUP].failovers, 1);
    let _ = rid2;
}

#[test]
fn new_sends_leave_a_suspect_rail_at_once() {
    let mut p = warm();
    p.hold_acks(SUP, 0);
    let t0 = p.now + MS;
    p.now = t0;
    one_transfer(&mut p, 20);
    p.now = t0 + MS;
    one_transfer(&mut p, 21); // SOUT completes after SUP went quiet: SUP is the silent one
    let suspect_check = t0 + SUSPECT_FLOOR_NS + 6 * MS;
    while p.s.poll_timeout() <= suspect_check {
        let at = p.s.poll_timeout();
        round(&mut p, at);
    }
    assert_eq!(suspects(&p, SUP), 1, "SUP is suspect");
    let before = p.wrs_on(Dir::ToRecv, SUP);
    one_transfer(&mut p, 22);
    assert_eq!(p.wrs_on(Dir::ToRecv, SUP), before, "a new send went on SOUT alone");
}

#[test]
fn a_slow_rail_that_completes_before_the_bound_is_used_again_without_a_failover() {
    let mut p = warm();
    p.hold_acks(SUP, 0);
    let t0 = p.now + MS;
    p.now = t0;
    one_transfer(&mut p, 30);
    p.now = t0 + MS;
    one_transfer(&mut p, 31);
    // Suspect (past the suspect floor), but its acknowledgements come before the failure
    // bound: a slow rail, the split's business.
    let mut now = p.now;
    while now < t0 + SUSPECT_FLOOR_NS + 10 * MS {
        now = p.s.poll_timeout();
        round(&mut p, now);
    }
    assert_eq!(suspects(&p, SUP), 1);
    p.release_acks(SUP, 0);
    p.now = now + MS;
    p.poll_send().unwrap();
    for _ in 0..20 {
        now = p.s.poll_timeout().max(now + 5 * MS);
        let (_, actions) = round(&mut p, now);
        assert!(actions.is_empty(), "no failover: {actions:?}");
    }
    assert_eq!(p.s.rail_states(), [RailState::Up; 2]);
    assert_eq!(p.s.counters()[SUP].failovers, 0);
    let before = p.wrs_on(Dir::ToRecv, SUP);
    one_transfer(&mut p, 32);
    assert!(p.wrs_on(Dir::ToRecv, SUP) > before, "SUP carries again");
}

#[test]
fn both_rails_silent_together_is_nobodys_failure() {
    let mut p = warm();
    p.hold_acks(SOUT, 0);
    p.hold_acks(SUP, 0);
    let t0 = p.now + MS;
    p.now = t0;
    one_transfer(&mut p, 40); // both parts land, neither acknowledgement comes
    let mut now = p.now;
    while now < t0 + 10_000 * MS {
        now = p.s.poll_timeout().max(now + MS);
        let (_, actions) = round(&mut p, now);
        assert!(actions.is_empty(), "both rails silent (a paused peer, an outage of both): no failover {actions:?}");
    }
    assert_eq!((suspects(&p, SOUT), suspects(&p, SUP)), (0, 0));
    assert_eq!(p.s.rail_states(), [RailState::Up; 2]);
}

/// The bounds are multiples of the rail's own round-trip spread with a floor: a rail whose
/// round trips take 10 ms (a long or deeply queued path) is not failed at the 50 ms floor.
#[test]
fn a_rail_with_long_round_trips_gets_a_longer_bound() {
    let mut p = Pair::new(Opts::default());
    enable_failover(&mut p, 0);
    for seed in 0..16 {
        let (rid, _) = p.irecv_one(8192);
        p.deliver_all();
        p.poll_recv().unwrap();
        let sa = p.send_buf(&pattern(seed, 8192));
        let sid = p.isend(sbuf(sa, 8192, 0)).unwrap().expect("CTS delivered");
        p.now += 10 * MS; // every part takes 10 ms to come back
        p.deliver_all();
        p.poll_send().unwrap();
        p.poll_recv().unwrap();
        assert!(p.test_send(sid).unwrap().is_some() && p.test_recv(rid).unwrap().is_some());
    }
    let srtt = p.s.telemetry()[SUP].view().srtt_ns;
    assert!(srtt >= 9 * MS, "SUP's SRTT {} ms", srtt / MS);
    p.hold_acks(SUP, 0);
    let t0 = p.now + MS;
    p.now = t0;
    one_transfer(&mut p, 50);
    p.now = t0 + MS;
    one_transfer(&mut p, 51);
    let mut now = p.now;
    let mut failed_at = None;
    while failed_at.is_none() && now < t0 + 1000 * MS {
        now = p.s.poll_timeout().max(now + MS);
        round(&mut p, now);
        if p.s.rail_states()[SUP] != RailState::Up {
            failed_at = Some(now - t0);
        }
    }
    let f = failed_at.expect("failed in the end");
    assert!(f > SILENT_FLOOR_NS + 5 * MS, "failed after {} ms: the floor alone, not its round trips", f / MS);
}

/// Both rails busy, both going quiet 8 ms apart (an outage of both links, seen through
/// queues of different depth): the one that crosses its bound first is not blamed because
/// its partner's last completion is still recent; both were stuck together.
#[test]
fn rails_going_quiet_a_moment_apart_are_not_blamed() {
    let mut p = warm();
    p.hold_acks(SOUT, 0);
    let t0 = p.now + MS;
    p.now = t0;
    one_transfer(&mut p, 60); // SOUT's part held; SUP's completes at t0
    p.now = t0 + 8 * MS;
    one_transfer(&mut p, 61); // SUP completes 8 ms into SOUT's silence
    p.hold_acks(SUP, 0);
    one_transfer(&mut p, 62); // now both hold theirs: both rails have work out, no completion
    let mut now = p.now;
    while now < t0 + 1000 * MS {
        now = p.s.poll_timeout().max(now + MS);
        let (_, actions) = round(&mut p, now);
        assert!(actions.is_empty(), "both stuck: no failover {actions:?}");
    }
    assert_eq!((suspects(&p, SOUT), suspects(&p, SUP)), (0, 0));
}

/// Before the rail has measured its rate, a large first part gets far more time before
/// silence fails the rail (on a loaded host one rail may finish its half of a first huge
/// message seconds after the other): it is suspect at its time at 250 Mb/s, failed only
/// at eight times that.
#[test]
fn a_large_first_part_on_an_unmeasured_rail_gets_eight_times_its_time_before_failing() {
    const SIZE: usize = 8 << 20;
    let mut p = Pair::new(Opts::default());
    enable_failover(&mut p, 0);
    one_transfer(&mut p, 69); // both rails have completed something (a round trip, no rate)
    assert_eq!(p.s.telemetry()[SUP].view().rate_sample_ns, 0, "no rate measured yet");
    p.hold_acks(SUP, 0);
    p.now += MS;
    let t0 = p.now;
    let (rid, _) = p.irecv_one(SIZE);
    p.deliver_all();
    p.poll_recv().unwrap();
    let sa = p.send_buf(&pattern(70, SIZE));
    p.isend(sbuf(sa, SIZE as u64, 0)).unwrap().expect("CTS delivered");
    p.deliver_all();
    p.poll_send().unwrap(); // SOUT's half completes, SUP's acknowledgement is held
    let sup_bytes = p.s.counters()[SUP].bytes;
    assert!(sup_bytes >= SIZE as u64 / 4, "SUP carries a large part: {sup_bytes}");
    let at_250 = sup_bytes * 32; // ns at 250 Mb/s
    let mut now = p.now;
    let mut failed_at = None;
    while failed_at.is_none() && now < t0 + 10 * at_250 {
        now = p.s.poll_timeout().max(now + MS);
        round(&mut p, now);
        if p.s.rail_states()[SUP] != RailState::Up {
            failed_at = Some(now - t0);
        }
    }
    assert_eq!(suspects(&p, SUP), 1, "suspect once past its time at 250 Mb/s");
    let f = failed_at.expect("failed in the end");
    assert!(f > 8 * at_250 + SILENT_FLOOR_NS, "failed after {} ms, its time at 250 Mb/s {} ms", f / MS, at_250 / MS);
    assert!(f <= 8 * at_250 + SILENT_FLOOR_NS + 10 * MS, "failed after {} ms", f / MS);
    let _ = rid;
}

/// A rail that has completed nothing on the connection yet (its first transfer waits for
/// the path to come up, say) has no round trip to judge a silence by: RC decides.
#[test]
fn a_rail_that_never_completed_is_not_judged_by_its_silence() {
    let mut p = Pair::new(Opts::default());
    enable_failover(&mut p, 0);
    p.hold_acks(SUP, 0);
    let t0 = p.now;
    one_transfer(&mut p, 80); // SOUT completes, SUP's first acknowledgement is held
    let mut now = p.now;
    while now < t0 + 2000 * MS {
        now = p.s.poll_timeout().max(now + MS);
        let (_, actions) = round(&mut p, now);
        assert!(actions.is_empty(), "no failover of a rail never heard from: {actions:?}");
    }
    assert_eq!((suspects(&p, SUP), p.s.counters()[SUP].failovers), (0, 0));
}

/// Rails that leave through one port (`FailoverConfig::silence` off) share its link: the
/// check does not run, a rail silent beside its partner is left to RC.
#[test]
fn rails_on_one_port_are_not_judged_by_silence() {
    let mut p = warm();
    p.s.failover_config_mut().silence = false;
    p.hold_acks(SUP, 0);
    let t0 = p.now + MS;
    p.now = t0;
    one_transfer(&mut p, 90);
    p.now = t0 + MS;
    one_transfer(&mut p, 91);
    let mut now = p.now;
    while now < t0 + 1000 * MS {
        now = p.s.poll_timeout().max(now + MS);
        let (_, actions) = round(&mut p, now);
        assert!(actions.is_empty(), "no failover: {actions:?}");
    }
    assert_eq!((suspects(&p, SUP), p.s.counters()[SUP].failovers), (0, 0));
}

/// A rail failed by its silence was slow, not dead: the receiver has every byte and, its
/// receive done, makes no call that would read the `RailDown` (as a rank whose receives
/// of the last collective completed). The late acknowledgement completes the send: the
/// rail's QPs on this side keep running until the receiver's report, and are fenced then.
#[test]
fn a_silent_rails_late_acknowledgement_completes_its_send_and_its_qps_stop_after_the_report() {
    let mut p = warm();
    p.hold_acks(SUP, 0);
    let t0 = p.now + MS;
    p.now = t0;
    let (rid, sid) = one_transfer(&mut p, 80);
    assert!(p.test_recv(rid).unwrap().is_some(), "the receiver has every byte");
    p.now = t0 + MS;
    let (rid2, sid2) = one_transfer(&mut p, 81); // SOUT completes after SUP went quiet
    assert!(p.test_recv(rid2).unwrap().is_some() && p.test_send(sid2).unwrap().is_none());
    let mut now = p.now;
    let mut fenced_early = false;
    while p.s.rail_states()[SUP] == RailState::Up {
        assert!(now < t0 + SILENT_FLOOR_NS + 50 * MS, "SUP not failed by {} ms", (now - t0) / MS);
        now = p.s.poll_timeout().max(now + MS);
        fenced_early |= round(&mut p, now).1.contains(&Action::FenceQps { rail: SUP });
    }
    assert!(!fenced_early, "the silent rail's QPs run until the receiver's report");
    assert_eq!(p.test_send(sid).unwrap(), None, "the first send waits on SUP's acknowledgement");
    // The receiver stays idle; the acknowledgement arrives late and completes both sends.
    p.release_acks(SUP, 0);
    p.poll_send().unwrap();
    assert_eq!(p.test_send(sid).unwrap(), Some(8192), "completed by its late acknowledgement");
    assert_eq!(p.test_send(sid2).unwrap(), Some(8192));
    for _ in 0..5 {
        now += 5 * MS;
        assert!(!round(&mut p, now).1.contains(&Action::FenceQps { rail: SUP }), "no fence before the report");
    }
    // The receiver's next call reads the RailDown, fences its end and reports; this side's
    // QPs of the rail stop then, and nothing is replayed (every part had arrived).
    let mut fo = FoOut::default();
    let mut sender_fenced = false;
    for _ in 0..6 {
        p.now += MS;
        p.pump_failover(&mut fo).unwrap();
        sender_fenced |= fo.s.actions.contains(&Action::FenceQps { rail: SUP });
        p.deliver_all();
        p.poll_send().unwrap();
        p.poll_recv().unwrap();
    }
    assert!(sender_fenced, "fenced once the receiver reported");
    assert_eq!(p.s.rail_states()[SUP], RailState::Failed { epoch: 0, fenced: true });
    assert_eq!(p.s.failover_counts().replayed_parts, 0, "nothing replayed: every part had arrived");
}

/// A connection configured with a longer floor (the soft fabric's, `MPIB_SILENT_MS`) keeps
/// a silent rail until past it: suspect at 2/5 of it, failed past it, not before.
#[test]
fn a_longer_floor_keeps_a_silent_rail_until_past_it() {
    const FLOOR: u64 = 1000 * MS;
    let mut p = warm();
    p.s.failover_config_mut().silent_floor_ns = FLOOR;
    p.hold_acks(SUP, 0);
    let t0 = p.now + MS;
    p.now = t0;
    one_transfer(&mut p, 90);
    p.now = t0 + MS;
    one_transfer(&mut p, 91); // SOUT completes after SUP went quiet
    let mut now = p.now;
    let (mut suspected_at, mut failed_at) = (None, None);
    while failed_at.is_none() && now < t0 + 2 * FLOOR {
        now = p.s.poll_timeout().max(now + MS);
        round(&mut p, now);
        if suspected_at.is_none() && suspects(&p, SUP) == 1 {
            suspected_at = Some(now - t0);
        }
        if p.s.rail_states()[SUP] != RailState::Up {
            failed_at = Some(now - t0);
        }
    }
    let (s, f) = (suspected_at.expect("suspected"), failed_at.expect("failed"));
    assert!(s > FLOOR * 2 / 5 && s <= FLOOR * 2 / 5 + 10 * MS, "suspected after {} ms", s / MS);
    assert!(f > FLOOR && f <= FLOOR + 10 * MS, "failed after {} ms", f / MS);
}
