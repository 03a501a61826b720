//! Every `MPIB_*` environment variable, and NCCL's variables that are their defaults,
//! parsed once into one validated [`Config`].
//!
//! A bad value (unknown word, out of range, unparsable number, unequal list lengths) is an
//! error naming the variable, the value and what is accepted;
//! `init` then fails with `ncclInvalidArgument`. An unknown `MPIB_*` name is only warned
//! about (it is most likely a typo), with the list of known names. Settings of each rail and
//! settings that follow an NCCL variable come in layers (`layers.rs`); what mpib says of
//! NCCL's other `NCCL_IB_*` variables is in `nccl.rs`.

use std::net::IpAddr;

use crate::fabric::FaultKind;

mod describe;
mod layers;
pub mod nccl;
mod vars;
pub use layers::{MAX_QPS_PER_RAIL, Origins, RAIL_NAMES, RailConfig};
pub use vars::{VARS, VarDoc, known_names, markdown_table};

/// Which fabric provider carries the rails.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum FabricChoice {
    /// verbs on a host with RDMA devices (`init` fails when they cannot be used); soft on
    /// a host without (logged once at INFO).
    Auto,
    /// Real RDMA NICs through libibverbs; `init` fails when there are none.
    Verbs,
    /// The software RDMA NIC over TCP.
    Soft,
    /// The software RDMA NIC with both ends in this process: no sockets, no threads
    /// (deterministic tests, counting instructions per message).
    Inproc,
}

pub mod hca;

pub use hca::{HcaFilter, HcaSpec, Selection};

/// PCI relaxed ordering for registrations (`MPIB_PCI_RELAXED_ORDERING`, net_ib's
/// `NCCL_IB_PCI_RELAXED_ORDERING`).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum RelaxedOrdering {
    /// 0: never.
    Off,
    /// 1: on; a WARN when libibverbs cannot (no `ibv_reg_mr_iova2`).
    On,
    /// 2: on where libibverbs can, silently off where it cannot (net_ib's default).
    Auto,
}

/// What NCCL's devices are (`MPIB_NCCL_DEVICES`).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum NcclDevices {
    /// `nics` through ABI v9+ for rail pairs whose two NICs are separate PCI devices on one
    /// NUMA node; `pairs` otherwise.
    Auto,
    /// One device per rail pair, through every ABI version (NCCL sees SOUT's PCI position).
    Pairs,
    /// The NICs themselves through ABI v9+, fused into rail pairs by NCCL (`makeVDevice`),
    /// whatever their PCI paths (for tests of fusion on virtual NICs).
    Nics,
}

/// How each send is divided between the rails.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum SplitMode {
    /// Telemetry-driven: both rails finish at the same time.
    Auto,
    /// Everything on SOUT.
    Sout,
    /// Everything on SUP.
    Sup,
    /// A fixed percentage of the bytes on SOUT (0–100).
    Percent(u8),
}

/// A soft-fabric rail's local address: an IP address or an interface name.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum RailAddr {
    Ip(IpAddr),
    Interface(String),
}

