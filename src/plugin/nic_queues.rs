//! The queues one rail NIC shares among the connections of one plugin context (one NCCL
//! communicator): ONE completion queue for every QP of every connection on the NIC, ONE
//! shared receive queue for every receive QP (made when the first receive connection comes),
//! and the routes from a QP number to its connection's completion inbox and rail.
//!
//! Polling (the data path, on the caller's thread): a connection first takes what its
//! inbox holds, then tries the NIC's poll lock, never waiting for it ([`NicQueues::try_lock`]):
//! a holder is polling and queues this connection's completions in its inbox. Holding the
//! lock, it polls the CQ dry in batches: its own completions go straight to its engine,
//! others' into their inboxes; a completion with no route (a closed connection's late one)
//! is counted and dropped, never charged to the poller. Then the SRQ is topped up.
//!
//! Set-up and close take the lock and wait (they are not the data path): creating QPs on
//! the CQ and SRQ, growing the CQ (`CompletionQueue::resize`) before it could ever fill,
//! draining a closing connection's QPs and removing its routes.
//!
//! Sizes. The CQ holds, at all times, room for every WR in every attached QP's send queue
//! (a QP in the error state completes each of them, flushed) plus every SRQ WQE that may be
//! posted: the QPs' send-queue depths and the receive windows are summed as connections
//! come and go, and the CQ grows ahead of them (never shrinks; it goes with the last
//! connection).
//!
//! The SRQ is kept stocked for every receive the attached receive connections may have
//! outstanding: each outstanding receive consumes at most one WQE on each rail, a receive
//! connection has at most its window outstanding (32 with ABI v7+, 8 with v6), so the NIC
//! reserves the sum of its connections' windows (per rail it carries). Polling gives back
//! the WQE of every receive completion (failed or not), and the poller tops the SRQ up when
//! fewer than `reserved + SRQ_LOW` are posted, to `reserved + SRQ_HIGH`, in one call, never
//! beyond its depth (`MPIB_SRQ_DEPTH`, at most the device's `max_srq_wr`; beyond it writes
//! wait for WQEs: receiver-not-ready, retried forever, slower but correct). Why the
//! windows and not the receives actually outstanding: the depth is allocated when the SRQ
//! is made, so WQEs posted ahead cost nothing, while counting outstanding receives would
//! write a counter that every receive connection shares on every `irecv` and completion
//! (a cache line bounced between NCCL's progress threads before v11); when the windows
//! exceed the depth, both keep the SRQ full anyway.

use std::sync::Arc;
use std::time::{Duration, Instant};

use parking_lot::{Mutex, MutexGuard};

use super::inbox::Inbox;
use super::resources::{Counts, Held, Res};
use crate::error::{Error, Result};
use crate::fabric::{
    Completion, CompletionQueue, Device, QpCaps, QueuePair, SharedRecvQueue, Timestamps, WcOpcode, WcStatus,
};

/// Completions polled per CQ call.
pub const POLL_BATCH: usize = 16;
/// `wr_id` of the marker WR a closing connection posts on each of its QPs (kind bits 0xf:
/// no engine WR has them).
pub const DRAIN_MARKER: u64 = 0xf << 60;
/// How long a close waits for its QPs' markers.
const DRAIN_LIMIT: Duration = Duration::from_secs(2);
/// The SRQ is topped up when fewer than `reserved + SRQ_LOW` WQEs are posted ...
pub const SRQ_LOW: u32 = 16;
/// ... to `reserved + SRQ_HIGH` (batches of at least 32 WQEs, one call each).
pub const SRQ_HIGH: u32 = 48;
/// The CQ's first depth; it grows as connections come.
pub const FIRST_CQ_DEPTH: u32 = 1024;

