//! Rail failover (DESIGN.md "Rail failover"): the parts both engines share (the
//! configuration, each rail's state, the control ring's messages and their encoding, what
//! the engines ask the plugin for (actions out) and learn from it (events in), the
//! re-admission steps), the sender's failover whole (`sender.rs`, `replay.rs`,
//! `silence.rs`, `readmit.rs`) and the receiver's (`receiver.rs`, `readmit.rs`), which the
//! engines call with their hot-path state lent for the step (`engine/{send,recv}/path.rs`).
//!
//! A rail failure does not break the connection: the receiver fences the rail (its QPs
//! of that rail to the error state, their CQ drained), reports which parts of which
//! transfers arrived (`Fenced`), and the sender replays only the missing parts on the
//! surviving rail. Control messages travel as one RDMA WRITE each into the peer's control
//! ring ([`CTL_ENTRIES`] entries of [`CTL_ENTRY_BYTES`]), on the surviving rail's CTS QP.
//! Nothing here runs on the data path of a connection whose rails are healthy.

use super::layout::SLOTS;
use super::{Chain, MAX_CHAIN, QpRef, RAILS, RailMask};
use crate::fabric::SendWr;

/// Entries of a control ring (each side has one, written by its peer).
pub const CTL_ENTRIES: usize = 8;
/// Bytes of one control-ring entry: the header word, `base_seq`, bitmap and ack,
/// [`CTL_PAYLOAD_WORDS`] payload words, then the sequence word. Sized so that one
/// `Rebuild`/`Rebuilt` describes a rail of 16 QPs (`plugin/readmit.rs`); still one packet
/// at the smallest RDMA MTU (256 bytes).
pub const CTL_ENTRY_BYTES: usize = 256;
/// 64-bit words of one entry.
pub const CTL_WORDS: usize = CTL_ENTRY_BYTES / 8;
/// Payload words of one entry: all but the header, `base_seq`, bitmap/ack and sequence words.
pub const CTL_PAYLOAD_WORDS: usize = CTL_WORDS - 4;
/// Bytes of a control ring.
pub const CTL_RING_BYTES: usize = CTL_ENTRIES * CTL_ENTRY_BYTES;
/// Messages a side may have written that its peer has not yet acknowledged: the protocol
/// never has more than two outstanding per rail and side (DESIGN.md), half the ring.
/// Every send queue that carries control writes holds this many more WRs.
pub const CTL_MAX_UNACKED: u64 = (2 * RAILS) as u64;
/// Receive sequence numbers one `Fenced` bitmap covers: the receive window.
pub const FENCE_WINDOW: u64 = SLOTS as u64;

/// The failover settings a connection's engines get (`MPIB_FAILOVER`, `MPIB_STALL_MS`) and
/// where its control messages go. The default is off: any rail failure fails the connection
/// until the plugin configures a control ring.
#[derive(Clone, Debug, Default)]
pub struct FailoverConfig {
    /// Failover on: a rail failure is survived while the other rail works.
    pub enabled: bool,
    /// Sender: a rail with signalled work outstanding and no completion for this long has
    /// failed (0 = never).
    pub stall_ns: u64,
    /// Sender: the silent-rail check (`engine/failover/silence.rs`) runs. Off where the two
    /// rails leave through one port: they share its link, so one cannot go silent beside
    /// the other, and a rail queued behind its partner's traffic in the NIC is no failure.
    pub silence: bool,
    /// Sender: the silent-rail check's failure floor (`MPIB_SILENT_MS`); 0: the default
    /// for a NIC that moves data by itself, [`crate::engine::SILENT_FLOOR_NS`]. A rail is
    /// suspect at 2/5 of it.
    pub silent_floor_ns: u64,
    /// Local source of the outgoing control messages ([`CTL_ENTRIES`] entries of
    /// [`CTL_ENTRY_BYTES`], the one of message `seq` at `(seq - 1) % CTL_ENTRIES`): address
    /// and lkey per rail.
    pub ctl_out_addr: u64,
    pub ctl_out_lkeys: [u32; RAILS],
    /// The peer's control ring: address and rkey per rail.
    pub ctl_ring_addr: u64,
    pub ctl_ring_rkeys: [u32; RAILS],
    /// Sender: re-admission of a failed rail, first tried this long after its fence
    /// (`MPIB_READMIT_MS`), the wait doubling after each failed attempt up to
    /// `readmit_max_ns` (`MPIB_READMIT_MAX_MS`); 0 = never re-admit.
    pub readmit_ns: u64,
    pub readmit_max_ns: u64,
    /// Sender: the fault drill (`MPIB_FAULT_RAIL`), if any.
    pub drill: Option<crate::config::FaultDrill>,
    /// How long a connection whose rails have all failed waits for one to come back
    /// before it fails (`MPIB_OUTAGE_GRACE_MS`); 0: it fails at once.
    pub outage_grace_ns: u64,
}

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
/// 64-bit words of QP records one `Rebuild`/`Rebuilt` carries: the entry's payload.
pub const QP_RECORD_WORDS: usize = CTL_PAYLOAD_WORDS;

