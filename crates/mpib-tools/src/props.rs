//! `getProperties` of every ABI version as one struct. Fields a version does not have are
//! `None` (NCCL synthesises defaults for them; a test wants to know what the plugin said).

use std::ffi::{CStr, c_char};

use ncclnet_types::types::*;

/// A device's properties, as the plugin reported them through one ABI version.
#[derive(Clone, Debug, PartialEq)]
pub struct Props {
    pub name: String,
    pub pci_path: Option<String>,
    pub guid: u64,
    pub ptr_support: i32,
    pub speed_mbps: i32,
    pub port: i32,
    pub latency_us: f32,
    pub max_comms: i32,
    pub max_recvs: i32,
    /// v7+.
    pub net_device_type: Option<i32>,
    pub net_device_version: Option<i32>,
    /// v8+.
    pub reg_is_global: Option<bool>,
    /// v9+.
    pub force_flush: Option<bool>,
    /// v9+: the physical devices fused into this one.
    pub vdevs: Option<Vec<i32>>,
    pub max_p2p_bytes: Option<usize>,
    pub max_coll_bytes: Option<usize>,
    /// v11+.
    pub max_multi_request_size: Option<i32>,
    /// v12.
    pub rail_id: Option<i16>,
    pub plane_id: Option<i16>,
}

fn string(p: *const c_char) -> Option<String> {
    // SAFETY: the plugin returns NULL or a NUL-terminated string it keeps alive (NCCL
    // holds these pointers for the process lifetime).
    (!p.is_null()).then(|| unsafe { CStr::from_ptr(p) }.to_string_lossy().into_owned())
}

fn vdevs(ndevs: i32, devs: &[i32]) -> Vec<i32> {
    devs[..(ndevs.max(0) as usize).min(devs.len())].to_vec()
}

/// The fields every version has.
macro_rules! base {
    ($p:expr) => {
        Props {
            name: string($p.name).unwrap_or_default(),
            pci_path: string($p.pciPath),
            guid: $p.guid,
            ptr_support: $p.ptrSupport,
            speed_mbps: $p.speed,
            port: $p.port,
            latency_us: $p.latency,
            max_comms: $p.maxComms,
            max_recvs: $p.maxRecvs,
            net_device_type: None,
            net_device_version: None,
            reg_is_global: None,
            force_flush: None,
            vdevs: None,
            max_p2p_bytes: None,
            max_coll_bytes: None,
            max_multi_request_size: None,
            rail_id: None,
            plane_id: None,
        }
    };
}

impl From<&ncclNetProperties_v6_t> for Props {
    fn from(p: &ncclNetProperties_v6_t) -> Props {
        base!(p)
    }
}

/// v7+ adds the device-offload type; v8+ `regIsGlobal`; v9+ `forceFlush`, the fused
/// devices and the size limits.
macro_rules! v7 {
    ($p:expr) => {
        Props { net_device_type: Some($p.netDeviceType), net_device_version: Some($p.netDeviceVersion), ..base!($p) }
    };
}
macro_rules! v9 {
    ($p:expr) => {
        Props {
            reg_is_global: Some($p.regIsGlobal != 0),
            force_flush: Some($p.forceFlush != 0),
            vdevs: Some(vdevs($p.vProps.ndevs, &$p.vProps.devs)),
            max_p2p_bytes: Some($p.maxP2pBytes),
            max_coll_bytes: Some($p.maxCollBytes),
            ..v7!($p)
        }
    };
}

impl From<&ncclNetProperties_v7_t> for Props {
    fn from(p: &ncclNetProperties_v7_t) -> Props {
        v7!(p)
    }
}

impl From<&ncclNetProperties_v8_t> for Props {
    fn from(p: &ncclNetProperties_v8_t) -> Props {
        Props { reg_is_global: Some(p.regIsGlobal != 0), ..v7!(p) }
    }
}

impl From<&ncclNetProperties_v9_t> for Props {
    fn from(p: &ncclNetProperties_v9_t) -> Props {
        v9!(p)
    }
}

impl From<&ncclNetProperties_v11_t> for Props {
    fn from(p: &ncclNetProperties_v11_t) -> Props {
        Props { max_multi_request_size: Some(p.maxMultiRequestSize), ..v9!(p) }
    }
}

impl From<&ncclNetProperties_v12_t> for Props {
    fn from(p: &ncclNetProperties_v12_t) -> Props {
        Props {
            max_multi_request_size: Some(p.maxMultiRequestSize),
            rail_id: Some(p.railId),
            plane_id: Some(p.planeId),
            ..v9!(p)
        }
    }
}
