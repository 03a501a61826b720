//! A fixed share of the bytes on SOUT: `MPIB_SPLIT=sout` (100 %), `sup` (0 %) or a
//! percentage.

use super::{SplitPolicy, align_share};
use crate::telemetry::RailView;

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Fixed {
    /// Percent of bytes on SOUT, 0–100.
    percent: u8,
}

impl Fixed {
    pub fn percent(percent: u8) -> Self {
        Fixed { percent: percent.min(100) }
    }
}

impl SplitPolicy for Fixed {
    #[inline]
    fn sout_bytes(&mut self, size: u64, _now_ns: u64, _rails: [&RailView; 2]) -> u64 {
        match self.percent {
            100 => size,
            0 => 0,
            p => align_share(size * p as u64 / 100, size),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const RAILS: [RailView; 2] = [RailView {
        speed_mbps: 1,
        srtt_ns: 0,
        rttvar_ns: 0,
        base_ns: 0,
        bw_bytes_per_s: 0,
        inflight_bytes: 0,
        drain_start_ns: 0,
        head_chain_bytes: 0,
        rate_sample_ns: 0,
        samples: 0,
        congested: false,
        congestion_events: 0,
        failed: false,
    }; 2];

    #[test]
    fn all_or_nothing() {
        for size in [0, 1, 127, 128, 129, 1 << 20] {
            assert_eq!(Fixed::percent(100).sout_bytes(size, 0, [&RAILS[0], &RAILS[1]]), size);
            assert_eq!(Fixed::percent(0).sout_bytes(size, 0, [&RAILS[0], &RAILS[1]]), 0);
        }
    }

    #[test]
    fn percentage_is_128_byte_aligned_or_whole() {
        let mut half = Fixed::percent(50);
        assert_eq!(half.sout_bytes(1 << 20, 0, [&RAILS[0], &RAILS[1]]), 1 << 19);
        assert_eq!(half.sout_bytes(1000, 0, [&RAILS[0], &RAILS[1]]), 512);
        // Too small to split into aligned parts: one rail takes it whole.
        let s = half.sout_bytes(100, 0, [&RAILS[0], &RAILS[1]]);
        assert!(s == 0 || s == 100, "{s}");
        for size in [129u64, 4096, 1_048_579, 64 << 20] {
            for p in [1u8, 10, 33, 50, 66, 99] {
                let s = Fixed::percent(p).sout_bytes(size, 0, [&RAILS[0], &RAILS[1]]);
                assert!(s <= size && (s % 128 == 0 || s == size), "p={p} size={size} -> {s}");
                let want = size as f64 * p as f64 / 100.0;
                assert!((s as f64 - want).abs() <= 128.0, "p={p} size={size} -> {s}, want ~{want}");
            }
        }
    }
}