/// WQEs to post on an SRQ with `posted` of them, for receives that may consume `reserved`,
/// of depth `depth`: none while `posted ≥ reserved + SRQ_LOW`, else up to
/// `reserved + SRQ_HIGH` (within the depth).
pub fn srq_topup(posted: u32, reserved: u32, depth: u32) -> u32 {
    if posted >= reserved.saturating_add(SRQ_LOW).min(depth) {
        return 0;
    }
    reserved.saturating_add(SRQ_HIGH).min(depth).saturating_sub(posted)
}

/// Entries to give a CQ that must hold `need` and holds `have`: at least half as many again
/// (few resizes while connections come), in units of 256, within `max`.
pub fn cq_growth(have: u32, need: u64, max: u32) -> Result<u32> {
    if need <= have as u64 {
        return Ok(have);
    }
    let max = max.max(1);
    if need > max as u64 {
        return Err(Error::system(format!(
            "a NIC's shared completion queue would need {need} entries for this connection, more than the device's \
             max_cqe {max}: too many connections on one NIC for one communicator"
        )));
    }
    let want = need.max(have as u64 + have as u64 / 2).next_multiple_of(256);
    Ok(want.min(max as u64) as u32)
}

/// Where the completions of one QP go.
struct Route {
    qp_num: u32,
    rail: u8,
    owner: u64,
    inbox: Arc<Inbox>,
}

/// QP number → route: open addressing over a power-of-two table at most half full, the
/// slot from one multiply (QP numbers come near-sequential; the high bits of the product
/// spread them), linear probing, backward-shift deletion (no tombstones). A lookup is a
/// multiply, a shift and usually one compare: it runs for every completion polled.
struct Routes {
    slots: Box<[Option<Route>]>,
    shift: u32,
    len: usize,
}

impl Routes {
    fn new() -> Routes {
        Routes { slots: (0..16).map(|_| None).collect(), shift: 64 - 4, len: 0 }
    }

    #[inline(always)]
    fn home(&self, qp_num: u32) -> usize {
        ((qp_num as u64).wrapping_mul(0x9e37_79b9_7f4a_7c15) >> self.shift) as usize
    }

    #[inline(always)]
    fn get(&self, qp_num: u32) -> Option<&Route> {
        let mask = self.slots.len() - 1;
        let mut i = self.home(qp_num);
        loop {
            match &self.slots[i] {
                Some(r) if r.qp_num == qp_num => return Some(r),
                Some(_) => i = (i + 1) & mask,
                None => return None,
            }
        }
    }

    fn insert(&mut self, r: Route) {
        self.remove(r.qp_num);
        if (self.len + 1) * 2 > self.slots.len() {
            let bigger = (0..self.slots.len() * 2).map(|_| None).collect();
            let old = std::mem::replace(&mut self.slots, bigger);
            self.shift -= 1;
            self.len = 0;
            for r in old.into_vec().into_iter().flatten() {
                self.place(r);
            }
        }
        self.place(r);
    }

    fn place(&mut self, r: Route) {
        let mask = self.slots.len() - 1;
        let mut i = self.home(r.qp_num);
        while self.slots[i].is_some() {
            i = (i + 1) & mask;
        }
        self.slots[i] = Some(r);
        self.len += 1;
    }

    fn remove(&mut self, qp_num: u32) {
        let mask = self.slots.len() - 1;
        let mut i = self.home(qp_num);
        loop {
            match &self.slots[i] {
                Some(r) if r.qp_num == qp_num => break,
                Some(_) => i = (i + 1) & mask,
                None => return,
            }
        }
        self.slots[i] = None;
        self.len -= 1;
        // Backward shift: move later entries of the run into the hole when their home
        // allows, so that every entry stays reachable from its home without a gap.
        let mut hole = i;
        let mut j = (i + 1) & mask;
        while let Some(r) = &self.slots[j] {
            let home = self.home(r.qp_num);
            // `r` may fill the hole if its home is not cyclically in (hole, j].
            if (j.wrapping_sub(home) & mask) >= (j.wrapping_sub(hole) & mask) {
                self.slots[hole] = self.slots[j].take();
                hole = j;
            }
            j = (j + 1) & mask;
        }
    }
}

