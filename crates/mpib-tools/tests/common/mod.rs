//! Helpers shared by the tools' integration tests: the freshly built plugin library, scratch
//! directories, two-process runs through the driver.
#![allow(dead_code)]

use std::path::PathBuf;
use std::process::Command;
use std::sync::OnceLock;

/// The plugin library (`libmpib.so`) of this workspace, built for this test binary's
/// profile. The tools do not link the plugin (they `dlopen` it, as NCCL does), so nothing
/// makes cargo build it for `cargo test -p mpib-tools`: this asks cargo for it once per test
/// process (a no-op when it is up to date) and takes the path from cargo's own artifact
/// report, wherever `CARGO_TARGET_DIR` puts it.
pub fn cdylib() -> PathBuf {
    static LIB: OnceLock<PathBuf> = OnceLock::new();
    LIB.get_or_init(|| {
        let cargo = std::env::var("CARGO").unwrap_or_else(|_| "cargo".into());
        let mut cmd = Command::new(cargo);
        cmd.args(["build", "-p", "mpib", "--lib", "--message-format=json-render-diagnostics"]);
        if !cfg!(debug_assertions) {
            cmd.arg("--release");
        }
        // The workspace root: two levels above this crate.
        let root = PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../..");
        let out = cmd.current_dir(root).output().expect("run cargo build -p mpib");
        assert!(out.status.success(), "cargo build -p mpib failed:\n{}", String::from_utf8_lossy(&out.stderr));
        let stdout = String::from_utf8_lossy(&out.stdout);
        stdout
            .lines()
            .filter(|l| l.contains(r#""reason":"compiler-artifact""#) && l.contains(r#""name":"mpib""#))
            .flat_map(|l| l.split('"'))
            .find(|s| s.ends_with("libmpib.so"))
            .map(PathBuf::from)
            .unwrap_or_else(|| panic!("cargo reported no libmpib.so:\n{stdout}"))
    })
    .clone()
}

/// A fresh scratch directory for one test.
pub fn tmpdir(name: &str) -> PathBuf {
    let d = std::env::temp_dir().join(format!("mpib-test-{}-{name}", std::process::id()));
    std::fs::create_dir_all(&d).unwrap();
    d
}

use mpib_tools::pair::{PairOutcome, PairSpec, Program, run_pair};
use mpib_tools::spec::Workload;

/// The rank program of the two-process tests: `CONFORMANCE_RANK` when set; else an
/// `mpib-rank` beside this test binary (both copied into a VM, away from `target/`, as
/// `ci/rxe-test.sh` does); else the `mpib-rank` cargo built with this test.
pub fn rank_program() -> Program {
    if let Ok(p) = std::env::var("CONFORMANCE_RANK")
        && !p.is_empty()
    {
        return Program::new(p);
    }
    let beside = std::env::current_exe().ok().and_then(|e| Some(e.parent()?.join("mpib-rank")));
    match beside {
        Some(p) if p.is_file() => Program::new(p),
        _ => Program::new(env!("CARGO_BIN_EXE_mpib-rank")),
    }
}

/// The ranks' fabric: the soft fabric over loopback (both rails on 127.0.0.1), or what
/// `CONFORMANCE_ENV` says, e.g. `CONFORMANCE_ENV="MPIB_FABRIC=verbs MPIB_HCA_SOUT=rxe0
/// MPIB_HCA_SUP=rxe1"` to run the same suite on Soft-RoCE (the ranks get no other `MPIB_*`
/// variable from the parent).
pub fn fabric_env() -> Vec<(String, String)> {
    mpib_tools::pair::fabric_env("CONFORMANCE_ENV").unwrap_or_else(|e| panic!("{e}"))
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
        rank_env: Default::default(),
        workload: w,
        timeout: pair_timeout(),
    }
}

/// The parent's last-resort limit for a run (a rank hung inside a call cannot report
/// itself; a run that stops making progress is caught sooner by the ranks' own stall
/// bound): `CONFORMANCE_TIMEOUT_S`, 180 s by default. Slow rigs raise it (Soft-RoCE under
/// qemu on a busy host took over 180 s for 100,000 messages that made steady progress).
fn pair_timeout() -> std::time::Duration {
    let s = std::env::var("CONFORMANCE_TIMEOUT_S").ok().and_then(|v| v.parse().ok()).unwrap_or(180);
    std::time::Duration::from_secs(s)
}

/// Runs `spec` with [`rank_program`] as both ranks; prints how long it took.
pub fn run(name: &str, spec: &PairSpec) -> PairOutcome {
    run_with(name, spec, &rank_program())
}

/// [`run`] with another rank program (`mpib-rank` with arguments).
pub fn run_with(name: &str, spec: &PairSpec, program: &Program) -> PairOutcome {
    let out = run_pair(spec, program).expect("start the ranks");
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
