//! The sender: matches `isend`s to the receiver's CTS entries in posting order, decides the
//! split of each send immediately before posting, emits one chain per active rail (nothing
//! on an inactive rail), and completes sends when every active rail's signalled WR did.

use super::imm::{Imm, MASK_SOUT, MASK_SUP, SIZEQ_SENTINEL};
use super::layout::{CtsEntry, MAX_RECVS, RECORD_SLOT_BYTES, SLOTS, SendMemory};
use super::{
    Chain, ErrorState, MAX_CHAIN, Posts, QpRef, RAIL_NAMES, RAILS, RailCounts, SOUT, SUP, WrKind, cold,
    completion_error,
};
use crate::error::{Error, Result};
use crate::fabric::{Completion, SendWr, Sge, WcStatus, WrOpcode};
use crate::split::{AnySplit, SHARE_ALIGN, SplitPolicy};
use crate::telemetry::{RailTelemetry, RailView, Sample};

/// What the sender needs to know about the connection.
#[derive(Clone, Debug)]
pub struct SendConfig {
    /// Data QPs per rail (`MPIB_SOUT_QP`, `MPIB_SUP_QP`).
    pub qps: [u16; RAILS],
    /// Most send requests in flight (NCCL_NET_MAX_REQUESTS × maxRecvs).
    pub max_requests: usize,
    /// Local source of the completion-record writes: address and lkey per rail.
    pub sizes_addr: u64,
    pub sizes_lkeys: [u32; RAILS],
    /// The receiver's completion records: address and rkey per rail.
    pub records_addr: u64,
    pub records_rkeys: [u32; RAILS],
    /// The receiver's probe scratch word: address and rkey per rail.
    pub scratch_addr: u64,
    pub scratch_rkeys: [u32; RAILS],
    /// Payloads up to this many bytes are posted inline.
    pub max_inline: u32,
    /// Probe a rail idle for this long (0 = never).
    pub probe_interval_ns: u64,
}

/// One send as NCCL gave it.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct SendBuf {
    pub addr: u64,
    pub size: u64,
    pub tag: u32,
    pub lkeys: [u32; RAILS],
}

#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
enum ReqState {
    #[default]
    Free,
    /// Matched to a CTS entry, waiting for the other sends of its slot or its completion.
    Pending,
    Done,
}

#[derive(Clone, Copy, Debug, Default)]
struct SendReq {
    state: ReqState,
    /// Bytes actually sent (clamped to the posted receive).
    size: u64,
}

/// A slot whose chains are posted and not yet complete.
#[derive(Clone, Copy, Debug, Default)]
struct PostedSlot {
    n: u8,
    reqs: [u16; MAX_RECVS],
    /// Rails whose signalled WR has not completed yet.
    pending: u8,
    posted_ns: [u64; RAILS],
    bytes: [u64; RAILS],
}

/// The slot being matched: its CTS entries and which send took each (its request and
/// buffer, kept here until the slot is posted).
#[derive(Clone, Copy, Debug, Default)]
struct Matching {
    n: usize,
    matched: usize,
    entries: [CtsEntry; MAX_RECVS],
    reqs: [Option<u16>; MAX_RECVS],
    bufs: [SendBuf; MAX_RECVS],
}

/// The sending side of one connection.
pub struct SendEngine {
    cfg: SendConfig,
    split: AnySplit,
    tel: [RailTelemetry; RAILS],
    reqs: Box<[SendReq]>,
    free: Vec<u16>,
    slots: Box<[PostedSlot; SLOTS]>,
    /// CTS slots consumed so far; the next slot is `fifo_head % SLOTS`.
    fifo_head: u64,
    /// The slot being matched, when `matching` (kept in place: no copies per send).
    cur: Matching,
    matching: bool,
    /// Round-robin data-QP cursor per rail.
    rr: [u16; RAILS],
    /// Slots whose signalled WR on the rail has not completed.
    outstanding: [u32; RAILS],
    /// The rail has carried a transfer of this connection (keepalives go only there).
    carried: [bool; RAILS],
    error: ErrorState,
    truncations: u64,
}

