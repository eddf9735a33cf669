//! The node installer, run against a scratch root (DESTDIR).
#![allow(clippy::unwrap_used, clippy::expect_used)] // tests fail loudly by design

mod support;

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::process::Command;

/// Every file under `root`, with its mode and contents.
fn snapshot(root: &Path) -> BTreeMap<String, (u32, Vec<u8>)> {
    use std::os::unix::fs::PermissionsExt;
    let mut files = BTreeMap::new();
    let mut stack = vec![root.to_owned()];
    while let Some(dir) = stack.pop() {
        for entry in std::fs::read_dir(&dir).unwrap().flatten() {
            let path = entry.path();
            let meta = entry.metadata().unwrap();
            let name = path.strip_prefix(root).unwrap().display().to_string();
            if meta.is_dir() {
                files.insert(format!("{name}/"), (meta.permissions().mode(), Vec::new()));
                stack.push(path);
            } else {
                files.insert(
                    name,
                    (meta.permissions().mode(), std::fs::read(&path).unwrap()),
                );
            }
        }
    }
    files
}

const INSTALL_SH: &str = concat!(env!("CARGO_MANIFEST_DIR"), "/scripts/install.sh");

/// scripts/install.sh acting on the scratch root `root`.
fn install_sh(root: &Path) -> Command {
    let mut command = Command::new("bash");
    command.arg(INSTALL_SH).env("DESTDIR", root);
    command
}

fn install(root: &Path, args: &[&str]) -> String {
    installed(install_sh(root), args)
}

/// What `command` (install.sh, however started) said, installing this
/// build's crr-proxy with `args`; it must succeed.
fn installed(mut command: Command, args: &[&str]) -> String {
    let out = command
        .args(["--binary", env!("CARGO_BIN_EXE_crr-proxy")])
        .args(args)
        .output()
        .unwrap();
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(out.status.success(), "install.sh {args:?} failed: {stderr}");
    String::from_utf8_lossy(&out.stdout).into_owned() + &stderr
}

#[test]
fn installs_idempotently_and_uninstall_restores_the_node() {
    let socket = support::temp_socket("install");
    let root = socket.parent().unwrap().join("root");
    let kubelet = root.join("var/lib/kubelet/config.yaml");
    std::fs::create_dir_all(kubelet.parent().unwrap()).unwrap();
    let original = "apiVersion: kubelet.config.k8s.io/v1beta1\nkind: KubeletConfiguration\n\
                    containerRuntimeEndpoint: unix:///run/containerd/containerd.sock\ncgroupDriver: systemd\n";
    std::fs::write(&kubelet, original).unwrap();
    let before = snapshot(&root);

    install(&root, &[]);
    let once = snapshot(&root);
    install(&root, &[]);
    assert_eq!(snapshot(&root), once, "a second run changed the node");

    let config = std::fs::read_to_string(&kubelet).unwrap();
    assert!(
        config.contains("containerRuntimeEndpoint: unix:///run/crr-proxy/crr-proxy.sock\n"),
        "{config}"
    );
    assert!(
        config.contains("imageServiceEndpoint: unix:///run/crr-proxy/crr-proxy.sock\n"),
        "{config}"
    );
    assert!(
        config.contains("cgroupDriver: systemd\n"),
        "other settings are kept: {config}"
    );
    for file in [
        "usr/local/bin/crr-proxy",
        "etc/systemd/system/crr-proxy.socket",
        "etc/systemd/system/crr-proxy.service",
        "etc/crr-proxy/crr-proxy.env",
    ] {
        assert!(once.contains_key(file), "{file} not installed");
    }
    assert_eq!(once["usr/local/bin/crr-proxy"].0 & 0o777, 0o755);

    // The operator's settings survive a re-install.
    let env = root.join("etc/crr-proxy/crr-proxy.env");
    std::fs::write(&env, "CRR_PROXY_AGENT=kruise\n").unwrap();
    install(&root, &[]);
    assert_eq!(
        std::fs::read_to_string(&env).unwrap(),
        "CRR_PROXY_AGENT=kruise\n"
    );

    install(&root, &["--uninstall"]);
    let after: BTreeMap<_, _> = snapshot(&root)
        .into_iter()
        .filter(|(name, _)| !name.ends_with('/'))
        .collect();
    let before: BTreeMap<_, _> = before
        .into_iter()
        .filter(|(name, _)| !name.ends_with('/'))
        .collect();
    assert_eq!(after, before, "uninstall did not restore the node");
    support::remove_socket_dir(&socket);
}

#[test]
fn the_units_name_the_documented_socket_and_service_settings() {
    let socket = std::fs::read_to_string(concat!(
        env!("CARGO_MANIFEST_DIR"),
        "/systemd/crr-proxy.socket"
    ))
    .unwrap();
    for line in [
        "ListenStream=/run/crr-proxy/crr-proxy.sock",
        "SocketMode=0660",
    ] {
        assert!(
            socket.lines().any(|l| l == line),
            "socket unit lacks {line}"
        );
    }
    let service = std::fs::read_to_string(concat!(
        env!("CARGO_MANIFEST_DIR"),
        "/systemd/crr-proxy.service"
    ))
    .unwrap();
    for line in [
        "Type=notify",
        "Restart=always",
        "After=crr-proxy.socket containerd.service network-online.target",
        "Before=kubelet.service",
        "OOMScoreAdjust=-999",
        "ExecStart=/usr/local/bin/crr-proxy run",
        "InaccessiblePaths=-/etc/kubernetes -/var/lib/kubelet/pki",
    ] {
        assert!(
            service.lines().any(|l| l == line),
            "service unit lacks {line}"
        );
    }
}

