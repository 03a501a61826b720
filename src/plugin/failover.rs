//! Rail failover in the plugin (DESIGN.md "Rail failover (issue 19)"): the control ring in
//! each comm's registered control region, the engine's failover rounds (its control
//! messages, replays and CTS re-posts posted, its fences performed on the fabric and
//! answered), and the soft fabric's fault drill (`MPIB_FAULT_RAIL`).
//!
//! Nothing here runs on a data path that completes: a comm enters a round only from a
//! call that did not complete a request (`test` not done, `isend`/`irecv` answering "not
//! now") and only when the engine has failover work due, the peer's next control message
//! is in place (one load, one compare), or the sender's stall check is due
//! (`MPIB_STALL_MS / 4`).
//!
//! Control region layout (both sides): after the scratch words, the control ring this
//! side's peer writes ([`CTL_RING_BYTES`]), then the local source of the messages this
//! side writes (as many bytes). The peer's ring is at its exchanged scratch address +
//! [`SCRATCH_BYTES`], under the rkeys exchanged with it: no set-up field is added.

use super::comm::{RECV_SCRATCH_OFF, Rail, RecvComm, RecvMem, SCRATCH_BYTES, SEND_SCRATCH_OFF, SendComm, SendMem};
use super::readmit::{READMIT_MAX_QPS, Refuse};
use crate::config::{FaultAt, FaultDrill};
use crate::engine::RailMask;
use crate::engine::failover::{CTL_ENTRY_BYTES, CTL_RING_BYTES, CTL_WORDS};
use crate::engine::{Action, CtlMemory, Event, FailoverConfig, FailoverPosts, RAIL_NAMES, RAILS, RailState};
use crate::engine::{RecvEngine, SendEngine};
use crate::error::{Error, Result};
use crate::fabric::{Completion, Device, FaultKind, QueuePair};

/// Offsets of the control ring (in) and of the outgoing messages' source in a send comm's
/// region, and the region's size.
pub const SEND_CTL_OFF: usize = SEND_SCRATCH_OFF + SCRATCH_BYTES;
pub const SEND_REGION_BYTES: usize = SEND_CTL_OFF + 2 * CTL_RING_BYTES;
/// The same in a receive comm's region.
pub const RECV_CTL_OFF: usize = RECV_SCRATCH_OFF + SCRATCH_BYTES;
pub const RECV_REGION_BYTES: usize = RECV_CTL_OFF + 2 * CTL_RING_BYTES;

/// The engine's failover settings for a comm whose region starts at `region_addr` (its
/// control ring at `ctl_off`, registered with `lkeys`) and whose peer's scratch words are
/// at `peer_scratch` (its control ring follows them, under `peer_rkeys`).
/// Re-admission is off where a rail has more QPs than its records can describe
/// ([`READMIT_MAX_QPS`]).
pub fn failover_config(
    cfg: &crate::config::Config,
    qps: [u16; RAILS],
    region_addr: u64,
    ctl_off: usize,
    lkeys: [u32; RAILS],
    peer_scratch: u64,
    peer_rkeys: [u32; RAILS],
) -> FailoverConfig {
    let readmit = qps.iter().all(|&n| n <= READMIT_MAX_QPS);
    if cfg.failover && !readmit {
        log::info!("rail re-admission is off for this connection: more than {READMIT_MAX_QPS} QPs on a rail");
    }
    FailoverConfig {
        readmit_ns: if readmit { cfg.readmit_ms * 1_000_000 } else { 0 },
        readmit_max_ns: cfg.readmit_max_ms * 1_000_000,
        enabled: cfg.failover,
        stall_ns: cfg.stall_ms * 1_000_000,
        ctl_out_addr: region_addr + (ctl_off + CTL_RING_BYTES) as u64,
        ctl_out_lkeys: lkeys,
        ctl_ring_addr: peer_scratch + SCRATCH_BYTES as u64,
        ctl_ring_rkeys: peer_rkeys,
    }
}

