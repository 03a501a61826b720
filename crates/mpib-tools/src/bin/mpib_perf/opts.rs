//! The command line (clap derive) and what it means: the sizes, the workload both ranks
//! run, the environment the plugin reads, and the options the two ranks must agree on.

use std::time::Duration;

use clap::{ArgGroup, Parser, ValueEnum};
use mpib_tools::kv::Writer;
use mpib_tools::{Phase, Workload};

pub use super::drill::Drill;

/// Benchmark and check the mpib NCCL net plugin between two ranks, through its C ABI as NCCL
/// drives it (no GPU, NCCL or MPI needed).
///
/// Without arguments: two local ranks on the soft fabric over loopback, sizes 8 B … 64 MiB,
/// every byte checked. Two hosts: `mpib-perf --listen` on one prints a token, `mpib-perf
/// --connect TOKEN` on the other runs the test; or `--rendezvous HOST:PORT` on both.
#[derive(Parser, Debug, Clone)]
#[command(name = "mpib-perf", version, about, max_term_width = 100)]
#[command(group(ArgGroup::new("peer").args(["listen", "connect", "rendezvous"])))]
pub struct Opts {
    /// The plugin library: a path, or a name as NCCL_NET_PLUGIN takes it [default: NCCL_NET_PLUGIN,
    /// else the libmpib.so cargo built next to this binary, else libnccl-net-mpib.so]
    #[arg(long, value_name = "PATH")]
    pub plugin: Option<String>,

    /// List every NIC mpib would use (its pairing, link layer, speed, address or GID) and the
    /// devices NCCL is shown through each ABI version, then exit. The fabric is the plugin's
    /// own choice (MPIB_FABRIC, else auto) unless --fabric says
    #[arg(long, conflicts_with_all = ["peer", "timeline", "json", "fail_rail", "inject_corruption"])]
    pub list: bool,

    /// Run on device N: the N-th of the devices NCCL would use, as --list numbers them
    #[arg(long, value_name = "N", default_value_t = 0, value_parser = clap::value_parser!(i32).range(0..))]
    pub dev: i32,

    /// ncclNet ABI version to drive (v6 … v12) [default: the newest the library exports]
    #[arg(long, value_name = "vN", value_parser = parse_abi)]
    pub abi: Option<u32>,

    /// Fabric (MPIB_FABRIC) [default: soft over loopback for local ranks; auto between hosts]
    #[arg(long, value_enum)]
    pub fabric: Option<Fabric>,

    /// Message sizes: A:B[:factor] from A to B, multiplying by factor (4), B always included;
    /// or one size. Suffixes K, M, G (×1024) [default: 8:64M, or 256K with --timeline]
    #[arg(long, value_name = "A:B[:F]", value_parser = parse_sizes)]
    pub sizes: Option<Sizes>,

    /// Messages per size (fixed count instead of a time budget)
    #[arg(long, value_name = "N", conflicts_with = "duration", value_parser = clap::value_parser!(u64).range(1..))]
    pub iters: Option<u64>,

    /// Time the measurement runs, shared among the sizes: each size's count is chosen from its
    /// warm-up so that it takes its share [default: 10s; 5s with --timeline]
    #[arg(long, value_name = "SECS", value_parser = parse_duration)]
    pub duration: Option<Duration>,

    /// Requests in flight per direction, as NCCL's proxy keeps them (at most 1 GiB of buffers)
    #[arg(long, value_name = "N", default_value_t = 8, value_parser = clap::value_parser!(u64).range(1..=32))]
    pub inflight: u64,

    /// Buffers per receive request (multi-receive, matched by tag)
    #[arg(long, value_name = "N", default_value_t = 1, value_parser = clap::value_parser!(u64).range(1..=8))]
    pub nrecv: u64,

    /// Both ranks send and receive at once
    #[arg(long)]
    pub bidir: bool,

    /// How sends are split between the rails (MPIB_SPLIT): auto, sout, sup, or 0-100 (% on SOUT)
    #[arg(long, value_name = "POLICY", value_parser = parse_split)]
    pub split: Option<String>,

