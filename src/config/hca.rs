//! NIC selection in NCCL's `NCCL_IB_HCA` syntax, so that a user who knows NCCL's variable
//! knows mpib's: `[^][=]device[:port[:rail[:plane]]],…`.
//!
//! - a bare name is a prefix: `mlx5` selects `mlx5_0`, `mlx5_10`, …; `mlx5_1` also selects
//!   `mlx5_10` (as in NCCL);
//! - `=` in front of the list makes every name exact: `=mlx5_1` selects `mlx5_1` only;
//! - `^` in front excludes what the list matches: `^mlx5_2,mlx5_3` selects everything but
//!   `mlx5_2*` and `mlx5_3*` (`^=` excludes exact names);
//! - `:port` limits an entry to one port; without it every port matches;
//! - `:rail` and `:plane` (NCCL 2.30) give the selected port's rail and plane ids, which
//!   mpib reports to NCCL ≥ 2.30 as `railId`/`planeId`; an empty field is "not given".
//!
//! The matching rules are NCCL's own (`src/misc/utils.cc`: `parseStringList`,
//! `matchIfList`, used by `net_ib`'s device discovery in `ncclIbInitDevices`).

use std::fmt;

/// One entry: `device[:port[:rail[:plane]]]`. In `MPIB_HCA_SOUT`/`MPIB_HCA_SUP` it names one
/// device exactly; in a filter it is a name prefix (or exact, after `=`).
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct HcaSpec {
    pub device: String,
    pub port: Option<u8>,
    /// NCCL's rail id of this NIC (v12 `railId`), when the user gave one.
    pub rail: Option<i16>,
    /// NCCL's plane id of this NIC (v12 `planeId`), when the user gave one.
    pub plane: Option<i16>,
}

impl HcaSpec {
    /// A spec naming `device` (any port, no rail or plane).
    pub fn device(device: &str) -> HcaSpec {
        HcaSpec { device: device.to_string(), ..HcaSpec::default() }
    }
}

impl fmt::Display for HcaSpec {
    /// `device[:port[:rail[:plane]]]`, empty fields where a later one is given.
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let opt = |v: Option<i64>| v.map_or(String::new(), |v| v.to_string());
        let fields = [opt(self.port.map(i64::from)), opt(self.rail.map(i64::from)), opt(self.plane.map(i64::from))];
        let used = fields.iter().rposition(|s| !s.is_empty()).map_or(0, |i| i + 1);
        write!(f, "{}", self.device)?;
        for s in &fields[..used] {
            write!(f, ":{s}")?;
        }
        Ok(())
    }
}

/// A NIC filter in `NCCL_IB_HCA` syntax (see the module doc).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct HcaFilter {
    /// `^`: the list says what is left out.
    pub exclude: bool,
    /// `=`: names match exactly, not as prefixes.
    pub exact: bool,
    pub entries: Vec<HcaSpec>,
}

/// What a filter says about one port.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Selection<'a> {
    /// Not selected.
    Out,
    /// Selected; by this entry when the list names what is selected (its rail and plane).
    In(Option<&'a HcaSpec>),
}

impl HcaFilter {
    /// Parses `[^][=]entry,…`. The error says what is accepted.
    pub fn parse(value: &str) -> Result<HcaFilter, String> {
        let v = value.trim();
        let (exclude, v) = v.strip_prefix('^').map_or((false, v), |r| (true, r));
        let (exact, v) = v.strip_prefix('=').map_or((false, v), |r| (true, r));
        let entries = parse_entries(v).map_err(|_| ACCEPTED_FILTER.to_string())?;
        Ok(HcaFilter { exclude, exact, entries })
    }

    /// Whether port `port` of `device` is selected (NCCL's `matchIfList(...) ^ searchNot`).
    pub fn select(&self, device: &str, port: u8) -> Selection<'_> {
        let hit = self.entries.iter().find(|e| {
            let name = if self.exact { device == e.device } else { device.starts_with(e.device.as_str()) };
            name && e.port.is_none_or(|p| p == port)
        });
        match (hit, self.exclude) {
            (Some(e), false) => Selection::In(Some(e)),
            (None, true) => Selection::In(None),
            _ => Selection::Out,
        }
    }
}

impl fmt::Display for HcaFilter {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let list: Vec<String> = self.entries.iter().map(|e| e.to_string()).collect();
        write!(f, "{}{}{}", if self.exclude { "^" } else { "" }, if self.exact { "=" } else { "" }, list.join(","))
    }
}

pub const ACCEPTED_LIST: &str = "a comma list of device[:port[:rail[:plane]]] (port 1-255), e.g. mlx5_0:1,mlx5_1";
pub const ACCEPTED_FILTER: &str =
    "NCCL_IB_HCA syntax: [^][=]device[:port[:rail[:plane]]],... (^ excludes, = exact names, else prefixes)";

