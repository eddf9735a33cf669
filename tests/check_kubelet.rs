//! `crr-proxy check`'s "kubelet endpoints" row: the endpoint kubelet
//! actually uses, from its own /configz or from the command line of the
//! kubelet running here and the files it names, layered as kubelet layers
//! them.
//!
//! A stand-in kubelet (a shell script named `kubelet`, which is what /proc
//! shows as its name, with kubelet's flags on its command line) runs while
//! each step checks; the steps share one test because every check on this
//! machine sees every process named `kubelet`.
#![allow(clippy::unwrap_used, clippy::expect_used)] // tests fail loudly by design

mod support;

use std::os::unix::fs::PermissionsExt;
use std::path::{Path, PathBuf};
use std::process::{Child, Command};
use std::time::Duration;

use serde_json::{Value, json};
use support::apiserver::{FakeApiServer, Resource};

/// A process named `kubelet` with `args` on its command line, run from
/// `dir`; killed when dropped.
struct StandIn(Child);

impl StandIn {
    fn start(dir: &Path, args: &[&str]) -> Self {
        let script = dir.join("kubelet");
        std::fs::write(&script, "#!/bin/sh\nwhile :; do sleep 1; done\n").unwrap();
        std::fs::set_permissions(&script, std::fs::Permissions::from_mode(0o755)).unwrap();
        let child = Command::new(&script)
            .args(args)
            .current_dir(dir)
            .spawn()
            .unwrap();
        // Until the shell has exec'd, /proc shows the test's own name.
        let comm = PathBuf::from(format!("/proc/{}/comm", child.id()));
        for _ in 0..100 {
            if std::fs::read_to_string(&comm).is_ok_and(|c| c.trim_end() == "kubelet") {
                break;
            }
            std::thread::sleep(Duration::from_millis(20));
        }
        Self(child)
    }

    fn pid(&self) -> u32 {
        self.0.id()
    }
}

