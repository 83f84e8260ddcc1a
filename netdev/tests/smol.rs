//! smoltcp links over real devices: a veth pair (raw Ethernet) and a TAP device, each inside a
//! network namespace the test creates and deletes.
//!
//! Needs root (network namespaces, veth, TAP, raw sockets). A test that cannot set up its
//! namespace fails with a message saying what is missing; it never skips.
//!
//! Each outer test creates a namespace, sets up the interfaces in it, and runs its body in a
//! child process (`ip netns exec NS <this test binary> --exact inner_... --ignored`), so every
//! frame stays inside the namespace. The inner tests are `#[ignore]`d and do nothing outside
//! such a child.
//!
//! The veth, TAP and loss cases run twice in their namespace: with the offloads the device
//! offers (segmentation, checksums: [`Offload::Auto`]) and with none ([`Offload::Off`]).

#![allow(clippy::unwrap_used, clippy::expect_used)]

use iwarp_tests::netns::{self, Netns};
use std::io::{IoSlice, Read, Write};
use std::net::{Ipv4Addr, SocketAddr, TcpListener};
use std::process::Command;
use std::time::{Duration, Instant};

use iwarp_netdev::smoltcp::socket::tcp::State;
use iwarp_netdev::{Link, LinkError, Offload, SmolConfig, SmolLink, SmolStack};

const INNER_ENV: &str = "IWARP_SMOL_NETNS";
const CHILD_TIMEOUT: Duration = Duration::from_secs(150);
const IP_A: Ipv4Addr = Ipv4Addr::new(10, 77, 0, 1);
const IP_B: Ipv4Addr = Ipv4Addr::new(10, 77, 0, 2);
const PORT: u16 = 7174;

/// A namespace for one outer test (see `iwarp_tests::netns`).
fn netns(tag: &str) -> Netns {
    Netns::new("iwsmol", tag, INNER_ENV, CHILD_TIMEOUT)
}

/// True inside the namespace child; outside, the inner tests do nothing.
fn inside() -> bool {
    netns::inside(INNER_ENV)
}

fn pattern(seed: u64, len: usize) -> Vec<u8> {
    let mut x = seed | 1;
    (0..len)
        .map(|_| {
            x ^= x << 13;
            x ^= x >> 7;
            x ^= x << 17;
            x.to_le_bytes()[3]
        })
        .collect()
}

/// Both offload settings, each test body runs with one and then the other.
const OFFLOADS: [Offload; 2] = [Offload::Auto, Offload::Off];

fn stack(dev: &str, ip: Ipv4Addr, drop_chance: f64) -> SmolStack {
    stack_with(dev, ip, drop_chance, Offload::Auto)
}

/// A stack on `dev` with `offload`; checks that a veth takes every offload when asked and
/// none is used when they are off.
fn stack_with(dev: &str, ip: Ipv4Addr, drop_chance: f64, offload: Offload) -> SmolStack {
    let mut cfg = SmolConfig::new(ip, 24);
    cfg.drop_chance = drop_chance;
    cfg.offload = offload;
    let stack = SmolStack::raw(dev, cfg).unwrap_or_else(|err| panic!("smoltcp stack on {dev}: {err}"));
    check_offloads(&stack, offload);
    stack
}

fn check_offloads(stack: &SmolStack, offload: Offload) {
    let o = stack.offloads();
    println!("{} ({offload:?}): offloads {o}", stack.device_name());
    match offload {
        Offload::Auto => assert!(o.tso && o.tx_checksum && o.rx_checksum, "offloads asked for, in use: {o}"),
        Offload::Off => assert!(!o.tso && !o.tx_checksum && !o.rx_checksum, "offloads off, in use: {o}"),
    }
}

