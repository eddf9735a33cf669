//! The passthrough against a deterministic in-test upstream: exact bytes,
//! headers, trailers, streaming, cancellation, routing and outages.
#![allow(clippy::unwrap_used, clippy::expect_used)] // tests fail loudly by design

mod support;

use std::time::{Duration, Instant};

use crr_proxy::cri::v1::VersionRequest;
use crr_proxy::proxy::Routes;
use http_body_util::BodyExt;
use support::ProxyUnderTest;
use support::raw::{self, Recorded};
use support::upstream::{self, FakeUpstream};

/// Metadata a caller may send, including binary and tracing headers.
const METADATA: &[(&str, &str)] = &[
    ("grpc-timeout", "5S"),
    (
        "traceparent",
        "00-0af7651916cd43dd8448eb211c80319c-b7ad6b7169203331-01",
    ),
    ("x-custom", "value with spaces"),
    ("x-custom-bin", "AAECAwQ"),
    ("user-agent", "grpc-go/1.72.0"),
];

async fn call(socket: &std::path::Path, path: &str, body: Vec<u8>) -> Recorded {
    let mut sender = raw::connect(socket).await.unwrap();
    let response = raw::send(&mut sender, raw::grpc_request(path, METADATA, body))
        .await
        .unwrap();
    raw::record(response).await.unwrap()
}

#[tokio::test]
async fn bytes_headers_and_trailers_pass_unchanged_both_ways() {
    support::init_logging();
    let upstream = FakeUpstream::start();
    let proxy = ProxyUnderTest::to(upstream.endpoint());
    // A request body that is not valid protobuf: the proxy must not care.
    let request_body = raw::grpc_frame(&[0xde, 0xad, 0xbe, 0xef, 0x00, 0x01]);

    let direct = call(&upstream.socket, upstream::FIXED, request_body.clone()).await;
    let proxied = call(&proxy.socket, upstream::FIXED, request_body.clone()).await;

    assert_eq!(direct.data, upstream::fixed_body());
    assert_eq!(direct.trailers.as_ref(), Some(&upstream::fixed_trailers()));
    assert_eq!(
        proxied, direct,
        "the response through the proxy differs from the direct one"
    );

    // What the upstream received: same method, authority, path, metadata and bytes.
    let seen = upstream.seen();
    assert_eq!(seen.len(), 2);
    assert_eq!(seen[0].body, request_body);
    assert_eq!(
        seen[1], seen[0],
        "the request through the proxy differs from the direct one"
    );
    for (name, value) in METADATA {
        assert_eq!(seen[1].headers.get(*name).unwrap(), value, "header {name}");
    }
    assert_eq!(seen[1].authority.as_deref(), Some("localhost"));
}

#[tokio::test]
async fn a_request_without_authority_passes_without_authority() {
    let upstream = FakeUpstream::start();
    let proxy = ProxyUnderTest::to(upstream.endpoint());
    for socket in [&upstream.socket, &proxy.socket] {
        let mut req = raw::grpc_request(upstream::FIXED, &[], vec![]);
        // A relative URI sent as HTTP/1-versioned makes h2 omit `:authority`.
        *req.uri_mut() = http::Uri::from_static(upstream::FIXED);
        *req.version_mut() = http::Version::HTTP_11;
        let mut sender = raw::connect(socket).await.unwrap();
        let recorded = raw::record(raw::send(&mut sender, req).await.unwrap())
            .await
            .unwrap();
        assert_eq!(recorded.data, upstream::fixed_body());
    }
    let seen = upstream.seen();
    assert_eq!(seen.len(), 2);
    assert_eq!(seen[0].authority, None);
    assert_eq!(seen[1], seen[0]);
}

