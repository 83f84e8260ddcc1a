//! `iwarp bench`: every row, text and JSON, the plot, flags, and the smoltcp transport.
#![allow(clippy::unwrap_used, clippy::expect_used, reason = "test helpers panic on broken fixtures")]

mod common;

use common::{SmolNetns, iwarp, stderr, stdout, wait_bounded};

/// A short `iwarp bench --json` run: every op's rows with positive numbers and the ratios.
fn bench_json(extra: &[&str]) -> serde_json::Value {
    let mut args = vec!["bench", "--sizes", "64,4k", "--duration", "0.05", "--json", "--quiet"];
    args.extend_from_slice(extra);
    let o = iwarp(&args);
    assert!(o.status.success(), "{}", stderr(&o));
    let v: serde_json::Value = serde_json::from_slice(&o.stdout).unwrap();
    let rows = v["rows"].as_array().unwrap();
    for op in ["write", "read", "send"] {
        for size in [64, 4096] {
            let r = rows
                .iter()
                .find(|r| r["op"] == op && r["size"] == size)
                .unwrap_or_else(|| panic!("{op} {size}"));
            for side in ["iwarp", "raw"] {
                for key in ["gbyte_s", "gbit_s", "mmsg_s", "p50_us", "p99_us"] {
                    assert!(r[side][key].as_f64().unwrap() > 0.0, "{op} {size} {side} {key}: {r}");
                }
            }
            for key in ["bandwidth", "msg_rate", "p50"] {
                assert!(r["ratio"][key].as_f64().unwrap() > 0.0, "{op} {size} ratio {key}: {r}");
            }
        }
    }
    assert!(v["msg_rate_64"]["ratio"].as_f64().unwrap() > 0.0);
    // Over kernel TCP, also against the raw stream written a window of messages per call.
    assert!(v["msg_rate_64"]["raw_per_window_mmsg_s"].as_f64().unwrap() > 0.0);
    assert!(v["msg_rate_64"]["ratio_per_window"].as_f64().unwrap() > 0.0);
    // Unpinned (no --pin), no record of threads.
    assert!(v["config"]["pin"].is_null());
    v
}

#[test]
fn bench_json_has_every_row() {
    let v = bench_json(&[]);
    assert_eq!(v["config"]["crc"], true);
    assert_eq!(v["config"]["poll"], "adaptive");
    assert_eq!(v["config"]["shared_device"], false);
    // Adaptive engines sleep when idle and the benchmark's threads block: nothing spins.
    assert_eq!(v["config"]["spinning_threads"], 0);
    assert!(v["config"]["cores"].as_u64().unwrap() >= 1);
    assert_eq!(v["config"]["negotiated"]["crc"], true);
    // Reads go as deep as the window (64 by default).
    assert_eq!(v["config"]["negotiated"]["ord"], 64);
    // One engine per end, each with its counters; both ran passes.
    let engines = v["config"]["engines"].as_array().unwrap();
    let names: Vec<_> = engines.iter().map(|e| e["device"].as_str().unwrap()).collect();
    assert_eq!(names, ["client", "server"]);
    // One queue pair: no stream over several connections.
    for r in v["rows"].as_array().unwrap() {
        assert!(r["raw_conns"].is_null() && r["ratio"]["bandwidth_conns"].is_null(), "{r}");
    }
    for e in engines {
        assert!(e["passes"].as_u64().unwrap() > 0, "{e}");
        for key in [
            "direct_passes",
            "sleeps",
            "event_wakeups",
            "timer_wakeups",
            "app_polls",
            "waiting_passes",
            "handoffs",
            "deafened",
            "alarms",
        ] {
            assert!(e[key].as_u64().is_some(), "{key}: {e}");
        }
    }
}

