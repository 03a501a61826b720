//! Every protocol violation the wire can bring is rejected with a precise error naming the
//! rail, the slot and what is wrong, and breaks the connection: every later call answers
//! "connection failed earlier: <cause>" and nothing more is interpreted or posted. Misuse
//! by the caller (too many requests, a slot still in use) is refused without breaking it.

use super::broken::*;
use super::harness::*;
use crate::engine::imm::{Imm, SIZEQ_SENTINEL};
use crate::engine::layout::{CTS_ENTRY_BYTES, CTS_SLOT_BYTES, CtsEntry, MAX_RECVS, SLOTS};
use crate::engine::{Refused, SOUT, SUP, Side, StrayCompletion, Violation, WorkRequest, WrKind};
use crate::fabric::WcStatus;

/// A pair whose receiver has one receive (slot 0) of buffers of `sizes` posted, its CTS
/// delivered to the sender and the CTS completion polled.
fn posted(o: Opts, sizes: &[u64]) -> Pair {
    let mut p = Pair::new(o);
    let bufs: Vec<_> = sizes.iter().enumerate().map(|(i, &s)| rbuf(p.recv_buf(s as usize), s, i as u32)).collect();
    assert_eq!(p.irecv(&bufs), Some(0));
    p.deliver_all();
    p.poll_recv().unwrap();
    p
}

fn imm(slot: u8, mask: RailMask, size_q: u32) -> Imm {
    Imm { slot, mask, size_q }
}

/// Injects an IMM on `rail` and expects the protocol violation `want`, arrived on that
/// rail; then the receiver is broken.
#[track_caller]
fn violation(p: &mut Pair, rail: usize, i: Imm, byte_len: u32, want: Violation) {
    assert_eq!(want.rail(), Some(rail));
    let e = rejected(p.inject_recv(rail, imm_cqe(i, byte_len)), want);
    assert_recv_broken(p, &e);
}

const BOTH: RailMask = RailMask::BOTH;
const ONLY_SOUT: RailMask = RailMask::SOUT;
const ONLY_SUP: RailMask = RailMask::SUP;

#[test]
fn imm_for_a_slot_without_a_receive_is_rejected() {
    let mut p = posted(Opts::default(), &[256]);
    violation(&mut p, SOUT, imm(7, ONLY_SOUT, 1), 100, Violation::NoReceiveWaiting { rail: SOUT, slot: 7 });
}

#[test]
fn imm_for_a_slot_whose_data_already_arrived_is_rejected() {
    let mut p = posted(Opts::default(), &[256]);
    p.inject_recv(SOUT, imm_cqe(imm(0, ONLY_SOUT, 1), 100)).unwrap();
    // Complete, not yet tested: a further IMM for it is a duplicate, not new data.
    violation(&mut p, SOUT, imm(0, ONLY_SOUT, 1), 100, Violation::NoReceiveWaiting { rail: SOUT, slot: 0 });
}

#[test]
fn mask_zero_is_rejected() {
    let mut p = posted(Opts::default(), &[256]);
    let i = imm(0, RailMask::NONE, 1);
    let want = Violation::BadMask { rail: SOUT, slot: 0, imm: i.encode(), mask: RailMask::NONE, rails: BOTH };
    violation(&mut p, SOUT, i, 100, want);
}

#[test]
fn mask_naming_a_rail_the_device_lacks_is_rejected() {
    for (rails, rail, mask) in [(ONLY_SOUT, SOUT, BOTH), (ONLY_SOUT, SOUT, ONLY_SUP), (ONLY_SUP, SUP, BOTH)] {
        let mut p = posted(Opts { rails_mask: rails, ..Opts::default() }, &[256]);
        // A single-rail device carries every CTS on its one rail.
        let cts_rail = p.log.iter().find(|(d, ..)| *d == Dir::ToSend).unwrap().1;
        assert_eq!(RailMask::of(cts_rail), rails);
        let i = imm(0, mask, 1);
        violation(&mut p, rail, i, 100, Violation::BadMask { rail, slot: 0, imm: i.encode(), mask, rails });
    }
}

#[test]
fn imm_on_a_rail_its_mask_does_not_name_is_rejected() {
    let mut p = posted(Opts::default(), &[256]);
    let want = Violation::MaskOmitsRail { rail: SUP, slot: 0, mask: ONLY_SOUT };
    violation(&mut p, SUP, imm(0, ONLY_SOUT, 1), 100, want);
}