    /// Check every received byte (the default)
    #[arg(long, overrides_with = "no_check")]
    pub check: bool,

    /// Check only the sizes the plugin reports, not the bytes
    #[arg(long, overrides_with = "check")]
    pub no_check: bool,

    /// Also write the results as JSON to FILE
    #[arg(long, value_name = "FILE")]
    pub json: Option<String>,

    /// Stream one size for --duration and write the sender's bytes per rail and SOUT share per
    /// millisecond to FILE (JSON); the sender prints `TIMELINE-START <CLOCK_MONOTONIC ns>`
    #[arg(long, value_name = "FILE")]
    pub timeline: Option<String>,

    /// At the end, print each rank's per-NIC and per-peer view of its process: per NIC port
    /// and rail the plugin's counters, latencies and estimates (mpib_nic_stats), and the worst
    /// peers by latency and by errors (mpib_worst_peers); with --json also under "stats"
    /// (with --quiet only there). Between two hosts each host prints its own rank's view
    #[arg(long)]
    pub stats: bool,

    /// Print nothing but errors (and the --listen token, and TIMELINE-START)
    #[arg(long, short)]
    pub quiet: bool,

    /// Two hosts: listen on ADDR ([HOST][:PORT], default every address, any port), print a
    /// token for the peer's --connect, wait for it
    #[arg(long, value_name = "ADDR", num_args = 0..=1, default_missing_value = "")]
    pub listen: Option<String>,

    /// Two hosts: connect to the peer whose --listen printed TOKEN
    #[arg(long, value_name = "TOKEN")]
    pub connect: Option<String>,

    /// Two hosts: meet at HOST:PORT: the side that can bind it listens (rank 0, receives), the
    /// other connects (rank 1, sends); --rank decides instead
    #[arg(long, value_name = "HOST:PORT")]
    pub rendezvous: Option<String>,

    /// With --rendezvous: 0 listens on HOST:PORT and receives, 1 connects and sends
    #[arg(long, requires = "rendezvous", value_parser = clap::value_parser!(u32).range(0..=1))]
    pub rank: Option<u32>,

    /// How long to wait for the peer, in seconds
    #[arg(long, value_name = "SECS", default_value = "60", value_parser = parse_duration)]
    pub timeout: Duration,

    /// Debug: flip one byte of the first message of the largest size, to prove that the
    /// check catches it (the run reports it and fails)
    #[arg(long)]
    pub inject_corruption: bool,

    /// Failure drill (local ranks, soft fabric): stream one size as --timeline does and drop
    /// this rail's connections (MPIB_FAULT_RAIL) at --fail-at for --fail-for, then print the
    /// failover and re-admission figures
    #[arg(long, value_name = "RAIL", value_parser = ["sout", "sup"])]
    pub fail_rail: Option<String>,

    /// When the first drop comes, from the sender's first isend (the stream's warm-up)
    #[arg(long, value_name = "SECS", default_value = "1", requires = "fail_rail", value_parser = parse_duration)]
    pub fail_at: Duration,

    /// How long the dropped rail refuses to come back (a link down this long)
    #[arg(long, value_name = "SECS", default_value = "0.5", requires = "fail_rail", value_parser = parse_duration)]
    pub fail_for: Duration,

    /// Drops this many times, --fail-every apart; --duration defaults to
    /// --fail-at + N × --fail-every
    #[arg(long, value_name = "N", default_value_t = 1, requires = "fail_rail",
          value_parser = clap::value_parser!(u64).range(1..=10_000))]
    pub injections: u64,

    /// Time between drops [default: --fail-for + 1.5 s]
    #[arg(long, value_name = "SECS", requires = "fail_rail", value_parser = parse_duration)]
    pub fail_every: Option<Duration>,
}

#[derive(Clone, Copy, Debug, PartialEq, Eq, ValueEnum)]
pub enum Fabric {
    /// RDMA NICs through libibverbs when present, else soft
    Auto,
    /// A software RDMA NIC over TCP
    Soft,
    /// Real RDMA NICs through libibverbs
    Verbs,
    /// Both ranks in this one process (two threads; no sockets between the rails)
    Inproc,
}

