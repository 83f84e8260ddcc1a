//! `iwarp fuzz-peer`: protocol fuzzing of another iWARP implementation over the wire.
//!
//! Each case is one TCP connection on which this tool plays rping's part (client with
//! `--target`, server with `--listen`) with the MPA, DDP and RDMAP encoders, up to the case's
//! point, then sends the case's mutated bytes and reads the answer. After each case the oracles
//! run: the peer's answers must be well-formed, the peer must still complete a connection and
//! a ping (Send, RDMA Read, RDMA Write) made with this stack's own API, and a guest's console
//! must show no crash. See docs/fuzz-peer.md.

mod console;
mod minimize;
mod mutate;
mod rng;
mod seeds;
mod session;

use std::collections::BTreeMap;
use std::io::Write as _;
use std::net::{SocketAddr, TcpListener, ToSocketAddrs};
use std::path::{Path, PathBuf};
use std::process::ExitCode;
use std::sync::{Arc, Mutex, PoisonError};
use std::time::{Duration, Instant};

use iwarp::netdev::PcapWriter;
use iwarp::{Device, DeviceConfig};
use serde::Serialize;

use crate::rping::{Probe, probe_client, probe_server};
use crate::toolbox::io_message;
use console::Console;
use minimize::{Attempt, minimize};
use mutate::{Case, CrcChoice, GenConfig, Layer, Point, Recipe, Side, generate, known_finding};
use session::{Outcome, Timing};

/// Exit status when a case failed an oracle (or the peer failed the first health probe).
const EXIT_FAILURES: u8 = 1;
/// Exit status of a usage error found after parsing.
const EXIT_USAGE: u8 = 2;
/// The longest time spent minimising one failure.
const MINIMIZE_BUDGET: Duration = Duration::from_secs(60);

