//! Posting a matched slot: the split of each send, decided immediately before it is posted,
//! and the chains it becomes — one per active rail, nothing on an inactive one. A single
//! receive whose size fits the IMM takes the fast path (one WRITE_WITH_IMM per rail); any
//! other slot writes its data and then a signalling WRITE_WITH_IMM, the leader rail's
//! carrying the sizes into the receiver's completion records.

use super::{CpuAccess, PostedSlot, SendBuf, SendEngine};
use crate::engine::failover::PartSrc;
use crate::engine::imm::{Imm, SIZEQ_SENTINEL};
use crate::engine::layout::{CtsEntry, MAX_RECVS, RECORD_SLOT_BYTES, SLOTS, SendMemory};
use crate::engine::{MAX_CHAIN, Posts, QpRef, RAILS, RailMask, SOUT, SUP, WrKind};
use crate::error::{Cause, Error, ErrorKind, Result};
use crate::fabric::{SendWr, Sge, WrOpcode};
use crate::split::{SHARE_ALIGN, SplitPolicy};

/// The rails that carry bytes of a `size`-byte send with `sout` bytes on SOUT.
#[inline]
fn rails_carrying(sout: u64, size: u64) -> RailMask {
    (if sout > 0 { RailMask::SOUT } else { RailMask::NONE }) | if size > sout { RailMask::SUP } else { RailMask::NONE }
}

/// The active rails of a slot whose sends carry bytes on `mask`'s rails. A slot of empty
/// sends carries none, yet its IMM must go: on SOUT alone (SUP when SOUT has failed).
#[inline]
fn or_empty_rail(mask: RailMask, failed: RailMask) -> RailMask {
    if !mask.is_empty() {
        mask
    } else if failed.contains(SOUT) {
        RailMask::SUP
    } else {
        RailMask::SOUT
    }
}

impl SendEngine {
    /// The bytes of a `size`-byte send that go on SOUT (the rest go on SUP), given which
    /// rails have failed. The policy reads the rails' views where they are (no copy).
    #[inline]
    fn sout_part(&mut self, size: u64, now_ns: u64, failed: RailMask) -> u64 {
        if failed.contains(SUP) {
            size
        } else if failed.contains(SOUT) {
            0
        } else {
            let views = [self.tel[SOUT].view(), self.tel[SUP].view()];
            let s = self.split.sout_bytes(size, now_ns, views).min(size);
            // A policy must answer in 128-byte units; repair anything else.
            if s != size && !s.is_multiple_of(SHARE_ALIGN) { crate::split::align_share(s, size) } else { s }
        }
    }

    /// The next data QP of `rail` (round robin).
    #[inline]
    pub(super) fn next_qp(&mut self, rail: usize) -> QpRef {
        crate::engine::send_path::next_qp(&mut self.rr, &self.cfg.qps, rail)
    }

    /// Book-keeping of a chain posted on `rail` for `slot`: counters, telemetry, in flight.
    /// Always inlined: as a call (one a send) its arguments and frame cost a fifth of it.
    #[inline(always)]
    fn posted(&mut self, now_ns: u64, rail: usize, slot: usize, wrs: u64, rail_bytes: u64, total: u64) {
        // One doorbell; exactly one WRITE_WITH_IMM per active rail.
        self.tel[rail].stats().count_post(wrs, 1, rail_bytes, total);
        self.track(now_ns, rail, slot, rail_bytes);
    }

    /// The rail's share of `slot` (`rail_bytes`, in one chain or striped) is in flight.
    #[inline(always)]
    fn track(&mut self, now_ns: u64, rail: usize, slot: usize, rail_bytes: u64) {
        self.tel[rail].on_post(now_ns, rail_bytes);
        self.outstanding[rail] += 1;
        if self.fo.silence_next_ns == u64::MAX && self.fo.cfg.silence {
            // Work outstanding again: the silent-rail checks resume.
            self.fo.silence_next_ns = now_ns + crate::engine::failover::SILENCE_CHECK_NS;
            self.fo.timer_ns = self.fo.timer_ns.min(self.fo.silence_next_ns);
        }
        if !self.carried.contains(rail) {
            // Keepalives may now be owed on this rail: check at the next `test`.
            (self.carried, self.probe_check_ns) = (self.carried.with(rail), 0);
        }
        let ps = &mut self.slots[slot];
        ps.posted_ns[rail] = now_ns;
        ps.bytes[rail] = rail_bytes;
    }

