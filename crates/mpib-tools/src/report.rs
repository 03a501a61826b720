//! What a rank measured, as one `key=value` line: per phase and direction the messages,
//! bytes, time, latency percentiles, every kind of wrong, a checksum of the delivered bytes
//! and the plugin's per-rail counters; plus the first error (with the monotonic time it
//! was seen, to time a dead peer's detection) and the answers to bad handles.

use super::kv::{Fields, Writer};
use super::net::{RailCounters, RailStats, Resources};
use super::stats_view::StatsView;
use super::{Error, ErrorKind, Result};

/// CLOCK_MONOTONIC in nanoseconds: the same clock in every process of a host, so a killed
/// rank's last words and its peer's error can be compared.
pub fn mono_ns() -> u64 {
    let mut ts = libc::timespec { tv_sec: 0, tv_nsec: 0 };
    // SAFETY: a valid out-pointer; CLOCK_MONOTONIC always exists on Linux.
    unsafe { libc::clock_gettime(libc::CLOCK_MONOTONIC, &mut ts) };
    ts.tv_sec as u64 * 1_000_000_000 + ts.tv_nsec as u64
}

/// One direction of one phase.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct SideStats {
    /// Requests completed (sends; receives of `nrecv` buffers).
    pub requests: u64,
    /// Buffers sent or received.
    pub messages: u64,
    /// Bytes delivered (after truncation).
    pub bytes: u64,
    /// First post to last completion.
    pub elapsed_ns: u64,
    /// Post-to-completion latency of the requests.
    pub lat_p50_ns: u64,
    pub lat_p99_ns: u64,
    pub lat_max_ns: u64,
    /// Received bytes that differ from the pattern.
    pub wrong_bytes: u64,
    /// Sizes `test` reported that differ from the expected ones.
    pub wrong_sizes: u64,
    /// Buffers whose bytes past the expected size (or past the posted size) were written.
    pub canary_broken: u64,
    /// Wrapping sum of the per-buffer checksums of the delivered bytes.
    pub checksum: u64,
    /// The first thing that was wrong, in words (empty when nothing was).
    pub first_wrong: String,
    /// `isend`/`irecv` calls that answered "retry later" (NULL request).
    pub null_requests: u64,
    pub test_calls: u64,
    /// `iflush` calls that returned a request.
    pub flushes: u64,
    /// The plugin's counters over the phase (after minus before), when it has them.
    pub counters: Option<[RailCounters; 2]>,
    /// Sender with [`super::spec::Phase::timeline_us`]: `[ns since the phase started,
    /// bytes posted on SOUT, on SUP]` since the phase started, one entry per interval and
    /// one at the end.
    pub timeline: Vec<[u64; 3]>,
    /// With the timeline: `[ns, failovers, re-admissions, replayed bytes, suspects]` of the
    /// process since the phase started, whenever one changed (the library's
    /// `mpib_rail_stats`).
    pub failover_events: Vec<[u64; 5]>,
    /// With the timeline: `[ns of the last sample before a failover showed, ns every send
    /// posted before it showed completed]`.
    pub recoveries: Vec<[u64; 2]>,
}

impl SideStats {
    /// Bytes per second of the phase.
    pub fn bandwidth(&self) -> f64 {
        if self.elapsed_ns == 0 { 0.0 } else { self.bytes as f64 * 1e9 / self.elapsed_ns as f64 }
    }

    fn put(&self, w: &mut Writer, p: &str) {
        w.put(&format!("{p}.requests"), self.requests)
            .put(&format!("{p}.messages"), self.messages)
            .put(&format!("{p}.bytes"), self.bytes)
            .put(&format!("{p}.elapsed_ns"), self.elapsed_ns)
            .put(&format!("{p}.lat_p50_ns"), self.lat_p50_ns)
            .put(&format!("{p}.lat_p99_ns"), self.lat_p99_ns)
            .put(&format!("{p}.lat_max_ns"), self.lat_max_ns)
            .put(&format!("{p}.wrong_bytes"), self.wrong_bytes)
            .put(&format!("{p}.wrong_sizes"), self.wrong_sizes)
            .put(&format!("{p}.canary_broken"), self.canary_broken)
            .put(&format!("{p}.checksum"), self.checksum)
            .put(&format!("{p}.first_wrong"), &self.first_wrong)
            .put(&format!("{p}.null_requests"), self.null_requests)
            .put(&format!("{p}.test_calls"), self.test_calls)
            .put(&format!("{p}.flushes"), self.flushes);
        if let Some(c) = &self.counters {
            for (r, c) in c.iter().enumerate() {
                put_counters(w, &format!("{p}.rail{r}"), c);
            }
        }
        put_rows(w, &format!("{p}.timeline"), &self.timeline);
        put_rows(w, &format!("{p}.failover_events"), &self.failover_events);
        put_rows(w, &format!("{p}.recoveries"), &self.recoveries);
    }

