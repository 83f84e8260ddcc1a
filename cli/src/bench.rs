//! `iwarp bench`: iWARP Write, Read and Send bandwidth, message rate and ping-pong latency
//! over 127.0.0.1, against a raw-TCP baseline measured in the same run.

use std::collections::BTreeMap;
use std::io::Write as _;
use std::process::ExitCode;
use std::time::Duration;

use iwarp::PollMode;
use serde_json::{Value, json};

mod device;
mod pin;
mod plot;
mod raw;
mod rdma;
mod results;
mod smolraw;
mod veth;

pub(crate) use results::Op;
use results::{BenchError, Budget, Latency, RawRow, Rounds, Row, Spread, Throughput, ratio, show_size};

/// Exit status when a measurement failed (a completion did not come, or came with an error).
const EXIT_FAILED: u8 = 1;
/// The largest message size taken.
const MAX_SIZE: usize = 1 << 30;
/// The default message sizes: 64 B to 1 MiB in powers of 4.
const DEFAULT_SIZES: [usize; 8] = [64, 256, 1 << 10, 4 << 10, 16 << 10, 64 << 10, 256 << 10, 1 << 20];
/// The default time per measurement.
const DEFAULT_DURATION: Duration = Duration::from_millis(300);
/// The message size of the message-rate summary.
const RATE_SIZE: usize = 64;

/// Measure iWARP RDMA Write, RDMA Read and Send against raw TCP, server and client in one
/// process over 127.0.0.1.
///
/// With `--transport smoltcp --iface A --peer-iface B --ip ADDR/P --peer-ip ADDR/P` (the two
/// ends of a veth pair) client and server each run their own smoltcp stack on one end; the
/// baseline is then smoltcp's raw TCP between the same two interfaces (a plain byte stream
/// and an echo), and a kernel-TCP stream is measured for comparison: over the same veth pair
/// when its ends are in two network namespaces (`--netns NS --peer-netns NS2`, the kernel's
/// addresses on the two ends; scripts/bench-smol.sh sets this up), over 127.0.0.1 otherwise.
/// What the smoltcp stacks' frames cost (frames per second and per CPU-second) and which
/// offloads they use are reported too (`--offload off` runs both stacks without them).
/// `--pcap` then records the client interface's frames.
///
/// For every operation and message size: bandwidth (GB/s) and message rate (Mmsg/s) with
/// `--window` work requests outstanding, and ping-pong round-trip latency (p50/p99, µs); next
/// to them the same for a raw-TCP baseline measured in the same run (a length-prefixed
/// stream, and an echo ping-pong of the same size, busy-polling nonblocking sockets when the
/// engine busy-polls or runs inline), and the ratios iwarp / raw. The ping-pongs: Write
/// writes into the peer's buffer, which notices the new sequence number in its last bytes
/// and writes back; Send answers each received message with a Send; Read is one Read.
///
/// Exit status: 0 when every measurement completed, 1 when one failed (a completion did not
/// come in time or had an error status), 2 for bad arguments.
#[derive(Debug, clap::Args)]
pub(crate) struct Args {
    /// Operations, comma-separated [default: write,read,send].
    #[arg(long, value_delimiter = ',', value_enum)]
    ops: Vec<Op>,
    /// Message sizes in bytes, comma-separated, with optional k/K (KiB), m/M (MiB) or g/G
    /// suffixes; 1 B to 1 GiB [default: 64,256,1k,4k,16k,64k,256k,1m].
    #[arg(long, value_delimiter = ',', value_parser = parse_size)]
    sizes: Vec<usize>,
    /// Messages (bandwidth) or round trips (latency) per measurement, instead of a duration.
    #[arg(long, conflicts_with = "duration", value_parser = clap::value_parser!(u64).range(1..))]
    iters: Option<u64>,
    /// Seconds per measurement [default: 0.3].
    #[arg(long, value_parser = parse_duration)]
    duration: Option<Duration>,
    /// MPA CRC32c.
    #[arg(long, value_enum, default_value_t = OnOff::On)]
    crc: OnOff,
    /// MPA revision.
    #[arg(long = "mpa-rev", value_parser = clap::value_parser!(u8).range(1..=2), default_value_t = 2)]
    mpa_rev: u8,
    /// The engine's poll mode.
    #[arg(long, value_enum, default_value_t = Poll::Adaptive)]
    poll: Poll,
    /// Queue pairs (connections); bandwidth messages go round-robin over them. Above one, the
    /// raw-TCP stream also runs over as many connections, a window's share of messages per
    /// connection in turn, for a like-for-like ratio, and Writes also run over the first
    /// queue pair alone with the whole window, for the aggregate against one queue pair in
    /// the same run; for Writes the three take turns in five rounds, and the ratios come
    /// with their spread over the rounds.
    #[arg(long, default_value_t = 1, value_parser = clap::value_parser!(u16).range(1..=4096))]
    qps: u16,
    /// Run both ends on one device (one engine). By default the client and the server have
    /// a device each, as two hosts would; one shared device hides the cost of waking the
    /// peer's engine.
    #[arg(long)]
    shared_device: bool,
    /// Large payloads straight between the sockets and registered memory (read into place,
    /// written from where they are); off: copied through the engine's buffers, for comparison.
    #[arg(long, value_enum, default_value_t = OnOff::On)]
    zero_copy: OnOff,
    /// Each end's threads on one CPU, the raw-TCP baseline's too, as on two hosts: the
    /// client's (this thread and its device's engine) on CLIENT, the server's (its engine,
    /// its application thread, the raw echo and stream servers) on SERVER. Neither end can
    /// then preempt the other, and a message wakes its receiver on the receiver's own CPU;
    /// without it the scheduler may run both ends on one CPU, the woken ahead of the waker.
    /// The header lists every thread and its CPUs. Kernel TCP, separate devices only.
    #[arg(long, value_name = "CLIENT,SERVER", value_parser = pin::parse)]
    pin: Option<pin::Pin>,
    /// A pause before each round trip of the latency measurements (raw TCP's too), e.g.
    /// 10ms: sparse messages, which find the engines asleep [default: 0].
    #[arg(long, value_parser = parse_gap)]
    gap: Option<Duration>,
    /// The ping-pongs' raw-TCP baseline taking turns with this stack's ping-pong over the
    /// same time (on: one round trip each with --gap, else 10 ms of each), or measured before
    /// it with the other baselines (off). On by default where the baseline blocks (adaptive
    /// and event modes over kernel TCP): on a shared machine a baseline measured seconds
    /// apart moved by a factor of two from one run to the next. Not with a busy or inline
    /// engine, whose baseline busy-polls (its spinning echo thread would take a core from
    /// this stack's turns), nor over smoltcp [default: on where it applies].
    #[arg(long, value_enum)]
    interleave: Option<OnOff>,
    /// Work requests outstanding on the sender in the bandwidth measurements, like perftest's
    /// transmit depth, spread over the queue pairs (at least one each: with more pairs than
    /// the window, one per pair). Reads too: the connections take the window per queue pair as
    /// their IRD and ORD, at least 16, as perftest's reads go as deep as the device allows. For
    /// Sends the receiver keeps `--rx-depth` receives posted (at least a window's worth per
    /// pair), and the sender never has more Sends in flight than that.
    #[arg(long, default_value_t = 64, value_parser = clap::value_parser!(u16).range(1..=4096))]
    window: u16,
    /// Receives the server keeps posted for the Send measurements, spread over the queue pairs,
    /// like perftest's receive depth (-r, 512 by default there too; perftest posts that many
    /// per queue pair, or over all of them with a shared receive queue); at least a window's
    /// share per pair is posted whatever this says. An iWARP Send that finds no receive posted
    /// ends the connection, so the sender sends only as many as the receiver has posted and
    /// not yet reposted: with small messages this depth, not the window, bounds what is in
    /// flight.
    #[arg(long, default_value_t = 512, value_parser = clap::value_parser!(u16).range(1..=16384))]
    rx_depth: u16,
    /// CQ moderation of the bandwidth measurements, like perftest's -Q: only every N-th work
    /// request of a queue pair asks for a completion, and the last of each list posted (a
    /// completion retires the unsignaled ones before it); 1 signals every one. At most the
    /// work requests a queue pair may have outstanding. Receives always complete. Ping-pongs
    /// signal every message.
    #[arg(long, default_value_t = 16, value_parser = clap::value_parser!(u16).range(1..))]
    cq_mod: u16,
    /// Print one JSON document with the configuration and every row instead of tables.
    #[arg(long)]
    json: bool,
    /// Draw bandwidth and ping-pong latency against message size, this stack's next to raw
    /// TCP's, into this SVG file.
    #[arg(long, value_name = "FILE.svg")]
    plot: Option<std::path::PathBuf>,
    /// Record the iWARP connections (both ends) into this pcap file, readable by tshark and
    /// `iwarp dissect`. Capturing costs throughput; use it with short runs.
    #[arg(long, value_name = "FILE")]
    pcap: Option<std::path::PathBuf>,
    /// No progress lines on stderr.
    #[arg(short, long)]
    quiet: bool,
    #[command(flatten)]
    transport: crate::transport::TransportArgs,
    /// smoltcp: the server's interface (the other end of the --iface veth pair).
    #[arg(long, value_name = "NAME")]
    peer_iface: Option<String>,
    /// smoltcp: the server stack's IPv4 address and prefix length.
    #[arg(long, value_name = "ADDR/PREFIX", value_parser = crate::transport::parse_cidr)]
    peer_ip: Option<(std::net::Ipv4Addr, u8)>,
    /// smoltcp: the network namespace holding --iface (`ip netns add`). With --peer-netns
    /// the kernel-TCP baseline runs over the same veth pair, between the kernel's addresses
    /// of the two ends.
    #[arg(long, value_name = "NAME", requires = "peer_netns")]
    netns: Option<String>,
    /// Measure this device through the backend seam instead (an rdma-core device such as
    /// siw0 or rxe0, listed by `iwarp devices`; needs the `verbs` feature), beside the
    /// userspace engine measured the same way in the same run, with the ratios device /
    /// engine: bandwidth and message rate with --window outstanding, both ends in this
    /// process over --device-addr.
    #[arg(long, value_name = "NAME")]
    device: Option<String>,
    /// --device: the address both ends use (the one the device is bound to).
    #[arg(long, value_name = "IP", default_value = "127.0.0.1")]
    device_addr: std::net::IpAddr,
    /// smoltcp: the network namespace holding --peer-iface.
    #[arg(long, value_name = "NAME", requires = "netns")]
    peer_netns: Option<String>,
}

