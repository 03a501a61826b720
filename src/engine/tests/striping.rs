//! Striping a rail's share over its QPs (`MPIB_QP_STRIPE`): the pieces, where they go,
//! what the receiver counts, and every IMM a hostile or broken sender could make of the
//! pieces field rejected precisely. (The random models cover the interleavings and the
//! failover of striped shares: `interleavings.rs`, `failover/mod.rs`.)

use super::broken::*;
use super::harness::*;
use crate::engine::imm::{Imm, MAX_PIECES, SIZEQ_SENTINEL, SLOT_BITS};
use crate::engine::send::stripe;
use crate::engine::{QpRef, SOUT, SUP, Violation, WrKind};
use crate::fabric::{WcOpcode, WrOpcode};
use crate::split::{AnySplit, Fixed};

fn striped(qps: [u16; 2], pieces: [u8; 2], percent: u8) -> Opts {
    Opts { qps, pieces, split: AnySplit::Fixed(Fixed::percent(percent)), ..Opts::default() }
}

#[test]
fn a_share_is_cut_into_128_byte_multiples_never_an_empty_piece() {
    assert_eq!(stripe(0, 4), (0, 1));
    assert_eq!(stripe(128, 4), (128, 1), "one granule: one piece");
    assert_eq!(stripe(129, 4), (128, 2));
    assert_eq!(stripe(300, 3), (128, 3));
    assert_eq!(stripe(1000, 16), (128, 8), "no more pieces than granules");
    assert_eq!(stripe(1 << 20, 4), (256 << 10, 4));
    assert_eq!(stripe((1 << 20) + 1, 4), ((256 << 10) + 128, 4));
    assert_eq!(stripe(5000, 1), (5000, 1), "not striped");
    for bytes in [1u64, 127, 129, 255, 256, 257, 511, 4097, 65_537, 3 << 20] {
        for most in 1..=MAX_PIECES {
            let (piece, k) = stripe(bytes, most);
            assert!((1..=most).contains(&k), "{bytes} over {most}: {k} pieces");
            assert!(k == 1 || piece % 128 == 0, "{bytes} over {most}: piece {piece}");
            assert!(
                piece * (k as u64 - 1) < bytes && piece * k as u64 >= bytes,
                "{bytes} over {most}: every piece carries bytes"
            );
        }
    }
}

#[test]
fn each_piece_goes_on_its_own_qp_and_the_receive_completes_with_the_last() {
    let mut p = Pair::new(striped([4, 2], [4, 2], 50));
    let size = 10_000usize;
    let ra = p.recv_buf(size);
    let rid = p.irecv(&[rbuf(ra, size as u64, 0)]).unwrap();
    p.deliver_all();
    let first = p.chains.len();
    let data = pattern(5, size);
    let sa = p.send_buf(&data);
    let sid = p.isend(sbuf(sa, size as u64, 0)).unwrap().unwrap();
    let chains: Vec<ChainRec> = p.chains[first..].to_vec();
    // 50 %: 4992 bytes on SOUT in 4 pieces of 1280 (the last 1152), 5008 on SUP in 2 of 2560.
    let per_rail = |rail| chains.iter().filter(|c| c.rail == rail).collect::<Vec<_>>();
    for (rail, pieces, share) in [(SOUT, 4u8, 4992u64), (SUP, 2, 5008)] {
        let cs = per_rail(rail);
        assert_eq!(cs.len(), pieces as usize, "rail {rail}: a chain per piece");
        let qps: Vec<QpRef> = cs.iter().map(|c| c.qp).collect();
        let mut distinct = qps.clone();
        distinct.dedup();
        assert_eq!(distinct.len(), qps.len(), "rail {rail}: pieces on distinct QPs {qps:?}");
        let wrs: Vec<_> = cs.iter().map(|c| p.log[c.start].3).collect();
        assert!(cs.iter().all(|c| c.len == 1), "the fast path: one WRITE_WITH_IMM per piece");
        assert_eq!(wrs.iter().map(|w| w.bytes()).sum::<u64>(), share);
        for w in &wrs {
            assert_eq!(w.opcode, WrOpcode::WriteImm);
            let i = Imm::decode(w.imm);
            assert_eq!((Imm::pieces_of(i.slot), i.slot & SLOT_BITS, i.size_q), (pieces, 0, 79));
            assert_eq!(WrKind::decode(w.wr_id).map(|d| (d.0, d.1)), Some((WrKind::DataSignal, rail)));
        }
    }
    // Every WR but SOUT's last piece: the receive waits; the sends too.
    let last = chains.iter().rev().find(|c| c.rail == SOUT).unwrap();
    let QpRef::Data(last_qp) = last.qp else { unreachable!() };
    p.hold_acks(SOUT, last_qp as usize);
    let held = p.wires[Dir::ToRecv as usize][SOUT][last_qp as usize].q.pop_front().unwrap();
    p.deliver_all();
    assert_eq!(p.test_recv(rid).unwrap(), None, "three of SOUT's four pieces are in");
    assert_eq!(p.test_send(sid).unwrap(), None);
    p.wires[Dir::ToRecv as usize][SOUT][last_qp as usize].q.push_front(held);
    p.deliver_all();
    let got = p.test_recv(rid).unwrap().expect("complete with the last piece");
    assert_eq!((got.n, got.sizes[0]), (1, size as u64));
    assert_eq!(p.rs.space.read(ra, size), data);
    assert_eq!(p.test_send(sid).unwrap(), None, "the last piece's ack is held");
    p.release_acks(SOUT, last_qp as usize);
    assert_eq!(p.test_send(sid).unwrap(), Some(size as u64));
    let c = p.s.counters();
    assert_eq!((c[SOUT].imm_sent, c[SUP].imm_sent, c[SOUT].doorbells), (4, 2, 4));
    assert_eq!(c[SOUT].zero_byte_imm + c[SUP].zero_byte_imm, 0);
}

