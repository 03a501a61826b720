//! A connection's rails: the QPs of each rail, made on the shared queues of the rail's NIC
//! in the connection's context (`context.rs`, `nic_queues.rs`), and the registration of its
//! control region, with send queues as deep as what can be outstanding on them:
//!
//! - a sender's data QP: each rail carries at most one chain per CTS slot in flight (a slot
//!   is taken again only once its chains completed), chains of at most `MAX_CHAIN` WRs, one
//!   request per QP round-robin: `ceil(SLOTS / QPs) × MAX_CHAIN`, plus one probe (or
//!   keepalive) at a time; striped (`MPIB_QP_STRIPE`), a slot's pieces go on distinct QPs,
//!   so a QP may hold one chain of every slot: `SLOTS × MAX_CHAIN`;
//! - a receiver's CTS QP (its first): every `CTS_SIGNAL_EVERY`-th CTS WRITE of a rail is
//!   signalled, and a slot is reused only after its signalled CTS completed, so the queue
//!   holds at most the unsignalled ones before the oldest signalled one still outstanding
//!   (`CTS_SIGNAL_EVERY - 1`), that one, and the CTS of the other slots posted after it
//!   (`SLOTS - 1`, whichever rail each takes: they follow the data, `engine/recv/mod.rs`), plus
//!   one keepalive; its other QPs post nothing; a flush QP: one READ per flush in flight.
//!
//! With rail failover on, the surviving rail also carries what the failed one owed: a
//! sender's data QPs the replays (the engine posts a slot's replay only once the slot's own
//! chain on that rail completed, so a slot still has one chain per rail at a time) and its
//! first QP the control writes: [`CTL_MAX_UNACKED`] more; a receiver's CTS QP also the
//! re-posted CTS (those the failed rail carried of the receives still waiting: at most
//! `SLOTS`, as the CTS follow the data) and the control writes.
//!
//! Every depth is clamped to the device's `max_qp_wr`.

use std::sync::Arc;

use super::MAX_RECVS;
use super::context::Context;
use super::inbox::Inbox;
use super::mr::CONTROL_ACCESS;
use super::nic_pair::NicPair;
use super::nic_queues::{NicQueues, QpSpec};
use super::resources::{Held, Res};
use crate::engine::CTS_SIGNAL_EVERY;
use crate::engine::failover::CTL_MAX_UNACKED;
use crate::engine::layout::SLOTS;
use crate::engine::{MAX_CHAIN, MAX_FLUSHES, QpRef, RAILS, cold};
use crate::error::{Error, Result};
use crate::fabric::mem::HostRegion;
use crate::fabric::{ConnectParams, Device, MemTypes, QpCaps, QpInfo, QueuePair};

/// One rail of a connection: its QPs on the rail's NIC (whose shared queues it holds), the
/// registration of its control region there, and its inbox on that NIC.
pub struct Rail<D: Device> {
    pub qps: Vec<D::Qp>,
    pub flush_qp: Option<D::Qp>,
    /// The comm's control region registered on this rail.
    pub region_mr: Option<D::Mr>,
    pub nic: Arc<NicQueues<D>>,
    pub inbox: Arc<Inbox>,
    /// The connection's identity in the NIC's routes, and its first QP's number (the one
    /// polls tell apart without a route lookup).
    pub owner: u64,
    pub first_qp: u32,
    /// What `NicQueues::attach` was given: the QPs' send-queue depths, the receive window.
    pub sq: u64,
    pub window: u32,
    pub dev: Arc<D>,
    /// What this rail holds, for `mpib_resource_stats`.
    pub held: Vec<Held>,
    /// Re-admission (`plugin/readmit.rs`): what the QPs were made with (the flush QP's
    /// last), the peer's QP infos and the transport parameters they were connected with.
    pub specs: Vec<QpSpec>,
    pub peer: Vec<QpInfo>,
    pub connect: Option<ConnectParams>,
}

impl<D: Device> Rail<D> {
    #[inline]
    pub(super) fn qp(&mut self, q: QpRef) -> Result<&mut D::Qp> {
        let qp = match q {
            QpRef::Cts => self.qps.first_mut(),
            QpRef::Data(i) => self.qps.get_mut(i as usize),
            QpRef::Flush => self.flush_qp.as_mut(),
        };
        qp.ok_or_else(|| cold(|| Error::internal(format!("the engine chose {q:?}, which this rail does not have"))))
    }