/// Parses an explicit rail list (`MPIB_HCA_SOUT`, `MPIB_HCA_SUP`): exact device names; a
/// leading `=` (NCCL's "exact") is accepted and changes nothing.
pub fn parse_list(value: &str) -> Result<Vec<HcaSpec>, String> {
    let v = value.trim();
    parse_entries(v.strip_prefix('=').unwrap_or(v)).map_err(|_| ACCEPTED_LIST.to_string())
}

fn parse_entries(v: &str) -> Result<Vec<HcaSpec>, ()> {
    if v.trim().is_empty() {
        return Err(());
    }
    v.split(',').map(|item| parse_entry(item.trim())).collect()
}

fn parse_entry(item: &str) -> Result<HcaSpec, ()> {
    let mut parts = item.split(':');
    let device = parts.next().unwrap_or("");
    if device.is_empty() || !device.chars().all(|ch| ch.is_ascii_alphanumeric() || "_-.".contains(ch)) {
        return Err(());
    }
    // Empty fields are "not given", as in NCCL ("mlx5_0::3" = any port, rail 3).
    let field = |s: Option<&str>| -> Result<Option<i64>, ()> {
        match s.map(str::trim) {
            None | Some("") => Ok(None),
            Some(s) => s.parse::<i64>().map(Some).map_err(|_| ()),
        }
    };
    let port = match field(parts.next())? {
        None => None,
        Some(p) if (1..=255).contains(&p) => Some(p as u8),
        Some(_) => return Err(()),
    };
    let id = |v: Option<i64>| -> Result<Option<i16>, ()> {
        match v {
            None => Ok(None),
            Some(v) if (0..=i16::MAX as i64).contains(&v) => Ok(Some(v as i16)),
            Some(_) => Err(()),
        }
    };
    let rail = id(field(parts.next())?)?;
    let plane = id(field(parts.next())?)?;
    if parts.next().is_some() {
        return Err(());
    }
    Ok(HcaSpec { device: device.to_string(), port, rail, plane })
}

#[cfg(test)]
mod tests {
    use super::*;

    fn sel(f: &str, dev: &str, port: u8) -> bool {
        matches!(HcaFilter::parse(f).unwrap().select(dev, port), Selection::In(_))
    }

    #[test]
    fn prefixes_exact_names_and_exclusion_as_nccl() {
        assert!(sel("mlx5", "mlx5_0", 1));
        assert!(sel("mlx5_1", "mlx5_10", 1), "a bare name is a prefix, as in NCCL");
        assert!(!sel("=mlx5_1", "mlx5_10", 1));
        assert!(sel("=mlx5_1", "mlx5_1", 1));
        assert!(!sel("^mlx5_2,mlx5_3", "mlx5_2", 1));
        assert!(!sel("^mlx5_2,mlx5_3", "mlx5_3", 2));
        assert!(sel("^mlx5_2,mlx5_3", "mlx5_0", 1));
        assert!(sel("^=mlx5_1", "mlx5_10", 1), "exclude exact: mlx5_10 stays");
        assert!(!sel("^=mlx5_1", "mlx5_1", 1));
        assert!(sel("mlx5_0:1", "mlx5_0", 1));
        assert!(!sel("mlx5_0:1", "mlx5_0", 2), "a port limits the entry");
        assert!(sel("^mlx5_0:1", "mlx5_0", 2), "excluding port 1 keeps port 2");
        assert!(!sel("rxe", "mlx5_0", 1));
    }

    #[test]
    fn rail_and_plane_fields() {
        let f = HcaFilter::parse("mlx5_0:1:3:0,mlx5_1::4").unwrap();
        assert_eq!(
            f.select("mlx5_0", 1),
            Selection::In(Some(&HcaSpec { device: "mlx5_0".into(), port: Some(1), rail: Some(3), plane: Some(0) }))
        );
        let Selection::In(Some(e)) = f.select("mlx5_1", 2) else { panic!("selected") };
        assert_eq!((e.port, e.rail, e.plane), (None, Some(4), None), "empty port field = any port");
        assert_eq!(HcaFilter::parse("^mlx5_0").unwrap().select("mlx5_1", 1), Selection::In(None));
        assert_eq!(f.to_string(), "mlx5_0:1:3:0,mlx5_1::4");
        assert_eq!(HcaFilter::parse("^=a,b:2").unwrap().to_string(), "^=a,b:2");
    }

    #[test]
    fn bad_entries_are_refused() {
        for bad in ["", "^", "=", "a b", "mlx5_0:0", "mlx5_0:x", "mlx5_0:300", "a:1:2:3:4", "a:1:-1", ",", "a,,b"] {
            assert!(HcaFilter::parse(bad).is_err(), "{bad:?}");
        }
        assert_eq!(
            parse_list("=mlx5_0,mlx5_1:2").unwrap(),
            vec![HcaSpec::device("mlx5_0"), HcaSpec { port: Some(2), ..HcaSpec::device("mlx5_1") }]
        );
        assert!(parse_list("mlx5_0:0").unwrap_err().contains("device[:port"));
    }
}
