//! The statistics file (`MPIB_STATS_FILE`, `%p` = pid): `rail<N>_<key>: <value>` lines,
//! rewritten every `MPIB_STATS_INTERVAL_MS` by a background thread and at close/finalize
//! ([`stats_flush_now`]). Each write goes to a temporary file in the same directory and
//! is renamed over the old one, so a reader sees the previous file or the new one, never
//! a partial one. The thread exists only when the file is configured, and sleeps in the
//! kernel between writes; the data path never touches the file.

use std::fmt::Write as _;
use std::io::Write as _;
use std::path::{Path, PathBuf};
use std::sync::{Arc, OnceLock};
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

use parking_lot::{Condvar, Mutex};

use super::registry::{RailTotals, process_totals};
use crate::config::Config;
use crate::error::{Error, Result};

/// The file's text: for each rail, latency statistics, estimates, share and counters.
pub fn format_stats(totals: &[RailTotals; 2]) -> String {
    let mut s = String::with_capacity(1024);
    for (n, t) in totals.iter().enumerate() {
        let l = &t.latency;
        let mut line = |key: &str, value: &dyn std::fmt::Display| {
            let _ = writeln!(s, "rail{n}_{key}: {value}");
        };
        line("latency_samples", &l.samples);
        line("latency_min_ns", &l.min_ns);
        line("latency_avg_ns", &l.avg_ns);
        line("latency_median_ns", &l.median_ns);
        line("latency_p95_ns", &l.p95_ns);
        line("latency_p99_ns", &l.p99_ns);
        line("latency_max_ns", &l.max_ns);
        line("srtt_ns", &t.srtt_ns);
        line("rttvar_ns", &t.rttvar_ns);
        line("base_latency_ns", &t.base_ns);
        line("bw_bytes_per_s", &t.bw_bytes_per_s);
        line("share", &format_args!("{:.4}", t.share));
        for (key, value) in t.counts.fields() {
            line(key, &value);
        }
        line("live_connections", &t.live);
        line("failed_connections", &t.failed);
    }
    s
}

/// `template` with `%p` replaced by `pid` (and `%%` by `%`).
pub fn expand_path(template: &str, pid: u32) -> PathBuf {
    let mut out = String::with_capacity(template.len() + 8);
    let mut chars = template.chars().peekable();
    while let Some(c) = chars.next() {
        match (c, chars.peek()) {
            ('%', Some('p')) => {
                chars.next();
                let _ = write!(out, "{pid}");
            }
            ('%', Some('%')) => {
                chars.next();
                out.push('%');
            }
            _ => out.push(c),
        }
    }
    PathBuf::from(out)
}

/// Replaces `path` with `contents` atomically: write a temporary file next to it, then
/// rename it over `path` (one directory, one filesystem, so the rename is atomic). An error
/// names the step that failed, the file it acted on and the real cause (a directory that
/// does not exist, a path component that is a file, the path itself a directory), keeping
/// the OS's error kind.
pub fn write_atomic(path: &Path, contents: &str) -> std::io::Result<()> {
    if path.is_dir() {
        // Said first: the temporary file next to it may fail for a reason of its own.
        return Err(std::io::Error::new(
            std::io::ErrorKind::IsADirectory,
            format!("{} is a directory", path.display()),
        ));
    }
    let name = path.file_name().ok_or_else(|| std::io::Error::other(format!("{}: not a file name", path.display())))?;
    let dir = path.parent().filter(|d| !d.as_os_str().is_empty()).unwrap_or(Path::new("."));
    let mut tmp_name = std::ffi::OsString::from(".");
    tmp_name.push(name);
    tmp_name.push(format!(".tmp{}", std::process::id()));
    let tmp = path.with_file_name(tmp_name);
    let failed = |e: std::io::Error, step: String, why: Option<String>| {
        std::io::Error::new(e.kind(), format!("{step}: {}", why.unwrap_or_else(|| e.to_string())))
    };
    let mut f = std::fs::File::create(&tmp).map_err(|e| {
        let step = format!("cannot create the temporary file {}", tmp.display());
        failed(e, step, dir_problem(dir))
    })?;
    let result = f
        .write_all(contents.as_bytes())
        .map_err(|e| failed(e, format!("cannot write the temporary file {}", tmp.display()), None))
        .and_then(|()| {
            std::fs::rename(&tmp, path).map_err(|e| {
                let is_dir = path.is_dir().then(|| format!("{} is a directory", path.display()));
                failed(e, format!("cannot rename {} to {}", tmp.display(), path.display()), is_dir)
            })
        });
    if result.is_err() {
        let _ = std::fs::remove_file(&tmp);
    }
    result
}

/// What is wrong with `dir` as a place for a file, if anything is: it does not exist, or
/// one of its components is not a directory.
fn dir_problem(dir: &Path) -> Option<String> {
    // The longest part of the path that exists says which.
    let existing = dir.ancestors().find(|a| a.exists())?;
    if !existing.is_dir() {
        return Some(format!("{} is not a directory", existing.display()));
    }
    (existing != dir).then(|| format!("the directory {} does not exist", dir.display()))
}

