//! The requester half of a connection: its send queue, where each WR is on its way
//! (posted, transmitted, executed by the peer, completed), the READs waiting for their
//! response, and the completions it produces, in posting order.
//!
//! Sequence numbers are send-queue positions: the n-th WR ever posted on a QP is request
//! `seq == n` (wrapping `u32`), so `head ≤ acked ≤ tx_done ≤ sent ≤ tail` are all request
//! numbers: `head` is the oldest WR not yet completed, `acked` says every request below it
//! was executed by the peer, `tx_done` that every one below it left in full, `sent` that
//! every one below it started to leave, `tail` is the next to be posted. (In-process mode
//! moves `acked`, `tx_done` and `sent` together: a WR is executed as it is sent.)
//!
//! Storage is sized to use: the send queue and its inline slots start at
//! [`FIRST_SLOTS`] entries and double when posting needs more, up to the QP's depth
//! (`max_send_wr`), so a QP that keeps one or two WRs in flight holds a few KiB, not the
//! depth × `max_inline` bytes its caps allow.
//!
//! Acknowledgements (TCP): a request the requester waits for carries ACK_REQ (a signalled
//! WR, and at least every quarter of the queue's depth, so unsignalled WRs retire too); the
//! responder acknowledges those by its caller's next step at the latest (`link.rs`) and lets
//! the others ride along with later frames.
//! The requester waits on the peer (the silent-peer check runs) only while a request that
//! must be answered (ACK_REQ, or a READ) is not.

use super::fault::{Fault, nak_status};
use super::frame::{Frame, MAX_MSG, NakCode};
use super::mr::MrTable;
use super::ring::Producer;
use crate::error::Error;
use crate::fabric::{Access, Completion, MAX_SGE, SendWr, WcOpcode, WcStatus, WrOpcode};

/// Most READs a requester has outstanding (verbs' `max_rd_atomic`).
pub const MAX_RD_ATOMIC: usize = 16;

/// Send-queue entries a QP starts with (the queue doubles as posting needs, up to its depth).
pub const FIRST_SLOTS: usize = 8;

/// `a < b` in wrapping sequence space.
#[inline]
pub fn seq_lt(a: u32, b: u32) -> bool {
    (a.wrapping_sub(b) as i32) < 0
}

/// One posted WR.
#[derive(Clone, Copy, Default)]
pub struct SqEntry {
    pub wr: SendWr,
    /// The local memory of the WR failed its check at post time (inline copy).
    pub bad_local: bool,
    /// READ: the response was placed.
    pub read_done: bool,
}

/// The SGEs of `wr` as (lkey, address, length), the rest 0.
pub fn segs_of(wr: &SendWr) -> [(u32, u64, u64); MAX_SGE] {
    let mut s = [(0, 0, 0); MAX_SGE];
    for (d, g) in s.iter_mut().zip(&wr.sge[..wr.num_sge as usize]) {
        *d = (g.lkey, g.addr, g.len as u64);
    }
    s
}

/// The completion of the send WR `wr` (`len` bytes) of QP `qp_num`.
#[inline(always)]
pub fn wr_completion(wr: &SendWr, len: u64, status: WcStatus, qp_num: u32) -> Completion {
    let opcode = if wr.opcode == WrOpcode::Read { WcOpcode::RdmaRead } else { WcOpcode::RdmaWrite };
    Completion { wr_id: wr.wr_id, status, opcode, byte_len: len as u32, qp_num, ..Completion::default() }
}

