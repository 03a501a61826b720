//! Silent-peer detection of a TCP connection: a peer that goes silent without closing
//! (host down, process stopped) is taken for gone when requests wait on it and no byte
//! moved for the verbs bound `4.096 µs × 2^timeout × (retry_cnt + 1)` (at least 100 ms).
//! `TCP_USER_TIMEOUT` is set to the same bound, so the kernel gives up on unacknowledged
//! data no later. A responder waiting for an SRQ WQE keeps its requester from taking it for
//! silent by sending RNR frames (`qp_recv.rs`).

use std::time::{Duration, Instant};

use crate::fabric::ConnectParams;

/// Shortest time a silent peer is given (TCP round trips are far above verbs' µs).
const MIN_BOUND: Duration = Duration::from_millis(100);

/// How long a QP waits on a silent peer before its WRs fail with `RetryExceeded`: the
/// verbs bound `4.096 µs × 2^timeout × (retry_cnt + 1)`, at least 100 ms.
pub fn silent_peer_bound(params: &ConnectParams) -> Duration {
    let t = Duration::from_nanos(4096u64 << params.timeout.min(31)) * (params.retry_cnt as u32 + 1);
    t.max(MIN_BOUND)
}

/// The silent-peer timer of one connection.
pub struct Liveness {
    bound: Duration,
    /// Since when requests have waited on the peer with no byte moving.
    idle_since: Option<Instant>,
}

impl Liveness {
    pub fn new() -> Liveness {
        Liveness { bound: Duration::from_secs(30), idle_since: None }
    }

    pub fn set_bound(&mut self, bound: Duration) {
        self.bound = bound;
    }

    /// Bytes moved: the peer is alive.
    #[inline]
    pub fn moved(&mut self) {
        self.idle_since = None;
    }

    /// Nothing moved while requests wait on the peer: starts the timer, or says why the
    /// peer is taken for gone once it ran past the bound.
    pub fn idle(&mut self) -> Option<String> {
        let now = Instant::now();
        match self.idle_since {
            None => self.idle_since = Some(now),
            Some(t) if now.duration_since(t) > self.bound => {
                return Some(format!("no byte from the peer for {:?} with requests outstanding", self.bound));
            }
            Some(_) => {}
        }
        None
    }
}