    /// Splits and posts the fully matched slot `cur`: one chain per active rail. The fast
    /// path (one receive whose size the IMM encodes) is decided here, inlined into `isend`;
    /// the others take [`Self::post_records`].
    #[inline(always)]
    pub(super) fn post_slot(&mut self, now_ns: u64, mem: &mut impl SendMemory, out: &mut Posts) -> Result<()> {
        let slot = (self.fifo_head % SLOTS as u64) as usize;
        let failed = self.failed_rails();
        if failed == RailMask::BOTH {
            return self.no_rail_to_post();
        }
        if self.cur.n == 1 {
            let id = self.cur.reqs[0].expect("matched");
            let size = self.reqs[id as usize].size;
            if Imm::size_q_for(size) != SIZEQ_SENTINEL {
                self.post_single(now_ns, slot, id, size, failed, out);
                return Ok(());
            }
        }
        self.post_records(now_ns, slot, failed, mem, out);
        Ok(())
    }

    /// A multi-receive (or oversized) slot: the data WRITEs, then on each active rail a
    /// signalling WRITE_WITH_IMM, the leader's carrying the sizes into the records.
    #[inline(never)]
    fn post_records(&mut self, now_ns: u64, slot: usize, failed: RailMask, mem: &mut impl SendMemory, out: &mut Posts) {
        let n = self.cur.n;
        // Per send: bytes on SOUT (the first part of the buffer), the rest on SUP.
        let mut sout = [0u64; MAX_RECVS];
        let mut sizes = [0u64; MAX_RECVS];
        let mut ids = [0u16; MAX_RECVS];
        let mut mask = RailMask::NONE;
        let mut total = 0u64;
        for i in 0..n {
            ids[i] = self.cur.reqs[i].expect("matched");
            let size = self.reqs[ids[i] as usize].size;
            let s = self.sout_part(size, now_ns, failed);
            sizes[i] = size;
            sout[i] = s;
            total += size;
            mask |= rails_carrying(s, size);
        }
        let mask = or_empty_rail(mask, failed);
        let imm = Imm { slot: slot as u8, mask, size_q: SIZEQ_SENTINEL }.encode();
        let leader = if mask.contains(SOUT) { SOUT } else { SUP };
        mem.write_sizes(slot, &sizes[..n]);
        let seq = self.fifo_head;
        self.slots[slot] = PostedSlot { n: n as u8, reqs: ids, pending: mask, seq, ..PostedSlot::default() };
        let r = &mut self.fo.replays[slot];
        (r.imm, r.replay, r.replay_wait) = (imm, RailMask::NONE, RailMask::NONE);
        for i in 0..n {
            r.parts[i] = PartSrc::of(&self.cur.bufs[i], &self.cur.entries[i], sout[i], sizes[i]);
        }
        // An inactive rail sends nothing at all.
        for rail in mask.iter() {
            if self.stripes && self.cfg.pieces[rail] > 1 {
                let ranges: [(u64, u64); MAX_RECVS] = std::array::from_fn(|i| {
                    if i >= n {
                        (0, 0)
                    } else if rail == SOUT {
                        (0, sout[i])
                    } else {
                        (sout[i], sizes[i] - sout[i])
                    }
                });
                let rail_bytes: u64 = ranges[..n].iter().map(|r| r.1).sum();
                if rail_bytes > SHARE_ALIGN {
                    let sizes = if rail == leader { Some(n) } else { None };
                    self.post_striped(now_ns, rail, slot, &ranges[..n], sizes, imm, total, out);
                    continue;
                }
            }
            let qp = self.next_qp(rail);
            let c = out.push(rail, qp);
            let mut rail_bytes = 0u64;
            for i in 0..n {
                let (off, len) = if rail == SOUT { (0, sout[i]) } else { (sout[i], sizes[i] - sout[i]) };
                rail_bytes += len;
                if len > 0 {
                    c.push(self.data_wr(rail, slot, &self.cur.bufs[i], &self.cur.entries[i], off, len, None));
                }
            }
            let sizes = if rail == leader { Some(n) } else { None };
            c.push(self.signal_wr(rail, slot, sizes, imm));
            debug_assert!(c.len as usize <= MAX_CHAIN);
            let wrs = c.len as u64;
            self.posted(now_ns, rail, slot, wrs, rail_bytes, total);
        }
        self.fifo_head += 1;
    }