/// The send queue of one QP (see the module documentation).
#[derive(Default)]
pub struct Requester {
    /// A power of two of entries, at most the depth rounded up; `seq & mask` is the slot.
    sq: Vec<SqEntry>,
    mask: u32,
    /// The depth (`max_send_wr`): WRs posted and not completed at most.
    depth: u32,
    /// Inline payloads, `max_inline` bytes per send-queue slot, copied at post time.
    inline: Vec<u8>,
    max_inline: usize,
    /// The last request that must be answered (ACK_REQ or READ), and the last ACK_REQ.
    need: Option<u32>,
    last_ack_req: u32,
    /// Bumped when the requester goes back to resend (RNR): notes of frames sent before
    /// are stale.
    round: u32,
    /// The last retire found the CQ full.
    blocked: bool,
    head: u32,
    tx_done: u32,
    sent: u32,
    tail: u32,
    acked: u32,
    /// Transmitted READs still waiting for their response, oldest first (a ring).
    reads: [u32; MAX_RD_ATOMIC],
    reads_len: usize,
    reads_head: usize,
    /// A fault hook fired on this request (`hook.rs`): its ACK is taken as the link's death
    /// (`true`: its IMM was stripped).
    doomed: Option<(u32, bool)>,
}

impl Requester {
    pub fn new(max_send_wr: u32, max_inline: usize) -> Requester {
        let depth = max_send_wr.max(1);
        let n = (depth as usize).next_power_of_two().min(FIRST_SLOTS);
        Requester {
            sq: vec![SqEntry::default(); n],
            mask: n as u32 - 1,
            depth,
            inline: vec![0; n * max_inline],
            max_inline,
            ..Requester::default()
        }
    }

    #[inline]
    fn cap(&self) -> u32 {
        self.depth
    }

    #[inline]
    pub fn entry(&self, seq: u32) -> &SqEntry {
        &self.sq[(seq & self.mask) as usize]
    }

    #[inline]
    fn entry_mut(&mut self, seq: u32) -> &mut SqEntry {
        let mask = self.mask;
        &mut self.sq[(seq & mask) as usize]
    }

    /// Makes room for `more` WRs beyond those queued: doubles the storage (control path:
    /// only while a QP's use deepens, at most log2(depth) times).
    #[cold]
    fn grow(&mut self, more: u32) {
        let want = (self.tail.wrapping_sub(self.head) + more) as usize;
        let mut n = self.sq.len();
        while n < want {
            n *= 2;
        }
        let mut sq = vec![SqEntry::default(); n];
        let mut inline = vec![0; n * self.max_inline];
        let (old, new) = (self.mask as usize, n - 1);
        let mut seq = self.head;
        while seq != self.tail {
            let (a, b) = (seq as usize & old, seq as usize & new);
            sq[b] = self.sq[a];
            let m = self.max_inline;
            inline[b * m..(b + 1) * m].copy_from_slice(&self.inline[a * m..(a + 1) * m]);
            seq = seq.wrapping_add(1);
        }
        (self.sq, self.inline, self.mask) = (sq, inline, new as u32);
    }

    /// Nothing posted is waiting to complete.
    #[inline(always)]
    pub fn idle(&self) -> bool {
        self.head == self.tail
    }

    /// Posted requests the peer has not executed yet: the oldest of them.
    #[inline]
    pub fn oldest_unacked(&self) -> Option<u32> {
        seq_lt(self.acked, self.tail).then_some(self.acked)
    }

    /// What `post_send` refuses: before `connect` (`created`), a full send queue, a
    /// malformed WR.
    #[inline]
    pub fn check_chain(&self, created: bool, chain: &[SendWr], qp_num: u32) -> crate::error::Result<()> {
        let free = self.cap() - self.tail.wrapping_sub(self.head);
        let mut ok = !created && chain.len() as u64 <= free as u64;
        for wr in chain {
            let n = wr.num_sge as usize;
            // SGE lengths are u32: two of them never overflow a u64.
            let bytes = wr.sge[0].len as u64 * (n > 0) as u64 + wr.sge[1].len as u64 * (n > 1) as u64;
            ok &= n <= crate::fabric::MAX_SGE
                && bytes <= MAX_MSG as u64
                && (!wr.inline || (bytes as usize <= self.max_inline && wr.opcode != WrOpcode::Read));
        }
        if ok { Ok(()) } else { Err(self.chain_error(created, chain, qp_num)) }
    }

