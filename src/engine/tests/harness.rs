//! A fake fabric for driving a [`SendEngine`] and a [`RecvEngine`] against each other in
//! memory, deterministically: a simulated address space per side, one FIFO of WRs per
//! (rail, QP) with RC semantics (in-order execution, WRITE_WITH_IMM consuming an SRQ WQE
//! or waiting when there is none, completions after placement), and CQs per rail per side.
#![allow(dead_code)] // some helpers serve only part of the suites

use std::collections::VecDeque;
use std::sync::Arc;

use crate::engine::imm::Imm;
use crate::engine::layout::{CTS_FIFO_BYTES, RECORDS_BYTES};
use crate::engine::{
    CpuAccess, FailoverConfig, Output, Posts, QpRef, RAILS, RecvBuf, RecvConfig, RecvDone, RecvEngine, SendBuf,
    SendConfig, SendEngine,
};
use crate::fabric::{Completion, SendWr, WcOpcode, WcStatus, WrOpcode};
use crate::split::AnySplit;
use crate::telemetry::{ProbeBudget, RailTelemetry, StatsHandle, TelemetryConfig};

pub use super::memory::*;
pub use crate::engine::{CallerWaits, RailMask};

/// Which way a WR travels.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Dir {
    /// Sender → receiver (data, signalling, probes).
    ToRecv,
    /// Receiver → sender (CTS).
    ToSend,
}

/// One QP's send queue in flight: WRs not yet executed at the responder, each with its
/// index in [`Pair::log`].
#[derive(Default)]
pub struct Wire {
    pub q: VecDeque<(usize, SendWr)>,
    /// The poster's QP is in the error state: every WR posted completes as flushed.
    pub err: bool,
}

/// What became of a posted WR (parallel to [`Pair::log`]).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Fate {
    /// Still on its wire.
    Queued,
    /// Executed at the responder; `cqe`: its position in the poster's CQ if signalled.
    Executed { cqe: Option<u64> },
    /// Executed, its completion held back (a late acknowledgement, see [`Pair::hold_acks`]).
    Acking,
    /// Failed or flushed (see [`Pair::fail_head`]).
    Failed,
}

/// A sender QP's completions held back, with their WRs' `log` indices; None: on time.
pub type LateAcks = Option<VecDeque<(usize, Completion)>>;

/// Index of the sender's CQs in [`Pair::cq_pushed`].
pub const SEND_SIDE: usize = 0;
/// Index of the receiver's CQs in [`Pair::cq_pushed`].
pub const RECV_SIDE: usize = 1;

pub struct Pair {
    pub s: SendEngine,
    pub r: RecvEngine,
    pub ss: SendSide,
    pub rs: RecvSide,
    /// wires[dir][rail][qp]
    pub wires: [[Vec<Wire>; RAILS]; 2],
    pub cq_s: [VecDeque<Completion>; RAILS],
    pub cq_r: [VecDeque<Completion>; RAILS],
    /// SRQ WQEs available at the receiver, per rail.
    pub srq: [u32; RAILS],
    /// Refill below `.0` WQEs, up to `.1`.
    pub srq_marks: (u32, u32),
    pub rnr: [u64; RAILS],
    pub now: u64,
    pub posts: Posts,
    /// Every WR posted, for shape checks: (dir, rail, qp, wr).
    pub log: Vec<(Dir, usize, QpRef, SendWr)>,
    /// Every chain posted: `log[start..start + len]` went in one post call.
    pub chains: Vec<ChainRec>,
    /// What became of each WR of `log`.
    pub fate: Vec<Fate>,
    /// Completions ever pushed to each CQ, `[side][rail]`; those popped (from the front, by
    /// whoever) are `cq_pushed - len`.
    pub cq_pushed: [[u64; RAILS]; 2],
    /// Per sender QP (`[rail][qp]`): completions held back while its acks are late.
    pub late_acks: [Vec<LateAcks>; RAILS],
    /// `[dir][rail]`: the responders of WRs travelling `dir` on `rail` are fenced (in the
    /// error state): such a WR fails when it reaches the head of its wire (`faults.rs`).
    pub fenced: [[bool; RAILS]; 2],
    /// The rail's link is silent (a pulled cable): its WRs, both ways, neither land nor
    /// complete until a fence or RC's retry limit ends them (`faults.rs`).
    pub silent: [bool; RAILS],
    /// Re-admission: the plugin's side of rebuilding a rail's QPs (`faults.rs`).
    pub rb: super::faults::Rebuilds,
}

