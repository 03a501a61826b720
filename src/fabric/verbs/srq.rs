//! The shared receive queue: generic 0-SGE WQEs, posted `count` at a time with one
//! `ibv_post_srq_recv` from a preallocated list.

use std::sync::Arc;

use rdma_mummy_sys as ibv;

use super::ctx::Ctx;
use super::sys;
use super::wr_pool::RecvPool;
use crate::error::Result;
use crate::fabric::SharedRecvQueue;

/// The SRQ object; destroyed when the last handle (the SRQ or a QP using it) goes.
pub struct SrqInner {
    pub(super) srq: *mut ibv::ibv_srq,
    ctx: Arc<Ctx>,
}

// SAFETY: SRQ calls are thread-safe in libibverbs; the pointer has no thread affinity.
unsafe impl Send for SrqInner {}
// SAFETY: shared references only reach `srq` for ibv_create_qp, which is thread-safe.
unsafe impl Sync for SrqInner {}

impl Drop for SrqInner {
    fn drop(&mut self) {
        // SAFETY: destroyed once, after every QP using it (they hold this Arc).
        let ret = unsafe { ibv::ibv_destroy_srq(self.srq) };
        if ret != 0 {
            log::warn!("ibv_destroy_srq on {}: {}", self.ctx.label(), sys::strerror(sys::ret_errno(ret)));
        }
    }
}

/// A shared receive queue (see [`crate::fabric::SharedRecvQueue`]).
pub struct VerbsSrq {
    pub(super) inner: Arc<SrqInner>,
    pool: RecvPool,
}

impl VerbsSrq {
    pub(super) fn create(ctx: &Arc<Ctx>, depth: u32) -> Result<VerbsSrq> {
        // SAFETY: all-zero is a valid ibv_srq_init_attr.
        let mut init: ibv::ibv_srq_init_attr = unsafe { std::mem::zeroed() };
        init.attr.max_wr = depth.max(1);
        // Providers refuse 0; the WQEs mpib posts carry no SGE anyway.
        init.attr.max_sge = 1;
        // Plain ibv_create_srq: the crates' ibv_create_srq_ex wrappers get the mask logic wrong.
        // SAFETY: ctx.pd is live; init is fully initialised.
        let srq = unsafe { ibv::ibv_create_srq(ctx.pd, &mut init) };
        if srq.is_null() {
            let errno = sys::errno();
            return Err(ctx.failed(&format!("ibv_create_srq(max_wr {depth})"), errno));
        }
        Ok(VerbsSrq { inner: Arc::new(SrqInner { srq, ctx: ctx.clone() }), pool: RecvPool::new(depth as usize) })
    }

    /// How many WQEs one `post_recv` takes.
    pub fn capacity(&self) -> usize {
        self.pool.capacity()
    }
}

impl SharedRecvQueue for VerbsSrq {
    fn post_recv(&mut self, count: u32) -> Result<()> {
        if count == 0 {
            return Ok(());
        }
        let srq = self.inner.srq;
        let ret = self.pool.with_chain(count as usize, |head| {
            let mut bad: *mut ibv::ibv_recv_wr = std::ptr::null_mut();
            // SAFETY: a live SRQ; head is a NULL-terminated list of `count` generic WQEs.
            unsafe { ibv::ibv_post_srq_recv(srq, head, &mut bad) }
        })?;
        if ret != 0 {
            return Err(self.inner.ctx.failed(&format!("ibv_post_srq_recv({count} WQEs)"), sys::ret_errno(ret)));
        }
        Ok(())
    }
}

impl std::fmt::Debug for VerbsSrq {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "VerbsSrq({}, {} WQEs per post)", self.inner.ctx.label(), self.capacity())
    }
}
