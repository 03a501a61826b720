//! Delivery rate of one rail (bytes per ns), from its own completions.
//!
//! Each completed chain contributes the bytes it carried and the time the rail spent
//! serving it:
//! - *queued* behind the previous chain (posted at least one base latency before the
//!   previous completion): the rail went straight from one to the other, so the service
//!   time is the gap between the two completions, exact for a FIFO rail whatever the
//!   latency;
//! - *alone* (the rail was idle when it was posted): its RTT minus the base latency. When
//!   that is less than half the RTT the sample is mostly latency and says little about
//!   bandwidth, so it is skipped (it is also what keeps an overestimated base latency from
//!   inflating the rate more than twofold).
//!
//! - either way, a chain shorter than [`MIN_SERVICE_NS`] at the link speed gives none: its
//!   timing is the host's (a scheduling hiccup, a poll loop), not the link's. Without this,
//!   a stream of 8-byte sends fed the estimate only their hiccups (the ones whose RTT
//!   doubled pass the rule above), the estimate sank until their serialization at it
//!   exceeded their RTT, the base latency (RTT less that serialization) went to 0, and from
//!   then on every such chain passed and held the estimate at 8 bytes per RTT: on the soft
//!   fabric, SOUT at 0.0003 bytes/ns against SUP's untouched 1.25, so the split's small
//!   sends reckoned SOUT 25 µs slower than it was.
//!
//! Idle time between chains is never counted, so an application that sends little does
//! not look like a slow rail. The contributions are low-pass filtered over *busy* time as a
//! ratio of decayed sums: `B ← k·B + bytes`, `T ← k·T + t`, `bw = B/T`, with
//! `k = 1/(1 + w + w²/2)` (the first terms of `e^w`, so the past fades about as
//! `e^(−busy time/τ)`), `w = t/τ`. It is a sum of bytes over a sum of time whatever `t` is,
//! so a burst of completions polled at one instant (all but the first with `t = 0`) counts
//! as all their bytes over the one interval they took, however long: after a stall of the
//! host (on the 2-core netem machine, milliseconds without a poll, then the completions of
//! several chains at once) the estimate is the rail's true rate over the stall, and a
//! stall that hits both rails leaves their ratio alone. Before a new interval is added,
//! the sums are scaled down to at most 2τ of busy time ([`MEMORY_TAUS`]): one long
//! interval (a retransmission timeout, say) then weighs as much as 2τ of traffic, so the
//! estimate recovers from it within 3τ even if the rail gets only small chains meanwhile.
//! A step in the true rate is followed with the error shrinking as `e^(−busy time/τ)`:
//! within 5 % after 3τ of busy time.
//!
//! (The filter this replaces, `bw ← (1 − w)·bw + bytes/max(t, τ)` with `w = min(t/τ, 1)`,
//! is the same for `t ≪ τ` but forgot everything at the first completion after an interval
//! of τ or more and added the others polled with it as `bytes/τ`: after a stall it said
//! how many chains the poll held rather than how fast the rail was, and the split swung
//! with it.)

use super::{f64_of, u64_of};

/// The most busy time (in τ) the sums hold when a new interval starts. A stall of the host
/// up to about 2τ is kept whole (its clump of completions is the rail's true rate over it,
/// and a stall that hits both rails leaves their ratio alone); a longer one counts as 2τ,
/// so it is forgotten within 3τ of traffic. (1τ made the simulated split settle later after
/// a halving with host stalls of 1–4 ms, τ = 2 ms: 71 of 100 seeds within 10 ms against 84
/// with 2τ, 85 with no bound.)
const MEMORY_TAUS: f64 = 2.0;

/// A chain that the link speed serves in less than this gives no sample (module comment).
pub const MIN_SERVICE_NS: f64 = 1_000.0;

