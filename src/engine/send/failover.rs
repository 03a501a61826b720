//! The sender's side of rail failover (DESIGN.md "Rail failover"). When a rail
//! fails (an error completion, a stall, the plugin's word, the receiver's report) it gets
//! no new traffic; its QPs are fenced; the receiver is told (`RailDown`). The receiver's
//! `Fenced` report says, per transfer, whether the dead rail's part arrived: a part that
//! did is confirmed, one that did not is re-posted on the surviving rail from the same
//! source to the same destination, its IMM flagged "the other rail's part". Only what is
//! missing is sent again. Both rails down: the connection fails.

use super::SendEngine;
use crate::engine::failover::PartSrc;
use crate::engine::failover::{CtlKind, CtlMsg, FailoverCounts, other};
use crate::engine::imm::{Imm, SIZEQ_SENTINEL};
use crate::engine::layout::{RECORD_SLOT_BYTES, SLOTS, SendMemory};
use crate::engine::{
    CpuAccess, CtlMemory, DownReason, Event, Output, RAIL_NAMES, RAILS, RailMask, RailState, SOUT, SUP, Side,
    StrayCompletion, Violation, WrKind,
};
use crate::error::{Cause, Error, ErrorKind, Result};
use crate::fabric::{Completion, SendWr, Sge, WrOpcode};

/// The stall bound's allowance per byte of the oldest part outstanding on a rail: 32 ns, the
/// time a byte takes at 250 Mb/s (a stall detector catches hangs, not slow links: 8 ns, 1
/// Gb/s, failed a rail under a 512 MiB message of a debug build on a loaded 2-core host).
pub const STALL_NS_PER_BYTE: u64 = 32;

/// `extra_pieces` of a striped part that its pieces' acknowledgements must not complete
/// (one failed, or the receiver's report settled the part): more than any count of pieces.
const NEVER_BY_PIECES: u8 = u8::MAX;

impl SendEngine {
    #[cfg(test)]
    pub(crate) fn failover_config_mut(&mut self) -> &mut crate::engine::FailoverConfig {
        self.fo.timer_ns = 0;
        &mut self.fo.cfg
    }

    /// Each rail's failover state.
    pub fn rail_states(&self) -> [RailState; RAILS] {
        self.fo.state
    }

    pub fn failover_counts(&self) -> FailoverCounts {
        self.fo.counts()
    }

    /// Whether [`Self::poll_failover`] has something to emit now (it must also be called
    /// while any rail is not [`RailState::Up`], to read the control ring).
    pub(crate) fn failover_due(&self) -> bool {
        self.fo.rail_work_due() || self.fo.replays_waiting != 0 || self.held() || self.fo.outage_ns != 0
    }

    /// What the plugin saw (a port down) or did (an action performed), at `now_ns`. What
    /// follows from it is emitted by the next [`Self::handle_timeout`] (due at once).
    pub fn handle_event(&mut self, now_ns: u64, ev: Event) -> Result<()> {
        self.error.check()?;
        self.fo.now_ns = now_ns;
        self.fo.timer_ns = 0;
        match ev {
            Event::RailDown { rail } => match self.fo.state[rail] {
                RailState::Rebuilding { .. } | RailState::Probing { .. } => self.readmit_failed(rail),
                RailState::Up if !self.fo.port_down_fails_over(rail) => {
                    log::log!(
                        self.failure_level(),
                        "send: the {} rail's port is down and no other rail can take its traffic: its transfers wait \
                         while RC retries (MPIB_TIMEOUT, MPIB_RETRY_CNT); a port back in time carries on{}",
                        RAIL_NAMES[rail],
                        self.at(rail)
                    );
                    Ok(())
                }
                _ => self.rail_down(rail, DownReason::Port),
            },
            Event::DeviceFatal { rail } => {
                self.fo.fatal = self.fo.fatal.with(rail);
                if self.fo.fatal == RailMask::BOTH && self.fo.outage_ns != 0 {
                    // Waiting for a rail whose device is gone: nothing will come back.
                    return Err(self.error.fail(Error::from_cause(ErrorKind::Remote, Cause::BothRailsFailed)));
                }
                self.rail_down(rail, DownReason::Port)
            }
            // The sender's own fence needs no follow-up: it only stops its QPs of the rail.
            Event::FenceDone { rail } => {
                self.fo.fence_wait = self.fo.fence_wait.without(rail);
                Ok(())
            }
            Event::QpsBuilt { rail, records } => {
                self.fo.on_qps_built(Side::Send, rail, records);
                Ok(())
            }
            Event::QpsConnected { rail } => {
                self.fo.on_qps_connected(rail);
                Ok(())
            }
            Event::ReadmitFailed { rail } => self.readmit_failed(rail),
            Event::PortDown { rail } => self.readmit_deferred(rail),
            Event::ControlOob { words } => {
                self.fo.ctl.receive_oob(words);
                Ok(())
            }
            Event::PeerGone => self.peer_gone(),
        }
    }

