//! The protocol's behaviour: shapes of what is posted, sizes, splits, multi-receives,
//! slot wrap-around, mask learning in either arrival order.

use super::harness::*;
use crate::engine::CTS_SIGNAL_EVERY;
use crate::engine::imm::{Imm, MAX_FAST_SIZE, SIZEQ_SENTINEL};
use crate::engine::{QpRef, Refused, SOUT, SUP};
use crate::error::{Cause, ErrorKind};
use crate::fabric::WrOpcode;
use crate::split::{AnySplit, Fixed};

fn opts(percent: u8) -> Opts {
    Opts { split: AnySplit::Fixed(Fixed::percent(percent)), ..Opts::default() }
}

/// One message of `len` bytes into a `posted`-byte receive; returns (received size, sent size).
fn one(p: &mut Pair, len: usize, posted: usize, seed: u64) -> (u64, u64) {
    let data = pattern(seed, len);
    let sa = p.send_buf(&data);
    let ra = p.recv_buf(posted);
    let rid = p.irecv(&[rbuf(ra, posted as u64, 7)]).unwrap();
    p.deliver_all();
    let sid = p.isend(sbuf(sa, len as u64, 7)).unwrap().expect("CTS was delivered");
    p.deliver_all();
    let got = p.test_recv(rid).unwrap().expect("receive complete");
    let sent = p.test_send(sid).unwrap().expect("send complete");
    let n = (got.sizes[0] as usize).min(len);
    assert_eq!(p.rs.space.read(ra, n), data[..n], "payload of {len} bytes");
    (got.sizes[0], sent)
}

#[test]
fn sizes_are_exact_and_data_lands_with_a_half_split() {
    let mut p = Pair::new(opts(50));
    for (i, len) in [0usize, 1, 127, 128, 129, 255, 256, 4096, (1 << 20) + 3].into_iter().enumerate() {
        assert_eq!(one(&mut p, len, len.max(1) + 64, i as u64), (len as u64, len as u64), "len {len}");
    }
    assert_eq!(p.s.counters()[SOUT].zero_byte_imm + p.s.counters()[SUP].zero_byte_imm, 0);
}

#[test]
fn fast_path_posts_one_write_with_imm_per_active_rail() {
    let mut p = Pair::new(opts(50));
    one(&mut p, 1 << 20, 1 << 20, 1);
    for rail in [SOUT, SUP] {
        let wrs: Vec<_> = p.log.iter().filter(|(d, r, _, _)| *d == Dir::ToRecv && *r == rail).collect();
        assert_eq!(wrs.len(), 1, "rail {rail}: exactly one WR");
        let wr = wrs[0].3;
        assert_eq!(wr.opcode, WrOpcode::WriteImm);
        assert!(wr.signaled);
        assert_eq!(wr.bytes(), 1 << 19);
        let imm = Imm::decode(wr.imm);
        assert_eq!((imm.mask, imm.size_q), (RailMask::BOTH, (1 << 20) / 128));
    }
}

#[test]
fn inactive_rail_sends_nothing() {
    for (percent, active) in [(100u8, SOUT), (0, SUP)] {
        let mut p = Pair::new(opts(percent));
        for i in 0..5 {
            one(&mut p, 4096 * (i + 1), 65536, i as u64);
        }
        let idle = 1 - active;
        assert_eq!(p.wrs_on(Dir::ToRecv, idle), 0, "{percent}%: nothing at all on the idle rail");
        assert_eq!(p.wrs_on(Dir::ToRecv, active), 5);
        assert_eq!(p.s.counters()[idle].imm_sent, 0);
        assert_eq!(p.s.counters()[active].imm_sent, 5);
    }
}