/// The validated configuration.
#[derive(Clone, Debug, PartialEq)]
pub struct Config {
    pub fabric: FabricChoice,
    /// Rail pairs: `hca_sout[i]` with `hca_sup[i]`; both empty = pair automatically.
    pub hca_sout: Vec<HcaSpec>,
    pub hca_sup: Vec<HcaSpec>,
    /// Which ports automatic pairing may use (`MPIB_HCA`, else `NCCL_IB_HCA`); `None`:
    /// every active port.
    pub hca_filter: Option<HcaFilter>,
    /// The variable `hca_filter` came from.
    pub hca_filter_var: &'static str,
    pub relaxed_ordering: RelaxedOrdering,
    /// Offer DMA-BUF registration of GPU memory where the NICs can (`MPIB_DMABUF`).
    pub dmabuf: bool,
    /// The P_Key table index of the verbs QPs (`MPIB_PKEY`, else `NCCL_IB_PKEY`).
    pub pkey_index: u16,
    pub nccl_devices: NcclDevices,
    pub split: SplitMode,
    /// Sends below this size go whole to one rail under `MPIB_SPLIT=auto`.
    pub split_min_bytes: u64,
    /// Depth of the shared receive queue of each NIC a communicator uses.
    pub srq_depth: u32,
    /// What each rail's QPs are made with (SOUT, SUP): QPs, traffic classes, service
    /// level, GID.
    pub rails: [RailConfig; 2],
    pub timeout: u8,
    pub retry_cnt: u8,
    /// Which variable each layered setting's value came from (absent: the default).
    pub origins: Origins,
    /// Rail failover: a rail failure is survived while the other rail works.
    /// Off: any rail failure fails the connection.
    pub failover: bool,
    /// A rail with signalled work outstanding and no completion for this long has failed
    /// (0 = only the fabric's own detection).
    pub stall_ms: u64,
    /// Re-admission of a failed rail: first back-off, and its cap.
    pub readmit_ms: u64,
    pub readmit_max_ms: u64,
    /// How long a connection whose rails have all failed waits for one to come back
    /// (`MPIB_OUTAGE_GRACE_MS`; 0: it fails at once). `None`: RC's retry budget
    /// ([`Config::outage_grace_ms`]).
    pub outage_grace: Option<u64>,
    /// The silent-rail check's failure floor in ms (`MPIB_SILENT_MS`; 0: the check is
    /// off). `None`: by fabric ([`Config::silent_floor_ms`]).
    pub silent: Option<u64>,
    /// Fault drill (soft fabric, `MPIB_FAULT_RAIL`).
    pub fault_rail: Option<FaultDrill>,
    pub rtt_alpha: f64,
    pub rtt_beta: f64,
    /// 0 = no probes.
    pub probe_interval_us: u64,
    /// Idle probes per second per NIC (0 = no cap).
    pub probe_rate: u64,
    pub stats_file: Option<String>,
    /// The node-exporter textfile (Prometheus text format), rewritten with the statistics.
    pub prom_file: Option<String>,
    pub stats_interval_ms: u64,
    pub soft_sout_addr: Option<RailAddr>,
    pub soft_sup_addr: Option<RailAddr>,
    pub connect_timeout_ms: u64,
    /// A request outstanding this long makes its connection log a hang report (0: never).
    pub hang_report_ms: u64,
    /// `NCCL_SOCKET_IFNAME`, honoured for the default soft-rail and bootstrap addresses.
    pub socket_ifname: Option<String>,
    /// `MPIB_*` names that are not known (typos); warned about, not fatal.
    pub unknown: Vec<String>,
    /// Other variables read but ignored, each with why (warned about at init).
    pub ignored: Vec<String>,
    /// NCCL variables set that concern only NCCL's own IB transport, each with why (named at
    /// INFO at init).
    pub not_applicable: Vec<String>,
}

impl Default for Config {
    fn default() -> Self {
        Config {
            fabric: FabricChoice::Auto,
            hca_sout: Vec::new(),
            hca_sup: Vec::new(),
            hca_filter: None,
            hca_filter_var: "MPIB_HCA",
            relaxed_ordering: RelaxedOrdering::Auto,
            dmabuf: true,
            pkey_index: 0,
            nccl_devices: NcclDevices::Auto,
            split: SplitMode::Auto,
            split_min_bytes: 65536,
            srq_depth: 16384,
            rails: [RailConfig::default(); 2],
            // NCCL's defaults: 4.096 µs × 2^20 × 8 ≈ 34.4 s before a silent link errors, so an
            // outage of both rails shorter than that is ridden out by RC's retransmissions; a
            // silent rail beside a working one is left within ~50 ms by the engine's
            // silent-rail detection, not by this budget. DESIGN.md "Rail failover".
            timeout: 20,
            retry_cnt: 7,
            origins: Origins::new(),
            failover: true,
            stall_ms: 0,
            readmit_ms: 100,
            readmit_max_ms: 1000,
            outage_grace: None,
            silent: None,
            fault_rail: None,
            rtt_alpha: 0.125,
            rtt_beta: 0.25,
            probe_interval_us: 1000,
            probe_rate: 10_000,
            stats_file: None,
            prom_file: None,
            stats_interval_ms: 1000,
            soft_sout_addr: None,
            soft_sup_addr: None,
            connect_timeout_ms: 0,
            hang_report_ms: 10_000,
            socket_ifname: None,
            unknown: Vec::new(),
            ignored: Vec::new(),
            not_applicable: Vec::new(),
        }
    }
}

