//! The C side of NCCL's network-plugin ABI, as data only: the `ncclNet_v6_t` …
//! `ncclNet_v12_t` function tables and the structs they pass (`types`, `tables`), the
//! `ncclResult_t` codes (`result`), and mpib's own exported structs (`mpib`).
//!
//! Two crates speak this language and nothing else in common: the plugin, which exports the
//! tables, and the tools (`mpib-tools`), which `dlopen` a plugin and call them as NCCL does.
//! No code, no dependencies; layouts are checked against a C compiler by the plugin's
//! `tests/abi.rs` and `tests/c/`.

pub mod mpib;
pub mod result;
pub mod tables;
mod tables_v9;
pub mod types;

pub use tables::*;
pub use types::*;