/// Fuzz another iWARP implementation over the wire: mutated MPA, DDP and RDMAP at chosen points
/// of a real rping conversation, with liveness, well-formedness and guest-console oracles.
///
/// With --target ADDR:PORT the peer is a responder running an rping server (`rping -s -P` on
/// Linux siw, or `iwarp rping -s -P`); this tool connects as rping's client. With --listen
/// PORT (or ADDR:PORT) the peer is an initiator that keeps connecting (a loop of `rping -c -C 1`); this
/// tool answers as rping's server, every case on one connection and the health probe on the
/// next.
///
/// A case strikes at one point (--points): the MPA Request or Reply itself (revision, flags,
/// PD_Length, IRD/ORD word, key, a cut frame, a close or reset right after the exchange), the
/// first FPDU, the second segment of a message, or after a Read Request. It starts from a
/// well-formed message (Send, Write, Read Request or Response, Terminate, RFC 7306 bodies, a
/// ULPDU of the --seed-pcap captures, random bytes) and mutates the FPDU framing (length, pad,
/// CRC, markers, segmentation, repeats), the DDP header (T and L bits, version, reserved bits,
/// STag, TO, QN, MSN, MO) and RDMAP (opcodes, reserved ones included, version, Read Request
/// fields, Terminate bodies, payload length) (--layers).
///
/// Oracles, after every case: each FPDU the peer sent deframes and decodes, a Terminate with a
/// defined layer/type/code (RFC or siw layout); the peer completes a connection and a validated
/// ping through this stack's API (the health probe, retried once); with --console, the guest's
/// serial log shows no Oops, BUG, WARN or KASAN line. A liveness or console failure ends the run.
/// Each failure is written as a pcap (--save-failures; `iwarp dissect` decodes it) with the
/// command that reproduces it (--seed N --case K), and shrunk to the fewest mutations that
/// still fail (--ops lists them).
///
/// Progress goes to stderr; a summary to stdout (--json: one JSON document).
///
/// Exit status: 0 when every case passed, 1 when a case failed (or the peer failed the health
/// probe before the first case), 2 on bad flags or an unusable file.
#[derive(Debug, clap::Args)]
#[command(group(clap::ArgGroup::new("peer").required(true).args(["target", "listen"])))]
pub(crate) struct Args {
    /// The peer's rping server (the peer responds).
    #[arg(long, value_name = "ADDR:PORT")]
    target: Option<String>,
    /// Listen here for the peer's rping clients (the peer initiates); ADDR defaults to 0.0.0.0.
    #[arg(long, value_name = "[ADDR:]PORT")]
    listen: Option<String>,
    /// The run's seed: with --case it reproduces a case (default: from the clock, printed).
    #[arg(long, value_name = "N")]
    seed: Option<u64>,
    /// Run only case K of the run seeded with --seed (give the other flags of that run too).
    #[arg(long, value_name = "K", requires = "seed")]
    case: Option<u64>,
    /// With --case: keep only these of its mutations (indices, as a minimised failure lists;
    /// `none` for none).
    #[arg(long, value_name = "I,J,..", value_parser = parse_ops, requires = "case")]
    ops: Option<OpList>,
    /// Seconds to run cases for.
    #[arg(long, value_name = "SECS", default_value_t = 60,
          value_parser = clap::value_parser!(u64).range(1..=2_592_000))]
    duration: u64,
    /// Stop after this many cases.
    #[arg(long, value_name = "N", value_parser = clap::value_parser!(u64).range(1..))]
    cases: Option<u64>,
    /// Where cases strike, comma-separated [default: all].
    #[arg(long, value_enum, value_delimiter = ',')]
    points: Vec<Point>,
    /// The families of mutations, comma-separated [default: all].
    #[arg(long, value_enum, value_delimiter = ',')]
    layers: Vec<Layer>,
    /// Run a hand-written case (a known finding) instead of generated ones.
    #[arg(long, value_enum, conflicts_with_all = ["case", "points", "layers"])]
    recipe: Option<Recipe>,
    /// A capture whose ULPDUs seed cases (repeatable; e.g. tests/data/siw/siw-rping.pcap).
    #[arg(long = "seed-pcap", value_name = "FILE")]
    seed_pcap: Vec<PathBuf>,
    /// Offer peer-to-peer mode (RFC 6581 RTR) in every Request and health probe (for a peer
    /// such as siw built with peer_to_peer=1).
    #[arg(long)]
    p2p: bool,
    /// CRC in this tool's Requests (and Replies).
    #[arg(long, value_enum, default_value_t = CrcChoice::Random)]
    crc: CrcChoice,
    /// Write each failing case here as a pcap, with a text file that reproduces it.
    #[arg(long, value_name = "DIR")]
    save_failures: Option<PathBuf>,
    /// Leave out generated cases that would trigger a known finding again (docs/fuzz-peer.md).
    #[arg(long)]
    skip_known: bool,
    /// Do not shrink failing cases.
    #[arg(long)]
    no_minimize: bool,
    /// Run the health probe after every Nth case only.
    #[arg(long, value_name = "N", default_value_t = 1,
          value_parser = clap::value_parser!(u64).range(1..=10_000))]
    probe_every: u64,
    /// Seconds the health probe (and, with --listen, waiting for a connection) may take.
    #[arg(long, value_name = "SECS", default_value_t = 10,
          value_parser = clap::value_parser!(u64).range(1..=600))]
    probe_timeout: u64,
    /// Milliseconds of silence that end the peer's answer to a case.
    #[arg(long, value_name = "MS", default_value_t = 200,
          value_parser = clap::value_parser!(u64).range(1..=60_000))]
    answer_wait: u64,
    /// A guest's serial console log to watch for kernel crashes and warnings.
    #[arg(long, value_name = "FILE")]
    console: Option<PathBuf>,
    /// Print the summary as one JSON document.
    #[arg(long)]
    json: bool,
    /// Print every case and what the peer did on stderr.
    #[arg(short, long)]
    verbose: bool,
    /// Seconds between progress lines on stderr (0: none).
    #[arg(long, value_name = "SECS", default_value_t = 5)]
    progress: u64,
}

/// Operation indices (`--ops`).
#[derive(Debug, Clone, PartialEq, Eq)]
struct OpList(Vec<usize>);

fn parse_ops(s: &str) -> Result<OpList, String> {
    if s == "none" {
        return Ok(OpList(Vec::new()));
    }
    s.split(',')
        .map(|p| p.trim().parse::<usize>().map_err(|_| format!("'{p}' is not an operation index")))
        .collect::<Result<Vec<_>, _>>()
        .map(OpList)
}

