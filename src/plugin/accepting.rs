//! The acceptor's side of connection set-up (`setup.rs` has the protocol and the
//! connector): a receive comm made on a connection the listener took, from the peer's Hello
//! to its Ready.

use std::sync::Arc;
use std::time::{Duration, Instant};

use super::comm::RecvComm;
use super::context::Context;
use super::failover::{FoSide, failover_config};
use super::nic_pair::NicPair;
use super::oob::OobConn;
use super::place::{ConnPlace, stats_places};
use super::rail::{FlushQp, RECV_INLINE, Rail, all_ready, build_rails, connect_qps, qp_infos, recv_plan, region_keys};
use super::region::{RECV_CTL_OFF, RECV_FLUSH_OFF, RECV_RECORDS_OFF, RECV_REGION_BYTES, RECV_SCRATCH_OFF};
use super::setup::{Params, WaitNote, fabric_name, refuse};
use super::setup_msg::{self, DecodeError, Hello, Msg, Reply};
use crate::engine::{PlaceRef, RAILS, RailMask, RecvConfig, RecvEngine};
use crate::error::{Error, Result};
use crate::fabric::Device;
use crate::fabric::mem::HostRegion;

/// How long a new set-up connection has to send its Hello (at most
/// `MPIB_CONNECT_TIMEOUT_MS`). A real connector sends it once its TCP connect completed and
/// its QPs are made, and whatever it sent is read before this deadline is checked. Not
/// short: a stranger that says nothing costs only a pending slot (the listener keeps up to
/// `MAX_PENDING` and makes room by dropping the oldest silent one), while a deadline a real
/// peer can miss fails its `connect` (5 s did: 64 connects on one communicator, Soft-RoCE
/// under qemu on a busy host, each making its QPs before the next).
pub const HELLO_WITHIN: Duration = Duration::from_secs(30);

/// Why a pending set-up ended without a receive comm.
#[derive(Debug)]
pub enum AcceptFailed {
    /// Not an mpib peer (closed, reset, garbage, an oversized length, anything but a
    /// Hello first): the listener drops it; the words say why.
    Stray(String),
    /// Not an mpib peer: it sent nothing within [`HELLO_WITHIN`].
    Silent(String),
    /// An mpib peer's set-up failed (another version or fabric, or anything after its
    /// Hello): NCCL's `accept` fails with this error; the peer was told why.
    Peer(Error),
}

enum AcceptStage {
    AwaitHello { by: Instant },
    AwaitReady { got_ready: bool },
}

/// A receive comm being set up on an accepted connection.
pub struct Accepting<D: Device> {
    pair: Arc<NicPair<D>>,
    /// The listening communicator's context: the receive comm's queues.
    ctx: Arc<Context<D>>,
    p: Params,
    conn: OobConn,
    stage: AcceptStage,
    /// Since the Hello arrived: the waiting notes and the deadline (if any) count from there.
    waited: WaitNote,
    rails: Option<[Rail<D>; RAILS]>,
    region: Option<HostRegion>,
    hello: Option<Hello>,
}

impl<D: Device> Accepting<D> {
    /// A connection the listener took at `now`.
    pub fn new(pair: Arc<NicPair<D>>, ctx: Arc<Context<D>>, p: Params, conn: OobConn, now: Instant) -> Self {
        let by = now + p.timeout.map_or(HELLO_WITHIN, |t| HELLO_WITHIN.min(t));
        Accepting {
            pair,
            ctx,
            p,
            conn,
            stage: AcceptStage::AwaitHello { by },
            waited: WaitNote::new(now),
            rails: None,
            region: None,
            hello: None,
        }
    }

    /// Whether the other end has shown itself an mpib peer (its Hello came).
    pub fn is_peer(&self) -> bool {
        matches!(self.stage, AcceptStage::AwaitReady { .. })
    }

    /// Where the other end is (for log lines).
    pub fn peer(&self) -> String {
        self.conn.peer()
    }

    /// One step at `now`: the receive comm once the connection is fully set up.
    pub fn step(&mut self, now: Instant) -> std::result::Result<Option<RecvComm<D>>, AcceptFailed> {
        if let AcceptStage::AwaitHello { by } = self.stage {
            let Some(hello) = self.hello(now, by)? else { return Ok(None) };
            self.waited = WaitNote::new(now);
            if let Err(e) = self.on_hello(hello) {
                refuse(&mut self.conn, &e);
                return Err(AcceptFailed::Peer(e));
            }
        }
        self.await_ready(now).map_err(|e| {
            refuse(&mut self.conn, &e);
            AcceptFailed::Peer(e)
        })
    }

