//! Silent-rail detection (sender). A link that goes silent — a cable pulled, a switch port
//! dead, an optic failing — gives no error completion: RC retries for its whole budget
//! (seconds) while the rail holds its share of every transfer. A rail with work outstanding
//! that has completed nothing for longer than its oldest part should take (twice its
//! serialization at the rail's measured rate) plus a bound, while the other rail of the
//! connection completes work, is *suspect*: new sends leave it. Past a longer bound it has
//! *failed*: fenced, reported, its parts replayed, as any failure.
//!
//! Each bound is a multiple of the rail's own round-trip spread (SRTT + 4·RTTVAR, a high
//! percentile's stand-in) with a floor: a rail whose round trips are long gets longer
//! bounds; one whose latency jumps or whose rate drops stays below them while its
//! completions keep coming. Both rails quiet together (a paused peer, a loaded host, an
//! outage of both links) is nobody's failure here: RC's own retry budget decides.
//!
//! All of it runs in the failover round, every [`SILENCE_CHECK_NS`] while work is out; the
//! data path only stores each rail's last completion time (`Failover::heard_ns`).

use super::sender::STALL_NS_PER_BYTE;
use super::{Failover, other};
use crate::engine::send_path::SendPath;
use crate::engine::{DownReason, RAIL_NAMES, RAILS, RailState};
use crate::error::Result;

/// The suspect and failure bounds' floors by default (`FailoverConfig::silent_floor_ns`
/// sets them for a connection): whatever the rail's round trips, a silence shorter than
/// these is never a rail failure.
pub const SUSPECT_FLOOR_NS: u64 = 20_000_000;
pub const SILENT_FLOOR_NS: u64 = 50_000_000;
/// The bounds in multiples of the rail's round-trip spread.
const SUSPECT_RTTS: u64 = 3;
const SILENT_RTTS: u64 = 6;
/// Before the rail has measured its rate, a part may take this many times its time at the
/// stall bound's 250 Mb/s before silence fails the rail.
const UNMEASURED_FAIL_FACTOR: u64 = 8;
/// How often the silence of a rail with work outstanding is looked at.
pub const SILENCE_CHECK_NS: u64 = 5_000_000;

impl Failover {
    /// The silent-rail check: clears a suspect that completed something since it was
    /// suspected (or has nothing outstanding), suspects, then fails, a rail
    /// silent too long while its partner completes work. Schedules the next check while
    /// work is outstanding.
    pub(super) fn check_silence(&mut self, p: &mut SendPath<'_>, now_ns: u64) -> Result<()> {
        if !self.cfg.silence {
            self.silence_next_ns = u64::MAX;
            return Ok(());
        }
        for rail in 0..RAILS {
            if self.heard_ns[rail] > self.suspect_at[rail] {
                self.clear_suspect(p, rail);
            }
        }
        let mut busy = false;
        let (suspect_floor, fail_floor) = self.silence_floors();
        for (rail, name) in RAIL_NAMES.iter().enumerate() {
            if self.state[rail] != RailState::Up || p.outstanding[rail] == 0 {
                self.clear_suspect(p, rail);
                continue;
            }
            busy = true;
            if self.heard_ns[rail] == 0 {
                // Nothing completed on this rail yet (since it came up or was re-admitted):
                // no round trip to judge a silence by, and its first work may wait for the
                // path to come up (the soft fabric dials at first use). RC's budget decides.
                continue;
            }
            let Some((posted, bytes)) = self.oldest_part(p, rail) else { continue };
            let since = posted.max(self.heard_ns[rail]);
            let partner = other(rail);
            if !self.completing(p, partner, since, now_ns) {
                continue;
            }
            let v = p.tel[rail].view();
            // RC says nothing before a chain's end: its bytes may be moving. Allow twice its
            // serialization at the rate the rail has measured. Before any measurement (small
            // parts give none) a part gets its time at the stall bound's conservative
            // 250 Mb/s before the rail is suspect, and at an eighth of that before it fails:
            // on a loaded host one rail may finish a first 256 MiB part many seconds after
            // the other, while a small part's allowance stays near the floor.
            let (suspect_allow, fail_allow) = if v.rate_sample_ns != 0 {
                let t = (bytes as f64 * 2.0 / v.rate_bytes_per_ns()) as u64;
                (t, t)
            } else {
                let t = bytes.saturating_mul(STALL_NS_PER_BYTE);
                (t, t.saturating_mul(UNMEASURED_FAIL_FACTOR))
            };
            let silent_ns = now_ns.saturating_sub(since);
            let spread = v.srtt_ns + 4 * v.rttvar_ns;
            let silent_ms = silent_ns / 1_000_000;
            if silent_ns.saturating_sub(fail_allow) > fail_floor.max(SILENT_RTTS * spread) {
                log::log!(
                    p.failure_level(),
                    "send: the {name} rail has completed nothing for {silent_ms} ms while the {} rail completes: it \
                     has failed{}",
                    RAIL_NAMES[partner],
                    p.at(rail)
                );
                self.silent_failures += 1;
                self.rail_down(p, rail, DownReason::Silent)?;
            } else if silent_ns.saturating_sub(suspect_allow) > suspect_floor.max(SUSPECT_RTTS * spread)
                && !self.suspect.contains(rail)
                && !self.suspect.contains(partner)
            {
                log::info!(
                    "send: the {name} rail has completed nothing for {silent_ms} ms while the {} rail completes: new \
                     sends leave it",
                    RAIL_NAMES[partner]
                );
                (self.suspect, self.suspect_at[rail]) = (self.suspect.with(rail), now_ns);
                p.tel[rail].set_suspect(true);
                p.tel[rail].stats().count_suspect();
            }
        }
        self.silence_next_ns = if busy { now_ns + SILENCE_CHECK_NS } else { u64::MAX };
        Ok(())
    }

    /// This connection's (suspect, failure) floors.
    fn silence_floors(&self) -> (u64, u64) {
        match self.cfg.silent_floor_ns {
            0 => (SUSPECT_FLOOR_NS, SILENT_FLOOR_NS),
            fail => (fail * 2 / 5, fail),
        }
    }

    /// Whether `partner` is working while the other rail has been silent since `since_ns`:
    /// up, heard from since then and, if it has work out itself, heard from lately and well
    /// into that silence. Two rails gone quiet together (a paused peer, late
    /// acknowledgements, an outage of both) leave nobody to blame, whichever crosses its
    /// bound first. An idle partner heard from since is working: its part is done.
    fn completing(&self, p: &SendPath<'_>, partner: usize, since_ns: u64, now_ns: u64) -> bool {
        let heard = self.heard_ns[partner];
        if self.state[partner] != RailState::Up || heard <= since_ns {
            return false;
        }
        if p.outstanding[partner] == 0 {
            return true;
        }
        let v = p.tel[partner].view();
        let quiet = now_ns.saturating_sub(heard);
        quiet <= self.silence_floors().0.max(SUSPECT_RTTS * (v.srtt_ns + 4 * v.rttvar_ns))
            && quiet.saturating_mul(2) <= now_ns.saturating_sub(since_ns)
    }

    /// `rail` is no longer suspect (it completed something, has nothing outstanding, or is
    /// the only rail left): new sends may use it again.
    pub(super) fn clear_suspect(&mut self, p: &mut SendPath<'_>, rail: usize) {
        if self.suspect.contains(rail) {
            self.suspect = self.suspect.without(rail);
            if self.state[rail] == RailState::Up {
                p.tel[rail].set_suspect(false);
                log::info!("send: the {} rail completes again: new sends use it again", RAIL_NAMES[rail]);
            }
        }
    }
}