/// One posted chain, as a range of [`Pair::log`].
#[derive(Clone, Copy, Debug)]
pub struct ChainRec {
    pub dir: Dir,
    pub rail: usize,
    pub qp: QpRef,
    pub start: usize,
    pub len: usize,
}

pub struct Opts {
    pub qps: [u16; RAILS],
    /// Most pieces the sender stripes a rail's share over (1: no striping).
    pub pieces: [u8; RAILS],
    pub split: AnySplit,
    pub max_send: usize,
    pub max_recv: usize,
    pub srq: (u32, u32),
    pub probe_ns: u64,
    /// Rails of the receiver's device (bit 0 SOUT, bit 1 SUP).
    pub rails_mask: RailMask,
    /// The sender's inline limit (0: nothing is posted inline).
    pub max_inline: u32,
    /// The probe budgets of the sender's rails' NICs (unlimited unless a test shares one).
    pub probe_budgets: [Arc<ProbeBudget>; RAILS],
}

impl Default for Opts {
    fn default() -> Self {
        Opts {
            qps: [1, 1],
            pieces: [1, 1],
            split: AnySplit::Fixed(crate::split::Fixed::percent(50)),
            max_send: 256,
            max_recv: 32,
            srq: (8, 32),
            probe_ns: 0,
            rails_mask: RailMask::BOTH,
            max_inline: 0,
            probe_budgets: [Arc::new(ProbeBudget::unlimited()), Arc::new(ProbeBudget::unlimited())],
        }
    }
}

fn tel() -> RailTelemetry {
    RailTelemetry::new(TelemetryConfig { alpha: 0.125, beta: 0.25, speed_mbps: 100_000 })
}

impl Pair {
    pub fn new(o: Opts) -> Pair {
        let mut ss = SendSide { space: Space::default() };
        assert_eq!(ss.space.add(CTS_FIFO_BYTES), FIFO);
        assert_eq!(ss.space.add(4096 * 4), SIZES);
        assert_eq!(ss.space.add(64), SEND_SCRATCH);
        let mut rs = RecvSide { space: Space::default() };
        assert_eq!(rs.space.add(CTS_FIFO_BYTES), CTS);
        assert_eq!(rs.space.add(RECORDS_BYTES), RECORDS);
        assert_eq!(rs.space.add(64), SCRATCH);
        let s = SendEngine::new(
            SendConfig {
                qps: o.qps,
                pieces: o.pieces,
                max_requests: o.max_send,
                sizes_addr: SIZES,
                sizes_lkeys: [11, 12],
                records_addr: RECORDS,
                records_rkeys: [21, 22],
                scratch_addr: SCRATCH,
                scratch_rkeys: [31, 32],
                max_inline: o.max_inline,
                probe_interval_ns: o.probe_ns,
                probe_budgets: o.probe_budgets,
                failover: FailoverConfig::default(),
            },
            o.split,
            [tel(), tel()],
            0,
        );
        let r = RecvEngine::new(
            RecvConfig {
                max_requests: o.max_recv,
                rails_mask: o.rails_mask,
                pieces: o.pieces,
                cts_addr: CTS,
                cts_lkeys: [41, 42],
                fifo_addr: FIFO,
                fifo_rkeys: [51, 52],
                max_inline: 0,
                flush_addr: 0,
                flush_lkeys: [0, 0],
                scratch_addr: SEND_SCRATCH,
                scratch_rkeys: [81, 82],
                failover: FailoverConfig::default(),
            },
            [StatsHandle::detached(0), StatsHandle::detached(1)],
        );
        let mk = |n: u16| (0..n).map(|_| Wire::default()).collect::<Vec<_>>();
        let wires = [[mk(o.qps[0]), mk(o.qps[1])], [mk(o.qps[0]), mk(o.qps[1])]];
        Pair {
            s,
            r,
            ss,
            rs,
            wires,
            cq_s: Default::default(),
            cq_r: Default::default(),
            srq: [0; RAILS],
            srq_marks: o.srq,
            rnr: [0; RAILS],
            now: 1_000,
            posts: Posts::default(),
            log: Vec::new(),
            chains: Vec::new(),
            fate: Vec::new(),
            cq_pushed: [[0; RAILS]; 2],
            late_acks: [vec![None; o.qps[0] as usize], vec![None; o.qps[1] as usize]],
            fenced: [[false; RAILS]; 2],
            silent: [false; RAILS],
            rb: Default::default(),
        }
    }