/// What polls: everything behind the NIC's poll lock.
struct Poll<D: Device> {
    cq: D::Cq,
    srq: Option<D::Srq>,
    srq_posted: u32,
    srq_depth: u32,
    rnr_seen: u64,
    routes: Routes,
    cq_depth: u32,
    /// Sum of the attached QPs' send-queue depths, and of the receive windows (WQEs the
    /// receive connections may consume at most: the SRQ's reservation).
    sq_sum: u64,
    windows: u64,
    /// The SRQ is topped up when fewer WQEs than this are posted (0: no SRQ): the one
    /// compare a poll makes for it, recomputed as the windows change.
    refill_below: u32,
    /// Receiver-not-ready waits the SRQ saw, not yet handed to a receive connection.
    rnr_new: u64,
    wc: [Completion; POLL_BATCH],
    /// The plugin instance's resource counts (this NIC's holdings, unrouted completions).
    counts: &'static Counts,
    _held_cq: Held,
    held_cqe: Held,
    held_srq: Option<[Held; 2]>,
    held_posted: Held,
}

impl<D: Device> Poll<D> {
    /// What the CQ must be able to hold: every send-queue WR and every WQE that may be
    /// posted (now or by the refills the windows allow).
    fn cq_need(&self, sq_sum: u64, windows: u64) -> u64 {
        let srq = if self.srq.is_some() {
            (windows + SRQ_HIGH as u64).min(self.srq_depth as u64).max(self.srq_posted as u64)
        } else {
            0
        };
        sq_sum + srq
    }

    /// The windows changed: when to top the SRQ up.
    fn set_reservation(&mut self, windows: u64) {
        self.windows = windows;
        let reserved = windows.min(u32::MAX as u64) as u32;
        self.refill_below = if self.srq.is_some() { reserved.saturating_add(SRQ_LOW).min(self.srq_depth) } else { 0 };
    }

    /// Posts SRQ WQEs if fewer than `reserved + SRQ_LOW` are posted (one call). Polls only
    /// compare; the rest is out of line.
    #[inline(always)]
    fn refill(&mut self) -> Result<()> {
        if self.srq_posted >= self.refill_below {
            return Ok(());
        }
        self.topup()
    }

    #[inline(never)]
    fn topup(&mut self) -> Result<()> {
        let Some(srq) = self.srq.as_mut() else { return Ok(()) };
        let reserved = self.windows.min(u32::MAX as u64) as u32;
        let n = srq_topup(self.srq_posted, reserved, self.srq_depth);
        if n > 0 {
            srq.post_recv(n)?;
            self.srq_posted += n;
            self.held_posted.set(self.srq_posted as u64);
        }
        // The SRQ ran short: were writers kept waiting? (A statistic only.)
        let total = srq.rnr_events();
        self.rnr_new += total.saturating_sub(self.rnr_seen);
        self.rnr_seen = total;
        Ok(())
    }
}

/// One NIC's shared queues for one context.
pub struct NicQueues<D: Device> {
    pub dev: Arc<D>,
    poll: Mutex<Poll<D>>,
    _held: Held,
}

/// A QP to create on attach.
#[derive(Clone, Copy, Debug)]
pub struct QpSpec {
    pub caps: QpCaps,
    /// Draws its receives from the NIC's SRQ.
    pub srq: bool,
}