/// Runs the subcommand and returns the exit status.
pub(crate) fn run(args: &Args) -> ExitCode {
    match fuzz(args) {
        Ok(summary) => {
            let failed = !summary.failures.is_empty() || summary.unhealthy.is_some();
            print_summary(args, &summary);
            if failed { ExitCode::from(EXIT_FAILURES) } else { ExitCode::SUCCESS }
        }
        Err(m) => {
            eprintln!("fuzz-peer: {m}");
            ExitCode::from(EXIT_USAGE)
        }
    }
}

/// A pcap written into memory.
#[derive(Clone, Default)]
struct Sink(Arc<Mutex<Vec<u8>>>);

impl std::io::Write for Sink {
    fn write(&mut self, buf: &[u8]) -> std::io::Result<usize> {
        self.0.lock().unwrap_or_else(PoisonError::into_inner).extend_from_slice(buf);
        Ok(buf.len())
    }

    fn flush(&mut self) -> std::io::Result<()> {
        Ok(())
    }
}

impl Sink {
    fn bytes(&self) -> Vec<u8> {
        self.0.lock().unwrap_or_else(PoisonError::into_inner).clone()
    }
}

/// Which oracle a case failed.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Serialize)]
#[serde(rename_all = "snake_case")]
enum FailKind {
    /// The peer sent something malformed.
    Answer,
    /// The peer no longer completes a connection and a ping.
    Liveness,
    /// The guest's console shows a crash or warning.
    Console,
}

impl std::fmt::Display for FailKind {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(match self {
            FailKind::Answer => "malformed answer",
            FailKind::Liveness => "liveness",
            FailKind::Console => "guest console",
        })
    }
}

/// A failed oracle.
#[derive(Debug, Clone, Serialize)]
struct Failure {
    kind: FailKind,
    message: String,
}

/// One run of a case: its connection, oracles and capture.
struct Trial {
    outcome: Option<Outcome>,
    failure: Option<Failure>,
    pcap: Vec<u8>,
}

/// A failure as reported.
#[derive(Debug, Serialize)]
struct FailureRecord {
    case: u64,
    kind: FailKind,
    message: String,
    point: Point,
    template: String,
    ops: Vec<String>,
    /// The operations the minimiser kept (indices), when it ran.
    minimized_ops: Option<Vec<usize>>,
    /// Why the case was not minimised, when it was not.
    #[serde(skip_serializing_if = "Option::is_none")]
    not_minimized: Option<String>,
    reproduce: String,
    pcap: Option<String>,
    minimized_pcap: Option<String>,
    #[serde(skip)]
    text: String,
}

/// The run's summary.
#[derive(Debug, Serialize)]
struct Summary {
    mode: &'static str,
    peer: String,
    seed: u64,
    duration_s: f64,
    cases: u64,
    cases_per_s: f64,
    probes: u64,
    /// Cases whose bytes went out at their point.
    reached: u64,
    /// Terminates the peer sent.
    terminates: u64,
    /// Case connections the peer closed or reset.
    peer_closed: u64,
    /// Generated cases left out by --skip-known.
    skipped: u64,
    points: BTreeMap<String, u64>,
    stopped: &'static str,
    /// Set when the peer failed the health probe before the first case.
    #[serde(skip_serializing_if = "Option::is_none")]
    unhealthy: Option<String>,
    failures: Vec<FailureRecord>,
}

struct Runner {
    side: Side,
    target: Option<SocketAddr>,
    listener: Option<TcpListener>,
    device: Arc<Device>,
    seeds: Vec<Vec<u8>>,
    timing: Timing,
    probe_timeout: Duration,
    p2p: bool,
    console: Option<Console>,
    probes: u64,
}

