//! Rail failover (DESIGN.md "Rail failover"): the parts both engines share (each rail's
//! state, the control ring's messages and their encoding, the re-admission steps; the
//! settings are `engine/config.rs`'s, the actions out and events in `engine/actions.rs`'s,
//! the control ring's layout `engine/layout.rs`'s), the sender's failover whole (`sender.rs`, `replay.rs`,
//! `silence.rs`, `readmit.rs`) and the receiver's (`receiver.rs`, `readmit.rs`), which the
//! engines call with their hot-path state lent for the step (`engine/{send,recv}_path.rs`).
//!
//! A rail failure does not break the connection: the receiver fences the rail (its QPs
//! of that rail to the error state, their CQ drained), reports which parts of which
//! transfers arrived (`Fenced`), and the sender replays only the missing parts on the
//! surviving rail. Control messages travel as one RDMA WRITE each into the peer's control
//! ring ([`CTL_ENTRIES`] entries of [`CTL_ENTRY_BYTES`]), on the surviving rail's CTS QP.
//! Nothing here runs on the data path of a connection whose rails are healthy.

pub use super::actions::{Action, DownReason, Event, Output, QpRecords, RailState};
pub use super::config::FailoverConfig;
use super::layout::SLOTS;
pub use super::layout::{
    CTL_ENTRIES, CTL_ENTRY_BYTES, CTL_MAX_UNACKED, CTL_PAYLOAD_WORDS, CTL_RING_BYTES, CTL_WORDS, QP_RECORD_WORDS,
};
use super::{ErrorState, RAIL_NAMES, RAILS, RailMask, Side};
use crate::error::{Cause, Error, ErrorKind, Result};

/// Receive sequence numbers one `Fenced` bitmap covers: the receive window.
pub const FENCE_WINDOW: u64 = SLOTS as u64;

/// `Failover::outage_ns` of an outage entered since the last round (its clock not started).
const OUTAGE_UNTIMED: u64 = u64::MAX;

/// While a rail stays down, at most one WARN about it this often.
pub const DOWN_WARN_EVERY_NS: u64 = 60_000_000_000;

/// A re-admission attempt not Up within this time has failed (its probes or its peer's
/// answer never came): it backs off and is tried again.
pub const READMIT_ATTEMPT_NS: u64 = 10_000_000_000;
/// A rail that stayed Up this long after a re-admission starts its next back-off again at
/// `readmit_ns`.
pub const READMIT_RESET_NS: u64 = 10_000_000_000;
/// Probe WRITEs the sender posts on a rebuilt rail's data QPs before it uses it again (one
/// per data QP where the rail has more).
pub const READMIT_PROBES: u8 = 3;

mod control;
mod readmit;
mod receiver;
mod replay;
mod sender;
mod silence;

pub(crate) use control::CtlChannel;
pub use control::CtlMemory;
pub use control::{CtlKind, CtlMsg};
pub(crate) use replay::{PartSrc, Replays};
pub use sender::STALL_NS_PER_BYTE;
pub(crate) use silence::SILENCE_CHECK_NS;
pub use silence::{SILENT_FLOOR_NS, SUSPECT_FLOOR_NS};

/// The other rail.
#[inline]
pub(crate) fn other(rail: usize) -> usize {
    rail ^ 1
}

