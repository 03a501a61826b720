//! Warnings a peer can provoke, rate-limited: a hostile or broken peer must not be able to
//! flood the log (a connection flood would otherwise log a line per connection). Each kind
//! of warning of a device is a [`Limited`]: at most one line per [`PERIOD`], and the next
//! line says how many were left out.

use std::time::{Duration, Instant};

use crate::ratelimit::{RateLimit, suppressed};

/// At most one line per kind per period.
pub const PERIOD: Duration = Duration::from_secs(5);

/// One kind of warning of one device: the crate's [`RateLimit`] (one line per period, the
/// next one says how many were held back).
pub struct Limited {
    limit: RateLimit,
}

impl Default for Limited {
    fn default() -> Self {
        Limited { limit: RateLimit::new(PERIOD) }
    }
}

impl Limited {
    /// Logs `what()` at WARN unless a line of this kind was written less than a period ago.
    pub fn warn(&self, what: impl FnOnce() -> String) {
        if let Some(held) = self.limit.admit(Instant::now()) {
            log::warn!("{}{}", what(), suppressed(held));
        }
    }
}

/// The warnings of one device that a peer can provoke.
#[derive(Default)]
pub struct Warnings {
    /// `accept` failed (descriptors exhausted, ...).
    pub accept: Limited,
    /// A connection said nothing valid (no HELLO in time, a bad HELLO, too many waiting).
    pub hello: Limited,
    /// A frame or CONNECT no QP expects.
    pub stray: Limited,
    /// A QP went to the error state with work outstanding.
    pub qp: Limited,
    /// A link broke.
    pub link: Limited,
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn one_line_per_period() {
        let l = Limited::default();
        for _ in 0..1000 {
            l.warn(|| "x".into());
        }
        // One line written, the other 999 held back (the next line would say so).
        assert_eq!(l.limit.take_held(), 999);
    }
}
