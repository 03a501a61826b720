//! The data path of one connection: the engine plus its fabric objects. Every call runs on
//! the caller's thread (NCCL's proxy): read the clock once, feed polled completions to the
//! engine, post the chains it emits with one call each. No allocation, no shared lock.

use std::sync::Arc;

use super::devices::DevPair;
use super::mr::{MrInfo, MrMemo};
use crate::engine::layout::{
    CTS_FIFO_BYTES, CTS_SLOT_BYTES, CTS_WORD_OFFSET, CtsEntry, MAX_RECVS, RecvMemory, SendMemory,
};
use crate::engine::{
    CallerWaits, FlushBuf, Posts, QpRef, RAILS, RailCounts, RailMask, RecvBuf, RecvEngine, SendEngine, cold,
};
use crate::error::{Error, Result};
use crate::fabric::mem::HostRegion;
use crate::fabric::{Completion, CompletionQueue, Device, Progress, QueuePair, SharedRecvQueue};

/// Completions polled per CQ call.
const POLL_BATCH: usize = 16;

/// Offsets inside a send comm's control region: the FIFO, then the sizes source, then a
/// scratch page (the receiver's keepalives land there).
pub const SEND_SIZES_OFF: usize = CTS_FIFO_BYTES;
pub const SEND_SCRATCH_OFF: usize = SEND_SIZES_OFF + crate::engine::layout::RECORDS_BYTES;
/// Offsets inside a receive comm's control region: CTS source, records, scratch page.
pub const RECV_RECORDS_OFF: usize = CTS_FIFO_BYTES;
pub const RECV_SCRATCH_OFF: usize = RECV_RECORDS_OFF + crate::engine::layout::RECORDS_BYTES;
/// The flush READs land here (inside the scratch page, away from the probe word).
pub const RECV_FLUSH_OFF: usize = RECV_SCRATCH_OFF + 64;

/// `CLOCK_MONOTONIC` nanoseconds (one clock read per ncclNet call).
#[inline]
pub fn now_ns() -> u64 {
    crate::fabric::clock::monotonic_ns()
}

/// One rail of a connection. Field order is drop order: QPs before the queues they use.
pub struct Rail<D: Device> {
    pub qps: Vec<D::Qp>,
    pub flush_qp: Option<D::Qp>,
    pub srq: Option<D::Srq>,
    pub cq: D::Cq,
    /// The comm's control region registered on this rail.
    pub region_mr: Option<D::Mr>,
    pub dev: Arc<D>,
    /// What this rail holds, for `mpib_resource_stats`.
    pub held: Vec<super::resources::Held>,
}

impl<D: Device> Rail<D> {
    #[inline]
    fn qp(&mut self, q: QpRef) -> Result<&mut D::Qp> {
        let qp = match q {
            QpRef::Cts => self.qps.first_mut(),
            QpRef::Data(i) => self.qps.get_mut(i as usize),
            QpRef::Flush => self.flush_qp.as_mut(),
        };
        qp.ok_or_else(|| cold(|| Error::internal(format!("the engine chose {q:?}, which this rail does not have"))))
    }

    /// Tears the rail down in the order the hardware needs: QPs, then the region's
    /// registration, then (by field drop) the SRQ and the CQ.
    fn shutdown(&mut self) {
        self.qps.clear();
        self.flush_qp = None;
        if let Some(mr) = self.region_mr.take()
            && let Err(e) = self.dev.dereg_mr(mr)
        {
            log::warn!("deregistering a connection's control region: {e}");
        }
    }
}

/// What the comms' shared fabric helpers need of an engine.
trait Engine {
    /// A fabric call failed: the connection is broken, every later call reports it.
    fn set_error(&mut self, e: Error);
}

impl Engine for SendEngine {
    fn set_error(&mut self, e: Error) {
        SendEngine::set_error(self, e);
    }
}

impl Engine for RecvEngine {
    fn set_error(&mut self, e: Error) {
        RecvEngine::set_error(self, e);
    }
}

/// The result of a fabric call (post, poll); a failure is recorded in `engine` first.
#[inline]
fn fabric<T>(engine: &mut impl Engine, r: Result<T>) -> Result<T> {
    // The failure out of line: inlined, its clone made callers too big to inline this.
    match r {
        Ok(v) => Ok(v),
        Err(e) => Err(broken(engine, e)),
    }
}

/// Records `e` as what broke the connection and returns it.
#[cold]
#[inline(never)]
fn broken(engine: &mut impl Engine, e: Error) -> Error {
    engine.set_error(e.clone());
    e
}

/// Posts every chain of `posts` on its rail's QP (one call each).
#[inline]
fn post_all<D: Device>(rails: &mut [Rail<D>; RAILS], posts: &Posts, engine: &mut impl Engine) -> Result<()> {
    if posts.n == 0 {
        return Ok(()); // most tests post nothing: no call
    }
    fabric(engine, post_chains(rails, posts))
}

