//! Debian's unmodified rdma-core programs with both ends on the drop-in libraries, over
//! 127.0.0.1: rping (rdmacm-utils 44), perftest 4.5's `ib_write_bw`, `ib_read_bw` and
//! `ib_send_bw` with `-R`, and libfabric 1.17's verbs provider (libfabric-bin's `fi_info` and
//! `fi_pingpong`, over `verbs;ofi_rxm` and plain `verbs` message endpoints), and Open MPI 4.1
//! running the project's MPI ping-pong (tests/mpi/pingpong.c) with its ofi MTL on
//! `verbs;ofi_rxm`. Every process is bounded in time and killed by its PID when over.
//! (The runs against `iwarp rping` / `iwarp perftest` and against Linux siw are in
//! scripts/verbs-abi-test.sh and tests/interop/run-verbs-abi.sh.)

#![allow(clippy::unwrap_used, clippy::expect_used, reason = "test code panics on failure")]

mod common;

use std::path::Path;
use std::process::{Command, Output};
use std::time::Duration;

use common::*;

const LIMIT: Duration = Duration::from_secs(60);

fn installed(programs: &[&str], package: &str) -> bool {
    let missing: Vec<&&str> = programs.iter().filter(|p| !have(p)).collect();
    if missing.is_empty() {
        return true;
    }
    skip(&format!("{missing:?} ({package})"));
    false
}

/// rping's server and client on the drop-in: `count` pings of `size` bytes, validated.
fn rping(size: u32, count: u32) {
    if !installed(&["rping"], "rdmacm-utils") {
        return;
    }
    let port = free_port().to_string();
    let mut s = dropin("rping");
    s.args(["-s", "-a", "127.0.0.1", "-p", &port, "-S", &size.to_string()]);
    let server = spawn(s);
    assert!(wait_listening(port.parse().unwrap(), LIMIT), "rping's server did not listen on {port}");
    let mut c = dropin("rping");
    c.args([
        "-c",
        "-a",
        "127.0.0.1",
        "-p",
        &port,
        "-C",
        &count.to_string(),
        "-V",
        "-v",
        "-S",
        &size.to_string(),
    ]);
    let client = wait_bounded(spawn(c), LIMIT, "rping -c");
    let server = wait_bounded(server, LIMIT, "rping -s");
    assert!(client.status.success(), "client: {}", show(&client));
    assert!(server.status.success(), "server: {}", show(&server));
    let pings = String::from_utf8_lossy(&client.stdout)
        .lines()
        .filter(|l| l.starts_with("ping data: rdma-ping-"))
        .count();
    assert_eq!(pings, count as usize, "client: {}", show(&client));
    // The server ends on the client's disconnect, as with rdma-core.
    assert!(String::from_utf8_lossy(&server.stderr).contains("server DISCONNECT EVENT"), "{}", show(&server));
}

#[test]
fn rping_100_pings_of_1024_bytes() {
    rping(1024, 100);
}

#[test]
fn rping_pings_of_65535_bytes() {
    // rping's largest size: its check refuses 65536 ("valid range is 23 to 65536" notwithstanding).
    rping(65535, 20);
}

#[test]
fn rping_refuses_65536_bytes_before_touching_the_device() {
    if !installed(&["rping"], "rdmacm-utils") {
        return;
    }
    let mut c = dropin("rping");
    c.args(["-c", "-a", "127.0.0.1", "-S", "65536", "-C", "1"]);
    let out = wait_bounded(spawn(c), LIMIT, "rping -S 65536");
    assert_eq!(out.status.code(), Some(22), "{}", show(&out));
}

/// Starts `server`, waits until it listens on `port`, runs `client`, and requires both to
/// exit 0 (`what` names them in the failure). A server whose client failed may wait for it
/// forever: it gets a short while. Their outputs, client's first.
fn server_and_client(what: &str, server: Command, port: &str, client: Command) -> (Output, Output) {
    server_and_client_with(what, server, port, client, |_| {})
}