    fn get(f: &Fields, p: &str) -> Result<SideStats> {
        let g = |n: &str| f.get::<u64>(&format!("{p}.{n}"));
        let counters = if f.has(&format!("{p}.rail0.wr_posted")) {
            Some([get_counters(f, &format!("{p}.rail0"))?, get_counters(f, &format!("{p}.rail1"))?])
        } else {
            None
        };
        Ok(SideStats {
            requests: g("requests")?,
            messages: g("messages")?,
            bytes: g("bytes")?,
            elapsed_ns: g("elapsed_ns")?,
            lat_p50_ns: g("lat_p50_ns")?,
            lat_p99_ns: g("lat_p99_ns")?,
            lat_max_ns: g("lat_max_ns")?,
            wrong_bytes: g("wrong_bytes")?,
            wrong_sizes: g("wrong_sizes")?,
            canary_broken: g("canary_broken")?,
            checksum: g("checksum")?,
            first_wrong: f.str(&format!("{p}.first_wrong"))?.to_string(),
            null_requests: g("null_requests")?,
            test_calls: g("test_calls")?,
            flushes: g("flushes")?,
            counters,
            timeline: rows(f.get_or(&format!("{p}.timeline"), String::new())?.as_str())?,
            failover_events: rows(f.get_or(&format!("{p}.failover_events"), String::new())?.as_str())?,
            recoveries: rows(f.get_or(&format!("{p}.recoveries"), String::new())?.as_str())?,
        })
    }
}

/// Rows of N numbers as `a:b:c,a:b:c` (nothing when empty).
fn put_rows<const N: usize>(w: &mut Writer, key: &str, rows: &[[u64; N]]) {
    if !rows.is_empty() {
        let t: Vec<String> = rows.iter().map(|r| r.iter().map(u64::to_string).collect::<Vec<_>>().join(":")).collect();
        w.put(key, t.join(","));
    }
}

fn rows<const N: usize>(text: &str) -> Result<Vec<[u64; N]>> {
    let entry = |e: &str| -> Option<[u64; N]> {
        let v: Vec<u64> = e.split(':').map(|v| v.parse::<u64>().ok()).collect::<Option<_>>()?;
        v.try_into().ok()
    };
    text.split(',')
        .filter(|e| !e.is_empty())
        .map(|e| entry(e).ok_or_else(|| Error::usage(format!("timeline entry {e:?} is not {N} numbers a:b:..."))))
        .collect()
}

fn put_counters(w: &mut Writer, p: &str, c: &RailCounters) {
    for (name, v) in counter_fields(c) {
        w.put(&format!("{p}.{name}"), v);
    }
}

fn get_counters(f: &Fields, p: &str) -> Result<RailCounters> {
    let v = |n: &str| f.get::<u64>(&format!("{p}.{n}"));
    Ok(RailCounters {
        wr_posted: v("wr_posted")?,
        doorbells: v("doorbells")?,
        bytes: v("bytes")?,
        imm_sent: v("imm_sent")?,
        cqe: v("cqe")?,
        rnr: v("rnr")?,
        zero_byte_imm: v("zero_byte_imm")?,
        probes: v("probes")?,
    })
}

/// Declares the `mpib_rail_stats_t` figures besides its counters that the report carries,
/// once for writing and reading.
macro_rules! rail_stats_fields {
    ($($f:ident),* $(,)?) => {
        /// The figures of `mpib_rail_stats_t` by name (counters first), `share` aside.
        pub fn rail_stats_fields(s: &RailStats) -> Vec<(&'static str, u64)> {
            let mut v = counter_fields(&s.counters).to_vec();
            v.extend([$((stringify!($f), s.$f),)*]);
            v
        }

        pub(crate) fn put_rail_stats(w: &mut Writer, p: &str, s: &RailStats) {
            put_counters(w, p, &s.counters);
            $(w.put(&format!("{p}.{}", stringify!($f)), s.$f);)*
            w.put(&format!("{p}.share"), s.share);
        }

        pub(crate) fn get_rail_stats(f: &Fields, p: &str) -> Result<RailStats> {
            Ok(RailStats {
                counters: get_counters(f, p)?,
                $($f: f.get(&format!("{p}.{}", stringify!($f)))?,)*
                share: f.get(&format!("{p}.share"))?,
            })
        }
    };
}

