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
