//! The kill engine on a real containerd: preStop hooks, grace periods and
//! StopContainer, as kubelet would do them.
#![allow(clippy::unwrap_used, clippy::expect_used)] // tests fail loudly by design

mod support;

use std::path::Path;
use std::time::{Duration, Instant};

use crr_proxy::cri::RuntimeClient;
use crr_proxy::cri::v1::{ContainerConfig, ContainerState, RemoveContainerRequest};
use crr_proxy::kill::{self, GraceSource, HookKind, HookResult, KillRequest, Killer, StateAfter};
use k8s_openapi::api::core::v1::LifecycleHandler;
use support::containerd::Containerd;
use support::pods;

/// A shell that exits 0 on SIGTERM: the graceful application.
const GRACEFUL: &[&str] = &[
    "sh",
    "-c",
    "trap 'exit 0' TERM; while :; do sleep 0.1; done",
];

struct Fixture {
    ctrd: Containerd,
    cri: RuntimeClient,
    killer: Killer,
}

impl Fixture {
    async fn new() -> Self {
        support::init_logging();
        let ctrd = tokio::task::spawn_blocking(Containerd::start)
            .await
            .unwrap()
            .unwrap();
        let cri = support::client(&ctrd.endpoint());
        let killer = Killer::new(cri.clone(), None);
        Self { ctrd, cri, killer }
    }

    /// A pod with one container named `app`, made from `config` (see [`Self::config`]).
    async fn run(&mut self, pod: &str, edit: impl FnOnce(&mut ContainerConfig, &Path)) -> String {
        let (pod_id, sandbox) = pods::run_pod(&mut self.cri, pod, &self.ctrd.scratch("logs"))
            .await
            .unwrap();
        let shared = self.ctrd.scratch(pod);
        let mut config = pods::container_config(&sandbox, "app", 0, GRACEFUL);
        pods::mount(&mut config, &shared, "/shared");
        edit(&mut config, &shared);
        pods::start(&mut self.cri, &pod_id, &sandbox, config)
            .await
            .unwrap()
    }

    async fn state(&mut self, id: &str) -> ContainerState {
        pods::container_status(&mut self.cri, id).await.state()
    }
}

fn handler(json: &str) -> LifecycleHandler {
    serde_json::from_str(json).unwrap()
}

fn request(grace: i64, pre_stop: Option<&str>) -> KillRequest {
    KillRequest {
        grace_period: Some(grace),
        pre_stop: pre_stop.map(handler),
        ..Default::default()
    }
}