    /// A fully matched slot and no rail to post it on: in an outage it is held
    /// (`outage.rs`) and posted once a rail is back; otherwise the connection has failed.
    #[cold]
    #[inline(never)]
    fn no_rail_to_post(&mut self) -> Result<()> {
        if self.fo.outage_ns != 0 {
            self.matching = true;
            return Ok(());
        }
        Err(self.error.fail(Error::from_cause(ErrorKind::Remote, Cause::BothRailsFailed)))
    }

    /// The fast path of a single receive whose size `size_q` encodes: one WRITE_WITH_IMM
    /// per active rail carries its share of the data and the IMM.
    #[inline(always)]
    fn post_single(&mut self, now_ns: u64, slot: usize, id: u16, size: u64, failed: RailMask, out: &mut Posts) {
        let s = self.sout_part(size, now_ns, failed);
        let mask = or_empty_rail(rails_carrying(s, size), failed);
        let imm = Imm { slot: slot as u8, mask, size_q: Imm::size_q_for(size) }.encode();
        let ps = &mut self.slots[slot];
        (ps.n, ps.reqs[0], ps.pending, ps.seq) = (1, id, mask, self.fifo_head);
        let r = &mut self.fo.replays[slot];
        r.imm = imm;
        r.parts[0] = PartSrc::of(&self.cur.bufs[0], &self.cur.entries[0], s, size);
        if self.stripes {
            self.post_single_striped(now_ns, slot, s, size, mask, imm, out);
        } else {
            // An inactive rail sends nothing at all.
            for rail in mask.iter() {
                let (off, len) = if rail == SOUT { (0, s) } else { (s, size - s) };
                let qp = self.next_qp(rail);
                let wr = self.data_wr(rail, slot, &self.cur.bufs[0], &self.cur.entries[0], off, len, Some(imm));
                out.push(rail, qp).push(wr);
                self.posted(now_ns, rail, slot, 1, len, size);
            }
        }
        self.fifo_head += 1;
    }

    /// [`Self::post_single`]'s chains on a connection that stripes (one check per message
    /// on one that does not): a striping rail's share over 128 bytes in pieces, any other
    /// in one chain.
    #[allow(clippy::too_many_arguments)]
    #[cold]
    #[inline(never)]
    fn post_single_striped(
        &mut self,
        now_ns: u64,
        slot: usize,
        s: u64,
        size: u64,
        mask: RailMask,
        imm: u32,
        out: &mut Posts,
    ) {
        self.slots[slot].extra_pieces = [0; RAILS];
        for rail in [SOUT, SUP] {
            if !mask.contains(rail) {
                continue;
            }
            let (off, len) = if rail == SOUT { (0, s) } else { (s, size - s) };
            if self.cfg.pieces[rail] > 1 && len > SHARE_ALIGN {
                self.post_striped(now_ns, rail, slot, &[(off, len)], None, imm, size, out);
            } else {
                let qp = self.next_qp(rail);
                let wr = self.data_wr(rail, slot, &self.cur.bufs[0], &self.cur.entries[0], off, len, Some(imm));
                out.push(rail, qp).push(wr);
                self.posted(now_ns, rail, slot, 1, len, size);
            }
        }
    }

    /// Posts a rail's share of `slot` striped over its QPs (`MPIB_QP_STRIPE`): the share is
    /// the sends' byte `ranges` on the rail, one after the other; each piece, a run of
    /// [`stripe`]'s size, is a chain on the rail's next QP ending in a WRITE_WITH_IMM that
    /// announces the number of pieces. On the records path (`sizes`: `Some(n)` on the
    /// leader rail) the first piece writes the sizes: the receiver reads them only when
    /// every piece of every rail is in.
    #[allow(clippy::too_many_arguments)]
    #[cold]
    #[inline(never)]
    fn post_striped(
        &mut self,
        now_ns: u64,
        rail: usize,
        slot: usize,
        ranges: &[(u64, u64)],
        sizes: Option<usize>,
        imm: u32,
        total: u64,
        out: &mut Posts,
    ) {
        let rail_bytes: u64 = ranges.iter().map(|r| r.1).sum();
        let (piece, k) = stripe(rail_bytes, self.cfg.pieces[rail]);
        let imm = Imm::with_pieces(imm, k);
        let fast = sizes.is_none() && Imm::decode(imm).size_q != SIZEQ_SENTINEL;
        let (mut i, mut used) = (0, 0u64);
        for j in 0..k as u64 {
            let mut left = piece.min(rail_bytes - j * piece);
            let qp = self.next_qp(rail);
            let c = out.push(rail, qp);
            let bytes = left;
            while left > 0 {
                let (off, len) = ranges[i];
                let take = (len - used).min(left);
                if take > 0 {
                    let w = if fast && take == left { Some(imm) } else { None };
                    c.push(self.data_wr(rail, slot, &self.cur.bufs[i], &self.cur.entries[i], off + used, take, w));
                }
                (used, left) = (used + take, left - take);
                if used == len {
                    (i, used) = (i + 1, 0);
                }
            }
            if !fast {
                c.push(self.signal_wr(rail, slot, if j == 0 { sizes } else { None }, imm));
            }
            debug_assert!(c.len as usize <= MAX_CHAIN);
            let wrs = c.len as u64;
            self.tel[rail].stats().count_post(wrs, 1, bytes, total);
        }
        self.slots[slot].extra_pieces[rail] = k - 1;
        self.track(now_ns, rail, slot, rail_bytes);
    }