#[test]
fn systemd_analyze_verifies_the_units_and_scores_their_hardening() {
    let scratch = support::temp_socket("verify");
    let dir = scratch.parent().unwrap();
    let units = concat!(env!("CARGO_MANIFEST_DIR"), "/systemd");
    std::fs::copy(
        format!("{units}/crr-proxy.socket"),
        dir.join("crr-proxy.socket"),
    )
    .unwrap();
    // verify checks that ExecStart exists: point it at the binary just built.
    let service = std::fs::read_to_string(format!("{units}/crr-proxy.service"))
        .unwrap()
        .replace(
            "ExecStart=/usr/local/bin/crr-proxy ",
            &format!("ExecStart={} ", env!("CARGO_BIN_EXE_crr-proxy")),
        );
    std::fs::write(dir.join("crr-proxy.service"), service).unwrap();
    let out = Command::new("systemd-analyze")
        .arg("verify")
        .arg(dir.join("crr-proxy.socket"))
        .arg(dir.join("crr-proxy.service"))
        .output()
        .expect("systemd-analyze (Debian's systemd package; scripts/test.sh installs it)");
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(
        out.status.success() && stderr.trim().is_empty(),
        "systemd-analyze verify: {stderr}"
    );
    // And with the drop-in of kubelet's identity, found beside the unit.
    let dropins = dir.join("crr-proxy.service.d");
    std::fs::create_dir_all(&dropins).unwrap();
    std::fs::copy(
        format!("{units}/kubelet-identity.conf"),
        dropins.join("kubelet-identity.conf"),
    )
    .unwrap();
    let out = Command::new("systemd-analyze")
        .arg("verify")
        .env("SYSTEMD_UNIT_PATH", format!("{}:", dir.display()))
        .arg(dir.join("crr-proxy.socket"))
        .arg(dir.join("crr-proxy.service"))
        .output()
        .unwrap();
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(
        out.status.success() && stderr.trim().is_empty(),
        "systemd-analyze verify with the drop-in: {stderr}"
    );
    std::fs::remove_dir_all(&dropins).unwrap();
    // systemd's own score of the hardening (0 is the most confined, 10
    // none): 2.2 before UMask=, PrivateMounts= and ProtectProc=, 1.8 after.
    let out = Command::new("systemd-analyze")
        .args(["security", "--offline=yes"])
        .arg(dir.join("crr-proxy.service"))
        .output()
        .unwrap();
    let report = String::from_utf8_lossy(&out.stdout);
    let score: f64 = report
        .lines()
        .find_map(|l| l.split_once("Overall exposure level for crr-proxy.service: "))
        .and_then(|(_, rest)| rest.split_whitespace().next()?.parse().ok())
        .unwrap_or_else(|| panic!("no overall exposure level:\n{report}"));
    assert!(score <= 1.8, "exposure {score}:\n{report}");
    support::remove_socket_dir(&scratch);
}

/// Stands in for kubectl: records the CSR, signs it with a test CA on
/// approval (as the kube-apiserver-client signer would), and answers the
/// current context's server and CA.
const KUBECTL_STUB: &str = r#"#!/bin/bash
set -euo pipefail
state="$STUB_STATE"
echo "$*" >>"$state/calls"
case "$*" in
  "delete certificatesigningrequest "*) ;;
  "create -f -") cat >"$state/csr.yaml" ;;
  "certificate approve "*)
    sed -n 's/^  request: //p' "$state/csr.yaml" | base64 -d >"$state/req.pem"
    openssl x509 -req -in "$state/req.pem" -CA "$state/ca.pem" -CAkey "$state/ca.key" \
      -days 1 -extfile <(printf 'keyUsage=digitalSignature\nextendedKeyUsage=clientAuth\n') \
      -out "$state/cert.pem" 2>/dev/null ;;
  "get certificatesigningrequest "*) base64 -w0 "$state/cert.pem" ;;
  *"jsonpath={.clusters[0].cluster.server}") printf https://10.0.0.1:6443 ;;
  *"jsonpath={.clusters[0].cluster.certificate-authority-data}") base64 -w0 "$state/ca.pem" ;;
  *) echo "kubectl stub: unexpected $*" >&2; exit 1 ;;
esac
"#;

fn run(program: &str, args: &[&str], envs: &[(&str, &Path)]) -> std::process::Output {
    let mut command = Command::new(program);
    command.args(args);
    for (key, value) in envs {
        command.env(key, value);
    }
    command.output().unwrap()
}

#[tokio::test]
async fn node_identity_issues_a_client_certificate_for_the_node() {
    use std::os::unix::fs::PermissionsExt;
    let scratch = support::temp_socket("identity");
    let dir = scratch.parent().unwrap().to_owned();
    let bin = dir.join("bin");
    std::fs::create_dir_all(&bin).unwrap();
    std::fs::write(bin.join("kubectl"), KUBECTL_STUB).unwrap();
    std::fs::set_permissions(bin.join("kubectl"), std::fs::Permissions::from_mode(0o755)).unwrap();
    let ca = run(
        "openssl",
        &[
            "req",
            "-x509",
            "-newkey",
            "ec",
            "-pkeyopt",
            "ec_paramgen_curve:P-256",
            "-nodes",
            "-subj",
            "/CN=test-ca",
            "-days",
            "1",
            "-keyout",
            dir.join("ca.key").to_str().unwrap(),
            "-out",
            dir.join("ca.pem").to_str().unwrap(),
        ],
        &[],
    );
    assert!(
        ca.status.success(),
        "{}",
        String::from_utf8_lossy(&ca.stderr)
    );
    let path = format!("{}:{}", bin.display(), std::env::var("PATH").unwrap());
    let script = concat!(env!("CARGO_MANIFEST_DIR"), "/scripts/node-identity.sh");
    let out_file = dir.join("node-x.kubeconfig");
    let issue = |node: &str| {
        run(
            script,
            &[node, "--out", out_file.to_str().unwrap()],
            &[("PATH", Path::new(&path)), ("STUB_STATE", &dir)],
        )
    };

    let first = issue("node-x");
    assert!(
        first.status.success(),
        "{}",
        String::from_utf8_lossy(&first.stderr)
    );
    assert_eq!(
        std::fs::metadata(&out_file).unwrap().permissions().mode() & 0o777,
        0o600
    );
    let csr = std::fs::read_to_string(dir.join("csr.yaml")).unwrap();
    for line in [
        "  name: crr-proxy-node-x",
        "  signerName: kubernetes.io/kube-apiserver-client",
        "  expirationSeconds: 31536000",
        "  usages: [\"digital signature\", \"client auth\"]",
    ] {
        assert!(csr.lines().any(|l| l == line), "CSR lacks {line:?}:\n{csr}");
    }
    let subject = run(
        "openssl",
        &[
            "x509",
            "-in",
            dir.join("cert.pem").to_str().unwrap(),
            "-noout",
            "-subject",
        ],
        &[],
    );
    assert_eq!(
        String::from_utf8_lossy(&subject.stdout).trim(),
        "subject=O = crr-proxy:nodes, CN = crr-proxy:node:node-x"
    );

    // kube (as crr-proxy uses it) reads the kubeconfig and loads the identity.
    let kubeconfig = kube::config::Kubeconfig::read_from(&out_file).unwrap();
    let config = kube::Config::from_custom_kubeconfig(kubeconfig, &Default::default())
        .await
        .unwrap();
    assert_eq!(config.cluster_url.to_string(), "https://10.0.0.1:6443/");
    assert!(
        config
            .root_cert
            .as_ref()
            .is_some_and(|certs| certs.len() == 1)
    );
    kube::Client::try_from(config).expect("a client with the node's certificate and key");

    // Re-issuing replaces the old CSR; a name that is no node name is refused.
    assert!(issue("node-x").status.success());
    let calls = std::fs::read_to_string(dir.join("calls")).unwrap();
    let deletes = calls
        .lines()
        .filter(|l| l.starts_with("delete certificatesigningrequest crr-proxy-node-x"))
        .count();
    assert_eq!(deletes, 2, "{calls}");
    let bad = issue("Node X; rm -rf /");
    assert_eq!(bad.status.code(), Some(2));
    support::remove_socket_dir(&scratch);
}

