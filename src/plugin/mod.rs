//! The one implementation behind every ABI version: the process's plugin (`process.rs`:
//! reference-counted `init`/`finalize`, the ncclNet calls), devices and their properties.
//!
//! Handles given to NCCL are opaque values checked on every call (see `handles.rs`), so a
//! bad or stale handle is a clear error, never a crash.

use std::ffi::CStr;

use crate::fabric::MemTypes;

pub mod accepting;
mod banner;
pub mod comm;
mod comm_profile;
pub mod context;
pub mod describe;
pub mod devices;
pub mod discover;
mod driven;
pub mod failover;
#[cfg(test)]
mod fake;
#[cfg(test)]
mod fake_tests;
pub mod handles;
mod hang;
pub mod inbox;
pub mod instance;
pub mod instance_state;
pub mod listen;
pub mod listen_handle;
mod memlock;
pub mod mr;
pub mod nic_pair;
pub mod nic_queues;
pub mod oob;
pub mod place;
pub mod process;
pub mod profile;
mod rail;
mod readmit;
pub mod region;
pub mod resources;
pub mod setup;
pub mod setup_msg;

pub use describe::RailDesc;
pub use handles::{CommHandle, ContextHandle, ListenHandle, MemHandle, RequestHandle};
pub use process::Process;

/// Most receives grouped in one `irecv` (`maxRecvs`).
pub const MAX_RECVS: usize = 8;
/// Size of the connection handle NCCL carries between the ranks (`NCCL_NET_HANDLE_MAXSIZE`).
pub const HANDLE_BYTES: usize = 128;

/// The ABI version a call came through. It decides the caller's limits (v6: 8 requests
/// in flight per comm, v7+: 32).
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord)]
pub enum AbiVersion {
    V6 = 6,
    V7 = 7,
    V8 = 8,
    V9 = 9,
    V10 = 10,
    V11 = 11,
    V12 = 12,
}

impl AbiVersion {
    /// The version numbered `v` (6 … 12).
    pub fn from_number(v: i32) -> Option<AbiVersion> {
        use AbiVersion::*;
        [V6, V7, V8, V9, V10, V11, V12].into_iter().find(|a| *a as i32 == v)
    }

    /// `NCCL_NET_MAX_REQUESTS` of the NCCL releases that use this version.
    pub fn max_requests(self) -> usize {
        if self == AbiVersion::V6 { 8 } else { 32 }
    }
}

/// A device's properties, one model for every version's struct.
#[derive(Clone, Copy, Debug)]
pub struct Properties {
    pub dev: i32,
    pub name: &'static CStr,
    pub pci_path: Option<&'static CStr>,
    pub guid: u64,
    /// Memory NCCL may register (the ABI edge turns it into `ptrSupport`).
    pub mem_types: MemTypes,
    pub reg_is_global: bool,
    pub force_flush: bool,
    pub speed_mbps: i32,
    pub port: i32,
    pub latency_us: f32,
    pub max_comms: i32,
    pub max_recvs: i32,
    pub max_p2p_bytes: usize,
    pub max_coll_bytes: usize,
    pub max_multi_request_size: i32,
    /// The NIC devices fused into this one (NCCL's `vProps`; itself when not fused).
    pub vdevs: nic_pair::VDevs,
    /// NCCL's `railId` / `planeId` (v12) when known.
    pub rail: Option<i16>,
    pub plane: Option<i16>,
}

/// An environment variable NCCL reads after `init` that the plugin wants set; the ABI edge
/// sets it where the user has not.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct NcclEnv {
    pub name: &'static str,
    pub value: String,
}

/// One buffer of an `irecv` or `iflush`: where, how large, its tag, its registration
/// (`None`: NCCL passed no handle, allowed for an empty buffer).
#[derive(Clone, Copy, Debug, Default)]
pub struct BufArg {
    pub addr: u64,
    pub size: usize,
    pub tag: i32,
    pub mh: Option<MemHandle>,
}
