//! `mpib-perf` from the outside, as users and scripts run it: the default sweep (with small
//! limits) and its `--json` file, usage errors (exit code 2), errors a user can act on
//! (exit code 1 and one line), a corrupted byte that must be caught, the two-host flows on
//! loopback (`--listen` / `--connect`, `--rendezvous`), the in-process fabric and the
//! `--timeline` file.

mod common;

use std::io::{BufRead, BufReader};
use std::path::PathBuf;
use std::process::{Child, Command, Output, Stdio};
use std::time::Instant;

use serde_json::Value;

const BIN: &str = env!("CARGO_BIN_EXE_mpib-perf");

/// The tool with `args`, none of this process's `MPIB_*` variables, and both soft rails on
/// loopback (the two-host tests run both "hosts" here).
fn cmd(args: &[&str]) -> Command {
    let mut c = Command::new(BIN);
    for (k, _) in std::env::vars() {
        if k.starts_with("MPIB_") {
            c.env_remove(k);
        }
    }
    c.env("MPIB_SOFT_SOUT_ADDR", "127.0.0.1").env("MPIB_SOFT_SUP_ADDR", "127.0.0.1").args(args);
    c
}

fn run(args: &[&str]) -> Output {
    let t = Instant::now();
    let out = cmd(args).output().expect("run mpib-perf");
    eprintln!("mpib-perf {}: {:.1} s, {}", args.join(" "), t.elapsed().as_secs_f64(), out.status);
    out
}

fn text(o: &Output) -> (String, String) {
    (String::from_utf8_lossy(&o.stdout).into_owned(), String::from_utf8_lossy(&o.stderr).into_owned())
}

fn json(path: &PathBuf) -> Value {
    let s = std::fs::read_to_string(path).unwrap_or_else(|e| panic!("{}: {e}", path.display()));
    serde_json::from_str(&s).unwrap_or_else(|e| panic!("{}: {e}\n{s}", path.display()))
}

fn u(v: &Value) -> u64 {
    v.as_u64().unwrap_or_else(|| panic!("not a count: {v}"))
}

/// Checks a `--json` document of a clean one-way run of `sizes`: the schema, every row
/// measured and clean, the rails' counters consistent with the messages sent.
fn check_results(doc: &Value, sizes: &[u64]) {
    assert_eq!(doc["abi"], "v12", "{doc}");
    let rows = doc["rows"].as_array().expect("rows");
    assert_eq!(rows.iter().map(|r| u(&r["size"])).collect::<Vec<_>>(), sizes, "{doc}");
    for r in rows {
        for k in ["size", "count", "us_per_msg", "gbps", "p50_us", "p99_us", "sout_share", "wrong"] {
            assert!(r.get(k).is_some(), "row without {k}: {r}");
        }
        assert_eq!(u(&r["wrong"]), 0, "{r}");
        assert!(u(&r["count"]) >= 1 && r["us_per_msg"].as_f64().unwrap() > 0.0, "{r}");
        assert!(r["p99_us"].as_f64().unwrap() >= r["p50_us"].as_f64().unwrap(), "{r}");
        let share = r["sout_share"].as_f64().unwrap();
        assert!((0.0..=1.0).contains(&share), "{r}");
    }
    let messages = u(&doc["messages"]);
    let measured: u64 = rows.iter().map(|r| u(&r["count"])).sum();
    assert!(messages > measured, "warm-ups are sent too: {messages} vs {measured}");
    let rails = doc["rails"].as_array().expect("rails");
    assert_eq!(rails.iter().map(|r| r["name"].as_str().unwrap()).collect::<Vec<_>>(), ["SOUT", "SUP"]);
    let sum = |k: &str| rails.iter().map(|r| u(&r[k])).sum::<u64>();
    // One WRITE_WITH_IMM per active rail per message (no other traffic of the sender uses
    // one), each rail's chain rung once: at least one IMM per message, at most two.
    let imms = sum("imm_sent");
    assert!((messages..=2 * messages).contains(&imms), "{imms} IMMs for {messages} messages: {doc}");
    let measured_bytes: u64 = rows.iter().map(|r| u(&r["size"]) * u(&r["count"])).sum();
    assert!(sum("bytes") > measured_bytes, "rails carried {} bytes, the rows {measured_bytes}", sum("bytes"));
    for r in rails {
        assert_eq!(u(&r["zero_byte_imm"]), 0, "{r}");
        assert!(u(&r["wr_posted"]) >= u(&r["doorbells"]) && u(&r["doorbells"]) >= u(&r["imm_sent"]), "{r}");
        assert!(u(&r["cqe"]) <= u(&r["wr_posted"]), "{r}");
        if u(&r["bytes"]) > 0 {
            assert!(u(&r["latency_samples"]) > 0 && u(&r["latency_median_ns"]) > 0, "{r}");
            assert!(u(&r["latency_p99_ns"]) >= u(&r["latency_median_ns"]) && u(&r["srtt_ns"]) > 0, "{r}");
        }
    }
}