    /// Why [`Self::check_chain`] refused `chain`: the first problem, precisely.
    #[cold]
    fn chain_error(&self, created: bool, chain: &[SendWr], qp_num: u32) -> Error {
        if created {
            return Error::invalid_usage(format!("QP {qp_num}: post_send before connect"));
        }
        let free = self.cap() - self.tail.wrapping_sub(self.head);
        if chain.len() as u64 > free as u64 {
            return Error::invalid_usage(format!(
                "QP {qp_num}: send queue full ({} WRs posted, room for {free} of the chain of {})",
                self.cap() - free,
                chain.len()
            ));
        }
        for wr in chain {
            if wr.num_sge as usize > crate::fabric::MAX_SGE {
                return Error::invalid_argument(format!("QP {qp_num}: WR with {} SGEs", wr.num_sge));
            }
            let bytes = wr.bytes();
            if bytes > MAX_MSG as u64 {
                return Error::invalid_argument(format!("QP {qp_num}: WR of {bytes} bytes"));
            }
            if wr.inline && (bytes as usize > self.max_inline || wr.opcode == WrOpcode::Read) {
                return Error::invalid_argument(format!(
                    "QP {qp_num}: inline {:?} of {} bytes (max_inline {})",
                    wr.opcode, bytes, self.max_inline
                ));
            }
        }
        Error::internal(format!("QP {qp_num}: chain refused for no reason found"))
    }

    /// Queues a checked chain (inline payloads are copied now, from registrations in `mrs`).
    pub fn enqueue(&mut self, mrs: &MrTable, chain: &[SendWr]) {
        if self.tail.wrapping_sub(self.head) as usize + chain.len() > self.sq.len() {
            self.grow(chain.len() as u32);
        }
        for wr in chain {
            let seq = self.tail;
            let mut bad_local = false;
            if wr.signaled || wr.opcode == WrOpcode::Read {
                self.need = Some(seq);
            }
            if wr.inline {
                let at = (seq & self.mask) as usize * self.max_inline;
                let mut off = at;
                for sge in &wr.sge[..wr.num_sge as usize] {
                    match mrs.pin_range(sge.lkey, sge.addr, sge.len as u64, Access::empty()) {
                        Some(_pin) => {
                            // SAFETY: the range lies inside a registration pinned for this
                            // copy; the destination is this QP's inline slot for `seq`.
                            unsafe {
                                std::ptr::copy_nonoverlapping(
                                    sge.addr as *const u8,
                                    self.inline.as_mut_ptr().add(off),
                                    sge.len as usize,
                                )
                            };
                            off += sge.len as usize;
                        }
                        None => bad_local = true,
                    }
                }
            }
            *self.entry_mut(seq) = SqEntry { wr: *wr, bad_local, read_done: false };
            self.tail = seq.wrapping_add(1);
        }
    }

    /// Completes finished WRs in order while the CQ has room. `failed`: the QP is in the
    /// error state, with the WR that failed and its status (every other one not yet
    /// finished flushes). Returns whether a WR completed.
    pub fn retire(&mut self, ring: &mut Producer<'_>, qp_num: u32, failed: Option<Option<(u32, WcStatus)>>) -> bool {
        let mut moved = false;
        while self.head != self.tail {
            let seq = self.head;
            let e = self.entry(seq);
            let done = match e.wr.opcode {
                WrOpcode::Read => e.read_done,
                _ => seq_lt(seq, self.acked),
            };
            let status = match failed {
                _ if done => WcStatus::Success,
                Some(Some((s, status))) if s == seq => status,
                Some(_) => WcStatus::Flushed,
                None => break,
            };
            let signal = e.wr.signaled || status != WcStatus::Success;
            if signal && !ring.push(wr_completion(&e.wr, e.wr.bytes(), status, qp_num)) {
                self.blocked = true;
                return moved;
            }
            self.head = seq.wrapping_add(1);
            moved = true;
        }
        self.blocked = false;
        moved
    }

    /// The last [`Self::retire`] stopped at a full CQ.
    pub fn blocked(&self) -> bool {
        self.blocked
    }

    /// The error state: no READ response is awaited any more.
    pub fn clear_reads(&mut self) {
        self.reads_len = 0;
    }