    /// A WRITE of `len` bytes at `off` of `buf` into `entry`'s buffer; with `imm`, the
    /// signalled WRITE_WITH_IMM of the fast path.
    #[allow(clippy::too_many_arguments)]
    #[inline]
    fn data_wr(
        &self,
        rail: usize,
        slot: usize,
        buf: &SendBuf,
        entry: &CtsEntry,
        off: u64,
        len: u64,
        imm: Option<u32>,
    ) -> SendWr {
        let (kind, opcode) =
            if imm.is_some() { (WrKind::DataSignal, WrOpcode::WriteImm) } else { (WrKind::Data, WrOpcode::Write) };
        let mut wr = SendWr {
            wr_id: kind.id(rail, slot),
            opcode,
            signaled: imm.is_some(),
            // Inline only from host memory: the CPU copies an inline payload (see CpuAccess).
            inline: buf.cpu == CpuAccess::Readable && len > 0 && len <= self.cfg.max_inline as u64,
            remote_addr: entry.addr + off,
            rkey: entry.rkeys[rail],
            imm: imm.unwrap_or(0),
            ..SendWr::default()
        };
        if len > 0 {
            wr.num_sge = 1;
            wr.sge[0] = Sge { addr: buf.addr + off, len: len as u32, lkey: buf.lkeys[rail] };
        }
        wr
    }

    /// The signalling WRITE_WITH_IMM of a multi-receive (or oversized) slot. `sizes`:
    /// `Some(n)` on the leader rail, whose WR also writes the slot's `n` sizes into the
    /// receiver's completion records; `None` on the other (IMM only).
    #[inline]
    fn signal_wr(&self, rail: usize, slot: usize, sizes: Option<usize>, imm: u32) -> SendWr {
        let off = (slot * RECORD_SLOT_BYTES) as u64;
        let mut wr = SendWr {
            wr_id: WrKind::DataSignal.id(rail, slot),
            opcode: WrOpcode::WriteImm,
            signaled: true,
            remote_addr: self.cfg.records_addr + off,
            rkey: self.cfg.records_rkeys[rail],
            imm,
            ..SendWr::default()
        };
        if let Some(n) = sizes {
            let len = (n * 8) as u32;
            wr.num_sge = 1;
            wr.inline = len <= self.cfg.max_inline;
            wr.sge[0] = Sge { addr: self.cfg.sizes_addr + off, len, lkey: self.cfg.sizes_lkeys[rail] };
        }
        wr
    }
}

/// How a rail share of `bytes` is striped over at most `most` QPs: the piece size, a
/// multiple of 128 bytes (the last piece may be shorter), and the number of pieces, each
/// carrying at least one byte (a 128-byte share is one piece).
#[inline]
pub(crate) fn stripe(bytes: u64, most: u8) -> (u64, u8) {
    if most <= 1 || bytes <= SHARE_ALIGN {
        return (bytes, 1);
    }
    let piece = bytes.div_ceil(most as u64).next_multiple_of(SHARE_ALIGN);
    (piece, bytes.div_ceil(piece) as u8)
}

impl PartSrc {
    /// What a replay of `buf`'s parts needs: sources, destinations, the split.
    #[inline(always)]
    fn of(buf: &SendBuf, entry: &CtsEntry, sout: u64, size: u64) -> PartSrc {
        PartSrc { src: buf.addr, lkeys: buf.lkeys, dst: entry.addr, rkeys: entry.rkeys, sout, size, cpu: buf.cpu }
    }
}
