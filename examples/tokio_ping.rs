//! Async use of the API under tokio: a server task accepts and answers every message it
//! receives with a Send of its own; the client connects, sends five pings and awaits each
//! pong. `cargo run --example tokio_ping`.

use std::error::Error;
use std::time::Duration;

use iwarp::{Access, ConnectOptions, Device, DeviceConfig, RecvWr, SendOp, SendWr, WcOpcode};

const TIMEOUT: Duration = Duration::from_secs(5);
const PINGS: u64 = 5;

fn send(op_id: u64, mr: &iwarp::MemoryRegion, len: u32) -> SendWr {
    SendWr {
        wr_id: op_id,
        op: SendOp::Send { solicited: false, invalidate: None },
        sgl: mr.sge(0, len).into(),
        signaled: true,
    }
}

#[tokio::main]
async fn main() -> Result<(), Box<dyn Error>> {
    // Two devices, as two hosts would have.
    let server_dev = Device::open(DeviceConfig::default());
    let client_dev = Device::open(DeviceConfig::default());
    let listener = server_dev.listen("127.0.0.1:0".parse()?)?;
    let addr = listener.local_addr()?;

    // The server: accept, then answer each message with one of the same length.
    let (spd, scq) = (server_dev.alloc_pd(), server_dev.create_cq(64));
    let server = tokio::spawn(async move {
        let req = listener.accept_async(TIMEOUT).await?;
        let inbox = spd.register(64, Access::LOCAL_WRITE)?;
        let opts = ConnectOptions {
            recv: (0..PINGS).map(|i| RecvWr { wr_id: i, sgl: inbox.sge(0, 64).into() }).collect(),
            ..ConnectOptions::default()
        };
        let qp = req.accept_async(&spd, &scq, &scq, &opts).await?;
        let mut answered = 0;
        while answered < PINGS {
            let wc = scq.next().await;
            if wc.opcode == WcOpcode::Recv {
                qp.post_send(send(100 + wc.wr_id, &inbox, u32::try_from(wc.byte_len)?))?;
                answered += 1;
            }
        }
        Ok::<_, Box<dyn Error + Send + Sync>>(())
    });

    // The client: connect, then ping and await the pong, five times.
    let (pd, cq) = (client_dev.alloc_pd(), client_dev.create_cq(64));
    let buf = pd.register(64, Access::LOCAL_WRITE)?;
    let opts = ConnectOptions {
        recv: (0..PINGS).map(|i| RecvWr { wr_id: i, sgl: buf.sge(0, 64).into() }).collect(),
        ..ConnectOptions::default()
    };
    let qp = client_dev.connect_async(addr, &pd, &cq, &cq, &opts).await?.qp;
    for i in 0..PINGS {
        buf.write(0, format!("ping {i}").as_bytes())?;
        qp.post_send(send(1000 + i, &buf, 6))?;
        loop {
            let wc = tokio::time::timeout(TIMEOUT, cq.next()).await?;
            if wc.opcode == WcOpcode::Recv {
                println!("pong {i}: {} bytes", wc.byte_len);
                break;
            }
        }
    }
    server.await?.map_err(|e| e.to_string())?;
    Ok(())
}