    pub fn enqueue(&mut self, dir: Dir) {
        let posts = std::mem::take(&mut self.posts);
        self.enqueue_chains(dir, posts.chains());
        self.posts = posts;
        self.posts.clear();
    }

    /// Puts `chains` on their wires; on a wire whose QP is in the error state each WR
    /// completes as flushed at once, as a post to an errored QP does.
    pub fn enqueue_chains(&mut self, dir: Dir, chains: &[crate::engine::Chain]) {
        for c in chains {
            let qp = match c.qp {
                QpRef::Data(i) => i as usize,
                QpRef::Cts => 0,
                QpRef::Flush => panic!("no flush QP in the harness"),
            };
            let start = self.log.len();
            self.chains.push(ChainRec { dir, rail: c.rail as usize, qp: c.qp, start, len: c.wrs().len() });
            for wr in c.wrs() {
                let idx = self.log.len();
                self.log.push((dir, c.rail as usize, c.qp, *wr));
                if self.wires[dir as usize][c.rail as usize][qp].err {
                    let side = if dir == Dir::ToRecv { SEND_SIDE } else { RECV_SIDE };
                    let qp_num = (c.rail as usize * 100 + qp) as u32;
                    let flushed =
                        Completion { wr_id: wr.wr_id, status: WcStatus::Flushed, qp_num, ..Completion::default() };
                    self.push_cq(side, c.rail as usize, flushed);
                    self.fate.push(Fate::Failed);
                    continue;
                }
                self.wires[dir as usize][c.rail as usize][qp].q.push_back((idx, *wr));
                self.fate.push(Fate::Queued);
            }
        }
    }

    /// Refills the SRQs between watermarks of their own (`Opts::srq`: below `low` WQEs, up
    /// to `high`), at irecv and test as the plugin does; small ones make writes wait (RNR).
    /// (The plugin's policy, stocked for every receive its connections may have outstanding,
    /// is `plugin::nic`'s.)
    pub fn refill(&mut self) {
        for rail in 0..RAILS {
            // As the plugin counts them: a WQE is gone once its completion was polled.
            let unpolled = self.cq_r[rail].iter().filter(|c| c.opcode == WcOpcode::RecvRdmaWithImm).count() as u32;
            let seen = self.srq[rail] + unpolled;
            if seen < self.srq_marks.0 {
                self.srq[rail] += self.srq_marks.1 - seen;
            }
        }
    }

    pub fn irecv(&mut self, bufs: &[RecvBuf]) -> Option<u16> {
        self.refill();
        let id = self.r.irecv(bufs, &mut self.rs, &mut self.posts).expect("irecv");
        self.enqueue(Dir::ToSend);
        id
    }

