//! The process's per-NIC and per-peer views (`mpib_nic_stats`, `mpib_worst_peers`): mpib's
//! own calls, for `mpib-perf --stats`. Another plugin has no such calls: `None`.

use std::ffi::{c_int, c_void};

use ncclnet_types::mpib::{MPIB_WORST_BY_ERRORS, MPIB_WORST_BY_LATENCY, mpib_nic_stats_t, mpib_peer_stats_t};

use super::Plugin;
use crate::{Result, check};

type NicStatsFn = unsafe extern "C" fn(*mut mpib_nic_stats_t, usize, usize, *mut usize) -> c_int;
type WorstPeersFn = unsafe extern "C" fn(c_int, *mut mpib_peer_stats_t, usize, usize, *mut usize) -> c_int;

/// One NIC on one rail over the whole process (`mpib_nic_stats`).
pub type NicStats = mpib_nic_stats_t;
/// One peer as one local NIC reaches it on one rail (`mpib_worst_peers`).
pub type PeerStats = mpib_peer_stats_t;

/// `mpib_worst_peers`' rankings.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum WorstBy {
    /// p99 latency of the live connections' data chains, then SRTT.
    Latency,
    /// Errors + failovers + silent-rail suspicions over the run.
    Errors,
}

impl Plugin {
    /// Every NIC's figures on each rail, ordered by NIC then rail (`mpib_nic_stats`; `None`:
    /// the library does not export it). Process-wide, live and closed connections.
    pub fn nic_stats(&self) -> Result<Option<Vec<NicStats>>> {
        // Looked up per call, as `resource_stats`: not the data path.
        let Some(p) = self.lib.symbol(c"mpib_nic_stats") else { return Ok(None) };
        // SAFETY: `mpib_nic_stats` as include/mpib.h declares it.
        let f = unsafe { std::mem::transmute::<*mut c_void, NicStatsFn>(p) };
        let size = std::mem::size_of::<NicStats>();
        // Rows may appear between the count and the copy (a connection coming up): ask again
        // with room for them, a few times.
        let mut rows: Vec<NicStats> = Vec::new();
        for _ in 0..4 {
            let mut n = 0usize;
            // SAFETY: `rows.len()` entries of the size we pass; a writable count.
            let rc = unsafe { f(rows.as_mut_ptr(), size, rows.len(), &mut n) };
            check("mpib_nic_stats", rc)?;
            if n <= rows.len() {
                rows.truncate(n);
                return Ok(Some(rows));
            }
            rows = vec![NicStats::default(); n + 4];
        }
        Ok(Some(rows))
    }

    /// The `max` worst peers by `by`, worst first (`mpib_worst_peers`; `None`: the library
    /// does not export it). Latencies are of live connections: ask before closing them.
    pub fn worst_peers(&self, by: WorstBy, max: usize) -> Result<Option<Vec<PeerStats>>> {
        let Some(p) = self.lib.symbol(c"mpib_worst_peers") else { return Ok(None) };
        // SAFETY: `mpib_worst_peers` as include/mpib.h declares it.
        let f = unsafe { std::mem::transmute::<*mut c_void, WorstPeersFn>(p) };
        let by = match by {
            WorstBy::Latency => MPIB_WORST_BY_LATENCY,
            WorstBy::Errors => MPIB_WORST_BY_ERRORS,
        };
        let mut rows = vec![PeerStats::default(); max];
        let mut n = 0usize;
        // SAFETY: `max` entries of the size we pass; a writable count.
        let rc = unsafe { f(by, rows.as_mut_ptr(), std::mem::size_of::<PeerStats>(), max, &mut n) };
        check("mpib_worst_peers", rc)?;
        rows.truncate(n.min(max));
        Ok(Some(rows))
    }
}
