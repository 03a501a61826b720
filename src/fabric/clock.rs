//! The clock of the data path: `CLOCK_MONOTONIC` in nanoseconds, read straight from the
//! vDSO (std's `Instant` arithmetic costs about three times as many instructions, and the
//! data path reads the clock once per call). Completion timestamps that a NIC does not
//! provide are taken from it; `mpib-perf --timeline` uses the same clock.

/// Nanoseconds of `CLOCK_MONOTONIC`.
#[inline]
pub fn monotonic_ns() -> u64 {
    let mut ts = libc::timespec { tv_sec: 0, tv_nsec: 0 };
    // SAFETY: clock_gettime only writes the timespec it is given; CLOCK_MONOTONIC exists on
    // every Linux kernel, so the call cannot fail.
    unsafe { libc::clock_gettime(libc::CLOCK_MONOTONIC, &mut ts) };
    ts.tv_sec as u64 * 1_000_000_000 + ts.tv_nsec as u64
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn monotonic_and_matches_std() {
        let a = monotonic_ns();
        std::thread::sleep(std::time::Duration::from_millis(2));
        let b = monotonic_ns();
        assert!(b >= a + 2_000_000 && b < a + 2_000_000_000, "{a} {b}");
    }
}
