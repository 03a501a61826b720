//! The receiver's side of rail failover (DESIGN.md "Rail failover"). The receiver alone
//! knows which parts arrived, so it fences before it reports: when a rail fails (its own
//! error completion, the plugin's word, the sender's `RailDown`) it asks the plugin to move
//! its QPs of that rail to the error state and drain their completions
//! ([`Action::FenceQps`]); once that is done ([`Event::FenceDone`]) no IMM can arrive on the
//! rail any more, and it writes `Fenced`: for each receive of the window, whether the dead
//! rail's part arrived. Its CTS writes lost on the dead rail are re-posted on the surviving
//! one (by the engine: `engine/recv/failover.rs`).
//!
//! The receiver engine calls in here with a [`RecvPath`]: its receive slots, keepalive and
//! counters, borrowed for the step. Nothing here runs on the data path of a connection
//! whose rails are healthy.
//!
//! [`Action::FenceQps`]: crate::engine::Action::FenceQps

use super::{CtlKind, CtlMsg, FENCE_WINDOW, Failover, other};
use crate::engine::layout::SLOTS;
use crate::engine::recv_path::RecvPath;
use crate::engine::{
    CtlMemory, DownReason, Event, Output, RAIL_NAMES, RailMask, RailState, Side, Violation, WorkRequest, WrKind,
    failure,
};
use crate::error::{Cause, Error, ErrorKind, Result};
use crate::fabric::Completion;

impl Failover {
    /// Receiver: what the plugin saw (a port down) or did (an action performed)
    /// (`RecvEngine::handle_event`).
    pub(crate) fn on_receiver_event(&mut self, p: &mut RecvPath<'_>, ev: Event) -> Result<()> {
        self.timer_ns = 0;
        match ev {
            Event::RailDown { rail } if self.state[rail] == RailState::Up && !self.port_down_fails_over(rail) => {
                log::log!(
                    p.failure_level(),
                    "recv: the {} rail's port is down and no other rail can take its traffic: receives wait while \
                     RC retries (MPIB_TIMEOUT, MPIB_RETRY_CNT); a port back in time carries on{}",
                    RAIL_NAMES[rail],
                    p.at(rail)
                );
                Ok(())
            }
            Event::DeviceFatal { rail } => {
                self.fatal = self.fatal.with(rail);
                if self.fatal == RailMask::BOTH && self.outage_ns != 0 {
                    // Waiting for a rail whose device is gone: nothing will come back.
                    return Err(p.error.fail(Error::from_cause(ErrorKind::Remote, Cause::BothRailsFailed)));
                }
                self.receiver_rail_down(p, rail, DownReason::Port)
            }
            Event::RailDown { rail } => self.receiver_rail_down(p, rail, DownReason::Port),
            Event::QpsBuilt { rail, records } => {
                self.on_qps_built(Side::Receive, rail, records);
                Ok(())
            }
            Event::QpsConnected { rail } => {
                self.on_qps_connected(rail);
                Ok(())
            }
            Event::ReadmitFailed { rail } | Event::PortDown { rail } => self.receiver_readmit_failed(p, rail),
            Event::ControlOob { words } => {
                self.ctl.receive_oob(words);
                Ok(())
            }
            Event::PeerGone => {
                // Remembered: an outage that follows is not waited out.
                self.peer_gone = true;
                if self.outage_ns == 0 {
                    return Ok(());
                }
                log::info!("recv: the peer closed its end while no rail works: the connection fails");
                Err(p.error.fail(Error::remote("the peer closed the connection while both rails were down")))
            }
            Event::FenceDone { rail } => {
                self.fence_wait = self.fence_wait.without(rail);
                // Every IMM of the rail is in now: report what arrived.
                if self.state[rail] != RailState::Up {
                    self.report_due = self.report_due.with(rail);
                }
                Ok(())
            }
        }
    }

    /// Receiver: an outage's round; past the grace, the connection fails
    /// (`Failover::outage_round`).
    #[cold]
    #[inline(never)]
    pub(crate) fn receiver_outage_round(
        &mut self,
        p: &mut RecvPath<'_>,
        mem: &impl CtlMemory,
        out: &mut Output,
    ) -> Result<()> {
        if self.outage_round(self.now_ns, "recv", p.error.place.at(0), mem, out) {
            return Err(p.error.fail(Error::from_cause(ErrorKind::Remote, Cause::BothRailsFailed)));
        }
        Ok(())
    }

    /// Receiver: the sender's control messages waiting in the ring (`RailDown`, `Rebuild`);
    /// anything else is a violation.
    pub(crate) fn read_receiver_ctl(
        &mut self,
        p: &mut RecvPath<'_>,
        mem: &impl CtlMemory,
        out: &mut Output,
    ) -> Result<()> {
        while let Some(msg) = self.ctl.poll(mem) {
            let seq = self.ctl.consumed();
            match msg {
                Some(m) if m.kind == CtlKind::RailDown => {
                    let rail = m.rail as usize;
                    if m.epoch == self.epoch[rail] {
                        self.receiver_rail_down(p, rail, DownReason::Peer)?;
                    }
                }
                Some(m) if m.kind == CtlKind::Rebuild => self.on_rebuild(&m, out),
                _ => {
                    let word0 = msg.map_or(0, |m| m.to_words(0, 0)[0]);
                    return Err(p.error.fail(Violation::BadControl { seq, word0 }.into()));
                }
            }
        }
        Ok(())
    }

