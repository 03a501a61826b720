//! Reliable-connected queue pairs: created and moved to INIT at once, INIT → RTR → RTS from
//! the peer's [`QpInfo`] in `connect`, and `post_send` = one `ibv_post_send` of a chain
//! translated into the QP's preallocated WR pool.

use std::sync::Arc;
use std::sync::atomic::Ordering;
use std::time::{Duration, Instant};

use rdma_mummy_sys as ibv;

use super::cq::{CqInner, VerbsCq};
use super::ctx::Ctx;
use super::qp_info::{self, PortInfo};
use super::route;
use super::srq::{SrqInner, VerbsSrq};
use super::sys::{self, LINK_LAYER_ETHERNET};
use super::wr_pool::SendPool;
use crate::error::{Error, Result};
use crate::fabric::{ConnectParams, MAX_SGE, QpCaps, QpInfo, QueuePair, SendWr};

/// How long a fence waits for `IBV_EVENT_QP_LAST_WQE_REACHED` (a NIC raises it within
/// microseconds; the bound keeps a device that never does from holding the caller).
const LAST_WQE_WAIT: Duration = Duration::from_millis(100);

/// RNR NAK timer the responder asks for (12 = 0.64 ms, as net_ib).
const MIN_RNR_TIMER: u8 = 12;
/// 7 = retry forever after an RNR NAK: a receiver whose SRQ ran dry is slow, not broken.
const RNR_RETRY: u8 = 7;

/// A raw RC QP on `ctx` whose completions go to `cq`; used by [`VerbsQp::create`] and by
/// the device's inline-size probe.
pub(super) fn create_raw(
    ctx: &Ctx,
    cq: *mut ibv::ibv_cq,
    srq: *mut ibv::ibv_srq,
    max_send_wr: u32,
    max_inline: u32,
) -> Result<*mut ibv::ibv_qp> {
    // SAFETY: all-zero is a valid ibv_qp_init_attr.
    let mut init: ibv::ibv_qp_init_attr = unsafe { std::mem::zeroed() };
    init.send_cq = cq;
    init.recv_cq = cq;
    init.srq = srq;
    init.qp_type = ibv::ibv_qp_type::IBV_QPT_RC;
    init.cap.max_send_wr = max_send_wr.max(1);
    init.cap.max_send_sge = MAX_SGE as u32;
    // A QP without an SRQ never receives (mpib only takes WRITE_WITH_IMM through an SRQ);
    // one receive slot keeps providers that refuse an empty receive queue happy.
    init.cap.max_recv_wr = if srq.is_null() { 1 } else { 0 };
    init.cap.max_recv_sge = if srq.is_null() { 1 } else { 0 };
    init.cap.max_inline_data = max_inline;
    // SAFETY: ctx.pd is live; cq/srq are live objects of the same context (or NULL srq).
    let qp = unsafe { ibv::ibv_create_qp(ctx.pd, &mut init) };
    if qp.is_null() {
        let errno = sys::errno();
        return Err(
            ctx.failed(&format!("ibv_create_qp(RC, max_send_wr {max_send_wr}, max_inline {max_inline})"), errno)
        );
    }
    Ok(qp)
}

/// A random 24-bit packet sequence number.
fn random_psn() -> u32 {
    let mut b = [0u8; 4];
    // SAFETY: writing at most 4 bytes into b.
    let n = unsafe { libc::getrandom(b.as_mut_ptr().cast(), 4, libc::GRND_NONBLOCK) };
    let v = if n == 4 {
        u32::from_ne_bytes(b)
    } else {
        std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).map_or(1, |d| d.subsec_nanos())
    };
    v & 0xff_ffff
}

/// A reliable-connected queue pair (see [`crate::fabric::QueuePair`]).
pub struct VerbsQp {
    qp: *mut ibv::ibv_qp,
    qpn: u32,
    psn: u32,
    port: PortInfo,
    pool: SendPool,
    connected: bool,
    /// Moved to the error state by a fence (`to_error`), once.
    fenced: bool,
    /// A fence waiting for this QP's `LAST_WQE_REACHED`: its flag and when it began.
    last_wqe: Option<(Arc<std::sync::atomic::AtomicBool>, Instant)>,
    ctx: Arc<Ctx>,
    // Kept alive (and destroyed after the QP) by these handles.
    _cq: Arc<CqInner>,
    _srq: Option<Arc<SrqInner>>,
}

// SAFETY: a QP may be used from any thread (libibverbs serializes posts per QP internally);
// `&mut self` on every post keeps the WR pool single-threaded.
unsafe impl Send for VerbsQp {}