#[test]
fn installs_the_node_identity_and_names_it_in_the_settings() {
    use std::os::unix::fs::PermissionsExt;
    let scratch = support::temp_socket("install-identity");
    let root = scratch.parent().unwrap().join("root");
    std::fs::create_dir_all(&root).unwrap();
    let identity = scratch.parent().unwrap().join("node.kubeconfig");
    std::fs::write(&identity, "apiVersion: v1\nkind: Config\n").unwrap();
    let before = snapshot(&root);

    install(&root, &["--kubeconfig", identity.to_str().unwrap()]);
    let once = snapshot(&root);
    install(&root, &["--kubeconfig", identity.to_str().unwrap()]);
    assert_eq!(snapshot(&root), once, "a second run changed the node");
    let installed = root.join("etc/crr-proxy/kubeconfig");
    assert_eq!(
        std::fs::read(&installed).unwrap(),
        std::fs::read(&identity).unwrap()
    );
    assert_eq!(
        std::fs::metadata(&installed).unwrap().permissions().mode() & 0o777,
        0o600
    );
    let env = std::fs::read_to_string(root.join("etc/crr-proxy/crr-proxy.env")).unwrap();
    assert_eq!(
        env.lines()
            .filter(|l| *l == "CRR_PROXY_KUBECONFIG=/etc/crr-proxy/kubeconfig")
            .count(),
        1,
        "{env}"
    );

    install(&root, &["--uninstall"]);
    let files = |s: BTreeMap<String, (u32, Vec<u8>)>| -> Vec<String> {
        s.into_keys().filter(|n| !n.ends_with('/')).collect()
    };
    assert_eq!(files(snapshot(&root)), files(before));
    support::remove_socket_dir(&scratch);
}

/// `--identity kubelet` names kubelet's kubeconfig and installs the drop-in
/// that opens it to the service; `--kubeconfig FILE` goes back to
/// crr-proxy's own identity; both at once are refused.
#[test]
fn kubelets_identity_is_named_with_its_drop_in_and_replaced_by_an_own_one() {
    let scratch = support::temp_socket("install-kubelet-identity");
    let root = scratch.parent().unwrap().join("root");
    std::fs::create_dir_all(&root).unwrap();
    let before = snapshot(&root);
    let env = || std::fs::read_to_string(root.join("etc/crr-proxy/crr-proxy.env")).unwrap();
    let kubeconfigs = |env: &str| -> Vec<String> {
        env.lines()
            .filter(|l| l.starts_with("CRR_PROXY_KUBECONFIG="))
            .map(str::to_owned)
            .collect()
    };
    let dropin = root.join("etc/systemd/system/crr-proxy.service.d/kubelet-identity.conf");

    let said = install(&root, &["--identity", "kubelet"]);
    assert!(
        said.contains("/etc/kubernetes/kubelet.conf does not exist"),
        "{said}"
    );
    let once = snapshot(&root);
    install(&root, &["--identity", "kubelet"]);
    assert_eq!(snapshot(&root), once, "a second run changed the node");
    assert_eq!(
        kubeconfigs(&env()),
        ["CRR_PROXY_KUBECONFIG=/etc/kubernetes/kubelet.conf"]
    );
    assert_eq!(
        std::fs::read_to_string(&dropin).unwrap(),
        include_str!("../systemd/kubelet-identity.conf")
    );

    // Back to an identity of its own, from a line the operator quoted.
    let env_file = root.join("etc/crr-proxy/crr-proxy.env");
    let quoted = env().replace(
        "CRR_PROXY_KUBECONFIG=/etc/kubernetes/kubelet.conf",
        "CRR_PROXY_KUBECONFIG=\"/etc/kubernetes/kubelet.conf\"",
    );
    std::fs::write(&env_file, quoted).unwrap();
    let own = scratch.parent().unwrap().join("node.kubeconfig");
    std::fs::write(&own, "apiVersion: v1\nkind: Config\n").unwrap();
    install(&root, &["--kubeconfig", own.to_str().unwrap()]);
    assert_eq!(
        kubeconfigs(&env()),
        ["CRR_PROXY_KUBECONFIG=/etc/crr-proxy/kubeconfig"]
    );
    assert!(!dropin.exists());

    let both = install_sh(&root)
        .args([
            "--identity",
            "kubelet",
            "--kubeconfig",
            own.to_str().unwrap(),
        ])
        .output()
        .unwrap();
    assert_eq!(both.status.code(), Some(2));
    assert!(String::from_utf8_lossy(&both.stderr).contains("give one"));

    install(&root, &["--identity", "kubelet"]);
    install(&root, &["--uninstall"]);
    let files = |s: BTreeMap<String, (u32, Vec<u8>)>| -> Vec<String> {
        s.into_keys().filter(|n| !n.ends_with('/')).collect()
    };
    assert_eq!(files(snapshot(&root)), files(before));
    assert!(!dropin.parent().unwrap().exists());
    support::remove_socket_dir(&scratch);
}

/// A scratch root holding kubelet configuration files at `files`.
fn node_with(name: &str, files: &[(&str, &str)]) -> (PathBuf, PathBuf) {
    let socket = support::temp_socket(name);
    let root = socket.parent().unwrap().join("root");
    for (path, text) in files {
        let path = root.join(path);
        std::fs::create_dir_all(path.parent().unwrap()).unwrap();
        std::fs::write(path, text).unwrap();
    }
    (socket, root)
}

const KUBELET: &str = "var/lib/kubelet/config.yaml";
const SWITCHED: &str = "containerRuntimeEndpoint: unix:///run/crr-proxy/crr-proxy.sock\n\
                        imageServiceEndpoint: unix:///run/crr-proxy/crr-proxy.sock\n";

