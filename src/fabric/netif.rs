//! Network interfaces and the default address, chosen the way NCCL's socket transport
//! chooses its interface: `NCCL_SOCKET_IFNAME` when set (prefix match, `^` excludes,
//! `=` exact), else an `ib*` interface, else the first up non-loopback, non-docker one,
//! else loopback. IPv4 is preferred within an interface.

use std::ffi::CStr;
use std::net::{IpAddr, Ipv4Addr, Ipv6Addr};

use crate::error::{Error, Result};

/// One address of an interface that is up.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct IfAddr {
    pub name: String,
    pub addr: IpAddr,
    pub loopback: bool,
}

/// Every address of every interface that is up, in the kernel's order.
pub fn list() -> Vec<IfAddr> {
    let mut out = Vec::new();
    let mut head: *mut libc::ifaddrs = std::ptr::null_mut();
    // SAFETY: getifaddrs fills `head` with a list we free below with freeifaddrs.
    if unsafe { libc::getifaddrs(&mut head) } != 0 {
        return out;
    }
    let mut p = head;
    while !p.is_null() {
        // SAFETY: `p` is a node of the list returned by getifaddrs, valid until freed.
        let ifa = unsafe { &*p };
        p = ifa.ifa_next;
        let flags = ifa.ifa_flags;
        if flags & libc::IFF_UP as u32 == 0 || ifa.ifa_addr.is_null() {
            continue;
        }
        // SAFETY: a non-null ifa_addr points to a sockaddr whose family says its type.
        let addr = unsafe {
            match (*ifa.ifa_addr).sa_family as i32 {
                libc::AF_INET => {
                    let sin = &*(ifa.ifa_addr as *const libc::sockaddr_in);
                    IpAddr::V4(Ipv4Addr::from(u32::from_be(sin.sin_addr.s_addr)))
                }
                libc::AF_INET6 => {
                    let sin6 = &*(ifa.ifa_addr as *const libc::sockaddr_in6);
                    IpAddr::V6(Ipv6Addr::from(sin6.sin6_addr.s6_addr))
                }
                _ => continue,
            }
        };
        // SAFETY: ifa_name is a NUL-terminated string owned by the list.
        let name = unsafe { CStr::from_ptr(ifa.ifa_name) }.to_string_lossy().into_owned();
        out.push(IfAddr { name, addr, loopback: flags & libc::IFF_LOOPBACK as u32 != 0 });
    }
    // SAFETY: `head` came from getifaddrs and is freed once.
    unsafe { libc::freeifaddrs(head) };
    out
}

/// Whether `name` matches an `NCCL_SOCKET_IFNAME`-style list.
pub fn matches_ifname(spec: &str, name: &str) -> bool {
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
        .map(str::trim)
        .filter(|s| !s.is_empty())
        .any(|p| if exact { name == p } else { name.starts_with(p) });
    hit != exclude
}

/// Preference among one interface's addresses: IPv4, then global IPv6, then the rest.
fn rank(a: &IpAddr) -> u8 {
    match a {
        IpAddr::V4(_) => 0,
        IpAddr::V6(v6) if (v6.segments()[0] & 0xffc0) != 0xfe80 => 1,
        IpAddr::V6(_) => 2,
    }
}

/// Picks from `ifs` as NCCL would (see the module comment).
pub fn choose(ifs: &[IfAddr], socket_ifname: Option<&str>) -> Option<IfAddr> {
    let best = |pred: &dyn Fn(&IfAddr) -> bool| -> Option<IfAddr> {
        let mut cands: Vec<&IfAddr> = ifs.iter().filter(|i| pred(i)).collect();
        cands.sort_by_key(|i| rank(&i.addr)); // stable: keeps the kernel's interface order
        cands.first().map(|i| (*i).clone())
    };
    if let Some(spec) = socket_ifname {
        return best(&|i: &IfAddr| matches_ifname(spec, &i.name));
    }
    best(&|i: &IfAddr| !i.loopback && i.name.starts_with("ib"))
        .or_else(|| best(&|i: &IfAddr| !i.loopback && !i.name.starts_with("docker")))
        .or_else(|| best(&|i: &IfAddr| i.loopback))
}

/// The default local address for sockets: NCCL's choice on this host.
pub fn default_addr(socket_ifname: Option<&str>) -> Result<IfAddr> {
    let ifs = list();
    choose(&ifs, socket_ifname).ok_or_else(|| {
        Error::system(match socket_ifname {
            Some(s) => format!("no interface that is up matches NCCL_SOCKET_IFNAME={s}"),
            None => "no network interface is up (not even loopback)".to_string(),
        })
    })
}

/// The preferred address of interface `name`.
pub fn addr_of(name: &str) -> Result<IfAddr> {
    let ifs = list();
    choose(&ifs, Some(&format!("={name}")))
        .ok_or_else(|| Error::invalid_argument(format!("interface {name} does not exist or is down")))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn ifa(name: &str, addr: &str, lo: bool) -> IfAddr {
        IfAddr { name: name.into(), addr: addr.parse().unwrap(), loopback: lo }
    }

    #[test]
    fn nccl_style_interface_choice() {
        let ifs = vec![
            ifa("lo", "127.0.0.1", true),
            ifa("docker0", "172.17.0.1", false),
            ifa("eth0", "fe80::1", false),
            ifa("eth0", "10.0.0.5", false),
            ifa("ib0", "192.168.1.5", false),
        ];
        assert_eq!(choose(&ifs, None).unwrap().name, "ib0");
        assert_eq!(choose(&ifs[..4], None).unwrap().addr, "10.0.0.5".parse::<IpAddr>().unwrap(), "IPv4 first");
        assert_eq!(choose(&ifs[..2], None).unwrap().name, "lo", "docker bridges are skipped by default");
        assert_eq!(choose(&ifs[..1], None).unwrap().name, "lo");
        assert_eq!(choose(&ifs, Some("eth")).unwrap().addr, "10.0.0.5".parse::<IpAddr>().unwrap());
        assert_eq!(choose(&ifs, Some("^ib,eth,docker")).unwrap().name, "lo");
        assert_eq!(choose(&ifs, Some("=eth")), None, "exact match only");
        assert!(choose(&ifs, Some("veth")).is_none());
    }

    #[test]
    fn loopback_is_listed() {
        assert!(list().iter().any(|i| i.loopback), "this host has an up loopback interface");
        assert!(addr_of("lo").is_ok());
        assert!(addr_of("no-such-if0").is_err());
    }
}
