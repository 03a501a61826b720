//! The hang watch (`engine/hang.rs`): a receive the sender never serves makes exactly one
//! hang report, once it has waited the threshold, with its slot and age; none before, none
//! with the watch off; another only for a request that starts waiting after the first
//! completed. Driven as the plugin drives the receiver: `handle_timeout` only when
//! `poll_timeout` says so, the clock moving on in steps a waiting caller makes.

use super::harness::*;
use crate::engine::Action;
use crate::engine::actions::Output;

const THRESHOLD_NS: u64 = 10_000_000_000;
const STEP_NS: u64 = 1_000_000;

/// Runs the receiver's timer rounds from `p.now` until `until_ns`, as a waiting caller
/// would (every `STEP_NS`, a round when the engine's time has come); the hang reports
/// emitted, with the time each came at.
fn rounds_until(p: &mut Pair, until_ns: u64) -> Vec<(u64, usize, u64)> {
    let mut reports = Vec::new();
    while p.now < until_ns {
        if p.r.poll_timeout() <= p.now {
            let mut out = Output::default();
            p.r.handle_timeout(p.now, &mut p.rs, &mut out).unwrap();
            // The keepalives go nowhere: the peer stopped (a keepalive that completes only
            // moves the quiet period).
            for a in out.actions {
                if let Action::HangReport { slot, age_ns } = a {
                    reports.push((p.now, slot, age_ns));
                }
            }
        }
        p.now += STEP_NS;
    }
    reports
}

#[test]
fn a_receive_the_sender_never_serves_makes_one_report_with_its_slot_and_age() {
    let mut p = Pair::new(Opts::default());
    p.r.set_hang_report_ns(THRESHOLD_NS);
    // One transfer completes (slot 0), then a receive (slot 1) whose sender stops.
    let (rid, _) = p.irecv_one(4096);
    p.deliver_all();
    let sa = p.send_buf(&[3; 4096]);
    let sid = p.isend(sbuf(sa, 4096, 0)).unwrap().expect("CTS delivered");
    p.deliver_all();
    p.poll_send().unwrap();
    p.poll_recv().unwrap();
    assert!(p.test_send(sid).unwrap().is_some() && p.test_recv(rid).unwrap().is_some());
    let start = p.now;
    let (stuck, _) = p.irecv_one(8192);
    assert!(rounds_until(&mut p, start + THRESHOLD_NS - 2 * STEP_NS).is_empty(), "nothing before the threshold");
    let reports = rounds_until(&mut p, start + 3 * THRESHOLD_NS);
    assert_eq!(reports.len(), 1, "exactly one report however long it waits: {reports:?}");
    let (at, slot, age) = reports[0];
    assert_eq!(slot, 1, "the stuck receive's slot");
    assert!((THRESHOLD_NS..=THRESHOLD_NS + 2 * STEP_NS).contains(&age), "age {age} ns");
    assert!(at - start <= THRESHOLD_NS + 2 * STEP_NS, "reported {} ns after the receive", at - start);
    // The report names the slot, its bytes, what it waits for and its age.
    let text = p.r.state_report(p.now).to_string();
    assert!(text.contains("slot 1 (receive 1): 1 buffers, 8192 bytes; no data yet: waiting for the sender"), "{text}");
    assert!(text.contains("seen waiting for 30.0 s"), "{text}");
    assert!(text.contains("SOUT rail: Up") && text.contains("SUP rail: Up"), "{text}");
    let _ = stuck;
}

#[test]
fn no_report_with_the_watch_off() {
    let mut p = Pair::new(Opts::default());
    p.r.set_hang_report_ns(0);
    let start = p.now;
    p.irecv_one(4096);
    assert!(rounds_until(&mut p, start + 3 * THRESHOLD_NS).is_empty());
}

#[test]
fn the_next_report_is_for_a_request_that_waits_after_the_reported_one_completed() {
    let mut p = Pair::new(Opts::default());
    p.r.set_hang_report_ns(THRESHOLD_NS);
    let start = p.now;
    let (rid, _) = p.irecv_one(4096);
    assert_eq!(rounds_until(&mut p, start + THRESHOLD_NS + 5 * STEP_NS).len(), 1);
    // The sender comes back: the receive completes; a new one then waits too long.
    p.deliver_all();
    let sa = p.send_buf(&[5; 4096]);
    let sid = p.isend(sbuf(sa, 4096, 0)).unwrap().expect("CTS delivered");
    p.deliver_all();
    p.poll_send().unwrap();
    p.poll_recv().unwrap();
    assert!(p.test_send(sid).unwrap().is_some() && p.test_recv(rid).unwrap().is_some());
    let again = p.now;
    p.irecv_one(4096);
    let reports = rounds_until(&mut p, again + 2 * THRESHOLD_NS);
    assert_eq!(reports.iter().map(|r| r.1).collect::<Vec<_>>(), vec![1], "{reports:?}");
}