    /// The failover work of one call: stalls (checked every `MPIB_STALL_MS / 4`), fences
    /// and `RailDown`s to emit, the receiver's control messages (a `Fenced` report replays
    /// the missing parts), re-admission.
    pub(crate) fn poll_failover(
        &mut self,
        now_ns: u64,
        mem: &mut (impl CtlMemory + SendMemory),
        out: &mut Output,
    ) -> Result<()> {
        self.error.check()?;
        if !self.fo.cfg.enabled {
            return Ok(());
        }
        self.fo.now_ns = now_ns;
        self.fo.stamp_outage(now_ns);
        if self.fo.outage_ns != 0 {
            self.poll_outage(now_ns, mem, out)?;
        } else if self.held() {
            self.post_held(now_ns, mem, out)?;
        }
        if now_ns >= self.fo.silence_next_ns {
            self.check_silence(now_ns)?;
        }
        let stall = self.fo.cfg.stall_ns;
        if stall != 0 && now_ns >= self.fo.stall_next_ns {
            self.fo.stall_next_ns = now_ns + (stall / 4).max(1);
            self.check_stalls(now_ns)?;
        }
        self.fo.emit_fences(out);
        for rail in self.fo.report_due.iter() {
            let msg = CtlMsg::new(CtlKind::RailDown, rail, self.fo.epoch[rail]);
            if self.fo.send_ctl(&msg, rail, mem, out) {
                self.fo.report_due = self.fo.report_due.without(rail);
            }
        }
        if self.fo.replays_waiting != 0 {
            self.replay_ready(out);
        }
        while let Some(msg) = self.fo.ctl.poll(mem) {
            let seq = self.fo.ctl.consumed();
            match msg {
                Some(m) if m.kind == CtlKind::Fenced => self.on_fenced(&m, out)?,
                Some(m) if m.kind == CtlKind::Rebuilt => self.fo.on_rebuilt(&m, out),
                _ => {
                    let word0 = msg.map_or(0, |m| m.to_words(0, 0)[0]);
                    return Err(self.error.fail(Violation::BadControl { seq, word0 }.into()));
                }
            }
        }
        self.poll_readmit(now_ns, mem, out)
    }

    /// A failed completion on `rail` (failover on): the rail has failed; the connection
    /// goes on unless it was the last rail.
    #[cold]
    #[inline(never)]
    pub(super) fn on_rail_error(&mut self, rail: usize, kind: WrKind, slot: usize, c: &Completion) -> Result<()> {
        if kind == WrKind::ReadmitProbe {
            // A probe of a rebuilt rail: the attempt fails (a stale one's is ignored).
            if self.fo.probing(rail, slot) {
                log::debug!("{}{}", kind.failed(rail, slot, c), self.at(rail));
                return self.readmit_failed(rail);
            }
            return Ok(());
        }
        if kind == WrKind::DataSignal && slot < SLOTS {
            // A piece of a striped part failed: the others' acknowledgements say nothing of
            // it, they no longer complete the part (the receiver's report settles it).
            let ps = &mut self.slots[slot];
            if ps.pending.contains(rail) && ps.extra_pieces[rail] > 0 {
                ps.extra_pieces[rail] = NEVER_BY_PIECES;
            }
        }
        if self.fo.failed().contains(rail) {
            return Ok(()); // flushed WRs of a rail already down
        }
        log::log!(self.failure_level(), "{}{}", kind.failed(rail, slot, c), self.at(rail));
        self.rail_down(rail, DownReason::Completion)
    }

