//! Connection set-up: the 128-byte listen handle, and `connect`/`accept` as non-blocking
//! state machines NCCL calls again and again (success with a NULL comm until ready).
//!
//! ```text
//!  connector (send comm)                       acceptor (receive comm)
//!  rails: N QPs per rail, FIFO region
//!  Hello{qps per rail, QP infos, FIFO keys} ─▶  rails: N QPs (+ flush QP) on the SRQ,
//!                                               records/scratch region; QPs → RTS
//!  QPs → RTS, wait until ready        ◀─  Reply{QP infos, records + scratch keys}
//!  Ready ─────────────────────────────▶  wait for Ready and ready QPs
//! ```
//! The acceptor's QPs reach RTS before it replies and the connector's before it says
//! Ready, so no WRITE ever finds an unconnected QP. Either side that gives up after the
//! Hello sends a Refusal saying why before it closes, so both sides report the cause.
//!
//! An accepted connection is a stranger until its first message is a Hello of this
//! version: one that says nothing within `HELLO_WITHIN`, closes, or sends anything else
//! is a stray (`AcceptFailed::Stray`, `Silent`; the acceptor is `accepting.rs`), which the listener drops
//! (`listen.rs`) without failing NCCL's `accept`; a Hello of another version or fabric is
//! an mpib peer that cannot work with this one, a failed set-up.
//!
//! **A late peer is waited for.** NCCL calls `connect` and `accept` until they are done or
//! it aborts, and a straggler rank (a slow node, a late data loader) is no failure: neither
//! side gives up on a peer that is merely late. A peer that is gone (its set-up connection
//! refused, reset or closed) or that sends nonsense fails the set-up at once. A set-up that
//! has waited long says so at INFO (after [`WAIT_NOTE_FIRST`], then at doubling intervals,
//! at most one line a second in all). `MPIB_CONNECT_TIMEOUT_MS` (0 by default: none) sets a
//! deadline from the first call for sites that want one.
//!
//! The QPs are made on the shared queues of each rail's NIC in the connection's context,
//! with send queues as deep as what can be outstanding on them (`rail.rs`).

use std::sync::Arc;
use std::time::{Duration, Instant};

use super::comm::SendComm;
use super::context::Context;
use super::failover::{FoSide, failover_config};
use super::nic_pair::NicPair;
use super::oob::{OobAddr, OobConn};
use super::place::{ConnPlace, stats_places};
use super::rail::{Rail, SEND_INLINE, all_ready, build_rails, connect_qps, qp_infos, region_keys, send_plan};
use super::region::{SEND_CTL_OFF, SEND_REGION_BYTES, SEND_SCRATCH_OFF, SEND_SIZES_OFF};
use super::setup_msg::{self, Hello, Msg, Reply};
use super::{AbiVersion, MAX_RECVS};
use crate::config::Config;
use crate::engine::imm::MAX_PIECES;
use crate::engine::{FailoverConfig, PlaceRef, RAILS, SendConfig, SendEngine};
use crate::error::{Error, Result};
use crate::fabric::mem::HostRegion;
use crate::fabric::{ConnectParams, Device};
use crate::split::AnySplit;
use crate::telemetry::{RailTelemetry, Registry, TelemetryConfig};

/// What the fabric is, written into handles and Hello so mismatched peers fail clearly.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum FabricKind {
    Soft = 1,
    Verbs = 2,
    Inproc = 3,
}

/// The fabric a peer's set-up byte names, in words (an unknown value as it is).
pub(super) fn fabric_name(b: u8) -> String {
    match b {
        1 => "soft".into(),
        2 => "verbs".into(),
        3 => "inproc".into(),
        other => format!("unknown ({other})"),
    }
}

