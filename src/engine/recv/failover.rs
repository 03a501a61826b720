//! The receiver's side of rail failover (DESIGN.md "Rail failover"). The
//! receiver alone knows which parts arrived, so it fences before it reports: when a rail
//! fails (its own error completion, the plugin's word, the sender's `RailDown`) it asks the
//! plugin to move its QPs of that rail to the error state and drain their completions
//! ([`Action::FenceQps`]); once that is done ([`Event::FenceDone`]) no IMM can arrive on
//! the rail any more, and it writes `Fenced`: for each receive of the window, whether the
//! dead rail's part arrived. Its CTS writes lost on the dead rail are re-posted on the
//! surviving one. Replayed parts arrive flagged; a duplicate is ignored and counted.

use super::{RecvEngine, State};
use crate::engine::failover::{CtlKind, CtlMsg, FENCE_WINDOW, FailoverCounts, other};
use crate::engine::imm::{Imm, PIECES_BITS, REPLAY_FLAG, SIZEQ_SENTINEL, SLOT_BITS};
use crate::engine::layout::{RecvMemory, SLOTS};
use crate::engine::{
    CtlMemory, DownReason, Event, Output, QpRef, RAIL_NAMES, RAILS, RailMask, RailState, Side, Violation, WorkRequest,
    WrKind, failure,
};
use crate::error::{Cause, Error, ErrorKind, Result};
use crate::fabric::Completion;

impl RecvEngine {
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
    /// regularly to read the control ring).
    pub(crate) fn failover_due(&self) -> bool {
        // (In an outage, every round reads the set-up channel: what comes back comes there.)
        self.fo.rail_work_due() || self.fo.cts_redo != 0 || self.fo.outage_ns != 0
    }

    /// What the plugin saw (a port down) or did (an action performed). What follows from it
    /// is emitted by the next [`Self::handle_timeout`] (due at once).
    pub fn handle_event(&mut self, ev: Event) -> Result<()> {
        self.error.check()?;
        self.fo.timer_ns = 0;
        match ev {
            Event::RailDown { rail } if self.fo.state[rail] == RailState::Up && !self.fo.port_down_fails_over(rail) => {
                log::log!(
                    self.failure_level(),
                    "recv: the {} rail's port is down and no other rail can take its traffic: receives wait while \
                     RC retries (MPIB_TIMEOUT, MPIB_RETRY_CNT); a port back in time carries on{}",
                    RAIL_NAMES[rail],
                    self.at(rail)
                );
                Ok(())
            }
            Event::DeviceFatal { rail } => {
                self.fo.fatal = self.fo.fatal.with(rail);
                if self.fo.fatal == RailMask::BOTH && self.fo.outage_ns != 0 {
                    // Waiting for a rail whose device is gone: nothing will come back.
                    return Err(self.error.fail(Error::from_cause(ErrorKind::Remote, Cause::BothRailsFailed)));
                }
                self.rail_down(rail, DownReason::Port)
            }
            Event::RailDown { rail } => self.rail_down(rail, DownReason::Port),
            Event::QpsBuilt { rail, records } => {
                self.fo.on_qps_built(Side::Receive, rail, records);
                Ok(())
            }
            Event::QpsConnected { rail } => {
                self.fo.on_qps_connected(rail);
                Ok(())
            }
            Event::ReadmitFailed { rail } | Event::PortDown { rail } => self.readmit_failed(rail),
            Event::ControlOob { words } => {
                self.fo.ctl.receive_oob(words);
                Ok(())
            }
            Event::PeerGone => {
                // Remembered: an outage that follows is not waited out.
                self.fo.peer_gone = true;
                if self.fo.outage_ns == 0 {
                    return Ok(());
                }
                log::info!("recv: the peer closed its end while no rail works: the connection fails");
                Err(self.error.fail(Error::remote("the peer closed the connection while both rails were down")))
            }
            Event::FenceDone { rail } => {
                self.fo.fence_wait = self.fo.fence_wait.without(rail);
                // Every IMM of the rail is in now: report what arrived.
                if self.fo.state[rail] != RailState::Up {
                    self.fo.report_due = self.fo.report_due.with(rail);
                }
                Ok(())
            }
        }
    }