/// A run with more spinning threads than cores says so above its tables: on one core (the
/// process's affinity set to one CPU), an inline run's two threads, a busy run's four; an
/// adaptive run spins none.
#[test]
fn bench_says_when_its_spinning_threads_outnumber_the_cores() {
    let run = |poll: &str| {
        let o = std::process::Command::new("taskset")
            .args(["-c", "0", env!("CARGO_BIN_EXE_iwarp"), "bench", "--ops", "write", "--sizes", "64"])
            .args(["--iters", "20", "--quiet", "--poll", poll])
            .output()
            .unwrap();
        assert!(o.status.success(), "{}", stderr(&o));
        stdout(&o)
    };
    let inline = run("inline");
    assert!(
        inline.contains("2 spinning threads (the benchmark's client and server) on 1 core(s)"),
        "{inline}"
    );
    let busy = run("busy");
    assert!(
        busy.contains("4 spinning threads (the benchmark's client and server, the two engines) on 1 core(s)"),
        "{busy}"
    );
    assert!(busy.contains("busy mode is for machines with a core per spinning thread"), "{busy}");
    let adaptive = run("adaptive");
    assert!(!adaptive.contains("spinning threads"), "{adaptive}");
}

#[test]
fn bench_inline_two_qps_no_crc() {
    let v =
        bench_json(&["--poll", "inline", "--qps", "2", "--crc", "off", "--mpa-rev", "1", "--window", "8"]);
    assert_eq!(v["config"]["poll"], "inline");
    assert_eq!(v["config"]["spinning_threads"], 2);
    // Inline, no engine thread runs, so none ever sleeps; the application's calls ran the
    // passes.
    for e in v["config"]["engines"].as_array().unwrap() {
        assert_eq!(e["sleeps"], 0, "{e}");
        assert!(e["passes"].as_u64().unwrap() > 0, "{e}");
    }
    assert_eq!(v["config"]["negotiated"]["crc"], false);
    assert_eq!(v["config"]["negotiated"]["mpa_revision"], 1);
    // A window of 4 per queue pair still lets 16 Reads be outstanding, the stack's default.
    assert_eq!(v["config"]["negotiated"]["ord"], 16);
    // Two queue pairs: each row also against the raw stream over two connections, which
    // carried whole turns (the same number of messages on each).
    // Writes also over the first queue pair alone, in the same run: the aggregate's
    // baseline. Reads and Sends have none.
    for r in v["rows"].as_array().unwrap() {
        let msgs = r["raw_conns"]["msgs"].as_u64().unwrap();
        assert!(msgs > 0 && msgs % 2 == 0, "{r}");
        assert!(r["ratio"]["bandwidth_conns"].as_f64().unwrap() > 0.0, "{r}");
        if r["op"] == "write" {
            assert!(r["iwarp_one_qp"]["msgs"].as_u64().unwrap() > 0, "{r}");
            assert!(r["ratio"]["bandwidth_one_qp"].as_f64().unwrap() > 0.0, "{r}");
        } else {
            assert!(r["iwarp_one_qp"].is_null() && r["ratio"]["bandwidth_one_qp"].is_null(), "{r}");
        }
    }
}

#[test]
fn bench_sends_beyond_the_window_up_to_the_posted_receives() {
    let run = |window: &str, qps: &str, extra: &[&str]| {
        let mut args = vec![
            "bench", "--ops", "send", "--sizes", "64", "--iters", "3000", "--window", window, "--qps", qps,
            "--json", "--quiet",
        ];
        args.extend_from_slice(extra);
        let o = iwarp(&args);
        assert!(o.status.success(), "{}", stderr(&o));
        serde_json::from_slice::<serde_json::Value>(&o.stdout).unwrap()
    };
    // Window 1 over 3 pairs: each pair's sender may have 170 Sends in flight (512 receives
    // posted over all pairs), far beyond its one outstanding work request at a time. A Send
    // past the server's posted receives would be terminated by the server and fail the run.
    let v = run("1", "3", &[]);
    assert_eq!(v["config"]["send_credits_per_qp"], 170);
    // More pairs than receives: one credit per pair, so every pair's next Send waits for the
    // server to repost the receive its last one took (the client sets such pairs aside, in
    // the order they ran out, and takes them up as their credits come back).
    let v = run("1", "520", &[]);
    assert_eq!(v["config"]["send_credits_per_qp"], 1);
    assert_eq!(v["rows"][0]["iwarp"]["msgs"], 3000);
    // A window beyond the default receive depth raises it. On one shared device the run
    // reports the one engine.
    let v = run("1024", "2", &["--shared-device"]);
    assert_eq!(v["config"]["send_credits_per_qp"], 512);
    let engines = v["config"]["engines"].as_array().unwrap();
    assert_eq!(engines.len(), 1, "{engines:?}");
    assert_eq!(engines[0]["device"], "shared");
    // A deeper receive queue (perftest's -r) gives the sender as many more credits, spread
    // over the pairs; one shallower than the window still leaves a window's worth per pair.
    let v = run("64", "2", &["--rx-depth", "4096"]);
    assert_eq!(v["config"]["rx_depth"], 4096);
    assert_eq!(v["config"]["send_credits_per_qp"], 2048);
    assert_eq!(v["rows"][0]["iwarp"]["msgs"], 3000);
    let v = run("64", "1", &["--rx-depth", "8"]);
    assert_eq!(v["config"]["send_credits_per_qp"], 64);
    assert_eq!(v["rows"][0]["iwarp"]["msgs"], 3000);
}

