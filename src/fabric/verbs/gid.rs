//! RoCE GID selection. Like net_ib: the GID table of the port is scanned; entries whose
//! type cannot be read (sysfs hidden in a container, and libibverbs cannot tell either)
//! are skipped, never fatal; link-local and empty GIDs are never chosen automatically.
//! A [`GidRule`] says what is wanted (`MPIB_GID_INDEX`, `MPIB_ROCE_VERSION`,
//! `MPIB_ADDR_FAMILY`, `MPIB_ADDR_RANGE`, per rail; NCCL's `NCCL_IB_*` of the same names are
//! their defaults). An index, when given, is taken as it is. Otherwise, among the usable
//! entries (in the address range, when one is given), the address family comes first, then
//! the RoCE version (net_ib's `ncclIbGetGidIndex` ranks them in that order too), then the
//! lowest index: by default RoCE v2 + IPv4-mapped, then RoCE v1 + IPv4-mapped, then RoCE
//! v2 + IPv6, then RoCE v1 + IPv6. Where net_ib falls back to index 0 when nothing
//! matches, mpib fails with the table in the message.

use std::fmt::Write;
use std::net::IpAddr;

use rdma_mummy_sys as ibv;

use super::sys::{self, ret_errno};
use crate::error::{Error, Result};

/// The type of a GID table entry.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum GidType {
    /// InfiniBand, or RoCE v1 (sysfs says "IB/RoCE v1" for both).
    IbRoceV1,
    RoceV2,
}

/// One entry of a port's GID table.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct GidEntry {
    pub index: u8,
    pub gid: [u8; 16],
    /// `None` when the type could not be read.
    pub kind: Option<GidType>,
}

/// The address family of a GID: IPv4 for `::ffff:a.b.c.d`, else IPv6.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum AddrFamily {
    V4,
    V6,
}

impl AddrFamily {
    /// NCCL's spelling (`NCCL_IB_ADDR_FAMILY`).
    pub fn name(self) -> &'static str {
        match self {
            AddrFamily::V4 => "AF_INET",
            AddrFamily::V6 => "AF_INET6",
        }
    }

    pub fn of_gid(gid: &[u8; 16]) -> AddrFamily {
        if is_ipv4_mapped(gid) { AddrFamily::V4 } else { AddrFamily::V6 }
    }
}

/// A range of addresses, `addr/prefix` (`NCCL_IB_ADDR_RANGE`): the GIDs whose first
/// `prefix` bits (of the IPv4 address, for an IPv4 range) are `addr`'s.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub struct AddrRange {
    pub addr: IpAddr,
    /// At most 32 (IPv4) or 128 (IPv6).
    pub prefix: u8,
}

impl AddrRange {
    pub fn family(&self) -> AddrFamily {
        match self.addr {
            IpAddr::V4(_) => AddrFamily::V4,
            IpAddr::V6(_) => AddrFamily::V6,
        }
    }

    /// Whether `gid` is an address of this range (of its family, and its prefix).
    pub fn contains(&self, gid: &[u8; 16]) -> bool {
        if AddrFamily::of_gid(gid) != self.family() {
            return false;
        }
        // Both sides as 128-bit numbers; an IPv4 range compares the mapped address's last
        // 32 bits, so its prefix counts from bit 96.
        let have = u128::from_be_bytes(*gid);
        let (want, bits) = match self.addr {
            IpAddr::V4(a) => (u32::from(a) as u128, 96 + self.prefix as u32),
            IpAddr::V6(a) => (u128::from(a), self.prefix as u32),
        };
        let want = if self.addr.is_ipv4() { want | (0xffff << 32) } else { want };
        let mask = if bits == 0 { 0 } else { u128::MAX << (128 - bits) };
        (want ^ have) & mask == 0
    }
}

impl std::fmt::Display for AddrRange {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "{}/{}", self.addr, self.prefix)
    }
}

/// What GID a RoCE port uses (see the module doc).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub struct GidRule {
    /// This table index, as it is; `None`: chosen by the preferences below.
    pub index: Option<u8>,
    /// Whether `index` also names the GRH source GID of InfiniBand ports (`MPIB_GID_INDEX`
    /// does; NCCL's `NCCL_IB_GID_INDEX` is a RoCE setting, which net_ib's IB ports ignore).
    pub index_on_ib: bool,
    /// The RoCE version preferred.
    pub version: GidType,
    /// The address family preferred.
    pub family: AddrFamily,
    /// Only GIDs in this range.
    pub range: Option<AddrRange>,
}

