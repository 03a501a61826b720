//! The send and receive comms' profiler calls (`profile.rs` holds the events they keep):
//! each a single branch when NCCL gave no profiler callback, the work in a cold function.

use super::comm::{RecvComm, SendComm};
use super::rail::Rail;
use crate::engine::layout::MAX_RECVS;
use crate::engine::{Posts, QpRef, RAILS, RecvBuf};
use crate::fabric::{Device, QueuePair};

/// The QP number of each rail's chain in `posts` (0 on a rail without one).
fn chain_qp_nums<D: Device>(rails: &[Rail<D>; RAILS], posts: &Posts) -> [u32; RAILS] {
    let mut nums = [0; RAILS];
    for c in posts.chains() {
        let r = &rails[c.rail as usize];
        let qp = match c.qp {
            QpRef::Cts => r.qps.first(),
            QpRef::Data(i) => r.qps.get(i as usize),
            QpRef::Flush => r.flush_qp.as_ref(),
        };
        nums[c.rail as usize] = qp.map_or(0, |q| q.qp_num());
    }
    nums
}

impl<D: Device> SendComm<D> {
    /// Profiler events of the `isend` that just returned `r` for NCCL's profiler handle
    /// `phandle`: one branch when there is no profiler.
    #[inline(always)]
    pub fn profile_isend(&mut self, r: Option<u16>, phandle: usize) {
        if self.prof.is_some() {
            self.profile_isend_cold(r, phandle);
        }
    }

    /// Parts completed since stop, the send's handle is kept, the slot it posted (if it
    /// did) starts its parts' events.
    #[cold]
    #[inline(never)]
    fn profile_isend_cold(&mut self, r: Option<u16>, phandle: usize) {
        self.profile_sweep();
        let Some(p) = self.prof.as_deref_mut() else { return };
        if let Some(id) = r {
            p.on_isend(id, phandle);
        }
        if self.core.posts.n > 0 {
            p.on_posted(&self.engine.last_posted(), chain_qp_nums(&self.core.rails, &self.core.posts));
        }
    }

    /// Stops the profiler events of the parts that completed (or failed over).
    #[cold]
    #[inline(never)]
    pub(super) fn profile_sweep(&mut self) {
        let engine = &self.engine;
        if let Some(p) = self.prof.as_deref_mut() {
            p.sweep(|slot, seq, rail| engine.part_state(slot, seq, rail));
        }
    }
}

impl<D: Device> RecvComm<D> {
    /// Profiler events of the `irecv` of `bufs` that just returned `r`, NCCL's profiler
    /// handle of buffer `i` being `phandle(i)` (read only when there is a profiler): one
    /// branch when there is none.
    #[inline(always)]
    pub fn profile_irecv(&mut self, r: Option<u16>, bufs: &[RecvBuf], phandle: &impl Fn(usize) -> usize) {
        if self.prof.is_some() {
            self.profile_irecv_cold(r, bufs, phandle);
        }
    }

    /// One event per buffer.
    #[cold]
    #[inline(never)]
    fn profile_irecv_cold(&mut self, r: Option<u16>, bufs: &[RecvBuf], phandle: &dyn Fn(usize) -> usize) {
        let (Some(id), Some(p)) = (r, self.prof.as_deref_mut()) else { return };
        let mut sizes = [0u64; MAX_RECVS];
        for (s, b) in sizes.iter_mut().zip(bufs) {
            *s = b.size;
        }
        let nums = chain_qp_nums(&self.core.rails, &self.core.posts);
        let cts = self
            .core
            .posts
            .chains()
            .iter()
            .find(|c| c.qp == QpRef::Cts)
            .map(|c| (c.rail as usize, nums[c.rail as usize]));
        p.on_irecv(id, &sizes[..bufs.len().min(MAX_RECVS)], phandle, cts);
    }

    /// Receive request `id` is done (`test` said so): its profiler events stop, before
    /// NCCL learns it (NCCL reuses its profiler handles). One branch when there is no
    /// profiler.
    #[inline(always)]
    pub fn profile_done(&mut self, id: u16) {
        if self.prof.is_some() {
            self.profile_done_cold(id);
        }
    }

    #[cold]
    #[inline(never)]
    fn profile_done_cold(&mut self, id: u16) {
        if let Some(p) = self.prof.as_deref_mut() {
            p.on_done(id);
        }
    }
}