    /// `rail` failed: no new traffic on it, its QPs fenced, the receiver told.
    #[cold]
    #[inline(never)]
    pub(super) fn rail_down(&mut self, rail: usize, why: DownReason) -> Result<()> {
        if !self.fo.cfg.enabled {
            return Err(self
                .error
                .fail(Error::remote(format!("the {} rail failed and failover is off", RAIL_NAMES[rail]))));
        }
        let Some(was_up) = self.fo.mark_failed(rail) else { return Ok(()) };
        self.fo.timer_ns = 0;
        self.fo.suspect = self.fo.suspect.without(rail);
        self.tel[rail].on_error(); // the split no longer uses it, probes stop
        // The other rail is all there is now: used, suspect or not.
        self.clear_suspect(other(rail));
        let level = self.failure_level();
        if self.fo.failed() == RailMask::BOTH && self.fo.outage_ns == 0 {
            if !self.fo.enter_outage() {
                log::log!(
                    level,
                    "send: {} rail failed ({why:?}) and the other rail is down: the connection fails{}{}",
                    RAIL_NAMES[rail],
                    if level == log::Level::Warn { "" } else { " (no send outstanding: the peer may have closed)" },
                    self.at(rail)
                );
                return Err(self.error.fail(Error::from_cause(ErrorKind::Remote, Cause::BothRailsFailed)));
            }
            log::log!(
                level,
                "send: {} rail failed ({why:?}) and the other rail is down: sends wait up to {} ms \
                 (MPIB_OUTAGE_GRACE_MS) for a rail to come back{}",
                RAIL_NAMES[rail],
                self.fo.cfg.outage_grace_ns / 1_000_000,
                self.at(rail)
            );
        }
        if was_up {
            self.fo.down_warned_ns[rail] = self.fo.now_ns.max(1);
            log::log!(
                level,
                "send: {} rail failed ({why:?}); {} transfers wait for the receiver's report, traffic goes on {}{}",
                RAIL_NAMES[rail],
                self.outstanding[rail],
                RAIL_NAMES[other(rail)],
                self.at(rail)
            );
            self.tel[rail].stats().count_failover();
        } else {
            let level = self.fo.while_down_level(rail, self.fo.now_ns);
            log::log!(
                level,
                "send: re-admission of the {} rail failed ({why:?}); it stays down and is tried again ({} attempts \
                 failed so far){}",
                RAIL_NAMES[rail],
                self.fo.readmit_failures,
                self.at(rail)
            );
        }
        if why == DownReason::Silent {
            // Silent may be slow, not dead: this side's QPs of the rail keep running until
            // the receiver's report (it fences its end first, so nothing lands after), and a
            // late acknowledgement still completes its part. The receiver may already have
            // every byte and make no call that would read the `RailDown` (its receives are
            // done): then that acknowledgement is what completes the send.
            self.fo.fence_after_report = self.fo.fence_after_report.with(rail);
        } else {
            self.fo.fence_due = self.fo.fence_due.with(rail);
        }
        if why != DownReason::Peer {
            self.fo.report_due = self.fo.report_due.with(rail);
        }
        Ok(())
    }

    /// A rail's failure is a warning while NCCL waits on the connection; with nothing of
    /// NCCL's outstanding (a peer that closed after its last receive looks the same to a
    /// probe) it is information, and the next call that needs the peer reports it.
    pub(super) fn failure_level(&self) -> log::Level {
        if self.nccl_waits() { log::Level::Warn } else { log::Level::Info }
    }

