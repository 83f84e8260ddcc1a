//! The control connection: one 56-byte receive posted at all times, lockstep Sends (the
//! version, cycle buffer, cache line and MTU exchange, the "pre"/"post" handshakes, key records
//! and the report).

use super::args::*;
use super::conn::*;
use crate::toolbox::{self, Fail, register};
use std::time::{Duration, Instant};

use iwarp::{
    Access, CompletionQueue, Device, MemoryRegion, ProtectionDomain, QpEvent, QueuePair, RecvWr, SendOp,
    SendWr, WcOpcode, WcStatus, WorkCompletion,
};

use super::wire::{self, KeyRecord};

/// The control connection: one 56-byte receive posted at all times, lockstep Sends.
pub(super) struct Ctrl {
    pub(super) qp: QueuePair,
    pub(super) cq: CompletionQueue,
    pub(super) recv_mr: MemoryRegion,
    pub(super) send_mr: MemoryRegion,
    /// Completions of the other kind seen while waiting for one kind.
    pub(super) stash: Vec<WorkCompletion>,
    /// The connection's event, seen while a completion was still to be taken
    /// ([`toolbox::completion_or_event`]).
    pub(super) event: Option<QpEvent>,
    pub(super) timeout: Duration,
    pub(super) server: bool,
    pub(super) next_wr: u64,
}

/// The control connection's buffers, registered before it is made (its receive is posted
/// before the connection goes live).
pub(super) struct CtrlBufs {
    pub(super) cq: CompletionQueue,
    pub(super) recv_mr: MemoryRegion,
    pub(super) send_mr: MemoryRegion,
}

impl CtrlBufs {
    pub(super) fn new(device: &Device, pd: &ProtectionDomain) -> Result<CtrlBufs, Fail> {
        Ok(CtrlBufs {
            cq: device.create_cq(16),
            recv_mr: register(pd, wire::MAX_MSG, Access::LOCAL_WRITE)?,
            send_mr: register(pd, wire::MAX_MSG, Access::NONE)?,
        })
    }

    /// The receive posted before the connection goes live.
    pub(super) fn first_recv(&self) -> RecvWr {
        RecvWr { wr_id: 0, sgl: self.recv_mr.sge_all().into() }
    }

    pub(super) fn into_ctrl(self, qp: QueuePair, timeout: Duration, server: bool) -> Ctrl {
        Ctrl {
            qp,
            cq: self.cq,
            recv_mr: self.recv_mr,
            send_mr: self.send_mr,
            stash: Vec::new(),
            event: None,
            timeout,
            server,
            next_wr: 1,
        }
    }
}

impl Ctrl {
    /// Waits for the next completion of `want` (Send or Recv); `limit` None waits as long as
    /// the connection lives.
    pub(super) fn wait(
        &mut self,
        want: WcOpcode,
        what: &str,
        limit: Option<Duration>,
    ) -> Result<WorkCompletion, String> {
        if let Some(i) = self.stash.iter().position(|wc| wc.opcode == want) {
            return Ok(self.stash.remove(i));
        }
        let deadline = limit.map(|l| Instant::now() + l);
        loop {
            let slice = wait_slice(deadline, what)?;
            let wc = match toolbox::completion_or_event(&self.cq, &self.qp, &mut self.event, slice) {
                Ok(Some(wc)) => wc,
                Ok(None) => continue,
                Err(ev) => return Err(toolbox::event_text(ev, Some(what))),
            };
            if wc.status != WcStatus::Success {
                return Err(wc_failure(&self.qp, &wc, what));
            }
            if wc.opcode == want {
                return Ok(wc);
            }
            self.stash.push(wc);
        }
    }
}

impl Lockstep for Ctrl {
    fn server(&self) -> bool {
        self.server
    }

    fn timeout(&self) -> Duration {
        self.timeout
    }