/// Connection parameters from the configuration (read once per connection).
#[derive(Clone, Debug)]
pub struct Params {
    pub kind: FabricKind,
    pub abi: AbiVersion,
    pub qps: [u16; RAILS],
    /// Most pieces a send comm stripes a rail's share of a request over (`MPIB_QP_STRIPE`:
    /// up to 4 of the rail's QPs; 1: none).
    pub pieces: [u8; RAILS],
    /// Transport parameters of a send comm's QPs, per rail (they carry the data).
    pub send: [ConnectParams; RAILS],
    /// Transport parameters of a receive comm's QPs, per rail: the control traffic class
    /// (`MPIB_CTS_TC`), as net_ib gives its receiver's QPs `NCCL_IB_FIFO_TC` (they carry the
    /// CTS, the control writes and keepalives, and the ACKs of the data received).
    pub recv: [ConnectParams; RAILS],
    /// A deadline for the whole set-up from its first call (`MPIB_CONNECT_TIMEOUT_MS`);
    /// `None` (the default): as long as NCCL calls.
    pub timeout: Option<Duration>,
    pub probe_interval_ns: u64,
    pub cfg: &'static Config,
}

impl Params {
    /// For a connection in a communicator of traffic class `comm_tc` (v10 `connect`,
    /// v11+ context).
    pub fn new(cfg: &'static Config, kind: FabricKind, abi: AbiVersion, comm_tc: Option<i32>) -> Params {
        let params = |r: usize, traffic_class: u8| {
            let rc = &cfg.rails[r];
            soft_floor(
                kind,
                ConnectParams {
                    traffic_class,
                    service_level: rc.service_level(comm_tc),
                    timeout: cfg.timeout,
                    retry_cnt: cfg.retry_cnt,
                },
            )
        };
        let rails = &cfg.rails;
        Params {
            kind,
            abi,
            qps: [rails[0].qps as u16, rails[1].qps as u16],
            pieces: [0, 1].map(|r| if rails[r].stripe { rails[r].qps.min(MAX_PIECES as u32) as u8 } else { 1 }),
            send: [0, 1].map(|r| params(r, rails[r].traffic_class(comm_tc))),
            recv: [0, 1].map(|r| params(r, rails[r].cts_traffic_class(comm_tc))),
            timeout: (cfg.connect_timeout_ms > 0).then(|| Duration::from_millis(cfg.connect_timeout_ms)),
            probe_interval_ns: cfg.probe_interval_us * 1000,
            cfg,
        }
    }
}

/// A set-up that has waited this long for its peer says so (INFO), then again after
/// doubling intervals, at most [`WAIT_NOTE_MAX`] apart.
pub const WAIT_NOTE_FIRST: Duration = Duration::from_secs(30);
pub const WAIT_NOTE_MAX: Duration = Duration::from_secs(600);
/// All set-ups' waiting notes together: at most one line a second.
static WAITING: crate::ratelimit::RateLimit = crate::ratelimit::RateLimit::per_second();

/// When a set-up that started at `started` next says it is still waiting, and what.
#[derive(Debug)]
pub(super) struct WaitNote {
    pub(super) started: Instant,
    next: Instant,
    /// The wait before the note after the next one.
    interval: Duration,
}

impl WaitNote {
    pub(super) fn new(started: Instant) -> WaitNote {
        WaitNote { started, next: started + WAIT_NOTE_FIRST, interval: WAIT_NOTE_FIRST }
    }

    /// At `now`: fails the set-up past `deadline`, else logs an INFO line when one is due.
    /// `side` ("connect", "accept") leads the INFO note; the error gets it from the ABI edge.
    pub(super) fn check(
        &mut self,
        now: Instant,
        deadline: Option<Duration>,
        side: &str,
        what: impl Fn() -> String,
    ) -> Result<()> {
        let waited = now.saturating_duration_since(self.started);
        if let Some(t) = deadline
            && waited > t
        {
            return Err(Error::remote(format!("{} within {} ms (MPIB_CONNECT_TIMEOUT_MS)", what(), t.as_millis())));
        }
        if now >= self.next {
            self.interval = self.interval.saturating_mul(2).min(WAIT_NOTE_MAX);
            self.next = now + self.interval;
            if let Some(held) = WAITING.admit(now) {
                log::info!(
                    "{side}: {} yet: still waiting after {:.0?} (a late rank; NCCL keeps calling, \
                     MPIB_CONNECT_TIMEOUT_MS sets a deadline){}",
                    what(),
                    waited,
                    crate::ratelimit::suppressed(held)
                );
            }
        }
        Ok(())
    }
}

