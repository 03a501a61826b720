//! The sender's replay data: for each slot posted, where its sends' bytes came from and
//! went, the IMM that announced them, and which of its parts are being replayed. Failover
//! reads it to send a lost part again on the surviving rail; the posting path only writes a
//! slot's record (indexed by the slot), and a healthy connection never reads it. The
//! replays themselves: a part the receiver's report says is missing waits for a rail
//! (`wait_for_rail`), then goes out again from the same source to the same destination
//! (`replay_part`).

use std::ops::{Index, IndexMut};

use super::{Failover, other};
use crate::engine::imm::{Imm, SIZEQ_SENTINEL};
use crate::engine::layout::{MAX_RECVS, RECORD_SLOT_BYTES, SLOTS};
use crate::engine::send_path::SendPath;
use crate::engine::{CpuAccess, Output, RAILS, RailMask, RailState, SOUT, SUP, WrKind};
use crate::fabric::{SendWr, Sge, WrOpcode};

/// Where one send's bytes came from and went: what a replay re-posts.
#[derive(Clone, Copy, Debug, Default)]
pub(crate) struct PartSrc {
    pub(crate) src: u64,
    pub(crate) lkeys: [u32; RAILS],
    pub(crate) dst: u64,
    pub(crate) rkeys: [u32; RAILS],
    /// Bytes on SOUT (the first part of the buffer); the rest of `size` went on SUP.
    pub(crate) sout: u64,
    pub(crate) size: u64,
    pub(crate) cpu: CpuAccess,
}

impl PartSrc {
    /// The byte range (offset, length) of the part that went on `rail`.
    #[inline]
    fn range(&self, rail: usize) -> (u64, u64) {
        if rail == SOUT { (0, self.sout) } else { (self.sout, self.size - self.sout) }
    }
}

/// One slot's replay record.
#[derive(Clone, Copy, Debug, Default)]
pub(crate) struct SlotReplay {
    /// The IMM the slot's chains carried (a replay carries it again, marked replayed).
    pub(crate) imm: u32,
    /// Parts whose replay on the other rail has not completed yet.
    pub(crate) replay: RailMask,
    /// Parts whose replay waits for the slot's own chain on the other rail to complete, so
    /// that a slot never has two chains on one rail (the send queues hold one per slot).
    pub(crate) replay_wait: RailMask,
    /// Its sends, in CTS order.
    pub(crate) parts: [PartSrc; MAX_RECVS],
}

/// The replay records of a sender's slots; none at a receiver (it replays nothing).
#[derive(Debug, Default)]
pub(crate) struct Replays(Box<[SlotReplay]>);

impl Replays {
    /// A record for each of a sender's slots.
    pub(crate) fn for_sender() -> Replays {
        Replays(vec![SlotReplay::default(); SLOTS].into_boxed_slice())
    }
}

impl Index<usize> for Replays {
    type Output = SlotReplay;
    #[inline(always)]
    fn index(&self, slot: usize) -> &SlotReplay {
        &self.0[slot]
    }
}

impl IndexMut<usize> for Replays {
    #[inline(always)]
    fn index_mut(&mut self, slot: usize) -> &mut SlotReplay {
        &mut self.0[slot]
    }
}

impl Failover {
    /// `part` of `slot` waits for a rail to take it (`replay_ready`).
    pub(super) fn wait_for_rail(&mut self, slot: usize, part: usize) {
        let rp = &mut self.replays[slot];
        rp.replay_wait = rp.replay_wait.with(part);
        self.replays_waiting += 1;
    }

    /// Posts the waiting replays whose slot has no live chain left on the rail that takes
    /// them: the other rail when it works (a replay), else the part's own rail when that
    /// one is back first after an outage (sent again as it was).
    #[cold]
    #[inline(never)]
    pub(super) fn replay_ready(&mut self, p: &mut SendPath<'_>, out: &mut Output) {
        for slot in 0..SLOTS {
            let wait = self.replays[slot].replay_wait;
            for part in wait.iter() {
                let up = |r: usize| self.state[r] == RailState::Up;
                let via = if up(other(part)) {
                    other(part)
                } else if up(part) {
                    part
                } else {
                    continue;
                };
                // A live chain of the slot on `via`: its own part's, unless that one died
                // too (waiting as well, or replayed elsewhere), or a replay riding on it.
                let (ps, rp) = (&p.slots[slot], &self.replays[slot]);
                let own = ps.pending.contains(via) && !(rp.replay_wait | rp.replay).contains(via);
                if own || rp.replay.contains(other(via)) {
                    continue;
                }
                let rp = &mut self.replays[slot];
                rp.replay_wait = rp.replay_wait.without(part);
                self.replays_waiting -= 1;
                self.replay_part(p, slot, part, via, out);
            }
        }
    }