#[test]
fn the_default_sweep_with_small_limits_prints_the_table_and_writes_json() {
    let dir = common::tmpdir("perf-sweep");
    let file = dir.join("out.json");
    let out = run(&["--sizes", "8:128K", "--duration", "2", "--json", file.to_str().unwrap()]);
    let (stdout, stderr) = text(&out);
    assert!(out.status.success(), "{stdout}\n{stderr}");
    assert!(stdout.contains("#wrong") && stdout.contains("soft fabric"), "{stdout}");
    assert!(stdout.lines().any(|l| l.starts_with("# SOUT ") && l.contains("0-byte IMMs 0")), "{stdout}");
    assert!(stdout.lines().any(|l| l.starts_with("# SUP ") && l.contains("RTT samples")), "{stdout}");
    assert!(!stdout.contains('\r'), "no progress line when stdout is not a terminal");
    let doc = json(&file);
    assert_eq!(doc["fabric"], "soft");
    check_results(&doc, &[8, 32, 128, 512, 2048, 8192, 32768, 131072]);
    assert_eq!(stdout.lines().filter(|l| !l.starts_with('#')).count(), 8, "{stdout}");
}

#[test]
fn bad_options_exit_2_with_a_usage_line() {
    for args in [
        &["--bogus"][..],
        &["--sizes", "64K:8"],
        &["--inflight", "33"],
        &["--nrecv", "0"],
        &["--iters", "5", "--duration", "1"],
        &["--split", "sideways"],
        &["--abi", "v5"],
        &["--listen", "--connect", "x"],
        &["--rank", "1"],
        &["--timeline", "t.json", "--sizes", "8:64"],
    ] {
        let out = run(args);
        let (_, stderr) = text(&out);
        assert_eq!(out.status.code(), Some(2), "{args:?}: {stderr}");
        assert!(stderr.starts_with("error:") && stderr.contains("--help"), "{args:?}: {stderr}");
    }
}

#[test]
fn a_corrupted_byte_is_reported_as_wrong_and_fails_the_run() {
    let file = common::tmpdir("perf-corrupt").join("out.json");
    let out = run(&["--sizes", "4K:16K", "--iters", "20", "--inject-corruption", "--json", file.to_str().unwrap()]);
    let (stdout, stderr) = text(&out);
    assert_eq!(out.status.code(), Some(1), "{stdout}\n{stderr}");
    let line = stderr.lines().find(|l| l.starts_with("mpib-perf: ")).expect("an error line");
    assert_eq!(
        line,
        "mpib-perf: data mismatch at size 16384: receive #0 tag 1 (16384 bytes): 1 wrong bytes, first at offset 8192, last at 8192"
    );
    let wrong: Vec<u64> = json(&file)["rows"].as_array().unwrap().iter().map(|r| u(&r["wrong"])).collect();
    assert_eq!(wrong, vec![0, 1]);
}

/// Runs the tool with `args` and `env`; it must exit 1; its stderr.
fn fails(args: &[&str], env: &[(&str, &str)]) -> String {
    let out = cmd(args).envs(env.iter().copied()).output().unwrap();
    let (_, stderr) = text(&out);
    assert_eq!(out.status.code(), Some(1), "{args:?}: {stderr}");
    stderr
}

