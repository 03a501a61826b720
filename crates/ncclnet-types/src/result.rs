//! `ncclResult_t` values, defined once for the plugin (which returns them) and the tools
//! (which read them). A network plugin returns only these.

use super::types::ncclResult_t;

pub const SUCCESS: ncclResult_t = 0;
pub const SYSTEM_ERROR: ncclResult_t = 2;
pub const INTERNAL_ERROR: ncclResult_t = 3;
pub const INVALID_ARGUMENT: ncclResult_t = 4;
pub const INVALID_USAGE: ncclResult_t = 5;
pub const REMOTE_ERROR: ncclResult_t = 6;

/// NCCL's name of a result code (`ncclGetErrorString`'s enum names).
pub fn name(code: ncclResult_t) -> &'static str {
    match code {
        SUCCESS => "ncclSuccess",
        1 => "ncclUnhandledCudaError",
        SYSTEM_ERROR => "ncclSystemError",
        INTERNAL_ERROR => "ncclInternalError",
        INVALID_ARGUMENT => "ncclInvalidArgument",
        INVALID_USAGE => "ncclInvalidUsage",
        REMOTE_ERROR => "ncclRemoteError",
        7 => "ncclInProgress",
        8 => "ncclTimeout",
        _ => "an unknown ncclResult_t",
    }
}