impl Drop for StandIn {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

/// The "kubelet endpoints" row of `crr-proxy check` with `args`.
async fn kubelet_row(args: Vec<String>) -> String {
    let out = tokio::task::spawn_blocking(move || {
        Command::new(env!("CARGO_BIN_EXE_crr-proxy"))
            .arg("check")
            .args(args)
            .env_remove("LISTEN_FDS")
            .output()
            .unwrap()
    })
    .await
    .unwrap();
    let table = String::from_utf8_lossy(&out.stdout).into_owned();
    table
        .lines()
        .find(|l| l.starts_with("kubelet endpoints"))
        .unwrap_or_else(|| panic!("no kubelet endpoints row:\n{table}"))
        .to_owned()
}

fn strings(args: &[&str]) -> Vec<String> {
    args.iter().map(|a| (*a).to_owned()).collect()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_endpoint_kubelet_runs_with_is_reported_and_a_difference_fails() {
    let dir = tempdir();
    let listen = dir.join("run/proxy.sock");
    let socket = format!("unix://{}", listen.display());
    let containerd = "unix:///run/containerd/containerd.sock";
    // What check would read if it went by the --kubelet-config file alone.
    let decoy = dir.join("decoy.yaml");
    std::fs::write(
        &decoy,
        format!("containerRuntimeEndpoint: {containerd}\nimageServiceEndpoint: {containerd}\n"),
    )
    .unwrap();
    let absent = format!("unix://{}", dir.join("no-runtime.sock").display());
    let base = [
        "--runtime-endpoint",
        &absent,
        "--listen",
        listen.to_str().unwrap(),
        "--kubelet-config",
        decoy.to_str().unwrap(),
    ];

    // No kubelet here: the --kubelet-config file stands in, and says so.
    let row = kubelet_row(strings(&base)).await;
    assert!(
        row.contains("FAIL") && row.contains("no kubelet runs here"),
        "{row}"
    );

    // kubelet's --config (relative to its working directory) sets the
    // runtime, a drop-in of its --config-dir the image endpoint.
    std::fs::write(
        dir.join("config.yaml"),
        format!("kind: KubeletConfiguration\ncontainerRuntimeEndpoint: {socket}\nimageServiceEndpoint: {containerd}\n"),
    )
    .unwrap();
    std::fs::create_dir_all(dir.join("conf.d/nested")).unwrap();
    std::fs::write(
        dir.join("conf.d/10-image.conf"),
        format!("imageServiceEndpoint: {socket}\n"),
    )
    .unwrap();
    // Not a .conf file: kubelet does not read it.
    std::fs::write(
        dir.join("conf.d/README"),
        format!("imageServiceEndpoint: {containerd}\n"),
    )
    .unwrap();
    let kubelet = StandIn::start(
        &dir,
        &["--config=config.yaml", "--config-dir", "conf.d", "--v=2"],
    );
    let row = kubelet_row(strings(&base)).await;
    assert!(row.contains("pass"), "{row}");
    assert!(
        row.contains(&format!(
            "kubelet pid {}'s command line and files",
            kubelet.pid()
        )),
        "{row}"
    );

    // A drop-in written after kubelet started: kubelet has not read it.
    tokio::time::sleep(Duration::from_millis(2500)).await;
    let late = dir.join("conf.d/nested/20-late.conf");
    std::fs::write(&late, format!("containerRuntimeEndpoint: {containerd}\n")).unwrap();
    let row = kubelet_row(strings(&base)).await;
    assert!(row.contains("FAIL"), "{row}");
    assert!(
        row.contains(&format!(
            "containerRuntimeEndpoint is \"{containerd}\" ({})",
            late.display()
        )),
        "{row}"
    );
    assert!(
        row.contains(&format!(
            "{} changed after kubelet started, so kubelet has not read it: restart kubelet",
            late.display()
        )),
        "{row}"
    );
    std::fs::remove_file(&late).unwrap();
    drop(kubelet);

    // A flag wins over every file.
    let kubelet = StandIn::start(
        &dir,
        &[
            "--config",
            "config.yaml",
            "--config-dir=conf.d",
            "--container-runtime-endpoint",
            containerd,
        ],
    );
    let row = kubelet_row(strings(&base)).await;
    assert!(
        row.contains("FAIL")
            && row.contains(&format!(
                "containerRuntimeEndpoint is \"{containerd}\" (flag --container-runtime-endpoint)"
            ))
            && !row.contains("imageServiceEndpoint"),
        "{row}"
    );
    drop(kubelet);

    // kubelet's own answer, through the API server, where the credentials
    // may read it: it is what kubelet runs with, and files that now say
    // otherwise fail the row (the next restart would change it).
    let kubelet = StandIn::start(&dir, &["--config=config.yaml", "--config-dir=conf.d"]);
    let api = FakeApiServer::start().await;
    api.create(Resource::Node, "", json!({"metadata": {"name": "node-a"}}))
        .unwrap();
    api.add_user("node-a-token", support::policy::UserInfo::node("node-a"));
    let kubeconfig = dir.join("kubeconfig");
    support::write_kubeconfig_as(&kubeconfig, &api.url, Some("node-a-token"));
    let agent = [
        "--agent",
        "kruise",
        "--node-name",
        "node-a",
        "--kubeconfig",
        kubeconfig.to_str().unwrap(),
    ];
    let with_agent = || {
        let mut args = strings(&base);
        args.extend(strings(&agent));
        args
    };
    let mut rules = kruise_rules();
    api.grant("crr-proxy:node:node-a", &rules);
    // Not granted (deploy/kruise/rbac.yaml does not): the files speak.
    let row = kubelet_row(with_agent()).await;
    assert!(
        row.contains("pass")
            && row.contains("command line and files")
            && row.contains("/configz: these credentials may not get nodes/proxy"),
        "{row}"
    );
    rules
        .as_array_mut()
        .unwrap()
        .push(json!({"apiGroups": [""], "resources": ["nodes/proxy"], "verbs": ["get"]}));
    api.grant("crr-proxy:node:node-a", &rules);
    // Granted, but kubelet is not reachable from the API server.
    let row = kubelet_row(with_agent()).await;
    assert!(
        row.contains("pass") && row.contains("/configz: error trying to reach service"),
        "{row}"
    );
    api.set_configz(
        "node-a",
        json!({"kind": "KubeletConfiguration", "containerRuntimeEndpoint": containerd}),
    );
    let row = kubelet_row(with_agent()).await;
    assert!(row.contains("FAIL"), "{row}");
    assert!(
        row.contains(&format!(
            "containerRuntimeEndpoint is \"{containerd}\" (kubelet's /configz)"
        )) && row.contains("from kubelet's /configz through the API server"),
        "{row}"
    );
    assert!(
        row.contains(&format!(
            "kubelet runs with containerRuntimeEndpoint \"{containerd}\", but kubelet pid {}'s command line and files now gives \"{socket}\"",
            kubelet.pid()
        )) && row.contains("its next restart changes it"),
        "{row}"
    );
    api.set_configz(
        "node-a",
        json!({"kind": "KubeletConfiguration", "containerRuntimeEndpoint": socket, "imageServiceEndpoint": socket}),
    );
    let row = kubelet_row(with_agent()).await;
    assert!(
        row.contains("pass") && row.contains("from kubelet's /configz through the API server"),
        "{row}"
    );
    drop(kubelet);
}

/// The ClusterRole's rules of deploy/kruise/rbac.yaml.
fn kruise_rules() -> Value {
    let text = include_str!("../deploy/kruise/rbac.yaml");
    text.split("\n---")
        .map(|doc| serde_saphyr::from_str::<Value>(doc).unwrap())
        .find(|doc| doc["kind"] == "ClusterRole")
        .expect("a ClusterRole")["rules"]
        .clone()
}

fn tempdir() -> PathBuf {
    let dir = std::env::temp_dir().join(format!("crr-check-kubelet-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&dir);
    std::fs::create_dir_all(&dir).unwrap();
    dir
}