    /// The receiver's report on a fenced rail: settles every outstanding part of it.
    fn on_fenced(&mut self, m: &CtlMsg, out: &mut Output) -> Result<()> {
        let rail = m.rail as usize;
        if m.epoch != self.fo.epoch[rail] {
            return Ok(()); // about an earlier life of the rail
        }
        match self.fo.state[rail] {
            RailState::Up | RailState::Rebuilding { .. } | RailState::Probing { .. } => {
                self.rail_down(rail, DownReason::Peer)?;
            }
            RailState::Failed { fenced: true, .. } => return Ok(()), // settled already
            RailState::Failed { fenced: false, .. } => {}
        }
        // The receiver knows: no RailDown owed any more; its end is fenced, so this side's
        // QPs of a rail failed by its silence stop now.
        self.fo.report_due = self.fo.report_due.without(rail);
        if self.fo.fence_after_report.contains(rail) {
            self.fo.fence_after_report = self.fo.fence_after_report.without(rail);
            self.fo.fence_due = self.fo.fence_due.with(rail);
        }
        let (mut confirmed, mut replayed) = (0u32, 0u32);
        for slot in 0..SLOTS {
            let (ps, rp) = (&self.slots[slot], &self.fo.replays[slot]);
            // (A part already waiting for a rail was settled by an earlier report.)
            if !ps.pending.contains(rail) || (rp.replay | rp.replay_wait).contains(rail) {
                continue;
            }
            let (bytes, seq) = (ps.bytes[rail], ps.seq);
            self.outstanding[rail] -= 1;
            self.tel[rail].on_abandon(bytes);
            // Settled here: a piece of a striped part acknowledged late completes nothing.
            if self.slots[slot].extra_pieces[rail] > 0 {
                self.slots[slot].extra_pieces[rail] = NEVER_BY_PIECES;
            }
            if m.part_seen(seq) {
                confirmed += 1;
                self.fo.confirmed_parts += 1;
                let ps = &mut self.slots[slot];
                ps.pending = ps.pending.without(rail);
                if ps.pending.is_empty() {
                    self.complete_slot(slot);
                }
            } else if self.fo.state[other(rail)] != RailState::Up {
                // No rail works (an outage): delivered once one is back (`replay_ready`).
                replayed += 1;
                self.wait_for_rail(slot, rail);
            } else if self.slots[slot].pending.contains(other(rail)) {
                // The slot's own chain on the surviving rail is still out: its replay
                // follows once that completed (`replay_ready`).
                replayed += 1;
                self.wait_for_rail(slot, rail);
            } else {
                replayed += 1;
                self.replay_part(slot, rail, other(rail), out);
            }
        }
        // Replays of the other rail's parts that rode on this one: the report says whether
        // each arrived; one that did not waits for a working rail.
        let part = other(rail);
        for slot in 0..SLOTS {
            if !self.fo.replays[slot].replay.contains(part) {
                continue;
            }
            self.outstanding[rail] -= 1;
            let rp = &mut self.fo.replays[slot];
            rp.replay = rp.replay.without(part);
            let ps = &mut self.slots[slot];
            if m.other_seen(ps.seq) {
                ps.pending = ps.pending.without(part);
                if ps.pending.is_empty() {
                    self.complete_slot(slot);
                }
            } else {
                replayed += 1;
                self.wait_for_rail(slot, part);
            }
        }
        self.fo.state[rail] = RailState::Failed { epoch: m.epoch, fenced: true };
        self.fo.schedule_readmit(rail);
        // The first fence of a failure is news; one after a failed attempt is not.
        let level = if confirmed + replayed > 0 { log::Level::Warn } else { log::Level::Debug };
        log::log!(
            level,
            "send: {} rail fenced by the receiver: {confirmed} parts had arrived, {replayed} replayed on {}{}",
            RAIL_NAMES[rail],
            RAIL_NAMES[other(rail)],
            self.at(rail)
        );
        Ok(())
    }