/// The shortest ACK-timeout budget the soft fabric is given: 4.096 µs × 2^16 × 7 ≈ 1.9 s.
/// On verbs the budget times the link (a NIC acknowledges whatever its host is doing); on
/// the soft fabric it times the peer *process*, which answers for both rails at once, so a
/// process descheduled or paused for longer than the budget (a loaded host, a long page
/// fault, a checkpoint) would fail both rails together: the connection, not a rail. A
/// smaller MPIB_TIMEOUT (one set for fast verbs failover) is raised to 16 there.
const SOFT_MIN_TIMEOUT: u8 = 16;

/// `p`, with the soft fabric's timeout raised to [`SOFT_MIN_TIMEOUT`] (see there).
fn soft_floor(kind: FabricKind, p: ConnectParams) -> ConnectParams {
    match kind {
        FabricKind::Soft | FabricKind::Inproc => ConnectParams { timeout: p.timeout.max(SOFT_MIN_TIMEOUT), ..p },
        FabricKind::Verbs => p,
    }
}

/// Whether both rails of a connection leave through one port (an odd port out of the
/// pairing carries both): the silent-rail check is off there (`FailoverConfig::silence`).
pub(super) fn one_port<D: Device>(rails: &[Rail<D>; RAILS]) -> bool {
    let (a, b) = (rails[0].dev.attrs(), rails[1].dev.attrs());
    a.name == b.name && a.port == b.port
}

/// The longest a connection takes to report a peer that stops answering without closing
/// (frozen, host down, link cut) while this side waits on it: within `KEEPALIVE_NS` of
/// silence a keepalive (or the data itself) is in flight, and its transport gives up after
/// the ACK-timeout budget `4.096 µs × 2^MPIB_TIMEOUT × (MPIB_RETRY_CNT + 1)` (the soft
/// fabric waits at least 100 ms, and its timeout is at least [`SOFT_MIN_TIMEOUT`]). With the
/// defaults (NCCL's 20, 7) 34.5 s: the time both rails may be silent before their QPs
/// fail; the connection then waits the outage grace (`MPIB_OUTAGE_GRACE_MS`) for a rail
/// to come back, unless the peer's set-up channel closed. A killed peer on the soft fabric is reported at once (its kernel closes the
/// sockets); on verbs only this bound tells (a NIC drops packets for a QP that no longer
/// exists). One silent rail beside a working one is left far sooner (the engine's
/// silent-rail detection).
pub fn silent_peer_bound(p: &ConnectParams) -> Duration {
    let keepalive = Duration::from_nanos(crate::engine::KEEPALIVE_NS);
    keepalive + crate::fabric::soft::silent_peer_bound(p)
}

/// Both rails' telemetry of a new connection, its statistics in `registry`.
pub(super) fn telemetry<D: Device>(
    pair: &NicPair<D>,
    p: &Params,
    registry: &'static Registry,
    rails: &[Rail<D>; RAILS],
) -> [RailTelemetry; RAILS] {
    let [sout, sup] = stats_places(rails);
    let t = |i: usize, place| {
        let cfg = TelemetryConfig::from_config(p.cfg, pair.rails[i].attrs().speed_mbps);
        RailTelemetry::registered(cfg, registry, i, place)
    };
    [t(0, sout), t(1, sup)]
}

enum ConnStage {
    AwaitReply,
    AwaitQps,
    Flushing,
}

