//! mpib: an NCCL network plugin whose every device is a pair of RDMA rails, SOUT (scale-out
//! NIC) and SUP (scale-up NIC), with each send split between them at the last moment from
//! live RTT telemetry. This crate is the plugin (the cdylib NCCL loads); its C types are the
//! `ncclnet-types` crate's, and the tools that drive it (`mpib-perf`, the conformance suite)
//! are `crates/mpib-tools`. See DESIGN.md for the layers:
//!
//! ```text
//! abi/      ncclNet v6…v12 tables and shims (the only C edge)
//! plugin/   comms, connection set-up, requests: glues the engine to a fabric
//! engine/   the dual-rail protocol, sans-IO
//! split/    split policies        telemetry/  RTT estimators and statistics
//! fabric/   the transport trait and its providers (soft, verbs)
//! rail.rs   rail indices and rail sets (RailMask), a leaf every layer uses
//! sync/     the SPSC ring of completion rings and inboxes, the atomics loom checks; a leaf
//! ratelimit.rs  rate-limited log lines (one a second per cause), a leaf
//! ```

pub mod abi;
pub mod config;
pub mod engine;
pub mod error;
pub mod fabric;
pub mod plugin;
pub mod rail;
pub mod ratelimit;
pub mod split;
pub mod sync;
pub mod telemetry;

pub use error::{Error, ErrorKind, Result};