/// On or off.
#[derive(Debug, Clone, Copy, PartialEq, Eq, clap::ValueEnum)]
enum OnOff {
    On,
    Off,
}

/// The engine's poll mode.
#[derive(Debug, Clone, Copy, PartialEq, Eq, clap::ValueEnum)]
enum Poll {
    /// The engine thread spins.
    Busy,
    /// The engine spins a while, then parks.
    Adaptive,
    /// The engine parks whenever idle.
    Event,
    /// No engine thread: the benchmark's thread drives the engine.
    Inline,
}

impl Poll {
    fn mode(self) -> PollMode {
        match self {
            Poll::Busy => PollMode::Busy,
            Poll::Adaptive => PollMode::Adaptive,
            Poll::Event => PollMode::Event,
            Poll::Inline => PollMode::Inline,
        }
    }

    fn name(self) -> &'static str {
        match self {
            Poll::Busy => "busy",
            Poll::Adaptive => "adaptive",
            Poll::Event => "event",
            Poll::Inline => "inline",
        }
    }
}

/// Parses a message size: digits with an optional k/K, m/M or g/G (binary) suffix.
fn parse_size(s: &str) -> Result<usize, String> {
    let t = s.trim();
    let (digits, unit) = match t.char_indices().last() {
        Some((i, 'k' | 'K')) => (&t[..i], 1usize << 10),
        Some((i, 'm' | 'M')) => (&t[..i], 1 << 20),
        Some((i, 'g' | 'G')) => (&t[..i], 1 << 30),
        _ => (t, 1),
    };
    let n: usize = digits.parse().map_err(|_| format!("'{s}' is not a size (e.g. 64, 4k, 1M)"))?;
    let size = n.checked_mul(unit).ok_or_else(|| format!("size '{s}' is above the 1 GiB limit"))?;
    if size == 0 {
        return Err("a message size must be at least 1 byte".into());
    }
    if size > MAX_SIZE {
        return Err(format!("size '{s}' is above the 1 GiB limit"));
    }
    Ok(size)
}

/// Parses a pause: a number with a unit (s, ms, us), e.g. 10ms; at most 10 s.
fn parse_gap(s: &str) -> Result<Duration, String> {
    let t = s.trim();
    let (num, scale) = if let Some(n) = t.strip_suffix("ms") {
        (n, 1e-3)
    } else if let Some(n) = t.strip_suffix("us") {
        (n, 1e-6)
    } else if let Some(n) = t.strip_suffix('s') {
        (n, 1.0)
    } else {
        return Err(format!("'{s}' needs a unit: s, ms or us (e.g. 10ms)"));
    };
    let v: f64 = num.trim().parse().map_err(|_| format!("'{s}' is not a pause (e.g. 10ms)"))?;
    let secs = v * scale;
    if !(0.0..=10.0).contains(&secs) {
        return Err(format!("the gap must be between 0 and 10 s, not {s}"));
    }
    Ok(Duration::from_secs_f64(secs))
}

/// Parses a positive number of seconds (at most a day).
fn parse_duration(s: &str) -> Result<Duration, String> {
    let secs: f64 = s.trim().parse().map_err(|_| format!("'{s}' is not a number of seconds"))?;
    if !(secs > 0.0 && secs <= 86_400.0) {
        return Err(format!("the duration must be above 0 and at most 86400 seconds, not {s}"));
    }
    Ok(Duration::from_secs_f64(secs))
}

