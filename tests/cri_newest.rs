//! The CRI as kubelet 1.37 speaks it, through crr-proxy: the streaming lists
//! of KEP-5825, long checkpoint calls, `KeyValue.value` as bytes, and fields
//! crr-proxy's editor does not know. The runtime is a scripted grpcio server
//! (tests/peers/cri_runtime.py) or a real containerd, which serves the
//! streaming lists from 2.4 on; the clients are grpcio, raw HTTP/2 frames and
//! crr-proxy's own.
#![allow(clippy::unwrap_used, clippy::expect_used)] // tests fail loudly by design

mod support;

use std::fmt::Debug;
use std::time::{Duration, Instant};

use crr_proxy::cri::v1::image_service_client::ImageServiceClient;
use crr_proxy::cri::v1::{
    CheckpointContainerRequest, ContainerConfig, ContainerMetadata, CreateContainerRequest,
    KeyValue, ListContainersRequest, StreamContainerStatsRequest, StreamContainersRequest,
    StreamContainersResponse, StreamImagesRequest, StreamImagesResponse,
    StreamPodSandboxMetricsRequest, StreamPodSandboxStatsRequest, StreamPodSandboxesRequest,
    StreamPodSandboxesResponse,
};
use crr_proxy::proxy::{Endpoint, Proxy, Routes};
use prost::Message;
use serde_json::Value;
use support::containerd::Containerd;
use support::peers::{CriRuntime, GrpcPeer, from_hex, h2_peer, to_hex};
use support::upstream::{self, FakeUpstream};
use support::{ProxyUnderTest, raw};

const RUNTIME: &str = "/runtime.v1.RuntimeService/";
const STREAM_IMAGES: &str = "/runtime.v1.ImageService/StreamImages";
const STREAM_CONTAINERS: &str = "/runtime.v1.RuntimeService/StreamContainers";
const STREAM_SANDBOXES: &str = "/runtime.v1.RuntimeService/StreamPodSandboxes";

/// KEP-5825's six streaming lists.
fn lists() -> Vec<String> {
    let mut paths: Vec<String> = [
        "StreamContainers",
        "StreamPodSandboxes",
        "StreamContainerStats",
        "StreamPodSandboxStats",
        "StreamPodSandboxMetrics",
    ]
    .iter()
    .map(|name| format!("{RUNTIME}{name}"))
    .collect();
    paths.push(STREAM_IMAGES.into());
    paths
}

/// What the runtime sent on the stream of `path` that ended last, as bytes.
fn sent_on(runtime: &CriRuntime, path: &str) -> Vec<Vec<u8>> {
    let call = runtime.ended(path);
    assert_eq!(call["code"], "OK", "{path}: {}", brief(&call));
    call["sent"]
        .as_array()
        .unwrap()
        .iter()
        .map(|m| from_hex(m.as_str().unwrap()))
        .collect()
}

fn brief(value: &Value) -> String {
    let text = value.to_string();
    text.chars().take(300).collect()
}