    /// The failover work of one call: fences to ask for, lost CTS writes to re-post,
    /// `Fenced` reports to write, the sender's control messages to read.
    pub(crate) fn poll_failover(&mut self, mem: &mut (impl RecvMemory + CtlMemory), out: &mut Output) -> Result<()> {
        self.error.check()?;
        if !self.fo.cfg.enabled {
            return Ok(());
        }
        if self.fo.outage_ns != 0 {
            self.poll_outage(mem, out)?;
        }
        while let Some(msg) = self.fo.ctl.poll(mem) {
            let seq = self.fo.ctl.consumed();
            match msg {
                Some(m) if m.kind == CtlKind::RailDown => {
                    let rail = m.rail as usize;
                    if m.epoch == self.fo.epoch[rail] {
                        self.rail_down(rail, DownReason::Peer)?;
                    }
                }
                Some(m) if m.kind == CtlKind::Rebuild => self.fo.on_rebuild(&m, out),
                _ => {
                    let word0 = msg.map_or(0, |m| m.to_words(0, 0)[0]);
                    return Err(self.error.fail(Violation::BadControl { seq, word0 }.into()));
                }
            }
        }
        self.fo.emit_fences(out);
        self.repost_cts(out);
        for rail in self.fo.report_due.iter() {
            let msg = self.fenced_report(rail);
            if self.fo.send_ctl(&msg, rail, mem, out) {
                self.fo.report_due = self.fo.report_due.without(rail);
                self.fo.state[rail] = RailState::Failed { epoch: msg.epoch, fenced: true };
                // The first report of a down period is news (the failure was a WARN); one
                // after each failed re-admission attempt is not.
                let first = self.fo.down_warned_ns[rail] == 0;
                self.fo.down_warned_ns[rail] = 1;
                log::log!(
                    if first { log::Level::Info } else { log::Level::Debug },
                    "recv: {} rail fenced: {} of the last {} receives had its part, reported to the sender{}",
                    RAIL_NAMES[rail],
                    msg.bitmap.count_ones(),
                    FENCE_WINDOW,
                    self.at(rail)
                );
            }
        }
        self.poll_readmit(mem, out);
        Ok(())
    }

    /// `Fenced` for `rail`: receives before `base_seq` completed; bit `i` says whether
    /// part `rail` of receive `base_seq + i` arrived (a receive whose data is all in, or
    /// that completed, has every part), and bit `i` of the first payload word whether the
    /// other part did.
    fn fenced_report(&self, rail: usize) -> CtlMsg {
        let tail = self.fifo_tail;
        let base = tail.saturating_sub(FENCE_WINDOW);
        let mut m = CtlMsg::new(CtlKind::Fenced, rail, self.fo.epoch[rail]);
        m.base_seq = base;
        for seq in base..tail {
            let s = &self.slots[(seq % SLOTS as u64) as usize];
            let done = s.state != State::Posted || s.data_done;
            m.bitmap |= ((done || s.seen.contains(rail)) as u32) << (seq - base);
            // The other part, which replays on this rail delivered: `CtlMsg::other_seen`.
            m.payload[0] |= ((done || s.seen.contains(other(rail))) as u64) << (seq - base);
        }
        m
    }

    /// Re-posts, on the surviving rail's CTS QP, the CTS of each slot whose CTS WRITE died
    /// with its rail while the slot's receive still waits for data (its entries are still
    /// in the local source). Identical content: if the first copy did land, the sender's
    /// sequence check ignores the second. Later CTS writes of the slot go on the same QP,
    /// after this one.
    fn repost_cts(&mut self, out: &mut Output) {
        let Some(rail) = self.fo.live_rails.first() else { return };
        while self.fo.cts_redo != 0 {
            let slot = self.fo.cts_redo.trailing_zeros() as usize;
            self.fo.cts_redo &= self.fo.cts_redo - 1;
            let s = &mut self.slots[slot];
            if s.state != State::Posted || s.data_done {
                continue;
            }
            // Signalled: the slot is done only once this copy is placed.
            s.cts_pending = true;
            let n = s.n as usize;
            let wr = self.cts_wr(rail, slot, n, true);
            out.push(rail, QpRef::Cts).add(wr);
            self.stats[rail].count_post(1, 0, 0, 0);
            self.fo.cts_reposts += 1;
        }
    }