impl<D: Device> NicQueues<D> {
    /// The queues of `dev` for a new context: the CQ now (small; it grows with the
    /// connections), the SRQ with the first receive connection.
    pub fn new(dev: Arc<D>, srq_depth: u32, counts: &'static Counts) -> Result<NicQueues<D>> {
        let a = dev.attrs();
        let depth = FIRST_CQ_DEPTH.min(a.max_cqe.max(1));
        let cq = dev.create_cq(depth, Timestamps::Wanted)?;
        let srq_depth = srq_depth.min(a.max_srq_wr.max(1));
        let poll = Poll {
            cq,
            srq: None,
            srq_posted: 0,
            srq_depth,
            rnr_seen: 0,
            routes: Routes::new(),
            cq_depth: depth,
            sq_sum: 0,
            windows: 0,
            refill_below: 0,
            rnr_new: 0,
            wc: [Completion::default(); POLL_BATCH],
            counts,
            _held_cq: counts.hold(Res::Cqs, 1),
            held_cqe: counts.hold(Res::CqEntries, depth as u64),
            held_srq: None,
            held_posted: counts.hold(Res::SrqPosted, 0),
        };
        Ok(NicQueues { poll: Mutex::new(poll), _held: counts.hold(Res::NicQueues, 1), dev })
    }

    /// Creates `qps` for connection `owner`'s rail `rail` (whose completions other pollers
    /// queue in `inbox`) and routes their completions; `window`: the WQEs its receives
    /// may consume on this NIC (reserved in the SRQ, which is stocked before this returns).
    /// Grows the CQ first so that it can hold everything.
    pub fn attach(
        &self,
        owner: u64,
        rail: usize,
        inbox: &Arc<Inbox>,
        qps: &[QpSpec],
        window: u32,
    ) -> Result<Vec<D::Qp>> {
        let mut p = self.poll.lock();
        let a = self.dev.attrs();
        let wants_srq = qps.iter().any(|q| q.srq);
        if wants_srq && p.srq.is_none() {
            p.srq = Some(self.dev.create_srq(p.srq_depth)?);
            p.held_srq = Some([p.counts.hold(Res::Srqs, 1), p.counts.hold(Res::SrqWqes, p.srq_depth as u64)]);
        }
        let sq: u64 = qps.iter().map(|q| q.caps.max_send_wr as u64).sum();
        let windows = p.windows + window as u64;
        let need = p.cq_need(p.sq_sum + sq, windows);
        let depth = cq_growth(p.cq_depth, need, a.max_cqe)?;
        if depth > p.cq_depth {
            p.cq.resize(depth)?;
            p.cq_depth = depth;
            p.held_cqe.set(depth as u64);
        }
        let mut made = Vec::with_capacity(qps.len());
        for q in qps {
            let srq = if q.srq { p.srq.as_ref() } else { None };
            made.push(self.dev.create_qp(&p.cq, srq, q.caps)?);
        }
        for qp in &made {
            p.routes.insert(Route { qp_num: qp.qp_num(), owner, rail: rail as u8, inbox: inbox.clone() });
        }
        p.sq_sum += sq;
        p.set_reservation(windows);
        p.refill()?;
        Ok(made)
    }

    /// Detaches connection `owner`'s `qps` (made by [`Self::attach`] with send-queue depths
    /// summing to `sq` and `window`) and destroys them: each goes to the error state with a
    /// marker WR behind its last one, the CQ is polled (others' completions queued as ever)
    /// until every marker came back or [`DRAIN_LIMIT`] passed, then the routes go, so a QP
    /// number reused later never receives this connection's late completions.
    pub fn detach(&self, owner: u64, qps: Vec<D::Qp>, sq: u64, window: u32) {
        let mut p = self.poll.lock();
        let mut qps = qps;
        let mut markers = 0usize;
        for qp in qps.iter_mut() {
            match qp.drain_marker(DRAIN_MARKER) {
                Ok(true) => markers += 1,
                Ok(false) => {}
                Err(e) => log::debug!("closing a connection: no drain marker on QP {}: {e}", qp.qp_num()),
            }
        }
        let end = Instant::now() + DRAIN_LIMIT;
        while markers > 0 && Instant::now() < end {
            let p = &mut *p;
            let n = match p.cq.poll(&mut p.wc) {
                Ok(n) => n,
                Err(e) => {
                    log::warn!("closing a connection: polling its CQ: {e}");
                    break;
                }
            };
            for c in &p.wc[..n] {
                if consumed_wqe(c) {
                    p.srq_posted = p.srq_posted.saturating_sub(1);
                }
                match p.routes.get(c.qp_num) {
                    Some(r) if r.owner == owner => markers -= (c.wr_id == DRAIN_MARKER) as usize,
                    Some(r) => {
                        r.inbox.push(c);
                    }
                    None => p.counts.count_unrouted(1),
                }
            }
            if n == 0 {
                std::thread::yield_now();
            }
        }
        if markers > 0 {
            log::warn!("closing a connection: {markers} QP(s) did not drain within {DRAIN_LIMIT:?}; closing anyway");
        }
        for qp in &qps {
            p.routes.remove(qp.qp_num());
        }
        drop(qps);
        p.sq_sum -= sq.min(p.sq_sum);
        let windows = p.windows - (window as u64).min(p.windows);
        p.set_reservation(windows);
        let posted = p.srq_posted as u64;
        p.held_posted.set(posted);
    }

