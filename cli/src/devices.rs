//! `iwarp devices`: the devices this build can drive, with their transport and capabilities.

use std::process::ExitCode;

use iwarp::backend::{Capabilities, devices};

/// List the devices `--device` takes: the userspace engine (`iwarp`) and, in a build with the
/// `verbs` feature, every rdma-core device (siw, rxe, an iWARP or RoCE NIC, the verbs drop-in)
/// with its transport and what it supports. Without rdma-core (or without the feature) only
/// the engine is listed, and a note on stderr says why.
///
/// Exit status: 0.
#[derive(Debug, clap::Args)]
pub(crate) struct Args {
    /// Print one JSON array instead of a table.
    #[arg(long)]
    json: bool,
}

fn caps_words(c: &Capabilities) -> String {
    let mut words = Vec::new();
    for (have, word) in [
        (c.rdma, "write/read/send"),
        (c.immediate, "immediate"),
        (c.atomics, "atomics"),
        (c.private_data, "private-data"),
        (c.reject, "reject"),
        (c.cq_notify, "cq-notify"),
        (c.srq, "srq"),
        (c.memory_windows, "memory-windows"),
    ] {
        if have {
            words.push(word);
        }
    }
    words.join(",")
}

pub(crate) fn run(args: &Args) -> ExitCode {
    let (list, why) = devices();
    if args.json {
        let rows: Vec<_> = list
            .iter()
            .map(|d| {
                serde_json::json!({
                    "name": d.name,
                    "transport": d.transport.to_string(),
                    "iwarp": d.transport.speaks_iwarp(),
                    "immediate": d.caps.immediate,
                    "atomics": d.caps.atomics,
                    "private_data": d.caps.private_data,
                    "reject": d.caps.reject,
                    "cq_notify": d.caps.cq_notify,
                    "srq": d.caps.srq,
                    "memory_windows": d.caps.memory_windows,
                })
            })
            .collect();
        println!("{}", serde_json::Value::Array(rows));
    } else {
        println!("{:<12} {:<26} capabilities", "device", "transport");
        for d in &list {
            println!("{:<12} {:<26} {}", d.name, d.transport.to_string(), caps_words(&d.caps));
        }
    }
    if let Some(why) = why {
        eprintln!("devices: no rdma-core devices: {why}");
    }
    ExitCode::SUCCESS
}