#[test]
fn a_plain_uninstall_restores_the_file_the_install_edited() {
    let other = "kind: KubeletConfiguration\ncontainerRuntimeEndpoint: unix:///run/containerd/containerd.sock\n";
    let default = "kind: KubeletConfiguration\nmaxPods: 50\n";
    let (socket, root) = node_with(
        "install-other",
        &[("etc/kubernetes/kubelet.yaml", other), (KUBELET, default)],
    );
    install(&root, &["--kubelet-config", "/etc/kubernetes/kubelet.yaml"]);
    let edited = std::fs::read_to_string(root.join("etc/kubernetes/kubelet.yaml")).unwrap();
    assert!(
        edited.contains(SWITCHED.lines().next().unwrap()),
        "{edited}"
    );
    // Another file while this one is switched is refused, not half-done.
    let out = install_sh(&root)
        .args(["--binary", env!("CARGO_BIN_EXE_crr-proxy")])
        .output()
        .unwrap();
    assert!(!out.status.success(), "a second kubelet file was switched");
    assert!(
        String::from_utf8_lossy(&out.stderr).contains("run --uninstall first"),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );

    install(&root, &["--uninstall"]);
    assert_eq!(
        std::fs::read_to_string(root.join("etc/kubernetes/kubelet.yaml")).unwrap(),
        other
    );
    assert_eq!(
        std::fs::read_to_string(root.join(KUBELET)).unwrap(),
        default,
        "the default file was written over"
    );
    assert!(!root.join("etc/crr-proxy").exists(), "settings left behind");
    support::remove_socket_dir(&socket);
}

#[test]
fn a_config_without_its_final_newline_is_switched_and_restored_exactly() {
    let original = "kind: KubeletConfiguration\ncgroupDriver: systemd";
    let (socket, root) = node_with("install-newline", &[(KUBELET, original)]);
    install(&root, &[]);
    let switched = std::fs::read_to_string(root.join(KUBELET)).unwrap();
    assert_eq!(switched, format!("{original}\n{SWITCHED}"));
    install(&root, &["--uninstall"]);
    assert_eq!(
        std::fs::read_to_string(root.join(KUBELET)).unwrap(),
        original
    );
    support::remove_socket_dir(&socket);
}

#[test]
fn uninstall_restores_the_endpoints_in_the_configuration_as_it_is_now() {
    let original = "kind: KubeletConfiguration\n\
                    containerRuntimeEndpoint: unix:///run/containerd/containerd.sock\n";
    let (socket, root) = node_with("install-current", &[(KUBELET, original)]);
    let first = install(&root, &[]);
    assert!(first.contains("pointed kubelet"), "{first}");
    let again = install(&root, &[]);
    assert!(
        again.contains("kubelet is not restarted") && !again.contains("pointed kubelet"),
        "a run that changed nothing would restart kubelet: {again}"
    );
    // Changed after the install, as `kubeadm upgrade node` rewrites it.
    let file = root.join(KUBELET);
    let mut now = std::fs::read_to_string(&file).unwrap();
    now.push_str("maxPods: 50\n");
    std::fs::write(&file, &now).unwrap();

    install(&root, &["--uninstall"]);
    assert_eq!(
        std::fs::read_to_string(&file).unwrap(),
        format!("{original}maxPods: 50\n"),
        "the later change is lost, or crr-proxy's endpoints stay"
    );
    support::remove_socket_dir(&socket);
}

// kubelet's endpoints on kubeadm's layouts. The helpers below do to the
// scratch root what kubeadm and kubelet do on a node, so that each test can
// ask what kubelet would use after the install, after an upgrade and after
// the uninstall.

const SOCKET: &str = "unix:///run/crr-proxy/crr-proxy.sock";
const CONTAINERD: &str = "unix:///var/run/containerd/containerd.sock";
const FLAGS: &str = "var/lib/kubelet/kubeadm-flags.env";
const INSTANCE: &str = "var/lib/kubelet/instance-config.yaml";
const DEFAULTS: &str = "etc/default/kubelet";
/// What the kubelet-config ConfigMap holds: kubeadm writes it as config.yaml.
const CONFIG_MAP: &str = "apiVersion: kubelet.config.k8s.io/v1beta1\nkind: KubeletConfiguration\n\
                          cgroupDriver: systemd\n";

/// The top-level scalar `key` of a YAML text, unquoted.
fn yaml_value(text: &str, key: &str) -> Option<String> {
    text.lines()
        .find_map(|l| l.strip_prefix(&format!("{key}:")))
        .map(|v| v.trim().trim_matches('"').to_owned())
}

/// The value of the last `--flag=value` or `--flag value` in `text`.
fn flag_value(text: &str, flag: &str) -> Option<String> {
    let words: Vec<&str> = text
        .split(|c: char| c.is_whitespace() || c == '"' || c == '=')
        .filter(|w| !w.is_empty())
        .collect();
    words
        .windows(2)
        .filter(|w| w[0] == flag)
        .map(|w| w[1].to_owned())
        .next_back()
}

fn read(root: &Path, rel: &str) -> String {
    std::fs::read_to_string(root.join(rel)).unwrap_or_default()
}

/// The endpoint kubelet would use for `key`: its --config file, then the
/// drop-ins of its --config-dir in lexical order, then its flags, last wins
/// (cmd/kubelet/app/server.go); the image endpoint defaults to the runtime's.
fn effective(root: &Path, key: &str) -> Option<String> {
    let flags = format!("{}\n{}", read(root, FLAGS), read(root, DEFAULTS));
    let flag = match key {
        "containerRuntimeEndpoint" => "--container-runtime-endpoint",
        _ => "--image-service-endpoint",
    };
    let mut value = yaml_value(&read(root, KUBELET), key);
    if let Some(dir) = flag_value(&flags, "--config-dir") {
        let dir = root.join(dir.trim_start_matches('/'));
        let mut dropins: Vec<PathBuf> = std::fs::read_dir(dir)
            .map(|d| d.flatten().map(|e| e.path()).collect())
            .unwrap_or_default();
        dropins.retain(|p| p.extension().is_some_and(|e| e == "conf"));
        dropins.sort();
        for dropin in dropins {
            if let Some(v) = yaml_value(&std::fs::read_to_string(dropin).unwrap(), key) {
                value = Some(v);
            }
        }
    }
    if let Some(v) = flag_value(&flags, flag) {
        value = Some(v);
    }
    match value {
        None if key == "imageServiceEndpoint" => effective(root, "containerRuntimeEndpoint"),
        value => value,
    }
}

fn kubelet_uses(root: &Path, endpoint: &str) {
    for key in ["containerRuntimeEndpoint", "imageServiceEndpoint"] {
        assert_eq!(
            effective(root, key).as_deref(),
            Some(endpoint),
            "{key}; flags: {:?}, config.yaml: {:?}, instance-config.yaml: {:?}",
            read(root, FLAGS),
            read(root, KUBELET),
            read(root, INSTANCE)
        );
    }
}