/// The two ways kubelet's calls reach a runtime: all on one route, or image
/// calls on a route of their own (served by the transcoder).
fn proxies(runtime: Endpoint) -> [(&'static str, ProxyUnderTest); 2] {
    [
        ("one route", ProxyUnderTest::to(runtime.clone())),
        (
            "an image route",
            ProxyUnderTest::start(Routes {
                runtime: runtime.clone(),
                image: Some(runtime),
            }),
        ),
    ]
}

/// Each list stream's first response reaches the client while the runtime
/// still holds the rest back (it waits for the client to say it has the
/// first), so a relay that buffered a stream to its end would deadlock here;
/// then all 40 responses arrive byte for byte, fields no CRI version defines
/// included.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_streaming_lists_reach_each_client_message_by_message() {
    let runtime = CriRuntime::start(&[]);
    for (route, proxy) in proxies(runtime.endpoint()) {
        let mut grpc = GrpcPeer::start_with(&proxy.socket, &["--authority", "localhost"]);
        for path in lists() {
            let (got, end) = tokio::task::block_in_place(|| {
                grpc.stream(&path, &[], 30, |i, _| {
                    if i == 0 {
                        runtime.release(&path);
                    }
                })
            });
            assert_eq!(end["code"], "OK", "grpcio, {route}, {path}: {end}");
            let sent = tokio::task::block_in_place(|| sent_on(&runtime, &path));
            assert_eq!(sent.len(), 40, "{path}");
            assert!(got == sent, "grpcio, {route}, {path}: the responses differ");

            let release = runtime.release_file(&path);
            let release = release.to_str().unwrap();
            let figures = h2_peer(
                "cri-call",
                &proxy.socket,
                &["--path", &path, "--release-file", release],
            )
            .await
            .unwrap_or_else(|e| panic!("raw HTTP/2, {route}, {path}: {e}"));
            let got: Vec<Vec<u8>> = figures["messages"]
                .as_array()
                .unwrap_or_else(|| panic!("{route}, {path}: {}", brief(&figures)))
                .iter()
                .map(|m| from_hex(m.as_str().unwrap()))
                .collect();
            let sent = tokio::task::block_in_place(|| sent_on(&runtime, &path));
            assert!(
                got == sent,
                "raw HTTP/2, {route}, {path}: the responses differ"
            );
        }

        let channel = crr_proxy::cri::channel(&proxy.endpoint());
        let mut client = proxy.client();
        let mut images = ImageServiceClient::new(channel);
        own_stream(
            &runtime,
            STREAM_CONTAINERS,
            client.stream_containers(StreamContainersRequest::default()),
        )
        .await;
        own_stream(
            &runtime,
            &format!("{RUNTIME}StreamPodSandboxes"),
            client.stream_pod_sandboxes(StreamPodSandboxesRequest::default()),
        )
        .await;
        own_stream(
            &runtime,
            &format!("{RUNTIME}StreamContainerStats"),
            client.stream_container_stats(StreamContainerStatsRequest::default()),
        )
        .await;
        own_stream(
            &runtime,
            &format!("{RUNTIME}StreamPodSandboxStats"),
            client.stream_pod_sandbox_stats(StreamPodSandboxStatsRequest::default()),
        )
        .await;
        own_stream(
            &runtime,
            &format!("{RUNTIME}StreamPodSandboxMetrics"),
            client.stream_pod_sandbox_metrics(StreamPodSandboxMetricsRequest::default()),
        )
        .await;
        own_stream(
            &runtime,
            STREAM_IMAGES,
            images.stream_images(StreamImagesRequest::default()),
        )
        .await;
    }
}

/// crr-proxy's own client on one list stream: the first response, the
/// release, the rest, compared with what the runtime sent (decoded alike).
async fn own_stream<T: Message + Default + PartialEq + Debug>(
    runtime: &CriRuntime,
    path: &str,
    call: impl Future<Output = Result<tonic::Response<tonic::Streaming<T>>, tonic::Status>>,
) {
    let mut stream = call
        .await
        .unwrap_or_else(|e| panic!("{path}: {e}"))
        .into_inner();
    let first = stream.message().await.unwrap().expect("a first response");
    runtime.release(path);
    let mut got = vec![first];
    while let Some(message) = stream.message().await.unwrap() {
        got.push(message);
    }
    let sent: Vec<T> = tokio::task::block_in_place(|| sent_on(runtime, path))
        .iter()
        .map(|m| T::decode(&m[..]).unwrap())
        .collect();
    assert_eq!(got.len(), 40, "{path}");
    assert!(got == sent, "own client, {path}: the responses differ");
}

