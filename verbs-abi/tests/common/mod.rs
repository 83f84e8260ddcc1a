//! What the drop-in's tests share: the staged library directory (the crate's cdylib as
//! libibverbs.so.1 beside the build script's librdmacm.so.1 and provider stubs), tools that
//! may be missing (then the test is skipped with a message, or fails under
//! `IWARP_REQUIRE_ALL=1`, as scripts/test.sh sets), and bounded child processes.
#![allow(dead_code, reason = "each test file uses part of the helpers")]

use std::io::Read;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Output, Stdio};
use std::sync::OnceLock;
use std::time::{Duration, Instant};

/// Whether missing tools fail the test instead of skipping it.
pub(crate) fn require_all() -> bool {
    std::env::var("IWARP_REQUIRE_ALL").is_ok_and(|v| v == "1")
}

/// Skips the test (or fails it under IWARP_REQUIRE_ALL=1) when `what` is missing.
pub(crate) fn skip(what: &str) {
    if require_all() {
        panic!("needed for this test: {what} (IWARP_REQUIRE_ALL=1)");
    }
    eprintln!("SKIPPED: needs {what}");
}

/// Whether `cmd` runs (is installed).
pub(crate) fn have(cmd: &str) -> bool {
    Command::new("sh").args(["-c", &format!("command -v {cmd}")]).output().is_ok_and(|o| o.status.success())
}

/// Whether the rdma-core development headers are installed.
pub(crate) fn have_headers() -> bool {
    Path::new("/usr/include/infiniband/verbs.h").exists()
        && Path::new("/usr/include/rdma/rdma_cma.h").exists()
}

/// A scratch directory of this test process, `PREFIX-PID` in cargo's directory for test
/// data (target/tmp). Test processes cannot remove theirs as they exit (nextest runs each test
/// in a process of its own, which ends without running destructors of statics), so each new
/// one removes the `PREFIX-*` directories of processes that no longer run: what piles up is
/// bounded by the processes alive, not by every run there ever was (about 900 directories
/// had gathered in one working copy).
pub(crate) fn scratch_dir(prefix: &str) -> PathBuf {
    let base = PathBuf::from(env!("CARGO_TARGET_TMPDIR"));
    if let Ok(entries) = std::fs::read_dir(&base) {
        for entry in entries.flatten() {
            let name = entry.file_name();
            let stale = name
                .to_str()
                .and_then(|n| n.strip_prefix(prefix)?.strip_prefix('-')?.parse::<u32>().ok())
                .is_some_and(|pid| pid != std::process::id() && !Path::new(&format!("/proc/{pid}")).exists());
            if stale {
                let _ = std::fs::remove_dir_all(entry.path());
            }
        }
    }
    let dir = base.join(format!("{prefix}-{}", std::process::id()));
    std::fs::create_dir_all(&dir).expect("create a scratch directory");
    dir
}

/// The directory holding the drop-in libraries: symbolic links to the crate's cdylib (as
/// libibverbs.so.1) and to the build script's librdmacm.so.1 and provider stubs, made once per
/// test process (nextest runs tests of one binary in parallel processes).
pub(crate) fn libdir() -> &'static Path {
    static DIR: OnceLock<PathBuf> = OnceLock::new();
    DIR.get_or_init(|| {
        let exe = std::env::current_exe().expect("test executable");
        let deps = exe.parent().expect("deps directory");
        let cdylib = deps.join("libiwarp_verbs_abi.so");
        assert!(cdylib.exists(), "{} not built", cdylib.display());
        let built = PathBuf::from(env!("IWARP_VERBS_ABI_LIBS"));
        let dir = scratch_dir("verbs-abi");
        // Links left by an earlier process of the same number.
        for entry in std::fs::read_dir(&dir).into_iter().flatten().flatten() {
            let _ = std::fs::remove_file(entry.path());
        }
        let link = |from: &Path, name: &str| {
            std::os::unix::fs::symlink(from, dir.join(name)).expect("link a library");
        };
        link(&cdylib, "libibverbs.so.1");
        link(&cdylib, "libibverbs.so");
        for lib in ["librdmacm.so.1", "libmlx5.so.1", "libefa.so.1"] {
            link(&built.join(lib), lib);
        }
        link(&built.join("librdmacm.so.1"), "librdmacm.so");
        dir
    })
}