/// [`server_and_client`], with `listening` called with the server's PID once it listens,
/// before the client starts.
fn server_and_client_with(
    what: &str,
    server: Command,
    port: &str,
    client: Command,
    listening: impl FnOnce(u32),
) -> (Output, Output) {
    let server = spawn(server);
    assert!(wait_listening(port.parse().unwrap(), LIMIT), "{what}: the server did not listen on {port}");
    listening(server.child.id());
    let (client, client_killed) = wait_or_kill(spawn(client), LIMIT);
    let (server, server_killed) =
        wait_or_kill(server, if client.status.success() { LIMIT } else { Duration::from_secs(5) });
    assert!(
        client.status.success() && server.status.success(),
        "{what}: client{}: {}\nserver{}: {}",
        if client_killed { " (killed)" } else { "" },
        show(&client),
        if server_killed { " (killed)" } else { "" },
        show(&server)
    );
    (client, server)
}

/// One perftest bandwidth test, server and client on the drop-in.
fn perftest(tool: &str) {
    if !installed(&[tool], "perftest") {
        return;
    }
    let port = free_port().to_string();
    let args = ["-R", "-F", "-p", &port, "-s", "65536", "-n", "200"];
    let mut s = dropin(tool);
    s.args(args);
    let mut c = dropin(tool);
    c.args(args).arg("127.0.0.1");
    let (client, server) = server_and_client(tool, s, &port, c);
    // perftest turns cycles into time with a frequency it measures first; on a loaded machine
    // that measurement can fail ("Correlation coefficient r^2: ... < 0.9" on stderr), and the
    // side where it failed reports every figure as 0 for a run that moved its 200 messages:
    // nothing about the stack. The Write and Read servers print the client's figures, sent
    // over at the end, so a client's failed measurement shows as zeros on both sides.
    let uncalibrated = [&client, &server]
        .iter()
        .any(|o| String::from_utf8_lossy(&o.stderr).contains("Correlation coefficient"));
    for out in [&client, &server] {
        let text = String::from_utf8_lossy(&out.stdout);
        assert!(text.contains("Transport type : IW") && text.contains("Device         : iwarp0"), "{text}");
        assert!(text.contains("ibv_wr* API     : OFF"), "perftest must take the classic post path: {text}");
        let row =
            text.lines().find(|l| l.trim_start().starts_with("65536")).unwrap_or_else(|| panic!("{text}"));
        let fields: Vec<&str> = row.split_whitespace().collect();
        assert_eq!(fields.get(1), Some(&"200"), "iterations: {row}");
        let avg: f64 = fields.get(3).and_then(|f| f.parse().ok()).unwrap_or(0.0);
        assert!(avg > 0.0 || uncalibrated, "bandwidth: {row}\n{}", show(out));
    }
}

#[test]
fn ib_write_bw_both_ends_on_the_dropin() {
    perftest("ib_write_bw");
}

#[test]
fn ib_read_bw_both_ends_on_the_dropin() {
    perftest("ib_read_bw");
}

#[test]
fn ib_send_bw_both_ends_on_the_dropin() {
    perftest("ib_send_bw");
}