#[test]
fn errors_a_user_can_act_on_are_one_line_and_exit_1() {
    let first = |s: String| s.lines().next().unwrap_or("").to_string();
    let e = first(fails(&["--plugin", "/nonexistent/libmpib.so"], &[]));
    assert!(e.starts_with("mpib-perf: plugin library not found: cannot load /nonexistent/libmpib.so"), "{e}");
    let e = first(fails(&["--plugin", "libm.so.6"], &[]));
    assert!(e.starts_with("mpib-perf: libm.so.6 exports no ncclNetPlugin_v6"), "{e}");
    let e = first(fails(&["--abi", "v6", "--inflight", "16"], &[]));
    assert!(e.starts_with("mpib-perf: --inflight 16: with ABI v6 NCCL keeps at most 8"), "{e}");
    // init's failure, then the plugin's own WARN line naming the variable.
    let e = fails(&["--sizes", "8", "--iters", "1"], &[("MPIB_SPLIT", "sideways")]);
    assert!(e.starts_with("mpib-perf: the plugin's init failed on rank"), "{e}");
    assert!(e.contains("MPIB_SPLIT=\"sideways\" is not valid"), "{e}");
}

/// Starts the tool in the background with its stdout piped.
fn spawn(args: &[&str]) -> Child {
    cmd(args).stdout(Stdio::piped()).stderr(Stdio::piped()).spawn().expect("spawn mpib-perf")
}

/// Waits for `child`; its status and stdout + stderr (the first `lines` of stdout were
/// already read).
fn finish(mut child: Child, mut lines: Vec<String>) -> (bool, String) {
    if let Some(s) = child.stdout.take() {
        lines.extend(BufReader::new(s).lines().map_while(Result::ok));
    }
    let o = child.wait_with_output().expect("wait");
    (o.status.success(), format!("{}\n{}", lines.join("\n"), String::from_utf8_lossy(&o.stderr)))
}

#[test]
fn listen_prints_a_token_and_connect_runs_the_test_against_it() {
    let args = ["--fabric", "soft", "--sizes", "8:4K", "--iters", "50"];
    let mut listener = spawn(&[&["--listen", "127.0.0.1"][..], &args].concat());
    let mut seen = Vec::new();
    let mut lines = BufReader::new(listener.stdout.take().unwrap()).lines();
    let token = loop {
        let l = lines.next().expect("the listener printed its token").unwrap();
        seen.push(l.clone());
        if let Some(t) = l.strip_prefix("mpib-perf --connect ") {
            break t.to_string();
        }
    };
    assert!(!token.contains(' ') && token.len() > 20, "{token}");
    let rest = std::thread::spawn(move || lines.map_while(Result::ok).collect::<Vec<_>>());
    let file = common::tmpdir("perf-connect").join("out.json");
    let out = run(&[&["--connect", &token, "--json", file.to_str().unwrap()][..], &args].concat());
    let (stdout, stderr) = text(&out);
    assert!(out.status.success(), "{stdout}\n{stderr}");
    check_results(&json(&file), &[8, 32, 128, 512, 2048, 4096]);
    seen.extend(rest.join().unwrap());
    let (ok, all) = finish(listener, seen);
    assert!(ok && all.contains("#wrong"), "the listener prints the table too:\n{all}");
    // A token is good for one run: nobody listens there any more.
    let out = run(&[&["--connect", &token, "--timeout", "0.3"][..], &args].concat());
    assert_eq!(out.status.code(), Some(1));
    assert!(text(&out).1.starts_with("mpib-perf: peer unreachable"), "{}", text(&out).1);
    assert_eq!(run(&["--connect", "not-a-token"]).status.code(), Some(1));
}

/// A free port on 127.0.0.1 (bound and released).
fn free_port() -> u16 {
    std::net::TcpListener::bind("127.0.0.1:0").unwrap().local_addr().unwrap().port()
}