/// A send comm being set up.
pub struct Connecting<D: Device> {
    pair: Arc<NicPair<D>>,
    p: Params,
    conn: OobConn,
    stage: ConnStage,
    waited: WaitNote,
    rails: Option<[Rail<D>; RAILS]>,
    region: Option<HostRegion>,
    reply: Option<Reply>,
    /// The communicator's id (its context's), for the connection's place.
    comm_id: u64,
    /// The context's profiler, when NCCL gave one (`profile.rs`).
    profiler: Option<super::profile::Sink>,
    /// What its plugin instance shares (the comm holds an amount of its counts; its
    /// telemetry is in its registry).
    state: &'static super::instance_state::InstanceState,
}

impl<D: Device> Connecting<D> {
    /// Starts a send comm to the listener at `addr`, its QPs on the NICs' queues of `ctx`.
    pub fn start(pair: Arc<NicPair<D>>, p: Params, addr: OobAddr, ctx: &Context<D>) -> Result<Self> {
        // The TCP connect first: its handshake completes while the QPs are made, so the
        // Hello goes out at once below. The acceptor drops a connection that says nothing
        // for HELLO_WITHIN, and NCCL calls `connect` for its other comms in between (each
        // making its own QPs): a Hello left for the next call could miss that deadline.
        let mut conn = OobConn::connect(addr, &ctx.state.inproc)?;
        let region = HostRegion::new(SEND_REGION_BYTES)?;
        let rails = build_rails(ctx, &pair, |r| send_plan(p.qps[r], p.pieces[r], p.cfg.failover), &region)?;
        let (_, rkeys) = region_keys(&rails);
        let hello = Hello {
            kind: p.kind as u8,
            pieces: p.pieces,
            qps: p.qps,
            fifo_addr: region.addr(),
            fifo_rkeys: rkeys,
            scratch_addr: region.addr() + SEND_SCRATCH_OFF as u64,
            qps_info: qp_infos(&rails),
        };
        conn.send(&hello.encode());
        conn.flush()?;
        Ok(Connecting {
            pair,
            p,
            conn,
            stage: ConnStage::AwaitReply,
            waited: WaitNote::new(Instant::now()),
            rails: Some(rails),
            region: Some(region),
            reply: None,
            comm_id: ctx.comm_id,
            profiler: ctx.profiler(),
            state: ctx.state,
        })
    }

    /// One step at `now`; the send comm once the connection is up. A failure is also told
    /// to the acceptor (a Refusal), so both sides report its cause.
    pub fn step(&mut self, now: Instant) -> Result<Option<SendComm<D>>> {
        let r = self.progress(now);
        if let Err(e) = &r {
            refuse(&mut self.conn, e);
        }
        r
    }

    fn progress(&mut self, now: Instant) -> Result<Option<SendComm<D>>> {
        let peer = self.conn.peer();
        self.waited.check(now, self.p.timeout, "connect", || format!("the peer {peer} has not completed set-up"))?;
        let rails = self.rails.as_mut().expect("rails until done");
        loop {
            match self.stage {
                ConnStage::AwaitReply => {
                    let Some(m) = self.conn.poll()? else { return Ok(None) };
                    let reply = match setup_msg::decode(&m)? {
                        Msg::Reply(r) if r.qps == self.p.qps => r,
                        Msg::Reply(r) => {
                            return Err(Error::remote(format!(
                                "the peer created {:?} QPs per rail, {:?} were asked for",
                                r.qps, self.p.qps
                            )));
                        }
                        Msg::Refusal(why) => {
                            return Err(Error::remote(format!("the listening peer refused: {why}")));
                        }
                        _ => return Err(Error::remote("the listening peer sent something else than a Reply")),
                    };
                    connect_qps(rails, &reply.qps_info, &self.p.send)?;
                    self.reply = Some(reply);
                    self.stage = ConnStage::AwaitQps;
                }
                ConnStage::AwaitQps => {
                    self.conn.poll()?;
                    if !all_ready(rails)? {
                        return Ok(None);
                    }
                    self.conn.send(&setup_msg::ready());
                    self.stage = ConnStage::Flushing;
                }
                ConnStage::Flushing => {
                    // Once Ready is handed to the kernel the set-up is done; the channel stays
                    // open for the connection's life (an outage's control messages). An EOF
                    // seen by the read half of this poll is the acceptor gone (failover off:
                    // it keeps no channel), not a failure of this set-up.
                    let r = self.conn.poll();
                    if self.conn.flushed() {
                        return self.finish().map(Some);
                    }
                    r?;
                    return Ok(None);
                }
            }
        }
    }

