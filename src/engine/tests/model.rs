//! A model-based property test: random interleavings of irecv (1..=8 buffers with tags),
//! isend (in posting order, tags shuffled within a multi-receive), test on any live
//! request, execution of the head WR of any wire, CQ polls, SRQ refills and idle probes,
//! checked against a reference model that is no more than a queue of expected messages.
//!
//! Checked at every step: each slot's chains are exactly what the protocol prescribes
//! (rails, QPs, WRs, offsets, IMM); a receive completes only when every WR of its chains
//! executed, with exact sizes (min(send, posted), as net_ib) and exactly the sent bytes in
//! place, nothing written past them; a send completes only after its signalled WRs'
//! completions were polled; the sender never reuses a slot whose chains are in flight; a
//! probe goes only on a rail with nothing in flight and at most one per rail. At the end:
//! everything completed, no byte changed since, counters agree with what was posted.

mod chains;

use std::collections::VecDeque;

use proptest::prelude::*;
use proptest::test_runner::TestCaseError;

use super::harness::*;
use crate::engine::layout::SLOTS;
use crate::engine::{RAILS, Refused, WrKind};
use crate::error::Cause;
use crate::fabric::WrOpcode;
use crate::split::{AnySplit, Fixed};

/// Bytes after each receive buffer that must stay zero.
const GUARD: usize = 64;
const MAX_RECVS_IN_FLIGHT: usize = 32;
const MAX_SENDS_IN_FLIGHT: usize = 256;

/// One buffer of a receive and the send that goes with it.
#[derive(Clone, Debug)]
pub struct BufSpec {
    pub tag: u32,
    pub posted: usize,
    pub send: usize,
}

#[derive(Clone, Debug)]
pub enum Op {
    /// irecv of these buffers; their sends are posted in `order` (a permutation).
    Irecv(Vec<BufSpec>, Vec<usize>),
    /// The next send in posting order.
    Isend,
    /// `test` on the `k`-th live request (modulo their number).
    Test(usize),
    /// Executes the head WR of the `k`-th non-empty wire.
    Step(usize),
    /// Polls one completion, or all, from a CQ.
    Poll { side: usize, rail: usize, all: bool },
    /// The plugin's SRQ refill.
    Refill,
    /// Time passes; the sender may probe.
    Tick(u64),
    /// The sender's QP `qp` (modulo the rail's QPs) of `rail` gets its acks late, or they
    /// all arrive now.
    Acks { rail: usize, qp: usize, late: bool },
    /// One round of what a plugin does: refill, run every wire, poll every CQ, post every
    /// send it can, test every request.
    Settle,
}

#[derive(Clone, Debug)]
pub struct Cfg {
    pub qps: [u16; RAILS],
    /// Most pieces the sender stripes a rail's share over (1: no striping).
    pub pieces: [u8; RAILS],
    pub percent: u8,
    pub srq: (u32, u32),
    pub probe_ns: u64,
    /// Messages sent before the interleaving starts (to start near the slot wrap).
    pub warmup: usize,
}

struct Send {
    tag: u32,
    data: Vec<u8>,
    addr: u64,
    /// Index of the receive buffer it lands in (first unmatched one with its tag).
    dest: usize,
    id: Option<u16>,
    done: bool,
}

struct Recv {
    seq: u64,
    id: u16,
    /// (tag, posted size, address) per buffer.
    bufs: Vec<(u32, usize, u64)>,
    /// In posting order.
    sends: Vec<Send>,
    issued: usize,
    /// `log` index of its CTS WRITE.
    cts: usize,
    /// `log` indices of every WR of its data chains, once posted.
    wrs: Vec<usize>,
    done: bool,
}

impl Recv {
    /// Bytes buffer `k` receives.
    fn expected(&self, k: usize) -> usize {
        let s = self.sends.iter().find(|s| s.dest == k).expect("a send per buffer");
        s.data.len().min(self.bufs[k].1)
    }
}

pub struct Model {
    pub p: Pair,
    cfg: Cfg,
    recvs: VecDeque<Recv>,
    /// Receives posted so far (warm-up included).
    pub seq: u64,
    live_recvs: usize,
    live_sends: usize,
    pub max_live: (usize, usize),
    /// `log` indices of the signalled WRs of the latest chains of each slot.
    slot_signals: Vec<Vec<usize>>,
    /// `log` index of the latest probe per rail.
    probes: [Option<usize>; RAILS],
    /// Completed receive regions and their expected bytes (buffer + guard).
    landed: Vec<(u64, Vec<u8>)>,
    mismatches: u64,
    next_seed: u64,
    /// isends answered "not now" because the slot's previous use awaited completions.
    pub slot_waits: u64,
}