#[test]
fn a_multi_receive_share_runs_across_sends_and_the_first_piece_writes_the_sizes() {
    let mut p = Pair::new(striped([3, 1], [3, 1], 100));
    let sizes = [700usize, 50, 900];
    let ras: Vec<u64> = sizes.iter().map(|&s| p.recv_buf(s)).collect();
    let bufs: Vec<_> = sizes.iter().zip(&ras).enumerate().map(|(i, (&s, &a))| rbuf(a, s as u64, i as u32)).collect();
    let rid = p.irecv(&bufs).unwrap();
    p.deliver_all();
    let first = p.chains.len();
    let data: Vec<Vec<u8>> = sizes.iter().enumerate().map(|(i, &s)| pattern(9 + i as u64, s)).collect();
    for (i, d) in data.iter().enumerate() {
        let sa = p.send_buf(d);
        p.isend(sbuf(sa, d.len() as u64, i as u32)).unwrap().unwrap();
    }
    let chains: Vec<ChainRec> = p.chains[first..].to_vec();
    assert!(chains.iter().all(|c| c.rail == SOUT), "100 % on SOUT");
    // 1650 bytes over 3: pieces of 640, 640 and 370; the first crosses from send 0 into 1.
    let shape: Vec<Vec<(WrOpcode, u64)>> = chains
        .iter()
        .map(|c| p.log[c.start..c.start + c.len].iter().map(|x| (x.3.opcode, x.3.bytes())).collect())
        .collect();
    use WrOpcode::{Write, WriteImm};
    assert_eq!(
        shape,
        vec![
            vec![(Write, 640), (WriteImm, 24)],
            vec![(Write, 60), (Write, 50), (Write, 530), (WriteImm, 0)],
            vec![(Write, 370), (WriteImm, 0)],
        ]
    );
    for c in &chains {
        let i = Imm::decode(p.log[c.start + c.len - 1].3.imm);
        assert_eq!((Imm::pieces_of(i.slot), i.size_q), (3, SIZEQ_SENTINEL));
    }
    p.deliver_all();
    let got = p.test_recv(rid).unwrap().expect("complete");
    for (i, d) in data.iter().enumerate() {
        assert_eq!(got.sizes[i], d.len() as u64);
        assert_eq!(p.rs.space.read(ras[i], d.len()), *d);
    }
}

#[test]
fn small_shares_and_rails_that_do_not_stripe_stay_one_chain() {
    let mut p = Pair::new(striped([4, 4], [4, 1], 50));
    let ra = p.recv_buf(8192);
    let rid = p.irecv(&[rbuf(ra, 8192, 0)]).unwrap();
    p.deliver_all();
    let first = p.chains.len();
    let sa = p.send_buf(&[3; 200]);
    let sid = p.isend(sbuf(sa, 200, 0)).unwrap().unwrap();
    // 200 bytes at 50 %: 128 on SOUT (one granule: one piece), 72 on SUP (not striped).
    let rails: Vec<usize> = p.chains[first..].iter().map(|c| c.rail).collect();
    assert_eq!(rails, vec![SOUT, SUP]);
    for c in &p.chains[first..] {
        assert_eq!(Imm::pieces_of(Imm::decode(p.log[c.start].3.imm).slot), 1);
    }
    p.deliver_all();
    assert_eq!(p.test_recv(rid).unwrap().unwrap().sizes[0], 200);
    assert_eq!(p.test_send(sid).unwrap(), Some(200));
}

