//! A connection's completion inbox for one rail: the completions another caller polled off
//! the NIC's shared CQ for it, waiting until the connection's own next call takes them.
//!
//! The project's SPSC ring (`sync/spsc.rs`, which says why it is sound) of completions as
//! four atomic words. Producers take turns: only the holder of the NIC's poll lock pushes
//! (the lock orders one holder's pushes before the next one's). The consumer is the
//! connection's owner, under its handle's lock. So the inbox needs no lock of its own and
//! the data path takes none that NCCL's other threads take.
//!
//! A full ring is a bug (it is sized to everything the connection can have outstanding on
//! the rail): the completion is not queued, the inbox says it overflowed, and the
//! connection fails with that error at its next call; nothing is dropped silently.

use std::sync::atomic::{AtomicBool, Ordering};

use crate::fabric::{Completion, WcOpcode, WcStatus};
use crate::sync::AtomicU64;
use crate::sync::spsc::{Ring, Slot};

pub struct Inbox {
    ring: Ring<InboxSlot>,
    overflowed: AtomicBool,
}

/// A completion as four atomic words (the QP number is left out: the route already named
/// the connection and the rail), so the inbox is safe code.
struct InboxSlot([AtomicU64; 4]);

impl Default for InboxSlot {
    fn default() -> InboxSlot {
        InboxSlot(std::array::from_fn(|_| AtomicU64::new(0)))
    }
}

impl Slot for InboxSlot {
    type Item = Completion;
    type Read<'a> = Completion;

    #[inline(always)]
    fn store(&self, c: Completion) {
        for (s, v) in self.0.iter().zip(encode(&c)) {
            s.store(v, Ordering::Relaxed);
        }
    }

    #[inline(always)]
    fn read(&self) -> Completion {
        decode(self.0.each_ref().map(|s| s.load(Ordering::Relaxed)))
    }
}

#[inline]
fn encode(c: &Completion) -> [u64; 4] {
    let (kind, code) = match c.status {
        WcStatus::Success => (0u64, 0u32),
        WcStatus::LocalError => (1, 0),
        WcStatus::RemoteAccessError => (2, 0),
        WcStatus::RemoteOpError => (3, 0),
        WcStatus::RetryExceeded => (4, 0),
        WcStatus::RnrRetryExceeded => (5, 0),
        WcStatus::Flushed => (6, 0),
        WcStatus::LocalQpError => (7, 0),
        WcStatus::Other(code) => (8, code),
    };
    let op = match c.opcode {
        WcOpcode::RdmaWrite => 0u64,
        WcOpcode::RdmaRead => 1,
        WcOpcode::RecvRdmaWithImm => 2,
    };
    [c.wr_id, c.imm as u64 | (c.byte_len as u64) << 32, op | kind << 8 | (code as u64) << 32, c.timestamp_ns]
}

/// Statuses by their code in [`encode`] (8: `Other`, its code in the word's high half).
const STATUSES: [WcStatus; 8] = [
    WcStatus::Success,
    WcStatus::LocalError,
    WcStatus::RemoteAccessError,
    WcStatus::RemoteOpError,
    WcStatus::RetryExceeded,
    WcStatus::RnrRetryExceeded,
    WcStatus::Flushed,
    WcStatus::LocalQpError,
];
const OPCODES: [WcOpcode; 4] =
    [WcOpcode::RdmaWrite, WcOpcode::RdmaRead, WcOpcode::RecvRdmaWithImm, WcOpcode::RecvRdmaWithImm];

#[inline]
fn decode(w: [u64; 4]) -> Completion {
    // Table lookups, not matches: this runs for every completion another caller polled.
    let kind = ((w[2] >> 8) & 0xff) as usize;
    let status = STATUSES.get(kind).copied().unwrap_or(WcStatus::Other((w[2] >> 32) as u32));
    let opcode = OPCODES[(w[2] & 3) as usize];
    Completion {
        wr_id: w[0],
        status,
        opcode,
        byte_len: (w[1] >> 32) as u32,
        imm: w[1] as u32,
        qp_num: 0,
        timestamp_ns: w[3],
    }
}

impl Inbox {
    /// An inbox for `cap` completions.
    pub fn new(cap: usize) -> Inbox {
        Inbox { ring: Ring::new(cap), overflowed: AtomicBool::new(false) }
    }

    pub fn capacity(&self) -> usize {
        self.ring.capacity()
    }

    /// Queues `c`; `false` when the ring is full (then it is marked overflowed). Only the
    /// holder of the NIC's poll lock calls this.
    #[inline]
    pub fn push(&self, c: &Completion) -> bool {
        let pushed = self.ring.push(*c);
        if !pushed {
            self.overflowed.store(true, Ordering::Release);
        }
        pushed
    }

