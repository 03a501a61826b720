//! Splits of 0 %, 100 % and any percentage (random per run), multi-QP rails, and the
//! per-rail counters checked to the exact value for scripted scenarios.

use proptest::prelude::*;

use super::harness::*;
use crate::engine::imm::{Imm, MAX_FAST_SIZE, SIZEQ_SENTINEL};
use crate::engine::{QpRef, RAILS, RailCounts, RailMask, SOUT, SUP, WrKind};
use crate::fabric::{SendWr, WrOpcode};
use crate::split::{AnySplit, Fixed, SplitPolicy};
use crate::telemetry::RailView;

fn opts(percent: u8) -> Opts {
    Opts { split: AnySplit::Fixed(Fixed::percent(percent)), ..Opts::default() }
}

/// The data chains of one transfer: (rail, qp, WRs).
type Chains = Vec<(usize, QpRef, Vec<SendWr>)>;

/// One receive of `sizes` (posted sizes = `sizes`, tags 0..n), sent in order and delivered.
/// Checks sizes and data; returns the transfer's chains and the receive buffers.
fn transfer_to(p: &mut Pair, sizes: &[usize], seed: u64) -> (Chains, Vec<u64>) {
    let ras: Vec<u64> = sizes.iter().map(|&s| p.recv_buf(s)).collect();
    let bufs: Vec<_> = sizes.iter().zip(&ras).enumerate().map(|(i, (&s, &a))| rbuf(a, s as u64, i as u32)).collect();
    let rid = p.irecv(&bufs).unwrap();
    p.deliver_all();
    let first_chain = p.chains.len();
    let data: Vec<Vec<u8>> = sizes.iter().enumerate().map(|(i, &s)| pattern(seed * 8 + i as u64, s)).collect();
    let sids: Vec<u16> = data
        .iter()
        .enumerate()
        .map(|(i, d)| {
            let sa = p.send_buf(d);
            p.isend(sbuf(sa, d.len() as u64, i as u32)).unwrap().unwrap()
        })
        .collect();
    let chains: Vec<_> = p.chains[first_chain..]
        .iter()
        .map(|c| (c.rail, c.qp, p.log[c.start..c.start + c.len].iter().map(|x| x.3).collect()))
        .collect();
    p.deliver_all();
    let got = p.test_recv(rid).unwrap().expect("receive complete");
    assert_eq!(got.n, sizes.len());
    for (i, d) in data.iter().enumerate() {
        assert_eq!(got.sizes[i], d.len() as u64, "size of buffer {i}");
        assert_eq!(p.rs.space.read(ras[i], d.len()), *d, "data of buffer {i}");
        assert_eq!(p.test_send(sids[i]).unwrap(), Some(d.len() as u64));
    }
    (chains, ras)
}

fn transfer(p: &mut Pair, sizes: &[usize], seed: u64) -> Chains {
    transfer_to(p, sizes, seed).0
}

/// The IMM every chain of a transfer carries (they all carry the same one).
fn imm_of(chains: &Chains) -> Imm {
    let imms: Vec<u32> = chains.iter().map(|c| c.2.last().unwrap().imm).collect();
    assert!(imms.windows(2).all(|w| w[0] == w[1]), "chains disagree on the IMM: {imms:x?}");
    Imm::decode(imms[0])
}