impl VerbsQp {
    pub(super) fn create(
        ctx: &Arc<Ctx>,
        port: PortInfo,
        cq: &VerbsCq,
        srq: Option<&VerbsSrq>,
        caps: QpCaps,
    ) -> Result<VerbsQp> {
        let srq_ptr = srq.map_or(std::ptr::null_mut(), |s| s.inner.srq);
        let qp = create_raw(ctx, cq.inner.cq, srq_ptr, caps.max_send_wr, caps.max_inline)?;
        // SAFETY: qp was just created.
        let qpn = unsafe { (*qp).qp_num };
        let this = VerbsQp {
            qp,
            qpn,
            psn: random_psn(),
            port,
            pool: SendPool::new(caps.max_send_wr as usize),
            connected: false,
            fenced: false,
            last_wqe: None,
            ctx: ctx.clone(),
            _cq: cq.inner.clone(),
            _srq: srq.map(|s| s.inner.clone()),
        };
        // SAFETY: all-zero is a valid ibv_qp_attr.
        let mut a: ibv::ibv_qp_attr = unsafe { std::mem::zeroed() };
        a.qp_state = ibv::ibv_qp_state::IBV_QPS_INIT;
        a.pkey_index = port.pkey_index;
        a.port_num = port.port;
        a.qp_access_flags = (ibv::ibv_access_flags::IBV_ACCESS_LOCAL_WRITE
            | ibv::ibv_access_flags::IBV_ACCESS_REMOTE_WRITE
            | ibv::ibv_access_flags::IBV_ACCESS_REMOTE_READ)
            .0;
        use ibv::ibv_qp_attr_mask as m;
        this.modify(
            &mut a,
            m::IBV_QP_STATE | m::IBV_QP_PKEY_INDEX | m::IBV_QP_PORT | m::IBV_QP_ACCESS_FLAGS,
            "INIT",
            None,
        )?;
        Ok(this)
    }

    fn modify(
        &self,
        a: &mut ibv::ibv_qp_attr,
        mask: ibv::ibv_qp_attr_mask,
        state: &str,
        remote: Option<u32>,
    ) -> Result<()> {
        // SAFETY: a live QP and a fully initialised attribute struct.
        let ret = unsafe { ibv::ibv_modify_qp(self.qp, a, mask.0 as i32) };
        if ret != 0 {
            let to = remote.map_or(String::new(), |r| format!(", to remote QP {r}"));
            return Err(self
                .ctx
                .failed(&format!("ibv_modify_qp(QP {} to {state}{to})", self.qpn), sys::ret_errno(ret)));
        }
        Ok(())
    }

    /// How many WRs one `post_send` takes.
    pub fn max_chain(&self) -> usize {
        self.pool.capacity()
    }

    /// The attributes the device holds for this QP (`ibv_query_qp`): what was applied, not
    /// what was asked for.
    pub fn query(&self) -> Result<QpAttrs> {
        use ibv::ibv_qp_attr_mask as m;
        // SAFETY: all-zero is a valid ibv_qp_attr and ibv_qp_init_attr.
        let (mut a, mut init): (ibv::ibv_qp_attr, ibv::ibv_qp_init_attr) =
            unsafe { (std::mem::zeroed(), std::mem::zeroed()) };
        let mask = m::IBV_QP_STATE
            | m::IBV_QP_AV
            | m::IBV_QP_PATH_MTU
            | m::IBV_QP_TIMEOUT
            | m::IBV_QP_RETRY_CNT
            | m::IBV_QP_RNR_RETRY
            | m::IBV_QP_PKEY_INDEX;
        // SAFETY: a live QP; both out-structs are valid for the call.
        let ret = unsafe { ibv::ibv_query_qp(self.qp, &mut a, mask.0 as i32, &mut init) };
        if ret != 0 {
            return Err(self.ctx.failed(&format!("ibv_query_qp(QP {})", self.qpn), sys::ret_errno(ret)));
        }
        Ok(QpAttrs {
            state: a.qp_state,
            traffic_class: a.ah_attr.grh.traffic_class,
            service_level: a.ah_attr.sl,
            sgid_index: a.ah_attr.grh.sgid_index,
            is_global: a.ah_attr.is_global != 0,
            path_mtu: a.path_mtu,
            timeout: a.timeout,
            retry_cnt: a.retry_cnt,
            rnr_retry: a.rnr_retry,
            pkey_index: a.pkey_index,
        })
    }
}

/// A QP's attributes as the device holds them ([`VerbsQp::query`]).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct QpAttrs {
    /// `enum ibv_qp_state` (3 = RTS).
    pub state: u32,
    pub traffic_class: u8,
    pub service_level: u8,
    pub sgid_index: u8,
    /// The address vector carries a GRH (always on RoCE).
    pub is_global: bool,
    /// `enum ibv_mtu`.
    pub path_mtu: u32,
    pub timeout: u8,
    pub retry_cnt: u8,
    pub rnr_retry: u8,
    pub pkey_index: u16,
}