fn fail<T>(msg: String) -> Result<T, TestCaseError> {
    Err(TestCaseError::fail(msg))
}

impl Model {
    pub fn new(cfg: Cfg) -> Self {
        let split = AnySplit::Fixed(Fixed::percent(cfg.percent));
        let o =
            Opts { qps: cfg.qps, pieces: cfg.pieces, split, srq: cfg.srq, probe_ns: cfg.probe_ns, ..Opts::default() };
        let mut m = Model {
            p: Pair::new(o),
            recvs: VecDeque::new(),
            seq: 0,
            live_recvs: 0,
            live_sends: 0,
            max_live: (0, 0),
            slot_signals: vec![Vec::new(); SLOTS],
            probes: [None; RAILS],
            landed: Vec::new(),
            mismatches: 0,
            next_seed: 1,
            slot_waits: 0,
            cfg,
        };
        for _ in 0..m.cfg.warmup {
            let p = &mut m.p;
            let (rid, _) = p.irecv_one(64);
            p.deliver_all();
            let sa = p.send_buf(&[7; 64]);
            let sid = p.isend(sbuf(sa, 64, 0)).unwrap().unwrap();
            p.deliver_all();
            p.test_recv(rid).unwrap().unwrap();
            p.test_send(sid).unwrap().unwrap();
        }
        m.seq = m.cfg.warmup as u64;
        m
    }

    pub fn run(&mut self, ops: &[Op]) -> Result<(), TestCaseError> {
        for op in ops {
            self.apply(op)?;
        }
        self.drain()?;
        self.final_checks()
    }

    fn apply(&mut self, op: &Op) -> Result<(), TestCaseError> {
        match op {
            Op::Irecv(bufs, order) => self.irecv(bufs, order),
            Op::Isend => self.isend().map(|_| ()),
            Op::Test(k) => self.test(*k).map(|_| ()),
            Op::Step(k) => {
                let wires = self.busy_wires();
                if !wires.is_empty() {
                    let (dir, rail, qp) = wires[k % wires.len()];
                    self.p.step(dir, rail, qp); // false: RNR, the WR waits
                }
                Ok(())
            }
            Op::Poll { side, rail, all } => self.poll(*side, *rail, *all).map(|_| ()),
            Op::Refill => {
                self.p.refill();
                Ok(())
            }
            Op::Tick(dt) => self.tick(*dt),
            &Op::Acks { rail, qp, late } => {
                let qp = qp % self.cfg.qps[rail] as usize;
                if late {
                    self.p.hold_acks(rail, qp)
                } else {
                    self.p.release_acks(rail, qp)
                }
                Ok(())
            }
            Op::Settle => self.settle().map(|_| ()),
        }
    }

    fn busy_wires(&self) -> Vec<(Dir, usize, usize)> {
        let mut v = Vec::new();
        for dir in [Dir::ToSend, Dir::ToRecv] {
            for rail in 0..RAILS {
                for (qp, w) in self.p.wires[dir as usize][rail].iter().enumerate() {
                    if !w.q.is_empty() {
                        v.push((dir, rail, qp));
                    }
                }
            }
        }
        v
    }

