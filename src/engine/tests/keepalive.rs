//! Keepalives: RC tells a side nothing about a dead peer it is not writing to, so a caller
//! waiting on a connection (receives posted, a send without its CTS) makes it write a tiny
//! signalled WRITE every `KEEPALIVE_NS` of silence; its failure is the error the caller sees.

use super::harness::*;
use crate::engine::{KEEPALIVE_NS, QpRef, SOUT, SUP, WrKind};
use crate::fabric::{Completion, WcOpcode, WcStatus, WrOpcode};

#[test]
fn a_waiting_sender_keeps_idle_rails_alive_even_with_probes_off() {
    let mut p = Pair::new(Opts::default()); // probes off
    p.now = 5 * KEEPALIVE_NS;
    let before = p.chains.len();
    p.probes_waiting(false);
    assert_eq!(p.chains.len(), before, "not waiting, probes off: nothing");
    p.probes_waiting(true);
    let rails: Vec<usize> = p.chains[before..].iter().map(|c| c.rail).collect();
    assert_eq!(rails, vec![SOUT, SUP], "waiting: one keepalive per idle rail");
    let mid = p.chains.len();
    p.now += KEEPALIVE_NS / 2;
    p.probes_waiting(true);
    assert_eq!(p.chains.len(), mid, "one at a time, and not before the interval");
}

#[test]
fn a_receiver_waiting_in_silence_writes_one_keepalive_to_the_sender_scratch() {
    let mut p = Pair::new(Opts::default());
    p.keepalive();
    assert!(p.log.iter().all(|(_, _, _, wr)| wr.wr_id >> 60 != 4), "no receive outstanding: no keepalive");
    let (id, _) = p.irecv_one(64);
    p.now += KEEPALIVE_NS - 1;
    p.keepalive();
    let n = p.log.len();
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
    p.poll_recv().unwrap();
    p.now += KEEPALIVE_NS;
    p.keepalive();
    assert_eq!(p.log.last().unwrap().1, SUP, "the next one goes on the other rail");
    assert_eq!(p.r.counters()[SOUT].probes + p.r.counters()[SUP].probes, 2);
    assert_eq!(p.r.test(id).unwrap(), None, "keepalives complete no receive");
}

#[test]
fn a_failed_keepalive_is_the_error_the_waiting_receiver_sees() {
    let mut p = Pair::new(Opts::default());
    let (id, _) = p.irecv_one(64);
    p.now += KEEPALIVE_NS;
    p.keepalive();
    let wr_id = WrKind::Probe.id(SOUT, 0);
    let c = Completion { wr_id, status: WcStatus::RetryExceeded, opcode: WcOpcode::RdmaWrite, ..Completion::default() };
    let e = p.r.on_completion(p.now, SOUT, &c, &p.rs).unwrap_err();
    assert!(e.msg.contains("retry"), "{}", e.msg);
    assert!(p.r.test(id).unwrap_err().msg.contains("connection failed earlier"));
}
