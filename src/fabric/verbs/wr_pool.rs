//! Preallocated work-request pools: a chain of [`SendWr`]s becomes a linked list of
//! `ibv_send_wr` + `ibv_sge` in memory allocated once per QP, and `count` generic SRQ
//! receives are a prefix of a list linked once per SRQ. Posting allocates nothing.

use rdma_mummy_sys as ibv;

use crate::error::{Error, Result};
use crate::fabric::{MAX_SGE, SendWr, WrOpcode};

/// The longest chain one `post_send` takes (the protocol posts at most nreqs (8) data
/// writes plus one record write per rail).
pub const MAX_CHAIN: usize = 64;

/// A heap array that is only ever reached through the raw pointer it was created with, so
/// that pointers stored inside it (`next`, `sg_list`) stay valid: no `&mut` to the whole
/// array is ever made again after they were written.
struct RawArray<T> {
    ptr: *mut T,
    len: usize,
}

impl<T> RawArray<T> {
    fn new(items: impl Iterator<Item = T>) -> RawArray<T> {
        let b: Box<[T]> = items.collect();
        let len = b.len();
        RawArray { ptr: Box::into_raw(b) as *mut T, len }
    }

    /// A pointer to element `i` (`i < len`).
    fn at(&self, i: usize) -> *mut T {
        assert!(i < self.len);
        // SAFETY: in bounds of the allocation.
        unsafe { self.ptr.add(i) }
    }
}

impl<T> Drop for RawArray<T> {
    fn drop(&mut self) {
        // SAFETY: ptr/len came from Box::into_raw of a boxed slice of exactly len elements.
        drop(unsafe { Box::from_raw(std::ptr::slice_from_raw_parts_mut(self.ptr, self.len)) });
    }
}

/// Send WRs and their SGEs, in memory that never moves (the `next` and `sg_list` pointers
/// point into it).
pub struct SendPool {
    wrs: RawArray<ibv::ibv_send_wr>,
    sges: RawArray<[ibv::ibv_sge; MAX_SGE]>,
}

// SAFETY: the pointers inside point only into the pool's own arrays; nothing is shared with
// another thread, so moving the pool to one is sound.
unsafe impl Send for SendPool {}

impl SendPool {
    pub fn new(len: usize) -> SendPool {
        let len = len.clamp(1, MAX_CHAIN);
        // SAFETY: all-zero is a valid ibv_send_wr (NULL pointers, zero integers and unions).
        let wrs = RawArray::new((0..len).map(|_| unsafe { std::mem::zeroed::<ibv::ibv_send_wr>() }));
        let sges = RawArray::new((0..len).map(|_| [ibv::ibv_sge { addr: 0, length: 0, lkey: 0 }; MAX_SGE]));
        SendPool { wrs, sges }
    }

    pub fn capacity(&self) -> usize {
        self.wrs.len
    }

    /// Writes `chain` into the pool and returns the head of the linked list.
    pub fn fill(&mut self, chain: &[SendWr]) -> Result<*mut ibv::ibv_send_wr> {
        if chain.is_empty() || chain.len() > self.wrs.len {
            return Err(Error::invalid_usage(format!(
                "a chain of {} WRs (this QP posts 1 to {} per call)",
                chain.len(),
                self.wrs.len
            )));
        }
        if let Some(i) = chain.iter().position(|w| w.num_sge as usize > MAX_SGE) {
            return Err(Error::invalid_usage(format!(
                "WR {i} of the chain has {} SGEs (at most {MAX_SGE})",
                chain[i].num_sge
            )));
        }
        let last = chain.len() - 1;
        for (i, wr) in chain.iter().enumerate() {
            let n = wr.num_sge as usize;
            // SAFETY: i < chain.len() <= len; `&mut self` makes these the only references.
            let (w, sges) = unsafe { (&mut *self.wrs.at(i), &mut *self.sges.at(i)) };
            for (dst, src) in sges.iter_mut().zip(&wr.sge[..n]) {
                *dst = ibv::ibv_sge { addr: src.addr, length: src.len, lkey: src.lkey };
            }
            w.wr_id = wr.wr_id;
            w.sg_list = if n == 0 { std::ptr::null_mut() } else { self.sges.at(i).cast() };
            w.num_sge = n as i32;
            w.opcode = match wr.opcode {
                WrOpcode::Write => ibv::ibv_wr_opcode::IBV_WR_RDMA_WRITE,
                WrOpcode::WriteImm => ibv::ibv_wr_opcode::IBV_WR_RDMA_WRITE_WITH_IMM,
                WrOpcode::Read => ibv::ibv_wr_opcode::IBV_WR_RDMA_READ,
            };
            let mut flags = 0;
            if wr.signaled {
                flags |= ibv::ibv_send_flags::IBV_SEND_SIGNALED.0;
            }
            if wr.inline {
                flags |= ibv::ibv_send_flags::IBV_SEND_INLINE.0;
            }
            w.send_flags = flags;
            // On the wire big-endian; the trait's imm is host order.
            w.imm_data_invalidated_rkey_union.imm_data =
                if wr.opcode == WrOpcode::WriteImm { wr.imm.to_be() } else { 0 };
            w.wr.rdma = ibv::rdma_t { remote_addr: wr.remote_addr, rkey: wr.rkey };
            w.next = if i == last { std::ptr::null_mut() } else { self.wrs.at(i + 1) };
        }
        Ok(self.wrs.at(0))
    }