/// A comm's failover state in the plugin: the engine's output buffers (allocated once),
/// when the next periodic round is due, and the fault drill.
pub struct FoSide {
    out: FailoverPosts,
    /// Periodic rounds (the sender's stall check): every `period_ns` while a call waits
    /// (0 = none); `next_ns`: the next one, or the engine's timer (re-admission) if sooner.
    period_ns: u64,
    next_ns: u64,
    /// Fault drill (`MPIB_FAULT_RAIL`); isends so far; with a time, when the next drop is
    /// due (ns, set at the first isend) and drops so far; how long each rail refuses to
    /// come back.
    drill: Option<FaultDrill>,
    isends: u64,
    /// Each rail's port-down count (`Device::port_downs`) this comm has acted on.
    port_downs: [u64; RAILS],
    failover: bool,
    drill_next_ns: u64,
    drops: u64,
    pub(super) refuse: [Refuse; RAILS],
    /// Rails whose new QPs are connecting (re-admission, `plugin/readmit.rs`).
    pub(super) connecting: RailMask,
    /// Rails whose re-admission waits for their port to be active (logged once).
    pub(super) port_wait: RailMask,
}

impl FoSide {
    /// `rails`: the comm's rails, whose ports' down counts start here (a port that went
    /// down before the comm existed is the set-up's business).
    pub fn new<D: Device>(cfg: &crate::config::Config, sender: bool, rails: &[Rail<D>; RAILS]) -> Box<FoSide> {
        let period_ns = if sender && cfg.failover { cfg.stall_ms * 1_000_000 / 4 } else { 0 };
        let drill = if sender { cfg.fault_rail } else { None };
        let next_ns = if period_ns != 0 { 0 } else { u64::MAX };
        let port_downs = std::array::from_fn(|r| rails[r].dev.port_downs().0);
        Box::new(FoSide {
            out: FailoverPosts::default(),
            period_ns,
            next_ns,
            drill,
            isends: 0,
            port_downs,
            failover: cfg.failover,
            drill_next_ns: 0,
            drops: 0,
            refuse: [Refuse::No; RAILS],
            connecting: RailMask::NONE,
            port_wait: RailMask::NONE,
        })
    }

    /// Whether a rail's port went down since this comm last looked (two loads; verbs only
    /// ever moves them).
    #[inline(always)]
    fn port_news<D: Device>(&self, rails: &[Rail<D>; RAILS]) -> bool {
        self.failover && (0..RAILS).any(|r| rails[r].dev.port_downs().0 != self.port_downs[r])
    }

    /// Whether the periodic round is due at `now`.
    #[inline]
    pub(super) fn periodic(&self, now: u64) -> bool {
        now >= self.next_ns
    }
}

/// Tells `on_event` of each rail whose port went down since `seen` (and is down still):
/// failover starts from the async event, before any WR times out.
fn feed_port_downs<D: Device>(
    rails: &[Rail<D>; RAILS],
    seen: &mut [u64; RAILS],
    mut on_event: impl FnMut(Event) -> Result<()>,
) -> Result<()> {
    for (r, rail) in rails.iter().enumerate() {
        let (downs, down) = rail.dev.port_downs();
        if downs != seen[r] {
            seen[r] = downs;
            if down {
                log::warn!("failover: the {} rail's port is down (async event): failing the rail over", RAIL_NAMES[r]);
                on_event(Event::RailDown { rail: r })?;
            }
        }
    }
    Ok(())
}

macro_rules! ctl_memory {
    ($t:ident, $off:expr) => {
        impl CtlMemory for $t<'_> {
            #[inline]
            fn ctl_seq(&self, i: usize) -> u64 {
                self.0.load_acquire($off + i * CTL_ENTRY_BYTES + (CTL_WORDS - 1) * 8)
            }
            fn ctl_entry(&self, i: usize) -> [u64; CTL_WORDS] {
                self.0.load_words::<CTL_WORDS>($off + i * CTL_ENTRY_BYTES)
            }
            fn write_ctl_out(&mut self, i: usize, words: &[u64; CTL_WORDS]) {
                self.0.store_words($off + CTL_RING_BYTES + i * CTL_ENTRY_BYTES, words);
            }
        }
    };
}
ctl_memory!(SendMem, SEND_CTL_OFF);
ctl_memory!(RecvMem, RECV_CTL_OFF);

/// Rounds one call may run back to back (a fence answered, then its report written).
const MAX_ROUNDS: usize = 4;

/// Moves every QP of `rail` to the error state (the fence): its responders accept nothing
/// more. A QP that refuses is logged: the rail is being given up either way.
fn fence_rail<D: Device>(rail: &mut Rail<D>, name: &str) {
    for qp in rail.qps.iter_mut().chain(rail.flush_qp.as_mut()) {
        if let Err(e) = qp.to_error() {
            log::warn!("failover: moving QP {} of the {name} rail to the error state: {e}", qp.qp_num());
        }
    }
}