/// Connects a link from `a` to a listener on `b`.
fn connect(a: &SmolStack, b: &SmolStack, port: u16) -> (SmolLink, SmolLink) {
    let mut listener = b.listen(port).unwrap();
    let client = a.connect(SocketAddr::from((b.ip(), port))).unwrap();
    let deadline = Instant::now() + Duration::from_secs(10);
    loop {
        a.poll_now();
        if let Some(server) = listener.accept().unwrap() {
            client.wait_established(Duration::from_secs(10)).unwrap();
            return (client, server);
        }
        assert!(Instant::now() < deadline, "no connection within 10 s (client state {})", client.state());
        std::thread::sleep(Duration::from_micros(100));
    }
}

/// One direction of a transfer.
struct Flow<'a> {
    data: &'a [u8],
    sent: usize,
    received: usize,
}

impl Flow<'_> {
    fn pump(&mut self, tx: &mut SmolLink, rx: &mut SmolLink, buf: &mut [u8]) -> bool {
        let mut progress = false;
        if self.sent < self.data.len() {
            let end = (self.sent + 256 * 1024).min(self.data.len());
            let n = tx.send_vectored(&[IoSlice::new(&self.data[self.sent..end])]).unwrap();
            self.sent += n;
            progress |= n > 0;
        }
        loop {
            match rx.recv(buf) {
                Ok(0) => break,
                Ok(n) => {
                    assert!(self.received + n <= self.data.len(), "more bytes than were sent");
                    assert!(
                        buf[..n] == self.data[self.received..self.received + n],
                        "corrupt data at offset {}",
                        self.received
                    );
                    self.received += n;
                    progress = true;
                }
                Err(err) => panic!("recv after {} of {} bytes: {err}", self.received, self.data.len()),
            }
        }
        progress
    }

    fn done(&self) -> bool {
        self.received == self.data.len()
    }
}

/// Moves `ab` from `a` to `b` and `ba` from `b` to `a` at once; returns the elapsed time.
fn exchange(
    stacks: [&SmolStack; 2],
    a: &mut SmolLink,
    b: &mut SmolLink,
    ab: &[u8],
    ba: &[u8],
    limit: Duration,
) -> Duration {
    let start = Instant::now();
    let mut fwd = Flow { data: ab, sent: 0, received: 0 };
    let mut back = Flow { data: ba, sent: 0, received: 0 };
    let mut buf = vec![0; 256 * 1024];
    while !(fwd.done() && back.done()) {
        let mut progress = fwd.pump(a, b, &mut buf);
        progress |= back.pump(b, a, &mut buf);
        for stack in stacks {
            progress |= stack.poll_now();
        }
        assert!(
            start.elapsed() < limit,
            "transfer stuck after {:?}: a->b {}/{} sent {}, b->a {}/{} sent {}; a {:?} b {:?}",
            limit,
            fwd.received,
            ab.len(),
            fwd.sent,
            back.received,
            ba.len(),
            back.sent,
            stacks[0].device_stats(),
            stacks[1].device_stats()
        );
        if !progress {
            std::thread::sleep(Duration::from_micros(50));
        }
    }
    start.elapsed()
}

fn mbps(bytes: usize, took: Duration) -> f64 {
    let bits = u32::try_from(bytes).map(f64::from).unwrap_or(f64::MAX) * 8.0;
    bits / took.as_secs_f64() / 1e6
}

/// Reads until `Closed`, polling `stacks`, with a time limit.
fn read_to_close(link: &mut SmolLink, stacks: [&SmolStack; 2], limit: Duration) -> Vec<u8> {
    let start = Instant::now();
    let mut out = Vec::new();
    let mut buf = vec![0; 65536];
    loop {
        for stack in stacks {
            stack.poll_now();
        }
        match link.recv(&mut buf) {
            Ok(0) => std::thread::sleep(Duration::from_micros(100)),
            Ok(n) => out.extend_from_slice(&buf[..n]),
            Err(LinkError::Closed) => return out,
            Err(err) => panic!("recv: {err}"),
        }
        assert!(start.elapsed() < limit, "no close within {limit:?} ({} bytes read)", out.len());
    }
}