impl Config {
    /// Parses a set of `(name, value)` pairs (normally the process environment).
    /// Returns every bad variable at once, one line each.
    pub fn from_vars<I, K, V>(vars: I) -> std::result::Result<Config, Vec<String>>
    where
        I: IntoIterator<Item = (K, V)>,
        K: AsRef<str>,
        V: AsRef<str>,
    {
        let mut c = Config::default();
        let mut errors = Vec::new();
        let mut nccl_ib_hca: Option<String> = None;
        let mut hca_sout_set = false;
        let mut hca_sup_set = false;
        let mut layers = layers::Layers::default();
        for (k, v) in vars {
            let (name, raw) = (k.as_ref(), v.as_ref());
            if name == "NCCL_SOCKET_IFNAME" {
                c.socket_ifname = (!raw.trim().is_empty()).then(|| raw.trim().to_string());
                continue;
            }
            if name == "NCCL_IB_HCA" {
                nccl_ib_hca = (!raw.trim().is_empty()).then(|| raw.trim().to_string());
                continue;
            }
            if layers.take(name, raw) {
                continue;
            }
            if name.starts_with("NCCL_") {
                match nccl::unfollowed(name, raw) {
                    nccl::Unfollowed::Warn(w) => c.ignored.push(w),
                    nccl::Unfollowed::Info(i) => c.not_applicable.push(i),
                    nccl::Unfollowed::Quiet => {}
                }
                continue;
            }
            if !name.starts_with("MPIB_") {
                continue;
            }
            let value = raw.trim();
            let r = match name {
                "MPIB_FABRIC" => parse_word(
                    value,
                    &[
                        ("auto", FabricChoice::Auto),
                        ("verbs", FabricChoice::Verbs),
                        ("soft", FabricChoice::Soft),
                        ("inproc", FabricChoice::Inproc),
                    ],
                )
                .map(|f| c.fabric = f),
                "MPIB_HCA" => HcaFilter::parse(value).map(|f| c.hca_filter = Some(f)),
                "MPIB_HCA_SOUT" => hca::parse_list(value).map(|l| {
                    hca_sout_set = true;
                    c.hca_sout = l
                }),
                "MPIB_HCA_SUP" => hca::parse_list(value).map(|l| {
                    hca_sup_set = true;
                    c.hca_sup = l
                }),
                "MPIB_NCCL_DEVICES" => parse_word(
                    value,
                    &[("auto", NcclDevices::Auto), ("pairs", NcclDevices::Pairs), ("nics", NcclDevices::Nics)],
                )
                .map(|d| c.nccl_devices = d),
                "MPIB_SPLIT" => parse_split(value).map(|s| c.split = s),
                "MPIB_SPLIT_MIN_BYTES" => parse_int(value, 0, 1 << 30).map(|n| c.split_min_bytes = n as u64),
                "MPIB_SRQ_DEPTH" => parse_int(value, 64, 1 << 20).map(|n| c.srq_depth = n as u32),
                "MPIB_FAILOVER" => parse_word(value, &[("0", false), ("1", true)]).map(|b| c.failover = b),
                "MPIB_STALL_MS" => parse_int(value, 0, 600_000).map(|n| c.stall_ms = n as u64),
                "MPIB_READMIT_MS" => parse_int(value, 10, 60_000).map(|n| c.readmit_ms = n as u64),
                "MPIB_READMIT_MAX_MS" => parse_int(value, 100, 600_000).map(|n| c.readmit_max_ms = n as u64),
                "MPIB_OUTAGE_GRACE_MS" => match value.to_ascii_lowercase().as_str() {
                    "auto" => {
                        c.outage_grace = None;
                        Ok(())
                    }
                    _ => parse_int(value, 0, 3_600_000)
                        .map(|n| c.outage_grace = Some(n as u64))
                        .map_err(|e| format!("auto or {e}")),
                },
                "MPIB_SILENT_MS" => match value.to_ascii_lowercase().as_str() {
                    "auto" => {
                        c.silent = None;
                        Ok(())
                    }
                    _ => parse_int(value, 0, 600_000)
                        .map(|n| c.silent = Some(n as u64))
                        .map_err(|e| format!("auto or {e}")),
                },
                "MPIB_FAULT_RAIL" => parse_fault(value).map(|f| c.fault_rail = Some(f)),
                "MPIB_RTT_ALPHA" => parse_gain(value).map(|g| c.rtt_alpha = g),
                "MPIB_RTT_BETA" => parse_gain(value).map(|g| c.rtt_beta = g),
                "MPIB_PROBE_INTERVAL_US" => parse_int(value, 0, 10_000_000).map(|n| c.probe_interval_us = n as u64),
                "MPIB_PROBE_RATE" => parse_int(value, 0, 10_000_000).map(|n| c.probe_rate = n as u64),
                "MPIB_STATS_FILE" => {
                    c.stats_file = (!value.is_empty()).then(|| value.to_string());
                    Ok(())
                }
                "MPIB_PROM_FILE" => {
                    c.prom_file = (!value.is_empty()).then(|| value.to_string());
                    Ok(())
                }
                "MPIB_STATS_INTERVAL_MS" => parse_int(value, 10, 3_600_000).map(|n| c.stats_interval_ms = n as u64),
                "MPIB_SOFT_SOUT_ADDR" => parse_rail_addr(value).map(|a| c.soft_sout_addr = Some(a)),
                "MPIB_SOFT_SUP_ADDR" => parse_rail_addr(value).map(|a| c.soft_sup_addr = Some(a)),
                "MPIB_CONNECT_TIMEOUT_MS" => parse_int(value, 0, 3_600_000).and_then(|n| match n {
                    1..=99 => Err(format!("{n} ms is too short a set-up deadline (0 = none, else 100 or more)")),
                    n => {
                        c.connect_timeout_ms = n as u64;
                        Ok(())
                    }
                }),
                "MPIB_HANG_REPORT_MS" => parse_int(value, 0, 3_600_000).and_then(|n| match n {
                    1..=99 => Err(format!("{n} ms is too short for a hang report (0 = off, else 100 or more)")),
                    n => {
                        c.hang_report_ms = n as u64;
                        Ok(())
                    }
                }),
                // The project's own test switches (`MPIB_TEST_*`) are no settings of mpib.
                _ if name.starts_with("MPIB_TEST_") => Ok(()),
                _ => {
                    c.unknown.push(name.to_string());
                    Ok(())
                }
            };
            if let Err(accepted) = r {
                errors.push(format!("{name}={} is not valid: accepted {accepted}", shown(raw)));
            }
        }
        // NCCL_IB_HCA is NCCL's own variable: the same selection for mpib's automatic
        // pairing unless MPIB_HCA says otherwise. NCCL accepts nearly anything there, so a
        // value mpib cannot read is not fatal: it is ignored with a WARN (at init).
        if c.hca_filter.is_none()
            && let Some(v) = nccl_ib_hca
        {
            match HcaFilter::parse(&v) {
                Ok(f) => (c.hca_filter, c.hca_filter_var) = (Some(f), "NCCL_IB_HCA"),
                Err(accepted) => c.ignored.push(format!(
                    "NCCL_IB_HCA={} is not understood (accepted: {accepted}); automatic pairing uses every active port",
                    shown(&v)
                )),
            }
        }
        let r = layers.resolve();
        (c.rails, c.timeout, c.retry_cnt, c.relaxed_ordering, c.dmabuf, c.pkey_index) =
            (r.rails, r.timeout, r.retry_cnt, r.relaxed_ordering, r.dmabuf, r.pkey_index);
        c.origins = std::mem::take(&mut layers.origins);
        errors.append(&mut layers.errors);
        c.ignored.sort();
        c.not_applicable.sort();
        if hca_sout_set != hca_sup_set || c.hca_sout.len() != c.hca_sup.len() {
            errors.push(format!(
                "MPIB_HCA_SOUT ({} entries) and MPIB_HCA_SUP ({} entries) must both be set, with equal lengths (pair i = SOUT[i] + SUP[i])",
                c.hca_sout.len(),
                c.hca_sup.len()
            ));
        }
        c.unknown.sort();
        if errors.is_empty() { Ok(c) } else { Err(errors) }
    }