/// The message-rate summary: 64-byte Sends against a raw stream of 64-byte messages.
#[derive(Debug, Clone, Copy)]
struct RateSummary {
    iwarp: Throughput,
    raw: Throughput,
    /// Kernel TCP over 127.0.0.1 runs only: the raw stream written `window` messages per
    /// system call (see [`raw_per_window`]).
    raw_per_window: Option<Throughput>,
}

/// Everything a run measured.
struct Report {
    rows: Vec<Row>,
    rate: RateSummary,
    negotiated: Option<rdma::Negotiated>,
    /// Resident memory per idle connection end, measured while connecting.
    idle_bytes_per_qp: Option<u64>,
    /// Bytes the iWARP connections received, and of those the payload bytes read straight
    /// into registered memory.
    received: (u64, u64),
    /// Bytes framed, of those written from registered memory, and copied for a full link.
    sent: (u64, u64, u64, u64),
    /// Each device's engine counters over the run (wake-ups, passes), by the end it serves.
    engines: Vec<(&'static str, iwarp::EngineStats)>,
    /// smoltcp runs: the offloads of the client's and the server's devices.
    offloads: Option<(iwarp::netdev::Offloads, iwarp::netdev::Offloads)>,
    /// `--pin`: every thread of the process by name, with the CPUs it may run on.
    threads: Option<Vec<(String, String)>>,
}

/// The client's and the server's smoltcp stacks of `--transport smoltcp`.
type Stacks = (iwarp::netdev::SmolStack, iwarp::netdev::SmolStack);

/// The two stacks and, when their ends are in two namespaces, the kernel-TCP path between them.
type Opened = (Stacks, Option<veth::VethPath>);

/// Opens the two smoltcp stacks (each in its namespace, when given) and the veth path of the
/// kernel-TCP baseline, or `None` for kernel TCP; `Err` is a one-line message and whether it
/// is a usage error.
fn open_stacks(args: &Args) -> Result<Option<Opened>, (String, bool)> {
    let Some((dev, config)) = args.transport.check().map_err(|m| (m, true))? else {
        if args.peer_iface.is_some() || args.peer_ip.is_some() || args.netns.is_some() {
            return Err(("--peer-iface, --peer-ip and --netns need --transport smoltcp".into(), true));
        }
        return Ok(None);
    };
    let crate::transport::Dev::Raw(_) = dev else {
        return Err((
            "bench over smoltcp needs two interfaces (a veth pair): --iface NAME --peer-iface NAME2, not --tap".into(),
            true,
        ));
    };
    let (Some(peer), Some((peer_ip, peer_prefix))) = (&args.peer_iface, args.peer_ip) else {
        return Err((
            "bench over smoltcp needs --peer-iface NAME and --peer-ip ADDR/PREFIX (the server's end)".into(),
            true,
        ));
    };
    if peer_ip == config.ip {
        return Err((format!("--ip and --peer-ip are both {peer_ip}"), true));
    }
    let mut peer_config = iwarp::netdev::SmolConfig::new(peer_ip, peer_prefix);
    peer_config.offload = config.offload;
    let peer_dev = crate::transport::Dev::Raw(peer.clone());
    let namespaces = args.netns.clone().map(veth::Netns).zip(args.peer_netns.clone().map(veth::Netns));
    let (client, server, veth) = match namespaces {
        None => {
            let client = crate::transport::open_stack(&dev, config).map_err(|m| (m, false))?;
            let server = crate::transport::open_stack(&peer_dev, peer_config).map_err(|m| (m, false))?;
            (client, server, None)
        }
        Some((ns, peer_ns)) => {
            let in_ns = |ns: &veth::Netns, dev: &crate::transport::Dev, config| {
                ns.run(|| crate::transport::open_stack(dev, config))
                    .map_err(|e| (e.to_string(), false))?
                    .map_err(|m| (m, false))
            };
            let client = in_ns(&ns, &dev, config)?;
            let server = in_ns(&peer_ns, &peer_dev, peer_config)?;
            let path = veth::VethPath::new(ns, peer_ns, peer).map_err(|e| (e.to_string(), false))?;
            (client, server, Some(path))
        }
    };
    if let Some(path) = &args.pcap {
        crate::transport::capture(&client, path).map_err(|m| (m, false))?;
    }
    Ok(Some(((client, server), veth)))
}

/// Runs the subcommand and returns the exit status.
pub(crate) fn run(args: &Args) -> ExitCode {
    if let Some(p) = args.pin {
        let conflict = if args.device.is_some() {
            Some("--device")
        } else if args.shared_device {
            Some("--shared-device (one engine serves both ends)")
        } else if args.transport.smoltcp() {
            Some("--transport smoltcp")
        } else {
            None
        };
        if let Some(c) = conflict {
            eprintln!("error: bench: --pin puts each end on its own CPU; it cannot be used with {c}");
            return ExitCode::from(2);
        }
        if let Err(m) = pin::set(p) {
            eprintln!("error: bench: {m}");
            return ExitCode::from(2);
        }
    }
    if let Some(name) = &args.device {
        return run_device(args, name);
    }
    if args.interleave == Some(OnOff::On) && (raw_busy(args) || args.transport.smoltcp()) {
        eprintln!(
            "error: bench: --interleave on needs the blocking raw-TCP baseline of adaptive or event mode over kernel TCP (with --poll {} {}, it would spin beside this stack's turns)",
            args.poll.name(),
            if args.transport.smoltcp() { "over smoltcp" } else { "the baseline busy-polls" }
        );
        return ExitCode::from(2);
    }
    let (stacks, veth) = match open_stacks(args) {
        Ok(Some((s, v))) => (Some(s), v),
        Ok(None) => (None, None),
        Err((m, usage)) => {
            eprintln!("error: bench: {m}");
            return ExitCode::from(if usage { 2 } else { EXIT_FAILED });
        }
    };
    let result = measure(args, stacks.as_ref(), veth.as_ref());
    if let Some((client, _)) = &stacks
        && let Err(e) = client.flush_capture()
    {
        eprintln!("bench: writing the capture: {e}");
    }
    match result {
        Ok(report) => {
            if let Some(path) = &args.plot {
                let title = config_line(args, &report).lines().next().unwrap_or_default().to_owned();
                if let Err(e) = std::fs::write(path, plot::svg(&title, &ops(args), &report.rows)) {
                    eprintln!("error: bench: cannot write {}: {e}", path.display());
                    return ExitCode::from(EXIT_FAILED);
                }
            }
            let text = if args.json { json_report(args, &report) } else { text_report(args, &report) };
            let mut stdout = std::io::stdout().lock();
            // A closed pipe (`| head`) is not an error worth reporting.
            let _ = stdout.write_all(text.as_bytes()).and_then(|()| stdout.flush());
            ExitCode::SUCCESS
        }
        Err(e) => {
            eprintln!("error: bench: {e}");
            if let Some((client, server)) = &stacks {
                // What the devices saw: losses, drops in the kernel, errors.
                eprintln!("bench: client device {:?}", client.device_stats());
                eprintln!("bench: server device {:?}", server.device_stats());
            }
            ExitCode::from(EXIT_FAILED)
        }
    }
}

/// `--device`: the device and the engine through the seam, and their ratios.
fn run_device(args: &Args, name: &str) -> ExitCode {
    let open = |n: &str| {
        device::open(n).map_err(|e| {
            eprintln!("error: bench: --device {n}: {e}");
            ExitCode::from(EXIT_FAILED)
        })
    };
    let (dev, engine) = match (open(name), open(iwarp::backend::ENGINE_DEVICE)) {
        (Ok(d), Ok(e)) => (d, e),
        (Err(code), _) | (_, Err(code)) => return code,
    };
    let sizes = if args.sizes.is_empty() { DEFAULT_SIZES.to_vec() } else { args.sizes.clone() };
    let duration = args.duration.unwrap_or(DEFAULT_DURATION);
    let mut rows = Vec::new();
    if !args.json {
        println!(
            "device {name} ({}) against the userspace engine, both through the backend seam",
            dev.info().transport
        );
        println!(
            "{:<6} {:>8} {:>12} {:>12} {:>7} {:>12} {:>12} {:>7}",
            "op", "size", "dev GB/s", "iwarp GB/s", "ratio", "dev Mmsg/s", "iwarp Mm/s", "ratio"
        );
    }
    for op in ops(args) {
        for &size in &sizes {
            if !args.quiet {
                eprintln!("bench: {} {} on {name} and on the engine", op.name(), show_size(size));
            }
            let measured =
                device::measure(&dev, args.device_addr, op, size, args.window, duration).and_then(|d| {
                    device::measure(&engine, args.device_addr, op, size, args.window, duration)
                        .map(|e| (d, e))
                });
            let (d, e) = match measured {
                Ok(pair) => pair,
                Err(m) => {
                    eprintln!("error: bench: {} {}: {m}", op.name(), show_size(size));
                    return ExitCode::from(EXIT_FAILED);
                }
            };
            let (bw, rate) = (d.bytes_per_s / e.bytes_per_s, d.msgs_per_s / e.msgs_per_s);
            if args.json {
                rows.push(json!({
                    "op": op.name(), "size": size,
                    "device_bytes_per_s": d.bytes_per_s, "engine_bytes_per_s": e.bytes_per_s,
                    "device_msgs_per_s": d.msgs_per_s, "engine_msgs_per_s": e.msgs_per_s,
                    "bandwidth_ratio": bw, "rate_ratio": rate,
                }));
            } else {
                println!(
                    "{:<6} {:>8} {:>12.3} {:>12.3} {:>7.2} {:>12.3} {:>12.3} {:>7.2}",
                    op.name(),
                    show_size(size),
                    d.bytes_per_s / 1e9,
                    e.bytes_per_s / 1e9,
                    bw,
                    d.msgs_per_s / 1e6,
                    e.msgs_per_s / 1e6,
                    rate
                );
            }
        }
    }
    if args.json {
        println!(
            "{}",
            json!({ "device": name, "transport": dev.info().transport.to_string(), "rows": rows })
        );
    }
    ExitCode::SUCCESS
}

fn ops(args: &Args) -> Vec<Op> {
    let mut ops = if args.ops.is_empty() { vec![Op::Write, Op::Read, Op::Send] } else { args.ops.clone() };
    let mut seen = Vec::new();
    ops.retain(|o| {
        let new = !seen.contains(o);
        seen.push(*o);
        new
    });
    ops
}

fn sizes(args: &Args) -> Vec<usize> {
    let mut sizes = if args.sizes.is_empty() { DEFAULT_SIZES.to_vec() } else { args.sizes.clone() };
    let mut seen = Vec::new();
    sizes.retain(|s| {
        let new = !seen.contains(s);
        seen.push(*s);
        new
    });
    sizes
}

fn gap(args: &Args) -> Duration {
    args.gap.unwrap_or(Duration::ZERO)
}

/// Whether the ping-pongs' baseline takes turns with this stack's (`--interleave`): where the
/// baseline blocks over kernel TCP, unless turned off.
fn interleave(args: &Args) -> bool {
    args.interleave != Some(OnOff::Off) && !raw_busy(args) && !args.transport.smoltcp()
}

fn budget(args: &Args) -> Budget {
    Budget { iters: args.iters, duration: args.duration.unwrap_or(DEFAULT_DURATION) }
}

/// Whether the raw-TCP ping-pong busy-polls (as the engine's thread or the inline
/// application thread does).
fn raw_busy(args: &Args) -> bool {
    matches!(args.poll, Poll::Busy | Poll::Inline)
}

fn measure(
    args: &Args,
    stacks: Option<&Stacks>,
    veth: Option<&veth::VethPath>,
) -> Result<Report, BenchError> {
    let (ops, sizes, budget) = (ops(args), sizes(args), budget(args));
    // [n/N] on every progress line: the baseline's sizes, then each operation at each size.
    let per_window = stacks.is_none() && veth.is_none();
    // With several queue pairs, the stream over as many connections too (per size).
    let conn_count = (per_window && args.qps > 1).then_some(usize::from(args.qps));
    // Writes measure it in their rounds (`write_rounds`), unless busy engine threads would
    // spin beside it: the baseline phase measures it for the other operations and for those.
    let rounds_conns = conn_count.filter(|_| args.poll != Poll::Busy);
    let apart_conns = conn_count.filter(|_| rounds_conns.is_none() || ops.iter().any(|&o| o != Op::Write));
    let total = sizes.len()
        + usize::from(!sizes.contains(&RATE_SIZE))
        + usize::from(per_window)
        + apart_conns.map_or(0, |_| sizes.len())
        + ops.len() * sizes.len()
        + one_qp_writes(args) * sizes.len();
    let done = std::cell::Cell::new(0usize);
    let progress = |line: String| {
        if !args.quiet {
            done.set(done.get() + 1);
            eprintln!("bench: [{}/{total}] {line}", done.get().min(total));
        }
    };
    // The baseline first, before the engine's thread starts (a busy one takes a core).
    let mut raw_rows = BTreeMap::new();
    let mut raw_sizes = sizes.clone();
    if !sizes.contains(&RATE_SIZE) {
        raw_sizes.push(RATE_SIZE);
    }
    let mut kernel_rows = BTreeMap::new();
    for &size in &raw_sizes {
        let (stream, ping_pong, frames) = match stacks {
            Some((client, server)) => {
                let kernel = raw::stream(size, &budget, veth, None)?;
                if !args.quiet {
                    eprintln!(
                        "bench: kernel TCP ({}) {:>5}: {:8.3} GB/s",
                        if veth.is_some() { "veth pair" } else { "127.0.0.1" },
                        show_size(size),
                        kernel.gbyte_s()
                    );
                }
                kernel_rows.insert(size, kernel);
                let (stream, cost) = smolraw::stream(client, server, size, &budget)?;
                let ping_pong = if sizes.contains(&size) {
                    smolraw::ping_pong(client, server, size, &budget)?
                } else {
                    Latency::default()
                };
                (stream, ping_pong, Some(cost))
            }
            None => {
                let stream = raw::stream(size, &budget, None, None)?;
                let ping_pong = if sizes.contains(&size) && !interleave(args) {
                    raw::ping_pong(size, &budget, raw_busy(args), gap(args))?
                } else {
                    Latency::default()
                };
                (stream, ping_pong, None)
            }
        };
        progress(format!(
            "{} {:>5}: {:8.3} GB/s {:8.3} Mmsg/s  {}",
            if stacks.is_some() { "smoltcp raw TCP" } else { "raw TCP" },
            show_size(size),
            stream.gbyte_s(),
            stream.mmsg_s(),
            if !sizes.contains(&size) {
                String::new()
            } else if interleave(args) {
                "ping-pong: in turns with each operation's".to_string()
            } else {
                format!("ping-pong p50 {:.1} us", ping_pong.p50_us)
            }
        ));
        let conns = match apart_conns {
            Some(n) if sizes.contains(&size) => {
                let per_pair = rdma::per_pair(usize::from(args.window), n);
                let t = raw::streams(size, &budget, n, per_pair)?;
                progress(format!(
                    "raw TCP {:>5} over {n} connections: {:8.3} GB/s {:8.3} Mmsg/s",
                    show_size(size),
                    t.gbyte_s(),
                    t.mmsg_s()
                ));
                Some(t)
            }
            _ => None,
        };
        raw_rows.insert(size, RawRow { stream, ping_pong, ping_pong_turns: None, frames, conns });
    }
    let raw_per_window = if per_window {
        let t = raw_per_window(usize::from(args.window), &budget)?;
        progress(format!(
            "raw TCP    {:>5}, {} per write: {:8.3} Mmsg/s",
            show_size(RATE_SIZE),
            args.window,
            t.mmsg_s()
        ));
        Some(t)
    } else {
        None
    };
    let cfg = rdma::Config {
        poll: args.poll.mode(),
        crc: args.crc == OnOff::On,
        revision: args.mpa_rev,
        qps: usize::from(args.qps),
        window: usize::from(args.window),
        cq_mod: usize::from(args.cq_mod),
        rx_depth: usize::from(args.rx_depth),
        shared_device: args.shared_device,
        zero_copy: args.zero_copy == OnOff::On,
        gap: gap(args),
        max_size: sizes.iter().copied().chain([RATE_SIZE]).max().unwrap_or(RATE_SIZE),
        pcap: match &args.pcap {
            Some(path) => Some(
                iwarp::netdev::PcapWriter::create(path)
                    .map_err(|e| BenchError(format!("cannot create {}: {e}", path.display())))?
                    .shared(),
            ),
            None => None,
        },
        smol: stacks.cloned(),
    };
    let mut bench = rdma::Bench::open(cfg)?;
    let negotiated = bench.negotiated();
    let idle_bytes_per_qp = bench.idle_bytes_per_qp();
    // Pinned: every thread and its CPUs, taken once the first ping-pong is over (below).
    let mut threads = None;
    let mut rows = Vec::new();
    for &op in &ops {
        for &size in &sizes {
            let mut raw = raw_rows
                .get(&size)
                .copied()
                .ok_or_else(|| BenchError(format!("no raw-TCP row for {size} B")))?;
            let (bw, one_qp, rounds) = if op == Op::Write && args.qps > 1 {
                let (bw, one, raw_conns, rounds) =
                    write_rounds(&mut bench, size, &budget, rounds_conns, args.window)?;
                raw.conns = raw_conns.or(raw.conns);
                (bw, Some(one), Some(rounds))
            } else {
                (bench.throughput(op, size, &budget).map_err(|e| bench.explain(e))?, None, None)
            };
            // The raw echo this stack's ping-pong takes turns with, open until the threads
            // are listed below.
            let mut echo = None;
            let lat = if interleave(args) {
                // The time of both ping-pongs measured apart.
                let both = Budget { duration: budget.duration * 2, ..budget };
                let e = echo.insert(raw::Echo::open(size, false)?);
                let (lat, raw_lat, turns) =
                    bench.latency(op, size, &both, Some(e)).map_err(|e| bench.explain(e))?;
                raw.ping_pong = raw_lat;
                raw.ping_pong_turns = Some(turns);
                lat
            } else {
                bench.latency(op, size, &budget, None).map_err(|e| bench.explain(e))?.0
            };
            // Every thread has answered a ping by now, so it runs where it pinned itself.
            if pin::pinned().is_some() && threads.is_none() {
                threads = Some(pin::threads());
            }
            if let Some(e) = echo {
                e.close()?;
            }
            let row = Row { op, size, bw, lat, raw, kernel: kernel_rows.get(&size).copied(), one_qp, rounds };
            progress(format!(
                "{:<5} {:>5}: {:8.3} GB/s ({:.2}x raw) {:8.3} Mmsg/s  ping-pong p50 {:.1} us ({:.2}x raw{})",
                op.name(),
                show_size(size),
                bw.gbyte_s(),
                row.bw_ratio(),
                bw.mmsg_s(),
                lat.p50_us,
                row.lat_ratio(),
                if interleave(args) {
                    format!(" {:.1} us, in turns", raw.ping_pong.p50_us)
                } else {
                    String::new()
                }
            ));
            if let (Some(one), Some(rounds)) = (row.one_qp, row.rounds) {
                progress(format!(
                    "{:<5} {:>5} over one QP: {:8.3} GB/s (over {} QPs / over one {:.2}; {} rounds {:.2}-{:.2})",
                    op.name(),
                    show_size(size),
                    one.gbyte_s(),
                    args.qps,
                    row.one_qp_ratio().unwrap_or(0.0),
                    rounds.n,
                    rounds.one_qp.min,
                    rounds.one_qp.max,
                ));
            }
            rows.push(row);
        }
    }
    let raw_rate =
        raw_rows.get(&RATE_SIZE).map(|r| r.stream).ok_or_else(|| BenchError("no raw-TCP 64 B row".into()))?;
    let iwarp_rate = match rows.iter().find(|r| r.op == Op::Send && r.size == RATE_SIZE) {
        Some(r) => r.bw,
        None => bench.throughput(Op::Send, RATE_SIZE, &budget).map_err(|e| bench.explain(e))?,
    };
    let (received, sent, engines) = (bench.received(), bench.sent(), bench.engines());
    bench.close();
    Ok(Report {
        rows,
        rate: RateSummary { iwarp: iwarp_rate, raw: raw_rate, raw_per_window },
        negotiated,
        idle_bytes_per_qp,
        received,
        sent,
        engines,
        offloads: stacks.map(|(c, s)| (c.offloads(), s.offloads())),
        threads,
    })
}

/// The rounds of a Write measurement over several queue pairs ([`write_rounds`]).
const WRITE_ROUNDS: u32 = 5;

/// Writes over every queue pair, over the first alone with the whole window, and (with
/// `conns`, the number of connections) raw TCP over as many connections, taking turns for
/// [`WRITE_ROUNDS`] rounds of that share of the budget each, the order rotating from one round to
/// the next: each round's ratios compare measurements made within about a second of each
/// other. Measured one after the other, each for the whole budget, the aggregate over 1,000
/// pairs against one pair came out at 0.56-0.90 and against raw TCP at 0.61-1.01 in eight
/// runs of one binary on a shared machine. The sums of the rounds, and how the ratios
/// spread over them.
fn write_rounds(
    bench: &mut rdma::Bench,
    size: usize,
    budget: &Budget,
    conns: Option<usize>,
    window: u16,
) -> Result<(Throughput, Throughput, Option<Throughput>, Rounds), BenchError> {
    let slice = Budget {
        iters: budget.iters.map(|n| n.div_ceil(u64::from(WRITE_ROUNDS)).max(1)),
        duration: budget.duration / WRITE_ROUNDS,
    };
    let mut per_round = Vec::new();
    for round in 0..WRITE_ROUNDS {
        let (mut all, mut one, mut raw) = (None, None, None);
        for turn in 0..3 {
            match (round + turn) % 3 {
                0 => all = Some(bench.throughput(Op::Write, size, &slice).map_err(|e| bench.explain(e))?),
                1 => one = Some(bench.throughput_one(size, &slice).map_err(|e| bench.explain(e))?),
                _ => {
                    if let Some(n) = conns {
                        raw = Some(raw::streams(size, &slice, n, rdma::per_pair(usize::from(window), n))?);
                    }
                }
            }
        }
        let (Some(all), Some(one)) = (all, one) else {
            return Err(BenchError("a round of Writes measured nothing".into()));
        };
        per_round.push((all, one, raw));
    }
    let zero = Throughput { msgs: 0, bytes: 0, secs: 0.0 };
    let all = per_round.iter().map(|r| r.0).fold(zero, Throughput::plus);
    let one = per_round.iter().map(|r| r.1).fold(zero, Throughput::plus);
    let raw = per_round.iter().filter_map(|r| r.2).reduce(Throughput::plus);
    let one_qp = Spread::of(per_round.iter().map(|r| ratio(r.0.gbyte_s(), r.1.gbyte_s())).collect())
        .ok_or_else(|| BenchError("no rounds".into()))?;
    let conns =
        Spread::of(per_round.iter().filter_map(|r| r.2.map(|c| ratio(r.0.gbyte_s(), c.gbyte_s()))).collect());
    Ok((all, one, raw, Rounds { n: per_round.len(), one_qp, conns }))
}

/// How many of the operations get a one-QP measurement beside the aggregate: Writes, with
/// `--qps` above 1 (`rdma::Bench::throughput_one`).
fn one_qp_writes(args: &Args) -> usize {
    usize::from(args.qps > 1 && ops(args).contains(&Op::Write))
}

/// The 64 B raw stream written `window` messages per system call. A Send completes once
/// handed to TCP and a sender keeps at most `window` of them outstanding, so no write of the
/// iWARP sender carries more than `window` messages; the plain stream's writes carry some
/// 3,000 (256 KiB), and on loopback the kernel's cost per write, not per byte, decides the
/// rate of small messages. This is the baseline that shares that bound.
fn raw_per_window(window: usize, budget: &Budget) -> Result<Throughput, BenchError> {
    raw::stream(RATE_SIZE, budget, None, Some(window))
}

fn config_line(args: &Args, report: &Report) -> String {
    let b = budget(args);
    let per = match b.iters {
        Some(n) => format!("{n} iterations"),
        None => format!("{} s", b.duration.as_secs_f64()),
    };
    let neg = match report.negotiated {
        Some(n) => format!(" (negotiated: CRC {}, rev {}, ORD {})", on_off(n.crc), n.revision, n.ord),
        None => String::new(),
    };
    let path = match (&args.transport.iface, &args.peer_iface) {
        (Some(a), Some(b)) if args.transport.smoltcp() => format!("smoltcp on {a} <-> {b}"),
        _ => "127.0.0.1".to_string(),
    };
    let raw_kind = if args.transport.smoltcp() { "smoltcp raw TCP" } else { "raw TCP" };
    let layout = match (args.shared_device, args.zero_copy == OnOff::On) {
        (true, true) => "client and server on one shared device",
        (false, true) => "client and server on separate devices (engines)",
        (true, false) => "client and server on one shared device, payloads copied (--zero-copy off)",
        (false, false) => {
            "client and server on separate devices (engines), payloads copied (--zero-copy off)"
        }
    };
    let gap =
        if gap(args).is_zero() { String::new() } else { format!(", {:?} between round trips", gap(args)) };
    let offloads = match report.offloads {
        Some((c, s)) => format!("smoltcp offloads: client {c}; server {s}\n"),
        None => String::new(),
    };
    let spinning = rdma::spinning_threads(args.poll.mode(), args.shared_device);
    let cores = rdma::cores();
    let crowded = if spinning > cores {
        format!(
            "{spinning} spinning threads (the benchmark's client and server{}) on {cores} core(s): a hand-over to a thread without a core of its own waits for the scheduler, and the latencies measure that as much as the stack{}\n",
            match (args.poll, args.shared_device) {
                (Poll::Busy, true) => ", the engine",
                (Poll::Busy, false) => ", the two engines",
                _ => "",
            },
            if args.poll == Poll::Busy {
                " (--poll inline spins two; busy mode is for machines with a core per spinning thread)"
            } else {
                ""
            },
        )
    } else {
        String::new()
    };
    let pinned = match (args.pin, &report.threads) {
        (Some(p), Some(threads)) => {
            let list: Vec<String> = threads.iter().map(|(n, c)| format!("{n} {c}")).collect();
            format!(
                "pinned (--pin): client CPU {}, server CPU {}; threads and their CPUs: {}\n",
                p.client,
                p.server,
                list.join(", ")
            )
        }
        _ => String::new(),
    };
    let memory = match report.idle_bytes_per_qp {
        Some(b) => {
            format!("memory per idle connection end: {:.1} KiB ({} QPs)\n", b as f64 / 1024.0, args.qps)
        }
        None => String::new(),
    };
    format!(
        "iwarp bench: {path}, CRC {}, MPA rev {}, poll {}, {} QP(s), window {}, CQ moderation {}, receive depth {}, {per} per measurement{neg}\n\
         {layout}; {raw_kind}: length-prefixed stream; {} ping-pong{gap}{}. Latency is the round trip.\n{crowded}{pinned}{offloads}{memory}",
        on_off(args.crc == OnOff::On),
        args.mpa_rev,
        args.poll.name(),
        args.qps,
        args.window,
        args.cq_mod,
        args.rx_depth,
        if raw_busy(args) { "busy-polling" } else { "blocking" },
        if interleave(args) { ", in turns with each operation's" } else { "" },
    )
}

/// Where the kernel-TCP comparison of a smoltcp run went.
fn kernel_path(args: &Args) -> &'static str {
    if args.netns.is_some() { "the same veth pair" } else { "127.0.0.1" }
}