/// Drains `cq`, `POLL_BATCH` completions a call, handing each batch to `on_batch`.
#[inline]
fn drain_cq<C: CompletionQueue, E: Engine>(
    cq: &mut C,
    wc: &mut [Completion; POLL_BATCH],
    engine: &mut E,
    mut on_batch: impl FnMut(&mut E, &[Completion]) -> Result<()>,
) -> Result<()> {
    loop {
        let n = fabric(engine, cq.poll(wc))?;
        if n == 0 {
            return Ok(());
        }
        on_batch(engine, &wc[..n])?;
        if n < POLL_BATCH {
            return Ok(());
        }
    }
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

/// The sender's control region as the engine sees it.
struct SendMem<'a>(&'a HostRegion);

impl SendMemory for SendMem<'_> {
    #[inline]
    fn fifo_word(&self, slot: usize, i: usize) -> u64 {
        self.0.load_acquire(slot * CTS_SLOT_BYTES + i * 64 + CTS_WORD_OFFSET)
    }
    #[inline]
    fn fifo_entry(&self, slot: usize, i: usize) -> CtsEntry {
        let base = slot * CTS_SLOT_BYTES + i * 64;
        // Words 4..6 are padding (see `CtsEntry::to_words`): not read.
        let [w0, w1, w2, w3] = self.0.load_words::<4>(base);
        CtsEntry::from_words(&[w0, w1, w2, w3, 0, 0, 0, self.0.load(base + 56)])
    }
    #[inline]
    fn write_sizes(&mut self, slot: usize, sizes: &[u64]) {
        for (i, &s) in sizes.iter().enumerate() {
            self.0.store(SEND_SIZES_OFF + slot * 64 + i * 8, s);
        }
    }
}

/// The receiver's control region as the engine sees it.
struct RecvMem<'a>(&'a HostRegion);

impl RecvMemory for RecvMem<'_> {
    #[inline]
    fn write_cts(&mut self, slot: usize, i: usize, e: &CtsEntry) {
        self.0.store_words(slot * CTS_SLOT_BYTES + i * 64, &e.to_words());
    }
    #[inline]
    fn record(&self, slot: usize, i: usize) -> u64 {
        self.0.load_acquire(RECV_RECORDS_OFF + slot * 64 + i * 8)
    }
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

/// A connected send comm.
pub struct SendComm<D: Device> {
    pub rails: [Rail<D>; RAILS],
    /// The rails whose CQs `test` polls even with nothing of this side outstanding: those
    /// whose device makes progress only when polled ([`Progress::OnPoll`]).
    poll_always: RailMask,
    pub engine: SendEngine,
    pub dev: Arc<DevPair<D>>,
    pub seqs: Seqs,
    pub mr_memo: MrMemo,
    posts: Posts,
    wc: [Completion; POLL_BATCH],
    region: HostRegion,
    _held: super::resources::Held,
}

impl<D: Device> SendComm<D> {
    pub fn new(rails: [Rail<D>; RAILS], engine: SendEngine, dev: Arc<DevPair<D>>, region: HostRegion) -> Self {
        let mut engine = engine;
        let poll_always = RailMask::from_fn(|r| rails[r].dev.attrs().progress == Progress::OnPoll);
        engine.start(now_ns());
        SendComm {
            rails,
            poll_always,
            engine,
            dev,
            seqs: Seqs::new(512),
            mr_memo: MrMemo::default(),
            posts: Posts::default(),
            wc: [Completion::default(); POLL_BATCH],
            region,
            _held: super::resources::Held::new(super::resources::Res::SendComms, 1),
        }
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
        self.posts.clear();
        let mut r = self.engine.isend(now, buf, &mut SendMem(&self.region), &mut self.posts)?;
        if r.is_none() {
            // The CTS may be waiting in the fabric (the soft NIC moves bytes when polled).
            self.poll(RailMask::BOTH, now)?;
            r = self.engine.isend(now, buf, &mut SendMem(&self.region), &mut self.posts)?;
            if r.is_none() {
                // Still no CTS: keep the idle rails probed, so a dead receiver is noticed.
                self.engine.poll_probes(now, CallerWaits::Yes, &mut self.posts);
            }
        }
        post_all(&mut self.rails, &self.posts, &mut self.engine)?;
        Ok(r)
    }

    /// Polls the CQs of `rails` and feeds the engine (`now`: this call's clock).
    fn poll(&mut self, rails: RailMask, now: u64) -> Result<()> {
        for rail in 0..RAILS {
            if !rails.contains(rail) {
                continue;
            }
            drain_cq(&mut self.rails[rail].cq, &mut self.wc, &mut self.engine, |engine, batch| {
                for c in batch {
                    engine.on_completion(now, rail, c)?;
                }
                Ok(())
            })?;
        }
        Ok(())
    }

    /// `test` of request `id`: polls, probes idle rails, returns the bytes sent when done.
    pub fn test(&mut self, id: u16) -> Result<Option<u64>> {
        // The rails with something to complete, and those where polling is also what
        // answers the peer (the TCP soft NIC: a rail may carry only CTS traffic).
        let now = now_ns();
        let rails = self.poll_always | self.engine.busy_rails();
        self.poll(rails, now)?;
        let done = self.engine.test(id)?;
        self.posts.clear();
        let waits = if done.is_none() { CallerWaits::Yes } else { CallerWaits::No };
        self.engine.poll_probes(now, waits, &mut self.posts);
        post_all(&mut self.rails, &self.posts, &mut self.engine)?;
        Ok(done)
    }