/// A real containerd's answer to the streaming lists reaches each client as
/// it is, and the same connection goes on with the unary list. Before 2.4
/// containerd predates them and says UNIMPLEMENTED (kubelet then falls back
/// to the unary lists); from 2.4 on it serves them
/// ([`the_streaming_lists_of_containerd_2_4_list_through_crr_proxy_what_they_list_directly`]).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_real_containerds_answer_to_the_streaming_lists_reaches_each_client() {
    let ctrd = Containerd::start().unwrap();
    if support::containerd::serves_streaming_lists().unwrap() {
        return the_streaming_lists_of_containerd_2_4_list_through_crr_proxy_what_they_list_directly(&ctrd).await;
    }
    for (route, proxy) in proxies(ctrd.endpoint()) {
        let mut grpc = GrpcPeer::start_with(&proxy.socket, &["--authority", "localhost"]);
        for path in [STREAM_CONTAINERS, STREAM_IMAGES] {
            let (got, end) = tokio::task::block_in_place(|| grpc.stream(path, &[], 10, |_, _| {}));
            assert!(got.is_empty(), "{route}, {path}");
            assert_eq!(
                end["code"], "UNIMPLEMENTED",
                "grpcio, {route}, {path}: {end}"
            );
            let figures = h2_peer("cri-call", &proxy.socket, &["--path", path])
                .await
                .unwrap();
            assert_eq!(
                figures["status"], 12,
                "raw HTTP/2, {route}, {path}: {figures}"
            );
        }
        let listed = tokio::task::block_in_place(|| {
            grpc.call_with(&format!("{RUNTIME}ListContainers"), &[], 10)
        });
        assert_eq!(listed["code"], "OK", "grpcio, {route}: {listed}");

        let mut client = proxy.client();
        let refused = client
            .stream_containers(StreamContainersRequest::default())
            .await
            .map(|_| ())
            .unwrap_err();
        assert_eq!(
            refused.code(),
            tonic::Code::Unimplemented,
            "{route}: {refused:?}"
        );
        let mut images = ImageServiceClient::new(crr_proxy::cri::channel(&proxy.endpoint()));
        let refused = images
            .stream_images(StreamImagesRequest::default())
            .await
            .map(|_| ())
            .unwrap_err();
        assert_eq!(
            refused.code(),
            tonic::Code::Unimplemented,
            "{route}: {refused:?}"
        );
        client
            .list_containers(ListContainersRequest::default())
            .await
            .unwrap_or_else(|e| panic!("{route}: {e}"));
    }
}

/// Checkpoints run as long as the client allows: the runtime sees the
/// client's own `grpc-timeout` (600 s), and a call that takes 12 s, longer
/// than any of crr-proxy's timers, is answered. All three clients at once.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn long_calls_keep_the_clients_deadline_and_get_none_of_crr_proxys() {
    const HOLD: Duration = Duration::from_secs(12);
    let runtime = CriRuntime::start(&["--hold", &HOLD.as_secs().to_string()]);
    let proxy = ProxyUnderTest::to(runtime.endpoint());
    let pod = format!("{RUNTIME}CheckpointPod");
    let restore = format!("{RUNTIME}RestorePod");
    let container = format!("{RUNTIME}CheckpointContainer");
    let started = Instant::now();

    let socket = proxy.socket.clone();
    let grpc_path = pod.clone();
    let grpcio = std::thread::spawn(move || {
        let mut grpc = GrpcPeer::start_with(&socket, &["--authority", "localhost"]);
        grpc.call_with(&grpc_path, b"\x0a\x03pod", 600)
    });
    let raw_args = [
        "--path",
        &restore,
        "--request",
        "0a03706f64",
        "--header",
        "grpc-timeout=600S",
        "--answer-timeout",
        "30",
    ];
    let raw_call = h2_peer("cri-call", &proxy.socket, &raw_args);
    let mut client = proxy.client();
    let mut request = tonic::Request::new(CheckpointContainerRequest {
        container_id: "app".into(),
        location: "/var/lib/checkpoints/app.tar".into(),
        timeout: 600,
    });
    request.set_timeout(Duration::from_secs(600));
    let (raw_answer, own_answer) = tokio::join!(raw_call, client.checkpoint_container(request));

    let raw_answer = raw_answer.unwrap();
    assert_eq!(raw_answer["status"], 0, "raw HTTP/2: {raw_answer}");
    own_answer.unwrap();
    let grpc_answer = tokio::task::block_in_place(|| grpcio.join().unwrap());
    assert_eq!(grpc_answer["code"], "OK", "grpcio: {grpc_answer}");
    assert!(started.elapsed() >= HOLD);
    for path in [&pod, &restore, &container] {
        let call = tokio::task::block_in_place(|| runtime.ended(path));
        let left = call["deadline_left"].as_f64().unwrap_or(0.0);
        assert!(
            (590.0..=601.0).contains(&left),
            "{path}: the runtime saw {} s left",
            call["deadline_left"]
        );
    }
}

