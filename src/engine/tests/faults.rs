//! The fake fabric's faults and the plugin's share of failover, for `failover.rs`: control
//! rings on both sides, fencing a side's QPs of a rail (its requesters flush, its
//! responders reject), a WR that lands but whose acknowledgement is lost, and one round of
//! what the plugin does with the engines' failover output (post the chains, perform the
//! fences, drain the fenced rail's CQ, report the fence done).

use super::harness::*;
use crate::engine::failover::{CTL_ENTRY_BYTES, CTL_RING_BYTES, CTL_WORDS};
use crate::engine::{Action, CtlMemory, Event, FailoverConfig, Output, QpRecords, RAILS};
use crate::fabric::{Completion, WcStatus};

/// Each side's control ring (written by the peer) and its outgoing messages' source.
pub const CTL_RING: u64 = base(3);
pub const CTL_OUT: u64 = base(4);

fn ring_word(space: &Space, addr: u64, i: usize, k: usize) -> u64 {
    let off = (addr & ((1 << 40) - 1)) as usize + i * CTL_ENTRY_BYTES + 8 * k;
    let r = &space.regions[(addr >> 40) as usize];
    u64::from_le_bytes(r[off..off + 8].try_into().unwrap())
}

fn entry(space: &Space, i: usize) -> [u64; CTL_WORDS] {
    std::array::from_fn(|k| ring_word(space, CTL_RING, i, k))
}

fn out_entry(space: &Space, i: usize) -> [u64; CTL_WORDS] {
    std::array::from_fn(|k| ring_word(space, CTL_OUT, i, k))
}

fn write_out(space: &mut Space, i: usize, words: &[u64; CTL_WORDS]) {
    let bytes: Vec<u8> = words.iter().flat_map(|w| w.to_le_bytes()).collect();
    space.write(CTL_OUT + (i * CTL_ENTRY_BYTES) as u64, &bytes);
}

impl CtlMemory for SendSide {
    fn ctl_seq(&self, i: usize) -> u64 {
        ring_word(&self.space, CTL_RING, i, CTL_WORDS - 1)
    }
    fn ctl_entry(&self, i: usize) -> [u64; CTL_WORDS] {
        entry(&self.space, i)
    }
    fn write_ctl_out(&mut self, i: usize, words: &[u64; CTL_WORDS]) {
        write_out(&mut self.space, i, words)
    }
    fn ctl_out_entry(&self, i: usize) -> [u64; CTL_WORDS] {
        out_entry(&self.space, i)
    }
}

impl CtlMemory for RecvSide {
    fn ctl_seq(&self, i: usize) -> u64 {
        ring_word(&self.space, CTL_RING, i, CTL_WORDS - 1)
    }
    fn ctl_entry(&self, i: usize) -> [u64; CTL_WORDS] {
        entry(&self.space, i)
    }
    fn write_ctl_out(&mut self, i: usize, words: &[u64; CTL_WORDS]) {
        write_out(&mut self.space, i, words)
    }
    fn ctl_out_entry(&self, i: usize) -> [u64; CTL_WORDS] {
        out_entry(&self.space, i)
    }
}

/// The plugin's failover output buffers.
#[derive(Default)]
pub struct FoOut {
    pub s: Output,
    pub r: Output,
}

/// Turns failover on for both engines (right after [`Pair::new`]: the rings take the
/// regions after the fixed ones). `stall_ns`: the sender's stall bound (0 = off).
pub fn enable_failover(p: &mut Pair, stall_ns: u64) {
    for space in [&mut p.ss.space, &mut p.rs.space] {
        assert_eq!(space.add(CTL_RING_BYTES), CTL_RING);
        assert_eq!(space.add(CTL_RING_BYTES), CTL_OUT);
    }
    let cfg = |lk: u32, rk: u32| FailoverConfig {
        enabled: true,
        stall_ns,
        silence: true,
        silent_floor_ns: 0,
        ctl_out_addr: CTL_OUT,
        ctl_out_lkeys: [lk, lk + 1],
        ctl_ring_addr: CTL_RING,
        ctl_ring_rkeys: [rk, rk + 1],
        readmit_ns: 0,
        readmit_max_ns: 0,
        drill: None,
        outage_grace_ns: 0,
    };
    *p.s.failover_config_mut() = cfg(91, 93);
    *p.r.failover_config_mut() = cfg(95, 97);
}

