//! Rail failover, sans-IO: a model test that fails one rail at random points of random
//! interleavings (which rail, which WR, on which side; the WR's data landed, partly or not
//! at all; its IMM landed or not; its acknowledgement lost so the sender saw an error
//! although it landed; the plugin's port-down word; the rail's link falling silent, caught
//! by the sender's silent-rail check or RC's retry limit), receives of 1…8 buffers of 0 bytes to
//! more than 512 MiB (the sentinel path), every split, near the slot wrap. Every request
//! must complete with exact sizes and exact bytes, and none may error. A second failure on
//! the other rail, during the recovery or after it, makes every request still outstanding
//! fail, with no hang and no wrong byte in what did complete. The deterministic cases are in
//! `failover_cases.rs`.

use proptest::prelude::*;
use proptest::test_runner::TestCaseError;

mod both;
mod outage;
mod strategy;

use both::run_both;

use strategy::*;

use super::faults::*;
use super::harness::*;
use crate::engine::imm::Imm;
use crate::engine::{Event, RailState};
use crate::fabric::{WcStatus, WrOpcode};
use crate::split::{AnySplit, Fixed};

/// Bytes after each real receive buffer that must stay zero.
const GUARD: usize = 64;
/// Receives larger than this use virtual buffers (sizes checked, bytes not held).
const VIRTUAL_FROM: usize = 1 << 20;

struct Live {
    spec: RecvSpec,
    seed: u64,
    rid: Option<u16>,
    /// (address, virtual) per buffer.
    addrs: Vec<(u64, bool)>,
    /// Send ids by buffer index, as posted.
    sids: Vec<Option<u16>>,
    sent: usize,
    recv_done: bool,
    sends_done: usize,
}

struct Model {
    p: Pair,
    fo: FoOut,
    specs: Vec<RecvSpec>,
    live: Vec<Live>,
    next_recv: usize,
    next_send: usize,
    failed_rail: Option<usize>,
    /// Per rail: a fault other than a silent link hit it. A rail whose link only fell
    /// silent and that carried nothing since may rightly stay up on both sides (nobody had
    /// a reason to notice).
    loud: [bool; 2],
    /// Per rail: a fault other than a port-down event hit it (a failed WR, a silent link). A
    /// port-down on a rail no other rail can relieve is left to RC, and the model's links
    /// work on: the port came back, and the rail is settled Up on both sides.
    not_only_port: [bool; 2],
    /// Faults may hit both rails (the both-rails-down model).
    both_rails: bool,
}

fn fail<T>(msg: String) -> Result<T, TestCaseError> {
    Err(TestCaseError::fail(msg))
}

fn sent_bytes(seed: u64, k: usize, len: usize) -> Vec<u8> {
    pattern(seed * 16 + k as u64 + 1, len)
}

impl Model {
    fn new(qps: [u16; 2], pieces: [u8; 2], percent: u8, warmup: usize, specs: Vec<RecvSpec>) -> Self {
        let split = AnySplit::Fixed(Fixed::percent(percent));
        let mut p = Pair::new(Opts { qps, pieces, split, ..Opts::default() });
        enable_failover(&mut p, 0);
        // Warm-up transfers large enough to be split: both rails have completed something
        // (the silent-rail check judges only rails it has heard from).
        for _ in 0..warmup {
            let (rid, _) = p.irecv_one(8192);
            p.deliver_all();
            let sa = p.send_buf(&[7; 8192]);
            let sid = p.isend(sbuf(sa, 8192, 0)).unwrap().unwrap();
            p.deliver_all();
            p.test_recv(rid).unwrap().unwrap();
            p.test_send(sid).unwrap().unwrap();
        }
        Model {
            p,
            fo: FoOut::default(),
            specs,
            live: Vec::new(),
            next_recv: 0,
            next_send: 0,
            failed_rail: None,
            loud: [false; 2],
            not_only_port: [false; 2],
            both_rails: false,
        }
    }