/// A command running on the drop-in libraries.
///
/// Under AddressSanitizer (scripts/asan.sh builds the crate with `-Zsanitizer=address`), the
/// programs are not instrumented themselves, so the sanitizer's runtime named by
/// `IWARP_VERBS_ABI_PRELOAD` is preloaded into them; the instrumented library then reports
/// any bad access of its own and stops the program. Leak checking is off there: it would
/// judge the programs' own allocations (perftest frees little before it exits).
pub(crate) fn dropin(program: &str) -> Command {
    let mut c = Command::new(program);
    c.envs(dropin_env()).env_remove("IWARP_PCAP");
    c
}

/// The environment a program needs to run on the drop-in (see [`dropin`]), for launchers
/// that pass it on themselves (mpirun's `-x NAME=VALUE`).
pub(crate) fn dropin_env() -> Vec<(String, String)> {
    let mut env = vec![("LD_LIBRARY_PATH".to_string(), libdir().display().to_string())];
    if let Some(runtime) = std::env::var_os("IWARP_VERBS_ABI_PRELOAD") {
        env.push(("LD_PRELOAD".to_string(), runtime.to_string_lossy().into_owned()));
        env.push(("ASAN_OPTIONS".to_string(), "detect_leaks=0:halt_on_error=1:exitcode=86".to_string()));
    }
    env
}

/// A child process whose output is read as it comes (a full pipe would stall it).
pub(crate) struct Running {
    pub(crate) child: Child,
    out: std::thread::JoinHandle<Vec<u8>>,
    err: std::thread::JoinHandle<Vec<u8>>,
}

fn drain(r: Option<impl Read + Send + 'static>) -> std::thread::JoinHandle<Vec<u8>> {
    std::thread::spawn(move || {
        let mut buf = Vec::new();
        if let Some(mut r) = r {
            let _ = r.read_to_end(&mut buf);
        }
        buf
    })
}

/// Starts `cmd` with its output captured.
pub(crate) fn spawn(mut cmd: Command) -> Running {
    let mut child = cmd.stdout(Stdio::piped()).stderr(Stdio::piped()).spawn().expect("spawn");
    let out = drain(child.stdout.take());
    let err = drain(child.stderr.take());
    Running { child, out, err }
}

/// Waits for `r` at most `limit`; kills it (by its PID) when over and says so.
pub(crate) fn wait_or_kill(mut r: Running, limit: Duration) -> (Output, bool) {
    let deadline = Instant::now() + limit;
    let (status, killed) = loop {
        match r.child.try_wait().expect("wait") {
            Some(status) => break (status, false),
            None if Instant::now() >= deadline => {
                let _ = r.child.kill();
                break (r.child.wait().expect("wait"), true);
            }
            None => std::thread::sleep(Duration::from_millis(20)),
        }
    };
    (
        Output { status, stdout: r.out.join().unwrap_or_default(), stderr: r.err.join().unwrap_or_default() },
        killed,
    )
}

/// Waits for `r` at most `limit`; kills it (by its PID) and fails when over.
pub(crate) fn wait_bounded(r: Running, limit: Duration, what: &str) -> Output {
    let (out, killed) = wait_or_kill(r, limit);
    assert!(!killed, "{what}: still running after {limit:?}; killed\n{}", show(&out));
    out
}

/// A free TCP port on 127.0.0.1 (bound and released; a race with other tests is unlikely).
pub(crate) fn free_port() -> u16 {
    std::net::TcpListener::bind("127.0.0.1:0").and_then(|l| l.local_addr()).map(|a| a.port()).expect("a port")
}

/// Waits (up to `limit`) until a TCP socket listens on `port` (/proc/net/tcp and tcp6 show
/// it in state LISTEN), so a client never races its server's start; false if none came.
pub(crate) fn wait_listening(port: u16, limit: Duration) -> bool {
    let needle = format!(":{port:04X} ");
    let deadline = Instant::now() + limit;
    loop {
        for table in ["/proc/net/tcp", "/proc/net/tcp6"] {
            let text = std::fs::read_to_string(table).unwrap_or_default();
            let listening = text.lines().skip(1).any(|l| {
                let f: Vec<&str> = l.split_whitespace().collect();
                f.len() > 3 && format!("{} ", f[1]).ends_with(&needle) && f[3] == "0A"
            });
            if listening {
                return true;
            }
        }
        if Instant::now() >= deadline {
            return false;
        }
        std::thread::sleep(Duration::from_millis(20));
    }
}

/// Describes an output for an assertion message.
pub(crate) fn show(o: &Output) -> String {
    format!(
        "status {:?}\nstdout:\n{}\nstderr:\n{}",
        o.status,
        String::from_utf8_lossy(&o.stdout),
        String::from_utf8_lossy(&o.stderr)
    )
}
