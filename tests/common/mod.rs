//! Helpers shared by the integration tests: where the built library is, compiling C test
//! programs with the system `cc`, running them.
#![allow(dead_code)]

use std::path::{Path, PathBuf};
use std::process::Command;

/// The `mpib_*` functions the library exports besides the seven tables.
pub const EXPORTED_FUNCTIONS: &[&str] = &[
    "mpib_comm_counters",
    "mpib_rail_stats",
    "mpib_nic_stats",
    "mpib_worst_peers",
    "mpib_resource_stats",
    "mpib_device_rails",
    "mpib_dump_state",
];

/// The cdylib cargo built with this test binary: the newer of `target/<profile>/libmpib.so`
/// and `target/<profile>/deps/libmpib.so`. Cargo rebuilds the one in `deps/` with every test
/// build but copies it up only when the library itself is a build target (`cargo build`,
/// plain `cargo test`), not for `cargo test --test NAME`.
pub fn cdylib() -> PathBuf {
    let exe = std::env::current_exe().expect("current_exe");
    let profile_dir = exe.parent().and_then(Path::parent).expect("target/<profile>");
    let age = |p: &Path| std::fs::metadata(p).and_then(|m| m.modified()).ok();
    [profile_dir.join("libmpib.so"), profile_dir.join("deps").join("libmpib.so")]
        .into_iter()
        .filter_map(|p| age(&p).map(|t| (t, p)))
        .max_by_key(|(t, _)| *t)
        .map(|(_, p)| p)
        .unwrap_or_else(|| {
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

/// A plugin instance of a test's own, configured by `vars` alone (the environment is not
/// read), beside the other tests' in this process: a configuration needs no child process.
pub struct Instance {
    pub p: &'static mpib::plugin::Process,
    vars: &'static [(&'static str, &'static str)],
}

impl Instance {
    pub fn new(vars: &'static [(&'static str, &'static str)]) -> Instance {
        Instance { p: Box::leak(Box::new(mpib::plugin::Process::new())), vars }
    }

    /// `init`, as NCCL's first call of version `abi`; the configuration is `vars`.
    pub fn init(&self, abi: mpib::plugin::AbiVersion) -> mpib::Result<Option<mpib::plugin::NcclEnv>> {
        self.p.init(abi, || mpib::config::Config::from_vars(self.vars.iter().copied()))
    }
}

impl std::ops::Deref for Instance {
    type Target = mpib::plugin::Process;
    fn deref(&self) -> &mpib::plugin::Process {
        self.p
    }
}

// ---- child processes (`child_procs`, the harness the tools' tests use too) ---------------
//
// A scenario that needs a configuration of its own runs in a child process of its test
// binary: the plugin reads its configuration once per process, from the environment. The
// test re-executes itself, alone ([`child_procs::Program::this_test`]); in the child,
// [`is_child`] is true and the test runs the scenario.

/// How long a child may run before it is killed and its test fails.
pub const CHILD_TIMEOUT: std::time::Duration = std::time::Duration::from_secs(300);

/// Whether this process is a child started by [`child_program`] (then it runs the scenario).
pub fn is_child() -> bool {
    child_procs::test_child_role().is_some()
}

/// Test `name` of this binary as a child with `env`.
pub fn child_program(name: &str, env: &[(&str, &str)]) -> child_procs::Program {
    child_procs::Program::this_test(name).envs(env.iter().copied())
}

/// Runs test `name` in a child with `env`; asserts it passed.
pub fn in_child(name: &str, env: &[(&str, &str)]) {
    child_output(name, env);
}

/// Runs test `name` in a child with `env` (killed after [`CHILD_TIMEOUT`]); asserts it
/// passed; returns its output.
pub fn child_output(name: &str, env: &[(&str, &str)]) -> String {
    let exit = child_procs::Children::run(&child_program(name, env), CHILD_TIMEOUT).expect("start the child");
    let text = exit.output();
    assert!(
        exit.success() && text.contains("1 passed"),
        "child {name} failed ({:?}{}):\n{text}",
        exit.status,
        if exit.killed_at_deadline { ", killed at its deadline" } else { "" }
    );
    text
}
