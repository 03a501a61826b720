//! The local addresses the plugin binds: NCCL's default interface (`NCCL_SOCKET_IFNAME`
//! rules, from the `netif` crate) or a named interface, with the plugin's errors.

use std::net::IpAddr;

pub use netif::{IfAddr, default_addr, first_matching, ifname_matches, interfaces};

use crate::error::{Error, Result};

/// The default local address for sockets: NCCL's choice on this host.
pub fn default_ip(socket_ifname: Option<&str>) -> Result<IpAddr> {
    default_addr(&interfaces(), socket_ifname).map(|i| i.ip).ok_or_else(|| {
        Error::system(match socket_ifname {
            Some(s) => format!("no interface that is up matches NCCL_SOCKET_IFNAME={s}"),
            None => "no network interface is up (not even loopback)".to_string(),
        })
    })
}

/// The preferred address of interface `name`.
pub fn ip_of(name: &str) -> Result<IpAddr> {
    first_matching(&interfaces(), &format!("={name}"))
        .map(|i| i.ip)
        .ok_or_else(|| Error::invalid_argument(format!("interface {name} does not exist, is down or has no address")))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn loopback_resolves_and_a_missing_interface_is_an_error() {
        assert!(ip_of("lo").is_ok());
        assert!(ip_of("no-such-if0").is_err());
        assert!(default_ip(Some("nosuch")).is_err());
    }
}
