//! Hostile clients on the listening socket: only their own connection or
//! stream suffers, memory stays bounded, and everyone else carries on.
#![allow(clippy::unwrap_used, clippy::expect_used)] // tests fail loudly by design

mod support;

use std::process::{Child, Command, Stdio};
use std::time::Duration;

use http_body_util::BodyExt;
use support::raw;
use support::upstream::{self, FakeUpstream};
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::UnixStream;

struct Proxy {
    child: Child,
    socket: std::path::PathBuf,
}

impl Proxy {
    fn start(upstream: &FakeUpstream) -> Self {
        let socket = support::temp_socket("hostile");
        let child = Command::new(env!("CARGO_BIN_EXE_crr-proxy"))
            .args(["run", "--listen", socket.to_str().unwrap()])
            .args(["--runtime-endpoint", &upstream.endpoint().to_string()])
            .env("CRR_PROXY_LOG", "warn")
            .stdin(Stdio::null())
            .spawn()
            .unwrap();
        support::wait_for_path(&socket);
        Self { child, socket }
    }

    fn rss_mib(&self) -> f64 {
        let status = std::fs::read_to_string(format!("/proc/{}/status", self.child.id())).unwrap();
        let kib: f64 = status
            .lines()
            .find_map(|l| l.strip_prefix("VmRSS:"))
            .and_then(|v| v.trim().trim_end_matches("kB").trim().parse().ok())
            .unwrap();
        kib / 1024.0
    }

    /// A normal client still gets its answer.
    async fn serves(&self) {
        let mut sender = raw::connect(&self.socket).await.unwrap();
        let response = tokio::time::timeout(
            Duration::from_secs(5),
            raw::send(&mut sender, raw::grpc_request(upstream::FIXED, &[], vec![])),
        )
        .await
        .expect("answered in time")
        .unwrap();
        assert_eq!(
            raw::record(response).await.unwrap().data,
            upstream::fixed_body()
        );
    }

    fn alive(&mut self) -> bool {
        self.child.try_wait().unwrap().is_none()
    }
}

impl Drop for Proxy {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
        support::remove_socket_dir(&self.socket);
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn garbage_truncated_frames_and_http1_only_end_their_own_connection() {
    let upstream = FakeUpstream::start();
    let mut proxy = Proxy::start(&upstream);
    let preface = b"PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n";
    let attempts: [&[u8]; 4] = [
        b"\x00\xff\x13garbage that is not HTTP/2 at all\x7f\x80",
        b"GET / HTTP/1.1\r\nHost: x\r\n\r\n",
        // A valid preface, then a frame header that promises more than comes.
        &[
            &preface[..],
            &[0x00, 0x10, 0x00, 0x04, 0x00, 0x00, 0x00, 0x00, 0x00, 0x01][..],
        ]
        .concat(),
        // A HEADERS frame on stream 1 whose HPACK block is nonsense.
        &[
            &preface[..],
            &[0, 0, 0, 4, 0, 0, 0, 0, 0][..],
            &[0, 0, 4, 1, 5, 0, 0, 0, 1, 0xff, 0xff, 0xff, 0xff][..],
        ]
        .concat(),
    ];
    for bytes in attempts {
        let mut stream = UnixStream::connect(&proxy.socket).await.unwrap();
        stream.write_all(bytes).await.unwrap();
        let _ = stream.shutdown().await;
        let mut sink = Vec::new();
        // The proxy ends the connection (GOAWAY and close, or just close).
        let _ = tokio::time::timeout(Duration::from_secs(5), stream.read_to_end(&mut sink))
            .await
            .expect("the proxy closed the bad connection");
        assert!(proxy.alive(), "crr-proxy died on {bytes:?}");
        proxy.serves().await;
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_64_mib_message_passes_with_bounded_memory() {
    let upstream = FakeUpstream::start();
    let proxy = Proxy::start(&upstream);
    let body = raw::grpc_frame(&vec![0x5a; 64 << 20]);
    let mut sender = raw::connect(&proxy.socket).await.unwrap();
    let response = raw::send(
        &mut sender,
        raw::grpc_request(upstream::FIXED, &[], body.clone()),
    )
    .await
    .unwrap();
    assert_eq!(
        raw::record(response).await.unwrap().data,
        upstream::fixed_body()
    );
    // The upstream got every byte; the proxy held only flow-control windows.
    assert_eq!(upstream.seen()[0].body.len(), body.len());
    let rss = proxy.rss_mib();
    eprintln!("crr-proxy RSS after a 64 MiB message: {rss:.1} MiB");
    assert!(
        rss < 32.0,
        "crr-proxy RSS {rss:.1} MiB after a 64 MiB message"
    );
    proxy.serves().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_client_that_never_reads_and_thousands_of_streams_hurt_no_one_else() {
    let upstream = FakeUpstream::start();
    let proxy = Proxy::start(&upstream);

    // Twenty 16 MiB answers asked for and never read (320 MiB): the relay
    // buffers a few hundred KiB; the runtime's flow control holds the rest.
    let mut stuck = raw::connect(&proxy.socket).await.unwrap();
    let mut unread = Vec::new();
    for _ in 0..20 {
        let response = raw::send(&mut stuck, raw::grpc_request(upstream::BIG, &[], vec![]))
            .await
            .unwrap();
        unread.push(response);
    }
    tokio::time::sleep(Duration::from_millis(500)).await;
    let rss = proxy.rss_mib();
    eprintln!("crr-proxy RSS with 320 MiB of unread answers pending: {rss:.1} MiB");
    assert!(rss < 32.0, "crr-proxy RSS {rss:.1} MiB with unread answers");
    // 10 000 concurrent streams on one connection: the runtime's stream
    // limit reaches the client, which queues the rest. Nobody else notices.
    let crowd = raw::connect(&proxy.socket).await.unwrap();
    let crowd_calls: Vec<_> = (0..10_000)
        .map(|_| {
            let mut sender = crowd.clone();
            tokio::spawn(async move {
                let response =
                    raw::send(&mut sender, raw::grpc_request(upstream::FIXED, &[], vec![])).await;
                match response {
                    Ok(response) => response.into_body().collect().await.is_ok(),
                    Err(_) => false,
                }
            })
        })
        .collect();
    proxy.serves().await;
    let mut answered = 0;
    for call in crowd_calls {
        answered += usize::from(call.await.unwrap());
    }
    assert_eq!(answered, 10_000, "calls of the crowd were lost");
    proxy.serves().await;
    let rss = proxy.rss_mib();
    eprintln!("crr-proxy RSS after 10 000 concurrent streams: {rss:.1} MiB");
    assert!(rss < 32.0, "crr-proxy RSS {rss:.1} MiB");
    drop(unread);
    drop(stuck);
    proxy.serves().await;
}