rail_stats_fields!(
    errors,
    rtt_samples,
    congestion_events,
    latency_samples,
    latency_min_ns,
    latency_avg_ns,
    latency_median_ns,
    latency_p95_ns,
    latency_p99_ns,
    latency_max_ns,
    srtt_ns,
    rttvar_ns,
    base_latency_ns,
    bw_bytes_per_s,
    live_connections,
    failovers,
    replayed_bytes,
    failed_connections,
    readmissions,
    suspects,
);

/// The counters' fields by name, in the order of `mpib_rail_counters_t`.
pub fn counter_fields(c: &RailCounters) -> [(&'static str, u64); 8] {
    [
        ("wr_posted", c.wr_posted),
        ("doorbells", c.doorbells),
        ("bytes", c.bytes),
        ("imm_sent", c.imm_sent),
        ("cqe", c.cqe),
        ("rnr", c.rnr),
        ("zero_byte_imm", c.zero_byte_imm),
        ("probes", c.probes),
    ]
}

/// `after - before`, field by field.
pub fn counters_delta(after: &[RailCounters; 2], before: &[RailCounters; 2]) -> [RailCounters; 2] {
    let d = |a: &RailCounters, b: &RailCounters| RailCounters {
        wr_posted: a.wr_posted - b.wr_posted,
        doorbells: a.doorbells - b.doorbells,
        bytes: a.bytes - b.bytes,
        imm_sent: a.imm_sent - b.imm_sent,
        cqe: a.cqe - b.cqe,
        rnr: a.rnr - b.rnr,
        zero_byte_imm: a.zero_byte_imm - b.zero_byte_imm,
        probes: a.probes - b.probes,
    };
    [d(&after[0], &before[0]), d(&after[1], &before[1])]
}

/// One phase: what this rank sent (`tx`) and received (`rx`).
#[derive(Clone, Debug, Default, PartialEq)]
pub struct PhaseReport {
    pub tx: Option<SideStats>,
    pub rx: Option<SideStats>,
    /// [`mono_ns`] when this rank started the phase (after its warm-up).
    pub start_ns: u64,
    /// The phase's warm-up ([`super::spec::Phase::warmup`]), if it had one.
    pub warmup: Option<Box<PhaseReport>>,
}

impl PhaseReport {
    /// This phase and its warm-up: everything that must have been delivered intact.
    pub fn with_warmup(&self) -> impl Iterator<Item = &PhaseReport> {
        std::iter::once(self).chain(self.warmup.as_deref())
    }

    fn put(&self, w: &mut Writer, p: &str) {
        w.put(&format!("{p}.start_ns"), self.start_ns);
        if let Some(s) = &self.tx {
            s.put(w, &format!("{p}.tx"));
        }
        if let Some(s) = &self.rx {
            s.put(w, &format!("{p}.rx"));
        }
        if let Some(wu) = &self.warmup {
            wu.put(w, &format!("{p}.w"));
        }
    }

    fn get(f: &Fields, p: &str) -> Result<PhaseReport> {
        let side = |s: &str| -> Result<Option<SideStats>> {
            let p = format!("{p}.{s}");
            if f.has(&format!("{p}.requests")) { SideStats::get(f, &p).map(Some) } else { Ok(None) }
        };
        let w = format!("{p}.w");
        let warmup = if f.has(&format!("{w}.start_ns")) { Some(Box::new(PhaseReport::get(f, &w)?)) } else { None };
        Ok(PhaseReport { tx: side("tx")?, rx: side("rx")?, start_ns: f.get_or(&format!("{p}.start_ns"), 0)?, warmup })
    }
}

/// What this process holds at one moment: the plugin's own figures
/// (`mpib_resource_stats`, when the library has it) and what the kernel counts.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct Snapshot {
    pub res: Option<Resources>,
    /// Open file descriptors, threads, resident memory (KiB) of the process.
    pub fds: u64,
    pub threads: u64,
    pub rss_kib: u64,
}

/// Declares the `mpib_resource_stats_t` fields the report carries, once for both ways.
macro_rules! resource_fields {
    ($($f:ident),* $(,)?) => {
        /// The fields of `mpib_resource_stats_t` by name.
        pub fn resource_fields(r: &Resources) -> Vec<(&'static str, u64)> {
            vec![$((stringify!($f), r.$f),)*]
        }

        fn get_resources(f: &Fields, p: &str) -> Result<Resources> {
            Ok(Resources { $($f: f.get(&format!("{p}.{}", stringify!($f)))?,)* })
        }
    };
}