/// A side's new QPs of a rail, as the plugin describes them to the peer (opaque to the
/// engines; `plugin/readmit.rs` encodes them): `n` words of `words` used.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct QpRecords {
    pub n: u8,
    pub words: [u64; QP_RECORD_WORDS],
}

/// A rail's failover state.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub enum RailState {
    /// Healthy at its current epoch.
    #[default]
    Up,
    /// Failed at `epoch`. Receiver: `fenced` once its `Fenced` report is posted. Sender:
    /// `fenced` once the receiver's `Fenced` report was applied (every part of the rail
    /// is either confirmed or replayed).
    Failed { epoch: u32, fenced: bool },
    /// Re-admission proposed at `epoch` (the failed epoch + 1): new QPs being built, the
    /// `Rebuild`/`Rebuilt` exchange under way.
    Rebuilding { epoch: u32 },
    /// New QPs connected (or connecting) at `epoch`; probes confirm them before the rail
    /// is Up again.
    Probing { epoch: u32 },
}

/// Why a rail failed.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum DownReason {
    /// A completion on the rail failed.
    Completion,
    /// Sender: signalled work outstanding and no completion for `MPIB_STALL_MS`.
    Stall,
    /// Sender: silent for long against its own round trips while the other rail completes.
    Silent,
    /// The plugin saw it: a port-down async event (verbs), the peer's rail connection lost
    /// (soft).
    Port,
    /// The peer reported it (`RailDown` or `Fenced`).
    Peer,
}

/// A side effect an engine asks of the plugin (performed on the fabric, answered with an
/// [`Event`]).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
// The records (a rail of 16 QPs, 232 bytes) travel by value: only failover rounds make
// and move these, a few at a time, and they stay `Copy`.
#[allow(clippy::large_enum_variant)]
pub enum Action {
    /// Move every QP of `rail` of this connection to the error state (its responders then
    /// accept nothing more); once that is final (verbs: `IBV_EVENT_QP_LAST_WQE_REACHED` for
    /// an SRQ-attached QP, bounded; soft: at once) feed the engine every completion the
    /// rail's CQ still holds for the connection, then answer [`Event::FenceDone`]. Never
    /// waited for: the plugin looks again at each round (the engine keeps them coming).
    FenceQps { rail: usize },
    /// Re-admission: create `rail`'s QPs of this connection again (on the same shared
    /// queues; the old ones, in the error state since the fence, are destroyed first), answer
    /// [`Event::QpsBuilt`] with their records (or [`Event::ReadmitFailed`]).
    RebuildQps { rail: usize },
    /// Re-admission: connect the new QPs of `rail` to the peer's (`records`); answer
    /// [`Event::QpsConnected`] once they carry WRs (or [`Event::ReadmitFailed`]).
    ConnectQps { rail: usize, records: QpRecords },
    /// The fault drill (`MPIB_FAULT_RAIL`, soft fabric) drops rails as a lost link would:
    /// inject `kind` on the QPs of the rails in `inject` (those Up), and refuse the
    /// re-admission of every rail in `refuse` for `refuse_ms` (`None`: for good). `isend`:
    /// the comm's isends so far, for the log. No event answers it.
    Drop { inject: RailMask, refuse: RailMask, kind: crate::fabric::FaultKind, refuse_ms: Option<u64>, isend: u64 },
    /// The request in `slot` has waited `age_ns` (at least): log the connection's state
    /// (`state_report`) once. No event answers it.
    HangReport { slot: usize, age_ns: u64 },
    /// No rail works: send this control-ring entry to the peer over the connection's
    /// set-up channel, whose plugin answers with [`Event::ControlOob`] on its side
    /// (`engine/failover/control.rs`). No event answers it here.
    ControlOob { words: [u64; CTL_WORDS] },
}