impl Runner {
    /// One health probe; retried once.
    fn probe(&mut self, capture: Option<&Arc<Mutex<PcapWriter>>>) -> Result<(), String> {
        let p = Probe { timeout: self.probe_timeout, p2p: self.p2p, capture: capture.cloned() };
        let mut first = None;
        for attempt in 0..2 {
            self.probes += 1;
            let r = match (self.side, self.target, &self.listener) {
                (Side::Initiator, Some(addr), _) => probe_client(&self.device, addr, &p),
                (Side::Responder, _, Some(l)) => match session::accept(l, self.probe_timeout) {
                    Ok(stream) => probe_server(&self.device, stream, &p),
                    Err(m) => Err(m),
                },
                _ => Err("no peer".to_string()),
            };
            match r {
                Ok(()) => return Ok(()),
                Err(m) if attempt == 0 => {
                    first = Some(m);
                    std::thread::sleep(Duration::from_secs(1));
                }
                Err(m) => {
                    let first = first.take().unwrap_or_default();
                    return Err(if first == m { m } else { format!("{first}; then, retried: {m}") });
                }
            }
        }
        Err("unreachable".to_string())
    }

    fn console_failure(&mut self) -> Option<Failure> {
        let c = self.console.as_mut()?;
        match c.check() {
            Ok(Some(line)) => Some(Failure { kind: FailKind::Console, message: line }),
            Ok(None) => None,
            Err(e) => {
                Some(Failure { kind: FailKind::Console, message: format!("cannot read the console: {e}") })
            }
        }
    }

    /// Runs `case` and the oracles.
    fn trial(&mut self, case: &Case, probe: bool) -> Trial {
        let sink = Sink::default();
        let writer = PcapWriter::new(sink.clone()).ok().map(PcapWriter::shared);
        let mut failures: Vec<Failure> = Vec::new();
        let outcome = match (self.side, self.target, &self.listener) {
            (Side::Initiator, Some(addr), _) => session::run_initiator(addr, case, &self.seeds, self.timing),
            (Side::Responder, _, Some(l)) => session::accept(l, self.probe_timeout)
                .map(|stream| session::run_responder(stream, case, &self.seeds, self.timing)),
            _ => Err("no peer".to_string()),
        };
        let outcome = match outcome {
            Ok(o) => {
                if let Some(w) = &writer {
                    let _ = o.write_pcap(&mut w.lock().unwrap_or_else(PoisonError::into_inner), self.side);
                }
                if !o.problems.is_empty() {
                    failures.push(Failure { kind: FailKind::Answer, message: o.problems.join("; ") });
                }
                Some(o)
            }
            Err(m) => {
                failures.push(Failure { kind: FailKind::Liveness, message: m });
                None
            }
        };
        failures.extend(self.console_failure());
        if probe && !failures.iter().any(|f| f.kind >= FailKind::Liveness) {
            if let Err(m) = self.probe(writer.as_ref()) {
                failures
                    .push(Failure { kind: FailKind::Liveness, message: format!("health probe failed: {m}") });
            }
            failures.extend(self.console_failure());
        }
        if let Some(w) = &writer {
            let _ = w.lock().unwrap_or_else(PoisonError::into_inner).flush();
        }
        let failure = failures.iter().max_by_key(|f| f.kind).cloned();
        Trial { outcome, failure, pcap: sink.bytes() }
    }
}

impl Trial {
    /// What the peer did, in a few words.
    fn describe(&self) -> String {
        let mut parts = Vec::new();
        match &self.outcome {
            Some(o) => {
                if !o.reached {
                    parts.push("point not reached".to_string());
                }
                for t in &o.terminates {
                    parts.push(format!("Terminate {t}"));
                }
                parts
                    .push(if o.peer_closed { "peer closed" } else { "peer kept the connection" }.to_string());
            }
            None => parts.push("no connection".to_string()),
        }
        if let Some(f) = &self.failure {
            parts.push(format!("FAILED ({}): {}", f.kind, f.message));
        }
        parts.join(", ")
    }
}

fn resolve(s: &str, default_host: Option<&str>) -> Result<SocketAddr, String> {
    let spec = match default_host {
        Some(host) if !s.contains(':') => format!("{host}:{s}"),
        _ => s.to_string(),
    };
    let mut addrs =
        spec.to_socket_addrs().map_err(|e| format!("cannot resolve '{s}': {}", io_message(&e)))?;
    addrs.next().ok_or_else(|| format!("cannot resolve '{s}': no address"))
}

