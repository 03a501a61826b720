//! The sender's side of rail failover (DESIGN.md "Rail failover"). When a rail
//! fails (an error completion, a stall, the plugin's word, the receiver's report) it gets
//! no new traffic; its QPs are fenced; the receiver is told (`RailDown`). The receiver's
//! `Fenced` report says, per transfer, whether the dead rail's part arrived: a part that
//! did is confirmed, one that did not is re-posted on the surviving rail from the same
//! source to the same destination, its IMM flagged "the other rail's part" (`replay.rs`).
//! Only what is missing is sent again. Both rails down: the connection fails, or waits out
//! an outage (`MPIB_OUTAGE_GRACE_MS`).
//!
//! The sender engine calls in here with a [`SendPath`]: its posted slots, requests, chains
//! in flight and telemetry, borrowed for the step. Nothing here runs on the data path of a
//! connection whose rails are healthy.

use super::{CtlKind, CtlMsg, Failover, other};
use crate::engine::layout::SLOTS;
use crate::engine::send_path::SendPath;
use crate::engine::{
    CtlMemory, DownReason, Event, Output, RAIL_NAMES, RAILS, RailMask, RailState, Side, StrayCompletion, Violation,
    WrKind,
};
use crate::error::{Cause, Error, ErrorKind, Result};
use crate::fabric::Completion;

/// The stall bound's allowance per byte of the oldest part outstanding on a rail: 32 ns, the
/// time a byte takes at 250 Mb/s (a stall detector catches hangs, not slow links: 8 ns, 1
/// Gb/s, failed a rail under a 512 MiB message of a debug build on a loaded 2-core host).
pub const STALL_NS_PER_BYTE: u64 = 32;

/// `extra_pieces` of a striped part that its pieces' acknowledgements must not complete
/// (one failed, or the receiver's report settled the part): more than any count of pieces.
const NEVER_BY_PIECES: u8 = u8::MAX;

impl Failover {
    /// Sender: what the plugin saw (a port down) or did (an action performed), at `now_ns`
    /// (`SendEngine::handle_event`).
    pub(crate) fn on_sender_event(&mut self, p: &mut SendPath<'_>, now_ns: u64, ev: Event) -> Result<()> {
        self.now_ns = now_ns;
        self.timer_ns = 0;
        match ev {
            Event::RailDown { rail } => match self.state[rail] {
                RailState::Rebuilding { .. } | RailState::Probing { .. } => self.readmit_failed(p, rail),
                RailState::Up if !self.port_down_fails_over(rail) => {
                    log::log!(
                        p.failure_level(),
                        "send: the {} rail's port is down and no other rail can take its traffic: its transfers wait \
                         while RC retries (MPIB_TIMEOUT, MPIB_RETRY_CNT); a port back in time carries on{}",
                        RAIL_NAMES[rail],
                        p.at(rail)
                    );
                    Ok(())
                }
                _ => self.rail_down(p, rail, DownReason::Port),
            },
            Event::DeviceFatal { rail } => {
                self.fatal = self.fatal.with(rail);
                if self.fatal == RailMask::BOTH && self.outage_ns != 0 {
                    // Waiting for a rail whose device is gone: nothing will come back.
                    return Err(p.error.fail(Error::from_cause(ErrorKind::Remote, Cause::BothRailsFailed)));
                }
                self.rail_down(p, rail, DownReason::Port)
            }
            // The sender's own fence needs no follow-up: it only stops its QPs of the rail.
            Event::FenceDone { rail } => {
                self.fence_wait = self.fence_wait.without(rail);
                Ok(())
            }
            Event::QpsBuilt { rail, records } => {
                self.on_qps_built(Side::Send, rail, records);
                Ok(())
            }
            Event::QpsConnected { rail } => {
                self.on_qps_connected(rail);
                Ok(())
            }
            Event::ReadmitFailed { rail } => self.readmit_failed(p, rail),
            Event::PortDown { rail } => self.readmit_deferred(p, rail),
            Event::ControlOob { words } => {
                self.ctl.receive_oob(words);
                Ok(())
            }
            Event::PeerGone => self.on_peer_gone(p),
        }
    }

    /// Sender: when the next failover round is due on failover's own clocks: the next stall
    /// or silent-rail check, a re-admission attempt to start (at once while one is under
    /// way), the outage's grace running out. `u64::MAX`: none.
    pub(crate) fn sender_timer_ns(&self) -> u64 {
        let stall = if self.cfg.enabled && self.cfg.stall_ns != 0 { self.stall_next_ns } else { u64::MAX };
        let stall = if self.cfg.enabled { stall.min(self.silence_next_ns) } else { stall };
        self.readmit_timer_ns().min(stall).min(self.outage_deadline())
    }

