//! RFC 6298 smoothed RTT and RTT variation, and the congestion signal built on them
//! (seed 000: a sample above SRTT + 4·RTTVAR means the path is queueing).

use super::{f64_of, u64_of};

/// SRTT / RTTVAR of one stream of samples (ns). Kept in `f64` so that small gains
/// (α = 1/8 on a 2 µs RTT) do not lose their fraction to truncation on every update.
#[derive(Clone, Copy, Debug, Default, PartialEq)]
pub struct RttEstimator {
    srtt: f64,
    rttvar: f64,
    samples: u64,
}

impl RttEstimator {
    /// Whether `sample_ns` exceeds SRTT + max(G, 4·RTTVAR), RFC 6298's RTO bound with
    /// `g_ns` as the clock granularity G. Never before the first sample. Ask before
    /// [`update`](Self::update): the signal compares against the estimate the sample
    /// has not yet moved.
    #[inline]
    pub fn exceeds(&self, sample_ns: u64, g_ns: f64) -> bool {
        self.samples > 0 && f64_of(sample_ns) > self.srtt + g_ns.max(4.0 * self.rttvar)
    }

    /// Feeds one sample with gains `alpha` (SRTT) and `beta` (RTTVAR).
    #[inline]
    pub fn update(&mut self, sample_ns: u64, alpha: f64, beta: f64) {
        let r = f64_of(sample_ns);
        if self.samples == 0 {
            // RFC 6298 (2.2): SRTT = R, RTTVAR = R/2.
            self.srtt = r;
            self.rttvar = r / 2.0;
        } else {
            // RFC 6298 (2.3): RTTVAR first, from the old SRTT.
            self.rttvar = (1.0 - beta) * self.rttvar + beta * (self.srtt - r).abs();
            self.srtt = (1.0 - alpha) * self.srtt + alpha * r;
        }
        self.samples += 1;
    }

    /// SRTT in ns, unrounded (for arithmetic: no round trip through an integer).
    #[inline]
    pub fn srtt(&self) -> f64 {
        self.srtt
    }

    pub fn srtt_ns(&self) -> u64 {
        u64_of(self.srtt)
    }

    pub fn rttvar_ns(&self) -> u64 {
        u64_of(self.rttvar)
    }

    #[cfg(test)]
    pub fn samples(&self) -> u64 {
        self.samples
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn rfc6298_first_and_second_sample() {
        let mut e = RttEstimator::default();
        assert!(!e.exceeds(u64::MAX, 0.0), "nothing to exceed before the first sample");
        e.update(1000, 0.125, 0.25);
        assert_eq!((e.srtt_ns(), e.rttvar_ns()), (1000, 500));
        assert!(!e.exceeds(2000, 0.0), "2000 < 1000 + 4*500");
        e.update(2000, 0.125, 0.25);
        // RTTVAR = 0.75*500 + 0.25*1000 = 625; SRTT = 0.875*1000 + 0.125*2000 = 1125.
        assert_eq!((e.srtt_ns(), e.rttvar_ns(), e.samples()), (1125, 625, 2));
        // Threshold now 1125 + 4*625 = 3625: equal is not above.
        assert!(!e.exceeds(3625, 0.0));
        assert!(e.exceeds(3626, 0.0));
        // A granularity larger than 4·RTTVAR raises the bar.
        assert!(!e.exceeds(3626, 3000.0));
        assert!(e.exceeds(4126, 3000.0));
    }

    #[test]
    fn steady_samples_converge_and_variance_decays() {
        let mut e = RttEstimator::default();
        e.update(10_000, 0.125, 0.25);
        for _ in 0..200 {
            e.update(3_000, 0.125, 0.25);
        }
        assert!(e.srtt_ns().abs_diff(3_000) <= 1, "{}", e.srtt_ns());
        assert!(e.rttvar_ns() <= 1, "{}", e.rttvar_ns());
        // Without variance, only the granularity floor keeps jitter from signalling.
        assert!(e.exceeds(3_100, 0.0));
        assert!(!e.exceeds(3_100, 3_000.0 / 8.0));
    }
}
