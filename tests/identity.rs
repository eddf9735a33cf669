//! crr-proxy under kubelet's identity, and credentials that change under a
//! running crr-proxy. The crr-proxy binary in kruise mode, a real
//! containerd, the kubelet and kruise-manager roles, and the fake API server
//! with the objects `crr-proxy manifests --agent kruise --identity kubelet`
//! renders, its Node authorizer and NodeRestriction.
#![allow(clippy::unwrap_used, clippy::expect_used)] // tests fail loudly by design

mod support;

use std::path::{Path, PathBuf};
use std::time::Duration;

use serde_json::{Value, json};
use support::apiserver::{FakeApiServer, Resource};
use support::containerd::Containerd;
use support::kubelet::{ContainerSpec, Kubelet, PodSpec};
use support::policy::UserInfo;
use support::roles::{KruiseManager, NAMESPACE, wait_for};

const NODE: &str = "node-a";

/// Writes the kubeconfig whole, as an operator's tools and kubelet's
/// certificate store do (a new file renamed into place).
fn write_kubeconfig(path: &Path, server: &str, token: &str) {
    let next = path.with_extension("next");
    support::write_kubeconfig_as(&next, server, Some(token));
    std::fs::rename(&next, path).unwrap();
}

fn crr(name: &str) -> Value {
    json!({"metadata": {"name": name},
           "spec": {"podName": "web-0", "containers": [{"name": "app"}]}})
}

async fn completed(api: &FakeApiServer, name: &str, log: &Path) -> Value {
    let done = wait_for(Duration::from_secs(30), || {
        api.get(Resource::Crr, NAMESPACE, name)
            .filter(|c| c["status"]["phase"] == "Completed")
    })
    .await;
    done.unwrap_or_else(|| {
        panic!(
            "{name} did not complete: {:?}\n--- crr-proxy's log\n{}",
            api.get(Resource::Crr, NAMESPACE, name),
            std::fs::read_to_string(log).unwrap_or_default()
        )
    })
}

/// Kruise mode runs under kubelet's identity with only what the rendered
/// objects and Node authorization allow (no request of the node's is
/// refused); then the kubeconfig is rewritten with a new credential and the
/// old one revoked, and the same process goes on with the new one.
#[tokio::test]
async fn kruise_mode_runs_as_the_kubelet_and_takes_renewed_credentials() {
    support::init_logging();
    let ctrd = tokio::task::spawn_blocking(Containerd::start)
        .await
        .unwrap()
        .unwrap();
    let api = FakeApiServer::start_for_kubelet(NODE, "first").await;
    let listen = support::temp_socket("identity");
    let kubeconfig: PathBuf = listen.with_file_name("kubelet.conf");
    write_kubeconfig(&kubeconfig, &api.url, "first");
    let cri = support::client(&ctrd.endpoint());
    let kubelet = Kubelet::start(&api, cri, NODE, ctrd.scratch("logs")).await;
    let _manager = KruiseManager::start(&api);
    kubelet
        .run_pod(PodSpec::new("web-0", vec![ContainerSpec::graceful("app")]))
        .await;

    let log = listen.with_file_name("crr-proxy.log");
    let _proxy = support::daemon(
        env!("CARGO_BIN_EXE_crr-proxy"),
        "kruise",
        NODE,
        &listen,
        &ctrd.endpoint(),
        &kubeconfig,
        &log,
    );

    api.create(Resource::Crr, NAMESPACE, crr("first")).unwrap();
    let first = completed(&api, "first", &log).await;
    assert_eq!(
        first["status"]["containerRecreateStates"][0]["phase"], "Succeeded",
        "{first}"
    );
    let user = UserInfo::kubelet(NODE).username;
    let refused: Vec<String> = api
        .writes()
        .iter()
        .filter(|w| w.user.as_deref() == Some(user.as_str()) && w.code.is_some_and(|c| c >= 400))
        .map(|w| format!("{} {} {:?}", w.method, w.path, w.code))
        .collect();
    assert!(refused.is_empty(), "refused: {refused:?}");
    let text = std::fs::read_to_string(&log).unwrap();
    assert!(!text.contains("forbidden"), "{text}");

    // A new credential in the kubeconfig; the old one stops working.
    api.add_user("second", UserInfo::kubelet(NODE));
    write_kubeconfig(&kubeconfig, &api.url, "second");
    api.remove_user("first");
    api.create(Resource::Crr, NAMESPACE, crr("second")).unwrap();
    let second = completed(&api, "second", &log).await;
    assert_eq!(
        second["status"]["containerRecreateStates"][0]["phase"], "Succeeded",
        "{second}"
    );
    let text = std::fs::read_to_string(&log).unwrap();
    assert!(text.contains("a credential it names changed"), "{text}");

    drop(kubelet);
    support::remove_socket_dir(&listen);
}