    /// Receiver: the `Fenced` reports due, written where the ring has room; a rail reported
    /// is fenced at its epoch.
    pub(crate) fn write_fenced_reports(&mut self, p: &RecvPath<'_>, mem: &mut impl CtlMemory, out: &mut Output) {
        for rail in self.report_due.iter() {
            let msg = self.fenced_report(p, rail);
            if self.send_ctl(&msg, rail, mem, out) {
                self.report_due = self.report_due.without(rail);
                self.state[rail] = RailState::Failed { epoch: msg.epoch, fenced: true };
                // The first report of a down period is news (the failure was a WARN); one
                // after each failed re-admission attempt is not.
                let first = self.down_warned_ns[rail] == 0;
                self.down_warned_ns[rail] = 1;
                log::log!(
                    if first { log::Level::Info } else { log::Level::Debug },
                    "recv: {} rail fenced: {} of the last {} receives had its part, reported to the sender{}",
                    RAIL_NAMES[rail],
                    msg.bitmap.count_ones(),
                    FENCE_WINDOW,
                    p.at(rail)
                );
            }
        }
    }

    /// `Fenced` for `rail`: receives before `base_seq` completed; bit `i` says whether
    /// part `rail` of receive `base_seq + i` arrived, and bit `i` of the first payload word
    /// whether the other part did.
    fn fenced_report(&self, p: &RecvPath<'_>, rail: usize) -> CtlMsg {
        let tail = p.fifo_tail;
        let base = tail.saturating_sub(FENCE_WINDOW);
        let mut m = CtlMsg::new(CtlKind::Fenced, rail, self.epoch[rail]);
        m.base_seq = base;
        for seq in base..tail {
            m.bitmap |= (p.part_arrived(seq, rail) as u32) << (seq - base);
            // The other part, which replays on this rail delivered: `CtlMsg::other_seen`.
            m.payload[0] |= (p.part_arrived(seq, other(rail)) as u64) << (seq - base);
        }
        m
    }

    /// Receiver: a failed completion on `rail` (failover on): `wr` is the WR it names, if
    /// any.
    #[cold]
    #[inline(never)]
    pub(crate) fn on_receiver_error(
        &mut self,
        p: &mut RecvPath<'_>,
        rail: usize,
        wr: Option<(WrKind, usize)>,
        c: &Completion,
    ) -> Result<()> {
        match wr {
            Some((WrKind::Cts, slot)) if slot < SLOTS => {
                // The WR is dead: no completion will follow. Re-post it if still needed.
                p.cts_lost(slot);
                self.cts_redo |= 1 << slot;
            }
            Some((WrKind::Probe, _)) if *p.keepalive == Some(rail) => *p.keepalive = None,
            Some((WrKind::Probe, _)) if p.keepalive_abandoned.contains(rail) => {
                *p.keepalive_abandoned = p.keepalive_abandoned.without(rail);
            }
            Some((WrKind::ReadmitProbe, tag)) => {
                // The keepalive of a rebuilt rail: the attempt fails (a stale one's is
                // ignored).
                if self.probing(rail, tag) {
                    log::debug!("{}{}", WrKind::ReadmitProbe.failed(rail, tag, c), p.at(rail));
                    return self.receiver_rail_down(p, rail, DownReason::Completion);
                }
                return Ok(());
            }
            _ => {}
        }
        if self.failed().contains(rail) {
            return Ok(()); // flushed WRs of a rail already down
        }
        let what = match wr {
            Some((kind, slot)) => kind.failed(rail, slot, c),
            None => failure(rail, WorkRequest::ImmReceive, None, c),
        };
        log::log!(p.failure_level(), "{what}{}", p.at(rail));
        self.receiver_rail_down(p, rail, DownReason::Completion)
    }

    /// Receiver: `rail` failed; CTS writes and keepalives go on the other rail, and the rail
    /// is fenced before the sender hears what arrived on it.
    #[cold]
    #[inline(never)]
    pub(super) fn receiver_rail_down(&mut self, p: &mut RecvPath<'_>, rail: usize, why: DownReason) -> Result<()> {
        if !self.cfg.enabled {
            return Err(p
                .error
                .fail(Error::remote(format!("the {} rail failed and failover is off", RAIL_NAMES[rail]))));
        }
        let Some(was_up) = self.mark_failed(rail) else { return Ok(()) };
        self.timer_ns = 0;
        self.live_rails = self.live_rails.without(rail);
        let level = p.failure_level();
        if self.live_rails.is_empty() && self.outage_ns == 0 {
            self.last_rail_failed(Side::Receive, rail, why, level, p.error)?;
        }
        if was_up {
            log::log!(
                level,
                "recv: {} rail failed ({why:?}); fencing it before reporting to the sender{}",
                RAIL_NAMES[rail],
                p.at(rail)
            );
            p.stats[rail].count_failover();
        } else {
            log::debug!("recv: re-admission of the {} rail failed ({why:?}); fencing its new QPs", RAIL_NAMES[rail]);
        }
        self.fence_due = self.fence_due.with(rail);
        if *p.keepalive == Some(rail) {
            // Another keepalive may go on the surviving rail at once; this one's completion
            // (flushed, or a success the fence did not stop) is still to come.
            *p.keepalive = None;
            *p.keepalive_abandoned = p.keepalive_abandoned.with(rail);
        }
        Ok(())
    }
}