impl Default for GidRule {
    /// net_ib's defaults: RoCE v2, IPv4, any address.
    fn default() -> Self {
        GidRule { index: None, index_on_ib: true, version: GidType::RoceV2, family: AddrFamily::V4, range: None }
    }
}

impl GidRule {
    /// The rule with only an index (`None`: automatic with the default preferences).
    pub fn index(index: Option<u8>) -> GidRule {
        GidRule { index, ..GidRule::default() }
    }
}

/// `::ffff:a.b.c.d`.
pub fn is_ipv4_mapped(gid: &[u8; 16]) -> bool {
    gid[..10].iter().all(|b| *b == 0) && gid[10] == 0xff && gid[11] == 0xff
}

/// `fe80::/10`.
pub fn is_link_local(gid: &[u8; 16]) -> bool {
    gid[0] == 0xfe && (gid[1] & 0xc0) == 0x80
}

pub fn is_zero(gid: &[u8; 16]) -> bool {
    gid.iter().all(|b| *b == 0)
}

/// The automatic choice under `rule`'s preferences (its index is not looked at): the
/// best-ranked usable entry, `None` when nothing is usable.
pub fn choose(table: &[GidEntry], rule: &GidRule) -> Option<u8> {
    table
        .iter()
        .filter_map(|e| {
            if is_zero(&e.gid) || is_link_local(&e.gid) {
                return None;
            }
            let version = e.kind?;
            if rule.range.is_some_and(|r| !r.contains(&e.gid)) {
                return None;
            }
            let family = AddrFamily::of_gid(&e.gid) != rule.family;
            Some((family, version != rule.version, e.index))
        })
        .min()
        .map(|(_, _, index)| index)
}

/// A GID as text: the IPv4 address for IPv4-mapped ones, else eight hex groups.
pub fn format_gid(gid: &[u8; 16]) -> String {
    if is_ipv4_mapped(gid) {
        return format!("::ffff:{}.{}.{}.{}", gid[12], gid[13], gid[14], gid[15]);
    }
    let mut s = String::with_capacity(39);
    for (i, pair) in gid.chunks(2).enumerate() {
        if i > 0 {
            s.push(':');
        }
        let _ = write!(s, "{:02x}{:02x}", pair[0], pair[1]);
    }
    s
}

/// Parses a sysfs `gid_attrs/types/N` line.
pub fn parse_type(text: &str) -> Option<GidType> {
    match text.trim() {
        "RoCE v2" => Some(GidType::RoceV2),
        "IB/RoCE v1" => Some(GidType::IbRoceV1),
        _ => None,
    }
}

/// `ibv_query_gid`.
pub fn query_gid(ctx: *mut ibv::ibv_context, dev: &str, port: u8, index: u8) -> Result<[u8; 16]> {
    // SAFETY: all-zero is a valid ibv_gid (a byte union).
    let mut gid: ibv::ibv_gid = unsafe { std::mem::zeroed() };
    // SAFETY: ctx is an open context; gid is a valid out buffer.
    let ret = unsafe { ibv::ibv_query_gid(ctx, port, index as i32, &mut gid) };
    if ret != 0 {
        return Err(sys::call_failed(&format!("ibv_query_gid(index {index})"), dev, port, ret_errno(ret)));
    }
    // SAFETY: raw is the union's byte view, always initialised.
    Ok(unsafe { gid.raw })
}

/// The type of one entry: sysfs first (as net_ib), then `ibv_query_gid_ex` (works where
/// sysfs is hidden); `None` when neither can tell.
fn query_type(ctx: *mut ibv::ibv_context, dev: &str, port: u8, index: u8) -> Option<GidType> {
    let path = format!("/sys/class/infiniband/{dev}/ports/{port}/gid_attrs/types/{index}");
    if let Ok(text) = std::fs::read_to_string(&path) {
        return parse_type(&text);
    }
    // SAFETY: all-zero is a valid ibv_gid_entry.
    let mut entry: ibv::ibv_gid_entry = unsafe { std::mem::zeroed() };
    // SAFETY: ctx is open; entry is a valid out buffer of the size the wrapper passes.
    let ret = unsafe { ibv::ibv_query_gid_ex(ctx, port as u32, index as u32, &mut entry, 0) };
    if ret != 0 {
        return None;
    }
    // enum ibv_gid_type: IBV_GID_TYPE_IB 0, IBV_GID_TYPE_ROCE_V1 1, IBV_GID_TYPE_ROCE_V2 2.
    match entry.gid_type {
        0 | 1 => Some(GidType::IbRoceV1),
        2 => Some(GidType::RoceV2),
        _ => None,
    }
}