/// Low-pass filtered delivery rate; see the module comment.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct DeliveryRate {
    /// Bytes per ns: `bytes / busy_ns`.
    bw: f64,
    /// The decayed sums of the samples' bytes and busy time (ns); the prior counts as τ of
    /// busy time at its rate.
    bytes: f64,
    busy_ns: f64,
    /// The latest data completion seen (ns), 0 before the first.
    last_completion_ns: u64,
    /// Rate samples taken (chains that contributed).
    samples: u64,
    /// Chains of fewer bytes give no sample: [`MIN_SERVICE_NS`] at the link speed.
    min_bytes: u64,
}

impl DeliveryRate {
    /// Starts from `prior_bytes_per_ns` (the link speed), which the first few τ of busy
    /// time replace; chains it serves in under [`MIN_SERVICE_NS`] give no sample.
    pub fn new(prior_bytes_per_ns: f64) -> Self {
        DeliveryRate {
            bw: prior_bytes_per_ns,
            bytes: 0.0,
            busy_ns: 0.0,
            last_completion_ns: 0,
            samples: 0,
            min_bytes: u64_of(prior_bytes_per_ns * MIN_SERVICE_NS).max(1),
        }
    }

    /// A data chain of `bytes` posted at `posted_ns` completed at `completed_ns`;
    /// `base_ns` is the rail's current base latency (RTT of an empty chain).
    #[inline]
    pub fn on_chain(&mut self, posted_ns: u64, completed_ns: u64, bytes: u64, base_ns: u64, tau_ns: u64) {
        let prev = self.last_completion_ns;
        self.last_completion_ns = prev.max(completed_ns);
        if bytes < self.min_bytes {
            return;
        }
        let queued = prev != 0 && posted_ns.saturating_add(base_ns) <= prev;
        let service_ns = if queued {
            completed_ns.saturating_sub(prev)
        } else {
            let rtt = completed_ns.saturating_sub(posted_ns);
            let service = rtt.saturating_sub(base_ns);
            if service == 0 || 2 * service < rtt {
                return;
            }
            service
        };
        let (t, tau) = (f64_of(service_ns), f64_of(tau_ns.max(1)));
        if self.samples == 0 {
            (self.bytes, self.busy_ns) = (self.bw * tau, tau);
        }
        if t > 0.0 && self.busy_ns > MEMORY_TAUS * tau {
            // A new interval starts: what came before weighs at most 2τ of busy time.
            self.bytes *= MEMORY_TAUS * tau / self.busy_ns;
            self.busy_ns = MEMORY_TAUS * tau;
        }
        let w = t / tau;
        let k = 1.0 / (1.0 + w * (1.0 + 0.5 * w));
        self.bytes = k * self.bytes + f64_of(bytes);
        self.busy_ns = k * self.busy_ns + t;
        self.bw = self.bytes / self.busy_ns;
        self.samples += 1;
    }

    /// The estimate, bytes per ns.
    pub fn bytes_per_ns(&self) -> f64 {
        self.bw
    }

    /// The estimate, bytes per second.
    pub fn bytes_per_s(&self) -> u64 {
        u64_of(self.bw * 1e9)
    }