/// Checks that a whole-rail split used `rail` alone, `nothing` was sent on the other.
fn one_rail_only(percent: u8, rail: usize) {
    let mut p = Pair::new(opts(percent));
    let other = 1 - rail;
    let cases: [&[usize]; 8] =
        [&[1], &[127], &[128], &[129], &[4096], &[70_001], &[1000, 0, 129], &[8, 8, 8, 8, 8, 8, 8, 8]];
    for (k, sizes) in cases.iter().enumerate() {
        let chains = transfer(&mut p, sizes, k as u64);
        assert_eq!(chains.len(), 1, "{sizes:?}: one chain");
        assert_eq!(chains[0].0, rail);
        let imm = imm_of(&chains);
        assert_eq!(imm.mask, RailMask::of(rail));
        let wrs = &chains[0].2;
        if sizes.len() > 1 {
            // This rail is the leader (it is the only one): it writes the records.
            assert_eq!(imm.size_q, SIZEQ_SENTINEL);
            assert_eq!(wrs.last().unwrap().bytes(), 8 * sizes.len() as u64);
            assert_eq!(wrs.last().unwrap().rkey, 21 + rail as u32, "records rkey of the rail");
        }
    }
    assert_eq!(p.wrs_on(Dir::ToRecv, other), 0, "nothing at all on the other rail");
    assert_eq!(p.s.counters()[other], RailCounts::default());
    // The other rail's SRQ was never consumed, its CQ never saw an IMM.
    assert_eq!(p.srq[other], 32);
    // Slot 0's CTS went by slot (SOUT: no data yet), every later one followed the data.
    assert_eq!(p.r.counters()[other].wr_posted, (other == SOUT) as u64, "CTS on the other rail");
    assert_eq!(p.r.counters()[other].cqe, 0, "nothing completed there (no CTS signalled)");
    assert_eq!(p.s.counters()[rail].imm_sent, cases.len() as u64);
    assert_eq!(p.s.counters()[rail].zero_byte_imm, 0);
}

#[test]
fn zero_percent_puts_everything_on_sup() {
    one_rail_only(0, SUP);
}

#[test]
fn hundred_percent_puts_everything_on_sout() {
    one_rail_only(100, SOUT);
}

#[test]
fn an_empty_multi_receive_uses_sout_alone_whatever_the_split() {
    for percent in [0u8, 50, 100] {
        let mut p = Pair::new(opts(percent));
        let chains = transfer(&mut p, &[0, 0, 0], 1);
        assert_eq!(chains.len(), 1);
        assert_eq!(chains[0].0, SOUT);
        assert_eq!(imm_of(&chains).mask, RailMask::SOUT);
        let wrs = &chains[0].2;
        assert_eq!(wrs.len(), 1, "no data WRITE for empty buffers: the signalling WR alone");
        assert_eq!(wrs[0].bytes(), 24, "three sizes in the records");
        assert_eq!(p.s.counters()[SOUT].zero_byte_imm, 0);
    }
}

#[test]
fn a_multi_receive_whose_buffers_split_differently_is_one_slot_on_both_rails() {
    // At 50 %: 100 bytes go whole to SUP (too small to split), 4096 half and half,
    // 0 nowhere. The slot's mask is the OR: both rails; SOUT leads.
    let mut p = Pair::new(opts(50));
    let chains = transfer(&mut p, &[100, 4096, 0], 2);
    assert_eq!(imm_of(&chains).mask, RailMask::BOTH);
    let by_rail = |r: usize| chains.iter().find(|c| c.0 == r).unwrap().2.clone();
    let (sout, sup) = (by_rail(SOUT), by_rail(SUP));
    let lens = |w: &[SendWr]| w.iter().map(|w| w.bytes()).collect::<Vec<_>>();
    assert_eq!(lens(&sout), vec![2048, 24], "SOUT: its half of buffer 1, then the records");
    assert_eq!(lens(&sup), vec![100, 2048, 0], "SUP: buffer 0 whole, its half of buffer 1, the IMM alone");
}