    /// Tears the rail down: the QPs drained off the shared CQ and destroyed (`NicQueues::
    /// detach`), then the region's registration. Runs once.
    pub(super) fn shutdown(&mut self) {
        if self.held.is_empty() {
            return;
        }
        let mut qps = std::mem::take(&mut self.qps);
        qps.extend(self.flush_qp.take());
        self.nic.detach(self.owner, qps, self.sq, self.window);
        if let Some(mr) = self.region_mr.take()
            && let Err(e) = self.dev.dereg_mr(mr)
        {
            log::warn!("deregistering a connection's control region: {e}");
        }
        self.held.clear();
    }
}

impl<D: Device> Drop for Rail<D> {
    fn drop(&mut self) {
        self.shutdown();
    }
}

/// Inline bytes of a sender's QPs (probes; small sends from host memory) and of a
/// receiver's (a CTS of up to 8 entries).
pub(super) const SEND_INLINE: u32 = 64;
pub(super) const RECV_INLINE: u32 = (MAX_RECVS * crate::engine::layout::CTS_ENTRY_BYTES) as u32;

/// Send-queue depth of each of a sender's `nqps` data QPs on a rail that stripes a
/// request's share over up to `pieces` of them (see the module doc).
pub fn send_qp_depth(nqps: u16, pieces: u8, failover: bool) -> u32 {
    let per_qp = if pieces > 1 { SLOTS } else { SLOTS.div_ceil(nqps.max(1) as usize) };
    let chains = per_qp * MAX_CHAIN;
    (chains + 1) as u32 + if failover { CTL_MAX_UNACKED as u32 } else { 0 }
}

/// Send-queue depth of a receiver's CTS QP (see the module doc): 48.
pub const CTS_QP_DEPTH: u32 = CTS_SIGNAL_EVERY as u32 + SLOTS as u32;
/// The same with rail failover on (see the module doc): 84.
pub const CTS_QP_DEPTH_FAILOVER: u32 = CTS_QP_DEPTH + SLOTS as u32 + CTL_MAX_UNACKED as u32;
/// Send-queue depth of a flush QP: a READ per flush in flight.
pub const FLUSH_QP_DEPTH: u32 = MAX_FLUSHES as u32;

pub(super) fn clamp_caps<D: Device>(dev: &D, caps: QpCaps) -> QpCaps {
    let a = dev.attrs();
    QpCaps { max_send_wr: caps.max_send_wr.min(a.max_qp_wr.max(1)), max_inline: caps.max_inline.min(a.max_inline) }
}

/// Whether a connection's rails get a loopback flush QP each (a receiver of GPU memory:
/// `iflush` READs through it).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(super) enum FlushQp {
    With,
    Without,
}

impl FlushQp {
    /// Flush QPs wherever the device pair can register GPU memory at all, through peer
    /// memory (nvidia-peermem) or DMA-BUF, as net_ib builds its flush QP; none for a pair
    /// that registers host memory only (its `iflush` is always a no-op).
    pub(super) fn for_memory(mem: MemTypes) -> FlushQp {
        if mem.intersects(MemTypes::CUDA | MemTypes::DMABUF) { FlushQp::With } else { FlushQp::Without }
    }
}

/// What one rail of a connection needs: its QPs (the last one the flush QP, if any), and
/// the receive window (SRQ WQEs its receives may consume at most).
pub(super) struct RailPlan {
    qps: Vec<QpSpec>,
    flush: FlushQp,
    window: u32,
}

/// A sender's rail: `nqps` data QPs.
pub(super) fn send_plan(nqps: u16, pieces: u8, failover: bool) -> RailPlan {
    let caps = QpCaps { max_send_wr: send_qp_depth(nqps, pieces, failover), max_inline: SEND_INLINE };
    RailPlan { qps: vec![QpSpec { caps, srq: false }; nqps as usize], flush: FlushQp::Without, window: 0 }
}

