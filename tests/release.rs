//! scripts/release.sh's artifacts: the sums hold, the .deb installs into a
//! scratch root with dpkg and leaves kubelet alone, its removal is refused
//! while kubelet dials crr-proxy, and the tarball installs with neither a
//! checkout nor a toolchain; krew's manifest names the tarball by its sum.
//!
//! The suite packages the binary it built (`--binary`) rather than building
//! a release one, which would take minutes on every run.
#![allow(clippy::unwrap_used, clippy::expect_used)] // tests fail loudly by design

mod support;

use std::path::{Path, PathBuf};
use std::process::{Command, Output};

const BINARY: &str = env!("CARGO_BIN_EXE_crr-proxy");
const VERSION: &str = env!("CARGO_PKG_VERSION");
const SOCKET: &str = "unix:///run/crr-proxy/crr-proxy.sock";
const KUBELET: &str = "apiVersion: kubelet.config.k8s.io/v1beta1\nkind: KubeletConfiguration\n\
                       containerRuntimeEndpoint: unix:///run/containerd/containerd.sock\n";

fn run(command: &mut Command) -> Output {
    command
        .env("PATH", "/usr/sbin:/usr/bin:/sbin:/bin")
        .output()
        .unwrap()
}

fn ok(command: &mut Command) -> String {
    let out = run(command);
    let text =
        String::from_utf8_lossy(&out.stdout).into_owned() + &String::from_utf8_lossy(&out.stderr);
    assert!(out.status.success(), "{command:?} failed:\n{text}");
    text
}

/// dpkg acting on the scratch root `root`. Maintainer scripts run outside
/// it with DPKG_ROOT set (the root has no shell of its own); the root has no
/// libc6 package for the dependency.
fn dpkg(root: &Path) -> Command {
    let mut command = Command::new("dpkg");
    command.arg(format!("--root={}", root.display())).args([
        "--force-script-chrootless",
        "--force-depends",
        "--log=/dev/null",
    ]);
    command
}

/// A root with dpkg's empty database and kubelet's configuration.
fn scratch_root(path: PathBuf) -> PathBuf {
    for dir in [
        "var/lib/dpkg/info",
        "var/lib/dpkg/updates",
        "var/lib/kubelet",
    ] {
        std::fs::create_dir_all(path.join(dir)).unwrap();
    }
    std::fs::write(path.join("var/lib/dpkg/status"), "").unwrap();
    std::fs::write(path.join("var/lib/kubelet/config.yaml"), KUBELET).unwrap();
    path
}

fn kubelet_config(root: &Path) -> String {
    std::fs::read_to_string(root.join("var/lib/kubelet/config.yaml")).unwrap()
}