/// Failover state of one side of a connection.
#[derive(Debug, Default)]
pub(crate) struct Failover {
    pub(crate) cfg: FailoverConfig,
    pub(crate) state: [RailState; RAILS],
    /// Each rail's epoch: 0 when the connection came up, +1 per re-admission.
    pub(crate) epoch: [u32; RAILS],
    pub(crate) ctl: CtlChannel,
    /// Rails whose fence (receiver: FenceQps) or report is still to be emitted.
    pub(crate) fence_due: RailMask,
    /// Rails whose FenceQps was emitted and whose FenceDone has not come: the fence is a
    /// state the engine waits in (the plugin polls the fabric at each round until the QPs'
    /// error state is final and their completions are in; it never waits for it).
    pub(crate) fence_wait: RailMask,
    /// Sender: rails failed by their silence whose QPs are fenced only once the
    /// receiver's report came (`engine/failover/sender.rs`, `rail_down`).
    pub(crate) fence_after_report: RailMask,
    /// Sender: rails whose `RailDown` is still to be written. Receiver: rails whose
    /// fence is done and whose `Fenced` is still to be written.
    pub(crate) report_due: RailMask,
    /// Rails with re-admission work for the next poll: a `Rebuild`/`Rebuilt` to write,
    /// probes to post. `connect_wait`: ConnectQps performed, QpsConnected not yet in (the
    /// plugin polls the new QPs in its rounds).
    pub(crate) readmit_due: RailMask,
    pub(crate) connect_wait: RailMask,
    /// Sender: replays waiting for their slot's chain on the surviving rail to complete.
    pub(crate) replays_waiting: u32,
    /// Counters: rail failures survived, parts confirmed, parts replayed and their bytes,
    /// duplicate IMMs ignored, CTS writes re-posted.
    pub(crate) failovers: u64,
    /// Sender: parts whose completion was lost with the rail but that the report confirms.
    pub(crate) confirmed_parts: u64,
    pub(crate) replayed_parts: u64,
    pub(crate) replayed_bytes: u64,
    pub(crate) duplicates: u64,
    pub(crate) cts_reposts: u64,
    /// Re-admission (`readmit.rs`). The time of the last failover poll (events carry none).
    pub(crate) now_ns: u64,
    /// The new QPs' records: ours (to write) and, at the receiver, the sender's (to
    /// connect to once ours are built).
    pub(crate) records: [QpRecords; RAILS],
    pub(crate) peer_records: [QpRecords; RAILS],
    /// Sender: when the next attempt starts (Failed, fenced) or the current one expires.
    pub(crate) readmit_at: [u64; RAILS],
    /// Sender: the wait before the next attempt (doubles per failure).
    pub(crate) backoff_ns: [u64; RAILS],
    /// Sender: when the rail last became Up again (0: never re-admitted).
    pub(crate) up_since_ns: [u64; RAILS],
    /// Probe WRITEs of the current attempt not yet completed.
    pub(crate) probes_out: [u8; RAILS],
    pub(crate) readmissions: u64,
    pub(crate) readmit_failures: u64,
    /// Sender: rails failed by the silent-rail check (not by a completion or the port).
    pub(crate) silent_failures: u64,
    /// When the engine's next failover round is due (0: at once; a lower bound kept by the
    /// engine: its `poll_timeout` reads it on every call).
    pub(crate) timer_ns: u64,
    /// Sender: the next stall check.
    pub(crate) stall_next_ns: u64,
    /// Sender: the next silent-rail check (`u64::MAX`: nothing outstanding, the next post
    /// arms it; 0 with failover off: never armed).
    pub(crate) silence_next_ns: u64,
    /// Sender: rails suspected silent (new sends leave them; a completion clears it).
    pub(crate) suspect: RailMask,
    /// Sender: when each rail last completed something (data or a probe), and when it was
    /// last suspected (`engine/failover/silence.rs`).
    pub(crate) heard_ns: [u64; RAILS],
    pub(crate) suspect_at: [u64; RAILS],
    /// When each rail's continued absence was last warned about (a rail that stays down
    /// is one WARN a minute, not one per attempt).
    pub(crate) down_warned_ns: [u64; RAILS],
    /// When the current outage began (every rail failed; 0: none): requests wait, control
    /// messages go out of band, until a rail is back or the grace is spent.
    pub(crate) outage_ns: u64,
    /// Entering the outage: the messages the peer has not acknowledged are still to be
    /// sent out of band.
    pub(crate) oob_resend: bool,
    /// Outages ridden out.
    pub(crate) outages: u64,
    /// Rails whose device is gone for good (`DEVICE_FATAL`): with every rail's gone there
    /// is nothing to wait for.
    pub(crate) fatal: RailMask,
    /// The peer's end of the set-up channel closed ([`Event::PeerGone`]): with every rail
    /// down too, there is nobody to wait for.
    pub(crate) peer_gone: bool,
    /// Sender: each slot's replay record (`replay.rs`); the posting path writes it.
    pub(crate) replays: Replays,
    /// Receiver: the rails that have not failed (CTS writes and keepalives go there), and
    /// the slots whose CTS WRITE failed or was flushed on a dead rail (bit per slot),
    /// posted again on a surviving rail while their receive still waits for data.
    pub(crate) live_rails: RailMask,
    pub(crate) cts_redo: u32,
}

/// What failover has counted on one side.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct FailoverCounts {
    pub failovers: u64,
    pub confirmed_parts: u64,
    pub replayed_parts: u64,
    pub replayed_bytes: u64,
    pub duplicates: u64,
    pub cts_reposts: u64,
    /// Rails re-admitted, and re-admission attempts that failed.
    pub readmissions: u64,
    pub readmit_failures: u64,
    /// Rails failed because they fell silent while the other rail completed work.
    pub silent_failures: u64,
    /// Outages (every rail failed) ridden out: a rail came back within the grace.
    pub outages: u64,
}

impl Failover {
    /// The failover state of a connection that came up at `now_ns` (a round is due at once:
    /// it sets the timers).
    pub(crate) fn new(cfg: FailoverConfig, now_ns: u64) -> Failover {
        let (timer_ns, silence_next_ns) = if cfg.enabled { (0, u64::MAX) } else { (u64::MAX, 0) };
        Failover { cfg, now_ns, timer_ns, silence_next_ns, ..Failover::default() }
    }