impl Fabric {
    pub fn name(self) -> &'static str {
        match self {
            Fabric::Auto => "auto",
            Fabric::Soft => "soft",
            Fabric::Verbs => "verbs",
            Fabric::Inproc => "inproc",
        }
    }
}

/// The sizes of a sweep, smallest first.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Sizes {
    pub list: Vec<u64>,
    /// As the user wrote it (for the agreement check).
    pub text: String,
}

/// Largest message: `test` reports sizes as int.
const MAX_SIZE: u64 = i32::MAX as u64;

fn parse_size(s: &str) -> Result<u64, String> {
    let t = s.trim();
    let t = t.strip_suffix("iB").or_else(|| t.strip_suffix('B')).unwrap_or(t);
    let (num, mult) = match t.chars().last().map(|c| c.to_ascii_uppercase()) {
        Some('K') => (&t[..t.len() - 1], 1u64 << 10),
        Some('M') => (&t[..t.len() - 1], 1 << 20),
        Some('G') => (&t[..t.len() - 1], 1 << 30),
        _ => (t, 1),
    };
    let n: u64 = num.parse().map_err(|_| format!("{s:?} is not a size (a number, optionally with K, M or G)"))?;
    n.checked_mul(mult).filter(|&v| v <= MAX_SIZE).ok_or_else(|| format!("{s:?}: at most {MAX_SIZE} bytes"))
}

pub fn parse_sizes(s: &str) -> Result<Sizes, String> {
    let parts: Vec<&str> = s.split(':').collect();
    let (a, b, f) = match parts[..] {
        [one] => {
            let v = parse_size(one)?;
            (v, v, 4)
        }
        [a, b] => (parse_size(a)?, parse_size(b)?, 4),
        [a, b, f] => {
            let f: u64 = f.trim().parse().map_err(|_| format!("factor {f:?} is not a number"))?;
            (parse_size(a)?, parse_size(b)?, f)
        }
        _ => return Err(format!("{s:?}: A:B[:factor] or one size")),
    };
    if a > b {
        return Err(format!("{s:?}: the first size is larger than the last"));
    }
    if f < 2 {
        return Err(format!("{s:?}: the factor must be 2 or more"));
    }
    if a == 0 && b > 0 {
        return Err(format!("{s:?}: a sweep starts at 1 byte or more (0 alone is a size of its own)"));
    }
    let mut list = vec![a];
    while let Some(&last) = list.last()
        && last < b
    {
        list.push((last * f).min(b));
    }
    Ok(Sizes { list, text: s.to_string() })
}

fn parse_abi(s: &str) -> Result<u32, String> {
    let v: u32 = s.strip_prefix('v').unwrap_or(s).parse().map_err(|_| format!("{s:?}: v6 … v12"))?;
    if (6..=12).contains(&v) { Ok(v) } else { Err(format!("{s:?}: v6 … v12")) }
}

pub fn parse_duration(s: &str) -> Result<Duration, String> {
    let t = s.trim();
    let (num, scale) = match t.strip_suffix("ms") {
        Some(n) => (n, 1e-3),
        None => (t.strip_suffix('s').unwrap_or(t), 1.0),
    };
    let v: f64 = num.trim().parse().map_err(|_| format!("{s:?} is not a duration (seconds, or 250ms)"))?;
    if !(v.is_finite() && v > 0.0 && v * scale <= 86_400.0) {
        return Err(format!("{s:?}: more than 0 and at most a day"));
    }
    Ok(Duration::from_secs_f64(v * scale))
}

fn parse_split(s: &str) -> Result<String, String> {
    match s {
        "auto" | "sout" | "sup" => Ok(s.to_string()),
        _ if s.parse::<u8>().is_ok_and(|p| p <= 100) => Ok(s.to_string()),
        _ => Err(format!("{s:?}: auto, sout, sup or 0-100 (% of bytes on SOUT)")),
    }
}