    fn irecv(&mut self) -> Result<(), TestCaseError> {
        let Some(spec) = self.specs.get(self.next_recv).cloned() else { return Ok(()) };
        let seed = self.next_recv as u64 + 1;
        let mut addrs = Vec::new();
        let mut bufs = Vec::new();
        for (k, &(posted, sent)) in spec.bufs.iter().enumerate() {
            let virt = posted.max(sent) >= VIRTUAL_FROM;
            let ra = if virt { self.p.rs.space.add_virtual(posted.max(1)) } else { self.p.recv_buf(posted + GUARD) };
            addrs.push((ra, virt));
            bufs.push(rbuf(ra, posted as u64, k as u32));
        }
        self.p.refill();
        let rid = self.p.r.irecv(&bufs, &mut self.p.rs, &mut self.p.posts)?;
        self.p.enqueue(Dir::ToSend);
        let Some(rid) = rid else { return Ok(()) }; // the slot's previous receive is out
        let n = spec.bufs.len();
        self.live.push(Live {
            spec,
            seed,
            rid: Some(rid),
            addrs,
            sids: vec![None; n],
            sent: 0,
            recv_done: false,
            sends_done: 0,
        });
        self.next_recv += 1;
        Ok(())
    }

    fn isend(&mut self) -> Result<(), TestCaseError> {
        let Some(l) = self.live.iter_mut().find(|l| l.sent < l.spec.bufs.len()) else { return Ok(()) };
        let k = l.spec.order[l.sent];
        let sent = l.spec.bufs[k].1;
        let sa = if sent.max(l.spec.bufs[k].0) >= VIRTUAL_FROM {
            self.p.ss.space.add_virtual(sent.max(1))
        } else {
            let data = sent_bytes(l.seed, k, sent);
            self.p.send_buf(&data)
        };
        let seed = l.seed;
        if let Some(id) = self.p.isend(sbuf(sa, sent as u64, k as u32))? {
            let l = self.live.iter_mut().find(|l| l.seed == seed).unwrap();
            l.sids[k] = Some(id);
            l.sent += 1;
            self.next_send += 1;
        }
        Ok(())
    }

    /// Tests the `k`-th live request; checks a completed one exactly.
    fn test(&mut self, k: usize) -> Result<(), TestCaseError> {
        let reqs: Vec<(usize, Option<usize>)> = self
            .live
            .iter()
            .enumerate()
            .flat_map(|(i, l)| {
                let r = (!l.recv_done).then_some((i, None));
                r.into_iter()
                    .chain(l.sids.iter().enumerate().filter(|(_, s)| s.is_some()).map(move |(j, _)| (i, Some(j))))
            })
            .collect();
        if reqs.is_empty() {
            return Ok(());
        }
        let (i, which) = reqs[k % reqs.len()];
        match which {
            None => {
                let rid = self.live[i].rid.unwrap();
                if let Some(done) = self.p.test_recv(rid)? {
                    self.check_recv(i, &done.sizes[..done.n])?;
                    self.live[i].recv_done = true;
                }
            }
            Some(j) => {
                let sid = self.live[i].sids[j].unwrap();
                if let Some(size) = self.p.test_send(sid)? {
                    let (posted, sent) = self.live[i].spec.bufs[j];
                    if size != sent.min(posted) as u64 {
                        return fail(format!("send {j} of receive {i}: size {size}, sent {sent} posted {posted}"));
                    }
                    self.live[i].sids[j] = None;
                    self.live[i].sends_done += 1;
                }
            }
        }
        self.live.retain(|l| !(l.recv_done && l.sends_done == l.spec.bufs.len()));
        Ok(())
    }

    fn check_recv(&mut self, i: usize, sizes: &[u64]) -> Result<(), TestCaseError> {
        let l = &self.live[i];
        if sizes.len() != l.spec.bufs.len() {
            return fail(format!("receive {}: {} sizes for {} buffers", l.seed, sizes.len(), l.spec.bufs.len()));
        }
        for (k, &(posted, sent)) in l.spec.bufs.iter().enumerate() {
            let want = sent.min(posted);
            if sizes[k] != want as u64 {
                return fail(format!("receive {} buffer {k}: size {} expected {want}", l.seed, sizes[k]));
            }
            let (addr, virt) = l.addrs[k];
            if virt {
                continue;
            }
            let got = self.p.rs.space.read(addr, posted + GUARD);
            let mut exp = sent_bytes(l.seed, k, sent);
            exp.truncate(want);
            exp.resize(posted + GUARD, 0);
            if got != exp {
                let at = got.iter().zip(&exp).position(|(a, b)| a != b).unwrap();
                return fail(format!("receive {} buffer {k} ({want} of {posted} bytes): wrong byte at {at}", l.seed));
            }
        }
        Ok(())
    }

    fn busy_wires(&self, rail: Option<usize>, dir: Option<Dir>) -> Vec<(Dir, usize, usize)> {
        let mut v = Vec::new();
        for d in [Dir::ToSend, Dir::ToRecv] {
            for r in 0..2 {
                for qp in 0..self.p.wires[d as usize][r].len() {
                    let ok = rail.is_none_or(|x| x == r) && dir.is_none_or(|x| x == d);
                    if ok && !self.p.wires[d as usize][r][qp].q.is_empty() {
                        v.push((d, r, qp));
                    }
                }
            }
        }
        v
    }

