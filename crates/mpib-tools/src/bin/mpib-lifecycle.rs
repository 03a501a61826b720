//! mpib-lifecycle: one rank of a life-cycle run (`mpib_tools::lifecycle`): the plugin
//! driven as NCCL drives it over a job's life — connections set up and closed from many
//! threads, ranks that leave independently, aborts with requests in flight, user errors.
//! Started by `lifecycle::run` (the tests in `tests/lifecycle.rs`), which gives each rank
//! `--rank R --ranks N` and the scenario, and the others' addresses on stdin.

fn main() {
    let args: Vec<String> = std::env::args().skip(1).collect();
    std::process::exit(mpib_tools::lifecycle::rank_main(&args));
}
