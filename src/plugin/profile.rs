//! NCCL profiler events (ncclNet v10+): when NCCL gives `init` a profiler callback, each
//! connection of that context reports its requests' work on each rail, as NCCL's IB
//! transport reports its QPs' work.
//!
//! - A send: one event per rail that carries bytes of it (one on the rail of its IMM for an
//!   empty send), started when the slot's chains are posted, stopped when that rail's
//!   signalled WRITE_WITH_IMM completed. A part whose rail failed stops there and a replay
//!   event runs on the other rail until the replay completed (rail failover).
//! - A receive: one event per buffer, from its CTS posted to its completion.
//! - Every event started is stopped exactly once: what is still open when the connection
//!   closes (a failed connection, requests never tested) is stopped then.
//!
//! The engine does nothing for this: the comm reads what the engine already records (the
//! posted slot's split, whether a rail's part is outstanding: `engine/send/profile.rs`) in
//! a branch taken only when a callback was given, and calls the [`ProfilerSink`] the ABI
//! edge made of NCCL's callback. A comm without one pays that single branch per call.
//!
//! Events are reported only for requests NCCL gave a profiler handle (NCCL dereferences it).
//!
//! Here: the sink and the comms' records of open events; the comms' `profile_*` calls are in
//! `comm_profile.rs`.

use std::sync::Arc;

use crate::engine::layout::{MAX_RECVS, SLOTS};
use crate::engine::{PartState, RAILS, SOUT, SUP, SlotView};

/// What a profiler event reports.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum EventKind {
    /// One rail's part of a send.
    SendPart,
    /// A send's part re-sent on the other rail after its own rail failed.
    Replay,
    /// One receive buffer.
    Recv,
}

/// One event's data (the ABI edge turns it into `mpib_profiler_descr_v1_t`).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct PartEvent {
    pub kind: EventKind,
    /// NCCL's device index of the connection.
    pub device: i32,
    /// The rail (SOUT, SUP); `None` when not known.
    pub rail: Option<usize>,
    /// The QP it was posted on; 0 when not known.
    pub qp_num: u32,
    pub slot: u32,
    /// This part's bytes, the request's bytes, and the request's bytes per rail (the split;
    /// zeros for a receive, whose split the sender decides).
    pub length: u64,
    pub size: u64,
    pub rail_bytes: [u64; RAILS],
}

/// Where a context's profiler events go: NCCL's callback, at the ABI edge.
pub trait ProfilerSink: Send + Sync {
    /// Starts an event of the request NCCL gave profiler handle `phandle` (never 0); returns
    /// the event's handle, for [`Self::stop`] (what the profiler made of it, 0 if nothing).
    fn start(&self, phandle: usize, ev: &PartEvent) -> usize;
    /// Stops the event `start` returned `event` for.
    fn stop(&self, event: usize);
}

pub type Sink = Arc<dyn ProfilerSink>;

/// A send's part whose event is open.
#[derive(Clone, Copy, Debug)]
struct OpenPart {
    /// The slot's use it belongs to, and the rail of the part (a replay's event runs on the
    /// other rail).
    slot: usize,
    seq: u64,
    rail: usize,
    replay: bool,
    event: usize,
    phandle: usize,
    ev: PartEvent,
}

/// A send comm's events.
pub struct SendProfile {
    sink: Sink,
    device: i32,
    /// The profiler handle NCCL gave each send request still in flight (by request id).
    phandles: Box<[usize]>,
    /// Open events (kept at their capacity: no allocation once made).
    open: Vec<OpenPart>,
}

impl SendProfile {
    pub fn new(sink: Sink, device: i32, max_requests: usize) -> SendProfile {
        SendProfile {
            sink,
            device,
            phandles: vec![0; max_requests].into_boxed_slice(),
            // At most one event per (slot, send, rail) open at once.
            open: Vec::with_capacity(SLOTS * MAX_RECVS * RAILS),
        }
    }

    /// `isend` returned request `id` for NCCL's profiler handle `phandle`.
    pub fn on_isend(&mut self, id: u16, phandle: usize) {
        if let Some(p) = self.phandles.get_mut(id as usize) {
            *p = phandle;
        }
    }

