//! The one way into the plugin from C: every entry point runs its body here, so that no
//! panic unwinds into NCCL and every error becomes a logged `ncclResult_t`.

use std::panic::{AssertUnwindSafe, catch_unwind};

use ncclnet_types::result;
use ncclnet_types::types::ncclResult_t;

use crate::error::{Error, ErrorKind};

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
}
