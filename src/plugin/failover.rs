//! Rail failover in the plugin: the engine's rounds (its control messages, replays and CTS
//! re-posts posted, its fences performed on the fabric and answered, its re-admission
//! actions handed to `readmit.rs`), the port-down events fed in, and the soft fabric's fault
//! drill (`MPIB_FAULT_RAIL`). The control ring's place in a comm's region is `region.rs`'s.
//!
//! Nothing here runs on a data path that completes: a comm enters a round only from a
//! call that did not complete a request (`test` not done, `isend`/`irecv` answering "not
//! now") and only when the engine's timer is due, it has failover work, the peer's next
//! control message is in place (one load, one compare), or a port went down.

use std::sync::Arc;

use super::driven::Driven;
use super::oob::OobConn;
use super::place::ConnPlace;
use super::rail::Rail;
use super::readmit::{READMIT_MAX_QPS, Readmission};
use super::region::SCRATCH_BYTES;
use crate::engine::RailMask;
use crate::engine::failover::{CTL_ENTRY_BYTES, CTL_RING_BYTES, CTL_WORDS};
use crate::engine::{Action, Event, FailoverConfig, Output, RAIL_NAMES, RAILS, RailState};
use crate::error::{Error, Result};
use crate::fabric::mem::HostRegion;
use crate::fabric::{Completion, Device, FaultKind, QueuePair};

/// The engine's failover settings for a comm whose region starts at `region_addr` (its
/// control ring at `ctl_off`, registered with `lkeys`) and whose peer's scratch words are
/// at `peer_scratch` (its control ring follows them, under `peer_rkeys`). `qps`: the data
/// QPs of each rail, whose re-admission records always fit a control entry
/// ([`READMIT_MAX_QPS`]: the configuration's and the set-up's bound).
pub fn failover_config(
    cfg: &crate::config::Config,
    qps: [u16; RAILS],
    region_addr: u64,
    ctl_off: usize,
    lkeys: [u32; RAILS],
    peer_scratch: u64,
    peer_rkeys: [u32; RAILS],
) -> FailoverConfig {
    debug_assert!(qps.iter().all(|&n| n <= READMIT_MAX_QPS), "{qps:?} QPs per rail: more than set-up accepts");
    FailoverConfig {
        readmit_ns: cfg.readmit_ms * 1_000_000,
        readmit_max_ns: cfg.readmit_max_ms * 1_000_000,
        enabled: cfg.failover,
        stall_ns: cfg.stall_ms * 1_000_000,
        silence: true,
        silent_floor_ns: 0,
        ctl_out_addr: region_addr + (ctl_off + CTL_RING_BYTES) as u64,
        ctl_out_lkeys: lkeys,
        ctl_ring_addr: peer_scratch + SCRATCH_BYTES as u64,
        ctl_ring_rkeys: peer_rkeys,
        drill: None,
        outage_grace_ns: cfg.outage_grace_ms() * 1_000_000,
    }
}

/// A comm's share of failover in the plugin: the engine's output buffer (allocated once),
/// the port-down counts it has acted on, the fences under way and the re-admissions.
pub struct FoSide {
    pub(super) out: Output,
    /// Each rail's port-down count (`Device::port_downs`) this comm has acted on.
    pub(super) port_downs: [u64; RAILS],
    pub(super) failover: bool,
    /// Rails whose fence is under way: moved to the error state, FenceDone not answered yet.
    fencing: RailMask,
    readmit: Readmission,
    /// Where the connection is (`place.rs`): the engine's log lines and the comm's errors
    /// name it; refreshed when a rail's QPs are rebuilt or connected anew.
    pub place: Arc<ConnPlace>,
    /// The set-up channel, kept for the connection's life: the control messages of an
    /// outage (no rail works) go over it (`engine/failover/control.rs`). `None` once the peer closed
    /// its end.
    oob: Option<OobConn>,
    /// When a round looks at the set-up channel next while every rail works (the peer may
    /// be in an outage this side has not seen yet).
    oob_look_ns: u64,
}

/// While every rail works, a round reads the set-up channel at most this often.
const OOB_LOOK_NS: u64 = 100_000_000;

impl FoSide {
    /// `rails`: the comm's rails, whose ports' down counts start here (a port that went
    /// down before the comm existed is the set-up's business).
    /// `place`: where the connection is.
    /// `oob`: the connection's set-up channel (kept for outages).
    pub fn new<D: Device>(
        cfg: &crate::config::Config,
        rails: &[Rail<D>; RAILS],
        place: Arc<ConnPlace>,
        oob: OobConn,
    ) -> Box<FoSide> {
        let port_downs = std::array::from_fn(|r| rails[r].dev.port_downs().0);
        Box::new(FoSide {
            out: Output::default(),
            port_downs,
            failover: cfg.failover,
            fencing: RailMask::NONE,
            readmit: Readmission::at(place.clone()),
            place,
            oob: cfg.failover.then_some(oob),
            oob_look_ns: 0,
        })
    }