    /// Re-posts `part` of `slot` on rail `via`: the same bytes from the same source to the
    /// same destination (`via`'s keys), ended by a WRITE_WITH_IMM whose IMM is the
    /// original's, with the replay flag when `via` is the other rail; for a multi-receive or
    /// oversized slot whose leader part this is, that WR also writes the completion records
    /// again. On the part's own rail (back after an outage) it is the part sent again, in
    /// one piece: completed as the original would have been.
    pub(super) fn replay_part(&mut self, p: &mut SendPath<'_>, slot: usize, part: usize, via: usize, out: &mut Output) {
        let resend = via == part;
        let (ps, rp) = (p.slots[slot], self.replays[slot]);
        let orig = Imm::decode(rp.imm);
        let imm = if resend { rp.imm } else { Imm::replayed(rp.imm) };
        let signal = if resend { WrKind::DataSignal } else { WrKind::ReplaySignal };
        let qp = p.next_qp(via);
        let (max_inline, n) = (p.cfg.max_inline as u64, ps.n as usize);
        let c = out.push(via, qp);
        let mut bytes = 0u64;
        let wr = |p: &PartSrc, kind: WrKind, imm: Option<u32>| {
            let (off, len) = p.range(part);
            let mut wr = SendWr {
                wr_id: kind.id(if imm.is_some() { part } else { via }, slot),
                opcode: if imm.is_some() { WrOpcode::WriteImm } else { WrOpcode::Write },
                signaled: imm.is_some(),
                inline: p.cpu == CpuAccess::Readable && len > 0 && len <= max_inline,
                remote_addr: p.dst + off,
                rkey: p.rkeys[via],
                imm: imm.unwrap_or(0),
                ..SendWr::default()
            };
            if len > 0 {
                wr.num_sge = 1;
                wr.sge[0] = Sge { addr: p.src + off, len: len as u32, lkey: p.lkeys[via] };
            }
            (wr, len)
        };
        if n == 1 && orig.size_q != SIZEQ_SENTINEL {
            let (w, len) = wr(&rp.parts[0], signal, Some(imm));
            c.add(w);
            bytes += len;
        } else {
            for p in &rp.parts[..n] {
                let (w, len) = wr(p, WrKind::Data, None);
                if len > 0 {
                    c.add(w);
                    bytes += len;
                }
            }
            let leader = if orig.mask.contains(SOUT) { SOUT } else { SUP };
            let off = (slot * RECORD_SLOT_BYTES) as u64;
            let mut w = SendWr {
                wr_id: signal.id(part, slot),
                opcode: WrOpcode::WriteImm,
                signaled: true,
                remote_addr: p.cfg.records_addr + off,
                rkey: p.cfg.records_rkeys[via],
                imm,
                ..SendWr::default()
            };
            if part == leader {
                let len = (n * 8) as u32;
                (w.num_sge, w.inline) = (1, len <= p.cfg.max_inline);
                w.sge[0] = Sge { addr: p.cfg.sizes_addr + off, len, lkey: p.cfg.sizes_lkeys[via] };
            }
            c.add(w);
        }
        let wrs = c.len as u64;
        p.tel[via].stats().count_post(wrs, 1, bytes, bytes);
        p.outstanding[via] += 1;
        if resend {
            // Completed, and sampled, as a part of its rail.
            let now = self.now_ns;
            p.tel[via].on_post(now, bytes);
            let ps = &mut p.slots[slot];
            (ps.posted_ns[via], ps.bytes[via], ps.extra_pieces[via]) = (now, bytes, 0);
        } else {
            let rp = &mut self.replays[slot];
            rp.replay = rp.replay.with(part);
        }
        self.replayed_parts += 1;
        self.replayed_bytes += bytes;
        p.tel[part].stats().count_replayed(bytes);
    }
}
