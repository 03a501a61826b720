//! The statistics file (`MPIB_STATS_FILE`, `%p` = pid): `<group>_<key>: <value>` lines,
//! rewritten every `MPIB_STATS_INTERVAL_MS` by a background thread and at close/finalize
//! ([`StatsExport::flush_now`]). Each write goes to a temporary file in the same directory and
//! is renamed over the old one, so a reader sees the previous file or the new one, never
//! a partial one. The thread exists only when the file is configured, and sleeps in the
//! kernel between writes; the data path never touches the file. The Prometheus textfile
//! (`MPIB_PROM_FILE`, `prom.rs`) is written the same way by a writer of its own.

use std::fmt::Write as _;
use std::io::Write as _;
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

use parking_lot::{Condvar, Mutex};

use super::prom::format_prometheus;
use super::registry::{PeerTotals, RailTotals, Registry, StatsView};
use crate::config::Config;
use crate::error::Error;

/// The lines of one group of figures, each key after `prefix`.
fn totals_lines(s: &mut String, prefix: &str, t: &RailTotals) {
    let l = &t.latency;
    let mut line = |key: &str, value: &dyn std::fmt::Display| {
        let _ = writeln!(s, "{prefix}{key}: {value}");
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

/// The file's text: for each rail, latency statistics, estimates, share and counters
/// (`rail<N>_<key>`); the same per NIC and rail (`nic<I>_<key>`, after `nic<I>_name` and
/// `nic<I>_rail`); the worst peers by latency (`slow_peer<I>_<key>`) and by errors
/// (`error_peer<I>_<key>`), worst first.
pub fn format_stats(view: &StatsView) -> String {
    let mut s = String::with_capacity(1024 + 1024 * view.nics.len());
    for (n, t) in view.rails.iter().enumerate() {
        totals_lines(&mut s, &format!("rail{n}_"), t);
    }
    for (i, n) in view.nics.iter().enumerate() {
        let _ = writeln!(s, "nic{i}_name: {}", n.nic);
        let _ = writeln!(s, "nic{i}_rail: {}", n.rail);
        totals_lines(&mut s, &format!("nic{i}_"), &n.totals);
    }
    for (i, p) in view.worst.by_latency.iter().enumerate() {
        peer_lines(&mut s, &format!("slow_peer{i}_"), p);
    }
    for (i, p) in view.worst.by_errors.iter().enumerate() {
        peer_lines(&mut s, &format!("error_peer{i}_"), p);
    }
    s
}

fn peer_lines(s: &mut String, prefix: &str, p: &PeerTotals) {
    let l = &p.latency;
    let c = &p.counts;
    let fields: [(&str, &dyn std::fmt::Display); 13] = [
        ("peer", &p.peer),
        ("nic", &p.nic),
        ("rail", &p.rail),
        ("latency_samples", &l.samples),
        ("latency_median_ns", &l.median_ns),
        ("latency_p99_ns", &l.p99_ns),
        ("latency_max_ns", &l.max_ns),
        ("srtt_ns", &p.srtt_ns),
        ("bytes", &c.bytes),
        ("errors", &c.errors),
        ("failovers", &c.failovers),
        ("suspects", &c.suspects),
        ("live_connections", &p.live),
    ];
    for (key, value) in fields {
        let _ = writeln!(s, "{prefix}{key}: {value}");
    }
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

/// A plugin instance's writers (`None`: that file is not configured), each rendering the
/// instance's registry.
#[derive(Default)]
pub struct StatsExport {
    stats: Option<StatsWriter>,
    prom: Option<StatsWriter>,
}

/// Starts the writer of `template` (`%p` = pid), rendering with `render`; `what` names the
/// file in messages.
fn start_writer(
    what: &str,
    template: &str,
    interval_ms: u64,
    render: impl Fn() -> String + Send + Sync + 'static,
    failed: &mut Option<Error>,
) -> Option<StatsWriter> {
    let path = expand_path(template, std::process::id());
    let interval = Duration::from_millis(interval_ms.max(1));
    match StatsWriter::spawn(path.clone(), interval, render) {
        Ok(w) => {
            log::info!(target: "mpib::stats", "{what} every {interval_ms} ms to {}", path.display());
            Some(w)
        }
        Err(e) => {
            let path = crate::config::cut(&path.to_string_lossy());
            failed.get_or_insert(Error::system(format!("cannot write the {what} {path}: {e}; none is written")));
            None
        }
    }
}

impl StatsExport {
    /// Starts the writers of `registry`'s figures: the statistics file if `MPIB_STATS_FILE`
    /// is set, the Prometheus textfile if `MPIB_PROM_FILE` is; otherwise none. The error
    /// says which file cannot be written (its writer is not started; the other may be).
    /// Called from `init`, once per plugin instance.
    pub fn start(cfg: &Config, registry: &'static Registry) -> (StatsExport, Option<Error>) {
        let mut failed = None;
        let ms = cfg.stats_interval_ms;
        let stats = cfg.stats_file.as_deref().and_then(|t| {
            let render = move || format_stats(&StatsView::of(registry));
            start_writer("statistics file", t, ms, render, &mut failed)
        });
        let prom = cfg.prom_file.as_deref().and_then(|t| {
            let render = move || format_prometheus(&StatsView::of(registry));
            start_writer("Prometheus textfile", t, ms, render, &mut failed)
        });
        (StatsExport { stats, prom }, failed)
    }

    /// Writes the statistics files now (connection close, finalize), those configured.
    pub fn flush_now(&self) {
        for w in [&self.stats, &self.prom].into_iter().flatten() {
            let _ = w.flush_now();
        }
    }

    /// Whether any file is written.
    #[cfg(test)]
    pub fn is_active(&self) -> bool {
        self.stats.is_some() || self.prom.is_some()
    }
}

#[cfg(test)]
#[path = "export_tests.rs"]
mod tests;
