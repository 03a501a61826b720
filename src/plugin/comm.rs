//! The data path of one connection: the engine plus its fabric objects. Every call runs on
//! the caller's thread (NCCL's proxy): read the clock once, feed completions to the engine,
//! post the chains it emits with one call each. No allocation, and no lock that another
//! thread may hold while this one waits: completions come from the connection's inboxes
//! and, when the NIC's poll lock is free, from the NIC's shared CQ (`nic_queues.rs`).

use std::sync::Arc;

use super::driven::Driven;
use super::failover::{FoSide, MAX_ROUNDS, carry_out, feed_port_downs};
use super::inbox::Inbox;
use super::mr::{MrInfo, MrMemo};
use super::nic_pair::NicPair;
use super::profile::{RecvProfile, SendProfile, Sink};
use super::rail::Rail;
use super::region::{RecvMem, SendMem};
use super::resources::{Counts, Held};
use crate::engine::{FlushBuf, Posts, RAILS, RailCounts, RailMask, RecvBuf, RecvEngine, SendEngine, cold};
use crate::error::{Error, Result};
use crate::fabric::mem::HostRegion;
use crate::fabric::{Completion, Device, Progress, QueuePair};

/// `CLOCK_MONOTONIC` nanoseconds (one clock read per ncclNet call).
#[inline]
pub fn now_ns() -> u64 {
    crate::fabric::clock::monotonic_ns()
}

/// What the fabric helpers below need of an engine: to record the failure that broke its
/// connection.
trait Fails {
    /// A fabric call failed: the connection is broken. Returns `e` placed.
    fn fail(&mut self, e: Error) -> Error;
}

impl<E: Driven> Fails for E {
    #[inline]
    fn fail(&mut self, e: Error) -> Error {
        Driven::fail(self, e)
    }
}

/// The result of a fabric call (post, poll); a failure is recorded in `engine` first.
#[inline]
fn fabric<T>(engine: &mut impl Fails, r: Result<T>) -> Result<T> {
    // The failure out of line: inlined, its clone made callers too big to inline this.
    match r {
        Ok(v) => Ok(v),
        Err(e) => Err(broken(engine, e)),
    }
}

/// Records `e` as what broke the connection and returns it.
#[cold]
#[inline(never)]
fn broken(engine: &mut impl Fails, e: Error) -> Error {
    engine.fail(e)
}

/// The result of polling for `test`: a failure is recorded in `engine` (it keeps the first)
/// and not returned, so that the engine's `test` decides: a request that had completed is
/// reported complete, one that had not reports the failure.
#[inline(always)]
fn settle<T>(engine: &mut impl Fails, r: Result<T>) -> Option<T> {
    match r {
        Ok(v) => Some(v),
        Err(e) => {
            broken(engine, e);
            None
        }
    }
}

/// Posts every chain of `posts` on its rail's QP (one call each). Always inlined: as a
/// call it costs ~+10 instructions per message in `inproc_msgs` (measured).
#[inline(always)]
fn post_all<D: Device>(rails: &mut [Rail<D>; RAILS], posts: &Posts, engine: &mut impl Fails) -> Result<()> {
    if posts.n == 0 {
        return Ok(()); // most tests post nothing: no call
    }
    fabric(engine, post_chains(rails, posts))
}

/// Feeds what `inbox` holds to `on` (the connection's own completions that another caller
/// polled), in order. An overflowed inbox (a bug: it is sized to what can be outstanding)
/// fails the connection. Inlined: with connections sharing a CQ (a send and a receive comm
/// of one communicator) it is the common path, not a slow one.
#[inline(always)]
fn take_inbox<E: Fails>(
    inbox: &Inbox,
    engine: &mut E,
    on: impl FnMut(&mut E, &Completion) -> Result<()>,
) -> Result<bool> {
    if inbox.is_empty() {
        return Ok(false);
    }
    take_inbox_slow(inbox, engine, on)?;
    Ok(true)
}

