//! mpib's own exported functions (declared in `include/mpib.h`): counters for tools such
//! as `mpib-perf` and the conformance suite. Every one is prefixed `mpib_`.
#![allow(non_camel_case_types)]

use std::ffi::c_void;

use super::guard::{out, run};
use super::types::ncclResult_t;
use crate::plugin;

/// Per-rail counters of one connection (index 0 = SOUT, 1 = SUP).
#[repr(C)]
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct mpib_rail_counters_t {
    /// Send work requests posted (data, signalling, CTS, probes, flushes).
    pub wr_posted: u64,
    /// Post calls (one per chain).
    pub doorbells: u64,
    /// Payload bytes posted.
    pub bytes: u64,
    /// WRITE_WITH_IMM work requests posted.
    pub imm_sent: u64,
    /// Completions polled.
    pub cqe: u64,
    /// Receiver-not-ready waits (receive side).
    pub rnr: u64,
    /// IMMs posted on a rail that carried no bytes of a non-empty transfer (always 0).
    pub zero_byte_imm: u64,
    /// Idle-rail probes posted.
    pub probes: u64,
}

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
        let c = plugin::comm_counters(comm)?;
        *dst = (&c[0]).into();
        // SAFETY: the caller's array has two entries.
        unsafe { *out_.add(1) = (&c[1]).into() };
        Ok(())
    })
}