    /// Sends one control message and waits for its completion.
    fn send(&mut self, msg: &[u8], what: &str) -> Result<(), String> {
        self.send_mr.write(0, msg).map_err(|e| format!("control send buffer: {e:?}"))?;
        self.next_wr += 1;
        let len = u32::try_from(msg.len()).unwrap_or(u32::MAX);
        let wr = SendWr {
            wr_id: self.next_wr,
            op: SendOp::Send { solicited: false, invalidate: None },
            sgl: self.send_mr.sge(0, len).into(),
            signaled: true,
        };
        self.qp.post_send(wr).map_err(|e| format!("cannot post the Send of {what}: {e:?}"))?;
        self.wait(WcOpcode::Send, &format!("the Send of {what}"), Some(self.timeout))?;
        Ok(())
    }

    /// Receives one control message (the `expect` bytes perftest copies out), then reposts.
    fn recv(&mut self, expect: usize, what: &str, limit: Option<Duration>) -> Result<Vec<u8>, String> {
        self.wait(WcOpcode::Recv, &format!("the peer's {what}"), limit)?;
        let mut b = vec![0u8; expect.min(wire::MAX_MSG)];
        self.recv_mr.read(0, &mut b).map_err(|e| format!("control receive buffer: {e:?}"))?;
        self.next_wr += 1;
        let wr = RecvWr { wr_id: self.next_wr, sgl: self.recv_mr.sge_all().into() };
        self.qp.post_recv(wr).map_err(|e| format!("cannot post a control receive: {e:?}"))?;
        Ok(b)
    }
}

/// The next slice (at most 50 ms) of a wait until `deadline` (None: without end), or the
/// timeout as text once it has passed.
pub(super) fn wait_slice(deadline: Option<Instant>, what: &str) -> Result<Duration, String> {
    let Some(d) = deadline else { return Ok(Duration::from_millis(50)) };
    let left = d.saturating_duration_since(Instant::now());
    if left.is_zero() {
        return Err(format!("timed out waiting for {what}"));
    }
    Ok(left.min(Duration::from_millis(50)))
}

/// perftest's lockstep control messages over a connection that sends one message and receives
/// the next (the engine's queue pair here, the seam's endpoint in seam.rs).
pub(super) trait Lockstep {
    /// Whether this side is the server (answers second).
    fn server(&self) -> bool;
    /// How long one message may take.
    fn timeout(&self) -> Duration;
    /// Sends one control message and waits for its completion.
    fn send(&mut self, msg: &[u8], what: &str) -> Result<(), String>;
    /// Receives one control message (the `expect` bytes perftest copies out), then reposts;
    /// `limit` None waits as long as the connection lives.
    fn recv(&mut self, expect: usize, what: &str, limit: Option<Duration>) -> Result<Vec<u8>, String>;

    /// One lockstep exchange: the client sends first and waits for the answer; the server
    /// receives, reposts, then answers. Returns the peer's message.
    fn exchange(&mut self, msg: &[u8], what: &str, limit: Option<Duration>) -> Result<Vec<u8>, String> {
        if self.server() {
            let got = self.recv(msg.len(), what, limit)?;
            self.send(msg, what)?;
            Ok(got)
        } else {
            self.send(msg, what)?;
            self.recv(msg.len(), what, limit)
        }
    }

    /// Part A: version, cycle buffer, cache line, MTU, then the "pre" handshake.
    fn part_a(&mut self) -> Result<Agreed, String> {
        let t = Some(self.timeout());
        let v = self.exchange(&wire::version_msg(wire::VERSION), "version", t)?;
        match wire::parse_version(&v) {
            Some(peer) if peer >= wire::MIN_PEER_VERSION => {}
            _ => {
                let end = v.iter().position(|&c| c == 0).unwrap_or(v.len());
                return Err(format!(
                    "the peer's perftest version {:?} is older than {} or not a version",
                    String::from_utf8_lossy(&v[..end]),
                    wire::MIN_PEER_VERSION
                ));
            }
        }
        let cycle = wire::parse_u32(&self.exchange(&wire::u32_msg(CYCLE_BUFFER), "cycle buffer size", t)?);
        let line = wire::parse_u32(&self.exchange(&wire::u32_msg(CACHE_LINE), "cache line size", t)?);
        let mtu = wire::parse_mtu(&self.exchange(&wire::mtu_msg(MTU_ENUM), "MTU", t)?);
        self.exchange(&[0u8; wire::KEY_RECORD_LEN], "\"pre\" handshake", t)?;
        Ok(Agreed {
            // The peer's cycle buffer sizes our data buffer: bounded, so a client cannot make
            // a server hold more than MAX_PEER_CYCLE (perftest's own is a page).
            cycle: cycle.clamp(CYCLE_BUFFER, MAX_PEER_CYCLE),
            cache_line: line.clamp(CACHE_LINE, 4096),
            mtu: mtu.map_or(MTU_ENUM, |m| m.min(MTU_ENUM)),
        })
    }