/// How the two ranks run.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Mode {
    /// Two processes on this host (the default).
    Local,
    /// Two threads of this process (`--fabric inproc`).
    Threads,
    /// `--listen ADDR`: rank 0, prints a token.
    Listen(String),
    /// `--connect TOKEN`: rank 1.
    Connect(String),
    /// `--rendezvous HOST:PORT`, with `--rank` if given.
    Rendezvous(String, Option<u32>),
    /// `--list`: no ranks; what the plugin would use, then exit.
    List,
}

/// Groups (of `nrecv` sends) the warm-up of `size` runs: about 64 MiB, 4 … 256 groups.
fn warmup_groups(size: u64, nrecv: u64) -> u64 {
    ((64 << 20) / (size.max(1) * nrecv)).clamp(4, 256)
}

/// Buffers in flight at most, per side.
const MAX_INFLIGHT_BYTES: u64 = 1 << 30;
/// Most groups a budgeted size may run (its latencies are kept in memory).
const MAX_GROUPS: u64 = 2_000_000;
/// The --timeline file's bins.
pub const TIMELINE_BIN_NS: u64 = 1_000_000;
/// The sender samples its counters 4 times per bin (so each bin gets its own samples
/// despite jitter), or less often in very long runs (at most 200,000 samples).
fn timeline_sample_us(duration: Duration) -> u64 {
    (TIMELINE_BIN_NS / 4000).max(duration.as_micros() as u64 / 200_000)
}

/// Everything the options decide.
#[derive(Clone, Debug)]
pub struct Plan {
    pub opts: Opts,
    pub mode: Mode,
    pub fabric: Fabric,
    pub sizes: Vec<u64>,
    pub workload: Workload,
    /// The measurement's time budget (None: --iters).
    pub duration: Option<Duration>,
    /// --fail-rail's drill.
    pub drill: Option<Drill>,
}

impl Plan {
    /// What the options mean; `Err` is a usage error (exit code 2).
    pub fn new(opts: Opts) -> Result<Plan, String> {
        let mode = match (&opts.listen, &opts.connect, &opts.rendezvous) {
            _ if opts.list => Mode::List,
            (Some(a), _, _) => Mode::Listen(a.clone()),
            (_, Some(t), _) => Mode::Connect(t.clone()),
            (_, _, Some(r)) => Mode::Rendezvous(r.clone(), opts.rank),
            _ if opts.fabric == Some(Fabric::Inproc) => Mode::Threads,
            _ => Mode::Local,
        };
        // --list shows what the plugin would do under NCCL: its own fabric choice.
        let two_hosts = !matches!(mode, Mode::Local | Mode::Threads | Mode::List);
        let fabric = opts.fabric.unwrap_or(if two_hosts || mode == Mode::List { Fabric::Auto } else { Fabric::Soft });
        if two_hosts && fabric == Fabric::Inproc {
            return Err(
                "--fabric inproc runs both ranks in this process: not with --listen, --connect or --rendezvous".into(),
            );
        }
        let drill = drill_of(&opts, &mode, fabric)?;
        let timeline = opts.timeline.is_some() || drill.is_some();
        let sizes = match &opts.sizes {
            Some(s) => s.list.clone(),
            None if timeline => vec![256 << 10],
            None => parse_sizes("8:64M").expect("default sizes").list,
        };
        if timeline && sizes.len() != 1 {
            return Err(format!(
                "--timeline streams one size; --sizes {} gives {}",
                opts.sizes.as_ref().map_or("", |s| &s.text),
                sizes.len()
            ));
        }
        let duration = match opts.iters {
            Some(_) => None,
            None => Some(
                opts.duration.or(drill.as_ref().map(Drill::duration)).unwrap_or(Duration::from_secs(if timeline {
                    5
                } else {
                    10
                })),
            ),
        };
        let nrecv = opts.nrecv;
        let budget_ms = duration.map_or(0, |d| ((d.as_millis() as u64) / sizes.len() as u64).max(1));
        let last = sizes.len() - 1;
        let phases = sizes
            .iter()
            .enumerate()
            .map(|(i, &size)| Phase {
                sizes: vec![size],
                count: opts.iters.unwrap_or(MAX_GROUPS),
                nrecv: nrecv as usize,
                inflight: opts.inflight.min((MAX_INFLIGHT_BYTES / (size.max(1) * nrecv)).max(1)) as usize,
                warmup: warmup_groups(size, nrecv),
                budget_ms,
                timeline_us: if timeline { timeline_sample_us(duration.unwrap_or(Duration::ZERO)) } else { 0 },
                corrupt: (opts.inject_corruption && i == last).then_some(0),
                ..Phase::default()
            })
            .collect();
        let workload = Workload {
            dev: opts.dev,
            seed: 0x6d70_6962_7065_7266,
            check: !opts.no_check,
            bidir: opts.bidir,
            stall_ms: 30_000,
            phases,
            ..Workload::default()
        };
        workload.check().map_err(|e| e.msg)?;
        Ok(Plan { opts, mode, fabric, sizes, workload, duration, drill })
    }