    // The TCP send half.

    /// The next request to transmit, if one is queued.
    #[inline]
    pub fn next_unsent(&self) -> Option<u32> {
        (self.sent != self.tail).then_some(self.sent)
    }

    /// Whether a READ must wait: [`MAX_RD_ATOMIC`] are awaiting their response.
    pub fn reads_full(&self) -> bool {
        self.reads_len == MAX_RD_ATOMIC
    }

    /// READ `seq` is being transmitted: its response is awaited after the older ones.
    pub fn start_read(&mut self, seq: u32) {
        let at = (self.reads_head + self.reads_len) % MAX_RD_ATOMIC;
        self.reads[at] = seq;
        self.reads_len += 1;
    }

    /// Request `seq` started to leave.
    pub fn mark_sent(&mut self, seq: u32) {
        self.sent = seq.wrapping_add(1);
    }

    /// Request `seq` left in full.
    pub fn mark_transmitted(&mut self, seq: u32) {
        self.tx_done = seq.wrapping_add(1);
    }

    /// The frame header of request `seq` (`len` and `imm` from its WR), as it is sent now:
    /// ACK_REQ when the requester waits for it (signalled), or when a quarter of the
    /// queue's depth went without one (unsignalled WRs retire on acknowledgements too).
    pub fn header(&mut self, seq: u32, dst_qpn: u32) -> Frame {
        let wr = self.entry(seq).wr;
        let len = wr.bytes() as u32;
        let ack_req = wr.signaled || seq.wrapping_sub(self.last_ack_req) >= (self.depth / 4).max(1);
        if ack_req && wr.opcode != WrOpcode::Read {
            self.last_ack_req = seq;
            self.need = Some(self.need.map_or(seq, |n| if seq_lt(n, seq) { seq } else { n }));
        }
        let (addr, rkey) = (wr.remote_addr, wr.rkey);
        match wr.opcode {
            WrOpcode::Write => Frame::Write { dst_qpn, seq, addr, rkey, len, imm: None, ack_req },
            WrOpcode::WriteImm => Frame::Write { dst_qpn, seq, addr, rkey, len, imm: Some(wr.imm), ack_req },
            WrOpcode::Read => Frame::ReadReq { dst_qpn, seq, addr, rkey, len },
        }
    }

    /// Request `seq`'s inline payload.
    #[inline]
    pub fn inline_of(&self, seq: u32) -> &[u8] {
        let at = (seq & self.mask) as usize * self.max_inline;
        &self.inline[at..at + self.entry(seq).wr.bytes() as usize]
    }

    /// Whether a request that must be answered (ACK_REQ, READ) is not answered yet: the
    /// peer owes a frame, and its silence for too long means it is gone.
    #[inline]
    pub fn waiting(&self) -> bool {
        self.need.is_some_and(|n| !seq_lt(n, self.acked))
    }

    /// The generation of frames sent now (see [`Self::rnr`]).
    pub fn round(&self) -> u32 {
        self.round
    }

    /// Receiver not ready for request `seq`: the ones before it were executed, it and
    /// later ones were not; they are sent again from `seq`. READs among them no longer
    /// await a response.
    pub fn on_rnr(&mut self, seq: u32) -> Result<(), Fault> {
        if seq_lt(seq, self.acked) || !seq_lt(seq, self.sent) {
            return Err(Fault::qp(format!("RNR {seq} outside the requests in flight [{}, {})", self.acked, self.sent)));
        }
        self.acked = seq;
        self.sent = seq;
        if seq_lt(seq, self.tx_done) {
            self.tx_done = seq;
        }
        while self.reads_len > 0 {
            let last = self.reads[(self.reads_head + self.reads_len - 1) % MAX_RD_ATOMIC];
            if seq_lt(last, seq) {
                break;
            }
            self.reads_len -= 1;
        }
        self.round = self.round.wrapping_add(1);
        Ok(())
    }

    // Responses from the peer (TCP).