#[inline(always)]
fn take_inbox_slow<E: Fails>(
    inbox: &Inbox,
    engine: &mut E,
    mut on: impl FnMut(&mut E, &Completion) -> Result<()>,
) -> Result<()> {
    // Everything queued, decoded straight into `on`; after a failure the rest is dropped
    // (the connection is broken by it).
    let mut r = Ok(());
    inbox.pop_each(
        #[inline(always)]
        |c| {
            if r.is_ok() {
                r = on(engine, c);
            }
        },
    );
    r?;
    if inbox.overflowed() {
        let cap = inbox.capacity();
        return Err(broken(
            engine,
            Error::internal(format!(
                "a completion for this connection found its inbox full ({cap} entries, sized to what it can have \
                 outstanding): completions were lost, the connection cannot go on"
            )),
        ));
    }
    Ok(())
}

/// Inlined into each caller: as a call, its frame (and the spills around it) cost as much
/// as its loop.
#[inline(always)]
fn post_chains<D: Device>(rails: &mut [Rail<D>; RAILS], posts: &Posts) -> Result<()> {
    for c in posts.chains() {
        rails[c.rail as usize].qp(c.qp)?.post_send(c.wrs())?;
    }
    Ok(())
}

/// Request sequence numbers, so a handle kept after `test` said done is recognised.
pub struct Seqs(Box<[u8]>);

impl Seqs {
    pub fn new(n: usize) -> Self {
        Seqs(vec![0; n].into_boxed_slice())
    }
    #[inline]
    pub fn bump(&mut self, id: u16) -> u8 {
        let s = &mut self.0[id as usize];
        *s = s.wrapping_add(1) & 0x7f;
        *s
    }
    #[inline]
    pub fn matches(&self, id: u16, seq: u8) -> bool {
        self.0.get(id as usize) == Some(&seq)
    }
}

/// What a send and a receive comm share: the rails (their QPs on the NICs' shared queues),
/// the NIC pair, the request sequence numbers, the registration memo, the chains of the
/// current call, the control region, the failover side and the resource count it holds.
/// Dropping it shuts the rails down, once for both kinds of comm.
pub struct CommCore<D: Device> {
    pub rails: [Rail<D>; RAILS],
    pub dev: Arc<NicPair<D>>,
    pub seqs: Seqs,
    pub mr_memo: MrMemo,
    pub(super) posts: Posts,
    pub(super) region: HostRegion,
    /// Rail failover (`failover.rs`): out of line, touched only by calls that wait (and,
    /// on a receive comm, by every [`IRECVS_PER_LOOK`]th irecv).
    pub(super) fo: Box<FoSide>,
    _held: Held,
}

impl<D: Device> CommCore<D> {
    fn new(rails: [Rail<D>; RAILS], dev: Arc<NicPair<D>>, region: HostRegion, fo: Box<FoSide>, held: Held) -> Self {
        CommCore {
            rails,
            dev,
            seqs: Seqs::new(512),
            mr_memo: MrMemo::default(),
            posts: Posts::default(),
            region,
            fo,
            _held: held,
        }
    }
}

impl<D: Device> Drop for CommCore<D> {
    fn drop(&mut self) {
        for r in &mut self.rails {
            r.shutdown();
        }
    }
}

/// A connected comm, send or receive: the engine `E` of its connection driven over its
/// fabric objects. Each call feeds the engine (the call, the completions the inboxes and
/// the NICs hold), posts what it returns and, when its deadline has come or news waits,
/// runs a round of its own work (`round`); nothing here decides anything of the protocol.
pub struct Comm<D: Device, E: Driven> {
    pub core: CommCore<D>,
    pub engine: E,
    /// The rails whose CQs a send comm's `test` polls even with nothing of its own
    /// outstanding: those whose device makes progress only when polled
    /// ([`Progress::OnPoll`]). A receive comm polls both rails always.
    poll_always: RailMask,
    /// A receive comm's irecvs so far (wrapping): see `irecv`.
    calls: u8,
    /// NCCL profiler events (`profile.rs`), when NCCL gave a callback.
    pub(super) prof: Option<Box<E::Profile>>,
}

/// A connected send comm.
pub type SendComm<D> = Comm<D, SendEngine>;
/// A connected receive comm.
pub type RecvComm<D> = Comm<D, RecvEngine>;