    fn irecv(&mut self, specs: &[BufSpec], order: &[usize]) -> Result<(), TestCaseError> {
        if self.live_recvs == MAX_RECVS_IN_FLIGHT {
            return Ok(());
        }
        let bufs: Vec<(u32, usize, u64)> =
            specs.iter().map(|b| (b.tag, b.posted, self.p.recv_buf(b.posted + GUARD))).collect();
        let rbufs: Vec<_> = bufs.iter().map(|&(tag, posted, a)| rbuf(a, posted as u64, tag)).collect();
        let cts = self.p.log.len();
        let Some(id) = self.p.irecv(&rbufs) else {
            // Not now: the receive posted SLOTS receives ago still holds this slot (later
            // ones were tested done first). Nothing was posted; the op is dropped.
            let slot = (self.seq % SLOTS as u64) as u16;
            prop_assert!(self.recvs.iter().any(|r| r.id == slot), "irecv deferred though slot {} is free", slot);
            prop_assert_eq!(self.p.log.len(), cts, "nothing posted for a deferred receive");
            return Ok(());
        };
        prop_assert_eq!(id as u64, self.seq % SLOTS as u64, "receive ids are CTS slots");
        let mut taken = vec![false; bufs.len()];
        let mut sends = Vec::new();
        for &j in order {
            let tag = specs[j].tag;
            let dest = (0..bufs.len()).find(|&k| !taken[k] && bufs[k].0 == tag).expect("a buffer with the tag");
            taken[dest] = true;
            self.next_seed += 1;
            let data = pattern(self.next_seed, specs[j].send);
            let addr = self.p.send_buf(&data);
            sends.push(Send { tag, data, addr, dest, id: None, done: false });
        }
        self.recvs.push_back(Recv { seq: self.seq, id, bufs, sends, issued: 0, cts, wrs: Vec::new(), done: false });
        self.seq += 1;
        self.live_recvs += 1;
        self.max_live.0 = self.max_live.0.max(self.live_recvs);
        Ok(())
    }

    /// Posts the next send; Ok(true) if the engine took it.
    fn isend(&mut self) -> Result<bool, TestCaseError> {
        if self.live_sends == MAX_SENDS_IN_FLIGHT {
            return Ok(false);
        }
        let Some(ri) = self.recvs.iter().position(|r| r.issued < r.sends.len()) else { return Ok(false) };
        let r = &self.recvs[ri];
        let slot = (r.seq % SLOTS as u64) as usize;
        let s = &r.sends[r.issued];
        let cts_visible = matches!(self.p.fate[r.cts], Fate::Executed { .. });
        let slot_free = self.slot_signals[slot].iter().all(|&i| self.p.completed(i));
        let first_chain = self.p.chains.len();
        let posted = r.bufs[s.dest].1;
        if s.data.len() > posted && cts_visible && slot_free {
            // Larger than its receive: refused, nothing posted; the user's send that fits
            // (the first `posted` bytes) goes instead.
            match self.p.isend(sbuf(s.addr, s.data.len() as u64, s.tag)) {
                Err(e) if matches!(e.cause, Cause::Refused(Refused::LargerThanReceive { .. })) => {}
                other => return fail(format!("an oversized isend of receive {}: {other:?}", r.seq)),
            }
            prop_assert_eq!(self.p.chains.len(), first_chain, "chains posted for a refused send");
            self.mismatches += 1;
            let (seq, issued) = (r.seq, r.issued);
            let r = self.recvs.iter_mut().find(|r| r.seq == seq).expect("the receive");
            r.sends[issued].data.truncate(posted);
            return self.isend();
        }
        let res = self.p.isend(sbuf(s.addr, s.data.len() as u64, s.tag));
        let id = match res {
            Err(e) => return fail(format!("isend of receive {}: {e}", r.seq)),
            Ok(None) if cts_visible && slot_free => {
                return fail(format!("isend of receive {} refused with its CTS in place", r.seq));
            }
            Ok(None) => {
                self.slot_waits += cts_visible as u64;
                return Ok(false);
            }
            Ok(Some(id)) => id,
        };
        prop_assert!(cts_visible, "isend matched receive {} before its CTS arrived", r.seq);
        let live = self.recvs.iter().flat_map(|r| &r.sends).any(|s| s.id == Some(id) && !s.done);
        prop_assert!(!live, "send id {} handed out twice", id);
        let r = &mut self.recvs[ri];
        r.sends[r.issued].id = Some(id);
        r.issued += 1;
        self.live_sends += 1;
        self.max_live.1 = self.max_live.1.max(self.live_sends);
        if r.issued < r.sends.len() {
            prop_assert_eq!(self.p.chains.len(), first_chain, "chains posted before the slot is matched");
            return Ok(true);
        }
        // The slot is complete: its chains went out now. It must have been free.
        prop_assert!(slot_free, "slot {} reused while its previous chains were in flight", slot);
        self.check_chains(ri, first_chain)?;
        Ok(true)
    }