    /// ACK of every request up to `seq`.
    pub fn on_ack(&mut self, seq: u32) -> Result<(), Fault> {
        let next = seq.wrapping_add(1);
        let read_before = self.reads_len > 0 && seq_lt(self.reads[self.reads_head], next);
        if seq_lt(next, self.acked) || seq_lt(self.tx_done, next) || read_before {
            return Err(Fault::qp(format!(
                "ACK {seq} outside the requests in flight [{}, {})",
                self.acked, self.tx_done
            )));
        }
        if let Some(d) = self.doomed
            && !seq_lt(seq, d.0)
        {
            return Err(self.doomed_acked());
        }
        self.acked = next;
        Ok(())
    }

    /// A fault hook fires on request `seq` as it starts (`hook.rs`): its ACK will not be
    /// taken, so it is asked for at once (signalled: the WR fails, which completes it
    /// anyway); `strip_imm`: it goes as a plain WRITE (no IMM at the responder).
    #[cold]
    pub fn doom(&mut self, seq: u32, strip_imm: bool) {
        self.doomed = Some((seq, strip_imm));
        let wr = &mut self.entry_mut(seq).wr;
        wr.signaled = true;
        if strip_imm {
            wr.opcode = WrOpcode::Write;
        }
    }

    /// The ACK covering the doomed request came: the requests before it were executed, it
    /// fails as on a link lost before its ACK (the rest flush).
    #[cold]
    #[inline(never)]
    fn doomed_acked(&mut self) -> Fault {
        let (seq, stripped) = self.doomed.take().expect("doomed");
        self.acked = seq;
        let why = if stripped {
            format!("link lost after the bytes of WRITE_WITH_IMM {seq}, before its IMM (fault hook)")
        } else {
            format!("the ACK of request {seq} was lost (fault hook)")
        };
        Fault::wr(seq, WcStatus::RetryExceeded, why)
    }

    /// How many queued requests have not started to leave.
    pub fn unsent(&self) -> u32 {
        self.tail.wrapping_sub(self.sent)
    }

    /// NAK of request `seq`: the requests before it were executed, it fails.
    ///
    /// NAK and RNR may come while the request's payload is still being sent (the responder
    /// decides on the header): they are bounded by what was started, not sent.
    pub fn on_nak(&mut self, seq: u32, code: NakCode) -> Fault {
        if seq_lt(seq, self.acked) || !seq_lt(seq, self.sent) {
            return Fault::qp(format!("NAK {seq} outside the requests in flight [{}, {})", self.acked, self.sent));
        }
        self.acked = seq;
        Fault::wr(seq, nak_status(code), format!("peer refused request {seq}: {code:?}"))
    }

    /// READ response header for `seq`: the READ whose data follows (`Ok(len)`), checked
    /// against the oldest READ awaited and its length.
    pub fn on_read_resp(&self, seq: u32, result: Result<u32, NakCode>) -> Result<SendWr, Fault> {
        let oldest = (self.reads_len > 0).then(|| self.reads[self.reads_head]);
        if oldest != Some(seq) {
            return Err(Fault::qp(format!("READ response {seq}, expected {oldest:?}")));
        }
        match result {
            Err(code) => Err(Fault::wr(seq, nak_status(code), format!("peer refused READ {seq}: {code:?}"))),
            Ok(len) => {
                let wr = self.entry(seq).wr;
                if len as u64 != wr.bytes() {
                    return Err(Fault::qp(format!("READ response {seq} of {len} bytes for a READ of {}", wr.bytes())));
                }
                Ok(wr)
            }
        }
    }

    /// The response of READ `seq` (the oldest awaited) is placed.
    pub fn read_placed(&mut self, seq: u32) {
        self.entry_mut(seq).read_done = true;
        if seq_lt(self.acked, seq.wrapping_add(1)) {
            self.acked = seq.wrapping_add(1);
        }
        self.reads_head = (self.reads_head + 1) % MAX_RD_ATOMIC;
        self.reads_len -= 1;
    }

    // In-process mode: WRs execute as they are sent.