impl SendEngine {
    /// The connection came up at `now_ns` (idle rails are probed, and kept alive, from then on).
    pub fn start(&mut self, now_ns: u64) {
        for t in &mut self.tel {
            t.start(now_ns);
        }
    }

    pub fn new(cfg: SendConfig, split: AnySplit, tel: [RailTelemetry; RAILS]) -> Self {
        assert!(cfg.qps.iter().all(|&q| q >= 1), "each rail needs at least one QP");
        let n = cfg.max_requests.clamp(1, SLOTS);
        SendEngine {
            split,
            tel,
            reqs: vec![SendReq::default(); n].into_boxed_slice(),
            free: (0..n as u16).rev().collect(),
            slots: Box::new([PostedSlot::default(); SLOTS]),
            fifo_head: 0,
            cur: Matching::default(),
            matching: false,
            rr: [0; RAILS],
            outstanding: [0; RAILS],
            carried: [false; RAILS],
            error: ErrorState::default(),
            truncations: 0,
            cfg,
        }
    }

    /// The counters of both rails, now.
    pub fn counters(&self) -> [RailCounts; RAILS] {
        [self.tel[SOUT].stats().counters.load(), self.tel[SUP].stats().counters.load()]
    }

    pub fn telemetry(&self) -> &[RailTelemetry; RAILS] {
        &self.tel
    }

    /// Sends clamped to a smaller posted receive so far.
    pub fn truncations(&self) -> u64 {
        self.truncations
    }

    /// The error that broke this connection, if any.
    pub fn error(&self) -> Option<&Error> {
        self.error.get()
    }

    /// Rails with signalled WRs in flight (the CQs worth polling).
    pub fn busy_rails(&self) -> u8 {
        let mut m = 0;
        for r in 0..RAILS {
            if self.outstanding[r] > 0 || self.tel[r].probe_outstanding() {
                m |= 1 << r;
            }
        }
        m
    }

    /// Puts the connection in the error state for a failure outside the engine (a post
    /// or poll the fabric refused); every later call reports it.
    pub fn set_error(&mut self, e: Error) {
        self.error.fail(e);
    }

    /// Reads the next CTS slot if the receiver has written all of it.
    fn poll_cts(&mut self, mem: &impl SendMemory) -> Result<bool> {
        let slot = (self.fifo_head % SLOTS as u64) as usize;
        if self.slots[slot].pending != 0 {
            // The slot's previous use still awaits completions (the receiver freed the slot
            // when the IMMs landed; acks can come later). Completions name only (rail, slot):
            // taking the slot now would let a late one complete the new send early and leave
            // the old one pending forever. Not now: NCCL's test on the old sends polls them.
            return Ok(false);
        }
        let w0 = mem.fifo_word(slot, 0);
        if w0 >> 8 != self.fifo_head + 1 {
            return Ok(false);
        }
        let n = (w0 & 0xff) as usize;
        if n == 0 || n > MAX_RECVS {
            return Err(self.error.fail(cold(|| {
                Error::remote(format!(
                    "protocol violation: CTS slot {slot} announces {n} receives (1..{MAX_RECVS} allowed)"
                ))
            })));
        }
        // The last word of the slot's WRITE is placed last: when it is fresh, all is.
        if n > 1 && mem.fifo_word(slot, n - 1) != w0 {
            return Ok(false);
        }
        for i in 0..n {
            let e = mem.fifo_entry(slot, i);
            if e.word != w0 || e.nreqs as usize != n {
                return Err(self.error.fail(cold(|| Error::remote(format!(
                    "protocol violation: CTS slot {slot} entry {i} is inconsistent (word {:#x}, nreqs {}, expected {w0:#x}, {n})",
                    e.word, e.nreqs
                )))));
            }
            self.cur.entries[i] = e;
        }
        let m = &mut self.cur;
        (m.n, m.matched) = (n, 0);
        m.reqs = [None; MAX_RECVS];
        self.matching = true;
        Ok(true)
    }