impl QueuePair for VerbsQp {
    fn qp_num(&self) -> u32 {
        self.qpn
    }

    fn local_info(&self) -> QpInfo {
        qp_info::encode(&self.port, self.qpn, self.psn)
    }

    fn connect(&mut self, remote: &QpInfo, params: &ConnectParams) -> Result<()> {
        if self.connected {
            return Err(Error::invalid_usage(format!("QP {} on {} is already connected", self.qpn, self.ctx.label())));
        }
        let r = qp_info::decode(remote)?;
        if r.link_layer != self.port.link_layer {
            let ll = |l: u8| if l == LINK_LAYER_ETHERNET { "RoCE (Ethernet)" } else { "InfiniBand" };
            return Err(Error::invalid_usage(format!(
                "{}: cannot connect a {} QP to a {} peer QP",
                self.ctx.label(),
                ll(self.port.link_layer),
                ll(r.link_layer)
            )));
        }
        use ibv::ibv_qp_attr_mask as m;
        // SAFETY: all-zero is a valid ibv_qp_attr.
        let mut a: ibv::ibv_qp_attr = unsafe { std::mem::zeroed() };
        a.qp_state = ibv::ibv_qp_state::IBV_QPS_RTR;
        a.path_mtu = self.port.mtu.min(r.mtu) as u32;
        a.dest_qp_num = r.qpn;
        a.rq_psn = r.psn;
        a.max_dest_rd_atomic = self.port.rd_atomic_responder;
        a.min_rnr_timer = MIN_RNR_TIMER;
        a.ah_attr.port_num = self.port.port;
        a.ah_attr.sl = params.service_level;
        let (av, warning) = route::address_vector(&self.port, &r, params.traffic_class);
        if let Some(w) = warning {
            log::warn!("{}: QP {}: {w}", self.ctx.label(), self.qpn);
        }
        a.ah_attr.dlid = av.dlid;
        if let Some(g) = av.grh {
            a.ah_attr.is_global = 1;
            a.ah_attr.grh.dgid = ibv::ibv_gid { raw: g.dgid };
            a.ah_attr.grh.sgid_index = g.sgid_index;
            a.ah_attr.grh.hop_limit = g.hop_limit;
            a.ah_attr.grh.traffic_class = g.traffic_class;
        }
        let mask = m::IBV_QP_STATE
            | m::IBV_QP_AV
            | m::IBV_QP_PATH_MTU
            | m::IBV_QP_DEST_QPN
            | m::IBV_QP_RQ_PSN
            | m::IBV_QP_MAX_DEST_RD_ATOMIC
            | m::IBV_QP_MIN_RNR_TIMER;
        self.modify(&mut a, mask, "RTR", Some(r.qpn))?;

        // SAFETY: as above.
        let mut a: ibv::ibv_qp_attr = unsafe { std::mem::zeroed() };
        a.qp_state = ibv::ibv_qp_state::IBV_QPS_RTS;
        a.timeout = params.timeout;
        a.retry_cnt = params.retry_cnt;
        a.rnr_retry = RNR_RETRY;
        a.sq_psn = self.psn;
        a.max_rd_atomic = self.port.rd_atomic_initiator.min(r.rd_atomic_granted).max(1);
        let mask = m::IBV_QP_STATE
            | m::IBV_QP_TIMEOUT
            | m::IBV_QP_RETRY_CNT
            | m::IBV_QP_RNR_RETRY
            | m::IBV_QP_SQ_PSN
            | m::IBV_QP_MAX_QP_RD_ATOMIC;
        self.modify(&mut a, mask, "RTS", Some(r.qpn))?;
        self.connected = true;
        log::debug!(
            "{}: QP {} connected to QP {} (MTU code {}, tc {}, sl {}, timeout {}, retry {})",
            self.ctx.label(),
            self.qpn,
            r.qpn,
            self.port.mtu.min(r.mtu),
            params.traffic_class,
            params.service_level,
            params.timeout,
            params.retry_cnt
        );
        Ok(())
    }

    fn is_ready(&mut self) -> Result<bool> {
        if self.ctx.health.device_fatal.load(std::sync::atomic::Ordering::Acquire) {
            return Err(Error::system(format!("{}: the device reported a fatal error", self.ctx.label())));
        }
        Ok(self.connected)
    }