fn on_off(b: bool) -> &'static str {
    if b { "on" } else { "off" }
}

fn text_report(args: &Args, report: &Report) -> String {
    let mut out = config_line(args, report);
    for op in ops(args) {
        out.push('\n');
        out.push_str(&format!("{}\n", op.name()));
        out.push_str(&format!(
            "{:>6} | {:>9} {:>9} {:>6} | {:>8} {:>6} | {:>22} {:>22} {:>6}\n",
            "size",
            "iwarp GB/s",
            "raw GB/s",
            "ratio",
            "Mmsg/s",
            "ratio",
            "iwarp p50/p99/p99.9 us",
            "raw p50/p99/p99.9 us",
            "ratio"
        ));
        for r in report.rows.iter().filter(|r| r.op == op) {
            let iw = format!("{:.1}/{:.1}/{:.1}", r.lat.p50_us, r.lat.p99_us, r.lat.p999_us);
            let raw = format!(
                "{:.1}/{:.1}/{:.1}",
                r.raw.ping_pong.p50_us, r.raw.ping_pong.p99_us, r.raw.ping_pong.p999_us
            );
            out.push_str(&format!(
                "{:>6} | {:>10.3} {:>9.3} {:>6.2} | {:>8.3} {:>6.2} | {:>22} {:>22} {:>6.2}\n",
                show_size(r.size),
                r.bw.gbyte_s(),
                r.raw.stream.gbyte_s(),
                r.bw_ratio(),
                r.bw.mmsg_s(),
                r.rate_ratio(),
                iw,
                raw,
                r.lat_ratio()
            ));
        }
    }
    if report.rows.iter().any(|r| r.kernel.is_some()) {
        out.push_str(&format!(
            "\nbandwidth: iwarp over smoltcp / smoltcp raw TCP (goal >= 0.8), and / kernel TCP over {} (goal >= 0.5)\n",
            kernel_path(args)
        ));
        for r in report.rows.iter().filter(|r| r.kernel.is_some()) {
            let kernel = r.kernel.map_or(0.0, |k| k.gbyte_s());
            out.push_str(&format!(
                "{:<5} {:>6}: iwarp {:.3} GB/s, smoltcp raw {:.3} GB/s, ratio {:.2}; kernel TCP {:.3} GB/s, iwarp/kernel {:.2}\n",
                r.op.name(),
                show_size(r.size),
                r.bw.gbyte_s(),
                r.raw.stream.gbyte_s(),
                r.bw_ratio(),
                kernel,
                ratio(r.bw.gbyte_s(), kernel)
            ));
        }
    }
    if report.rows.iter().any(|r| r.raw.conns.is_some() || r.one_qp.is_some()) {
        let qps = args.qps;
        let per_pair = rdma::per_pair(usize::from(args.window), usize::from(qps));
        out.push_str(&format!("\nbandwidth over {qps} QPs"));
        if report.rows.iter().any(|r| r.one_qp.is_some()) {
            out.push_str(&format!(
                " against one QP in the same run (Writes: the whole window of {} on the first QP);",
                args.window
            ));
        }
        if report.rows.iter().any(|r| r.raw.conns.is_some()) {
            out.push_str(&format!(
                " against raw TCP over {qps} connections, {per_pair} message(s) per connection per write (at most 4 MiB; the table's ratio is against one connection), and raw TCP's own change from one connection to {qps}"
            ));
        }
        if let Some(n) = report.rows.iter().find_map(|r| r.rounds.map(|x| x.n)) {
            out.push_str(&format!(
                ". Writes over all QPs, over one{} take turns in {n} rounds; the ratios are of their sums, and how they spread over the rounds",
                if report.rows.iter().any(|r| r.rounds.is_some_and(|x| x.conns.is_some())) {
                    " and raw TCP over as many connections"
                } else {
                    ""
                }
            ));
        }
        out.push('\n');
        for r in report.rows.iter() {
            if r.raw.conns.is_none() && r.one_qp.is_none() {
                continue;
            }
            out.push_str(&format!(
                "{:<5} {:>6}: iwarp {:.3} GB/s",
                r.op.name(),
                show_size(r.size),
                r.bw.gbyte_s()
            ));
            let spread = |s: Option<Spread>| match s {
                Some(s) => format!(" (rounds {:.2}-{:.2}, median {:.2})", s.min, s.max, s.median),
                None => String::new(),
            };
            if let (Some(o), Some(q)) = (r.one_qp, r.one_qp_ratio()) {
                out.push_str(&format!(
                    ", over one QP {:.3} GB/s, over {qps} / over one {q:.2}{}",
                    o.gbyte_s(),
                    spread(r.rounds.map(|x| x.one_qp))
                ));
            }
            if let (Some(c), Some(q)) = (r.raw.conns, r.conns_ratio()) {
                out.push_str(&format!(
                    "; raw TCP over {qps} connections {:.3} GB/s, ratio {q:.2}{}; raw over {qps} / raw over one {:.2}",
                    c.gbyte_s(),
                    spread(r.rounds.and_then(|x| x.conns)),
                    ratio(c.gbyte_s(), r.raw.stream.gbyte_s())
                ));
            }
            out.push('\n');
        }
    }
    if report.rows.iter().any(|r| r.raw.frames.is_some()) {
        out.push_str(
            "\nsmoltcp raw TCP frames through the two devices (sent and received), per second and per CPU-second (per core busy)\n",
        );
        let mut seen = Vec::new();
        for r in report.rows.iter() {
            let Some(f) = r.raw.frames else { continue };
            if seen.contains(&r.size) {
                continue;
            }
            seen.push(r.size);
            out.push_str(&format!(
                "{:>6}: {:.0} kframes/s, {:.0} kframes per CPU-second, {:.2} cores busy, {:.0} stream bytes per frame sent and received\n",
                show_size(r.size),
                f.per_sec() / 1e3,
                f.per_cpu_sec() / 1e3,
                f.cpu_secs / f.secs.max(1e-9),
                r.raw.stream.bytes as f64 / f.frames.max(1) as f64
            ));
        }
    }
    let rate = report.rate;
    out.push_str(&format!(
        "\n64 B message rate: iwarp send {:.3} Mmsg/s, raw TCP stream {:.3} Mmsg/s, ratio {:.2}\n",
        rate.iwarp.mmsg_s(),
        rate.raw.mmsg_s(),
        ratio(rate.iwarp.mmsg_s(), rate.raw.mmsg_s())
    ));
    if let Some(w) = rate.raw_per_window {
        out.push_str(&format!(
            "64 B message rate against raw TCP written {} messages per system call (no write of a sender with {} Sends outstanding carries more): {:.3} Mmsg/s, ratio {:.2}\n",
            args.window,
            args.window,
            w.mmsg_s(),
            ratio(rate.iwarp.mmsg_s(), w.mmsg_s())
        ));
    }
    let (bytes, in_place) = report.received;
    out.push_str(&format!(
        "received: {:.1} MB, {:.0}% read straight into registered memory (the rest copied from a receive buffer)\n",
        bytes as f64 / 1e6,
        100.0 * ratio(in_place as f64, bytes as f64)
    ));
    let (bytes, by_ref, staged, moved) = report.sent;
    out.push_str(&format!(
        "sent: {:.1} MB, at least {:.0}% written straight from registered memory, {:.0}% copied into a transmit buffer as framed ({:.0}% to keep the kernel's copy off a slow distance), {:.0}% copied for a full link\n",
        bytes as f64 / 1e6,
        100.0 * ratio((by_ref.saturating_sub(staged)) as f64, bytes as f64),
        100.0 * ratio((bytes - by_ref) as f64, bytes as f64),
        100.0 * ratio(moved as f64, bytes as f64),
        100.0 * ratio(staged as f64, bytes as f64)
    ));
    for (name, e) in &report.engines {
        out.push_str(&format!(
            "engine ({name}): slept {} times ({} of them on the doorbell alone while an application thread handled input; {} sleeps made deaf to the links by a posting thread), woken {} times by events and {} by timeouts; {} passes, {} of them run by a posting thread; waiting application threads slept {} times in a queue's poll (arming its timer {} times) and found input in {} passes of their own; the engine thread left input to a thread holding the engine's lock {} times; its adaptive spin found the core taken by another thread and slept {} times, and it offered the core to a waiting application thread after {} passes\n",
            e.sleeps,
            e.quiet_sleeps,
            e.deafened,
            e.event_wakeups,
            e.timer_wakeups,
            e.passes,
            e.direct_passes,
            e.app_polls,
            e.alarms,
            e.waiting_passes,
            e.handoffs,
            e.contended_yields,
            e.waiter_yields,
        ));
    }
    out
}