/// Reads the first `len` (at most 256) entries of the port's GID table. Entries that cannot
/// be read are left out; empty ones are kept (with no type) so that an override can say why.
pub fn read_table(ctx: *mut ibv::ibv_context, dev: &str, port: u8, len: usize) -> Vec<GidEntry> {
    let mut table = Vec::new();
    for index in 0..len.min(256) as u16 {
        let index = index as u8;
        let Ok(gid) = query_gid(ctx, dev, port, index) else { continue };
        let kind = if is_zero(&gid) { None } else { query_type(ctx, dev, port, index) };
        table.push(GidEntry { index, gid, kind });
    }
    table
}

/// The GID index to use on a RoCE port under `rule`: its index when given (it must hold a
/// GID), else the automatic choice; the error says what the table holds.
pub fn select(table: &[GidEntry], rule: &GidRule, dev: &str, port: u8) -> Result<u8> {
    if let Some(i) = rule.index {
        return match table.iter().find(|e| e.index == i) {
            Some(e) if !is_zero(&e.gid) => Ok(i),
            _ => Err(Error::invalid_argument(format!(
                "{dev}:{port} has no GID at index {i} (usable: {})",
                describe(table)
            ))),
        };
    }
    choose(table, rule).ok_or_else(|| {
        let what = match &rule.range {
            Some(r) => format!("a non-link-local GID of known type in {r}"),
            None => "a non-link-local GID of known type".to_string(),
        };
        Error::system(format!(
            "{dev}:{port}: no usable RoCE GID (need {what}; table: {}); \
             give the port's netdev an IP address or set MPIB_GID_INDEX",
            describe(table)
        ))
    })
}

/// The GID index to use now on a RoCE port whose GID was `current` (value and type), after
/// its table may have changed (a GID_CHANGE or PORT_ACTIVE event, or the entry at the index
/// in use no longer holding it): with an index (`MPIB_GID_INDEX`), that index as [`select`]
/// checks it; else the entry holding the same value and type again (mlx5 and rxe re-add a
/// RoCE GID at another index after a port flap; it was chosen by `rule` and still is), else
/// a choice made anew by [`select`] with `rule` (the port's address changed). The error
/// says what the table holds (no usable GID: the address is gone for now).
pub fn reselect(table: &[GidEntry], current: &GidEntry, rule: &GidRule, dev: &str, port: u8) -> Result<u8> {
    if rule.index.is_none()
        && let Some(e) = table.iter().find(|e| e.gid == current.gid && e.kind == current.kind && !is_zero(&e.gid))
    {
        return Ok(e.index);
    }
    select(table, rule, dev, port)
}

