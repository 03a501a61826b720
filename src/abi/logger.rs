//! Routes the `log` crate to NCCL's logger once `init` gave one; before that (and when NCCL
//! passes NULL, as the tools do) to stderr, at the level `RUST_LOG` names (default `warn`).
//!
//! The stderr fallback is a dozen lines here rather than `env_logger`: the library NCCL
//! loads carries only what it needs, and a plugin's messages before `init` are a handful of
//! configuration lines, for which one level (`RUST_LOG=info`, or `mpib=info` among other
//! crates' directives) is enough.
//!
//! Level mapping: error/warn → `NCCL_LOG_WARN`, info → `NCCL_LOG_INFO`, debug/trace →
//! `NCCL_LOG_TRACE`. Subsystem: records from `mpib::config` → `NCCL_ENV`, from the
//! init/connect paths (`mpib::abi`, `mpib::plugin::setup`) → `NCCL_INIT`, the rest →
//! `NCCL_NET`; WARN lines go to `NCCL_ALL` as NCCL's own plugins do.

use std::ffi::{CString, c_int, c_ulong};
use std::io::Write;
use std::sync::OnceLock;
use std::sync::atomic::{AtomicUsize, Ordering};

use ncclnet_types::types::ncclDebugLogger_t;

const NCCL_LOG_WARN: c_int = 2;
const NCCL_LOG_INFO: c_int = 3;
const NCCL_LOG_TRACE: c_int = 5;
const NCCL_INIT: c_ulong = 0x1;
const NCCL_NET: c_ulong = 0x10;
const NCCL_ENV: c_ulong = 0x80;
const NCCL_ALL: c_ulong = !0;

/// NCCL's logger as a raw function address (0 = none yet).
static NCCL_LOGGER: AtomicUsize = AtomicUsize::new(0);

struct MpibLogger {
    /// The stderr fallback's level, from `RUST_LOG`.
    fallback: log::LevelFilter,
}

static LOGGER: OnceLock<MpibLogger> = OnceLock::new();

/// Installs the process-wide `log` logger (once). Safe to call from every entry point.
pub fn install() {
    let mut first = false;
    let logger = LOGGER.get_or_init(|| {
        first = true;
        MpibLogger { fallback: fallback_level(std::env::var("RUST_LOG").ok().as_deref()) }
    });
    if first && log::set_logger(logger).is_ok() {
        log::set_max_level(max_level());
    }
}

/// Uses NCCL's logger from now on (NULL keeps the stderr fallback).
pub fn set_nccl_logger(f: ncclDebugLogger_t) {
    install();
    if let Some(f) = f {
        NCCL_LOGGER.store(f as usize, Ordering::Release);
        log::set_max_level(max_level());
    }
}

/// The most verbose level worth formatting: NCCL drops what `NCCL_DEBUG` does not ask for,
/// so formatting it would only cost time.
fn max_level() -> log::LevelFilter {
    if NCCL_LOGGER.load(Ordering::Acquire) == 0 {
        return LOGGER.get().map_or(log::LevelFilter::Warn, |l| l.fallback);
    }
    match std::env::var("NCCL_DEBUG").map(|s| s.to_ascii_uppercase()) {
        Ok(s) if s == "TRACE" => log::LevelFilter::Trace,
        Ok(s) if s == "INFO" => log::LevelFilter::Info,
        _ => log::LevelFilter::Warn,
    }
}

/// The stderr level a `RUST_LOG` value asks for mpib: the value of an `mpib=LEVEL`
/// directive, else a bare `LEVEL` among the comma-separated directives, else `warn`.
fn fallback_level(rust_log: Option<&str>) -> log::LevelFilter {
    let (mut bare, mut ours) = (None, None);
    for d in rust_log.unwrap_or("").split(',').map(str::trim) {
        match d.split_once('=') {
            Some((target, level)) if target == "mpib" || target.starts_with("mpib::") => ours = level.parse().ok(),
            Some(_) => {}
            None => bare = bare.or(d.parse().ok()),
        }
    }
    ours.or(bare).unwrap_or(log::LevelFilter::Warn)
}

