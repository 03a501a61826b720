//! mpib's own exported functions (declared in `include/mpib.h`): counters and the devices'
//! rails for tools such as `mpib-perf` and the conformance suite. Every one is prefixed `mpib_`.
#![allow(non_camel_case_types)]

use super::PROCESS;
use std::ffi::{c_int, c_void};

use super::args::out;
use super::guard::run;
use super::stats::{c_string, prefix_len, write_prefix};
use crate::error::Error;
use crate::fabric::LinkLayer;
use crate::plugin::{self, AbiVersion};
use ncclnet_types::mpib::*;
use ncclnet_types::types::ncclResult_t;

impl From<&crate::engine::RailCounts> for mpib_rail_counters_t {
    fn from(x: &crate::engine::RailCounts) -> Self {
        mpib_rail_counters_t {
            wr_posted: x.wr_posted,
            doorbells: x.doorbells,
            bytes: x.bytes,
            imm_sent: x.imm_sent,
            cqe: x.cqe,
            rnr: x.rnr,
            zero_byte_imm: x.zero_byte_imm,
            probes: x.probes,
        }
    }
}

/// Copies the counters of send or receive comm `comm` into `out[0]` (SOUT) and `out[1]`
/// (SUP). Returns ncclSuccess, or ncclInvalidArgument for a bad handle or NULL `out`.
///
/// # Safety
/// `out` must be NULL or point to two writable `mpib_rail_counters_t`.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn mpib_comm_counters(comm: *mut c_void, out_: *mut mpib_rail_counters_t) -> ncclResult_t {
    super::logger::install();
    run("mpib_comm_counters", || {
        // SAFETY: the caller passes NULL (rejected) or room for two entries.
        let dst = unsafe { out(out_, "out") }?;
        let c = PROCESS.comm_counters(plugin::CommHandle(comm as usize as u64))?;
        *dst = (&c[0]).into();
        // SAFETY: the caller's array has two entries.
        unsafe { *out_.add(1) = (&c[1]).into() };
        Ok(())
    })
}

impl From<&plugin::RailDesc> for mpib_rail_info_t {
    fn from(r: &plugin::RailDesc) -> Self {
        let mut out = mpib_rail_info_t {
            port: r.port.into(),
            link_layer: match r.link_layer {
                LinkLayer::InfiniBand => MPIB_LINK_INFINIBAND,
                LinkLayer::Ethernet => MPIB_LINK_ETHERNET,
                LinkLayer::Tcp => MPIB_LINK_TCP,
            },
            speed_mbps: r.speed_mbps,
            speed_known: r.speed_known.into(),
            gid_index: r.gid.map_or(-1, |(i, _)| i.into()),
            lid: r.lid.unwrap_or(0).into(),
            gid: r.gid.map_or([0; 16], |(_, g)| g),
            ..mpib_rail_info_t::default()
        };
        c_string(&mut out.name, &r.name);
        c_string(&mut out.address, &r.addr);
        c_string(&mut out.pci_path, r.pci_path.as_deref().unwrap_or(""));
        out
    }
}

/// Writes the rails of device `dev`, as NCCL sees it through ABI `version` (6 … 12), to
/// `out[0]` (SOUT) and `out[1]` (SUP): through v6 – v8 device k is rail pair k; through v9+
/// a device is a rail pair, a pair's NIC that NCCL fuses with its partner (used alone it
/// carries both rails: the same NIC twice), or a device `makeVDevice` made.
///
/// `size` is `sizeof(mpib_rail_info_t)` as the caller was compiled: it is the stride of
/// `out`, and only the first `size` bytes of each entry are written. Returns ncclSuccess;
/// ncclInvalidArgument for a version other than 6 … 12, a device that does not exist, a
/// NULL `out` or a `size` below 8; ncclInvalidUsage before `init`.
///
/// # Safety
/// `out` must be NULL or point to `2 * size` writable bytes.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn mpib_device_rails(
    version: c_int,
    dev: c_int,
    out: *mut mpib_rail_info_t,
    size: usize,
) -> ncclResult_t {
    super::logger::install();
    run("mpib_device_rails", || {
        let n = prefix_len::<mpib_rail_info_t>(out.is_null(), size, "mpib_rail_info_t")?;
        let abi = AbiVersion::from_number(version)
            .ok_or_else(|| Error::invalid_argument(format!("ABI version {version}: 6 … 12")))?;
        let rails = PROCESS.device_rails(abi, dev)?;
        for (i, r) in rails.iter().enumerate() {
            // SAFETY: the caller gives 2 × `size` writable bytes at `out`, so
            // `[i·size, i·size + n)` (n ≤ size) lies inside them.
            unsafe { write_prefix(&mpib_rail_info_t::from(r), out.cast::<u8>().add(i * size), n) };
        }
        Ok(())
    })
}