/// `fi_info` (libfabric-bin) on the drop-in: the verbs provider finds the device, as a
/// message endpoint over iWARP and, with the rxm utility provider on top, as a reliable
/// datagram endpoint (what MPI's ofi layers use).
#[test]
fn fi_info_lists_the_device_for_verbs_and_ofi_rxm() {
    if !installed(&["fi_info"], "libfabric-bin") {
        return;
    }
    let mut c = dropin("fi_info");
    c.args(["-p", "verbs"]);
    let out = wait_bounded(spawn(c), LIMIT, "fi_info -p verbs");
    assert!(out.status.success(), "{}", show(&out));
    let text = String::from_utf8_lossy(&out.stdout);
    for want in ["provider: verbs", "domain: iwarp0", "type: FI_EP_MSG", "protocol: FI_PROTO_IWARP"] {
        assert!(text.contains(want), "no {want:?}: {}", show(&out));
    }
    let mut c = dropin("fi_info");
    c.args(["-p", "verbs;ofi_rxm", "-t", "FI_EP_RDM"]);
    let out = wait_bounded(spawn(c), LIMIT, "fi_info -p verbs;ofi_rxm");
    assert!(out.status.success(), "{}", show(&out));
    let text = String::from_utf8_lossy(&out.stdout);
    for want in ["provider: verbs;ofi_rxm", "domain: iwarp0", "type: FI_EP_RDM"] {
        assert!(text.contains(want), "no {want:?}: {}", show(&out));
    }
}

/// `fi_pingpong` server and client on the drop-in with libfabric's provider `provider` and
/// endpoint type `ep`: every default size (64 B to 1 MiB: eager sends, rxm's segmented and
/// its rendezvous protocol, which RDMA-Reads the sender's buffer), `iters` round trips
/// each, every message checked by the receiver (`-c`).
fn fi_pingpong(provider: &str, ep: &str, iters: u32) {
    if !installed(&["fi_pingpong"], "libfabric-bin") {
        return;
    }
    let port = free_port().to_string();
    let args = ["-p", provider, "-e", ep, "-I", &iters.to_string(), "-c"];
    let mut s = dropin("fi_pingpong");
    s.args(args).args(["-B", &port]);
    let mut c = dropin("fi_pingpong");
    c.args(args).args(["-P", &port, "127.0.0.1"]);
    let (client, server) = server_and_client(&format!("fi_pingpong -p {provider} -e {ep}"), s, &port, c);
    // fi_pingpong's counts: "#sent" and "#ack" (the latter with "=" when all came back).
    let count = if iters >= 1000 { format!("{}k", iters / 1000) } else { iters.to_string() };
    let ack = format!("={count}");
    for out in [&client, &server] {
        let text = String::from_utf8_lossy(&out.stdout);
        assert!(!text.contains("Error at iteration"), "a message arrived corrupted: {}", show(out));
        for size in ["64", "256", "1k", "4k", "64k", "1m"] {
            let row = text
                .lines()
                .find(|l| l.split_whitespace().next() == Some(size))
                .unwrap_or_else(|| panic!("no row for {size}: {}", show(out)));
            let f: Vec<&str> = row.split_whitespace().collect();
            assert_eq!((f.get(1), f.get(2)), (Some(&count.as_str()), Some(&ack.as_str())), "{row}");
        }
    }
}

#[test]
fn fi_pingpong_rdm_over_verbs_ofi_rxm() {
    fi_pingpong("verbs;ofi_rxm", "rdm", 200);
}

#[test]
fn fi_pingpong_msg_over_verbs() {
    fi_pingpong("verbs", "msg", 200);
}

