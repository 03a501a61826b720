//! The one way into the plugin from C: every entry point runs its body here, so that no
//! panic unwinds into NCCL and every error becomes a logged `ncclResult_t`.

use std::panic::{AssertUnwindSafe, catch_unwind};

use ncclnet_types::result;
use ncclnet_types::types::ncclResult_t;

use std::time::{Duration, Instant};

use crate::error::{Error, ErrorKind};
use crate::ratelimit::{Keyed, suppressed};

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
            // The data path's calls, which a caller repeats in a loop (a user's mismatched
            // sizes, every test of a broken connection), log one line per call and cause a
            // second; every call still gets its code. Set-up, registration and close calls
            // log each failure (each is a different comm or a new attempt).
            match repeated_call(call) {
                Some(name) => {
                    if let Some(held) = FAILED.admit(name, cause_class(&e), Instant::now()) {
                        log::warn!("{call}: {e}{}", suppressed(held));
                    }
                }
                None => log::warn!("{call}: {e}"),
            }
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

static FAILED: Keyed = Keyed::new(Duration::from_secs(1));

/// The data-path entry points, as `'static` keys: the calls NCCL's proxy repeats.
fn repeated_call(call: &str) -> Option<&'static str> {
    const CALLS: [&str; 5] = ["isend", "irecv", "test", "iflush", "irecvConsumed"];
    CALLS.iter().find(|&&c| c == call).copied()
}

/// What kind of failure `e` is, as a key: its class and the type of its cause (a message's
/// words vary from call to call; its type does not).
fn cause_class(e: &Error) -> &'static str {
    use crate::error::Cause;
    match (&e.root().cause, e.kind) {
        (Cause::Refused(_), _) => "refused",
        (Cause::Violation(_), _) => "violation",
        (Cause::CompletionFailed(_), _) => "completion",
        (Cause::StrayCompletion(_), _) => "stray",
        (Cause::BothRailsFailed, _) => "rails",
        (Cause::FailedEarlier(_), _) => "earlier",
        (Cause::At { .. }, _) => "placed", // (a root is never placed)
        (Cause::Message(_), ErrorKind::System) => "system",
        (Cause::Message(_), ErrorKind::Internal) => "internal",
        (Cause::Message(_), ErrorKind::InvalidArgument) => "argument",
        (Cause::Message(_), ErrorKind::InvalidUsage) => "usage",
        (Cause::Message(_), ErrorKind::Remote) => "remote",
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn data_path_calls_are_rate_limited_and_set_up_calls_are_not() {
        assert_eq!(repeated_call("isend"), Some("isend"));
        assert_eq!(repeated_call("test"), Some("test"));
        assert_eq!(repeated_call("init"), None, "every failed init is logged");
        assert_eq!(repeated_call("connect"), None);
        let refused = Error::from(crate::engine::Refused::TooManySends { max: 1 });
        assert_eq!(cause_class(&refused), "refused");
        assert_eq!(cause_class(&Error::remote("gone")), "remote");
    }

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