    /// Posts one receive into a fresh zeroed `size`-byte buffer, tag 0: (id, buffer).
    pub fn irecv_one(&mut self, size: usize) -> (u16, u64) {
        let ra = self.recv_buf(size);
        (self.irecv(&[rbuf(ra, size as u64, 0)]).expect("receive id"), ra)
    }

    pub fn isend(&mut self, buf: SendBuf) -> crate::Result<Option<u16>> {
        let r = self.s.isend(self.now, buf, &mut self.ss, &mut self.posts);
        self.enqueue(Dir::ToRecv);
        r
    }

    pub fn probes(&mut self) {
        self.probes_waiting(CallerWaits::No);
    }

    /// Probes, with the caller waiting on the connection (keepalives even with probes off).
    pub fn probes_waiting(&mut self, waiting: CallerWaits) {
        let mut out = Output::default();
        self.s.poll_probes(self.now, waiting, &mut out);
        self.enqueue_chains(Dir::ToRecv, &out.chains);
    }

    /// The receiver's keepalive check.
    pub fn keepalive(&mut self) {
        let mut out = Output::default();
        self.r.poll_keepalive(self.now, &mut out);
        self.enqueue_chains(Dir::ToSend, &out.chains);
    }

    /// Executes the head WR of one wire. Returns false when it cannot (empty, or RNR).
    pub fn step(&mut self, dir: Dir, rail: usize, qp: usize) -> bool {
        let Some((idx, wr)) = self.wires[dir as usize][rail][qp].q.front().copied() else { return false };
        if self.fenced[dir as usize][rail] {
            // The responder is in the error state: the WR is never placed, the requester
            // runs out of retries and its QP fails.
            self.fail_head(dir, rail, qp, WcStatus::RetryExceeded);
            self.wires[dir as usize][rail][qp].err = true;
            return true;
        }
        if self.silent[rail] {
            return false; // nothing crosses a silent link
        }
        if wr.opcode == WrOpcode::WriteImm && dir == Dir::ToRecv {
            if self.srq[rail] == 0 {
                self.rnr[rail] += 1;
                return false; // RC with infinite RNR retry: wait
            }
            self.srq[rail] -= 1;
        }
        self.wires[dir as usize][rail][qp].q.pop_front();
        let (src, dst) = match dir {
            Dir::ToRecv => (&mut self.ss.space, &mut self.rs.space),
            Dir::ToSend => (&mut self.rs.space, &mut self.ss.space),
        };
        let mut off = 0u64;
        for sge in &wr.sge[..wr.num_sge as usize] {
            if src.is_virtual(sge.addr, sge.len as usize) || dst.is_virtual(wr.remote_addr + off, sge.len as usize) {
                off += sge.len as u64;
                continue;
            }
            let data = src.read(sge.addr, sge.len as usize);
            dst.write(wr.remote_addr + off, &data);
            off += sge.len as u64;
        }
        self.now += 100;
        let qp_num = (rail * 100 + qp) as u32;
        let (local, remote) = match dir {
            Dir::ToRecv => (SEND_SIDE, RECV_SIDE),
            Dir::ToSend => (RECV_SIDE, SEND_SIDE),
        };
        if wr.opcode == WrOpcode::WriteImm {
            let c = Completion {
                opcode: WcOpcode::RecvRdmaWithImm,
                imm: wr.imm,
                byte_len: off as u32,
                qp_num,
                ..Completion::default()
            };
            self.push_cq(remote, rail, c);
        }
        let mut cqe = None;
        if wr.signaled {
            let c = Completion { wr_id: wr.wr_id, opcode: WcOpcode::RdmaWrite, qp_num, ..Completion::default() };
            if let (Dir::ToRecv, Some(late)) = (dir, &mut self.late_acks[rail][qp]) {
                late.push_back((idx, c));
                self.fate[idx] = Fate::Acking;
                return true;
            }
            cqe = Some(self.push_cq(local, rail, c));
        }
        self.fate[idx] = Fate::Executed { cqe };
        true
    }

