//! NCCL's profiler callback (`init`'s `ncclProfilerCallback_t`, v10+) as the plugin's
//! [`ProfilerSink`]: each event's data becomes a `mpib_profiler_descr_v1_t` (declared in
//! `include/mpib.h`) under plugin id `MPIB_PROFILER_NET_TYPE | MPIB_PROFILER_NET_MPIB_VER`,
//! as NCCL's IB transport reports its `ncclProfilerNetIbDescr_v1_t`.
//!
//! The callback cannot break the data path: what it returns is not NCCL's business (an
//! error is noted once in the log, the transfer goes on), and each event it started gets
//! its stop whatever it answered.

use std::ffi::{c_int, c_void};
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};

use ncclnet_types::mpib::{
    MPIB_PROFILE_RECV, MPIB_PROFILE_REPLAY, MPIB_PROFILE_SEND_PART, MPIB_PROFILER_NET_MPIB_VER, MPIB_PROFILER_NET_TYPE,
    MPIB_PROFILER_RAIL_UNKNOWN, mpib_profiler_descr_v1_t,
};
use ncclnet_types::result;
use ncclnet_types::types::{ncclProfilerCallback_t, ncclResult_t};

use crate::plugin::profile::{EventKind, PartEvent, ProfilerSink, Sink};

/// `ncclProfilerCallback_t`'s `type` (NCCL's `nccl_common.h`; not in `include/mpib.h`, where
/// it would clash with NCCL's own enum): an event starts, an event stops.
const EVENT_START: c_int = 0;
const EVENT_STOP: c_int = 1;

/// The plugin id of every mpib event: its network type and descriptor version.
pub const PLUGIN_ID: i64 = MPIB_PROFILER_NET_TYPE | MPIB_PROFILER_NET_MPIB_VER;

type Callback = unsafe extern "C" fn(*mut *mut c_void, c_int, *mut c_void, i64, *mut c_void) -> ncclResult_t;

struct NcclProfiler {
    f: Callback,
    /// An error from the callback was logged (once: it is not the transfer's failure).
    warned: AtomicBool,
}

/// The sink of NCCL's callback; `None` when NCCL gave none (NULL).
pub fn sink(cb: ncclProfilerCallback_t) -> Option<Sink> {
    cb.map(|f| Arc::new(NcclProfiler { f, warned: AtomicBool::new(false) }) as Sink)
}

/// The descriptor of `ev`.
pub fn descriptor(ev: &PartEvent) -> mpib_profiler_descr_v1_t {
    mpib_profiler_descr_v1_t {
        r#type: match ev.kind {
            EventKind::SendPart => MPIB_PROFILE_SEND_PART,
            EventKind::Replay => MPIB_PROFILE_REPLAY,
            EventKind::Recv => MPIB_PROFILE_RECV,
        },
        rail: ev.rail.map_or(MPIB_PROFILER_RAIL_UNKNOWN, |r| r as u8),
        device: ev.device,
        qp_num: ev.qp_num,
        slot: ev.slot,
        length: ev.length,
        size: ev.size,
        rail_bytes: ev.rail_bytes,
    }
}

impl NcclProfiler {
    fn check(&self, what: &str, rc: ncclResult_t) {
        if rc != result::SUCCESS && !self.warned.swap(true, Ordering::Relaxed) {
            log::info!(
                "NCCL's profiler callback returned {} for an event {what} (ignored: the transfer goes on; said once)",
                result::name(rc)
            );
        }
    }
}

impl ProfilerSink for NcclProfiler {
    fn start(&self, phandle: usize, ev: &PartEvent) -> usize {
        let mut d = descriptor(ev);
        let mut h: *mut c_void = std::ptr::null_mut();
        // SAFETY: NCCL's callback, as its IB transport calls it: an event handle to set, the
        // profiler handle NCCL gave isend/irecv (never NULL here), a descriptor it reads
        // during the call.
        let rc = unsafe { (self.f)(&mut h, EVENT_START, phandle as *mut c_void, PLUGIN_ID, (&raw mut d).cast()) };
        self.check("start", rc);
        h as usize
    }

    fn stop(&self, event: usize) {
        let mut h = event as *mut c_void;
        // SAFETY: as `start`; a stop names the event by the handle its start set (NULL when
        // the profiler did not take it, which NCCL's stop accepts, as from its IB transport).
        let rc = unsafe { (self.f)(&mut h, EVENT_STOP, std::ptr::null_mut(), 0, std::ptr::null_mut()) };
        self.check("stop", rc);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_plugin_id_carries_mpibs_type_in_nccls_type_field_and_the_version_below() {
        const TYPE_MASK: i64 = (!0u32 << 16) as i64;
        const VER_MASK: i64 = (!0u32 >> 16) as i64;
        assert_eq!(PLUGIN_ID & TYPE_MASK, MPIB_PROFILER_NET_TYPE);
        assert_eq!(PLUGIN_ID & VER_MASK, 1);
        for nccl in [1i64 << 16, 2 << 16] {
            assert_ne!(PLUGIN_ID & TYPE_MASK, nccl, "not NCCL's IB or socket type");
        }
    }

    #[test]
    fn the_descriptor_has_its_c_layout() {
        use std::mem::{offset_of, size_of};
        assert_eq!(size_of::<mpib_profiler_descr_v1_t>(), 48);
        assert_eq!(offset_of!(mpib_profiler_descr_v1_t, device), 4);
        assert_eq!(offset_of!(mpib_profiler_descr_v1_t, length), 16);
        assert_eq!(offset_of!(mpib_profiler_descr_v1_t, rail_bytes), 32);
        let ev = PartEvent {
            kind: EventKind::Recv,
            device: 3,
            rail: None,
            qp_num: 9,
            slot: 4,
            length: 10,
            size: 10,
            rail_bytes: [0, 0],
        };
        let d = descriptor(&ev);
        assert_eq!((d.r#type, d.rail, d.device, d.qp_num), (MPIB_PROFILE_RECV, MPIB_PROFILER_RAIL_UNKNOWN, 3, 9));
    }
}