/// `kubeadm upgrade node`: config.yaml written again from the ConfigMap,
/// with instance-config.yaml merged in where the node has one; with
/// NodeLocalCRISocket (1.34+) and no instance-config.yaml yet, the flag's
/// value moves there first (cmd/kubeadm/app/phases/upgrade/postupgrade.go,
/// WriteKubeletConfigFiles; phases/kubelet/config.go, WriteConfigToDisk).
fn kubeadm_upgrade(root: &Path, node_local_cri_socket: bool) {
    let flags = read(root, FLAGS);
    if node_local_cri_socket && !root.join(INSTANCE).exists() {
        if let Some(endpoint) = flag_value(&flags, "--container-runtime-endpoint") {
            let kept: Vec<&str> = flags
                .trim_start_matches("KUBELET_KUBEADM_ARGS=\"")
                .trim_end_matches(['"', '\n'])
                .split(' ')
                .filter(|w| !w.starts_with("--container-runtime-endpoint"))
                .collect();
            std::fs::write(
                root.join(FLAGS),
                format!("KUBELET_KUBEADM_ARGS=\"{}\"\n", kept.join(" ")),
            )
            .unwrap();
            std::fs::write(
                root.join(INSTANCE),
                format!("containerRuntimeEndpoint: \"{endpoint}\"\n"),
            )
            .unwrap();
        }
    }
    let mut config = CONFIG_MAP.to_owned();
    if let Some(endpoint) = yaml_value(&read(root, INSTANCE), "containerRuntimeEndpoint") {
        config.push_str(&format!("containerRuntimeEndpoint: {endpoint}\n"));
    }
    std::fs::write(root.join(KUBELET), config).unwrap();
}

/// No file under `root` names crr-proxy's socket.
fn nothing_names_the_socket(root: &Path) {
    for (name, (_, bytes)) in snapshot(root) {
        assert!(
            !String::from_utf8_lossy(&bytes).contains(SOCKET),
            "{name} still names the socket"
        );
    }
}

#[test]
fn kubeadm_flags_env_the_flag_is_switched_where_it_stands_and_survives_upgrades() {
    let flags = format!(
        "KUBELET_KUBEADM_ARGS=\"--container-runtime-endpoint={CONTAINERD} --node-ip=10.0.0.5\"\n"
    );
    let (socket, root) = node_with("install-flags", &[(FLAGS, &flags), (KUBELET, CONFIG_MAP)]);
    let before = snapshot(&root);
    kubelet_uses(&root, CONTAINERD);

    install(&root, &[]);
    kubelet_uses(&root, SOCKET);
    assert_eq!(
        read(&root, FLAGS),
        format!(
            "KUBELET_KUBEADM_ARGS=\"--container-runtime-endpoint={SOCKET} --node-ip=10.0.0.5\"\n"
        )
    );
    assert_eq!(
        read(&root, KUBELET),
        CONFIG_MAP,
        "the flag wins: config.yaml is left alone"
    );
    let once = snapshot(&root);
    install(&root, &[]);
    assert_eq!(snapshot(&root), once, "a second run changed the node");

    // Uninstalled before any upgrade: the node as it was, byte for byte.
    install(&root, &["--uninstall"]);
    assert_eq!(
        snapshot(&root)
            .into_iter()
            .filter(|(n, _)| !n.ends_with('/'))
            .collect::<BTreeMap<_, _>>(),
        before
            .into_iter()
            .filter(|(n, _)| !n.ends_with('/'))
            .collect::<BTreeMap<_, _>>()
    );

    // An upgrade before 1.34 keeps the flags file; 1.34+ moves the flag
    // into instance-config.yaml. kubelet stays on the socket either way, and
    // the uninstall puts containerd back wherever kubeadm moved it.
    install(&root, &[]);
    kubeadm_upgrade(&root, false);
    kubelet_uses(&root, SOCKET);
    kubeadm_upgrade(&root, true);
    assert!(!read(&root, FLAGS).contains("--container-runtime-endpoint"));
    kubelet_uses(&root, SOCKET);
    install(&root, &["--uninstall"]);
    kubelet_uses(&root, CONTAINERD);
    nothing_names_the_socket(&root);
    support::remove_socket_dir(&socket);
}

#[test]
fn instance_config_yaml_is_switched_so_that_kubeadm_merges_the_socket_back() {
    let instance = format!("containerRuntimeEndpoint: \"{CONTAINERD}\"\n");
    let merged = format!("{CONFIG_MAP}containerRuntimeEndpoint: {CONTAINERD}\n");
    let flags = "KUBELET_KUBEADM_ARGS=\"--node-ip=10.0.0.5\"\n";
    let (socket, root) = node_with(
        "install-instance",
        &[(INSTANCE, &instance), (KUBELET, &merged), (FLAGS, flags)],
    );
    let before = snapshot(&root);

    install(&root, &[]);
    kubelet_uses(&root, SOCKET);
    assert_eq!(
        read(&root, INSTANCE),
        format!("containerRuntimeEndpoint: {SOCKET}\n")
    );
    kubeadm_upgrade(&root, true);
    kubelet_uses(&root, SOCKET);

    install(&root, &["--uninstall"]);
    kubelet_uses(&root, CONTAINERD);
    nothing_names_the_socket(&root);
    assert_eq!(
        read(&root, INSTANCE),
        instance,
        "instance-config.yaml as it was"
    );

    // Without an upgrade in between: byte for byte.
    install(&root, &[]);
    install(&root, &["--uninstall"]);
    let files = |s: BTreeMap<String, (u32, Vec<u8>)>| -> BTreeMap<_, _> {
        s.into_iter().filter(|(n, _)| !n.ends_with('/')).collect()
    };
    assert_eq!(files(snapshot(&root)), files(before));
    support::remove_socket_dir(&socket);
}

