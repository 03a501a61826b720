//! Split policies: telemetry in, the bytes of each send on SOUT out (the rest on SUP).
//! One trait, a file per policy (as quinn-proto's congestion controllers); the plugin picks
//! one per connection from `MPIB_SPLIT`, and the engine asks it immediately before posting.
//! The trait's one method is the only door: the engine calls [`SplitPolicy::sout_bytes`] on
//! an [`AnySplit`] and nothing else, so a new policy is a file here, a variant of
//! [`AnySplit`] and a name in the configuration.

use crate::config::{Config, SplitMode};
use crate::rail::RailMask;
use crate::telemetry::RailView;

mod auto;
mod fixed;
pub mod sim;

pub use auto::Auto;
pub use fixed::Fixed;

/// Granularity of a share: LL/LL128 lines must not straddle rails (net_ib's
/// `IB_WRITE_CHUNK_ALIGNMENT`).
pub const SHARE_ALIGN: u64 = 128;

/// Decides, per send, how many of its bytes go on SOUT.
pub trait SplitPolicy {
    /// Bytes of a `size`-byte send to put on SOUT; the rest goes on SUP. The answer must
    /// be a multiple of [`SHARE_ALIGN`] or `size` itself; the engine clamps it to `size`.
    /// `rails[0]` is SOUT, `rails[1]` SUP, read where they are (the engine's telemetry: no
    /// copy per send). Called on the data path: a few arithmetic operations, no
    /// allocation, no lock.
    fn sout_bytes(&mut self, size: u64, now_ns: u64, rails: [&RailView; 2]) -> u64;
}

/// The policies, for static dispatch in the engine (the one `match` on them is here).
#[derive(Clone, Debug)]
pub enum AnySplit {
    Fixed(Fixed),
    Auto(Auto),
}

impl AnySplit {
    /// The policy for `MPIB_SPLIT` and `MPIB_SPLIT_MIN_BYTES`: one per connection.
    pub fn from_config(cfg: &Config) -> Self {
        Self::from_mode(cfg.split, cfg.split_min_bytes)
    }

    /// The policy for `mode`; under `auto`, sends below `split_min_bytes` go whole to one
    /// rail.
    pub fn from_mode(mode: SplitMode, split_min_bytes: u64) -> Self {
        match mode {
            SplitMode::Sout => AnySplit::Fixed(Fixed::percent(100)),
            SplitMode::Sup => AnySplit::Fixed(Fixed::percent(0)),
            SplitMode::Percent(p) => AnySplit::Fixed(Fixed::percent(p)),
            SplitMode::Auto => AnySplit::Auto(Auto::new(split_min_bytes)),
        }
    }
}

impl SplitPolicy for AnySplit {
    #[inline]
    fn sout_bytes(&mut self, size: u64, now_ns: u64, rails: [&RailView; 2]) -> u64 {
        match self {
            AnySplit::Fixed(p) => p.sout_bytes(size, now_ns, rails),
            AnySplit::Auto(p) => match p.quick(size, rails) {
                Some(s) => s,
                None => decide_out_of_line(p, size, now_ns, rails),
            },
        }
    }
}

/// The auto policy's arithmetic from a call of its own: inlined, the compiler computes
/// some of it ahead of the match on the policy, for fixed splits and held small sends too.
#[inline(never)]
fn decide_out_of_line(p: &mut Auto, size: u64, now_ns: u64, rails: [&RailView; 2]) -> u64 {
    p.decide(size, now_ns, rails)
}

/// The active rails of a `size`-byte transfer with `sout_bytes` on SOUT: a rail is active
/// only if it carries bytes (never a 0-byte IMM), and a transfer of 0 bytes uses SOUT alone.
#[inline]
pub fn active_mask(size: u64, sout_bytes: u64) -> RailMask {
    let sout = sout_bytes.min(size);
    match (sout > 0, size > sout) {
        (true, true) => RailMask::BOTH,
        (false, true) => RailMask::SUP,
        _ => RailMask::SOUT,
    }
}

/// `bytes` rounded to the nearest multiple of [`SHARE_ALIGN`], at most `size`; a share that
/// would leave the other rail less than one aligned unit goes whole to one rail.
#[inline]
pub fn align_share(bytes: u64, size: u64) -> u64 {
    let b = (bytes.min(size) + SHARE_ALIGN / 2) / SHARE_ALIGN * SHARE_ALIGN;
    if b >= size { size } else { b }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn mask_follows_the_bytes_and_empty_goes_to_sout() {
        assert_eq!(active_mask(0, 0), RailMask::SOUT);
        assert_eq!(active_mask(1000, 1000), RailMask::SOUT);
        assert_eq!(active_mask(1000, 5000), RailMask::SOUT, "clamped to the size");
        assert_eq!(active_mask(1000, 0), RailMask::SUP);
        assert_eq!(active_mask(1000, 512), RailMask::BOTH);
    }

    #[test]
    fn modes_pick_their_policy() {
        let view = RailView { speed_mbps: 100_000, ..RailView::default() };
        let rails = [&view, &view];
        let mut cfg = Config::default();
        assert!(matches!(AnySplit::from_config(&cfg), AnySplit::Auto(_)));
        // Auto's threshold comes from the configuration.
        cfg.split_min_bytes = 1 << 20;
        let s = AnySplit::from_config(&cfg).sout_bytes(1 << 19, 0, rails);
        assert!(s == 0 || s == 1 << 19, "below MPIB_SPLIT_MIN_BYTES: whole, got {s}");
        cfg.split_min_bytes = 0;
        assert_eq!(AnySplit::from_config(&cfg).sout_bytes(1 << 19, 0, rails), 1 << 18);
        assert_eq!(AnySplit::from_mode(SplitMode::Sup, 0).sout_bytes(4096, 0, rails), 0);
        assert_eq!(AnySplit::from_mode(SplitMode::Sout, 0).sout_bytes(4096, 0, rails), 4096);
        assert_eq!(AnySplit::from_mode(SplitMode::Percent(25), 0).sout_bytes(4096, 0, rails), 1024);
    }
}