/// Polls until `link.recv` fails with something other than `Closed`.
fn wait_reset(link: &mut SmolLink, stacks: [&SmolStack; 2], limit: Duration) {
    let start = Instant::now();
    let mut buf = [0; 1024];
    loop {
        for stack in stacks {
            stack.poll_now();
        }
        match link.recv(&mut buf) {
            Ok(_) => {}
            Err(LinkError::Reset) => return,
            Err(err) => panic!("expected a reset, got {err}"),
        }
        assert!(start.elapsed() < limit, "no reset within {limit:?}");
        std::thread::sleep(Duration::from_micros(100));
    }
}

// ---- raw Ethernet over a veth pair -------------------------------------------------------

#[test]
fn raw_veth_transfer_8mib_both_ways() {
    if !netns::privileged("raw_veth_transfer_8mib_both_ways") {
        return;
    }
    let ns = netns("xfer");
    ns.veth();
    ns.run_inner("inner_raw_transfer");
}

#[test]
#[ignore = "runs inside the namespace of raw_veth_transfer_8mib_both_ways"]
fn inner_raw_transfer() {
    if !inside() {
        return;
    }
    for (i, offload) in (0u16..).zip(OFFLOADS) {
        raw_transfer(offload, PORT + i);
    }
}

fn raw_transfer(offload: Offload, port: u16) {
    let a = stack_with("va", IP_A, 0.0, offload);
    let b = stack_with("vb", IP_B, 0.0, offload);
    assert_eq!(a.mtu(), 1500);
    let (mut ca, mut cb) = connect(&a, &b, port);
    assert_eq!(ca.peer_addr(), Some(SocketAddr::from((IP_B, port))));
    assert_eq!(cb.local_addr(), Some(SocketAddr::from((IP_B, port))));
    assert_eq!(cb.peer_addr(), ca.local_addr());
    let ab = pattern(1, 8 << 20);
    let ba = pattern(2, 8 << 20);
    let took = exchange([&a, &b], &mut ca, &mut cb, &ab, &ba, Duration::from_secs(60));
    println!(
        "smoltcp raw veth: 8 MiB each way at once in {took:?} ({:.0} Mbit/s per direction); a {:?}",
        mbps(ab.len(), took),
        a.device_stats()
    );
    // One way only: raw smoltcp TCP throughput for comparisons.
    let big = pattern(3, 32 << 20);
    let took = exchange([&a, &b], &mut ca, &mut cb, &big, &[], Duration::from_secs(60));
    println!(
        "smoltcp raw veth TCP throughput ({offload:?}): 32 MiB one way in {took:?} = {:.0} Mbit/s",
        mbps(big.len(), took)
    );
    // Segments larger than the wire's went out only with the offloads on.
    let gso = a.device_stats().tx_gso_frames;
    assert_eq!(gso > 0, offload == Offload::Auto, "{gso} segmentation requests ({offload:?})");
    ca.shutdown_write();
    assert!(read_to_close(&mut cb, [&a, &b], Duration::from_secs(10)).is_empty());
}

#[test]
fn raw_veth_connect_listen_close_reset() {
    if !netns::privileged("raw_veth_connect_listen_close_reset") {
        return;
    }
    let ns = netns("cm");
    ns.veth();
    ns.run_inner("inner_raw_close_reset");
}