#[test]
fn empty_transfer_uses_sout_alone_even_when_split_says_sup() {
    let mut p = Pair::new(opts(0));
    assert_eq!(one(&mut p, 0, 128, 3), (0, 0));
    assert_eq!(p.wrs_on(Dir::ToRecv, SUP), 0);
    let (_, _, _, wr) = p.log.iter().find(|(d, _, _, _)| *d == Dir::ToRecv).unwrap();
    assert_eq!(Imm::decode(wr.imm).mask, RailMask::SOUT);
    assert_eq!(p.s.counters()[SOUT].zero_byte_imm, 0, "an empty transfer's IMM is not a wasted one");
}

#[test]
fn receive_larger_than_send_reports_the_real_size() {
    let mut p = Pair::new(opts(50));
    assert_eq!(one(&mut p, 1000, 1 << 16, 9), (1000, 1000));
}

#[test]
fn send_larger_than_receive_is_refused_and_the_receive_waits_for_one_that_fits() {
    let mut p = Pair::new(opts(50));
    let data = pattern(4, 5000);
    let sa = p.send_buf(&data);
    let ra = p.recv_buf(3000);
    let rid = p.irecv(&[rbuf(ra, 3000, 7)]).unwrap();
    p.deliver_all();
    for _ in 0..3 {
        let e = p.isend(sbuf(sa, 5000, 7)).unwrap_err();
        assert_eq!(e.kind, ErrorKind::InvalidUsage, "{e}");
        assert!(matches!(e.cause, Cause::Refused(Refused::LargerThanReceive { size: 5000, posted: 3000, .. })), "{e}");
        assert!(p.log.iter().all(|(d, ..)| *d != Dir::ToRecv), "nothing of a refused send goes out");
    }
    assert_eq!(p.s.mismatches(), 3);
    let sid = p.isend(sbuf(sa, 3000, 7)).unwrap().expect("the CTS entry is still there");
    p.deliver_all();
    assert_eq!(p.test_recv(rid).unwrap().expect("receive complete").sizes[0], 3000);
    assert_eq!(p.test_send(sid).unwrap(), Some(3000));
    assert_eq!(p.rs.space.read(ra, 3000), data[..3000]);
}

#[test]
fn multi_receive_matches_tags_and_reads_sizes_from_records() {
    let mut p = Pair::new(opts(50));
    let lens = [1000usize, 0, 4096, 129, 70_000, 8, 128, 33];
    let ras: Vec<u64> = lens.iter().map(|&l| p.recv_buf(l + 256)).collect();
    let bufs: Vec<_> =
        ras.iter().zip(lens).enumerate().map(|(i, (&a, l))| rbuf(a, l as u64 + 256, 100 + i as u32)).collect();
    let rid = p.irecv(&bufs).unwrap();
    p.deliver_all();
    // Sends in a different order than the receive's buffers; tags pick the buffer.
    let order = [5usize, 2, 7, 0, 1, 6, 3, 4];
    let mut sids = Vec::new();
    for &i in &order {
        let data = pattern(i as u64, lens[i]);
        let sa = p.send_buf(&data);
        sids.push(p.isend(sbuf(sa, lens[i] as u64, 100 + i as u32)).unwrap().expect("slot is posted"));
        if sids.len() < 8 {
            assert!(
                p.log.iter().all(|(d, ..)| *d != Dir::ToRecv),
                "nothing is posted before the whole slot is matched"
            );
        }
    }
    p.deliver_all();
    let got = p.test_recv(rid).unwrap().expect("complete");
    assert_eq!(got.n, 8);
    for i in 0..8 {
        assert_eq!(got.sizes[i], lens[i] as u64, "size of buffer {i}");
        assert_eq!(p.rs.space.read(ras[i], lens[i]), pattern(i as u64, lens[i]), "data of buffer {i}");
    }
    for (k, sid) in sids.into_iter().enumerate() {
        assert_eq!(p.test_send(sid).unwrap(), Some(lens[order[k]] as u64));
    }
    // Shape: each active rail = its non-empty data WRITEs + one signalling WRITE_WITH_IMM,
    // the leader (SOUT) writing the 8 sizes.
    for rail in [SOUT, SUP] {
        let wrs: Vec<_> = p.log.iter().filter(|(d, r, ..)| *d == Dir::ToRecv && *r == rail).map(|x| x.3).collect();
        let last = wrs.last().unwrap();
        assert_eq!(last.opcode, WrOpcode::WriteImm);
        assert_eq!(Imm::decode(last.imm).size_q, SIZEQ_SENTINEL);
        assert!(wrs[..wrs.len() - 1].iter().all(|w| w.opcode == WrOpcode::Write && !w.signaled && w.bytes() > 0));
        assert_eq!(last.bytes(), if rail == SOUT { 64 } else { 0 }, "only the leader writes the records");
    }
}

