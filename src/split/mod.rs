//! Split policies: telemetry in, the bytes of each send on SOUT out (the rest on SUP).
//! One trait, a file per policy (as quinn-proto's congestion controllers); the plugin picks
//! one per connection from `MPIB_SPLIT`, and the engine asks it immediately before posting.

use crate::config::SplitMode;
use crate::telemetry::RailView;

mod fixed;

pub use fixed::Fixed;

/// Granularity of a share: LL/LL128 lines must not straddle rails (net_ib's
/// `IB_WRITE_CHUNK_ALIGNMENT`).
pub const SHARE_ALIGN: u64 = 128;

/// Decides, per send, how many of its bytes go on SOUT.
pub trait SplitPolicy {
    /// Bytes of a `size`-byte send to put on SOUT; the rest goes on SUP. The answer must
    /// be a multiple of [`SHARE_ALIGN`] or `size` itself; the engine clamps it to `size`.
    /// `rails[0]` is SOUT, `rails[1]` SUP. Called on the data path: a few arithmetic
    /// operations, no allocation, no lock.
    fn sout_bytes(&mut self, size: u64, now_ns: u64, rails: &[RailView; 2]) -> u64;
}

/// The policies, for static dispatch in the engine.
#[derive(Clone, Debug)]
pub enum AnySplit {
    Fixed(Fixed),
}

impl AnySplit {
    /// The policy for `MPIB_SPLIT`.
    pub fn from_mode(mode: SplitMode) -> Self {
        match mode {
            SplitMode::Sout => AnySplit::Fixed(Fixed::percent(100)),
            SplitMode::Sup => AnySplit::Fixed(Fixed::percent(0)),
            SplitMode::Percent(p) => AnySplit::Fixed(Fixed::percent(p)),
            // Until the telemetry-driven policy lands: half and half.
            SplitMode::Auto => AnySplit::Fixed(Fixed::percent(50)),
        }
    }
}

impl SplitPolicy for AnySplit {
    #[inline]
    fn sout_bytes(&mut self, size: u64, now_ns: u64, rails: &[RailView; 2]) -> u64 {
        match self {
            AnySplit::Fixed(p) => p.sout_bytes(size, now_ns, rails),
        }
    }
}

/// `bytes` rounded to the nearest multiple of [`SHARE_ALIGN`], at most `size`; a share that
/// would leave the other rail less than one aligned unit goes whole to one rail.
#[inline]
pub fn align_share(bytes: u64, size: u64) -> u64 {
    let b = (bytes.min(size) + SHARE_ALIGN / 2) / SHARE_ALIGN * SHARE_ALIGN;
    if b >= size { size } else { b }
}