    /// Slot `v` was posted, its chains on the QPs `qp_nums` (by rail): an event per rail
    /// carrying bytes of each of its sends (the IMM's rail for an empty one).
    pub fn on_posted(&mut self, v: &SlotView, qp_nums: [u32; RAILS]) {
        let lead = if v.rails.contains(SOUT) { SOUT } else { SUP };
        for p in &v.parts[..v.n] {
            let phandle = self.phandles.get(p.req as usize).copied().unwrap_or(0);
            if phandle == 0 {
                continue;
            }
            for rail in [SOUT, SUP] {
                let carries = p.on(rail) > 0 || p.size == 0 && rail == lead;
                if !carries || !v.rails.contains(rail) || self.open.len() == self.open.capacity() {
                    continue;
                }
                let ev = PartEvent {
                    kind: EventKind::SendPart,
                    device: self.device,
                    rail: Some(rail),
                    qp_num: qp_nums[rail],
                    slot: v.slot as u32,
                    length: p.on(rail),
                    size: p.size,
                    rail_bytes: [p.on(SOUT), p.on(SUP)],
                };
                let event = self.sink.start(phandle, &ev);
                self.open.push(OpenPart { slot: v.slot, seq: v.seq, rail, replay: false, event, phandle, ev });
            }
        }
    }

    /// Stops the events of parts that are done; the event of a part whose rail failed is
    /// stopped and its replay's started on the other rail. `state` is the engine's
    /// [`crate::engine::SendEngine::part_state`].
    pub fn sweep(&mut self, state: impl Fn(usize, u64, usize) -> PartState) {
        let mut i = 0;
        while i < self.open.len() {
            let o = self.open[i];
            match state(o.slot, o.seq, o.rail) {
                PartState::Outstanding => i += 1,
                PartState::Replaying if o.replay => i += 1,
                PartState::Replaying => {
                    self.sink.stop(o.event);
                    let other = 1 - o.rail;
                    let ev = PartEvent { kind: EventKind::Replay, rail: Some(other), qp_num: 0, ..o.ev };
                    let event = self.sink.start(o.phandle, &ev);
                    self.open[i] = OpenPart { replay: true, event, ev, ..o };
                    i += 1;
                }
                PartState::Done => {
                    self.sink.stop(o.event);
                    self.open.swap_remove(i);
                }
            }
        }
    }
}

impl Drop for SendProfile {
    /// The connection closes: what is still open stops (every start has its stop).
    fn drop(&mut self) {
        for o in self.open.drain(..) {
            self.sink.stop(o.event);
        }
    }
}

/// A receive comm's events.
pub struct RecvProfile {
    sink: Sink,
    device: i32,
    /// (request id, event) of every open event (kept at its capacity).
    open: Vec<(u16, usize)>,
}

impl RecvProfile {
    pub fn new(sink: Sink, device: i32) -> RecvProfile {
        RecvProfile { sink, device, open: Vec::with_capacity(SLOTS * MAX_RECVS) }
    }

    /// `irecv` returned request `id` for buffers of `sizes`, NCCL's profiler handle of
    /// buffer `i` being `phandle(i)`; its CTS went on `cts` (rail, QP number) if it was posted.
    pub fn on_irecv(&mut self, id: u16, sizes: &[u64], phandle: impl Fn(usize) -> usize, cts: Option<(usize, u32)>) {
        for (i, &size) in sizes.iter().enumerate() {
            let ph = phandle(i);
            if ph == 0 || self.open.len() == self.open.capacity() {
                continue;
            }
            let ev = PartEvent {
                kind: EventKind::Recv,
                device: self.device,
                rail: cts.map(|c| c.0),
                qp_num: cts.map_or(0, |c| c.1),
                slot: id as u32,
                length: size,
                size,
                rail_bytes: [0; RAILS],
            };
            let event = self.sink.start(ph, &ev);
            self.open.push((id, event));
        }
    }

    /// Request `id` completed: its events stop.
    pub fn on_done(&mut self, id: u16) {
        let mut i = 0;
        while i < self.open.len() {
            if self.open[i].0 == id {
                self.sink.stop(self.open[i].1);
                self.open.swap_remove(i);
            } else {
                i += 1;
            }
        }
    }
}

