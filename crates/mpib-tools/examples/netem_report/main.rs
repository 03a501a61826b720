//! The report of ci/netem-rails.sh (docs/testing.md, "Emulated rails"): reads the `--json`
//! results of its single-rail, `auto` and static 50/50 runs and the `--timeline` of its `auto`
//! run with a mid-run rate change, prints the figures, draws the timeline as SVG, and ends
//! with `auto_vs_sum: <ratio> static_vs_sum: <ratio> settle_ms: <ms>`. With `--outage-*`, also
//! the outage drill's run (one rail's veth down and up): failover and re-admission figures
//! and a second picture (`outage.rs`); its goals are printed, never fatal.
//!
//! ```text
//! cargo run --release --example netem_report -- --tput sout=a.json,b.json --tput sup=… \
//!     --tput auto=… --tput static=… --timeline t.json --change-ns N --change-end-ns M \
//!     --what "SOUT 4 -> 2 Gbit/s" --shaped-gbps 4,2 --svg timeline.svg
//! ```

mod outage;
mod plot;
mod timeline;

use std::process::ExitCode;

use clap::Parser;
use serde_json::Value;

use timeline::{Criteria, Timeline, settle};

#[derive(Parser, Debug)]
#[command(about = "Figures and picture of ci/netem-rails.sh")]
struct Args {
    /// MODE=FILE[,FILE…]: mpib-perf --json results of one mode (sout, sup, auto, static), one
    /// file per round; the median round counts.
    #[arg(long, value_name = "MODE=FILES", required = true)]
    tput: Vec<String>,
    /// mpib-perf --timeline document of the run with the change.
    #[arg(long)]
    timeline: String,
    /// CLOCK_MONOTONIC (ns) just before the rate change was made.
    #[arg(long)]
    change_ns: u64,
    /// CLOCK_MONOTONIC (ns) once it was made.
    #[arg(long)]
    change_end_ns: u64,
    /// What changed, for the captions.
    #[arg(long, default_value = "rate change")]
    what: String,
    /// The shaped rates of SOUT and SUP (Gbit/s), to tell how close the single rails come.
    #[arg(long, value_delimiter = ',', value_name = "SOUT,SUP")]
    shaped_gbps: Vec<f64>,
    /// Where to write the picture.
    #[arg(long)]
    svg: String,
    /// Width of the windows the shares are judged over. 10 ms: on a 2-core machine that runs
    /// both ranks and the kernel's shaping, 5 ms windows (about ten 256 KiB sends) strayed
    /// beyond 5 % of the steady share 2 to 20 % of the time with nothing changing (the
    /// sender or a completion off the CPU for a millisecond), 10 ms windows 0.5 to 9 %.
    #[arg(long, default_value_t = 10)]
    window_ms: usize,
    /// Tolerance around the new steady share (relative).
    #[arg(long, default_value_t = 0.05)]
    tol: f64,
    /// How long the windows must stay within the tolerance to count as settled (twice the
    /// window: no window that saw the change's transient is left, and a scheduling stall of
    /// the shared machine long after the change does not count as the reaction to it).
    #[arg(long, default_value_t = 20)]
    hold_ms: usize,
    /// Goals: auto ≥ this fraction of the single rails' sum …
    #[arg(long, default_value_t = 0.95)]
    goal_ratio: f64,
    /// … and settled within this many ms.
    #[arg(long, default_value_t = 10.0)]
    goal_settle_ms: f64,
    /// Exit with status 3 when a goal is missed (figures are always printed).
    #[arg(long)]
    strict: bool,
    /// The outage drill's --timeline document.
    #[arg(long, requires_all = ["outages", "outage_rail", "outage_svg"])]
    outage_timeline: Option<String>,
    /// DOWN_NS:UP_NS[,…]: CLOCK_MONOTONIC when the rail's link went down and came up.
    #[arg(long)]
    outages: Option<String>,
    /// The rail taken down: sout, sup, or both.
    #[arg(long, value_parser = ["sout", "sup", "both"])]
    outage_rail: Option<String>,
    /// Where to write the outage picture.
    #[arg(long)]
    outage_svg: Option<String>,
}