    /// The oldest queued WR not executed yet, if any.
    #[inline]
    pub fn next_unexecuted(&self) -> Option<u32> {
        (self.acked != self.tail).then_some(self.acked)
    }

    /// Where WR `seq`'s inline payload lies (its slot), for an in-process copy.
    #[inline]
    pub fn inline_addr(&self, seq: u32) -> u64 {
        self.inline.as_ptr() as u64 + ((seq & self.mask) as usize * self.max_inline) as u64
    }

    /// WR `seq` was executed at the peer (a READ: its data is in place).
    #[inline]
    pub fn executed(&mut self, seq: u32) {
        let e = self.entry_mut(seq);
        e.read_done = e.wr.opcode == WrOpcode::Read;
        let next = seq.wrapping_add(1);
        (self.acked, self.sent, self.tx_done) = (next, next, next);
    }

    /// Queues `wr`, executed as it was posted, whose completion found the CQ full: it
    /// retires the queued way.
    #[cold]
    pub fn push_executed(&mut self, wr: &SendWr) {
        if self.tail.wrapping_sub(self.head) as usize == self.sq.len() {
            self.grow(1);
        }
        let seq = self.tail;
        *self.entry_mut(seq) = SqEntry { wr: *wr, bad_local: false, read_done: true };
        let next = seq.wrapping_add(1);
        (self.tail, self.acked, self.sent, self.tx_done) = (next, next, next, next);
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::fabric::Sge;
    use crate::fabric::soft::ring::CqRing;

    fn wr(wr_id: u64, signaled: bool) -> SendWr {
        let sge = [Sge { addr: 0, len: 8, lkey: 1 }, Sge::default()];
        SendWr { wr_id, signaled, num_sge: 1, sge, ..SendWr::default() }
    }

    fn drain(ring: &CqRing) -> Vec<(u64, WcStatus)> {
        let mut out = [Completion::default(); 16];
        // SAFETY: this test is the ring's only consumer.
        let n = unsafe { ring.pop_into(&mut out) };
        out[..n].iter().map(|c| (c.wr_id, c.status)).collect()
    }

    /// Posting order, acknowledgement, unsignalled WRs and the error state's verdicts,
    /// without a connection: the requester alone.
    #[test]
    fn completions_come_in_order_and_the_error_state_fails_one_and_flushes_the_rest() {
        let (mrs, ring) = (MrTable::default(), CqRing::new(16));
        let mut r = Requester::new(8, 0);
        assert!(r.check_chain(true, &[wr(1, true)], 7).is_err(), "before connect");
        let chain = [wr(1, true), wr(2, false), wr(3, true), wr(4, true), wr(5, true)];
        r.check_chain(false, &chain, 7).unwrap();
        r.enqueue(&mrs, &chain);
        assert!(r.check_chain(false, &chain, 7).unwrap_err().msg().contains("send queue full"));
        for seq in 0..5 {
            assert_eq!(r.next_unsent(), Some(seq));
            r.mark_sent(seq);
            r.mark_transmitted(seq);
        }
        assert!(r.on_ack(5).is_err(), "an ACK beyond what was transmitted");
        r.on_ack(1).unwrap();
        assert!(r.retire(&mut ring.lock(), 7, None));
        assert_eq!(r.oldest_unacked(), Some(2));
        assert_eq!(drain(&ring), [(1, WcStatus::Success)], "WR 2 is unsignalled");
        assert!(matches!(r.on_nak(1, NakCode::RemoteAccess), Fault::Qp { at: None, .. }), "NAK of an ACKed one");
        let Fault::Qp { at, .. } = r.on_nak(3, NakCode::RemoteAccess);
        assert_eq!(at, Some((3, WcStatus::RemoteAccessError)));
        r.retire(&mut ring.lock(), 7, Some(at));
        assert_eq!(
            drain(&ring),
            [(3, WcStatus::Success), (4, WcStatus::RemoteAccessError), (5, WcStatus::Flushed)],
            "requests before the NAKed one were executed"
        );
        assert!(r.idle());
    }
}