    /// A failed completion on `rail` (failover on): `wr` is the WR it names, if any.
    #[cold]
    #[inline(never)]
    pub(super) fn on_rail_error(&mut self, rail: usize, wr: Option<(WrKind, usize)>, c: &Completion) -> Result<()> {
        match wr {
            Some((WrKind::Cts, slot)) if slot < SLOTS => {
                // The WR is dead: no completion will follow. Re-post it if still needed.
                let s = &mut self.slots[slot];
                if s.state == State::Posted && s.cts_pending {
                    s.cts_pending = false;
                    if s.data_done {
                        s.state = State::Done;
                    }
                }
                self.fo.cts_redo |= 1 << slot;
            }
            Some((WrKind::Probe, _)) if self.keepalive == Some(rail) => self.keepalive = None,
            Some((WrKind::Probe, _)) if self.keepalive_abandoned.contains(rail) => {
                self.keepalive_abandoned = self.keepalive_abandoned.without(rail);
            }
            Some((WrKind::ReadmitProbe, tag)) => {
                // The keepalive of a rebuilt rail: the attempt fails (a stale one's is
                // ignored).
                if self.fo.probing(rail, tag) {
                    log::debug!("{}{}", WrKind::ReadmitProbe.failed(rail, tag, c), self.at(rail));
                    return self.rail_down(rail, DownReason::Completion);
                }
                return Ok(());
            }
            _ => {}
        }
        if self.fo.failed().contains(rail) {
            return Ok(()); // flushed WRs of a rail already down
        }
        let what = match wr {
            Some((kind, slot)) => kind.failed(rail, slot, c),
            None => failure(rail, WorkRequest::ImmReceive, None, c),
        };
        log::log!(self.failure_level(), "{what}{}", self.at(rail));
        self.rail_down(rail, DownReason::Completion)
    }

    /// An outage's round: past the grace, the connection fails (`Failover::outage_round`).
    #[cold]
    #[inline(never)]
    fn poll_outage(&mut self, mem: &impl CtlMemory, out: &mut Output) -> Result<()> {
        if self.fo.outage_round(self.fo.now_ns, "recv", self.error.place.at(0), mem, out) {
            return Err(self.error.fail(Error::from_cause(ErrorKind::Remote, Cause::BothRailsFailed)));
        }
        Ok(())
    }

    /// A rail's failure is a warning while NCCL waits on a receive; with none outstanding
    /// (a sender that closed after its last send looks the same) it is information.
    fn failure_level(&self) -> log::Level {
        if self.nccl_waits() { log::Level::Warn } else { log::Level::Info }
    }

