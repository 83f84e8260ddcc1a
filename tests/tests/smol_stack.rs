//! The whole stack over smoltcp (userspace TCP/IP) on real devices: two devices, each with
//! its own `SmolStack`, over the two ends of a veth pair; a smoltcp endpoint against a
//! kernel-TCP endpoint over a TAP device; 1% frame loss.
//!
//! Needs root (network namespaces, veth, TAP, raw sockets). Each outer test creates a network
//! namespace (deleted whatever happens), sets up its interfaces there and runs its body in a
//! child process inside it (`ip netns exec NS <this binary> --exact inner_... --ignored`), so
//! every frame stays inside the namespace. A test that cannot set up its namespace fails with
//! a message saying what is missing; it never skips. Every wait is bounded.

#![allow(clippy::unwrap_used, clippy::expect_used, reason = "test code panics on failure")]
#![allow(clippy::cast_possible_truncation, reason = "test sizes are small")]

use iwarp_tests::netns::{self, Netns};
use std::net::{Ipv4Addr, SocketAddr};
use std::time::{Duration, Instant};

use iwarp::mpa::{CrcPolicy, Policy};
use iwarp::netdev::{SmolConfig, SmolStack};
use iwarp::{
    Access, CompletionQueue, ConnectOptions, Device, DeviceConfig, ListenOptions, PollMode, ProtectionDomain,
    QueuePair, RecvWr, SendOp, SendWr, Transport, WcOpcode, WcStatus, WorkCompletion,
};

const INNER_ENV: &str = "IWARP_SMOL_STACK_NETNS";
const CHILD_TIMEOUT: Duration = Duration::from_secs(200);
/// The longest any single wait may take.
const T: Duration = Duration::from_secs(30);
const IP_A: Ipv4Addr = Ipv4Addr::new(10, 79, 0, 1);
const IP_B: Ipv4Addr = Ipv4Addr::new(10, 79, 0, 2);
const PORT: u16 = 7180;
const MIB: usize = 1 << 20;

/// A namespace for one outer test (see `iwarp_tests::netns`).
fn netns(tag: &str) -> Netns {
    Netns::new("iwstk", tag, INNER_ENV, CHILD_TIMEOUT)
}

/// True inside the namespace child; outside, the inner tests do nothing.
fn inside() -> bool {
    netns::inside(INNER_ENV)
}

fn pattern(seed: u64, len: usize) -> Vec<u8> {
    let mut x = seed.wrapping_mul(0x9e37_79b9_7f4a_7c15) | 1;
    (0..len)
        .map(|_| {
            x ^= x << 13;
            x ^= x >> 7;
            x ^= x << 17;
            x as u8
        })
        .collect()
}

/// One end of a connection.
struct End {
    pd: ProtectionDomain,
    cq: CompletionQueue,
    qp: QueuePair,
}

impl End {
    fn wait_ok(&self, wr_id: u64, what: &str) -> WorkCompletion {
        let wc = self.cq.wait(T).unwrap_or_else(|| panic!("{what}: no completion within {T:?}"));
        assert_eq!((wc.wr_id, wc.status), (wr_id, WcStatus::Success), "{what}: {wc:?}");
        wc
    }
}

fn options(crc: bool) -> ConnectOptions {
    let crc = if crc { CrcPolicy::Strict } else { CrcPolicy::Off };
    ConnectOptions {
        policy: Policy { crc, ird: 16, ord: 16, ..Policy::default() },
        timeout: T,
        ..ConnectOptions::default()
    }
}

/// Where the passive end listens.
enum Server<'a> {
    Smol(&'a SmolStack),
    Kernel(SocketAddr),
}

/// Where the active end connects from.
enum Client<'a> {
    Smol(&'a SmolStack, SocketAddr),
    Kernel(SocketAddr),
}

/// Connects `client_dev` to `server_dev` (the server accepting on its own thread).
fn connect(client_dev: &Device, client: Client<'_>, server_dev: &Device, server: Server<'_>) -> (End, End) {
    let (spd, scq) = (server_dev.alloc_pd(), server_dev.create_cq(4096));
    let (cpd, ccq) = (client_dev.alloc_pd(), client_dev.create_cq(4096));
    let server_qp = std::thread::scope(|s| {
        let accepted = match server {
            Server::Smol(stack) => {
                let lopts =
                    ListenOptions { transport: Transport::Smol(stack.clone()), ..ListenOptions::default() };
                let listener = server_dev.listen_with(SocketAddr::from((stack.ip(), PORT)), &lopts).unwrap();
                let (spd, scq) = (&spd, &scq);
                s.spawn(move || {
                    let req = listener.accept(T).unwrap();
                    req.accept(spd, scq, scq, &options(true)).unwrap()
                })
            }
            Server::Kernel(addr) => {
                let listener = server_dev.listen(addr).unwrap();
                let (spd, scq) = (&spd, &scq);
                s.spawn(move || {
                    let req = listener.accept(T).unwrap();
                    req.accept(spd, scq, scq, &options(true)).unwrap()
                })
            }
        };
        let connected = match client {
            Client::Smol(stack, remote) => {
                let opts = ConnectOptions { transport: Transport::Smol(stack.clone()), ..options(true) };
                client_dev.connect(remote, &cpd, &ccq, &ccq, &opts).unwrap()
            }
            Client::Kernel(remote) => client_dev.connect(remote, &cpd, &ccq, &ccq, &options(true)).unwrap(),
        };
        assert!(connected.qp.conn_params().crc, "CRC must be on");
        let server_qp = accepted.join().unwrap();
        (connected.qp, server_qp)
    });
    let (cqp, sqp) = server_qp;
    (End { pd: cpd, cq: ccq, qp: cqp }, End { pd: spd, cq: scq, qp: sqp })
}