impl<D: Device, E: Driven> Comm<D, E> {
    /// The comm of a connection whose set-up finished: `engine` over `rails` on the NIC
    /// pair `dev`, its control region, its failover side; it counts as one `res`.
    pub fn new(
        rails: [Rail<D>; RAILS],
        engine: E,
        dev: Arc<NicPair<D>>,
        region: HostRegion,
        fo: Box<FoSide>,
        counts: &'static Counts,
    ) -> Self {
        let poll_always = RailMask::from_fn(|r| rails[r].dev.attrs().progress == Progress::OnPoll);
        let core = CommCore::new(rails, dev, region, fo, counts.hold(E::RESOURCE, 1));
        Comm { core, engine, poll_always, calls: 0, prof: None }
    }

    pub fn counters(&self) -> [RailCounts; RAILS] {
        self.engine.counters()
    }

    /// The completions of `rails` that other callers polled for this connection (`now`:
    /// this call's clock); whether there were any.
    #[inline(always)]
    fn take_inboxes(&mut self, rails: RailMask, now: u64) -> Result<bool> {
        let mut took = false;
        // Only the rails of the set are visited (one, on a single-rail split).
        for rail in rails.iter() {
            let (engine, region) = (&mut self.engine, &self.core.region);
            took |= take_inbox(&self.core.rails[rail].inbox, engine, |e, c| e.on_completion(now, rail, c, region))?;
        }
        Ok(took)
    }

    /// Polls the NICs of `rails` whose poll lock is free (for a receive comm the poll also
    /// tops the SRQ up). A completion queued in an inbox meanwhile is taken at the next
    /// call: the engine takes a connection's completions in any order.
    #[inline(always)]
    fn poll_nics(&mut self, rails: RailMask, now: u64) -> Result<()> {
        for rail in rails.iter() {
            let Rail { nic, owner, first_qp, .. } = &self.core.rails[rail];
            let (engine, region) = (&mut self.engine, &self.core.region);
            if let Some(mut nic) = nic.try_lock() {
                let r = nic.poll(*owner, (*first_qp, rail), |rail, c| engine.on_completion(now, rail, c, region));
                fabric(engine, r)?;
                if E::COUNTS_RNR {
                    let rnr = nic.take_rnr();
                    if rnr > 0 {
                        engine.count_rnr(rail, rnr);
                    }
                }
            }
        }
        Ok(())
    }

    /// NCCL closes the comm: when failover work is owed or a control message waits, one
    /// last round, so that the peer hears what it needs (a receiver that closes right after
    /// its last receive still reads a late `RailDown`, fences and reports which parts
    /// arrived: the sender's last sends then complete). Never waits; a failure is only
    /// logged (the comm is going).
    pub fn closing(&mut self) {
        if !self.core.fo.failover || !(self.news() || self.engine.failover_due()) {
            return;
        }
        if let Err(e) = self.round(now_ns()) {
            log::debug!("closing: the last failover round: {e}");
        }
    }

    /// Whether the peer or the fabric has news for the engine (a control message, a port
    /// gone down): two loads and compares, for calls that wait.
    #[inline(always)]
    pub(super) fn news(&self) -> bool {
        self.engine.control_waiting(&self.core.region) || self.core.fo.port_news(&self.core.rails)
    }

    /// A round of the engine's own work at `now` (probes, keepalives, failover, the drill):
    /// the port-downs fed in, then its timeout handled and what it asks for carried out,
    /// again while an action was answered (a fence, then its report), a few times at most.
    #[cold]
    #[inline(never)]
    pub(super) fn round(&mut self, now: u64) -> Result<()> {
        if self.core.fo.failover {
            let engine = &mut self.engine;
            feed_port_downs(&self.core.rails, &mut self.core.fo.port_downs, &self.core.fo.place, |e| {
                engine.on_event(now, e)
            })?;
        }
        for _ in 0..MAX_ROUNDS {
            let core = &mut self.core;
            core.fo.out.clear();
            self.engine.on_timeout(now, &core.region, &mut core.fo.out)?;
            if !carry_out(now, &mut core.rails, &mut core.fo, &mut self.engine, &core.region)? {
                break;
            }
        }
        Ok(())
    }
}

