//! The failover model's inputs: receives, faults and operations, and the proptest
//! strategies that draw cases of them.

use proptest::prelude::*;

use crate::engine::imm::MAX_FAST_SIZE;

#[derive(Clone, Debug)]
pub struct RecvSpec {
    /// (posted, sent) per buffer; tag = index.
    pub bufs: Vec<(usize, usize)>,
    /// The order its sends are posted in.
    pub order: Vec<usize>,
}

#[derive(Clone, Copy, Debug)]
pub enum Fault {
    /// The head WR of the `k`-th busy wire of `rail` (`dir`) fails without landing; with
    /// `partial`, the first half of its payload landed first.
    FailHead { rail: usize, to_send: bool, k: usize, partial: bool },
    /// The head WR lands (data and IMM) but its acknowledgement is lost.
    LandThenFail { rail: usize, to_send: bool, k: usize },
    /// The plugin reports the rail down to one side (port-down event, link lost).
    PortDown { rail: usize, at_sender: bool },
    /// The rail's link goes silent (a pulled cable): nothing crosses it any more, no
    /// completion comes; time passes from then on. The sender's silent-rail check fails it
    /// while the other rail completes work, else RC's retry limit does.
    Silent { rail: usize },
}

impl Fault {
    pub fn rail(&self) -> usize {
        match *self {
            Fault::FailHead { rail, .. }
            | Fault::LandThenFail { rail, .. }
            | Fault::PortDown { rail, .. }
            | Fault::Silent { rail } => rail,
        }
    }
}

#[derive(Clone, Debug)]
pub enum Op {
    Irecv,
    Isend,
    Step(usize),
    Poll {
        side: usize,
        rail: usize,
    },
    Test(usize),
    Pump,
    /// The sender's QP `qp` of `rail` gets its acknowledgements late (they arrive when
    /// released, or are lost if the QP fails meanwhile).
    Acks {
        rail: usize,
        qp: usize,
        late: bool,
    },
    Fault(Fault),
    /// Time passes (ms), once a link went silent.
    Tick(u64),
}

fn size() -> impl Strategy<Value = usize> {
    prop_oneof![
        6 => 0usize..=4096,
        2 => Just(0usize),
        2 => (0usize..=64).prop_map(|q| q * 128),
        1 => Just(MAX_FAST_SIZE as usize),
        1 => (600usize << 20)..=(700usize << 20),
    ]
}

fn recv_spec() -> impl Strategy<Value = RecvSpec> {
    prop::collection::vec((size(), size(), any::<bool>()), 1..=8).prop_flat_map(|v| {
        let n = v.len();
        // Sends that fit their receive, most smaller (a larger one is refused at isend and
        // never posted: the protocol model covers that).
        let bufs: Vec<(usize, usize)> =
            v.into_iter().map(|(a, b, exact)| if exact { (a, a) } else { (a.max(b), a.min(b)) }).collect();
        Just((0..n).collect::<Vec<_>>()).prop_shuffle().prop_map(move |order| RecvSpec { bufs: bufs.clone(), order })
    })
}

fn fault() -> impl Strategy<Value = Fault> {
    prop_oneof![
        4 => (0..2usize, prop::bool::weighted(0.2), any::<usize>(), any::<bool>())
            .prop_map(|(rail, to_send, k, partial)| Fault::FailHead { rail, to_send, k, partial }),
        3 => (0..2usize, prop::bool::weighted(0.2), any::<usize>())
            .prop_map(|(rail, to_send, k)| Fault::LandThenFail { rail, to_send, k }),
        1 => (0..2usize, any::<bool>()).prop_map(|(rail, at_sender)| Fault::PortDown { rail, at_sender }),
        3 => (0..2usize).prop_map(|rail| Fault::Silent { rail }),
    ]
}

fn op() -> impl Strategy<Value = Op> {
    prop_oneof![
        3 => Just(Op::Irecv),
        4 => Just(Op::Isend),
        8 => any::<usize>().prop_map(Op::Step),
        3 => (0..2usize, 0..2usize).prop_map(|(side, rail)| Op::Poll { side, rail }),
        3 => any::<usize>().prop_map(Op::Test),
        2 => Just(Op::Pump),
        1 => (0..2usize, 0..4usize, prop::bool::weighted(0.7)).prop_map(|(rail, qp, late)| Op::Acks { rail, qp, late }),
        2 => (1..=40u64).prop_map(Op::Tick),
    ]
}

/// A case: configuration, receives, and the interleaving with 1 or 2 faults (one rail).
pub fn case() -> impl Strategy<Value = ([u16; 2], u8, usize, Vec<RecvSpec>, Vec<Op>)> {
    case_on(false)
}

/// A case whose faults hit one rail, or (`both`) the first rail and then the other.
pub fn case_on(both: bool) -> impl Strategy<Value = ([u16; 2], u8, usize, Vec<RecvSpec>, Vec<Op>)> {
    (
        prop::sample::select(vec![[1u16, 1], [2, 1], [1, 3]]),
        prop::sample::select(vec![0u8, 13, 50, 87, 100]),
        prop_oneof![1 => Just(0usize), 3 => 20usize..=40],
        prop::collection::vec(recv_spec(), 1..=10),
        prop::collection::vec(op(), 0..=120),
        prop::collection::vec((any::<prop::sample::Index>(), fault()), if both { 2..=2 } else { 1..=2 }),
    )
        .prop_map(move |(qps, pct, warmup, specs, mut ops, mut faults)| {
            let first = faults[0].1.rail();
            // The second fault comes after the first (faults are inserted in order).
            faults.sort_by_key(|(at, _)| at.index(ops.len() + 1));
            for (n, (at, f)) in faults.into_iter().enumerate() {
                let rail = if both && n == 1 { first ^ 1 } else { first };
                let f = match f {
                    Fault::FailHead { to_send, k, partial, .. } => Fault::FailHead { rail, to_send, k, partial },
                    Fault::LandThenFail { to_send, k, .. } => Fault::LandThenFail { rail, to_send, k },
                    Fault::PortDown { at_sender, .. } => Fault::PortDown { rail, at_sender },
                    Fault::Silent { .. } => Fault::Silent { rail },
                };
                let i = at.index(ops.len() + 1);
                ops.insert(i, Op::Fault(f));
            }
            (qps, pct, warmup, specs, ops)
        })
}
