//! RDMA Write, RDMA Read and Send between two queue pairs over loopback TCP, in one process.
//!
//! ```text
//! cargo run --example write_read_send
//! ```
//!
//! The "server" accepts on its own thread, as an rdma_cm passive side would; everything else
//! runs on the main thread. Both ends share one device here (one engine thread), but each could
//! just as well be a separate process on a separate host.

use std::error::Error;
use std::time::{Duration, Instant};

use iwarp::{
    Access, CompletionQueue, ConnectOptions, Device, DeviceConfig, PollMode, RecvWr, SendOp, SendWr,
    WcStatus, WorkCompletion,
};

/// The longest we wait for any one completion.
const TIMEOUT: Duration = Duration::from_secs(5);

/// Waits for the next completion and checks that it succeeded.
fn completion(cq: &CompletionQueue, what: &str) -> Result<WorkCompletion, Box<dyn Error>> {
    let wc = cq.wait(TIMEOUT).ok_or_else(|| format!("{what}: no completion within {TIMEOUT:?}"))?;
    if wc.status != WcStatus::Success {
        return Err(format!("{what}: {:?}", wc.status).into());
    }
    Ok(wc)
}

fn main() -> Result<(), Box<dyn Error>> {
    let start = Instant::now();

    // An emulated RNIC. The engine thread spins briefly after work, then parks until a
    // doorbell (PollMode::Busy never parks; PollMode::Inline has no thread at all).
    let device = Device::open(DeviceConfig { poll_mode: PollMode::Adaptive, ..DeviceConfig::default() });

    // Each side gets a protection domain and a completion queue (used for both its send and
    // receive queues).
    let (server_pd, server_cq) = (device.alloc_pd(), device.create_cq(16));
    let (client_pd, client_cq) = (device.alloc_pd(), device.create_cq(16));

    // The server's memory: a region the client may write into, and one it may read from.
    // Registration hands out an rkey (STag) and an address; a real application would send
    // these to its peer, say in the connection's private data.
    let inbox = server_pd.register(64, Access::REMOTE_WRITE)?;
    let outbox = server_pd.register_bytes(b"the server's data, read by RDMA Read", Access::REMOTE_READ)?;
    // And a buffer for an incoming Send (local write: the stack places the message there).
    let mailbox = server_pd.register(64, Access::LOCAL_WRITE)?;

    // Connection management, rdma_cm style: listen, connect, accept, with private data in the
    // MPA Request and Reply.
    let listener = device.listen("127.0.0.1:0".parse()?)?;
    let addr = listener.local_addr()?;
    let server = {
        let (pd, cq) = (server_pd.clone(), server_cq.clone());
        std::thread::spawn(move || {
            let request = listener.accept(TIMEOUT)?;
            println!(
                "server: connection request, private data {:?}",
                String::from_utf8_lossy(request.private_data())
            );
            let opts = ConnectOptions { private_data: b"welcome".to_vec(), ..ConnectOptions::default() };
            request.accept(&pd, &cq, &cq, &opts)
        })
    };
    let opts = ConnectOptions { private_data: b"hello".to_vec(), ..ConnectOptions::default() };
    let client = device.connect(addr, &client_pd, &client_cq, &client_cq, &opts)?;
    let server_qp = server.join().map_err(|_| "the accepting thread panicked")??;
    println!("client: connected, private data {:?}", String::from_utf8_lossy(&client.private_data));
    let client_qp = client.qp;

    // 1. RDMA Write: the client's bytes land in the server's inbox without the server doing
    //    anything. The completion means "handed to TCP", not "placed".
    let message = client_pd.register_bytes(b"written by the client", Access::NONE)?;
    client_qp.post_send(SendWr {
        wr_id: 1,
        op: SendOp::Write { remote_stag: inbox.rkey(), remote_to: inbox.addr() },
        sgl: message.sge_all().into(),
        signaled: true,
    })?;
    completion(&client_cq, "Write")?;

    // 2. Send: the server posts a receive buffer first; the message goes to it. Sends are
    //    placed in order after the Write, so once the server sees this receive complete, the
    //    Write's bytes are in its inbox too.
    server_qp.post_recv(RecvWr { wr_id: 10, sgl: mailbox.sge_all().into() })?;
    let note = client_pd.register_bytes(b"look in your inbox", Access::NONE)?;
    client_qp.post_send(SendWr {
        wr_id: 2,
        op: SendOp::Send { solicited: true, invalidate: None },
        sgl: note.sge_all().into(),
        signaled: true,
    })?;
    completion(&client_cq, "Send")?;
    let received = completion(&server_cq, "Recv")?;
    let len = usize::try_from(received.byte_len)?;
    let mut text = vec![0; len];
    mailbox.read(0, &mut text)?;
    println!("server: received a Send of {len} bytes: {:?}", String::from_utf8_lossy(&text));
    let mut written = vec![0; message.len()];
    inbox.read(0, &mut written)?;
    println!("server: inbox holds {:?}", String::from_utf8_lossy(&written));
    assert_eq!(written, message.to_vec());

    // 3. RDMA Read: the client pulls the server's outbox into its own region (which must allow
    //    local writes). Its completion does mean the data is there.
    let sink = client_pd.register(outbox.len(), Access::LOCAL_WRITE)?;
    client_qp.post_send(SendWr {
        wr_id: 3,
        op: SendOp::Read { remote_stag: outbox.rkey(), remote_to: outbox.addr() },
        sgl: sink.sge_all().into(),
        signaled: true,
    })?;
    let wc = completion(&client_cq, "Read")?;
    println!("client: read {} bytes: {:?}", wc.byte_len, String::from_utf8_lossy(&sink.to_vec()));
    assert_eq!(sink.to_vec(), outbox.to_vec());

    // Tear down: the peer sees the connection go (QpEvent::LlpLost) and its queue pair goes to
    // the error state.
    client_qp.disconnect();
    let event = server_qp.wait_event(TIMEOUT);
    println!("server: {event:?}, queue pair {:?}", server_qp.state());
    println!("done in {:?}", start.elapsed());
    Ok(())
}
