//! RoCE GID selection. Like net_ib: the GID table of the port is scanned; entries whose
//! type cannot be read (sysfs hidden in a container, and libibverbs cannot tell either)
//! are skipped, never fatal; link-local and empty GIDs are never chosen automatically.
//! Preference: RoCE v2 + IPv4-mapped, then RoCE v2 + other, then RoCE v1 + IPv4-mapped,
//! then RoCE v1 + other; the lowest index wins a tie. `MPIB_GID_INDEX` overrides it.

use std::fmt::Write;

use rdma_mummy_sys as ibv;

use super::sys::{self, ret_errno};
use crate::error::{Error, Result};

/// The type of a GID table entry.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
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

/// The automatic choice: the best-ranked usable entry, `None` when nothing is usable.
pub fn choose(table: &[GidEntry]) -> Option<u8> {
    table
        .iter()
        .filter_map(|e| {
            if is_zero(&e.gid) || is_link_local(&e.gid) {
                return None;
            }
            let v2 = match e.kind? {
                GidType::RoceV2 => 0,
                GidType::IbRoceV1 => 2,
            };
            let family = if is_ipv4_mapped(&e.gid) { 0 } else { 1 };
            Some((v2 + family, e.index))
        })
        .min()
        .map(|(_, index)| index)
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

/// The GID index to use on a RoCE port: the override when given (it must hold a GID),
/// else the automatic choice; the error says what the table holds.
pub fn select(table: &[GidEntry], override_index: Option<u8>, dev: &str, port: u8) -> Result<u8> {
    if let Some(i) = override_index {
        return match table.iter().find(|e| e.index == i) {
            Some(e) if !is_zero(&e.gid) => Ok(i),
            _ => Err(Error::invalid_argument(format!(
                "MPIB_GID_INDEX={i}: {dev}:{port} has no GID at index {i} (usable: {})",
                describe(table)
            ))),
        };
    }
    choose(table).ok_or_else(|| {
        Error::system(format!(
            "{dev}:{port}: no usable RoCE GID (need a non-link-local GID of known type; table: {}); \
             give the port's netdev an IP address or set MPIB_GID_INDEX",
            describe(table)
        ))
    })
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

    #[test]
    fn rxe_like_table_picks_the_v2_ipv4_entry() {
        // What the kernel 6.1 rxe driver shows: 0 = fe80 link-local (v2), 1 = ::ffff:192.0.2.1 (v2).
        let t = [v6(0, 0xfe80, Some(RoceV2)), v4(1, 1, Some(RoceV2)), empty(2), empty(3)];
        assert_eq!(choose(&t), Some(1));
    }

    #[test]
    fn mlx5_like_table_prefers_v2_over_v1_and_ipv4_over_ipv6() {
        let t = [
            v6(0, 0xfe80, Some(IbRoceV1)),
            v6(1, 0xfe80, Some(RoceV2)),
            v4(2, 7, Some(IbRoceV1)),
            v6(3, 0x2001, Some(RoceV2)),
            v4(4, 7, Some(RoceV2)),
            v4(5, 8, Some(RoceV2)),
        ];
        assert_eq!(choose(&t), Some(4), "v2 + IPv4, lowest index");
        assert_eq!(choose(&t[..4]), Some(3), "v2 IPv6 beats v1 IPv4");
        assert_eq!(choose(&t[..3]), Some(2), "v1 IPv4 when there is no v2");
    }

    #[test]
    fn link_local_empty_and_unknown_types_are_never_chosen() {
        let t = [v6(0, 0xfe80, Some(RoceV2)), v6(1, 0xfebf, Some(RoceV2)), empty(2), v4(3, 9, None)];
        assert_eq!(choose(&t), None);
        assert_eq!(choose(&[]), None);
        // An unreadable type is skipped, the next readable one is taken.
        let t = [v4(0, 9, None), v4(1, 9, Some(IbRoceV1))];
        assert_eq!(choose(&t), Some(1));
        // fec0::/10 (site-local) is not link-local.
        assert!(!is_link_local(&v6(0, 0xfec0, None).gid));
    }

    #[test]
    fn override_must_name_a_non_empty_entry() {
        let t = [v6(0, 0xfe80, Some(RoceV2)), v4(1, 1, Some(RoceV2)), empty(2)];
        assert_eq!(select(&t, Some(0), "rxe0", 1).unwrap(), 0, "an override may pick link-local");
        assert_eq!(select(&t, None, "rxe0", 1).unwrap(), 1);
        let e = select(&t, Some(2), "rxe0", 1).unwrap_err();
        assert!(e.msg().contains("MPIB_GID_INDEX=2: rxe0:1 has no GID at index 2"), "{e}");
        assert!(e.msg().contains("1=::ffff:192.0.2.1(v2)"), "{e}");
        let e = select(&t, Some(9), "rxe0", 1).unwrap_err();
        assert!(e.msg().contains("index 9"), "{e}");
        let e = select(&t[..1], None, "rxe0", 1).unwrap_err();
        assert!(e.msg().contains("no usable RoCE GID") && e.msg().contains("MPIB_GID_INDEX"), "{e}");
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