    /// Tests the `k`-th live request; Ok(true) if it completed.
    fn test(&mut self, k: usize) -> Result<bool, TestCaseError> {
        let mut live = Vec::new();
        for (ri, r) in self.recvs.iter().enumerate() {
            if !r.done {
                live.push((ri, None));
            }
            for (si, s) in r.sends.iter().enumerate() {
                if s.id.is_some() && !s.done {
                    live.push((ri, Some(si)));
                }
            }
        }
        if live.is_empty() {
            return Ok(false);
        }
        let (ri, si) = live[k % live.len()];
        let done = match si {
            None => self.test_recv(ri)?,
            Some(si) => self.test_send(ri, si)?,
        };
        let r = &self.recvs[ri];
        if done && r.done && r.sends.iter().all(|s| s.done) {
            self.recvs.remove(ri);
        }
        Ok(done)
    }

    fn test_recv(&mut self, ri: usize) -> Result<bool, TestCaseError> {
        let r = &self.recvs[ri];
        let got = match self.p.r.test(r.id) {
            Err(e) => return fail(format!("test of receive {}: {e}", r.seq)),
            Ok(None) => return Ok(false),
            Ok(Some(got)) => got,
        };
        prop_assert_eq!(r.issued, r.sends.len(), "receive {} done before all its sends were posted", r.seq);
        for &i in &r.wrs {
            let ran = matches!(self.p.fate[i], Fate::Executed { .. } | Fate::Acking);
            prop_assert!(ran, "receive {} done before WR {} ran", r.seq, i);
        }
        prop_assert_eq!(got.n, r.bufs.len());
        for k in 0..r.bufs.len() {
            let want = r.expected(k);
            prop_assert_eq!(got.sizes[k], want as u64, "size of buffer {} of receive {}", k, r.seq);
            let s = r.sends.iter().find(|s| s.dest == k).unwrap();
            let mut bytes = s.data[..want].to_vec();
            bytes.resize(r.bufs[k].1 + GUARD, 0);
            let (_, posted, addr) = r.bufs[k];
            prop_assert!(
                self.p.rs.space.read(addr, posted + GUARD) == bytes,
                "bytes of buffer {} of receive {}",
                k,
                r.seq
            );
            self.landed.push((addr, bytes));
        }
        self.recvs[ri].done = true;
        self.live_recvs -= 1;
        Ok(true)
    }

    fn test_send(&mut self, ri: usize, si: usize) -> Result<bool, TestCaseError> {
        let r = &self.recvs[ri];
        let s = &r.sends[si];
        let got = match self.p.s.test(s.id.unwrap()) {
            Err(e) => return fail(format!("test of a send of receive {}: {e}", r.seq)),
            Ok(None) => return Ok(false),
            Ok(Some(got)) => got,
        };
        prop_assert_eq!(r.issued, r.sends.len(), "send done before its slot was posted");
        let slot = (r.seq % SLOTS as u64) as usize;
        for &i in r.wrs.iter().filter(|&&i| self.p.log[i].3.signaled) {
            prop_assert!(self.p.completed(i), "send of slot {} done before WR {} completed", slot, i);
        }
        let want = r.expected(s.dest);
        prop_assert_eq!(got, want as u64);
        self.recvs[ri].sends[si].done = true;
        self.live_sends -= 1;
        Ok(true)
    }

    /// Polls `side`'s CQ of `rail`; Ok(true) if there was something.
    fn poll(&mut self, side: usize, rail: usize, all: bool) -> Result<bool, TestCaseError> {
        let mut any = false;
        loop {
            let p = &mut self.p;
            let c = if side == SEND_SIDE { p.cq_s[rail].pop_front() } else { p.cq_r[rail].pop_front() };
            let Some(c) = c else { break };
            any = true;
            let res = if side == SEND_SIDE {
                p.s.handle_completion(p.now, rail, &c)
            } else {
                p.r.handle_completion(rail, &c, &p.rs)
            };
            if let Err(e) = res {
                return fail(format!("completion {c:?} on side {side} rail {rail}: {e}"));
            }
            if !all {
                break;
            }
        }
        Ok(any)
    }

