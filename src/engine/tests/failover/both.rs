//! The both-rails model: a fault on each rail, anywhere in the stream; with no outage
//! grace the connection fails with `BothRailsFailed`, never a hang or a wrong byte in a
//! receive that completed.

use proptest::test_runner::TestCaseError;

use super::super::harness::*;
use super::{Model, Op, RecvSpec, Shape, fail};

/// Both rails fail (the second while the first is failing over or after): the connection
/// fails with `BothRailsFailed` — never a hang, never a wrong byte in a receive that did
/// complete. Once the rails are dead for good, every request still outstanding fails, and
/// so does every later call of a side that failed.
pub(super) fn run_both(
    shape: Shape,
    pct: u8,
    warmup: usize,
    specs: Vec<RecvSpec>,
    ops: &[Op],
) -> Result<(), TestCaseError> {
    let mut m = Model::new(shape.0, shape.1, pct, warmup, specs);
    m.both_rails = true;
    let both = |e: &TestCaseError| e.to_string().contains("both rails have failed");
    let mut r = ops.iter().try_for_each(|op| m.apply(op));
    if r.is_ok() {
        r = m.settle();
    }
    match r {
        Err(e) if both(&e) => {}
        Err(e) => return Err(e),
        // A link that fell silent after the last transfer: nobody had a reason to notice. A
        // rail whose faults were only port-downs: RC waited and the port came back.
        Ok(()) if (0..2).any(|r| m.unnoticed(r) || !m.not_only_port[r]) => return Ok(()),
        Ok(()) => return fail("both rails failed and the connection went on".into()),
    }
    // The links are dead: every QP of both rails on both sides is in the error state. Time
    // passes; keepalives and flushed WRs tell each side.
    for rail in 0..2 {
        m.p.fence(SEND_SIDE, rail);
        m.p.fence(RECV_SIDE, rail);
    }
    for _ in 0..6 {
        m.p.now += crate::engine::KEEPALIVE_NS + 1;
        m.p.keepalive();
        m.p.probes_waiting(crate::engine::CallerWaits::Yes);
        let _ = m.p.poll_send();
        let _ = m.p.poll_recv();
        let _ = m.p.pump_failover(&mut m.fo);
    }
    // An outstanding request fails, or completes if all its data had landed (exactly);
    // none may still be pending: that would be a hang.
    for i in 0..m.live.len() {
        let l = &m.live[i];
        if !l.recv_done {
            match m.p.r.test(l.rid.unwrap()) {
                Ok(None) => return fail(format!("receive {} still pending after both rails died", l.seed)),
                Ok(Some(d)) => m.check_recv(i, &d.sizes[..d.n])?,
                Err(_) => {}
            }
        }
        let l = &m.live[i];
        for sid in l.sids.iter().flatten() {
            if let Ok(None) = m.p.s.test(*sid) {
                return fail(format!(
                    "send {sid} still pending after both rails died: {:?} {:?} {:?} busy {:?}",
                    m.p.s.rail_states(),
                    m.p.s.error().map(|e| e.to_string()),
                    m.p.r.error().map(|e| e.to_string()),
                    m.p.s.busy_rails()
                ));
            }
        }
    }
    if m.p.s.error().is_some() && m.p.s.isend(m.p.now, sbuf(0, 8, 0), &mut m.p.ss, &mut m.p.posts).is_ok() {
        return fail("a later isend succeeded".into());
    }
    if m.p.r.error().is_some() && m.p.r.irecv(&[rbuf(0, 8, 0)], &mut m.p.rs, &mut m.p.posts).is_ok() {
        return fail("a later irecv succeeded".into());
    }
    Ok(())
}
