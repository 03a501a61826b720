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
//! Ready, so no WRITE ever finds an unconnected QP. Every stage is bounded by
//! `MPIB_CONNECT_TIMEOUT_MS` once the peer has shown up.
//!
//! The QPs are made on the shared queues of each rail's NIC in the connection's context
//! (`context.rs`, `nic.rs`), with send queues as deep as what can be outstanding on them:
//!
//! - a sender's data QP: each rail carries at most one chain per CTS slot in flight (a slot
//!   is taken again only once its chains completed), chains of at most `MAX_CHAIN` WRs, one
//!   request per QP round-robin: `ceil(SLOTS / QPs) × MAX_CHAIN`, plus one probe (or
//!   keepalive) at a time;
//! - a receiver's CTS QP (its first): the CTS WRITEs of the slots since the last signalled
//!   one of its rail (signalled when `slot == rail`, once per `SLOTS` slots; a slot is reused
//!   only after its CTS completed): at most `2 × SLOTS`, plus one keepalive; its other QPs
//!   post nothing; a flush QP: one READ per flush in flight.
//!
//! Every depth is clamped to the device's `max_qp_wr`.

use std::sync::Arc;
use std::time::{Duration, Instant};

use super::comm::{
    RECV_FLUSH_OFF, RECV_SCRATCH_OFF, Rail, RecvComm, SCRATCH_BYTES, SEND_SCRATCH_OFF, SEND_SIZES_OFF, SendComm,
};
use super::context::Context;
use super::devices::DevPair;
use super::inbox::Inbox;
use super::mr::ACCESS;
use super::nic::{QpSpec, new_owner};
use super::oob::{OobAddr, OobConn, OobListener};
use super::resources::{Held, Res};
use super::wire::{Hello, READY, Reply};
use super::{AbiVersion, MAX_RECVS};
use crate::config::Config;
use crate::engine::layout::SLOTS;
use crate::engine::{MAX_CHAIN, MAX_FLUSHES, RAILS, RailMask, RecvConfig, RecvEngine, SendConfig, SendEngine};
use crate::error::{Error, Result};
use crate::fabric::mem::HostRegion;
use crate::fabric::{ConnectParams, Device, MemTypes, QpCaps, QpInfo, QueuePair};
use crate::split::AnySplit;
use crate::telemetry::{RailTelemetry, StatsHandle, TelemetryConfig};

const HANDLE_MAGIC: [u8; 4] = *b"MPIB";
const HANDLE_VERSION: u8 = 1;
/// Where `connect` keeps its progress token inside NCCL's handle buffer.
const TOKEN_OFF: usize = 120;

/// What the fabric is, written into handles and Hello so mismatched peers fail clearly.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum FabricKind {
    Soft = 1,
    Verbs = 2,
    Inproc = 3,
}

/// Connection parameters from the configuration (read once per connection).
#[derive(Clone, Debug)]
pub struct Params {
    pub kind: FabricKind,
    pub abi: AbiVersion,
    pub qps: [u16; RAILS],
    pub connect: ConnectParams,
    pub timeout: Duration,
    pub probe_interval_ns: u64,
    pub cfg: &'static Config,
}

impl Params {
    pub fn new(cfg: &'static Config, kind: FabricKind, abi: AbiVersion, comm_tc: Option<i32>) -> Params {
        let tc = cfg.tc.or_else(|| comm_tc.filter(|t| (0..=255).contains(t)).map(|t| t as u8)).unwrap_or(0);
        Params {
            kind,
            abi,
            qps: [cfg.sout_qps as u16, cfg.sup_qps as u16],
            connect: ConnectParams {
                traffic_class: tc,
                service_level: cfg.sl.unwrap_or(0),
                timeout: cfg.timeout,
                retry_cnt: cfg.retry_cnt,
            },
            timeout: Duration::from_millis(cfg.connect_timeout_ms),
            probe_interval_ns: cfg.probe_interval_us * 1000,
            cfg,
        }
    }
}

/// Writes a listen handle.
pub fn write_handle(handle: &mut [u8; 128], kind: FabricKind, addr: OobAddr) {
    handle.fill(0);
    handle[..4].copy_from_slice(&HANDLE_MAGIC);
    handle[4] = HANDLE_VERSION;
    handle[5] = kind as u8;
    let mut a = [0u8; 19];
    addr.write(&mut a);
    handle[8..27].copy_from_slice(&a);
}

