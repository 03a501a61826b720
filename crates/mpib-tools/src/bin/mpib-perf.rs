//! `mpib-perf`: the benchmark and diagnostic tool users run first. It loads the plugin
//! library with `dlopen` exactly as NCCL does and drives it between two ranks through the
//! `ncclNet` C ABI (`mpib_tools`): no GPU, no NCCL, no MPI.
//!
//! ```text
//! mpib-perf                          two local ranks, soft fabric over loopback, 8 B … 64 MiB
//! mpib-perf --listen                 (host A) prints `mpib-perf --connect TOKEN`
//! mpib-perf --connect TOKEN          (host B) runs the test against A
//! mpib-perf --rendezvous A:PORT      on both hosts: whoever can bind A:PORT listens
//! mpib-perf --list                   the NICs, pairs and devices NCCL would see, then exit
//! mpib-perf --dev N                  run on the N-th device NCCL would use (--list's numbers)
//! mpib-perf --json out.json          also the results as JSON
//! mpib-perf --stats                  also each rank's view per NIC and rail, and its worst peers
//! mpib-perf --timeline t.json        one size streamed for --duration, bytes per rail per ms
//! ```
//! `mpib-perf --help` lists every option. Exit codes: 0 all good; 1 an error the run found
//! (one line saying what: library, init, peer, options, data); 2 bad options.

mod mpib_perf;

fn main() -> std::process::ExitCode {
    // When started as a rank of the local two-process mode: run it and exit.
    mpib_tools::pair::child_main();
    mpib_perf::main()
}
