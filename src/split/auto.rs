//! `MPIB_SPLIT=auto`: each send is divided so that both rails finish it at the same time.
//!
//! Rail i, with estimated rate `r_i` (bytes/ns), base latency `l_i` and `q_i` bytes in
//! flight, finishes `x` more bytes at `d_i + x / r_i`, where `d_i` ≈ `max(l_i, q_i / r_i)`
//! is when it would be done with what it already has ([`RailView::drain_ns`], which also
//! credits the progress of the chain on the wire since the last completion). In-flight
//! bytes include those on the wire, about `r_i·l_i` of them when the rail is busy, so
//! `q_i / r_i` already counts the latency once; an idle rail still pays `l_i`. Equal
//! finish times for a send of `S` bytes give SOUT
//!
//! ```text
//! x = (g·(d_1 − d_0)·r_1 + S) · r_0 / (r_0 + r_1)      clamped to [0, S], 128-byte aligned
//! ```
//!
//! with `g = 1` for exactly equal finish times. So when both rails are busy the split is
//! their rate ratio, and a rail with a longer queue gets less until it catches up: queued
//! bytes correct a wrong rate estimate before the estimate itself moves. mpib uses
//! `g = 1/2` ([`QUEUE_GAIN`]): the queue lengths come from rate estimates with some noise,
//! and correcting half of an imbalance per send converges as fast without swinging. And
//! the imbalance `Δ = d_1 − d_0` goes in as `Δ³/(Δ² + δ²)` with `δ = S/(r_0 + r_1)`, the
//! time the pair takes for the send itself: a drain time is known only to about a chain
//! (completions come a chain at a time, and several at once when the host was busy), so
//! an imbalance well below `δ` is mostly that grain and barely moves the split (by
//! `(Δ/δ)²` of it), while one well above it, as after a rail's rate changes, is
//! corrected as before (2.4 ms at `δ` = 0.5 ms: 96 %).
//!
//! - Sends below `MPIB_SPLIT_MIN_BYTES` go whole to the rail that finishes them first:
//!   latency-bound traffic pays one rail's overhead, and a stream of small sends still
//!   spreads over both rails as their queues grow. SOUT is their home: they go to SUP only
//!   while it finishes them sooner by more than [`SWITCH_MARGIN`] (back once SOUT is within
//!   half of it, or after [`AWAY_DECISIONS`] decisions in any case; never to a SUP
//!   with no latency sample yet), so two alike rails whose estimates differ by noise do not
//!   trade every message, and every connection's small sends (a request and its reply)
//!   share a rail. The choice is re-made
//!   every [`SMALL_SENDS_PER_DECISION`] small sends or quarter of `MPIB_SPLIT_MIN_BYTES`
//!   of them, and at once after a congestion event or a failure: a tiny send's finish time
//!   is its rail's latency, which the send itself does not move.
//! - Congestion: a new RTT sample above SRTT + 4·RTTVAR on a rail (see
//!   [`RailView::congested`]) cuts the rate at which it is given new bytes by a quarter
//!   (at most once per its SRTT: one congestion episode, one backoff); each clean sample
//!   adds back 1/8; the floor is 1/16 so a rail is never written off. What it already holds is
//!   still reckoned at its estimated rate.
//! - A healthy rail never starves: a rail whose delivery rate nothing has measured for
//!   [`STALE_NS`] is reckoned at least as fast as the other for new bytes. Its estimate may
//!   be stuck low (one bad sample taken while both rails shared a busy CPU; a rail given
//!   nothing, or only chains too small to tell bandwidth from latency, is never measured
//!   again), so it gets a real part until its own completions measure it; a rail that
//!   really is slower then falls back to its share. On loopback, where both rails share the
//!   host's CPU, SUP otherwise got 0 % of 32 KiB–2 MiB sends for good.
//! - A rail with failed completions gets nothing. Before any sample the rate estimate is
//!   the link speed, so the first sends follow the speeds.
//! - Cost per send: some twenty float operations and a few compares (a small send between
//!   decisions: a few compares); no allocation, no lock.

use super::{SplitPolicy, align_share};
use crate::telemetry::{RailView, f64_of};