    /// The variable that set layered setting `setting` (its `VARS` name) for `rail`
    /// (0 SOUT, 1 SUP, 2 the whole plugin), or "default".
    pub fn origin(&self, setting: &'static str, rail: usize) -> &'static str {
        self.origins.get(&(setting, rail as u8)).copied().unwrap_or("default")
    }

    /// The warning for unknown `MPIB_*` names, if any.
    pub fn unknown_warning(&self) -> Option<String> {
        if self.unknown.is_empty() {
            return None;
        }
        let known: Vec<&str> = known_names().collect();
        let names: Vec<String> =
            self.unknown.iter().map(|n| if n.len() > SHOWN_BYTES { shown(n) } else { n.clone() }).collect();
        Some(format!("ignoring unknown variable(s) {} (a typo?); known: {}", names.join(", "), known.join(", ")))
    }
}

/// The silent-rail check's failure floor on a NIC that moves data by itself (verbs): a
/// rail silent this long beside a working one has failed (suspect at 2/5 of it).
pub const SILENT_FLOOR_MS: u64 = 50;
/// The floor on the soft fabric, whose rails move data only when a thread of this process
/// or of the peer's runs: on a loaded host one rail's thread may wait hundreds of ms for a
/// CPU while the other's runs, and that is no link failure.
pub const SOFT_SILENT_FLOOR_MS: u64 = 1000;

impl Config {
    /// The silent-rail check's failure floor (ms) on a fabric whose rails progress only
    /// when polled (`on_poll`: the soft fabric) or by themselves: `MPIB_SILENT_MS`, by
    /// default [`SOFT_SILENT_FLOOR_MS`] or [`SILENT_FLOOR_MS`]. 0: the check is off.
    pub fn silent_floor_ms(&self, on_poll: bool) -> u64 {
        self.silent.unwrap_or(if on_poll { SOFT_SILENT_FLOOR_MS } else { SILENT_FLOOR_MS })
    }