impl Drop for RecvProfile {
    fn drop(&mut self) {
        for (_, event) in self.open.drain(..) {
            self.sink.stop(event);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::engine::{RailMask, SentPart};
    use parking_lot::Mutex;

    /// One call: (start or stop, event handle, phandle, a start's event).
    type Call = (bool, usize, usize, Option<PartEvent>);

    /// Records the calls; the second field numbers the events.
    #[derive(Default)]
    struct Log(Mutex<Vec<Call>>, Mutex<usize>);

    impl ProfilerSink for Log {
        fn start(&self, phandle: usize, ev: &PartEvent) -> usize {
            let mut n = self.1.lock();
            *n += 1;
            self.0.lock().push((true, *n, phandle, Some(*ev)));
            *n
        }
        fn stop(&self, event: usize) {
            self.0.lock().push((false, event, 0, None));
        }
    }

    fn view(parts: &[SentPart], rails: RailMask) -> SlotView {
        let mut v = SlotView { slot: 3, seq: 7, rails, n: parts.len(), ..SlotView::default() };
        v.parts[..parts.len()].copy_from_slice(parts);
        v
    }

    #[test]
    fn a_split_send_starts_a_part_per_rail_and_a_failed_rails_part_becomes_a_replay() {
        let log = Arc::new(Log::default());
        let mut p = SendProfile::new(log.clone(), 2, 8);
        p.on_isend(0, 0x100);
        p.on_isend(1, 0x200);
        p.on_isend(2, 0); // NCCL gave no handle: no events
        let parts = [
            SentPart { req: 0, size: 1000, sout: 600 },
            SentPart { req: 1, size: 256, sout: 256 },
            SentPart { req: 2, size: 50, sout: 50 },
        ];
        p.on_posted(&view(&parts, RailMask::BOTH), [11, 22]);
        let starts: Vec<_> = log.0.lock().iter().map(|e| (e.2, e.3.unwrap().rail, e.3.unwrap().length)).collect();
        assert_eq!(starts, [(0x100, Some(0), 600), (0x100, Some(1), 400), (0x200, Some(0), 256)]);
        assert_eq!(log.0.lock()[1].3.unwrap().qp_num, 22);
        assert_eq!(log.0.lock()[1].3.unwrap().rail_bytes, [600, 400]);
        // SUP failed: its part is replayed on SOUT; SOUT's parts complete.
        p.sweep(|_, _, rail| if rail == SUP { PartState::Replaying } else { PartState::Outstanding });
        p.sweep(|_, _, rail| if rail == SUP { PartState::Replaying } else { PartState::Done });
        p.sweep(|_, _, _| PartState::Done);
        let l = log.0.lock();
        let stops: Vec<_> = l.iter().filter(|e| !e.0).map(|e| e.1).collect();
        assert_eq!(stops, [2, 1, 3, 4], "SUP's part stopped at the failover, then SOUT's, then the replay");
        let replay = l.iter().find(|e| e.1 == 4).unwrap();
        assert_eq!((replay.2, replay.3.unwrap().kind, replay.3.unwrap().rail), (0x100, EventKind::Replay, Some(0)));
        assert!(p.open.is_empty());
    }

    #[test]
    fn an_empty_send_has_one_event_on_its_imms_rail_and_a_close_stops_what_is_open() {
        let log = Arc::new(Log::default());
        let mut p = SendProfile::new(log.clone(), 0, 8);
        p.on_isend(5, 0x50);
        p.on_posted(&view(&[SentPart { req: 5, size: 0, sout: 0 }], RailMask::SUP), [1, 2]);
        let mut r = RecvProfile::new(log.clone(), 0);
        r.on_irecv(9, &[64, 128], |i| 0x900 + i, Some((SOUT, 7)));
        r.on_done(8);
        assert_eq!(log.0.lock().iter().filter(|e| !e.0).count(), 0, "another request's completion stops nothing");
        drop(p);
        drop(r);
        let l = log.0.lock();
        assert_eq!(l[0].3.unwrap().rail, Some(SUP));
        assert_eq!(l.iter().filter(|e| e.0).count(), 3);
        let mut stopped: Vec<_> = l.iter().filter(|e| !e.0).map(|e| e.1).collect();
        stopped.sort();
        assert_eq!(stopped, [1, 2, 3], "every start stopped once at close");
    }
}