/// The flags that make `case` again.
fn reproduce(args: &Args, seed: u64, case: &Case, kept: Option<&[usize]>) -> String {
    let mut s = String::from("iwarp fuzz-peer");
    if let Some(t) = &args.target {
        s.push_str(&format!(" --target {t}"));
    }
    if let Some(l) = &args.listen {
        s.push_str(&format!(" --listen {l}"));
    }
    if let Some(r) = args.recipe {
        let name =
            serde_json::to_value(r).ok().and_then(|v| v.as_str().map(str::to_string)).unwrap_or_default();
        s.push_str(&format!(" --recipe {name}"));
    } else {
        s.push_str(&format!(" --seed {seed} --case {}", case.index));
        if let Some(k) = kept {
            let k: Vec<String> = k.iter().map(ToString::to_string).collect();
            s.push_str(&format!(" --ops {}", if k.is_empty() { "none".to_string() } else { k.join(",") }));
        }
        if !args.points.is_empty() {
            let p: Vec<String> = args.points.iter().map(ToString::to_string).collect();
            s.push_str(&format!(" --points {}", p.join(",")));
        }
        if !args.layers.is_empty() {
            let l: Vec<String> = args.layers.iter().map(|l| format!("{l:?}").to_lowercase()).collect();
            s.push_str(&format!(" --layers {}", l.join(",")));
        }
        for p in &args.seed_pcap {
            s.push_str(&format!(" --seed-pcap {}", p.display()));
        }
    }
    if args.p2p {
        s.push_str(" --p2p");
    }
    if args.crc != CrcChoice::Random {
        s.push_str(&format!(" --crc {}", if args.crc == CrcChoice::On { "on" } else { "off" }));
    }
    s
}

