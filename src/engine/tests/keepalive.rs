//! Keepalives: RC tells a side nothing about a dead peer it is not writing to, so a caller
//! waiting on a connection (receives posted, a send without its CTS) makes it write a tiny
//! signalled WRITE every `KEEPALIVE_NS` of silence; its failure is the error the caller sees.

use super::harness::*;
use crate::engine::{CompletionFailed, KEEPALIVE_NS, QpRef, SOUT, SUP, WorkRequest, WrKind};
use crate::error::Cause;
use crate::fabric::{Completion, WcOpcode, WcStatus, WrOpcode};

/// One transfer of `size` bytes, tag 0, from the receive's posting to both sides' completion.
fn transfer(p: &mut Pair, size: usize) {
    let (rid, _) = p.irecv_one(size);
    p.deliver_all();
    let sa = p.send_buf(&vec![7; size]);
    let sid = p.isend(sbuf(sa, size as u64, 0)).unwrap().expect("CTS delivered");
    p.deliver_all();
    p.poll_send().unwrap();
    p.poll_recv().unwrap();
    assert!(p.test_send(sid).unwrap().is_some() && p.test_recv(rid).unwrap().is_some());
}

/// The rails of the keepalives a waiting sender writes at `p.now` (probes off).
fn keepalive_rails(p: &mut Pair) -> Vec<usize> {
    let before = p.chains.len();
    p.probes_waiting(CallerWaits::Yes);
    let rails = p.chains[before..].iter().map(|c| c.rail).collect();
    p.deliver_all();
    p.poll_send().unwrap();
    rails
}

#[test]
fn a_waiting_sender_keeps_its_rails_alive_even_with_probes_off() {
    let mut p = Pair::new(Opts::default()); // probes off, 50/50
    p.now = 5 * KEEPALIVE_NS;
    let before = p.chains.len();
    p.probes_waiting(CallerWaits::No);
    assert_eq!(p.chains.len(), before, "not waiting, probes off: nothing");
    assert_eq!(keepalive_rails(&mut p), vec![SOUT], "before any transfer: SOUT alone");
    p.now += KEEPALIVE_NS / 2;
    assert_eq!(keepalive_rails(&mut p), vec![], "not before the interval");
    transfer(&mut p, 4096);
    p.now += KEEPALIVE_NS;
    assert_eq!(keepalive_rails(&mut p), vec![SOUT, SUP], "each rail that carried bytes");
}

#[test]
fn a_rail_that_carries_no_bytes_gets_no_keepalive() {
    let sup_only = crate::split::AnySplit::Fixed(crate::split::Fixed::percent(0));
    let mut p = Pair::new(Opts { split: sup_only, ..Opts::default() });
    transfer(&mut p, 4096);
    p.now += 5 * KEEPALIVE_NS;
    assert_eq!(keepalive_rails(&mut p), vec![SUP], "SOUT carried nothing: it stays silent");
}

#[test]
fn a_receiver_waiting_in_silence_writes_one_keepalive_to_the_sender_scratch() {
    let mut p = Pair::new(Opts::default());
    p.keepalive();
    assert!(p.log.iter().all(|(_, _, _, wr)| wr.wr_id >> 60 != 4), "no receive outstanding: no keepalive");
    let (id, _) = p.irecv_one(64);
    p.keepalive(); // the first check after the receive starts the silence
    let n = p.log.len();
    p.now += KEEPALIVE_NS - 1;
    p.keepalive();
    assert_eq!(p.log.len(), n, "nothing before KEEPALIVE_NS of silence");
    p.now += 1;
    p.keepalive();
    assert_eq!(p.log.len(), n + 1, "one keepalive after KEEPALIVE_NS of silence");
    let (dir, rail, qp, wr) = p.log[n];
    assert_eq!((dir, rail, qp), (Dir::ToSend, SOUT, QpRef::Cts));
    assert_eq!((wr.opcode, wr.signaled, wr.bytes(), wr.remote_addr), (WrOpcode::Write, true, 8, SEND_SCRATCH));
    p.now += 10 * KEEPALIVE_NS;
    p.keepalive();
    assert_eq!(p.log.len(), n + 1, "at most one in flight");
    p.deliver_all();
    p.poll_recv().unwrap(); // the keepalive's completion: activity, the silence restarts
    p.keepalive();
    p.now += KEEPALIVE_NS;
    p.keepalive();
    assert_eq!(p.log.len(), n + 2);
    assert_eq!(p.log.last().unwrap().1, SUP, "the next one goes on the other rail");
    assert_eq!(p.r.counters()[SOUT].probes + p.r.counters()[SUP].probes, 2);
    assert_eq!(p.r.test(id).unwrap(), None, "keepalives complete no receive");
}

