//! Idle-rail probes (`SendEngine::poll_probes`): a tiny signalled WRITE without IMM on a
//! healthy rail that has carried nothing for `probe_interval_ns`, at most one per rail at a
//! time, never while the rail has a transfer in flight; its completion is an RTT sample. At
//! the receiver it is invisible: no SRQ WQE, no CQE, no IMM. Off when the interval is 0.

use std::sync::Arc;

use super::harness::*;
use crate::engine::{QpRef, RAILS, RailCounts, SOUT, SUP, WrKind};
use crate::fabric::WrOpcode;
use crate::split::{AnySplit, Fixed};
use crate::telemetry::ProbeBudget;

const INTERVAL: u64 = 10_000;

fn probing(percent: u8) -> Pair {
    Pair::new(Opts { probe_ns: INTERVAL, split: AnySplit::Fixed(Fixed::percent(percent)), ..Opts::default() })
}

/// Rails that got a probe from the last `probes()` call.
fn probe_at(p: &mut Pair, now: u64) -> Vec<usize> {
    p.now = now;
    let before = p.chains.len();
    p.probes();
    p.chains[before..].iter().map(|c| c.rail).collect()
}

fn samples(p: &Pair, rail: usize) -> u64 {
    p.s.telemetry()[rail].view().samples
}

#[test]
fn probes_are_off_when_the_interval_is_zero() {
    let mut p = Pair::new(Opts::default());
    for now in [0, INTERVAL, 1 << 30, 1 << 50] {
        assert_eq!(probe_at(&mut p, now), Vec::<usize>::new());
    }
    assert_eq!(p.s.counters(), [RailCounts::default(); RAILS]);
}

#[test]
fn an_idle_rail_gets_one_tiny_signalled_write_without_imm_after_the_interval() {
    let mut p = probing(50);
    assert_eq!(probe_at(&mut p, INTERVAL - 1), Vec::<usize>::new(), "not before the interval");
    assert_eq!(probe_at(&mut p, INTERVAL), vec![SOUT, SUP]);
    for (c, rail) in p.chains.clone().iter().zip([SOUT, SUP]) {
        assert_eq!((c.dir, c.rail, c.qp, c.len), (Dir::ToRecv, rail, QpRef::Data(0), 1));
        let wr = p.log[c.start].3;
        assert_eq!(WrKind::decode(wr.wr_id), Some((WrKind::Probe, rail, 0)));
        assert_eq!((wr.opcode, wr.signaled, wr.imm), (WrOpcode::Write, true, 0));
        assert_eq!((wr.bytes(), wr.remote_addr, wr.rkey), (8, SCRATCH, 31 + rail as u32));
        let want = RailCounts { wr_posted: 1, doorbells: 1, probes: 1, ..RailCounts::default() };
        assert_eq!(p.s.counters()[rail], want, "a probe is neither payload nor an IMM");
    }
}

#[test]
fn at_most_one_probe_per_rail_is_in_flight() {
    let mut p = probing(50);
    assert_eq!(probe_at(&mut p, INTERVAL).len(), 2);
    for now in [INTERVAL + 1, 10 * INTERVAL, 1000 * INTERVAL] {
        assert_eq!(probe_at(&mut p, now), Vec::<usize>::new(), "the first probes are not complete");
    }
    // SUP's completes; only SUP may be probed again (one interval after its probe).
    assert!(p.step(Dir::ToRecv, SUP, 0));
    p.poll_send().unwrap();
    assert_eq!(probe_at(&mut p, 1001 * INTERVAL), vec![SUP]);
}

#[test]
fn the_interval_counts_from_the_last_probe() {
    let mut p = probing(50);
    assert_eq!(probe_at(&mut p, INTERVAL).len(), 2);
    p.deliver_all();
    p.poll_send().unwrap();
    // Completed, but an idle rail is probed once per interval, not on every poll.
    for now in [p.now, p.now + 1, 2 * INTERVAL - 1] {
        assert_eq!(probe_at(&mut p, now), Vec::<usize>::new(), "probed again at {now}");
    }
    assert_eq!(probe_at(&mut p, 2 * INTERVAL), vec![SOUT, SUP]);
    assert_eq!(p.s.counters()[SOUT].probes, 2);
}

