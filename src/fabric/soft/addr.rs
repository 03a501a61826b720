//! Which local address each soft rail uses, and what its interface says about it.
//!
//! Default: what NCCL's socket transport picks. `NCCL_SOCKET_IFNAME` when set (a comma
//! list of name prefixes; `^` in front excludes them, `=` in front matches names exactly);
//! else the first up `ib*` interface, else the first up interface that is neither
//! `docker*` nor `lo*`, else `docker*`, else loopback. An interface's IPv4 address is
//! preferred over its IPv6 one; IPv6 link-local addresses are skipped (they need a scope).

use std::ffi::CStr;
use std::net::{IpAddr, Ipv4Addr, Ipv6Addr};

use crate::config::RailAddr;
use crate::error::{Error, Result};

/// Link speed reported when sysfs has none (loopback, some virtual NICs), in Mbit/s:
/// the value NCCL's socket transport reports in that case.
pub const NOMINAL_SPEED_MBPS: u32 = 10_000;

/// One address of an up interface.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct IfAddr {
    pub name: String,
    pub ip: IpAddr,
}

/// The addresses of every up interface, in the kernel's order.
pub fn interfaces() -> Vec<IfAddr> {
    let mut out = Vec::new();
    let mut head: *mut libc::ifaddrs = std::ptr::null_mut();
    // SAFETY: getifaddrs fills `head` with a list we free below.
    if unsafe { libc::getifaddrs(&mut head) } != 0 {
        return out;
    }
    let mut p = head;
    while !p.is_null() {
        // SAFETY: `p` is a node of the list getifaddrs returned, alive until freeifaddrs.
        let ifa = unsafe { &*p };
        p = ifa.ifa_next;
        if ifa.ifa_addr.is_null() || ifa.ifa_flags & libc::IFF_UP as u32 == 0 {
            continue;
        }
        // SAFETY: ifa_name is a NUL-terminated string owned by the list.
        let name = unsafe { CStr::from_ptr(ifa.ifa_name) }.to_string_lossy().into_owned();
        // SAFETY: ifa_addr is non-null; its family says which sockaddr it is.
        let ip = unsafe {
            match (*ifa.ifa_addr).sa_family as i32 {
                libc::AF_INET => {
                    let a = &*(ifa.ifa_addr as *const libc::sockaddr_in);
                    IpAddr::V4(Ipv4Addr::from(u32::from_be(a.sin_addr.s_addr)))
                }
                libc::AF_INET6 => {
                    let a = &*(ifa.ifa_addr as *const libc::sockaddr_in6);
                    IpAddr::V6(Ipv6Addr::from(a.sin6_addr.s6_addr))
                }
                _ => continue,
            }
        };
        if let IpAddr::V6(v6) = ip {
            if v6.segments()[0] & 0xffc0 == 0xfe80 {
                continue;
            }
        }
        out.push(IfAddr { name, ip });
    }
    // SAFETY: frees the list getifaddrs allocated, once.
    unsafe { libc::freeifaddrs(head) };
    out
}

/// NCCL's interface-name matching (`NCCL_SOCKET_IFNAME` syntax).
pub fn ifname_matches(spec: &str, name: &str) -> bool {
    let (exclude, spec) = match spec.strip_prefix('^') {
        Some(s) => (true, s),
        None => (false, spec),
    };
    let (exact, spec) = match spec.strip_prefix('=') {
        Some(s) => (true, s),
        None => (false, spec),
    };
    let hit = spec
        .split(',')
        .map(|s| s.split(':').next().unwrap_or(""))
        .filter(|s| !s.is_empty())
        .any(|p| if exact { name == p } else { name.starts_with(p) });
    hit != exclude
}

/// The first address (IPv4 preferred within an interface) whose interface matches `spec`.
fn first_matching(ifs: &[IfAddr], spec: &str) -> Option<IfAddr> {
    let mut names: Vec<&str> = Vec::new();
    for i in ifs {
        if ifname_matches(spec, &i.name) && !names.contains(&i.name.as_str()) {
            names.push(&i.name);
        }
    }
    let name = names.first()?;
    let of = |v4: bool| ifs.iter().find(|i| i.name == *name && i.ip.is_ipv4() == v4).cloned();
    of(true).or_else(|| of(false))
}

/// The default interface address, as NCCL's socket transport chooses it.
pub fn default_addr(ifs: &[IfAddr], socket_ifname: Option<&str>) -> Option<IfAddr> {
    if let Some(spec) = socket_ifname {
        return first_matching(ifs, spec);
    }
    ["ib", "^docker,lo", "docker", "lo"].iter().find_map(|spec| first_matching(ifs, spec))
}

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

    fn ifs() -> Vec<IfAddr> {
        let a = |n: &str, ip: &str| IfAddr { name: n.into(), ip: ip.parse().unwrap() };
        vec![
            a("lo", "127.0.0.1"),
            a("docker0", "172.17.0.1"),
            a("eth0", "2001:db8::1"),
            a("eth0", "10.0.0.2"),
            a("eth1", "10.0.1.2"),
            a("ib0", "10.1.0.2"),
        ]
    }

    #[test]
    fn nccl_ifname_syntax() {
        assert!(ifname_matches("eth", "eth0"));
        assert!(!ifname_matches("eth", "ib0"));
        assert!(ifname_matches("ib,eth", "eth1"));
        assert!(!ifname_matches("^eth", "eth1"));
        assert!(ifname_matches("^eth", "ib0"));
        assert!(!ifname_matches("=eth", "eth0"));
        assert!(ifname_matches("=eth0", "eth0"));
        assert!(!ifname_matches("^=eth0", "eth0"));
        assert!(ifname_matches("^=eth0", "eth01"));
        assert!(ifname_matches("eth0:1234", "eth0"), "a port suffix is ignored");
    }

    #[test]
    fn default_prefers_ib_then_non_docker_non_lo() {
        let all = ifs();
        assert_eq!(default_addr(&all, None).unwrap().name, "ib0");
        let no_ib: Vec<_> = all.iter().filter(|i| i.name != "ib0").cloned().collect();
        let d = default_addr(&no_ib, None).unwrap();
        assert_eq!((d.name.as_str(), d.ip.to_string().as_str()), ("eth0", "10.0.0.2"), "IPv4 first");
        let only: Vec<_> = all.iter().filter(|i| i.name == "lo" || i.name == "docker0").cloned().collect();
        assert_eq!(default_addr(&only, None).unwrap().name, "docker0");
        assert_eq!(default_addr(&all, Some("eth1")).unwrap().name, "eth1");
        assert_eq!(default_addr(&all, Some("^ib,eth,docker")).unwrap().name, "lo");
        assert_eq!(default_addr(&all, Some("nosuch")), None);
    }

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