#[test]
#[ignore = "runs inside the namespace of raw_veth_connect_listen_close_reset"]
fn inner_raw_close_reset() {
    if !inside() {
        return;
    }
    let a = stack("va", IP_A, 0.0);
    let b = stack("vb", IP_B, 0.0);

    // A second listener on the same port is refused.
    let listener = b.listen(PORT).unwrap();
    let err = b.listen(PORT).unwrap_err();
    assert_eq!(err.kind(), std::io::ErrorKind::AddrInUse, "{err}");
    assert!(err.to_string().contains("7174"), "{err}");
    drop(listener);

    // Orderly close, both halves separately: data sent before the FIN all arrives.
    let (mut ca, mut cb) = connect(&a, &b, PORT);
    assert!(ca.is_established() && cb.is_established());
    assert_eq!(ca.send(b"hello then FIN").unwrap(), 14);
    ca.shutdown_write();
    ca.shutdown_write();
    assert!(matches!(ca.send(b"x"), Err(LinkError::WriteShutdown)));
    assert_eq!(read_to_close(&mut cb, [&a, &b], Duration::from_secs(10)), b"hello then FIN");
    assert!(matches!(cb.recv(&mut [0; 8]), Err(LinkError::Closed)));
    // The other direction still works after the half-close.
    assert_eq!(cb.send(b"reply after FIN").unwrap(), 15);
    cb.shutdown_write();
    assert_eq!(read_to_close(&mut ca, [&a, &b], Duration::from_secs(10)), b"reply after FIN");
    drop((ca, cb));

    // The listener keeps taking connections after the first ones (re-armed backlog); more
    // handshakes at once than the backlog would be refused (smoltcp answers a SYN nobody
    // listens for with RST), so they come two at a time.
    let mut listener = b.listen(PORT + 1).unwrap();
    let mut clients = Vec::new();
    let mut servers = Vec::new();
    let start = Instant::now();
    for _ in 0..4 {
        for _ in 0..2 {
            clients.push(a.connect(SocketAddr::from((IP_B, PORT + 1))).unwrap());
        }
        while servers.len() < clients.len() {
            a.poll_now();
            if let Some(s) = listener.accept().unwrap() {
                servers.push(s);
            } else {
                std::thread::sleep(Duration::from_micros(200));
            }
            assert!(
                start.elapsed() < Duration::from_secs(20),
                "accepted {} of {}",
                servers.len(),
                clients.len()
            );
        }
    }
    for client in &clients {
        client.wait_established(Duration::from_secs(5)).unwrap();
    }
    drop((clients, servers, listener));

    // Reset: the peer sees Reset, on recv and on send.
    let (mut ca, mut cb) = connect(&a, &b, PORT + 2);
    ca.abort();
    wait_reset(&mut cb, [&a, &b], Duration::from_secs(10));
    assert!(matches!(cb.send(b"x"), Err(LinkError::Reset)));
    assert_eq!(ca.state(), State::Closed);

    // Nobody listening: the connection is refused.
    let mut refused = a.connect(SocketAddr::from((IP_B, 9))).unwrap();
    let start = Instant::now();
    while refused.state() != State::Closed {
        a.poll_now();
        b.poll_now();
        assert!(start.elapsed() < Duration::from_secs(10), "no RST from a port nobody listens on");
        std::thread::sleep(Duration::from_micros(100));
    }
    let err = refused.wait_established(Duration::from_secs(1)).unwrap_err();
    assert_eq!(err.kind(), std::io::ErrorKind::ConnectionRefused, "{err}");
    assert!(matches!(refused.recv(&mut [0; 8]), Err(LinkError::Reset)));

    // No such host: connecting times out (ARP gets no answer).
    let nobody = a.connect(SocketAddr::from((Ipv4Addr::new(10, 77, 0, 99), PORT))).unwrap();
    let err = nobody.wait_established(Duration::from_millis(500)).unwrap_err();
    assert_eq!(err.kind(), std::io::ErrorKind::TimedOut, "{err}");
}

#[test]
fn raw_veth_half_open_connections_time_out() {
    if !netns::privileged("raw_veth_half_open_connections_time_out") {
        return;
    }
    let ns = netns("synflood");
    ns.veth();
    ns.run_inner("inner_raw_half_open");
}