fn fuzz(args: &Args) -> Result<Summary, String> {
    // Flags clap cannot check.
    let (side, target, listener, peer) = match (&args.target, &args.listen) {
        (Some(t), None) => {
            let addr = resolve(t, None)?;
            (Side::Initiator, Some(addr), None, addr.to_string())
        }
        (None, Some(l)) => {
            let bind = resolve(l, Some("0.0.0.0"))?;
            let listener = TcpListener::bind(bind)
                .map_err(|e| format!("cannot listen on {bind}: {}", io_message(&e)))?;
            let shown = listener.local_addr().map_or(bind, |a| a);
            (Side::Responder, None, Some(listener), shown.to_string())
        }
        _ => return Err("give one of --target and --listen".into()),
    };
    if args.case.is_some() && args.cases.is_some() {
        return Err("--case runs one case; --cases does not go with it".into());
    }
    let gencfg = GenConfig {
        side,
        points: if args.points.is_empty() {
            vec![Point::Handshake, Point::First, Point::Mid, Point::Read]
        } else {
            args.points.clone()
        },
        layers: if args.layers.is_empty() {
            vec![Layer::Mpa, Layer::Fpdu, Layer::Ddp, Layer::Rdmap, Layer::Conn]
        } else {
            args.layers.clone()
        },
        crc: args.crc,
        p2p: args.p2p,
        seeds: 0,
    };
    if args.recipe.is_none() && gencfg.eligible_points().is_empty() {
        return Err(
            "--points handshake needs --layers mpa or conn; the other points need fpdu, ddp, rdmap or conn"
                .into(),
        );
    }
    let seeds = seeds::load(&args.seed_pcap)?;
    let gencfg = GenConfig { seeds: seeds.len(), ..gencfg };
    if let Some(dir) = &args.save_failures {
        std::fs::create_dir_all(dir)
            .map_err(|e| format!("cannot create {}: {}", dir.display(), io_message(&e)))?;
    }
    let console = match &args.console {
        Some(p) => {
            Some(Console::open(p).map_err(|e| format!("cannot read {}: {}", p.display(), io_message(&e)))?)
        }
        None => None,
    };
    let seed = args.seed.unwrap_or_else(|| {
        let t = std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).unwrap_or_default();
        t.as_secs() ^ u64::from(t.subsec_nanos()) << 20
    });
    let mut runner = Runner {
        side,
        target,
        listener,
        device: Arc::new(Device::open(DeviceConfig::default())),
        seeds,
        timing: Timing {
            quiet: Duration::from_millis(args.answer_wait),
            step: Duration::from_secs(args.probe_timeout.min(5)),
        },
        probe_timeout: Duration::from_secs(args.probe_timeout),
        p2p: args.p2p,
        console,
        probes: 0,
    };
    let mode = if side == Side::Initiator { "target" } else { "listen" };
    eprintln!("fuzz-peer: {mode} {peer}, seed {seed}, {} s", args.duration);
    let start = Instant::now();
    let mut summary = Summary {
        mode,
        peer,
        seed,
        duration_s: 0.0,
        cases: 0,
        cases_per_s: 0.0,
        probes: 0,
        reached: 0,
        terminates: 0,
        peer_closed: 0,
        skipped: 0,
        points: BTreeMap::new(),
        stopped: "duration",
        unhealthy: None,
        failures: Vec::new(),
    };
    if let Some(f) = runner.console_failure() {
        summary.unhealthy = Some(format!("the console already shows: {}", f.message));
        summary.stopped = "guest crash";
    } else if let Err(m) = runner.probe(None) {
        summary.unhealthy = Some(format!("the peer failed the health probe before the first case: {m}"));
        summary.stopped = "unhealthy peer";
    }
    if let Some(m) = &summary.unhealthy {
        eprintln!("fuzz-peer: {m}");
        summary.probes = runner.probes;
        return Ok(summary);
    }
    let deadline = start + Duration::from_secs(args.duration);
    let make = |index: u64| -> Case {
        let case = match args.recipe {
            Some(r) => r.case(index, args.crc == CrcChoice::On),
            None => generate(&gencfg, seed, index),
        };
        match &args.ops {
            Some(keep) => case.keeping(&keep.0),
            None => case,
        }
    };
    let mut index = args.case.unwrap_or(0);
    let mut last_progress = Instant::now();
    loop {
        if Instant::now() >= deadline && summary.cases > 0 {
            break;
        }
        if args.cases.is_some_and(|n| summary.cases >= n) {
            summary.stopped = "cases";
            break;
        }
        let case = make(index);
        if args.skip_known
            && args.recipe.is_none()
            && args.case.is_none()
            && known_finding(side, &case).is_some()
        {
            summary.skipped += 1;
            index += 1;
            continue;
        }
        let probe = args.case.is_some() || (summary.cases + 1).is_multiple_of(args.probe_every);
        let began = Instant::now();
        let trial = runner.trial(&case, probe);
        if args.verbose {
            eprintln!("fuzz-peer: {case}");
            eprintln!("  -> {} in {} ms", trial.describe(), began.elapsed().as_millis());
        }
        summary.cases += 1;
        *summary.points.entry(case.point.to_string()).or_insert(0) += 1;
        if let Some(o) = &trial.outcome {
            summary.reached += u64::from(o.reached);
            summary.terminates += o.terminates.len() as u64;
            summary.peer_closed += u64::from(o.peer_closed);
        }
        if let Some(f) = &trial.failure {
            let fatal = f.kind >= FailKind::Liveness;
            let record = record_failure(args, seed, &mut runner, &case, f, &trial);
            eprintln!("{}", record.text);
            summary.failures.push(record);
            if fatal {
                summary.stopped =
                    if f.kind == FailKind::Console { "guest crash" } else { "liveness failure" };
                break;
            }
        }
        if args.progress > 0 && last_progress.elapsed() >= Duration::from_secs(args.progress) {
            last_progress = Instant::now();
            let secs = start.elapsed().as_secs_f64();
            eprintln!(
                "fuzz-peer: {} cases in {secs:.0} s ({:.1} cases/s), {} failures, {} s left",
                summary.cases,
                summary.cases as f64 / secs.max(1e-9),
                summary.failures.len(),
                deadline.saturating_duration_since(Instant::now()).as_secs()
            );
        }
        if args.case.is_some() {
            summary.stopped = "cases";
            break;
        }
        index += 1;
    }
    summary.duration_s = start.elapsed().as_secs_f64();
    summary.cases_per_s = summary.cases as f64 / summary.duration_s.max(1e-9);
    summary.probes = runner.probes;
    Ok(summary)
}