    /// From now on the sender's QP `qp` of `rail` gets its acknowledgements late: its WRs
    /// still execute (data lands, IMMs arrive) but their completions are held back, in order,
    /// until [`Pair::release_acks`]; the other QPs' completions go on.
    pub fn hold_acks(&mut self, rail: usize, qp: usize) {
        self.late_acks[rail][qp].get_or_insert_with(VecDeque::new);
    }

    /// The held completions of the sender's QP `qp` of `rail` arrive, in order.
    pub fn release_acks(&mut self, rail: usize, qp: usize) {
        for (idx, c) in self.late_acks[rail][qp].take().unwrap_or_default() {
            let pos = self.push_cq(SEND_SIDE, rail, c);
            self.fate[idx] = Fate::Executed { cqe: Some(pos) };
        }
    }

    /// Appends `c` to `side`'s CQ of `rail`; returns its position in that CQ's history.
    pub(super) fn push_cq(&mut self, side: usize, rail: usize, c: Completion) -> u64 {
        let cq = if side == SEND_SIDE { &mut self.cq_s[rail] } else { &mut self.cq_r[rail] };
        cq.push_back(c);
        self.cq_pushed[side][rail] += 1;
        self.cq_pushed[side][rail] - 1
    }

    /// Completions popped so far from `side`'s CQ of `rail`.
    pub fn cq_popped(&self, side: usize, rail: usize) -> u64 {
        let len = if side == SEND_SIDE { self.cq_s[rail].len() } else { self.cq_r[rail].len() };
        self.cq_pushed[side][rail] - len as u64
    }

    /// Whether WR `log[idx]` executed and, if signalled, its completion was polled.
    pub fn completed(&self, idx: usize) -> bool {
        let (dir, rail, ..) = self.log[idx];
        let side = if dir == Dir::ToRecv { SEND_SIDE } else { RECV_SIDE };
        match self.fate[idx] {
            Fate::Executed { cqe: Some(pos) } => self.cq_popped(side, rail) > pos,
            Fate::Executed { cqe: None } => true,
            _ => false,
        }
    }

    /// Executes every WR that can execute, in a fixed order.
    pub fn deliver_all(&mut self) {
        loop {
            let mut progressed = false;
            for dir in [Dir::ToSend, Dir::ToRecv] {
                for rail in 0..RAILS {
                    for qp in 0..self.wires[dir as usize][rail].len() {
                        while self.step(dir, rail, qp) {
                            progressed = true;
                        }
                    }
                }
            }
            if !progressed {
                break;
            }
        }
    }

    /// The head WR of one wire fails with `status` instead of executing: it completes with
    /// that status (signalled or not, as an RC QP reports a failed WR), the QP goes to the
    /// error state and every WR behind it completes as flushed. Returns the failed WR.
    pub fn fail_head(&mut self, dir: Dir, rail: usize, qp: usize, status: WcStatus) -> SendWr {
        let q = &mut self.wires[dir as usize][rail][qp].q;
        let failed: Vec<(usize, SendWr)> = q.drain(..).collect();
        let side = if dir == Dir::ToRecv { SEND_SIDE } else { RECV_SIDE };
        let qp_num = (rail * 100 + qp) as u32;
        for (k, &(idx, w)) in failed.iter().enumerate() {
            let status = if k == 0 { status } else { WcStatus::Flushed };
            self.push_cq(side, rail, Completion { wr_id: w.wr_id, status, qp_num, ..Completion::default() });
            self.fate[idx] = Fate::Failed;
        }
        failed.first().expect("a WR to fail").1
    }

    /// Whether any WR still waiting on a wire in direction `dir` matches `pred`.
    pub fn wire_any(&self, dir: Dir, pred: impl Fn(usize, &SendWr) -> bool) -> bool {
        self.wires[dir as usize]
            .iter()
            .enumerate()
            .any(|(rail, qps)| qps.iter().any(|w| w.q.iter().any(|(_, wr)| pred(rail, wr))))
    }

