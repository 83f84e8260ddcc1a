//! `iwarp rping`'s command line.

use super::proto::MAX_SIZE;

/// rping's TCP port.
pub(super) const DEFAULT_PORT: u16 = 7174;
/// rping's smallest ping size (an artefact of its range check, kept for compatibility).
pub(super) const MIN_SIZE: u32 = 23;

/// Ping another rping (rdmacm-utils' `rping -s`/`rping -c`) or this one, over iWARP.
///
/// The client connects (MPA revision 2, IRD/ORD 1/1 as rping), and per ping sends the
/// advertisement of its start buffer (filled with rping's pattern `rdma-ping-N: ABC...`),
/// waits for the server's go-ahead (the server has RDMA Read the buffer), sends the
/// advertisement of its sink buffer and waits for the second go-ahead (the server has RDMA
/// Written the data there). With -V it compares the sink with what it sent, with -v it prints
/// `ping data: ...` per ping. The server does the server's half for one connection (with -P:
/// for every connection, concurrently, until killed), printing `server ping data: ...` with
/// -v; it never sends before the client's first Send.
///
/// Against Linux siw 6.1 no flag is needed: siw may leave a first Send that follows its MPA
/// Reply at once unread, and the client nudges it (docs/siw-quirks.md).
///
/// Differences from rping: -S goes up to 16 MiB (rping: 65535), and the server grows its
/// buffer to the size a client advertises (rping fails when the client's -S is larger); the
/// client stops with status 1 when the server closes mid-ping (rping prints the state and
/// exits 0); every wait has a time limit (--timeout), rping has none.
///
/// Exit status: 0 when every ping succeeded (the server: the connection ended with the
/// client's close after whole pings), 1 on a failure (refused, rejected, Terminate from the
/// peer, timeout, data mismatch; one line on stderr names the cause), 2 on bad flags.
#[derive(Debug, clap::Args)]
#[command(group(clap::ArgGroup::new("role").required(true).args(["server", "client"])))]
pub(crate) struct Args {
    /// Run the server: listen on ADDR:PORT and serve the pings.
    #[arg(short = 's', long)]
    pub(super) server: bool,
    /// Run the client: connect to ADDR:PORT and ping.
    #[arg(short = 'c', long)]
    pub(super) client: bool,
    /// The server's address (client), or the address to listen on (server; default 0.0.0.0).
    #[arg(short = 'a', long = "addr", value_name = "ADDR")]
    pub(super) addr: Option<String>,
    /// TCP port.
    #[arg(short = 'p', long, value_name = "PORT", default_value_t = DEFAULT_PORT)]
    pub(super) port: u16,
    /// Client: the number of pings (0 or absent: ping until killed, as rping). The server
    /// ignores it and serves until the client closes.
    #[arg(short = 'C', long, value_name = "COUNT")]
    pub(super) count: Option<u64>,
    /// Ping size in bytes, 23 to 16777216 (the server's initial buffer size).
    #[arg(short = 'S', long, value_name = "SIZE", default_value_t = 64,
          value_parser = clap::value_parser!(u32).range(i64::from(MIN_SIZE)..=i64::from(MAX_SIZE)))]
    pub(super) size: u32,
    /// Print the data of each ping.
    #[arg(short = 'v', long)]
    pub(super) verbose: bool,
    /// Client: check that the data that came back equals the data sent.
    #[arg(short = 'V', long)]
    pub(super) validate: bool,
    /// Server: keep serving connection after connection (concurrently) until killed.
    #[arg(short = 'P', long)]
    pub(super) persistent: bool,
    /// Print what happens (connection, advertisements) on stderr.
    #[arg(short = 'd', long)]
    pub(super) debug: bool,
    /// Client: milliseconds to wait between the MPA Reply and the first Send (not needed
    /// against Linux siw 6.1: the client nudges a peer that leaves it unread).
    #[arg(long, value_name = "MS", default_value_t = 0)]
    pub(super) first_fpdu_delay: u64,
    /// Ask for MPA CRC32c (either side asking turns it on).
    #[arg(long)]
    pub(super) crc: bool,
    /// Ask the peer to insert MPA markers (Linux siw refuses: the connection is rejected).
    #[arg(long)]
    pub(super) markers: bool,
    /// MPA revision to speak: 2 (RFC 6581, with IRD/ORD; rping's default) or 1 (RFC 5044).
    #[arg(long, value_name = "REV", default_value_t = 2, value_parser = clap::value_parser!(u8).range(1..=2))]
    pub(super) mpa_rev: u8,
    /// Client: offer peer-to-peer mode (RFC 6581 RTR: write and read), as siw's
    /// `peer_to_peer=1`. A server always agrees when a client offers it.
    #[arg(long)]
    pub(super) p2p: bool,
    /// Client with --p2p: the RTR message types to offer, comma-separated (write, read,
    /// send) [default: write,read].
    #[arg(long, value_delimiter = ',', value_enum, requires = "p2p")]
    pub(super) rtr: Vec<Rtr>,
    /// Record this end's connections into a pcap file (tshark / `iwarp dissect` decode it).
    #[arg(long, value_name = "FILE")]
    pub(super) pcap: Option<std::path::PathBuf>,
    /// Seconds any single wait (connect, a completion) may take before the run fails.
    #[arg(long, value_name = "SECS", default_value_t = 10,
          value_parser = clap::value_parser!(u64).range(1..=86_400))]
    pub(super) timeout: u64,
    /// Server: give up when no connection arrives within SECS, at most a year (default: wait
    /// forever).
    #[arg(long, value_name = "SECS", value_parser = clap::value_parser!(u64).range(1..=31_536_000))]
    pub(super) accept_timeout: Option<u64>,
    /// Server: clients served at once, at most (-P); one more is rejected on the wire and the
    /// server keeps serving.
    #[arg(long, value_name = "N", default_value_t = 64,
          value_parser = clap::value_parser!(u64).range(1..=4096))]
    pub(super) max_clients: u64,
    /// Server: MiB of buffers all clients together may make it register (each client's
    /// buffer grows to what it advertises, up to 16 MiB); a client beyond it is turned away.
    #[arg(long, value_name = "MIB", default_value_t = 256,
          value_parser = clap::value_parser!(u64).range(1..=65_536))]
    pub(super) max_memory: u64,
    /// Ping over this device through the backend seam instead of the userspace engine: an
    /// rdma-core device (siw0, rxe0, the verbs drop-in iwarp0; needs the `verbs` feature) or
    /// `iwarp`, the engine itself (`iwarp devices` lists them). The protocol is the same;
    /// --crc, --markers, --mpa-rev, --p2p, --first-fpdu-delay, --pcap, -P and --transport are
    /// not available with it.
    #[arg(long, value_name = "NAME")]
    pub(super) device: Option<String>,
    #[command(flatten)]
    pub(super) transport: crate::transport::TransportArgs,
}

/// An RFC 6581 ready-to-receive message type.
#[derive(Debug, Clone, Copy, PartialEq, Eq, clap::ValueEnum)]
pub(super) enum Rtr {
    /// A zero-length RDMA Write.
    Write,
    /// A zero-length RDMA Read.
    Read,
    /// A zero-length Send.
    Send,
}
