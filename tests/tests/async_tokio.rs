//! The API under tokio: connect and accept as futures, completions awaited one at a time or
//! as a stream, and an inline device whose pending wait costs no polling (no self-wake).

#![allow(clippy::unwrap_used, clippy::expect_used, reason = "test code panics on failure")]

use std::future::Future;
use std::pin::Pin;
use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::task::{Context, Poll};
use std::time::Duration;

use futures_core::Stream;
use iwarp::{
    Access, CompletionQueue, ConnectOptions, Device, DeviceConfig, MemoryRegion, PollMode, ProtectionDomain,
    QueuePair, RecvWr, SendOp, SendWr, WcOpcode, WcStatus,
};

const T: Duration = Duration::from_secs(10);

/// One end: its protection domain, completion queue and queue pair.
struct End {
    pd: ProtectionDomain,
    cq: CompletionQueue,
    qp: QueuePair,
}

impl End {
    fn region(&self) -> MemoryRegion {
        self.pd.register(64, Access::LOCAL_WRITE).unwrap()
    }

    fn send(&self, mr: &MemoryRegion, wr_id: u64, len: u32) {
        let op = SendOp::Send { solicited: false, invalidate: None };
        self.qp.post_send(SendWr { wr_id, op, sgl: mr.sge(0, len).into(), signaled: true }).unwrap();
    }
}

/// Connects two devices with futures only.
async fn connect(client: &Device, server: &Device) -> (End, End) {
    let listener = server.listen("127.0.0.1:0".parse().unwrap()).unwrap();
    let addr = listener.local_addr().unwrap();
    let (spd, scq) = (server.alloc_pd(), server.create_cq(64));
    let (cpd, ccq) = (client.alloc_pd(), client.create_cq(64));
    let opts = ConnectOptions::default();
    let accepting = async {
        let req = listener.accept_async(T).await.unwrap();
        req.accept_async(&spd, &scq, &scq, &opts).await.unwrap()
    };
    let connecting = client.connect_async(addr, &cpd, &ccq, &ccq, &opts);
    let (server_qp, connected) = tokio::join!(accepting, connecting);
    (End { pd: cpd, cq: ccq, qp: connected.unwrap().qp }, End { pd: spd, cq: scq, qp: server_qp })
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn connect_accept_and_completions_as_futures() {
    let (client_dev, server_dev) =
        (Device::open(DeviceConfig::default()), Device::open(DeviceConfig::default()));
    let (client, server) = connect(&client_dev, &server_dev).await;
    let inbox = server.region();
    server.qp.post_recv(RecvWr { wr_id: 7, sgl: inbox.sge(0, 64).into() }).unwrap();
    let msg = client.region();
    msg.write(0, b"over tokio").unwrap();
    client.send(&msg, 1, 10);
    let sent = tokio::time::timeout(T, client.cq.next()).await.unwrap();
    assert_eq!((sent.wr_id, sent.status), (1, WcStatus::Success));
    let got = tokio::time::timeout(T, server.cq.next()).await.unwrap();
    assert_eq!((got.wr_id, got.opcode, got.byte_len), (7, WcOpcode::Recv, 10));
    let mut back = [0u8; 10];
    inbox.read(0, &mut back).unwrap();
    assert_eq!(&back, b"over tokio");
}

/// The next item of a stream (what `StreamExt::next` does).
async fn next_of<S: Stream + Unpin>(s: &mut S) -> Option<S::Item> {
    std::future::poll_fn(|cx| Pin::new(&mut *s).poll_next(cx)).await
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn completions_as_a_stream_in_a_spawned_task() {
    let (client_dev, server_dev) =
        (Device::open(DeviceConfig::default()), Device::open(DeviceConfig::default()));
    let (client, server) = connect(&client_dev, &server_dev).await;
    let inbox = server.region();
    for i in 0..8 {
        server.qp.post_recv(RecvWr { wr_id: i, sgl: inbox.sge(0, 64).into() }).unwrap();
    }
    let mut stream = server.cq.stream();
    let receiver = tokio::spawn(async move {
        let mut ids = Vec::new();
        while ids.len() < 8 {
            let wc = next_of(&mut stream).await.unwrap();
            assert_eq!((wc.opcode, wc.status), (WcOpcode::Recv, WcStatus::Success));
            ids.push(wc.wr_id);
        }
        ids
    });
    let msg = client.region();
    for i in 0..8 {
        client.send(&msg, 100 + i, 8);
    }
    let ids = tokio::time::timeout(T, receiver).await.unwrap().unwrap();
    assert_eq!(ids, (0..8).collect::<Vec<_>>());
}

/// Counts how often the wrapped future is polled.
struct Counted<F> {
    inner: Pin<Box<F>>,
    polls: Arc<AtomicUsize>,
}

impl<F: Future> Future for Counted<F> {
    type Output = F::Output;

    fn poll(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<F::Output> {
        self.polls.fetch_add(1, Ordering::Relaxed);
        self.inner.as_mut().poll(cx)
    }
}

/// An inline device has no engine thread; a task waiting on it is woken by the input, not by
/// polling itself over and over while nothing happens.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn inline_device_waits_without_spinning() {
    let server_dev = Device::open(DeviceConfig { poll_mode: PollMode::Inline, ..DeviceConfig::default() });
    let client_dev = Device::open(DeviceConfig::default());
    let (client, server) = connect(&client_dev, &server_dev).await;
    let inbox = server.region();
    server.qp.post_recv(RecvWr { wr_id: 1, sgl: inbox.sge(0, 64).into() }).unwrap();
    let polls = Arc::new(AtomicUsize::new(0));
    let cq = server.cq.clone();
    let waiting =
        tokio::spawn(Counted { inner: Box::pin(async move { cq.next().await }), polls: polls.clone() });
    // Nothing arrives for a while: the task stays asleep.
    tokio::time::sleep(Duration::from_millis(200)).await;
    let idle_polls = polls.load(Ordering::Relaxed);
    assert!(idle_polls <= 2, "the pending wait was polled {idle_polls} times with nothing to do");
    let msg = client.region();
    client.send(&msg, 9, 8);
    let wc = tokio::time::timeout(T, waiting).await.unwrap().unwrap();
    assert_eq!((wc.wr_id, wc.opcode), (1, WcOpcode::Recv));
}