#[test]
fn a_probe_never_touches_the_receivers_srq_or_cq() {
    let mut p = probing(50);
    // No receive posted: the SRQs are empty. A WRITE_WITH_IMM would wait (RNR); a probe
    // must not.
    assert_eq!(p.srq, [0, 0]);
    probe_at(&mut p, INTERVAL);
    p.deliver_all();
    assert_eq!(p.wires_len(), 0, "both probes executed");
    assert_eq!(p.rnr, [0, 0]);
    assert!(p.cq_r.iter().all(|q| q.is_empty()), "no CQE at the receiver");
    assert_eq!(p.r.counters(), [RailCounts::default(); RAILS]);
    assert_eq!(p.srq, [0, 0], "no WQE consumed");
    assert_eq!(p.cq_s.iter().map(|q| q.len()).sum::<usize>(), 2, "each probe completes at the sender");
}

#[test]
fn a_probe_completion_is_an_rtt_sample() {
    let mut p = probing(50);
    probe_at(&mut p, INTERVAL);
    p.deliver_all();
    // SOUT's completion has no device timestamp: the poll time counts. SUP's has one.
    let mut sup = p.cq_s[SUP].pop_front().unwrap();
    sup.timestamp_ns = INTERVAL + 300;
    p.now = INTERVAL + 700;
    p.poll_send().unwrap();
    p.inject_send(SUP, sup).unwrap();
    let v = [*p.s.telemetry()[SOUT].view(), *p.s.telemetry()[SUP].view()];
    assert_eq!((v[SOUT].samples, v[SOUT].srtt_ns, v[SOUT].rttvar_ns), (1, 700, 350));
    assert_eq!((v[SUP].samples, v[SUP].srtt_ns, v[SUP].rttvar_ns), (1, 300, 150));
    assert!(v.iter().all(|v| v.inflight_bytes == 0 && !v.failed));
    assert_eq!(p.s.counters()[SOUT].cqe, 1);
    assert_eq!(p.s.counters()[SUP].cqe, 1);
}

#[test]
fn a_rail_with_a_transfer_in_flight_is_not_probed() {
    // 100 %: a 4 KiB send keeps SOUT busy; SUP is idle.
    let mut p = probing(100);
    let (rid, _) = p.irecv_one(4096);
    p.deliver_all();
    p.now = 5 * INTERVAL;
    let sa = p.send_buf(&[3; 4096]);
    let sid = p.isend(sbuf(sa, 4096, 0)).unwrap().unwrap();
    assert_eq!(probe_at(&mut p, 20 * INTERVAL), vec![SUP], "SOUT has data in flight");
    p.deliver_all();
    assert_eq!(probe_at(&mut p, 30 * INTERVAL), Vec::<usize>::new(), "SOUT's completion is not polled yet");
    assert_eq!(p.test_send(sid).unwrap(), Some(4096));
    p.test_recv(rid).unwrap().unwrap();
    assert_eq!(probe_at(&mut p, 40 * INTERVAL), vec![SOUT, SUP]);
}

#[test]
fn a_rail_with_an_empty_transfer_in_flight_is_not_probed() {
    // An empty transfer carries 0 bytes on SOUT, but its WRITE_WITH_IMM is in flight.
    let mut p = probing(50);
    let (rid, _) = p.irecv_one(64);
    p.deliver_all();
    let sa = p.send_buf(&[]);
    let sid = p.isend(sbuf(sa, 0, 0)).unwrap().unwrap();
    assert_eq!(probe_at(&mut p, 20 * INTERVAL), vec![SUP]);
    p.deliver_all();
    assert_eq!(p.test_send(sid).unwrap(), Some(0));
    assert_eq!(p.test_recv(rid).unwrap().unwrap().sizes[0], 0);
}

#[test]
fn a_probe_and_data_on_the_same_qp_complete_independently() {
    let mut p = probing(100);
    assert_eq!(probe_at(&mut p, INTERVAL), vec![SOUT, SUP]);
    let (rid, ra) = p.irecv_one(1000);
    assert!(p.step(Dir::ToSend, SOUT, 0));
    let data = pattern(8, 1000);
    let sa = p.send_buf(&data);
    let sid = p.isend(sbuf(sa, 1000, 0)).unwrap().unwrap();
    // SOUT's QP 0 holds the probe, then the data chain.
    assert_eq!(p.wires[Dir::ToRecv as usize][SOUT][0].q.len(), 2);
    assert!(p.step(Dir::ToRecv, SOUT, 0));
    p.poll_send().unwrap();
    assert_eq!(p.s.test(sid).unwrap(), None, "the probe's completion is not the data's");
    assert_eq!(samples(&p, SOUT), 1);
    assert!(p.step(Dir::ToRecv, SOUT, 0));
    assert_eq!(p.test_send(sid).unwrap(), Some(1000));
    assert_eq!(samples(&p, SOUT), 2);
    assert_eq!(p.test_recv(rid).unwrap().unwrap().sizes[0], 1000);
    assert_eq!(p.rs.space.read(ra, 1000), data);
    // Probes never show up as IMMs.
    assert_eq!(p.s.counters()[SOUT].imm_sent, 1);
    assert_eq!(p.s.counters()[SOUT].zero_byte_imm + p.s.counters()[SUP].zero_byte_imm, 0);
}