    /// `part` of `slot` waits for a rail to take it (`replay_ready`).
    fn wait_for_rail(&mut self, slot: usize, part: usize) {
        let rp = &mut self.fo.replays[slot];
        rp.replay_wait = rp.replay_wait.with(part);
        self.fo.replays_waiting += 1;
    }

    /// Posts the waiting replays whose slot has no live chain left on the rail that takes
    /// them: the other rail when it works (a replay), else the part's own rail when that
    /// one is back first after an outage (sent again as it was).
    #[cold]
    #[inline(never)]
    fn replay_ready(&mut self, out: &mut Output) {
        for slot in 0..SLOTS {
            let wait = self.fo.replays[slot].replay_wait;
            for part in wait.iter() {
                let up = |r: usize| self.fo.state[r] == RailState::Up;
                let via = if up(other(part)) {
                    other(part)
                } else if up(part) {
                    part
                } else {
                    continue;
                };
                // A live chain of the slot on `via`: its own part's, unless that one died
                // too (waiting as well, or replayed elsewhere), or a replay riding on it.
                let (ps, rp) = (&self.slots[slot], &self.fo.replays[slot]);
                let own = ps.pending.contains(via) && !(rp.replay_wait | rp.replay).contains(via);
                if own || rp.replay.contains(other(via)) {
                    continue;
                }
                let rp = &mut self.fo.replays[slot];
                rp.replay_wait = rp.replay_wait.without(part);
                self.fo.replays_waiting -= 1;
                self.replay_part(slot, part, via, out);
            }
        }
    }

    /// Re-posts `part` of `slot` on rail `via`: the same bytes from the same source to the
    /// same destination (`via`'s keys), ended by a WRITE_WITH_IMM whose IMM is the
    /// original's, with the replay flag when `via` is the other rail; for a multi-receive or
    /// oversized slot whose leader part this is, that WR also writes the completion records
    /// again. On the part's own rail (back after an outage) it is the part sent again, in
    /// one piece: completed as the original would have been.
    fn replay_part(&mut self, slot: usize, part: usize, via: usize, out: &mut Output) {
        let resend = via == part;
        let (ps, rp) = (self.slots[slot], self.fo.replays[slot]);
        let orig = Imm::decode(rp.imm);
        let imm = if resend { rp.imm } else { Imm::replayed(rp.imm) };
        let signal = if resend { WrKind::DataSignal } else { WrKind::ReplaySignal };
        let qp = self.next_qp(via);
        let (max_inline, n) = (self.cfg.max_inline as u64, ps.n as usize);
        let c = out.push(via, qp);
        let mut bytes = 0u64;
        let wr = |p: &PartSrc, kind: WrKind, imm: Option<u32>| {
            let (off, len) = p.range(part);
            let mut wr = SendWr {
                wr_id: kind.id(if imm.is_some() { part } else { via }, slot),
                opcode: if imm.is_some() { WrOpcode::WriteImm } else { WrOpcode::Write },
                signaled: imm.is_some(),
                inline: p.cpu == CpuAccess::Readable && len > 0 && len <= max_inline,
                remote_addr: p.dst + off,
                rkey: p.rkeys[via],
                imm: imm.unwrap_or(0),
                ..SendWr::default()
            };
            if len > 0 {
                wr.num_sge = 1;
                wr.sge[0] = Sge { addr: p.src + off, len: len as u32, lkey: p.lkeys[via] };
            }
            (wr, len)
        };
        if n == 1 && orig.size_q != SIZEQ_SENTINEL {
            let (w, len) = wr(&rp.parts[0], signal, Some(imm));
            c.add(w);
            bytes += len;
        } else {
            for p in &rp.parts[..n] {
                let (w, len) = wr(p, WrKind::Data, None);
                if len > 0 {
                    c.add(w);
                    bytes += len;
                }
            }
            let leader = if orig.mask.contains(SOUT) { SOUT } else { SUP };
            let off = (slot * RECORD_SLOT_BYTES) as u64;
            let mut w = SendWr {
                wr_id: signal.id(part, slot),
                opcode: WrOpcode::WriteImm,
                signaled: true,
                remote_addr: self.cfg.records_addr + off,
                rkey: self.cfg.records_rkeys[via],
                imm,
                ..SendWr::default()
            };
            if part == leader {
                let len = (n * 8) as u32;
                (w.num_sge, w.inline) = (1, len <= self.cfg.max_inline);
                w.sge[0] = Sge { addr: self.cfg.sizes_addr + off, len, lkey: self.cfg.sizes_lkeys[via] };
            }
            c.add(w);
        }
        let wrs = c.len as u64;
        self.tel[via].stats().count_post(wrs, 1, bytes, bytes);
        self.outstanding[via] += 1;
        if resend {
            // Completed, and sampled, as a part of its rail.
            let now = self.fo.now_ns;
            self.tel[via].on_post(now, bytes);
            let ps = &mut self.slots[slot];
            (ps.posted_ns[via], ps.bytes[via], ps.extra_pieces[via]) = (now, bytes, 0);
        } else {
            let rp = &mut self.fo.replays[slot];
            rp.replay = rp.replay.with(part);
        }
        self.fo.replayed_parts += 1;
        self.fo.replayed_bytes += bytes;
        self.tel[part].stats().count_replayed(bytes);
    }