/// CQ moderation: whatever share of the work requests signal, every message of every op is
/// counted once (a completion retires the unsignaled ones before it), over one queue pair
/// and over several, with moderation above the window (cut to it) and with none.
#[test]
fn bench_cq_moderation_counts_every_message_once() {
    for (cq_mod, window, qps) in [("7", "20", "1"), ("1", "8", "1"), ("100", "10", "3"), ("16", "64", "2")] {
        let o = iwarp(&[
            "bench",
            "--ops",
            "write,read,send",
            "--sizes",
            "64,8k",
            "--iters",
            "500",
            "--cq-mod",
            cq_mod,
            "--window",
            window,
            "--qps",
            qps,
            "--json",
            "--quiet",
        ]);
        assert!(o.status.success(), "{cq_mod} {window} {qps}: {}", stderr(&o));
        let v: serde_json::Value = serde_json::from_slice(&o.stdout).unwrap();
        assert_eq!(v["config"]["cq_mod"].as_u64().unwrap().to_string(), cq_mod);
        for r in v["rows"].as_array().unwrap() {
            assert_eq!(r["iwarp"]["msgs"], 500, "{cq_mod} {window} {qps}: {r}");
        }
    }
}

#[test]
fn bench_text_and_iters() {
    let o = iwarp(&["bench", "--ops", "send", "--sizes", "1K", "--iters", "50", "--poll", "event"]);
    assert!(o.status.success(), "{}", stderr(&o));
    let s = stdout(&o);
    for word in ["send", "1K", "iwarp GB/s", "raw p50/p99/p99.9 us", "64 B message rate"] {
        assert!(s.contains(word), "{word}: {s}");
    }
    assert!(s.contains("against raw TCP written 64 messages per system call"), "{s}");
    // Progress lines count the measurements: the raw 1K and 64 B rows, the 64 B stream
    // written a window per call, then send 1K.
    let err = stderr(&o);
    assert!(err.contains("bench: [1/4] raw TCP"), "{err}");
    assert!(err.contains("bench: [3/4] raw TCP       64, 64 per write"), "{err}");
    assert!(err.contains("bench: [4/4] send"), "{err}");
}

/// Several queue pairs: the raw stream over as many connections too (one more progress line
/// per size), Writes over one queue pair alone too (one more line after each Write row), and
/// a line per row with iwarp against both and raw TCP's own change.
#[test]
fn bench_over_several_qps_compares_with_raw_tcp_over_as_many_connections_and_with_one_qp() {
    let o = iwarp(&[
        "bench",
        "--ops",
        "write,read",
        "--sizes",
        "4K",
        "--iters",
        "300",
        "--qps",
        "5",
        "--window",
        "8",
    ]);
    assert!(o.status.success(), "{}", stderr(&o));
    let s = stdout(&o);
    assert!(
        s.contains(
            "bandwidth over 5 QPs against one QP in the same run (Writes: the whole window of 8 on the first QP); against raw TCP over 5 connections, 2 message(s) per connection per write"
        ),
        "{s}"
    );
    let line = s.lines().find(|l| l.starts_with("write ") && l.contains("over 5 connections")).unwrap();
    assert!(line.contains("over one QP") && line.contains("over 5 / over one"), "{line}");
    assert!(line.contains("raw over 5 / raw over one"), "{line}");
    let line = s.lines().find(|l| l.starts_with("read ") && l.contains("over 5 connections")).unwrap();
    assert!(!line.contains("over one QP"), "{line}");
    let err = stderr(&o);
    assert!(err.contains("bench: [2/7] raw TCP    4K over 5 connections"), "{err}");
    assert!(err.contains("bench: [5/7] write    4K:"), "{err}");
    assert!(err.contains("bench: [6/7] write    4K over one QP:") && err.contains("; 5 rounds "), "{err}");
    assert!(err.contains("bench: [7/7] read"), "{err}");
    assert!(s.contains("take turns in 5 rounds"), "{s}");
    let line = s.lines().find(|l| l.starts_with("write ") && l.contains("over 5 connections")).unwrap();
    assert_eq!(line.matches("(rounds ").count(), 2, "{line}");
}