/// Writes a text to a file every interval from its own thread, and on demand.
pub struct StatsWriter {
    shared: Arc<Shared>,
    thread: Option<JoinHandle<()>>,
}

struct Shared {
    path: PathBuf,
    render: Box<dyn Fn() -> String + Send + Sync>,
    /// Serializes writes (the thread's and `flush_now`'s share one temporary name).
    write_lock: Mutex<WriteState>,
    stop: Mutex<bool>,
    wake: Condvar,
}

#[derive(Default)]
struct WriteState {
    /// The last write failed (logged once until a write succeeds again).
    failing: bool,
    writes: u64,
}

impl Shared {
    fn write(&self) -> std::io::Result<()> {
        let mut st = self.write_lock.lock();
        let r = write_atomic(&self.path, &(self.render)());
        match &r {
            Ok(()) => {
                st.failing = false;
                st.writes += 1;
            }
            Err(e) if !st.failing => {
                st.failing = true;
                let path = crate::config::cut(&self.path.to_string_lossy());
                log::warn!(target: "mpib::stats", "cannot write the statistics file {path}: {e}");
            }
            Err(_) => {}
        }
        r
    }
}

impl StatsWriter {
    /// Writes `render()` to `path` now, then starts the thread writing it every
    /// `interval`. A first write that fails is the error (nothing is started), so the
    /// caller can say at once what is wrong with the path.
    pub fn spawn(
        path: PathBuf,
        interval: Duration,
        render: impl Fn() -> String + Send + Sync + 'static,
    ) -> std::io::Result<StatsWriter> {
        write_atomic(&path, &render())?;
        let shared = Arc::new(Shared {
            path,
            render: Box::new(render),
            write_lock: Mutex::new(WriteState { failing: false, writes: 1 }),
            stop: Mutex::new(false),
            wake: Condvar::new(),
        });
        let s = shared.clone();
        let thread = std::thread::Builder::new().name("mpib-stats".into());
        let thread = thread
            .spawn(move || {
                let mut next = Instant::now() + interval;
                let mut stop = s.stop.lock();
                loop {
                    // Sleeps in the kernel until the deadline or a stop; never spins.
                    while !*stop && !s.wake.wait_until(&mut stop, next).timed_out() {}
                    if *stop {
                        return;
                    }
                    parking_lot::MutexGuard::unlocked(&mut stop, || {
                        let _ = s.write();
                    });
                    next += interval;
                    let now = Instant::now();
                    if next < now {
                        next = now + interval; // fell behind (a slow disk): do not catch up in a burst
                    }
                }
            })
            .map_err(|e| std::io::Error::new(e.kind(), format!("cannot start the statistics writer thread: {e}")))?;
        Ok(StatsWriter { shared, thread: Some(thread) })
    }

    /// Writes the file now, in the caller's thread.
    pub fn flush_now(&self) -> std::io::Result<()> {
        self.shared.write()
    }

    /// Successful writes so far.
    #[cfg(test)]
    pub fn writes(&self) -> u64 {
        self.shared.write_lock.lock().writes
    }
}

impl Drop for StatsWriter {
    /// Stops the thread (without a last write: call `flush_now` for that).
    fn drop(&mut self) {
        *self.shared.stop.lock() = true;
        self.shared.wake.notify_all();
        if let Some(t) = self.thread.take() {
            let _ = t.join();
        }
    }
}

/// The process's writer, once started (`None` inside: no file configured).
static PROCESS_WRITER: OnceLock<Option<StatsWriter>> = OnceLock::new();

/// Starts the process's statistics writer if `MPIB_STATS_FILE` is set; otherwise does
/// nothing. Idempotent: the first call decides. Call it from `init`.
pub fn start_stats_export(cfg: &Config) -> Result<()> {
    let mut failed = None;
    PROCESS_WRITER.get_or_init(|| {
        let template = cfg.stats_file.as_deref()?;
        let path = expand_path(template, std::process::id());
        let interval = Duration::from_millis(cfg.stats_interval_ms.max(1));
        let render = || format_stats(&process_totals());
        match StatsWriter::spawn(path.clone(), interval, render) {
            Ok(w) => {
                log::info!(target: "mpib::stats", "statistics every {} ms to {}", cfg.stats_interval_ms, path.display());
                Some(w)
            }
            Err(e) => {
                let path = crate::config::cut(&path.to_string_lossy());
                failed = Some(Error::system(format!("cannot write the statistics file {path}: {e}; none is written")));
                None
            }
        }
    });
    failed.map_or(Ok(()), Err)
}

/// Writes the statistics file now (connection close, finalize), if it is configured.
pub fn stats_flush_now() {
    if let Some(Some(w)) = PROCESS_WRITER.get() {
        let _ = w.flush_now();
    }
}

#[cfg(test)]
#[path = "export_tests.rs"]
mod tests;