/// Write, Read and Send both ways with the data checked, then `big` bytes written and read
/// back.
fn exercise(a: &End, b: &End, big: usize) {
    let mut wr_id = 0;
    for (from, to, seed) in [(a, b, 1u64), (b, a, 2)] {
        for len in [1usize, 1000, 1460, 9000, 64 * 1024] {
            wr_id += 1;
            let data = pattern(seed * 1000 + len as u64, len);
            // RDMA Write.
            let src = from.pd.register_bytes(&data, Access::NONE).unwrap();
            let dst = to.pd.register(len, Access::REMOTE_WRITE.union(Access::LOCAL_WRITE)).unwrap();
            let op = SendOp::Write { remote_stag: dst.rkey(), remote_to: dst.addr() };
            from.qp
                .post_send(SendWr { wr_id, op, sgl: src.sge(0, len as u32).into(), signaled: true })
                .unwrap();
            from.wait_ok(wr_id, "write");
            // A Write completes when sent; placement follows its arrival.
            wait_placed(&dst, &data, "RDMA Write");
            // RDMA Read back into a fresh buffer.
            wr_id += 1;
            let back = from.pd.register(len, Access::LOCAL_WRITE).unwrap();
            let readable = to.pd.register_bytes(&data, Access::REMOTE_READ).unwrap();
            let op = SendOp::Read { remote_stag: readable.rkey(), remote_to: readable.addr() };
            from.qp
                .post_send(SendWr { wr_id, op, sgl: back.sge(0, len as u32).into(), signaled: true })
                .unwrap();
            from.wait_ok(wr_id, "read");
            assert!(back.to_vec() == data, "RDMA Read of {len} B: data differs");
            // Send / Receive.
            wr_id += 1;
            let rbuf = to.pd.register(len, Access::LOCAL_WRITE).unwrap();
            to.qp.post_recv(RecvWr { wr_id, sgl: rbuf.sge(0, len as u32).into() }).unwrap();
            from.qp
                .post_send(SendWr {
                    wr_id,
                    op: SendOp::Send { solicited: false, invalidate: None },
                    sgl: src.sge(0, len as u32).into(),
                    signaled: true,
                })
                .unwrap();
            from.wait_ok(wr_id, "send");
            let wc = to.wait_ok(wr_id, "recv");
            assert_eq!((wc.opcode, wc.byte_len as usize), (WcOpcode::Recv, len));
            assert!(rbuf.to_vec() == data, "Send of {len} B: data differs");
        }
    }
    // A large transfer each way: written by A, read back by A.
    let data = pattern(99, big);
    let src = a.pd.register_bytes(&data, Access::NONE).unwrap();
    let dst = b.pd.register(big, Access::ALL).unwrap();
    let started = Instant::now();
    let op = SendOp::Write { remote_stag: dst.rkey(), remote_to: dst.addr() };
    a.qp.post_send(SendWr { wr_id: 900, op, sgl: src.sge(0, big as u32).into(), signaled: true }).unwrap();
    a.wait_ok(900, "large write");
    wait_placed(&dst, &data, "large RDMA Write");
    let wrote = started.elapsed();
    let back = a.pd.register(big, Access::LOCAL_WRITE).unwrap();
    let op = SendOp::Read { remote_stag: dst.rkey(), remote_to: dst.addr() };
    a.qp.post_send(SendWr { wr_id: 901, op, sgl: back.sge(0, big as u32).into(), signaled: true }).unwrap();
    a.wait_ok(901, "large read");
    assert!(back.to_vec() == data, "large RDMA Read: data differs");
    println!("{} MiB written in {wrote:?}, read back in {:?}", big / MIB, started.elapsed() - wrote);
}