    fn fault(&mut self, f: Fault) -> Result<(), TestCaseError> {
        let rail = f.rail();
        if !self.both_rails && self.failed_rail.is_some_and(|r| r != rail) {
            return Ok(()); // one rail fails per case here; both: the deterministic tests
        }
        self.failed_rail = Some(rail);
        self.loud[rail] |= !matches!(f, Fault::Silent { .. });
        let dir_of = |to_send: bool| if to_send { Dir::ToSend } else { Dir::ToRecv };
        let pick = |m: &Model, to_send: bool, k: usize| {
            let w = m.busy_wires(Some(rail), Some(dir_of(to_send)));
            let w = if w.is_empty() { m.busy_wires(Some(rail), None) } else { w };
            (!w.is_empty()).then(|| w[k % w.len()])
        };
        match f {
            Fault::FailHead { to_send, k, partial, .. } => match pick(self, to_send, k) {
                Some((d, r, qp)) => {
                    if partial {
                        let len = self.p.wires[d as usize][r][qp].q.front().map_or(0, |(_, w)| w.bytes() as usize);
                        self.p.land_partly(d, r, qp, len / 2);
                    }
                    self.p.fail_qp(d, r, qp, WcStatus::RetryExceeded);
                    self.not_only_port[rail] = true;
                }
                None => self.p.s.handle_event(self.p.now, Event::RailDown { rail })?,
            },
            Fault::LandThenFail { to_send, k, .. } => match pick(self, to_send, k) {
                Some((d, r, qp)) => {
                    self.p.refill();
                    self.p.land_then_fail(d, r, qp);
                    self.not_only_port[rail] = true;
                }
                None => self.p.r.handle_event(Event::RailDown { rail })?,
            },
            Fault::PortDown { at_sender: true, .. } => self.p.s.handle_event(self.p.now, Event::RailDown { rail })?,
            Fault::PortDown { at_sender: false, .. } => self.p.r.handle_event(Event::RailDown { rail })?,
            Fault::Silent { .. } => {
                self.p.silent[rail] = true;
                self.not_only_port[rail] = true;
            }
        }
        Ok(())
    }

    fn apply(&mut self, op: &Op) -> Result<(), TestCaseError> {
        match *op {
            Op::Irecv => self.irecv(),
            Op::Isend => self.isend(),
            Op::Step(k) => {
                let w = self.busy_wires(None, None);
                if !w.is_empty() {
                    let (d, r, qp) = w[k % w.len()];
                    self.p.refill();
                    self.p.step(d, r, qp);
                }
                Ok(())
            }
            Op::Poll { side, rail } => {
                if side == SEND_SIDE {
                    if let Some(c) = self.p.cq_s[rail].pop_front() {
                        self.p.s.handle_completion(self.p.now, rail, &c)?;
                    }
                } else if let Some(c) = self.p.cq_r[rail].pop_front() {
                    self.p.r.handle_completion(rail, &c, &self.p.rs)?;
                }
                Ok(())
            }
            Op::Test(k) => self.test(k),
            Op::Pump => Ok(self.p.pump_failover(&mut self.fo)?),
            Op::Acks { rail, qp, late } => {
                let qp = qp % self.p.late_acks[rail].len();
                let live = self.p.s.rail_states()[rail] == RailState::Up && !self.p.silent[rail];
                if live && !self.p.wires[Dir::ToRecv as usize][rail][qp].err {
                    if late {
                        self.p.hold_acks(rail, qp);
                    } else {
                        self.p.release_acks(rail, qp);
                    }
                }
                Ok(())
            }
            Op::Fault(f) => self.fault(f),
            Op::Tick(ms) => {
                if !self.p.silent.contains(&true) {
                    return Ok(());
                }
                if !self.both_rails {
                    // Late acknowledgements are a µs-scale reordering on a working link: in
                    // milliseconds they arrive, and so does what waits on its wires. (Held
                    // for good, the rail would be a second silent one, which is the
                    // both-rails model: a working rail left idle for the ms of a tick while
                    // the silent one had just completed late ACKs looked silent itself.)
                    let silent = self.p.silent;
                    for rail in (0..2).filter(|&r| !silent[r]) {
                        for qp in 0..self.p.late_acks[rail].len() {
                            self.p.release_acks(rail, qp);
                        }
                        for d in [Dir::ToSend, Dir::ToRecv] {
                            for qp in 0..self.p.wires[d as usize][rail].len() {
                                while self.p.step(d, rail, qp) {}
                            }
                        }
                    }
                }
                self.p.now += ms * 1_000_000;
                // As the plugin's test: its CQs polled before the round that checks silence.
                self.p.poll_send()?;
                Ok(self.p.poll_recv()?)
            }
        }
    }