/// What the plugin tells an engine.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
#[allow(clippy::large_enum_variant)] // as `Action`: records by value, in failover rounds only
pub enum Event {
    /// [`Action::FenceQps`] is done and the rail's completions were all fed in.
    FenceDone { rail: usize },
    /// `rail`'s port went down (an async event): the rail fails over where the other rail
    /// can take its traffic; on the last working rail RC's retries decide.
    RailDown { rail: usize },
    /// `rail`'s device is gone for good (`DEVICE_FATAL`): the rail fails, the last one too.
    DeviceFatal { rail: usize },
    /// [`Action::RebuildQps`] done: the new QPs' records, for the peer.
    QpsBuilt { rail: usize, records: QpRecords },
    /// [`Action::ConnectQps`] done: the new QPs carry WRs now.
    QpsConnected { rail: usize },
    /// Re-admission of `rail` failed in the plugin (QPs not made, connect refused or timed
    /// out): the attempt backs off.
    ReadmitFailed { rail: usize },
    /// [`Action::RebuildQps`] not done: `rail`'s port is down now (verbs: no PORT_ACTIVE
    /// since its PORT_ERR). Sender: no attempt was made; the next one starts
    /// `MPIB_READMIT_MS` later, the back-off unchanged (an outage's length is no failed
    /// attempt, and QPs built on a dead port only fail their probes seconds later).
    /// Receiver: as [`Event::ReadmitFailed`].
    PortDown { rail: usize },
    /// A control-ring entry the peer sent out of band ([`Action::ControlOob`]).
    ControlOob { words: [u64; CTL_WORDS] },
    /// The peer's end of the set-up channel closed: during an outage, the peer is gone.
    PeerGone,
}

/// What an engine's `handle_timeout` hands the plugin: chains to post in order (probes,
/// keepalives, control writes, replays, CTS re-posts) and actions to perform on the fabric,
/// each answered with an [`Event`]. Reused: it grows to the most one round produced (a few
/// probes while the rails work, up to a window of replays in an outage), not to the most
/// a round could produce (24 KiB a comm).
#[derive(Debug, Default)]
pub struct Output {
    pub chains: Vec<Chain>,
    pub actions: Vec<Action>,
}

impl Output {
    pub fn clear(&mut self) {
        self.chains.clear();
        self.actions.clear();
    }

    /// A new chain for `rail` on `qp`; the caller fills its WRs.
    pub(crate) fn push(&mut self, rail: usize, qp: QpRef) -> &mut Chain {
        self.chains.push(Chain { rail: rail as u8, qp, len: 0, ..Chain::default() });
        self.chains.last_mut().expect("just pushed")
    }
}

impl Chain {
    /// Appends `wr` (failover chains; at most [`MAX_CHAIN`] WRs).
    pub(crate) fn add(&mut self, wr: SendWr) {
        debug_assert!((self.len as usize) < MAX_CHAIN);
        self.wrs[self.len as usize] = wr;
        self.len += 1;
    }
}

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