    /// The options both ranks must share, as `--name value` pairs (in a fixed order).
    pub fn agreed(&self) -> Vec<(&'static str, String)> {
        let o = &self.opts;
        let onoff = |b: bool| if b { "on" } else { "off" }.to_string();
        vec![
            ("version", env!("CARGO_PKG_VERSION").to_string()),
            ("--fabric", self.fabric.name().to_string()),
            ("--sizes", self.sizes.iter().map(u64::to_string).collect::<Vec<_>>().join(",")),
            ("--iters", o.iters.map_or("-".into(), |v| v.to_string())),
            ("--duration", self.duration.map_or("-".into(), |d| format!("{}s", d.as_secs_f64()))),
            ("--inflight", o.inflight.to_string()),
            ("--nrecv", o.nrecv.to_string()),
            ("--bidir", onoff(o.bidir)),
            ("--split", o.split.clone().unwrap_or_else(|| "-".into())),
            ("--check", onoff(!o.no_check)),
            ("--timeline", onoff(o.timeline.is_some())),
            ("--inject-corruption", onoff(o.inject_corruption)),
        ]
    }

    /// [`Plan::agreed`] as one line, for the control channel.
    pub fn agreed_line(&self) -> String {
        let mut w = Writer::new();
        for (k, v) in self.agreed() {
            w.put(k, v);
        }
        w.finish()
    }

    /// The environment the plugin must see (MPIB_FABRIC, MPIB_SPLIT, loopback rails for local
    /// soft runs); the user's other MPIB_* variables stay as they are.
    pub fn plugin_env(&self) -> Vec<(String, String)> {
        let mut env = Vec::new();
        if self.fabric != Fabric::Auto {
            env.push(("MPIB_FABRIC".to_string(), self.fabric.name().to_string()));
        }
        if self.mode == Mode::Local && self.fabric == Fabric::Soft {
            for var in ["MPIB_SOFT_SOUT_ADDR", "MPIB_SOFT_SUP_ADDR"] {
                if std::env::var_os(var).is_none() {
                    env.push((var.to_string(), "127.0.0.1".to_string()));
                }
            }
        }
        if let Some(s) = &self.opts.split {
            env.push(("MPIB_SPLIT".to_string(), s.clone()));
        }
        if let Some(d) = &self.drill {
            env.push(("MPIB_FAULT_RAIL".to_string(), d.env()));
        }
        env
    }
}

/// The `--name` values that differ between `ours` and `theirs` (agreed lines), as
/// `--name (here X, peer Y)`.
pub fn differences(ours: &str, theirs: &str) -> Vec<String> {
    let parse = |l: &str| mpib_tools::kv::Fields::parse(l).map(|f| f.0).unwrap_or_default();
    let (a, b) = (parse(ours), parse(theirs));
    let mut keys: Vec<&String> = a.keys().chain(b.keys()).collect();
    keys.sort();
    keys.dedup();
    let none = String::from("(unset)");
    keys.into_iter()
        .filter(|k| a.get(*k) != b.get(*k))
        .map(|k| format!("{k} (here {}, peer {})", a.get(k).unwrap_or(&none), b.get(k).unwrap_or(&none)))
        .collect()
}