    /// A replay's signal or a control WRITE completed (on `rail`'s CQ; `wr_rail` is the
    /// part a replay delivered).
    #[cold]
    #[inline(never)]
    pub(super) fn on_failover_completion(&mut self, rail: usize, kind: WrKind, part: usize, slot: usize) -> Result<()> {
        self.fo.timer_ns = 0;
        if kind == WrKind::Control {
            return Ok(());
        }
        if kind == WrKind::ReadmitProbe {
            self.on_readmit_probe(rail, slot);
            return Ok(());
        }
        if slot >= SLOTS || !self.fo.replays[slot].replay.contains(part) || self.fo.state[rail] != RailState::Up {
            if self.fo.state[rail] != RailState::Up {
                // A replay that rode on a rail that failed since: the rail's report settled
                // it (or will), as for the rail's own parts (`stray_signal`).
                return Ok(());
            }
            return Err(self.error.fail(StrayCompletion::NoneOutstanding { rail, slot }.into()));
        }
        self.outstanding[rail] -= 1;
        let rp = &mut self.fo.replays[slot];
        rp.replay = rp.replay.without(part);
        let ps = &mut self.slots[slot];
        ps.pending = ps.pending.without(part);
        if ps.pending.is_empty() {
            self.complete_slot(slot);
        }
        Ok(())
    }

    /// The post time and bytes of the oldest original part outstanding on `rail` (replays
    /// ride the other rail).
    pub(super) fn oldest_part(&self, rail: usize) -> Option<(u64, u64)> {
        (0..SLOTS)
            .filter(|&s| self.slots[s].pending.contains(rail) && !self.fo.replays[s].replay.contains(rail))
            .map(|s| (self.slots[s].posted_ns[rail], self.slots[s].bytes[rail]))
            .min()
    }

    /// A healthy rail with signalled work out and no completion for the stall time fails.
    fn check_stalls(&mut self, now_ns: u64) -> Result<()> {
        let stall = self.fo.cfg.stall_ns;
        if stall == 0 {
            return Ok(());
        }
        for rail in 0..RAILS {
            if self.fo.state[rail] != RailState::Up || self.outstanding[rail] == 0 {
                continue;
            }
            let Some((oldest, bytes)) = self.oldest_part(rail) else { continue };
            // The last data completion on the rail moves `drain_start_ns` forward. A large
            // part completes only at its end: it gets the time it takes at 250 Mb/s on top
            // (a 512 MiB part moving slowly on the soft fabric is no stall).
            let last = oldest.max(self.tel[rail].view().drain_start_ns);
            if now_ns.saturating_sub(last) > stall + bytes.saturating_mul(STALL_NS_PER_BYTE) {
                self.rail_down(rail, DownReason::Stall)?;
            }
        }
        Ok(())
    }
}