/// Writes over several queue pairs take turns with one queue pair and with raw TCP over as
/// many connections, in five rounds of a fifth of the budget each: the figures are the rounds'
/// sums, the ratios come with their spread. Busy engines would spin beside raw TCP's turns:
/// there raw TCP over the connections is the one measured before the engines started.
#[test]
fn bench_writes_over_several_qps_take_turns_in_rounds() {
    let run = |poll: &str| {
        let o = iwarp(&[
            "bench", "--ops", "write", "--sizes", "4K", "--iters", "100", "--qps", "3", "--window", "6",
            "--poll", poll, "--json", "--quiet",
        ]);
        assert!(o.status.success(), "{poll}: {}", stderr(&o));
        let v: serde_json::Value = serde_json::from_slice(&o.stdout).unwrap();
        v["rows"][0].clone()
    };
    for poll in ["adaptive", "busy"] {
        let r = run(poll);
        assert_eq!(r["write_rounds"], 5, "{poll}: {r}");
        // 100 messages in rounds of 20, for the aggregate and for one queue pair.
        assert_eq!(r["iwarp"]["msgs"], 100, "{poll}: {r}");
        assert_eq!(r["iwarp_one_qp"]["msgs"], 100, "{poll}: {r}");
        let one = &r["ratio"]["bandwidth_one_qp_rounds"];
        let (lo, mid, hi) =
            (one["min"].as_f64().unwrap(), one["median"].as_f64().unwrap(), one["max"].as_f64().unwrap());
        assert!(0.0 < lo && lo <= mid && mid <= hi, "{poll}: {r}");
        assert!(r["raw_conns"]["gbyte_s"].as_f64().unwrap() > 0.0, "{poll}: {r}");
        let conns = &r["ratio"]["bandwidth_conns_rounds"];
        if poll == "busy" {
            assert!(conns.is_null(), "{r}");
        } else {
            assert!(conns["min"].as_f64().unwrap() <= conns["max"].as_f64().unwrap(), "{r}");
            // Five rounds of at least 20 messages (whole turns of 2 per connection).
            assert!(r["raw_conns"]["msgs"].as_u64().unwrap() >= 100, "{r}");
        }
    }
}

#[test]
fn bench_plot_draws_both_panels_and_every_op() {
    let file = std::env::temp_dir().join(format!("iwarp-bench-{}.svg", std::process::id()));
    let f = file.to_str().unwrap();
    let o = iwarp(&["bench", "--sizes", "64,4k", "--iters", "20", "--quiet", "--plot", f]);
    assert!(o.status.success(), "{}", stderr(&o));
    let svg = std::fs::read_to_string(&file).unwrap();
    std::fs::remove_file(&file).ok();
    assert!(svg.starts_with("<svg") && svg.trim_end().ends_with("</svg>"), "{svg}");
    for word in
        ["Bandwidth", "round trip", "write iwarp", "read iwarp", "send iwarp", "raw TCP", ">64<", ">4K<"]
    {
        assert!(svg.contains(word), "{word}");
    }
    // Per operation: this stack and raw TCP, in each of the two panels.
    assert_eq!(svg.matches("<polyline").count(), 3 * 2 * 2);
    let o = iwarp(&["bench", "--sizes", "64", "--iters", "5", "--quiet", "--plot", "/nonexistent-dir/x.svg"]);
    assert_eq!(o.status.code(), Some(1));
    assert!(stderr(&o).contains("cannot write /nonexistent-dir/x.svg"), "{}", stderr(&o));
}

