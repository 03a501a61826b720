//! Settings that come in layers, the first one set wins: a rail's own variable
//! (`MPIB_SOUT_TC`), the setting of both rails (`MPIB_TC`), the NCCL variable it follows
//! (`NCCL_IB_TC`), mpib's default. Settings of the whole plugin (`MPIB_TIMEOUT`) have no
//! rail layer. `vars.rs` names each setting's layers; the INFO configuration line says which
//! one each effective value came from.
//!
//! Every `MPIB_*` variable set must be valid, even where a rail's own variable hides it; an
//! NCCL variable must be valid for mpib where mpib uses it (a bad value is an error naming
//! it: setting the `MPIB_*` variable over it is the way to run anyway).

use std::collections::{BTreeMap, HashMap};
use std::fmt::Write;
use std::net::IpAddr;

use super::nccl::c_int;
use super::vars::{VarDoc, doc};
use super::{RelaxedOrdering, parse_int, parse_word, shown};
use crate::fabric::verbs::{AddrFamily, AddrRange, GidRule, GidType};

/// The rails' names in the INFO line, SOUT first.
pub const RAIL_NAMES: [&str; 2] = ["sout", "sup"];
/// The most data QPs per connection a rail takes (`MPIB_QP`, `NCCL_IB_QPS_PER_CONNECTION`):
/// NCCL's bound, and what one control-ring entry describes for re-admission.
pub const MAX_QPS_PER_RAIL: u32 = 16;

/// The settings resolved here, by their `VARS` name.
const LAYERED: &[&str] = &[
    "MPIB_QP",
    "MPIB_QP_STRIPE",
    "MPIB_GID_INDEX",
    "MPIB_TC",
    "MPIB_CTS_TC",
    "MPIB_SL",
    "MPIB_ROCE_VERSION",
    "MPIB_ADDR_FAMILY",
    "MPIB_ADDR_RANGE",
    "MPIB_TIMEOUT",
    "MPIB_RETRY_CNT",
    "MPIB_PCI_RELAXED_ORDERING",
    "MPIB_DMABUF",
    "MPIB_PKEY",
];

/// What one rail's QPs are made with.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct RailConfig {
    /// Data QPs per connection.
    pub qps: u32,
    /// A request's share of the rail is striped over up to 4 of its QPs.
    pub stripe: bool,
    /// Traffic class; `None`: the communicator's, else 0.
    pub tc: Option<u8>,
    /// Traffic class of a receive comm's QPs (CTS, control writes, ACKs); `None`: `tc`'s.
    pub cts_tc: Option<u8>,
    /// Service level; `None`: the communicator's traffic class where it is one (0-15), else
    /// 0 (net_ib's rule).
    pub sl: Option<u8>,
    /// Which RoCE GID the rail's ports use.
    pub gid: GidRule,
}

impl Default for RailConfig {
    fn default() -> Self {
        RailConfig { qps: 1, stripe: false, tc: None, cts_tc: None, sl: None, gid: GidRule::default() }
    }
}

/// The communicator's traffic class (v10 `connect`, v11+ context) where it is one.
fn comm_class(comm_tc: Option<i32>) -> Option<u8> {
    comm_tc.filter(|t| (0..=255).contains(t)).map(|t| t as u8)
}

impl RailConfig {
    /// The traffic class of the rail's data QPs in a communicator of class `comm_tc`.
    pub fn traffic_class(&self, comm_tc: Option<i32>) -> u8 {
        self.tc.or_else(|| comm_class(comm_tc)).unwrap_or(0)
    }

    /// The traffic class of the rail's QPs of a receive comm (CTS and control writes).
    pub fn cts_traffic_class(&self, comm_tc: Option<i32>) -> u8 {
        self.cts_tc.unwrap_or_else(|| self.traffic_class(comm_tc))
    }

    /// The service level of the rail's QPs in a communicator of class `comm_tc`.
    pub fn service_level(&self, comm_tc: Option<i32>) -> u8 {
        self.sl.or_else(|| comm_class(comm_tc).filter(|t| *t <= 15)).unwrap_or(0)
    }
}

/// The values of the plugin-wide layered settings.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Resolved {
    pub rails: [RailConfig; 2],
    pub timeout: u8,
    pub retry_cnt: u8,
    pub relaxed_ordering: RelaxedOrdering,
    pub dmabuf: bool,
    pub pkey_index: u16,
}