    /// Whether `rail`'s faults, if any, are settled: fenced on both sides, or (a silent link
    /// only) unnoticed, up on both.
    fn settled(&self, rail: usize) -> bool {
        let (ss, rs) = (self.p.s.rail_states()[rail], self.p.r.rail_states()[rail]);
        let fenced = |st: RailState| st != RailState::Up && st != (RailState::Failed { epoch: 0, fenced: false });
        let faulted = self.loud[rail] || self.p.silent[rail];
        let waited = !self.not_only_port[rail] && ss == RailState::Up && rs == RailState::Up;
        !faulted || self.unnoticed(rail) || waited || fenced(ss) && fenced(rs)
    }

    /// `rail`'s link only fell silent, and both sides still have it up.
    fn unnoticed(&self, rail: usize) -> bool {
        !self.loud[rail]
            && self.p.s.rail_states()[rail] == RailState::Up
            && self.p.r.rail_states()[rail] == RailState::Up
    }

    /// What a plugin does until everything completed: bounded, or the case fails (a hang).
    fn settle(&mut self) -> Result<(), TestCaseError> {
        for round in 0..200 {
            if self.p.silent.contains(&true) {
                // Time passes; past RC's retry budget (here 300 ms) the silent rail's
                // requesters give up, whether or not the silent-rail check was first, and
                // so does every WR posted on it later.
                self.p.now += 2_000_000;
                if round >= 150 {
                    let silent = self.p.silent;
                    for rail in (0..2).filter(|&r| silent[r]) {
                        self.p.rc_gives_up(rail);
                    }
                }
            }
            if self.live.is_empty() && self.next_recv == self.specs.len() && (0..2).all(|r| self.settled(r)) {
                return Ok(());
            }
            self.irecv()?;
            for _ in 0..8 {
                self.isend()?;
            }
            self.p.refill();
            self.p.deliver_all();
            // Late acknowledgements of a live QP arrive in the end; a fenced one's were lost.
            let silent = self.p.silent;
            for rail in (0..2).filter(|&r| !silent[r]) {
                for qp in 0..self.p.late_acks[rail].len() {
                    self.p.release_acks(rail, qp);
                }
            }
            self.p.poll_send()?;
            self.p.poll_recv()?;
            self.p.pump_failover(&mut self.fo)?;
            for k in 0..64 {
                self.test(k)?;
            }
        }
        fail(format!(
            "hang: {} receives live, {} of {} posted, rails {:?} / {:?}",
            self.live.len(),
            self.next_recv,
            self.specs.len(),
            self.p.s.rail_states(),
            self.p.r.rail_states()
        ))
    }
}

/// The QPs per rail and the most pieces the sender stripes each rail's share over.
type Shape = ([u16; 2], [u8; 2]);

/// Unstriped: a request on one QP per rail.
fn plain(qps: [u16; 2]) -> Shape {
    (qps, [1, 1])
}

fn run_case(shape: Shape, pct: u8, warmup: usize, specs: Vec<RecvSpec>, ops: &[Op]) -> Result<Model, TestCaseError> {
    let mut m = Model::new(shape.0, shape.1, pct, warmup, specs);
    for op in ops {
        m.apply(op)?;
    }
    m.settle()?;
    // The connection is healthy, and both sides went through the failover of the rail.
    if m.p.s.error().is_some() || m.p.r.error().is_some() {
        return fail(format!("a side broke: {:?} / {:?}", m.p.s.error(), m.p.r.error()));
    }
    if let Some(rail) = m.failed_rail.filter(|&r| !m.unnoticed(r)) {
        for (side, st) in [("send", m.p.s.rail_states()), ("recv", m.p.r.rail_states())] {
            if !matches!(st[rail], RailState::Failed { fenced: true, .. }) || st[rail ^ 1] != RailState::Up {
                return fail(format!("{side}: rail states {st:?} after rail {rail} failed"));
            }
        }
        let c = m.p.s.failover_counts();
        STATS.with(|t| {
            let mut t = t.borrow_mut();
            t.0 += 1;
            t.1 += c.replayed_parts;
            t.2 += m.p.r.failover_counts().cts_reposts;
            t.3 += c.confirmed_parts;
            t.4 += c.silent_failures;
        });
    }
    Ok(m)
}