    /// Sends a control-ring entry over the set-up channel ([`Action::ControlOob`]). A
    /// channel that is gone is the peer gone: the grace runs out, or its close is seen.
    fn send_oob(&mut self, words: &[u64; CTL_WORDS]) {
        if let Some(c) = self.oob.as_mut() {
            let bytes: Vec<u8> = words.iter().flat_map(|w| w.to_le_bytes()).collect();
            c.send(&bytes);
            let _ = c.flush();
        }
    }

    /// Reads the set-up channel: every rail round while a rail is down here, else every
    /// [`OOB_LOOK_NS`]. Each control entry goes to `on`; the peer's close once, as
    /// [`Event::PeerGone`]. Whether anything came.
    fn poll_oob(&mut self, now: u64, rails_down: bool, mut on: impl FnMut(Event) -> Result<()>) -> Result<bool> {
        let Some(c) = self.oob.as_mut() else { return Ok(false) };
        if !rails_down && now < self.oob_look_ns {
            return Ok(false);
        }
        self.oob_look_ns = now + OOB_LOOK_NS;
        let mut got = false;
        loop {
            match c.poll() {
                Ok(None) => return Ok(got),
                Ok(Some(m)) => {
                    let Ok(bytes) = <[u8; CTL_ENTRY_BYTES]>::try_from(m.as_slice()) else {
                        return Err(Error::remote(format!(
                            "the peer sent a {}-byte message on the set-up channel; control entries are {CTL_ENTRY_BYTES}",
                            m.len()
                        )));
                    };
                    let words =
                        std::array::from_fn(|i| u64::from_le_bytes(bytes[i * 8..i * 8 + 8].try_into().expect("8")));
                    on(Event::ControlOob { words })?;
                    got = true;
                }
                Err(e) => {
                    log::debug!("failover: the set-up channel ended: {e}{}", self.place.at(0));
                    self.oob = None;
                    on(Event::PeerGone)?;
                    return Ok(true);
                }
            }
        }
    }

    /// Whether a rail's port went down since this comm last looked (two loads; verbs only
    /// ever moves them).
    #[inline(always)]
    pub(super) fn port_news<D: Device>(&self, rails: &[Rail<D>; RAILS]) -> bool {
        self.failover && (0..RAILS).any(|r| rails[r].dev.port_downs().0 != self.port_downs[r])
    }
}

/// Tells `on_event` of each rail whose port went down since `seen` (and is down still):
/// failover starts from the async event, before any WR times out.
pub(super) fn feed_port_downs<D: Device>(
    rails: &[Rail<D>; RAILS],
    seen: &mut [u64; RAILS],
    place: &ConnPlace,
    mut on_event: impl FnMut(Event) -> Result<()>,
) -> Result<()> {
    for (r, rail) in rails.iter().enumerate() {
        let (downs, down) = rail.dev.port_downs();
        if downs != seen[r] {
            seen[r] = downs;
            if down && rail.dev.fatal() {
                log::warn!(
                    "failover: the {} rail's device is gone (DEVICE_FATAL): failing the rail{}",
                    RAIL_NAMES[r],
                    place.at(r)
                );
                on_event(Event::DeviceFatal { rail: r })?;
            } else if down {
                log::warn!("failover: the {} rail's port is down (async event){}", RAIL_NAMES[r], place.at(r));
                on_event(Event::RailDown { rail: r })?;
            }
        }
    }
    Ok(())
}

/// Rounds one call may run back to back (a fence answered, then its report written).
pub(super) const MAX_ROUNDS: usize = 4;

/// Moves every QP of `rail` to the error state (the fence): its responders accept nothing
/// more. A QP that refuses is logged: the rail is being given up either way.
fn fence_rail<D: Device>(rail: &mut Rail<D>, idx: usize, place: &ConnPlace) {
    for qp in rail.qps.iter_mut().chain(rail.flush_qp.as_mut()) {
        if let Err(e) = qp.to_error() {
            log::warn!(
                "failover: moving QP {} of the {} rail to the error state: {e}{}",
                qp.qp_num(),
                RAIL_NAMES[idx],
                place.at(idx)
            );
        }
    }
}

/// Feeds `on` every completion of `rail` that is in, once its fence is final: the NIC's CQ
/// polled dry under its poll lock (after `fence_rail`, what the fabric delivered is in the
/// CQ or in this connection's inbox, and the inbox is filled only under that lock), then
/// the inbox. `Ok(false)`: not yet (a QP's error state is not final, or another thread
/// holds the NIC's poll lock: it is tried, never waited for); the next round asks again.
fn drain_rail<D: Device>(
    rail: &mut Rail<D>,
    idx: usize,
    mut on: impl FnMut(&Completion) -> Result<()>,
) -> Result<bool> {
    if !rail.qps.iter_mut().chain(rail.flush_qp.as_mut()).all(|q| q.fence_settled()) {
        return Ok(false);
    }
    let mut first = Ok(());
    {
        let Some(mut nic) = rail.nic.try_lock() else { return Ok(false) };
        nic.poll(rail.owner, (rail.first_qp, idx), |_, c| on(c))?;
    }
    rail.inbox.pop_each(|c| {
        if first.is_ok() {
            first = on(c);
        }
    });
    first.map(|()| true)
}