/// The fake plugin's rebuilds: how many QP generations each side made per rail, what each
/// side connected to, and test knobs.
#[derive(Default)]
pub struct Rebuilds {
    /// `[side][rail]`: generations built (records name side, rail and generation).
    pub built: [[u64; RAILS]; 2],
    /// The set-up channel holds what is sent on it (`to side`, words) until released.
    pub oob_held: bool,
    pub oob_queue: Vec<(usize, [u64; crate::engine::failover::CTL_WORDS])>,
    /// `[side][rail]`: the records each side last connected its new QPs to.
    pub connected: [[Option<QpRecords>; RAILS]; 2],
    /// The receiver's QpsConnected still to feed (the sender connected last).
    pub recv_connected_due: [bool; RAILS],
    /// Test knobs: the next N RebuildQps of the sender fail (a rail that stays down).
    pub refuse: [u32; RAILS],
    /// Actions performed, for checks: (side, action).
    pub actions: Vec<(usize, Action)>,
    /// The sender's next timed round where rounds are gated ([`Pair::pump_failover_gated`]).
    pub next_round_ns: u64,
    /// Test knob: the rail's port is down (verbs): RebuildQps answers PortDown.
    pub port_down: [bool; RAILS],
    /// Test knob, with gated rounds: the sender's calls never wait (its requests are all
    /// done when tested), so only its timer runs a round (the plugin's successful isend).
    pub sender_never_waits: bool,
}

/// The records a fake side's rebuilt QPs of `rail`, generation `g`, are described by: as
/// many words as 16 QPs take (26), each one distinct, so a word lost or moved on the way
/// through the control ring fails the connect's check.
pub fn fake_records(side: usize, rail: usize, g: u64) -> QpRecords {
    let mut r = QpRecords { n: 26, ..QpRecords::default() };
    for (k, w) in r.words[..26].iter_mut().enumerate() {
        *w = (side as u64) << 56 | (rail as u64) << 48 | (k as u64) << 40 | g;
    }
    r
}

/// Turns re-admission on (after [`enable_failover`]): first back-off `base_ns`, cap `max_ns`.
pub fn enable_readmit(p: &mut Pair, base_ns: u64, max_ns: u64) {
    for cfg in [p.s.failover_config_mut(), p.r.failover_config_mut()] {
        (cfg.readmit_ns, cfg.readmit_max_ns) = (base_ns, max_ns);
    }
}

impl Pair {
    /// The plugin's share of an action (both sides): fence, rebuild, connect.
    fn perform(&mut self, side: usize, a: Action) -> crate::Result<()> {
        self.rb.actions.push((side, a));
        let ev = match a {
            Action::FenceQps { rail } => {
                self.fence(side, rail);
                if side == RECV_SIDE {
                    while let Some(c) = self.cq_r[rail].pop_front() {
                        self.r.handle_completion(rail, &c, &self.rs)?;
                    }
                }
                Some(Event::FenceDone { rail })
            }
            Action::RebuildQps { rail } => {
                if self.rb.port_down[rail] {
                    Some(Event::PortDown { rail })
                } else if side == SEND_SIDE && self.rb.refuse[rail] > 0 {
                    self.rb.refuse[rail] -= 1;
                    Some(Event::ReadmitFailed { rail })
                } else {
                    self.rb.built[side][rail] += 1;
                    self.rb.connected[side][rail] = None;
                    Some(Event::QpsBuilt { rail, records: fake_records(side, rail, self.rb.built[side][rail]) })
                }
            }
            Action::Drop { .. } => unreachable!("no drill in the engine tests' pairs"),
            Action::ControlOob { words } => {
                // The set-up channel: delivered to the peer's engine at once, unless held.
                if self.rb.oob_held {
                    self.rb.oob_queue.push((1 - side, words));
                } else if side == SEND_SIDE {
                    self.r.handle_event(Event::ControlOob { words })?;
                } else {
                    self.s.handle_event(self.now, Event::ControlOob { words })?;
                }
                None
            }
            Action::HangReport { .. } => None,
            Action::ConnectQps { rail, records } => {
                let peer = 1 - side;
                assert_eq!(
                    records,
                    fake_records(peer, rail, self.rb.built[peer][rail]),
                    "connects to the peer's newest QPs"
                );
                self.rb.connected[side][rail] = Some(records);
                let mine = fake_records(side, rail, self.rb.built[side][rail]);
                if self.rb.connected[peer][rail].is_some_and(|r| r == mine) {
                    // Both ends connected: the rail's wires are new and empty.
                    self.new_wires(rail);
                    self.rb.recv_connected_due[rail] = true;
                    self.s.handle_event(self.now, Event::QpsConnected { rail })?;
                }
                None
            }
        };
        match (ev, side) {
            (Some(ev), SEND_SIDE) => self.s.handle_event(self.now, ev),
            (Some(ev), _) => self.r.handle_event(ev),
            (None, _) => Ok(()),
        }
    }