/// Reports, saves and (when the peer allows it) minimises a failure.
fn record_failure(
    args: &Args,
    seed: u64,
    runner: &mut Runner,
    case: &Case,
    f: &Failure,
    trial: &Trial,
) -> FailureRecord {
    let base = format!("seed-{seed}-case-{}", case.index);
    let pcap = save(args.save_failures.as_deref(), &format!("{base}.pcap"), &trial.pcap);
    let mut record = FailureRecord {
        case: case.index,
        kind: f.kind,
        message: f.message.clone(),
        point: case.point,
        template: case.template.to_string(),
        ops: case.op_texts(),
        minimized_ops: None,
        not_minimized: None,
        reproduce: reproduce(args, seed, case, None),
        pcap,
        minimized_pcap: None,
        text: String::new(),
    };
    let mut minimized: Option<Case> = None;
    if args.no_minimize {
        record.not_minimized = Some("--no-minimize".into());
    } else if f.kind == FailKind::Console {
        record.not_minimized = Some("the guest's kernel crashed".into());
    } else if f.kind == FailKind::Liveness && runner.probe(None).is_err() {
        record.not_minimized = Some("the peer did not recover".into());
    } else {
        let until = Instant::now() + MINIMIZE_BUDGET;
        let mut last_pcap = None;
        let (min, kept) = minimize(case, |c| {
            if Instant::now() >= until {
                return Attempt::Stop;
            }
            let t = runner.trial(c, true);
            match &t.failure {
                Some(g) if g.kind == f.kind => {
                    last_pcap = Some(t.pcap);
                    Attempt::Fails
                }
                Some(g) if g.kind >= FailKind::Liveness => Attempt::Stop,
                _ => Attempt::Passes,
            }
        });
        if let Some(p) = last_pcap {
            record.minimized_pcap = save(args.save_failures.as_deref(), &format!("{base}-min.pcap"), &p);
        }
        record.reproduce = reproduce(args, seed, case, Some(&kept));
        record.minimized_ops = Some(kept);
        minimized = Some(min);
    }
    let mut text = format!("fuzz-peer: FAILURE ({}) in {case}\n  {}\n", f.kind, f.message);
    if let Some(m) = &minimized {
        text.push_str(&format!("  minimised: {m}\n"));
    } else if let Some(why) = &record.not_minimized {
        text.push_str(&format!("  not minimised: {why}\n"));
    }
    text.push_str(&format!("  reproduce: {}\n", record.reproduce));
    for p in record.pcap.iter().chain(&record.minimized_pcap) {
        text.push_str(&format!("  saved: {p}\n"));
    }
    let text = text.trim_end().to_string();
    if let Some(dir) = &args.save_failures {
        let _ = std::fs::write(dir.join(format!("{base}.txt")), format!("{text}\n"));
    }
    record.text = text;
    record
}

/// Writes `bytes` as `name` under `dir`; the path written.
fn save(dir: Option<&Path>, name: &str, bytes: &[u8]) -> Option<String> {
    let path = dir?.join(name);
    match std::fs::write(&path, bytes) {
        Ok(()) => Some(path.display().to_string()),
        Err(e) => {
            eprintln!("fuzz-peer: cannot write {}: {}", path.display(), io_message(&e));
            None
        }
    }
}

fn print_summary(args: &Args, s: &Summary) {
    let text = if args.json {
        match serde_json::to_string_pretty(s) {
            Ok(t) => format!("{t}\n"),
            Err(e) => {
                eprintln!("fuzz-peer: cannot encode the summary as JSON: {e}");
                return;
            }
        }
    } else {
        let mut t = format!(
            "fuzz-peer: {} cases in {:.1} s ({:.1} cases/s) against {} ({}), seed {}: {} failures\n",
            s.cases,
            s.duration_s,
            s.cases_per_s,
            s.peer,
            s.mode,
            s.seed,
            s.failures.len()
        );
        t.push_str(&format!(
            "  {} health probes, {} Terminates received, {} case connections closed by the peer\n",
            s.probes, s.terminates, s.peer_closed
        ));
        if let Some(m) = &s.unhealthy {
            t.push_str(&format!("  {m}\n"));
        }
        for f in &s.failures {
            t.push_str(&format!("{}\n", f.text));
        }
        t
    };
    let mut out = std::io::stdout().lock();
    let _ = out.write_all(text.as_bytes()).and_then(|()| out.flush());
}