impl<D: Device> SendComm<D> {
    /// Reports this comm's work to `sink` (NCCL's profiler), its events naming NCCL device
    /// `device`.
    pub fn set_profiler(&mut self, sink: Option<Sink>, device: i32) {
        self.prof = sink.map(|s| Box::new(SendProfile::new(s, device, self.core.seqs.0.len())));
    }

    /// `isend`: `Ok(None)` until the receiver's CTS is there.
    pub fn isend(&mut self, addr: u64, size: u64, tag: u32, mh: &MrInfo) -> Result<Option<u16>> {
        if !mh.covers(addr, size) {
            return Err(cold(|| {
                Error::invalid_argument(format!(
                    "isend of {size} bytes at {addr:#x} lies outside its registration [{:#x}, +{})",
                    mh.addr, mh.len
                ))
            }));
        }
        let buf = mh.send_buf(addr, size, tag);
        let now = now_ns();
        self.core.posts.clear();
        let mut r = self.engine.isend(now, buf, &mut SendMem(&self.core.region), &mut self.core.posts)?;
        if r.is_none() {
            // The CTS may be waiting in the fabric (the soft NIC moves bytes when polled).
            self.poll(RailMask::BOTH, now)?;
            r = self.engine.isend(now, buf, &mut SendMem(&self.core.region), &mut self.core.posts)?;
        }
        post_all(&mut self.core.rails, &self.core.posts, &mut self.engine)?;
        // The engine's own work (probes, keepalives while no CTS came, failover, the drill)
        // when its time has come — one compare — or when news waits for a caller that waits.
        if now >= self.engine.poll_timeout() || r.is_none() && self.news() {
            self.round(now)?;
        }
        Ok(r)
    }

    /// Feeds the engine the completions of `rails` (`now`: this call's clock): what the
    /// inboxes hold, then, where the NIC's poll lock is free, the shared CQ's.
    fn poll(&mut self, rails: RailMask, now: u64) -> Result<()> {
        self.take_inboxes(rails, now)?;
        self.poll_nics(rails, now)
    }

    /// `test` of request `id`: the inboxes, and when that did not complete it, the NICs;
    /// probes idle rails; returns the bytes sent when done.
    pub fn test(&mut self, id: u16) -> Result<Option<u64>> {
        // The rails with something to complete, and those where polling is also what
        // answers the peer (the TCP soft NIC: a rail may carry only CTS traffic).
        let now = now_ns();
        let rails = self.poll_always | self.engine.busy_rails();
        // (Only what the inboxes brought can have completed it since the last call.)
        let took = self.take_inboxes(rails, now);
        let took = settle(&mut self.engine, took).unwrap_or(true);
        let mut done = if took { self.engine.test(id)? } else { None };
        if done.is_none() {
            let polled = self.poll_nics(rails, now);
            settle(&mut self.engine, polled);
            done = self.engine.test(id)?;
            if done.is_none() && self.news() {
                self.round(now)?;
                done = self.engine.test(id)?;
            }
        }
        // The engine's own work when its time has come (one compare): probes, keepalives,
        // the stall check, re-admission. A failure there (recorded) does not undo a
        // completed send.
        if now >= self.engine.poll_timeout() {
            let r = self.round(now);
            if done.is_none() {
                r?;
                done = self.engine.test(id)?;
            }
        }
        if self.prof.is_some() {
            self.profile_sweep();
        }
        Ok(done)
    }
}

/// A receiver whose requests are always done when it tests them (its sender is faster)
/// makes no call that waits, so it would never read the control ring: a re-admission's
/// `Rebuild` would go unanswered and the rail stay down. Every this many irecvs, one looks
/// at the failover work as a waiting call does (a counter, not the clock: the receiver's
/// data path reads no clock).
const IRECVS_PER_LOOK: u8 = 8;

impl<D: Device> RecvComm<D> {
    /// Reports this comm's work to `sink` (NCCL's profiler), its events naming NCCL device
    /// `device`.
    pub fn set_profiler(&mut self, sink: Option<Sink>, device: i32) {
        self.prof = sink.map(|s| Box::new(RecvProfile::new(s, device)));
    }

