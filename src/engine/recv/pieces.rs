//! The receiver's side of striping (`MPIB_QP_STRIPE`): a rail's share of one request
//! arrives as up to four pieces, each a WRITE_WITH_IMM on its own QP whose IMM announces
//! how many there are (bits 6:5 of the slot byte). The rail's part is seen when the last
//! piece is in, with the bytes of all of them; until then nothing else of the slot moves.
//! A replay (failover) re-sends a part whole, so the pieces of a part that had not all
//! arrived when its rail was fenced are simply superseded by it.

use super::RecvEngine;
use crate::engine::Violation;
use crate::engine::imm::{Imm, SLOT_BITS};
use crate::engine::layout::RecvMemory;
use crate::error::Result;

impl RecvEngine {
    /// Striped rail shares replayed whole after some of their pieces had arrived.
    pub fn partial_parts(&self) -> u64 {
        self.partial_parts
    }

    /// One piece of a striped rail share, arrived on `rail` (its IMM's pieces field is set).
    #[cold]
    #[inline(never)]
    pub(super) fn on_piece(&mut self, rail: usize, imm: u32, byte_len: u64, mem: &impl RecvMemory) -> Result<()> {
        let Imm { slot: byte, mask, size_q } = Imm::decode(imm);
        let (slot, pieces) = ((byte & SLOT_BITS) as usize, Imm::pieces_of(byte));
        let most = self.cfg.pieces[rail];
        if pieces > most {
            return Err(self.violation(move || Violation::BadPieces { rail, slot, pieces, most }));
        }
        self.check_arrival(rail, slot, imm, mask, size_q)?;
        let s = &self.slots[slot];
        let earlier = s.pieces[rail];
        if s.pieces_seen[rail] > 0 && earlier != pieces {
            return Err(self.violation(move || Violation::PiecesChanged { rail, slot, pieces, earlier }));
        }
        let s = &mut self.slots[slot];
        if s.pieces_seen[rail] == 0 {
            (s.pieces[rail], s.part_bytes[rail]) = (pieces, 0);
        }
        s.pieces_seen[rail] += 1;
        s.part_bytes[rail] += byte_len;
        // The later IMMs of the slot are checked against this one's mask and size.
        (s.expected, s.size_q) = (mask, size_q);
        self.data_rails = mask;
        if s.pieces_seen[rail] < pieces {
            return Ok(());
        }
        let bytes = s.part_bytes[rail];
        self.accept(rail, rail, slot, mask, size_q, bytes, mem)
    }
}
