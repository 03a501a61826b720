//! The status of a completion: a leaf (the error types name it, and every layer reads it).

use std::fmt;

/// Status of a completion (as `ibv_wc_status`, the ones mpib distinguishes).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Default)]
pub enum WcStatus {
    #[default]
    Success,
    /// Local length or protection error (a bad lkey or SGE).
    LocalError,
    /// The peer refused the access: unknown rkey, out of bounds, missing rights.
    RemoteAccessError,
    /// The peer failed to execute the operation.
    RemoteOpError,
    /// No acknowledgement within the retry budget (peer gone, link down).
    RetryExceeded,
    /// The peer never had a receive WQE within the RNR retry budget.
    RnrRetryExceeded,
    /// Flushed because the QP went to the error state.
    Flushed,
    /// The local QP could not execute the WR (verbs: `IBV_WC_LOC_QP_OP_ERR`; rxe reports it
    /// for WRs in flight when its port goes down).
    LocalQpError,
    /// Anything else; the provider's code is kept.
    Other(u32),
}

impl WcStatus {
    /// The status by its verbs name (`IBV_WC_*`, without the prefix; a group's
    /// representative), as net_ib and `ibv_wc_status_str` users read it in logs.
    pub fn name(self) -> &'static str {
        match self {
            WcStatus::Success => "SUCCESS",
            WcStatus::LocalError => "LOC_PROT_ERR",
            WcStatus::RemoteAccessError => "REM_ACCESS_ERR",
            WcStatus::RemoteOpError => "REM_OP_ERR",
            WcStatus::RetryExceeded => "RETRY_EXC_ERR",
            WcStatus::RnrRetryExceeded => "RNR_RETRY_EXC_ERR",
            WcStatus::Flushed => "WR_FLUSH_ERR",
            WcStatus::LocalQpError => "LOC_QP_OP_ERR",
            WcStatus::Other(_) => "OTHER",
        }
    }
}

impl fmt::Display for WcStatus {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            WcStatus::Success => f.write_str("success"),
            WcStatus::LocalError => f.write_str("local length/protection error"),
            WcStatus::RemoteAccessError => f.write_str("remote access error"),
            WcStatus::RemoteOpError => f.write_str("remote operation error"),
            WcStatus::RetryExceeded => f.write_str("transport retry counter exceeded"),
            WcStatus::RnrRetryExceeded => f.write_str("RNR retry counter exceeded"),
            WcStatus::Flushed => f.write_str("work request flushed (QP in error state)"),
            WcStatus::LocalQpError => f.write_str("local QP operation error"),
            WcStatus::Other(c) => write!(f, "completion error {c}"),
        }
    }
}
