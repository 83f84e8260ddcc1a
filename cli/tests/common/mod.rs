//! Helpers of the `iwarp` command's tests: running the binary, reading its output, the
//! siw captures, an `iwarp rping -s` child, and a namespace with a veth pair for the smoltcp
//! transport.
#![allow(dead_code, unreachable_pub, reason = "each test file uses some of the helpers")]

use std::io::{BufRead, BufReader, Read};
use std::net::TcpListener;
use std::process::{Child, ExitStatus, Stdio};
use std::sync::mpsc;
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

use iwarp_tests::netns::Netns;

use std::path::{Path, PathBuf};
use std::process::{Command, Output};

pub fn data(name: &str) -> PathBuf {
    // The siw captures are the tests crate's (tests/data/siw/ at the workspace root).
    Path::new(env!("CARGO_MANIFEST_DIR")).parent().unwrap().join("tests/data/siw").join(name)
}

pub fn iwarp(args: &[&str]) -> Output {
    Command::new(env!("CARGO_BIN_EXE_iwarp")).args(args).output().unwrap()
}

pub fn stdout(o: &Output) -> String {
    String::from_utf8(o.stdout.clone()).unwrap()
}

pub fn stderr(o: &Output) -> String {
    String::from_utf8(o.stderr.clone()).unwrap()
}

/// The records of `iwarp dissect --json` (JSON Lines), each line parsed.
pub fn json_lines(o: &Output) -> Vec<serde_json::Value> {
    stdout(o).lines().map(|l| serde_json::from_str(l).unwrap_or_else(|e| panic!("{e}: {l}"))).collect()
}

/// The records of one kind.
pub fn records<'a>(lines: &'a [serde_json::Value], kind: &str) -> Vec<&'a serde_json::Value> {
    lines.iter().filter(|r| r["record"] == kind).collect()
}

/// A temp file removed on drop.
pub struct Temp(pub PathBuf);

impl Temp {
    pub fn new(tag: &str, bytes: &[u8]) -> Temp {
        let p = std::env::temp_dir().join(format!("iwarp-cli-{}-{tag}", std::process::id()));
        std::fs::write(&p, bytes).unwrap();
        Temp(p)
    }

    pub fn path(&self) -> &str {
        self.0.to_str().unwrap()
    }
}

impl Drop for Temp {
    fn drop(&mut self) {
        let _ = std::fs::remove_file(&self.0);
    }
}

/// A dissected segment (JSON) is one of the engine's nudges: a zero-length RDMA Write to
/// STag 1 that an initiator sends when its peer is slow to answer (docs/siw-quirks.md).
pub fn is_nudge_json(seg: &serde_json::Value) -> bool {
    seg["opcode"] == "Write" && seg["payload_len"] == 0 && seg["stag"] == 1
}

/// The binary under test.
pub const BIN: &str = env!("CARGO_BIN_EXE_iwarp");

/// A port nobody listens on (bound to 127.0.0.1:0, then released).
pub fn free_port() -> u16 {
    TcpListener::bind("127.0.0.1:0").unwrap().local_addr().unwrap().port()
}

/// An `iwarp rping -s` child process; on drop it is killed (by its own PID) and reaped.
pub struct Server {
    child: Option<Child>,
    pub port: u16,
    stderr: mpsc::Receiver<String>,
    stdout: Option<JoinHandle<String>>,
}

impl Server {
    pub fn start(extra: &[&str]) -> Server {
        // Port 0: the server binds a free port itself and names it, so no other test process
        // can take it between a look for a free port and the bind.
        let mut child = Command::new(BIN)
            .args(["rping", "-s", "-a", "127.0.0.1", "-p", "0", "-d", "--accept-timeout", "60"])
            .args(extra)
            .stdout(Stdio::piped())
            .stderr(Stdio::piped())
            .spawn()
            .unwrap();
        let err = child.stderr.take().unwrap();
        let out = child.stdout.take().unwrap();
        let (tx, rx) = mpsc::channel();
        std::thread::spawn(move || {
            for line in BufReader::new(err).lines() {
                let Ok(line) = line else { break };
                if tx.send(line).is_err() {
                    break;
                }
            }
        });
        let stdout = std::thread::spawn(move || {
            let mut s = String::new();
            let _ = BufReader::new(out).read_to_string(&mut s);
            s
        });
        let mut server = Server { child: Some(child), port: 0, stderr: rx, stdout: Some(stdout) };
        let lines = server.wait_line("listening on 127.0.0.1:");
        let listening = lines.last().expect("the line waited for");
        server.port = listening
            .split_once("listening on 127.0.0.1:")
            .and_then(|(_, rest)| rest.split(|c: char| !c.is_ascii_digit()).next()?.parse().ok())
            .unwrap_or_else(|| panic!("no port in {listening:?}"));
        server
    }