resource_fields!(
    contexts,
    send_comms,
    recv_comms,
    listen_comms,
    nic_queues,
    cqs,
    cq_entries,
    srqs,
    srq_wqes,
    srq_posted,
    qps,
    qp_send_wrs,
    control_bytes,
    inbox_entries,
    unrouted_completions,
);

impl Snapshot {
    /// This process, now; `res` from the plugin.
    pub fn now(res: Option<Resources>) -> Snapshot {
        let status = std::fs::read_to_string("/proc/self/status").unwrap_or_default();
        let field = |name: &str| {
            status
                .lines()
                .find_map(|l| l.strip_prefix(name))
                .and_then(|v| v.split_whitespace().next())
                .and_then(|v| v.parse().ok())
                .unwrap_or(0)
        };
        let fds = std::fs::read_dir("/proc/self/fd").map(|d| d.count() as u64).unwrap_or(0);
        Snapshot { res, fds, threads: field("Threads:"), rss_kib: field("VmRSS:") }
    }

    fn put(&self, w: &mut Writer, p: &str) {
        w.put(&format!("{p}.fds"), self.fds)
            .put(&format!("{p}.threads"), self.threads)
            .put(&format!("{p}.rss_kib"), self.rss_kib);
        if let Some(r) = &self.res {
            for (name, v) in resource_fields(r) {
                w.put(&format!("{p}.{name}"), v);
            }
        }
    }

    fn get(f: &Fields, p: &str) -> Result<Snapshot> {
        let res = if f.has(&format!("{p}.cqs")) { Some(get_resources(f, p)?) } else { None };
        Ok(Snapshot {
            res,
            fds: f.get(&format!("{p}.fds"))?,
            threads: f.get(&format!("{p}.threads"))?,
            rss_kib: f.get(&format!("{p}.rss_kib"))?,
        })
    }
}

/// One round of a workload: its connections opened, used, closed.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct RoundReport {
    /// From the first `listen`/`connect` to the last comm up.
    pub setup_ns: u64,
    /// Right after the connections came up, after the phases (before closing), after
    /// closing them.
    pub open: Snapshot,
    pub used: Snapshot,
    pub closed: Snapshot,
}

impl RoundReport {
    fn put(&self, w: &mut Writer, p: &str) {
        w.put(&format!("{p}.setup_ns"), self.setup_ns);
        self.open.put(w, &format!("{p}.open"));
        self.used.put(w, &format!("{p}.used"));
        self.closed.put(w, &format!("{p}.closed"));
    }

    fn get(f: &Fields, p: &str) -> Result<RoundReport> {
        Ok(RoundReport {
            setup_ns: f.get(&format!("{p}.setup_ns"))?,
            open: Snapshot::get(f, &format!("{p}.open"))?,
            used: Snapshot::get(f, &format!("{p}.used"))?,
            closed: Snapshot::get(f, &format!("{p}.closed"))?,
        })
    }
}

/// The first error a rank hit.
#[derive(Clone, Debug, PartialEq)]
pub struct Failure {
    pub error: Error,
    /// [`mono_ns`] when it was seen.
    pub at_ns: u64,
}

/// Everything one rank reports.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct RankReport {
    pub rank: u32,
    /// ABI version driven.
    pub abi: u32,
    /// The plugin's `name` and device 0's name.
    pub plugin: String,
    pub device: String,
    /// From `init` to connected comms.
    pub setup_ns: u64,
    pub phases: Vec<PhaseReport>,
    /// Bad-handle probes: (what, `ncclResult_t` returned).
    pub bad_handles: Vec<(String, i32)>,
    /// The plugin's per-rail statistics of this process after the last phase
    /// (`mpib_rail_stats`), when the library has them.
    pub rails: Option<[RailStats; 2]>,
    /// The plugin's per-NIC and per-peer view of this process after the last phase, its
    /// connections still open (`mpib_nic_stats`, `mpib_worst_peers`), when the library has it.
    pub view: Option<StatsView>,
    /// The line rate (Mbit/s) of each rail of the device used (SOUT, SUP), where the plugin
    /// says what it is (`mpib_device_rails`).
    pub line_mbps: [Option<u32>; 2],
    /// The process after `init`, before any connection.
    pub base: Snapshot,
    /// One entry per round ([`super::spec::Workload::rounds`]) this rank finished.
    pub rounds: Vec<RoundReport>,
    pub failure: Option<Failure>,
}

fn kind_name(k: &ErrorKind) -> &'static str {
    match k {
        ErrorKind::Load => "load",
        ErrorKind::Call => "call",
        ErrorKind::Contract => "contract",
        ErrorKind::Data => "data",
        ErrorKind::Timeout => "timeout",
        ErrorKind::Io => "io",
        ErrorKind::Usage => "usage",
    }
}

