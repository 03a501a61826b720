//! Engine tests, sans-IO and deterministic: two engines driven against each other through
//! the fake fabric of `harness.rs`.

mod broken;
mod failover;
mod failover_cases;
mod failures;
mod faults;
mod gpu_memory;
mod hang;
mod harness;
mod interleavings;
mod keepalive;
mod memory;
mod messages;
mod model;
mod outage;
mod probes;
mod protocol;
mod readmit;
mod readmit_outage;
mod silence;
mod slot_reuse;
mod splits;
mod striping;
mod teardown;
mod timers;
mod violations;
