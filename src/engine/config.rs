//! What a connection's engines are told at set-up: the sender's and the receiver's
//! configuration and the failover settings both carry. A leaf of the engine: the engines,
//! failover and the views failover is lent all read it.

use std::sync::Arc;

use super::RAILS;
use super::RailMask;
use crate::telemetry::ProbeBudget;

/// What the sender needs to know about the connection.
#[derive(Clone, Debug)]
pub struct SendConfig {
    /// Data QPs per rail (`MPIB_SOUT_QP`, `MPIB_SUP_QP`).
    pub qps: [u16; RAILS],
    /// Most pieces a rail's share of one request is striped over, each on its own QP
    /// (`MPIB_QP_STRIPE`): 1 (a request on one QP per rail, round-robin) up to
    /// `min(qps, imm::MAX_PIECES)`. The receiver reserves completions for as many.
    pub pieces: [u8; RAILS],
    /// Most send requests in flight (NCCL_NET_MAX_REQUESTS × maxRecvs).
    pub max_requests: usize,
    /// Local source of the completion-record writes: address and lkey per rail.
    pub sizes_addr: u64,
    pub sizes_lkeys: [u32; RAILS],
    /// The receiver's completion records: address and rkey per rail.
    pub records_addr: u64,
    pub records_rkeys: [u32; RAILS],
    /// The receiver's probe scratch word: address and rkey per rail.
    pub scratch_addr: u64,
    pub scratch_rkeys: [u32; RAILS],
    /// Payloads up to this many bytes are posted inline.
    pub max_inline: u32,
    /// Probe a rail idle for this long (0 = never).
    pub probe_interval_ns: u64,
    /// Each rail's NIC's probe budget, shared with the other connections on that NIC.
    pub probe_budgets: [Arc<ProbeBudget>; RAILS],
    /// Rail failover (off by default), its control ring, re-admission and the fault drill.
    pub failover: FailoverConfig,
}

/// What the receiver needs to know about the connection.
#[derive(Clone, Debug)]
pub struct RecvConfig {
    /// Most receives in flight (NCCL_NET_MAX_REQUESTS: 8 for v6, 32 after; at most
    /// [`SLOTS`](crate::engine::layout::SLOTS)).
    pub max_requests: usize,
    /// Rails this device has.
    pub rails_mask: RailMask,
    /// Most pieces the sender stripes a rail's share of one request over (its Hello says;
    /// 1: not striped): an IMM announcing more is a violation.
    pub pieces: [u8; RAILS],
    /// Local source of the CTS writes: address and lkey per rail.
    pub cts_addr: u64,
    pub cts_lkeys: [u32; RAILS],
    /// The sender's CTS FIFO: address and rkey per rail.
    pub fifo_addr: u64,
    pub fifo_rkeys: [u32; RAILS],
    /// Payloads up to this many bytes are posted inline.
    pub max_inline: u32,
    /// Local host word the flush READs land in: address and lkey per rail. Also the
    /// source of keepalive WRITEs.
    pub flush_addr: u64,
    pub flush_lkeys: [u32; RAILS],
    /// The sender's scratch word, target of keepalive WRITEs: address and rkey per rail.
    pub scratch_addr: u64,
    pub scratch_rkeys: [u32; RAILS],
    /// Rail failover (off by default) and its control ring.
    pub failover: FailoverConfig,
}

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
    /// Local source of the outgoing control messages (`failover::CTL_ENTRIES` entries of
    /// `failover::CTL_ENTRY_BYTES`, the one of message `seq` at `(seq - 1) % CTL_ENTRIES`):
    /// address and lkey per rail.
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