    /// Fresh QPs on both ends of `rail`: empty wires, nobody fenced.
    fn new_wires(&mut self, rail: usize) {
        for dir in 0..2 {
            for w in self.wires[dir][rail].iter_mut() {
                assert!(w.q.is_empty(), "the old QPs were drained by their fence");
                *w = Wire::default();
            }
            self.fenced[dir][rail] = false;
        }
        for l in self.late_acks[rail].iter_mut() {
            *l = None;
        }
    }

    /// RC's retry limit runs out on a silent `rail`: every requester of it with WRs queued
    /// fails its head (`RetryExceeded`, the rest flushed); acknowledgements held back are
    /// lost with it.
    pub fn rc_gives_up(&mut self, rail: usize) {
        for dir in [Dir::ToRecv, Dir::ToSend] {
            for qp in 0..self.wires[dir as usize][rail].len() {
                self.fail_qp(dir, rail, qp, WcStatus::RetryExceeded);
            }
        }
        for qp in 0..self.late_acks[rail].len() {
            if let Some(held) = self.late_acks[rail][qp].as_mut() {
                for (idx, c) in std::mem::take(held) {
                    self.push_cq(SEND_SIDE, rail, Completion { status: WcStatus::RetryExceeded, ..c });
                    self.fate[idx] = Fate::Failed;
                }
            }
        }
    }

    /// Fences `side`'s QPs of `rail`: its requesters' queued WRs flush (and later posts
    /// flush at once); WRs reaching its responders fail at the peer.
    pub fn fence(&mut self, side: usize, rail: usize) {
        let (own, peer) = if side == SEND_SIDE { (Dir::ToRecv, Dir::ToSend) } else { (Dir::ToSend, Dir::ToRecv) };
        for qp in 0..self.wires[own as usize][rail].len() {
            if !self.wires[own as usize][rail][qp].q.is_empty() {
                self.fail_head(own, rail, qp, WcStatus::Flushed);
            }
            self.wires[own as usize][rail][qp].err = true;
        }
        self.fenced[peer as usize][rail] = true;
        // Acknowledgements held back on a fenced sender QP never come: those WRs landed,
        // the sender sees them fail (the ACK-lost case).
        if side == SEND_SIDE {
            for qp in 0..self.late_acks[rail].len() {
                for (idx, c) in self.late_acks[rail][qp].take().unwrap_or_default() {
                    let failed = Completion { status: WcStatus::RetryExceeded, ..c };
                    self.push_cq(SEND_SIDE, rail, failed);
                    self.fate[idx] = Fate::Failed;
                }
            }
        }
    }

    /// The head WR of a wire lands (data and IMM), but its acknowledgement is lost: the
    /// poster sees it fail and its QP goes to the error state. False: nothing to run.
    pub fn land_then_fail(&mut self, dir: Dir, rail: usize, qp: usize) -> bool {
        let Some(&(_, wr)) = self.wires[dir as usize][rail][qp].q.front() else { return false };
        if self.fenced[dir as usize][rail] {
            return false; // its responder is fenced: it cannot land
        }
        if dir == Dir::ToRecv {
            self.hold_acks(rail, qp);
        }
        if !self.step(dir, rail, qp) {
            return false; // RNR: it waits
        }
        let side = if dir == Dir::ToRecv { SEND_SIDE } else { RECV_SIDE };
        let qp_num = (rail * 100 + qp) as u32;
        let mut lost: Vec<u64> = Vec::new();
        if dir == Dir::ToRecv {
            // Every completion held back on the QP (the head's, if signalled) is lost.
            for (idx, c) in self.late_acks[rail][qp].take().unwrap_or_default() {
                self.fate[idx] = Fate::Failed;
                lost.push(c.wr_id);
            }
        } else if wr.signaled {
            // The receiver's signalled WR completed: take that success back.
            self.cq_r[rail].pop_back();
            self.cq_pushed[RECV_SIDE][rail] -= 1;
        }
        if !wr.signaled || dir == Dir::ToSend {
            lost.push(wr.wr_id);
        }
        for (k, wr_id) in lost.into_iter().enumerate() {
            let status = if k == 0 { WcStatus::RetryExceeded } else { WcStatus::Flushed };
            self.push_cq(side, rail, Completion { wr_id, status, qp_num, ..Completion::default() });
        }
        if !self.wires[dir as usize][rail][qp].q.is_empty() {
            self.fail_head(dir, rail, qp, WcStatus::Flushed);
        }
        self.wires[dir as usize][rail][qp].err = true;
        true
    }

