//! The `iwarp` command: tools around the userspace iWARP stack.
//!
//! One module per subcommand; each returns the process exit status.

use std::process::ExitCode;

use clap::{Parser, Subcommand};

mod bench;
mod dissect;
mod rping;

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
    // The help text comes from `dissect::Args`' doc comment.
    Dissect(dissect::Args),
    // The help text comes from `rping::Args`' doc comment.
    Rping(rping::Args),
}

fn main() -> ExitCode {
    let cli = Cli::parse();
    match cli.command {
        Command::Bench(args) => bench::run(&args),
        Command::Dissect(args) => dissect::run(&args),
        Command::Rping(args) => rping::run(&args),
    }
}
