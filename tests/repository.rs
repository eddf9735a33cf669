//! What the repository itself holds: scripts that take package mirrors
//! from the machine's own configuration, no file naming a package
//! registry's host, and the license Cargo.toml names.
#![allow(clippy::unwrap_used, clippy::expect_used)] // tests fail loudly by design

use std::path::{Path, PathBuf};
use std::process::Command;

/// `_debian_mirror` of `scripts/lib/containerd2.sh` over an apt folder.
fn debian_mirror(apt: &Path, codename: &str) -> (bool, String) {
    let script = concat!(env!("CARGO_MANIFEST_DIR"), "/scripts/lib/containerd2.sh");
    let out = Command::new("bash")
        .arg("-c")
        .arg(format!("source '{script}' && _debian_mirror \"$0\" \"$1\""))
        .arg(apt)
        .arg(codename)
        .output()
        .unwrap();
    (
        out.status.success(),
        String::from_utf8_lossy(&out.stdout).trim().to_owned(),
    )
}

/// A fresh apt folder holding `files` (paths relative to it).
fn apt_folder(name: &str, files: &[(&str, &str)]) -> PathBuf {
    let dir = std::env::temp_dir().join(format!("crr-scripts-{}-{name}", std::process::id()));
    let _ = std::fs::remove_dir_all(&dir);
    std::fs::create_dir_all(dir.join("sources.list.d")).unwrap();
    for (path, text) in files {
        std::fs::write(dir.join(path), text).unwrap();
    }
    dir
}

#[test]
fn containerd2_takes_the_mirror_from_the_machines_apt_sources() {
    // One-line style with options, a deb-src line before it.
    let one_line = apt_folder(
        "one-line",
        &[(
            "sources.list",
            "# the mirror\ndeb-src http://src.invalid/debian bookworm main\n\
         deb [arch=amd64 signed-by=/k.gpg] http://one.invalid/debian/ bookworm main contrib\n",
        )],
    );
    assert_eq!(
        debian_mirror(&one_line, "bookworm"),
        (true, "http://one.invalid/debian".into())
    );
    // deb822, the security archive first, no blank line at the end.
    let deb822 = apt_folder(
        "deb822",
        &[(
            "sources.list.d/debian.sources",
            "Types: deb\nURIs: http://security.invalid/debian-security\nSuites: bookworm-security\n\
         Components: main\n\nTypes: deb deb-src\nURIs: http://two.invalid/debian\n\
         Suites: bookworm bookworm-updates\nComponents: main",
        )],
    );
    assert_eq!(
        debian_mirror(&deb822, "bookworm"),
        (true, "http://two.invalid/debian".into())
    );
    // A source of another release, or a disabled file, is no answer.
    let none = apt_folder(
        "none",
        &[
            (
                "sources.list",
                "deb http://old.invalid/debian bullseye main\n",
            ),
            (
                "sources.list.d/x.sources.disabled",
                "Types: deb\nURIs: http://off.invalid/debian\nSuites: bookworm\n",
            ),
        ],
    );
    assert_eq!(debian_mirror(&none, "bookworm").1, "");
}

#[test]
fn no_tracked_file_names_a_package_registrys_host() {
    let root = env!("CARGO_MANIFEST_DIR");
    let out = Command::new("git")
        .args(["-C", root, "ls-files", "-z"])
        .output()
        .unwrap();
    assert!(out.status.success(), "git ls-files failed");
    let hosts = [
        "deb.debian.org",
        "security.debian.org",
        "archive.ubuntu.com",
        "pypi.org",
        "files.pythonhosted.org",
        "static.crates.io",
        "index.crates.io",
        "docker.io",
        "ghcr.io",
        "quay.io",
        "registry.k8s.io",
    ];
    let mut found = Vec::new();
    for name in out.stdout.split(|b| *b == 0).filter(|n| !n.is_empty()) {
        let name = String::from_utf8_lossy(name);
        // cargo's lock files name their source by its fixed id, not a mirror.
        if name.ends_with("Cargo.lock") || name == "tests/repository.rs" {
            continue;
        }
        let Ok(text) = std::fs::read(Path::new(root).join(&*name)) else {
            continue;
        };
        let text = String::from_utf8_lossy(&text);
        for host in hosts.iter().filter(|h| text.contains(*h)) {
            found.push(format!("{name}: {host}"));
        }
    }
    assert!(found.is_empty(), "registry hosts named: {found:?}");
}

#[test]
fn the_license_file_holds_the_license_cargo_names() {
    let root = Path::new(env!("CARGO_MANIFEST_DIR"));
    let manifest = std::fs::read_to_string(root.join("Cargo.toml")).unwrap();
    assert!(
        manifest.contains("license = \"Apache-2.0\""),
        "Cargo.toml's license changed"
    );
    let license = std::fs::read_to_string(root.join("LICENSE")).unwrap();
    let head: Vec<&str> = license
        .lines()
        .map(str::trim)
        .filter(|l| !l.is_empty())
        .take(2)
        .collect();
    assert_eq!(head, ["Apache License", "Version 2.0, January 2004"]);
    assert!(
        license.contains("END OF TERMS AND CONDITIONS"),
        "the license text is cut short"
    );
}
