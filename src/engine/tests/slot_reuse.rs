//! A CTS slot comes back every `SLOTS` (32) receives. The receiver frees it when its IMMs arrived;
//! the sender's completions for it can come much later (an acknowledgement delayed on one
//! QP while the others go on). The sender must not take the slot's next CTS until the
//! previous use's completions were polled: completions carry only (rail, slot), so a late
//! one would complete the new send before its data left, and the old send never.

use super::harness::*;
use crate::engine::layout::SLOTS;
use crate::engine::{SOUT, WrKind};
use crate::fabric::Completion;
use crate::split::{AnySplit, Fixed};

/// One message of `len` bytes, sent and delivered; the receive is tested to completion.
fn message(p: &mut Pair, len: usize, seed: u64) -> (u16, u64, Vec<u8>) {
    let (rid, ra) = p.irecv_one(len);
    p.deliver_all();
    let data = pattern(seed, len);
    let sa = p.send_buf(&data);
    let sid = p.isend(sbuf(sa, len as u64, 0)).unwrap().expect("CTS delivered");
    p.deliver_all();
    assert_eq!(p.test_recv(rid).unwrap().unwrap().sizes[0], len as u64);
    (sid, ra, data)
}

#[test]
fn sender_waits_for_late_completions_before_reusing_a_slot() {
    // All on SOUT, two QPs: even slots on QP 0, odd slots on QP 1. QP 0's completions are
    // held back (its acks are late); QP 1's arrive and their sends complete.
    let mut p = Pair::new(Opts { qps: [2, 1], split: AnySplit::Fixed(Fixed::percent(100)), ..Opts::default() });
    let mut held: Vec<Completion> = Vec::new();
    let mut sends = Vec::new();
    for i in 0..SLOTS as u64 {
        let (sid, ..) = message(&mut p, 256, i);
        let (qp0, rest): (Vec<_>, Vec<_>) = p.cq_s[SOUT].drain(..).partition(|c| c.qp_num == 0);
        held.extend(qp0);
        p.cq_s[SOUT].extend(rest);
        if i % 2 == 1 {
            assert_eq!(p.test_send(sid).unwrap(), Some(256));
        } else {
            assert_eq!(p.test_send(sid).unwrap(), None, "its completion is late");
            sends.push(sid);
        }
    }
    assert_eq!(held.len(), SLOTS / 2);
    // Receive SLOTS reuses slot 0 at the receiver (free since its IMM came). The sender
    // must not take it while slot 0's completion is outstanding.
    let (rid, ra) = p.irecv_one(300);
    p.deliver_all();
    let data = pattern(999, 300);
    let sa = p.send_buf(&data);
    let wrs = p.log.len();
    assert_eq!(p.isend(sbuf(sa, 300, 0)).unwrap(), None, "slot 0 still has a completion outstanding");
    assert_eq!(p.log.len(), wrs, "nothing posted");
    // The late completions arrive: every held send completes, then slot 0 is taken.
    for c in held {
        assert_eq!(WrKind::decode(c.wr_id).unwrap().0, WrKind::DataSignal);
        p.inject_send(SOUT, c).unwrap();
    }
    for sid in sends {
        assert_eq!(p.s.test(sid).unwrap(), Some(256));
    }
    let sid = p.isend(sbuf(sa, 300, 0)).unwrap().expect("slot 0 is free now");
    assert_eq!(p.s.test(sid).unwrap(), None, "not before its own WR completed");
    p.deliver_all();
    assert_eq!(p.test_send(sid).unwrap(), Some(300));
    assert_eq!(p.test_recv(rid).unwrap().unwrap().sizes[0], 300);
    assert_eq!(p.rs.space.read(ra, 300), data);
}
