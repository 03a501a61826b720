//! Hang reports: the engine says when a request has waited `MPIB_HANG_REPORT_MS`
//! ([`crate::engine::Action::HangReport`], `engine/hang.rs`); this logs the connection's
//! state then, with its place (`place.rs`). The same text, for every live connection, on
//! demand: `mpib_dump_state` (`abi/stats.rs`, `Plugin::dump_state`).
//!
//! One report per stuck request per connection (the engine's rule), and at most one line a
//! second in the process (a job whose every connection hangs at once writes the first and
//! counts the rest: they say the same).

use std::fmt;
use std::time::Instant;

use super::place::ConnPlace;
use crate::ratelimit::{RateLimit, suppressed};

static REPORTS: RateLimit = RateLimit::per_second();

/// One connection's state: `<place>:` then the engine's lines.
pub fn describe(place: &ConnPlace, state: impl fmt::Display) -> String {
    format!("{place}:{state}")
}

/// The hang report of a connection whose request in `slot` has waited `age_ns`.
pub fn report(place: &ConnPlace, slot: usize, age_ns: u64, state: impl fmt::Display) {
    let Some(held) = REPORTS.admit(Instant::now()) else { return };
    log::warn!(
        "hang report{}: a request (slot {slot}) has waited {} ms (MPIB_HANG_REPORT_MS); {}",
        suppressed(held),
        age_ns / 1_000_000,
        describe(place, state)
    );
}