    /// `isend`: `Ok(None)` when the matching receive is not posted yet, or its CTS slot's
    /// previous use still awaits completions (NCCL retries; polling the CQs of
    /// [`Self::busy_rails`] frees the slot).
    /// When this send completes its slot, the slot's chains are appended to `out`.
    pub fn isend(
        &mut self,
        now_ns: u64,
        buf: SendBuf,
        mem: &mut impl SendMemory,
        out: &mut Posts,
    ) -> Result<Option<u16>> {
        self.error.check()?;
        if !self.matching && !self.poll_cts(mem)? {
            return Ok(None);
        }
        let m = &self.cur;
        // Tags select the buffer within the slot, first unmatched one first.
        let Some(i) = (0..m.n).find(|&i| m.reqs[i].is_none() && m.entries[i].tag == buf.tag) else {
            // Not for this slot: net_ib also answers "not now"; NCCL matches in order.
            return Ok(None);
        };
        let posted = m.entries[i].size;
        let Some(id) = self.free.pop() else {
            return Err(cold(|| {
                Error::internal(format!(
                    "too many send requests in flight (at most {}): NCCL must test and complete earlier ones",
                    self.reqs.len()
                ))
            }));
        };
        let size = buf.size.min(posted);
        if size < buf.size {
            self.truncated(&buf, posted);
        }
        self.reqs[id as usize] = SendReq { state: ReqState::Pending, size };
        let m = &mut self.cur;
        m.reqs[i] = Some(id);
        m.bufs[i] = buf;
        m.matched += 1;
        if m.matched == m.n {
            self.matching = false;
            self.post_slot(now_ns, mem, out)?;
        }
        Ok(Some(id))
    }

    /// A send larger than its posted receive: clamped, as net_ib does.
    #[cold]
    #[inline(never)]
    fn truncated(&mut self, buf: &SendBuf, posted: u64) {
        self.truncations += 1;
        log::warn!(
            "isend of {} bytes (tag {}) truncated to the posted receive of {posted} bytes, as net_ib does",
            buf.size,
            buf.tag,
        );
    }

    fn views(&self) -> [RailView; RAILS] {
        [*self.tel[SOUT].view(), *self.tel[SUP].view()]
    }

    /// The policy's bytes on SOUT for a `size`-byte send, both rails healthy.
    #[inline]
    fn sout_share(&mut self, size: u64, now_ns: u64) -> u64 {
        match &mut self.split {
            AnySplit::Fixed(f) => f.sout_bytes(size, now_ns, &[*self.tel[SOUT].view(), *self.tel[SUP].view()]),
            AnySplit::Auto(_) => self.auto_share(size, now_ns),
        }
    }

    /// Out of line: inlined, the compiler computes its rail arithmetic ahead of the policy
    /// check, for fixed splits too.
    #[inline(never)]
    fn auto_share(&mut self, size: u64, now_ns: u64) -> u64 {
        let views = self.views();
        self.split.sout_bytes(size, now_ns, &views)
    }

    /// The bytes of a `size`-byte send that go on SOUT (the rest go on SUP), given which
    /// rails have failed.
    #[inline]
    fn sout_part(&mut self, size: u64, now_ns: u64, failed: [bool; RAILS]) -> u64 {
        if failed[SUP] {
            size
        } else if failed[SOUT] {
            0
        } else {
            let s = self.sout_share(size, now_ns).min(size);
            // A policy must answer in 128-byte units; repair anything else.
            if s != size && !s.is_multiple_of(SHARE_ALIGN) { crate::split::align_share(s, size) } else { s }
        }
    }

    /// The next data QP of `rail` (round robin).
    #[inline]
    fn next_qp(&mut self, rail: usize) -> QpRef {
        let qp = self.rr[rail];
        // Kept below the QP count: no division per post.
        self.rr[rail] = if qp + 1 >= self.cfg.qps[rail] { 0 } else { qp + 1 };
        QpRef::Data(qp)
    }

    /// Book-keeping of a chain posted on `rail` for `slot`: counters, telemetry, in flight.
    /// Always inlined: as a call (one a send) its arguments and frame cost a fifth of it.
    #[inline(always)]
    fn posted(&mut self, now_ns: u64, rail: usize, slot: usize, wrs: u64, rail_bytes: u64, total: u64) {
        // One doorbell; exactly one WRITE_WITH_IMM per active rail.
        self.tel[rail].stats().count_post(wrs, 1, rail_bytes, total);
        self.tel[rail].on_post(now_ns, rail_bytes);
        self.outstanding[rail] += 1;
        self.carried[rail] = true;
        let ps = &mut self.slots[slot];
        ps.posted_ns[rail] = now_ns;
        ps.bytes[rail] = rail_bytes;
    }

