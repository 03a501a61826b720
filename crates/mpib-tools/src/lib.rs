//! A driver for any `ncclNet` plugin: loads the library as NCCL does and drives it as NCCL's
//! proxy does, through the C ABI only. The conformance suite, the `inproc_msgs` example and
//! `mpib-perf` are built on it.
//!
//! ```text
//! ffi       dlopen / dlsym, the seven function tables         (unsafe, FFI)
//! net/      Plugin, Net, listen/connect (mod.rs); comms, Mr, Request (comm.rs): one
//!           safe API over v6 … v12
//! props     getProperties of every version as one struct
//! mem       Arena: page-aligned memory that plugins read and write behind Rust's back
//! pattern   the deterministic per-message byte pattern and checksum
//! spec      Workload (phases of messages) and its one-line text form
//! workload  the proxy-like sender and receiver loops that run one phase
//! timeline  the sender's samples of its per-rail byte counters during a phase
//! link      the control channel between two ranks (TCP, framed)
//! rank      one rank: open, init, connect, run the workload (warm-ups, time budgets),
//!           report
//! report    what a rank measured, as one line
//! stats_view the plugin's per-NIC and per-peer view of a rank's process (mpib-perf --stats)
//! pair      the two-process mode: start two ranks (`mpib-rank`, or mpib-perf itself)
//!           through `child_procs`, collect their reports
//! lifecycle N ranks (`mpib-lifecycle`) driving the plugin through NCCL's life cycle:
//!           threads setting up and closing, independent teardown, aborts
//! ```
//!
//! Calls behave like NCCL's: a NULL request means "retry later", the oldest request of each
//! direction is tested, `*request` is pre-set to `NCCL_NET_OPTIONAL_RECV_COMPLETION` before
//! `irecv` for v9+ and must come back overwritten, `connect`/`accept` are called again with
//! the same handle buffer until they return a comm.

use std::fmt;

pub mod ffi;
pub mod kv;
pub mod lifecycle;
pub mod link;
pub mod mem;
pub mod net;
pub mod pair;
pub mod pattern;
pub mod props;
pub mod rank;
pub mod report;
pub mod spec;
pub mod stats_view;
mod timeline;
pub mod workload;

pub use ffi::{Library, VERSIONS};
pub use mem::Arena;
pub use net::{Connector, ListenComm, Mr, Net, Plugin, RecvComm, Request, SendComm};
pub use props::Props;
pub use spec::{Phase, RecvSize, Side, Workload};

/// `ncclResult_t` values, as NCCL's headers define them (one definition for plugin and tools).
pub use ncclnet_types::result as code;

/// What went wrong, and where.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum ErrorKind {
    /// The library or a symbol could not be loaded.
    Load,
    /// A plugin call returned a non-success `ncclResult_t` (in [`Error::code`]).
    Call,
    /// The plugin broke the ABI contract (left the optional-completion marker in
    /// `*request`, wrote sizes it must not write, completed a request twice, …).
    Contract,
    /// Received bytes or sizes differ from what was sent.
    Data,
    /// Nothing happened for too long.
    Timeout,
    /// The control channel between the ranks, or a process, failed.
    Io,
    /// A bad argument to the driver itself (options, workload).
    Usage,
}

/// A driver error: its kind, the plugin call it came from, the plugin's result code.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Error {
    pub kind: ErrorKind,
    /// The ncclNet call (`"isend"`, `"test"`, …) for [`ErrorKind::Call`] and contract errors.
    pub call: &'static str,
    /// The `ncclResult_t` the plugin returned ([`ErrorKind::Call`] only).
    pub code: i32,
    pub msg: String,
}

pub type Result<T> = std::result::Result<T, Error>;

impl Error {
    pub fn new(kind: ErrorKind, msg: impl Into<String>) -> Error {
        Error { kind, call: "", code: 0, msg: msg.into() }
    }
    pub fn load(msg: impl Into<String>) -> Error {
        Error::new(ErrorKind::Load, msg)
    }
    pub fn usage(msg: impl Into<String>) -> Error {
        Error::new(ErrorKind::Usage, msg)
    }
    pub fn io(msg: impl Into<String>) -> Error {
        Error::new(ErrorKind::Io, msg)
    }
    pub fn data(msg: impl Into<String>) -> Error {
        Error::new(ErrorKind::Data, msg)
    }
    pub fn timeout(msg: impl Into<String>) -> Error {
        Error::new(ErrorKind::Timeout, msg)
    }
    /// `call` returned `code`.
    pub fn call(call: &'static str, code: i32) -> Error {
        Error { kind: ErrorKind::Call, call, code, msg: format!("{call} returned {} ({code})", code_name(code)) }
    }
    /// The plugin broke the contract of `call`.
    pub fn contract(call: &'static str, msg: impl Into<String>) -> Error {
        Error { kind: ErrorKind::Contract, call, code: 0, msg: format!("{call}: {}", msg.into()) }
    }
}

