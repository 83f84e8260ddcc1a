//! The command line and the run's parameters: perftest's flags and defaults, and the
//! adjustments perftest makes to them (iterations, sizes, the agreed cycle buffer).

use std::path::PathBuf;
use std::time::Duration;

/// perftest's port.
pub(super) const DEFAULT_PORT: u16 = 18515;
/// perftest's largest message size (`MAX_SIZE`, 8 MiB).
pub(super) const MAX_SIZE: u32 = 8 << 20;
/// Our cycle buffer (the page size) and cache line size, sent in messages 2 and 3.
pub(super) const CYCLE_BUFFER: u32 = 4096;
/// Cache line size.
pub(super) const CACHE_LINE: u32 = 64;
/// The verbs MTU enum we report: 3 = 1024 bytes, what siw shows on a 1500-byte netdev.
pub(super) const MTU_ENUM: u8 = 3;
/// Outstanding reads on the read test's data connection (siw's `max_qp_rd_atom`).
pub(super) const MAX_OUT_READS: u16 = 128;
/// perftest's RESULT_LINE.
pub(super) const RESULT_LINE: &str =
    "---------------------------------------------------------------------------------------";
/// Iterations above which the peak is estimated from a sample of windows.
pub(super) const PEAK_FULL_LIMIT: usize = 4000;

/// The test to run.
#[derive(Debug, Clone, Copy, PartialEq, Eq, clap::ValueEnum)]
pub(crate) enum Test {
    /// RDMA Write bandwidth (ib_write_bw).
    Write,
    /// RDMA Read bandwidth (ib_read_bw).
    Read,
    /// Send bandwidth (ib_send_bw, with perftest's iWARP credit flow control).
    Send,
}

/// Measure bandwidth as perftest's `ib_write_bw -R`, `ib_read_bw -R` or `ib_send_bw -R`,
/// interoperating with them (perftest 4.5-0.17, e.g. over Linux siw).
///
/// Without an address it runs the server: it listens on the port (all addresses unless
/// --bind) and serves one client. With an address it runs the client, which opens perftest's
/// two rdma_cm connections (control, then data), exchanges keys with Sends, runs the test and
/// prints perftest's table. Write/read: the server prints the client's numbers; send: each
/// side prints its own (the server's peak is 0.00, as perftest's).
///
/// -R is implied (perftest over iWARP needs it) and -F is accepted for compatibility. Both
/// sides must agree on -s, -n/-D and --report_gbits, as with perftest.
///
/// Against Linux siw 6.1 no flag is needed: siw may leave a first message that follows its MPA
/// Reply at once unread, and the client nudges it (docs/siw-quirks.md).
///
/// Exit status: 0 when the test ran, 1 on a failure (refused, rejected, a Terminate, a
/// timeout, a peer that does not speak the protocol; one line on stderr names the cause), 2
/// on bad flags.
#[derive(Debug, clap::Args)]
pub(crate) struct Args {
    /// The test: write, read or send.
    #[arg(value_enum)]
    pub(super) test: Test,
    /// The server's address: run the client. Without it, run the server.
    #[arg(value_name = "ADDRESS")]
    pub(super) address: Option<String>,
    /// Message size in bytes (1 to 8388608).
    #[arg(short = 's', long = "size", default_value_t = 65536,
          value_parser = clap::value_parser!(u32).range(1..=i64::from(MAX_SIZE)))]
    pub(super) size: u32,
    /// Messages to send [default: 5000 for write, 1000 for read and send]; at least 5.
    #[arg(short = 'n', long = "iters", value_parser = clap::value_parser!(u64).range(5..=100_000_000))]
    pub(super) iters: Option<u64>,
    /// Run for SECS seconds instead of a number of messages (both sides need the same -D).
    #[arg(short = 'D', long = "duration", value_name = "SECS", conflicts_with = "iters",
          value_parser = clap::value_parser!(u64).range(1..=86_400))]
    pub(super) duration: Option<u64>,
    /// TCP port of both connections.
    #[arg(short = 'p', long = "port", default_value_t = DEFAULT_PORT)]
    pub(super) port: u16,
    /// Send queue depth (cut to -n).
    #[arg(short = 't', long = "tx-depth", default_value_t = 128,
          value_parser = clap::value_parser!(u32).range(1..=8192))]
    pub(super) tx_depth: u32,
    /// Receive queue depth of send (cut to -n, rounded up to even).
    #[arg(short = 'r', long = "rx-depth", default_value_t = 512,
          value_parser = clap::value_parser!(u32).range(1..=8192))]
    pub(super) rx_depth: u32,
    /// Signal every N-th work request (cut to the tx depth; 1 for sizes above 8192).
    #[arg(short = 'Q', long = "cq-mod", default_value_t = 100,
          value_parser = clap::value_parser!(u32).range(1..=8192))]
    pub(super) cq_mod: u32,
    /// Outstanding RDMA Reads (read test), at most 128.
    #[arg(short = 'o', long = "outs", default_value_t = MAX_OUT_READS,
          value_parser = clap::value_parser!(u16).range(1..=i64::from(MAX_OUT_READS)))]
    pub(super) outs: u16,
    /// Use rdma_cm for the data connection and the key exchange (always on: implied).
    #[arg(short = 'R', long = "rdma_cm")]
    pub(super) rdma_cm: bool,
    /// Do not fail on CPU frequency warnings (accepted, no effect).
    #[arg(short = 'F', long = "CPU-freq")]
    pub(super) cpu_freq: bool,
    /// Device name shown in the table (perftest's -d) [default: --device's, else iwarp0].
    #[arg(short = 'd', long = "ib-dev", value_name = "NAME")]
    pub(super) ib_dev: Option<String>,
    /// Report bandwidth in Gb/sec instead of MB/sec (both sides need the same flag).
    #[arg(long = "report_gbits", alias = "report-gbits")]
    pub(super) report_gbits: bool,
    /// Ask for MPA CRC32c on both connections.
    #[arg(long)]
    pub(super) crc: bool,
    /// Client: milliseconds to wait between the MPA Reply and the first Send on each
    /// connection (not needed against Linux siw 6.1: the client nudges a peer that leaves it
    /// unread).
    #[arg(long, value_name = "MS", default_value_t = 0)]
    pub(super) first_fpdu_delay: u64,
    /// Server: the address to listen on [default: 0.0.0.0].
    #[arg(long, value_name = "ADDR")]
    pub(super) bind: Option<String>,
    /// Seconds a connection attempt or a control message may take (the data phase is not
    /// limited while the peer makes progress).
    #[arg(long, value_name = "SECS", default_value_t = 10,
          value_parser = clap::value_parser!(u64).range(1..=86_400))]
    pub(super) timeout: u64,
    /// Server: give up when no client connects within SECS, at most a year (default: wait
    /// forever).
    #[arg(long, value_name = "SECS", value_parser = clap::value_parser!(u64).range(1..=31_536_000))]
    pub(super) accept_timeout: Option<u64>,
    /// Server: how long the client's run may last (the wait for its end-of-run record; in
    /// duration mode -D plus --timeout is used when longer).
    #[arg(long, value_name = "SECS", default_value_t = 600,
          value_parser = clap::value_parser!(u64).range(1..=86_400))]
    pub(super) run_timeout: u64,
    /// Record both connections into this pcap file (readable by tshark and `iwarp dissect`).
    #[arg(long, value_name = "FILE")]
    pub(super) pcap: Option<PathBuf>,
    /// Run over this device through the backend seam instead of the userspace engine: an
    /// rdma-core device (siw0, rxe0, the verbs drop-in iwarp0; needs the `verbs` feature) or
    /// `iwarp`, the engine itself (`iwarp devices` lists them). The messages are the same;
    /// --crc, --first-fpdu-delay, --pcap and --transport are not available with it. The table
    /// shows its name unless -d is given.
    #[arg(long, value_name = "NAME")]
    pub(super) device: Option<String>,
    #[command(flatten)]
    pub(super) transport: crate::transport::TransportArgs,
}