    fn tick(&mut self, dt: u64) -> Result<(), TestCaseError> {
        self.p.now += dt;
        let first = self.p.chains.len();
        self.p.probes();
        for c in self.p.chains[first..].iter().copied() {
            prop_assert!(self.cfg.probe_ns > 0, "probe with probes off");
            let wr = self.p.log[c.start].3;
            prop_assert_eq!((c.len, wr.opcode, wr.signaled), (1, WrOpcode::Write, true));
            prop_assert_eq!(WrKind::decode(wr.wr_id).map(|k| k.0), Some(WrKind::Probe));
            let busy = self.slot_signals.iter().flatten().any(|&i| self.p.log[i].1 == c.rail && !self.p.completed(i));
            prop_assert!(!busy, "probe on rail {} with a transfer in flight", c.rail);
            if let Some(prev) = self.probes[c.rail] {
                prop_assert!(self.p.completed(prev), "second probe in flight on rail {}", c.rail);
            }
            self.probes[c.rail] = Some(c.start);
        }
        Ok(())
    }

    /// One plugin-like round; Ok(true) if anything moved.
    fn settle(&mut self) -> Result<bool, TestCaseError> {
        let mut progress = false;
        self.p.refill();
        for (dir, rail, qp) in self.busy_wires() {
            while self.p.step(dir, rail, qp) {
                progress = true;
            }
        }
        for side in [SEND_SIDE, RECV_SIDE] {
            for rail in 0..RAILS {
                progress |= self.poll(side, rail, true)?;
            }
        }
        while self.isend()? {
            progress = true;
        }
        for k in (0..self.live_recvs + self.live_sends).rev() {
            progress |= self.test(k)?;
        }
        Ok(progress)
    }

    /// Runs everything to completion (late acks arrive); fails if it gets stuck.
    fn drain(&mut self) -> Result<(), TestCaseError> {
        for rail in 0..RAILS {
            for qp in 0..self.cfg.qps[rail] as usize {
                self.p.release_acks(rail, qp);
            }
        }
        for _ in 0..100_000 {
            let progress = self.settle()?;
            if self.recvs.is_empty() {
                return Ok(());
            }
            if !progress {
                let r = &self.recvs[0];
                return fail(format!(
                    "stuck: receive {} ({} of {} sends posted, done {}), {} WRs on the wires, SRQ {:?}, RNR {:?}",
                    r.seq,
                    r.issued,
                    r.sends.len(),
                    r.done,
                    self.p.wires_len(),
                    self.p.srq,
                    self.p.rnr
                ));
            }
        }
        fail("no completion after 100000 rounds".into())
    }

    fn final_checks(&mut self) -> Result<(), TestCaseError> {
        for (addr, bytes) in &self.landed {
            prop_assert!(self.p.rs.space.read(*addr, bytes.len()) == *bytes, "a completed buffer changed later");
        }
        prop_assert_eq!(self.p.s.mismatches(), self.mismatches);
        let p = &self.p;
        for rail in 0..RAILS {
            let on = |dir: Dir| p.log.iter().filter(move |(d, r, ..)| *d == dir && *r == rail).map(|x| x.3);
            let sc = p.s.counters()[rail];
            let data_bytes: u64 = on(Dir::ToRecv)
                // Payload goes to receive buffers, above the fixed regions (records, scratch).
                .filter(|w| w.remote_addr >> 40 > SCRATCH >> 40)
                .map(|w| w.bytes())
                .sum();
            prop_assert_eq!(sc.wr_posted, on(Dir::ToRecv).count() as u64);
            prop_assert_eq!(
                sc.doorbells,
                p.chains.iter().filter(|c| c.dir == Dir::ToRecv && c.rail == rail).count() as u64
            );
            prop_assert_eq!(sc.imm_sent, on(Dir::ToRecv).filter(|w| w.opcode == WrOpcode::WriteImm).count() as u64);
            prop_assert_eq!(
                sc.probes,
                on(Dir::ToRecv).filter(|w| w.opcode == WrOpcode::Write && w.signaled).count() as u64
            );
            prop_assert_eq!(sc.bytes, data_bytes);
            prop_assert_eq!(sc.cqe, p.cq_popped(SEND_SIDE, rail));
            prop_assert_eq!(sc.zero_byte_imm, 0);
            let rc = p.r.counters()[rail];
            prop_assert_eq!(rc.wr_posted, on(Dir::ToSend).count() as u64);
            prop_assert_eq!(rc.doorbells, rc.wr_posted);
            prop_assert_eq!(rc.cqe, p.cq_popped(RECV_SIDE, rail));
        }
        Ok(())
    }
}