impl fmt::Display for Error {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.msg)
    }
}

impl std::error::Error for Error {}

/// The name of an `ncclResult_t` value.
pub use ncclnet_types::result::name as code_name;

/// Maps a plugin's return code to `Ok` or an [`ErrorKind::Call`] error.
#[inline]
pub(crate) fn check(call: &'static str, rc: i32) -> Result<()> {
    if rc == code::SUCCESS { Ok(()) } else { Err(Error::call(call, rc)) }
}

/// Raises this process's soft limit of open files to its hard limit; returns the new soft
/// limit. Runs with many connections need it while the soft fabric uses a TCP socket per
/// QP (an NCCL job with hundreds of comms runs with a raised limit anyway).
pub fn raise_fd_limit() -> u64 {
    let mut r = libc::rlimit { rlim_cur: 0, rlim_max: 0 };
    // SAFETY: a valid out-pointer; then the same struct, with the soft limit raised.
    unsafe {
        if libc::getrlimit(libc::RLIMIT_NOFILE, &mut r) != 0 {
            return 0;
        }
        if r.rlim_cur < r.rlim_max {
            let want = libc::rlimit { rlim_cur: r.rlim_max, rlim_max: r.rlim_max };
            if libc::setrlimit(libc::RLIMIT_NOFILE, &want) == 0 {
                r = want;
            }
        }
    }
    r.rlim_cur
}

/// The mpib library for the running executable: `NCCL_NET_PLUGIN` when set, as NCCL would
/// read it; else the release's own plugin (`bin/mpib-perf` beside
/// `lib/libnccl-net-mpib.so`: [`released_plugin`]); else the one cargo built for it (tests
/// live in `target/<profile>/deps/`, examples in `target/<profile>/examples/`, tools in
/// `target/<profile>/`).
///
/// Cargo always rebuilds `target/<profile>/deps/libmpib.so` with the library, but copies it
/// up to `target/<profile>/libmpib.so` only when the library itself was asked for (not for
/// `cargo build --example …` or `cargo test --test …`), so the newer of the two is taken.
pub fn default_plugin() -> String {
    if let Ok(v) = std::env::var("NCCL_NET_PLUGIN")
        && !v.is_empty()
    {
        return v;
    }
    let exe = std::env::current_exe().unwrap_or_default();
    if let Some(lib) = released_plugin(&exe) {
        return lib.to_string_lossy().into_owned();
    }
    let mut dir = exe.parent();
    while let Some(d) = dir {
        if let Some(lib) = newest_lib(d) {
            return lib.to_string_lossy().into_owned();
        }
        if d.file_name().is_some_and(|n| n == "target") {
            break;
        }
        dir = d.parent();
    }
    "libmpib.so".to_string()
}

/// The plugin of a release (ci/release.sh's layout) that `exe` belongs to:
/// `<root>/lib/libnccl-net-mpib.so` for `<root>/bin/<exe>`, if it exists.
pub fn released_plugin(exe: &std::path::Path) -> Option<std::path::PathBuf> {
    let bin = exe.parent().filter(|d| d.file_name().is_some_and(|n| n == "bin"))?;
    let lib = bin.parent()?.join("lib").join("libnccl-net-mpib.so");
    lib.is_file().then_some(lib)
}

/// The newer of `profile/libmpib.so` and `profile/deps/libmpib.so`, if either exists.
pub fn newest_lib(profile: &std::path::Path) -> Option<std::path::PathBuf> {
    let age = |p: &std::path::Path| std::fs::metadata(p).and_then(|m| m.modified()).ok();
    [profile.join("libmpib.so"), profile.join("deps").join("libmpib.so")]
        .into_iter()
        .filter_map(|p| age(&p).map(|t| (t, p)))
        .max_by_key(|(t, _)| *t)
        .map(|(_, p)| p)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_released_tool_finds_the_plugin_of_its_release() {
        let root = std::env::temp_dir().join(format!("mpib-tools-release-{}", std::process::id()));
        std::fs::create_dir_all(root.join("bin")).unwrap();
        let exe = root.join("bin").join("mpib-perf");
        assert_eq!(released_plugin(&exe), None, "no lib/ beside bin/");
        std::fs::create_dir_all(root.join("lib")).unwrap();
        std::fs::write(root.join("lib").join("libnccl-net-mpib.so"), b"").unwrap();
        assert_eq!(released_plugin(&exe), Some(root.join("lib").join("libnccl-net-mpib.so")));
        assert_eq!(released_plugin(&root.join("mpib-perf")), None, "only from a bin/ folder");
        std::fs::remove_dir_all(&root).unwrap();
    }
}
