//! Network interfaces and the default address, chosen the way NCCL's socket transport
//! chooses its interface: `NCCL_SOCKET_IFNAME` when set (a comma list of name prefixes;
//! `^` in front excludes them, `=` in front matches names exactly); else the first up
//! `ib*` interface, else the first up interface that is neither `docker*` nor `lo*`, else
//! `docker*`, else loopback. An interface's IPv4 address is preferred over its IPv6 one;
//! IPv6 link-local addresses are skipped (they need a scope). Used by the plugin (the soft
//! fabric's rails, the set-up listener) and by the tools (the addresses `mpib-perf --listen`
//! advertises).

use std::ffi::CStr;
use std::net::{IpAddr, Ipv4Addr, Ipv6Addr};

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
        if let IpAddr::V6(v6) = ip
            && v6.segments()[0] & 0xffc0 == 0xfe80
        {
            continue;
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
pub fn first_matching(ifs: &[IfAddr], spec: &str) -> Option<IfAddr> {
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
    fn loopback_is_listed() {
        assert!(interfaces().iter().any(|i| i.ip.is_loopback()));
    }
}