/// Reads a listen handle written by [`write_handle`] (of a peer with the same fabric).
pub fn read_handle(handle: &[u8; 128], kind: FabricKind) -> Result<OobAddr> {
    if handle[..4] != HANDLE_MAGIC {
        return Err(Error::invalid_argument("the connect handle was not written by mpib's listen (bad magic)"));
    }
    if handle[4] != HANDLE_VERSION {
        return Err(Error::invalid_argument(format!(
            "the connect handle is version {}, this plugin speaks {HANDLE_VERSION}",
            handle[4]
        )));
    }
    if handle[5] != kind as u8 {
        return Err(Error::invalid_argument(format!(
            "the listener uses fabric {} and this side {kind:?}: set the same MPIB_FABRIC on every rank",
            handle[5]
        )));
    }
    OobAddr::read(handle[8..27].try_into().expect("19 bytes"))
}

/// The token `connect` left in NCCL's handle buffer (0 = first call).
pub fn handle_token(handle: &[u8; 128]) -> u64 {
    u64::from_le_bytes(handle[TOKEN_OFF..].try_into().expect("8 bytes"))
}

pub fn set_handle_token(handle: &mut [u8; 128], token: u64) {
    handle[TOKEN_OFF..].copy_from_slice(&token.to_le_bytes());
}

/// Inline bytes of a sender's QPs (probes; small sends from host memory) and of a
/// receiver's (a CTS of up to 8 entries).
const SEND_INLINE: u32 = 64;
const RECV_INLINE: u32 = (MAX_RECVS * crate::engine::layout::CTS_ENTRY_BYTES) as u32;

/// Send-queue depth of each of a sender's `nqps` data QPs on a rail (see the module doc).
pub fn send_qp_depth(nqps: u16) -> u32 {
    (SLOTS.div_ceil(nqps.max(1) as usize) * MAX_CHAIN + 1) as u32
}

/// Send-queue depth of a receiver's CTS QP (see the module doc).
pub const CTS_QP_DEPTH: u32 = 2 * SLOTS as u32 + 1;
/// Send-queue depth of a flush QP: a READ per flush in flight.
pub const FLUSH_QP_DEPTH: u32 = MAX_FLUSHES as u32;

fn clamp_caps<D: Device>(dev: &D, caps: QpCaps) -> QpCaps {
    let a = dev.attrs();
    QpCaps { max_send_wr: caps.max_send_wr.min(a.max_qp_wr.max(1)), max_inline: caps.max_inline.min(a.max_inline) }
}

/// Whether a connection's rails get a loopback flush QP each (a receiver of GPU memory:
/// `iflush` READs through it).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum FlushQp {
    With,
    Without,
}

/// What one rail of a connection needs: its QPs (the last one the flush QP, if any), and
/// the receive window (SRQ WQEs its receives may consume at most).
struct RailPlan {
    qps: Vec<QpSpec>,
    flush: FlushQp,
    window: u32,
}

/// A sender's rail: `nqps` data QPs.
fn send_plan(nqps: u16) -> RailPlan {
    let caps = QpCaps { max_send_wr: send_qp_depth(nqps), max_inline: SEND_INLINE };
    RailPlan { qps: vec![QpSpec { caps, srq: false }; nqps as usize], flush: FlushQp::Without, window: 0 }
}

/// A receiver's rail: the CTS QP, `nqps - 1` more that only receive, the flush QP if asked,
/// and `window` receives in flight.
fn recv_plan(nqps: u16, flush: FlushQp, window: u32) -> RailPlan {
    let mut qps = vec![QpSpec { caps: QpCaps { max_send_wr: CTS_QP_DEPTH, max_inline: RECV_INLINE }, srq: true }];
    qps.extend((1..nqps).map(|_| QpSpec { caps: QpCaps { max_send_wr: 1, max_inline: 0 }, srq: true }));
    if flush == FlushQp::With {
        qps.push(QpSpec { caps: QpCaps { max_send_wr: FLUSH_QP_DEPTH, max_inline: 0 }, srq: false });
    }
    RailPlan { qps, flush, window }
}

