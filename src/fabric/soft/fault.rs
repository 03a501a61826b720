//! Why a connection goes to the error state: what the receive half, the send half and the
//! in-process path report instead of moving the QP there themselves. The connection
//! (`conn_tcp.rs`, `conn_inproc.rs`) applies it: the WR it names fails with its status,
//! every other WR not yet completed flushes, the link is closed so the peer learns of it.

use super::frame::NakCode;
use crate::fabric::WcStatus;

/// A reason to move the QP to the error state.
#[derive(Debug)]
pub enum Fault {
    /// A protocol or memory error: WR `at` (if any) fails with its status, the rest flush.
    Qp { at: Option<(u32, WcStatus)>, why: String },
}

impl Fault {
    /// An error of the QP as a whole (a malformed or unexpected frame): every WR flushes.
    #[cold]
    pub fn qp(why: String) -> Fault {
        Fault::Qp { at: None, why }
    }

    /// WR `seq` fails with `status`; the rest flush.
    #[cold]
    pub fn wr(seq: u32, status: WcStatus, why: String) -> Fault {
        Fault::Qp { at: Some((seq, status)), why }
    }
}

/// The status a requester reports for a responder's refusal.
pub fn nak_status(code: NakCode) -> WcStatus {
    match code {
        NakCode::RemoteAccess => WcStatus::RemoteAccessError,
        NakCode::InvalidRequest => WcStatus::RemoteOpError,
    }
}