/// An environment variable's value is bytes, not text: a CreateContainer
/// whose value is no UTF-8 reaches the runtime byte for byte from each
/// client.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn environment_values_pass_as_bytes() {
    let runtime = CriRuntime::start(&[]);
    let proxy = ProxyUnderTest::to(runtime.endpoint());
    let create = format!("{RUNTIME}CreateContainer");
    let request = CreateContainerRequest {
        pod_sandbox_id: "sandbox".into(),
        config: Some(ContainerConfig {
            metadata: Some(ContainerMetadata {
                name: "app".into(),
                attempt: 0,
            }),
            envs: vec![
                KeyValue {
                    key: "RAW".into(),
                    value: vec![0xff, 0xfe, 0x00, b'x', 0xc3],
                },
                KeyValue {
                    key: "TEXT".into(),
                    value: "grün".into(),
                },
            ],
            ..Default::default()
        }),
        sandbox_config: None,
    };
    let bytes = request.encode_to_vec();

    let mut client = proxy.client();
    let answer = client.create_container(request).await.unwrap().into_inner();
    assert_eq!(answer.container_id, "created");
    let seen = tokio::task::block_in_place(|| runtime.ended(&create));
    assert_eq!(seen["request"], to_hex(&bytes), "own client");

    let mut grpc = GrpcPeer::start(&proxy.socket);
    let answer = tokio::task::block_in_place(|| grpc.call_with(&create, &bytes, 10));
    assert_eq!(answer["code"], "OK", "{answer}");
    let seen = tokio::task::block_in_place(|| runtime.ended(&create));
    assert_eq!(seen["request"], to_hex(&bytes), "grpcio");

    let figures = h2_peer(
        "cri-call",
        &proxy.socket,
        &["--path", &create, "--request", &to_hex(&bytes)],
    )
    .await
    .unwrap();
    assert_eq!(figures["status"], 0, "{figures}");
    let seen = tokio::task::block_in_place(|| runtime.ended(&create));
    assert_eq!(seen["request"], to_hex(&bytes), "raw HTTP/2");
}

/// The status of a container crr-proxy recreated is edited (reason and
/// message) and every other byte is the runtime's, `stop_signal` (field 19,
/// which crr-proxy's proto and editor do not declare) and fields no CRI
/// version defines included, for grpcio and raw HTTP/2 as for our own client
/// (tests/passthrough.rs).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_edited_status_keeps_the_fields_the_editor_does_not_know() {
    let upstream = FakeUpstream::start();
    let recreated = std::sync::Arc::new(crr_proxy::reason::Recreated::in_memory());
    recreated
        .record(upstream::STOPPED_ID, "shop/restart-app", None)
        .unwrap();
    let proxy = ProxyUnderTest::serve(
        Proxy::new(Routes {
            runtime: upstream.endpoint(),
            image: None,
        })
        .with_reasons(recreated),
    );
    let edited = upstream::container_status(&upstream::stopped_status(
        upstream::STOPPED_ID,
        Some((
            "ContainerRecreateRequest",
            "recreated by ContainerRecreateRequest shop/restart-app",
        )),
    ));

    // The fake upstream is hyper, which refuses C-core's percent-encoded
    // socket path as `:authority`.
    let mut grpc = GrpcPeer::start_with(&proxy.socket, &["--authority", "localhost"]);
    let answer =
        tokio::task::block_in_place(|| grpc.call_with(upstream::CONTAINER_STATUS, &[], 10));
    assert_eq!(answer["code"], "OK", "{answer}");
    assert_eq!(answer["response"], to_hex(&edited), "grpcio");

    let figures = h2_peer(
        "cri-call",
        &proxy.socket,
        &["--path", upstream::CONTAINER_STATUS],
    )
    .await
    .unwrap();
    assert_eq!(figures["messages"][0], to_hex(&edited), "raw HTTP/2");
    // The runtime itself sent the status unedited, stop_signal and all.
    let mut direct = raw::connect(&upstream.socket).await.unwrap();
    let sent = raw::send(
        &mut direct,
        raw::grpc_request(upstream::CONTAINER_STATUS, &[], vec![]),
    )
    .await
    .unwrap();
    let sent = raw::record(sent).await.unwrap();
    assert_eq!(
        sent.data,
        raw::grpc_frame(&upstream::container_status(&upstream::stopped_status(
            upstream::STOPPED_ID,
            None
        )))
    );
}