/// Activity (a receive posted, a completion) restarts the silence: the engine keeps it as a
/// flag the next check turns into a start time (the data path reads no clock).
#[test]
fn activity_restarts_the_receivers_silence() {
    let mut p = Pair::new(Opts::default());
    let is_keepalive = |wr: &crate::fabric::SendWr| wr.wr_id >> 60 == WrKind::Probe.id(SOUT, 0) >> 60;
    let keepalives = |p: &Pair| p.log.iter().filter(|(_, _, _, wr)| is_keepalive(wr)).count();
    p.irecv_one(64);
    p.keepalive();
    p.now += KEEPALIVE_NS / 2;
    p.irecv_one(64); // activity half-way through the silence
    p.now += KEEPALIVE_NS / 2;
    p.keepalive();
    assert_eq!(keepalives(&p), 0, "the second receive restarted the silence");
    p.now += KEEPALIVE_NS - 1;
    p.keepalive();
    assert_eq!(keepalives(&p), 0, "not before KEEPALIVE_NS since the restart");
    p.now += 1;
    p.keepalive();
    assert_eq!(keepalives(&p), 1, "one after KEEPALIVE_NS of silence since the restart");
}

#[test]
fn a_failed_keepalive_is_the_error_the_waiting_receiver_sees() {
    let mut p = Pair::new(Opts::default());
    let (id, _) = p.irecv_one(64);
    p.keepalive();
    p.now += KEEPALIVE_NS;
    p.keepalive();
    assert!(p.log.iter().any(|(_, _, _, wr)| wr.wr_id == WrKind::Probe.id(SOUT, 0)), "the keepalive went out");
    let wr_id = WrKind::Probe.id(SOUT, 0);
    let c = Completion { wr_id, status: WcStatus::RetryExceeded, opcode: WcOpcode::RdmaWrite, ..Completion::default() };
    let e = p.r.handle_completion(SOUT, &c, &p.rs).unwrap_err();
    let want = CompletionFailed {
        rail: SOUT,
        what: WorkRequest::ProbeWrite,
        slot: None,
        status: WcStatus::RetryExceeded,
        qp_num: 0,
        vendor_err: 0,
    };
    assert_eq!(e.cause, Cause::CompletionFailed(want));
    let later = p.r.test(id).unwrap_err();
    assert!(matches!(&later.cause, Cause::FailedEarlier(first) if *first == e), "{later}");
    assert!(matches!(later.root().cause, Cause::CompletionFailed(CompletionFailed { rail: SOUT, .. })));
}

/// A rail that fails while the receiver's keepalive is in flight on it (the sender reported
/// it silent, say, though it still works): the keepalive's completion comes later, a success
/// or a flush, and is the rail's leftover, not a stray that fails the connection.
#[test]
fn a_keepalive_left_on_a_failed_rail_completes_without_an_error() {
    for status in [WcStatus::Success, WcStatus::Flushed] {
        let mut p = Pair::new(Opts::default());
        super::faults::enable_failover(&mut p, 0);
        let (id, _) = p.irecv_one(64);
        p.keepalive();
        p.now += KEEPALIVE_NS;
        p.keepalive();
        let wr_id = WrKind::Probe.id(SOUT, 0);
        assert!(p.log.iter().any(|(_, _, _, wr)| wr.wr_id == wr_id), "the keepalive went out on SOUT");
        p.r.handle_event(crate::engine::Event::RailDown { rail: SOUT }).unwrap();
        let c = Completion { wr_id, status, opcode: WcOpcode::RdmaWrite, ..Completion::default() };
        p.r.handle_completion(SOUT, &c, &p.rs).unwrap_or_else(|e| panic!("{status:?}: {e}"));
        assert_eq!(p.r.test(id).unwrap(), None, "{status:?}: the receive still waits, without an error");
        let again = p.r.handle_completion(SOUT, &c, &p.rs);
        if status == WcStatus::Success {
            assert!(again.is_err(), "a second completion of the one keepalive is still a stray");
        }
    }
}
