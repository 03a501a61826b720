//! What the plugin tells people about its rails: each rail's NIC, link layer, address (GID
//! or LID; TCP address on the soft fabric) and speed, for the INFO banner (`banner.rs`) and
//! for tools through `mpib_device_rails` (`mpib-perf --list`).

use std::sync::Arc;

use super::nic_pair::Nic;
use crate::fabric::soft::SoftDevice;
use crate::fabric::verbs::{self, VerbsDevice};
use crate::fabric::{Device, LinkLayer};

/// One rail: the NIC (a port) it runs on.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct RailDesc {
    /// The device's name as users write it in `MPIB_HCA_*` (`mlx5_0`, `soft-sout`).
    pub name: String,
    pub port: u8,
    pub link_layer: LinkLayer,
    /// `GID 3 ::ffff:10.0.0.1`, `LID 0x5`, or a TCP address.
    pub addr: String,
    /// The GID the rail's queue pairs use, and its index (verbs).
    pub gid: Option<(u8, [u8; 16])>,
    /// The port's LID (InfiniBand).
    pub lid: Option<u16>,
    pub speed_mbps: u32,
    /// Whether the NIC reported `speed_mbps` (false: a nominal figure).
    pub speed_known: bool,
    /// Registrations use PCI relaxed ordering (verbs), `None` where that means nothing.
    pub relaxed_ordering: Option<bool>,
    /// sysfs PCI path of the NIC, if it has one.
    pub pci_path: Option<String>,
}

impl RailDesc {
    /// `device:port`.
    pub fn label(&self) -> String {
        format!("{}:{}", self.name, self.port)
    }

    /// `IB`, `RoCE` or `TCP`, as net_ib's banner names link layers.
    pub fn link(&self) -> &'static str {
        match self.link_layer {
            LinkLayer::InfiniBand => "IB",
            LinkLayer::Ethernet => "RoCE",
            LinkLayer::Tcp => "TCP",
        }
    }
}

/// A provider's devices, described.
pub trait Describe: Device {
    fn describe(&self) -> RailDesc;
}

/// The fields every provider fills alike.
fn base<D: Device>(d: &D, addr: String) -> RailDesc {
    let a = d.attrs();
    RailDesc {
        name: a.name.clone(),
        port: a.port,
        link_layer: a.link_layer,
        addr,
        gid: None,
        lid: None,
        speed_mbps: a.speed_mbps,
        speed_known: a.speed_known,
        relaxed_ordering: None,
        pci_path: a.pci_path.clone(),
    }
}

impl Describe for SoftDevice {
    fn describe(&self) -> RailDesc {
        base(self, self.local_addr().map_or("in-process".to_string(), |a| a.to_string()))
    }
}

impl Describe for VerbsDevice {
    fn describe(&self) -> RailDesc {
        let (gid, index) = (self.gid(), self.gid_index());
        let ib = self.attrs().link_layer == LinkLayer::InfiniBand;
        let version = match self.gid_type() {
            Some(verbs::GidType::RoceV2) => " (RoCE v2)",
            Some(verbs::GidType::IbRoceV1) => " (RoCE v1)",
            None => "",
        };
        let addr = if ib {
            format!("LID {:#x}", self.lid())
        } else {
            format!("GID {index} {}{version}", verbs::format_gid(&gid))
        };
        RailDesc {
            gid: Some((index, gid)),
            lid: ib.then(|| self.lid()),
            relaxed_ordering: Some(self.relaxed_ordering()),
            ..base(self, addr)
        }
    }
}

/// The rail on `nic`: its device described, with the PCI path discovery found for it
/// (where the device itself has none).
pub fn rail<D: Describe>(nic: &Arc<Nic<D>>) -> RailDesc {
    let mut r = nic.dev.describe();
    if let Some(p) = &nic.meta.pci_path {
        r.pci_path = Some(p.clone());
    }
    r
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::fabric::soft::{self, SoftOptions};

    #[test]
    fn a_soft_rail_names_its_tcp_address_and_a_nominal_speed() {
        let d = soft::open(&SoftOptions::tcp("soft-test", "127.0.0.1".parse().unwrap())).unwrap();
        let r = d.describe();
        assert_eq!((r.label(), r.link()), ("soft-test:1".to_string(), "TCP"));
        assert!(r.addr.starts_with("127.0.0.1:"), "{r:?}");
        assert_eq!((r.gid, r.lid, r.relaxed_ordering), (None, None, None));
        assert!(!r.speed_known, "loopback has no line rate: {r:?}");
        let inproc = soft::open(&SoftOptions::inproc("inproc-test", &soft::InprocNet::new())).unwrap().describe();
        assert_eq!(inproc.addr, "in-process");
    }
}