#[test]
fn oversized_single_receive_uses_the_sentinel_and_records() {
    let mut p = Pair::new(opts(50));
    let size = MAX_FAST_SIZE as usize + 4096;
    let (sa, ra) = p.virtual_bufs(size);
    let rid = p.irecv(&[rbuf(ra, size as u64, 1)]).unwrap();
    p.deliver_all();
    let sid = p.isend(sbuf(sa, size as u64, 1)).unwrap().unwrap();
    p.deliver_all();
    assert_eq!(p.test_recv(rid).unwrap().unwrap().sizes[0], size as u64);
    assert_eq!(p.test_send(sid).unwrap(), Some(size as u64));
    let sout: Vec<_> = p.log.iter().filter(|(d, r, ..)| *d == Dir::ToRecv && *r == SOUT).map(|x| x.3).collect();
    assert_eq!(sout.len(), 2, "data WRITE + signalling WR carrying the record");
    assert_eq!(Imm::decode(sout[1].imm).size_q, SIZEQ_SENTINEL);
    assert_eq!(sout[1].bytes(), 8);
}

#[test]
fn mask_is_learned_whichever_rail_arrives_first() {
    for first in [SOUT, SUP] {
        let mut p = Pair::new(opts(50));
        let data = pattern(5, 8192);
        let sa = p.send_buf(&data);
        let ra = p.recv_buf(8192);
        let rid = p.irecv(&[rbuf(ra, 8192, 0)]).unwrap();
        p.deliver_all();
        p.isend(sbuf(sa, 8192, 0)).unwrap().unwrap();
        assert!(p.step(Dir::ToRecv, first, 0));
        assert_eq!(p.test_recv(rid).unwrap(), None, "one rail of two is not complete");
        assert!(p.step(Dir::ToRecv, 1 - first, 0));
        assert_eq!(p.test_recv(rid).unwrap().unwrap().sizes[0], 8192);
        assert_eq!(p.rs.space.read(ra, 8192), data);
    }
}

#[test]
fn slots_wrap_around_with_requests_in_flight() {
    let mut p = Pair::new(opts(37));
    let mut inflight = std::collections::VecDeque::new();
    for i in 0..700u64 {
        let len = (i as usize * 131) % 5000;
        let data = pattern(i, len);
        let sa = p.send_buf(&data);
        let ra = p.recv_buf(5000);
        let rid = p.irecv(&[rbuf(ra, 5000, 3)]).unwrap();
        p.deliver_all();
        let sid = p.isend(sbuf(sa, len as u64, 3)).unwrap().unwrap_or_else(|| panic!("message {i}: no CTS"));
        inflight.push_back((rid, sid, ra, data));
        if inflight.len() == 20 {
            p.deliver_all();
            while let Some((rid, sid, ra, data)) = inflight.pop_front() {
                // SRQ credits run out with 20 in flight (RNR): refills let the rest through.
                p.refill();
                p.deliver_all();
                assert_eq!(p.test_recv(rid).unwrap().unwrap().sizes[0], data.len() as u64);
                assert_eq!(p.test_send(sid).unwrap(), Some(data.len() as u64));
                assert_eq!(p.rs.space.read(ra, data.len()), data);
            }
        }
    }
    assert!(p.rnr.iter().sum::<u64>() > 0, "the small SRQ made senders wait (RNR) and they recovered");
}