/// The non-empty entries, `index=gid(type)`, for error messages and logs.
pub fn describe(table: &[GidEntry]) -> String {
    let items: Vec<String> = table
        .iter()
        .filter(|e| !is_zero(&e.gid))
        .map(|e| {
            let t = match e.kind {
                Some(GidType::RoceV2) => "v2",
                Some(GidType::IbRoceV1) => "v1",
                None => "type unknown",
            };
            format!("{}={}({t})", e.index, format_gid(&e.gid))
        })
        .collect();
    if items.is_empty() { "empty".to_string() } else { items.join(", ") }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn v4(index: u8, last: u8, kind: Option<GidType>) -> GidEntry {
        let mut gid = [0u8; 16];
        gid[10] = 0xff;
        gid[11] = 0xff;
        gid[12..].copy_from_slice(&[192, 0, 2, last]);
        GidEntry { index, gid, kind }
    }
    fn v6(index: u8, first: u16, kind: Option<GidType>) -> GidEntry {
        let mut gid = [0u8; 16];
        gid[..2].copy_from_slice(&first.to_be_bytes());
        gid[15] = index + 1;
        GidEntry { index, gid, kind }
    }
    fn empty(index: u8) -> GidEntry {
        GidEntry { index, gid: [0; 16], kind: None }
    }
    use GidType::*;

    fn auto() -> GidRule {
        GidRule::default()
    }

    #[test]
    fn rxe_like_table_picks_the_v2_ipv4_entry() {
        // What the kernel 6.1 rxe driver shows: 0 = fe80 link-local (v2), 1 = ::ffff:192.0.2.1 (v2).
        let t = [v6(0, 0xfe80, Some(RoceV2)), v4(1, 1, Some(RoceV2)), empty(2), empty(3)];
        assert_eq!(choose(&t, &auto()), Some(1));
    }

    #[test]
    fn mlx5_like_table_prefers_ipv4_then_v2() {
        let t = [
            v6(0, 0xfe80, Some(IbRoceV1)),
            v6(1, 0xfe80, Some(RoceV2)),
            v4(2, 7, Some(IbRoceV1)),
            v6(3, 0x2001, Some(RoceV2)),
            v4(4, 7, Some(RoceV2)),
            v4(5, 8, Some(RoceV2)),
        ];
        assert_eq!(choose(&t, &auto()), Some(4), "v2 + IPv4, lowest index");
        assert_eq!(choose(&t[..4], &auto()), Some(2), "the family first, as net_ib: v1 IPv4 beats v2 IPv6");
        assert_eq!(choose(&t[..2], &auto()), None, "link-local only");
    }

    #[test]
    fn version_family_and_range_preferences() {
        let t = [
            v6(0, 0xfe80, Some(RoceV2)),
            v4(1, 7, Some(IbRoceV1)),
            v4(2, 7, Some(RoceV2)),
            v6(3, 0x2001, Some(IbRoceV1)),
            v6(4, 0x2001, Some(RoceV2)),
            v4(5, 200, Some(RoceV2)),
        ];
        let rule = |version, family, range: Option<&str>| GidRule {
            index: None,
            index_on_ib: true,
            version,
            family,
            range: range.map(|r| {
                let (a, p) = r.split_once('/').unwrap();
                AddrRange { addr: a.parse().unwrap(), prefix: p.parse().unwrap() }
            }),
        };
        use AddrFamily::*;
        assert_eq!(choose(&t, &rule(IbRoceV1, V4, None)), Some(1), "RoCE v1 asked for");
        assert_eq!(choose(&t, &rule(RoceV2, V6, None)), Some(4), "IPv6 asked for; never link-local");
        assert_eq!(choose(&t, &rule(IbRoceV1, V6, None)), Some(3));
        // A range is a filter: only its addresses, whatever the other preferences.
        assert_eq!(choose(&t, &rule(RoceV2, V4, Some("192.0.2.128/25"))), Some(5));
        assert_eq!(choose(&t, &rule(RoceV2, V4, Some("192.0.2.7/32"))), Some(2));
        assert_eq!(choose(&t, &rule(IbRoceV1, V4, Some("192.0.2.0/24"))), Some(1));
        assert_eq!(choose(&t, &rule(RoceV2, V4, Some("10.0.0.0/8"))), None);
        assert_eq!(choose(&t, &rule(RoceV2, V6, Some("2001::/16"))), Some(4));
        assert_eq!(choose(&t, &rule(RoceV2, V4, Some("0.0.0.0/0"))), Some(2), "/0: every IPv4 GID");
        let e = select(&t, &rule(RoceV2, V4, Some("10.0.0.0/8")), "mlx5_0", 1).unwrap_err();
        assert!(e.msg().contains("in 10.0.0.0/8") && e.msg().contains("2=::ffff:192.0.2.7(v2)"), "{e}");
    }

    #[test]
    fn range_matching_counts_bits() {
        let r = |s: &str| {
            let (a, p) = s.split_once('/').unwrap();
            AddrRange { addr: a.parse().unwrap(), prefix: p.parse().unwrap() }
        };
        let g = v4(0, 77, None).gid; // 192.0.2.77
        assert!(r("192.0.2.64/26").contains(&g));
        assert!(!r("192.0.2.0/26").contains(&g));
        assert!(r("192.0.0.0/22").contains(&g) && !r("192.0.4.0/22").contains(&g));
        assert!(!r("::/0").contains(&g), "an IPv6 range holds no IPv4-mapped GID");
        let g6 = v6(0, 0x2001, None).gid; // 2001::1
        assert!(r("2001::/16").contains(&g6) && r("2000::/3").contains(&g6) && !r("2002::/16").contains(&g6));
        assert!(r("2001::1/128").contains(&g6) && !r("0.0.0.0/0").contains(&g6));
    }

    #[test]
    fn link_local_empty_and_unknown_types_are_never_chosen() {
        let t = [v6(0, 0xfe80, Some(RoceV2)), v6(1, 0xfebf, Some(RoceV2)), empty(2), v4(3, 9, None)];
        assert_eq!(choose(&t, &auto()), None);
        assert_eq!(choose(&[], &auto()), None);
        // An unreadable type is skipped, the next readable one is taken.
        let t = [v4(0, 9, None), v4(1, 9, Some(IbRoceV1))];
        assert_eq!(choose(&t, &auto()), Some(1));
        // fec0::/10 (site-local) is not link-local.
        assert!(!is_link_local(&v6(0, 0xfec0, None).gid));
    }

    #[test]
    fn override_must_name_a_non_empty_entry() {
        let t = [v6(0, 0xfe80, Some(RoceV2)), v4(1, 1, Some(RoceV2)), empty(2)];
        assert_eq!(select(&t, &GidRule::index(Some(0)), "rxe0", 1).unwrap(), 0, "an override may pick link-local");
        assert_eq!(select(&t, &auto(), "rxe0", 1).unwrap(), 1);
        let e = select(&t, &GidRule::index(Some(2)), "rxe0", 1).unwrap_err();
        assert!(e.msg().contains("rxe0:1 has no GID at index 2"), "{e}");
        assert!(e.msg().contains("1=::ffff:192.0.2.1(v2)"), "{e}");
        let e = select(&t, &GidRule::index(Some(9)), "rxe0", 1).unwrap_err();
        assert!(e.msg().contains("index 9"), "{e}");
        let e = select(&t[..1], &auto(), "rxe0", 1).unwrap_err();
        assert!(e.msg().contains("no usable RoCE GID") && e.msg().contains("MPIB_GID_INDEX"), "{e}");
    }

    #[test]
    fn a_changed_table_keeps_the_same_gid_else_chooses_anew() {
        let ours = v4(1, 1, Some(RoceV2));
        // The same GID again, at another index (re-added after a flap while the old entry
        // was still held): found again, not the first v2 IPv4 GID of the table.
        let t = [v6(0, 0xfe80, Some(RoceV2)), v4(1, 9, Some(RoceV2)), v4(2, 1, Some(IbRoceV1)), v4(3, 1, Some(RoceV2))];
        assert_eq!(reselect(&t, &ours, &auto(), "mlx5_0", 1).unwrap(), 3, "same value and type, not the v1 twin");
        // Gone: chosen anew by the same rules as at open.
        let t = [v6(0, 0xfe80, Some(RoceV2)), v4(4, 7, Some(RoceV2)), v4(5, 8, Some(RoceV2))];
        assert_eq!(reselect(&t, &ours, &auto(), "rxe0", 1).unwrap(), 4);
        // Nothing usable (the address removed): the error says so, to be tried again later.
        let e = reselect(&t[..1], &ours, &auto(), "rxe0", 1).unwrap_err();
        assert!(e.msg().contains("no usable RoCE GID"), "{e}");
        // MPIB_GID_INDEX: the index the user chose, whatever it holds now.
        let t = [v6(0, 0xfe80, Some(RoceV2)), v4(1, 7, Some(RoceV2)), v4(2, 1, Some(RoceV2))];
        assert_eq!(reselect(&t, &ours, &GidRule::index(Some(1)), "rxe0", 1).unwrap(), 1);
        assert!(reselect(&t, &ours, &GidRule::index(Some(9)), "rxe0", 1).is_err());
        // The preferences of the rule choose anew: an IPv6 rule takes the v2 IPv6 GID.
        let v6_rule = GidRule { family: AddrFamily::V6, ..auto() };
        let t = [v6(0, 0xfe80, Some(RoceV2)), v4(4, 7, Some(RoceV2)), v6(5, 0x2001, Some(RoceV2))];
        assert_eq!(reselect(&t, &ours, &v6_rule, "rxe0", 1).unwrap(), 5);
    }

    #[test]
    fn sysfs_type_text_and_formatting() {
        assert_eq!(parse_type("RoCE v2\n"), Some(RoceV2));
        assert_eq!(parse_type("IB/RoCE v1\n"), Some(IbRoceV1));
        assert_eq!(parse_type("garbage"), None);
        assert_eq!(format_gid(&v4(0, 1, None).gid), "::ffff:192.0.2.1");
        assert_eq!(format_gid(&v6(0, 0xfe80, None).gid), "fe80:0000:0000:0000:0000:0000:0000:0001");
    }
}
