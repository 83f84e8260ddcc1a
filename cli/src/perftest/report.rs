//! What perftest prints (the banner, the addresses, the result line) and how it measures
//! (per-iteration timestamps or a duration window).

use super::args::*;
use std::fmt::Write as _;
use std::time::{Duration, Instant};

use super::wire::{self, KeyRecord, Report};

pub(super) fn test_title(t: Test) -> &'static str {
    match t {
        Test::Write => "RDMA_Write BW Test",
        Test::Read => "RDMA_Read BW Test",
        Test::Send => "Send BW Test",
    }
}

/// C's `%#0Nx`: no `0x` for zero.
pub(super) fn c_alt_hex(v: u32, width: usize) -> String {
    if v == 0 { format!("{:0width$}", 0) } else { format!("{v:#0width$x}") }
}

/// The table header block (both sides), ending with the server's waiting note.
pub(super) fn print_banner(p: &Params, a: &Agreed, dev: &str, server: bool) {
    let mut s = String::new();
    let _ = writeln!(s, "{RESULT_LINE}");
    let _ = writeln!(s, "                    {}", test_title(p.test));
    let _ = writeln!(s, " Dual-port       : OFF\t\tDevice         : {dev}");
    let _ = writeln!(s, " Number of qps   : 1\t\tTransport type : IW");
    let _ = writeln!(s, " Connection type : RC\t\tUsing SRQ      : OFF");
    let _ = writeln!(s, " PCIe relax order: ON");
    let _ = writeln!(s, " ibv_wr* API     : OFF");
    if !server {
        let _ = writeln!(s, " TX depth        : {}", p.tx_depth);
    }
    if server && p.test == Test::Send {
        let _ = writeln!(s, " RX depth        : {}", p.rx_depth);
    }
    let _ = writeln!(s, " CQ Moderation   : {}", p.cq_mod);
    let _ = writeln!(s, " Mtu             : {}[B]", wire::mtu_bytes(a.mtu));
    let _ = writeln!(s, " Link type       : Ethernet");
    let _ = writeln!(s, " GID index       : 0");
    if p.test == Test::Read {
        let _ = writeln!(s, " Outstand reads  : {}", p.out_reads);
    } else {
        let _ = writeln!(s, " Max inline data : 0[B]");
    }
    let _ = writeln!(s, " rdma_cm QPs\t : ON");
    let _ = writeln!(s, " Data ex. method : rdma_cm");
    if server {
        let _ = writeln!(s, "{RESULT_LINE}");
        let _ = writeln!(s, " Waiting for client rdma_cm QP to connect");
        let _ = writeln!(s, " Please run the same command with the IB/RoCE interface IP");
    }
    let _ = write!(s, "{RESULT_LINE}");
    println!("{s}");
}

pub(super) fn print_addresses(mine: &KeyRecord, peer: &KeyRecord) {
    let mut s = String::new();
    for (what, r) in [("local", mine), ("remote", peer)] {
        let _ = writeln!(
            s,
            " {what} address: LID {} QPN {} PSN {}",
            c_alt_hex(r.lid, 4),
            c_alt_hex(r.qpn, 6),
            c_alt_hex(r.psn, 8)
        );
        let gid: Vec<String> = r.gid.iter().map(|b| format!("{b:02}")).collect();
        let _ = writeln!(s, " GID: {}", gid.join(":"));
    }
    let _ = write!(s, "{RESULT_LINE}");
    println!("{s}");
}

pub(super) fn print_result(r: &Report, gbits: bool) {
    let unit = if gbits { "Gb/sec" } else { "MB/sec" };
    let mut s = String::new();
    let _ = writeln!(s, " #bytes     #iterations    BW peak[{unit}]    BW average[{unit}]   MsgRate[Mpps]");
    if gbits && r.bw_avg < 0.1 {
        let _ = writeln!(
            s,
            " {:<7}    {:<10}       {:<7.6}            {:<7.6}\t\t   {:<7.6}",
            r.size, r.iters, r.bw_peak, r.bw_avg, r.msg_rate
        );
    } else {
        let _ = writeln!(
            s,
            " {:<7}    {:<10}       {:<7.2}            {:<7.2}\t\t   {:<7.6}",
            r.size, r.iters, r.bw_peak, r.bw_avg, r.msg_rate
        );
    }
    let _ = write!(s, "{RESULT_LINE}");
    println!("{s}");
}