    pub fn counters(&self) -> [RailCounts; RAILS] {
        self.engine.counters()
    }
}

impl<D: Device> Drop for SendComm<D> {
    fn drop(&mut self) {
        for r in &mut self.rails {
            r.shutdown();
        }
    }
}

/// A connected receive comm.
pub struct RecvComm<D: Device> {
    pub rails: [Rail<D>; RAILS],
    pub engine: RecvEngine,
    rnr_seen: [u64; RAILS],
    pub dev: Arc<DevPair<D>>,
    pub seqs: Seqs,
    pub mr_memo: MrMemo,
    posts: Posts,
    wc: [Completion; POLL_BATCH],
    region: HostRegion,
    _held: super::resources::Held,
}

impl<D: Device> RecvComm<D> {
    pub fn new(rails: [Rail<D>; RAILS], engine: RecvEngine, dev: Arc<DevPair<D>>, region: HostRegion) -> Self {
        RecvComm {
            rails,
            engine,
            rnr_seen: [0; RAILS],
            dev,
            seqs: Seqs::new(512),
            mr_memo: MrMemo::default(),
            posts: Posts::default(),
            wc: [Completion::default(); POLL_BATCH],
            region,
            _held: super::resources::Held::new(super::resources::Res::RecvComms, 1),
        }
    }

    /// Tops the shared receive queues up between their watermarks (one post per rail).
    /// Inlined into `irecv` and `test`: no frame on either.
    #[inline(always)]
    fn refill(&mut self) -> Result<()> {
        for rail in 0..RAILS {
            let n = self.engine.srq_refill(rail);
            if n == 0 {
                continue;
            }
            let Some(srq) = self.rails[rail].srq.as_mut() else { continue };
            fabric(&mut self.engine, srq.post_recv(n))?;
            self.engine.srq_posted(rail, n);
        }
        Ok(())
    }

    /// `irecv` of `bufs` (checked against their registrations by the caller).
    pub fn irecv(&mut self, bufs: &[RecvBuf]) -> Result<Option<u16>> {
        self.refill()?;
        self.posts.clear();
        let r = self.engine.irecv(now_ns(), bufs, &mut RecvMem(&self.region), &mut self.posts)?;
        post_all(&mut self.rails, &self.posts, &mut self.engine)?;
        Ok(r)
    }

    /// `iflush`: a 1-byte READ per rail for GPU buffers, nothing (None) for host memory.
    pub fn iflush(&mut self, last: Option<(u64, MrInfo)>) -> Result<Option<u16>> {
        let Some((addr, mh)) = last.filter(|(_, mh)| mh.gpu) else { return Ok(None) };
        if self.rails.iter().any(|r| r.flush_qp.is_none()) {
            return Err(Error::internal("flush of GPU memory on a connection without flush QPs"));
        }
        self.posts.clear();
        let r = self.engine.iflush(FlushBuf { addr, rkeys: [mh.keys[0].rkey, mh.keys[1].rkey] }, &mut self.posts)?;
        post_all(&mut self.rails, &self.posts, &mut self.engine)?;
        Ok(r)
    }

    /// Drains both rails' CQs into the engine. Inlined into `test`, its one caller.
    #[inline(always)]
    fn poll(&mut self) -> Result<()> {
        for rail in 0..RAILS {
            let mem = RecvMem(&self.region);
            drain_cq(&mut self.rails[rail].cq, &mut self.wc, &mut self.engine, |engine, batch| {
                let now = now_ns();
                for c in batch {
                    engine.on_completion(now, rail, c, &mem)?;
                }
                Ok(())
            })?;
        }
        Ok(())
    }

    /// `test` of request `id`: polls both rails, refills the SRQs; once done, the sizes are
    /// in `sizes` and their number is returned.
    pub fn test(&mut self, id: u16, sizes: &mut [u64; MAX_RECVS]) -> Result<Option<usize>> {
        self.poll()?;
        self.refill()?;
        self.count_rnr();
        let done = self.engine.test_into(id, sizes)?;
        if done.is_none() {
            self.posts.clear();
            self.engine.poll_keepalive(now_ns(), &mut self.posts);
            post_all(&mut self.rails, &self.posts, &mut self.engine)?;
        }
        Ok(done)
    }

    /// Publishes the receiver-not-ready waits the SRQs saw since the last call.
    fn count_rnr(&mut self) {
        for rail in 0..RAILS {
            let total = self.rails[rail].srq.as_ref().map_or(0, |s| s.rnr_events());
            if total > self.rnr_seen[rail] {
                self.engine.count_rnr(rail, total - self.rnr_seen[rail]);
                self.rnr_seen[rail] = total;
            }
        }
    }

    pub fn counters(&self) -> [RailCounts; RAILS] {
        self.engine.counters()
    }
}

impl<D: Device> Drop for RecvComm<D> {
    fn drop(&mut self) {
        for r in &mut self.rails {
            r.shutdown();
        }
    }
}