    /// The position of `bad` in the pool (which WR of the chain `ibv_post_send` refused).
    pub fn index_of(&self, bad: *const ibv::ibv_send_wr) -> Option<usize> {
        let off = (bad as usize).checked_sub(self.wrs.ptr as usize)?;
        let size = std::mem::size_of::<ibv::ibv_send_wr>();
        (off % size == 0 && off / size < self.wrs.len).then_some(off / size)
    }
}

/// Generic receive WQEs (no SGE, `wr_id` 0), linked once; posting `count` of them cuts the
/// list after `count` entries for the duration of one `ibv_post_srq_recv`.
pub struct RecvPool {
    wrs: RawArray<ibv::ibv_recv_wr>,
}

// SAFETY: as for SendPool: the links point only into the pool's own array.
unsafe impl Send for RecvPool {}

impl RecvPool {
    pub fn new(len: usize) -> RecvPool {
        let len = len.max(1);
        let wrs = RawArray::new((0..len).map(|_| ibv::ibv_recv_wr {
            wr_id: 0,
            next: std::ptr::null_mut(),
            sg_list: std::ptr::null_mut(),
            num_sge: 0,
        }));
        for i in 0..len - 1 {
            // SAFETY: i + 1 < len; no other reference to the element exists.
            unsafe { (*wrs.at(i)).next = wrs.at(i + 1) };
        }
        RecvPool { wrs }
    }

    pub fn capacity(&self) -> usize {
        self.wrs.len
    }

    /// Runs `post` with the head of a list of exactly `count` WQEs, then relinks the pool.
    pub fn with_chain<T>(&mut self, count: usize, post: impl FnOnce(*mut ibv::ibv_recv_wr) -> T) -> Result<T> {
        if count == 0 || count > self.wrs.len {
            return Err(Error::invalid_usage(format!(
                "posting {count} receive WQEs (this SRQ takes 1 to {} per call)",
                self.wrs.len
            )));
        }
        let cut = self.wrs.at(count - 1);
        // SAFETY: cut is in bounds; `&mut self` makes this the only access.
        let saved = unsafe { std::mem::replace(&mut (*cut).next, std::ptr::null_mut()) };
        let r = post(self.wrs.at(0));
        // SAFETY: as above; the provider has copied the WQEs and holds no reference.
        unsafe { (*cut).next = saved };
        Ok(r)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::fabric::Sge;

    /// Walks a posted list the way a provider does.
    fn walk(head: *mut ibv::ibv_send_wr) -> Vec<&'static ibv::ibv_send_wr> {
        let mut v = Vec::new();
        let mut p = head;
        while !p.is_null() {
            // SAFETY: the pool outlives the test's use; the list is NULL-terminated.
            let w = unsafe { &*p };
            v.push(w);
            p = w.next;
        }
        v
    }

    fn wr(op: WrOpcode, n: u8, signaled: bool, imm: u32) -> SendWr {
        SendWr {
            wr_id: 100 + n as u64,
            opcode: op,
            signaled,
            deferrable: false,
            inline: false,
            num_sge: n,
            sge: [Sge { addr: 0x1000, len: 64, lkey: 7 }, Sge { addr: 0x2000, len: 32, lkey: 8 }],
            remote_addr: 0xabc0,
            rkey: 0x55,
            imm,
        }
    }