/// Registers `region` on rail `rail`'s NIC and attaches `plan`'s QPs to the NIC's shared
/// queues in `ctx`, for connection `owner`.
fn build_rail<D: Device>(
    ctx: &Context<D>,
    dev: &Arc<D>,
    rail: usize,
    owner: u64,
    plan: RailPlan,
    region: &HostRegion,
) -> Result<Rail<D>> {
    let nic = ctx.queues(dev)?;
    let specs: Vec<QpSpec> = plan.qps.iter().map(|q| QpSpec { caps: clamp_caps(dev.as_ref(), q.caps), ..*q }).collect();
    let sq: u64 = specs.iter().map(|q| q.caps.max_send_wr as u64).sum();
    // Everything that can complete for this rail: each send-queue WR, each receive.
    let inbox = Arc::new(Inbox::new(sq as usize + plan.window as usize));
    let region_mr = dev.reg_mr(region.as_mut_ptr(), region.len(), ACCESS)?;
    let mut qps = match nic.attach(owner, rail, &inbox, &specs, plan.window) {
        Ok(q) => q,
        Err(e) => {
            let _ = dev.dereg_mr(region_mr);
            return Err(e);
        }
    };
    let flush_qp = if plan.flush == FlushQp::With { qps.pop() } else { None };
    let first_qp = qps.first().map_or(0, |q| q.qp_num());
    let held = vec![
        Held::new(Res::Qps, specs.len() as u64),
        Held::new(Res::QpSendWrs, sq),
        Held::new(Res::ControlBytes, region.len() as u64),
        Held::new(Res::InboxEntries, inbox.capacity() as u64),
    ];
    Ok(Rail {
        qps,
        flush_qp,
        region_mr: Some(region_mr),
        nic,
        inbox,
        owner,
        first_qp,
        sq,
        window: plan.window,
        dev: dev.clone(),
        held,
    })
}

fn build_rails<D: Device>(
    ctx: &Context<D>,
    pair: &DevPair<D>,
    plan: impl Fn(usize) -> RailPlan,
    region: &HostRegion,
) -> Result<[Rail<D>; RAILS]> {
    let owner = new_owner();
    let r0 = build_rail(ctx, &pair.rails[0], 0, owner, plan(0), region)?;
    let r1 = build_rail(ctx, &pair.rails[1], 1, owner, plan(1), region)?;
    Ok([r0, r1])
}

fn region_keys<D: Device>(rails: &[Rail<D>; RAILS]) -> ([u32; RAILS], [u32; RAILS]) {
    let k = |r: &Rail<D>| D::mr_keys(r.region_mr.as_ref().expect("registered"));
    ([k(&rails[0]).lkey, k(&rails[1]).lkey], [k(&rails[0]).rkey, k(&rails[1]).rkey])
}

fn qp_infos<D: Device>(rails: &[Rail<D>; RAILS]) -> Vec<QpInfo> {
    rails.iter().flat_map(|r| r.qps.iter().map(|q| q.local_info())).collect()
}

fn connect_qps<D: Device>(rails: &mut [Rail<D>; RAILS], infos: &[QpInfo], p: &ConnectParams) -> Result<()> {
    let mut it = infos.iter();
    for r in rails.iter_mut() {
        for q in r.qps.iter_mut() {
            q.connect(it.next().ok_or_else(|| Error::remote("peer sent too few QP infos"))?, p)?;
        }
        if let Some(f) = r.flush_qp.as_mut() {
            let me = f.local_info();
            f.connect(&me, p)?;
        }
    }
    Ok(())
}

fn all_ready<D: Device>(rails: &mut [Rail<D>; RAILS]) -> Result<bool> {
    for r in rails.iter_mut() {
        for q in r.qps.iter_mut().chain(r.flush_qp.as_mut()) {
            if !q.is_ready()? {
                return Ok(false);
            }
        }
    }
    Ok(true)
}

fn telemetry<D: Device>(pair: &DevPair<D>, p: &Params) -> [RailTelemetry; RAILS] {
    let t =
        |i: usize| RailTelemetry::registered(TelemetryConfig::from_config(p.cfg, pair.rails[i].attrs().speed_mbps), i);
    [t(0), t(1)]
}

enum ConnStage {
    AwaitReply,
    AwaitQps,
    Flushing,
}

/// A send comm being set up.
pub struct Connecting<D: Device> {
    pair: Arc<DevPair<D>>,
    p: Params,
    conn: OobConn,
    stage: ConnStage,
    started: Instant,
    rails: Option<[Rail<D>; RAILS]>,
    region: Option<HostRegion>,
    reply: Option<Reply>,
}

