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
//! cq  cq_tests  srq
//!             VerbsCq (plain and extended, timestamps; its tests), VerbsSrq (generic WQEs)
//! ctx         Ctx: the opened context and PD every object holds alive
//! route       the address vector a QP reaches its peer with (RoCE, IB, routed IB)
//! events  gid  pkey  qp_info
//!             the async-event thread and the port/device health it records; the RoCE
//!             GID choice (and its re-reading when the table changes); the P_Key index;
//!             a QP's connection info bytes
//! props  wr_pool  sys
//!             leaves: sysfs and speed tables, WR pools, the libibverbs calls and errors
//! memlock     the locked-memory limit an ENOMEM names
//! ```

mod cq;
mod ctx;
mod device;
mod events;
mod gid;
pub mod memlock;
mod pkey;
mod props;
mod qp;
mod qp_info;
mod route;
mod srq;
mod sys;
mod wr_pool;

pub use cq::{TsClock, UNEXPECTED_OPCODE, VerbsCq, wc_status_str};
pub use device::{VerbsDevice, VerbsMr, VerbsOptions};
pub use gid::{AddrFamily, AddrRange, GidRule, GidType, format_gid};
pub use qp::{QpAttrs, VerbsQp};
pub use srq::VerbsSrq;
pub use sys::relaxed_ordering_available;
pub use wr_pool::MAX_CHAIN;

use sys::DeviceList;

/// Whether verbs can be used on this host.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Availability {
    /// At least one port is active.
    Usable,
    /// The host has no RDMA: libibverbs cannot be loaded, the kernel has no RDMA support,
    /// or there is no device. Why, in words.
    Absent(String),
    /// The host has RDMA devices, and none can be used: the list cannot be read, no port is
    /// active, or every device failed to open (each such failure was WARNed with the call
    /// and errno). Why, in words.
    Broken(String),
}

/// Whether verbs can be used on this host (see [`Availability`]). `MPIB_FABRIC=auto` uses
/// the soft fabric only when `Absent` (said at INFO); `Broken` fails `init` with a WARN.
pub fn availability() -> Availability {
    if let Some(e) = sys::libibverbs_load_error() {
        return Availability::Absent(format!(
            "libibverbs.so.1 cannot be loaded: {e} (install rdma-core's libibverbs1)"
        ));
    }
    let list = match DeviceList::get() {
        Ok(l) => l,
        // No uverbs in the kernel is "no RDMA here"; any other failure of the list is not.
        Err((libc::ENOSYS, why)) => return Availability::Absent(why),
        Err((_, why)) => return Availability::Broken(why),
    };
    if list.is_empty() {
        return Availability::Absent("no RDMA devices (ibv_get_device_list found none)".to_string());
    }
    let ports = list_ports(&list);
    if !ports.iter().any(|p| p.active) {
        let seen: Vec<String> = ports.iter().map(|p| format!("{} {}", p.label(), p.state)).collect();
        return Availability::Broken(format!(
            "no active RDMA port on {} ({})",
            list.names().join(", "),
            if seen.is_empty() { "no device could be opened and queried".to_string() } else { seen.join(", ") }
        ));
    }
    Availability::Usable
}

/// Why verbs cannot be used on this host, or `None` when at least one port is active
/// ([`availability`] in one line).
pub fn unavailable_reason() -> Option<String> {
    match availability() {
        Availability::Usable => None,
        Availability::Absent(why) | Availability::Broken(why) => Some(why),
    }
}

/// What fork safety libibverbs gives this process.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum ForkSafety {
    /// `ibv_fork_init` succeeded: registered pages are kept out of fork children.
    Enabled,
    /// The kernel copies registered pages on fork (Linux ≥ 5.13 with rdma-core ≥ 35):
    /// nothing to do.
    Unneeded,
    /// `ibv_fork_init` failed with this errno (EOPNOTSUPP: no libibverbs).
    Failed(i32),
}

impl std::fmt::Display for ForkSafety {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            ForkSafety::Enabled => write!(f, "ibv_fork_init done"),
            ForkSafety::Unneeded => write!(f, "not needed (kernel copy-on-fork)"),
            ForkSafety::Failed(e) => write!(f, "ibv_fork_init failed: {}", sys::strerror(*e)),
        }
    }
}

/// Calls `ibv_fork_init()` once per process, before any other verb, as net_ib does
/// (`ncclIbInitDevices` calls it unconditionally under its lock before listing devices):
/// a process that forks (Python data loaders) must not have its registered pages
/// copied-on-write under the NIC. Later calls return the first call's outcome.
pub fn fork_init() -> ForkSafety {
    static ONCE: std::sync::OnceLock<ForkSafety> = std::sync::OnceLock::new();
    *ONCE.get_or_init(|| {
        // SAFETY: no arguments; libibverbs' own locking makes it safe at any time, and it
        // is called before this process registers any memory (it fails with EINVAL after).
        let ret = unsafe { rdma_mummy_sys::ibv_fork_init() };
        if ret != 0 {
            return ForkSafety::Failed(sys::ret_errno(ret));
        }
        // SAFETY: no arguments; reads libibverbs' state.
        match unsafe { rdma_mummy_sys::ibv_is_fork_initialized() } {
            rdma_mummy_sys::IBV_FORK_UNNEEDED => ForkSafety::Unneeded,
            _ => ForkSafety::Enabled,
        }
    })
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
    Ok(list_ports(&DeviceList::get().map_err(|(_, why)| why)?))
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

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn symbol_lookup_in_the_loaded_libibverbs() {
        // The stub loaded libibverbs (or failed to) when the library was loaded.
        assert!(!sys::libibverbs_has(c"ibv_no_such_verb"), "a made-up verb is never found");
        if sys::libibverbs_load_error().is_none() {
            assert!(sys::libibverbs_has(c"ibv_get_device_list"), "every libibverbs has it");
        }
        // Whatever this host's rdma-core, the answer and the banner agree with the lookup.
        assert_eq!(relaxed_ordering_available(), sys::libibverbs_has(c"ibv_reg_mr_iova2"));
    }

    #[test]
    fn fork_init_runs_once_and_says_what_it_did() {
        let first = fork_init();
        assert_eq!(fork_init(), first, "later calls return the first outcome");
        let text = first.to_string();
        assert!(text.starts_with("ibv_fork_init") || text.starts_with("not needed"), "{text}");
    }
}
