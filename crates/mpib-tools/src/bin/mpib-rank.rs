//! mpib-rank: one rank of a two-process run (`mpib_tools::pair`): started by `run_pair` (the
//! tests in `tests/conformance.rs`, `failover.rs`, `many_connections.rs`, `link_down.rs`,
//! `silent_link.rs`), which gives it the workload, the plugin and its control channel in the
//! environment. It loads the plugin, runs the workload against its peer and prints its report.
//!
//! ```text
//! mpib-rank                      the rank run_pair described
//! mpib-rank --raise-fd-limit     the same with the open-files limit raised to the hard limit
//!                                (many connections on the soft fabric: a socket per QP)
//! ```
//! Exit codes: 0 the rank ran (its report says how it went); 2 bad arguments, or not started
//! by `run_pair`; 3 the rank could not run (its control channel, its variables).

fn main() {
    let mut raise = false;
    for a in std::env::args().skip(1) {
        match a.as_str() {
            "--raise-fd-limit" => raise = true,
            _ => usage(&format!("unknown argument {a:?}")),
        }
    }
    if raise {
        mpib_tools::raise_fd_limit();
    }
    match mpib_tools::pair::rank_from_env() {
        Some(code) => std::process::exit(code),
        None => usage("not started as a rank: mpib_tools::pair::run_pair starts it, with its variables"),
    }
}

fn usage(why: &str) -> ! {
    eprintln!("mpib-rank: {why}\nusage: mpib-rank [--raise-fd-limit] (started by mpib_tools::pair::run_pair)");
    std::process::exit(2);
}
