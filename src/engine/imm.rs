//! The 32-bit immediate data of every WRITE_WITH_IMM (seed 003 §2.2), packed with shifts
//! and masks, never bitfields:
//!
//! ```text
//!  [ 4:0]   slot         CTS slot of the request (0..31, `layout::SLOTS`)
//!  [ 6:5]   pieces - 1   this rail's WRITE_WITH_IMMs for the slot, less one: a rail's
//!                        share striped over up to 4 of its QPs (`MPIB_QP_STRIPE`); 0 when
//!                        not striped and in a replay
//!  [ 7]     replay       this IMM delivers the OTHER rail's part (rail failover):
//!                        part = arrival rail XOR this bit
//!  [ 9:8]   active mask  rails that carry the transfer: bit0 SOUT, bit1 SUP (1, 2 or 3)
//!  [31:10]  size_q       ceil(bytes / 128) for a single receive; all ones = sentinel
//!                        "read the sizes from the completion records"
//! ```
//!
//! Values here are in host order; the fabric puts them on the wire in network byte order.

/// Size granularity of `size_q`.
pub const SIZE_GRANULE: u64 = 128;
/// Bits of `size_q`.
pub const SIZEQ_BITS: u32 = 22;
/// `size_q` value meaning "sizes are in the completion records".
pub const SIZEQ_SENTINEL: u32 = (1 << SIZEQ_BITS) - 1;
/// Largest single-receive size the fast path encodes: (2^22 − 2) · 128 bytes (≈ 512 MiB).
pub const MAX_FAST_SIZE: u64 = (SIZEQ_SENTINEL as u64 - 1) * SIZE_GRANULE;

use crate::rail::RailMask;

/// The slot byte's replay bit: the IMM delivers the part of the rail it did not arrive on
/// (a part re-posted on the surviving rail after a failover). The decoded `slot` keeps it,
/// so the receiver's data path (`slot >= SLOTS`) sends every replayed IMM to its cold path.
pub const REPLAY_FLAG: u8 = 0x80;

/// Most pieces a rail's share of one request is striped over (the 2-bit field).
pub const MAX_PIECES: u8 = 4;
/// Where the pieces field sits in the slot byte.
const PIECES_SHIFT: u32 = 5;
/// The slot byte's pieces field. Set, the decoded `slot` is `SLOTS` or more, so a striped
/// IMM takes the receiver's cold path like a replay.
pub const PIECES_BITS: u8 = 0x60;

/// The slot byte's bits that name the slot.
pub const SLOT_BITS: u8 = 0x1f;

/// Decoded immediate data.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Imm {
    pub slot: u8,
    /// The active rails; its bits are the field's (bit 0 SOUT, bit 1 SUP).
    pub mask: RailMask,
    pub size_q: u32,
}

impl Imm {
    /// Packs the fields. `size_q` must fit 22 bits.
    #[inline]
    pub fn encode(self) -> u32 {
        debug_assert!(self.size_q <= SIZEQ_SENTINEL);
        self.slot as u32 | ((self.mask.bits() as u32) << 8) | ((self.size_q & SIZEQ_SENTINEL) << 10)
    }

    /// Unpacks the fields (any 32-bit value decodes; validity is the receiver's check).
    #[inline]
    pub fn decode(v: u32) -> Imm {
        Imm { slot: (v & 0xff) as u8, mask: RailMask::from_bits_truncate((v >> 8) as u8), size_q: v >> 10 }
    }

    /// The same IMM marked as a replay (see [`REPLAY_FLAG`]).
    #[inline]
    pub fn replayed(v: u32) -> u32 {
        v | REPLAY_FLAG as u32
    }

    /// `v` announcing `pieces` (1..=[`MAX_PIECES`]) WRITE_WITH_IMMs on its rail.
    #[inline]
    pub fn with_pieces(v: u32, pieces: u8) -> u32 {
        debug_assert!((1..=MAX_PIECES).contains(&pieces));
        v | (((pieces - 1) as u32) << PIECES_SHIFT)
    }