    /// The Hello, once it is in. Anything else first makes the connection a stray, except
    /// an mpib peer of another version or fabric: a failed set-up, told why.
    fn hello(&mut self, now: Instant, by: Instant) -> std::result::Result<Option<Hello>, AcceptFailed> {
        let m = match self.conn.poll() {
            Ok(Some(m)) => m,
            Ok(None) if now > by => {
                let ms = by.saturating_duration_since(self.waited.started).as_millis();
                return Err(AcceptFailed::Silent(format!(
                    "{} sent no set-up message within {ms} ms",
                    self.conn.peer()
                )));
            }
            Ok(None) => return Ok(None),
            Err(e) => return Err(AcceptFailed::Stray(e.msg().into_owned())),
        };
        let e = match setup_msg::decode(&m) {
            Ok(Msg::Hello(h)) if h.kind == self.p.kind as u8 => return Ok(Some(h)),
            Ok(Msg::Hello(h)) => Error::remote(format!(
                "the connecting peer uses the {} fabric and this side the {} fabric: set the same MPIB_FABRIC on \
                 every rank",
                fabric_name(h.kind),
                fabric_name(self.p.kind as u8)
            )),
            Ok(_) => {
                return Err(AcceptFailed::Stray(format!(
                    "{} sent a set-up message other than a Hello",
                    self.conn.peer()
                )));
            }
            Err(DecodeError::Foreign(why)) => return Err(AcceptFailed::Stray(format!("{} {why}", self.conn.peer()))),
            Err(v @ DecodeError::Version(_)) => Error::from(v),
        };
        refuse(&mut self.conn, &e);
        Err(AcceptFailed::Peer(e))
    }

    /// Builds the rails for the peer's `hello`, connects them and replies.
    fn on_hello(&mut self, hello: Hello) -> Result<()> {
        let region = HostRegion::new(RECV_REGION_BYTES)?;
        let flush = FlushQp::for_memory(self.pair.props.mem_types);
        let window = self.p.abi.max_requests() as u32;
        // Each piece of a striped rail share takes a receive of the rail's SRQ.
        let plan = |r: usize| recv_plan(hello.qps[r], flush, window * hello.pieces[r] as u32, self.p.cfg.failover);
        let mut rails = build_rails(&self.ctx, &self.pair, plan, &region)?;
        connect_qps(&mut rails, &hello.qps_info, &self.p.recv)?;
        let (_, rkeys) = region_keys(&rails);
        let reply = Reply {
            qps: hello.qps,
            records_addr: region.addr() + RECV_RECORDS_OFF as u64,
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
        Ok(())
    }

    fn await_ready(&mut self, now: Instant) -> Result<Option<RecvComm<D>>> {
        let peer = self.conn.peer();
        self.waited.check(now, self.p.timeout, "accept", || format!("the peer {peer} has not completed set-up"))?;
        let AcceptStage::AwaitReady { mut got_ready } = self.stage else {
            return Err(Error::internal("set-up stepped before its Hello"));
        };
        // Once Ready is read the set-up channel has done its job: the connector closes it as
        // soon as Ready left (it is connected then), so it is not read again. Reading it
        // while this side's QPs were still coming up took that EOF for a failed set-up
        // (many_connections under load: "peer closed the set-up connection").
        if !got_ready && let Some(m) = self.conn.poll()? {
            match setup_msg::decode(&m)? {
                Msg::Ready => got_ready = true,
                Msg::Refusal(why) => return Err(Error::remote(format!("the connecting peer gave up: {why}"))),
                _ => return Err(Error::remote("the peer sent something else than Ready")),
            }
        }
        self.stage = AcceptStage::AwaitReady { got_ready };
        // Drive the QPs on every call, not only once Ready arrived: a fabric may finish its
        // connection set-up inside `is_ready` on both ends (the soft fabric's dialing QP
        // sends its HELLO from there), and the peer only says Ready when its own QPs are up.
        let ready = all_ready(self.rails.as_mut().expect("rails"))?;
        if !got_ready || !ready {
            return Ok(None);
        }
        self.finish().map(Some)
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
            pieces: hello.pieces,
            cts_addr: region.addr(),
            cts_lkeys: lkeys,
            fifo_addr: hello.fifo_addr,
            fifo_rkeys: hello.fifo_rkeys,
            max_inline,
            flush_addr: region.addr() + RECV_FLUSH_OFF as u64,
            flush_lkeys: lkeys,
            scratch_addr: hello.scratch_addr,
            scratch_rkeys: hello.fifo_rkeys,
            failover: failover_config(
                self.p.cfg,
                hello.qps,
                region.addr(),
                RECV_CTL_OFF,
                lkeys,
                hello.scratch_addr,
                hello.fifo_rkeys,
            ),
        };
        log::info!(target: "mpib::plugin::setup", "accepted: receive comm on {} ({} + {} QPs)",
            self.pair.props.name.to_string_lossy(), hello.qps[0], hello.qps[1]);
        let [sout, sup] = stats_places(&rails);
        let stats = [self.ctx.state.stats.register_at(0, sout), self.ctx.state.stats.register_at(1, sup)];
        let mut engine = RecvEngine::new(cfg, stats);
        let place = ConnPlace::new("recv", self.ctx.comm_id, &rails);
        engine.set_place(PlaceRef::new(place.clone()));
        engine.set_hang_report_ns(self.p.cfg.hang_report_ms * 1_000_000);
        let fo = FoSide::new(self.p.cfg, &rails, place, self.conn.take());
        let mut comm = RecvComm::new(rails, engine, self.pair.clone(), region, fo, &self.ctx.state.counts);
        comm.set_profiler(self.ctx.profiler(), self.pair.props.dev);
        Ok(comm)
    }
}