/// A receiver of a connection whose sender stripes over `pieces`, with one 64 KiB receive
/// posted (slot 0); an IMM of slot 0 on `rail` announcing `k` pieces, with `replay`.
fn posted(pieces: [u8; 2]) -> Pair {
    let mut p = Pair::new(striped([4, 4], pieces, 50));
    let ra = p.recv_buf(65536);
    assert_eq!(p.irecv(&[rbuf(ra, 65536, 0)]), Some(0));
    p.deliver_all();
    p.poll_recv().unwrap();
    p
}

fn piece(k: u8, mask: RailMask) -> crate::fabric::Completion {
    let v = Imm::with_pieces(Imm { slot: 0, mask, size_q: 512 }.encode(), k);
    crate::fabric::Completion { opcode: WcOpcode::RecvRdmaWithImm, imm: v, byte_len: 8192, ..Default::default() }
}

#[track_caller]
fn refused(p: &mut Pair, rail: usize, c: crate::fabric::Completion, want: Violation) {
    let e = rejected(p.inject_recv(rail, c), want);
    assert!(e.to_string().contains("piece") || e.to_string().contains("IMM"), "{e}");
    assert_recv_broken(p, &e);
}

#[test]
fn more_pieces_than_the_sender_announced_are_rejected() {
    let mut p = posted([2, 1]);
    refused(&mut p, SOUT, piece(3, RailMask::BOTH), Violation::BadPieces { rail: SOUT, slot: 0, pieces: 3, most: 2 });
    let mut p = posted([2, 1]);
    let want = Violation::BadPieces { rail: SUP, slot: 0, pieces: 2, most: 1 };
    refused(&mut p, SUP, piece(2, RailMask::BOTH), want);
    let e = want.to_string();
    assert!(e.contains("on the SUP rail") && e.contains("2 pieces") && e.contains("at most 1"), "{e}");
}

#[test]
fn a_piece_count_that_changes_within_a_share_is_rejected() {
    let mut p = posted([4, 4]);
    p.inject_recv(SOUT, piece(4, RailMask::BOTH)).unwrap();
    let want = Violation::PiecesChanged { rail: SOUT, slot: 0, pieces: 3, earlier: 4 };
    refused(&mut p, SOUT, piece(3, RailMask::BOTH), want);
}

#[test]
fn a_piece_beyond_the_count_is_a_duplicate() {
    let mut p = posted([2, 2]);
    p.inject_recv(SOUT, piece(2, RailMask::BOTH)).unwrap();
    p.inject_recv(SOUT, piece(2, RailMask::BOTH)).unwrap();
    assert_eq!(p.r.test(0).unwrap(), None, "SUP's part is still out");
    refused(&mut p, SOUT, piece(2, RailMask::BOTH), Violation::DuplicateImm { rail: SOUT, slot: 0 });
}

#[test]
fn pieces_must_agree_with_the_other_rails_mask_and_size() {
    let mut p = posted([2, 2]);
    p.inject_recv(SUP, piece(2, RailMask::BOTH)).unwrap();
    let want = Violation::MaskChanged { rail: SUP, slot: 0, mask: RailMask::SUP, earlier: RailMask::BOTH };
    refused(&mut p, SUP, piece(2, RailMask::SUP), want);
    let mut p = posted([2, 2]);
    p.inject_recv(SOUT, piece(2, RailMask::BOTH)).unwrap();
    let mut c = piece(2, RailMask::BOTH);
    c.imm = Imm::with_pieces(Imm { slot: 0, mask: RailMask::BOTH, size_q: 511 }.encode(), 2);
    refused(&mut p, SUP, c, Violation::SizeQChanged { rail: SUP, slot: 0, size_q: 511, earlier: 512 });
}

#[test]
fn pieces_whose_bytes_do_not_add_up_to_the_size_are_rejected() {
    let mut p = posted([2, 2]);
    for rail in [SOUT, SOUT, SUP] {
        p.inject_recv(rail, piece(2, RailMask::BOTH)).unwrap();
    }
    // 4 × 8192 in, size_q says 64 KiB: the last piece completes the slot and fails the sum.
    let want = Violation::BytesMismatch { rail: SUP, slot: 0, bytes: 32768, size_q: 512, posted: 65536 };
    refused(&mut p, SUP, piece(2, RailMask::BOTH), want);
}

#[test]
fn a_replay_carries_a_part_whole_never_pieces() {
    let mut p = posted([4, 4]);
    let mut c = piece(2, RailMask::BOTH);
    c.imm = Imm::replayed(c.imm);
    refused(&mut p, SUP, c, Violation::BadPieces { rail: SUP, slot: 0, pieces: 2, most: 1 });
}