    /// The "post" handshake and K1-K3; returns the peer's record (the last one).
    fn keys(&mut self, mine: &KeyRecord) -> Result<KeyRecord, String> {
        let t = Some(self.timeout());
        self.exchange(&[0u8; wire::KEY_RECORD_LEN], "\"post\" handshake", t)?;
        let mut peer = KeyRecord::default();
        for k in 1..=3 {
            let b = self.exchange(&mine.to_bytes(), &format!("key record K{k}"), t)?;
            peer = KeyRecord::parse(&b).ok_or_else(|| format!("short key record K{k}"))?;
        }
        Ok(peer)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use iwarp::{ConnectOptions, DeviceConfig, PollMode, QpState};

    /// A peer that sends its last control message and closes at once: the message and the
    /// close arrive together, and the wait for the message returns it; the close is what the
    /// next wait reports.
    #[test]
    fn a_message_that_came_with_the_close_is_received() {
        const T: Duration = Duration::from_secs(5);
        let open = || Device::open(DeviceConfig { poll_mode: PollMode::Event, ..DeviceConfig::default() });
        let (client, server) = (open(), open());
        let listener = server.listen("127.0.0.1:0".parse().unwrap()).unwrap();
        let addr = listener.local_addr().unwrap();
        let (cpd, spd) = (client.alloc_pd(), server.alloc_pd());
        let bufs = CtrlBufs::new(&client, &cpd).unwrap();
        let opts = ConnectOptions { recv: vec![bufs.first_recv()], ..ConnectOptions::default() };
        // The server answers the client's first message (a responder speaks only after the
        // initiator has) with its last one, and closes.
        let peer = std::thread::spawn(move || {
            let cq = server.create_cq(4);
            let mr = spd.register(8, Access::LOCAL_WRITE).unwrap();
            let recv = vec![RecvWr { wr_id: 1, sgl: mr.sge(0, 8).into() }];
            let qp = listener
                .accept(T)
                .unwrap()
                .accept(&spd, &cq, &cq, &ConnectOptions { recv, ..ConnectOptions::default() })
                .unwrap();
            let done = |wr_id| {
                let wc = cq.wait(T).unwrap();
                assert_eq!((wc.wr_id, wc.status), (wr_id, WcStatus::Success));
            };
            done(1);
            let op = SendOp::Send { solicited: false, invalidate: None };
            qp.post_send(SendWr { wr_id: 2, op, sgl: mr.sge(0, 8).into(), signaled: true }).unwrap();
            done(2);
            qp.disconnect();
            server
        });
        let qp = client.connect(addr, &cpd, &bufs.cq, &bufs.cq, &opts).unwrap().qp;
        let op = SendOp::Send { solicited: false, invalidate: None };
        qp.post_send(SendWr { wr_id: 9, op, sgl: bufs.send_mr.sge(0, 4).into(), signaled: true }).unwrap();
        let _server = peer.join().unwrap();
        // Both are in before the wait looks: the close, and the message's completion.
        let deadline = Instant::now() + T;
        while qp.state() == QpState::Rts && Instant::now() < deadline {
            std::thread::sleep(Duration::from_millis(5));
        }
        let mut ctrl = bufs.into_ctrl(qp, T, false);
        let wc = ctrl.wait(WcOpcode::Recv, "the last message", Some(T)).unwrap();
        assert_eq!((wc.wr_id, wc.byte_len), (0, 8));
        let e = ctrl.wait(WcOpcode::Recv, "another message", Some(T)).unwrap_err();
        assert!(e.contains("closed"), "{e}");
    }
}