    /// Splits and posts the fully matched slot `cur`: one chain per active rail.
    fn post_slot(&mut self, now_ns: u64, mem: &mut impl SendMemory, out: &mut Posts) -> Result<()> {
        let slot = (self.fifo_head % SLOTS as u64) as usize;
        let failed = [self.tel[SOUT].view().failed, self.tel[SUP].view().failed];
        if failed[SOUT] && failed[SUP] {
            return Err(self.error.fail(Error::remote("both rails have failed")));
        }
        let n = self.cur.n;
        if n == 1 {
            let id = self.cur.reqs[0].expect("matched");
            let size = self.reqs[id as usize].size;
            if Imm::size_q_for(size) != SIZEQ_SENTINEL {
                self.post_single(now_ns, slot, id, size, failed, out);
                return Ok(());
            }
        }
        // Per send: bytes on SOUT (the first part of the buffer), the rest on SUP.
        let mut sout = [0u64; MAX_RECVS];
        let mut sizes = [0u64; MAX_RECVS];
        let mut ids = [0u16; MAX_RECVS];
        let mut mask = 0u8;
        let mut total = 0u64;
        for i in 0..n {
            ids[i] = self.cur.reqs[i].expect("matched");
            let size = self.reqs[ids[i] as usize].size;
            let s = self.sout_part(size, now_ns, failed);
            sizes[i] = size;
            sout[i] = s;
            total += size;
            if s > 0 {
                mask |= MASK_SOUT;
            }
            if size > s {
                mask |= MASK_SUP;
            }
        }
        if mask == 0 {
            // All sizes are 0: SOUT alone carries the (empty) transfer.
            mask = if failed[SOUT] { MASK_SUP } else { MASK_SOUT };
        }
        let imm = Imm { slot: slot as u8, mask, size_q: SIZEQ_SENTINEL }.encode();
        let leader = if mask & MASK_SOUT != 0 { SOUT } else { SUP };
        mem.write_sizes(slot, &sizes[..n]);
        self.slots[slot] = PostedSlot { n: n as u8, reqs: ids, pending: mask, ..PostedSlot::default() };
        for rail in [SOUT, SUP] {
            if mask & (1 << rail) == 0 {
                continue; // an inactive rail sends nothing at all
            }
            let qp = self.next_qp(rail);
            let c = out.push(rail, qp);
            let mut rail_bytes = 0u64;
            for i in 0..n {
                let (off, len) = if rail == SOUT { (0, sout[i]) } else { (sout[i], sizes[i] - sout[i]) };
                rail_bytes += len;
                if len > 0 {
                    c.push(self.data_wr(rail, slot, &self.cur.bufs[i], &self.cur.entries[i], off, len, false, 0));
                }
            }
            c.push(self.signal_wr(rail, slot, n, rail == leader, imm));
            debug_assert!(c.len as usize <= MAX_CHAIN);
            let wrs = c.len as u64;
            self.posted(now_ns, rail, slot, wrs, rail_bytes, total);
        }
        self.fifo_head += 1;
        Ok(())
    }

    /// The fast path of a single receive whose size `size_q` encodes: one WRITE_WITH_IMM
    /// per active rail carries its share of the data and the IMM.
    #[inline]
    fn post_single(&mut self, now_ns: u64, slot: usize, id: u16, size: u64, failed: [bool; RAILS], out: &mut Posts) {
        let s = self.sout_part(size, now_ns, failed);
        let mut mask = if s > 0 { MASK_SOUT } else { 0 } | if size > s { MASK_SUP } else { 0 };
        if mask == 0 {
            // An empty send: SOUT alone carries it.
            mask = if failed[SOUT] { MASK_SUP } else { MASK_SOUT };
        }
        let imm = Imm { slot: slot as u8, mask, size_q: Imm::size_q_for(size) }.encode();
        let ps = &mut self.slots[slot];
        (ps.n, ps.reqs[0], ps.pending) = (1, id, mask);
        for rail in [SOUT, SUP] {
            if mask & (1 << rail) == 0 {
                continue; // an inactive rail sends nothing at all
            }
            let (off, len) = if rail == SOUT { (0, s) } else { (s, size - s) };
            let qp = self.next_qp(rail);
            out.push(rail, qp).push(self.data_wr(
                rail,
                slot,
                &self.cur.bufs[0],
                &self.cur.entries[0],
                off,
                len,
                true,
                imm,
            ));
            self.posted(now_ns, rail, slot, 1, len, size);
        }
        self.fifo_head += 1;
    }