    /// The sender's failover state: with a replay record per slot.
    pub(crate) fn with_replays(mut self) -> Failover {
        self.replays = Replays::for_sender();
        self
    }

    /// Whether a rail has a fence, a report, a re-admission step or a connect waiting (one
    /// OR over the four masks; either engine's `failover_due` adds its own work).
    #[inline]
    pub(crate) fn rail_work_due(&self) -> bool {
        !(self.fence_due | self.fence_wait | self.report_due | self.readmit_due | self.connect_wait).is_empty()
    }

    /// The level of a line about `rail` while it stays down (a re-admission attempt
    /// failed, fenced again): a WARN when none was written for [`DOWN_WARN_EVERY_NS`] (the
    /// rail's failure itself is one), else DEBUG: a rail down for hours writes one WARN a
    /// minute, not one per attempt. Its return is an INFO line.
    pub(crate) fn while_down_level(&mut self, rail: usize, now_ns: u64) -> log::Level {
        if self.down_warned_ns[rail] == 0 || now_ns.saturating_sub(self.down_warned_ns[rail]) >= DOWN_WARN_EVERY_NS {
            self.down_warned_ns[rail] = now_ns.max(1);
            log::Level::Warn
        } else {
            log::Level::Debug
        }
    }

    /// Whether a port-down event on `rail` fails it over: only where the other rail can take
    /// its traffic (failover on, the other rail Up). Otherwise RC's retry budget decides, as
    /// with NCCL's IB transport: the rail's QPs keep retrying, a port back in time carries
    /// on, and one that stays down errors them, which fails the rail (and the connection).
    pub(crate) fn port_down_fails_over(&self, rail: usize) -> bool {
        self.cfg.enabled && self.state[other(rail)] == RailState::Up
    }

    /// Writes a control message about `rail`: on the other rail's CTS QP while that works,
    /// out of band in an outage (no rail works). `false`: not now (the ring is full, or
    /// the other rail is being re-admitted; sent at a later round).
    pub(crate) fn send_ctl(&mut self, msg: &CtlMsg, rail: usize, mem: &mut impl CtlMemory, out: &mut Output) -> bool {
        let via = other(rail);
        if self.state[via] == RailState::Up {
            self.ctl.send(&self.cfg, msg, Some(via), mem, out)
        } else if self.outage_ns != 0 {
            self.ctl.send(&self.cfg, msg, None, mem, out)
        } else {
            false
        }
    }

    /// Every rail has failed: whether the connection rides it out (a grace is configured).
    /// Starts the out-of-band resend; the outage's clock starts at the next round
    /// ([`Self::stamp_outage`]: a failure found in a completion has no time of its own).
    pub(crate) fn enter_outage(&mut self) -> bool {
        if self.cfg.outage_grace_ns == 0 || self.fatal == RailMask::BOTH || self.peer_gone {
            return false;
        }
        if self.outage_ns == 0 {
            (self.outage_ns, self.oob_resend) = (OUTAGE_UNTIMED, true);
            self.timer_ns = 0;
        }
        true
    }

    /// `rail` failed (`why`) and was the last one working, on `side`: the outage begins
    /// ([`Self::enter_outage`]), said at `level`, or, with no grace, the connection fails.
    pub(crate) fn last_rail_failed(
        &mut self,
        side: Side,
        rail: usize,
        why: DownReason,
        level: log::Level,
        error: &mut ErrorState,
    ) -> Result<()> {
        let (me, none_left, calls) = match side {
            Side::Send => ("send", "the other rail is down", "send"),
            Side::Receive => ("recv", "no other rail is up", "receive"),
        };
        let at = error.place.at(rail);
        if !self.enter_outage() {
            log::log!(
                level,
                "{me}: {} rail failed ({why:?}) and {none_left}: the connection fails{}{at}",
                RAIL_NAMES[rail],
                if level == log::Level::Warn {
                    String::new()
                } else {
                    format!(" (no {calls} outstanding: the peer may have closed)")
                },
            );
            return Err(error.fail(Error::from_cause(ErrorKind::Remote, Cause::BothRailsFailed)));
        }
        log::log!(
            level,
            "{me}: {} rail failed ({why:?}) and {none_left}: {calls}s wait up to {} ms \
             (MPIB_OUTAGE_GRACE_MS) for a rail to come back{at}",
            RAIL_NAMES[rail],
            self.cfg.outage_grace_ns / 1_000_000,
        );
        Ok(())
    }

