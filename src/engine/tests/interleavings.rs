//! The model-based property test and long deterministic runs of the model (`model.rs`):
//! random interleavings of every call and every fabric event, a full window in flight
//! across the slot wrap, and late acknowledgements across several wraps.

use proptest::prelude::*;

use super::model::{BufSpec, Cfg, Model, Op};
use crate::engine::layout::SLOTS;
use crate::engine::{RAILS, SOUT, SUP};

fn size() -> impl Strategy<Value = usize> {
    prop_oneof![1 => Just(0usize), 2 => (1usize..=24).prop_map(|k| k * 128), 3 => 0usize..3200]
}

/// A buffer: posted equal to, larger or smaller than the send, or unrelated; few tags, so
/// that equal tags within a multi-receive occur.
fn buf_spec() -> impl Strategy<Value = BufSpec> {
    (0u32..4, size(), size(), 0u8..4, 0usize..300).prop_map(|(tag, send, other, mode, d)| {
        let posted = match mode {
            0 => send,
            1 => send + d,
            2 => send.saturating_sub(d),
            _ => other,
        };
        BufSpec { tag, posted, send }
    })
}

fn irecv_op() -> impl Strategy<Value = Op> {
    prop_oneof![2 => prop::collection::vec(buf_spec(), 1..=1), 1 => prop::collection::vec(buf_spec(), 2..=8)]
        .prop_flat_map(|bufs| {
            let n = bufs.len();
            (Just(bufs), Just((0..n).collect::<Vec<_>>()).prop_shuffle())
        })
        .prop_map(|(bufs, order)| Op::Irecv(bufs, order))
}

fn op() -> impl Strategy<Value = Op> {
    prop_oneof![
        3 => irecv_op(),
        8 => Just(Op::Isend),
        4 => any::<usize>().prop_map(Op::Test),
        10 => any::<usize>().prop_map(Op::Step),
        4 => (0..2usize, 0..RAILS, any::<bool>()).prop_map(|(side, rail, all)| Op::Poll { side, rail, all }),
        1 => Just(Op::Refill),
        1 => (0u64..3000).prop_map(Op::Tick),
        1 => (0..RAILS, 0..3usize, any::<bool>()).prop_map(|(rail, qp, late)| Op::Acks { rail, qp, late }),
        1 => Just(Op::Settle),
    ]
}

fn cfg() -> impl Strategy<Value = Cfg> {
    let percent = prop_oneof![Just(0u8), Just(100), 0u8..=100];
    let probe_ns = prop_oneof![Just(0u64), 500u64..5000];
    // Half the cases start just before the slot wrap, so that they cross it.
    let warmup = prop_oneof![0usize..SLOTS, SLOTS - 24..SLOTS];
    (1u16..=3, 1u16..=3, percent, 1u32..=8, 0u32..=24, probe_ns, warmup).prop_map(
        |(sout, sup, percent, low, extra, probe_ns, warmup)| Cfg {
            qps: [sout, sup],
            pieces: [1, 1],
            percent,
            srq: (low, low + extra),
            probe_ns,
            warmup,
        },
    )
}

proptest! {
    /// Random interleavings (starting anywhere in the slot space, so many cases cross the
    /// wrap) against the model.
    #[test]
    fn model_random_interleavings(cfg in cfg(), ops in prop::collection::vec(op(), 1..300)) {
        Model::new(cfg).run(&ops)?;
    }

    /// The same with every rail of more than one QP striping its shares over all of them
    /// (`MPIB_QP_STRIPE`): pieces executed, acknowledged and polled in any order.
    #[test]
    fn model_random_interleavings_striped(cfg in cfg(), ops in prop::collection::vec(op(), 1..300)) {
        Model::new(Cfg { pieces: cfg.qps.map(|q| q.min(4) as u8), ..cfg }).run(&ops)?;
    }
}

/// A deterministic scramble of wire steps, polls and tests.
fn scramble(seed: u64, n: usize) -> Vec<Op> {
    let mut x = seed | 1;
    (0..n)
        .map(|_| {
            x ^= x << 13;
            x ^= x >> 7;
            x ^= x << 17;
            let k = (x >> 8) as usize;
            match x % 8 {
                0..=3 => Op::Step(k),
                4 | 5 => Op::Poll { side: k % 2, rail: (k >> 1) % 2, all: k & 4 != 0 },
                6 => Op::Test(k),
                _ => Op::Refill,
            }
        })
        .collect()
}