    #[allow(clippy::too_many_arguments)]
    #[inline]
    fn data_wr(
        &self,
        rail: usize,
        slot: usize,
        buf: &SendBuf,
        entry: &CtsEntry,
        off: u64,
        len: u64,
        with_imm: bool,
        imm: u32,
    ) -> SendWr {
        let mut wr = SendWr {
            wr_id: if with_imm { WrKind::DataSignal.id(rail, slot) } else { WrKind::Data.id(rail, slot) },
            opcode: if with_imm { WrOpcode::WriteImm } else { WrOpcode::Write },
            signaled: with_imm,
            inline: len > 0 && len <= self.cfg.max_inline as u64,
            remote_addr: entry.addr + off,
            rkey: entry.rkeys[rail],
            imm,
            ..SendWr::default()
        };
        if len > 0 {
            wr.num_sge = 1;
            wr.sge[0] = Sge { addr: buf.addr + off, len: len as u32, lkey: buf.lkeys[rail] };
        }
        wr
    }

    /// The signalling WRITE_WITH_IMM of a multi-receive (or oversized) slot: the leader
    /// rail also writes the sizes into the receiver's completion records.
    #[inline]
    fn signal_wr(&self, rail: usize, slot: usize, n: usize, leader: bool, imm: u32) -> SendWr {
        let off = (slot * RECORD_SLOT_BYTES) as u64;
        let mut wr = SendWr {
            wr_id: WrKind::DataSignal.id(rail, slot),
            opcode: WrOpcode::WriteImm,
            signaled: true,
            remote_addr: self.cfg.records_addr + off,
            rkey: self.cfg.records_rkeys[rail],
            imm,
            ..SendWr::default()
        };
        if leader {
            let len = (n * 8) as u32;
            wr.num_sge = 1;
            wr.inline = len <= self.cfg.max_inline;
            wr.sge[0] = Sge { addr: self.cfg.sizes_addr + off, len, lkey: self.cfg.sizes_lkeys[rail] };
        }
        wr
    }

    /// Emits a probe on each healthy rail idle for the probe interval.
    ///
    /// `waiting`: the caller waits on this connection (a send without its CTS, or not yet
    /// complete), so even with probes off an idle rail gets a keepalive every
    /// [`KEEPALIVE_NS`](super::KEEPALIVE_NS): a dead receiver is then noticed.
    pub fn poll_probes(&mut self, now_ns: u64, waiting: bool, out: &mut Posts) {
        if self.error.is_set() {
            return;
        }
        for rail in 0..RAILS {
            // Not while a signalled WR is out (an empty transfer's carries 0 bytes, so the
            // telemetry's bytes in flight does not see it).
            if self.outstanding[rail] > 0 {
                continue;
            }
            let t = &self.tel[rail];
            let probe = self.cfg.probe_interval_ns > 0 && t.probe_due(now_ns, self.cfg.probe_interval_ns);
            // A keepalive goes on a rail that carries this connection's transfers (SOUT
            // before any): one live rail tells a dead receiver, and a rail that carries no
            // bytes sends nothing at all (MPIB_SPLIT=sout leaves SUP silent).
            let carries = self.carried[rail] || (rail == SOUT && !self.carried.contains(&true));
            let keepalive = waiting && carries && t.probe_due(now_ns, super::KEEPALIVE_NS);
            if !(probe || keepalive) {
                continue;
            }
            let c: &mut Chain = out.push(rail, QpRef::Data(0));
            c.push(SendWr {
                wr_id: WrKind::Probe.id(rail, 0),
                opcode: WrOpcode::Write,
                signaled: true,
                inline: true,
                num_sge: 1,
                sge: [Sge { addr: self.cfg.sizes_addr, len: 8, lkey: self.cfg.sizes_lkeys[rail] }, Sge::default()],
                remote_addr: self.cfg.scratch_addr,
                rkey: self.cfg.scratch_rkeys[rail],
                ..SendWr::default()
            });
            // A probe is a WR and a doorbell, and counts in `probes` (not as data).
            self.tel[rail].on_probe_post(now_ns);
            self.tel[rail].stats().count_post(1, 0, 0, 0);
        }
    }