/// Backoff factor scale: `FULL` = no backoff.
const FULL: u32 = 1024;
/// Multiplicative decrease on congestion: ×(1 − 2^−BACKOFF_SHIFT) = ×3/4. The delivery
/// rate follows a real slowdown within a few ms anyway; halving on top made the split
/// undershoot and swing back (ci/netem-rails.sh, SOUT 4 -> 2 Gbit/s: settle_ms 3.4, 15.3,
/// 18.3, 31.0 with halving; 1.0, 5.1, 6.0, 8.2, 11.7 with ×3/4).
const BACKOFF_SHIFT: u32 = 2;
/// Additive increase per clean RTT sample (1/8).
const RECOVER_STEP: u32 = FULL / 8;
/// The lowest factor: 1/16.
const FLOOR: u32 = FULL / 16;
/// Small sends leave SOUT for SUP only when SUP finishes them sooner by more than this part
/// of SOUT's finish time, and come back once SOUT is within half of it. Each switch wakes
/// the other rail's completion path (and its caches) for nothing when the rails are alike:
/// under valgrind the in-process rails' latency estimates jitter enough to trade every
/// other message. And one home rail for every connection keeps a request and its reply
/// on one link: when each side's small sends chose for themselves, the two directions of
/// a ping-pong sat on different rails for long stretches, and on the soft fabric each
/// message then paid a send of its own for the CTS or acknowledgement that otherwise
/// rides with it (`soft_rtt`: ~23 µs round trips against ~12 µs on one rail).
const SWITCH_MARGIN: f64 = 1.0 / 8.0;
/// Part of a queue imbalance between the rails that one send corrects. The imbalance is
/// measured through rate estimates that carry noise (a 1 % rate error on a 7 ms queue is
/// 70 µs); correcting all of it at once makes successive sends swing around the ratio,
/// half of it settles as fast (a few sends) without the swing.
const QUEUE_GAIN: f64 = 0.5;
/// A small send re-decides its rail (the finish-time comparison, some twenty float
/// operations, ~150 instructions: half again the rest of an 8-byte send's split and
/// posting) only after this many small sends on the rail it holds, or when their bytes
/// reach a quarter of `split_min_bytes` ([`Auto::small_budget`]), or when a rail saw a
/// congestion event or failed. A tiny send's finish time is its rail's latency, which one
/// more send does not move; a stream of larger ones still re-decides every send or two as
/// the queues grow. Any split send resets it: the next small send decides afresh.
const SMALL_SENDS_PER_DECISION: u32 = 8;
/// Decisions that small sends stay away from SOUT at most (~256 sends); then they go home,
/// where SOUT is measured as the rail carrying them is, and the next decision leaves again
/// if SUP is still clearly sooner (a genuinely faster SUP loses one run in 32). The rail
/// carrying them is measured by their own RTTs, whose acknowledgements ride on the peer's
/// replies, the idle one only by probes that wait for the peer's next poll of that rail: on
/// the soft fabric the carrying rail's base latency read 4.7 µs against 26 µs for the idle
/// one (the same link), so a comparison made while away hardly ever brought them back.
/// Small sends that once moved to SUP (a first decision against one slow sample) then
/// stayed there for the whole run while the replies came on SOUT: 23 µs round trips
/// against 13. (One send home instead of a run was not enough: its single sample did not
/// bring SOUT's base below a SUP base that was the least of thousands.)
const AWAY_DECISIONS: u32 = 32;
/// A rail whose delivery rate nothing has measured for this long is reckoned at least as
/// fast as the other for new bytes (see the module documentation).
pub const STALE_NS: u64 = 10_000_000;

/// No delivery-rate sample for [`STALE_NS`].
#[inline]
fn stale(v: &RailView, now_ns: u64) -> bool {
    now_ns.saturating_sub(v.rate_sample_ns) >= STALE_NS
}

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
struct RailState {
    /// Effective-rate factor, out of [`FULL`].
    factor: u32,
    seen_events: u64,
    seen_samples: u64,
    last_backoff_ns: Option<u64>,
}

impl Default for RailState {
    fn default() -> Self {
        RailState { factor: FULL, seen_events: 0, seen_samples: 0, last_backoff_ns: None }
    }
}

