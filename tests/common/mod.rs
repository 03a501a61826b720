//! Helpers shared by the integration tests: where the built library is, compiling C test
//! programs with the system `cc`, running them.
#![allow(dead_code)]

use std::path::{Path, PathBuf};
use std::process::Command;

/// The `mpib_*` functions the library exports besides the seven tables.
pub const EXPORTED_FUNCTIONS: &[&str] = &["mpib_comm_counters", "mpib_rail_stats"];

/// The cdylib cargo built with this test binary: the newer of `target/<profile>/libmpib.so`
/// and `target/<profile>/deps/libmpib.so`. Cargo rebuilds the one in `deps/` with every test
/// build but copies it up only when the library itself is a build target (`cargo build`,
/// plain `cargo test`), not for `cargo test --test NAME`.
pub fn cdylib() -> PathBuf {
    let exe = std::env::current_exe().expect("current_exe");
    let profile_dir = exe.parent().and_then(Path::parent).expect("target/<profile>");
    mpib::driver::newest_lib(profile_dir).unwrap_or_else(|| {
        panic!("no libmpib.so in {}: run `cargo build --lib` first (ci/test.sh does)", profile_dir.display())
    })
}

/// A fresh scratch directory for one test.
pub fn tmpdir(name: &str) -> PathBuf {
    let d = std::env::temp_dir().join(format!("mpib-test-{}-{name}", std::process::id()));
    std::fs::create_dir_all(&d).unwrap();
    d
}

/// Compiles C sources (paths relative to the crate root) into an executable, once per test
/// process: tests run in parallel, and a second `cc` writing the same file while another
/// test executes it made that exec fail with ETXTBSY ("Text file busy").
pub fn compile_c(name: &str, sources: &[&str], libs: &[&str]) -> PathBuf {
    static BUILT: std::sync::Mutex<Vec<(String, PathBuf)>> = std::sync::Mutex::new(Vec::new());
    let key = format!("{name} {sources:?} {libs:?}");
    let mut built = BUILT.lock().unwrap_or_else(|e| e.into_inner());
    if let Some((_, p)) = built.iter().find(|(k, _)| *k == key) {
        return p.clone();
    }
    let root = env!("CARGO_MANIFEST_DIR");
    let out = tmpdir(name).join(format!("{name}-{}", built.len()));
    let mut cmd = Command::new("cc");
    cmd.args(["-std=gnu11", "-O1", "-g", "-Wall", "-Wextra", "-Werror", "-o"]).arg(&out);
    cmd.arg(format!("-I{root}/include"));
    for s in sources {
        cmd.arg(format!("{root}/{s}"));
    }
    cmd.args(libs);
    let r = cmd.output().expect("run cc");
    assert!(r.status.success(), "cc {sources:?} failed:\n{}", String::from_utf8_lossy(&r.stderr));
    built.push((key, out.clone()));
    out
}

/// Runs the C loader against `lib` in `mode`; returns (passed, stdout+stderr).
pub fn run_loader(loader: &Path, lib: &str, mode: &str, env: &[(&str, &str)]) -> (bool, String) {
    let mut cmd = Command::new(loader);
    cmd.arg(lib).arg(mode);
    for (k, v) in env {
        cmd.env(k, v);
    }
    let r = cmd.output().expect("run loader");
    let text = format!("{}{}", String::from_utf8_lossy(&r.stdout), String::from_utf8_lossy(&r.stderr));
    (r.status.success(), text)
}

/// The mode and environment that give the plugin a usable device on any machine: the
/// soft fabric over loopback.
pub fn device_mode() -> (&'static str, Vec<(&'static str, &'static str)>) {
    ("dev", vec![("MPIB_FABRIC", "soft"), ("MPIB_SOFT_SOUT_ADDR", "127.0.0.1"), ("MPIB_SOFT_SUP_ADDR", "127.0.0.1")])
}

// ---- two-process runs through the driver (tests/conformance.rs) -------------------------

use mpib::driver::pair::{Launcher, PairOutcome, PairSpec, run_pair};
use mpib::driver::spec::Workload;

/// The test every conformance binary defines to be re-executed as a rank.
pub const RANK_ENTRY: &str = "rank_child";

/// The ranks' fabric: the soft fabric over loopback (both rails on 127.0.0.1), or what
/// `CONFORMANCE_ENV` says, e.g. `CONFORMANCE_ENV="MPIB_FABRIC=verbs MPIB_HCA_SOUT=rxe0
/// MPIB_HCA_SUP=rxe1"` to run the same suite on Soft-RoCE (the ranks get no other `MPIB_*`
/// variable from the parent).
pub fn fabric_env() -> Vec<(String, String)> {
    let pairs = std::env::var("CONFORMANCE_ENV")
        .unwrap_or_else(|_| "MPIB_FABRIC=soft MPIB_SOFT_SOUT_ADDR=127.0.0.1 MPIB_SOFT_SUP_ADDR=127.0.0.1".to_string());
    pairs
        .split_whitespace()
        .map(|kv| {
            let (k, v) = kv.split_once('=').unwrap_or_else(|| panic!("CONFORMANCE_ENV: {kv:?} is not NAME=VALUE"));
            (k.to_string(), v.to_string())
        })
        .collect()
}

/// The library the conformance suite drives: `NCCL_NET_PLUGIN` when set (a test binary
/// copied into a VM, away from `target/`), else [`cdylib`].
pub fn plugin_path() -> String {
    match std::env::var("NCCL_NET_PLUGIN") {
        Ok(p) if !p.is_empty() => p,
        _ => cdylib().to_string_lossy().into_owned(),
    }
}

/// A run of `w` between two processes on [`fabric_env`], newest ABI on both.
pub fn pair(w: Workload) -> PairSpec {
    PairSpec {
        plugin: plugin_path(),
        abi: [None, None],
        env: fabric_env(),
        workload: w,
        timeout: std::time::Duration::from_secs(180),
    }
}

/// Runs `spec` with this test binary as both ranks; prints how long it took.
pub fn run(name: &str, spec: &PairSpec) -> PairOutcome {
    let out = run_pair(spec, &Launcher::test_binary(RANK_ENTRY)).expect("start the ranks");
    eprintln!("{name}: {:.2} s (workload: {})", out.elapsed.as_secs_f64(), spec.workload.to_line());
    out
}

/// A seed from the environment (`CONFORMANCE_SEED`) or the clock; printed so a failing
/// run can be repeated.
pub fn seed(what: &str) -> u64 {
    let s = std::env::var("CONFORMANCE_SEED").ok().and_then(|v| v.parse().ok()).unwrap_or_else(|| {
        std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).unwrap().as_nanos() as u64
    });
    eprintln!("{what}: seed {s} (repeat with CONFORMANCE_SEED={s})");
    s
}