impl<D: Device> Connecting<D> {
    /// Starts a send comm to the listener at `addr`, its QPs on the NICs' queues of `ctx`.
    pub fn start(pair: Arc<DevPair<D>>, p: Params, addr: OobAddr, ctx: &Context<D>) -> Result<Self> {
        let region = HostRegion::new(SEND_SCRATCH_OFF + SCRATCH_BYTES)?;
        let rails = build_rails(ctx, &pair, |r| send_plan(p.qps[r]), &region)?;
        let (_, rkeys) = region_keys(&rails);
        let mut conn = OobConn::connect(addr)?;
        let hello = Hello {
            kind: p.kind as u8,
            qps: p.qps,
            fifo_addr: region.addr(),
            fifo_rkeys: rkeys,
            scratch_addr: region.addr() + SEND_SCRATCH_OFF as u64,
            qps_info: qp_infos(&rails),
        };
        conn.send(&hello.encode());
        Ok(Connecting {
            pair,
            p,
            conn,
            stage: ConnStage::AwaitReply,
            started: Instant::now(),
            rails: Some(rails),
            region: Some(region),
            reply: None,
        })
    }

    /// One step; the send comm once the connection is up.
    pub fn step(&mut self) -> Result<Option<SendComm<D>>> {
        if self.started.elapsed() > self.p.timeout {
            return Err(Error::remote(format!(
                "connect: the peer did not complete set-up within {} ms (MPIB_CONNECT_TIMEOUT_MS)",
                self.p.timeout.as_millis()
            )));
        }
        let rails = self.rails.as_mut().expect("rails until done");
        loop {
            match self.stage {
                ConnStage::AwaitReply => {
                    let Some(m) = self.conn.poll()? else { return Ok(None) };
                    let reply = Reply::decode(&m, self.p.qps)?;
                    connect_qps(rails, &reply.qps_info, &self.p.connect)?;
                    self.reply = Some(reply);
                    self.stage = ConnStage::AwaitQps;
                }
                ConnStage::AwaitQps => {
                    self.conn.poll()?;
                    if !all_ready(rails)? {
                        return Ok(None);
                    }
                    self.conn.send(&READY);
                    self.stage = ConnStage::Flushing;
                }
                ConnStage::Flushing => {
                    // Once Ready is handed to the kernel the set-up channel has done its job,
                    // and the acceptor closes it as soon as it has read Ready: an EOF seen by
                    // the read half of this poll is that close, not a failure.
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
        let cfg = SendConfig {
            qps: self.p.qps,
            max_requests: self.p.abi.max_requests() * MAX_RECVS,
            sizes_addr: region.addr() + SEND_SIZES_OFF as u64,
            sizes_lkeys: lkeys,
            records_addr: reply.records_addr,
            records_rkeys: reply.records_rkeys,
            scratch_addr: reply.scratch_addr,
            scratch_rkeys: reply.scratch_rkeys,
            max_inline,
            probe_interval_ns: self.p.probe_interval_ns,
        };
        let engine = SendEngine::new(cfg, AnySplit::from_config(self.p.cfg), telemetry(&self.pair, &self.p));
        log::info!(target: "mpib::plugin::setup", "connected: send comm on {} ({} + {} QPs)",
            self.pair.props.name.to_string_lossy(), self.p.qps[0], self.p.qps[1]);
        // The TCP soft NIC answers its peer only when polled: poll idle rails' CQs too.
        Ok(SendComm::new(rails, engine, self.pair.clone(), region))
    }
}

enum AcceptStage {
    AwaitHello,
    AwaitReady { got_ready: bool },
}

/// A receive comm being set up on an accepted connection.
pub struct Accepting<D: Device> {
    pair: Arc<DevPair<D>>,
    ctx: Arc<Context<D>>,
    p: Params,
    conn: OobConn,
    stage: AcceptStage,
    started: Instant,
    rails: Option<[Rail<D>; RAILS]>,
    region: Option<HostRegion>,
    hello: Option<Hello>,
}

impl<D: Device> Accepting<D> {
    pub fn new(pair: Arc<DevPair<D>>, ctx: Arc<Context<D>>, p: Params, conn: OobConn) -> Self {
        Accepting {
            pair,
            ctx,
            p,
            conn,
            stage: AcceptStage::AwaitHello,
            started: Instant::now(),
            rails: None,
            region: None,
            hello: None,
        }
    }

    pub fn step(&mut self) -> Result<Option<RecvComm<D>>> {
        if self.started.elapsed() > self.p.timeout {
            return Err(Error::remote(format!(
                "accept: the peer did not complete set-up within {} ms (MPIB_CONNECT_TIMEOUT_MS)",
                self.p.timeout.as_millis()
            )));
        }
        loop {
            match self.stage {
                AcceptStage::AwaitHello => {
                    let Some(m) = self.conn.poll()? else { return Ok(None) };
                    let hello = Hello::decode(&m, self.p.kind as u8)?;
                    let region = HostRegion::new(RECV_SCRATCH_OFF + SCRATCH_BYTES)?;
                    let gpu = self.pair.props.mem_types.contains(MemTypes::CUDA);
                    let flush = if gpu { FlushQp::With } else { FlushQp::Without };
                    let window = self.p.abi.max_requests() as u32;
                    let plan = |r: usize| recv_plan(hello.qps[r], flush, window);
                    let mut rails = build_rails(&self.ctx, &self.pair, plan, &region)?;
                    connect_qps(&mut rails, &hello.qps_info, &self.p.connect)?;
                    let (_, rkeys) = region_keys(&rails);
                    let reply = Reply {
                        qps: hello.qps,
                        records_addr: region.addr() + super::comm::RECV_RECORDS_OFF as u64,
                        records_rkeys: rkeys,
                        scratch_addr: region.addr() + RECV_SCRATCH_OFF as u64,
                        scratch_rkeys: rkeys,
                        qps_info: qp_infos(&rails),
                    };
                    self.conn.send(&reply.encode());
                    self.rails = Some(rails);
                    self.region = Some(region);
                    self.hello = Some(hello);
                    self.stage = AcceptStage::AwaitReady { got_ready: false };
                }
                AcceptStage::AwaitReady { got_ready } => {
                    let mut got = got_ready;
                    if let Some(m) = self.conn.poll()? {
                        if m != READY {
                            return Err(Error::remote("accept: the peer sent something else than Ready"));
                        }
                        got = true;
                    }
                    self.stage = AcceptStage::AwaitReady { got_ready: got };
                    // Drive the QPs on every call, not only once Ready arrived: a fabric may
                    // finish its connection set-up inside `is_ready` on both ends (the soft
                    // fabric's dialing QP sends its HELLO from there), and the peer only
                    // says Ready when its own QPs are up.
                    let ready = all_ready(self.rails.as_mut().expect("rails"))?;
                    if !got || !ready {
                        return Ok(None);
                    }
                    return self.finish().map(Some);
                }
            }
        }
    }

    fn finish(&mut self) -> Result<RecvComm<D>> {
        let rails = self.rails.take().expect("rails");
        let region = self.region.take().expect("region");
        let hello = self.hello.take().expect("hello");
        let (lkeys, _) = region_keys(&rails);
        let max_inline = rails.iter().map(|r| r.dev.attrs().max_inline).min().unwrap_or(0).min(RECV_INLINE);
        let cfg = RecvConfig {
            max_requests: self.p.abi.max_requests(),
            rails_mask: RailMask::BOTH,
            cts_addr: region.addr(),
            cts_lkeys: lkeys,
            fifo_addr: hello.fifo_addr,
            fifo_rkeys: hello.fifo_rkeys,
            max_inline,
            flush_addr: region.addr() + RECV_FLUSH_OFF as u64,
            flush_lkeys: lkeys,
            scratch_addr: hello.scratch_addr,
            scratch_rkeys: hello.fifo_rkeys,
        };
        log::info!(target: "mpib::plugin::setup", "accepted: receive comm on {} ({} + {} QPs)",
            self.pair.props.name.to_string_lossy(), hello.qps[0], hello.qps[1]);
        let stats = [StatsHandle::register(0), StatsHandle::register(1)];
        Ok(RecvComm::new(rails, RecvEngine::new(cfg, stats), self.pair.clone(), region))
    }
}

/// A listen comm: its listener and at most one connection being accepted.
pub struct ListenComm<D: Device> {
    pub listener: OobListener,
    pub pair: Arc<DevPair<D>>,
    /// The context of the communicator that listens: its receive comms' queues.
    pub ctx: Arc<Context<D>>,
    pub p: Params,
    pub pending: Option<Accepting<D>>,
    pub held: Held,
}

impl<D: Device> ListenComm<D> {
    /// One step of `accept`: the receive comm once a connection is fully set up.
    pub fn accept(&mut self) -> Result<Option<RecvComm<D>>> {
        if self.pending.is_none() {
            match self.listener.accept()? {
                Some(conn) => {
                    self.pending = Some(Accepting::new(self.pair.clone(), self.ctx.clone(), self.p.clone(), conn))
                }
                None => return Ok(None),
            }
        }
        let r = self.pending.as_mut().expect("pending").step();
        match r {
            Ok(Some(c)) => {
                self.pending = None;
                Ok(Some(c))
            }
            Ok(None) => Ok(None),
            Err(e) => {
                self.pending = None;
                Err(e)
            }
        }
    }
}