/// containerd 2.4 serves the streaming lists: with a sandbox and a
/// container running, each client (grpcio, raw HTTP/2 frames, crr-proxy's
/// own) gets through crr-proxy, on both routes, the sandboxes, containers
/// and images it gets from containerd directly. (containerd sends up to
/// 5 000 items a message, so here each stream is one message; message by
/// message relaying is shown on the scripted runtime above.)
async fn the_streaming_lists_of_containerd_2_4_list_through_crr_proxy_what_they_list_directly(
    ctrd: &Containerd,
) {
    let mut direct = support::client(&ctrd.endpoint());
    let (sandbox, pod) = support::pods::run_pod(&mut direct, "streamed", &ctrd.scratch("logs"))
        .await
        .unwrap();
    let container =
        support::pods::start_container(&mut direct, &sandbox, &pod, "app", &["sleep", "600"])
            .await
            .unwrap();
    let paths = [STREAM_CONTAINERS, STREAM_SANDBOXES, STREAM_IMAGES];
    let mut grpc = GrpcPeer::start_with(&ctrd.socket(), &["--authority", "localhost"]);
    let listed: Vec<Vec<String>> = paths
        .iter()
        .map(|path| {
            let (got, end) = tokio::task::block_in_place(|| grpc.stream(path, &[], 10, |_, _| {}));
            assert_eq!(end["code"], "OK", "directly, {path}: {end}");
            ids(path, &got)
        })
        .collect();
    assert_eq!(listed[0], vec![container], "{listed:?}");
    assert_eq!(listed[1], vec![sandbox], "{listed:?}");
    assert_eq!(listed[2].len(), 2, "busybox and pause: {listed:?}");

    for (route, proxy) in proxies(ctrd.endpoint()) {
        let mut grpc = GrpcPeer::start_with(&proxy.socket, &["--authority", "localhost"]);
        for (path, listed) in paths.iter().zip(&listed) {
            let (got, end) = tokio::task::block_in_place(|| grpc.stream(path, &[], 10, |_, _| {}));
            assert_eq!(end["code"], "OK", "grpcio, {route}, {path}: {end}");
            assert_eq!(&ids(path, &got), listed, "grpcio, {route}, {path}");
            let figures = h2_peer("cri-call", &proxy.socket, &["--path", path])
                .await
                .unwrap();
            let got: Vec<Vec<u8>> = figures["messages"]
                .as_array()
                .unwrap_or_else(|| panic!("{route}, {path}: {}", brief(&figures)))
                .iter()
                .map(|m| from_hex(m.as_str().unwrap()))
                .collect();
            assert_eq!(&ids(path, &got), listed, "raw HTTP/2, {route}, {path}");
        }
        let mut client = proxy.client();
        let mut own = Vec::new();
        let mut stream = client
            .stream_containers(StreamContainersRequest::default())
            .await
            .unwrap()
            .into_inner();
        while let Some(message) = stream.message().await.unwrap() {
            own.extend(message.containers.into_iter().map(|c| c.id));
        }
        assert_eq!(own, listed[0], "own client, {route}");
        client
            .list_containers(ListContainersRequest::default())
            .await
            .unwrap_or_else(|e| panic!("{route}: {e}"));
    }
}

/// The IDs a streaming list's responses name, sorted (containerd lists
/// from a map).
fn ids(path: &str, messages: &[Vec<u8>]) -> Vec<String> {
    let mut ids: Vec<String> = messages
        .iter()
        .flat_map(|message| -> Vec<String> {
            match path {
                STREAM_CONTAINERS => StreamContainersResponse::decode(&message[..])
                    .unwrap()
                    .containers
                    .into_iter()
                    .map(|c| c.id)
                    .collect(),
                STREAM_SANDBOXES => StreamPodSandboxesResponse::decode(&message[..])
                    .unwrap()
                    .pod_sandboxes
                    .into_iter()
                    .map(|p| p.id)
                    .collect(),
                _ => StreamImagesResponse::decode(&message[..])
                    .unwrap()
                    .images
                    .into_iter()
                    .map(|i| i.id)
                    .collect(),
            }
        })
        .collect();
    ids.sort();
    ids
}