/// Feeds `on` every completion of `rail` that is in: the NIC's CQ (waiting for its poll
/// lock: after `fence_rail`, what the fabric delivered is in the CQ or in the inbox of
/// this connection, and the inbox is filled only under that lock), then the inbox.
fn drain_rail<D: Device>(rail: &Rail<D>, idx: usize, mut on: impl FnMut(&Completion) -> Result<()>) -> Result<()> {
    let mut first = Ok(());
    {
        let mut nic = rail.nic.lock();
        nic.poll(rail.owner, (rail.first_qp, idx), |_, c| on(c))?;
    }
    rail.inbox.pop_each(|c| {
        if first.is_ok() {
            first = on(c);
        }
    });
    first
}

/// What the part of a failover round both comms share needs of their engine.
trait RoundEngine {
    fn on_event(&mut self, ev: Event) -> Result<()>;
    fn set_error(&mut self, e: Error);
}

impl RoundEngine for SendEngine {
    fn on_event(&mut self, ev: Event) -> Result<()> {
        SendEngine::on_event(self, ev)
    }
    fn set_error(&mut self, e: Error) {
        SendEngine::set_error(self, e);
    }
}

impl RoundEngine for RecvEngine {
    fn on_event(&mut self, ev: Event) -> Result<()> {
        RecvEngine::on_event(self, ev)
    }
    fn set_error(&mut self, e: Error) {
        RecvEngine::set_error(self, e);
    }
}

/// What follows the engine's poll in a round, the same for both comms: its chains posted
/// (a failed post breaks the connection), its actions performed on the rails and answered
/// (a fenced rail's completions fed in with `on_completion`), the re-admitted QPs that are
/// connecting polled. Whether an action was performed (another round may be due).
fn carry_out<D: Device, E: RoundEngine>(
    rails: &mut [Rail<D>; RAILS],
    fo: &mut FoSide,
    engine: &mut E,
    mut on_completion: impl FnMut(&mut E, usize, &Completion) -> Result<()>,
) -> Result<bool> {
    for c in &fo.out.chains {
        let r = rails[c.rail as usize].qp(c.qp).and_then(|qp| qp.post_send(c.wrs()));
        if let Err(e) = r {
            engine.set_error(e.clone());
            return Err(e);
        }
    }
    let mut acted = false;
    for i in 0..fo.out.actions.len() {
        let ev = match fo.out.actions[i] {
            Action::FenceQps { rail } => {
                fence_rail(&mut rails[rail], RAIL_NAMES[rail]);
                fo.fenced(rail);
                drain_rail(&rails[rail], rail, |c| on_completion(engine, rail, c))?;
                Event::FenceDone { rail }
            }
            Action::RebuildQps { rail } => fo.rebuild(&mut rails[rail], rail),
            Action::ConnectQps { rail, records } => match fo.connect(&mut rails[rail], rail, &records) {
                Some(ev) => ev,
                None => continue,
            },
        };
        engine.on_event(ev)?;
        acted = true;
    }
    fo.poll_connecting(rails, |ev| engine.on_event(ev))?;
    Ok(acted)
}

impl<D: Device> SendComm<D> {
    /// Whether a call that did not complete must run a failover round.
    #[inline(always)]
    pub(super) fn failover_wanted(&self, now: u64) -> bool {
        self.engine.failover_due()
            || self.engine.control_waiting(&SendMem(&self.region))
            || self.fo.periodic(now)
            || self.fo.port_news(&self.rails)
    }

    /// One failover round (see the module doc).
    #[cold]
    #[inline(never)]
    pub(super) fn failover_round(&mut self, now: u64) -> Result<()> {
        self.fo.next_ns = u64::MAX;
        if self.fo.failover {
            let engine = &mut self.engine;
            feed_port_downs(&self.rails, &mut self.fo.port_downs, |e| engine.on_event(e))?;
        }
        let r = self.failover_rounds(now);
        let period = if self.fo.period_ns != 0 { now + self.fo.period_ns } else { u64::MAX };
        self.fo.next_ns = period.min(self.engine.failover_timer_ns());
        r
    }

    fn failover_rounds(&mut self, now: u64) -> Result<()> {
        for _ in 0..MAX_ROUNDS {
            self.fo.out.clear();
            self.engine.poll_failover(now, &mut SendMem(&self.region), &mut self.fo.out)?;
            let fenced =
                carry_out(&mut self.rails, &mut self.fo, &mut self.engine, |e, rail, c| e.on_completion(now, rail, c))?;
            if !fenced && !self.engine.failover_due() {
                break;
            }
        }
        Ok(())
    }