#[tokio::test]
async fn server_streaming_arrives_message_by_message_with_trailers() {
    let upstream = FakeUpstream::start();
    let proxy = ProxyUnderTest::to(upstream.endpoint());
    let started = Instant::now();
    let response = raw::open(&proxy.socket, upstream::STREAM).await;
    let mut body = response.into_body();
    let mut messages = Vec::new();
    let mut trailers = None;
    while let Some(frame) = body.frame().await {
        let frame = frame.unwrap();
        match frame.into_data() {
            Ok(data) => messages.push((started.elapsed(), data.to_vec())),
            Err(frame) => trailers = frame.into_trailers().ok(),
        }
    }
    assert_eq!(
        messages.len(),
        upstream::TICKS,
        "one DATA frame per message: {messages:?}"
    );
    for (i, (at, data)) in messages.iter().enumerate() {
        assert_eq!(data, &upstream::tick(i));
        // Each message arrives when it is sent, not buffered until the end.
        let sent_at = upstream::TICK_GAP * i as u32;
        assert!(
            *at >= sent_at,
            "message {i} at {at:?} before it was sent ({sent_at:?})"
        );
        assert!(
            *at < sent_at + upstream::TICK_GAP,
            "message {i} arrived at {at:?}, held back past the next tick"
        );
    }
    let trailers = trailers.expect("trailers");
    assert_eq!(trailers.get("grpc-status").unwrap(), "0");
    assert_eq!(
        trailers.get("x-ticks").unwrap(),
        &upstream::TICKS.to_string()
    );
}

/// On shutdown the proxy stops accepting, and a call in flight (a stream
/// still ticking) runs to its trailers before the proxy is done.
#[tokio::test]
async fn shutdown_lets_the_calls_in_flight_finish() {
    let upstream = FakeUpstream::start();
    let proxy = ProxyUnderTest::to(upstream.endpoint());
    let socket = proxy.socket.clone();
    let mut body = raw::open(&proxy.socket, upstream::STREAM).await.into_body();
    let first = body.frame().await.unwrap().unwrap();
    assert_eq!(first.into_data().unwrap(), upstream::tick(0));

    let stopping = tokio::spawn(proxy.stop());
    let (mut ticks, mut trailers) = (1, None);
    while let Some(frame) = body.frame().await {
        match frame.unwrap().into_data() {
            Ok(data) => {
                assert_eq!(data, upstream::tick(ticks));
                ticks += 1;
                if ticks < upstream::TICKS {
                    assert!(!stopping.is_finished(), "stopped with a call in flight");
                }
            }
            Err(frame) => trailers = frame.into_trailers().ok(),
        }
    }
    assert_eq!(ticks, upstream::TICKS);
    assert_eq!(trailers.expect("trailers").get("grpc-status").unwrap(), "0");
    tokio::time::timeout(Duration::from_secs(5), stopping)
        .await
        .expect("the drain ends once the call has")
        .unwrap();
    assert!(tokio::net::UnixStream::connect(&socket).await.is_err());
}

/// A connection accepted just before shutdown whose client has not sent its
/// call yet still gets to make it: hyper's client fails an unsent call when
/// a GOAWAY comes first, so the drain waits for the connection's first
/// stream (bounded), and the connection then ends with that call.
#[tokio::test]
async fn a_connection_with_no_call_yet_makes_its_first_before_the_drain() {
    let upstream = FakeUpstream::start();
    let proxy = ProxyUnderTest::to(upstream.endpoint());
    let mut sender = raw::connect(&proxy.socket).await.unwrap();
    let stopping = tokio::spawn(proxy.stop());
    tokio::time::sleep(Duration::from_millis(100)).await;
    let response = raw::send(&mut sender, raw::grpc_request(upstream::FIXED, &[], vec![]))
        .await
        .expect("the call is taken, not refused by a GOAWAY");
    let recorded = raw::record(response).await.unwrap();
    assert_eq!(recorded.data, upstream::fixed_body());
    tokio::time::timeout(Duration::from_secs(5), stopping)
        .await
        .expect("the drain ends once the call has")
        .unwrap();
}