proptest! {
    /// Any percentage: buffer i's first `sout_i` bytes go on SOUT and the rest on SUP,
    /// `sout_i` 128-aligned (or the whole buffer) and within 128 bytes of the share; the
    /// mask names exactly the rails that carry bytes; everything lands.
    #[test]
    fn any_split_sends_the_policys_share_on_each_rail(
        percent in 0u8..=100,
        sizes in prop::collection::vec(prop_oneof![Just(0usize), (1usize..40).prop_map(|k| k * 128), 0usize..6000], 1..=8),
    ) {
        let mut p = Pair::new(opts(percent));
        let (chains, ras) = transfer_to(&mut p, &sizes, percent as u64);
        let view = RailView::default();
        let mut want_bytes = [0u64; RAILS];
        let mut shares = Vec::new();
        for &s in &sizes {
            let sout = Fixed::percent(percent).sout_bytes(s as u64, 0, [&view, &view]);
            shares.push(sout);
            prop_assert!(sout == s as u64 || sout % 128 == 0);
            prop_assert!((sout as f64 - s as f64 * percent as f64 / 100.0).abs() <= 128.0);
            want_bytes[SOUT] += sout;
            want_bytes[SUP] += s as u64 - sout;
        }
        let mut want_mask = RailMask::from_fn(|rail| want_bytes[rail] > 0);
        if want_mask.is_empty() {
            want_mask = RailMask::SOUT;
        }
        prop_assert_eq!(imm_of(&chains).mask, want_mask);
        for rail in [SOUT, SUP] {
            prop_assert_eq!(p.s.counters()[rail].bytes, want_bytes[rail]);
            prop_assert_eq!(chains.iter().filter(|c| c.0 == rail).count(), want_mask.contains(rail) as usize);
        }
        // Each data WRITE carries its rail's part of its buffer: SOUT [0, share), SUP
        // [share, size), at the same offset in source and destination.
        for (rail, _, wrs) in &chains {
            for wr in wrs.iter().filter(|w| w.num_sge > 0 && (w.opcode == WrOpcode::Write || sizes.len() == 1)) {
                let i = ras.iter().position(|&a| a >> 40 == wr.remote_addr >> 40).expect("a receive buffer");
                let (off_src, off_dst) = (wr.sge[0].addr & ((1 << 40) - 1), wr.remote_addr & ((1 << 40) - 1));
                prop_assert_eq!(off_src, off_dst);
                let (off, len) = if *rail == SOUT { (0, shares[i]) } else { (shares[i], sizes[i] as u64 - shares[i]) };
                prop_assert_eq!((off_dst, wr.bytes()), (off, len), "rail {} buffer {}", rail, i);
            }
        }
        prop_assert_eq!(p.s.counters()[SOUT].zero_byte_imm + p.s.counters()[SUP].zero_byte_imm, 0);
    }
}

#[test]
fn data_qps_round_robin_over_the_requests_that_use_the_rail() {
    // 3 SOUT QPs, 2 SUP QPs, 50 %: 4096 B uses both rails, 0 B SOUT alone, 100 B SUP alone.
    let mut p = Pair::new(Opts { qps: [3, 2], ..opts(50) });
    let sizes = [4096usize, 0, 100, 4096, 0, 0, 100, 4096, 100, 4096];
    let mut ids = Vec::new();
    let mut ras = Vec::new();
    for _ in &sizes {
        let (id, ra) = p.irecv_one(4096);
        ids.push(id);
        ras.push(ra);
    }
    p.deliver_all();
    let first = p.chains.len();
    for (i, &s) in sizes.iter().enumerate() {
        let sa = p.send_buf(&pattern(i as u64, s));
        p.isend(sbuf(sa, s as u64, 0)).unwrap().unwrap();
    }
    let mut qps = [Vec::new(), Vec::new()];
    for c in &p.chains[first..] {
        let QpRef::Data(q) = c.qp else { panic!("data chain on {:?}", c.qp) };
        qps[c.rail].push(q);
        // One chain per rail per request, all its WRs for one slot.
        let slots: Vec<usize> = p.log[c.start..c.start + c.len].iter().map(|x| x.3.wr_id as usize & 0xff).collect();
        assert!(slots.iter().all(|&s| s == slots[0]));
    }
    assert_eq!(qps[SOUT], vec![0, 1, 2, 0, 1, 2, 0], "SOUT: the 7 requests with SOUT bytes or empty");
    assert_eq!(qps[SUP], vec![0, 1, 0, 1, 0, 1, 0], "SUP: the 7 requests with SUP bytes");
    // Execute the wires in the opposite order (last QP first, SUP first): all lands.
    for rail in [SUP, SOUT] {
        for qp in (0..p.wires[Dir::ToRecv as usize][rail].len()).rev() {
            while p.step(Dir::ToRecv, rail, qp) {}
        }
    }
    for (i, &s) in sizes.iter().enumerate() {
        assert_eq!(p.test_recv(ids[i]).unwrap().unwrap().sizes[0], s as u64);
        assert_eq!(p.rs.space.read(ras[i], s), pattern(i as u64, s));
    }
}