    /// Sender: the failover work of a round after the outage's (`SendEngine::poll_failover`):
    /// the silent-rail and stall checks (every `MPIB_STALL_MS / 4`), fences and `RailDown`s
    /// to emit, waiting replays, the receiver's control messages (a `Fenced` report replays
    /// the missing parts), re-admission.
    pub(crate) fn sender_round(
        &mut self,
        p: &mut SendPath<'_>,
        now_ns: u64,
        mem: &mut impl CtlMemory,
        out: &mut Output,
    ) -> Result<()> {
        if now_ns >= self.silence_next_ns {
            self.check_silence(p, now_ns)?;
        }
        let stall = self.cfg.stall_ns;
        if stall != 0 && now_ns >= self.stall_next_ns {
            self.stall_next_ns = now_ns + (stall / 4).max(1);
            self.check_stalls(p, now_ns)?;
        }
        self.emit_fences(out);
        for rail in self.report_due.iter() {
            let msg = CtlMsg::new(CtlKind::RailDown, rail, self.epoch[rail]);
            if self.send_ctl(&msg, rail, mem, out) {
                self.report_due = self.report_due.without(rail);
            }
        }
        if self.replays_waiting != 0 {
            self.replay_ready(p, out);
        }
        while let Some(msg) = self.ctl.poll(mem) {
            let seq = self.ctl.consumed();
            match msg {
                Some(m) if m.kind == CtlKind::Fenced => self.on_fenced(p, &m, out)?,
                Some(m) if m.kind == CtlKind::Rebuilt => self.on_rebuilt(&m, out),
                _ => {
                    let word0 = msg.map_or(0, |m| m.to_words(0, 0)[0]);
                    return Err(p.error.fail(Violation::BadControl { seq, word0 }.into()));
                }
            }
        }
        self.sender_readmit_round(p, now_ns, mem, out)
    }

    /// Sender: an outage's round; past the grace, the connection fails (`Self::outage_round`).
    #[cold]
    #[inline(never)]
    pub(crate) fn sender_outage_round(
        &mut self,
        p: &mut SendPath<'_>,
        now_ns: u64,
        mem: &impl CtlMemory,
        out: &mut Output,
    ) -> Result<()> {
        if self.outage_round(now_ns, "send", p.at(0), mem, out) {
            return Err(p.error.fail(Error::from_cause(ErrorKind::Remote, Cause::BothRailsFailed)));
        }
        Ok(())
    }

    /// Sender: a failed completion on `rail` (failover on): the rail has failed; the
    /// connection goes on unless it was the last rail.
    #[cold]
    #[inline(never)]
    pub(crate) fn on_sender_error(
        &mut self,
        p: &mut SendPath<'_>,
        rail: usize,
        kind: WrKind,
        slot: usize,
        c: &Completion,
    ) -> Result<()> {
        if kind == WrKind::ReadmitProbe {
            // A probe of a rebuilt rail: the attempt fails (a stale one's is ignored).
            if self.probing(rail, slot) {
                log::debug!("{}{}", kind.failed(rail, slot, c), p.at(rail));
                return self.readmit_failed(p, rail);
            }
            return Ok(());
        }
        if kind == WrKind::DataSignal && slot < SLOTS {
            // A piece of a striped part failed: the others' acknowledgements say nothing of
            // it, they no longer complete the part (the receiver's report settles it).
            let ps = &mut p.slots[slot];
            if ps.pending.contains(rail) && ps.extra_pieces[rail] > 0 {
                ps.extra_pieces[rail] = NEVER_BY_PIECES;
            }
        }
        if self.failed().contains(rail) {
            return Ok(()); // flushed WRs of a rail already down
        }
        log::log!(p.failure_level(), "{}{}", kind.failed(rail, slot, c), p.at(rail));
        self.rail_down(p, rail, DownReason::Completion)
    }