// --- measurements -----------------------------------------------------------------------------

/// Bytes per second in the report's unit: MiB/s, or Gb/s (1.25e8 bytes/s).
pub(super) fn unit_rate(bytes_per_sec: f64, gbits: bool) -> f64 {
    if gbits { bytes_per_sec / 1.25e8 } else { bytes_per_sec / f64::from(1u32 << 20) }
}

pub(super) fn to_f64(n: u64) -> f64 {
    // Message counts stay far below 2^53.
    #[expect(clippy::cast_precision_loss, reason = "counts below 2^53")]
    let f = n as f64;
    f
}

/// perftest's report from per-message post and completion times (nanoseconds from a common
/// start): average over the whole run, peak over the best window of messages.
pub(super) fn iteration_report(p: &Params, posted: &[u64], completed: &[u64]) -> Report {
    let n = posted.len().min(completed.len());
    let size = f64::from(p.size);
    let (Some(&first), Some(&last)) = (posted.first(), completed.get(n.wrapping_sub(1))) else {
        return Report { size: u64::from(p.size), ..Report::default() };
    };
    let total = (last.saturating_sub(first)).max(1);
    let secs = to_f64(total) / 1e9;
    let n64 = u64::try_from(n).unwrap_or(u64::MAX);
    let avg = size * to_f64(n64) / secs;
    // Peak: the shortest average time per message over any window [i, j].
    let stride = n.div_ceil(PEAK_FULL_LIMIT).max(1);
    let mut best = f64::INFINITY;
    for i in (0..n).step_by(stride) {
        for j in (i..n).step_by(stride) {
            let t = to_f64(completed[j].saturating_sub(posted[i]).max(1))
                / to_f64(u64::try_from(j - i + 1).unwrap_or(1));
            if t < best {
                best = t;
            }
        }
    }
    let peak = if best.is_finite() { size / (best / 1e9) } else { 0.0 };
    Report {
        size: u64::from(p.size),
        iters: n64,
        bw_peak: unit_rate(peak, p.gbits),
        bw_avg: unit_rate(avg, p.gbits),
        msg_rate: to_f64(n64) / secs / 1e6,
    }
}

/// Duration mode: completions inside the sample window; no peak.
pub(super) fn duration_report(p: &Params, count: u64, window: Duration) -> Report {
    let secs = window.as_secs_f64().max(1e-9);
    Report {
        size: u64::from(p.size),
        iters: count,
        bw_peak: 0.0,
        bw_avg: unit_rate(f64::from(p.size) * to_f64(count) / secs, p.gbits),
        msg_rate: to_f64(count) / secs / 1e6,
    }
}

/// The duration-mode sample window: warm-up margin D/4, sample D/2, cool-down D/4.
pub(super) struct Window {
    pub(super) start: Instant,
    pub(super) begin: Instant,
    pub(super) end: Instant,
    pub(super) stop: Instant,
    pub(super) at_begin: Option<u64>,
    pub(super) at_end: Option<u64>,
}

impl Window {
    pub(super) fn new(d: Duration) -> Window {
        let start = Instant::now();
        let margin = d / 4;
        Window {
            start,
            begin: start + margin,
            end: start + d - margin,
            stop: start + d,
            at_begin: None,
            at_end: None,
        }
    }

    /// Notes the completion count as time passes; returns whether the run is over.
    pub(super) fn tick(&mut self, count: u64) -> bool {
        let now = Instant::now();
        if self.at_begin.is_none() && now >= self.begin {
            self.at_begin = Some(count);
        }
        if self.at_end.is_none() && now >= self.end {
            self.at_end = Some(count);
        }
        now >= self.stop
    }

    pub(super) fn report(&self, p: &Params) -> Report {
        let count = self.at_end.unwrap_or(0).saturating_sub(self.at_begin.unwrap_or(0));
        let _ = self.start;
        duration_report(p, count, self.end - self.begin)
    }
}