#[test]
fn a_config_dir_gets_a_drop_in_of_its_own_and_config_yaml_is_left_alone() {
    let config = format!(
        "{CONFIG_MAP}containerRuntimeEndpoint: {CONTAINERD}\nimageServiceEndpoint: {CONTAINERD}\n"
    );
    let defaults = "KUBELET_EXTRA_ARGS=--config-dir=/etc/kubernetes/kubelet.conf.d\n";
    let (socket, root) = node_with(
        "install-dropin",
        &[(KUBELET, &config), (DEFAULTS, defaults)],
    );
    let before = snapshot(&root);

    install(&root, &[]);
    kubelet_uses(&root, SOCKET);
    assert_eq!(read(&root, KUBELET), config);
    assert!(
        root.join("etc/kubernetes/kubelet.conf.d/99-crr-proxy.conf")
            .exists()
    );
    // kubeadm rewrites config.yaml; the drop-in still wins over it.
    kubeadm_upgrade(&root, true);
    kubelet_uses(&root, SOCKET);
    std::fs::write(root.join(KUBELET), &config).unwrap();

    install(&root, &["--uninstall"]);
    kubelet_uses(&root, CONTAINERD);
    let files = |s: BTreeMap<String, (u32, Vec<u8>)>| -> BTreeMap<_, _> {
        s.into_iter().filter(|(n, _)| !n.ends_with('/')).collect()
    };
    assert_eq!(files(snapshot(&root)), files(before));
    support::remove_socket_dir(&socket);
}

#[test]
fn extra_args_flags_in_either_spelling_are_switched_and_put_back_exactly() {
    let flags = format!("KUBELET_KUBEADM_ARGS=\"--container-runtime-endpoint={CONTAINERD}\"\n");
    let defaults = format!(
        "KUBELET_EXTRA_ARGS=\"--container-runtime-endpoint {CONTAINERD} --image-service-endpoint={CONTAINERD}\"\n"
    );
    let (socket, root) = node_with(
        "install-extra",
        &[
            (FLAGS, &flags),
            (DEFAULTS, &defaults),
            (KUBELET, CONFIG_MAP),
        ],
    );
    let before = snapshot(&root);
    install(&root, &[]);
    kubelet_uses(&root, SOCKET);
    assert_eq!(
        read(&root, DEFAULTS),
        format!(
            "KUBELET_EXTRA_ARGS=\"--container-runtime-endpoint={SOCKET} --image-service-endpoint={SOCKET}\"\n"
        )
    );
    install(&root, &["--uninstall"]);
    assert_eq!(read(&root, DEFAULTS), defaults);
    assert_eq!(read(&root, FLAGS), flags);
    let files = |s: BTreeMap<String, (u32, Vec<u8>)>| -> BTreeMap<_, _> {
        s.into_iter().filter(|(n, _)| !n.ends_with('/')).collect()
    };
    assert_eq!(files(snapshot(&root)), files(before));
    support::remove_socket_dir(&socket);
}

#[test]
fn an_install_made_with_the_old_backup_is_uninstalled_from_it() {
    // Before the record, the install kept a copy of config.yaml and its path.
    let original = format!("{CONFIG_MAP}containerRuntimeEndpoint: {CONTAINERD}\n");
    let switched =
        format!("{CONFIG_MAP}containerRuntimeEndpoint: {SOCKET}\nimageServiceEndpoint: {SOCKET}\n");
    let (socket, root) = node_with(
        "install-old",
        &[
            (KUBELET, &switched),
            ("etc/crr-proxy/kubelet-config.orig", &original),
            (
                "etc/crr-proxy/kubelet-config.path",
                "/var/lib/kubelet/config.yaml\n",
            ),
        ],
    );
    install(&root, &["--uninstall"]);
    assert_eq!(read(&root, KUBELET), original);
    assert!(
        !root.join("etc/crr-proxy").exists(),
        "the old backup is left behind"
    );
    support::remove_socket_dir(&socket);
}

/// A node without a kubelet configuration: the install says what to set
/// and never that kubelet already points at crr-proxy; `--kubelet-only`,
/// which exists to switch kubelet, fails.
#[test]
fn without_a_kubelet_configuration_nothing_claims_kubelet_was_switched() {
    let (socket, root) = node_with("no-kubelet", &[("etc/hostname", "node-a\n")]);
    let said = install(&root, &[]);
    assert!(
        said.contains("no /var/lib/kubelet/config.yaml: set kubelet's"),
        "{said}"
    );
    assert!(!said.contains("already points"), "{said}");
    let out = install_sh(&root).arg("--kubelet-only").output().unwrap();
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(!out.status.success(), "{stderr}");
    assert!(stderr.contains("kubelet is not switched"), "{stderr}");
    support::remove_socket_dir(&socket);
}

/// kubelet reads JSON as well as YAML (EKS AL2023's nodeadm writes
/// config.json): install.sh never edits one, says what to do instead, and
/// `--kubelet-only` fails; the same for YAML in flow style. Given a
/// --config-dir, its drop-in switches kubelet and the file stays as it is.
#[test]
fn a_json_configuration_is_never_edited_and_a_config_dir_switches_kubelet() {
    const CONFIG: &str = "/etc/kubernetes/kubelet/config.json";
    let json = format!(
        "{{\n  \"apiVersion\": \"kubelet.config.k8s.io/v1beta1\",\n  \"kind\": \"KubeletConfiguration\",\n  \"containerRuntimeEndpoint\": \"{CONTAINERD}\"\n}}\n"
    );
    let flow = format!(
        "# kubelet\n{{kind: KubeletConfiguration, containerRuntimeEndpoint: {CONTAINERD}}}\n"
    );
    for (name, text) in [("install-json", &json), ("install-flow", &flow)] {
        let rel = CONFIG.trim_start_matches('/');
        let (socket, root) = node_with(name, &[(rel, text)]);
        let said = install(&root, &["--kubelet-config", CONFIG]);
        assert!(said.contains("is JSON (or YAML in flow style)"), "{said}");
        assert_eq!(&read(&root, rel), text, "the configuration was edited");
        assert!(!root.join("etc/crr-proxy/kubelet-switch").exists());
        let out = install_sh(&root)
            .args(["--kubelet-only", "--kubelet-config", CONFIG])
            .output()
            .unwrap();
        let stderr = String::from_utf8_lossy(&out.stderr);
        assert!(!out.status.success(), "{stderr}");
        assert!(stderr.contains("kubelet is not switched"), "{stderr}");
        assert_eq!(&read(&root, rel), text, "the configuration was edited");

        // With a --config-dir, as nodeadm gives kubelet, the drop-in does it.
        std::fs::create_dir_all(root.join("etc/default")).unwrap();
        std::fs::write(
            root.join(DEFAULTS),
            "KUBELET_EXTRA_ARGS=--config-dir=/etc/kubernetes/kubelet/config.json.d\n",
        )
        .unwrap();
        install(&root, &["--kubelet-config", CONFIG]);
        assert_eq!(&read(&root, rel), text, "the configuration was edited");
        kubelet_uses(&root, SOCKET);
        install(&root, &["--uninstall", "--kubelet-config", CONFIG]);
        assert_eq!(&read(&root, rel), text);
        assert!(
            !root
                .join("etc/kubernetes/kubelet/config.json.d/99-crr-proxy.conf")
                .exists()
        );
        support::remove_socket_dir(&socket);
    }
}