#[test]
fn rendezvous_picks_the_ranks_and_checks_that_the_options_agree() {
    let addr = format!("127.0.0.1:{}", free_port());
    let args = ["--rendezvous", &addr, "--fabric", "soft", "--sizes", "8:1K", "--iters", "30"];
    let a = spawn(&args);
    let b = spawn(&args);
    let (ok_a, out_a) = finish(a, Vec::new());
    let (ok_b, out_b) = finish(b, Vec::new());
    assert!(ok_a && ok_b, "{out_a}\n----\n{out_b}");
    assert!(out_a.contains("#wrong") && out_b.contains("#wrong"));

    let addr = format!("127.0.0.1:{}", free_port());
    let a = spawn(&["--rendezvous", &addr, "--sizes", "8:1K", "--iters", "30", "--bidir"]);
    let b = spawn(&["--rendezvous", &addr, "--sizes", "8:2K", "--iters", "30"]);
    for (ok, out) in [finish(a, Vec::new()), finish(b, Vec::new())] {
        assert!(!ok, "{out}");
        let line = out.lines().find(|l| l.starts_with("mpib-perf: ")).unwrap_or_else(|| panic!("{out}"));
        assert!(line.starts_with("mpib-perf: options differ from the peer's: --bidir (here "), "{line}");
        assert!(line.contains("--sizes (here 8,32,128,512,"), "{line}");
    }
}

#[test]
fn the_in_process_fabric_runs_both_ranks_as_threads() {
    let file = common::tmpdir("perf-inproc").join("out.json");
    let out = run(&["--fabric", "inproc", "--sizes", "8:8K", "--iters", "200", "--json", file.to_str().unwrap()]);
    let (stdout, stderr) = text(&out);
    assert!(out.status.success(), "{stdout}\n{stderr}");
    let doc = json(&file);
    assert_eq!(doc["fabric"], "inproc");
    assert!(doc["rows"].as_array().unwrap().iter().all(|r| u(&r["count"]) == 200 && u(&r["wrong"]) == 0), "{doc}");
}

#[test]
fn the_timeline_has_one_entry_per_millisecond_and_adds_up_to_what_was_sent() {
    let file = common::tmpdir("perf-timeline").join("tl.json");
    let size = 64 * 1024;
    let out = run(&["--timeline", file.to_str().unwrap(), "--sizes", "64K", "--duration", "1", "--quiet"]);
    let (stdout, stderr) = text(&out);
    assert!(out.status.success(), "{stdout}\n{stderr}");
    let start: u64 = stdout
        .lines()
        .find_map(|l| l.strip_prefix("TIMELINE-START "))
        .unwrap_or_else(|| panic!("no TIMELINE-START line: {stdout}"))
        .parse()
        .unwrap();
    let doc = json(&file);
    assert_eq!((u(&doc["size"]), u(&doc["interval_ms"]), u(&doc["start_mono_ns"])), (size, 1, start), "{doc}");
    let samples = doc["samples"].as_array().unwrap();
    let duration = doc["duration_ms"].as_f64().unwrap();
    assert!(samples.len() as f64 >= duration.floor(), "{} entries for {duration} ms", samples.len());
    for (i, s) in samples.iter().enumerate() {
        assert_eq!(u(&s["t_ms"]), i as u64);
        let (a, b) = (u(&s["sout_bytes"]), u(&s["sup_bytes"]));
        match s["sout_share"].as_f64() {
            Some(x) => assert!((x - a as f64 / (a + b) as f64).abs() < 1e-9, "{s}"),
            None => assert_eq!(a + b, 0, "{s}"),
        }
    }
    let posted: u64 = samples.iter().map(|s| u(&s["sout_bytes"]) + u(&s["sup_bytes"])).sum();
    assert_eq!(posted, u(&doc["messages"]) * size, "every byte of the stream is in one millisecond");
    // How many milliseconds have posts depends on how often the sender gets a core (189 of
    // 1756 with both cores busy elsewhere): a figure for the benchmarks, not a test bound.
    assert!(samples.iter().any(|s| !s["sout_share"].is_null()), "no millisecond with posts");
    // The count came from the 1 s budget, not the maximum (2,000,000 messages).
    assert!(duration < 10_000.0 && u(&doc["messages"]) < 2_000_000, "{duration} ms");
}