#[test]
fn model_full_window_across_the_slot_wrap() {
    // 32 receives of 8 buffers (slots 240..=271, across the wrap), all CTS delivered, then
    // all 256 sends in flight at once, executed and completed in a scrambled order.
    let cfg = Cfg { qps: [2, 3], pieces: [1, 1], percent: 37, srq: (2, 4), probe_ns: 0, warmup: 240 };
    let mut ops = Vec::new();
    for i in 0..32usize {
        let bufs = (0..8)
            .map(|k| BufSpec { tag: k as u32, posted: 100 + 97 * ((i + k) % 7), send: 128 * ((i * 3 + k) % 9) + k })
            .collect();
        ops.push(Op::Irecv(bufs, (0..8).rev().collect()));
    }
    ops.extend((0..32).map(Op::Step));
    ops.extend((0..256).map(|_| Op::Isend));
    ops.extend(scramble(7, 4000));
    let mut m = Model::new(cfg);
    m.run(&ops).unwrap();
    assert_eq!(m.max_live, (32, 256), "a full window was in flight");
    assert!(m.p.rnr.iter().sum::<u64>() > 0, "the small SRQ made writers wait, and they recovered");
}

#[test]
fn model_full_window_striped_across_the_slot_wrap() {
    // As above with both rails striping over all their QPs: every slot's share of a rail
    // in up to 4 pieces on distinct QPs, completed in a scrambled order.
    let cfg = Cfg { qps: [4, 3], pieces: [4, 3], percent: 41, srq: (2, 4), probe_ns: 0, warmup: 240 };
    let mut ops = Vec::new();
    for i in 0..32usize {
        let n = 1 + i % 8;
        let bufs = (0..n)
            .map(|k| BufSpec { tag: k as u32, posted: 300 + 997 * ((i + k) % 7), send: 131 * ((i * 3 + k) % 9) + k })
            .collect();
        ops.push(Op::Irecv(bufs, (0..n).rev().collect()));
    }
    ops.extend((0..32).map(Op::Step));
    ops.extend((0..(0..32).map(|i| 1 + i % 8).sum::<usize>()).map(|_| Op::Isend));
    ops.extend(scramble(11, 6000));
    let mut m = Model::new(cfg);
    m.run(&ops).unwrap();
    let pieces = |rail: usize, k: u8| {
        m.p.log
            .iter()
            .filter(|(_, r, _, wr)| *r == rail && wr.opcode == crate::fabric::WrOpcode::WriteImm)
            .filter(|(_, _, _, wr)| crate::engine::imm::Imm::pieces_of(wr.imm as u8) == k)
            .count()
    };
    for (rail, most) in [(SOUT, 4), (SUP, 3)] {
        assert!(pieces(rail, most) >= 4 * most as usize, "rail {rail}: shares striped over {most} QPs");
        assert!(pieces(rail, 1) > 0, "rail {rail}: small shares stay in one piece");
        assert_eq!(pieces(rail, most + 1), 0);
    }
}

#[test]
fn model_long_run_wraps_the_slots_several_times() {
    // SOUT's QP 0 gets its acks late for 300 messages while the other QPs go on: past the
    // wrap, the sender must wait for them before it reuses those slots.
    let cfg = Cfg { qps: [3, 1], pieces: [1, 1], percent: 60, srq: (2, 6), probe_ns: 1000, warmup: 0 };
    let mut ops = vec![Op::Acks { rail: SOUT, qp: 0, late: true }];
    for i in 0..700usize {
        if i == 300 {
            ops.push(Op::Acks { rail: SOUT, qp: 0, late: false });
        }
        let n = 1 + i % 3;
        let bufs = (0..n)
            .map(|k| BufSpec { tag: (k % 2) as u32, posted: (i * 37 + k * 300) % 2000, send: (i * 53 + k) % 1900 })
            .collect();
        ops.push(Op::Irecv(bufs, (0..n).collect()));
        ops.extend((0..n).map(|_| Op::Isend));
        ops.extend(scramble(i as u64 + 1, 12));
        ops.push(Op::Tick(700));
        if i % 4 == 3 {
            ops.push(Op::Settle);
        }
    }
    let mut m = Model::new(cfg);
    m.run(&ops).unwrap();
    assert!(m.p.s.counters()[SOUT].probes > 0, "idle rails were probed along the way");
    assert!(m.seq > 2 * SLOTS as u64, "the slots wrapped twice ({} receives)", m.seq);
    assert!(m.slot_waits > 0, "the sender had to wait for a slot's late completions");
}