#[tokio::test]
async fn a_caller_that_cancels_cancels_the_upstream_call() {
    let upstream = FakeUpstream::start();
    let proxy = ProxyUnderTest::to(upstream.endpoint());
    let response = raw::open(&proxy.socket, upstream::STREAM).await;
    let mut body = response.into_body();
    let first = body.frame().await.unwrap().unwrap();
    assert_eq!(first.into_data().unwrap().to_vec(), upstream::tick(0));
    drop(body); // RST_STREAM(CANCEL) to the proxy

    let deadline = Instant::now() + upstream::TICK_GAP * 3;
    while upstream.cancelled() == 0 && Instant::now() < deadline {
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    assert_eq!(
        upstream.cancelled(),
        1,
        "the upstream stream was not cancelled"
    );
}

#[tokio::test]
async fn streams_on_one_connection_do_not_block_each_other() {
    let upstream = FakeUpstream::start();
    let proxy = ProxyUnderTest::to(upstream.endpoint());
    let sender = raw::connect(&proxy.socket).await.unwrap();

    // A long stream is open while 64 unary calls go over the same connection.
    let mut stream_sender = sender.clone();
    let stream = tokio::spawn(async move {
        let response = raw::send(
            &mut stream_sender,
            raw::grpc_request(upstream::STREAM, &[], vec![]),
        )
        .await
        .unwrap();
        raw::record(response).await.unwrap();
        Instant::now()
    });
    // The stream must be open at the runtime before the calls go, or the
    // test shows nothing.
    let deadline = Instant::now() + Duration::from_secs(5);
    while !upstream.seen().iter().any(|s| s.path == upstream::STREAM) {
        assert!(
            Instant::now() < deadline,
            "the stream never reached the runtime"
        );
        tokio::time::sleep(Duration::from_millis(5)).await;
    }
    let unary: Vec<_> = (0..64)
        .map(|_| {
            let mut sender = sender.clone();
            tokio::spawn(async move {
                let response =
                    raw::send(&mut sender, raw::grpc_request(upstream::FIXED, &[], vec![]))
                        .await
                        .unwrap();
                let recorded = raw::record(response).await.unwrap();
                (Instant::now(), recorded)
            })
        })
        .collect();
    let mut last_unary = None;
    for call in unary {
        let (done, recorded) = call.await.unwrap();
        assert_eq!(recorded.data, upstream::fixed_body());
        last_unary = Some(last_unary.map_or(done, |t: Instant| t.max(done)));
    }
    let stream_done = stream.await.unwrap();
    assert!(
        last_unary.unwrap() < stream_done,
        "unary calls waited for the open stream to finish"
    );
}

#[tokio::test]
async fn image_service_calls_go_to_the_image_endpoint() {
    let runtime = FakeUpstream::start();
    let image = FakeUpstream::start();
    let proxy = ProxyUnderTest::start(Routes {
        runtime: runtime.endpoint(),
        image: Some(image.endpoint()),
    });
    for path in [
        "/runtime.v1.ImageService/ListImages",
        "/runtime.v1.RuntimeService/Version",
        "/runtime.v1.ImageService/PullImage",
        "/some.other.Service/Call",
    ] {
        call(&proxy.socket, path, vec![]).await;
    }
    let paths = |u: &FakeUpstream| u.seen().into_iter().map(|s| s.path).collect::<Vec<_>>();
    assert_eq!(
        paths(&image),
        [
            "/runtime.v1.ImageService/ListImages",
            "/runtime.v1.ImageService/PullImage"
        ]
    );
    assert_eq!(
        paths(&runtime),
        [
            "/runtime.v1.RuntimeService/Version",
            "/some.other.Service/Call"
        ]
    );
}

#[tokio::test]
async fn runtime_down_is_unavailable_at_once_and_service_resumes() {
    let socket = support::temp_socket("absent-runtime");
    let endpoint = crr_proxy::proxy::Endpoint::from_path(&socket);
    let proxy = ProxyUnderTest::to(endpoint.clone());
    let mut client = proxy.client();

    for _ in 0..3 {
        let started = Instant::now();
        let status = client.version(VersionRequest::default()).await.unwrap_err();
        assert_eq!(status.code(), tonic::Code::Unavailable, "{status:?}");
        assert!(
            status.message().contains(&endpoint.to_string()),
            "message does not name the endpoint: {}",
            status.message()
        );
        // At once: not after connect retries or a dial timeout (grpc-go's
        // is 20 s). How fast is the benchmark's business.
        assert!(
            started.elapsed() < Duration::from_secs(5),
            "took {:?}",
            started.elapsed()
        );
    }

    // The runtime appears on that path: the same proxy serves it.
    let listener = tokio::net::UnixListener::bind(&socket).unwrap();
    drop(listener); // a dead socket file: connection refused, still UNAVAILABLE
    let status = client.version(VersionRequest::default()).await.unwrap_err();
    assert_eq!(status.code(), tonic::Code::Unavailable);
    std::fs::remove_file(&socket).unwrap();

    let upstream = FakeUpstream::start_at(socket.clone());
    let recorded = call(&proxy.socket, upstream::FIXED, vec![]).await;
    assert_eq!(recorded.data, upstream::fixed_body());
    assert_eq!(upstream.seen().len(), 1);

    // The client that connected while the runtime was away carries on: its
    // connection is handed over to a relayed one (GOAWAY), with at most
    // `HAND_OVER_LOSSES` calls unprocessed on the way (which tonic does not
    // retry by itself), and its calls reach the runtime (which does not
    // know Version).
    let mut refusals = 0;
    for _ in 0..6 {
        let status = client.version(VersionRequest::default()).await.unwrap_err();
        if support::refused(&status) {
            refusals += 1;
            continue;
        }
        assert_eq!(status.code(), tonic::Code::Unimplemented, "{status:?}");
    }
    assert!(
        refusals <= support::HAND_OVER_LOSSES,
        "{refusals} calls refused"
    );
    assert_eq!(upstream.seen().len(), 7 - refusals);
}

/// A proxy whose record says the fake upstream's stopped container was
/// recreated, and that container's status as the proxy should tell it.
fn proxy_with_a_recreated_container() -> (FakeUpstream, ProxyUnderTest, Vec<u8>) {
    use crr_proxy::proxy::{Proxy, Routes};
    use crr_proxy::reason::Recreated;
    let upstream = FakeUpstream::start();
    let recreated = std::sync::Arc::new(Recreated::in_memory());
    recreated
        .record(upstream::STOPPED_ID, "shop/restart-app", None)
        .unwrap();
    let routes = Routes {
        runtime: upstream.endpoint(),
        image: None,
    };
    let proxy = ProxyUnderTest::serve(Proxy::new(routes).with_reasons(recreated));
    let edited = upstream::stopped_status(
        upstream::STOPPED_ID,
        Some((
            "ContainerRecreateRequest",
            "recreated by ContainerRecreateRequest shop/restart-app",
        )),
    );
    (upstream, proxy, edited)
}

/// The statuses of a container crr-proxy stopped for a CRR carry the CRR as
/// reason and message; every other byte, fields unknown to crr-proxy's proto
/// included (cri-api's `stop_signal`, and numbers no version defines), is the
/// runtime's. Messages split across DATA frames anywhere.
#[tokio::test]
async fn recreated_containers_get_the_crr_reason_and_nothing_else_changes() {
    let (upstream, proxy, edited) = proxy_with_a_recreated_container();

    let direct = call(&upstream.socket, upstream::SANDBOX_STATUS, vec![]).await;
    let proxied = call(&proxy.socket, upstream::SANDBOX_STATUS, vec![]).await;
    let original = upstream::stopped_status(upstream::STOPPED_ID, None);
    assert_eq!(
        direct.data,
        raw::grpc_frame(&upstream::sandbox_status(&original))
    );
    assert_eq!(
        proxied.data,
        raw::grpc_frame(&upstream::sandbox_status(&edited))
    );
    assert_eq!(
        (proxied.headers, proxied.trailers),
        (direct.headers, direct.trailers)
    );

    let direct = call(&upstream.socket, upstream::CONTAINER_STATUS, vec![]).await;
    let proxied = call(&proxy.socket, upstream::CONTAINER_STATUS, vec![]).await;
    assert_eq!(
        direct.data,
        raw::grpc_frame(&upstream::container_status(&original))
    );
    assert_eq!(
        proxied.data,
        raw::grpc_frame(&upstream::container_status(&edited))
    );

    let direct = call(&upstream.socket, upstream::CONTAINER_EVENTS, vec![]).await;
    let proxied = call(&proxy.socket, upstream::CONTAINER_EVENTS, vec![]).await;
    let expect = |stopped: &[u8]| -> Vec<u8> {
        (0..upstream::EVENTS)
            .flat_map(|i| raw::grpc_frame(&upstream::container_event(i, stopped)))
            .collect()
    };
    assert_eq!(direct.data, expect(&original));
    assert_eq!(proxied.data, expect(&edited));
    assert_eq!(proxied.trailers, direct.trailers);

    // Other methods pass untouched, even with a record.
    let direct = call(&upstream.socket, upstream::FIXED, vec![]).await;
    let proxied = call(&proxy.socket, upstream::FIXED, vec![]).await;
    assert_eq!(proxied, direct);
}

/// An edit makes an answer longer than what the runtime sent, so the proxy
/// must keep within the client's flow-control windows itself (h2 fails any
/// stream or connection a peer overruns). Two clients get every answer whole
/// and edited: one that grants each stream 40 bytes at a time, and one whose
/// 64 KiB connection window two 16 MiB answers exhaust again and again while
/// edited answers go by on the same connection.
#[tokio::test]
async fn edited_answers_keep_within_a_tight_client_window() {
    let (_upstream, proxy, edited) = proxy_with_a_recreated_container();
    let events: Vec<u8> = (0..upstream::EVENTS)
        .flat_map(|i| raw::grpc_frame(&upstream::container_event(i, &edited)))
        .collect();
    let sandbox = raw::grpc_frame(&upstream::sandbox_status(&edited));

    let big = raw::grpc_frame(&vec![0x42; upstream::BLOB]);
    for (windows, calls) in [((Some(40), None), 40), ((None, Some(65_535)), 32)] {
        let edited_answers =
            mixed_calls(&proxy.socket, windows, calls, &events, &sandbox, &big).await;
        // Every call but each third one is one of the two edited methods.
        assert_eq!(edited_answers, calls - calls / 3);
    }
}

/// `calls` calls on one connection, cycling through the two edited methods
/// and FIXED (or, with a tight connection window, BIG for the first two);
/// checks every answer and returns how many were edited.
async fn mixed_calls(
    socket: &std::path::Path,
    (stream_window, connection_window): (Option<u32>, Option<u32>),
    calls: usize,
    events: &[u8],
    sandbox: &[u8],
    big: &[u8],
) -> usize {
    let sender = raw::connect_with_windows(socket, stream_window, connection_window)
        .await
        .unwrap();
    let calls: Vec<_> = (0..calls)
        .map(|i| {
            let mut sender = sender.clone();
            let path = match i % 3 {
                0 => upstream::CONTAINER_EVENTS,
                1 => upstream::SANDBOX_STATUS,
                _ if connection_window.is_some() && i < 6 => upstream::BIG,
                _ => upstream::FIXED,
            };
            tokio::spawn(async move {
                let response = raw::send(&mut sender, raw::grpc_request(path, &[], vec![]))
                    .await
                    .unwrap();
                (path, raw::record(response).await.unwrap())
            })
        })
        .collect();
    let fixed = upstream::fixed_body();
    let mut edited_answers = 0;
    for call in calls {
        let (path, recorded) = tokio::time::timeout(Duration::from_secs(30), call)
            .await
            .expect("answered in time")
            .unwrap();
        let expected: &[u8] = match path {
            upstream::CONTAINER_EVENTS => events,
            upstream::SANDBOX_STATUS => sandbox,
            upstream::BIG => big,
            _ => &fixed,
        };
        assert!(
            recorded.data == expected,
            "{path}: {} bytes differ",
            recorded.data.len()
        );
        assert!(recorded.trailers.is_some(), "{path} ended without trailers");
        edited_answers +=
            usize::from(path == upstream::CONTAINER_EVENTS || path == upstream::SANDBOX_STATUS);
    }
    edited_answers
}
