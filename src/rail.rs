//! The two rails of a device, by index and by set. A leaf every layer may use: rail indices
//! (`SOUT` = 0, `SUP` = 1) name one rail, a [`RailMask`] names a set of them (the IMM's
//! active mask, the rails a device has, the rails that failed, the rails with work in
//! flight). A mask is a bit set (bit 0 SOUT, bit 1 SUP) behind a type: no raw `0b11`, no
//! `[bool; 2]` between functions; its bits are read only where the wire needs them
//! ([`RailMask::bits`] for the IMM encoding).

use std::fmt;
use std::ops::{BitOr, BitOrAssign};

/// Rails per device: SOUT and SUP.
pub const RAILS: usize = 2;
/// Rail index of SOUT.
pub const SOUT: usize = 0;
/// Rail index of SUP.
pub const SUP: usize = 1;
/// Rail names, by index.
pub const RAIL_NAMES: [&str; RAILS] = ["SOUT", "SUP"];

/// A set of rails. `Copy`, one byte; every operation is a shift and a mask.
#[derive(Clone, Copy, PartialEq, Eq, Default, Hash)]
pub struct RailMask(u8);

impl RailMask {
    /// No rail.
    pub const NONE: RailMask = RailMask(0);
    /// SOUT alone.
    pub const SOUT: RailMask = RailMask(1 << SOUT);
    /// SUP alone.
    pub const SUP: RailMask = RailMask(1 << SUP);
    /// Both rails.
    pub const BOTH: RailMask = RailMask(Self::SOUT.0 | Self::SUP.0);

    /// The set of `rail` alone.
    #[inline]
    pub const fn of(rail: usize) -> RailMask {
        debug_assert!(rail < RAILS);
        RailMask(1 << rail)
    }

    /// The rails for which `f` holds.
    #[inline]
    pub fn from_fn(mut f: impl FnMut(usize) -> bool) -> RailMask {
        RailMask(f(SOUT) as u8 | (f(SUP) as u8) << 1)
    }

    /// The set whose bits (bit 0 SOUT, bit 1 SUP) are the low two of `bits`; the others
    /// are dropped (the IMM's mask field is two bits wide).
    #[inline]
    pub const fn from_bits_truncate(bits: u8) -> RailMask {
        RailMask(bits & Self::BOTH.0)
    }

    /// The bits of the set: bit 0 SOUT, bit 1 SUP (the IMM encoding).
    #[inline]
    pub const fn bits(self) -> u8 {
        self.0
    }

    /// Whether `rail` is in the set.
    #[inline]
    pub const fn contains(self, rail: usize) -> bool {
        self.0 & (1 << rail) != 0
    }

    #[inline]
    pub const fn is_empty(self) -> bool {
        self.0 == 0
    }

    /// Whether every rail of `self` is in `other`.
    #[inline]
    pub const fn is_subset(self, other: RailMask) -> bool {
        self.0 & !other.0 == 0
    }

    /// The set with `rail` added.
    #[inline]
    pub const fn with(self, rail: usize) -> RailMask {
        RailMask(self.0 | 1 << rail)
    }

    /// The set with `rail` removed.
    #[inline]
    pub const fn without(self, rail: usize) -> RailMask {
        RailMask(self.0 & !(1 << rail))
    }

    /// The lowest rail of the set (SOUT before SUP), if any.
    #[inline]
    pub const fn first(self) -> Option<usize> {
        if self.0 == 0 { None } else { Some(self.0.trailing_zeros() as usize) }
    }

    /// The rails of the set, SOUT first.
    #[inline]
    pub fn iter(self) -> Rails {
        Rails(self.0)
    }
}

/// The rails of a [`RailMask`], SOUT first: one bit taken off per step.
#[derive(Clone, Copy, Debug)]
pub struct Rails(u8);

impl Iterator for Rails {
    type Item = usize;
    #[inline]
    fn next(&mut self) -> Option<usize> {
        if self.0 == 0 {
            return None;
        }
        let rail = self.0.trailing_zeros() as usize;
        self.0 &= self.0 - 1;
        Some(rail)
    }
}

impl BitOr for RailMask {
    type Output = RailMask;
    #[inline]
    fn bitor(self, rhs: RailMask) -> RailMask {
        RailMask(self.0 | rhs.0)
    }
}

impl BitOrAssign for RailMask {
    #[inline]
    fn bitor_assign(&mut self, rhs: RailMask) {
        self.0 |= rhs.0;
    }
}

/// `{:#b}` prints the bits as the log lines always have (`0b11`, `0b1`).
impl fmt::Binary for RailMask {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        fmt::Binary::fmt(&self.0, f)
    }
}

/// The rails by name: `RailMask(SOUT|SUP)`, `RailMask(none)`.
impl fmt::Debug for RailMask {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("RailMask(")?;
        if self.is_empty() {
            f.write_str("none")?;
        }
        for (i, r) in self.iter().enumerate() {
            if i > 0 {
                f.write_str("|")?;
            }
            f.write_str(RAIL_NAMES[r])?;
        }
        f.write_str(")")
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn bits_are_the_imm_encoding() {
        assert_eq!((RailMask::SOUT.bits(), RailMask::SUP.bits(), RailMask::BOTH.bits()), (0b01, 0b10, 0b11));
        assert_eq!(RailMask::from_bits_truncate(0b111), RailMask::BOTH);
        assert_eq!(RailMask::from_bits_truncate(0b100), RailMask::NONE);
        assert_eq!(RailMask::of(SUP), RailMask::SUP);
        assert_eq!(RailMask::from_fn(|r| r == SUP), RailMask::SUP);
    }

    #[test]
    fn set_operations() {
        assert!(RailMask::BOTH.contains(SOUT) && RailMask::BOTH.contains(SUP));
        assert!(!RailMask::SUP.contains(SOUT));
        assert!(RailMask::SUP.is_subset(RailMask::BOTH) && !RailMask::BOTH.is_subset(RailMask::SOUT));
        assert!(RailMask::NONE.is_subset(RailMask::NONE) && RailMask::NONE.is_empty());
        assert_eq!(RailMask::BOTH.without(SOUT), RailMask::SUP);
        assert_eq!(RailMask::NONE.with(SUP) | RailMask::SOUT, RailMask::BOTH);
        assert_eq!((RailMask::BOTH.first(), RailMask::SUP.first(), RailMask::NONE.first()), (Some(0), Some(1), None));
        assert_eq!(RailMask::BOTH.iter().collect::<Vec<_>>(), [SOUT, SUP]);
        assert_eq!(RailMask::SUP.iter().collect::<Vec<_>>(), [SUP]);
    }

    #[test]
    fn formats() {
        assert_eq!(format!("{:#b} {:#b} {:#b}", RailMask::NONE, RailMask::SOUT, RailMask::BOTH), "0b0 0b1 0b11");
        assert_eq!(format!("{:?} {:?}", RailMask::BOTH, RailMask::NONE), "RailMask(SOUT|SUP) RailMask(none)");
    }
}