    #[test]
    fn a_chain_becomes_one_linked_list_with_big_endian_imm() {
        let mut pool = SendPool::new(8);
        let chain = [
            wr(WrOpcode::Write, 2, false, 0),
            wr(WrOpcode::Read, 1, false, 0),
            wr(WrOpcode::WriteImm, 0, true, 0x0a0b_0c0d),
        ];
        let head = pool.fill(&chain).unwrap();
        let list = walk(head);
        assert_eq!(list.len(), 3);
        assert_eq!(list[0].opcode, ibv::ibv_wr_opcode::IBV_WR_RDMA_WRITE);
        assert_eq!(list[1].opcode, ibv::ibv_wr_opcode::IBV_WR_RDMA_READ);
        assert_eq!(list[2].opcode, ibv::ibv_wr_opcode::IBV_WR_RDMA_WRITE_WITH_IMM);
        assert_eq!(list.iter().map(|w| w.wr_id).collect::<Vec<_>>(), [102, 101, 100]);
        assert_eq!(list.iter().map(|w| w.num_sge).collect::<Vec<_>>(), [2, 1, 0]);
        assert!(list[2].sg_list.is_null(), "a 0-byte WRITE_WITH_IMM has no SGE list");
        // SAFETY: reading the SGEs the pool points at.
        let s = unsafe { std::slice::from_raw_parts(list[0].sg_list, 2) };
        assert_eq!((s[0].addr, s[0].length, s[0].lkey, s[1].addr, s[1].lkey), (0x1000, 64, 7, 0x2000, 8));
        // SAFETY: plain u32 / struct union members written by fill.
        unsafe {
            assert_eq!(list[2].imm_data_invalidated_rkey_union.imm_data, 0x0a0b_0c0du32.to_be());
            assert_eq!(list[2].imm_data_invalidated_rkey_union.imm_data.to_ne_bytes(), [0x0a, 0x0b, 0x0c, 0x0d]);
            assert_eq!((list[1].wr.rdma.remote_addr, list[1].wr.rdma.rkey), (0xabc0, 0x55));
        }
        assert_eq!(list[0].send_flags, 0);
        assert_eq!(list[2].send_flags, ibv::ibv_send_flags::IBV_SEND_SIGNALED.0);
        assert_eq!(pool.index_of(list[2]), Some(2));
        assert_eq!(pool.index_of(std::ptr::null()), None);
    }

    #[test]
    fn reusing_the_pool_relinks_and_terminates_shorter_chains() {
        let mut pool = SendPool::new(4);
        pool.fill(&[wr(WrOpcode::Write, 1, false, 0); 4]).unwrap();
        let mut inl = wr(WrOpcode::WriteImm, 1, true, 1);
        inl.inline = true;
        let list = walk(pool.fill(&[inl]).unwrap());
        assert_eq!(list.len(), 1, "the old 4-WR links must not leak into a 1-WR chain");
        assert_eq!(
            list[0].send_flags,
            ibv::ibv_send_flags::IBV_SEND_SIGNALED.0 | ibv::ibv_send_flags::IBV_SEND_INLINE.0
        );
    }

    #[test]
    fn chains_outside_the_pool_are_refused() {
        let mut pool = SendPool::new(2);
        assert!(pool.fill(&[]).is_err());
        let e = pool.fill(&[wr(WrOpcode::Write, 1, false, 0); 3]).unwrap_err();
        assert!(e.msg().contains("chain of 3 WRs"), "{e}");
        assert!(pool.fill(&[wr(WrOpcode::Write, 3, false, 0)]).unwrap_err().msg().contains("3 SGEs"));
        assert_eq!(SendPool::new(10_000).capacity(), MAX_CHAIN);
    }

    #[test]
    fn receive_pool_posts_exact_prefixes() {
        let mut pool = RecvPool::new(5);
        let count = |head: *mut ibv::ibv_recv_wr| {
            let (mut n, mut p) = (0, head);
            while !p.is_null() {
                // SAFETY: a NULL-terminated list inside the pool.
                let w = unsafe { &*p };
                assert_eq!((w.num_sge, w.wr_id), (0, 0));
                assert!(w.sg_list.is_null());
                n += 1;
                p = w.next;
            }
            n
        };
        assert_eq!(pool.with_chain(2, count).unwrap(), 2);
        assert_eq!(pool.with_chain(5, count).unwrap(), 5);
        assert_eq!(pool.with_chain(1, count).unwrap(), 1);
        assert_eq!(pool.with_chain(5, count).unwrap(), 5, "links restored after a short post");
        assert!(pool.with_chain(0, count).is_err());
        assert!(pool.with_chain(6, count).unwrap_err().msg().contains("1 to 5"));
    }
}