/// Open MPI 4.1 (openmpi-bin, libopenmpi-dev; Debian's build has the ofi MTL): the project's
/// two-rank ping-pong, tests/mpi/pingpong.c, with the ofi MTL forced onto libfabric's
/// `verbs;ofi_rxm` over the drop-in: 1 B to 1 MiB, every message checked by its receiver,
/// and both ranks on the device (`mtl:ofi:provider: iwarp0`).
#[test]
fn mpi_pingpong_over_the_ofi_mtl_on_verbs_ofi_rxm() {
    if !installed(&["mpicc", "mpirun", "fi_info"], "libopenmpi-dev, openmpi-bin, libfabric-bin") {
        return;
    }
    let dir = scratch_dir("mpi");
    let exe = dir.join("pingpong");
    let src = Path::new(env!("CARGO_MANIFEST_DIR")).join("..").join("tests/mpi/pingpong.c");
    let out =
        Command::new("mpicc").args(["-O2", "-Wall", "-Werror", "-o"]).arg(&exe).arg(&src).output().unwrap();
    assert!(out.status.success(), "mpicc: {}", show(&out));
    let mut c = Command::new("mpirun");
    c.args(["--allow-run-as-root", "-np", "2", "--host", "localhost:2", "--bind-to", "none"])
        .args(dropin_env().into_iter().flat_map(|(k, v)| ["-x".to_string(), format!("{k}={v}")]))
        .args([
            "--mca",
            "pml",
            "cm",
            "--mca",
            "mtl",
            "ofi",
            "--mca",
            "mtl_ofi_provider_include",
            "verbs;ofi_rxm",
        ])
        .args(["--mca", "mtl_base_verbose", "100"])
        .arg(&exe)
        .args(["1048576", "50"])
        .env_remove("IWARP_PCAP");
    let out = wait_bounded(spawn(c), Duration::from_secs(120), "mpirun pingpong");
    assert!(out.status.success(), "{}", show(&out));
    let all = format!("{}{}", String::from_utf8_lossy(&out.stdout), String::from_utf8_lossy(&out.stderr));
    assert_eq!(
        all.matches("mtl:ofi:provider: iwarp0").count(),
        2,
        "both ranks on the drop-in: {}",
        show(&out)
    );
    let rows = all
        .lines()
        .filter(|l| {
            let f: Vec<&str> = l.split_whitespace().collect();
            f.len() == 4 && f[0].parse::<u64>().is_ok_and(|n| n.is_power_of_two()) && f[1] == "50"
        })
        .count();
    assert_eq!(rows, 21, "one row per size, 1 B to 1 MiB: {}", show(&out));
    // 21 sizes, 5 warm-up and 50 timed round trips each, a message checked on either rank.
    assert!(all.contains("pingpong: OK, 2310 messages checked"), "{}", show(&out));
}

/// Debian's `rstream` (rdmacm-utils 44) with both ends on the drop-in's rsockets: `count`
/// transfers of `size` bytes each way, every transfer checked by rstream itself (`-T v`:
/// a mismatch makes it exit non-zero), with the extra test options `opts` (`-T a`: rpoll
/// before each call; `-T n`: non-blocking calls; `-T b`: MSG_WAITALL).
fn rstream(size: &str, count: &str, opts: &[&str]) {
    if !installed(&["rstream"], "rdmacm-utils") {
        return;
    }
    let port = free_port().to_string();
    let mut args = vec!["-p", &port, "-T", "v", "-S", size, "-C", count];
    for o in opts {
        args.extend(["-T", o]);
    }
    let mut s = dropin("rstream");
    s.args(&args);
    let mut c = dropin("rstream");
    c.args(["-s", "127.0.0.1"]).args(&args);
    let (client, server) = server_and_client("rstream", s, &port, c);
    for out in [&client, &server] {
        let text = String::from_utf8_lossy(&out.stdout);
        let row = text.lines().find(|l| l.starts_with("custom")).unwrap_or_else(|| panic!("{}", show(out)));
        let fields: Vec<&str> = row.split_whitespace().collect();
        assert_eq!(fields.get(2).copied(), Some(count), "transfers: {row}");
        assert!(!String::from_utf8_lossy(&out.stderr).contains("mismatch"), "{}", show(out));
    }
}

#[test]
fn rstream_verified_64_bytes() {
    rstream("64", "500", &[]);
}

#[test]
fn rstream_verified_1_mib_through_the_rings() {
    // Larger than the default ring (128 KiB): every transfer wraps the rings and needs the
    // receiver's credit and buffer grants.
    rstream("1048576", "20", &[]);
}

#[test]
fn rstream_verified_async_with_rpoll() {
    rstream("65536", "200", &["a"]);
}

#[test]
fn rstream_verified_nonblocking() {
    rstream("4096", "500", &["n"]);
}

