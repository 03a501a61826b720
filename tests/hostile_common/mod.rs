//! What the hostile-input tests share: the plugin driven through its exported C table
//! (`ncclNetPlugin_v8`, as NCCL calls it), and running a scenario in a child process of the
//! test binary (the configuration is read once per process, from its environment).
#![allow(dead_code)]

pub mod abi;

use std::process::Command;

/// Set in a child: the test it runs is the scenario itself.
pub const CHILD: &str = "HOSTILE_TEST_CHILD";

/// The soft fabric on loopback, both rails.
pub const SOFT: &[(&str, &str)] =
    &[("MPIB_FABRIC", "soft"), ("MPIB_SOFT_SOUT_ADDR", "127.0.0.1"), ("MPIB_SOFT_SUP_ADDR", "127.0.0.1")];

pub fn is_child() -> bool {
    std::env::var_os(CHILD).is_some()
}

/// A command that runs test `name` of this binary as a child with `env` (the soft fabric on
/// loopback first, `env` after it).
pub fn child_command(name: &str, env: &[(&str, &str)]) -> Command {
    let mut cmd = Command::new(std::env::current_exe().unwrap());
    cmd.args(["--exact", name, "--nocapture", "--test-threads=1"]).env(CHILD, "1");
    for (k, v) in SOFT.iter().chain(env) {
        cmd.env(k, v);
    }
    cmd
}

/// Runs test `name` in a child with `env`; asserts it passed; returns its output.
pub fn in_child(name: &str, env: &[(&str, &str)]) -> String {
    let out = child_command(name, env).output().unwrap();
    let text = format!("{}{}", String::from_utf8_lossy(&out.stdout), String::from_utf8_lossy(&out.stderr));
    assert!(out.status.success() && text.contains("1 passed"), "child {name} failed ({}):\n{text}", out.status);
    text
}

pub fn hex(b: &[u8]) -> String {
    b.iter().map(|x| format!("{x:02x}")).collect()
}

pub fn unhex(s: &str) -> Vec<u8> {
    (0..s.len()).step_by(2).map(|i| u8::from_str_radix(&s[i..i + 2], 16).unwrap()).collect()
}