    /// The poll lock, waiting for it: only a rail's fence (failover), which must see every
    /// completion the fabric delivered for its connection.
    pub fn lock(&self) -> Polling<'_, D> {
        Polling { g: self.poll.lock() }
    }

    /// The poll lock if nobody holds it: the data path never waits for it.
    #[inline]
    pub fn try_lock(&self) -> Option<Polling<'_, D>> {
        self.poll.try_lock().map(|g| Polling { g })
    }
}

/// Whether a completion consumed an SRQ WQE: every receive completion, and a failed one
/// whose opcode verbs leaves undefined but whose `wr_id` is the generic WQEs' 0.
#[inline]
fn consumed_wqe(c: &Completion) -> bool {
    c.opcode == WcOpcode::RecvRdmaWithImm || (c.status != WcStatus::Success && c.wr_id == 0)
}

/// The NIC's poll lock, held.
pub struct Polling<'a, D: Device> {
    g: MutexGuard<'a, Poll<D>>,
}

impl<D: Device> Polling<'_, D> {
    /// Polls the CQ dry, a batch a call: the completions of connection `owner` go to
    /// `mine(rail, completion)`, others' to their inboxes. `(qp_num, rail)`: the caller's
    /// busiest QP, told apart without a route lookup. Then tops the SRQ up. The first
    /// error of `mine` is returned after its batch was dispatched (no completion of another
    /// connection is lost to it); a CQ or SRQ failure is returned at once.
    #[inline(always)]
    pub fn poll(
        &mut self,
        owner: u64,
        (my_qp, my_rail): (u32, usize),
        mut mine: impl FnMut(usize, &Completion) -> Result<()>,
    ) -> Result<()> {
        let p = &mut *self.g;
        let mut first = Ok(());
        let Poll { cq, wc, routes, srq_posted, counts, .. } = p;
        loop {
            // Each completion is routed where the CQ holds it (no copy out first).
            let n = cq.poll_each(
                wc,
                #[inline(always)]
                |c| {
                    if consumed_wqe(c) {
                        *srq_posted = srq_posted.saturating_sub(1);
                    }
                    let r = if c.qp_num == my_qp {
                        mine(my_rail, c)
                    } else {
                        match routes.get(c.qp_num) {
                            Some(r) if r.owner == owner => mine(r.rail as usize, c),
                            Some(r) => {
                                r.inbox.push(c);
                                Ok(())
                            }
                            None => {
                                unrouted(counts, c);
                                Ok(())
                            }
                        }
                    };
                    if let Err(e) = r
                        && first.is_ok()
                    {
                        first = Err(e);
                    }
                },
            )?;
            if n < POLL_BATCH || first.is_err() {
                break;
            }
        }
        p.refill()?;
        first
    }

    /// Receiver-not-ready waits the SRQ saw since the last call (seen when it is topped up).
    #[inline(always)]
    pub fn take_rnr(&mut self) -> u64 {
        std::mem::take(&mut self.g.rnr_new)
    }
}

