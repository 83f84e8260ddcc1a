//! The receive path over kernel TCP: where reading an FPDU's payload straight into place
//! ([`Connection::receive`]: a header read, then the payload read into the region) beats
//! reading into a receive buffer and copying (one read takes many FPDUs, then each payload is
//! copied into place). The first saves a copy per payload byte and costs a second read per
//! FPDU; which wins depends on the FPDU size.
//!
//! A sender thread writes a pre-framed stream of RDMA Writes (one FPDU each, CRC on) over
//! 127.0.0.1; the receiving thread drives a [`Connection`] with blocking reads. For each
//! payload size, both ways: the receiving thread's CPU time per KiB (the cost that decides;
//! it is little disturbed by other load) and the wall-clock rate.
//!
//! `cargo bench -p iwarp-rdmap --bench receive` (`IWARP_BENCH_QUICK=1`: shorter runs).
#![expect(clippy::expect_used, clippy::unwrap_used, reason = "a benchmark aborts on setup errors")]
#![allow(
    clippy::cast_precision_loss,
    clippy::cast_possible_truncation,
    reason = "figures for printing; sizes are small"
)]

use std::io::{Read, Write};
use std::net::{TcpListener, TcpStream};
use std::time::{Duration, Instant};

use iwarp_ddp::stag_table::{Access, Addressing, ProtectionDomainId, RegionSpec, TaggedBufferTable};
use iwarp_ddp::{RegionMemory, STag, TableMemory};
use iwarp_mpa::{FrameRepr, Policy};
use iwarp_rdmap::conn::Connection;
use iwarp_rdmap::memory::Sge;
use iwarp_rdmap::qp::{QpConfig, SendOp, SendWr};

const REGION: usize = 1 << 20;
const BASE: u64 = 0x7f00_0000_0000;
const SIZES: [usize; 7] = [1024, 2048, 4096, 8192, 16 * 1024, 32 * 1024, 65_000];

fn thread_cpu() -> Duration {
    let t = rustix::time::clock_gettime(rustix::time::ClockId::ThreadCPUTime);
    Duration::new(u64::try_from(t.tv_sec).unwrap_or(0), u32::try_from(t.tv_nsec).unwrap_or(0))
}

/// Sender and receiver connections for one payload size (one FPDU per message).
fn connections(payload: usize) -> (Connection, Connection) {
    let policy = Policy { crc: iwarp_mpa::CrcPolicy::Wanted, ..Policy::default() };
    let req = policy.request(b"").unwrap().to_vec().unwrap();
    let req = FrameRepr::parse(&req).unwrap();
    let (reply, server) = policy.respond(&req, b"").unwrap();
    let client = policy.accept_reply(&reply).unwrap();
    let cfg = QpConfig { mulpdu: payload + 14, max_send_wr: 4096, ..QpConfig::default() };
    (Connection::new(&client, cfg), Connection::new(&server, cfg))
}

fn region(table: &mut TaggedBufferTable, pd: ProtectionDomainId, access: Access) -> STag {
    let spec =
        RegionSpec { base_va: BASE, len: REGION as u64, access, addressing: Addressing::VirtualAddress };
    let bytes: Vec<u8> = (0..REGION).map(|i| (i % 251) as u8).collect();
    table.register(pd, spec, RegionMemory::new(bytes)).expect("register")
}

