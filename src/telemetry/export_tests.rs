//! Unit tests of `export.rs`: the file's format, path expansion, atomic replacement and
//! the writer thread.

use super::*;
use crate::telemetry::{LatencySummary, RailCounts};
use std::collections::BTreeMap;

fn tmpdir(name: &str) -> PathBuf {
    let d = std::env::temp_dir().join(format!("mpib-export-{name}-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&d);
    std::fs::create_dir_all(&d).unwrap();
    d
}

fn parse(text: &str) -> BTreeMap<String, String> {
    text.lines()
        .map(|l| {
            let (k, v) = l.split_once(": ").unwrap_or_else(|| panic!("not `key: value`: {l:?}"));
            (k.to_string(), v.to_string())
        })
        .collect()
}

#[test]
fn every_key_of_both_rails_with_its_value() {
    let mut t = [RailTotals::default(); 2];
    t[0].latency = LatencySummary {
        samples: 10,
        min_ns: 1000,
        avg_ns: 1500,
        median_ns: 1400,
        p95_ns: 2500,
        p99_ns: 2900,
        max_ns: 3000,
    };
    t[0].counts =
        RailCounts { wr_posted: 30, doorbells: 10, bytes: 3 << 20, imm_sent: 10, cqe: 10, ..Default::default() };
    t[1].counts.bytes = 1 << 20;
    (t[0].share, t[1].share) = (0.75, 0.25);
    (t[1].srtt_ns, t[1].rttvar_ns, t[1].base_ns, t[1].bw_bytes_per_s) = (21_000, 1_500, 19_000, 250_000_000);
    let text = format_stats(&StatsView { rails: t, ..Default::default() });
    let kv = parse(&text);
    let keys = [
        "latency_samples",
        "latency_min_ns",
        "latency_avg_ns",
        "latency_median_ns",
        "latency_p95_ns",
        "latency_p99_ns",
        "latency_max_ns",
        "srtt_ns",
        "rttvar_ns",
        "base_latency_ns",
        "bw_bytes_per_s",
        "share",
        "wr_posted",
        "doorbells",
        "bytes",
        "imm_sent",
        "cqe",
        "rnr",
        "zero_byte_imm",
    ];
    for rail in 0..2 {
        for k in keys {
            assert!(kv.contains_key(&format!("rail{rail}_{k}")), "rail{rail}_{k} missing from:\n{text}");
        }
    }
    assert_eq!(text.lines().count(), kv.len(), "no key twice");
    assert!(text.lines().all(|l| l.starts_with("rail0_") || l.starts_with("rail1_")), "{text}");
    assert_eq!(kv["rail0_latency_p99_ns"], "2900");
    assert_eq!(kv["rail0_bytes"], (3 << 20).to_string());
    assert_eq!(kv["rail0_share"], "0.7500");
    assert_eq!(kv["rail1_share"], "0.2500");
    assert_eq!(kv["rail1_srtt_ns"], "21000");
    assert_eq!(kv["rail1_bw_bytes_per_s"], "250000000");
    assert_eq!(kv["rail1_zero_byte_imm"], "0");
    assert!(text.ends_with('\n'));
}

#[test]
fn nic_rows_and_the_worst_peers_follow_the_rails() {
    let view = crate::telemetry::prom::tests::sample_view();
    let text = format_stats(&view);
    let kv = parse(&text);
    assert_eq!(text.lines().count(), kv.len(), "no key twice");
    assert_eq!((kv["nic0_name"].as_str(), kv["nic0_rail"].as_str()), ("mlx5_0:1", "0"));
    assert_eq!((kv["nic1_name"].as_str(), kv["nic1_rail"].as_str()), ("mlx5_1:1", "1"));
    assert_eq!(kv["nic0_bytes"], (3 << 20).to_string());
    assert_eq!((kv["nic1_errors"].as_str(), kv["nic1_failed_connections"].as_str()), ("2", "1"));
    assert_eq!(kv["nic0_latency_p99_ns"], "2900");
    assert_eq!((kv["slow_peer0_peer"].as_str(), kv["slow_peer0_latency_p99_ns"].as_str()), ("GID fe80::b", "250000"));
    assert_eq!((kv["slow_peer1_peer"].as_str(), kv["slow_peer1_srtt_ns"].as_str()), ("GID fe80::a", "1500"));
    assert!(!kv.contains_key("slow_peer2_peer"));
    assert_eq!((kv["error_peer0_peer"].as_str(), kv["error_peer0_nic"].as_str()), ("GID fe80::c", "mlx5_1:1"));
    assert_eq!((kv["error_peer0_errors"].as_str(), kv["error_peer0_failovers"].as_str()), ("2", "1"));
    // The rail lines come first and are what they were.
    assert!(text.starts_with("rail0_latency_samples: 10\n"), "{text}");
}

#[test]
fn percent_p_becomes_the_pid() {
    assert_eq!(expand_path("/tmp/mpib-%p.txt", 4242), PathBuf::from("/tmp/mpib-4242.txt"));
    assert_eq!(expand_path("/tmp/%p/%p", 7), PathBuf::from("/tmp/7/7"));
    assert_eq!(expand_path("/tmp/100%%-%p", 7), PathBuf::from("/tmp/100%-7"));
    assert_eq!(expand_path("/tmp/a%b%", 7), PathBuf::from("/tmp/a%b%"));
}

#[test]
fn write_atomic_replaces_and_leaves_no_temporary_file() {
    let d = tmpdir("replace");
    let p = d.join("stats.txt");
    write_atomic(&p, "one\n").unwrap();
    write_atomic(&p, "two\n").unwrap();
    assert_eq!(std::fs::read_to_string(&p).unwrap(), "two\n");
    let names: Vec<_> = std::fs::read_dir(&d).unwrap().map(|e| e.unwrap().file_name()).collect();
    assert_eq!(names, vec![std::ffi::OsString::from("stats.txt")]);
    let e = write_atomic(&d.join("no-such-dir/stats.txt"), "x").unwrap_err();
    assert_eq!(e.kind(), std::io::ErrorKind::NotFound);
    std::fs::remove_dir_all(&d).unwrap();
}

/// An unwritable path's error names the real cause: the step that failed, the file it
/// acted on, and why (a missing directory, a path that is a directory, ...), not the
/// statistics file's own "No such file or directory".
#[test]
fn an_unwritable_path_names_the_real_cause() {
    let d = tmpdir("causes");
    let missing = d.join("no-such-dir");
    let e = write_atomic(&missing.join("stats.txt"), "x").unwrap_err();
    let m = e.to_string();
    assert!(m.contains(&format!("the directory {} does not exist", missing.display())), "{m}");
    assert_eq!(e.kind(), std::io::ErrorKind::NotFound, "the OS's error kind is kept");
    // The path is a directory.
    let e = write_atomic(&d, "x").unwrap_err().to_string();
    assert!(e.contains("is a directory"), "{e}");
    // A path under a regular file.
    let f = d.join("file");
    std::fs::write(&f, "").unwrap();
    let e = write_atomic(&f.join("stats.txt"), "x").unwrap_err().to_string();
    assert!(e.contains(&format!("{} is not a directory", f.display())), "{e}");
    // A directory where nothing can be created (procfs).
    let e = write_atomic(Path::new("/proc/mpib-stats.txt"), "x").unwrap_err().to_string();
    assert!(e.contains("cannot create the temporary file /proc/.mpib-stats.txt.tmp"), "{e}");
    std::fs::remove_dir_all(&d).unwrap();
}

/// `StatsExport::start`'s first write happens at once, so `init` can say what is wrong with
/// the path (its caller logs the error as a WARN).
#[test]
fn the_first_write_happens_at_start() {
    let d = tmpdir("first");
    let w = StatsWriter::spawn(d.join("s.txt"), Duration::from_secs(3600), || "a: 1\n".to_string()).unwrap();
    assert_eq!(w.writes(), 1, "written before the first interval");
    assert_eq!(std::fs::read_to_string(d.join("s.txt")).unwrap(), "a: 1\n");
    let e = StatsWriter::spawn(d.join("nope/s.txt"), Duration::from_secs(3600), String::new).err().unwrap();
    assert!(e.to_string().contains("does not exist"), "{e}");
    drop(w);
    std::fs::remove_dir_all(&d).unwrap();
}

/// A document of `n` numbered lines ending in a line that gives their count, so a
/// reader can tell a whole file from a partial one.
fn document(n: usize) -> String {
    let mut s = String::new();
    for i in 0..n {
        s.push_str(&format!("rail0_key{i}: {}\n", i * 7));
    }
    s.push_str(&format!("rail1_lines: {n}\n"));
    s
}

fn is_whole(text: &str) -> bool {
    let Some(last) = text.lines().last() else { return false };
    let Some(n) = last.strip_prefix("rail1_lines: ").and_then(|v| v.parse::<usize>().ok()) else { return false };
    text == document(n)
}

#[test]
fn a_reader_never_sees_a_partial_file() {
    let d = tmpdir("atomic");
    let p = d.join("stats-%p.txt");
    let path = expand_path(p.to_str().unwrap(), std::process::id());
    // Documents of different lengths (up to ~1 MB) so a torn write would show.
    let n = Arc::new(std::sync::atomic::AtomicUsize::new(1));
    let n2 = n.clone();
    let w = StatsWriter::spawn(path.clone(), Duration::from_millis(1), move || {
        document(1 + n2.fetch_add(7919, std::sync::atomic::Ordering::Relaxed) % 40_000)
    })
    .unwrap();
    // Until enough of both happened to mean something, however slow the machine (the
    // deadline only stops a hang).
    let deadline = Instant::now() + Duration::from_secs(120);
    let (mut reads, mut whole) = (0, 0);
    while whole <= 20 || w.writes() <= 20 {
        assert!(Instant::now() < deadline, "{whole} reads of {} writes in 120 s", w.writes());
        // Writes from this thread too: they must not collide with the writer thread's.
        if reads % 16 == 0 {
            w.flush_now().unwrap();
        }
        match std::fs::read_to_string(&path) {
            Ok(text) => {
                reads += 1;
                assert!(is_whole(&text), "a partial file: {} bytes", text.len());
                whole += 1;
            }
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => {}
            Err(e) => panic!("{e}"),
        }
    }
    let writes = w.writes();
    drop(w);
    assert!(whole > 20 && writes > 20, "{whole} reads of {writes} writes: too few to mean anything");
    std::fs::remove_dir_all(&d).unwrap();
}

#[test]
fn the_writer_sleeps_between_writes_and_stops_when_dropped() {
    let d = tmpdir("sleep");
    let path = d.join("s.txt");
    let renders = Arc::new(std::sync::atomic::AtomicU64::new(0));
    let r2 = renders.clone();
    let w = StatsWriter::spawn(path.clone(), Duration::from_millis(100), move || {
        r2.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
        "rail0_x: 1\n".to_string()
    })
    .unwrap();
    std::thread::sleep(Duration::from_millis(450));
    let n = renders.load(std::sync::atomic::Ordering::Relaxed);
    // About 4 writes; a thread that spun would have written thousands of times.
    assert!((1..=6).contains(&n), "{n} writes in 450 ms at a 100 ms interval");
    drop(w);
    assert_eq!(std::fs::read_to_string(&path).unwrap(), "rail0_x: 1\n");
    // Stopping wakes the sleeping thread: with a 10-minute interval, a drop that waited for
    // the deadline would take 10 minutes; 30 s leaves any busy machine room to schedule it.
    let w = StatsWriter::spawn(path.clone(), Duration::from_secs(600), String::new).unwrap();
    std::thread::sleep(Duration::from_millis(20)); // let the thread reach its sleep
    let t0 = Instant::now();
    drop(w);
    assert!(t0.elapsed() < Duration::from_secs(30), "stop did not wake the sleeping thread");
    std::fs::remove_dir_all(&d).unwrap();
}

#[test]
fn without_a_file_nothing_starts() {
    // The default configuration has no statistics file and no Prometheus file: no thread,
    // flush is a no-op.
    let (export, failed) = StatsExport::start(&Config::default(), Box::leak(Box::default()));
    assert!(failed.is_none());
    export.flush_now();
    assert!(!export.is_active());
}

#[test]
fn each_export_writes_its_own_registrys_figures() {
    let d = tmpdir("own");
    let (a, b): (&'static Registry, &'static Registry) = (Box::leak(Box::default()), Box::leak(Box::default()));
    let cfg = |name: &str| Config { stats_file: Some(d.join(name).display().to_string()), ..Config::default() };
    let (ea, failed) = StatsExport::start(&cfg("a.txt"), a);
    assert!(failed.is_none() && ea.is_active());
    let (eb, failed) = StatsExport::start(&cfg("b.txt"), b);
    assert!(failed.is_none());
    let h = a.register(0);
    h.count_post(1, 1, 4096, 4096);
    ea.flush_now();
    eb.flush_now();
    let bytes = |name: &str| parse(&std::fs::read_to_string(d.join(name)).unwrap())["rail0_bytes"].clone();
    assert_eq!(bytes("a.txt"), "4096");
    assert_eq!(bytes("b.txt"), "0", "the other instance's registry saw nothing");
    drop((ea, eb, h));
    std::fs::remove_dir_all(&d).unwrap();
}
