//! The control channel between the two engines of a connection (DESIGN.md "Rail
//! failover"): each side writes its messages, numbered, into the peer's control ring with
//! one RDMA WRITE each on a working rail's CTS QP, and reads its own ring in order.
//!
//! When no rail works (both rails failed, the connection riding out the outage), a message
//! goes out of band instead: the engine hands its entry's words to the plugin
//! ([`Action::ControlOob`]), which sends them over the connection's set-up channel, and the
//! peer's plugin hands them back ([`Event::ControlOob`]). An entry sent out of band keeps its
//! sequence number, so the reader takes each number once, from the ring or out of band,
//! whichever comes first, and the ring's order holds across the outage. Entering an outage,
//! a side sends out of band again every message the peer has not acknowledged: one written
//! to a rail that then died may never land, and the reader waits for its number.

use super::{
    Action, CTL_ENTRIES, CTL_ENTRY_BYTES, CTL_MAX_UNACKED, CTL_PAYLOAD_WORDS, CTL_WORDS, FENCE_WINDOW, FailoverConfig,
    Output, QP_RECORD_WORDS, QpRecords,
};
use crate::engine::{QpRef, RAILS, WrKind};
use crate::fabric::{SendWr, Sge, WrOpcode};

/// The kind of a control message (word 0, bits 7:0).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum CtlKind {
    /// Sender → receiver: "rail `rail` failed at `epoch` here; fence it and report".
    RailDown = 1,
    /// Receiver → sender: "rail `rail` is fenced at `epoch`; these parts arrived".
    Fenced = 2,
    /// Re-admission, sender → receiver: "my new QPs of `rail` at `epoch`" (records in the
    /// payload, their count of words in `flags`).
    Rebuild = 3,
    /// Re-admission: the receiver's new QPs of `rail`, answering `Rebuild`.
    Rebuilt = 4,
}

/// One control message, decoded.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct CtlMsg {
    pub kind: CtlKind,
    pub rail: u8,
    pub epoch: u32,
    /// `Fenced`: receives before this sequence number all arrived.
    pub base_seq: u64,
    /// `Fenced`: bit `i`: part `rail` of receive `base_seq + i` arrived.
    pub bitmap: u32,
    /// `Rebuild`/`Rebuilt`: QP records (plugin-defined); `flags`: how many words.
    pub payload: [u64; CTL_PAYLOAD_WORDS],
    pub flags: u16,
}

impl CtlMsg {
    pub fn new(kind: CtlKind, rail: usize, epoch: u32) -> Self {
        CtlMsg { kind, rail: rail as u8, epoch, base_seq: 0, bitmap: 0, payload: [0; CTL_PAYLOAD_WORDS], flags: 0 }
    }

    /// The entry's words: `seq` (1-based count of messages this side wrote) last, `ack`
    /// (messages of the peer consumed so far) beside the bitmap.
    pub fn to_words(&self, seq: u64, ack: u64) -> [u64; CTL_WORDS] {
        let mut w = [0; CTL_WORDS];
        w[0] = self.kind as u64 | (self.rail as u64) << 8 | (self.flags as u64) << 16 | (self.epoch as u64) << 32;
        w[1] = self.base_seq;
        w[2] = self.bitmap as u64 | (ack & 0xffff_ffff) << 32;
        w[3..CTL_WORDS - 1].copy_from_slice(&self.payload);
        w[CTL_WORDS - 1] = seq;
        w
    }

    /// Decodes an entry: the message and the peer's ack; `None` for a kind or rail mpib
    /// never writes, or records of more words than the payload holds (a protocol violation).
    pub fn from_words(w: &[u64; CTL_WORDS]) -> Option<(CtlMsg, u32)> {
        let kind = match w[0] & 0xff {
            1 => CtlKind::RailDown,
            2 => CtlKind::Fenced,
            3 => CtlKind::Rebuild,
            4 => CtlKind::Rebuilt,
            _ => return None,
        };
        let rail = ((w[0] >> 8) & 0xff) as u8;
        if rail as usize >= RAILS {
            return None;
        }
        let flags = (w[0] >> 16) as u16;
        if matches!(kind, CtlKind::Rebuild | CtlKind::Rebuilt) && flags as usize > QP_RECORD_WORDS {
            return None;
        }
        let msg = CtlMsg {
            kind,
            rail,
            flags,
            epoch: (w[0] >> 32) as u32,
            base_seq: w[1],
            bitmap: w[2] as u32,
            payload: w[3..CTL_WORDS - 1].try_into().expect("the payload words"),
        };
        Some((msg, (w[2] >> 32) as u32))
    }

