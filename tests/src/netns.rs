//! Network namespaces for tests that need real devices (veth pairs, TAP, raw sockets): each
//! outer test creates a namespace (deleted, with every interface in it, whatever happens) and
//! runs its body in a child process inside it (`ip netns exec NS <this binary> --exact
//! inner_... --ignored`), so every frame stays inside the namespace. Setting up fails the test
//! with a message saying what is missing (root, iproute2); it never skips. Every wait is bounded.

use std::io::Read as _;
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

/// Runs `cmd`, failing the test with `what` and the command's error output if it fails.
pub fn run_checked(what: &str, cmd: &mut Command) {
    let out = match cmd.output() {
        Ok(out) => out,
        Err(err) => panic!("{what}: cannot run {cmd:?}: {err} (is iproute2 installed?)"),
    };
    assert!(
        out.status.success(),
        "{what}: {cmd:?} failed ({}): {} (these tests need root: network namespaces, veth, TAP, raw sockets)",
        out.status,
        String::from_utf8_lossy(&out.stderr).trim()
    );
}

/// Whether this process may make network namespaces, veth pairs, TAP devices and raw
/// sockets (it runs as root). When it may not, a test that needs them is skipped with a line
/// naming it and why, unless `IWARP_REQUIRE_ALL` is set (scripts/test.sh sets it): then the
/// test fails, so the full test command never passes without them.
pub fn privileged(test: &str) -> bool {
    let root = std::fs::read_to_string("/proc/self/status")
        .ok()
        .and_then(|s| {
            let line = s.lines().find(|l| l.starts_with("Uid:"))?.to_owned();
            // Real, effective, saved, filesystem: the effective one decides.
            line.split_whitespace().nth(2).map(|euid| euid == "0")
        })
        .unwrap_or(false);
    if root {
        return true;
    }
    let why = "needs root (network namespaces, veth pairs, TAP devices, raw sockets)";
    if std::env::var_os("IWARP_REQUIRE_ALL").is_some() {
        panic!("{test} {why}, and IWARP_REQUIRE_ALL is set");
    }
    // Straight to the process's stderr, past the test harness's output capture, so the skip
    // shows in a plain `cargo test` run.
    use std::io::Write as _;
    let _ = writeln!(std::io::stderr(), "skipped: {test} {why}; scripts/test.sh runs it as root");
    false
}

/// A network namespace, deleted (with every interface in it) on drop.
#[derive(Debug)]
pub struct Netns {
    /// The namespace's name (`PREFIX-TAG-PID`).
    pub name: String,
    /// The environment variable that tells the child it runs inside the namespace.
    env: &'static str,
    /// How long the child may run.
    timeout: Duration,
}

impl Netns {
    /// Creates `PREFIX-TAG-PID` with loopback up and IPv6 off (no autoconfiguration frames).
    /// The child run by [`Netns::run_inner`] finds `env` set; it may run for `timeout`.
    pub fn new(prefix: &str, tag: &str, env: &'static str, timeout: Duration) -> Netns {
        let name = format!("{prefix}-{tag}-{}", std::process::id());
        run_checked("creating a network namespace", Command::new("ip").args(["netns", "add", &name]));
        let ns = Netns { name, env, timeout };
        ns.ip(&["link", "set", "lo", "up"]);
        for key in ["all", "default"] {
            let sysctl = format!("net.ipv6.conf.{key}.disable_ipv6=1");
            let _ = Command::new("ip").args(["netns", "exec", &ns.name, "sysctl", "-qw", &sysctl]).output();
        }
        ns
    }

    /// `ip -n NS ARGS`.
    pub fn ip(&self, args: &[&str]) {
        run_checked(
            "configuring the test namespace",
            Command::new("ip").arg("-n").arg(&self.name).args(args),
        );
    }

    /// A veth pair `va`/`vb`, both up, no IP addresses on the kernel side.
    pub fn veth(&self) {
        self.ip(&["link", "add", "name", "va", "type", "veth", "peer", "name", "vb"]);
        self.ip(&["link", "set", "va", "up"]);
        self.ip(&["link", "set", "vb", "up"]);
    }

    /// Runs the `#[ignore]`d test `inner` of this test binary inside the namespace; fails if
    /// it fails or runs past the namespace's timeout (the child is then killed).
    pub fn run_inner(&self, inner: &str) {
        let exe = match std::env::current_exe() {
            Ok(exe) => exe,
            Err(err) => panic!("cannot find the test binary: {err}"),
        };
        let mut child = Command::new("ip")
            .args(["netns", "exec", &self.name])
            .arg(exe)
            .args(["--exact", inner, "--ignored", "--nocapture", "--test-threads=1"])
            .env(self.env, &self.name)
            .stdout(Stdio::piped())
            .stderr(Stdio::piped())
            .spawn()
            .unwrap_or_else(|err| panic!("cannot run the test in namespace {}: {err}", self.name));
        let pipes = (child.stdout.take(), child.stderr.take());
        let out_thread = std::thread::spawn(move || {
            let mut s = String::new();
            if let Some(mut p) = pipes.0 {
                let _ = p.read_to_string(&mut s);
            }
            s
        });
        let err_thread = std::thread::spawn(move || {
            let mut s = String::new();
            if let Some(mut p) = pipes.1 {
                let _ = p.read_to_string(&mut s);
            }
            s
        });
        let deadline = Instant::now() + self.timeout;
        let status = loop {
            if let Ok(Some(status)) = child.try_wait() {
                break Some(status);
            }
            if Instant::now() > deadline {
                let _ = child.kill();
                let _ = child.wait();
                break None;
            }
            std::thread::sleep(Duration::from_millis(20));
        };
        let out = out_thread.join().unwrap_or_default();
        let err = err_thread.join().unwrap_or_default();
        print!("{out}");
        eprint!("{err}");
        match status {
            Some(status) => assert!(
                status.success() && out.contains("1 passed"),
                "{inner} failed in namespace {} ({status})",
                self.name
            ),
            None => panic!("{inner} ran past {:?} in namespace {}", self.timeout, self.name),
        }
    }
}

impl Drop for Netns {
    fn drop(&mut self) {
        let _ = Command::new("ip").args(["netns", "del", &self.name]).output();
    }
}

/// Whether this process is the child inside a namespace (`env` set). Outside, an inner test
/// has nothing to do and says so.
pub fn inside(env: &str) -> bool {
    if std::env::var_os(env).is_some() {
        true
    } else {
        eprintln!("(runs inside a namespace started by its outer test; nothing to do here)");
        false
    }
}
