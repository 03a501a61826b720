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

use super::failover::{CTL_ENTRIES, CTL_ENTRY_BYTES, CTL_MAX_UNACKED, CTL_WORDS, CtlMsg, FailoverConfig, Output};
use super::{Action, QpRef, WrKind};
use crate::fabric::{SendWr, Sge, WrOpcode};

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
