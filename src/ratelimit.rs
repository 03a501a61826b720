//! Rate-limited log lines: at most one line per interval for one cause, and the next line
//! says how many were held back. Anything that logs on behalf of the network (a listener
//! dropping strangers, a peer sending garbage) goes through one of these, so a flood of bad
//! input costs a line a second, not a line per packet. A leaf: every layer may use it.
//!
//! ```ignore
//! static DROPPED: RateLimit = RateLimit::per_second();
//! if let Some(held) = DROPPED.admit(Instant::now()) {
//!     log::warn!("dropped a connection from {peer}: {why}{}", suppressed(held));
//! }
//! ```

use std::time::{Duration, Instant};

use parking_lot::Mutex;

/// One cause's limiter. `const`-constructible, so a cause can be a `static`; thread-safe
/// (a lock taken only on the control path that logs).
pub struct RateLimit {
    interval: Duration,
    state: Mutex<State>,
}

struct State {
    /// When the last line was admitted.
    last: Option<Instant>,
    /// Lines held back since then.
    held: u64,
}

impl RateLimit {
    /// At most one line per `interval`.
    pub const fn new(interval: Duration) -> RateLimit {
        RateLimit { interval, state: Mutex::new(State { last: None, held: 0 }) }
    }

    /// At most one line per second.
    pub const fn per_second() -> RateLimit {
        RateLimit::new(Duration::from_secs(1))
    }

    /// Whether a line may be written at `now`: `Some(n)` with the `n` lines held back since
    /// the last one written (then reset), or `None` when this one is held back (counted).
    pub fn admit(&self, now: Instant) -> Option<u64> {
        let mut s = self.state.lock();
        match s.last {
            Some(t) if now.saturating_duration_since(t) < self.interval => {
                s.held += 1;
                None
            }
            _ => {
                s.last = Some(now);
                Some(std::mem::take(&mut s.held))
            }
        }
    }

    /// The lines held back and not yet reported (then reset): for a closing summary.
    pub fn take_held(&self) -> u64 {
        std::mem::take(&mut self.state.lock().held)
    }
}

/// Rate limits per cause when the causes are not known in advance (an error of a call,
/// keyed by the call and the error's class): one [`RateLimit`] per key, created when the
/// key is first seen, in a table of at most [`Keyed::MAX_KEYS`]; keys beyond it share the
/// last entry. A lock on the path that logs only.
pub struct Keyed {
    interval: Duration,
    keys: Mutex<Vec<(&'static str, &'static str, State)>>,
}

impl Keyed {
    pub const MAX_KEYS: usize = 64;

    pub const fn new(interval: Duration) -> Keyed {
        Keyed { interval, keys: Mutex::new(Vec::new()) }
    }

    /// As [`RateLimit::admit`], for the cause `(a, b)`.
    pub fn admit(&self, a: &'static str, b: &'static str, now: Instant) -> Option<u64> {
        let mut keys = self.keys.lock();
        let i = match keys.iter().position(|(ka, kb, _)| *ka == a && *kb == b) {
            Some(i) => i,
            None if keys.len() < Self::MAX_KEYS => {
                keys.push((a, b, State { last: None, held: 0 }));
                keys.len() - 1
            }
            None => Self::MAX_KEYS - 1,
        };
        let s = &mut keys[i].2;
        match s.last {
            Some(t) if now.saturating_duration_since(t) < self.interval => {
                s.held += 1;
                None
            }
            _ => {
                s.last = Some(now);
                Some(std::mem::take(&mut s.held))
            }
        }
    }
}

/// `" (N more suppressed)"` for `n > 0`, else nothing: the tail of an admitted line.
pub fn suppressed(n: u64) -> String {
    if n == 0 { String::new() } else { format!(" ({n} more suppressed)") }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn one_line_per_interval_and_the_next_counts_the_rest() {
        let r = RateLimit::per_second();
        let t0 = Instant::now();
        let ms = |n: u64| t0 + Duration::from_millis(n);
        assert_eq!(r.admit(ms(0)), Some(0));
        for i in 1..=5 {
            assert_eq!(r.admit(ms(i * 100)), None, "held back within the second");
        }
        assert_eq!(r.admit(ms(999)), None);
        assert_eq!(r.admit(ms(1000)), Some(6), "the next line says how many were held back");
        assert_eq!(r.admit(ms(1500)), None);
        assert_eq!(r.take_held(), 1);
        assert_eq!(r.take_held(), 0);
        assert_eq!(r.admit(ms(5000)), Some(0));
        // A clock that goes backwards (another thread's older `now`) holds the line back.
        assert_eq!(r.admit(ms(4000)), None);
    }

    #[test]
    fn the_tail_of_a_line() {
        assert_eq!(suppressed(0), "");
        assert_eq!(suppressed(3), " (3 more suppressed)");
    }

    #[test]
    fn keyed_limits_are_apart_per_key_and_bounded() {
        let k = Keyed::new(Duration::from_secs(1));
        let t0 = Instant::now();
        let ms = |n: u64| t0 + Duration::from_millis(n);
        assert_eq!(k.admit("isend", "Refused", ms(0)), Some(0));
        assert_eq!(k.admit("isend", "Refused", ms(10)), None);
        assert_eq!(k.admit("test", "Refused", ms(20)), Some(0), "another call is another cause");
        assert_eq!(k.admit("isend", "Remote", ms(30)), Some(0), "another class is another cause");
        assert_eq!(k.admit("isend", "Refused", ms(1000)), Some(1));
        static NAMES: [&str; 100] = {
            let mut a = [""; 100];
            let mut i = 0;
            while i < 100 {
                a[i] = ["a", "b", "c", "d", "e", "f", "g", "h", "i", "j"][i % 10];
                i += 1;
            }
            a
        };
        for (i, n) in NAMES.iter().enumerate() {
            let _ = k.admit(n, ["0", "1", "2", "3", "4", "5", "6", "7", "8", "9"][i / 10], ms(2000));
        }
        assert!(k.keys.lock().len() <= Keyed::MAX_KEYS, "the table stays bounded");
    }

    #[test]
    fn a_static_limiter() {
        static S: RateLimit = RateLimit::new(Duration::from_millis(10));
        assert_eq!(S.admit(Instant::now()), Some(0));
    }
}