impl RailState {
    /// Applies the samples the rail took since the last send.
    #[inline]
    fn update(&mut self, now_ns: u64, v: &RailView) {
        let events = v.congestion_events.saturating_sub(self.seen_events);
        let clean = v.samples.saturating_sub(self.seen_samples).saturating_sub(events);
        self.seen_events = v.congestion_events;
        self.seen_samples = v.samples;
        let episode_over = self.last_backoff_ns.is_none_or(|t| now_ns.saturating_sub(t) >= v.srtt_ns);
        if events > 0 && episode_over {
            self.factor = (self.factor - (self.factor >> BACKOFF_SHIFT)).max(FLOOR);
            self.last_backoff_ns = Some(now_ns);
        } else if clean > 0 {
            self.factor = (self.factor as u64 + RECOVER_STEP as u64 * clean).min(FULL as u64) as u32;
        }
    }
}

/// The telemetry-driven split.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Auto {
    split_min_bytes: u64,
    rails: [RailState; 2],
    /// The rail the last small send took (0 = SOUT).
    small_rail: usize,
    /// Small sends that may still take `small_rail` without a decision.
    small_sends_left: u32,
    /// Their bytes, likewise.
    small_bytes_left: u64,
    /// Decisions left before small sends away from SOUT go back ([`AWAY_DECISIONS`]).
    away_left: u32,
}

impl Auto {
    /// Sends below `split_min_bytes` go whole to one rail.
    pub fn new(split_min_bytes: u64) -> Self {
        Auto {
            split_min_bytes,
            rails: [RailState::default(); 2],
            small_rail: 0,
            small_sends_left: 0,
            small_bytes_left: 0,
            away_left: 0,
        }
    }

    /// The bytes small sends may put on their rail between decisions.
    #[inline]
    fn small_budget(&self) -> u64 {
        self.split_min_bytes / 4
    }

    /// Whether a `size`-byte small send may take the rail of the last one without a
    /// decision (counted when so): see [`SMALL_SENDS_PER_DECISION`].
    #[inline(always)]
    fn small_send_held(&mut self, size: u64, rails: [&RailView; 2]) -> bool {
        if self.small_sends_left == 0
            || size > self.small_bytes_left
            || rails[0].congestion_events != self.rails[0].seen_events
            || rails[1].congestion_events != self.rails[1].seen_events
        {
            return false;
        }
        self.small_sends_left -= 1;
        self.small_bytes_left -= size;
        true
    }

    /// The current backoff factors of SOUT and SUP (1.0 = none), for tools and tests.
    pub fn backoff(&self) -> [f64; 2] {
        self.rails.map(|r| r.factor as f64 / FULL as f64)
    }

    /// The answer when it needs no arithmetic: an empty send, a failed rail, a small send
    /// held on its rail. Inlined where the policy is asked; [`Self::decide`] is not.
    #[inline(always)]
    pub(super) fn quick(&mut self, size: u64, rails: [&RailView; 2]) -> Option<u64> {
        if size == 0 {
            return Some(0);
        }
        match (rails[0].failed, rails[1].failed) {
            (false, true) | (true, true) => Some(size),
            (true, false) => Some(0),
            (false, false) if size < self.split_min_bytes && self.small_send_held(size, rails) => {
                Some(if self.small_rail == 0 { size } else { 0 })
            }
            (false, false) => None,
        }
    }

    /// The rail of the small sends from this decision on, given when each rail would finish
    /// the send. SOUT is home: SUP takes them only while it finishes them clearly sooner,
    /// also with each rail's smoothed RTT in place of its base latency (SOUT's first sample
    /// after an idle gap, alone in its base window then, is often slow: 105 µs against a
    /// smoothed 24), not before it has a latency of its own, and it gives them back after
    /// [`AWAY_DECISIONS`].
    #[inline(always)]
    fn small_rail_for(&mut self, finish: [f64; 2], rails: [&RailView; 2]) {
        if self.small_rail == 0 {
            let smoothed =
                |f: f64, v: &RailView| if v.srtt_ns > 0 { f - f64_of(v.base_ns) + f64_of(v.srtt_ns) } else { f };
            if rails[1].samples > 0
                && finish[1] * (1.0 + SWITCH_MARGIN) < finish[0]
                && smoothed(finish[1], rails[1]) * (1.0 + SWITCH_MARGIN) < smoothed(finish[0], rails[0])
            {
                (self.small_rail, self.away_left) = (1, AWAY_DECISIONS);
            }
        } else {
            self.away_left = self.away_left.saturating_sub(1);
            if self.away_left == 0 || finish[0] <= finish[1] * (1.0 + SWITCH_MARGIN / 2.0) {
                // Home: measured as data there, SOUT is judged fairly at the next decision,
                // which leaves again if SUP is still clearly sooner.
                self.small_rail = 0;
            }
        }
    }

