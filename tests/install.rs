//! The node installer, run against a scratch root (DESTDIR).
#![allow(clippy::unwrap_used, clippy::expect_used)] // tests fail loudly by design

mod support;

use std::collections::BTreeMap;
use std::path::Path;
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

fn install(root: &Path, args: &[&str]) -> String {
    let out = Command::new("bash")
        .arg(concat!(env!("CARGO_MANIFEST_DIR"), "/scripts/install.sh"))
        .args(["--binary", env!("CARGO_BIN_EXE_crr-proxy")])
        .args(args)
        .env("DESTDIR", root)
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
    ] {
        assert!(
            service.lines().any(|l| l == line),
            "service unit lacks {line}"
        );
    }
}

#[test]
fn systemd_analyze_verify_passes_on_the_units() {
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
    support::remove_socket_dir(&scratch);
}