/// A completion no live connection claims: counted, dropped.
#[cold]
#[inline(never)]
fn unrouted(counts: &Counts, c: &Completion) {
    counts.count_unrouted(1);
    log::debug!("a completion of QP {} (no connection: closed) dropped: {c:?}", c.qp_num);
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_srq_is_topped_up_in_batches_to_its_reservation() {
        // Enough posted: nothing.
        assert_eq!(srq_topup(64, 40, 1000), 0);
        assert_eq!(srq_topup(56, 40, 1000), 0, "at the low mark");
        // Short: up to needed + SRQ_HIGH in one go.
        assert_eq!(srq_topup(55, 40, 1000), 40 + SRQ_HIGH - 55);
        assert_eq!(srq_topup(0, 1, 1000), 1 + SRQ_HIGH);
        // Never beyond the depth; a full SRQ asks for nothing even when short.
        assert_eq!(srq_topup(0, 5000, 1000), 1000);
        assert_eq!(srq_topup(1000, 5000, 1000), 0);
        assert_eq!(srq_topup(990, 5000, 1000), 10, "to the depth");
        // Nothing reserved: a small stock is kept all the same.
        assert_eq!(srq_topup(0, 0, 1000), SRQ_HIGH);
        assert_eq!(srq_topup(SRQ_LOW, 0, 1000), 0);
    }

    #[test]
    fn a_shared_cq_grows_ahead_and_within_the_device() {
        assert_eq!(cq_growth(1024, 1000, 1 << 20).unwrap(), 1024, "enough already");
        // Half as much again, in units of 256, when that covers the need.
        assert_eq!(cq_growth(1024, 1100, 1 << 20).unwrap(), 1536);
        // The need itself when it is larger.
        assert_eq!(cq_growth(1024, 5000, 1 << 20).unwrap(), 5120);
        // Capped by the device; refused beyond it, with the reason.
        assert_eq!(cq_growth(30000, 32000, 32767).unwrap(), 32767);
        let e = cq_growth(30000, 40000, 32767).unwrap_err();
        assert!(e.msg().contains("max_cqe 32767"), "{}", e.msg());
    }

    #[test]
    fn routes_find_every_qp_through_growth_and_removals() {
        let inbox = Arc::new(Inbox::new(1));
        let route = |q: u32| Route { qp_num: q, rail: (q % 2) as u8, owner: q as u64 * 3, inbox: inbox.clone() };
        let mut r = Routes::new();
        // Near-sequential numbers (as NICs hand them out) and scattered ones.
        let qpns: Vec<u32> =
            (0..300u32).map(|i| if i % 3 == 0 { 0x11_0000 + i } else { i.wrapping_mul(2_654_435_761) >> 8 }).collect();
        for &q in &qpns {
            r.insert(route(q));
        }
        assert_eq!(r.len, qpns.len());
        assert!(r.slots.len() >= 2 * r.len, "at most half full");
        for &q in &qpns {
            let got = r.get(q).expect("routed");
            assert_eq!((got.qp_num, got.owner, got.rail), (q, q as u64 * 3, (q % 2) as u8));
        }
        assert!(r.get(7).is_none() || qpns.contains(&7));
        // Remove every other one: the rest stay reachable (backward shift), the removed go.
        for &q in qpns.iter().step_by(2) {
            r.remove(q);
        }
        for (i, &q) in qpns.iter().enumerate() {
            assert_eq!(r.get(q).is_some(), i % 2 == 1, "qp {q:#x}");
        }
        // A number routed again replaces its old route.
        r.insert(Route { owner: 99, ..route(qpns[1]) });
        assert_eq!(r.get(qpns[1]).unwrap().owner, 99);
        assert_eq!(r.len, qpns.len() / 2);
    }
}