    /// A round at `now_ns`: an outage entered since the last one starts its clock now.
    #[inline]
    pub(crate) fn stamp_outage(&mut self, now_ns: u64) {
        if self.outage_ns == OUTAGE_UNTIMED {
            self.outage_ns = now_ns.max(1);
        }
    }

    /// An outage's round at `now_ns` on `side` ("send", "recv"; `at`: where, for the log
    /// line): entering it, the control
    /// messages the peer has not acknowledged go out of band again (`engine/failover/control.rs`).
    /// Whether the grace has run out (logged here; the caller fails the connection).
    #[cold]
    pub(crate) fn outage_round(
        &mut self,
        now_ns: u64,
        side: &str,
        at: impl std::fmt::Display,
        mem: &impl CtlMemory,
        out: &mut Output,
    ) -> bool {
        if now_ns >= self.outage_deadline() {
            log::warn!(
                "{side}: no rail came back within {} ms (MPIB_OUTAGE_GRACE_MS): the connection fails{at}",
                self.cfg.outage_grace_ns / 1_000_000
            );
            return true;
        }
        if std::mem::take(&mut self.oob_resend) {
            self.ctl.resend_unacked(mem, out);
        }
        false
    }

    /// When the current outage's grace ends (`u64::MAX`: no outage).
    pub(crate) fn outage_deadline(&self) -> u64 {
        if self.outage_ns == 0 { u64::MAX } else { self.outage_ns.saturating_add(self.cfg.outage_grace_ns) }
    }

    /// A rail works again: the outage (if any) is over; how long it lasted.
    pub(crate) fn leave_outage(&mut self, now_ns: u64) -> Option<u64> {
        if self.outage_ns == 0 {
            return None;
        }
        let took = now_ns.saturating_sub(self.outage_ns);
        (self.outage_ns, self.oob_resend) = (0, false);
        self.outages += 1;
        Some(took)
    }

    /// The fences to ask the plugin for, now waited on.
    pub(crate) fn emit_fences(&mut self, out: &mut Output) {
        for rail in self.fence_due.iter() {
            out.actions.push(Action::FenceQps { rail });
        }
        self.fence_wait |= self.fence_due;
        self.fence_due = RailMask::NONE;
    }

    pub(crate) fn counts(&self) -> FailoverCounts {
        FailoverCounts {
            failovers: self.failovers,
            confirmed_parts: self.confirmed_parts,
            replayed_parts: self.replayed_parts,
            replayed_bytes: self.replayed_bytes,
            duplicates: self.duplicates,
            cts_reposts: self.cts_reposts,
            readmissions: self.readmissions,
            readmit_failures: self.readmit_failures,
            silent_failures: self.silent_failures,
            outages: self.outages,
        }
    }

    /// The rails that have failed (any epoch, not re-admitted).
    pub(crate) fn failed(&self) -> RailMask {
        RailMask::from_fn(|r| self.state[r] != RailState::Up)
    }

    /// Marks `rail` failed at its epoch: `None` when it already was, else whether it was
    /// Up (a failover) rather than being re-admitted (a failed attempt).
    pub(crate) fn mark_failed(&mut self, rail: usize) -> Option<bool> {
        let was_up = match self.state[rail] {
            RailState::Failed { .. } => return None,
            RailState::Up => true,
            RailState::Rebuilding { .. } | RailState::Probing { .. } => false,
        };
        self.state[rail] = RailState::Failed { epoch: self.epoch[rail], fenced: false };
        self.readmit_due = self.readmit_due.without(rail);
        self.connect_wait = self.connect_wait.without(rail);
        self.probes_out[rail] = 0;
        if was_up {
            self.failovers += 1;
        } else {
            self.readmit_failures += 1;
        }
        Some(was_up)
    }

    /// The epoch a re-admission probe's `wr_id` carries (its slot field).
    pub(crate) fn probe_tag(epoch: u32) -> usize {
        (epoch & 0xff) as usize
    }

    /// Whether a re-admission probe tagged `tag` belongs to `rail`'s current attempt.
    pub(crate) fn probing(&self, rail: usize, tag: usize) -> bool {
        matches!(self.state[rail], RailState::Probing { epoch } if Self::probe_tag(epoch) == tag)
    }

    /// [`Event::QpsConnected`], the same on both sides: the probes (sender) or the
    /// keepalive (receiver) on the new QPs go at the next poll; a late one (the attempt
    /// given up, or not waiting for its connect) changes nothing.
    pub(crate) fn on_qps_connected(&mut self, rail: usize) {
        if matches!(self.state[rail], RailState::Probing { .. }) && self.connect_wait.contains(rail) {
            self.connect_wait = self.connect_wait.without(rail);
            self.readmit_due = self.readmit_due.with(rail);
        }
    }
}

#[cfg(test)]
mod tests;