#[test]
fn bench_bad_flags_exit_nonzero_with_a_clear_message() {
    for (args, needle) in [
        (&["--sizes", "0"][..], "at least 1 byte"),
        (&["--sizes", "2g"], "1 GiB"),
        (&["--sizes", "12q"], "not a size"),
        (&["--qps", "0"], "--qps"),
        (&["--window", "0"], "--window"),
        (&["--cq-mod", "0"], "--cq-mod"),
        (&["--rx-depth", "0"], "--rx-depth"),
        (&["--rx-depth", "20000"], "--rx-depth"),
        (&["--crc", "maybe"], "--crc"),
        (&["--mpa-rev", "3"], "--mpa-rev"),
        (&["--poll", "sometimes"], "--poll"),
        (&["--duration", "0"], "duration"),
        (&["--duration", "1", "--iters", "5"], "cannot be used with"),
        (&["--ops", "atomic"], "--ops"),
        (&["--interleave", "sometimes"], "--interleave"),
        (&["--poll", "busy", "--interleave", "on"], "--interleave on"),
        (&["--poll", "inline", "--interleave", "on"], "--interleave on"),
        (&["--pin", "0"], "CLIENT,SERVER"),
        (&["--pin", "0,x"], "CLIENT,SERVER"),
        (&["--pin", "0,0", "--shared-device"], "--shared-device"),
        (&["--pin", "0,0", "--device", "siw0"], "--device"),
        (&["--pin", "0,100000"], "may not run on CPU 100000"),
    ] {
        let mut all = vec!["bench"];
        all.extend_from_slice(args);
        let o = iwarp(&all);
        assert_eq!(o.status.code(), Some(2), "{args:?}");
        let e = stderr(&o);
        assert!(e.starts_with("error:") && e.contains(needle), "{args:?}: {e}");
        assert!(o.stdout.is_empty(), "{args:?}");
    }
}

/// The ping-pongs' raw-TCP baseline takes turns with this stack's: with a gap, one round trip
/// each, as many as this stack's; back to back, 10 ms of each, several turns in a measurement;
/// measured apart with `--interleave off` and where the baseline busy-polls.
#[test]
fn bench_ping_pongs_take_turns_with_the_raw_baseline() {
    let run = |extra: &[&str]| {
        let mut args = vec!["bench", "--ops", "send,write", "--sizes", "8", "--json", "--quiet"];
        args.extend_from_slice(extra);
        let o = iwarp(&args);
        assert!(o.status.success(), "{extra:?}: {}", stderr(&o));
        let v: serde_json::Value = serde_json::from_slice(&o.stdout).unwrap();
        assert_eq!(v["rows"].as_array().unwrap().len(), 2, "{v}");
        v
    };
    let v = run(&["--iters", "20", "--gap", "1ms"]);
    assert_eq!(v["config"]["raw_ping_pong"], "blocking, in turns");
    for r in v["rows"].as_array().unwrap() {
        assert_eq!(r["iwarp"]["samples"], 20, "{r}");
        assert_eq!(r["raw"]["samples"], 20, "{r}");
        assert_eq!(r["raw"]["ping_pong_turns"], 20, "{r}");
        assert!(r["raw"]["p50_us"].as_f64().unwrap() > 0.0, "{r}");
    }
    // Back to back: 0.1 s of each, in turns of 10 ms.
    let v = run(&["--duration", "0.1", "--poll", "event"]);
    for r in v["rows"].as_array().unwrap() {
        let turns = r["raw"]["ping_pong_turns"].as_u64().unwrap();
        assert!((3..=40).contains(&turns), "{turns} turns: {r}");
        assert!(r["raw"]["samples"].as_u64().unwrap() > turns, "{r}");
        assert!(r["iwarp"]["samples"].as_u64().unwrap() > turns, "{r}");
    }
    for extra in [&["--iters", "20", "--interleave", "off"][..], &["--iters", "20", "--poll", "inline"]] {
        let v = run(extra);
        for r in v["rows"].as_array().unwrap() {
            assert!(r["raw"]["ping_pong_turns"].is_null(), "{extra:?}: {r}");
            assert_eq!(r["raw"]["samples"], 20, "{extra:?}: {r}");
        }
    }
}

