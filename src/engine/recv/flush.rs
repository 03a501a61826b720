//! `iflush` for GPU memory: the receive's flush requests, a 1-byte RDMA READ per rail.

use super::FLUSH_ID_BASE;
use super::RecvEngine;
use crate::engine::{MAX_FLUSHES, Posts, QpRef, RAILS, RailMask, Refused, WrKind, cold};
use crate::error::Result;
use crate::fabric::{SendWr, Sge, WrOpcode};

/// The buffer a flush reads one byte from (the last non-empty one of the receive).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct FlushBuf {
    pub addr: u64,
    pub rkeys: [u32; RAILS],
}

/// A flush request: in use, and the rails whose READ has not completed yet.
#[derive(Clone, Copy, Debug, Default)]
pub(super) struct FlushReq {
    pub(super) live: bool,
    pub(super) pending: RailMask,
}

impl RecvEngine {
    /// `iflush` for GPU memory: a 1-byte RDMA READ of `buf` on each rail's loopback flush QP
    /// (the READ cannot pass the NIC's earlier writes, so when it completes the GPU sees
    /// the data; net_ib does the same). Returns the flush request.
    pub fn iflush(&mut self, buf: FlushBuf, out: &mut Posts) -> Result<Option<u16>> {
        self.error.check()?;
        let Some(i) = self.flushes.iter().position(|f| !f.live) else {
            return Err(cold(move || Refused::TooManyFlushes { max: MAX_FLUSHES }.into()));
        };
        let mut pending = RailMask::NONE;
        for rail in self.cfg.rails_mask.iter() {
            let c = out.push(rail, QpRef::Flush);
            c.push(SendWr {
                wr_id: WrKind::Flush.id(rail, i),
                opcode: WrOpcode::Read,
                signaled: true,
                num_sge: 1,
                sge: [Sge { addr: self.cfg.flush_addr, len: 1, lkey: self.cfg.flush_lkeys[rail] }, Sge::default()],
                remote_addr: buf.addr,
                rkey: buf.rkeys[rail],
                ..SendWr::default()
            });
            self.stats[rail].count_post(1, 0, 0, 0);
            pending = pending.with(rail);
        }
        self.flushes[i] = FlushReq { live: true, pending };
        Ok(Some(FLUSH_ID_BASE + i as u16))
    }
}