/// What follows the engine's `handle_timeout` in a round, the same for both comms: its
/// chains posted (a failed post breaks the connection), its actions performed on the rails
/// and answered (a fenced rail's completions fed in with `on_completion`), the re-admitted
/// QPs that are connecting polled. Whether an action was answered (another round is due).
pub(super) fn carry_out<D: Device, E: Driven>(
    now: u64,
    rails: &mut [Rail<D>; RAILS],
    fo: &mut FoSide,
    engine: &mut E,
    region: &HostRegion,
) -> Result<bool> {
    for c in &fo.out.chains {
        let r = rails[c.rail as usize].qp(c.qp).and_then(|qp| qp.post_send(c.wrs()));
        if let Err(e) = r {
            return Err(engine.fail(e));
        }
    }
    let mut acted = false;
    for i in 0..fo.out.actions.len() {
        let ev = match fo.out.actions[i] {
            Action::FenceQps { rail } => {
                fence_rail(&mut rails[rail], rail, &fo.place);
                fo.readmit.fenced(rail);
                fo.fencing = fo.fencing.with(rail);
                continue;
            }
            Action::RebuildQps { rail } => {
                let ev = fo.readmit.rebuild(&mut rails[rail], rail);
                fo.place.refresh(rail, &rails[rail]);
                ev
            }
            Action::ConnectQps { rail, records } => {
                let ev = fo.readmit.connect(&mut rails[rail], rail, &records);
                fo.place.refresh(rail, &rails[rail]);
                match ev {
                    Some(ev) => ev,
                    None => continue,
                }
            }
            Action::HangReport { slot, age_ns } => {
                engine.hang_report(now, &fo.place, slot, age_ns);
                continue;
            }
            Action::Drop { inject, refuse, kind, refuse_ms, isend } => {
                drop_rails(rails, fo, inject, refuse, kind, refuse_ms, isend);
                continue;
            }
            Action::ControlOob { words } => {
                fo.send_oob(&words);
                continue;
            }
        };
        engine.on_event(now, ev)?;
        acted = true;
    }
    // Fences whose error state is final and whose completions are all in are answered.
    for rail in fo.fencing.iter() {
        if drain_rail(&mut rails[rail], rail, |c| engine.on_completion(now, rail, c, region))? {
            fo.fencing = fo.fencing.without(rail);
            engine.on_event(now, Event::FenceDone { rail })?;
            acted = true;
        }
    }
    fo.readmit.poll_connecting(rails, |ev| engine.on_event(now, ev))?;
    let rails_down = engine.rail_states() != [RailState::Up; RAILS];
    acted |= fo.poll_oob(now, rails_down, |ev| engine.on_event(now, ev)).map_err(|e| engine.fail(e))?;
    Ok(acted)
}

/// The fault drill's drop (`MPIB_FAULT_RAIL`): every fault lives on this side's QPs of the
/// rail (the requester of the data WRs): a hook fires on the next matching WR, and what the
/// receiver must see (bytes without their IMM, an IMM whose ACK is lost, requests arriving
/// after its QP's error state) travels on the wire (soft fabric, `hook.rs`). A rail that is
/// not Up only has its refusal renewed.
fn drop_rails<D: Device>(
    rails: &mut [Rail<D>; RAILS],
    fo: &mut FoSide,
    inject: RailMask,
    refuse: RailMask,
    kind: FaultKind,
    refuse_ms: Option<u64>,
    isend: u64,
) {
    fo.readmit.refuse_for(refuse, refuse_ms);
    for r in refuse.iter() {
        if !inject.contains(r) {
            log::warn!("MPIB_FAULT_RAIL: the {} rail is not up at isend {isend}: it stays down", RAIL_NAMES[r]);
            continue;
        }
        let what = match kind {
            FaultKind::LinkLoss => "dropping",
            FaultKind::DropImm => "arming drop-imm (the next IMM lost, its bytes landed) on",
            FaultKind::DropAck => "arming drop-ack (the next ACK lost, its WR executed) on",
            FaultKind::HoldPastFence => "arming hold (requests held past the fence) on",
        };
        log::warn!("MPIB_FAULT_RAIL: {what} the {} rail's connections at isend {isend}", RAIL_NAMES[r]);
        for qp in rails[r].qps.iter_mut() {
            match qp.inject_fault(kind) {
                Ok(true) => {}
                Ok(false) => log::warn!("MPIB_FAULT_RAIL: this fabric cannot inject {kind:?} (soft, TCP)"),
                Err(e) => log::warn!("MPIB_FAULT_RAIL: {e}"),
            }
        }
    }
}