    /// The finish-time arithmetic, for a non-empty send with both rails up that
    /// [`Self::quick`] did not answer.
    #[inline]
    pub(super) fn decide(&mut self, size: u64, now_ns: u64, rails: [&RailView; 2]) -> u64 {
        let small = size < self.split_min_bytes;
        self.rails[0].update(now_ns, rails[0]);
        self.rails[1].update(now_ns, rails[1]);
        let (r0, r1) = (rails[0].rate_bytes_per_ns(), rails[1].rate_bytes_per_ns());
        let (d0, d1) = (rails[0].drain_ns(now_ns, r0), rails[1].drain_ns(now_ns, r1));
        // New bytes go at the backed-off rate; what is queued drains at the estimated one.
        // A stale rail is reckoned at least as fast as the other (never starved).
        let (n0, n1) = (
            if stale(rails[0], now_ns) { r0.max(r1) } else { r0 },
            if stale(rails[1], now_ns) { r1.max(r0) } else { r1 },
        );
        let full = FULL as f64;
        let (e0, e1) = (n0 * self.rails[0].factor as f64 / full, n1 * self.rails[1].factor as f64 / full);
        let s = size as f64;
        if small {
            self.small_rail_for([d0 + s / e0, d1 + s / e1], rails);
            // This send counts as the first of the next run.
            self.small_sends_left = SMALL_SENDS_PER_DECISION - 1;
            self.small_bytes_left = self.small_budget().saturating_sub(size);
            return if self.small_rail == 0 { size } else { 0 };
        }
        self.small_sends_left = 0;
        // The queue imbalance, less what is within the grain of a drain time (module doc).
        let inv = 1.0 / (e0 + e1);
        let (dd, grain) = (d1 - d0, s * inv);
        let dd = dd * dd * dd / (dd * dd + grain * grain);
        let x = (QUEUE_GAIN * dd * e1 + s) * e0 * inv;
        align_share(x.clamp(0.0, s) as u64, size)
    }
}