/// Which variable each layered setting's value came from: `(setting, rail)` (rail 2: the
/// whole plugin) to the variable; absent: mpib's default.
pub type Origins = BTreeMap<(&'static str, u8), &'static str>;

/// The layered variables that are set, and what resolving them found.
#[derive(Default)]
pub struct Layers {
    vals: HashMap<&'static str, String>,
    /// Values already parsed, by variable name: a bad one is reported once.
    bad: Vec<&'static str>,
    pub errors: Vec<String>,
    pub origins: Origins,
}

/// A value parser: the value, or what is accepted.
type Parse<'a, T> = &'a dyn Fn(&str) -> Result<T, String>;

impl Layers {
    /// Keeps `name=value` when `name` is one of the layered settings' variables.
    pub fn take(&mut self, name: &str, value: &str) -> bool {
        let found = LAYERED.iter().map(|s| doc(s)).find_map(|d| d.names().chain([d.nccl]).find(|n| *n == name));
        match found {
            Some(n) => {
                self.vals.insert(n, value.to_string());
                true
            }
            None => false,
        }
    }

    /// The value of `setting` for `rail` (`None`: a plugin-wide setting) from the first of
    /// its layers that is set, parsed by `mpib` (an `MPIB_*` variable) or `nccl` (NCCL's);
    /// `None` when none is set (the default). NCCL's variable set to "" is unset.
    fn get<T>(&mut self, setting: &'static str, rail: Option<usize>, mpib: Parse<T>, nccl: Parse<T>) -> Option<T> {
        let d: &'static VarDoc = doc(setting);
        let own = rail.and_then(|r| d.rails.map(|n| n[r]));
        let mut found = None;
        for name in own.into_iter().chain([d.name]) {
            let Some(v) = self.vals.get(name) else { continue };
            match mpib(v.trim()) {
                Ok(t) if found.is_none() => found = Some((t, name)),
                Ok(_) => {}
                Err(accepted) => self.report(name, format!("{name}={} is not valid: accepted {accepted}", shown(v))),
            }
        }
        if found.is_none()
            && !d.nccl.is_empty()
            && let Some(v) = self.vals.get(d.nccl).filter(|v| !v.trim().is_empty())
        {
            match nccl(v.trim()) {
                Ok(t) => found = Some((t, d.nccl)),
                Err(accepted) => {
                    let over = match own {
                        Some(o) => format!("{o} or {setting}"),
                        None => setting.to_string(),
                    };
                    let line = format!(
                        "{}={} is not valid for mpib: accepted {accepted} (set {over} to override it)",
                        d.nccl,
                        shown(v)
                    );
                    self.report(d.nccl, line);
                }
            }
        }
        let (t, name) = found?;
        self.origins.insert((setting, rail.map_or(2, |r| r as u8)), name);
        Some(t)
    }

    fn report(&mut self, name: &'static str, line: String) {
        if !self.bad.contains(&name) {
            self.bad.push(name);
            self.errors.push(line);
        }
    }

    /// Resolves every layered setting; errors are in `self.errors`.
    pub fn resolve(&mut self) -> Resolved {
        let mut rails = [RailConfig::default(); 2];
        for (rail, rc) in rails.iter_mut().enumerate() {
            let r = Some(rail);
            let max = MAX_QPS_PER_RAIL as i64;
            let qps = |v: &str| int(v, 1, max);
            rc.qps = self.get("MPIB_QP", r, &|v| qps(v), &|v| c_ranged(v, 1, max)).map_or(1, |n| n as u32);
            // NCCL stripes for any value but 0 (`ncclParamIbSplitDataOnQps() ? nqps : 1`).
            let on = |v: &str| c_int(v).map(|n| n != 0).ok_or_else(|| "an integer".to_string());
            rc.stripe =
                self.get("MPIB_QP_STRIPE", r, &|v| parse_word(v, &[("0", false), ("1", true)]), &on).unwrap_or(false);
            // -1 is "not set" in NCCL's variables and mpib's alike: the default, from there.
            let class = |max| move |v: &str| int(v, -1, max).map(|n| u8::try_from(n).ok());
            let c_class = |max| move |v: &str| c_ranged(v, -1, max).map(|n| u8::try_from(n).ok());
            rc.tc = self.get("MPIB_TC", r, &class(255), &c_class(255)).flatten();
            rc.cts_tc = self.get("MPIB_CTS_TC", r, &class(255), &c_class(255)).flatten();
            rc.sl = self.get("MPIB_SL", r, &class(15), &c_class(15)).flatten();
            rc.gid.index = self.get("MPIB_GID_INDEX", r, &class(255), &c_class(255)).flatten();
            rc.gid.index_on_ib = self.origins.get(&("MPIB_GID_INDEX", rail as u8)) != Some(&"NCCL_IB_GID_INDEX");
            let version = |v: i64| if v == 1 { GidType::IbRoceV1 } else { GidType::RoceV2 };
            let ver = self.get("MPIB_ROCE_VERSION", r, &|v| int(v, 1, 2), &|v| c_ranged(v, 1, 2));
            rc.gid.version = ver.map_or(GidType::RoceV2, version);
            let words = [("af_inet", AddrFamily::V4), ("af_inet6", AddrFamily::V6)];
            // NCCL compares the names exactly (anything else is AF_INET to it).
            let exact = |v: &str| match v {
                "AF_INET" => Ok(AddrFamily::V4),
                "AF_INET6" => Ok(AddrFamily::V6),
                _ => Err("AF_INET, AF_INET6".to_string()),
            };
            rc.gid.family =
                self.get("MPIB_ADDR_FAMILY", r, &|v| parse_word(v, &words), &exact).unwrap_or(AddrFamily::V4);
            rc.gid.range = self.get("MPIB_ADDR_RANGE", r, &parse_range, &parse_range);
            self.check_range(rail, &rc.gid);
        }
        let g = None;
        Resolved {
            rails,
            timeout: self.get("MPIB_TIMEOUT", g, &|v| int(v, 1, 31), &|v| c_ranged(v, 1, 31)).map_or(20, |n| n as u8),
            retry_cnt: self.get("MPIB_RETRY_CNT", g, &|v| int(v, 0, 7), &|v| c_ranged(v, 0, 7)).map_or(7, |n| n as u8),
            relaxed_ordering: {
                let ro = |n: i64| [RelaxedOrdering::Off, RelaxedOrdering::On, RelaxedOrdering::Auto][n as usize];
                let words = [("0", 0), ("1", 1), ("2", 2)];
                let get = self.get("MPIB_PCI_RELAXED_ORDERING", g, &|v| parse_word(v, &words), &|v| c_ranged(v, 0, 2));
                get.map_or(RelaxedOrdering::Auto, ro)
            },
            // NCCL turns DMA-BUF off for 0 only (`ncclParamDmaBufEnable() == 0`).
            dmabuf: self
                .get("MPIB_DMABUF", g, &|v| parse_word(v, &[("0", false), ("1", true)]), &|v| {
                    c_int(v).map(|n| n != 0).ok_or_else(|| "an integer".to_string())
                })
                .unwrap_or(true),
            pkey_index: self
                .get("MPIB_PKEY", g, &|v| int(v, 0, 65535), &|v| c_ranged(v, 0, 65535))
                .map_or(0, |n| n as u16),
        }
    }

    /// A range must be of the family the rail prefers (NCCL reads the range as an address
    /// of that family and drops it otherwise). Said once where both rails share the error.
    fn check_range(&mut self, rail: usize, gid: &GidRule) {
        let Some(range) = gid.range else { return };
        if range.family() == gid.family {
            return;
        }
        let var = |s| *self.origins.get(&(s, rail as u8)).unwrap_or(&"default");
        let (rv, fv) = (var("MPIB_ADDR_RANGE"), var("MPIB_ADDR_FAMILY"));
        let own = doc("MPIB_ADDR_FAMILY").rails.expect("per rail")[rail];
        let rail_specific =
            [rv, fv].iter().any(|v| doc("MPIB_ADDR_RANGE").rails.expect("per rail").contains(v) || *v == own);
        let (whose, set) = if rail_specific {
            (
                format!("the {} rail's address family", RAIL_NAMES[rail].to_uppercase()),
                format!("MPIB_ADDR_FAMILY (or {own})"),
            )
        } else {
            ("the address family".to_string(), "MPIB_ADDR_FAMILY".to_string())
        };
        let line = format!(
            "{rv}={range} is an {} range, but {whose} is {} ({fv}): set {set} to {}",
            if range.family() == AddrFamily::V4 { "IPv4" } else { "IPv6" },
            gid.family.name(),
            range.family().name(),
        );
        if !self.errors.contains(&line) {
            self.errors.push(line);
        }
    }
}

/// An `MPIB_*` integer (decimal) in `min..=max`.
fn int(v: &str, min: i64, max: i64) -> Result<i64, String> {
    parse_int(v, min, max)
}

/// An NCCL integer (as `strtoll(v, NULL, 0)` reads it) in `min..=max`.
fn c_ranged(v: &str, min: i64, max: i64) -> Result<i64, String> {
    c_int(v).filter(|n| (min..=max).contains(n)).ok_or_else(|| format!("an integer from {min} to {max}"))
}

/// `address/prefix` (`NCCL_IB_ADDR_RANGE`'s syntax).
fn parse_range(v: &str) -> Result<AddrRange, String> {
    let accepted = || "an IPv4 or IPv6 address/prefix (192.0.2.0/24, fd00::/8)".to_string();
    let (a, p) = v.split_once('/').ok_or_else(accepted)?;
    let addr: IpAddr = a.trim().parse().map_err(|_| accepted())?;
    let max = if addr.is_ipv4() { 32 } else { 128 };
    let prefix: u8 = p.trim().parse().ok().filter(|p| *p <= max).ok_or_else(accepted)?;
    Ok(AddrRange { addr, prefix })
}

/// The layered settings for the INFO line: `name=value (where from)`, a per-rail setting as
/// one value where both rails agree, else `sout:…,sup:…`.
pub fn describe(r: &Resolved, origins: &Origins) -> String {
    let from = |s: &'static str, rail: u8| *origins.get(&(s, rail)).unwrap_or(&"default");
    let opt = |v: Option<u8>, none: &str| v.map_or(none.to_string(), |v| v.to_string());
    type Show<'a> = &'a dyn Fn(&RailConfig) -> String;
    let per_rail: [(&str, &'static str, Show); 9] = [
        ("qps", "MPIB_QP", &|c| c.qps.to_string()),
        ("qp_stripe", "MPIB_QP_STRIPE", &|c| (c.stripe as u8).to_string()),
        ("tc", "MPIB_TC", &|c| opt(c.tc, "comm's")),
        ("cts_tc", "MPIB_CTS_TC", &|c| opt(c.cts_tc, "as-tc")),
        ("sl", "MPIB_SL", &|c| opt(c.sl, "comm's")),
        ("gid_index", "MPIB_GID_INDEX", &|c| opt(c.gid.index, "auto")),
        ("roce_version", "MPIB_ROCE_VERSION", &|c| if c.gid.version == GidType::RoceV2 { "2" } else { "1" }.into()),
        ("addr_family", "MPIB_ADDR_FAMILY", &|c| c.gid.family.name().into()),
        ("addr_range", "MPIB_ADDR_RANGE", &|c| c.gid.range.map_or("any".into(), |r| r.to_string())),
    ];
    let mut s = String::new();
    for (key, setting, show) in per_rail {
        let v = [show(&r.rails[0]), show(&r.rails[1])];
        let f = [from(setting, 0), from(setting, 1)];
        if v[0] == v[1] && f[0] == f[1] {
            let _ = write!(s, " {key}={} ({})", v[0], f[0]);
        } else {
            let _ = write!(s, " {key}=sout:{} ({}),sup:{} ({})", v[0], f[0], v[1], f[1]);
        }
    }
    let ro = match r.relaxed_ordering {
        RelaxedOrdering::Off => "0",
        RelaxedOrdering::On => "1",
        RelaxedOrdering::Auto => "2",
    };
    let _ = write!(
        s,
        " timeout={} ({}) retry_cnt={} ({}) relaxed_ordering={ro} ({}) dmabuf={} ({}) pkey_index={} ({})",
        r.timeout,
        from("MPIB_TIMEOUT", 2),
        r.retry_cnt,
        from("MPIB_RETRY_CNT", 2),
        from("MPIB_PCI_RELAXED_ORDERING", 2),
        r.dmabuf as u8,
        from("MPIB_DMABUF", 2),
        r.pkey_index,
        from("MPIB_PKEY", 2),
    );
    s.trim_start().to_string()
}
