//! The auto split on simulated rails: `cargo run --release --example split_sim`.
//!
//! For each pair of rails: the throughput of each rail alone, of `auto` and of a static
//! 50/50 split, `auto` as a fraction of the two single rails' sum, and the share auto
//! settles on against the rails' rate ratio. Then one rail halves its rate mid-run: how
//! long (ms) and how many RTT samples of that rail until every 1 ms slot's share stays
//! within 5 % of the new steady share. The same figures the netem proof
//! (`ci/netem-rails.sh`) measures on kernel networking; targets: auto ≥ 0.95 of the sum,
//! settling ≤ 10 ms. "Slot noise" is the largest deviation of a slot's share from the
//! steady share, relative, before the change and after settling: the floor under which
//! no settling criterion can go.

use mpib::config::SplitMode;
use mpib::split::AnySplit;
use mpib::split::sim::{RailEvent, RailModel, SimConfig, SimReport, run};

const SPLIT_MIN: u64 = 65536;

fn sim(mode: SplitMode, cfg: &SimConfig) -> SimReport {
    run(&mut AnySplit::from_mode(mode, SPLIT_MIN), cfg)
}

fn gbps(bytes_per_ns: f64) -> f64 {
    bytes_per_ns * 8.0
}

fn steady(name: &str, rails: [RailModel; 2]) {
    let cfg = SimConfig::new(rails);
    let t = |m| sim(m, &cfg).throughput();
    let (sout, sup, half) = (t(SplitMode::Sout), t(SplitMode::Sup), t(SplitMode::Percent(50)));
    let auto = sim(SplitMode::Auto, &cfg);
    let ideal = rails[0].rate / (rails[0].rate + rails[1].rate);
    let share = auto.posted_share(cfg.duration_ns / 2, cfg.duration_ns, cfg.slot_ns);
    println!(
        "{name:<28} sout {:>6.2} sup {:>6.2} auto {:>6.2} 50/50 {:>6.2} Gbit/s | auto_vs_sum {:.3} static_vs_sum {:.3} | share {:.3} (rate ratio {:.3})",
        gbps(sout),
        gbps(sup),
        gbps(auto.throughput()),
        gbps(half),
        auto.throughput() / (sout + sup),
        half / (sout + sup),
        share,
        ideal,
    );
}

/// `poll_ns`: how often completions are polled (the clock's granularity for samples).
fn change(name: &str, rails: [RailModel; 2], rail: usize, poll_ns: u64) {
    let mut cfg = SimConfig::new(rails);
    cfg.poll_ns = poll_ns;
    let at = cfg.duration_ns / 2;
    cfg.events.push(RailEvent::SetRate { at_ns: at, rail, rate: rails[rail].rate / 2.0 });
    let r = sim(SplitMode::Auto, &cfg);
    let (new_share, settle) = r.settle(at, 0.05, cfg.slot_ns);
    let samples = r.samples_between(rail, at, at + settle);
    let (a, b) = if rail == 0 { (rails[0].rate / 2.0, rails[1].rate) } else { (rails[0].rate, rails[1].rate / 2.0) };
    let old_share = r.posted_share(at / 2, at, cfg.slot_ns);
    println!(
        "{name:<28} rail{rail} halves at {} ms: share {old_share:.3} -> {new_share:.3} (rate ratio {:.3}), settle_ms: {:.1} \
         ({samples} samples of rail{rail}); slot noise before {:.1} % after {:.1} %",
        at / 1_000_000,
        a / (a + b),
        settle as f64 / 1e6,
        100.0 * r.slot_noise(at / 2, at, old_share, cfg.slot_ns),
        100.0 * r.slot_noise(at + settle, cfg.duration_ns, new_share, cfg.slot_ns),
    );
}

fn main() {
    let netem = [RailModel::gbps(4.0, 50.0), RailModel::gbps(2.0, 20.0)];
    let mut jittery = netem;
    for r in jittery.iter_mut() {
        r.jitter_ns = 30_000;
    }
    let rdma = [RailModel::gbps(200.0, 3.0), RailModel::gbps(100.0, 2.0)];
    println!("512 KiB sends, 8 in flight, 200 ms, completions polled every 2 us; MPIB_SPLIT_MIN_BYTES={SPLIT_MIN}");
    steady("equal 4+4 Gbit/s", [RailModel::gbps(4.0, 50.0), RailModel::gbps(4.0, 50.0)]);
    steady("2:1 4G/50us + 2G/20us", netem);
    steady("2:1 with 0-30 us jitter", jittery);
    steady("10:1 10G + 1G", [RailModel::gbps(10.0, 10.0), RailModel::gbps(1.0, 10.0)]);
    steady("2:1 RDMA 200G + 100G", rdma);
    change("2:1 4G/50us + 2G/20us", netem, 0, 2_000);
    change("2:1 4G/50us + 2G/20us", netem, 1, 2_000);
    change("2:1 with 0-30 us jitter", jittery, 0, 2_000);
    change("2:1 RDMA 200G + 100G", rdma, 0, 2_000);
    change("  same, polled every 250 ns", rdma, 0, 250);
    let mut dead = SimConfig::new(netem);
    dead.events.push(RailEvent::Die { at_ns: 100_000_000, rail: 1 });
    let r = sim(SplitMode::Auto, &dead);
    println!(
        "{:<28} rail1 dies at 100 ms: share after {:.3}, throughput after {:.2} Gbit/s",
        "2:1 4G/50us + 2G/20us",
        r.posted_share(110_000_000, 200_000_000, dead.slot_ns),
        gbps(r.timeline[110..200].iter().map(|s| s.delivered[0] + s.delivered[1]).sum::<u64>() as f64 / 90e6),
    );
}