#[test]
fn bench_over_smoltcp_reports_the_raw_ratio_and_kernel_tcp() {
    if !iwarp_tests::netns::privileged("bench_over_smoltcp_reports_the_raw_ratio_and_kernel_tcp") {
        return;
    }
    let ns = SmolNetns::new("bench");
    let child = ns
        .iwarp(&[
            "bench",
            "--transport",
            "smoltcp",
            "--iface",
            "va",
            "--peer-iface",
            "vb",
            "--ip",
            "10.82.0.1/24",
            "--peer-ip",
            "10.82.0.2/24",
            "--ops",
            "write,send",
            "--sizes",
            "64,64k",
            "--iters",
            "20",
            "--json",
            "--quiet",
        ])
        .stdout(std::process::Stdio::piped())
        .stderr(std::process::Stdio::piped())
        .spawn()
        .unwrap();
    let o = wait_bounded(child, std::time::Duration::from_secs(120), "bench over smoltcp");
    assert!(o.status.success(), "{}{}", stdout(&o), stderr(&o));
    let v: serde_json::Value = serde_json::from_str(&stdout(&o)).unwrap();
    assert_eq!(v["config"]["transport"], "smoltcp");
    let rows = v["rows"].as_array().unwrap();
    assert_eq!(rows.len(), 4);
    for r in rows {
        assert!(r["iwarp"]["gbyte_s"].as_f64().unwrap() > 0.0, "{r}");
        assert!(r["raw"]["gbyte_s"].as_f64().unwrap() > 0.0, "{r}");
        assert!(r["kernel_tcp"]["gbyte_s"].as_f64().unwrap() > 0.0, "{r}");
    }
}

/// The two ends of the veth pair in two namespaces: the kernel-TCP baseline runs over the same
/// pair (between the kernel's addresses of its ends), and `--offload off` runs both stacks
/// without offloads, which the report says.
#[test]
fn bench_over_smoltcp_in_two_namespaces_compares_with_kernel_tcp_on_the_pair() {
    let test = "bench_over_smoltcp_in_two_namespaces_compares_with_kernel_tcp_on_the_pair";
    if !iwarp_tests::netns::privileged(test) {
        return;
    }
    let limit = std::time::Duration::from_secs(120);
    let a = iwarp_tests::netns::Netns::new("iwcli", "bench2a", "IWARP_CLI_NS", limit);
    let b = iwarp_tests::netns::Netns::new("iwcli", "bench2b", "IWARP_CLI_NS", limit);
    iwarp_tests::netns::run_checked(
        "creating a veth pair between two namespaces",
        std::process::Command::new("ip").args([
            "link", "add", "vsa", "netns", &a.name, "type", "veth", "peer", "name", "vsb", "netns", &b.name,
        ]),
    );
    a.ip(&["addr", "add", "10.84.0.1/24", "dev", "vsa"]);
    b.ip(&["addr", "add", "10.84.0.2/24", "dev", "vsb"]);
    a.ip(&["link", "set", "vsa", "up"]);
    b.ip(&["link", "set", "vsb", "up"]);
    let child = std::process::Command::new(env!("CARGO_BIN_EXE_iwarp"))
        .args([
            "bench",
            "--transport",
            "smoltcp",
            "--netns",
            &a.name,
            "--peer-netns",
            &b.name,
            "--iface",
            "vsa",
            "--peer-iface",
            "vsb",
            "--ip",
            "10.84.1.1/24",
            "--peer-ip",
            "10.84.1.2/24",
            "--offload",
            "off",
            "--ops",
            "write",
            "--sizes",
            "64k",
            "--iters",
            "20",
            "--json",
            "--quiet",
        ])
        .stdout(std::process::Stdio::piped())
        .stderr(std::process::Stdio::piped())
        .spawn()
        .unwrap();
    let o = wait_bounded(child, limit, "bench over smoltcp in two namespaces");
    assert!(o.status.success(), "{}{}", stdout(&o), stderr(&o));
    let v: serde_json::Value = serde_json::from_str(&stdout(&o)).unwrap();
    assert_eq!(v["config"]["kernel_tcp_path"], "the same veth pair", "{v}");
    for end in ["client", "server"] {
        let offloads = v["config"]["offloads"][end].as_str().unwrap();
        assert!(!offloads.contains("tso") && !offloads.contains("csum"), "{end}: {offloads}");
    }
    let rows = v["rows"].as_array().unwrap();
    assert!(!rows.is_empty());
    for r in rows {
        assert!(r["kernel_tcp"]["gbyte_s"].as_f64().unwrap() > 0.0, "{r}");
        assert!(r["raw_frames"]["frames"].as_u64().unwrap() > 0, "{r}");
    }
}