/// `DOWN:UP,…` as pairs of ns.
fn spans(text: &str) -> Result<Vec<[u64; 2]>, String> {
    text.split(',')
        .filter(|s| !s.is_empty())
        .map(|s| {
            let (a, b) = s.split_once(':').ok_or_else(|| format!("--outages {s}: expected DOWN_NS:UP_NS"))?;
            let n = |v: &str| v.trim().parse::<u64>().map_err(|_| format!("--outages {s}: not a number"));
            Ok([n(a)?, n(b)?])
        })
        .collect()
}

/// One mode's rounds: GB/s and SOUT share of the single size each ran.
struct Mode {
    name: String,
    gbs: Vec<f64>,
    share: Vec<Option<f64>>,
}

impl Mode {
    fn median(&self) -> f64 {
        let mut v = self.gbs.clone();
        v.sort_by(f64::total_cmp);
        v[v.len() / 2]
    }
}

fn read_json(path: &str) -> Result<Value, String> {
    let text = std::fs::read_to_string(path).map_err(|e| format!("{path}: {e}"))?;
    serde_json::from_str(&text).map_err(|e| format!("{path}: {e}"))
}

fn read_mode(spec: &str) -> Result<Mode, String> {
    let (name, files) = spec.split_once('=').ok_or_else(|| format!("--tput {spec}: expected MODE=FILE[,FILE…]"))?;
    let mut m = Mode { name: name.to_string(), gbs: Vec::new(), share: Vec::new() };
    for f in files.split(',') {
        let v = read_json(f)?;
        let row = v.pointer("/rows/0").ok_or_else(|| format!("{f}: no result row"))?;
        if row.get("wrong").and_then(Value::as_u64) != Some(0) {
            return Err(format!("{f}: wrong bytes or sizes reported: {row}"));
        }
        m.gbs.push(row.get("gbps").and_then(Value::as_f64).ok_or_else(|| format!("{f}: no gbps"))?);
        m.share.push(row.get("sout_share").and_then(Value::as_f64));
    }
    Ok(m)
}

fn fmt_list(v: &[f64]) -> String {
    v.iter().map(|x| format!("{:.2}", x * 8.0)).collect::<Vec<_>>().join(" ")
}

