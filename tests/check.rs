//! `crr-proxy check` against a real containerd and the fake API server.
#![allow(clippy::unwrap_used, clippy::expect_used)] // tests fail loudly by design

mod support;

use std::path::Path;
use std::process::Command;

use serde_json::json;
use support::apiserver::{FakeApiServer, Resource};
use support::containerd::Containerd;

/// `crr-proxy check` with `args`, run off the async runtime, on which the
/// fake API server answers it.
async fn check(args: &[&str], kubeconfig: &Path, kubelet: &Path) -> (i32, String) {
    let mut command = Command::new(env!("CARGO_BIN_EXE_crr-proxy"));
    command
        .arg("check")
        .args(args)
        .arg("--kubeconfig")
        .arg(kubeconfig)
        .arg("--kubelet-config")
        .arg(kubelet)
        .env_remove("LISTEN_FDS");
    let out = tokio::task::spawn_blocking(move || command.output())
        .await
        .unwrap()
        .unwrap();
    (
        out.status.code().unwrap_or(-1),
        String::from_utf8_lossy(&out.stdout).into_owned(),
    )
}

fn row<'a>(table: &'a str, check: &str) -> &'a str {
    table
        .lines()
        .find(|l| l.starts_with(check))
        .unwrap_or_else(|| panic!("no {check} row:\n{table}"))
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn everything_in_place_passes_and_each_gap_fails_by_name() {
    let ctrd = tokio::task::spawn_blocking(Containerd::start)
        .await
        .unwrap()
        .unwrap();
    let api = FakeApiServer::start_for_node("node-a", "node-a-token").await;
    api.create(Resource::Node, "", json!({"metadata": {"name": "node-a"}}))
        .unwrap();
    let dir = ctrd.scratch("check");
    let kubeconfig = dir.join("kubeconfig");
    support::write_kubeconfig_as(&kubeconfig, &api.url, Some("node-a-token"));
    let listen = dir.join("run/proxy.sock");
    let kubelet = dir.join("kubelet.yaml");
    let socket = format!("unix://{}", listen.display());
    std::fs::write(
        &kubelet,
        format!("kind: KubeletConfiguration\ncontainerRuntimeEndpoint: {socket}\nimageServiceEndpoint: {socket}\ncrashLoopBackOff:\n  maxContainerRestartPeriod: 30s\n"),
    )
    .unwrap();
    let runtime = ctrd.endpoint().to_string();
    let args = [
        "--runtime-endpoint",
        &runtime,
        "--listen",
        listen.to_str().unwrap(),
        "--agent",
        "standalone",
        "--node-name",
        "node-a",
    ];

    let (code, table) = check(&args, &kubeconfig, &kubelet).await;
    assert_eq!(code, 0, "{table}");
    for check in [
        "runtime endpoint",
        "listen path",
        "kubelet endpoints",
        "kubeconfig",
        "API server",
        "identity",
        "RBAC",
        "CRD",
        "node name",
        "restart back-off",
        "Lease",
    ] {
        assert!(row(&table, check).contains("pass"), "{check}:\n{table}");
    }

    // Kruise mode: a kruise-daemon on the node fails its row.
    let kruise: Vec<&str> = args
        .iter()
        .map(|a| if *a == "standalone" { "kruise" } else { a })
        .collect();
    let (_, alone) = check(&kruise, &kubeconfig, &kubelet).await;
    assert!(row(&alone, "kruise-daemon").contains("pass"), "{alone}");
    api.create_unchecked(
        Resource::Pod,
        "kruise-system",
        json!({"metadata": {"name": "kruise-daemon-x", "labels": {"control-plane": "daemon"}},
               "spec": {"nodeName": "node-a", "serviceAccountName": "kruise-daemon", "containers": [{"name": "daemon"}]}}),
    )
    .unwrap();
    let (code, beside) = check(&kruise, &kubeconfig, &kubelet).await;
    assert_ne!(code, 0, "{beside}");
    let aside = row(&beside, "kruise-daemon");
    assert!(
        aside.contains("FAIL")
            && aside.contains("kruise-daemon Pod kruise-system/kruise-daemon-x runs on this node"),
        "{beside}"
    );
    api.delete_with_grace(Resource::Pod, "kruise-system", "kruise-daemon-x", Some(0))
        .unwrap();
    // The Lease as deploy/base/claimer.yaml ships it, held by no node.
    assert!(
        row(&table, "Lease").contains(
            "crr-proxy-system/crr-proxy-claimer has no holder: the first standalone node to look takes it"
        ),
        "{table}"
    );
    // Without it, the node policies refuse every update and delete of a CRR.
    api.delete(Resource::Lease, "crr-proxy-system", "crr-proxy-claimer")
        .unwrap();
    let (_, missing) = check(&args, &kubeconfig, &kubelet).await;
    assert!(
        row(&missing, "Lease").contains(
            "crr-proxy-system/crr-proxy-claimer does not exist: the first standalone node to look makes it; \
             until then deploy/base/node-policy.yaml refuses every update and delete of a CRR, by anyone \
             (deploy/base/claimer.yaml ships it)"
        ),
        "{missing}"
    );
    // A Lease no node could make: its namespace is missing, or the node
    // policy allows another one.
    for (namespace, why) in [
        ("ops", "namespace ops does not exist"),
        (
            "kube-system",
            "may not make Lease kube-system/crr-proxy-claimer: ",
        ),
    ] {
        let elsewhere: Vec<&str> = args
            .iter()
            .copied()
            .chain(["--lease-namespace", namespace])
            .collect();
        let (code, table) = check(&elsewhere, &kubeconfig, &kubelet).await;
        assert_ne!(code, 0, "{table}");
        let lease = row(&table, "Lease");
        assert!(lease.contains("FAIL") && lease.contains(why), "{table}");
    }
    assert!(
        api.get(Resource::Lease, "kube-system", "crr-proxy-claimer")
            .is_none()
    );
    api.create(
        Resource::Lease,
        "crr-proxy-system",
        json!({"metadata": {"name": "crr-proxy-claimer"},
               "spec": {"holderIdentity": "node-b", "leaseDurationSeconds": 15,
                        "renewTime": support::apiserver::now()}}),
    )
    .unwrap();
    let (_, table) = check(&args, &kubeconfig, &kubelet).await;
    assert!(
        row(&table, "Lease").contains("held by node-b, renewed"),
        "{table}"
    );
    assert!(
        row(&table, "restart back-off").contains("waits 10s, doubling to 30s"),
        "{table}"
    );
    assert!(
        row(&table, "identity").contains("crr-proxy:node:node-a"),
        "{table}"
    );
    assert!(
        row(&table, "runtime endpoint").contains("containerd"),
        "{table}"
    );

    // Now break things, one per check.
    api.deny("patch pods/status");
    api.deny("update leases");
    std::fs::write(&kubelet, "kind: KubeletConfiguration\ncontainerRuntimeEndpoint: unix:///run/containerd/containerd.sock\n").unwrap();
    let absent = format!("unix://{}", dir.join("absent.sock").display());
    let broken = [
        "--runtime-endpoint",
        &absent,
        "--listen",
        listen.to_str().unwrap(),
        "--agent",
        "standalone",
        "--node-name",
        "node-z",
    ];
    let (code, table) = check(&broken, &kubeconfig, &kubelet).await;
    assert_eq!(code, 1, "{table}");
    assert!(row(&table, "runtime endpoint").contains("FAIL"), "{table}");
    assert!(row(&table, "kubelet endpoints").contains("FAIL"), "{table}");
    assert!(
        row(&table, "restart back-off").contains("doubling to 300s (kubelet's default)"),
        "{table}"
    );
    assert!(
        row(&table, "RBAC").contains("denied: patch pods/status"),
        "{table}"
    );
    assert!(row(&table, "node name").contains("FAIL"), "{table}");
    assert!(
        row(&table, "Lease").contains("FAIL")
            && row(&table, "Lease").contains("may not update Lease"),
        "{table}"
    );
    // node-a's identity on a crr-proxy told it is node-z.
    assert!(row(&table, "identity").contains("FAIL"), "{table}");
    assert!(row(&table, "CRD").contains("pass"), "{table}");

    // Credentials that are no node identity (an admin's): noted, not failed.
    support::write_kubeconfig(&kubeconfig, &api.url);
    let (_, table) = check(&args, &kubeconfig, &kubelet).await;
    assert!(row(&table, "identity").contains("skip"), "{table}");
    assert!(
        row(&table, "identity").contains("kubernetes-admin"),
        "{table}"
    );
}