/// The receiver's stream: about `total` bytes of RDMA Writes of `payload` bytes each, framed by
/// the sender's connection, filling the receiver's region round after round.
fn stream(sender: &mut Connection, sink: STag, payload: usize, total: usize) -> Vec<u8> {
    let pd = ProtectionDomainId(1);
    let mut table = TaggedBufferTable::new(4);
    let src = region(&mut table, pd, Access::NONE);
    let mut out = Vec::with_capacity(total + 2 * payload);
    let per_region = REGION / payload;
    let mut i = 0;
    while out.len() < total {
        for _ in 0..64 {
            let off = (i % per_region) * payload;
            i += 1;
            sender
                .qp()
                .post_send(SendWr {
                    wr_id: 0,
                    op: SendOp::Write { remote_stag: sink, remote_to: BASE + off as u64 },
                    sgl: Sge { lkey: src, addr: BASE + off as u64, len: payload as u32 }.into(),
                    signaled: false,
                })
                .unwrap();
        }
        let mut mem = TableMemory { table: &mut table, pd };
        sender.poll_transmit(&mut mem, &mut out, usize::MAX);
    }
    out
}

/// One measurement: (receiver CPU time, wall time) to take `rounds` copies of `bytes`.
fn measure(
    bytes: &[u8],
    rounds: usize,
    receiver: &mut Connection,
    table: &mut TaggedBufferTable,
) -> (Duration, Duration) {
    let listener = TcpListener::bind("127.0.0.1:0").unwrap();
    let addr = listener.local_addr().unwrap();
    let data = bytes.to_vec();
    let sender = std::thread::spawn(move || {
        let mut s = TcpStream::connect(addr).unwrap();
        for _ in 0..rounds {
            s.write_all(&data).unwrap();
        }
    });
    let (mut s, _) = listener.accept().unwrap();
    let mut rx = vec![0; 256 * 1024];
    let total = bytes.len() * rounds;
    let mut got = 0;
    let (cpu0, wall0) = (thread_cpu(), Instant::now());
    let mut mem = TableMemory { table, pd: ProtectionDomainId(2) };
    while got < total {
        let step = receiver.receive(&mut mem, &mut rx, |bufs| s.read_vectored(bufs)).unwrap();
        assert!(step.read > 0, "the sender closed early");
        got += step.read;
    }
    let r = (thread_cpu() - cpu0, wall0.elapsed());
    sender.join().unwrap();
    assert!(receiver.qp().poll_event().is_none(), "the receiver terminated the stream");
    r
}

fn main() {
    let quick = std::env::var_os("IWARP_BENCH_QUICK").is_some() || std::env::args().any(|a| a == "--test");
    let (total, rounds) = if quick { (8 << 20, 2) } else { (32 << 20, 8) };
    println!("receive over 127.0.0.1, CRC on, one FPDU per RDMA Write; receiver CPU ns per KiB (wall GB/s)");
    println!("{:>8} | {:>20} | {:>20} | {:>6}", "payload", "buffered + copy", "straight into place", "ratio");
    for payload in SIZES {
        let mut row = Vec::new();
        for direct in [None, Some(0)] {
            let (mut sender, mut receiver) = connections(payload);
            receiver.set_direct_min(direct);
            let mut table = TaggedBufferTable::new(4);
            let sink = region(&mut table, ProtectionDomainId(2), Access::REMOTE_WRITE);
            let bytes = stream(&mut sender, sink, payload, total);
            // Best of three: other load on the machine only ever adds time.
            let mut best = (Duration::MAX, Duration::MAX);
            for _ in 0..3 {
                let (cpu, wall) = measure(&bytes, rounds, &mut receiver, &mut table);
                best = (best.0.min(cpu), best.1.min(wall));
            }
            let kib = (bytes.len() * rounds) as f64 / 1024.0;
            let gbs = (bytes.len() * rounds) as f64 / best.1.as_secs_f64() / 1e9;
            row.push((best.0.as_nanos() as f64 / kib, gbs, receiver.rx_stats()));
        }
        let (b, d) = (row[0], row[1]);
        println!(
            "{payload:>8} | {:>9.0} ({:>5.2} GB/s) | {:>9.0} ({:>5.2} GB/s) | {:>6.2}   in place {:.0}%",
            b.0,
            b.1,
            d.0,
            d.1,
            d.0 / b.0,
            100.0 * d.2.in_place as f64 / d.2.bytes as f64,
        );
    }
}