fn subsystem(target: &str) -> c_ulong {
    if target.starts_with("mpib::config") {
        NCCL_ENV
    } else if target.starts_with("mpib::abi") || target.starts_with("mpib::plugin::setup") {
        NCCL_INIT
    } else {
        NCCL_NET
    }
}

/// A C string from arbitrary text (interior NULs replaced).
fn c_text(s: &str) -> CString {
    CString::new(s.replace('\0', "?")).unwrap_or_default()
}

impl log::Log for MpibLogger {
    fn enabled(&self, metadata: &log::Metadata) -> bool {
        metadata.level() <= log::max_level()
    }

    fn log(&self, record: &log::Record) {
        if !self.enabled(record.metadata()) {
            return;
        }
        let f = NCCL_LOGGER.load(Ordering::Acquire);
        if f == 0 {
            // One write per line, so lines of several threads do not interleave.
            let line = format!("mpib {} {}: {}\n", record.level(), record.target(), record.args());
            let _ = std::io::stderr().lock().write_all(line.as_bytes());
            return;
        }
        // SAFETY: `f` was stored from a non-null `ncclDebugLogger_t` by `set_nccl_logger`,
        // so it is a valid function pointer of exactly this type.
        let f: unsafe extern "C" fn(c_int, c_ulong, *const std::ffi::c_char, c_int, *const std::ffi::c_char, ...) =
            unsafe { std::mem::transmute(f) };
        let (level, flags) = match record.level() {
            log::Level::Error | log::Level::Warn => (NCCL_LOG_WARN, NCCL_ALL),
            log::Level::Info => (NCCL_LOG_INFO, subsystem(record.target())),
            _ => (NCCL_LOG_TRACE, subsystem(record.target())),
        };
        let msg = c_text(&format!("MPIB: {}", record.args()));
        let file = c_text(record.file().unwrap_or("mpib"));
        let line = record.line().unwrap_or(0) as c_int;
        // SAFETY: NCCL's logger takes a printf format; "%s" with one valid C string argument
        // matches it, and both strings outlive the call.
        unsafe { f(level, flags, file.as_ptr(), line, c"%s".as_ptr(), msg.as_ptr()) };
    }

    fn flush(&self) {}
}

/// Sends panic messages to the log (NCCL's WARN) instead of the host's stderr.
pub fn install_panic_hook() {
    static ONCE: OnceLock<()> = OnceLock::new();
    ONCE.get_or_init(|| {
        std::panic::set_hook(Box::new(|info| {
            let loc = info.location().map(|l| format!(" at {}:{}", l.file(), l.line())).unwrap_or_default();
            let msg = info
                .payload()
                .downcast_ref::<&str>()
                .map(|s| s.to_string())
                .or_else(|| info.payload().downcast_ref::<String>().cloned())
                .unwrap_or_else(|| "(non-string payload)".to_string());
            log::error!("internal error (panic){loc}: {msg}");
        }));
    });
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn rust_log_picks_mpibs_level() {
        use log::LevelFilter::*;
        assert_eq!(fallback_level(None), Warn);
        assert_eq!(fallback_level(Some("")), Warn);
        assert_eq!(fallback_level(Some("info")), Info);
        assert_eq!(fallback_level(Some("TRACE")), Trace);
        assert_eq!(fallback_level(Some("other=debug")), Warn, "another crate's directive");
        assert_eq!(fallback_level(Some("error,mpib=debug")), Debug, "mpib's directive wins");
        assert_eq!(fallback_level(Some("mpib::plugin=info,warn")), Info);
        assert_eq!(fallback_level(Some("off")), Off);
        assert_eq!(fallback_level(Some("nonsense")), Warn);
    }
}
