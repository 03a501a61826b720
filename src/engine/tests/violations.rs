//! Every protocol violation the wire can bring is rejected with a precise error naming the
//! rail, the slot and what is wrong, and breaks the connection: every later call answers
//! "connection failed earlier: <cause>" and nothing more is interpreted or posted. Misuse
//! by the caller (too many requests, a slot still in use) is refused without breaking it.

use super::broken::*;
use super::harness::*;
use crate::engine::imm::{Imm, SIZEQ_SENTINEL};
use crate::engine::{SOUT, SUP, WrKind};
use crate::error::ErrorKind;
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

fn imm(slot: u8, mask: u8, size_q: u32) -> Imm {
    Imm { slot, mask, size_q }
}

/// Injects an IMM on `rail` and expects a protocol violation naming `needles`; then the
/// receiver is broken.
#[track_caller]
fn violation(p: &mut Pair, rail: usize, i: Imm, byte_len: u32, needles: &[&str]) {
    let e = rejected(p.inject_recv(rail, imm_cqe(i, byte_len)), ErrorKind::Remote, needles);
    assert!(e.msg.starts_with(&format!("protocol violation on the {} rail", ["SOUT", "SUP"][rail])), "{}", e.msg);
    assert_recv_broken(p, &e);
}

#[test]
fn imm_for_a_slot_without_a_receive_is_rejected() {
    let mut p = posted(Opts::default(), &[256]);
    violation(&mut p, SOUT, imm(7, 0b01, 1), 100, &["slot 7", "no receive waiting"]);
}

#[test]
fn imm_for_a_slot_whose_data_already_arrived_is_rejected() {
    let mut p = posted(Opts::default(), &[256]);
    p.inject_recv(SOUT, imm_cqe(imm(0, 0b01, 1), 100)).unwrap();
    // Complete, not yet tested: a further IMM for it is a duplicate, not new data.
    violation(&mut p, SOUT, imm(0, 0b01, 1), 100, &["slot 0", "no receive waiting"]);
}

#[test]
fn mask_zero_is_rejected() {
    let mut p = posted(Opts::default(), &[256]);
    violation(&mut p, SOUT, imm(0, 0, 1), 100, &["slot 0", "rail mask 0b0", "rails are 0b11"]);
}

#[test]
fn mask_naming_a_rail_the_device_lacks_is_rejected() {
    for (rails, rail, mask) in [(0b01u8, SOUT, 0b11u8), (0b01, SOUT, 0b10), (0b10, SUP, 0b11)] {
        let mut p = posted(Opts { rails_mask: rails, ..Opts::default() }, &[256]);
        // A single-rail device carries every CTS on its one rail.
        let cts_rail = p.log.iter().find(|(d, ..)| *d == Dir::ToSend).unwrap().1;
        assert_eq!(1 << cts_rail, rails);
        let needles = [format!("rail mask {mask:#b}"), format!("rails are {rails:#b}")];
        violation(&mut p, rail, imm(0, mask, 1), 100, &[&needles[0], &needles[1], "slot 0"]);
    }
}

#[test]
fn imm_on_a_rail_its_mask_does_not_name_is_rejected() {
    let mut p = posted(Opts::default(), &[256]);
    violation(&mut p, SUP, imm(0, 0b01, 1), 100, &["slot 0", "mask 0b1 does not name"]);
}

#[test]
fn mask_differing_from_the_learned_one_is_rejected() {
    let mut p = posted(Opts::default(), &[256]);
    p.inject_recv(SOUT, imm_cqe(imm(0, 0b11, 2), 128)).unwrap();
    violation(&mut p, SUP, imm(0, 0b10, 2), 128, &["slot 0", "mask 0b10", "earlier IMM announced 0b11"]);
}

#[test]
fn second_imm_from_the_same_rail_is_rejected() {
    let mut p = posted(Opts::default(), &[256]);
    p.inject_recv(SUP, imm_cqe(imm(0, 0b11, 2), 128)).unwrap();
    violation(&mut p, SUP, imm(0, 0b11, 2), 128, &["second IMM for slot 0"]);
}

#[test]
fn size_q_differing_between_rails_is_rejected() {
    let mut p = posted(Opts::default(), &[512]);
    p.inject_recv(SOUT, imm_cqe(imm(0, 0b11, 2), 128)).unwrap();
    violation(&mut p, SUP, imm(0, 0b11, 3), 128, &["slot 0", "size_q 3", "earlier IMM had 2"]);
}

#[test]
fn size_q_for_a_multi_receive_is_rejected() {
    let mut p = posted(Opts::default(), &[256, 256]);
    violation(&mut p, SOUT, imm(0, 0b01, 1), 100, &["slot 0", "multi-receive of 2"]);
}

#[test]
fn bytes_not_matching_size_q_are_rejected() {
    // 100 bytes cannot be size_q 2 (129..=256 bytes).
    let mut p = posted(Opts::default(), &[512]);
    violation(&mut p, SOUT, imm(0, 0b01, 2), 100, &["slot 0", "100 bytes arrived", "size_q 2"]);
    // The rails' bytes are summed: 128 + 128 is size_q 2, not 3.
    let mut p = posted(Opts::default(), &[512]);
    p.inject_recv(SUP, imm_cqe(imm(0, 0b11, 3), 128)).unwrap();
    violation(&mut p, SOUT, imm(0, 0b11, 3), 128, &["slot 0", "256 bytes arrived", "size_q 3"]);
    // Consistent with size_q, but more than the posted receive.
    let mut p = posted(Opts::default(), &[100]);
    violation(&mut p, SOUT, imm(0, 0b01, 1), 120, &["slot 0", "120 bytes arrived", "100-byte receive"]);
}