/// The failure drill: SUP dropped three times for 0.2 s while 1 MiB messages stream (the
/// back-off capped at its minimum, so each return takes one attempt or two): every byte
/// right, no error, each drop seen as a failover and followed by a re-admission, the
/// figures printed and in the JSON. (The figures themselves are the benchmark's,
/// docs/benchmarks.md; a missed goal is printed, never fatal.)
#[test]
fn the_failure_drill_drops_a_rail_and_prints_failover_and_readmission_figures() {
    let file = common::tmpdir("perf-drill").join("drill.json");
    let args = [
        "--fail-rail",
        "sup",
        "--fail-at",
        "0.4",
        "--fail-for",
        "0.2",
        "--fail-every",
        "1.5",
        "--injections",
        "3",
        "--sizes",
        "1M",
        "--json",
        file.to_str().unwrap(),
    ];
    // The back-off capped at 100 ms (drops 1.5 s apart would otherwise double it towards its
    // 1 s cap); the stall check every 250 ms (MPIB_STALL_MS / 4). Each return
    // must end before the next drop (1.3 s later), or that drop finds SUP still down and is
    // no failover.
    let env = [("MPIB_READMIT_MAX_MS", "100"), ("MPIB_STALL_MS", "1000")];
    let out = cmd(&args).envs(env).output().unwrap();
    let (stdout, stderr) = text(&out);
    assert!(out.status.success(), "{stdout}\n{stderr}");
    let drill: Vec<&str> = stdout.lines().filter(|l| l.starts_with("# drill: ")).collect();
    assert_eq!(drill.len(), 7, "{stdout}");
    assert!(stdout.contains("MPIB_FAULT_RAIL=sup:@400:200:1500:3"), "{stdout}");
    assert!(stdout.contains("# drill: wrong bytes 0, errors seen by the caller 0"), "{stdout}");
    let doc = json(&file);
    let d = &doc["drill"];
    assert_eq!(u(&doc["rows"][0]["wrong"]), 0, "{doc}");
    // At least the 3 drops (a loaded host may add a spurious one), each re-admitted (the
    // exit status says so too).
    let seen = u(&d["failovers_seen"]);
    assert!(seen >= 3 && u(&d["readmitted"]) == seen, "{d}");
    assert!(d["recovery_ms"].as_array().unwrap().len() >= 3, "{d}");
    assert_eq!(d["return_ms"].as_array().unwrap().len() as u64, seen, "{d}");
    assert!(d["alone_gbps"].as_f64().unwrap() > 0.0 && d["outage_gbps"].as_f64().unwrap() > 0.0, "{d}");
    for r in d["return_ms"].as_array().unwrap() {
        // Not before the rail works again (one sample of slack: the failover shows within
        // a sample of the drop).
        assert!(r.as_f64().unwrap() > -1.0, "{d}");
    }
}