/// The CTS follow the data: once a transfer came on one rail, the next CTS go on that rail
/// (on the soft fabric they ride with its traffic); before any data, or after a split
/// transfer, by slot. Every CTS_SIGNAL_EVERY-th CTS of a rail is signalled (what bounds the
/// CTS QP's send queue), and its slot completes only once that CTS completed.
#[test]
fn cts_follow_one_rail_data_and_each_rails_sixteenth_is_signalled() {
    for (percent, rail) in [(100, SOUT), (0, SUP)] {
        let mut p = Pair::new(opts(percent));
        for i in 0..40 {
            assert_eq!(one(&mut p, 512, 512, i), (512, 512));
        }
        let cts: Vec<_> = p.log.iter().filter(|(d, ..)| *d == Dir::ToSend).collect();
        assert_eq!(cts.len(), 40);
        assert_eq!(cts[0].1, SOUT, "slot 0's by slot (no data yet)");
        for (i, (_, r, qp, _)) in cts.iter().enumerate().skip(1) {
            assert_eq!((*r, *qp), (rail, QpRef::Cts), "CTS {i} follows the data");
        }
        let signalled: Vec<usize> = cts.iter().enumerate().filter(|(_, c)| c.3.signaled).map(|(i, _)| i).collect();
        let every = CTS_SIGNAL_EVERY as usize;
        let want = if rail == SOUT { vec![every - 1, 2 * every - 1] } else { vec![every, 2 * every] };
        assert_eq!(signalled, want, "rail {rail}");
        assert!(cts.iter().all(|c| c.3.deferrable), "no CTS needs a doorbell of its own, signalled or not");
        let data: Vec<_> = p.log.iter().filter(|(d, ..)| *d == Dir::ToRecv).collect();
        assert!(data.iter().all(|c| !c.3.deferrable), "the sender's data does");
        assert_eq!(p.r.counters()[rail].cqe, 40 + 2, "40 IMMs and the 2 signalled CTS completed");
    }
    // A half split: an empty message goes on SOUT alone, the next CTS (slot 1) follows it;
    // after split data, by slot again.
    let mut p = Pair::new(opts(50));
    one(&mut p, 0, 64, 0);
    for i in 1..8 {
        one(&mut p, 4096, 4096, i);
    }
    let rails: Vec<usize> = p.log.iter().filter(|(d, ..)| *d == Dir::ToSend).map(|c| c.1).collect();
    assert_eq!(rails, [SOUT, SOUT, SOUT, SUP, SOUT, SUP, SOUT, SUP], "slot 1's followed SOUT, then by slot");
}

#[test]
fn data_qps_round_robin_one_qp_per_rail_per_request() {
    let mut p = Pair::new(Opts { qps: [2, 3], ..opts(50) });
    for i in 0..6 {
        one(&mut p, 1024, 1024, i);
    }
    for (rail, nqp) in [(SOUT, 2u16), (SUP, 3)] {
        let qps: Vec<u16> = p
            .log
            .iter()
            .filter(|(d, r, ..)| *d == Dir::ToRecv && *r == rail)
            .map(|(_, _, q, _)| match q {
                QpRef::Data(i) => *i,
                other => panic!("data on {other:?}"),
            })
            .collect();
        assert_eq!(qps, (0..6).map(|i| i % nqp).collect::<Vec<_>>(), "rail {rail}");
    }
    // CTS always on the rail's first QP; the data split over both rails, so they
    // alternate rails by slot; none is its rail's CTS_SIGNAL_EVERY-th yet.
    let cts: Vec<_> = p.log.iter().filter(|(d, ..)| *d == Dir::ToSend).collect();
    for (slot, (_, rail, qp, wr)) in cts.iter().enumerate() {
        assert_eq!((*rail, *qp), (slot % 2, QpRef::Cts));
        assert!(!wr.signaled, "slot {slot}");
    }
}
