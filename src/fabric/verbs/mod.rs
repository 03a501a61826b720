//! The verbs fabric: real InfiniBand and RoCE NICs through libibverbs.
//!
//! libibverbs is reached through rdma-mummy-sys, which `dlopen`s it at run time: the plugin
//! has no link-time dependency on rdma-core and loads (and runs on the soft fabric) on hosts
//! without it; [`unavailable_reason`] then says why verbs cannot be used.
//!
//! Objects map 1:1 onto verbs: a [`VerbsDevice`] is an opened port with one PD shared by all
//! comms; [`VerbsCq`] a CQ (extended, with completion timestamps, where the device has them);
//! [`VerbsSrq`] a basic SRQ (`ibv_create_srq`) of generic WQEs; [`VerbsQp`] an RC QP. Every
//! object holds its device context alive, so drop order never matters. Each opened device
//! has one thread that sleeps until the kernel has an async event (port down, QP fatal) and
//! logs it. See `pairing` for how ports become rail pairs and `gid` for the RoCE GID choice.

mod cq;
mod device;
mod events;
mod gid;
mod pairing;
mod props;
mod qp;
mod qp_info;
mod srq;
mod sys;
mod wr_pool;

use std::collections::HashMap;
use std::collections::hash_map::Entry;
use std::sync::Arc;

pub use cq::{TsClock, UNEXPECTED_OPCODE, VerbsCq, wc_status_str};
pub use device::{VerbsDevice, VerbsMr};
pub use qp::VerbsQp;
pub use srq::VerbsSrq;
pub use wr_pool::MAX_CHAIN;

use crate::config::{Config, HcaSpec};
use crate::error::{Error, Result};
use crate::fabric::RailPair;
use pairing::{PortCandidate, Resolved};
use sys::DeviceList;

/// Why verbs cannot be used on this host, or `None` when at least one port is active:
/// libibverbs cannot be loaded, the kernel has no RDMA support, there is no device, or no
/// port is active. `MPIB_FABRIC=auto` falls back to the soft fabric on `Some`.
pub fn unavailable_reason() -> Option<String> {
    if let Some(e) = sys::libibverbs_load_error() {
        return Some(format!("libibverbs.so.1 cannot be loaded: {e} (install rdma-core's libibverbs1)"));
    }
    let list = match DeviceList::get() {
        Ok(l) => l,
        Err(why) => return Some(why),
    };
    if list.is_empty() {
        return Some("no RDMA devices (ibv_get_device_list found none)".to_string());
    }
    let ports = list_ports(&list);
    if !ports.iter().any(|p| p.active) {
        let seen: Vec<String> = ports.iter().map(|p| format!("{} {}", p.label(), p.state)).collect();
        return Some(format!(
            "no active RDMA port ({})",
            if seen.is_empty() { "none found".to_string() } else { seen.join(", ") }
        ));
    }
    None
}

/// Every port of every device, with its state and the device's PCI path. A device that
/// cannot be opened or queried is left out with a WARN.
fn list_ports(list: &DeviceList) -> Vec<PortCandidate> {
    let mut out = Vec::new();
    for i in 0..list.len() {
        let name = list.name(i);
        let ctx = match sys::OpenContext::open(list.device(i), &name) {
            Ok(c) => c,
            Err(e) => {
                log::warn!("{e}; device skipped");
                continue;
            }
        };
        let nports = match sys::query_device(ctx.0, &name) {
            Ok(a) => a.orig_attr.phys_port_cnt,
            Err(e) => {
                log::warn!("{e}; device skipped");
                continue;
            }
        };
        let pci_path = props::pci_path(&name);
        for port in 1..=nports {
            match sys::query_port(ctx.0, &name, port) {
                Ok(a) => out.push(PortCandidate {
                    device: name.clone(),
                    port,
                    active: a.state == sys::PORT_ACTIVE,
                    state: sys::port_state_str(a.state),
                    pci_path: pci_path.clone(),
                }),
                Err(e) => log::warn!("{e}; port skipped"),
            }
        }
    }
    out
}

fn spec_text(s: &HcaSpec) -> String {
    match s.port {
        Some(p) => format!("{}:{p}", s.device),
        None => s.device.clone(),
    }
}

/// The rail pairs NCCL's devices are made of, from `MPIB_HCA_SOUT`/`MPIB_HCA_SUP` or paired
/// automatically (see `pairing`), each port opened once (a port in several pairs, or both
/// rails on one port, share one [`VerbsDevice`]). `cfg.gid_index` applies to every port.
///
/// Errors: verbs unavailable ([`unavailable_reason`]'s text), a named device or port that
/// does not exist, a port that cannot be opened, or no pair left after down ports were
/// skipped (each skip is a WARN).
pub fn open_rail_pairs(cfg: &Config) -> Result<Vec<RailPair<VerbsDevice>>> {
    if let Some(why) = unavailable_reason() {
        return Err(Error::system(format!("the verbs fabric cannot be used: {why}")));
    }
    let ports = list_ports(&DeviceList::get().map_err(Error::system)?);
    let mut opened: HashMap<usize, Arc<VerbsDevice>> = HashMap::new();
    let open = |i: usize| -> Result<Arc<VerbsDevice>> {
        let p = &ports[i];
        Ok(Arc::new(VerbsDevice::open(&p.device, Some(p.port), cfg.gid_index)?))
    };
    let pairs: Vec<(usize, usize)> = if cfg.hca_sout.is_empty() {
        let mut usable = ports.clone();
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