    /// `Rebuild`/`Rebuilt`: the QP records the payload carries.
    pub fn records(&self) -> QpRecords {
        QpRecords { n: (self.flags as u8).min(QP_RECORD_WORDS as u8), words: self.payload }
    }

    /// `Rebuild`/`Rebuilt` with records `r`.
    pub fn with_records(mut self, r: &QpRecords) -> Self {
        (self.payload, self.flags) = (r.words, r.n as u16);
        self
    }

    /// `Fenced`: whether part `rail` of receive `seq` arrived. Receives before the window
    /// completed (their slot was reused); after it, they were posted after the fence.
    pub fn part_seen(&self, seq: u64) -> bool {
        Self::seen_in(self.base_seq, self.bitmap, seq)
    }

    /// `Fenced`: whether the other rail's part of receive `seq` arrived (by any rail):
    /// settles that part's replays that rode on the fenced rail. Its bitmap is the first
    /// payload word.
    pub fn other_seen(&self, seq: u64) -> bool {
        Self::seen_in(self.base_seq, self.payload[0] as u32, seq)
    }

    fn seen_in(base_seq: u64, bitmap: u32, seq: u64) -> bool {
        if seq < base_seq {
            return true;
        }
        let i = seq - base_seq;
        i < FENCE_WINDOW && bitmap & (1 << i) != 0
    }
}

/// Reading the control ring this side's peer writes, and the local source of the messages
/// this side writes. The plugin backs it with registered memory, tests with arrays.
pub trait CtlMemory {
    /// Acquire-load of the sequence word (the last) of ring entry `i`.
    fn ctl_seq(&self, i: usize) -> u64;
    /// Ring entry `i`; called only after its sequence word was seen.
    fn ctl_entry(&self, i: usize) -> [u64; CTL_WORDS];
    /// Writes outgoing message entry `i` into the local source of its RDMA WRITE.
    fn write_ctl_out(&mut self, i: usize, words: &[u64; CTL_WORDS]);
    /// Outgoing message entry `i` as last written (sent again out of band).
    fn ctl_out_entry(&self, i: usize) -> [u64; CTL_WORDS];
}

/// One side's control channel: sequence numbers out and in.
#[derive(Debug, Default)]
pub(crate) struct CtlChannel {
    /// Messages written so far.
    sent: u64,
    /// The peer's messages consumed so far.
    consumed: u64,
    /// Our messages the peer has acknowledged.
    acked: u64,
    /// The peer's messages that came out of band and are not consumed yet (in any order;
    /// at most the ring's worth).
    oob_in: Vec<[u64; CTL_WORDS]>,
}