    fn finish(&mut self) -> Result<SendComm<D>> {
        let rails = self.rails.take().expect("rails");
        let region = self.region.take().expect("region");
        let reply = self.reply.take().expect("reply");
        let (lkeys, _) = region_keys(&rails);
        let max_inline = rails.iter().map(|r| r.dev.attrs().max_inline).min().unwrap_or(0).min(SEND_INLINE);
        // A rail of the soft fabric moves data only when a thread runs (silence floors).
        let on_poll = rails.iter().any(|r| r.dev.attrs().progress == crate::fabric::Progress::OnPoll);
        let cfg = SendConfig {
            qps: self.p.qps,
            pieces: self.p.pieces,
            max_requests: self.p.abi.max_requests() * MAX_RECVS,
            sizes_addr: region.addr() + SEND_SIZES_OFF as u64,
            sizes_lkeys: lkeys,
            records_addr: reply.records_addr,
            records_rkeys: reply.records_rkeys,
            scratch_addr: reply.scratch_addr,
            scratch_rkeys: reply.scratch_rkeys,
            max_inline,
            probe_interval_ns: self.p.probe_interval_ns,
            probe_budgets: self.pair.nics().each_ref().map(|n| n.probe_budget(self.p.cfg.probe_rate)),
            // The fault drill (MPIB_FAULT_RAIL) runs on send comms.
            failover: FailoverConfig {
                drill: self.p.cfg.fault_rail,
                silence: !one_port(&rails) && self.p.cfg.silent_floor_ms(on_poll) != 0,
                silent_floor_ns: self.p.cfg.silent_floor_ms(on_poll) * 1_000_000,
                ..failover_config(
                    self.p.cfg,
                    self.p.qps,
                    region.addr(),
                    SEND_CTL_OFF,
                    lkeys,
                    reply.scratch_addr,
                    reply.scratch_rkeys,
                )
            },
        };
        let split = AnySplit::from_config(self.p.cfg);
        let mut engine = SendEngine::new(
            cfg,
            split,
            telemetry(&self.pair, &self.p, &self.state.stats, &rails),
            super::comm::now_ns(),
        );
        let place = ConnPlace::new("send", self.comm_id, &rails);
        engine.set_place(PlaceRef::new(place.clone()));
        engine.set_hang_report_ns(self.p.cfg.hang_report_ms * 1_000_000);
        log::info!(target: "mpib::plugin::setup", "connected: send comm on {} ({} + {} QPs)",
            self.pair.props.name.to_string_lossy(), self.p.qps[0], self.p.qps[1]);
        // The TCP soft NIC answers its peer only when polled: poll idle rails' CQs too.
        let fo = FoSide::new(self.p.cfg, &rails, place, self.conn.take());
        let mut comm = SendComm::new(rails, engine, self.pair.clone(), region, fo, &self.state.counts);
        comm.set_profiler(self.profiler.take(), self.pair.props.dev);
        Ok(comm)
    }
}

/// Sends a Refusal saying why this side gives up, and hands it to the kernel (best effort:
/// the peer may be gone already).
pub(super) fn refuse(conn: &mut OobConn, e: &Error) {
    conn.send(&setup_msg::refusal(&e.msg()));
    let _ = conn.poll();
}

#[cfg(test)]
#[path = "setup_tests.rs"]
mod tests;