#[test]
fn bench_smoltcp_flag_errors() {
    let o = iwarp(&["bench", "--transport", "smoltcp", "--iface", "va", "--ip", "10.82.0.1/24"]);
    assert_eq!(o.status.code(), Some(2));
    assert!(stderr(&o).contains("--peer-iface"), "{}", stderr(&o));
    let o = iwarp(&["bench", "--transport", "smoltcp", "--tap", "tp0", "--ip", "10.82.0.1/24"]);
    assert_eq!(o.status.code(), Some(2));
    assert!(stderr(&o).contains("two interfaces"), "{}", stderr(&o));
    let o = iwarp(&[
        "bench",
        "--transport",
        "smoltcp",
        "--iface",
        "iwnosuch8",
        "--peer-iface",
        "iwnosuch9",
        "--ip",
        "10.82.0.1/24",
        "--peer-ip",
        "10.82.0.2/24",
    ]);
    assert_eq!(o.status.code(), Some(1));
    assert_eq!(stderr(&o).lines().count(), 1, "{}", stderr(&o));
    assert!(stderr(&o).contains("iwnosuch8"), "{}", stderr(&o));
    let o = iwarp(&["bench", "--peer-iface", "vb"]);
    assert_eq!(o.status.code(), Some(2));
    let o = iwarp(&["bench", "--offload", "off"]);
    assert_eq!(o.status.code(), Some(2));
    assert!(stderr(&o).contains("--offload needs --transport smoltcp"), "{}", stderr(&o));
    let o = iwarp(&["bench", "--netns", "a", "--peer-netns", "b"]);
    assert_eq!(o.status.code(), Some(2));
}

/// The CPUs this process may run on (`Cpus_allowed_list` in /proc/self/status: `0-3,6`).
fn allowed_cpus() -> Vec<usize> {
    let status = std::fs::read_to_string("/proc/self/status").unwrap();
    let list = status.lines().find_map(|l| l.strip_prefix("Cpus_allowed_list:")).unwrap();
    let mut cpus = Vec::new();
    for part in list.trim().split(',') {
        let (a, b) = part.split_once('-').unwrap_or((part, part));
        cpus.extend(a.parse::<usize>().unwrap()..=b.parse::<usize>().unwrap());
    }
    cpus
}

/// The first CPU this process may run on.
fn first_allowed_cpu() -> String {
    allowed_cpus()[0].to_string()
}

/// `--pin CLIENT,SERVER`: the bench's own thread and the client's engine on one CPU; the
/// server's engine, its application thread and the raw echo it takes turns with on the other
/// (the first and last CPUs this process may use: one CPU for both where it has only one),
/// as the JSON's thread list shows. Refused with one device, over smoltcp, through a verbs
/// device, or on a CPU the process may not use (in `bench_bad_flags_exit_nonzero_with_a_clear_message`).
#[test]
fn bench_pin_puts_each_end_on_a_cpu_of_its_own() {
    let cpus = allowed_cpus();
    let (client, server) = (cpus[0], cpus[cpus.len() - 1]);
    let pin = format!("{client},{server}");
    let o = iwarp(
        &["bench", "--ops", "send", "--sizes", "8", "--iters", "200", "--crc", "off", "--pin", pin.as_str()]
            .into_iter()
            .chain(["--json", "--quiet"])
            .collect::<Vec<_>>(),
    );
    assert!(o.status.success(), "{}", stderr(&o));
    let v: serde_json::Value = serde_json::from_slice(&o.stdout).unwrap();
    let p = &v["config"]["pin"];
    assert_eq!((p["client"].as_u64(), p["server"].as_u64()), (Some(client as u64), Some(server as u64)));
    let threads: Vec<(&str, &str)> = p["threads"]
        .as_array()
        .unwrap()
        .iter()
        .map(|t| (t["name"].as_str().unwrap(), t["cpus"].as_str().unwrap()))
        .collect();
    let cpus_of =
        |name: &str| threads.iter().filter(|t| t.0 == name).map(|t| t.1.to_string()).collect::<Vec<_>>();
    let (c, s) = (client.to_string(), server.to_string());
    // The first thread is the bench's own, the client.
    assert_eq!(threads[0].1, c, "{threads:?}");
    let mut engines = cpus_of("iwarp-engine");
    engines.sort();
    let mut want = vec![c.clone(), s.clone()];
    want.sort();
    assert_eq!(engines, want, "one engine per end: {threads:?}");
    assert_eq!(cpus_of("bench-server"), [s.as_str()], "{threads:?}");
    assert_eq!(cpus_of("raw-tcp-server"), [s.as_str()], "the raw echo with the server: {threads:?}");
}

