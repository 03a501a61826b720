//! The minimum of a signal over a sliding time window in O(1) time and space: Kathleen
//! Nichols' three-sample estimator, as TCP BBR keeps its min RTT. It holds the best, the
//! second-best from a later sub-window and the third-best from a still later one, so when
//! the best ages out of the window a recent candidate takes its place at once.

#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
struct Entry {
    t: u64,
    v: u64,
}

/// Windowed minimum; `get` is `None` before the first sample.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct WindowedMin {
    s: [Entry; 3],
    seen: bool,
}

impl WindowedMin {
    /// Adds `v` observed at `t` (ns; not decreasing between calls) and returns the minimum
    /// over the last `window_ns`.
    pub fn update(&mut self, t: u64, v: u64, window_ns: u64) -> u64 {
        let e = Entry { t, v };
        if !self.seen || v <= self.s[0].v || t.saturating_sub(self.s[2].t) > window_ns {
            // A new best, or everything has aged out: restart from this sample.
            self.s = [e; 3];
            self.seen = true;
            return v;
        }
        if v <= self.s[1].v {
            self.s[1] = e;
            self.s[2] = e;
        } else if v <= self.s[2].v {
            self.s[2] = e;
        }
        let age = t.saturating_sub(self.s[0].t);
        if age > window_ns {
            // The best has expired: promote the later candidates.
            self.s = [self.s[1], self.s[2], e];
            if t.saturating_sub(self.s[0].t) > window_ns {
                self.s = [self.s[1], self.s[2], e];
            }
        } else if self.s[1] == self.s[0] && age > window_ns / 4 {
            // A quarter of the window passed without a second choice: take this one.
            self.s[1] = e;
            self.s[2] = e;
        } else if self.s[2] == self.s[1] && age > window_ns / 2 {
            // Half the window passed without a third choice.
            self.s[2] = e;
        }
        self.s[0].v
    }

    pub fn get(&self) -> Option<u64> {
        self.seen.then_some(self.s[0].v)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The exact windowed minimum, for comparison.
    fn exact(samples: &[(u64, u64)], now: u64, window: u64) -> u64 {
        samples.iter().filter(|(t, _)| now - t <= window).map(|&(_, v)| v).min().unwrap()
    }

    #[test]
    fn empty_then_first_sample() {
        let mut m = WindowedMin::default();
        assert_eq!(m.get(), None);
        assert_eq!(m.update(5, 70, 100), 70);
        assert_eq!(m.get(), Some(70));
    }

    #[test]
    fn keeps_the_minimum_until_it_ages_out() {
        let mut m = WindowedMin::default();
        m.update(0, 10, 1000);
        for t in 1..=1000 {
            assert_eq!(m.update(t, 50, 1000), 10, "t={t}");
        }
        // The 10 is now older than the window: a recent 50 takes over.
        assert_eq!(m.update(1001, 60, 1000), 50);
    }

    #[test]
    fn rising_signal_is_followed_within_a_window() {
        // A base latency that steps up (a route change) is learnt one window later at most.
        let (w, mut m, mut all) = (1000u64, WindowedMin::default(), Vec::new());
        for t in (0..5000).step_by(10) {
            let v = if t < 2000 { 100 } else { 300 };
            all.push((t, v));
            let got = m.update(t, v, w);
            assert!(got <= v, "never above the current sample");
            assert!(got >= exact(&all, t, w) || t < 2000 + w, "t={t}");
            if t >= 2000 + w + w / 2 {
                assert_eq!(got, 300, "t={t}");
            }
        }
    }

    #[test]
    fn noisy_signal_stays_within_the_window_minimum_bounds() {
        // Pseudo-random values; the estimate is never below the true windowed minimum
        // and never above the minimum of the most recent quarter window.
        let (w, mut m, mut all) = (4000u64, WindowedMin::default(), Vec::new());
        let mut x = 0x9e3779b97f4a7c15u64;
        for t in (0..100_000).step_by(37) {
            x ^= x << 13;
            x ^= x >> 7;
            x ^= x << 17;
            let v = 1000 + x % 500;
            all.push((t, v));
            let got = m.update(t, v, w);
            assert!(got >= exact(&all, t, w), "t={t}: {got} below the window's minimum");
            assert!(got <= exact(&all, t, w / 4), "t={t}: {got} above the last quarter's minimum");
        }
    }
}