/// `--list` on the soft fabric: both NICs with their pairing, link layer, nominal speed and
/// TCP address; the devices of each ABI version; the devices NCCL would use, numbered as
/// `--dev` takes them. With the NICs shown apart (v9+), NCCL fuses them.
#[test]
fn list_shows_the_nics_their_pairing_and_what_nccl_sees_per_abi_version() {
    let out = run(&["--list", "--fabric", "soft"]);
    let (stdout, stderr) = text(&out);
    assert!(out.status.success(), "{stdout}\n{stderr}");
    let nic = |name: &str, role: &str| {
        stdout.lines().any(|l| {
            l.contains(&format!("{name}:1 ")) && l.contains(role) && l.contains(" TCP ") && l.contains("127.0.0.1:")
        })
    };
    assert!(stdout.contains("# NICs mpib uses (2):"), "{stdout}");
    assert!(nic("soft-sout", "pair 0 SOUT") && nic("soft-sup", "pair 0 SUP"), "{stdout}");
    assert!(stdout.contains("10 Gb/s (nominal)"), "loopback has no line rate: {stdout}");
    assert!(stdout.contains("#   ABI v6-v12 (NCCL 2.14-2.30): 1 device(s)"), "{stdout}");
    assert!(
        stdout.contains("    --dev 0: [0] soft-sout+soft-sup  20 Gb/s  SOUT soft-sout:1 + SUP soft-sup:1"),
        "{stdout}"
    );
    assert!(!stdout.contains("--dev 1"), "{stdout}");

    let out = cmd(&["--list", "--fabric", "soft"]).env("MPIB_NCCL_DEVICES", "nics").output().unwrap();
    let (stdout, stderr) = text(&out);
    assert!(out.status.success(), "{stdout}\n{stderr}");
    assert!(stdout.contains("#   ABI v6-v8 (NCCL 2.14-2.23): 1 device(s)"), "{stdout}");
    assert!(stdout.contains("#   ABI v9-v12 (NCCL 2.24-2.30): 2 device(s)"), "{stdout}");
    assert!(stdout.contains("      [1] soft-sup  10 Gb/s  soft-sup:1 (both rails)"), "{stdout}");
    assert!(stdout.contains("NCCL_NET_FORCE_MERGE=soft-sout:1,soft-sup:1"), "{stdout}");
    assert!(
        stdout.contains(
            "    --dev 0: [2] soft-sout+soft-sup  20 Gb/s  SOUT soft-sout:1 + SUP soft-sup:1  fused from [0, 1]"
        ),
        "{stdout}"
    );
    // Through v8 there is nothing to fuse.
    let out = cmd(&["--list", "--fabric", "soft", "--abi", "v8"]).env("MPIB_NCCL_DEVICES", "nics").output().unwrap();
    assert!(
        text(&out).0.contains("through ABI v8, after fusing (mpib-perf --dev N):\n    --dev 0: [0] soft-sout+soft-sup"),
        "{}",
        text(&out).0
    );
}

/// `--dev N` runs on the N-th device NCCL would use: with the NICs shown apart and nothing
/// fused (the user's empty NCCL_NET_FORCE_MERGE), device 1 is SUP's NIC alone; a device
/// that does not exist is an error naming it. The table has Gb/s beside GB/s, and no share
/// of line rate where the NICs report no speed.
#[test]
fn dev_picks_the_device_and_the_table_has_gbits_and_line_share() {
    let env = [("MPIB_NCCL_DEVICES", "nics"), ("NCCL_NET_FORCE_MERGE", "")];
    let file = common::tmpdir("perf-dev").join("out.json");
    let out = cmd(&["--dev", "1", "--sizes", "4K:64K", "--iters", "50", "--json", file.to_str().unwrap()])
        .envs(env)
        .output()
        .unwrap();
    let (stdout, stderr) = text(&out);
    assert!(out.status.success(), "{stdout}\n{stderr}");
    assert!(stdout.contains(", device 1: soft-sup (soft fabric),"), "{stdout}");
    assert!(stdout.contains("     GB/s     Gb/s  %line "), "{stdout}");
    assert!(stdout.contains("# line rate: unknown"), "{stdout}");
    let doc = json(&file);
    assert!(doc["line_mbps"].is_null(), "{doc}");
    for r in doc["rows"].as_array().unwrap() {
        let (gb, gbit) = (r["gbps"].as_f64().unwrap(), r["gbits_per_s"].as_f64().unwrap());
        assert!(gb > 0.0 && (gbit - 8.0 * gb).abs() < 1e-9 && r["line_share"].is_null(), "{r}");
    }
    let e = fails(&["--dev", "2", "--sizes", "8", "--iters", "1"], &env);
    assert!(e.starts_with("mpib-perf: --dev: device 2 does not exist"), "{e}");
}

