//! The published statistics of one rail of one connection: counters, the latency
//! histogram and the current estimates, written by the connection's data path (single
//! writer, no lock, no read-modify-write; see [`Counter`]) and read by the statistics
//! writer and the query function through the registry (`registry.rs`).

use std::sync::Arc;

use super::counter::Counter;
use super::histogram::LatencyHistogram;

/// Declares the counters once: the live single-writer block, its plain copy, and the
/// `(key, value)` list the statistics file prints, all from one list.
macro_rules! rail_counters {
    ($($(#[$doc:meta])* $name:ident),* $(,)?) => {
        /// The live counters of one rail of one connection.
        #[derive(Debug, Default)]
        pub struct RailCounters {
            $($(#[$doc])* pub $name: Counter,)*
        }

        /// A plain copy of [`RailCounters`], summable.
        #[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
        pub struct RailCounts {
            $($(#[$doc])* pub $name: u64,)*
        }

        impl RailCounters {
            pub fn load(&self) -> RailCounts {
                RailCounts { $($name: self.$name.get(),)* }
            }
        }

        impl RailCounts {
            pub fn add(&mut self, o: &RailCounts) {
                $(self.$name += o.$name;)*
            }

            /// `(key, value)` in the statistics file's order.
            pub fn fields(&self) -> impl Iterator<Item = (&'static str, u64)> {
                [$((stringify!($name), self.$name)),*].into_iter()
            }
        }
    };
}

rail_counters! {
    /// Work requests posted (data, metadata, CTS writes and probes).
    wr_posted,
    /// Post calls (`ibv_post_send`), each ringing the doorbell once for a chain.
    doorbells,
    /// Payload bytes posted.
    bytes,
    /// WRITE_WITH_IMM work requests posted.
    imm_sent,
    /// Completions polled.
    cqe,
    /// Receiver-not-ready events.
    rnr,
    /// IMMs posted on a rail that carried 0 bytes of a non-empty transfer. The protocol
    /// never does this (an inactive rail sends nothing); anything but 0 is a bug.
    zero_byte_imm,
    /// Completions with an error status.
    errors,
    /// Idle-rail probes posted.
    probes,
    /// RTT samples taken (data chains and probes).
    rtt_samples,
    /// RTT samples above SRTT + 4·RTTVAR.
    congestion_events,
    /// Failures of this rail that the connection survived on the other rail (failover).
    failovers,
    /// Bytes of this rail's parts re-sent on the other rail after it failed.
    replayed_bytes,
    /// Times this rail was re-admitted after a failure (new QPs, probed, used again).
    readmissions,
    /// Times this rail was suspected silent (it completed nothing for long while its
    /// partner completed work): new sends left it until it completed again or failed.
    suspects,
}

/// The current estimates of a rail (gauges, overwritten by each sample).
#[derive(Debug, Default)]
pub struct RailGauges {
    pub srtt_ns: Counter,
    pub rttvar_ns: Counter,
    pub base_ns: Counter,
    pub bw_bytes_per_s: Counter,
    /// 1 while this rail of the connection is failed (failover), else 0.
    pub failed: Counter,
}

/// Where one rail of a connection runs, as the per-NIC and per-peer views group it: the
/// local NIC as `name:port` and the peer's address on that rail (its GID, or `IP:port` on
/// the soft fabric). Set once when the connection is made; the data path never reads it.
#[derive(Clone, Debug, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct StatsPlace {
    pub nic: Arc<str>,
    pub peer: Arc<str>,
}

impl StatsPlace {
    pub fn new(nic: &str, peer: &str) -> Self {
        StatsPlace { nic: nic.into(), peer: peer.into() }
    }
}

impl Default for StatsPlace {
    /// Statistics registered without a place (tests, tools).
    fn default() -> Self {
        StatsPlace::new("unknown", "unknown")
    }
}

/// Everything published about one rail of one connection.
#[derive(Debug)]
pub struct RailStats {
    rail: usize,
    place: StatsPlace,
    pub counters: RailCounters,
    pub gauges: RailGauges,
    pub latency: LatencyHistogram,
}

impl RailStats {
    /// Statistics of rail `rail` (0 = SOUT, 1 = SUP), not yet registered anywhere.
    pub fn new(rail: usize) -> Self {
        Self::at(rail, StatsPlace::default())
    }

    /// Statistics of rail `rail` running at `place`.
    pub fn at(rail: usize, place: StatsPlace) -> Self {
        assert!(rail < 2, "rail {rail}: 0 is SOUT, 1 is SUP");
        RailStats {
            rail,
            place,
            counters: RailCounters::default(),
            gauges: RailGauges::default(),
            latency: LatencyHistogram::default(),
        }
    }

    pub fn rail(&self) -> usize {
        self.rail
    }

    pub fn place(&self) -> &StatsPlace {
        &self.place
    }

    /// One post call (doorbell) of `wrs` work requests, `imm_wrs` of them WRITE_WITH_IMM,
    /// carrying `payload_bytes` of a transfer of `transfer_bytes` in all (both rails).
    /// A CTS write is `count_post(1, 0, 0, 0)`.
    #[inline]
    pub fn count_post(&self, wrs: u64, imm_wrs: u64, payload_bytes: u64, transfer_bytes: u64) {
        let c = &self.counters;
        c.doorbells.add(1);
        c.wr_posted.add(wrs);
        c.imm_sent.add(imm_wrs);
        c.bytes.add(payload_bytes);
        if imm_wrs > 0 && payload_bytes == 0 && transfer_bytes > 0 {
            c.zero_byte_imm.add(imm_wrs);
        }
    }

    /// `n` completions polled.
    #[inline]
    pub fn count_cqes(&self, n: u64) {
        self.counters.cqe.add(n);
    }

    /// The rail is suspected silent (failover's silent-rail detection).
    #[cold]
    pub fn count_suspect(&self) {
        self.counters.suspects.add(1);
    }

    /// The rail failed and the connection goes on without it (failover).
    #[cold]
    pub fn count_failover(&self) {
        self.counters.failovers.add(1);
        self.gauges.failed.set(1);
    }

    /// The rail was re-admitted: it carries traffic again.
    #[cold]
    pub fn count_readmission(&self) {
        self.counters.readmissions.add(1);
        self.gauges.failed.set(0);
    }

    /// `n` bytes of this rail's parts re-sent on the other rail.
    #[cold]
    pub fn count_replayed(&self, n: u64) {
        self.counters.replayed_bytes.add(n);
    }

    /// `n` receiver-not-ready events.
    #[inline]
    pub fn count_rnr(&self, n: u64) {
        self.counters.rnr.add(n);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn count_post_flags_only_empty_imms_of_non_empty_transfers() {
        let s = RailStats::new(1);
        s.count_post(3, 1, 4096, 8192); // a data chain
        s.count_post(1, 0, 0, 0); // a CTS write
        s.count_post(1, 1, 0, 0); // the IMM of an all-empty transfer (SOUT alone)
        assert_eq!(s.counters.zero_byte_imm.get(), 0);
        s.count_post(1, 1, 0, 8192); // an IMM on a rail that carried none of 8 KiB: a bug
        let c = s.counters.load();
        assert_eq!((c.doorbells, c.wr_posted, c.imm_sent, c.bytes, c.zero_byte_imm), (4, 6, 3, 4096, 1));
        s.count_cqes(5);
        s.count_rnr(2);
        let keys: Vec<_> = s.counters.load().fields().map(|(k, _)| k).collect();
        assert_eq!(keys[..7], ["wr_posted", "doorbells", "bytes", "imm_sent", "cqe", "rnr", "zero_byte_imm"]);
        assert_eq!(s.counters.load().fields().find(|(k, _)| *k == "cqe"), Some(("cqe", 5)));
    }

    #[test]
    #[should_panic(expected = "0 is SOUT")]
    fn only_two_rails() {
        RailStats::new(2);
    }
}