#[test]
fn mask_differing_from_the_learned_one_is_rejected() {
    let mut p = posted(Opts::default(), &[256]);
    p.inject_recv(SOUT, imm_cqe(imm(0, BOTH, 2), 128)).unwrap();
    let want = Violation::MaskChanged { rail: SUP, slot: 0, mask: ONLY_SUP, earlier: BOTH };
    violation(&mut p, SUP, imm(0, ONLY_SUP, 2), 128, want);
}

#[test]
fn second_imm_from_the_same_rail_is_rejected() {
    let mut p = posted(Opts::default(), &[256]);
    p.inject_recv(SUP, imm_cqe(imm(0, BOTH, 2), 128)).unwrap();
    violation(&mut p, SUP, imm(0, BOTH, 2), 128, Violation::DuplicateImm { rail: SUP, slot: 0 });
}

#[test]
fn size_q_differing_between_rails_is_rejected() {
    let mut p = posted(Opts::default(), &[512]);
    p.inject_recv(SOUT, imm_cqe(imm(0, BOTH, 2), 128)).unwrap();
    let want = Violation::SizeQChanged { rail: SUP, slot: 0, size_q: 3, earlier: 2 };
    violation(&mut p, SUP, imm(0, BOTH, 3), 128, want);
}

#[test]
fn size_q_for_a_multi_receive_is_rejected() {
    let mut p = posted(Opts::default(), &[256, 256]);
    violation(&mut p, SOUT, imm(0, ONLY_SOUT, 1), 100, Violation::SizeForMultiRecv { rail: SOUT, slot: 0, n: 2 });
}

#[test]
fn bytes_not_matching_size_q_are_rejected() {
    let mismatch = |rail, bytes, size_q, posted| Violation::BytesMismatch { rail, slot: 0, bytes, size_q, posted };
    // 100 bytes cannot be size_q 2 (129..=256 bytes).
    let mut p = posted(Opts::default(), &[512]);
    violation(&mut p, SOUT, imm(0, ONLY_SOUT, 2), 100, mismatch(SOUT, 100, 2, 512));
    // The rails' bytes are summed: 128 + 128 is size_q 2, not 3.
    let mut p = posted(Opts::default(), &[512]);
    p.inject_recv(SUP, imm_cqe(imm(0, BOTH, 3), 128)).unwrap();
    violation(&mut p, SOUT, imm(0, BOTH, 3), 128, mismatch(SOUT, 256, 3, 512));
    // Consistent with size_q, but more than the posted receive.
    let mut p = posted(Opts::default(), &[100]);
    violation(&mut p, SOUT, imm(0, ONLY_SOUT, 1), 120, mismatch(SOUT, 120, 1, 100));
}

#[test]
fn completion_record_larger_than_the_posted_size_is_rejected() {
    let mut p = posted(Opts::default(), &[1000, 1000]);
    // The leader's signalling WR wrote the records; the second claims too much.
    p.rs.space.write(RECORDS, &10u64.to_le_bytes());
    p.rs.space.write(RECORDS + 8, &5000u64.to_le_bytes());
    p.inject_recv(SUP, imm_cqe(imm(0, BOTH, SIZEQ_SENTINEL), 0)).unwrap();
    let want = Violation::RecordTooLarge { rail: SOUT, slot: 0, index: 1, claimed: 5000, posted: 1000 };
    violation(&mut p, SOUT, imm(0, BOTH, SIZEQ_SENTINEL), 16, want);
}

/// Writes a CTS entry into the sender's FIFO as the receiver's WRITE would.
fn write_cts(p: &mut Pair, slot: usize, i: usize, e: CtsEntry) {
    let words: Vec<u8> = e.to_words().iter().flat_map(|w| w.to_le_bytes()).collect();
    p.ss.space.write(FIFO + (slot * CTS_SLOT_BYTES + i * CTS_ENTRY_BYTES) as u64, &words);
}

#[test]
fn cts_slot_announcing_a_bad_count_breaks_the_sender() {
    for n in [0usize, MAX_RECVS + 1] {
        let mut p = Pair::new(Opts::default());
        write_cts(
            &mut p,
            0,
            0,
            CtsEntry { size: 64, nreqs: n as u32, word: CtsEntry::word_for(0, n), ..CtsEntry::default() },
        );
        let sa = p.send_buf(&[1; 64]);
        let e = rejected(p.isend(sbuf(sa, 64, 0)), Violation::CtsBadCount { slot: 0, n });
        assert_eq!(p.log.len(), 0, "nothing posted");
        assert_send_broken(&mut p, &e);
    }
}