fn read(path: &Path) -> String {
    std::fs::read_to_string(path).unwrap_or_default()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn exec_pre_stop_runs_inside_the_container_before_it_stops() {
    let mut f = Fixture::new().await;
    let id = f.run("exec", |_, _| {}).await;
    let hook = r#"{"exec":{"command":["sh","-c","cat /proc/1/cmdline > /shared/hook; sleep 1"]}}"#;

    let outcome = f.killer.kill(&id, request(10, Some(hook))).await.unwrap();

    // The hook saw the container's own process: it ran inside, before the stop.
    let shared = f.ctrd.scratch("exec");
    assert!(
        read(&shared.join("hook")).contains("trap"),
        "hook marker: {:?}",
        read(&shared.join("hook"))
    );
    let report = outcome.hook.clone().unwrap();
    assert_eq!(report.kind, HookKind::Exec);
    assert_eq!(report.result, HookResult::Succeeded);
    assert_eq!(report.seconds, 1);
    assert_eq!(outcome.grace_period, 10);
    assert_eq!(outcome.grace_source, GraceSource::Request);
    assert_eq!(outcome.stop_timeout, Some(9));
    assert_eq!(outcome.message, "Stopping container app");
    // The shell traps SIGTERM and exits 0: containerd calls that Completed.
    match &outcome.after {
        StateAfter::Exited {
            exit_code,
            reason,
            finished_at,
        } => {
            assert_eq!((*exit_code, reason.as_str()), (0, "Completed"));
            assert!(*finished_at > 0);
        }
        other => panic!("not exited: {other:?}"),
    }
    assert_eq!(f.state(&id).await, ContainerState::ContainerExited);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_pre_stop_longer_than_the_grace_is_cut_at_the_grace() {
    let mut f = Fixture::new().await;
    let id = f.run("long", |_, _| {}).await;
    let started = Instant::now();
    let outcome = f
        .killer
        .kill(
            &id,
            request(3, Some(r#"{"exec":{"command":["sleep","8"]}}"#)),
        )
        .await
        .unwrap();
    let took = started.elapsed();
    assert!(
        took < Duration::from_secs(8),
        "the hook was not cut: {took:?}"
    );
    assert!(
        took >= Duration::from_secs(3),
        "the grace was not given: {took:?}"
    );
    let report = outcome.hook.unwrap();
    assert_eq!(report.result, HookResult::TimedOut);
    assert_eq!(report.seconds, 3);
    assert_eq!(outcome.stop_timeout, Some(kill::MIN_STOP_TIMEOUT));
    assert!(
        matches!(outcome.after, StateAfter::Exited { .. }),
        "{:?}",
        outcome.after
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn grace_zero_skips_the_hook_and_stops_with_two_seconds() {
    let mut f = Fixture::new().await;
    let id = f.run("zero", |_, _| {}).await;
    let hook = r#"{"exec":{"command":["sh","-c","echo ran > /shared/hook"]}}"#;
    let outcome = f.killer.kill(&id, request(0, Some(hook))).await.unwrap();
    assert_eq!(outcome.hook, None);
    assert_eq!(outcome.stop_timeout, Some(2));
    assert_eq!(read(&f.ctrd.scratch("zero").join("hook")), "");
    assert!(matches!(outcome.after, StateAfter::Exited { .. }));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_container_that_ignores_sigterm_is_killed_after_the_grace() {
    let mut f = Fixture::new().await;
    let id = f
        .run("stubborn", |config, _| {
            config.command = vec!["sleep".into(), "3600".into()];
            pods::own_pid_namespace(config);
        })
        .await;
    let started = Instant::now();
    let outcome = f.killer.kill(&id, request(3, None)).await.unwrap();
    let took = started.elapsed();
    assert_eq!(outcome.stop_timeout, Some(3));
    assert!(
        took >= Duration::from_secs(3),
        "killed before the grace ran out: {took:?}"
    );
    assert!(took < Duration::from_secs(10), "{took:?}");
    match outcome.after {
        StateAfter::Exited { exit_code, .. } => assert_eq!(exit_code, 137, "not SIGKILLed"),
        other => panic!("not exited: {other:?}"),
    }
}

/// A CGI script for busybox httpd that records the request it served.
const RECORDER: &str = "#!/bin/sh\nenv > /www/seen.tmp && mv /www/seen.tmp /www/seen\nprintf 'Content-Type: text/plain\\r\\n\\r\\nbye\\n'\n";

fn free_port() -> u16 {
    std::net::TcpListener::bind("127.0.0.1:0")
        .unwrap()
        .local_addr()
        .unwrap()
        .port()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn http_get_reaches_the_pod_with_path_headers_and_a_named_port() {
    use std::os::unix::fs::PermissionsExt;
    let mut f = Fixture::new().await;
    let port = free_port();
    let id = f
        .run("http", |config, shared| {
            std::fs::create_dir_all(shared.join("cgi-bin")).unwrap();
            let script = shared.join("cgi-bin/hook");
            std::fs::write(&script, RECORDER).unwrap();
            std::fs::set_permissions(&script, std::fs::Permissions::from_mode(0o755)).unwrap();
            pods::mount(config, shared, "/www");
            config.command = vec![
                "httpd".into(),
                "-f".into(),
                "-p".into(),
                format!("127.0.0.1:{port}"),
                "-h".into(),
                "/www".into(),
            ];
            config.annotations.insert(
                kill::keys::PORTS.into(),
                format!(r#"[{{"name":"web","containerPort":{port},"protocol":"TCP"}}]"#),
            );
        })
        .await;
    // Let httpd bind before the hook calls it.
    let deadline = Instant::now() + Duration::from_secs(5);
    while std::net::TcpStream::connect(("127.0.0.1", port)).is_err() {
        assert!(Instant::now() < deadline, "httpd did not start");
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    // No host: a host-network Pod's address is the node's.
    let hook = r#"{"httpGet":{"path":"/cgi-bin/hook?stage=prestop","port":"web","httpHeaders":[{"name":"X-Hook","value":"yes"}]}}"#;
    let outcome = f.killer.kill(&id, request(5, Some(hook))).await.unwrap();

    let report = outcome.hook.clone().unwrap();
    assert_eq!(
        (report.kind, report.result),
        (HookKind::HttpGet, HookResult::Succeeded)
    );
    let seen = read(&f.ctrd.scratch("http").join("seen"));
    assert!(
        seen.contains("REQUEST_URI=/cgi-bin/hook?stage=prestop"),
        "{seen}"
    );
    assert!(seen.contains("HTTP_X_HOOK=yes"), "{seen}");
    assert!(
        seen.contains(&format!("HTTP_USER_AGENT={}", kill::http::USER_AGENT)),
        "{seen}"
    );
    assert!(
        seen.contains(&format!("HTTP_HOST=127.0.0.1:{port}")),
        "{seen}"
    );
    assert!(
        matches!(outcome.after, StateAfter::Exited { .. }),
        "{:?}",
        outcome.after
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn failing_hooks_are_reported_and_the_container_still_stops() {
    let mut f = Fixture::new().await;
    let closed = free_port();
    let cases = [
        (
            format!(r#"{{"httpGet":{{"host":"127.0.0.1","port":{closed},"path":"/quit"}}}}"#),
            HookKind::HttpGet,
            r#"Http lifecycle hook (/quit) for Container "app" in Pod "unreachable_default(uid-unreachable)" failed - error: dial tcp 127.0.0.1:"#,
        ),
        (
            r#"{"exec":{"command":["sh","-c","echo out; echo err >&2; exit 3"]}}"#.to_owned(),
            HookKind::Exec,
            r#"Exec lifecycle hook ([sh -c echo out; echo err >&2; exit 3]) for Container "app" in Pod "failing_default(uid-failing)" failed - error: command 'sh -c echo out; echo err >&2; exit 3' exited with 3: err"#,
        ),
        (
            r#"{"tcpSocket":{"port":80}}"#.to_owned(),
            HookKind::Invalid,
            "Cannot run handler: invalid handler: tcpSocket to port 80",
        ),
    ];
    for ((hook, kind, message), pod) in cases.iter().zip(["unreachable", "failing", "tcp"]) {
        let id = f.run(pod, |_, _| {}).await;
        let outcome = f.killer.kill(&id, request(5, Some(hook))).await.unwrap();
        let report = outcome.hook.clone().unwrap();
        assert_eq!(report.kind, *kind);
        match &report.result {
            HookResult::Failed(text) => assert!(text.starts_with(message), "{pod}: {text}"),
            other => panic!("{pod}: hook did not fail: {other:?}"),
        }
        assert!(
            matches!(outcome.after, StateAfter::Exited { .. }),
            "{pod}: {:?}",
            outcome.after
        );
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn sleep_hooks_and_the_containers_own_pre_stop_are_honoured() {
    let mut f = Fixture::new().await;
    let id = f.run("sleep", |_, _| {}).await;
    let outcome = f
        .killer
        .kill(&id, request(10, Some(r#"{"sleep":{"seconds":2}}"#)))
        .await
        .unwrap();
    let report = outcome.hook.unwrap();
    assert_eq!(
        (report.kind, report.result, report.seconds),
        (HookKind::Sleep, HookResult::Succeeded, 2)
    );
    assert_eq!(outcome.stop_timeout, Some(8));

    // No hook and no grace in the request: the container's annotations decide.
    let id = f
        .run("annotated", |config, _| {
            config.annotations.insert(
                kill::keys::PRE_STOP_HANDLER.into(),
                r#"{"exec":{"command":["sh","-c","echo annotated > /shared/hook"]}}"#.into(),
            );
            config
                .annotations
                .insert(kill::keys::TERMINATION_GRACE_PERIOD.into(), "7".into());
        })
        .await;
    let outcome = f.killer.kill(&id, KillRequest::default()).await.unwrap();
    assert_eq!(outcome.grace_period, 7);
    assert_eq!(outcome.grace_source, GraceSource::TerminationGracePeriod);
    assert_eq!(outcome.hook.unwrap().result, HookResult::Succeeded);
    assert_eq!(
        read(&f.ctrd.scratch("annotated").join("hook")),
        "annotated\n"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn exited_and_removed_containers_need_no_stop() {
    let mut f = Fixture::new().await;
    let id = f
        .run("done", |config, _| config.command = vec!["true".into()])
        .await;
    let deadline = Instant::now() + Duration::from_secs(10);
    while f.state(&id).await != ContainerState::ContainerExited {
        assert!(Instant::now() < deadline, "container did not exit");
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    let outcome = f.killer.kill(&id, request(5, None)).await.unwrap();
    assert_eq!(outcome.stop_timeout, None);
    assert_eq!(outcome.hook, None);
    assert!(
        matches!(outcome.after, StateAfter::Exited { exit_code: 0, .. }),
        "{:?}",
        outcome.after
    );

    f.cri
        .remove_container(RemoveContainerRequest {
            container_id: id.clone(),
        })
        .await
        .unwrap();
    let outcome = f.killer.kill(&id, request(5, None)).await.unwrap();
    assert_eq!(outcome.after, StateAfter::Gone);
    assert_eq!(outcome.target, None);
    assert_eq!(outcome.stop_timeout, None);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn concurrent_kills_of_one_container_run_one_hook() {
    let mut f = Fixture::new().await;
    let id = f.run("twice", |_, _| {}).await;
    let hook = r#"{"exec":{"command":["sh","-c","echo run >> /shared/count; sleep 1"]}}"#;
    let (a, b) = tokio::join!(
        f.killer.kill(&id, request(10, Some(hook))),
        f.killer.kill(&id, request(10, Some(hook))),
    );
    let (a, b) = (a.unwrap(), b.unwrap());
    assert_eq!(a, b, "the second kill did not join the first");
    assert_eq!(read(&f.ctrd.scratch("twice").join("count")), "run\n");
    assert!(matches!(a.after, StateAfter::Exited { .. }));
}

/// The stop's own answer decides: once StopContainer succeeded, a
/// ContainerStatus that fails (the runtime is busy) leaves the state
/// unknown, and the kill has still succeeded (kruise reads nothing after it).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_status_error_after_a_successful_stop_is_no_failure() {
    let mut f = Fixture::new().await;
    let id = f.run("busy-runtime", |_, _| {}).await;
    let interposer = support::interposer::StatusFailsAfterStop::start(f.ctrd.socket());
    let killer = Killer::new(support::client(&interposer.endpoint()), None);
    let outcome = killer.kill(&id, request(5, None)).await;
    let outcome = outcome.unwrap_or_else(|error| panic!("the kill failed: {error}"));
    // (Compared by name, so that this test builds on the code before the fix.)
    assert_eq!(format!("{:?}", outcome.after), "Unknown");
    assert!(outcome.stop_timeout.is_some(), "{outcome:?}");
    assert_eq!(f.state(&id).await, ContainerState::ContainerExited);
}
