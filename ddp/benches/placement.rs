//! Tagged placement throughput (the live code: [`place_tagged`], the table check, then the DMA
//! module's copy into the region's [`RegionMemory`], here a registered `Vec<u8>`) against
//! `copy_from_slice` of the same bytes into a plain `Vec<u8>`, at payloads of 1428 (siw's RDMA
//! Write segment on a 1500-byte MTU), 16 KiB and 64 KiB.
//!
//! Two destinations: "stream" places consecutive segments across a 1 MiB region (an RDMA
//! Write filling a buffer); "hot" places every segment at the same offset (the destination
//! stays in cache, where a fixed per-segment cost such as the table check weighs most).
//!
//! `cargo bench -p iwarp-ddp --bench placement` runs the criterion groups, then prints the
//! ratios measured in the same run (goal: placement >= 0.9 of memcpy).
//! `IWARP_BENCH_QUICK=1` (or criterion's `--test`) shortens the ratio table's runs.
#![expect(clippy::expect_used, reason = "a benchmark aborts on impossible setup errors")]

use std::hint::black_box;
use std::time::{Duration, Instant};

use criterion::{BenchmarkId, Criterion, Throughput};
use iwarp_ddp::{
    Access, Addressing, ProtectionDomainId, RegionMemory, RegionSpec, STag, TaggedBufferTable, TaggedOffset,
    place_tagged,
};

const SIZES: [usize; 3] = [1428, 16 * 1024, 64 * 1024];
const REGION: usize = 1 << 20;
const BASE: u64 = 0x7f00_0000_0000;
const PD: ProtectionDomainId = ProtectionDomainId(1);

struct Case {
    table: TaggedBufferTable,
    stag: STag,
    plain: Vec<u8>,
    payload: Vec<u8>,
    /// Segments per batch: as many as fill the region.
    count: usize,
}

impl Case {
    fn new(size: usize) -> Case {
        let mut table = TaggedBufferTable::new(16);
        let memory = RegionMemory::new(vec![0u8; REGION]);
        let spec = RegionSpec {
            base_va: BASE,
            len: REGION as u64,
            access: Access::REMOTE_WRITE,
            addressing: Addressing::VirtualAddress,
        };
        let stag = table.register(PD, spec, memory).expect("register");
        let payload: Vec<u8> = (0..size).map(|i| u8::try_from(i % 251).unwrap_or(0)).collect();
        Case { table, stag, plain: vec![0; REGION], payload, count: REGION / size }
    }

    fn bytes(&self) -> u64 {
        (self.count * self.payload.len()) as u64
    }

    fn place(&mut self, stream: bool) {
        let n = self.payload.len();
        for i in 0..self.count {
            let off = if stream { i * n } else { 0 };
            let to = TaggedOffset(BASE + off as u64);
            place_tagged(&mut self.table, PD, self.stag, to, black_box(&self.payload), Access::REMOTE_WRITE)
                .expect("in bounds");
        }
    }

    fn memcpy(&mut self, stream: bool) {
        let n = self.payload.len();
        for i in 0..self.count {
            let off = if stream { i * n } else { 0 };
            self.plain[off..off + n].copy_from_slice(black_box(&self.payload));
        }
        black_box(&mut self.plain);
    }

    fn raw_write(&mut self, stream: bool) {
        let n = self.payload.len();
        let memory = self.table.memory_mut(self.stag).expect("registered");
        for i in 0..self.count {
            let off = if stream { i * n } else { 0 };
            memory.write(off, black_box(&self.payload)).expect("in bounds");
        }
    }
}

fn criterion_groups(c: &mut Criterion) {
    for stream in [true, false] {
        let mut g = c.benchmark_group(if stream { "placement-stream" } else { "placement-hot" });
        for size in SIZES {
            let mut case = Case::new(size);
            g.throughput(Throughput::Bytes(case.bytes()));
            g.bench_function(BenchmarkId::new("place_tagged", size), |b| b.iter(|| case.place(stream)));
            g.bench_function(BenchmarkId::new("memcpy-vec", size), |b| b.iter(|| case.memcpy(stream)));
        }
        g.finish();
    }
}

/// Best times of several runs of each of `fs`, taken in turn (so that a slower or busier
/// stretch of the run affects all of them alike), within a time budget.
fn best_of_each<const N: usize>(budget: Duration, case: &mut Case, fs: [fn(&mut Case); N]) -> [Duration; N] {
    let start = Instant::now();
    let mut best = [Duration::MAX; N];
    let mut runs = 0;
    while runs < 3 || (start.elapsed() < budget && runs < 1000) {
        for (f, b) in fs.iter().zip(&mut best) {
            let t = Instant::now();
            f(case);
            *b = (*b).min(t.elapsed());
        }
        runs += 1;
    }
    best
}

fn ratio_report(quick: bool) {
    let budget = if quick { Duration::from_millis(60) } else { Duration::from_millis(2000) };
    println!("\nTagged placement vs memcpy into a Vec, same run, GB/s of payload (1 MiB destination).");
    println!("place: place_tagged (check + copy into the region); write: RegionMemory::write alone.");
    println!(
        "{:>8} {:>7} {:>8} {:>8} {:>8} {:>12} {:>12}",
        "payload", "dest", "memcpy", "place", "write", "place/memcpy", "write/memcpy"
    );
    for size in SIZES {
        for stream in [true, false] {
            let mut case = Case::new(size);
            let bytes = case.bytes() as f64;
            let gbps = |d: Duration| bytes / d.as_secs_f64() / 1e9;
            let [t_memcpy, t_place, t_write] = if stream {
                best_of_each(
                    budget,
                    &mut case,
                    [|c| c.memcpy(true), |c| c.place(true), |c| c.raw_write(true)],
                )
            } else {
                best_of_each(
                    budget,
                    &mut case,
                    [|c| c.memcpy(false), |c| c.place(false), |c| c.raw_write(false)],
                )
            };
            println!(
                "{:>8} {:>7} {:>8.2} {:>8.2} {:>8.2} {:>12.2} {:>12.2}",
                size,
                if stream { "stream" } else { "hot" },
                gbps(t_memcpy),
                gbps(t_place),
                gbps(t_write),
                t_memcpy.as_secs_f64() / t_place.as_secs_f64(),
                t_memcpy.as_secs_f64() / t_write.as_secs_f64(),
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