    /// WRs waiting on all wires.
    pub fn wires_len(&self) -> usize {
        self.wires.iter().flatten().flatten().map(|w| w.q.len()).sum()
    }

    /// Hands the receiver a completion as if polled from `rail`'s CQ.
    pub fn inject_recv(&mut self, rail: usize, c: Completion) -> crate::Result<()> {
        self.r.handle_completion(rail, &c, &self.rs)
    }

    /// Hands the sender a completion as if polled from `rail`'s CQ.
    pub fn inject_send(&mut self, rail: usize, c: Completion) -> crate::Result<()> {
        self.s.handle_completion(self.now, rail, &c)
    }

    /// Polls the sender's CQs into its engine.
    pub fn poll_send(&mut self) -> crate::Result<()> {
        for rail in 0..RAILS {
            while let Some(c) = self.cq_s[rail].pop_front() {
                self.s.handle_completion(self.now, rail, &c)?;
            }
        }
        Ok(())
    }

    /// Polls the receiver's CQs into its engine.
    pub fn poll_recv(&mut self) -> crate::Result<()> {
        for rail in 0..RAILS {
            while let Some(c) = self.cq_r[rail].pop_front() {
                self.r.handle_completion(rail, &c, &self.rs)?;
            }
        }
        Ok(())
    }

    pub fn test_recv(&mut self, id: u16) -> crate::Result<Option<RecvDone>> {
        self.refill();
        self.poll_recv()?;
        self.r.test(id)
    }

    pub fn test_send(&mut self, id: u16) -> crate::Result<Option<u64>> {
        self.poll_send()?;
        self.s.test(id)
    }

    /// Adds a send buffer filled with `pattern`; returns its address.
    pub fn send_buf(&mut self, data: &[u8]) -> u64 {
        let a = self.ss.space.add(data.len().max(1));
        self.ss.space.write(a, data);
        a
    }

    /// Adds a zeroed receive buffer; returns its address.
    pub fn recv_buf(&mut self, len: usize) -> u64 {
        self.rs.space.add(len.max(1))
    }

    /// A send and a receive buffer too large to hold: lengths only.
    pub fn virtual_bufs(&mut self, size: usize) -> (u64, u64) {
        (self.ss.space.add_virtual(size), self.rs.space.add_virtual(size))
    }

    /// WRs posted on `rail` in direction `dir` so far.
    pub fn wrs_on(&self, dir: Dir, rail: usize) -> usize {
        self.log.iter().filter(|(d, r, _, _)| *d == dir && *r == rail).count()
    }
}

/// A deterministic byte pattern for message `seed`.
pub fn pattern(seed: u64, len: usize) -> Vec<u8> {
    let mut x = seed.wrapping_mul(0x9e37_79b9_7f4a_7c15) | 1;
    (0..len)
        .map(|_| {
            x ^= x << 13;
            x ^= x >> 7;
            x ^= x << 17;
            x as u8
        })
        .collect()
}

/// The receive completion a WRITE_WITH_IMM carrying `byte_len` bytes produces.
pub fn imm_cqe(imm: Imm, byte_len: u32) -> Completion {
    Completion { opcode: WcOpcode::RecvRdmaWithImm, imm: imm.encode(), byte_len, ..Completion::default() }
}

/// A completion for the WR `wr_id` with `status`.
pub fn wr_cqe(wr_id: u64, status: WcStatus) -> Completion {
    Completion { wr_id, status, ..Completion::default() }
}

pub fn rbuf(addr: u64, size: u64, tag: u32) -> RecvBuf {
    RecvBuf { addr, size, tag, rkeys: [61, 62] }
}

pub fn sbuf(addr: u64, size: u64, tag: u32) -> SendBuf {
    SendBuf { addr, size, tag, lkeys: [71, 72], cpu: CpuAccess::Readable }
}