#[test]
fn cts_entry_inconsistent_with_its_slot_breaks_the_sender() {
    let mut p = Pair::new(Opts::default());
    let word = CtsEntry::word_for(0, 3);
    write_cts(&mut p, 0, 0, CtsEntry { size: 64, word, ..CtsEntry::default() });
    write_cts(&mut p, 0, 2, CtsEntry { size: 64, tag: 2, word, ..CtsEntry::default() });
    // The first and last words are fresh (the slot looks complete), but the middle entry
    // claims a slot of 2 receives.
    let other = CtsEntry::word_for(0, 2);
    write_cts(&mut p, 0, 1, CtsEntry { size: 64, tag: 1, word: other, ..CtsEntry::default() });
    let sa = p.send_buf(&[1; 64]);
    let want =
        Violation::CtsInconsistent { slot: 0, entry: 1, word: other, nreqs: 2, expected_word: word, expected_n: 3 };
    let e = rejected(p.isend(sbuf(sa, 64, 0)), want);
    assert_eq!(want.rail(), None, "read from memory, not from a rail");
    assert_send_broken(&mut p, &e);
}

#[test]
fn a_slot_still_outstanding_makes_irecv_wait_without_breaking_the_connection() {
    // Slot 0's receive is left untested while the 31 after it complete (NCCL may test the
    // requests of a shared comm out of order): the next irecv needs slot 0 again.
    let mut p = Pair::new(Opts::default());
    let mut bufs = Vec::new();
    for i in 0..SLOTS as u64 {
        let ra = p.recv_buf(64);
        assert_eq!(p.irecv(&[rbuf(ra, 64, 0)]), Some(i as u16));
        bufs.push(ra);
    }
    p.deliver_all();
    for i in 0..SLOTS {
        let sa = p.send_buf(&pattern(i as u64, 64));
        let sid = p.isend(sbuf(sa, 64, 0)).unwrap().expect("every CTS is there");
        p.deliver_all();
        assert_eq!(p.test_send(sid).unwrap(), Some(64));
    }
    for i in 1..SLOTS as u16 {
        assert_eq!(p.test_recv(i).unwrap().unwrap().sizes[0], 64);
    }
    let ra = p.recv_buf(64);
    let r = p.r.irecv(&[rbuf(ra, 64, 0)], &mut p.rs, &mut p.posts).expect("not an error");
    assert_eq!(r, None, "not now: slot 0 is still outstanding");
    assert_eq!(p.posts.n, 0, "nothing posted for the deferred receive");
    assert!(p.r.error().is_none(), "waiting does not break the connection");
    // Slot 0 is tested done; then it is posted again.
    assert_eq!(p.test_recv(0).unwrap().unwrap().sizes[0], 64);
    assert_eq!(p.rs.space.read(bufs[0], 64), pattern(0, 64));
    assert_eq!(p.irecv(&[rbuf(ra, 64, 0)]), Some(0));
}

#[test]
fn too_many_receives_in_flight_are_refused_without_breaking_the_connection() {
    let mut p = Pair::new(Opts::default());
    let ras: Vec<u64> = (0..33).map(|_| p.recv_buf(64)).collect();
    for (i, &ra) in ras[..32].iter().enumerate() {
        assert_eq!(p.irecv(&[rbuf(ra, 64, 0)]), Some(i as u16));
    }
    let e = p.r.irecv(&[rbuf(ras[32], 64, 0)], &mut p.rs, &mut p.posts);
    rejected(e, Refused::TooManyRecvs { max: 32 });
    assert_eq!(p.posts.n, 0);
    assert!(p.r.error().is_none());
    // Complete the first; the 33rd then goes through, in slot 0 again (32 slots).
    p.deliver_all();
    let sa = p.send_buf(&[5; 64]);
    p.isend(sbuf(sa, 64, 0)).unwrap().unwrap();
    p.deliver_all();
    p.test_recv(0).unwrap().unwrap();
    assert_eq!(p.irecv(&[rbuf(ras[32], 64, 0)]), Some(0));
}