fn kind_of(s: &str) -> ErrorKind {
    match s {
        "load" => ErrorKind::Load,
        "call" => ErrorKind::Call,
        "contract" => ErrorKind::Contract,
        "data" => ErrorKind::Data,
        "timeout" => ErrorKind::Timeout,
        "io" => ErrorKind::Io,
        _ => ErrorKind::Usage,
    }
}

/// Plugin call names, so a parsed report keeps `Error::call` as `&'static str`.
const CALLS: &[&str] = &[
    "",
    "init",
    "devices",
    "getProperties",
    "listen",
    "connect",
    "accept",
    "regMr",
    "deregMr",
    "isend",
    "irecv",
    "iflush",
    "test",
    "closeSend",
    "closeRecv",
    "closeListen",
    "finalize",
    "mpib_comm_counters",
    "mpib_rail_stats",
    "mpib_resource_stats",
    "mpib_device_rails",
    "mpib_nic_stats",
    "mpib_worst_peers",
];

impl RankReport {
    pub fn ok(&self) -> bool {
        self.failure.is_none()
    }

    pub fn to_line(&self) -> String {
        let mut w = Writer::new();
        w.put("rank", self.rank)
            .put("abi", self.abi)
            .put("plugin", &self.plugin)
            .put("device", &self.device)
            .put("setup_ns", self.setup_ns)
            .put("phases", self.phases.len())
            .put("bad_handles", self.bad_handles.len())
            .put("rounds", self.rounds.len());
        self.base.put(&mut w, "base");
        for (i, r) in self.rounds.iter().enumerate() {
            r.put(&mut w, &format!("round{i}"));
        }
        for (i, p) in self.phases.iter().enumerate() {
            p.put(&mut w, &format!("p{i}"));
        }
        for (i, (what, code)) in self.bad_handles.iter().enumerate() {
            w.put(&format!("bad{i}.what"), what).put(&format!("bad{i}.code"), code);
        }
        if let Some(r) = &self.rails {
            for (n, s) in r.iter().enumerate() {
                put_rail_stats(&mut w, &format!("rails.r{n}"), s);
            }
        }
        if let Some(v) = &self.view {
            v.put(&mut w, "view");
        }
        for (n, m) in self.line_mbps.iter().enumerate() {
            if let Some(m) = m {
                w.put(&format!("line_mbps.r{n}"), m);
            }
        }
        if let Some(f) = &self.failure {
            w.put("error.kind", kind_name(&f.error.kind))
                .put("error.call", f.error.call)
                .put("error.code", f.error.code)
                .put("error.msg", &f.error.msg)
                .put("error.at_ns", f.at_ns);
        }
        w.finish()
    }

    pub fn from_line(line: &str) -> Result<RankReport> {
        let f = Fields::parse(line)?;
        let mut r = RankReport {
            rank: f.get("rank")?,
            abi: f.get("abi")?,
            plugin: f.str("plugin")?.to_string(),
            device: f.str("device")?.to_string(),
            setup_ns: f.get("setup_ns")?,
            ..RankReport::default()
        };
        for i in 0..f.get::<usize>("phases")? {
            r.phases.push(PhaseReport::get(&f, &format!("p{i}"))?);
        }
        r.base = Snapshot::get(&f, "base")?;
        for i in 0..f.get::<usize>("rounds")? {
            r.rounds.push(RoundReport::get(&f, &format!("round{i}"))?);
        }
        for i in 0..f.get::<usize>("bad_handles")? {
            r.bad_handles.push((f.str(&format!("bad{i}.what"))?.to_string(), f.get(&format!("bad{i}.code"))?));
        }
        if f.has("rails.r0.wr_posted") {
            r.rails = Some([get_rail_stats(&f, "rails.r0")?, get_rail_stats(&f, "rails.r1")?]);
        }
        r.view = StatsView::get(&f, "view")?;
        for n in 0..2 {
            let key = format!("line_mbps.r{n}");
            if f.has(&key) {
                r.line_mbps[n] = Some(f.get(&key)?);
            }
        }
        if f.has("error.kind") {
            let call = f.str("error.call")?;
            let error = Error {
                kind: kind_of(f.str("error.kind")?),
                call: CALLS.iter().find(|&&c| c == call).copied().unwrap_or("?"),
                code: f.get("error.code")?,
                msg: f.str("error.msg")?.to_string(),
            };
            r.failure = Some(Failure { error, at_ns: f.get("error.at_ns")? });
        }
        Ok(r)
    }
}

#[cfg(test)]
mod tests;
