//! The both-rails model with an outage grace: the same random cases as
//! `both_rails_fail_anywhere_…` (a fault on each rail, anywhere in the stream: failed
//! heads, writes that land but whose ACK is lost, port-downs, silent links), but the
//! connection rides the outage out: its control messages go over the set-up channel (the
//! harness relays them), and once the links work again (re-admission succeeds) every
//! request completes with exact bytes and sizes — never an error, never a hang, never a
//! wrong byte, whatever was in flight, replayed or riding on the rail that failed second.

use proptest::prelude::*;
use proptest::test_runner::TestCaseError;

use super::strategy::case_on;
use super::{Model, Shape, fail, plain, striped};
use crate::engine::RailState;
use crate::engine::tests::faults::enable_readmit;

const MS: u64 = 1_000_000;

fn run_outage(
    shape: Shape,
    pct: u8,
    warmup: usize,
    specs: Vec<super::RecvSpec>,
    ops: &[super::Op],
) -> Result<Model, TestCaseError> {
    let mut m = Model::new(shape.0, shape.1, pct, warmup, specs);
    m.both_rails = true;
    enable_readmit(&mut m.p, 20 * MS, 80 * MS);
    m.p.s.failover_config_mut().outage_grace_ns = 60_000 * MS;
    m.p.r.failover_config_mut().outage_grace_ns = 60_000 * MS;
    for op in ops {
        m.apply(op)?;
    }
    // The outage goes on past RC's retry budget: a silent link's requesters give up too.
    for _ in 0..40 {
        m.p.now += 10 * MS;
        let silent = m.p.silent;
        for rail in (0..2).filter(|&r| silent[r]) {
            m.p.rc_gives_up(rail);
        }
        m.p.poll_send()?;
        m.p.poll_recv()?;
        m.p.pump_failover(&mut m.fo)?;
        for k in 0..64 {
            m.test(k)?;
        }
    }
    // The links work again: silent ones speak, ports accept rebuilt QPs.
    m.p.silent = [false; 2];
    m.p.rb.port_down = [false; 2];
    for _ in 0..600 {
        if m.live.is_empty()
            && m.next_recv == m.specs.len()
            && m.p.s.rail_states() == [RailState::Up; 2]
            && m.p.r.rail_states() == [RailState::Up; 2]
        {
            return Ok(m);
        }
        m.p.now += 5 * MS;
        m.irecv()?;
        for _ in 0..8 {
            m.isend()?;
        }
        m.p.refill();
        m.p.deliver_all();
        for rail in 0..2 {
            for qp in 0..m.p.late_acks[rail].len() {
                m.p.release_acks(rail, qp);
            }
        }
        m.p.poll_send()?;
        m.p.poll_recv()?;
        m.p.pump_failover(&mut m.fo)?;
        for k in 0..64 {
            m.test(k)?;
        }
    }
    fail(format!(
        "hang after the outage: {} receives live, {} of {} posted, rails {:?} / {:?}",
        m.live.len(),
        m.next_recv,
        m.specs.len(),
        m.p.s.rail_states(),
        m.p.r.rail_states()
    ))
}

/// Over 300 random cases: none errs, hangs or delivers a wrong byte; and the model does
/// what it claims, most cases going through an outage ridden out on each side (a case
/// whose faults were only port-downs RC rode out, or silent links nobody noticed, has none).
#[test]
fn both_rails_fail_anywhere_and_the_outage_is_ridden_out_exactly() {
    let mut runner = proptest::test_runner::TestRunner::new(ProptestConfig { cases: 300, ..ProptestConfig::default() });
    let counts = std::cell::RefCell::new((0u64, 0u64, 0u64, 0u64));
    runner
        .run(&(any::<bool>(), striped(), case_on(true)), |(stripe, shape, (qps, pct, warmup, specs, ops))| {
            // Half the cases with striped rail shares (their pieces in flight when it fails).
            let shape = if stripe { shape } else { plain(qps) };
            let m = run_outage(shape, pct, warmup, specs, &ops)?;
            let mut c = counts.borrow_mut();
            c.0 += 1;
            c.1 += (m.p.s.failover_counts().outages > 0) as u64;
            c.2 += (m.p.r.failover_counts().outages > 0) as u64;
            c.3 += m.p.s.failover_counts().replayed_parts;
            Ok(())
        })
        .unwrap();
    let (cases, send, recv, replayed) = *counts.borrow();
    println!(
        "outage model: {cases} cases, an outage ridden out by the sender in {send}, the receiver in {recv}; {replayed} parts sent again"
    );
    assert!(send * 2 > cases && recv * 2 > cases && replayed > 100, "{cases} {send} {recv} {replayed}");
}