/// A setting in `root`'s crr-proxy.env.
fn setting(root: &Path, name: &str) -> Option<String> {
    read(root, "etc/crr-proxy/crr-proxy.env")
        .lines()
        .find_map(|l| l.strip_prefix(&format!("{name}=")).map(str::to_owned))
}

/// kubelet's files in `root`: the flags files, its configuration files and
/// drop-ins, with their contents.
fn kubelet_files(root: &Path) -> BTreeMap<String, (u32, Vec<u8>)> {
    snapshot(root)
        .into_iter()
        .filter(|(name, _)| {
            !name.ends_with('/')
                && !name.starts_with("etc/crr-proxy")
                && !name.starts_with("usr/")
                && !name.starts_with("etc/systemd")
        })
        .collect()
}

/// crr-proxy forwards to the runtime kubelet used before the switch,
/// wherever kubelet took it from (a flag over its files, a drop-in over
/// --config, a bare path, an image endpoint of its own, kubelet's default).
/// Once kubelet dials crr-proxy, the settings are the operator's. The
/// bypass puts kubelet's files back byte for byte and keeps crr-proxy with
/// its settings; --kubelet-only undoes it.
#[test]
fn the_runtime_kubelet_used_is_carried_into_crr_proxys_settings() {
    const CRIO: &str = "unix:///var/run/crio/crio.sock";
    let with_containerd =
        format!("kind: KubeletConfiguration\ncontainerRuntimeEndpoint: {CONTAINERD}\n");
    // A node's kubelet files, and the endpoints crr-proxy must forward to.
    let cases = [
        (
            "carry-flag",
            vec![
                (
                    FLAGS,
                    format!("KUBELET_KUBEADM_ARGS=\"--container-runtime-endpoint={CRIO}\"\n"),
                ),
                (KUBELET, with_containerd.clone()),
            ],
            (CRIO, None),
        ),
        (
            "carry-config",
            vec![(
                KUBELET,
                "kind: KubeletConfiguration\ncontainerRuntimeEndpoint: /run/k3s/containerd/containerd.sock\n\
                 imageServiceEndpoint: \"unix:///run/images.sock\"\n"
                    .to_owned(),
            )],
            (
                "unix:///run/k3s/containerd/containerd.sock",
                Some("unix:///run/images.sock"),
            ),
        ),
        (
            "carry-dropin",
            vec![
                (
                    DEFAULTS,
                    "KUBELET_EXTRA_ARGS=--config-dir=/etc/kubernetes/kubelet.conf.d\n".to_owned(),
                ),
                (
                    "etc/kubernetes/kubelet.conf.d/50-runtime.conf",
                    format!("containerRuntimeEndpoint: {CRIO}\n"),
                ),
                (KUBELET, with_containerd.clone()),
            ],
            (CRIO, None),
        ),
        (
            "carry-default",
            vec![(KUBELET, "kind: KubeletConfiguration\nmaxPods: 50\n".to_owned())],
            ("unix:///run/containerd/containerd.sock", None),
        ),
    ];
    for (name, files, (runtime, image)) in cases {
        let files: Vec<(&str, &str)> = files.iter().map(|(p, t)| (*p, t.as_str())).collect();
        let (socket, root) = node_with(name, &files);
        let before = kubelet_files(&root);
        let said = install(&root, &[]);
        assert_eq!(
            setting(&root, "CRR_PROXY_RUNTIME_ENDPOINT").as_deref(),
            Some(runtime),
            "{name}: {said}"
        );
        assert_eq!(
            setting(&root, "CRR_PROXY_IMAGE_ENDPOINT").as_deref(),
            image,
            "{name}: {said}"
        );
        kubelet_uses(&root, SOCKET);

        // Switched, the settings are the operator's.
        let env = root.join("etc/crr-proxy/crr-proxy.env");
        let edited = read(&root, "etc/crr-proxy/crr-proxy.env")
            .replace(runtime, "unix:///run/operator.sock");
        std::fs::write(&env, &edited).unwrap();
        install(&root, &[]);
        assert_eq!(read(&root, "etc/crr-proxy/crr-proxy.env"), edited, "{name}");

        // The bypass and its inverse.
        let installed = snapshot(&root);
        install(&root, &["--bypass"]);
        assert_eq!(kubelet_files(&root), before, "{name}: the bypass");
        let after: BTreeMap<_, _> = snapshot(&root)
            .into_iter()
            .filter(|(n, _)| {
                n.starts_with("usr/")
                    || n.starts_with("etc/systemd")
                    || n == "etc/crr-proxy/crr-proxy.env"
            })
            .collect();
        for (file, content) in &after {
            assert_eq!(
                Some(content),
                installed.get(file),
                "{name}: the bypass changed {file}"
            );
        }
        assert!(after.contains_key("usr/local/bin/crr-proxy"), "{name}");
        install(&root, &["--kubelet-only"]);
        kubelet_uses(&root, SOCKET);
        install(&root, &["--uninstall"]);
        assert_eq!(kubelet_files(&root), before, "{name}: the uninstall");
        support::remove_socket_dir(&socket);
    }
}

/// k3s and RKE2 run kubelet inside their binary beside a containerd of
/// their own, which they turn off once container-runtime-endpoint points
/// elsewhere: install.sh refuses, naming why, and changes nothing.
#[test]
fn k3s_and_rke2_nodes_are_refused_before_anything_changes() {
    for distro in ["k3s", "rke2"] {
        let (socket, root) = node_with(
            &format!("install-{distro}"),
            &[(
                &format!("etc/rancher/{distro}/config.yaml"),
                "write-kubeconfig-mode: \"0644\"\n",
            )],
        );
        let before = snapshot(&root);
        for args in [&[][..], &["--kubelet-only"]] {
            let out = install_sh(&root)
                .args(["--binary", env!("CARGO_BIN_EXE_crr-proxy")])
                .args(args)
                .output()
                .unwrap();
            let stderr = String::from_utf8_lossy(&out.stderr);
            assert!(!out.status.success(), "{distro} {args:?}: {stderr}");
            assert!(
                stderr.contains(&format!("this node runs {distro}"))
                    && stderr.contains("nothing was changed"),
                "{stderr}"
            );
            assert_eq!(
                snapshot(&root),
                before,
                "{distro} {args:?} changed the node"
            );
        }
        support::remove_socket_dir(&socket);
    }
}