/// A receiver's rail: the CTS QP, `nqps - 1` more that only receive, the flush QP if asked,
/// and `window` receives in flight.
pub(super) fn recv_plan(nqps: u16, flush: FlushQp, window: u32, failover: bool) -> RailPlan {
    let cts = if failover { CTS_QP_DEPTH_FAILOVER } else { CTS_QP_DEPTH };
    let mut qps = vec![QpSpec { caps: QpCaps { max_send_wr: cts, max_inline: RECV_INLINE }, srq: true }];
    qps.extend((1..nqps).map(|_| QpSpec { caps: QpCaps { max_send_wr: 1, max_inline: 0 }, srq: true }));
    if flush == FlushQp::With {
        qps.push(QpSpec { caps: QpCaps { max_send_wr: FLUSH_QP_DEPTH, max_inline: 0 }, srq: false });
    }
    RailPlan { qps, flush, window }
}

/// Registers `region` on rail `rail`'s NIC and attaches `plan`'s QPs to the NIC's shared
/// queues in `ctx`, for connection `owner`.
pub(super) fn build_rail<D: Device>(
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
    let region_mr = dev.reg_mr(region.as_mut_ptr(), region.len(), CONTROL_ACCESS)?;
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
        ctx.state.counts.hold(Res::Qps, specs.len() as u64),
        ctx.state.counts.hold(Res::QpSendWrs, sq),
        ctx.state.counts.hold(Res::ControlBytes, region.len() as u64),
        ctx.state.counts.hold(Res::InboxEntries, inbox.capacity() as u64),
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
        specs,
        peer: Vec::new(),
        connect: None,
    })
}

pub(super) fn build_rails<D: Device>(
    ctx: &Context<D>,
    pair: &NicPair<D>,
    plan: impl Fn(usize) -> RailPlan,
    region: &HostRegion,
) -> Result<[Rail<D>; RAILS]> {
    let owner = ctx.state.new_owner();
    let r0 = build_rail(ctx, &pair.rails[0], 0, owner, plan(0), region)?;
    let r1 = build_rail(ctx, &pair.rails[1], 1, owner, plan(1), region)?;
    Ok([r0, r1])
}

pub(super) fn region_keys<D: Device>(rails: &[Rail<D>; RAILS]) -> ([u32; RAILS], [u32; RAILS]) {
    let k = |r: &Rail<D>| D::mr_keys(r.region_mr.as_ref().expect("registered"));
    ([k(&rails[0]).lkey, k(&rails[1]).lkey], [k(&rails[0]).rkey, k(&rails[1]).rkey])
}

pub(super) fn qp_infos<D: Device>(rails: &[Rail<D>; RAILS]) -> Vec<QpInfo> {
    rails.iter().flat_map(|r| r.qps.iter().map(|q| q.local_info())).collect()
}

/// Connects each rail's QPs to the peer's (`infos`, in the same order), rail `r`'s with
/// `p[r]`; the flush QP (a loopback) to itself.
pub(super) fn connect_qps<D: Device>(
    rails: &mut [Rail<D>; RAILS],
    infos: &[QpInfo],
    p: &[ConnectParams; RAILS],
) -> Result<()> {
    let mut it = infos.iter();
    for (r, p) in rails.iter_mut().zip(p) {
        for q in r.qps.iter_mut() {
            let peer = it.next().ok_or_else(|| Error::remote("peer sent too few QP infos"))?;
            q.connect(peer, p)?;
            r.peer.push(*peer);
        }
        r.connect = Some(*p);
        if let Some(f) = r.flush_qp.as_mut() {
            let me = f.local_info();
            f.connect(&me, p)?;
        }
    }
    Ok(())
}

pub(super) fn all_ready<D: Device>(rails: &mut [Rail<D>; RAILS]) -> Result<bool> {
    for r in rails.iter_mut() {
        for q in r.qps.iter_mut().chain(r.flush_qp.as_mut()) {
            if !q.is_ready()? {
                return Ok(false);
            }
        }
    }
    Ok(true)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn flush_qps_wherever_gpu_memory_can_be_registered() {
        assert_eq!(FlushQp::for_memory(MemTypes::HOST), FlushQp::Without);
        assert_eq!(FlushQp::for_memory(MemTypes::HOST | MemTypes::CUDA), FlushQp::With, "nvidia-peermem");
        assert_eq!(FlushQp::for_memory(MemTypes::HOST | MemTypes::DMABUF), FlushQp::With, "DMA-BUF alone");
        assert_eq!(FlushQp::for_memory(MemTypes::all()), FlushQp::With);
    }
}
