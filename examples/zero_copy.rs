//! Zero copy: a peer's RDMA Write lands straight in the application's own vector, which the
//! application then reads in place, and gets back when it deregisters it.
//!
//! ```text
//! cargo run --example zero_copy
//! ```
//!
//! The receiver registers a `Vec<u8>` it allocated (no copy into stack memory), hands the rkey
//! and address to the sender (here: in the same process), and posts a receive. The sender
//! RDMA Writes 4 MiB into the vector, then Sends a short "done" message. RDMA orders the two:
//! once the receiver has polled the receive completion of that Send, every byte of the Write
//! is in place, and the receiver reads the vector where it is, through the region's zero-copy
//! view. Deregistration gives the same vector back.

use std::error::Error;
use std::time::Duration;

use iwarp::{
    Access, CompletionQueue, ConnectOptions, Device, DeviceConfig, MemoryRegion, PollMode, RecvWr, SendOp,
    SendWr, WcOpcode, WcStatus,
};

const TIMEOUT: Duration = Duration::from_secs(5);
const LEN: usize = 4 << 20;

/// Waits for the next completion and checks that it is a successful `opcode`.
fn completion(cq: &CompletionQueue, opcode: WcOpcode) -> Result<(), Box<dyn Error>> {
    let wc = cq.wait(TIMEOUT).ok_or("no completion in time")?;
    if (wc.status, wc.opcode) != (WcStatus::Success, opcode) {
        return Err(format!("unexpected completion {wc:?}").into());
    }
    Ok(())
}

/// A checksum of the region's bytes, read where the peer wrote them.
#[expect(
    unsafe_code,
    reason = "the zero-copy view: reading the peer's bytes in place under the RDMA contract"
)]
fn checksum_in_place(mr: &MemoryRegion) -> u64 {
    // SAFETY: the receive completion of the peer's "done" Send, which the peer posted after its
    // Write, has been polled, so the Write is complete and visible; the peer writes nothing
    // more, no receive or Read names the region, and this thread does not write it while the
    // slice lives.
    let bytes = unsafe { mr.view().as_slice() };
    bytes.iter().fold(0u64, |acc, &b| acc.rotate_left(5) ^ u64::from(b))
}

fn main() -> Result<(), Box<dyn Error>> {
    // Two emulated RNICs, as on two hosts.
    let receiver_dev =
        Device::open(DeviceConfig { poll_mode: PollMode::Adaptive, ..DeviceConfig::default() });
    let sender_dev = Device::open(DeviceConfig { poll_mode: PollMode::Adaptive, ..DeviceConfig::default() });
    let (rpd, rcq) = (receiver_dev.alloc_pd(), receiver_dev.create_cq(16));
    let (spd, scq) = (sender_dev.alloc_pd(), sender_dev.create_cq(16));

    // The receiver's own vector becomes the region: the peer writes into it, in place.
    let inbox = rpd.register_buffer(vec![0u8; LEN], Access::REMOTE_WRITE)?;
    let done = rpd.register(16, Access::LOCAL_WRITE)?;

    let listener = receiver_dev.listen("127.0.0.1:0".parse()?)?;
    let addr = listener.local_addr()?;
    let accepting = {
        let (pd, cq) = (rpd.clone(), rcq.clone());
        std::thread::spawn(move || {
            listener.accept(TIMEOUT)?.accept(&pd, &cq, &cq, &ConnectOptions::default())
        })
    };
    let sender = sender_dev.connect(addr, &spd, &scq, &scq, &ConnectOptions::default())?.qp;
    let receiver = accepting.join().map_err(|_| "accept thread panicked")??;
    receiver.post_recv(RecvWr { wr_id: 1, sgl: done.sge_all().into() })?;

    // The sender: 4 MiB of data, RDMA Written to the receiver's rkey and address, then "done".
    let data: Vec<u8> = (0..LEN).map(|i| (i % 251).to_le_bytes()[0]).collect();
    let expected = data.iter().fold(0u64, |acc, &b| acc.rotate_left(5) ^ u64::from(b));
    let source = spd.register_buffer(data, Access::NONE)?;
    let note = spd.register_bytes(b"done", Access::NONE)?;
    let write = SendOp::Write { remote_stag: inbox.rkey(), remote_to: inbox.addr() };
    sender.post_send_list([
        SendWr { wr_id: 10, op: write, sgl: source.sge_all().into(), signaled: true },
        SendWr {
            wr_id: 11,
            op: SendOp::Send { solicited: false, invalidate: None },
            sgl: note.sge_all().into(),
            signaled: true,
        },
    ])?;
    completion(&scq, WcOpcode::Write)?;
    completion(&scq, WcOpcode::Send)?;

    // The receiver: the "done" receive completes after the Write; read the vector in place.
    completion(&rcq, WcOpcode::Recv)?;
    let sum = checksum_in_place(&inbox);
    println!("receiver: 4 MiB written in place, checksum {sum:#018x} (expected {expected:#018x})");
    if sum != expected {
        return Err("the bytes in place differ from what was written".into());
    }

    // Deregistration gives the vector back, bytes and all.
    let vector = inbox.deregister().map_err(|(_, e)| e)?.into_vec().ok_or("not a vector")?;
    println!("receiver: got its {} byte vector back, byte 1000 is {}", vector.len(), vector[1000]);
    sender.disconnect();
    Ok(())
}