    /// The fault drill: counts isends (or reads the time); at the chosen one, drops the
    /// chosen rails' QP connections as a lost link would (soft fabric). A timed drill's
    /// times count from the comm's first isend; a repeated one keeps its cadence (a drop
    /// due while the rail is not Up only renews the refusal).
    #[cold]
    #[inline(never)]
    pub(super) fn fault_drill(&mut self, now: u64) {
        let Some(d) = self.fo.drill else { return };
        self.fo.isends += 1;
        let fire = match d.at {
            FaultAt::Isend(n) => self.fo.isends == n,
            FaultAt::Ms(at) => {
                if self.fo.isends == 1 {
                    self.fo.drill_next_ns = now + at * 1_000_000;
                }
                let due = self.fo.drill_next_ns != u64::MAX && now >= self.fo.drill_next_ns;
                if due {
                    self.fo.drops += 1;
                    let more = d.count.is_none_or(|c| self.fo.drops < c);
                    self.fo.drill_next_ns = match d.every_ms {
                        Some(e) if more => {
                            let e = e * 1_000_000;
                            self.fo.drill_next_ns + ((now - self.fo.drill_next_ns) / e + 1) * e
                        }
                        _ => u64::MAX,
                    };
                }
                due
            }
        };
        if !fire {
            return;
        }
        let (mask, isends) = (d.mask, self.fo.isends);
        self.fo.refuse_for(mask, d.for_ms);
        let states = self.engine.rail_states();
        for (r, rail) in self.rails.iter_mut().enumerate() {
            if mask & (1 << r) == 0 {
                continue;
            }
            if states[r] != RailState::Up {
                // Still down or coming back: the refusal renewed is the drop (dropping the
                // new QPs of an attempt would test the drill, not the rail).
                log::warn!("MPIB_FAULT_RAIL: the {} rail is not up at isend {isends}: it stays down", RAIL_NAMES[r]);
                continue;
            }
            // Every fault lives on this side's QPs of the rail (the requester of the data
            // WRs): a hook fires on the next matching WR and what the receiver must see
            // (bytes without their IMM, an IMM whose ACK is lost, requests arriving after
            // its QP's error state) travels on the wire (soft fabric, `hook.rs`).
            let what = match d.kind {
                FaultKind::LinkLoss => "dropping",
                FaultKind::DropImm => "arming drop-imm (the next IMM lost, its bytes landed) on",
                FaultKind::DropAck => "arming drop-ack (the next ACK lost, its WR executed) on",
                FaultKind::HoldPastFence => "arming hold (requests held past the fence) on",
            };
            log::warn!("MPIB_FAULT_RAIL: {what} the {} rail's connections at isend {isends}", RAIL_NAMES[r]);
            for qp in rail.qps.iter_mut() {
                match qp.inject_fault(d.kind) {
                    Ok(true) => {}
                    Ok(false) => log::warn!("MPIB_FAULT_RAIL: this fabric cannot inject {:?} (soft, TCP)", d.kind),
                    Err(e) => log::warn!("MPIB_FAULT_RAIL: {e}"),
                }
            }
        }
    }

    #[inline]
    pub(super) fn has_drill(&self) -> bool {
        self.fo.drill.is_some()
    }
}

impl<D: Device> RecvComm<D> {
    /// Whether a call that did not complete must run a failover round.
    #[inline(always)]
    pub(super) fn failover_wanted(&self) -> bool {
        self.engine.failover_due()
            || self.engine.control_waiting(&RecvMem(&self.region))
            || self.fo.port_news(&self.rails)
    }

    /// One failover round (see the module doc): the sender's messages read, fences
    /// performed and answered, the `Fenced` reports and CTS re-posts posted.
    #[cold]
    #[inline(never)]
    pub(super) fn failover_round(&mut self) -> Result<()> {
        if self.fo.failover {
            let engine = &mut self.engine;
            feed_port_downs(&self.rails, &mut self.fo.port_downs, |e| engine.on_event(e))?;
        }
        for _ in 0..MAX_ROUNDS {
            self.fo.out.clear();
            self.engine.poll_failover(&mut RecvMem(&self.region), &mut self.fo.out)?;
            let mem = RecvMem(&self.region);
            let fenced = carry_out(&mut self.rails, &mut self.fo, &mut self.engine, |e, rail, c| {
                e.on_completion(rail, c, &mem)
            })?;
            if !fenced && !self.engine.failover_due() {
                break;
            }
        }
        Ok(())
    }
}