/// A runtime flag on kubelet's own command line, as EKS AL2023's nodeadm
/// writes it on kubelet.service's ExecStart, or as a drop-in of a kubelet
/// unit under another name (`--kubelet-unit`) gives it: it wins over every
/// file install.sh edits, so kubelet is left as it is, with the way out
/// named, and `--kubelet-only` fails. crr-proxy still forwards to that
/// endpoint.
#[test]
fn a_runtime_flag_in_kubelets_unit_is_never_overridden_by_a_file() {
    const CONFIG: &str = "/etc/kubernetes/kubelet/config.json";
    let unit = "[Service]\nEnvironmentFile=/etc/eks/kubelet/environment\n\
                ExecStart=/usr/bin/kubelet \\\n    --config /etc/kubernetes/kubelet/config.json \\\n    \
                --container-runtime-endpoint unix:///run/eks/containerd.sock \\\n    $NODEADM_KUBELET_ARGS\n";
    let plain =
        "[Service]\nExecStart=/opt/bin/kubelet --config /etc/kubernetes/kubelet/config.json\n";
    let dropin = "[Service]\nExecStart=\nExecStart=/opt/bin/kubelet --config /etc/kubernetes/kubelet/config.json \
                  --container-runtime-endpoint=unix:///run/eks/containerd.sock\n";
    let json = "{\"kind\": \"KubeletConfiguration\", \"maxPods\": 29}\n";
    // Each: its name, kubelet's unit files, install.sh's arguments, and
    // the file the refusal names.
    type Layout<'a> = (&'a str, Vec<(&'a str, &'a str)>, &'a [&'a str], &'a str);
    let layouts: [Layout<'_>; 2] = [
        (
            "install-nodeadm",
            vec![("etc/systemd/system/kubelet.service", unit)],
            &[],
            "/etc/systemd/system/kubelet.service sets",
        ),
        (
            "install-unit-name",
            vec![
                ("usr/lib/systemd/system/node-kubelet.service", plain),
                (
                    "etc/systemd/system/node-kubelet.service.d/20-runtime.conf",
                    dropin,
                ),
            ],
            &["--kubelet-unit", "node-kubelet.service"],
            "/etc/systemd/system/node-kubelet.service.d/20-runtime.conf sets",
        ),
    ];
    for (name, mut files, args, said_by) in layouts {
        files.push((CONFIG.trim_start_matches('/'), json));
        let (socket, root) = node_with(name, &files);
        let kubelet_before = kubelet_files(&root);
        let mut all = vec!["--kubelet-config", CONFIG];
        all.extend(args);
        let said = install(&root, &all);
        assert!(
            said.contains(&format!("{said_by} kubelet's --container-runtime-endpoint")),
            "{name}: {said}"
        );
        assert_eq!(
            kubelet_files(&root),
            kubelet_before,
            "{name}: kubelet's files were edited"
        );
        assert_eq!(
            setting(&root, "CRR_PROXY_RUNTIME_ENDPOINT").as_deref(),
            Some("unix:///run/eks/containerd.sock"),
            "{name}"
        );
        let out = install_sh(&root)
            .arg("--kubelet-only")
            .args(&all)
            .output()
            .unwrap();
        assert!(
            !out.status.success(),
            "{name}: {}",
            String::from_utf8_lossy(&out.stderr)
        );
        assert_eq!(kubelet_files(&root), kubelet_before, "{name}");
        support::remove_socket_dir(&socket);
    }
}

/// Where /usr is read-only (Flatcar), the binary goes to /opt/bin and the
/// installed unit runs it from there; a re-run keeps it there and the
/// uninstall removes it. On a writable /usr, /usr/local/bin as before.
#[test]
fn a_read_only_usr_gets_the_binary_in_opt_bin() {
    let (socket, root) = node_with(
        "install-flatcar",
        &[
            (KUBELET, "kind: KubeletConfiguration\n"),
            ("usr/local/bin/.keep", ""),
        ],
    );
    // install.sh with $root/usr mounted read-only, in a mount namespace of
    // its own.
    let read_only = |args: &[&str]| {
        let mut command = Command::new("unshare");
        command
            .args(["--mount", "--propagation", "private", "bash", "-c"])
            .arg(
                "set -e; mount --bind \"$1\" \"$1\"; mount -o remount,bind,ro \"$1\"; \
                 if touch \"$1/local/bin/probe\" 2>/dev/null; then echo \"$1 is writable\" >&2; exit 9; fi; \
                 shift; exec bash \"$@\"",
            )
            .arg("sh")
            .arg(root.join("usr"))
            .arg(INSTALL_SH)
            .env("DESTDIR", &root);
        installed(command, args)
    };
    let unit = || read(&root, "etc/systemd/system/crr-proxy.service");
    let said = read_only(&[]);
    assert!(
        said.contains("installed crr-proxy as /opt/bin/crr-proxy"),
        "{said}"
    );
    assert!(root.join("opt/bin/crr-proxy").is_file());
    assert!(!root.join("usr/local/bin/crr-proxy").exists());
    assert!(
        unit().contains("\nExecStart=/opt/bin/crr-proxy run\n"),
        "{}",
        unit()
    );
    let once = snapshot(&root);
    read_only(&[]);
    assert_eq!(snapshot(&root), once, "a second run changed the node");
    read_only(&["--uninstall"]);
    assert!(!root.join("opt/bin/crr-proxy").exists());
    assert!(!root.join("etc/systemd/system/crr-proxy.service").exists());

    // Writable: /usr/local/bin, the unit as shipped.
    install(&root, &[]);
    assert!(root.join("usr/local/bin/crr-proxy").is_file());
    assert!(!root.join("opt/bin/crr-proxy").exists());
    assert_eq!(
        unit(),
        std::fs::read_to_string(concat!(
            env!("CARGO_MANIFEST_DIR"),
            "/systemd/crr-proxy.service"
        ))
        .unwrap()
    );
    support::remove_socket_dir(&socket);
}

/// `install.sh --help` prints its whole comment header, every option
/// included, and none of its code.
#[test]
fn the_help_is_the_scripts_header() {
    let out = install_sh(Path::new("/nonexistent"))
        .arg("--help")
        .output()
        .unwrap();
    assert!(out.status.success());
    let help = String::from_utf8_lossy(&out.stdout);
    for option in [
        "--binary",
        "--kubelet-only",
        "--bypass",
        "--uninstall",
        "DESTDIR=",
    ] {
        assert!(
            help.contains(option),
            "{option} is not in the help:\n{help}"
        );
    }
    assert!(
        !help.contains("set -euo pipefail"),
        "code in the help:\n{help}"
    );
}
