//! Which NCCL devices the plugin shows, and which NICs are the two rails of each: the
//! configuration (`MPIB_FABRIC`, `MPIB_HCA_SOUT`/`MPIB_HCA_SUP`, `MPIB_SOFT_*_ADDR`,
//! `NCCL_SOCKET_IFNAME`, `MPIB_GID_INDEX`) turned into providers' options, and the devices
//! opened with them. The fabric providers know nothing of rails or the environment: they
//! list what the host has and open what they are asked to.
//!
//! - Soft fabric: one pair, SOUT on `MPIB_SOFT_SOUT_ADDR` and SUP on `MPIB_SOFT_SUP_ADDR`
//!   (default: the address NCCL's socket transport would pick, see `netif`); in-process
//!   mode (`MPIB_FABRIC=inproc`): two devices without sockets.
//! - Verbs: explicit pairs from `MPIB_HCA_SOUT[i]` + `MPIB_HCA_SUP[i]`, or pairs chosen by PCI
//!   locality (`pairing.rs`); each port opened once (a port in several pairs, or both rails
//!   on one port, share one device).

mod pairing;

use std::collections::HashMap;
use std::collections::hash_map::Entry;
use std::net::{IpAddr, Ipv4Addr};
use std::sync::Arc;
use std::time::Duration;

use crate::config::{Config, FabricChoice, HcaSpec, RailAddr};
use crate::error::{Error, Result};
use crate::fabric::Device;
use crate::fabric::netif::{default_addr, first_matching, interfaces};
use crate::fabric::soft::{self, SoftBind, SoftDevice, SoftOptions};
use crate::fabric::verbs::{self, HostPort, VerbsDevice, VerbsOptions};
use pairing::Resolved;

/// The two rails of one NCCL device: SOUT (index 0) and SUP (index 1). Both may be the
/// same NIC (two rails over one port, e.g. for loopback tests).
pub struct RailPair<D: Device> {
    pub sout: Arc<D>,
    pub sup: Arc<D>,
}

impl<D: Device> RailPair<D> {
    /// The rail's device by index (0 = SOUT, 1 = SUP).
    pub fn rail(&self, i: usize) -> &Arc<D> {
        if i == 0 { &self.sout } else { &self.sup }
    }
}

impl<D: Device> Clone for RailPair<D> {
    fn clone(&self) -> Self {
        RailPair { sout: self.sout.clone(), sup: self.sup.clone() }
    }
}

/// Opens the soft rail pair: over TCP (`Soft`, and `Auto`/`Verbs` when the plugin falls
/// back), or in-process (`Inproc`). The chosen addresses are logged at INFO.
pub fn soft_pairs(cfg: &Config) -> Result<Vec<RailPair<SoftDevice>>> {
    let connect_timeout = Duration::from_millis(cfg.connect_timeout_ms);
    if cfg.fabric == FabricChoice::Inproc {
        let open =
            |rail: &str| soft::open(&SoftOptions { name: format!("inproc-{rail}"), bind: None, connect_timeout });
        let pair = RailPair { sout: Arc::new(open("sout")?), sup: Arc::new(open("sup")?) };
        log::info!("soft fabric: in-process rails inproc-sout and inproc-sup");
        return Ok(vec![pair]);
    }
    let ifname = cfg.socket_ifname.as_deref();
    let open = |rail: &str, addr: Option<&RailAddr>, var: &str| -> Result<SoftDevice> {
        let (ip, iface) = resolve(addr, ifname, var)?;
        let bind_iface = match addr {
            Some(RailAddr::Interface(name)) => Some(name.clone()),
            _ => None,
        };
        let bind = Some(SoftBind { ip, iface, bind_iface });
        soft::open(&SoftOptions { name: format!("soft-{rail}"), bind, connect_timeout })
    };
    let sout = open("sout", cfg.soft_sout_addr.as_ref(), "MPIB_SOFT_SOUT_ADDR")?;
    let sup = open("sup", cfg.soft_sup_addr.as_ref(), "MPIB_SOFT_SUP_ADDR")?;
    Ok(vec![RailPair { sout: Arc::new(sout), sup: Arc::new(sup) }])
}