fn run(a: &Args) -> Result<bool, String> {
    let modes: Vec<Mode> = a.tput.iter().map(|s| read_mode(s)).collect::<Result<_, _>>()?;
    let get = |n: &str| modes.iter().find(|m| m.name == n).ok_or_else(|| format!("no --tput {n}=…"));
    let (sout, sup, auto, stat) = (get("sout")?, get("sup")?, get("auto")?, get("static")?);
    for (i, m) in [sout, sup].into_iter().enumerate() {
        let shaped = a.shaped_gbps.get(i).copied();
        let of = shaped
            .map_or(String::new(), |g| format!(" = {:.0} % of its shaped {g} Gbit/s", 100.0 * m.median() * 8.0 / g));
        println!("{:<7} {} Gbit/s (median {:.2}{of})", m.name, fmt_list(&m.gbs), m.median() * 8.0);
        if shaped.is_some_and(|g| m.median() * 8.0 < 0.85 * g) {
            println!(
                "# {} reaches less than 85 % of its shaped rate: CPU-bound here? (try lower --sout-rate/--sup-rate)",
                m.name
            );
        }
    }
    let sum = sout.median() + sup.median();
    let ideal = sout.median() / sum;
    for m in [auto, stat] {
        let shares: Vec<String> = m.share.iter().map(|s| s.map_or("-".into(), |v| format!("{v:.3}"))).collect();
        println!(
            "{:<7} {} Gbit/s (median {:.2}; SOUT share {})",
            m.name,
            fmt_list(&m.gbs),
            m.median() * 8.0,
            shares.join(" ")
        );
    }
    let (auto_vs_sum, static_vs_sum) = (auto.median() / sum, stat.median() / sum);
    println!("sum of single rails {:.2} Gbit/s; single-rail share of SOUT {ideal:.3}", sum * 8.0);

    let tv = read_json(&a.timeline)?;
    let t = Timeline::from_json(&tv)?;
    // A rate change is the split's business, not failover's: the run's counters say which
    // acted (both should stay 0).
    let (ev, _) = outage::events(&tv);
    let last = ev.last().copied().unwrap_or([0.0; 4]);
    println!(
        "timeline: failovers {} and suspected rails {} during the run with the rate change (no false failover: 0)",
        last[1], last[3]
    );
    let c = Criteria { window_ms: a.window_ms, tol: a.tol, hold_ms: a.hold_ms };
    // A change the timeline cannot measure (the stream ended too soon after it, three
    // times: a host much busier during the warm-up than after it) is no measure, not a
    // failed run: said so, and the settling goal counts as missed (fatal only with --strict).
    let settled = match settle(&t, a.change_ns, c) {
        Ok(s) => Some(s),
        Err(e) => {
            println!("timeline: the rate change could not be measured ({e}): settle not measured");
            None
        }
    };
    if let Some(s) = &settled {
        let tc_ms = a.change_end_ns.saturating_sub(a.change_ns) as f64 / 1e6;
        let strict = s.strict_ms.map_or("never".to_string(), |v| format!("{v:.1} ms"));
        println!(
            "timeline: {} B sends for {} ms; {} at {:.1} ms (tc took {tc_ms:.1} ms); SOUT share {:.3} -> {:.3}",
            t.size,
            t.full_bins(),
            a.what,
            s.change_ms,
            s.before,
            s.after
        );
        let r_before = t.rates((s.change_ms / 2.0) as usize, s.change_ms as usize);
        let r_after = t.rates(t.full_bins() - (t.full_bins() - s.change_ms as usize) / 2, t.full_bins());
        println!(
            "  posted Gbit/s before: SOUT {:.2} SUP {:.2}; after: SOUT {:.2} SUP {:.2}",
            r_before[0] * 8.0,
            r_before[1] * 8.0,
            r_after[0] * 8.0,
            r_after[1] * 8.0
        );
        println!(
            "  settle: {} ({} ms windows within {:.0} % of {:.3} for {} ms); every later window: {strict}; \
             windows within: {:.1} % before the change, {:.1} % after settling",
            s.settle_ms.map_or("never".to_string(), |v| format!("{v:.1} ms")),
            c.window_ms,
            c.tol * 100.0,
            s.after,
            c.hold_ms,
            s.within_before * 100.0,
            s.within_after * 100.0
        );
        plot::draw(&a.svg, &t, s, c, &a.what).map_err(|e| format!("{}: {e}", a.svg))?;
        println!("picture: {}", a.svg);
    }
    if let (Some(file), Some(sp), Some(rail), Some(svg)) =
        (&a.outage_timeline, &a.outages, &a.outage_rail, &a.outage_svg)
    {
        let v = read_json(file)?;
        let ot = Timeline::from_json(&v)?;
        let r = match rail.as_str() {
            "sout" => 0,
            "sup" => 1,
            _ => 2,
        };
        let os = outage::analyse(&ot, &v, r, &spans(sp)?);
        let alone = if r < 2 { [sout, sup][1 - r].median() } else { 0.0 };
        outage::report(&os, &rail.to_uppercase(), alone);
        outage::draw(svg, &ot, &os, &rail.to_uppercase()).map_err(|e| format!("{svg}: {e}"))?;
        println!("outage picture: {svg}");
    }
    let settle_ms = settled.as_ref().and_then(|s| s.settle_ms).unwrap_or(f64::INFINITY);
    let met = auto_vs_sum >= a.goal_ratio && settle_ms <= a.goal_settle_ms;
    println!(
        "goals: auto_vs_sum >= {} {}, settle_ms <= {} {}",
        a.goal_ratio,
        if auto_vs_sum >= a.goal_ratio { "met" } else { "MISSED" },
        a.goal_settle_ms,
        if settle_ms <= a.goal_settle_ms { "met" } else { "MISSED" }
    );
    let settle_txt = settled.as_ref().and_then(|s| s.settle_ms).map_or("inf".to_string(), |v| format!("{v:.1}"));
    println!("auto_vs_sum: {auto_vs_sum:.3} static_vs_sum: {static_vs_sum:.3} settle_ms: {settle_txt}");
    Ok(met)
}

fn main() -> ExitCode {
    let a = Args::parse();
    match run(&a) {
        Ok(true) => ExitCode::SUCCESS,
        Ok(false) => ExitCode::from(if a.strict { 3 } else { 0 }),
        Err(e) => {
            eprintln!("netem_report: {e}");
            ExitCode::FAILURE
        }
    }
}