    /// The pieces a decoded slot byte announces (1 when not striped).
    #[inline]
    pub fn pieces_of(slot_byte: u8) -> u8 {
        ((slot_byte & PIECES_BITS) >> PIECES_SHIFT) + 1
    }

    /// `size_q` for a single receive of `bytes`, or the sentinel when it does not fit.
    #[inline]
    pub fn size_q_for(bytes: u64) -> u32 {
        if bytes > MAX_FAST_SIZE { SIZEQ_SENTINEL } else { bytes.div_ceil(SIZE_GRANULE) as u32 }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn layout_matches_the_spec() {
        let v = Imm { slot: 0xab, mask: RailMask::BOTH, size_q: 5 }.encode();
        assert_eq!(v, 0xab | (3 << 8) | (5 << 10));
        assert_eq!(Imm { slot: 0, mask: RailMask::SOUT, size_q: SIZEQ_SENTINEL }.encode(), 0xffff_fc00 | (1 << 8));
        assert_eq!(Imm::decode(0x0000_0200).mask, RailMask::SUP);
    }

    #[test]
    fn round_trip_every_field_extreme() {
        for slot in [0u8, 1, 127, 255] {
            for mask in [RailMask::SOUT, RailMask::SUP, RailMask::BOTH] {
                for size_q in [0u32, 1, 4096, SIZEQ_SENTINEL - 1, SIZEQ_SENTINEL] {
                    let imm = Imm { slot, mask, size_q };
                    assert_eq!(Imm::decode(imm.encode()), imm);
                }
            }
        }
    }

    #[test]
    fn replay_flag_is_bit_7_of_the_slot_byte() {
        let v = Imm { slot: 31, mask: RailMask::BOTH, size_q: 9 }.encode();
        let r = Imm::decode(Imm::replayed(v));
        assert_eq!((r.slot, r.mask, r.size_q), (31 | REPLAY_FLAG, RailMask::BOTH, 9));
        const { assert!(crate::engine::layout::SLOTS <= REPLAY_FLAG as usize) };
    }

    #[test]
    fn pieces_are_bits_6_5_of_the_slot_byte() {
        let v = Imm { slot: 7, mask: RailMask::SUP, size_q: 3 }.encode();
        for pieces in 1..=MAX_PIECES {
            let d = Imm::decode(Imm::with_pieces(v, pieces));
            assert_eq!(Imm::pieces_of(d.slot), pieces);
            assert_eq!(d.slot & SLOT_BITS, 7);
            assert_eq!((d.mask, d.size_q), (RailMask::SUP, 3), "no other field moves");
            assert_eq!(d.slot >= crate::engine::layout::SLOTS as u8, pieces > 1, "striped IMMs take the cold path");
        }
        assert_eq!(Imm::with_pieces(v, 4) ^ v, 0x60);
        let r = Imm::decode(Imm::replayed(Imm::with_pieces(v, 2)));
        assert_eq!((r.slot & SLOT_BITS, Imm::pieces_of(r.slot), r.slot & REPLAY_FLAG), (7, 2, REPLAY_FLAG));
        const { assert!(SLOT_BITS as usize + 1 == crate::engine::layout::SLOTS) };
    }

    #[test]
    fn size_quantization_and_sentinel() {
        assert_eq!(Imm::size_q_for(0), 0);
        assert_eq!(Imm::size_q_for(1), 1);
        assert_eq!(Imm::size_q_for(128), 1);
        assert_eq!(Imm::size_q_for(129), 2);
        assert_eq!(Imm::size_q_for(MAX_FAST_SIZE), SIZEQ_SENTINEL - 1);
        assert_eq!(Imm::size_q_for(MAX_FAST_SIZE + 1), SIZEQ_SENTINEL);
        assert_eq!(Imm::size_q_for(600 << 20), SIZEQ_SENTINEL);
        const { assert!(MAX_FAST_SIZE > 511 << 20 && MAX_FAST_SIZE < 512 << 20) };
    }
}
