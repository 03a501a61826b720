//! The idle-probe budget of one NIC, shared by every connection on it.
//!
//! Each connection probes its idle rails on its own (`RailTelemetry::idle_probe_due`), so
//! probes grow with connections: a communicator whose many comms each send small messages
//! leaves a rail idle on every comm (and, a message per comm every few ms, the other rail
//! too), and at 256 comms over the soft fabric the probes outnumbered the messages two to
//! one (`probe_rate`). The path a probe measures is the NIC's to the peer, not the
//! connection's, so a NIC needs only so many of them a second: the budget caps the idle
//! probes of all connections on the NIC together; a connection refused tries again an
//! interval later. Keepalives (a dead peer's detection) are not budgeted.
//!
//! A lock-free GCRA (generic cell rate algorithm, the leaky bucket as a virtual schedule):
//! one atomic holds the time the next probe is due at the steady rate; a probe is allowed
//! while that time is less than the burst ahead of now, and moves it on by one interval. A
//! refusal writes nothing, so connections refused do not bounce the cache line. Sans-IO:
//! the time is the caller's.

use std::sync::atomic::{AtomicU64, Ordering};

/// The budget lets this much time's worth of probes go at once (after a quiet spell).
const BURST_NS: u64 = 10_000_000;

/// Idle probes per second for one NIC (see the module documentation).
#[derive(Debug)]
pub struct ProbeBudget {
    /// Nanoseconds between probes at the steady rate; 0: no cap.
    interval_ns: u64,
    /// How far ahead of now the schedule may run: the burst, less one interval.
    ahead_ns: u64,
    /// When the next probe is due at the steady rate (the theoretical arrival time).
    next_ns: AtomicU64,
}

impl ProbeBudget {
    /// At most `per_second` probes a second (0: no cap), with bursts of 10 ms's worth (at
    /// least one).
    pub fn per_second(per_second: u64) -> ProbeBudget {
        let interval_ns = 1_000_000_000u64.checked_div(per_second).map_or(0, |i| i.max(1));
        let burst = (BURST_NS / interval_ns.max(1)).max(1);
        ProbeBudget { interval_ns, ahead_ns: (burst - 1) * interval_ns, next_ns: AtomicU64::new(0) }
    }

    /// No cap (tests and tools that drive one connection).
    pub fn unlimited() -> ProbeBudget {
        ProbeBudget::per_second(0)
    }

    /// Whether a probe may go at `now_ns`; if so it is counted against the budget.
    #[inline]
    pub fn take(&self, now_ns: u64) -> bool {
        if self.interval_ns == 0 {
            return true;
        }
        let mut next = self.next_ns.load(Ordering::Relaxed);
        loop {
            if next > now_ns.saturating_add(self.ahead_ns) {
                return false;
            }
            let after = next.max(now_ns) + self.interval_ns;
            match self.next_ns.compare_exchange_weak(next, after, Ordering::Relaxed, Ordering::Relaxed) {
                Ok(_) => return true,
                Err(seen) => next = seen,
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::sync::Arc;

    /// Probes allowed when asked every `step_ns` from `from_ns` for `for_ns`.
    fn allowed(b: &ProbeBudget, from_ns: u64, for_ns: u64, step_ns: u64) -> u64 {
        (0..for_ns / step_ns).filter(|i| b.take(from_ns + i * step_ns)).count() as u64
    }

    #[test]
    fn a_budget_allows_its_rate_and_one_burst() {
        // 10,000 a second: an interval of 100 µs, a burst of 100.
        let b = ProbeBudget::per_second(10_000);
        // Asked every µs for a second: the burst, then one per interval.
        let n = allowed(&b, 1_000_000_000, 1_000_000_000, 1_000);
        assert!((10_000..=10_100).contains(&n), "{n} allowed");
        // Asked far less often than the rate: every ask is allowed.
        let n = allowed(&b, 3_000_000_000, 1_000_000_000, 1_000_000);
        assert_eq!(n, 1_000);
    }

    #[test]
    fn a_burst_is_bounded_and_refills_at_the_rate() {
        let b = ProbeBudget::per_second(1_000);
        // 10 ms's worth (10) at once, then nothing at the same instant.
        let t = 5_000_000_000;
        assert_eq!((0..50).filter(|_| b.take(t)).count(), 10);
        assert!(!b.take(t));
        // One more per millisecond.
        assert!(!b.take(t + 999_999));
        assert!(b.take(t + 1_000_000));
        assert!(!b.take(t + 1_000_000));
    }

    #[test]
    fn no_cap_allows_everything_and_a_tiny_rate_still_allows_one() {
        let b = ProbeBudget::unlimited();
        assert!((0..10_000).all(|_| b.take(7)));
        // One a second: the burst is one probe.
        let b = ProbeBudget::per_second(1);
        assert!(b.take(0));
        assert!(!b.take(500_000_000));
        assert!(b.take(1_000_000_000));
    }

    #[test]
    fn threads_sharing_a_budget_never_exceed_it() {
        let b = Arc::new(ProbeBudget::per_second(100_000));
        // Four threads ask at the same simulated instants: 10 ms of time, 1 µs steps.
        let threads: Vec<_> = (0..4)
            .map(|_| {
                let b = b.clone();
                std::thread::spawn(move || allowed(&b, 0, 10_000_000, 1_000))
            })
            .collect();
        let total: u64 = threads.into_iter().map(|t| t.join().unwrap()).sum();
        // The burst (1,000) plus 10 ms at 100,000/s (1,000), whatever the interleaving.
        assert!(total <= 2_000, "{total} allowed");
        assert!(total >= 1_000, "{total} allowed");
    }
}
