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
pub fn require_all() -> bool {
    std::env::var("IWARP_REQUIRE_ALL").is_ok_and(|v| v == "1")
}

/// Skips the test (or fails it under IWARP_REQUIRE_ALL=1) when `what` is missing.
pub fn skip(what: &str) {
    if require_all() {
        panic!("needed for this test: {what} (IWARP_REQUIRE_ALL=1)");
    }
    eprintln!("SKIPPED: needs {what}");
}

/// Whether `cmd` runs (is installed).
pub fn have(cmd: &str) -> bool {
    Command::new("sh").args(["-c", &format!("command -v {cmd}")]).output().is_ok_and(|o| o.status.success())
}

/// Whether the rdma-core development headers are installed.
pub fn have_headers() -> bool {
    Path::new("/usr/include/infiniband/verbs.h").exists() && Path::new("/usr/include/rdma/rdma_cma.h").exists()
}

/// The directory holding the drop-in libraries: symbolic links to the crate's cdylib (as
/// libibverbs.so.1) and to the build script's librdmacm.so.1 and provider stubs, made once per
/// test process (nextest runs tests of one binary in parallel processes).
pub fn libdir() -> &'static Path {
    static DIR: OnceLock<PathBuf> = OnceLock::new();
    DIR.get_or_init(|| {
        let exe = std::env::current_exe().expect("test executable");
        let deps = exe.parent().expect("deps directory");
        let cdylib = deps.join("libiwarp_verbs_abi.so");
        assert!(cdylib.exists(), "{} not built", cdylib.display());
        let built = PathBuf::from(env!("IWARP_VERBS_ABI_LIBS"));
        let dir = PathBuf::from(env!("CARGO_TARGET_TMPDIR")).join(format!("verbs-abi-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&dir);
        std::fs::create_dir_all(&dir).expect("create the library directory");
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
pub fn dropin(program: &str) -> Command {
    let mut c = Command::new(program);
    c.env("LD_LIBRARY_PATH", libdir()).env_remove("IWARP_PCAP");
    c
}

/// Waits for `child` at most `limit`; kills it (by its PID) when over.
pub fn wait_bounded(mut child: Child, limit: Duration, what: &str) -> Output {
    let deadline = Instant::now() + limit;
    loop {
        match child.try_wait().expect("wait") {
            Some(_) => break,
            None if Instant::now() >= deadline => {
                let _ = child.kill();
                let out = collect(child);
                panic!(
                    "{what}: still running after {limit:?}; killed\nstdout:\n{}\nstderr:\n{}",
                    String::from_utf8_lossy(&out.stdout),
                    String::from_utf8_lossy(&out.stderr)
                );
            }
            None => std::thread::sleep(Duration::from_millis(20)),
        }
    }
    collect(child)
}

fn collect(mut child: Child) -> Output {
    let status = child.wait().expect("wait");
    let mut stdout = Vec::new();
    let mut stderr = Vec::new();
    if let Some(mut o) = child.stdout.take() {
        let _ = o.read_to_end(&mut stdout);
    }
    if let Some(mut e) = child.stderr.take() {
        let _ = e.read_to_end(&mut stderr);
    }
    Output { status, stdout, stderr }
}

/// Starts `cmd` with its output captured.
pub fn spawn(mut cmd: Command) -> Child {
    cmd.stdout(Stdio::piped()).stderr(Stdio::piped()).spawn().expect("spawn")
}

/// A free TCP port on 127.0.0.1 (bound and released; a race with other tests is unlikely).
pub fn free_port() -> u16 {
    std::net::TcpListener::bind("127.0.0.1:0").and_then(|l| l.local_addr()).map(|a| a.port()).expect("a port")
}

/// Describes an output for an assertion message.
pub fn show(o: &Output) -> String {
    format!(
        "status {:?}\nstdout:\n{}\nstderr:\n{}",
        o.status,
        String::from_utf8_lossy(&o.stdout),
        String::from_utf8_lossy(&o.stderr)
    )
}
