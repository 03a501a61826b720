//! One rank's per-NIC and per-peer view at the end of a run (`mpib_nic_stats`,
//! `mpib_worst_peers`), taken while its connections are still open (the per-peer latencies
//! are of live connections): carried in its report, printed for an operator by
//! `mpib-perf --stats`, and as JSON.

use std::fmt::Write as _;

use serde_json::{Value, json};

use super::Result;
use super::kv::{Fields, Writer};
use super::net::rails::c_text;
use super::net::{NicStats, PeerStats, Plugin, RailStats, WorstBy};
use super::report::{get_rail_stats, put_rail_stats, rail_stats_fields};

/// How many peers each ranking lists (as the plugin's statistics file).
pub const WORST_PEERS: usize = 8;

const RAIL_NAMES: [&str; 2] = ["SOUT", "SUP"];

fn rail_name(rail: usize) -> &'static str {
    RAIL_NAMES.get(rail).copied().unwrap_or("?")
}

/// One NIC port on one rail over the whole process.
#[derive(Clone, Debug, PartialEq)]
pub struct NicRow {
    /// `mlx5_0:1`, `soft-sout:1`.
    pub nic: String,
    /// 0 = SOUT, 1 = SUP.
    pub rail: usize,
    /// `share` is this row's part of the payload bytes of all rows.
    pub stats: RailStats,
}

/// Declares [`PeerRow`]'s figures once for the struct, the report line and JSON.
macro_rules! peer_row {
    ($($f:ident),* $(,)?) => {
        /// One peer as one local NIC reaches it on one rail: counters over the run, latencies
        /// and SRTT of the live connections.
        #[derive(Clone, Debug, Default, PartialEq, Eq)]
        pub struct PeerRow {
            /// The peer's address on this rail: `GID …`, `LID … GID …` or `IP:port`.
            pub peer: String,
            pub nic: String,
            pub rail: usize,
            $(pub $f: u64,)*
        }

        impl PeerRow {
            fn of(p: &PeerStats) -> PeerRow {
                PeerRow {
                    peer: c_text(&p.peer),
                    nic: c_text(&p.nic),
                    rail: p.rail as usize,
                    $($f: p.$f,)*
                }
            }

            /// The figures by name.
            pub fn fields(&self) -> Vec<(&'static str, u64)> {
                vec![$((stringify!($f), self.$f),)*]
            }

            fn get(f: &Fields, p: &str) -> Result<PeerRow> {
                Ok(PeerRow {
                    peer: f.str(&format!("{p}.peer"))?.to_string(),
                    nic: f.str(&format!("{p}.nic"))?.to_string(),
                    rail: f.get(&format!("{p}.rail"))?,
                    $($f: f.get(&format!("{p}.{}", stringify!($f)))?,)*
                })
            }
        }
    };
}

peer_row!(
    live_connections,
    latency_samples,
    latency_median_ns,
    latency_p99_ns,
    latency_max_ns,
    srtt_ns,
    bytes,
    errors,
    failovers,
    suspects,
);

impl PeerRow {
    fn put(&self, w: &mut Writer, p: &str) {
        w.put(&format!("{p}.peer"), &self.peer)
            .put(&format!("{p}.nic"), &self.nic)
            .put(&format!("{p}.rail"), self.rail);
        for (k, v) in self.fields() {
            w.put(&format!("{p}.{k}"), v);
        }
    }

    fn json(&self) -> Value {
        let mut o = json!({ "peer": self.peer, "nic": self.nic, "rail": rail_name(self.rail) });
        for (k, v) in self.fields() {
            o[k] = v.into();
        }
        o
    }
}

/// What `mpib_nic_stats` and `mpib_worst_peers` said at one moment.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct StatsView {
    /// Every NIC on each rail, by NIC then rail.
    pub nics: Vec<NicRow>,
    /// The worst peers by latency (p99 of data chains, then SRTT), worst first.
    pub slow: Vec<PeerRow>,
    /// The worst peers by errors + failovers + suspicions, worst first.
    pub troubled: Vec<PeerRow>,
}

impl StatsView {
    /// This process's view now; `None` when the library does not export the calls.
    pub fn take(plugin: &Plugin) -> Result<Option<StatsView>> {
        let Some(nics) = plugin.nic_stats()? else { return Ok(None) };
        let Some(slow) = plugin.worst_peers(WorstBy::Latency, WORST_PEERS)? else { return Ok(None) };
        let Some(troubled) = plugin.worst_peers(WorstBy::Errors, WORST_PEERS)? else { return Ok(None) };
        let nics =
            nics.iter().map(|n: &NicStats| NicRow { nic: c_text(&n.nic), rail: n.rail as usize, stats: n.stats });
        Ok(Some(StatsView {
            nics: nics.collect(),
            slow: slow.iter().map(PeerRow::of).collect(),
            troubled: troubled.iter().map(PeerRow::of).collect(),
        }))
    }