/// Two adaptive devices on one core (`taskset`), 8 B Send ping-pong: the server's engine
/// thread finds its spin competing with the threads it waits for and sleeps, and the
/// application threads, which wait for that input anyway, run the passes. A spin that kept
/// going ran every pass on the engine thread (none by the posting thread) and took turns on
/// the core with the threads that had the messages: twice event mode's round trip.
#[test]
fn adaptive_engines_sharing_a_core_leave_the_passes_to_the_waiting_threads() {
    let cpu = first_allowed_cpu();
    let o = std::process::Command::new("taskset")
        .args(["-c", &cpu, common::BIN, "bench", "--ops", "send", "--sizes", "8", "--iters", "300"])
        .args(["--poll", "adaptive", "--json", "--quiet"])
        .output()
        .unwrap();
    assert!(o.status.success(), "{}", stderr(&o));
    let v: serde_json::Value = serde_json::from_slice(&o.stdout).unwrap();
    let engines = v["config"]["engines"].as_array().unwrap();
    let server = engines.iter().find(|e| e["device"] == "server").unwrap();
    let n = |k: &str| server[k].as_u64().unwrap();
    // Not asserted: that a yield came back late (`contended_yields`), which is how the spin
    // notices; whether one does in a short run is the scheduler's timing (0 in 4 of 10 runs
    // here on an otherwise idle machine). Where the passes ran is the behaviour.
    // About one pass a round trip is the posting thread's (each pong's post), none with the
    // spin that kept going. The rest split between the engine and the waiting thread, and how
    // is the scheduler's timing: 45-57% of all passes were the posting thread's in 8 runs of a
    // debug build here once, 33-46% in 20 runs since, so the share is not what is asserted.
    assert!(2 * n("direct_passes") >= 300, "a pass by the posting thread on most round trips: {server}");
}

/// 64 KiB Writes from the bench's page-aligned buffers: most payload bytes go out straight
/// from registered memory, and some first FPDUs of a write (16 bytes into it, a slow distance
/// from their page-aligned source for the kernel's copy) are copied instead; with
/// `--zero-copy off` every payload is copied as framed, so none counts as either.
#[test]
fn bench_counts_payloads_moved_off_a_slow_copy_distance() {
    let run = |zero_copy: &str| {
        let o = iwarp(&[
            "bench",
            "--ops",
            "write",
            "--sizes",
            "64k",
            "--iters",
            "200",
            "--crc",
            "off",
            "--zero-copy",
            zero_copy,
            "--json",
            "--quiet",
        ]);
        assert!(o.status.success(), "{}", stderr(&o));
        let v: serde_json::Value = serde_json::from_slice(&o.stdout).unwrap();
        let c = &v["config"];
        (
            c["tx_bytes"].as_u64().unwrap(),
            c["tx_by_ref_bytes"].as_u64().unwrap(),
            c["tx_moved_bytes"].as_u64().unwrap(),
        )
    };
    let (bytes, by_ref, moved) = run("on");
    assert!(moved > 0 && by_ref > moved, "{bytes} bytes, {by_ref} by reference, {moved} moved");
    assert!(by_ref + moved <= bytes, "{bytes} bytes, {by_ref} by reference, {moved} moved");
    let (bytes, by_ref, moved) = run("off");
    assert!(bytes > 0 && by_ref == 0 && moved == 0, "{bytes} bytes, {by_ref} by reference, {moved} moved");
}