    /// `irecv` of `bufs` (checked against their registrations by the caller). The NICs'
    /// SRQs are stocked for every receive it may have outstanding (`nic_queues.rs`).
    pub fn irecv(&mut self, bufs: &[RecvBuf]) -> Result<Option<u16>> {
        self.core.posts.clear();
        let r = self.engine.irecv(bufs, &mut RecvMem(&self.core.region), &mut self.core.posts)?;
        post_all(&mut self.core.rails, &self.core.posts, &mut self.engine)?;
        // "Not now": a call that waits looks for news and the engine's due work; so does
        // every IRECVS_PER_LOOK-th (the clock is read only then).
        self.calls = self.calls.wrapping_add(1);
        if (r.is_none() || self.calls.is_multiple_of(IRECVS_PER_LOOK)) && (self.news() || self.engine.has_work()) {
            self.round(now_ns())?;
        }
        Ok(r)
    }

    /// `iflush`: a 1-byte READ per rail for GPU buffers, nothing (None) for host memory.
    pub fn iflush(&mut self, last: Option<(u64, MrInfo)>) -> Result<Option<u16>> {
        let Some((addr, mh)) = last.filter(|(_, mh)| mh.gpu) else { return Ok(None) };
        if self.core.rails.iter().any(|r| r.flush_qp.is_none()) {
            return Err(Error::internal("flush of GPU memory on a connection without flush QPs"));
        }
        self.core.posts.clear();
        let r =
            self.engine.iflush(FlushBuf { addr, rkeys: [mh.keys[0].rkey, mh.keys[1].rkey] }, &mut self.core.posts)?;
        post_all(&mut self.core.rails, &self.core.posts, &mut self.engine)?;
        Ok(r)
    }

    /// `test` of request `id`: the inboxes, and when that did not complete it, the NICs;
    /// once done, the number of its sizes, which `self.engine.done_sizes` then reads.
    pub fn test(&mut self, id: u16) -> Result<Option<usize>> {
        // (Only what the inboxes brought can have completed it since the last call.) A
        // failure while polling is recorded, and the engine's `test` reports it for a
        // receive it left incomplete, not for one that completed.
        let took = self.take_inboxes(RailMask::BOTH, 0);
        let took = settle(&mut self.engine, took).unwrap_or(true);
        if took && let Some(n) = self.engine.test_n(id)? {
            return Ok(Some(n));
        }
        let polled = self.poll_nics(RailMask::BOTH, 0);
        settle(&mut self.engine, polled);
        let mut done = self.engine.test_n(id)?;
        if done.is_none() {
            // The clock is read only here, by a caller that waits: the engine's own work
            // (a keepalive, failover) when its time has come or news waits.
            let now = now_ns();
            if now >= self.engine.poll_timeout() || self.news() {
                self.round(now)?;
                done = self.engine.test_n(id)?;
            }
        }
        Ok(done)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    struct Fake {
        got: Vec<u64>,
        error: Option<Error>,
    }

    impl Fails for Fake {
        fn fail(&mut self, e: Error) -> Error {
            self.error.get_or_insert(e.clone());
            e
        }
    }

    #[test]
    fn an_overflowed_inbox_fails_its_connection_after_delivering_what_it_holds() {
        let inbox = Inbox::new(2);
        let mut e = Fake { got: Vec::new(), error: None };
        let c = |i| Completion { wr_id: i, ..Completion::default() };
        assert!(inbox.push(&c(1)) && inbox.push(&c(2)));
        let on = |e: &mut Fake, c: &Completion| {
            e.got.push(c.wr_id);
            Ok(())
        };
        assert!(take_inbox(&inbox, &mut e, on).unwrap());
        assert!(!take_inbox(&inbox, &mut e, on).unwrap(), "empty now");
        assert!(inbox.push(&c(3)) && inbox.push(&c(4)));
        assert!(!inbox.push(&c(5)), "full: a bug the connection must hear of");
        let err = take_inbox(&inbox, &mut e, on).unwrap_err();
        assert_eq!(e.got, [1, 2, 3, 4], "what the inbox held was delivered first");
        assert!(err.msg().contains("inbox full (2 entries"), "{}", err.msg());
        assert_eq!(e.error.as_ref().map(|x| x.msg()), Some(err.msg()), "the connection is broken with it");
    }
}