#[test]
#[ignore = "runs inside the namespace of raw_veth_half_open_connections_time_out"]
fn inner_raw_half_open() {
    if !inside() {
        return;
    }
    let mut cfg = SmolConfig::new(IP_A, 24);
    cfg.backlog = 2;
    cfg.handshake_timeout = Duration::from_millis(300);
    let server = SmolStack::raw("va", cfg).unwrap();
    let mut listener = server.listen(PORT).unwrap();
    // A host that sends SYNs and then never answers again: its stack is polled only until
    // the SYNs are out, then left alone (its frames pile up unread).
    let ghost = stack("vb", IP_B, 0.0);
    let ghosts: Vec<SmolLink> =
        (0..2).map(|_| ghost.connect(SocketAddr::from((IP_A, PORT))).unwrap()).collect();
    let start = Instant::now();
    loop {
        ghost.poll_now();
        server.poll_now();
        assert!(listener.accept().unwrap().is_none());
        if ghosts.iter().all(|g| g.state() == State::SynSent) && server_half_open(&server) == 2 {
            break;
        }
        assert!(start.elapsed() < Duration::from_secs(10), "the ghost's SYNs did not arrive");
        std::thread::sleep(Duration::from_millis(1));
    }
    // Both backlog slots are half open. A real client (another address on the same link)
    // still gets in once the half-open slots time out and are armed again.
    let real = stack("vb", Ipv4Addr::new(10, 77, 0, 3), 0.0);
    let start = Instant::now();
    let (client, accepted) = loop {
        let client = real.connect(SocketAddr::from((IP_A, PORT))).unwrap();
        let mut accepted = None;
        while client.state() == State::SynSent || (client.is_established() && accepted.is_none()) {
            real.poll_now();
            server.poll_now();
            if accepted.is_none() {
                accepted = listener.accept().unwrap();
            }
            assert!(
                start.elapsed() < Duration::from_secs(20),
                "the listener stayed full of half-open sockets"
            );
            std::thread::sleep(Duration::from_millis(1));
        }
        if let Some(a) = accepted {
            break (client, a);
        }
        // Refused while the backlog was full: try again.
    };
    assert!(client.is_established());
    assert_eq!(accepted.peer_addr(), client.local_addr());
    drop(ghosts);
}

/// Half-open (SYN-RECEIVED) sockets of `stack`.
fn server_half_open(stack: &SmolStack) -> usize {
    stack.tcp_states().iter().filter(|s| **s == State::SynReceived).count()
}

#[test]
fn raw_veth_transfer_with_one_percent_frame_loss() {
    if !netns::privileged("raw_veth_transfer_with_one_percent_frame_loss") {
        return;
    }
    let ns = netns("loss");
    ns.veth();
    ns.run_inner("inner_raw_loss");
}

#[test]
#[ignore = "runs inside the namespace of raw_veth_transfer_with_one_percent_frame_loss"]
fn inner_raw_loss() {
    if !inside() {
        return;
    }
    for (i, offload) in (0u16..).zip(OFFLOADS) {
        raw_loss(offload, PORT + i);
    }
}

fn raw_loss(offload: Offload, port: u16) {
    // netem is not available on every kernel; the device's own fault injection drops 1% of
    // the frames in each direction on both stacks (with the offloads on, a dropped frame may
    // be a whole 64 KiB segment).
    let a = stack_with("va", IP_A, 0.0, offload);
    let b = stack_with("vb", IP_B, 0.0, offload);
    let (mut ca, mut cb) = connect(&a, &b, port);
    a.set_drop_chance(0.01);
    b.set_drop_chance(0.01);
    let ab = pattern(4, 4 << 20);
    let ba = pattern(5, 4 << 20);
    let took = exchange([&a, &b], &mut ca, &mut cb, &ab, &ba, Duration::from_secs(60));
    let (sa, sb) = (a.device_stats(), b.device_stats());
    println!(
        "1% loss ({offload:?}): 4 MiB each way in {took:?}; dropped {} + {} frames",
        sa.injected_drops, sb.injected_drops
    );
    assert!(sa.injected_drops + sb.injected_drops > 0, "fault injection dropped nothing");
    ca.shutdown_write();
    assert!(read_to_close(&mut cb, [&a, &b], Duration::from_secs(30)).is_empty());
}

// ---- TAP: a smoltcp endpoint against the kernel's TCP -------------------------------------

const TAP_KERNEL: Ipv4Addr = Ipv4Addr::new(10, 78, 0, 1);
const TAP_SMOL: Ipv4Addr = Ipv4Addr::new(10, 78, 0, 2);

