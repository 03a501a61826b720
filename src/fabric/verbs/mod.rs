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
//! logs it. [`ports`] says what the host has; which ports become which rails is the
//! plugin's business (`plugin/discover`). See `gid` for the RoCE GID choice.
//!
//! # Layout
//!
//! Each file imports only files listed below it (no circles); read top-down:
//!
//! ```text
//! device      VerbsDevice (open, probe, reg_mr, the object factories), VerbsOptions
//! qp          VerbsQp: RC QP, INIT → RTR → RTS, chained posts
//! cq  srq     VerbsCq (plain and extended, timestamps), VerbsSrq (generic WQEs)
//! ctx         Ctx: the opened context and PD every object holds alive
//! events  gid  qp_info
//!             the async-event thread and the port/device health it records; the RoCE
//!             GID choice; a QP's connection info bytes
//! props  wr_pool  sys
//!             leaves: sysfs and speed tables, WR pools, the libibverbs calls and errors
//! ```

mod cq;
mod ctx;
mod device;
mod events;
mod gid;
mod props;
mod qp;
mod qp_info;
mod srq;
mod sys;
mod wr_pool;

pub use cq::{TsClock, UNEXPECTED_OPCODE, VerbsCq, wc_status_str};
pub use device::{VerbsDevice, VerbsMr, VerbsOptions};
pub use qp::VerbsQp;
pub use srq::VerbsSrq;
pub use wr_pool::MAX_CHAIN;

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

/// A port found on the host.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct HostPort {
    pub device: String,
    pub port: u8,
    pub active: bool,
    /// The port state as libibverbs names it (for the WARN about a down port).
    pub state: &'static str,
    pub pci_path: Option<String>,
}

impl HostPort {
    pub fn label(&self) -> String {
        format!("{}:{}", self.device, self.port)
    }
}

/// Every port of every device on the host, with its state and the device's PCI path.
pub fn ports() -> std::result::Result<Vec<HostPort>, String> {
    if let Some(e) = sys::libibverbs_load_error() {
        return Err(format!("libibverbs.so.1 cannot be loaded: {e} (install rdma-core's libibverbs1)"));
    }
    Ok(list_ports(&DeviceList::get()?))
}

/// Every port of every device, with its state and the device's PCI path. A device that
/// cannot be opened or queried is left out with a WARN.
fn list_ports(list: &DeviceList) -> Vec<HostPort> {
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
                Ok(a) => out.push(HostPort {
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
