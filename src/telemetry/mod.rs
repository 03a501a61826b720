//! Per-rail telemetry from the data path itself (seed 000): RTT samples from post →
//! completion of each signalled chain, RFC 6298 SRTT/RTTVAR, and the rail's bytes in flight.
//! Sans-IO: every time is an input (`now_ns` from one clock read per post/poll batch, or a
//! device completion timestamp), so tests drive it with a fake clock.

/// What the split policy sees of one rail.
#[derive(Clone, Copy, Debug, Default, PartialEq)]
pub struct RailView {
    /// Link speed from the device (Mbit/s): the prior before any sample.
    pub speed_mbps: u32,
    /// Smoothed RTT (ns); 0 before the first sample.
    pub srtt_ns: u64,
    /// RTT variation (ns).
    pub rttvar_ns: u64,
    /// Bytes posted on the rail whose completion has not been seen.
    pub inflight_bytes: u64,
    /// RTT samples taken so far.
    pub samples: u64,
    /// The last sample exceeded SRTT + 4·RTTVAR.
    pub congested: bool,
    /// A completion on this rail failed: it gets no new traffic.
    pub failed: bool,
}

/// Estimator parameters (`MPIB_RTT_ALPHA`, `MPIB_RTT_BETA`).
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct TelemetryConfig {
    pub alpha: f64,
    pub beta: f64,
    pub speed_mbps: u32,
}

/// One RTT sample: a signalled chain posted at `posted_ns`, completed at `completed_ns`,
/// that carried `bytes`.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Sample {
    pub posted_ns: u64,
    pub completed_ns: u64,
    pub bytes: u64,
}

/// The telemetry of one rail of one connection. Owned by the data path: no locks.
#[derive(Clone, Debug)]
pub struct RailTelemetry {
    cfg: TelemetryConfig,
    view: RailView,
    last_post_ns: u64,
}

impl RailTelemetry {
    pub fn new(cfg: TelemetryConfig) -> Self {
        RailTelemetry { cfg, view: RailView { speed_mbps: cfg.speed_mbps, ..RailView::default() }, last_post_ns: 0 }
    }

    /// `bytes` were posted on the rail at `now_ns`.
    pub fn on_post(&mut self, now_ns: u64, bytes: u64) {
        self.view.inflight_bytes += bytes;
        self.last_post_ns = now_ns;
    }

    /// A signalled chain completed; `sample.bytes` leave the in-flight count.
    pub fn on_complete(&mut self, sample: Sample) {
        self.view.inflight_bytes = self.view.inflight_bytes.saturating_sub(sample.bytes);
        let rtt = sample.completed_ns.saturating_sub(sample.posted_ns);
        let v = &mut self.view;
        if v.samples == 0 {
            // RFC 6298 (2.2): SRTT = R, RTTVAR = R/2.
            v.srtt_ns = rtt;
            v.rttvar_ns = rtt / 2;
            v.congested = false;
        } else {
            v.congested = rtt > v.srtt_ns + 4 * v.rttvar_ns;
            // RFC 6298 (2.3): RTTVAR first, from the old SRTT.
            let err = (v.srtt_ns as f64 - rtt as f64).abs();
            v.rttvar_ns = ((1.0 - self.cfg.beta) * v.rttvar_ns as f64 + self.cfg.beta * err) as u64;
            v.srtt_ns = ((1.0 - self.cfg.alpha) * v.srtt_ns as f64 + self.cfg.alpha * rtt as f64) as u64;
        }
        v.samples += 1;
    }

    /// A completion on this rail failed.
    pub fn on_error(&mut self) {
        self.view.failed = true;
    }

    /// Forget `bytes` in flight without a sample (e.g. a flushed chain).
    pub fn on_abandon(&mut self, bytes: u64) {
        self.view.inflight_bytes = self.view.inflight_bytes.saturating_sub(bytes);
    }

    /// When the rail last carried a post (ns), for probes.
    pub fn last_post_ns(&self) -> u64 {
        self.last_post_ns
    }

    pub fn view(&self) -> &RailView {
        &self.view
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn tel() -> RailTelemetry {
        RailTelemetry::new(TelemetryConfig { alpha: 0.125, beta: 0.25, speed_mbps: 100_000 })
    }

    #[test]
    fn first_sample_sets_srtt_and_half_rttvar() {
        let mut t = tel();
        t.on_post(0, 100);
        assert_eq!(t.view().inflight_bytes, 100);
        t.on_complete(Sample { posted_ns: 0, completed_ns: 1000, bytes: 100 });
        assert_eq!((t.view().srtt_ns, t.view().rttvar_ns, t.view().inflight_bytes), (1000, 500, 0));
    }

    #[test]
    fn rfc6298_update_and_congestion_signal() {
        let mut t = tel();
        t.on_complete(Sample { posted_ns: 0, completed_ns: 1000, bytes: 0 });
        t.on_complete(Sample { posted_ns: 0, completed_ns: 2000, bytes: 0 });
        // RTTVAR = 0.75*500 + 0.25*|1000-2000| = 625; SRTT = 0.875*1000 + 0.125*2000 = 1125.
        assert_eq!((t.view().srtt_ns, t.view().rttvar_ns), (1125, 625));
        assert!(!t.view().congested, "2000 < 1000 + 4*500");
        t.on_complete(Sample { posted_ns: 0, completed_ns: 10_000, bytes: 0 });
        assert!(t.view().congested, "10000 > 1125 + 4*625");
    }
}