    /// How long (ms) a connection whose rails have all failed waits for one to come back:
    /// `MPIB_OUTAGE_GRACE_MS`, by default RC's retry budget, 4.096 µs × 2^timeout ×
    /// (retry count + 1) (34.4 s with NCCL's defaults): as patient when the rails' QPs fail
    /// at once (a port that errors them) as net_ib is while RC retries.
    pub fn outage_grace_ms(&self) -> u64 {
        self.outage_grace
            .unwrap_or_else(|| (4096u64 << self.timeout) * (self.retry_cnt as u64 + 1) / 1_000_000_000 * 1000 + 1000)
    }
}

fn parse_word<T: Copy>(value: &str, words: &[(&str, T)]) -> std::result::Result<T, String> {
    let lower = value.to_ascii_lowercase();
    words
        .iter()
        .find(|(w, _)| *w == lower)
        .map(|(_, t)| *t)
        .ok_or_else(|| words.iter().map(|(w, _)| *w).collect::<Vec<_>>().join(", "))
}

fn parse_int(value: &str, min: i64, max: i64) -> std::result::Result<i64, String> {
    let accepted = || format!("an integer from {min} to {max}");
    let n: i64 = value.parse().map_err(|_| accepted())?;
    if (min..=max).contains(&n) { Ok(n) } else { Err(accepted()) }
}

/// `sout:N`, `sup:N`, `both:N`: the rails (a mask) and the isend that drops them.
/// A fault drill (soft fabric, `MPIB_FAULT_RAIL`): a send comm drops the connections of
/// the rails in `mask` (bit 0 SOUT, bit 1 SUP) as a lost link would, at `at`; they refuse
/// re-admission for `for_ms` (None: for good), and the drop repeats every `every_ms`
/// (`count` times in all, or for as long as the comm lives). `kind`: what the drop is (a
/// lost link at once, or a fault hook armed on the rail's QPs that fires on the next
/// matching WR: `:drop-imm`, `:drop-ack`, `:hold`, the last field).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct FaultDrill {
    pub mask: u8,
    pub at: FaultAt,
    pub for_ms: Option<u64>,
    /// Only with [`FaultAt::Ms`] (a count of isends happens once).
    pub every_ms: Option<u64>,
    /// With `every_ms`: drops in all (None: as long as the comm lives).
    pub count: Option<u64>,
    pub kind: FaultKind,
}

/// When a [`FaultDrill`] drops its rails.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum FaultAt {
    /// At the comm's N-th isend (`sout:N`).
    Isend(u64),
    /// At the first isend at least this many ms after the comm's first isend (`sout:@MS`).
    Ms(u64),
}