    fn post_send(&mut self, chain: &[SendWr]) -> Result<()> {
        if chain.is_empty() {
            return Ok(());
        }
        if !self.connected {
            return Err(Error::invalid_usage(format!(
                "post_send on QP {} of {} before connect",
                self.qpn,
                self.ctx.label()
            )));
        }
        let head = self.pool.fill(chain)?;
        let mut bad: *mut ibv::ibv_send_wr = std::ptr::null_mut();
        // SAFETY: a live, connected QP; head is a NULL-terminated list in the pool, valid
        // for the call (the provider copies the WRs before returning).
        let ret = unsafe { ibv::ibv_post_send(self.qp, head, &mut bad) };
        if ret != 0 {
            let posted = match self.pool.index_of(bad) {
                Some(0) => "none of them was posted".to_string(),
                Some(i) => format!("WRs 0-{} were posted, WR {i} and after were not", i - 1),
                None => "the provider did not say which WR it refused: an unknown prefix was posted".to_string(),
            };
            return Err(self.ctx.failed(
                &format!("ibv_post_send(QP {}, a chain of {} WRs: {posted})", self.qpn, chain.len()),
                sys::ret_errno(ret),
            ));
        }
        Ok(())
    }

    fn to_error(&mut self) -> Result<()> {
        if !self.connected || self.fenced {
            return Ok(()); // never connected: nothing can arrive; fenced: done before
        }
        // A QP on an SRQ may go on consuming WQEs (and completing receives) until the
        // device raises IBV_EVENT_QP_LAST_WQE_REACHED for it; only then is the set of
        // receives it completed final: `fence_settled` says when (registered before the
        // state change, so the event cannot come first).
        let health = &self.ctx.health;
        let waits = self._srq.is_some() && self.ctx.reads_events() && !health.last_wqe_missing.load(Ordering::Relaxed);
        let seen = waits.then(|| health.expect_last_wqe(self.qpn));
        // SAFETY: all-zero is a valid ibv_qp_attr.
        let mut a: ibv::ibv_qp_attr = unsafe { std::mem::zeroed() };
        a.qp_state = ibv::ibv_qp_state::IBV_QPS_ERR;
        let r = self.modify(&mut a, ibv::ibv_qp_attr_mask::IBV_QP_STATE, "ERR", None);
        match (&r, seen) {
            (Ok(()), Some(seen)) => self.last_wqe = Some((seen, Instant::now())),
            (_, Some(_)) => health.forget_last_wqe(self.qpn),
            _ => {}
        }
        self.fenced = r.is_ok();
        r
    }

    fn fence_settled(&mut self) -> bool {
        let Some((seen, since)) = &self.last_wqe else { return true };
        let health = &self.ctx.health;
        if !seen.load(Ordering::Acquire) {
            if since.elapsed() < LAST_WQE_WAIT && !health.last_wqe_missing.load(Ordering::Relaxed) {
                return false;
            }
            if !health.last_wqe_missing.swap(true, Ordering::Relaxed) {
                // Once per device: it does not raise the event (rxe on Linux 6.1), so its
                // fences drain the CQ at once from now on, without waiting for it.
                log::info!(
                    "{}: QP {} raised no IBV_EVENT_QP_LAST_WQE_REACHED within {:?} of the error state; \
                     fences on this device no longer wait for it",
                    self.ctx.label(),
                    self.qpn,
                    LAST_WQE_WAIT
                );
            }
        }
        health.forget_last_wqe(self.qpn);
        self.last_wqe = None;
        true
    }

    fn drain_marker(&mut self, marker: u64) -> Result<bool> {
        if !self.connected {
            return Ok(false); // never connected: nothing was posted
        }
        // SAFETY: all-zero is a valid ibv_qp_attr.
        let mut a: ibv::ibv_qp_attr = unsafe { std::mem::zeroed() };
        a.qp_state = ibv::ibv_qp_state::IBV_QPS_ERR;
        self.modify(&mut a, ibv::ibv_qp_attr_mask::IBV_QP_STATE, "ERR", None)?;
        // In the error state a posted WR completes flushed, after every WR before it.
        let wr = SendWr { wr_id: marker, signaled: true, ..SendWr::default() };
        self.post_send(&[wr])?;
        Ok(true)
    }
}

impl Drop for VerbsQp {
    fn drop(&mut self) {
        // SAFETY: the QP is destroyed once; its CQ, SRQ and PD outlive it (Arcs above).
        let ret = unsafe { ibv::ibv_destroy_qp(self.qp) };
        if ret != 0 {
            log::warn!(
                "ibv_destroy_qp(QP {}) on {}: {}",
                self.qpn,
                self.ctx.label(),
                sys::strerror(sys::ret_errno(ret))
            );
        }
    }
}

impl std::fmt::Debug for VerbsQp {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "VerbsQp({} QP {}, connected: {})", self.ctx.label(), self.qpn, self.connected)
    }
}
