//! Engine tests, sans-IO and deterministic: two engines driven against each other through
//! the fake fabric of `harness.rs`.

mod failures;
mod harness;
mod model;
mod probes;
mod protocol;
mod splits;
mod violations;
mod slot_reuse;