    /// Waits (10 s at most) for a stderr line containing `needle`; returns the lines so far.
    pub fn wait_line(&self, needle: &str) -> Vec<String> {
        let deadline = Instant::now() + Duration::from_secs(10);
        let mut seen = Vec::new();
        loop {
            let left = deadline.saturating_duration_since(Instant::now());
            match self.stderr.recv_timeout(left) {
                Ok(l) => {
                    let hit = l.contains(needle);
                    seen.push(l);
                    if hit {
                        return seen;
                    }
                }
                Err(_) => panic!("no stderr line with {needle:?}; got {seen:?}"),
            }
        }
    }

    /// Waits (10 s at most) until each of `needles` has shown in some stderr line, in any
    /// order (a persistent server serves each connection on a thread of its own, so what it
    /// prints for two connections may come in either order); the line each was found in.
    pub fn wait_all(&self, needles: &[&str]) -> Vec<String> {
        let deadline = Instant::now() + Duration::from_secs(10);
        let mut found: Vec<Option<String>> = vec![None; needles.len()];
        let mut seen = Vec::new();
        while found.iter().any(Option::is_none) {
            let left = deadline.saturating_duration_since(Instant::now());
            let Ok(line) = self.stderr.recv_timeout(left) else {
                let missing: Vec<&str> =
                    needles.iter().zip(&found).filter(|(_, f)| f.is_none()).map(|(n, _)| *n).collect();
                panic!("no stderr line with {missing:?}; got {seen:?}");
            };
            if let Some(i) = (0..needles.len()).find(|&i| found[i].is_none() && line.contains(needles[i])) {
                found[i] = Some(line.clone());
            }
            seen.push(line);
        }
        found.into_iter().flatten().collect()
    }

    /// Waits (10 s at most) for the server to exit; its status, stdout and stderr lines.
    pub fn wait_exit(mut self) -> (ExitStatus, String, Vec<String>) {
        let deadline = Instant::now() + Duration::from_secs(10);
        let child = self.child.as_mut().unwrap();
        let status = loop {
            if let Some(s) = child.try_wait().unwrap() {
                break s;
            }
            assert!(Instant::now() < deadline, "the server did not exit");
            std::thread::sleep(Duration::from_millis(10));
        };
        self.child = None;
        let out = self.stdout.take().unwrap().join().unwrap();
        (status, out, self.rest_of_stderr())
    }

    /// The stderr lines not read yet, up to the end of the stream (the child has exited; its
    /// reader thread may not have passed on the last lines yet, which once lost the server's
    /// closing line).
    fn rest_of_stderr(&self) -> Vec<String> {
        let deadline = Instant::now() + Duration::from_secs(10);
        let mut err = Vec::new();
        loop {
            match self.stderr.recv_timeout(deadline.saturating_duration_since(Instant::now())) {
                Ok(line) => err.push(line),
                Err(mpsc::RecvTimeoutError::Disconnected) => return err,
                Err(mpsc::RecvTimeoutError::Timeout) => panic!("stderr did not end; got {err:?}"),
            }
        }
    }

    /// Kills the server and returns its stdout and the stderr lines not read yet.
    pub fn kill(mut self) -> (String, Vec<String>) {
        let mut child = self.child.take().unwrap();
        let _ = child.kill();
        let _ = child.wait();
        let out = self.stdout.take().unwrap().join().unwrap();
        (out, self.rest_of_stderr())
    }
}

impl Drop for Server {
    fn drop(&mut self) {
        if let Some(mut child) = self.child.take() {
            let _ = child.kill();
            let _ = child.wait();
        }
    }
}

/// A network namespace with a veth pair `va`/`vb` (up, no kernel addresses), deleted on drop
/// whatever happens (the tests' one namespace harness, `iwarp_tests::netns`). Needs root.
pub struct SmolNetns(Netns);

impl SmolNetns {
    pub fn new(tag: &str) -> SmolNetns {
        let ns = Netns::new("iwcli", tag, "IWARP_CLI_NS", Duration::from_secs(120));
        ns.veth();
        SmolNetns(ns)
    }

    /// `iwarp ARGS` inside the namespace.
    pub fn iwarp(&self, args: &[&str]) -> Command {
        let mut c = Command::new("ip");
        c.args(["netns", "exec", &self.0.name, env!("CARGO_BIN_EXE_iwarp")]).args(args);
        c
    }
}

/// Waits for `child` at most `limit`; kills it past that.
pub fn wait_bounded(mut child: std::process::Child, limit: std::time::Duration, what: &str) -> Output {
    let deadline = std::time::Instant::now() + limit;
    loop {
        if child.try_wait().unwrap().is_some() {
            return child.wait_with_output().unwrap();
        }
        if std::time::Instant::now() > deadline {
            let _ = child.kill();
            let out = child.wait_with_output().unwrap();
            panic!("{what} ran past {limit:?}: {}{}", stdout(&out), stderr(&out));
        }
        std::thread::sleep(std::time::Duration::from_millis(20));
    }
}
