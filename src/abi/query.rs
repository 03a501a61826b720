//! mpib's own exported functions (declared in `include/mpib.h`): counters for tools such
//! as `mpib-perf` and the conformance suite. Every one is prefixed `mpib_`.
#![allow(non_camel_case_types)]

use std::ffi::c_void;

use super::args::out;
use super::guard::run;
use crate::plugin;
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
        let c = plugin::comm_counters(plugin::CommHandle(comm as usize as u64))?;
        *dst = (&c[0]).into();
        // SAFETY: the caller's array has two entries.
        unsafe { *out_.add(1) = (&c[1]).into() };
        Ok(())
    })
}