    /// The head WR of a wire fails without landing and its QP goes to the error state.
    pub fn fail_qp(&mut self, dir: Dir, rail: usize, qp: usize, status: WcStatus) -> bool {
        if self.wires[dir as usize][rail][qp].q.is_empty() {
            return false;
        }
        self.fail_head(dir, rail, qp, status);
        self.wires[dir as usize][rail][qp].err = true;
        true
    }

    /// Writes the first `len` bytes of the head WR's payload at its destination without
    /// completing it (a WRITE cut off mid-way; what follows decides its fate).
    pub fn land_partly(&mut self, dir: Dir, rail: usize, qp: usize, len: usize) {
        let Some(&(_, wr)) = self.wires[dir as usize][rail][qp].q.front() else { return };
        if wr.num_sge == 0 || wr.inline && dir == Dir::ToSend {
            return;
        }
        let sge = wr.sge[0];
        let len = len.min(sge.len as usize);
        let (src, dst) = match dir {
            Dir::ToRecv => (&mut self.ss.space, &mut self.rs.space),
            Dir::ToSend => (&mut self.rs.space, &mut self.ss.space),
        };
        if src.virtual_len[(sge.addr >> 40) as usize] > 0 || dst.virtual_len[(wr.remote_addr >> 40) as usize] > 0 {
            return;
        }
        let data = src.read(sge.addr, len);
        dst.write(wr.remote_addr, &data);
    }

    /// One round of the plugin's failover work: both engines' control rings read (the
    /// receiver's only when `control_waiting` or `failover_due`; the sender's every round,
    /// for its stall check), their chains posted, fences performed (the receiver's fenced rail drained into its
    /// engine before FenceDone, as LAST_WQE_REACHED and a CQ drain give).
    pub fn pump_failover(&mut self, fo: &mut FoOut) -> crate::Result<()> {
        self.pump_failover_gated(fo, None)
    }

    /// [`Self::pump_failover`] with the sender's round gated as the plugin's is when
    /// `MPIB_STALL_MS=0` (no periodic round): only when the engine has output due, a control
    /// message waits, or its timer (`next_ns`, set from `failover_timer_ns` after each
    /// round) is due. `None`: the sender polls every round.
    pub fn pump_failover_gated(&mut self, fo: &mut FoOut, next_ns: Option<&mut u64>) -> crate::Result<()> {
        fo.s.clear();
        let wanted = |p: &Pair, next: u64| {
            let waits =
                !p.rb.sender_never_waits && (p.s.failover_due() || p.s.control_waiting(&p.ss) || p.s.oob_waiting());
            waits || p.now >= next
        };
        let run = next_ns.as_deref().is_none_or(|&next| wanted(self, next));
        if run {
            self.s.poll_failover(self.now, &mut self.ss, &mut fo.s)?;
        }
        self.enqueue_chains(Dir::ToRecv, &fo.s.chains);
        for &a in &fo.s.actions {
            self.perform(SEND_SIDE, a)?;
        }
        // As the plugin: the timer is read once the round's actions were answered.
        if let Some(next) = next_ns.filter(|_| run) {
            *next = self.s.failover_timer_ns();
        }
        for rail in 0..RAILS {
            if std::mem::take(&mut self.rb.recv_connected_due[rail]) {
                self.r.handle_event(Event::QpsConnected { rail })?;
            }
        }
        fo.r.clear();
        // As the plugin does: only when a message waits or the engine has output (the
        // sender's RailDown must reach a receiver that saw nothing wrong itself).
        if !(self.r.control_waiting(&self.rs) || self.r.oob_waiting() || self.r.failover_due()) {
            return Ok(());
        }
        self.r.poll_failover(&mut self.rs, &mut fo.r)?;
        self.enqueue_chains(Dir::ToSend, &fo.r.chains);
        for &a in &fo.r.actions {
            self.perform(RECV_SIDE, a)?;
        }
        Ok(())
    }
}
