//! The model's oracle of a slot's chains: what the protocol prescribes for a receive's
//! sends, computed independently of the engine (one chain per active rail, or per piece of
//! a striped share), compared WR by WR with what the engine posted.

use proptest::prelude::*;
use proptest::test_runner::TestCaseError;

use super::super::harness::*;
use super::{Model, fail};
use crate::engine::imm::{Imm, MAX_FAST_SIZE, SIZEQ_SENTINEL};
use crate::engine::layout::SLOTS;
use crate::engine::{QpRef, SOUT, SUP};
use crate::fabric::WrOpcode;
use crate::split::{Fixed, SplitPolicy};
use crate::telemetry::RailView;

impl Model {
    /// The chains of receive `ri`'s slot, appended from `first`, are exactly the protocol's.
    pub(super) fn check_chains(&mut self, ri: usize, first: usize) -> Result<(), TestCaseError> {
        let r = &self.recvs[ri];
        let slot = (r.seq % SLOTS as u64) as usize;
        let n = r.bufs.len();
        let sizes: Vec<u64> = (0..n).map(|k| r.expected(k) as u64).collect();
        let view = RailView::default();
        let shares: Vec<u64> =
            sizes.iter().map(|&s| Fixed::percent(self.cfg.percent).sout_bytes(s, 0, [&view, &view])).collect();
        let part = |rail: usize, k: usize| {
            if rail == SOUT { (0, shares[k]) } else { (shares[k], sizes[k] - shares[k]) }
        };
        let mut mask = RailMask::from_fn(|rail| (0..n).any(|k| part(rail, k).1 > 0));
        if mask.is_empty() {
            mask = RailMask::SOUT;
        }
        let fast = n == 1 && sizes[0] <= MAX_FAST_SIZE;
        let size_q = if fast { Imm::size_q_for(sizes[0]) } else { SIZEQ_SENTINEL };
        let imm = Imm { slot: slot as u8, mask, size_q }.encode();
        let leader = if mask.contains(SOUT) { SOUT } else { SUP };
        let chains: Vec<ChainRec> = self.p.chains[first..].to_vec();
        // The chains as prescribed, each a rail, its WRs' (opcode, signalled, local addr,
        // remote addr, bytes) and its IMM: one per active rail, or with striping one per
        // piece of the rail's share (the sends' parts one after the other, cut into runs
        // of a 128-byte multiple, at most `pieces` of them).
        type Wr = (WrOpcode, bool, u64, u64, u64);
        let mut expect: Vec<(usize, Vec<Wr>, u32)> = Vec::new();
        for rail in mask.iter() {
            let total: u64 = (0..n).map(|k| part(rail, k).1).sum();
            let most = self.cfg.pieces[rail] as u64;
            let (piece, k_pieces) = if most > 1 && total > 128 {
                let piece = total.div_ceil(most).div_ceil(128) * 128;
                (piece, total.div_ceil(piece))
            } else {
                (total.max(1), 1)
            };
            let imm = Imm::with_pieces(imm, k_pieces as u8);
            for j in 0..k_pieces {
                let (lo, hi) = (j * piece, ((j + 1) * piece).min(total));
                let mut wrs = Vec::new();
                let mut at = 0u64;
                for k in 0..n {
                    let (off, len) = part(rail, k);
                    let s = r.sends.iter().find(|s| s.dest == k).unwrap();
                    // This send's part covers [at, at + len) of the share.
                    let (a, b) = (lo.max(at), hi.min(at + len));
                    if fast || b > a {
                        let op = if fast { WrOpcode::WriteImm } else { WrOpcode::Write };
                        let o = off + a.min(b) - at;
                        let local = if b > a { s.addr + o } else { 0 };
                        wrs.push((op, fast, local, r.bufs[k].2 + o, b.saturating_sub(a)));
                    }
                    at += len;
                }
                if !fast {
                    let off = (slot * 64) as u64;
                    let len = if rail == leader && j == 0 { 8 * n as u64 } else { 0 };
                    let local = if len > 0 { SIZES + off } else { 0 };
                    wrs.push((WrOpcode::WriteImm, true, local, RECORDS + off, len));
                }
                expect.push((rail, wrs, imm));
            }
        }
        let rails: Vec<usize> = chains.iter().map(|c| c.rail).collect();
        let want: Vec<usize> = expect.iter().map(|e| e.0).collect();
        prop_assert_eq!(rails, want, "one chain per active rail (per piece when striped), none on an inactive one");
        let mut wrs = Vec::new();
        let mut signals = Vec::new();
        let mut qps_used = Vec::new();
        for (c, (_, expect, imm)) in chains.iter().zip(&expect) {
            let QpRef::Data(q) = c.qp else { return fail(format!("data chain on {:?}", c.qp)) };
            prop_assert!(c.dir == Dir::ToRecv && q < self.cfg.qps[c.rail]);
            prop_assert!(!qps_used.contains(&(c.rail, q)), "two pieces of slot {} on one QP", slot);
            qps_used.push((c.rail, q));
            let got: Vec<_> = self.p.log[c.start..c.start + c.len].iter().map(|x| x.3).collect();
            let shape: Vec<_> = got
                .iter()
                .map(|w| {
                    (w.opcode, w.signaled, if w.num_sge > 0 { w.sge[0].addr } else { 0 }, w.remote_addr, w.bytes())
                })
                .collect();
            prop_assert_eq!(&shape, expect, "chain on rail {} of slot {} (sizes {:?})", c.rail, slot, sizes);
            prop_assert!(got.iter().filter(|w| w.opcode == WrOpcode::WriteImm).all(|w| w.imm == *imm));
            wrs.extend(c.start..c.start + c.len);
            signals.push(c.start + c.len - 1);
        }
        self.slot_signals[slot] = signals;
        self.recvs[ri].wrs = wrs;
        Ok(())
    }
}