/// Under kubelet's identity, kruise mode's identity and RBAC rows pass on
/// what `crr-proxy manifests --agent kruise --identity kubelet` and Node
/// authorization allow (Pods asked with the agent's field selector);
/// standalone's identity row fails and says why.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn kubelets_identity_passes_in_kruise_mode_and_fails_in_standalone() {
    let api = FakeApiServer::start_for_kubelet("node-a", "kubelet-token").await;
    let listen = support::temp_socket("check-kubelet");
    let kubeconfig = listen.with_file_name("kubelet.conf");
    support::write_kubeconfig_as(&kubeconfig, &api.url, Some("kubelet-token"));
    let kubelet = listen.with_file_name("kubelet.yaml");
    std::fs::write(&kubelet, "kind: KubeletConfiguration\n").unwrap();
    let absent = format!("unix://{}", listen.with_file_name("absent.sock").display());
    let args = |mode: &'static str| {
        [
            "--runtime-endpoint".to_owned(),
            absent.clone(),
            "--listen".to_owned(),
            listen.to_str().unwrap().to_owned(),
            "--agent".to_owned(),
            mode.to_owned(),
            "--node-name".to_owned(),
            "node-a".to_owned(),
        ]
    };
    let kruise = args("kruise");
    let kruise: Vec<&str> = kruise.iter().map(String::as_str).collect();
    let (_, table) = check(&kruise, &kubeconfig, &kubelet).await;
    let identity = row(&table, "identity");
    assert!(
        identity.contains("pass") && identity.contains("system:node:node-a (kubelet's)"),
        "{table}"
    );
    assert!(row(&table, "RBAC").contains("pass"), "{table}");

    let standalone = args("standalone");
    let standalone: Vec<&str> = standalone.iter().map(String::as_str).collect();
    let (code, table) = check(&standalone, &kubeconfig, &kubelet).await;
    assert_ne!(code, 0, "{table}");
    let identity = row(&table, "identity");
    assert!(
        identity.contains("FAIL") && identity.contains("serves --agent kruise only"),
        "{table}"
    );
    // Standalone's verbs are not all granted to kubelets either.
    assert!(row(&table, "RBAC").contains("FAIL"), "{table}");
    support::remove_socket_dir(&listen);
}