/// Each engine's counters (`EngineStats`) in `--json`.
fn engines_json(report: &Report) -> Value {
    let engines = report.engines.iter().map(|(name, e)| {
        json!({
            "device": name,
            "passes": e.passes,
            "direct_passes": e.direct_passes,
            "sleeps": e.sleeps,
            "event_wakeups": e.event_wakeups,
            "timer_wakeups": e.timer_wakeups,
            "app_polls": e.app_polls,
            "waiting_passes": e.waiting_passes,
            "handoffs": e.handoffs,
            "quiet_sleeps": e.quiet_sleeps,
            "deafened": e.deafened,
            "contended_yields": e.contended_yields,
            "waiter_yields": e.waiter_yields,
            "alarms": e.alarms,
        })
    });
    Value::Array(engines.collect())
}

/// `--pin` in the JSON document: the two CPUs and every thread with the CPUs it may run on.
fn pin_json(args: &Args, report: &Report) -> Value {
    let Some(p) = args.pin else { return Value::Null };
    let threads: Vec<Value> =
        report.threads.iter().flatten().map(|(n, c)| json!({ "name": n, "cpus": c })).collect();
    json!({ "client": p.client, "server": p.server, "threads": threads })
}

fn json_report(args: &Args, report: &Report) -> String {
    let b = budget(args);
    let rows: Vec<Value> = report
        .rows
        .iter()
        .map(|r| {
            let mut iwarp = r.bw.to_json();
            let mut raw = r.raw.stream.to_json();
            if let (Value::Object(i), Value::Object(l)) = (&mut iwarp, r.lat.to_json()) {
                i.extend(l);
            }
            if let (Value::Object(i), Value::Object(l)) = (&mut raw, r.raw.ping_pong.to_json()) {
                i.extend(l);
                i.insert("ping_pong_turns".into(), json!(r.raw.ping_pong_turns));
            }
            json!({
                "op": r.op.name(),
                "size": r.size,
                "iwarp": iwarp,
                "raw": raw,
                "kernel_tcp": r.kernel.map(|k| k.to_json()),
                "raw_frames": r.raw.frames.map(|f| f.to_json()),
                "raw_conns": r.raw.conns.map(|c| c.to_json()),
                "iwarp_one_qp": r.one_qp.map(|o| o.to_json()),
                "write_rounds": r.rounds.map(|x| x.n),
                "ratio": {
                    "bandwidth": r.bw_ratio(),
                    "bandwidth_conns": r.conns_ratio(),
                    "bandwidth_one_qp": r.one_qp_ratio(),
                    "bandwidth_one_qp_rounds": r.rounds.map(|x| x.one_qp.to_json()),
                    "bandwidth_conns_rounds": r.rounds.and_then(|x| x.conns).map(|s| s.to_json()),
                    "msg_rate": r.rate_ratio(),
                    "p50": r.lat_ratio(),
                },
            })
        })
        .collect();
    let credits =
        rdma::send_credits(usize::from(args.window), usize::from(args.qps), usize::from(args.rx_depth));
    let mut doc = json!({
        "config": {
            "ops": ops(args).iter().map(|o| o.name()).collect::<Vec<_>>(),
            "sizes": sizes(args),
            "iters": b.iters,
            "duration_s": if b.iters.is_some() { None } else { Some(b.duration.as_secs_f64()) },
            "crc": args.crc == OnOff::On,
            "mpa_revision": args.mpa_rev,
            "poll": args.poll.name(),
            "transport": if args.transport.smoltcp() { "smoltcp" } else { "kernel" },
            "kernel_tcp_path": args.transport.smoltcp().then(|| kernel_path(args)),
            "offloads": report.offloads.map(|(c, s)| json!({ "client": c.to_string(), "server": s.to_string() })),
            "qps": args.qps,
            "window": args.window,
            "cq_mod": args.cq_mod,
            "rx_depth": args.rx_depth,
            "send_credits_per_qp": credits,
            "raw_ping_pong": match (raw_busy(args), interleave(args)) {
                (true, _) => "busy-poll",
                (false, true) => "blocking, in turns",
                (false, false) => "blocking",
            },
            "shared_device": args.shared_device,
            "spinning_threads": rdma::spinning_threads(args.poll.mode(), args.shared_device),
            "cores": rdma::cores(),
            "zero_copy": args.zero_copy == OnOff::On,
            "gap_us": gap(args).as_secs_f64() * 1e6,
            "idle_bytes_per_qp": report.idle_bytes_per_qp,
            "rx_bytes": report.received.0,
            "rx_in_place_bytes": report.received.1,
            "tx_bytes": report.sent.0,
            "tx_by_ref_bytes": report.sent.1,
            "tx_staged_bytes": report.sent.2,
            "engines": engines_json(report),
            "latency": "round trip",
            "negotiated": report.negotiated.map(|n| json!({
                "crc": n.crc, "mpa_revision": n.revision, "ord": n.ord,
            })),
        },
        "rows": rows,
        "msg_rate_64": {
            "iwarp_send_mmsg_s": report.rate.iwarp.mmsg_s(),
            "raw_mmsg_s": report.rate.raw.mmsg_s(),
            "ratio": ratio(report.rate.iwarp.mmsg_s(), report.rate.raw.mmsg_s()),
            "raw_per_window_mmsg_s": report.rate.raw_per_window.map(|w| w.mmsg_s()),
            "ratio_per_window": report.rate.raw_per_window.map(|w| ratio(report.rate.iwarp.mmsg_s(), w.mmsg_s())),
        },
    });
    // Beside the other byte counts (one more inside the macro passes its recursion limit).
    doc["config"]["tx_moved_bytes"] = json!(report.sent.3);
    doc["config"]["pin"] = pin_json(args, report);
    let mut s = serde_json::to_string_pretty(&doc).unwrap_or_else(|e| format!("{{\"error\": \"{e}\"}}"));
    s.push('\n');
    s
}
