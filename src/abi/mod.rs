//! The C ABI edge: the exported `ncclNet_v6` … `ncclNet_v12` tables (their C types are the
//! `ncclnet-types` crate's) and thin per-version shims over the one implementation in `crate::plugin`. Every entry point
//! catches panics and maps errors to `ncclResult_t` (`guard.rs`); nothing unwinds into C.

mod args;
mod common;
mod fusion;
mod guard;
pub mod logger;
pub mod profiler;
pub mod query;
pub mod stats;
mod versions;

pub use versions::{
    ncclNetPlugin_v6, ncclNetPlugin_v7, ncclNetPlugin_v8, ncclNetPlugin_v9, ncclNetPlugin_v10, ncclNetPlugin_v11,
    ncclNetPlugin_v12,
};

use crate::config::Config;
use crate::error::Result;
use crate::plugin::{AbiVersion, NcclEnv, Process};

/// The process's plugin: the one instance every ncclNet call of every ABI version reaches
/// (the plugin's state lives in it, not in statics of its own).
static PROCESS: Process = Process::new();

/// The process's plugin (tools and tests that call it without going through C).
pub fn process() -> &'static Process {
    &PROCESS
}

/// `init` of the process's plugin, its configuration read from the environment (at the
/// first `init` only).
pub fn init_process(abi: AbiVersion) -> Result<Option<NcclEnv>> {
    PROCESS.init(abi, || Config::from_vars(std::env::vars()))
}
