//! The one way into the plugin from C: every entry point runs its body here, so that no
//! panic unwinds into NCCL and every error becomes a logged `ncclResult_t`.

use std::panic::{AssertUnwindSafe, catch_unwind};

use super::types::ncclResult_t;
use crate::error::{Error, ErrorKind};

/// Result codes (`ncclResult_t` values). A plugin returns only 0–6.
pub mod result {
    use super::ncclResult_t;
    pub const SUCCESS: ncclResult_t = 0;
    pub const SYSTEM_ERROR: ncclResult_t = 2;
    pub const INTERNAL_ERROR: ncclResult_t = 3;
    pub const INVALID_ARGUMENT: ncclResult_t = 4;
    pub const INVALID_USAGE: ncclResult_t = 5;
    pub const REMOTE_ERROR: ncclResult_t = 6;
}

/// The `ncclResult_t` for an error class.
pub fn code(kind: ErrorKind) -> ncclResult_t {
    match kind {
        ErrorKind::System => result::SYSTEM_ERROR,
        ErrorKind::Internal => result::INTERNAL_ERROR,
        ErrorKind::InvalidArgument => result::INVALID_ARGUMENT,
        ErrorKind::InvalidUsage => result::INVALID_USAGE,
        ErrorKind::Remote => result::REMOTE_ERROR,
    }
}

/// Runs `body` for the entry point `call`: `Ok` → `ncclSuccess`; `Err` → one WARN line
/// `call: message` and the error's code; a panic → one WARN line and `ncclInternalError`.
#[inline]
pub fn run(call: &str, body: impl FnOnce() -> Result<(), Error>) -> ncclResult_t {
    match catch_unwind(AssertUnwindSafe(body)) {
        Ok(Ok(())) => result::SUCCESS,
        other => failed(call, other),
    }
}

/// The log line and code of a failed or panicked call (out of the callers' way).
#[cold]
#[inline(never)]
fn failed(call: &str, outcome: std::thread::Result<Result<(), Error>>) -> ncclResult_t {
    match outcome {
        Ok(Ok(())) => result::SUCCESS,
        Ok(Err(e)) => {
            log::warn!("{call}: {e}");
            code(e.kind)
        }
        Err(payload) => {
            let msg = payload
                .downcast_ref::<&str>()
                .map(|s| s.to_string())
                .or_else(|| payload.downcast_ref::<String>().cloned())
                .unwrap_or_default();
            log::warn!("{call}: internal error (panic caught at the ABI edge): {msg}");
            result::INTERNAL_ERROR
        }
    }
}

/// `ptr` as `&mut T`, or an `InvalidArgument` error naming `what` when it is NULL.
///
/// # Safety
/// A non-null `ptr` must point to a valid, writable `T` for the call's duration.
#[inline(always)]
pub unsafe fn out<'a, T>(ptr: *mut T, what: &str) -> Result<&'a mut T, Error> {
    // SAFETY: the caller guarantees a non-null pointer is valid and writable.
    match unsafe { ptr.as_mut() } {
        Some(r) => Ok(r),
        None => Err(super::common::null_argument(what)),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn success_error_and_panic_map_to_codes() {
        assert_eq!(run("t", || Ok(())), result::SUCCESS);
        assert_eq!(run("t", || Err(Error::invalid_argument("x"))), result::INVALID_ARGUMENT);
        assert_eq!(run("t", || Err(Error::remote("peer"))), result::REMOTE_ERROR);
        assert_eq!(run("t", || Err(Error::system("s"))), result::SYSTEM_ERROR);
        assert_eq!(run("t", || Err(Error::invalid_usage("u"))), result::INVALID_USAGE);
        assert_eq!(run("t", || panic!("boom")), result::INTERNAL_ERROR);
        let v: Vec<u8> = Vec::new();
        #[allow(clippy::useless_vec)]
        let r = run("t", || {
            let _ = v[3];
            Ok(())
        });
        assert_eq!(r, result::INTERNAL_ERROR);
    }

    #[test]
    fn null_out_pointer_is_invalid_argument() {
        // SAFETY: NULL is handled without dereferencing.
        let e = unsafe { out::<i32>(std::ptr::null_mut(), "ndev") }.unwrap_err();
        assert_eq!(e.kind, ErrorKind::InvalidArgument);
        assert!(e.msg.contains("ndev is NULL"));
    }
}