    /// Whether completions wait (the consumer's quick check).
    #[inline(always)]
    pub fn is_empty(&self) -> bool {
        self.ring.is_empty()
    }

    /// Moves the oldest completions into `out`; returns how many (tests: batches smaller
    /// than what is queued). Only the connection's owner calls this.
    #[cfg(test)]
    pub fn pop_into(&self, out: &mut [Completion]) -> usize {
        let mut n = 0;
        self.ring.pop_each(out.len(), |c| {
            out[n] = *c;
            n += 1;
        })
    }

    /// Hands every queued completion to `f`, oldest first, decoded on the stack (no copy
    /// through a buffer); returns how many. Only the connection's owner calls this.
    #[inline(always)]
    pub fn pop_each(&self, f: impl FnMut(&Completion)) -> usize {
        self.ring.pop_each(usize::MAX, f)
    }

    /// Whether a completion found the ring full.
    #[inline]
    pub fn overflowed(&self) -> bool {
        self.overflowed.load(Ordering::Acquire)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn c(i: u64) -> Completion {
        Completion {
            wr_id: i,
            status: if i.is_multiple_of(3) { WcStatus::Other(0x1_0005) } else { WcStatus::Flushed },
            opcode: if i.is_multiple_of(2) { WcOpcode::RecvRdmaWithImm } else { WcOpcode::RdmaRead },
            byte_len: (i as u32).wrapping_mul(7),
            imm: !(i as u32),
            qp_num: 0,
            timestamp_ns: i << 20,
        }
    }

    #[test]
    fn every_field_round_trips() {
        for s in [
            WcStatus::Success,
            WcStatus::LocalError,
            WcStatus::RemoteAccessError,
            WcStatus::RemoteOpError,
            WcStatus::RetryExceeded,
            WcStatus::RnrRetryExceeded,
            WcStatus::Flushed,
            WcStatus::LocalQpError,
            WcStatus::Other(u32::MAX),
        ] {
            for opcode in [WcOpcode::RdmaWrite, WcOpcode::RdmaRead, WcOpcode::RecvRdmaWithImm] {
                let x = Completion { status: s, opcode, ..c(u64::MAX) };
                assert_eq!(decode(encode(&x)), x);
            }
        }
    }

    #[test]
    fn full_is_an_overflow_never_a_silent_drop() {
        let b = Inbox::new(3);
        let mut out = [Completion::default(); 4];
        for round in 0..10u64 {
            for i in 0..3 {
                assert!(b.push(&c(round * 3 + i)));
            }
            assert!(!b.overflowed());
            assert_eq!(b.pop_into(&mut out), 3);
            assert_eq!(
                out[..3].iter().map(|o| o.wr_id).collect::<Vec<_>>(),
                (round * 3..round * 3 + 3).collect::<Vec<_>>()
            );
        }
        for i in 0..3 {
            assert!(b.push(&c(i)));
        }
        assert!(!b.push(&c(99)), "a fourth does not fit");
        assert!(b.overflowed(), "and the inbox says so");
        assert_eq!(b.pop_into(&mut out), 3);
        assert!(b.is_empty());
    }

    /// Producers on other threads taking turns under a lock (as holders of the NIC's poll
    /// lock do), the consumer on this one: every completion once, in order.
    #[test]
    fn producers_taking_turns_and_a_consumer_lose_nothing() {
        use std::sync::{Arc, Mutex};
        const PER: u64 = 20_000;
        let b = Arc::new(Inbox::new(8));
        let turn = Arc::new(Mutex::new(0u64));
        let producers: Vec<_> = (0..2)
            .map(|_| {
                let (b, turn) = (b.clone(), turn.clone());
                std::thread::spawn(move || {
                    loop {
                        let mut next = turn.lock().unwrap();
                        if *next == 2 * PER {
                            return;
                        }
                        if b.push(&c(*next)) {
                            *next += 1;
                        } else {
                            drop(next);
                            std::thread::yield_now();
                        }
                    }
                })
            })
            .collect();
        let mut want = 0;
        let mut out = [Completion::default(); 5];
        while want < 2 * PER {
            let n = b.pop_into(&mut out);
            for o in &out[..n] {
                assert_eq!(*o, c(want));
                want += 1;
            }
            if n == 0 {
                std::thread::yield_now();
            }
        }
        for p in producers {
            p.join().unwrap();
        }
        // (Each failed push marks the overflow: the test's producers retry on purpose.)
    }
}
