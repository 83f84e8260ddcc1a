//! What both paths (the engine's, in perftest.rs, and the seam's, in seam.rs) run once their
//! connections are up: the key records, the test and the report; and the checks and lines
//! they share.

use super::args::*;
use super::conn::random_u64;
use super::ctrl::Lockstep;
use super::data::*;
use super::report::*;
use super::wire::{self, KeyRecord, Report};
use crate::toolbox::Fail;
use std::time::Duration;

/// The client's flags that only a server takes.
pub(super) fn check_client_flags(args: &Args) -> Result<(), Fail> {
    if args.bind.is_some() || args.accept_timeout.is_some() {
        return Err(Fail::Usage("--bind and --accept-timeout are server options (no ADDRESS)".into()));
    }
    Ok(())
}

/// What the server prints while it waits for a client.
pub(super) fn print_waiting() {
    println!();
    println!("************************************");
    println!("* Waiting for client to connect... *");
    println!("************************************");
}

/// Part A of the control exchange once the control connection is up (ib_write_bw sleeps a
/// second first, on both sides).
pub(super) fn part_a(p: &Params, ctrl: &mut impl Lockstep) -> Result<Agreed, Fail> {
    if p.test == Test::Write {
        std::thread::sleep(Duration::from_secs(1));
    }
    Ok(ctrl.part_a()?)
}

/// This side's key record (a random PSN) and the peer's, after the "post" handshake and K1-K3;
/// prints both.
fn keys(p: &Params, ctrl: &mut impl Lockstep, data: &impl DataPath) -> Result<(KeyRecord, KeyRecord), Fail> {
    let psn = u32::try_from(random_u64() & 0x00ff_ffff).unwrap_or(0);
    let mine = data.record(p, psn);
    let peer = ctrl.keys(&mine)?;
    print_addresses(&mine, &peer);
    Ok((mine, peer))
}

/// The client once both connections are up: the key records, the run, the report and K5.
pub(super) fn client_data(
    p: &Params,
    agreed: &Agreed,
    ctrl: &mut impl Lockstep,
    data: &impl DataPath,
) -> Result<(), Fail> {
    let (mine, peer) = keys(p, ctrl, data)?;
    let t = Some(p.timeout);
    let report = match p.test {
        Test::Write | Test::Read => {
            let report = run_rdma_client(p, agreed, data, &peer)?;
            ctrl.exchange(&mine.to_bytes(), "key record K4", t)?;
            for (i, m) in report.to_msgs().iter().enumerate() {
                ctrl.exchange(m, &format!("report field {}", i + 1), t)?;
            }
            report
        }
        Test::Send => {
            ctrl.exchange(&mine.to_bytes(), "key record K4", t)?;
            run_send_client(p, data)?
        }
    };
    ctrl.exchange(&mine.to_bytes(), "key record K5", t)?;
    print_result(&report, p.gbits);
    Ok(())
}

/// The server once both connections are up: the key records, the client's run (write and
/// read: its report; send: the receives and credits), K5.
pub(super) fn server_data(
    p: &Params,
    ctrl: &mut impl Lockstep,
    data: &impl DataPath,
    posted: u64,
    run_timeout: Duration,
) -> Result<(), Fail> {
    let (mine, peer) = keys(p, ctrl, data)?;
    let t = Some(p.timeout);
    // How long the client's run may take: --run-timeout, or its duration and a margin.
    let run = Some(run_timeout.max(p.duration.map_or(Duration::ZERO, |d| d + p.timeout)));
    let report = match p.test {
        Test::Write | Test::Read => {
            // The client runs; we wait for its K4 as long as a run may last.
            ctrl.exchange(&mine.to_bytes(), "key record K4 (end of the client's run)", run)?;
            let mut fields: [Vec<u8>; 5] = Default::default();
            for (i, f) in fields.iter_mut().enumerate() {
                // perftest's server answers with uninitialised memory; zeros here.
                *f = ctrl.exchange(&[0u8; wire::REPORT_FIELD_LEN], &format!("report field {}", i + 1), t)?;
            }
            Report::from_msgs(&fields)
        }
        Test::Send => {
            ctrl.exchange(&mine.to_bytes(), "key record K4", t)?;
            let peer_data = peer;
            run_send_server(p, data, &peer_data, posted)?
        }
    };
    ctrl.exchange(&mine.to_bytes(), "key record K5", if p.test == Test::Send { run } else { t })?;
    print_result(&report, p.gbits);
    Ok(())
}