#[test]
fn too_many_sends_in_flight_are_refused_without_breaking_the_connection() {
    let mut p = Pair::new(Opts { max_send: 2, ..Opts::default() });
    let ras: Vec<u64> = (0..3).map(|_| p.recv_buf(64)).collect();
    let rids: Vec<u16> = ras.iter().map(|&ra| p.irecv(&[rbuf(ra, 64, 0)]).unwrap()).collect();
    p.deliver_all();
    let data: Vec<Vec<u8>> = (0..3).map(|i| pattern(i, 64)).collect();
    let sas: Vec<u64> = data.iter().map(|d| p.send_buf(d)).collect();
    let s0 = p.isend(sbuf(sas[0], 64, 0)).unwrap().unwrap();
    let s1 = p.isend(sbuf(sas[1], 64, 0)).unwrap().unwrap();
    let posted = p.log.len();
    rejected(p.isend(sbuf(sas[2], 64, 0)), Refused::TooManySends { max: 2 });
    assert_eq!(p.log.len(), posted, "nothing posted for the refused send");
    assert!(p.s.error().is_none(), "refusing a call does not break the connection");
    // NCCL completes one and retries: the refused send goes through, all data lands.
    p.deliver_all();
    assert_eq!(p.test_send(s0).unwrap(), Some(64));
    let s2 = p.isend(sbuf(sas[2], 64, 0)).unwrap().expect("retried send");
    p.deliver_all();
    for (k, sid) in [(1, s1), (2, s2)] {
        assert_eq!(p.test_send(sid).unwrap(), Some(64), "send {k}");
    }
    for k in 0..3 {
        assert_eq!(p.test_recv(rids[k]).unwrap().unwrap().sizes[0], 64);
        assert_eq!(p.rs.space.read(ras[k], 64), data[k]);
    }
}

#[test]
fn unknown_wr_id_breaks_either_side() {
    let mut p = posted(Opts::default(), &[64]);
    let e = rejected(
        p.inject_recv(SUP, wr_cqe(0xdead, WcStatus::Success)),
        StrayCompletion::UnknownWrId { rail: SUP, wr_id: 0xdead },
    );
    assert_recv_broken(&mut p, &e);
    let e = rejected(
        p.inject_send(SOUT, wr_cqe(0xbeef, WcStatus::Success)),
        StrayCompletion::UnknownWrId { rail: SOUT, wr_id: 0xbeef },
    );
    assert_send_broken(&mut p, &e);
}

#[test]
fn completion_with_nothing_outstanding_breaks_the_sender() {
    for (c, want) in [
        (WrKind::DataSignal.id(SUP, 9), StrayCompletion::NoneOutstanding { rail: SUP, slot: 9 }),
        (WrKind::Probe.id(SOUT, 0), StrayCompletion::NoProbeInFlight { rail: SOUT }),
        (
            WrKind::Cts.id(SOUT, 0),
            StrayCompletion::Unexpected { rail: SOUT, what: WorkRequest::CtsWrite, side: Side::Send },
        ),
    ] {
        let mut p = Pair::new(Opts::default());
        let e = rejected(p.inject_send(SOUT, wr_cqe(c, WcStatus::Success)), want);
        assert_send_broken(&mut p, &e);
    }
}

#[test]
fn completion_with_nothing_outstanding_breaks_the_receiver() {
    let unexpected = StrayCompletion::Unexpected { rail: SOUT, what: WorkRequest::WriteWithImm, side: Side::Receive };
    for (c, want) in [
        (WrKind::Cts.id(SOUT, 2), StrayCompletion::CtsNotAwaited { slot: 2 }),
        (WrKind::Cts.id(SOUT, 0), StrayCompletion::CtsNotAwaited { slot: 0 }),
        (WrKind::Flush.id(SUP, 3), StrayCompletion::FlushNotInFlight { rail: SUP, flush: 3 }),
        (WrKind::Flush.id(SUP, 200), StrayCompletion::FlushNotInFlight { rail: SUP, flush: 200 }),
        (WrKind::DataSignal.id(SOUT, 0), unexpected),
    ] {
        // Slot 0 is posted and its (signalled) CTS completion already polled.
        let mut p = posted(Opts::default(), &[64]);
        let e = rejected(p.inject_recv(SUP, wr_cqe(c, WcStatus::Success)), want);
        assert_recv_broken(&mut p, &e);
    }
}
