//! The `iwarp` command: tools around the userspace iWARP stack.
//!
//! One module per subcommand; each returns the process exit status.

use std::process::ExitCode;

use clap::{Parser, Subcommand};

mod bench;
mod devices;
mod dissect;
mod fuzz_peer;
mod perftest;
mod rping;
mod toolbox;
mod transport;

/// Tools for the userspace iWARP (RDMA over TCP) stack.
#[derive(Debug, Parser)]
#[command(name = "iwarp", version)]
struct Cli {
    #[command(subcommand)]
    command: Command,
}

#[derive(Debug, Subcommand)]
enum Command {
    // The help text comes from `bench::Args`' doc comment.
    Bench(bench::Args),
    // The help text comes from `devices::Args`' doc comment.
    Devices(devices::Args),
    // The help text comes from `dissect::Args`' doc comment.
    Dissect(dissect::Args),
    // The help text comes from `fuzz_peer::Args`' doc comment.
    FuzzPeer(fuzz_peer::Args),
    // The help text comes from `perftest::Args`' doc comment.
    Perftest(perftest::Args),
    // The help text comes from `rping::Args`' doc comment.
    Rping(rping::Args),
}

/// Installs a `tracing` subscriber writing to stderr when `IWARP_LOG` is set (a filter such
/// as `debug` or `iwarp=trace`); without it tracing stays off and costs nothing.
fn init_logging() {
    if let Ok(filter) = std::env::var("IWARP_LOG") {
        let filter = tracing_subscriber::EnvFilter::try_new(&filter)
            .unwrap_or_else(|_| tracing_subscriber::EnvFilter::new("info"));
        let _ = tracing_subscriber::fmt().with_env_filter(filter).with_writer(std::io::stderr).try_init();
    }
}

fn main() -> ExitCode {
    init_logging();
    let cli = Cli::parse();
    match cli.command {
        Command::Bench(args) => bench::run(&args),
        Command::Devices(args) => devices::run(&args),
        Command::Dissect(args) => dissect::run(&args),
        Command::FuzzPeer(args) => fuzz_peer::run(&args),
        Command::Perftest(args) => perftest::run(&args),
        Command::Rping(args) => rping::run(&args),
    }
}
