//! A data IMM arriving: the checks it must pass (its mask, a receive waiting for data, the
//! slot's earlier IMMs, no duplicate), its part recorded, and the slot's data complete with
//! its sizes once every part of the mask is in. The hot path of a receive; replays and
//! pieces take `failover.rs`'s and `pieces.rs`'s cold paths and come back to
//! `check_arrival` and `accept`.

use super::RecvEngine;
use crate::engine::imm::{Imm, SIZE_GRANULE, SIZEQ_SENTINEL};
use crate::engine::layout::{RecvMemory, SLOTS};
use crate::engine::slots::RecvState;
use crate::engine::{RailMask, Violation};
use crate::error::Result;

impl RecvEngine {
    pub(super) fn on_imm(&mut self, rail: usize, imm: u32, byte_len: u64, mem: &impl RecvMemory) -> Result<()> {
        let Imm { slot, mask, size_q } = Imm::decode(imm);
        let slot = slot as usize;
        if slot >= SLOTS {
            // Replays (the slot byte's bit 7) take the cold path.
            return self.on_odd_imm(rail, imm, byte_len, mem);
        }
        self.check_arrival(rail, slot, imm, mask, size_q)?;
        self.data_rails = mask;
        self.accept(rail, rail, slot, mask, size_q, byte_len, mem)
    }

    /// The checks every IMM of a slot passes, a whole part's or a piece's (`pieces.rs`):
    /// its mask names this device's rails and its own; the slot has a receive waiting for
    /// data; mask and `size_q` agree with the slot's earlier IMMs; the rail's part has not
    /// arrived yet; a size only for a single receive. Inlined into both callers.
    #[inline(always)]
    pub(super) fn check_arrival(
        &mut self,
        rail: usize,
        slot: usize,
        imm: u32,
        mask: RailMask,
        size_q: u32,
    ) -> Result<()> {
        let rails = self.cfg.rails_mask;
        if mask.is_empty() || !mask.is_subset(rails) {
            return Err(self.violation(move || Violation::BadMask { rail, slot, imm, mask, rails }));
        }
        if !mask.contains(rail) {
            return Err(self.violation(move || Violation::MaskOmitsRail { rail, slot, mask }));
        }
        let s = &self.slots[slot];
        let (state, data_done, expected, seen, prev_q, n) = (s.state, s.data_done, s.expected, s.seen, s.size_q, s.n);
        if state != RecvState::Posted || data_done {
            return Err(self.violation(move || Violation::NoReceiveWaiting { rail, slot }));
        }
        if !expected.is_empty() && expected != mask {
            return Err(self.violation(move || Violation::MaskChanged { rail, slot, mask, earlier: expected }));
        }
        if seen.contains(rail) {
            return Err(self.violation(move || Violation::DuplicateImm { rail, slot }));
        }
        if !expected.is_empty() && prev_q != size_q {
            return Err(self.violation(move || Violation::SizeQChanged { rail, slot, size_q, earlier: prev_q }));
        }
        if size_q != SIZEQ_SENTINEL && n != 1 {
            let n = n as usize;
            return Err(self.violation(move || Violation::SizeForMultiRecv { rail, slot, n }));
        }
        Ok(())
    }

    /// Records part `part` of `slot` (arrived on `rail`) as seen; completes the slot's data
    /// when every part of its mask is.
    #[allow(clippy::too_many_arguments)]
    #[inline(always)]
    pub(super) fn accept(
        &mut self,
        rail: usize,
        part: usize,
        slot: usize,
        mask: RailMask,
        size_q: u32,
        byte_len: u64,
        mem: &impl RecvMemory,
    ) -> Result<()> {
        let s = &mut self.slots[slot];
        let n = s.n as usize;
        s.expected = mask;
        s.size_q = size_q;
        s.seen = s.seen.with(part);
        s.byte_sum += byte_len;
        if s.seen != s.expected {
            return Ok(());
        }
        // Every active rail delivered: the data is in place. Sizes, exactly: the first `n`
        // of `sizes` (all `test` reads), written in place. A violation fails the connection
        // before the slot is done, so a size written before it is never reported.
        if size_q != SIZEQ_SENTINEL {
            // Fast path: each rail's WRITE_WITH_IMM carried its share; byte_len sums them.
            let (byte_sum, posted) = (s.byte_sum, s.posted[0]);
            if byte_sum.div_ceil(SIZE_GRANULE) != size_q as u64 || byte_sum > posted {
                return Err(self.violation(move || Violation::BytesMismatch {
                    rail,
                    slot,
                    bytes: byte_sum,
                    size_q,
                    posted,
                }));
            }
            s.sizes[0] = byte_sum;
        } else {
            for i in 0..n {
                let (got, posted) = (mem.record(slot, i), self.slots[slot].posted[i]);
                if got > posted {
                    return Err(self.violation(move || Violation::RecordTooLarge {
                        rail,
                        slot,
                        index: i,
                        claimed: got,
                        posted,
                    }));
                }
                self.slots[slot].sizes[i] = got;
            }
        }
        let st = &mut self.slots[slot];
        st.data_done = true;
        if !st.cts_pending {
            st.state = RecvState::Done;
        }
        Ok(())
    }
}