    /// A completion polled from `rail`'s CQ. `now_ns` is used when it has no timestamp.
    pub fn on_completion(&mut self, now_ns: u64, rail: usize, c: &Completion) -> Result<()> {
        self.tel[rail].stats().count_cqes(1);
        // A broken connection interprets nothing more (flushed WRs, late completions).
        self.error.check()?;
        let Some((kind, wr_rail, slot)) = WrKind::decode(c.wr_id) else {
            return Err(self.error.unknown_wr_id(rail, c.wr_id));
        };
        let t = if c.timestamp_ns != 0 { c.timestamp_ns } else { now_ns };
        if c.status != WcStatus::Success {
            self.tel[wr_rail].on_error();
            return Err(self.error.fail(cold(|| completion_error(wr_rail, &kind.what(slot), c.status))));
        }
        match kind {
            WrKind::DataSignal => {
                let s = &mut self.slots[slot];
                if s.pending & (1 << wr_rail) == 0 {
                    return Err(self.error.fail(cold(|| {
                        Error::internal(format!(
                            "{} rail: completion for slot {slot}, which has none outstanding",
                            RAIL_NAMES[wr_rail]
                        ))
                    })));
                }
                s.pending &= !(1 << wr_rail);
                self.outstanding[wr_rail] -= 1;
                let sample = Sample { posted_ns: s.posted_ns[wr_rail], completed_ns: t, bytes: s.bytes[wr_rail] };
                let done = s.pending == 0;
                let (n, reqs) = (s.n as usize, s.reqs);
                self.tel[wr_rail].on_complete(sample);
                if done {
                    for &id in &reqs[..n] {
                        self.reqs[id as usize].state = ReqState::Done;
                    }
                }
                Ok(())
            }
            WrKind::Probe => {
                if !self.tel[wr_rail].probe_outstanding() {
                    return Err(self.error.fail(cold(|| {
                        Error::internal(format!(
                            "{} rail: probe completion, but no probe is in flight",
                            RAIL_NAMES[wr_rail]
                        ))
                    })));
                }
                self.tel[wr_rail].on_probe_complete(t);
                Ok(())
            }
            _ => Err(self.error.fail(cold(|| {
                Error::internal(format!(
                    "{} rail: unexpected {kind:?} completion on a send connection",
                    RAIL_NAMES[wr_rail]
                ))
            }))),
        }
    }

    /// `test`: the bytes sent once request `id` is complete (then `id` is free again).
    /// Inlined into the comm's `test`, its one caller.
    #[inline(always)]
    pub fn test(&mut self, id: u16) -> Result<Option<u64>> {
        // Every call after a failure reports it, even for a request that had completed.
        self.error.check()?;
        let Some(r) = self.reqs.get_mut(id as usize) else {
            return Err(cold(|| Error::internal(format!("send request {id} does not exist"))));
        };
        match r.state {
            ReqState::Done => {
                let size = r.size;
                *r = SendReq::default();
                self.free.push(id);
                Ok(Some(size))
            }
            ReqState::Pending => Ok(None),
            ReqState::Free => {
                Err(cold(|| Error::internal(format!("send request {id} is not in flight (tested after done?)"))))
            }
        }
    }

    /// Whether request `id` is in flight (allocated and not yet returned by `test`).
    pub fn is_live(&self, id: u16) -> bool {
        self.reqs.get(id as usize).is_some_and(|r| r.state != ReqState::Free)
    }
}
