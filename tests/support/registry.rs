//! A private image registry on loopback: Debian's `docker-registry`
//! (CNCF distribution 2.8) with its storage in a temp dir, filled by
//! `skopeo` from the suite's own OCI archives, so that kubelet's image
//! pulls have somewhere to pull from and nothing leaves the machine.
//! containerd speaks plain HTTP to a registry on 127.0.0.1 without being
//! told (it does so for any loopback host), so its configuration stays as it is.

use std::fs;
use std::path::{Path, PathBuf};
use std::process::Command;
use std::time::Duration;

use anyhow::{Context, Result, bail};

use super::cluster::{Process, free_port};
use super::containerd::on_path;
use super::images;

const REGISTRY: &str = "docker-registry";
const SKOPEO: &str = "skopeo";

pub struct Registry {
    /// `127.0.0.1:<port>`: the first part of every reference it serves.
    pub host: String,
    dir: PathBuf,
    process: Process,
}

impl Registry {
    /// Starts a registry on a free loopback port; waits until it answers.
    pub fn start() -> Result<Self> {
        for binary in [REGISTRY, SKOPEO] {
            if !on_path(binary) {
                bail!(
                    "{binary} is not installed: run the test command (scripts/test.sh), which installs it"
                );
            }
        }
        let dir = super::fresh_dir("crr-registry")?;
        let host = format!("127.0.0.1:{}", free_port("127.0.0.1")?);
        let config = dir.join("config.yml");
        fs::write(
            &config,
            format!(
                "version: 0.1\nlog: {{level: warn}}\n\
                 storage: {{filesystem: {{rootdirectory: \"{storage}\"}}}}\n\
                 http: {{addr: \"{host}\"}}\n",
                storage = dir.join("storage").display()
            ),
        )?;
        let mut process = Process::spawn(
            REGISTRY,
            Command::new(REGISTRY).arg("serve").arg(&config),
            &dir.join("registry.log"),
        )?;
        process.wait_listening(&host, Duration::from_secs(10))?;
        Ok(Self { host, dir, process })
    }

    /// Pushes the suite's busybox image as `<host>/<name>`; returns that
    /// reference.
    pub fn push_busybox(&self, name: &str) -> Result<String> {
        let archives = self.dir.join("archives");
        if !archives.join("busybox.oci.tar").exists() {
            fs::create_dir_all(&archives)?;
            images::build(&archives)?;
        }
        self.push(&archives.join("busybox.oci.tar"), name)
    }

    /// Pushes the OCI archive `archive` as `<host>/<name>`; returns that
    /// reference.
    pub fn push(&self, archive: &Path, name: &str) -> Result<String> {
        let reference = format!("{}/{name}", self.host);
        let out = Command::new(SKOPEO)
            .args(["copy", "--quiet", "--dest-tls-verify=false"])
            .arg(format!("oci-archive:{}", archive.display()))
            .arg(format!("docker://{reference}"))
            .output()
            .context("run skopeo")?;
        if !out.status.success() {
            bail!(
                "skopeo copy to {reference}: {}",
                String::from_utf8_lossy(&out.stderr)
            );
        }
        Ok(reference)
    }
}

impl Drop for Registry {
    fn drop(&mut self) {
        self.process.stop(Duration::from_secs(5));
        let _ = fs::remove_dir_all(&self.dir);
    }
}
