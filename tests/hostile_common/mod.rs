//! What the hostile-input tests share: the plugin driven through its exported C table
//! (`ncclNetPlugin_v8`, as NCCL calls it), and running a scenario in a child process of the
//! test binary (the configuration is read once per process, from its environment).
#![allow(dead_code)]

pub mod abi;

use std::process::Command;

#[path = "../common/mod.rs"]
mod common;

pub use common::is_child;

/// The soft fabric on loopback, both rails.
pub const SOFT: &[(&str, &str)] =
    &[("MPIB_FABRIC", "soft"), ("MPIB_SOFT_SOUT_ADDR", "127.0.0.1"), ("MPIB_SOFT_SUP_ADDR", "127.0.0.1")];

/// A command that runs test `name` of this binary as a child with `env` (the soft fabric on
/// loopback first, `env` after it).
pub fn child_command(name: &str, env: &[(&str, &str)]) -> Command {
    common::child_command(name, &with_soft(env))
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