impl Args {
    /// The device name shown in the table.
    pub(super) fn shown_device(&self) -> &str {
        self.ib_dev.as_deref().or(self.device.as_deref()).unwrap_or("iwarp0")
    }
}

/// The largest cycle buffer a peer may make this side use (perftest sends its page size).
pub(super) const MAX_PEER_CYCLE: u32 = 16 << 20;

/// The run's parameters after perftest's adjustments.
#[derive(Debug, Clone)]
pub(super) struct Params {
    pub(super) test: Test,
    pub(super) size: u32,
    /// Messages (0 in duration mode).
    pub(super) iters: u64,
    pub(super) duration: Option<Duration>,
    pub(super) tx_depth: u32,
    pub(super) rx_depth: u32,
    pub(super) cq_mod: u32,
    pub(super) out_reads: u16,
    pub(super) gbits: bool,
    pub(super) timeout: Duration,
}

impl Params {
    pub(super) fn new(args: &Args) -> Params {
        let default_iters = if args.test == Test::Write { 5000 } else { 1000 };
        let duration = args.duration.map(Duration::from_secs);
        let iters = if duration.is_some() { 0 } else { args.iters.unwrap_or(default_iters) };
        let cut = |d: u32| if iters == 0 { d } else { u32::try_from(iters).unwrap_or(u32::MAX).min(d) };
        let tx_depth = cut(args.tx_depth);
        let mut rx_depth = cut(args.rx_depth);
        if iters != 0 && rx_depth % 2 == 1 {
            rx_depth += 1;
        }
        let cq_mod = if args.size > 8192 { 1 } else { args.cq_mod.min(tx_depth) };
        Params {
            test: args.test,
            size: args.size,
            iters,
            duration,
            tx_depth,
            rx_depth,
            cq_mod,
            out_reads: if args.test == Test::Read { args.outs } else { 1 },
            gbits: args.report_gbits,
            timeout: Duration::from_secs(args.timeout),
        }
    }
}

/// What the control exchange settled: the larger cycle buffer and cache line, the MTU.
#[derive(Debug, Clone, Copy)]
pub(super) struct Agreed {
    pub(super) cycle: u32,
    pub(super) cache_line: u32,
    pub(super) mtu: u8,
}

impl Agreed {
    /// Bytes of each half of the data buffer: max(size, cycle buffer), cache-line rounded.
    pub(super) fn half(&self, size: u32) -> usize {
        let line = usize::try_from(self.cache_line.max(1)).unwrap_or(64);
        let n = usize::try_from(size.max(self.cycle)).unwrap_or(usize::MAX);
        n.div_ceil(line) * line
    }

    /// Offset of message `i` in a half: successive small messages step through the cycle
    /// buffer by the size rounded up to a cache line; larger ones all use offset 0.
    pub(super) fn offset(&self, size: u32, i: u64) -> u64 {
        if size > self.cycle / 2 {
            return 0;
        }
        let line = u64::from(self.cache_line.max(1));
        let step = u64::from(size).div_ceil(line) * line;
        let slots = (u64::from(self.cycle) / step).max(1);
        (i % slots) * step
    }
}
