//! Framing and deframing throughput, with CRC on and off, at ULPDU sizes 1442 (one FPDU per
//! 1500-byte-MTU segment), 16 KiB and 65535, against crc32c alone over the same bytes.
//!
//! `cargo bench -p iwarp-mpa --bench framing` runs the criterion groups, then prints a table
//! of the ratios measured in the same run (goal: deframe + CRC >= 0.8 of CRC alone).
//! `IWARP_BENCH_QUICK=1` (or criterion's `--test`) shortens the ratio table's runs.
#![expect(clippy::expect_used, reason = "a benchmark aborts on impossible setup errors")]

use std::hint::black_box;
use std::time::{Duration, Instant};

use criterion::{BenchmarkId, Criterion, Throughput};
use iwarp_mpa::{Deframed, Deframer, Framer};

const SIZES: [usize; 3] = [1442, 16 * 1024, 65535];
/// Bytes of ULPDU per measured batch.
const BATCH: usize = 4 << 20;

struct Case {
    ulpdu: Vec<u8>,
    count: usize,
    wire: Vec<u8>,
    out: Vec<u8>,
}

impl Case {
    fn new(size: usize, crc: bool) -> Case {
        let ulpdu: Vec<u8> = (0..size).map(|i| u8::try_from(i % 251).unwrap_or(0)).collect();
        let count = (BATCH / size).max(1);
        let mut f = Framer::new(crc, false);
        let mut wire = Vec::new();
        for _ in 0..count {
            wire.extend(f.frame_to_vec(&ulpdu).expect("ULPDU fits"));
        }
        let out = vec![0; f.wire_len(size)];
        Case { ulpdu, count, wire, out }
    }

    fn frame(&mut self, crc: bool) -> usize {
        let mut f = Framer::new(crc, false);
        let mut total = 0;
        for _ in 0..self.count {
            total += f.frame(black_box(&self.ulpdu), &mut self.out).expect("buffer fits");
        }
        total
    }

    fn deframe(&self, crc: bool) -> usize {
        let mut d = Deframer::new(crc, false);
        let mut rest = &self.wire[..];
        let mut total = 0;
        while let Ok(Deframed::Fpdu(f)) = d.deframe(black_box(rest)) {
            total += f.ulpdu.len();
            let n = f.wire_len;
            rest = &rest[n..];
        }
        total
    }

    /// crc32c over the whole batch in one call.
    fn crc_alone(&self) -> u32 {
        crc32c::crc32c(black_box(&self.wire))
    }

    /// crc32c over the same bytes, one call per FPDU (the CRC work deframing cannot avoid).
    fn crc_per_fpdu(&self) -> u32 {
        let fpdu = self.wire.len() / self.count;
        self.wire.chunks(fpdu).fold(0, |acc, c| acc ^ crc32c::crc32c(black_box(&c[..c.len() - 4])))
    }
}

fn criterion_groups(c: &mut Criterion) {
    for crc in [true, false] {
        let mut g = c.benchmark_group(if crc { "mpa-crc" } else { "mpa-nocrc" });
        for size in SIZES {
            let mut case = Case::new(size, crc);
            g.throughput(Throughput::Bytes(case.wire.len() as u64));
            g.bench_function(BenchmarkId::new("frame", size), |b| b.iter(|| case.frame(crc)));
            let case = Case::new(size, crc);
            g.bench_function(BenchmarkId::new("deframe", size), |b| b.iter(|| case.deframe(crc)));
            if crc {
                g.bench_function(BenchmarkId::new("crc32c-alone", size), |b| b.iter(|| case.crc_alone()));
            }
        }
        g.finish();
    }
}

/// Best time of several runs of `f`, within a time budget.
fn best<R>(budget: Duration, mut f: impl FnMut() -> R) -> Duration {
    let start = Instant::now();
    let mut best = Duration::MAX;
    let mut runs = 0;
    while runs < 3 || (start.elapsed() < budget && runs < 1000) {
        let t = Instant::now();
        black_box(f());
        best = best.min(t.elapsed());
        runs += 1;
    }
    best
}

fn ratio_report(quick: bool) {
    let budget = if quick { Duration::from_millis(20) } else { Duration::from_millis(700) };
    println!("\nMPA throughput, same run, GB/s of wire bytes. crc32c: one call over the whole batch;");
    println!("crc/FPDU: one call per FPDU over the same bytes. Ratios: op throughput / crc32c.");
    println!(
        "{:>8} {:>4} {:>8} {:>9} {:>8} {:>8} {:>8} {:>8} {:>9}",
        "ULPDU", "CRC", "crc32c", "crc/FPDU", "frame", "deframe", "frame/x", "defr/x", "defr/FPDU"
    );
    for size in SIZES {
        for crc in [true, false] {
            let mut case = Case::new(size, crc);
            let bytes = case.wire.len() as f64;
            let gbps = |d: Duration| bytes / d.as_secs_f64() / 1e9;
            let t_crc = best(budget, || case.crc_alone());
            let t_crc_fpdu = best(budget, || case.crc_per_fpdu());
            let t_deframe = best(budget, || case.deframe(crc));
            let t_frame = best(budget, || case.frame(crc));
            println!(
                "{:>8} {:>4} {:>8.2} {:>9.2} {:>8.2} {:>8.2} {:>8.2} {:>8.2} {:>9.2}",
                size,
                if crc { "on" } else { "off" },
                gbps(t_crc),
                gbps(t_crc_fpdu),
                gbps(t_frame),
                gbps(t_deframe),
                t_crc.as_secs_f64() / t_frame.as_secs_f64(),
                t_crc.as_secs_f64() / t_deframe.as_secs_f64(),
                t_crc_fpdu.as_secs_f64() / t_deframe.as_secs_f64(),
            );
        }
    }
}

fn main() {
    let quick = std::env::args().any(|a| a == "--test") || std::env::var_os("IWARP_BENCH_QUICK").is_some();
    let mut c = Criterion::default().configure_from_args();
    criterion_groups(&mut c);
    c.final_summary();
    ratio_report(quick);
}