impl CtlChannel {
    /// Writes `msg` into the local source and appends its WRITE (signalled, on `rail`'s CTS
    /// QP, after everything that QP already carries) to `out`. `false`: the ring is full
    /// of unacknowledged messages (the protocol never gets there: a peer that does not
    /// read its ring).
    ///
    /// `rail: None`: no rail works; the entry goes out of band ([`Action::ControlOob`]).
    pub(crate) fn send(
        &mut self,
        cfg: &FailoverConfig,
        msg: &CtlMsg,
        rail: Option<usize>,
        mem: &mut impl CtlMemory,
        out: &mut Output,
    ) -> bool {
        if self.sent - self.acked >= CTL_MAX_UNACKED {
            return false;
        }
        self.sent += 1;
        let i = ((self.sent - 1) % CTL_ENTRIES as u64) as usize;
        let words = msg.to_words(self.sent, self.consumed);
        mem.write_ctl_out(i, &words);
        let Some(rail) = rail else {
            out.actions.push(Action::ControlOob { words });
            return true;
        };
        let off = (i * CTL_ENTRY_BYTES) as u64;
        out.push(rail, QpRef::Cts).add(SendWr {
            wr_id: WrKind::Control.id(rail, i),
            opcode: WrOpcode::Write,
            signaled: true,
            // From registered memory, never inline: an entry is larger than some providers'
            // inline limit, and the QP's inline size is not sized for it.
            inline: false,
            num_sge: 1,
            sge: [
                Sge { addr: cfg.ctl_out_addr + off, len: CTL_ENTRY_BYTES as u32, lkey: cfg.ctl_out_lkeys[rail] },
                Sge::default(),
            ],
            remote_addr: cfg.ctl_ring_addr + off,
            rkey: cfg.ctl_ring_rkeys[rail],
            ..SendWr::default()
        });
        true
    }

    /// Whether the peer's next message is in place: one load and one compare, for the
    /// plugin's `test` on a request that is not complete.
    #[inline]
    ///
    /// (Messages that came out of band need no look here: the plugin's round that read them
    /// runs another at once, which takes them.)
    pub(crate) fn waiting(&self, mem: &impl CtlMemory) -> bool {
        mem.ctl_seq((self.consumed % CTL_ENTRIES as u64) as usize) == self.consumed + 1
    }

    /// Whether a message that came out of band waits to be taken.
    pub(crate) fn has_oob(&self) -> bool {
        !self.oob_in.is_empty()
    }

    /// Sends out of band again every message the peer has not acknowledged (entering an
    /// outage: see the module doc).
    pub(crate) fn resend_unacked(&self, mem: &impl CtlMemory, out: &mut Output) {
        for seq in self.acked + 1..=self.sent {
            let words = mem.ctl_out_entry(((seq - 1) % CTL_ENTRIES as u64) as usize);
            out.actions.push(Action::ControlOob { words });
        }
    }

    /// A message of the peer that came out of band; taken in its turn by [`Self::poll`].
    /// One already consumed (it also came through the ring) is dropped, as is anything
    /// beyond what the ring could hold unacknowledged (a peer that floods).
    pub(crate) fn receive_oob(&mut self, words: [u64; CTL_WORDS]) {
        let seq = words[CTL_WORDS - 1];
        let ahead = seq.wrapping_sub(self.consumed);
        if (1..=CTL_ENTRIES as u64).contains(&ahead) && !self.oob_in.iter().any(|w| w[CTL_WORDS - 1] == seq) {
            self.oob_in.push(words);
        }
    }

    /// The peer's messages consumed so far (the last one's sequence number).
    pub(crate) fn consumed(&self) -> u64 {
        self.consumed
    }

    /// The peer's next message if it is in place: `Some(None)` for an entry that does not
    /// decode (a violation).
    pub(crate) fn poll(&mut self, mem: &impl CtlMemory) -> Option<Option<CtlMsg>> {
        let want = self.consumed + 1;
        let i = (self.consumed % CTL_ENTRIES as u64) as usize;
        let words = if mem.ctl_seq(i) == want {
            // (An out-of-band copy of it, if one came, is dropped below.)
            mem.ctl_entry(i)
        } else if let Some(k) = self.oob_in.iter().position(|w| w[CTL_WORDS - 1] == want) {
            self.oob_in.swap_remove(k)
        } else {
            return None;
        };
        self.consumed = want;
        self.oob_in.retain(|w| w[CTL_WORDS - 1].wrapping_sub(want) as i64 > 0);
        let Some((msg, ack)) = CtlMsg::from_words(&words) else { return Some(None) };
        // The ack is the low 32 bits of the peer's count: widen it against ours.
        let acked = (self.sent & !0xffff_ffff) | ack as u64;
        let acked = if acked > self.sent { acked.wrapping_sub(1 << 32) } else { acked };
        self.acked = self.acked.max(acked);
        Some(Some(msg))
    }
}