    pub(crate) fn put(&self, w: &mut Writer, p: &str) {
        w.put(&format!("{p}.nics"), self.nics.len())
            .put(&format!("{p}.slow"), self.slow.len())
            .put(&format!("{p}.troubled"), self.troubled.len());
        for (i, n) in self.nics.iter().enumerate() {
            w.put(&format!("{p}.nic{i}.name"), &n.nic).put(&format!("{p}.nic{i}.rail"), n.rail);
            put_rail_stats(w, &format!("{p}.nic{i}"), &n.stats);
        }
        for (i, r) in self.slow.iter().enumerate() {
            r.put(w, &format!("{p}.slow{i}"));
        }
        for (i, r) in self.troubled.iter().enumerate() {
            r.put(w, &format!("{p}.troubled{i}"));
        }
    }

    /// The view under prefix `p`, if the line has one.
    pub(crate) fn get(f: &Fields, p: &str) -> Result<Option<StatsView>> {
        if !f.has(&format!("{p}.nics")) {
            return Ok(None);
        }
        let mut v = StatsView::default();
        for i in 0..f.get::<usize>(&format!("{p}.nics"))? {
            let q = format!("{p}.nic{i}");
            let (nic, rail) = (f.str(&format!("{q}.name"))?.to_string(), f.get(&format!("{q}.rail"))?);
            v.nics.push(NicRow { nic, rail, stats: get_rail_stats(f, &q)? });
        }
        for i in 0..f.get::<usize>(&format!("{p}.slow"))? {
            v.slow.push(PeerRow::get(f, &format!("{p}.slow{i}"))?);
        }
        for i in 0..f.get::<usize>(&format!("{p}.troubled"))? {
            v.troubled.push(PeerRow::get(f, &format!("{p}.troubled{i}"))?);
        }
        Ok(Some(v))
    }

    /// The view as an operator reads it, every line starting with `#`, headed by `who`
    /// (`rank 1 (sends)`): per NIC and rail its counters, then its latencies and estimates;
    /// then the two rankings of peers as tables.
    pub fn text(&self, who: &str) -> String {
        let us = |ns: u64| ns as f64 / 1e3;
        let mut t = String::new();
        let _ = writeln!(t, "# {who}: per NIC and rail, over the run (mpib_nic_stats)");
        if self.nics.is_empty() {
            t.push_str("#   no NIC carried a connection\n");
        }
        let nic_w = self.nics.iter().map(|n| n.nic.len()).max().unwrap_or(0);
        for n in &self.nics {
            let (s, c) = (&n.stats, &n.stats.counters);
            let _ = writeln!(
                t,
                "#   {:<nic_w$} {:<4} bytes {} ({:.1}%) WRs {} doorbells {} IMMs {} CQEs {} RNR {} probes {} | errors {} failovers {} (replayed {} B) readmissions {} suspects {} | live conns {} failed {}",
                n.nic,
                rail_name(n.rail),
                c.bytes,
                s.share * 100.0,
                c.wr_posted,
                c.doorbells,
                c.imm_sent,
                c.cqe,
                c.rnr,
                c.probes,
                s.errors,
                s.failovers,
                s.replayed_bytes,
                s.readmissions,
                s.suspects,
                s.live_connections,
                s.failed_connections,
            );
            let _ = writeln!(
                t,
                "#   {:<nic_w$} {:<4} latency {} samples: min {:.1} avg {:.1} p50 {:.1} p95 {:.1} p99 {:.1} max {:.1} us | srtt {:.1} us rttvar {:.1} us base {:.1} us | {:.3} GB/s | RTT samples {} congestion events {}",
                "",
                "",
                s.latency_samples,
                us(s.latency_min_ns),
                us(s.latency_avg_ns),
                us(s.latency_median_ns),
                us(s.latency_p95_ns),
                us(s.latency_p99_ns),
                us(s.latency_max_ns),
                us(s.srtt_ns),
                us(s.rttvar_ns),
                us(s.base_latency_ns),
                s.bw_bytes_per_s as f64 / 1e9,
                s.rtt_samples,
                s.congestion_events,
            );
        }
        peer_table(&mut t, who, "by latency (p99 of data chains on live connections, then srtt)", &self.slow);
        peer_table(&mut t, who, "by errors (errors + failovers + suspicions over the run)", &self.troubled);
        t
    }