#[test]
fn rstream_verified_blocking_waitall() {
    rstream("100000", "50", &["b"]);
}

/// An unmodified TCP program through rdma-core's librspreload.so on the drop-in: netcat
/// (the traditional one: librspreload interposes `accept`, which it calls, not `accept4`)
/// sends 2 MB of pseudo-random bytes; the receiving netcat's output must be the same bytes,
/// and the drop-in must have carried the connection (its rdma_cm log shows it).
#[test]
fn netcat_through_librspreload() {
    let preload = Path::new("/usr/lib/x86_64-linux-gnu/rsocket/librspreload.so");
    if !installed(&["nc.traditional"], "netcat-traditional") {
        return;
    }
    if !preload.exists() {
        skip("librspreload.so (librdmacm1)");
        return;
    }
    let dir = std::env::temp_dir().join(format!("iwarp-rspreload-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let input = dir.join("in.bin");
    let mut x: u64 = 0x9E37_79B9_7F4A_7C15;
    let data: Vec<u8> = (0..2_000_000)
        .map(|_| {
            x ^= x << 13;
            x ^= x >> 7;
            x ^= x << 17;
            x.to_le_bytes()[0]
        })
        .collect();
    std::fs::write(&input, &data).unwrap();
    // The open file outlives its name: removing the directory now leaves nothing behind in
    // the temporary directory, even if an assertion below fails.
    let stdin = std::fs::File::open(&input).unwrap();
    let _ = std::fs::remove_dir_all(&dir);
    let port = free_port().to_string();
    // Under AddressSanitizer the sanitizer's runtime must stay first in the preload list.
    let preload = match dropin_env().into_iter().find(|(k, _)| k == "LD_PRELOAD") {
        Some((_, runtime)) => format!("{runtime} {}", preload.display()),
        None => preload.display().to_string(),
    };
    let mut s = dropin("nc.traditional");
    s.env("LD_PRELOAD", &preload).env("IWARP_LOG", "iwarp_verbs_abi::cm=debug").args(["-l", "-p", &port]);
    let mut c = dropin("nc.traditional");
    c.env("LD_PRELOAD", &preload).args(["-q", "0", "127.0.0.1", &port]).stdin(stdin);
    let (_client, server) = server_and_client_with("nc.traditional", s, &port, c, |pid| {
        // netcat-traditional takes no descriptor above 16 (its source sets FD_SETSIZE to 16)
        // and exits with status 1, silently, when its accepted socket gets one. That socket
        // takes the lowest free number after those the drop-in and librspreload opened, so
        // they must leave room: with rdma-core's rsockets the socket gets about 8. The
        // highest descriptor while the server waits in accept (librspreload's for the
        // socket to come) is checked once the table has settled.
        let table = || -> Vec<i32> {
            let mut fds: Vec<i32> = std::fs::read_dir(format!("/proc/{pid}/fd"))
                .map(|d| d.flatten().filter_map(|e| e.file_name().to_str()?.parse().ok()).collect())
                .unwrap_or_default();
            // Above 64: inherited from the test harness, not the program's own.
            fds.retain(|&fd| fd < 64);
            fds.sort_unstable();
            fds
        };
        let mut last = table();
        for _ in 0..40 {
            std::thread::sleep(Duration::from_millis(50));
            let now = table();
            if now == last {
                break;
            }
            last = now;
        }
        let highest = last.last().copied().unwrap_or(0);
        assert!(
            highest <= 13,
            "netcat's accepted socket would get descriptor {highest} or more (16 at most works): {last:?}"
        );
    });
    assert_eq!(server.stdout.len(), data.len(), "bytes received");
    assert!(server.stdout == data, "the received bytes differ from those sent");
    assert!(
        String::from_utf8_lossy(&server.stderr).contains("RDMA_CM_EVENT_CONNECT_REQUEST"),
        "the connection did not go through the drop-in: {}",
        show(&server)
    );
}
