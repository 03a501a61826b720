//! Closing comms (with requests still outstanding), deregistering and finalizing frees
//! everything: `examples/lifecycle.rs` runs whole lifecycles under valgrind's memcheck, which
//! must report no definitely or indirectly lost byte. ("Possibly lost" blocks are the
//! interior pointers of process-wide tables and of helper threads alive at exit, by design.)

use std::path::PathBuf;
use std::process::Command;

fn lifecycle_example() -> PathBuf {
    // `cargo test` builds the examples next to the test binaries' profile directory.
    let exe = std::env::current_exe().unwrap();
    let p = exe.parent().and_then(|d| d.parent()).unwrap().join("examples").join("lifecycle");
    assert!(p.exists(), "{} is not built (cargo test builds the examples)", p.display());
    p
}

fn no_leaks(env: &[(&str, &str)]) {
    let mut cmd = Command::new("valgrind");
    cmd.args(["--leak-check=full", "--errors-for-leak-kinds=definite,indirect", "--error-exitcode=9"]);
    cmd.arg(lifecycle_example()).arg("3");
    for (k, v) in env {
        cmd.env(k, v);
    }
    let out = cmd.output().expect("valgrind must be installed (ci/setup.sh installs it)");
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(String::from_utf8_lossy(&out.stdout).contains("lifecycle: done"), "the lifecycle did not finish:\n{err}");
    assert!(err.contains("definitely lost: 0 bytes") || err.contains("All heap blocks were freed"), "{err}");
    assert!(err.contains("indirectly lost: 0 bytes") || err.contains("All heap blocks were freed"), "{err}");
    assert!(out.status.success(), "memcheck reported errors:\n{err}");
}

#[test]
fn inproc_lifecycle_leaks_nothing() {
    no_leaks(&[("MPIB_FABRIC", "inproc")]);
}

#[test]
fn soft_tcp_lifecycle_leaks_nothing() {
    no_leaks(&[("MPIB_FABRIC", "soft"), ("MPIB_SOFT_SOUT_ADDR", "127.0.0.1"), ("MPIB_SOFT_SUP_ADDR", "127.0.0.1")]);
}