    /// Sender: `rail` failed: no new traffic on it, its QPs fenced, the receiver told.
    #[cold]
    #[inline(never)]
    pub(super) fn rail_down(&mut self, p: &mut SendPath<'_>, rail: usize, why: DownReason) -> Result<()> {
        if !self.cfg.enabled {
            return Err(p
                .error
                .fail(Error::remote(format!("the {} rail failed and failover is off", RAIL_NAMES[rail]))));
        }
        let Some(was_up) = self.mark_failed(rail) else { return Ok(()) };
        self.timer_ns = 0;
        self.suspect = self.suspect.without(rail);
        p.tel[rail].on_error(); // the split no longer uses it, probes stop
        // The other rail is all there is now: used, suspect or not.
        self.clear_suspect(p, other(rail));
        let level = p.failure_level();
        if self.failed() == RailMask::BOTH && self.outage_ns == 0 {
            self.last_rail_failed(Side::Send, rail, why, level, p.error)?;
        }
        if was_up {
            self.down_warned_ns[rail] = self.now_ns.max(1);
            log::log!(
                level,
                "send: {} rail failed ({why:?}); {} transfers wait for the receiver's report, traffic goes on {}{}",
                RAIL_NAMES[rail],
                p.outstanding[rail],
                RAIL_NAMES[other(rail)],
                p.at(rail)
            );
            p.tel[rail].stats().count_failover();
        } else {
            let level = self.while_down_level(rail, self.now_ns);
            log::log!(
                level,
                "send: re-admission of the {} rail failed ({why:?}); it stays down and is tried again ({} attempts \
                 failed so far){}",
                RAIL_NAMES[rail],
                self.readmit_failures,
                p.at(rail)
            );
        }
        if why == DownReason::Silent {
            // Silent may be slow, not dead: this side's QPs of the rail keep running until
            // the receiver's report (it fences its end first, so nothing lands after), and a
            // late acknowledgement still completes its part. The receiver may already have
            // every byte and make no call that would read the `RailDown` (its receives are
            // done): then that acknowledgement is what completes the send.
            self.fence_after_report = self.fence_after_report.with(rail);
        } else {
            self.fence_due = self.fence_due.with(rail);
        }
        if why != DownReason::Peer {
            self.report_due = self.report_due.with(rail);
        }
        Ok(())
    }

    /// The receiver's report on a fenced rail: settles every outstanding part of it.
    fn on_fenced(&mut self, p: &mut SendPath<'_>, m: &CtlMsg, out: &mut Output) -> Result<()> {
        let rail = m.rail as usize;
        if m.epoch != self.epoch[rail] {
            return Ok(()); // about an earlier life of the rail
        }
        match self.state[rail] {
            RailState::Up | RailState::Rebuilding { .. } | RailState::Probing { .. } => {
                self.rail_down(p, rail, DownReason::Peer)?;
            }
            RailState::Failed { fenced: true, .. } => return Ok(()), // settled already
            RailState::Failed { fenced: false, .. } => {}
        }
        // The receiver knows: no RailDown owed any more; its end is fenced, so this side's
        // QPs of a rail failed by its silence stop now.
        self.report_due = self.report_due.without(rail);
        if self.fence_after_report.contains(rail) {
            self.fence_after_report = self.fence_after_report.without(rail);
            self.fence_due = self.fence_due.with(rail);
        }
        let (mut confirmed, mut replayed) = (0u32, 0u32);
        for slot in 0..SLOTS {
            let (ps, rp) = (&p.slots[slot], &self.replays[slot]);
            // (A part already waiting for a rail was settled by an earlier report.)
            if !ps.pending.contains(rail) || (rp.replay | rp.replay_wait).contains(rail) {
                continue;
            }
            let (bytes, seq) = (ps.bytes[rail], ps.seq);
            p.outstanding[rail] -= 1;
            p.tel[rail].on_abandon(bytes);
            // Settled here: a piece of a striped part acknowledged late completes nothing.
            if p.slots[slot].extra_pieces[rail] > 0 {
                p.slots[slot].extra_pieces[rail] = NEVER_BY_PIECES;
            }
            if m.part_seen(seq) {
                confirmed += 1;
                self.confirmed_parts += 1;
                let ps = &mut p.slots[slot];
                ps.pending = ps.pending.without(rail);
                if ps.pending.is_empty() {
                    p.complete_slot(slot);
                }
            } else if self.state[other(rail)] != RailState::Up {
                // No rail works (an outage): delivered once one is back (`replay_ready`).
                replayed += 1;
                self.wait_for_rail(slot, rail);
            } else if p.slots[slot].pending.contains(other(rail)) {
                // The slot's own chain on the surviving rail is still out: its replay
                // follows once that completed (`replay_ready`).
                replayed += 1;
                self.wait_for_rail(slot, rail);
            } else {
                replayed += 1;
                self.replay_part(p, slot, rail, other(rail), out);
            }
        }
        // Replays of the other rail's parts that rode on this one: the report says whether
        // each arrived; one that did not waits for a working rail.
        let part = other(rail);
        for slot in 0..SLOTS {
            if !self.replays[slot].replay.contains(part) {
                continue;
            }
            p.outstanding[rail] -= 1;
            let rp = &mut self.replays[slot];
            rp.replay = rp.replay.without(part);
            let ps = &mut p.slots[slot];
            if m.other_seen(ps.seq) {
                ps.pending = ps.pending.without(part);
                if ps.pending.is_empty() {
                    p.complete_slot(slot);
                }
            } else {
                replayed += 1;
                self.wait_for_rail(slot, part);
            }
        }
        self.state[rail] = RailState::Failed { epoch: m.epoch, fenced: true };
        self.schedule_readmit(rail);
        // The first fence of a failure is news; one after a failed attempt is not.
        let level = if confirmed + replayed > 0 { log::Level::Warn } else { log::Level::Debug };
        log::log!(
            level,
            "send: {} rail fenced by the receiver: {confirmed} parts had arrived, {replayed} replayed on {}{}",
            RAIL_NAMES[rail],
            RAIL_NAMES[other(rail)],
            p.at(rail)
        );
        Ok(())
    }