/// Waits (bounded) until `region` holds `data`.
fn wait_placed(region: &iwarp::MemoryRegion, data: &[u8], what: &str) {
    let deadline = Instant::now() + T;
    while region.to_vec() != data {
        assert!(Instant::now() < deadline, "{what} of {} B: data differs after {T:?}", data.len());
        std::thread::sleep(Duration::from_millis(1));
    }
}

fn device(mode: PollMode) -> Device {
    Device::open(DeviceConfig { poll_mode: mode, ..DeviceConfig::default() })
}

/// The veth pair: each device on its own stack, on its own end.
fn veth_pair(drop_chance: f64, modes: (PollMode, PollMode)) {
    let mut ca = SmolConfig::new(IP_A, 24);
    ca.drop_chance = drop_chance;
    let mut cb = SmolConfig::new(IP_B, 24);
    cb.drop_chance = drop_chance;
    let sa = SmolStack::raw("va", ca).unwrap();
    let sb = SmolStack::raw("vb", cb).unwrap();
    let (da, db) = (device(modes.0), device(modes.1));
    let (a, b) = connect(&da, Client::Smol(&sa, SocketAddr::from((IP_B, PORT))), &db, Server::Smol(&sb));
    let mulpdu = a.qp.config().mulpdu;
    assert!(mulpdu > 1000 && mulpdu < 1500, "MULPDU {mulpdu} should follow the 1500-byte MTU");
    exercise(&a, &b, 4 * MIB);
    a.qp.disconnect();
    println!("stats a {:?} b {:?}", sa.device_stats(), sb.device_stats());
}

#[test]
fn smol_veth_two_devices() {
    if !netns::privileged("smol_veth_two_devices") {
        return;
    }
    let ns = netns("veth");
    ns.veth();
    ns.run_inner("inner_veth_two_devices");
}

#[test]
#[ignore = "runs inside the namespace of smol_veth_two_devices"]
fn inner_veth_two_devices() {
    if !inside() {
        return;
    }
    veth_pair(0.0, (PollMode::Adaptive, PollMode::Event));
}

#[test]
fn smol_veth_busy_engine() {
    if !netns::privileged("smol_veth_busy_engine") {
        return;
    }
    let ns = netns("modes");
    ns.veth();
    ns.run_inner("inner_veth_busy_modes");
}

#[test]
#[ignore = "runs inside the namespace of smol_veth_busy_engine"]
fn inner_veth_busy_modes() {
    if !inside() {
        return;
    }
    veth_pair(0.0, (PollMode::Busy, PollMode::Adaptive));
}

#[test]
fn smol_veth_one_percent_loss() {
    if !netns::privileged("smol_veth_one_percent_loss") {
        return;
    }
    let ns = netns("loss");
    ns.veth();
    ns.run_inner("inner_veth_loss");
}

#[test]
#[ignore = "runs inside the namespace of smol_veth_one_percent_loss"]
fn inner_veth_loss() {
    if !inside() {
        return;
    }
    veth_pair(0.01, (PollMode::Adaptive, PollMode::Adaptive));
}

const TAP_KERNEL: Ipv4Addr = Ipv4Addr::new(10, 79, 1, 1);
const TAP_SMOL: Ipv4Addr = Ipv4Addr::new(10, 79, 1, 2);

#[test]
fn smol_tap_against_kernel_tcp() {
    if !netns::privileged("smol_tap_against_kernel_tcp") {
        return;
    }
    let ns = netns("tap");
    ns.ip(&["tuntap", "add", "mode", "tap", "name", "tp0"]);
    ns.ip(&["addr", "add", "10.79.1.1/24", "dev", "tp0"]);
    ns.ip(&["link", "set", "tp0", "up"]);
    ns.run_inner("inner_tap_kernel");
}

#[test]
#[ignore = "runs inside the namespace of smol_tap_against_kernel_tcp"]
fn inner_tap_kernel() {
    if !inside() {
        return;
    }
    let stack = SmolStack::tap("tp0", SmolConfig::new(TAP_SMOL, 24)).unwrap();
    let (smol_dev, kernel_dev) = (device(PollMode::Adaptive), device(PollMode::Adaptive));
    // smoltcp connects to the kernel-TCP device's listener.
    let kernel_addr = SocketAddr::from((TAP_KERNEL, PORT));
    let (a, b) =
        connect(&smol_dev, Client::Smol(&stack, kernel_addr), &kernel_dev, Server::Kernel(kernel_addr));
    exercise(&a, &b, 4 * MIB);
    a.qp.disconnect();
    // The kernel-TCP device connects to the smoltcp device's listener.
    let (c, d) = connect(
        &kernel_dev,
        Client::Kernel(SocketAddr::from((TAP_SMOL, PORT))),
        &smol_dev,
        Server::Smol(&stack),
    );
    exercise(&c, &d, 4 * MIB);
    c.qp.disconnect();
}
