//! Which local address each soft rail uses, and what its interface says about it.
//! Default: what NCCL's socket transport picks (`fabric::netif`).

use std::net::{IpAddr, Ipv4Addr};

use crate::fabric::netif::{default_addr, first_matching, interfaces};

use crate::config::RailAddr;
use crate::error::{Error, Result};

/// Link speed reported when sysfs has none (loopback, some virtual NICs), in Mbit/s:
/// the value NCCL's socket transport reports in that case.
pub const NOMINAL_SPEED_MBPS: u32 = 10_000;

/// A rail's local address and the interface it belongs to (if any is known).
pub fn resolve(addr: Option<&RailAddr>, socket_ifname: Option<&str>, var: &str) -> Result<(IpAddr, Option<String>)> {
    let ifs = interfaces();
    match addr {
        Some(RailAddr::Ip(ip)) => Ok((*ip, ifs.iter().find(|i| i.ip == *ip).map(|i| i.name.clone()))),
        Some(RailAddr::Interface(name)) => {
            first_matching(&ifs, &format!("={name}")).map(|i| (i.ip, Some(i.name))).ok_or_else(|| {
                Error::invalid_argument(format!("{var}={name}: no up interface of that name with an address"))
            })
        }
        None => Ok(default_addr(&ifs, socket_ifname)
            .map(|i| (i.ip, Some(i.name)))
            .unwrap_or((IpAddr::V4(Ipv4Addr::LOCALHOST), None))),
    }
}

fn sysfs(iface: &str, what: &str) -> Option<String> {
    std::fs::read_to_string(format!("/sys/class/net/{iface}/{what}")).ok().map(|s| s.trim().to_string())
}

/// Link speed of an interface in Mbit/s, or the nominal value when sysfs has none.
pub fn speed_mbps(iface: Option<&str>) -> u32 {
    iface
        .and_then(|i| sysfs(i, "speed"))
        .and_then(|s| s.parse::<i64>().ok())
        .filter(|s| *s > 0)
        .map_or(NOMINAL_SPEED_MBPS, |s| s.min(u32::MAX as i64) as u32)
}

/// MTU of an interface (1500 when unknown).
pub fn mtu(iface: Option<&str>) -> u32 {
    iface.and_then(|i| sysfs(i, "mtu")).and_then(|s| s.parse().ok()).unwrap_or(1500)
}

/// sysfs path of the interface's PCI device, when it has one.
pub fn pci_path(iface: Option<&str>) -> Option<String> {
    let p = std::fs::canonicalize(format!("/sys/class/net/{}/device", iface?)).ok()?;
    let s = p.to_string_lossy().into_owned();
    s.contains("/pci").then_some(s)
}

/// A stable 64-bit id (FNV-1a) of the rail's identity.
pub fn guid(parts: &[&str]) -> u64 {
    let mut h: u64 = 0xcbf2_9ce4_8422_2325;
    for p in parts {
        for b in p.bytes().chain(std::iter::once(0)) {
            h = (h ^ b as u64).wrapping_mul(0x0100_0000_01b3);
        }
    }
    h
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn loopback_resolves_and_has_nominal_speed() {
        let (ip, iface) = resolve(Some(&RailAddr::Ip("127.0.0.1".parse().unwrap())), None, "X").unwrap();
        assert!(ip.is_loopback());
        assert_eq!(speed_mbps(iface.as_deref()), NOMINAL_SPEED_MBPS);
        assert_eq!(pci_path(iface.as_deref()), None);
        assert!(resolve(Some(&RailAddr::Interface("nosuch0".into())), None, "MPIB_SOFT_SUP_ADDR").is_err());
        assert_eq!(guid(&["a", "b"]), guid(&["a", "b"]));
        assert_ne!(guid(&["ab", ""]), guid(&["a", "b"]));
    }
}