    /// Sender: a replay's signal or a control WRITE completed (on `rail`'s CQ; `part` is the
    /// part a replay delivered).
    #[cold]
    #[inline(never)]
    pub(crate) fn on_sender_completion(
        &mut self,
        p: &mut SendPath<'_>,
        rail: usize,
        kind: WrKind,
        part: usize,
        slot: usize,
    ) -> Result<()> {
        self.timer_ns = 0;
        if kind == WrKind::Control {
            return Ok(());
        }
        if kind == WrKind::ReadmitProbe {
            self.on_readmit_probe(p, rail, slot);
            return Ok(());
        }
        if slot >= SLOTS || !self.replays[slot].replay.contains(part) || self.state[rail] != RailState::Up {
            if self.state[rail] != RailState::Up {
                // A replay that rode on a rail that failed since: the rail's report settled
                // it (or will), as for the rail's own parts (`stray_signal`).
                return Ok(());
            }
            return Err(p.error.fail(StrayCompletion::NoneOutstanding { rail, slot }.into()));
        }
        p.outstanding[rail] -= 1;
        let rp = &mut self.replays[slot];
        rp.replay = rp.replay.without(part);
        let ps = &mut p.slots[slot];
        ps.pending = ps.pending.without(part);
        if ps.pending.is_empty() {
            p.complete_slot(slot);
        }
        Ok(())
    }

    /// The post time and bytes of the oldest original part outstanding on `rail` (replays
    /// ride the other rail).
    pub(super) fn oldest_part(&self, p: &SendPath<'_>, rail: usize) -> Option<(u64, u64)> {
        (0..SLOTS)
            .filter(|&s| p.slots[s].pending.contains(rail) && !self.replays[s].replay.contains(rail))
            .map(|s| (p.slots[s].posted_ns[rail], p.slots[s].bytes[rail]))
            .min()
    }

    /// A healthy rail with signalled work out and no completion for the stall time fails.
    fn check_stalls(&mut self, p: &mut SendPath<'_>, now_ns: u64) -> Result<()> {
        let stall = self.cfg.stall_ns;
        if stall == 0 {
            return Ok(());
        }
        for rail in 0..RAILS {
            if self.state[rail] != RailState::Up || p.outstanding[rail] == 0 {
                continue;
            }
            let Some((oldest, bytes)) = self.oldest_part(p, rail) else { continue };
            // The last data completion on the rail moves `drain_start_ns` forward. A large
            // part completes only at its end: it gets the time it takes at 250 Mb/s on top
            // (a 512 MiB part moving slowly on the soft fabric is no stall).
            let last = oldest.max(p.tel[rail].view().drain_start_ns);
            if now_ns.saturating_sub(last) > stall + bytes.saturating_mul(STALL_NS_PER_BYTE) {
                self.rail_down(p, rail, DownReason::Stall)?;
            }
        }
        Ok(())
    }

    /// The peer's end of the set-up channel closed. In an outage that is the peer gone
    /// (killed, or closed its comm): nothing will come back, the connection fails now.
    /// Otherwise it is remembered (an outage that follows is not waited out) and news for
    /// no one: the rails say what they say.
    fn on_peer_gone(&mut self, p: &mut SendPath<'_>) -> Result<()> {
        self.peer_gone = true;
        if self.outage_ns == 0 {
            return Ok(());
        }
        log::info!("send: the peer closed its end while no rail works: the connection fails{}", p.at(0));
        Err(p.error.fail(Error::remote("the peer closed the connection while both rails were down")))
    }
}
