//! The proxy in front of a real, private containerd.
#![allow(clippy::unwrap_used, clippy::expect_used)] // tests fail loudly by design

mod support;

use std::sync::Arc;
use std::time::{Duration, Instant};

use crr_proxy::cri::RuntimeClient;
use crr_proxy::cri::v1::{
    ContainerEventType, ContainerState, ContainerStatusRequest, CreateContainerRequest,
    ExecSyncRequest, GetEventsRequest, ListContainersRequest, PodSandboxStatusRequest,
    RemoveContainerRequest, RemovePodSandboxRequest, StartContainerRequest, StopContainerRequest,
    StopPodSandboxRequest, VersionRequest,
};
use crr_proxy::proxy::{Proxy, Routes};
use crr_proxy::reason::Recreated;
use prost::Message;
use support::containerd::Containerd;
use support::{ProxyUnderTest, pods, raw};

async fn exec(
    client: &mut RuntimeClient,
    id: &str,
    cmd: &[&str],
) -> crr_proxy::cri::v1::ExecSyncResponse {
    client
        .exec_sync(ExecSyncRequest {
            container_id: id.to_owned(),
            cmd: cmd.iter().map(|s| (*s).to_owned()).collect(),
            timeout: 10,
        })
        .await
        .unwrap()
        .into_inner()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn full_pod_lifecycle_through_the_proxy() {
    support::init_logging();
    let ctrd = Containerd::start().unwrap();
    let proxy = ProxyUnderTest::to(ctrd.endpoint());
    let mut cri = proxy.client();

    let (pod_id, pod) = pods::run_pod(&mut cri, "lifecycle", &ctrd.scratch("logs"))
        .await
        .unwrap();
    let sandbox = cri
        .pod_sandbox_status(PodSandboxStatusRequest {
            pod_sandbox_id: pod_id.clone(),
            verbose: false,
        })
        .await
        .unwrap()
        .into_inner();
    assert_eq!(sandbox.status.unwrap().metadata.unwrap().name, "lifecycle");

    let id = pods::start_container(&mut cri, &pod_id, &pod, "app", &["sleep", "3600"])
        .await
        .unwrap();
    let out = exec(&mut cri, &id, &["sh", "-c", "echo hello $((6 * 7))"]).await;
    assert_eq!(out.exit_code, 0);
    assert_eq!(String::from_utf8_lossy(&out.stdout), "hello 42\n");

    let status = pods::container_status(&mut cri, &id).await;
    assert_eq!(status.state(), ContainerState::ContainerRunning);
    assert_eq!(
        status
            .labels
            .get("io.kubernetes.container.name")
            .map(String::as_str),
        Some("app")
    );

    cri.stop_container(StopContainerRequest {
        container_id: id.clone(),
        timeout: 1,
    })
    .await
    .unwrap();
    let status = pods::container_status(&mut cri, &id).await;
    assert_eq!(status.state(), ContainerState::ContainerExited);
    // Killed by SIGTERM (143) or, after the timeout, SIGKILL (137).
    assert!(
        [137, 143].contains(&status.exit_code),
        "exit code {}",
        status.exit_code
    );

    cri.remove_container(RemoveContainerRequest {
        container_id: id.clone(),
    })
    .await
    .unwrap();
    let gone = cri
        .container_status(ContainerStatusRequest {
            container_id: id,
            verbose: false,
        })
        .await
        .unwrap_err();
    assert_eq!(gone.code(), tonic::Code::NotFound);
    cri.stop_pod_sandbox(StopPodSandboxRequest {
        pod_sandbox_id: pod_id.clone(),
    })
    .await
    .unwrap();
    cri.remove_pod_sandbox(RemovePodSandboxRequest {
        pod_sandbox_id: pod_id,
    })
    .await
    .unwrap();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn answers_through_the_proxy_equal_direct_ones() {
    let ctrd = Containerd::start().unwrap();
    let proxy = ProxyUnderTest::to(ctrd.endpoint());
    let mut via = proxy.client();
    let mut direct = support::client(&ctrd.endpoint());

    let (pod_id, pod) = pods::run_pod(&mut direct, "same", &ctrd.scratch("logs"))
        .await
        .unwrap();
    let mut ids = Vec::new();
    for name in ["a", "b", "c"] {
        ids.push(
            pods::start_container(&mut direct, &pod_id, &pod, name, &["sleep", "3600"])
                .await
                .unwrap(),
        );
    }

    let version = direct
        .version(VersionRequest::default())
        .await
        .unwrap()
        .into_inner();
    assert_eq!(version.runtime_name, "containerd");
    assert_eq!(version.runtime_api_version, "v1");
    assert_eq!(
        via.version(VersionRequest::default())
            .await
            .unwrap()
            .into_inner(),
        version
    );

    let list = |mut c: RuntimeClient| async move {
        let mut containers = c
            .list_containers(ListContainersRequest::default())
            .await
            .unwrap()
            .into_inner()
            .containers;
        containers.sort_by(|a, b| a.id.cmp(&b.id));
        containers
    };
    let listed = list(direct.clone()).await;
    assert_eq!(listed.len(), 3);
    assert_eq!(list(via.clone()).await, listed);

    for id in &ids {
        assert_eq!(
            pods::container_status(&mut via, id).await,
            pods::container_status(&mut direct, id).await
        );
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn unknown_methods_and_services_get_containerds_own_answer() {
    let ctrd = Containerd::start().unwrap();
    let proxy = ProxyUnderTest::to(ctrd.endpoint());
    // (containerd 2.4 serves StreamContainers: OK, with no container.)
    let streams = if support::containerd::serves_streaming_lists().unwrap() {
        "0"
    } else {
        "12"
    };
    for (path, status) in [
        ("/runtime.v1.RuntimeService/NoSuchMethod", "12"),
        ("/runtime.v1.RuntimeService/StreamContainers", streams),
        ("/no.such.v1.Service/Call", "12"),
    ] {
        let mut answers = Vec::new();
        for socket in [ctrd.socket(), proxy.socket.clone()] {
            let mut sender = raw::connect(&socket).await.unwrap();
            let response = raw::send(
                &mut sender,
                raw::grpc_request(path, &[], raw::grpc_frame(b"")),
            )
            .await
            .unwrap();
            answers.push(raw::record(response).await.unwrap());
        }
        assert_eq!(
            raw::grpc_status(&answers[0]).as_deref(),
            Some(status),
            "{path}: {:?}",
            answers[0]
        );
        assert_eq!(answers[1], answers[0], "{path}");
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn large_responses_pass_and_caller_deadlines_propagate() {
    let ctrd = Containerd::start().unwrap();
    let proxy = ProxyUnderTest::to(ctrd.endpoint());
    let mut cri = proxy.client();
    let (pod_id, pod) = pods::run_pod(&mut cri, "big", &ctrd.scratch("logs"))
        .await
        .unwrap();
    let id = pods::start_container(&mut cri, &pod_id, &pod, "app", &["sleep", "3600"])
        .await
        .unwrap();

    const TWELVE_MIB: usize = 12 << 20;
    let out = exec(
        &mut cri,
        &id,
        &["head", "-c", &TWELVE_MIB.to_string(), "/dev/zero"],
    )
    .await;
    assert_eq!(out.exit_code, 0);
    assert_eq!(out.stdout.len(), TWELVE_MIB);

    // kubelet's deadline travels as grpc-timeout and containerd enforces it.
    // A raw client with no timer of its own shows that the proxy carries it:
    // the call ends at the deadline, as it does straight to containerd (1.6
    // answers UNKNOWN "deadline exceeded"; 2.x resets the stream).
    let request = ExecSyncRequest {
        container_id: id.clone(),
        cmd: vec!["sleep".into(), "5".into()],
        timeout: 0,
    };
    let direct = deadline_outcome(&ctrd.socket(), &request).await;
    let proxied = deadline_outcome(&proxy.socket, &request).await;
    assert_eq!(proxied.0, direct.0, "through the proxy vs direct");
    assert!(
        direct.0.contains("deadline exceeded: true") || direct.0.starts_with("reset"),
        "not ended by the deadline: {direct:?}"
    );
    for (what, took) in [("direct", direct.1), ("proxied", proxied.1)] {
        assert!(
            took >= Duration::from_millis(900),
            "{what}: ended before the deadline: {took:?}"
        );
        assert!(
            took < Duration::from_secs(2),
            "{what}: deadline not honoured: {took:?}"
        );
    }
}

/// How a 1 s `grpc-timeout` call of `request` to `socket` ends (its status
/// and message, or the reset of its stream), and when.
async fn deadline_outcome(
    socket: &std::path::Path,
    request: &ExecSyncRequest,
) -> (String, Duration) {
    let mut sender = raw::connect(socket).await.unwrap();
    let started = Instant::now();
    let sent = raw::send(
        &mut sender,
        raw::grpc_request(
            "/runtime.v1.RuntimeService/ExecSync",
            &[("grpc-timeout", "1S")],
            raw::grpc_frame(&request.encode_to_vec()),
        ),
    )
    .await;
    let answer = match sent {
        Ok(response) => raw::record(response).await,
        Err(error) => Err(error),
    };
    let outcome = match answer {
        Ok(answer) => {
            // The message names the exec, which differs per call.
            let message = answer
                .trailers
                .as_ref()
                .unwrap_or(&answer.headers)
                .get("grpc-message")
                .and_then(|m| m.to_str().ok())
                .unwrap_or("");
            let deadline = message.contains("deadline exceeded");
            format!(
                "status {:?}, deadline exceeded: {deadline}",
                raw::grpc_status(&answer)
            )
        }
        // The h2 error names the stream and the reason (both the same on a
        // fresh connection, direct or not).
        Err(error) => format!("reset: {:?}", error.root_cause()),
    };
    (outcome, started.elapsed())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn containerd_down_is_unavailable_then_the_same_proxy_recovers() {
    let mut ctrd = Containerd::start().unwrap();
    let proxy = ProxyUnderTest::to(ctrd.endpoint());
    let mut cri = proxy.client();
    cri.version(VersionRequest::default()).await.unwrap();

    ctrd.pause().unwrap();
    let started = Instant::now();
    // The relayed connection ends with containerd's; a call queued on it
    // then was never sent (as grpc-go, retried on a new connection).
    let (answer, _) = support::unprocessed_retried(|| {
        let mut cri = cri.clone();
        async move { cri.version(VersionRequest::default()).await }
    })
    .await;
    let status = answer.unwrap_err();
    assert_eq!(status.code(), tonic::Code::Unavailable, "{status:?}");
    assert!(
        status.message().contains(&ctrd.endpoint().to_string()),
        "{}",
        status.message()
    );
    // At once: not after connect retries or a dial timeout (grpc-go's is
    // 20 s). How fast is the benchmark's business.
    assert!(
        started.elapsed() < Duration::from_secs(5),
        "took {:?}",
        started.elapsed()
    );

    ctrd.resume().unwrap();
    // The connection made while containerd was away is handed over to a
    // relayed one; a call that meets the hand-over is refused, unprocessed.
    let (version, _) = support::unprocessed_retried(|| {
        let mut cri = cri.clone();
        async move { cri.version(VersionRequest::default()).await }
    })
    .await;
    assert_eq!(version.unwrap().into_inner().runtime_name, "containerd");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn containerd_restarted_under_load_fails_calls_only_with_unavailable() {
    let mut ctrd = Containerd::start().unwrap();
    let proxy = ProxyUnderTest::to(ctrd.endpoint());
    let deadline = Duration::from_secs(2);
    let load = tokio::spawn({
        let cri = proxy.client();
        async move {
            let mut outcomes = Vec::new();
            let until = Instant::now() + Duration::from_secs(4);
            while Instant::now() < until {
                let mut request = tonic::Request::new(VersionRequest::default());
                request.set_timeout(deadline);
                let started = Instant::now();
                let result = cri
                    .clone()
                    .version(request)
                    .await
                    .map(|_| ())
                    .map_err(|s| (s.code(), s.message().to_owned()));
                outcomes.push((started.elapsed(), result));
                tokio::time::sleep(Duration::from_millis(5)).await;
            }
            outcomes
        }
    });
    tokio::time::sleep(Duration::from_secs(1)).await;
    tokio::task::block_in_place(|| {
        ctrd.pause().unwrap();
        std::thread::sleep(Duration::from_millis(500));
        ctrd.resume().unwrap();
    });
    let outcomes = load.await.unwrap();
    let failed: Vec<_> = outcomes
        .iter()
        .filter_map(|(_, r)| r.as_ref().err())
        .collect();
    let ok = outcomes.len() - failed.len();
    let unavailable = failed
        .iter()
        .filter(|(c, _)| *c == tonic::Code::Unavailable)
        .count();
    eprintln!(
        "containerd restart under load: {ok} ok, {unavailable} UNAVAILABLE, others {:?}",
        failed
            .iter()
            .filter(|(c, _)| *c != tonic::Code::Unavailable)
            .collect::<Vec<_>>()
    );
    assert!(unavailable > 0, "the restart was not seen");
    // The proxy's own answers are always UNAVAILABLE; anything else must be
    // containerd's own answer (say, a call it was serving as it stopped),
    // passed through as it is.
    for (code, message) in &failed {
        let from_proxy = message.contains("is unavailable:");
        assert!(
            *code == tonic::Code::Unavailable || !from_proxy,
            "{code:?}: {message}"
        );
    }
    let slowest = outcomes.iter().map(|(t, _)| *t).max().unwrap();
    assert!(
        slowest < deadline,
        "a call outlived its deadline: {slowest:?}"
    );
    // Once containerd is back, every call succeeds again.
    let tail = &outcomes[outcomes.len() - 20..];
    assert!(tail.iter().all(|(_, r)| r.is_ok()), "{tail:?}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn calls_are_counted_by_method_and_code() {
    let mut ctrd = Containerd::start().unwrap();
    let proxy = ProxyUnderTest::to(ctrd.endpoint());
    let mut cri = proxy.client();
    for _ in 0..3 {
        cri.version(VersionRequest::default()).await.unwrap();
    }
    let missing = cri
        .container_status(ContainerStatusRequest {
            container_id: "no-such-container".into(),
            verbose: false,
        })
        .await
        .unwrap_err();
    assert_eq!(missing.code(), tonic::Code::NotFound);
    let mut sender = raw::connect(&proxy.socket).await.unwrap();
    let response = raw::send(
        &mut sender,
        raw::grpc_request("/no.such.v1.Service/Call", &[], raw::grpc_frame(b"")),
    )
    .await
    .unwrap();
    raw::record(response).await.unwrap();
    ctrd.pause().unwrap();
    cri.version(VersionRequest::default()).await.unwrap_err();

    let text = proxy.metrics.render();
    for line in [
        r#"crr_proxy_cri_requests_total{service="RuntimeService",method="Version",code="OK"} 3"#,
        r#"crr_proxy_cri_requests_total{service="RuntimeService",method="Version",code="UNAVAILABLE"} 1"#,
        r#"crr_proxy_cri_requests_total{service="RuntimeService",method="ContainerStatus",code="NOT_FOUND"} 1"#,
        r#"crr_proxy_cri_requests_total{service="other",method="other",code="UNIMPLEMENTED"} 1"#,
        r#"crr_proxy_cri_request_duration_seconds_count{service="RuntimeService",method="Version"} 4"#,
        "crr_proxy_cri_in_flight_requests 0",
    ] {
        assert!(text.lines().any(|l| l == line), "missing {line}:\n{text}");
    }
}

/// A call with 1.5 MiB of metadata (more than one header block's worth of
/// frames) reaches containerd, which answers it, and the connection carries
/// on: the relay decodes header blocks as they stream past and sets no
/// limit of its own below the runtime's.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn large_metadata_reaches_containerd_and_the_connection_carries_on() {
    let ctrd = Containerd::start().unwrap();
    let proxy = ProxyUnderTest::to(ctrd.endpoint());
    let mut sender = raw::connect(&proxy.socket).await.unwrap();
    // `~` has a 13-bit Huffman code, so the client sends it as it is.
    let big = "~".repeat(1_572_864);
    let version = "/runtime.v1.RuntimeService/Version";
    let answer = raw::send(
        &mut sender,
        raw::grpc_request(version, &[("x-big", &big)], raw::grpc_frame(&[])),
    )
    .await
    .unwrap();
    let answer = raw::record(answer).await.unwrap();
    assert!(
        raw::grpc_status(&answer).is_some(),
        "containerd's answer carries a status: {answer:?}"
    );
    let again = raw::send(
        &mut sender,
        raw::grpc_request(version, &[], raw::grpc_frame(&[])),
    )
    .await
    .unwrap();
    let again = raw::record(again).await.unwrap();
    assert_eq!(raw::grpc_status(&again).as_deref(), Some("0"));
    assert!(!again.data.is_empty());
}

/// GetContainerEvents through the proxy. containerd 2.x streams events: the
/// stopped event of a container crr-proxy recreated carries the CRR as its
/// reason, though the stream opened before anything was recorded (as
/// kubelet's does, at its start). containerd 1.6 does not implement the
/// call, and its own answer passes.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn container_events_carry_the_crr_reason_of_recreated_containers() {
    let ctrd = Containerd::start().unwrap();
    let recreated = Arc::new(Recreated::in_memory());
    let routes = Routes {
        runtime: ctrd.endpoint(),
        image: None,
    };
    let proxy = ProxyUnderTest::serve(Proxy::new(routes).with_reasons(Arc::clone(&recreated)));
    let mut cri = proxy.client();
    // grpc-go sends a stream's headers with its first message, so the call
    // returns only once there is an event.
    let mut watcher = proxy.client();
    let events = tokio::spawn(async move {
        watcher
            .get_container_events(GetEventsRequest::default())
            .await
    });
    if support::containerd::containerd_major().unwrap() < 2 {
        let status = events.await.unwrap().unwrap_err();
        assert_eq!(status.code(), tonic::Code::Unimplemented, "{status:?}");
        return;
    }
    // The stream is open at containerd before anything happens.
    tokio::time::sleep(Duration::from_millis(300)).await;
    let (pod_id, pod) = pods::run_pod(&mut cri, "events", &ctrd.scratch("logs"))
        .await
        .unwrap();
    let id = cri
        .create_container(CreateContainerRequest {
            pod_sandbox_id: pod_id,
            config: Some(pods::container_config(&pod, "done", 0, &["true"])),
            sandbox_config: Some(pod),
        })
        .await
        .unwrap()
        .into_inner()
        .container_id;
    recreated.record(&id, "shop/restart-app", None).unwrap();
    cri.start_container(StartContainerRequest {
        container_id: id.clone(),
    })
    .await
    .unwrap();
    let stopped = ContainerEventType::ContainerStoppedEvent as i32;
    let event = tokio::time::timeout(Duration::from_secs(20), async {
        let mut events = events.await.unwrap().unwrap().into_inner();
        loop {
            let event = events.message().await.unwrap().expect("the stream ended");
            if event.container_id == id && event.container_event_type == stopped {
                return event;
            }
        }
    })
    .await
    .expect("no stopped event for the container");
    let status = event
        .containers_statuses
        .iter()
        .find(|s| s.id == id)
        .unwrap_or_else(|| panic!("the event has no status of {id}: {event:?}"));
    assert_eq!(status.reason, "ContainerRecreateRequest", "{status:?}");
    assert_eq!(
        status.message,
        "recreated by ContainerRecreateRequest shop/restart-app"
    );
}