    /// The view as JSON: `nics` (every figure of each row), `worst_by_latency` and
    /// `worst_by_errors` (worst first).
    pub fn json(&self) -> Value {
        let nics: Vec<Value> = self
            .nics
            .iter()
            .map(|n| {
                let mut o = json!({ "nic": n.nic, "rail": rail_name(n.rail), "share": n.stats.share });
                for (k, v) in rail_stats_fields(&n.stats) {
                    o[k] = v.into();
                }
                o
            })
            .collect();
        json!({
            "nics": nics,
            "worst_by_latency": self.slow.iter().map(PeerRow::json).collect::<Vec<_>>(),
            "worst_by_errors": self.troubled.iter().map(PeerRow::json).collect::<Vec<_>>(),
        })
    }
}

fn peer_table(t: &mut String, who: &str, what: &str, rows: &[PeerRow]) {
    if rows.is_empty() {
        let _ = writeln!(t, "# {who}: worst peers {what}: none ranked");
        return;
    }
    let _ = writeln!(t, "# {who}: worst peers {what}, worst first (mpib_worst_peers)");
    let peer_w = rows.iter().map(|r| r.peer.len()).max().unwrap_or(0).max(4);
    let nic_w = rows.iter().map(|r| r.nic.len()).max().unwrap_or(0).max(3);
    let _ = writeln!(
        t,
        "#   {:<peer_w$} {:<nic_w$} {:<4} {:>9} {:>9} {:>9} {:>9} {:>8} {:>14} {:>6} {:>9} {:>8} {:>5}",
        "peer",
        "NIC",
        "rail",
        "p50 us",
        "p99 us",
        "max us",
        "srtt us",
        "samples",
        "bytes",
        "errors",
        "failovers",
        "suspects",
        "conns"
    );
    let us = |ns: u64| ns as f64 / 1e3;
    for r in rows {
        let _ = writeln!(
            t,
            "#   {:<peer_w$} {:<nic_w$} {:<4} {:>9.1} {:>9.1} {:>9.1} {:>9.1} {:>8} {:>14} {:>6} {:>9} {:>8} {:>5}",
            r.peer,
            r.nic,
            rail_name(r.rail),
            us(r.latency_median_ns),
            us(r.latency_p99_ns),
            us(r.latency_max_ns),
            us(r.srtt_ns),
            r.latency_samples,
            r.bytes,
            r.errors,
            r.failovers,
            r.suspects,
            r.live_connections,
        );
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn view() -> StatsView {
        let mut s = RailStats { share: 0.75, latency_p99_ns: 42_000, ..RailStats::default() };
        s.counters.bytes = 3 << 20;
        let slow = PeerRow {
            peer: "198.18.0.13:40001".into(),
            nic: "soft-sout:1".into(),
            rail: 0,
            latency_p99_ns: 20_500_000,
            bytes: 1 << 20,
            live_connections: 1,
            ..PeerRow::default()
        };
        let troubled =
            PeerRow { peer: "GID fe80::1".into(), nic: "mlx5_0:1".into(), rail: 1, errors: 3, ..slow.clone() };
        StatsView {
            nics: vec![
                NicRow { nic: "soft-sout:1".into(), rail: 0, stats: s },
                NicRow { nic: "soft-sup:1".into(), rail: 1, stats: RailStats { share: 0.25, ..s } },
            ],
            slow: vec![slow],
            troubled: vec![troubled],
        }
    }

    #[test]
    fn a_view_round_trips_through_the_report_line() {
        let v = view();
        let mut w = Writer::new();
        v.put(&mut w, "view");
        let f = Fields::parse(&w.finish()).unwrap();
        assert_eq!(StatsView::get(&f, "view").unwrap(), Some(v));
        assert_eq!(StatsView::get(&f, "other").unwrap(), None);
    }

    #[test]
    fn the_text_names_each_nic_and_peer_and_the_json_has_every_figure() {
        let v = view();
        let t = v.text("rank 1 (sends)");
        assert!(t.lines().all(|l| l.starts_with('#')), "{t}");
        let row = t.lines().find(|l| l.contains("soft-sout:1 SOUT bytes 3145728 (75.0%)")).expect(&t);
        assert!(row.contains("errors 0"), "{row}");
        assert!(t.contains("soft-sup:1  SUP  bytes 3145728 (25.0%)"), "{t}");
        let slow = t.lines().find(|l| l.contains("198.18.0.13:40001")).expect(&t);
        assert!(slow.contains("soft-sout:1") && slow.contains("20500.0"), "{slow}");
        assert!(t.contains("GID fe80::1"), "{t}");
        let j = v.json();
        assert_eq!(j["nics"][1]["rail"], "SUP");
        assert_eq!(j["nics"][0]["bytes"], 3 << 20);
        assert_eq!(j["nics"][0]["latency_p99_ns"], 42_000);
        assert_eq!(j["worst_by_latency"][0]["peer"], "198.18.0.13:40001");
        assert_eq!(j["worst_by_errors"][0]["errors"], 3);
        let empty = StatsView::default().text("rank 0");
        assert!(empty.contains("no NIC") && empty.contains("none ranked"), "{empty}");
    }
}