    /// Chains that contributed a sample.
    #[inline]
    pub fn samples(&self) -> u64 {
        self.samples
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const TAU: u64 = 1_000_000;

    /// A FIFO rail at `rate` bytes/ns with round-trip latency `lat`: returns the
    /// completion time of a chain posted at `t`, given when the rail frees up.
    fn serve(busy_until: &mut u64, t: u64, bytes: u64, rate: f64, lat: u64) -> u64 {
        let start = (*busy_until).max(t);
        *busy_until = start + (bytes as f64 / rate) as u64;
        *busy_until + lat
    }

    fn rel_err(got: f64, want: f64) -> f64 {
        (got - want).abs() / want
    }

    #[test]
    fn pipelined_chains_give_the_rail_rate() {
        // 8 chains of 256 KiB kept in flight on a 0.5 B/ns (4 Gbit/s) rail, 50 µs latency.
        let (rate, lat, bytes) = (0.5, 50_000, 256 << 10);
        let mut r = DeliveryRate::new(12.5);
        let mut busy = 0;
        let mut inflight: std::collections::VecDeque<(u64, u64)> = (0..8).map(|_| (0, 0)).collect();
        for c in inflight.iter_mut() {
            *c = (0, serve(&mut busy, 0, bytes, rate, lat));
        }
        for _ in 0..100 {
            let (posted, done) = inflight.pop_front().unwrap();
            r.on_chain(posted, done, bytes, lat, TAU);
            inflight.push_back((done, serve(&mut busy, done, bytes, rate, lat)));
        }
        assert!(rel_err(r.bytes_per_ns(), rate) < 0.01, "{}", r.bytes_per_ns());
    }

    #[test]
    fn completions_polled_in_bursts_give_the_same_rate() {
        // The clock is read once per poll: every completion of a poll batch carries the
        // batch's time, so within a batch all but the first show no service time at all.
        let (rate, lat, bytes, poll) = (1.0, 5_000, 64 << 10, 300_000u64);
        let mut r = DeliveryRate::new(25.0);
        let mut busy = 0;
        let mut t = 0;
        let mut queue: std::collections::VecDeque<(u64, u64)> = std::collections::VecDeque::new();
        for _ in 0..16 {
            queue.push_back((0, serve(&mut busy, 0, bytes, rate, lat)));
        }
        while t < 20_000_000 {
            t += poll;
            let mut batch = 0;
            while queue.front().is_some_and(|&(_, done)| done <= t) {
                let (posted, _) = queue.pop_front().unwrap();
                r.on_chain(posted, t, bytes, lat, TAU);
                batch += 1;
            }
            for _ in 0..batch {
                queue.push_back((t, serve(&mut busy, t, bytes, rate, lat)));
            }
        }
        assert!(rel_err(r.bytes_per_ns(), rate) < 0.05, "{}", r.bytes_per_ns());
    }

    #[test]
    fn idle_gaps_do_not_look_like_a_slow_rail() {
        // One 1 MiB chain at a time with 2 ms of idle time in between: each is served
        // alone, and the idle time is not counted.
        let (rate, lat, bytes) = (2.0, 20_000, 1 << 20);
        let mut r = DeliveryRate::new(0.1);
        let mut busy = 0;
        let mut t = 0;
        for _ in 0..50 {
            let done = serve(&mut busy, t, bytes, rate, lat);
            r.on_chain(t, done, bytes, lat, TAU);
            t = done + 2_000_000;
        }
        assert!(rel_err(r.bytes_per_ns(), rate) < 0.01, "{}", r.bytes_per_ns());
    }

    #[test]
    fn latency_bound_chains_and_empty_chains_are_skipped() {
        let mut r = DeliveryRate::new(3.0);
        // 128 bytes over a 10 µs RTT: 10 ns of serialization, all latency.
        r.on_chain(0, 10_010, 128, 10_000, TAU);
        r.on_chain(20_000, 30_000, 0, 10_000, TAU);
        assert_eq!((r.bytes_per_ns(), r.samples()), (3.0, 0));
    }

    /// 8-byte chains whose RTT jitters (every fourth a host hiccup of twice the RTT) on a
    /// rail of 1.25 bytes/ns: the hiccups pass the half-RTT rule, but such chains say
    /// nothing of the link, and the estimate stays where it was (it sank to 8 bytes per RTT
    /// before the floor).
    #[test]
    fn chains_too_short_for_the_link_speed_to_time_give_no_sample() {
        let mut r = DeliveryRate::new(1.25);
        let (lat, mut t) = (10_000u64, 1_000_000u64);
        for i in 0..10_000u64 {
            let rtt = if i % 4 == 0 { 3 * lat } else { lat + i % 700 };
            r.on_chain(t, t + rtt, 8, lat, TAU);
            t += rtt + 1_000;
        }
        assert_eq!((r.bytes_per_ns(), r.samples()), (1.25, 0));
        // At the floor (1 µs at the link speed: 1,250 bytes) they count.
        r.on_chain(t, t + 2 * lat + 1_000, 1_250, lat, TAU);
        assert_eq!(r.samples(), 1);
    }

    #[test]
    fn a_halved_rate_is_followed_within_three_tau_of_busy_time() {
        let (lat, bytes) = (20_000, 128 << 10);
        let mut rate = 1.0;
        let mut r = DeliveryRate::new(1.0);
        let mut busy = 0;
        let mut q: std::collections::VecDeque<(u64, u64)> = std::collections::VecDeque::new();
        for _ in 0..8 {
            q.push_back((0, serve(&mut busy, 0, bytes, rate, lat)));
        }
        let mut change_at = None;
        let mut within_at = None;
        while within_at.is_none() {
            let (posted, done) = q.pop_front().unwrap();
            r.on_chain(posted, done, bytes, lat, TAU);
            if done > 10_000_000 && change_at.is_none() {
                rate = 0.5;
                change_at = Some(done);
            }
            if change_at.is_some() && rel_err(r.bytes_per_ns(), 0.5) < 0.05 {
                within_at = Some(done);
            }
            q.push_back((done, serve(&mut busy, done, bytes, rate, lat)));
        }
        let took = within_at.unwrap() - change_at.unwrap();
        // The chains already queued at the old rate drain first (8 × 131 µs); then 3τ.
        assert!(took <= 3 * TAU + 8 * 262_144, "{took} ns");
        assert!(took >= TAU, "{took} ns: faster than the filter allows, so it is not filtering");
    }

    #[test]
    fn completions_held_by_stalls_of_the_host_give_the_rate() {
        // 16 chains of 128 KiB kept in flight on a 0.5 B/ns rail (4 ms of work); the sender
        // is off the CPU 2 ms of every 5 (a shared 2-core machine), so the completions of
        // those 2 ms are polled together when it runs again, all with the same time.
        let (rate, lat, bytes) = (0.5, 40_000, 128 << 10);
        let stalled = |t: u64| t % 5_000_000 < 2_000_000;
        let seen = |t: u64| if stalled(t) { t - t % 5_000_000 + 2_000_000 } else { t };
        let mut r = DeliveryRate::new(12.5);
        let mut busy = 0;
        let mut q: std::collections::VecDeque<(u64, u64)> = std::collections::VecDeque::new();
        for _ in 0..16 {
            q.push_back((0, seen(serve(&mut busy, 0, bytes, rate, lat))));
        }
        let mut worst: f64 = 0.0;
        while let Some((posted, done)) = q.pop_front() {
            r.on_chain(posted, done, bytes, lat, TAU);
            // What the split sees: the estimate once the poll's whole batch is in.
            let batch_done = q.front().is_none_or(|&(_, next)| next > done);
            if done > 20_000_000 && batch_done {
                worst = worst.max(rel_err(r.bytes_per_ns(), rate));
            }
            if done < 60_000_000 {
                q.push_back((done, seen(serve(&mut busy, done, bytes, rate, lat))));
            }
        }
        assert!(worst < 0.15, "the estimate strays {:.0} % from the rate", worst * 100.0);
    }

    #[test]
    fn one_long_stall_is_forgotten_within_a_few_tau() {
        // 1 B/ns; one chain completes 200 ms after the one before it (a retransmission
        // timeout, say), then the rail gets only small chains (8 KiB, 8 µs each).
        let mut r = DeliveryRate::new(1.0);
        let (lat, mut t) = (10_000, 1_000_000u64);
        for _ in 0..100 {
            r.on_chain(t - 100_000, t, 64 << 10, lat, TAU);
            t += 65_536;
        }
        t += 200_000_000;
        r.on_chain(t - 201_000_000, t, 64 << 10, lat, TAU);
        assert!(r.bytes_per_ns() < 0.1, "{}", r.bytes_per_ns());
        let until = t + 3 * TAU;
        while t < until {
            t += 8_192;
            r.on_chain(t - 50_000, t, 8 << 10, lat, TAU);
        }
        assert!(rel_err(r.bytes_per_ns(), 1.0) < 0.1, "{} after 3τ", r.bytes_per_ns());
    }
}