/// The drill the options ask for, if any; `Err`: a usage error.
fn drill_of(o: &Opts, mode: &Mode, fabric: Fabric) -> Result<Option<Drill>, String> {
    let Some(rail) = &o.fail_rail else { return Ok(None) };
    if *mode != Mode::Local || fabric != Fabric::Soft {
        return Err("--fail-rail drills two local ranks on the soft fabric".into());
    }
    if o.bidir || o.iters.is_some() {
        return Err("--fail-rail streams one way for a time: not with --bidir or --iters".into());
    }
    let every = o.fail_every.unwrap_or(o.fail_for + Duration::from_millis(1500));
    if o.injections > 1 && every <= o.fail_for {
        return Err("--fail-every must be longer than --fail-for (the rail must come back in between)".into());
    }
    let rail = if rail == "sout" { 0 } else { 1 };
    Ok(Some(Drill { rail, at: o.fail_at, down: o.fail_for, every, injections: o.injections }))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn plan(args: &[&str]) -> Result<Plan, String> {
        let mut v = vec!["mpib-perf"];
        v.extend_from_slice(args);
        Plan::new(Opts::try_parse_from(v).map_err(|e| e.to_string())?)
    }

    #[test]
    fn sizes_sweep_by_the_factor_and_end_at_the_last() {
        assert_eq!(parse_sizes("8:64M").unwrap().list.len(), 13);
        assert_eq!(*parse_sizes("8:64M").unwrap().list.last().unwrap(), 64 << 20);
        assert_eq!(parse_sizes("1K:4K:2").unwrap().list, vec![1024, 2048, 4096]);
        assert_eq!(parse_sizes("4MiB").unwrap().list, vec![4 << 20]);
        assert_eq!(parse_sizes("1g").unwrap().list, vec![1 << 30]);
        assert_eq!(parse_sizes("0").unwrap().list, vec![0]);
        for bad in ["", "x", "8:4", "8:64M:1", "1:2:3:4", "0:8", "4G", "8:3G"] {
            assert!(parse_sizes(bad).is_err(), "{bad}");
        }
    }

    #[test]
    fn defaults_are_a_local_soft_sweep_with_a_time_budget() {
        let p = plan(&[]).unwrap();
        assert_eq!((p.mode.clone(), p.fabric, p.sizes.len()), (Mode::Local, Fabric::Soft, 13));
        assert_eq!(p.duration, Some(Duration::from_secs(10)));
        let ph = &p.workload.phases;
        assert!(ph.iter().all(|x| x.budget_ms == 10_000 / 13 && x.warmup >= 4 && x.inflight == 8));
        assert!(p.workload.check && ph.iter().all(|x| x.corrupt.is_none() && x.timeline_us == 0));
        let env = p.plugin_env();
        assert!(env.contains(&("MPIB_FABRIC".into(), "soft".into())));
    }

    #[test]
    fn options_shape_the_workload() {
        let p = plan(&["--iters", "7", "--sizes", "1M:64M", "--inflight", "32", "--nrecv", "4", "--no-check"]).unwrap();
        assert_eq!(p.duration, None);
        let ph = &p.workload.phases;
        assert!(ph.iter().all(|x| x.count == 7 && x.budget_ms == 0 && x.nrecv == 4));
        assert_eq!(ph[0].inflight, 32);
        assert_eq!(ph.last().unwrap().inflight, 4, "64 MiB × 4 buffers: 1 GiB in flight at most");
        assert!(!p.workload.check);
        let p = plan(&["--inject-corruption", "--sizes", "8:32"]).unwrap();
        assert_eq!(p.workload.phases.iter().map(|x| x.corrupt).collect::<Vec<_>>(), vec![None, Some(0)]);
        let p = plan(&["--timeline", "t.json", "--split", "30"]).unwrap();
        assert_eq!((p.sizes.clone(), p.duration), (vec![256 << 10], Some(Duration::from_secs(5))));
        assert_eq!(p.workload.phases[0].timeline_us, 250);
        assert_eq!(timeline_sample_us(Duration::from_secs(100)), 500);
        assert!(p.plugin_env().contains(&("MPIB_SPLIT".into(), "30".into())));
    }

    #[test]
    fn the_drill_sets_the_plugins_fault_rail_and_the_stream() {
        let p = plan(&["--fail-rail", "sout", "--fail-at", "2", "--fail-for", "0.25", "--injections", "4"]).unwrap();
        let env = p.plugin_env();
        assert!(env.contains(&("MPIB_FAULT_RAIL".into(), "sout:@2000:250:1750:4".into())), "{env:?}");
        assert_eq!(
            (p.sizes.clone(), p.duration),
            (vec![256 << 10], Some(Duration::from_millis(12_250))),
            "(2 + 4 x 1.75) x 1.25 + 1"
        );
        assert!(p.workload.phases[0].timeline_us > 0 && p.opts.timeline.is_none());
        let one = plan(&["--fail-rail", "sup"]).unwrap();
        assert_eq!(one.drill.as_ref().unwrap().env(), "sup:@1000:500");
        for bad in [
            &["--fail-rail", "both"][..],
            &["--fail-for", "1"],
            &["--fail-rail", "sup", "--bidir"],
            &["--fail-rail", "sup", "--iters", "9"],
            &["--fail-rail", "sup", "--fabric", "inproc"],
            &["--fail-rail", "sup", "--listen"],
            &["--fail-rail", "sup", "--injections", "2", "--fail-every", "0.4"],
        ] {
            assert!(plan(bad).is_err(), "{bad:?}");
        }
    }

    #[test]
    fn modes_and_their_conflicts() {
        assert_eq!(plan(&["--fabric", "inproc"]).unwrap().mode, Mode::Threads);
        assert_eq!(plan(&["--listen"]).unwrap().mode, Mode::Listen(String::new()));
        assert_eq!(plan(&["--listen", ":5000"]).unwrap().mode, Mode::Listen(":5000".into()));
        let p = plan(&["--rendezvous", "h:1", "--rank", "1"]).unwrap();
        assert_eq!((p.mode, p.fabric), (Mode::Rendezvous("h:1".into(), Some(1)), Fabric::Auto));
        for bad in [
            &["--listen", "--connect", "x"][..],
            &["--rank", "0"],
            &["--iters", "3", "--duration", "1"],
            &["--inflight", "33"],
            &["--nrecv", "9"],
            &["--split", "sideways"],
            &["--abi", "v5"],
            &["--timeline", "t", "--sizes", "1K:4K"],
            &["--fabric", "inproc", "--connect", "x"],
            &["--duration", "-1"],
        ] {
            assert!(plan(bad).is_err(), "{bad:?}");
        }
        let p = plan(&["--list"]).unwrap();
        assert_eq!((p.mode.clone(), p.fabric), (Mode::List, Fabric::Auto));
        assert!(p.plugin_env().is_empty(), "--list leaves the fabric to the plugin: {:?}", p.plugin_env());
        let p = plan(&["--list", "--fabric", "soft"]).unwrap();
        assert_eq!(p.plugin_env(), vec![("MPIB_FABRIC".to_string(), "soft".to_string())], "no loopback rails");
        for bad in [&["--list", "--listen"][..], &["--list", "--json", "x"], &["--dev", "-1"], &["--dev", "x"]] {
            assert!(Opts::try_parse_from([&["mpib-perf"][..], bad].concat()).is_err(), "{bad:?}");
        }
        assert_eq!(plan(&["--dev", "3"]).unwrap().workload.dev, 3);
        assert_eq!(plan(&["--abi", "v9"]).unwrap().opts.abi, Some(9));
        assert_eq!(plan(&["--abi", "12"]).unwrap().opts.abi, Some(12));
        assert_eq!(parse_duration("250ms").unwrap(), Duration::from_millis(250));
    }

    #[test]
    fn differences_name_each_option_and_both_values() {
        let a = plan(&["--sizes", "8:1M"]).unwrap().agreed_line();
        let b = plan(&["--sizes", "8:1M", "--bidir", "--split", "sout"]).unwrap().agreed_line();
        assert!(differences(&a, &a).is_empty());
        assert_eq!(differences(&a, &b), vec!["--bidir (here off, peer on)", "--split (here -, peer sout)"]);
    }
}