#[test]
fn the_release_artifacts_install_as_an_operator_installs_them() {
    let dir = support::temp_socket("release").parent().unwrap().to_owned();
    let dist = dir.join("dist");
    let arch = ok(Command::new("dpkg").arg("--print-architecture"))
        .trim()
        .to_owned();
    let made = ok(Command::new("bash")
        .arg(concat!(env!("CARGO_MANIFEST_DIR"), "/scripts/release.sh"))
        .args(["--binary", BINARY, "--allow-dirty", "--out"])
        .arg(&dist));
    let deb = dist.join(format!("crr-proxy_{VERSION}_{arch}.deb"));
    let tarball = format!("crr-proxy-{VERSION}-linux-{arch}");
    assert!(
        deb.is_file() && dist.join(format!("{tarball}.tar.gz")).is_file(),
        "{made}"
    );
    let sums = ok(Command::new("sha256sum")
        .args(["--check", "SHA256SUMS"])
        .current_dir(&dist));
    assert_eq!(sums.matches(": OK").count(), 2, "{sums}");

    // The package's own description of itself.
    let fields = ok(Command::new("dpkg-deb").arg("--field").arg(&deb).args([
        "Package",
        "Version",
        "Architecture",
        "Depends",
    ]));
    assert!(
        fields.contains("Package: crr-proxy")
            && fields.contains(&format!("Version: {VERSION}"))
            && fields.contains(&format!("Architecture: {arch}"))
            && fields.contains("Depends: libc6 (>= 2."),
        "{fields}"
    );

    // Installed: the binary, the units naming it, the settings; kubelet
    // untouched.
    let root = scratch_root(dir.join("root"));
    ok(dpkg(&root).arg("--install").arg(&deb));
    let version = ok(Command::new(root.join("usr/bin/crr-proxy")).arg("--version"));
    assert!(version.contains(VERSION), "{version}");
    let unit =
        std::fs::read_to_string(root.join("usr/lib/systemd/system/crr-proxy.service")).unwrap();
    assert!(
        unit.contains("\nExecStart=/usr/bin/crr-proxy run"),
        "{unit}"
    );
    assert!(
        root.join("usr/lib/systemd/system/crr-proxy.socket")
            .is_file()
    );
    assert!(root.join("etc/crr-proxy/crr-proxy.env").is_file());
    assert_eq!(kubelet_config(&root), KUBELET);
    assert!(!root.join("etc/crr-proxy/kubelet-switch").exists());

    // The package's installer switches kubelet only, on request.
    let installer = root.join("usr/share/crr-proxy/scripts/install.sh");
    ok(Command::new("bash")
        .arg(&installer)
        .arg("--kubelet-only")
        .env("DESTDIR", &root));
    assert!(kubelet_config(&root).contains(SOCKET));
    assert!(!root.join("usr/local/bin/crr-proxy").exists());

    // Removing the package now would leave kubelet dialling a dead socket.
    let refused = run(dpkg(&root).args(["--remove", "crr-proxy"]));
    let said = String::from_utf8_lossy(&refused.stderr);
    assert!(!refused.status.success(), "{said}");
    assert!(
        said.contains("\n  /usr/share/crr-proxy/scripts/install.sh --bypass\n"),
        "{said}"
    );
    assert!(root.join("usr/bin/crr-proxy").is_file());

    // A plain --uninstall on the package's files puts kubelet back and
    // leaves the package's files and the node's settings to apt.
    let settings = std::fs::read(root.join("etc/crr-proxy/crr-proxy.env")).unwrap();
    std::fs::write(root.join("etc/crr-proxy/kubeconfig"), "node identity\n").unwrap();
    let said = ok(Command::new("bash")
        .arg(&installer)
        .arg("--uninstall")
        .env("DESTDIR", &root));
    assert!(said.contains("apt remove crr-proxy"), "{said}");
    assert_eq!(kubelet_config(&root), KUBELET);
    assert_eq!(
        std::fs::read(root.join("etc/crr-proxy/crr-proxy.env")).unwrap(),
        settings
    );
    assert!(root.join("etc/crr-proxy/kubeconfig").is_file());
    assert!(
        root.join("usr/lib/systemd/system/crr-proxy.socket")
            .is_file()
    );
    assert!(root.join("usr/bin/crr-proxy").is_file());

    // The command the refusal names, after switching again.
    ok(Command::new("bash")
        .arg(&installer)
        .arg("--kubelet-only")
        .env("DESTDIR", &root));
    assert!(kubelet_config(&root).contains(SOCKET));
    ok(Command::new("bash")
        .arg(&installer)
        .arg("--bypass")
        .env("DESTDIR", &root));
    assert_eq!(kubelet_config(&root), KUBELET);
    assert_eq!(
        std::fs::read(root.join("etc/crr-proxy/crr-proxy.env")).unwrap(),
        settings
    );
    std::fs::remove_file(root.join("etc/crr-proxy/kubeconfig")).unwrap();

    // Removed, the settings stay (a conffile); purged, they go.
    ok(dpkg(&root).args(["--remove", "crr-proxy"]));
    assert!(!root.join("usr/bin/crr-proxy").exists());
    assert!(
        !root
            .join("usr/lib/systemd/system/crr-proxy.service")
            .exists()
    );
    assert!(root.join("etc/crr-proxy/crr-proxy.env").is_file());
    ok(dpkg(&root).args(["--purge", "crr-proxy"]));
    assert!(!root.join("etc/crr-proxy").exists());

    // The tarball: install.sh from it, with no target/ and no cargo on PATH.
    let unpacked = dir.join("unpacked");
    std::fs::create_dir_all(&unpacked).unwrap();
    ok(Command::new("tar")
        .arg("-xzf")
        .arg(dist.join(format!("{tarball}.tar.gz")))
        .arg("-C")
        .arg(&unpacked));
    let tree = unpacked.join(&tarball);
    for file in [
        "bin/crr-proxy",
        "scripts/install.sh",
        "systemd/crr-proxy.service",
        "deploy/base/rbac-restart.yaml",
        "LICENSE",
    ] {
        assert!(tree.join(file).is_file(), "{file} is not in the tarball");
    }
    // krew's manifest names this tarball by its sum, and files it holds.
    let manifest: serde_json::Value =
        serde_saphyr::from_str(&std::fs::read_to_string(dist.join("crr.yaml")).unwrap()).unwrap();
    assert_eq!(manifest["kind"], "Plugin");
    assert_eq!(manifest["metadata"]["name"], "crr");
    assert_eq!(manifest["spec"]["version"], format!("v{VERSION}"));
    let platform = &manifest["spec"]["platforms"][0];
    assert_eq!(platform["selector"]["matchLabels"]["arch"], arch.as_str());
    let listed = std::fs::read_to_string(dist.join("SHA256SUMS")).unwrap();
    let sum = listed
        .lines()
        .find(|l| l.ends_with(&format!("{tarball}.tar.gz")))
        .and_then(|l| l.split_whitespace().next())
        .unwrap();
    assert_eq!(platform["sha256"], sum);
    assert!(
        platform["uri"]
            .as_str()
            .unwrap()
            .ends_with(&format!("/{tarball}.tar.gz"))
    );
    assert_eq!(platform["bin"], "kubectl-crr");
    for file in platform["files"].as_array().unwrap() {
        let from = file["from"].as_str().unwrap();
        assert!(
            unpacked.join(from).is_file(),
            "{from} is not in the tarball"
        );
    }
    assert_eq!(platform["files"][0]["to"], "kubectl-crr");

    let node = scratch_root(dir.join("node"));
    ok(Command::new("bash")
        .arg(tree.join("scripts/install.sh"))
        .env_clear()
        .env("DESTDIR", &node));
    assert_eq!(
        std::fs::read(node.join("usr/local/bin/crr-proxy")).unwrap(),
        std::fs::read(tree.join("bin/crr-proxy")).unwrap()
    );
    let version = ok(Command::new(node.join("usr/local/bin/crr-proxy")).arg("--version"));
    assert!(version.contains(VERSION), "{version}");
    assert!(node.join("etc/systemd/system/crr-proxy.socket").is_file());
    assert!(kubelet_config(&node).contains(SOCKET));
    // (A failed run leaves its folder to be read.)
    let _ = std::fs::remove_dir_all(&dir);
}