/// `check --before-switch`, which install.sh runs before pointing kubelet
/// at crr-proxy: it passes only where kubelet's runtime answers and
/// crr-proxy's socket answers for that same runtime; kubelet's endpoints
/// and the agent (here a kubeconfig that does not exist) are not its
/// business.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn before_the_switch_crr_proxy_must_answer_for_kubelets_runtime() {
    let ctrd = tokio::task::spawn_blocking(Containerd::start)
        .await
        .unwrap()
        .unwrap();
    let dir = ctrd.scratch("before-switch");
    let kubelet = dir.join("kubelet.yaml");
    std::fs::write(&kubelet, "kind: KubeletConfiguration\n").unwrap();
    let missing = dir.join("no-kubeconfig");
    let runtime = ctrd.endpoint().to_string();
    let before_switch = async |listen: &Path, runtime: &str| {
        let args = [
            "--before-switch",
            "--runtime-endpoint",
            runtime,
            "--listen",
            listen.to_str().unwrap(),
            "--agent",
            "kruise",
            "--node-name",
            "node-a",
        ];
        check(&args, &missing, &kubelet).await
    };

    // crr-proxy forwarding to kubelet's runtime.
    let proxy = support::ProxyUnderTest::to(ctrd.endpoint());
    let (code, table) = before_switch(&proxy.socket, &runtime).await;
    assert_eq!(code, 0, "{table}");
    assert!(row(&table, "runtime endpoint").contains("pass"), "{table}");
    let through = row(&table, "through crr-proxy");
    assert!(
        through.contains("pass") && through.contains("the same runtime"),
        "{table}"
    );
    for unchecked in ["kubelet endpoints", "kubeconfig", "listen path"] {
        assert!(
            !table.contains(unchecked),
            "{unchecked} is checked:\n{table}"
        );
    }

    // crr-proxy forwarding to another runtime (the scripted one).
    let other = support::peers::CriRuntime::start(&[]);
    let elsewhere = support::ProxyUnderTest::to(other.endpoint());
    let (code, table) = before_switch(&elsewhere.socket, &runtime).await;
    assert_ne!(code, 0, "{table}");
    let through = row(&table, "through crr-proxy");
    assert!(
        through.contains("FAIL") && through.contains("forwards elsewhere"),
        "{table}"
    );

    // Nothing listening where crr-proxy should be.
    let (code, table) = before_switch(&dir.join("nobody.sock"), &runtime).await;
    assert_ne!(code, 0, "{table}");
    assert!(row(&table, "through crr-proxy").contains("FAIL"), "{table}");

    // kubelet's runtime does not answer: that is the failure named.
    let absent = format!("unix://{}", dir.join("crio.sock").display());
    let (code, table) = before_switch(&proxy.socket, &absent).await;
    assert_ne!(code, 0, "{table}");
    let direct = row(&table, "runtime endpoint");
    assert!(
        direct.contains("FAIL") && direct.contains("crio.sock"),
        "{table}"
    );
    assert!(row(&table, "through crr-proxy").contains("skip"), "{table}");
}
