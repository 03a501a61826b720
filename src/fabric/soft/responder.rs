//! The responder half of a connection: which request it executes next, whether it refused
//! one (then every later request of the connection is read and dropped, never executed),
//! whether it waits for a request sent again after a receiver-not-ready refusal (RNR: the
//! requests between are dropped, they come again), which receiver-not-ready wait it
//! counted. How a WRITE's bytes are placed is `placement.rs`.

use super::fault::Fault;
use crate::fabric::{Completion, WcOpcode, WcStatus};

/// The completion a WRITE_WITH_IMM of `len` bytes gives the responder QP `qp_num`, for the
/// SRQ WQE it consumed (`status`: Success once placed; Flushed when the QP failed first).
#[inline]
pub fn imm_completion(qp_num: u32, len: u64, imm: u32, status: WcStatus) -> Completion {
    Completion { status, opcode: WcOpcode::RecvRdmaWithImm, byte_len: len as u32, imm, qp_num, ..Completion::default() }
}

/// The responder state of one connection.
#[derive(Default)]
pub struct Responder {
    expect_seq: u32,
    /// A request was refused: later requests are read and dropped, never executed.
    discarding: bool,
    /// The WR whose receiver-not-ready wait was counted.
    rnr_counted: Option<u32>,
    /// TCP: request `seq` was refused with RNR: everything up to its new start is dropped.
    rnr_wait: Option<u32>,
}

/// What to do with a request that arrived.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Verdict {
    Execute,
    /// Read and drop it: a request was refused before (NAK), or it comes before the one
    /// refused with RNR is sent again.
    Drop,
}

impl Responder {
    /// Request `seq` arrived: it must be the next in order (or, after an RNR, anything up
    /// to the refused one sent again).
    pub fn next_request(&mut self, seq: u32) -> Result<Verdict, Fault> {
        match self.rnr_wait {
            Some(w) if w != seq => return Ok(Verdict::Drop),
            Some(_) => self.rnr_wait = None,
            None => {}
        }
        if seq != self.expect_seq {
            return Err(Fault::qp(format!("request {seq} out of order (expected {})", self.expect_seq)));
        }
        self.expect_seq = seq.wrapping_add(1);
        Ok(if self.discarding { Verdict::Drop } else { Verdict::Execute })
    }

    /// Request `seq` was refused with RNR: the requester sends it (and what follows) again.
    pub fn rnr(&mut self, seq: u32) {
        self.rnr_wait = Some(seq);
        self.expect_seq = seq;
    }

    /// Whether requests are dropped until one refused with RNR comes again.
    pub fn in_rnr(&self) -> bool {
        self.rnr_wait.is_some()
    }

    /// A request was refused: drop every later one.
    pub fn refuse(&mut self) {
        self.discarding = true;
    }

    /// WR `seq` found the SRQ empty. Whether this wait is new (to be counted once in
    /// `rnr_events`, however often the request comes again).
    pub fn rnr_wait(&mut self, seq: u32) -> bool {
        let new = self.rnr_counted != Some(seq);
        self.rnr_counted = Some(seq);
        new
    }
}