/// Connections probing every `interval` whose rails' NICs share one probe budget
/// (`MPIB_PROBE_RATE`).
fn sharing(n: usize, interval: u64, per_second: u64) -> Vec<Pair> {
    let budgets = [Arc::new(ProbeBudget::per_second(per_second)), Arc::new(ProbeBudget::per_second(per_second))];
    (0..n)
        .map(|_| {
            Pair::new(Opts {
                probe_ns: interval,
                split: AnySplit::Fixed(Fixed::percent(50)),
                probe_budgets: budgets.clone(),
                ..Opts::default()
            })
        })
        .collect()
}

/// Every connection probes (and its probes complete) at every `step` from `from` to `to`:
/// the probes each one sent on each rail.
fn probe_for(pairs: &mut [Pair], from: u64, to: u64, step: u64) -> Vec<[u64; RAILS]> {
    let mut now = from;
    while now < to {
        for p in pairs.iter_mut() {
            probe_at(p, now);
            p.deliver_all();
            p.poll_send().unwrap();
        }
        now += step;
    }
    pairs.iter().map(|p| [p.s.counters()[SOUT].probes, p.s.counters()[SUP].probes]).collect()
}

#[test]
fn connections_sharing_a_nic_probe_within_its_budget_and_each_gets_a_turn() {
    // 100 connections, each due a probe per rail every 10 µs: 10 M a second per rail
    // wanted; the NICs allow 1 M a second each (a burst of 10,000: 10 ms's worth).
    let mut pairs = sharing(100, INTERVAL, 1_000_000);
    let sent = probe_for(&mut pairs, INTERVAL, INTERVAL + 50_000_000, 1_000);
    for rail in [SOUT, SUP] {
        let total: u64 = sent.iter().map(|s| s[rail]).sum();
        // 50 ms at 1 M a second, plus the burst.
        assert!((50_000..=60_100).contains(&total), "rail {rail}: {total} probes in 50 ms");
        // Each connection keeps getting turns (a refused one tries an interval later).
        let least = sent.iter().map(|s| s[rail]).min().unwrap();
        assert!(least >= 100, "rail {rail}: a connection got only {least} probes");
    }
}

#[test]
fn a_probe_refused_by_the_budget_is_tried_an_interval_later() {
    // Probes every 100 ms; 100 a second per NIC (a burst of one, room again 10 ms later).
    const EVERY: u64 = 100_000_000;
    let mut pairs = sharing(2, EVERY, 100);
    assert_eq!(probe_at(&mut pairs[0], EVERY), vec![SOUT, SUP]);
    assert_eq!(probe_at(&mut pairs[1], EVERY), Vec::<usize>::new(), "the budget is spent");
    // The budget has room again 10 ms later, but the refused connection waits its interval
    // (it does not ask on every call) ...
    assert_eq!(probe_at(&mut pairs[1], EVERY + 20_000_000), Vec::<usize>::new());
    assert_eq!(probe_at(&mut pairs[1], 2 * EVERY - 1), Vec::<usize>::new());
    // ... and then gets its probes.
    assert_eq!(probe_at(&mut pairs[1], 2 * EVERY), vec![SOUT, SUP]);
    assert_eq!(pairs[1].s.counters()[SUP].probes, 1);
}

#[test]
fn keepalives_are_not_budgeted() {
    // A spent budget: a waiting connection still writes its keepalive on the rail that
    // carries its transfers (SOUT before any), so a dead peer is still noticed.
    let mut pairs = sharing(2, INTERVAL, 1);
    assert_eq!(probe_at(&mut pairs[0], INTERVAL).len(), 2);
    let p = &mut pairs[1];
    p.now = crate::engine::KEEPALIVE_NS + 1;
    let before = p.chains.len();
    p.probes_waiting(CallerWaits::Yes);
    let rails: Vec<usize> = p.chains[before..].iter().map(|c| c.rail).collect();
    assert_eq!(rails, vec![SOUT], "the keepalive went; SUP's idle probe was refused");
}