fn parse_fault(value: &str) -> std::result::Result<FaultDrill, String> {
    let accepted = || {
        "sout:N, sup:N or both:N with N from 1 to 2^40, then optionally :MS (0 to 3600000); \
         or sout:@AT, sup:@AT, both:@AT (ms after the first isend), then optionally :MS, :EVERY (ms) and :COUNT; \
         either form then optionally :drop-imm, :drop-ack or :hold (the fault; default a lost link)"
            .to_string()
    };
    let ms = |v: &str| parse_int(v, 0, 3_600_000).map(|n| n as u64).map_err(|_| accepted());
    let kinds =
        [("drop-imm", FaultKind::DropImm), ("drop-ack", FaultKind::DropAck), ("hold", FaultKind::HoldPastFence)];
    let (value, kind) = match value.rsplit_once(':') {
        Some((head, last)) if last.starts_with(|c: char| c.is_ascii_alphabetic()) => {
            (head, parse_word(last, &kinds).map_err(|_| accepted())?)
        }
        _ => (value, FaultKind::LinkLoss),
    };
    let mut it = value.split(':');
    let mask =
        parse_word(it.next().unwrap_or(""), &[("sout", 1u8), ("sup", 2), ("both", 3)]).map_err(|_| accepted())?;
    let when = it.next().ok_or_else(accepted)?;
    let for_ms = it.next().map(ms).transpose()?;
    let every_ms = it.next().map(ms).transpose()?;
    let count = it.next().map(|v| parse_int(v, 1, 1 << 40).map(|n| n as u64).map_err(|_| accepted())).transpose()?;
    let at = match when.strip_prefix('@') {
        Some(t) => FaultAt::Ms(ms(t)?),
        None => FaultAt::Isend(parse_int(when, 1, 1 << 40).map_err(|_| accepted())? as u64),
    };
    // A repetition needs a time, a positive period, and a rail that comes back.
    let repeat_ok = match every_ms {
        None => true,
        Some(e) => matches!(at, FaultAt::Ms(_)) && e > 0 && for_ms.is_some(),
    };
    if it.next().is_some() || !repeat_ok {
        return Err(accepted());
    }
    Ok(FaultDrill { mask, at, for_ms, every_ms, count, kind })
}

fn parse_gain(value: &str) -> std::result::Result<f64, String> {
    let accepted = || "a number g with 0 < g <= 1".to_string();
    let g: f64 = value.parse().map_err(|_| accepted())?;
    if g > 0.0 && g <= 1.0 { Ok(g) } else { Err(accepted()) }
}

fn parse_split(value: &str) -> std::result::Result<SplitMode, String> {
    let accepted = || "auto, sout, sup, or a percentage of bytes on SOUT from 0 to 100".to_string();
    match value.to_ascii_lowercase().as_str() {
        "auto" => Ok(SplitMode::Auto),
        "sout" => Ok(SplitMode::Sout),
        "sup" => Ok(SplitMode::Sup),
        v => {
            let n: u8 = v.trim_end_matches('%').parse().map_err(|_| accepted())?;
            if n <= 100 { Ok(SplitMode::Percent(n)) } else { Err(accepted()) }
        }
    }
}

fn parse_rail_addr(value: &str) -> std::result::Result<RailAddr, String> {
    let accepted = || "an IPv4/IPv6 address or a network interface name".to_string();
    if let Ok(ip) = value.parse::<IpAddr>() {
        return Ok(RailAddr::Ip(ip));
    }
    let valid = !value.is_empty()
        && value.len() < libc::IFNAMSIZ
        && value.chars().all(|ch| ch.is_ascii_alphanumeric() || "_-.@".contains(ch));
    if valid { Ok(RailAddr::Interface(value.to_string())) } else { Err(accepted()) }
}

/// Bytes of a value (or name) a log line shows; the rest is cut, with its length said.
const SHOWN_BYTES: usize = 64;

/// `s` quoted for a log line, cut to [`SHOWN_BYTES`] (at a character boundary) with its
/// length after it: a 100 KB value must not become a 100 KB WARN line.
pub fn shown(s: &str) -> String {
    match split_long(s) {
        None => format!("{s:?}"),
        Some(head) => format!("{head:?}… ({} bytes)", s.len()),
    }
}

/// As [`shown`], unquoted (names and paths).
pub fn cut(s: &str) -> String {
    match split_long(s) {
        None => s.to_string(),
        Some(head) => format!("{head}… ({} bytes)", s.len()),
    }
}

/// The first [`SHOWN_BYTES`] of `s` (at a character boundary) when it is longer.
fn split_long(s: &str) -> Option<&str> {
    if s.len() <= SHOWN_BYTES {
        return None;
    }
    let mut at = SHOWN_BYTES;
    while !s.is_char_boundary(at) {
        at -= 1;
    }
    Some(&s[..at])
}

#[cfg(test)]
mod layers_tests;
#[cfg(test)]
mod tests;
