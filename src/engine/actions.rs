//! What an engine hands the plugin and learns from it, beyond the data path's chains:
//! `Output` (chains to post and `Action`s to perform), the `Event`s that answer them, and
//! the rail states and failure reasons they carry (DESIGN.md "The engine"). The failover
//! sub-state machine (`failover/`) produces most of them; the engines, the plugin and the
//! views failover is lent all name them, so they sit below all of those.

use super::layout::{CTL_WORDS, QP_RECORD_WORDS};
use super::{Chain, MAX_CHAIN, QpRef, RailMask};
use crate::fabric::SendWr;

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