#[test]
fn tap_smoltcp_to_kernel_tcp() {
    if !netns::privileged("tap_smoltcp_to_kernel_tcp") {
        return;
    }
    let ns = netns("tap");
    ns.ip(&["tuntap", "add", "mode", "tap", "name", "tp0"]);
    ns.ip(&["addr", "add", "10.78.0.1/24", "dev", "tp0"]);
    ns.ip(&["link", "set", "tp0", "up"]);
    ns.run_inner("inner_tap_kernel");
}

/// The kernel side: accepts one connection, checks `expect` arrives, sends `reply`, closes.
fn kernel_peer(listener: TcpListener, expect: Vec<u8>, reply: Vec<u8>) -> std::thread::JoinHandle<()> {
    std::thread::spawn(move || {
        let (mut s, _) = listener.accept().unwrap();
        s.set_read_timeout(Some(Duration::from_secs(30))).unwrap();
        s.set_write_timeout(Some(Duration::from_secs(30))).unwrap();
        let writer = {
            let mut s = s.try_clone().unwrap();
            std::thread::spawn(move || {
                s.write_all(&reply).unwrap();
                s.shutdown(std::net::Shutdown::Write).unwrap();
            })
        };
        let mut got = Vec::new();
        s.read_to_end(&mut got).unwrap();
        assert!(got == expect, "kernel side got {} bytes, wrong data", got.len());
        writer.join().unwrap();
    })
}

#[test]
#[ignore = "runs inside the namespace of tap_smoltcp_to_kernel_tcp"]
fn inner_tap_kernel() {
    if !inside() {
        return;
    }
    for (i, offload) in (0u16..).zip(OFFLOADS) {
        tap_kernel(offload, PORT + 2 * i);
    }
}

fn tap_kernel(offload: Offload, port: u16) {
    let mut cfg = SmolConfig::new(TAP_SMOL, 24);
    cfg.offload = offload;
    let smol = SmolStack::tap("tp0", cfg.clone()).unwrap();
    check_offloads(&smol, offload);
    let err = SmolStack::tap("tp0", cfg).unwrap_err();
    println!("second attach: {err}");

    // smoltcp connects to a kernel listener.
    let up = pattern(6, 4 << 20);
    let down = pattern(7, 4 << 20);
    let listener = TcpListener::bind((TAP_KERNEL, port)).unwrap();
    let kernel = kernel_peer(listener, up.clone(), down.clone());
    let mut link = smol.connect(SocketAddr::from((TAP_KERNEL, port))).unwrap();
    link.wait_established(Duration::from_secs(10)).unwrap();
    transfer_with_kernel(&smol, &mut link, &up, &down);
    kernel.join().unwrap();

    // The kernel connects to a smoltcp listener.
    let mut listener = smol.listen(port).unwrap();
    let (up2, down2) = (down, up);
    let (tx_expect, rx_data) = (up2.clone(), down2.clone());
    let kernel = std::thread::spawn(move || {
        let mut s = std::net::TcpStream::connect_timeout(
            &SocketAddr::from((TAP_SMOL, port)),
            Duration::from_secs(10),
        )
        .unwrap();
        s.set_read_timeout(Some(Duration::from_secs(30))).unwrap();
        let writer = {
            let mut s = s.try_clone().unwrap();
            std::thread::spawn(move || {
                s.write_all(&tx_expect).unwrap();
                s.shutdown(std::net::Shutdown::Write).unwrap();
            })
        };
        let mut got = Vec::new();
        s.read_to_end(&mut got).unwrap();
        assert!(got == rx_data, "kernel client got {} bytes, wrong data", got.len());
        writer.join().unwrap();
    });
    let mut link = listener.accept_timeout(Duration::from_secs(10)).unwrap();
    transfer_with_kernel(&smol, &mut link, &down2, &up2);
    kernel.join().unwrap();
    let stats = smol.device_stats();
    println!("tap ({offload:?}): {stats:?}");
    assert_eq!(stats.tx_gso_frames > 0, offload == Offload::Auto, "segmentation requests: {stats:?}");
    // The kernel hands over segments it did not cut (its TCP sends to a TAP with TSO as to a
    // NIC with it) only when told the stack takes them.
    assert_eq!(stats.rx_gso_frames > 0, offload == Offload::Auto, "large segments received: {stats:?}");
}