#[test]
fn stats_prints_each_ranks_view_per_nic_and_its_peers_and_puts_it_in_the_json() {
    let file = common::tmpdir("perf-stats").join("out.json");
    let (size, iters) = (65536u64, 40u64);
    let out = run(&["--sizes", "64K", "--iters", "40", "--split", "50", "--stats", "--json", file.to_str().unwrap()]);
    let (stdout, stderr) = text(&out);
    assert!(out.status.success(), "{stdout}\n{stderr}");
    let doc = json(&file);
    // Every message, warm-up included, split half and half: what each NIC must have carried.
    let messages = u(&doc["messages"]);
    assert!(messages > iters, "{doc}");
    let half = messages * size / 2;
    for rank in ["rank 0 (receives)", "rank 1 (sends)"] {
        assert!(stdout.contains(&format!("# {rank}: per NIC and rail")), "{rank}:\n{stdout}");
    }
    // The sender's NIC rows, as printed: each names its NIC port and rail and its bytes.
    let sender = &stdout[stdout.find("# rank 1 (sends): per NIC").expect("the sender's view")..];
    for (nic, rail) in [("soft-sout:1", "SOUT"), ("soft-sup:1", "SUP")] {
        let want = format!("bytes {half} (50.0%)");
        let row = |l: &&str| l.split_whitespace().take(3).eq(["#", nic, rail]) && l.contains(&want);
        assert!(sender.lines().any(|l| row(&l)), "no {nic} {rail} row with `{want}`:\n{stdout}");
    }
    // Its worst peers by latency: the receiver, as each NIC reaches it on loopback.
    let table = &sender[sender.find("worst peers by latency").expect("the latency ranking")..];
    let peers: Vec<&str> = table.lines().skip(2).take_while(|l| l.contains("127.0.0.1:")).collect();
    assert_eq!(peers.len(), 2, "one peer per NIC:\n{stdout}");
    assert!(
        peers.iter().any(|l| l.contains("soft-sout:1")) && peers.iter().any(|l| l.contains("soft-sup:1")),
        "{stdout}"
    );
    // The same in the JSON, one entry per rank.
    let stats = doc["stats"].as_array().expect("stats");
    assert_eq!(stats.iter().map(|s| u(&s["rank"])).collect::<Vec<_>>(), [0, 1], "{doc}");
    let nics = stats[1]["nics"].as_array().expect("nics");
    let rows: Vec<(&str, &str, u64)> =
        nics.iter().map(|n| (n["nic"].as_str().unwrap(), n["rail"].as_str().unwrap(), u(&n["bytes"]))).collect();
    assert_eq!(rows, [("soft-sout:1", "SOUT", half), ("soft-sup:1", "SUP", half)], "{doc}");
    let rails: u64 = doc["rails"].as_array().unwrap().iter().map(|r| u(&r["bytes"])).sum();
    assert_eq!(rails, messages * size, "the per-rail totals agree: {doc}");
    for n in nics {
        assert!(u(&n["latency_samples"]) > 0 && u(&n["wr_posted"]) > 0 && u(&n["cqe"]) > 0, "{n}");
        assert_eq!(u(&n["errors"]), 0, "{n}");
    }
    let worst = stats[1]["worst_by_latency"].as_array().expect("worst_by_latency");
    assert_eq!(worst.len(), 2, "{doc}");
    for p in worst {
        assert!(p["peer"].as_str().unwrap().starts_with("127.0.0.1:"), "{p}");
        assert_eq!((u(&p["bytes"]), u(&p["live_connections"])), (half, 1), "{p}");
        assert!(u(&p["latency_p99_ns"]) > 0, "{p}");
    }
    assert_eq!(stats[1]["worst_by_errors"].as_array().map(Vec::len), Some(0), "no errors: {doc}");
    // Without --stats neither the view nor the JSON entry.
    let plain = run(&["--sizes", "64K", "--iters", "5", "--json", file.to_str().unwrap()]);
    let (stdout, stderr) = text(&plain);
    assert!(plain.status.success(), "{stdout}\n{stderr}");
    assert!(!stdout.contains("per NIC and rail") && json(&file).get("stats").is_none(), "{stdout}");
}
