//! What the hostile-input tests share: the plugin driven through its exported C table
//! (`ncclNetPlugin_v8`, as NCCL calls it), and running a scenario in a child process of the
//! test binary (`child_procs`; the configuration is read once per process, from its
//! environment).
#![allow(dead_code)]

pub mod abi;

#[path = "../common/mod.rs"]
mod common;

/// Whether this process is a child started by [`child_program`] or [`in_child`].
pub fn is_child() -> bool {
    common::is_child()
}

/// The soft fabric on loopback, both rails.
pub const SOFT: &[(&str, &str)] =
    &[("MPIB_FABRIC", "soft"), ("MPIB_SOFT_SOUT_ADDR", "127.0.0.1"), ("MPIB_SOFT_SUP_ADDR", "127.0.0.1")];

/// Test `name` of this binary as a child with `env` (the soft fabric on loopback first,
/// `env` after it).
pub fn child_program(name: &str, env: &[(&str, &str)]) -> child_procs::Program {
    common::child_program(name, &with_soft(env))
}

/// Runs test `name` in a child on the soft fabric with `env`; asserts it passed; returns
/// its output.
pub fn in_child(name: &str, env: &[(&str, &str)]) -> String {
    common::child_output(name, &with_soft(env))
}

fn with_soft<'a>(env: &[(&'a str, &'a str)]) -> Vec<(&'a str, &'a str)> {
    SOFT.iter().chain(env).copied().collect()
}

pub fn hex(b: &[u8]) -> String {
    b.iter().map(|x| format!("{x:02x}")).collect()
}

pub fn unhex(s: &str) -> Vec<u8> {
    (0..s.len()).step_by(2).map(|i| u8::from_str_radix(&s[i..i + 2], 16).unwrap()).collect()
}