/// Sends `send` on `link` and closes; reads `expect` then the kernel's FIN.
fn transfer_with_kernel(smol: &SmolStack, link: &mut SmolLink, send: &[u8], expect: &[u8]) {
    let start = Instant::now();
    let mut sent = 0;
    let mut got = Vec::new();
    let mut buf = vec![0; 65536];
    let mut closed = false;
    while !closed || sent < send.len() {
        let mut progress = smol.poll_now();
        if sent < send.len() {
            let n = link.send(&send[sent..]).unwrap();
            sent += n;
            progress |= n > 0;
            if sent == send.len() {
                link.shutdown_write();
            }
        }
        if !closed {
            match link.recv(&mut buf) {
                Ok(0) => {}
                Ok(n) => {
                    got.extend_from_slice(&buf[..n]);
                    progress = true;
                }
                Err(LinkError::Closed) => closed = true,
                Err(err) => panic!("recv from the kernel: {err}"),
            }
        }
        assert!(
            start.elapsed() < Duration::from_secs(60),
            "stuck: sent {sent}/{}, got {}/{}",
            send.len(),
            got.len(),
            expect.len()
        );
        if !progress {
            smol.wait(Duration::from_millis(1)).unwrap();
        }
    }
    assert!(got == expect, "smoltcp side got {} bytes, wrong data", got.len());
    let took = start.elapsed();
    println!("tap, smoltcp <-> kernel TCP: {} bytes each way in {took:?}", send.len());
    // Let the last ACKs go out.
    let until = Instant::now() + Duration::from_millis(200);
    while Instant::now() < until && link.send_queue() > 0 {
        smol.poll_now();
        smol.wait(Duration::from_millis(1)).unwrap();
    }
}

// ---- errors --------------------------------------------------------------------------------

#[test]
fn permission_errors_name_the_interface_and_cause() {
    if !netns::privileged("permission_errors_name_the_interface_and_cause") {
        return;
    }
    let ns = netns("perm");
    ns.veth();
    ns.ip(&["tuntap", "add", "mode", "tap", "name", "tp0"]);
    // The inner test runs as an unprivileged user: no CAP_NET_RAW, no CAP_NET_ADMIN.
    let exe = std::env::current_exe().unwrap();
    let out = Command::new("ip")
        .args(["netns", "exec", &ns.name, "setpriv", "--reuid=65534", "--regid=65534", "--clear-groups"])
        .arg(exe)
        .args(["--exact", "inner_permission_errors", "--ignored", "--nocapture"])
        .env(INNER_ENV, &ns.name)
        .output()
        .expect("setpriv (util-linux) is needed to drop privileges");
    let text = String::from_utf8_lossy(&out.stdout);
    print!("{text}");
    eprint!("{}", String::from_utf8_lossy(&out.stderr));
    assert!(out.status.success() && text.contains("1 passed"), "inner_permission_errors failed");
}

#[test]
#[ignore = "runs inside the namespace of permission_errors_name_the_interface_and_cause"]
fn inner_permission_errors() {
    if !inside() {
        return;
    }
    let err = SmolStack::raw("va", SmolConfig::new(IP_A, 24)).unwrap_err();
    println!("raw as nobody: {err}");
    assert_eq!(err.kind(), std::io::ErrorKind::PermissionDenied, "{err}");
    assert!(err.to_string().contains("va") && err.to_string().contains("CAP_NET_RAW"), "{err}");
    let err = SmolStack::tap("tp0", SmolConfig::new(IP_A, 24)).unwrap_err();
    println!("tap as nobody: {err}");
    assert_eq!(err.kind(), std::io::ErrorKind::PermissionDenied, "{err}");
    assert!(err.to_string().contains("tp0") && err.to_string().contains("CAP_NET_ADMIN"), "{err}");
}