/// The counters the engine itself keeps (the telemetry adds RTT samples and congestion
/// events, which depend on the timing of the fake fabric).
fn posted(c: RailCounts) -> RailCounts {
    RailCounts { rtt_samples: 0, congestion_events: 0, ..c }
}

fn counters(wr_posted: u64, doorbells: u64, bytes: u64, imm_sent: u64, cqe: u64) -> RailCounts {
    RailCounts { wr_posted, doorbells, bytes, imm_sent, cqe, ..RailCounts::default() }
}

#[test]
fn counters_match_what_was_posted_half_split() {
    let mut p = Pair::new(opts(50));
    transfer(&mut p, &[4096], 1); // fast path: 2048 B + IMM on each rail
    transfer(&mut p, &[0], 2); // SOUT alone, one empty WRITE_WITH_IMM
    transfer(&mut p, &[1000, 0, 300], 3); // SOUT 512 + 128 + records; SUP 488 + 172 + IMM
    assert_eq!(posted(p.s.counters()[SOUT]), counters(5, 3, 2048 + 512 + 128, 3, 3));
    assert_eq!(posted(p.s.counters()[SUP]), counters(4, 2, 2048 + 488 + 172, 2, 2));
    // Receiver: slot 0's CTS on SOUT (no data yet: by slot), slot 1's on SUP (the data came
    // on both: by slot), slot 2's on SOUT (the data came on SOUT alone); none signalled, so
    // the CQEs are one IMM per active rail per transfer.
    assert_eq!(posted(p.r.counters()[SOUT]), counters(2, 2, 0, 0, 3));
    assert_eq!(posted(p.r.counters()[SUP]), counters(1, 1, 0, 0, 2));
}

#[test]
fn counters_match_what_was_posted_all_on_sup_with_several_qps() {
    let mut p = Pair::new(Opts { qps: [2, 3], ..opts(0) });
    for k in 0..3 {
        transfer(&mut p, &[1000], k);
    }
    transfer(&mut p, &[1000, 1000], 3); // two data WRITEs + signalling WR with the records
    assert_eq!(p.s.counters()[SOUT], RailCounts::default());
    assert_eq!(posted(p.s.counters()[SUP]), counters(6, 4, 5000, 4, 4));
    // Slot 0's CTS on SOUT (before any data), the rest follow the data to SUP.
    assert_eq!(posted(p.r.counters()[SOUT]), counters(1, 1, 0, 0, 0));
    assert_eq!(posted(p.r.counters()[SUP]), counters(3, 3, 0, 0, 4));
}

#[test]
fn counters_match_what_was_posted_on_the_sentinel_path() {
    let mut p = Pair::new(opts(50));
    let size = MAX_FAST_SIZE + 4096;
    let (sa, ra) = p.virtual_bufs(size as usize);
    let rid = p.irecv(&[rbuf(ra, size, 1)]).unwrap();
    p.deliver_all();
    let sid = p.isend(sbuf(sa, size, 1)).unwrap().unwrap();
    p.deliver_all();
    assert_eq!(p.test_recv(rid).unwrap().unwrap().sizes[0], size);
    assert_eq!(p.test_send(sid).unwrap(), Some(size));
    let half = Fixed::percent(50).sout_bytes(size, 0, [&RailView::default(), &RailView::default()]);
    assert_eq!(posted(p.s.counters()[SOUT]), counters(2, 1, half, 1, 1));
    assert_eq!(posted(p.s.counters()[SUP]), counters(2, 1, size - half, 1, 1));
    for rail in [SOUT, SUP] {
        let sig = p.log.iter().rev().find(|(d, r, ..)| *d == Dir::ToRecv && *r == rail).unwrap().3;
        assert_eq!(WrKind::decode(sig.wr_id).unwrap().0, WrKind::DataSignal);
        assert_eq!(sig.bytes(), if rail == SOUT { 8 } else { 0 }, "the leader writes the one record");
    }
}