thread_local! {
    /// (cases with a failover, parts replayed, CTS writes re-posted, parts confirmed by the
    /// report although their completion was lost, rails failed by the silent-rail check)
    /// over a run.
    static STATS: std::cell::RefCell<(u64, u64, u64, u64, u64)> = const { std::cell::RefCell::new((0, 0, 0, 0, 0)) };
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 400, ..ProptestConfig::default() })]

    #[test]
    fn both_rails_fail_anywhere_and_every_request_errors_without_a_hang(
        (qps, pct, warmup, specs, ops) in case_on(true)
    ) {
        run_both(plain(qps), pct, warmup, specs, &ops)?;
    }

    #[test]
    fn one_rail_fails_anywhere_and_every_request_completes_exactly(
        (qps, pct, warmup, specs, ops) in case()
    ) {
        run_case(plain(qps), pct, warmup, specs, &ops)?;
    }
}

/// The shapes of the striped models: both rails striped, one rail, and 4 pieces.
fn striped() -> impl Strategy<Value = Shape> {
    prop::sample::select(vec![([2u16, 2], [2u8, 2]), ([3, 1], [3, 1]), ([4, 3], [4, 3]), ([1, 4], [1, 4])])
}

/// The failover models with striped rail shares (`MPIB_QP_STRIPE`): a rail fails with some
/// pieces of a share in and others not; the receiver's report counts the part as arrived
/// only when all its pieces are, and the replay re-sends it whole. Over the run, parts were
/// replayed after a partial arrival, and the pieces were many.
#[test]
fn a_striped_rail_fails_anywhere_and_every_request_completes_exactly() {
    let cfg = ProptestConfig { cases: 300, ..ProptestConfig::default() };
    let mut runner = proptest::test_runner::TestRunner::new(cfg.clone());
    let (mut pieces, mut partial) = (0usize, 0u64);
    let counts = std::cell::RefCell::new((0usize, 0u64));
    runner
        .run(&(striped(), case()), |(shape, (_, pct, warmup, specs, ops))| {
            let m = run_case(shape, pct, warmup, specs, &ops)?;
            let mut c = counts.borrow_mut();
            c.0 +=
                m.p.log
                    .iter()
                    .filter(|(.., wr)| wr.opcode == WrOpcode::WriteImm && Imm::pieces_of(wr.imm as u8) > 1)
                    .count();
            c.1 += m.p.r.partial_parts();
            Ok(())
        })
        .unwrap();
    (pieces, partial) = (pieces + counts.borrow().0, partial + counts.borrow().1);
    let mut runner = proptest::test_runner::TestRunner::new(cfg);
    runner
        .run(&(striped(), case_on(true)), |(shape, (_, pct, warmup, specs, ops))| {
            run_both(shape, pct, warmup, specs, &ops)
        })
        .unwrap();
    println!(
        "striped failover model: {pieces} striped IMMs, {partial} parts replayed after some of their pieces arrived"
    );
    assert!(pieces > 1000 && partial > 5, "{pieces} {partial}");
}

/// The model above must exercise what it claims: over its cases, parts were replayed, parts
/// whose completion was lost were confirmed by the report (landed, ACK lost), CTS writes
/// were re-posted, silent rails were caught by the silent-rail check before RC's retry limit
/// (a run where none ever was would prove nothing).
#[test]
fn the_model_replays_parts_and_reposts_cts() {
    let mut runner = proptest::test_runner::TestRunner::new(ProptestConfig { cases: 400, ..ProptestConfig::default() });
    STATS.with(|t| *t.borrow_mut() = (0, 0, 0, 0, 0));
    runner
        .run(&case(), |(qps, pct, warmup, specs, ops)| run_case(plain(qps), pct, warmup, specs, &ops).map(|_| ()))
        .unwrap();
    let (cases, replayed, reposts, confirmed, silent) = STATS.with(|t| *t.borrow());
    println!(
        "failover model: {cases} cases with a rail failure, {replayed} parts replayed, {confirmed} confirmed \
         (completion lost, part arrived), {reposts} CTS re-posted, {silent} rails failed as silent"
    );
    assert!(
        cases > 200 && replayed > 50 && reposts > 5 && confirmed > 5 && silent > 2,
        "{cases} {replayed} {confirmed} {reposts} {silent}"
    );
}