    /// `rail` failed: CTS writes and keepalives go on the other rail, and the rail is
    /// fenced before the sender hears what arrived on it.
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
        self.fo.live_rails = self.fo.live_rails.without(rail);
        let level = self.failure_level();
        if self.fo.live_rails.is_empty() && self.fo.outage_ns == 0 {
            if !self.fo.enter_outage() {
                log::log!(
                    level,
                    "recv: {} rail failed ({why:?}) and no other rail is up: the connection fails{}{}",
                    RAIL_NAMES[rail],
                    if level == log::Level::Warn { "" } else { " (no receive outstanding: the peer may have closed)" },
                    self.at(rail)
                );
                return Err(self.error.fail(Error::from_cause(ErrorKind::Remote, Cause::BothRailsFailed)));
            }
            log::log!(
                level,
                "recv: {} rail failed ({why:?}) and no other rail is up: receives wait up to {} ms \
                 (MPIB_OUTAGE_GRACE_MS) for a rail to come back{}",
                RAIL_NAMES[rail],
                self.fo.cfg.outage_grace_ns / 1_000_000,
                self.at(rail)
            );
        }
        if was_up {
            log::log!(
                level,
                "recv: {} rail failed ({why:?}); fencing it before reporting to the sender{}",
                RAIL_NAMES[rail],
                self.at(rail)
            );
            self.stats[rail].count_failover();
        } else {
            log::debug!("recv: re-admission of the {} rail failed ({why:?}); fencing its new QPs", RAIL_NAMES[rail]);
        }
        self.fo.fence_due = self.fo.fence_due.with(rail);
        if self.keepalive == Some(rail) {
            // Another keepalive may go on the surviving rail at once; this one's completion
            // (flushed, or a success the fence did not stop) is still to come.
            self.keepalive = None;
            self.keepalive_abandoned = self.keepalive_abandoned.with(rail);
        }
        Ok(())
    }

    /// An IMM whose slot byte is not a slot: a piece of a striped rail share (bits 6:5,
    /// `pieces.rs`), a replay (bit 7) when failover is on, a violation otherwise.
    #[cold]
    #[inline(never)]
    pub(super) fn on_odd_imm(&mut self, rail: usize, imm: u32, byte_len: u64, mem: &impl RecvMemory) -> Result<()> {
        let Imm { slot, mask, size_q } = Imm::decode(imm);
        if slot & REPLAY_FLAG == 0 && slot & PIECES_BITS != 0 {
            return self.on_piece(rail, imm, byte_len, mem);
        }
        if slot & REPLAY_FLAG != 0 && slot & PIECES_BITS != 0 {
            // A replay re-sends a part whole.
            let (pieces, slot) = (Imm::pieces_of(slot), (slot & SLOT_BITS) as usize);
            return Err(self.violation(move || Violation::BadPieces { rail, slot, pieces, most: 1 }));
        }
        let (slot, replay) = ((slot & !REPLAY_FLAG) as usize, slot & REPLAY_FLAG != 0);
        if !self.fo.cfg.enabled || !replay || slot >= SLOTS {
            let slot = slot | if replay { REPLAY_FLAG as usize } else { 0 };
            return Err(self.violation(move || Violation::NoReceiveWaiting { rail, slot }));
        }
        let part = other(rail);
        let rails = self.cfg.rails_mask;
        if mask.is_empty() || !mask.is_subset(rails) {
            return Err(self.violation(move || Violation::BadMask { rail, slot, imm, mask, rails }));
        }
        if !mask.contains(part) || self.fo.state[part] == RailState::Up && self.fo.epoch[part] == 0 {
            // A part outside the mask, or the replay of a part whose rail never failed here
            // (a rail Up at a later epoch failed once: a replay of its earlier life may
            // still arrive after its re-admission).
            return Err(self.violation(move || Violation::MaskOmitsRail { rail: part, slot, mask }));
        }
        let s = &self.slots[slot];
        let (state, data_done, expected, seen, prev_q, n) = (s.state, s.data_done, s.expected, s.seen, s.size_q, s.n);
        if state == State::Free {
            return Err(self.violation(move || Violation::NoReceiveWaiting { rail, slot }));
        }
        if seen.contains(part) && expected == mask {
            // Delivered already: ignored, counted, never a second completion.
            self.fo.duplicates += 1;
            return Ok(());
        }
        if data_done {
            return Err(self.violation(move || Violation::NoReceiveWaiting { rail, slot }));
        }
        if !expected.is_empty() && expected != mask {
            return Err(self.violation(move || Violation::MaskChanged { rail, slot, mask, earlier: expected }));
        }
        if !expected.is_empty() && prev_q != size_q {
            return Err(self.violation(move || Violation::SizeQChanged { rail, slot, size_q, earlier: prev_q }));
        }
        if size_q != SIZEQ_SENTINEL && n != 1 {
            let n = n as usize;
            return Err(self.violation(move || Violation::SizeForMultiRecv { rail, slot, n }));
        }
        if s.pieces_seen[part] > 0 {
            // A striped share of which some pieces arrived: the replay carries it whole, and
            // only its bytes count (the pieces' were never added).
            self.partial_parts += 1;
        }
        self.accept(rail, part, slot, mask, size_q, byte_len, mem)
    }
}