/// A soft rail's local address (from `MPIB_SOFT_*_ADDR`, named `var`) and the interface it
/// belongs to (if any is known). Default: what NCCL's socket transport picks, else loopback.
fn resolve(addr: Option<&RailAddr>, socket_ifname: Option<&str>, var: &str) -> Result<(IpAddr, Option<String>)> {
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

fn spec_text(s: &HcaSpec) -> String {
    s.to_string()
}

/// The verbs rail pairs NCCL's devices are made of, from `MPIB_HCA_SOUT`/`MPIB_HCA_SUP` or
/// paired automatically (see `pairing`). `cfg.gid_index` applies to every port.
///
/// Errors: verbs unavailable ([`verbs::unavailable_reason`]'s text), a named device or port
/// that does not exist, a port that cannot be opened, or no pair left after down ports were
/// skipped (each skip is a WARN).
pub fn verbs_pairs(cfg: &Config) -> Result<Vec<RailPair<VerbsDevice>>> {
    if let Some(why) = verbs::unavailable_reason() {
        return Err(Error::system(format!("the verbs fabric cannot be used: {why}")));
    }
    let ports = verbs::ports().map_err(Error::system)?;
    let mut opened: HashMap<usize, Arc<VerbsDevice>> = HashMap::new();
    let open = |i: usize| -> Result<Arc<VerbsDevice>> {
        let p = &ports[i];
        let opts = VerbsOptions { device: p.device.clone(), port: Some(p.port), gid_index: cfg.gid_index };
        Ok(Arc::new(VerbsDevice::open(&opts)?))
    };
    let pairs: Vec<(usize, usize)> = if cfg.hca_sout.is_empty() {
        let mut usable: Vec<HostPort> = ports.clone();
        for (i, p) in ports.iter().enumerate() {
            if !p.active {
                log::warn!("verbs: {} is {}, not used", p.label(), p.state);
                continue;
            }
            match open(i) {
                Ok(d) => {
                    opened.insert(i, d);
                }
                Err(e) => {
                    log::warn!("verbs: {} not used: {e}", p.label());
                    usable[i].active = false;
                }
            }
        }
        pairing::pair_auto(&usable)
    } else {
        let mut pairs = Vec::new();
        for (k, (so, su)) in cfg.hca_sout.iter().zip(&cfg.hca_sup).enumerate() {
            let (a, b) = (pairing::resolve(so, &ports), pairing::resolve(su, &ports));
            for (var, spec, r) in [("MPIB_HCA_SOUT", so, &a), ("MPIB_HCA_SUP", su, &b)] {
                if let Resolved::Missing(m) = r {
                    return Err(Error::invalid_argument(format!("{var} entry {k} ({}): {m}", spec_text(spec))));
                }
            }
            match (a, b) {
                (Resolved::Port(a), Resolved::Port(b)) => pairs.push((a, b)),
                (a, b) => {
                    let why: Vec<String> = [a, b]
                        .into_iter()
                        .filter_map(|r| if let Resolved::Down(m) = r { Some(m) } else { None })
                        .collect();
                    log::warn!(
                        "verbs: rail pair {k} ({} + {}) skipped: {}",
                        spec_text(so),
                        spec_text(su),
                        why.join("; ")
                    );
                }
            }
        }
        for &(a, b) in &pairs {
            for i in [a, b] {
                if let Entry::Vacant(slot) = opened.entry(i) {
                    slot.insert(open(i)?);
                }
            }
        }
        pairs
    };
    if pairs.is_empty() {
        let seen: Vec<String> = ports.iter().map(|p| format!("{} {}", p.label(), p.state)).collect();
        return Err(Error::system(format!("verbs: no usable rail pair (ports: {})", seen.join(", "))));
    }
    let mut out = Vec::with_capacity(pairs.len());
    for (k, (a, b)) in pairs.into_iter().enumerate() {
        log::info!("verbs: NCCL device {k} = SOUT {} + SUP {}", ports[a].label(), ports[b].label());
        out.push(RailPair { sout: opened[&a].clone(), sup: opened[&b].clone() });
    }
    Ok(out)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn soft_rail_addresses_resolve() {
        let (ip, _) = resolve(Some(&RailAddr::Ip("127.0.0.1".parse().unwrap())), None, "X").unwrap();
        assert!(ip.is_loopback());
        let e = resolve(Some(&RailAddr::Interface("nosuch0".into())), None, "MPIB_SOFT_SUP_ADDR").unwrap_err();
        assert_eq!(e.msg(), "MPIB_SOFT_SUP_ADDR=nosuch0: no up interface of that name with an address");
    }
}