#[test]
fn completion_record_larger_than_the_posted_size_is_rejected() {
    let mut p = posted(Opts::default(), &[1000, 1000]);
    // The leader's signalling WR wrote the records; the second claims too much.
    p.rs.space.write(RECORDS, &10u64.to_le_bytes());
    p.rs.space.write(RECORDS + 8, &5000u64.to_le_bytes());
    p.inject_recv(SUP, imm_cqe(imm(0, 0b11, SIZEQ_SENTINEL), 0)).unwrap();
    violation(
        &mut p,
        SOUT,
        imm(0, 0b11, SIZEQ_SENTINEL),
        16,
        &["slot 0", "completion record 1 claims 5000 bytes for a 1000-byte receive"],
    );
}

#[test]
fn slot_reused_while_outstanding_is_refused_without_breaking_the_connection() {
    // More receives allowed than there are slots: the 257th finds slot 0 still in use.
    let mut p = Pair::new(Opts { max_recv: 300, srq: (8, 300), ..Opts::default() });
    let mut bufs = Vec::new();
    for i in 0..256u64 {
        let ra = p.recv_buf(64);
        assert_eq!(p.irecv(&[rbuf(ra, 64, 0)]), Some(i as u16));
        bufs.push(ra);
    }
    let ra = p.recv_buf(64);
    let e = p.r.irecv(p.now, &[rbuf(ra, 64, 0)], &mut p.rs, &mut p.posts);
    rejected(e, ErrorKind::Internal, &["CTS slot 0 reused while its receive is still outstanding"]);
    assert_eq!(p.posts.n, 0, "nothing posted for the refused receive");
    assert!(p.r.error().is_none(), "refusing a call does not break the connection");
    // Slot 0 completes normally; then slot 0 can be posted again.
    p.deliver_all();
    let data = pattern(1, 64);
    let sa = p.send_buf(&data);
    let sid = p.isend(sbuf(sa, 64, 0)).unwrap().expect("CTS 0 is there");
    p.deliver_all();
    assert_eq!(p.test_recv(0).unwrap().unwrap().sizes[0], 64);
    assert_eq!(p.rs.space.read(bufs[0], 64), data);
    assert_eq!(p.test_send(sid).unwrap(), Some(64));
    assert_eq!(p.irecv(&[rbuf(ra, 64, 0)]), Some(0));
}

#[test]
fn too_many_receives_in_flight_are_refused_without_breaking_the_connection() {
    let mut p = Pair::new(Opts::default());
    let ras: Vec<u64> = (0..33).map(|_| p.recv_buf(64)).collect();
    for (i, &ra) in ras[..32].iter().enumerate() {
        assert_eq!(p.irecv(&[rbuf(ra, 64, 0)]), Some(i as u16));
    }
    let e = p.r.irecv(p.now, &[rbuf(ras[32], 64, 0)], &mut p.rs, &mut p.posts);
    rejected(e, ErrorKind::Internal, &["too many receives in flight (at most 32)"]);
    assert_eq!(p.posts.n, 0);
    assert!(p.r.error().is_none());
    // Complete the first; the 33rd then goes through in slot 32.
    p.deliver_all();
    let sa = p.send_buf(&[5; 64]);
    p.isend(sbuf(sa, 64, 0)).unwrap().unwrap();
    p.deliver_all();
    p.test_recv(0).unwrap().unwrap();
    assert_eq!(p.irecv(&[rbuf(ras[32], 64, 0)]), Some(32));
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
    rejected(p.isend(sbuf(sas[2], 64, 0)), ErrorKind::Internal, &["too many send requests in flight (at most 2)"]);
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
        ErrorKind::Internal,
        &["SUP rail", "unknown wr_id 0xdead"],
    );
    assert_recv_broken(&mut p, &e);
    let e = rejected(
        p.inject_send(SOUT, wr_cqe(0xbeef, WcStatus::Success)),
        ErrorKind::Internal,
        &["SOUT rail", "unknown wr_id 0xbeef"],
    );
    assert_send_broken(&mut p, &e);
}

#[test]
fn completion_with_nothing_outstanding_breaks_the_sender() {
    for (c, needle) in [
        (WrKind::DataSignal.id(SUP, 9), "completion for slot 9, which has none outstanding"),
        (WrKind::Probe.id(SOUT, 0), "probe completion, but no probe is in flight"),
        (WrKind::Cts.id(SOUT, 0), "unexpected Cts completion on a send connection"),
    ] {
        let mut p = Pair::new(Opts::default());
        let e = rejected(p.inject_send(SOUT, wr_cqe(c, WcStatus::Success)), ErrorKind::Internal, &[needle]);
        assert_send_broken(&mut p, &e);
    }
}

#[test]
fn completion_with_nothing_outstanding_breaks_the_receiver() {
    for (c, needle) in [
        (WrKind::Cts.id(SOUT, 2), "CTS completion for slot 2, which awaits none"),
        (WrKind::Cts.id(SOUT, 0), "CTS completion for slot 0, which awaits none"),
        (WrKind::Flush.id(SUP, 3), "flush completion for flush 3"),
        (WrKind::Flush.id(SUP, 200), "flush completion for flush 200"),
        (WrKind::DataSignal.id(SOUT, 0), "unexpected DataSignal completion on a receive connection"),
    ] {
        // Slot 0 is posted and its (signalled) CTS completion already polled.
        let mut p = posted(Opts::default(), &[64]);
        let e = rejected(p.inject_recv(SUP, wr_cqe(c, WcStatus::Success)), ErrorKind::Internal, &[needle]);
        assert_recv_broken(&mut p, &e);
    }
}