impl SplitPolicy for Auto {
    #[inline]
    fn sout_bytes(&mut self, size: u64, now_ns: u64, rails: [&RailView; 2]) -> u64 {
        match self.quick(size, rails) {
            Some(s) => s,
            None => self.decide(size, now_ns, rails),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A rail at `gbps` with `base_ns` latency, `inflight` bytes queued, after samples.
    fn rail(gbps: u64, base_ns: u64, inflight: u64) -> RailView {
        RailView {
            speed_mbps: 100_000,
            bw_bytes_per_s: gbps * 125_000_000,
            base_ns,
            inflight_bytes: inflight,
            samples: 1,
            srtt_ns: base_ns,
            ..RailView::default()
        }
    }

    #[test]
    fn idle_rails_split_by_rate() {
        let mut p = Auto::new(65536);
        let s = p.sout_bytes(3 << 20, 0, [&rail(200, 5_000, 0), &rail(100, 5_000, 0)]);
        assert!((s as f64 / (3 << 20) as f64 - 2.0 / 3.0).abs() < 0.001, "{s}");
        assert_eq!(s % 128, 0);
    }

    #[test]
    fn a_rail_whose_rate_nothing_measured_for_a_while_is_tried_again() {
        let mut p = Auto::new(65536);
        let now = 50 * STALE_NS;
        // SUP's estimate says 1 Gbit/s (one bad sample) against SOUT's 100.
        let (mut sout, mut sup) = (rail(100, 2_000, 0), rail(1, 2_000, 0));
        sout.rate_sample_ns = now - 1_000;
        sup.rate_sample_ns = now - STALE_NS + 1;
        let size = 1 << 20;
        let fresh = p.sout_bytes(size, now, [&sout, &sup]);
        assert!(fresh > size * 98 / 100, "a freshly measured slow rail gets its small share: {fresh}");
        // No sample for STALE_NS: SUP counts as fast as SOUT for the new bytes (an even split).
        sup.rate_sample_ns = now - STALE_NS;
        assert_eq!(p.sout_bytes(size, now, [&sout, &sup]), size / 2);
        // Never measured at all: likewise; and a stale SOUT is tried the same way.
        sup.rate_sample_ns = 0;
        assert_eq!(p.sout_bytes(size, now, [&sout, &sup]), size / 2);
        let (mut slow_sout, mut fast_sup) = (rail(1, 2_000, 0), rail(100, 2_000, 0));
        (slow_sout.rate_sample_ns, fast_sup.rate_sample_ns) = (0, now);
        assert_eq!(p.sout_bytes(size, now, [&slow_sout, &fast_sup]), size / 2);
        // Small sends too: the stale rail finishes them as early as the other.
        assert_eq!(p.sout_bytes(4096, now, [&slow_sout, &fast_sup]), 4096, "ties go to SOUT");
    }

    #[test]
    fn queued_bytes_shift_the_split_to_the_other_rail() {
        let mut p = Auto::new(0);
        let even = p.sout_bytes(1 << 20, 0, [&rail(100, 2_000, 1 << 20), &rail(100, 2_000, 1 << 20)]);
        assert_eq!(even, 1 << 19);
        // The send takes δ = 1 MiB / 25 B/ns = 42 µs on the pair. SOUT has 1 MiB more
        // queued, 84 µs = 2δ: equal finish times would give it 512 KiB less; the queue gain
        // corrects half of that per send, of an imbalance counted at 4/5 (Δ³/(Δ² + δ²)).
        let share = |p: &mut Auto, sout_queued: u64| {
            let s = p.sout_bytes(1 << 20, 0, [&rail(100, 2_000, sout_queued), &rail(100, 2_000, 1 << 20)]);
            s as f64 / (1 << 20) as f64
        };
        assert!((share(&mut p, 2 << 20) - (0.5 - 0.5 * 0.8 / 2.0)).abs() < 0.001);
        // 256 KiB more, δ/2, is within the grain of a drain time: counted at 1/5.
        assert!((share(&mut p, 5 << 18) - (0.5 - 0.5 * 0.2 / 8.0)).abs() < 0.001);
        // So much queued on SOUT that SUP alone finishes first.
        assert_eq!(p.sout_bytes(1 << 20, 0, [&rail(100, 2_000, 8 << 20), &rail(100, 2_000, 0)]), 0);
    }

    #[test]
    fn before_any_sample_the_link_speeds_decide() {
        let v = |mbps| RailView { speed_mbps: mbps, ..RailView::default() };
        let mut p = Auto::new(65536);
        let s = p.sout_bytes(1 << 20, 0, [&v(400_000), &v(100_000)]);
        assert_eq!(s, 838_912, "4/5 of 1 MiB, 128-byte aligned");
    }

    #[test]
    fn small_sends_go_whole_to_the_first_finisher() {
        // (A fresh policy each: the first small send decides.)
        let first = |size, rails: [&RailView; 2]| Auto::new(65536).sout_bytes(size, 0, rails);
        // Same rate: the lower latency wins.
        assert_eq!(first(4096, [&rail(100, 9_000, 0), &rail(100, 3_000, 0)]), 0);
        assert_eq!(first(4096, [&rail(100, 3_000, 0), &rail(100, 9_000, 0)]), 4096);
        // 64 KiB - 1 at 400 vs 100 Gbit/s: 1.3 µs vs 5.2 µs of serialization beats 2 µs of latency.
        assert_eq!(first(65535, [&rail(400, 4_000, 0), &rail(100, 2_000, 0)]), 65535);
        // At the threshold it is split.
        let s = first(65536, [&rail(100, 2_000, 0), &rail(100, 2_000, 0)]);
        assert!(s > 0 && s < 65536, "{s}");
    }

    #[test]
    fn small_sends_keep_to_sout_unless_sup_is_clearly_sooner() {
        let mut p = Auto::new(65536);
        let runs = SMALL_SENDS_PER_DECISION as u64;
        // Ten decisions each (a run of sends between them).
        let mut stream = |t0: u64, sout: RailView, sup: RailView| -> Vec<u64> {
            (0..10 * runs).map(|i| p.sout_bytes(8, t0 + i, [&sout, &sup])).collect()
        };
        // Latencies that differ by noise (±5 %): SOUT keeps the stream, even where SUP
        // reads a little faster.
        for i in 0..100u64 {
            let (l0, l1) = (3_000 + (i * 37) % 150, 3_000 + (i * 53) % 150);
            assert!(stream(i * 1000, rail(100, l0, 0), rail(100, l1, 0)).iter().all(|&s| s == 8), "step {i}");
        }
        // SOUT's queue grows past the margin: the stream moves to SUP at the next decision
        // (within SMALL_SENDS_PER_DECISION sends), and stays there while SUP is sooner by
        // more than half the margin.
        let on = stream(200_000, rail(100, 3_000, 100_000), rail(100, 3_000, 0));
        let moved = on.iter().position(|&s| s == 0).expect("the stream moved to SUP");
        assert!(moved < runs as usize && on[moved..].iter().all(|&s| s == 0), "{on:?}");
        let sticky = stream(300_000, rail(100, 3_300, 0), rail(100, 3_000, 0));
        // (But for the one send home per AWAY_DECISIONS decisions.)
        let home_sends = sticky.iter().filter(|&&s| s == 8).count() as u64;
        assert!(
            home_sends <= 10 / AWAY_DECISIONS as u64 + 1,
            "SUP 10 % sooner (between half the margin and it): {sticky:?}"
        );
        // SOUT within half the margin again: home at the next decision, and there it stays.
        let home = stream(400_000, rail(100, 3_100, 0), rail(100, 3_000, 0));
        let back = home.iter().position(|&s| s == 8).expect("back on SOUT");
        assert!(back < runs as usize && home[back..].iter().all(|&s| s == 8), "{home:?}");
        let stays = stream(500_000, rail(100, 3_300, 0), rail(100, 3_000, 0));
        assert!(stays.iter().all(|&s| s == 8), "SUP 10 % sooner does not take it from home: {stays:?}");
    }

    /// After an idle gap SOUT's base latency is its first new sample alone (105 µs), its
    /// smoothed RTT still 24 µs; SUP's probes say 32 / 40 µs: small sends stay home. Where
    /// both say SUP, they go.
    #[test]
    fn small_sends_do_not_leave_home_on_one_slow_sample() {
        let mut p = Auto::new(65536);
        let sout = RailView { srtt_ns: 24_000, ..rail(100, 105_000, 0) };
        let sup = RailView { srtt_ns: 40_000, ..rail(100, 32_000, 0) };
        assert!((0..64).all(|t| p.sout_bytes(8, t, [&sout, &sup]) == 8));
        let slow_sout = RailView { srtt_ns: 90_000, ..sout };
        assert_eq!(p.sout_bytes(8, 64, [&slow_sout, &sup]), 0, "SOUT slow by both measures");
    }

    /// SOUT's first chain was slow (the connection's first round trip) and SUP has no sample
    /// yet: small sends stay home. Away on a clearly faster SUP, a run goes home every
    /// AWAY_DECISIONS decisions so SOUT is measured as data again.
    #[test]
    fn small_sends_go_home_now_and_then_and_never_leave_for_an_unmeasured_rail() {
        let mut p = Auto::new(65536);
        let slow_first = RailView { samples: 1, ..rail(100, 80_000, 0) };
        let unmeasured = RailView { samples: 0, srtt_ns: 0, ..rail(100, 0, 0) };
        assert!((0..100).all(|t| p.sout_bytes(8, t, [&slow_first, &unmeasured]) == 8));
        let (slow, fast) = (rail(100, 9_000, 0), rail(100, 3_000, 0));
        let mut p = Auto::new(65536);
        let per = (AWAY_DECISIONS * SMALL_SENDS_PER_DECISION) as u64;
        let sout: Vec<u64> = (0..2 * per).filter(|&t| p.sout_bytes(8, t, [&slow, &fast]) == 8).collect();
        // The first send leaves; after AWAY_DECISIONS decisions a run goes home, and the
        // decision after it leaves again.
        let run = SMALL_SENDS_PER_DECISION as u64;
        let want: Vec<u64> = (per..per + run).collect();
        assert_eq!(sout, want);
    }

    /// Between decisions a small send costs a few compares; what must not wait for the
    /// next decision does not: a congestion event, a failed rail, a split send, a budget of
    /// bytes spent.
    #[test]
    fn small_sends_re_decide_every_few_sends_and_at_once_when_it_matters() {
        let (fast, slow) = (rail(100, 2_000, 0), rail(100, 9_000, 0));
        let mut p = Auto::new(65536);
        assert_eq!(p.sout_bytes(8, 0, [&fast, &slow]), 8);
        // The rails trade places: the held sends stay, the next decision moves.
        let taken: Vec<u64> =
            (1..=SMALL_SENDS_PER_DECISION as u64).map(|t| p.sout_bytes(8, t, [&slow, &fast])).collect();
        let mut want = vec![8; SMALL_SENDS_PER_DECISION as usize - 1];
        want.push(0);
        assert_eq!(taken, want, "the first send of a run decides, the rest follow it");
        // A congestion event on either rail: the very next send decides.
        let mut p = Auto::new(65536);
        assert_eq!(p.sout_bytes(8, 0, [&fast, &slow]), 8);
        // (SOUT's latency rose with it; without the event the send would be held on SOUT.)
        let congested = RailView { congestion_events: 1, samples: 2, ..slow };
        assert_eq!(p.sout_bytes(8, 1, [&congested, &fast]), 0, "decided at once: SUP");
        // A failed rail: at once, whatever the run.
        let mut dead = fast;
        dead.failed = true;
        assert_eq!(p.sout_bytes(8, 2, [&fast, &dead]), 8);
        // A split send ends the run: the next small send decides.
        let mut p = Auto::new(65536);
        assert_eq!(p.sout_bytes(8, 0, [&fast, &slow]), 8);
        assert!(p.sout_bytes(1 << 20, 1, [&fast, &slow]) > 0);
        assert_eq!(p.sout_bytes(8, 2, [&slow, &fast]), 0);
        // A run's bytes: 16 KiB of 4 KiB sends (a quarter of 64 KiB) is four sends.
        let mut p = Auto::new(65536);
        assert_eq!(p.sout_bytes(4096, 0, [&fast, &slow]), 4096);
        let taken: Vec<u64> = (1..=4).map(|t| p.sout_bytes(4096, t, [&slow, &fast])).collect();
        assert_eq!(taken, [4096, 4096, 4096, 0]);
    }

    #[test]
    fn failed_rail_gets_nothing_and_empty_sends_stay_whole() {
        let mut p = Auto::new(0);
        let (ok, mut bad) = (rail(100, 1_000, 0), rail(400, 1_000, 0));
        bad.failed = true;
        assert_eq!(p.sout_bytes(1 << 20, 0, [&bad, &ok]), 0);
        assert_eq!(p.sout_bytes(1 << 20, 0, [&ok, &bad]), 1 << 20);
        assert_eq!(p.sout_bytes(0, 0, [&ok, &ok]), 0, "0 bytes: the engine puts it on SOUT alone");
    }

    #[test]
    fn congestion_backs_off_multiplicatively_and_recovers_additively() {
        let mut p = Auto::new(0);
        let (mut a, b) = (rail(100, 10_000, 0), rail(100, 10_000, 0));
        assert_eq!(p.sout_bytes(1 << 20, 0, [&a, &b]), 1 << 19);
        // One congested sample on SOUT: its rate counts 3/4, so it gets 3/7.
        (a.samples, a.congestion_events) = (2, 1);
        let s = p.sout_bytes(1 << 20, 1_000, [&a, &b]);
        assert_eq!(p.backoff(), [0.75, 1.0]);
        assert!((s as f64 / (1 << 20) as f64 - 3.0 / 7.0).abs() < 0.001, "{s}");
        // Another one within the same SRTT is the same episode: no second backoff.
        (a.samples, a.congestion_events) = (3, 2);
        p.sout_bytes(1 << 20, 5_000, [&a, &b]);
        assert_eq!(p.backoff(), [0.75, 1.0]);
        // A later episode backs off again, down to the floor at most.
        for i in 0..10u64 {
            (a.samples, a.congestion_events) = (4 + i, 3 + i);
            p.sout_bytes(1 << 20, 20_000 * (i + 1), [&a, &b]);
        }
        assert_eq!(p.backoff(), [1.0 / 16.0, 1.0]);
        // Clean samples add back 1/8 each.
        a.samples += 2;
        p.sout_bytes(1 << 20, 400_000, [&a, &b]);
        assert_eq!(p.backoff(), [1.0 / 16.0 + 2.0 / 8.0, 1.0]);
        a.samples += 100;
        p.sout_bytes(1 << 20, 500_000, [&a, &b]);
        assert_eq!(p.backoff(), [1.0, 1.0]);
    }
}
