//! A private, real containerd (Debian's `containerd` + `runc`) in a temp dir
//! with its own socket, for tests. Dropping it removes every container it
//! ran, stops it, and deletes the directory, also when the test failed.
//!
//! `CRR_TEST_CONTAINERD=<dir>` takes containerd, its runc shim and ctr from
//! `<dir>` instead of PATH (runc stays the system's), so the same tests run
//! against containerd 2.x too (scripts/lib/containerd2.sh fetches one).

use std::ffi::OsString;
use std::fs;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::sync::OnceLock;
use std::time::{Duration, Instant};

use anyhow::{Context, Result, bail};
use crr_proxy::proxy::Endpoint;
use nix::sys::signal::{Signal, kill};
use nix::unistd::Pid;

use super::images;

const NAMESPACE: &str = "k8s.io";
const START_TIMEOUT: Duration = Duration::from_secs(30);
/// Names a directory holding the containerd, containerd-shim-runc-v2 and ctr to test.
const BINARIES_ENV: &str = "CRR_TEST_CONTAINERD";
const SHIM: &str = "containerd-shim-runc-v2";

pub struct Containerd {
    dir: PathBuf,
    child: Option<Child>,
}

impl Containerd {
    /// Starts a containerd with the CRI plugin and imports the test images.
    pub fn start() -> Result<Self> {
        if let Some(dir) = binaries_dir()? {
            for binary in ["containerd", SHIM, "ctr"] {
                if !dir.join(binary).is_file() {
                    bail!("{binary} is not in {BINARIES_ENV}={}", dir.display());
                }
            }
            if !on_path("runc") {
                bail!(
                    "runc is not installed: run the test command (scripts/test.sh), which installs it"
                );
            }
        } else {
            for binary in ["containerd", SHIM, "runc", "ctr"] {
                if !on_path(binary) {
                    bail!(
                        "{binary} is not installed: run the test command (scripts/test.sh), which installs containerd and runc"
                    );
                }
            }
        }
        let dir = super::fresh_dir("crr-ctrd")?;
        fs::create_dir_all(dir.join("cni/net.d"))?;
        fs::create_dir_all(dir.join("certs.d"))?;
        let mut this = Self { dir, child: None };
        fs::write(this.config_path(), this.config()?)?;
        this.launch()?;
        let [busybox, pause] = images::build(&this.dir)?;
        for image in [busybox, pause] {
            this.ctr(&[
                "-n",
                NAMESPACE,
                "images",
                "import",
                "--snapshotter",
                &snapshotter(),
                image.to_str().context("image path")?,
            ])?;
        }
        this.wait_for_cri_images(&[images::BUSYBOX_IMAGE, images::PAUSE_IMAGE])?;
        Ok(this)
    }

    /// Waits until CRI's ImageStatus shows each of `images`. The CRI
    /// plugin learns of an image imported with `ctr` from an event, a moment
    /// after the import returns; a sandbox started before that tries to pull
    /// its pause image from the network (seen once on containerd 2.1).
    fn wait_for_cri_images(&self, images: &[&str]) -> Result<()> {
        use super::raw;
        let socket = self.socket();
        let images: Vec<String> = images.iter().map(|i| (*i).to_owned()).collect();
        let check = move || -> Result<()> {
            let runtime = tokio::runtime::Builder::new_current_thread()
                .enable_all()
                .build()?;
            runtime.block_on(async {
                let deadline = Instant::now() + Duration::from_secs(10);
                for image in &images {
                    // ImageStatusRequest { image: ImageSpec { image } }; the
                    // names are shorter than 128 bytes, so each length is
                    // one byte.
                    let spec = [&[0x0a, image.len() as u8][..], image.as_bytes()].concat();
                    let request = [&[0x0a, spec.len() as u8][..], &spec].concat();
                    loop {
                        let mut sender = raw::connect(&socket).await?;
                        let call = raw::grpc_request(
                            "/runtime.v1.ImageService/ImageStatus",
                            &[],
                            raw::grpc_frame(&request),
                        );
                        let answer = raw::record(raw::send(&mut sender, call).await?).await?;
                        // Found: a status of 0 and a response that is not
                        // empty (the gRPC frame's 5 bytes and more).
                        if raw::grpc_status(&answer).as_deref() == Some("0") && answer.data.len() > 5 {
                            break;
                        }
                        if Instant::now() > deadline {
                            bail!("containerd's CRI does not show {image} after its import: {answer:?}");
                        }
                        tokio::time::sleep(Duration::from_millis(50)).await;
                    }
                }
                Ok(())
            })
        };
        // A thread of its own: the caller may be inside a runtime already.
        std::thread::spawn(check)
            .join()
            .map_err(|_| anyhow::anyhow!("the image check panicked"))?
    }

    pub fn socket(&self) -> PathBuf {
        self.dir.join("containerd.sock")
    }

    pub fn endpoint(&self) -> Endpoint {
        Endpoint::from_path(self.socket())
    }

    /// The folder of containerd's registry hosts (`<host>/hosts.toml`, and
    /// `_default/hosts.toml` for any host without its own; read at each
    /// pull). Empty: every registry as containerd reaches it by default.
    pub fn registry_hosts_dir(&self) -> PathBuf {
        self.dir.join("certs.d")
    }

    /// The folder containerd loads CNI network configurations from (it
    /// watches it: a configuration written after the start is taken).
    pub fn cni_conf_dir(&self) -> PathBuf {
        self.dir.join("cni/net.d")
    }

    /// A scratch directory inside this instance's temp dir.
    pub fn scratch(&self, name: &str) -> PathBuf {
        let path = self.dir.join("scratch").join(name);
        let _ = fs::create_dir_all(&path);
        path
    }

    /// Stops containerd only (SIGTERM); containers and shims keep running and
    /// are picked up again by [`Containerd::resume`].
    pub fn pause(&mut self) -> Result<()> {
        if let Some(mut child) = self.child.take() {
            let pid = Pid::from_raw(child.id() as i32);
            kill(pid, Signal::SIGTERM)?;
            let deadline = Instant::now() + Duration::from_secs(10);
            while child.try_wait()?.is_none() {
                if Instant::now() > deadline {
                    child.kill()?;
                    child.wait()?;
                    break;
                }
                std::thread::sleep(Duration::from_millis(10));
            }
        }
        Ok(())
    }

    /// Freezes containerd (SIGSTOP): its socket still accepts connections,
    /// but nothing is answered until [`Containerd::thaw`], as with a runtime
    /// that hangs.
    pub fn freeze(&self) -> Result<()> {
        self.signal(Signal::SIGSTOP)
    }

    /// Lets a frozen containerd go on (SIGCONT).
    pub fn thaw(&self) -> Result<()> {
        self.signal(Signal::SIGCONT)
    }

    fn signal(&self, signal: Signal) -> Result<()> {
        if let Some(child) = &self.child {
            kill(Pid::from_raw(child.id() as i32), signal)?;
        }
        Ok(())
    }

    /// Starts containerd again on the same root, state and socket.
    pub fn resume(&mut self) -> Result<()> {
        if self.child.is_none() {
            self.launch()?;
        }
        Ok(())
    }

    fn launch(&mut self) -> Result<()> {
        let _ = fs::remove_file(self.socket());
        let log = fs::OpenOptions::new()
            .create(true)
            .append(true)
            .open(self.dir.join("containerd.log"))?;
        let mut command = Command::new(binary("containerd")?);
        if let Some(dir) = binaries_dir()? {
            // containerd looks for the shim on PATH first and beside its own
            // binary only after that, so the system's shim (of another
            // containerd version) would win: put the chosen directory first.
            command.env("PATH", path_with(&dir)?);
        }
        let child = command
            .arg("--config")
            .arg(self.config_path())
            .stdin(Stdio::null())
            .stdout(log.try_clone()?)
            .stderr(log)
            .spawn()
            .context("spawn containerd")?;
        self.child = Some(child);
        let deadline = Instant::now() + START_TIMEOUT;
        loop {
            if let Some(child) = self.child.as_mut() {
                if let Some(status) = child.try_wait()? {
                    self.child = None;
                    bail!(
                        "containerd exited during start-up ({status}):\n{}",
                        self.log_tail()
                    );
                }
            }
            if self.socket().exists() && self.cri_ready() {
                return Ok(());
            }
            if Instant::now() > deadline {
                bail!(
                    "containerd not ready after {START_TIMEOUT:?}:\n{}",
                    self.log_tail()
                );
            }
            std::thread::sleep(Duration::from_millis(20));
        }
    }

    fn cri_ready(&self) -> bool {
        self.ctr(&["plugins", "ls"]).is_ok_and(|out| {
            out.lines().any(|line| {
                let cols: Vec<&str> = line.split_whitespace().collect();
                cols.first() == Some(&"io.containerd.grpc.v1")
                    && cols.get(1) == Some(&"cri")
                    && cols.last() == Some(&"ok")
            })
        })
    }

    pub fn ctr(&self, args: &[&str]) -> Result<String> {
        let out = Command::new(binary("ctr")?)
            .arg("--address")
            .arg(self.socket())
            .args(args)
            .output()
            .context("run ctr")?;
        if !out.status.success() {
            bail!("ctr {args:?}: {}", String::from_utf8_lossy(&out.stderr));
        }
        Ok(String::from_utf8_lossy(&out.stdout).into_owned())
    }

    /// containerd's own log (its CRI calls at info level, with timestamps).
    pub fn log_path(&self) -> PathBuf {
        self.dir.join("containerd.log")
    }

    /// The StopContainer calls containerd has served, as its log lines:
    /// what shows a second stop that a restart count would not (kubelet's
    /// back-off holds the second restart back).
    #[allow(dead_code)] // each test binary uses a different part
    pub fn stop_calls(&self) -> Vec<String> {
        fs::read_to_string(self.log_path())
            .unwrap_or_default()
            .lines()
            .filter(|l| l.contains("StopContainer for") && l.contains("with timeout"))
            .map(str::to_owned)
            .collect()
    }

    pub fn log_tail(&self) -> String {
        let log = fs::read_to_string(self.log_path()).unwrap_or_default();
        let lines: Vec<&str> = log.lines().collect();
        lines[lines.len().saturating_sub(30)..].join("\n")
    }

    fn config_path(&self) -> PathBuf {
        self.dir.join("config.toml")
    }

    fn config(&self) -> Result<String> {
        let runc = which("runc")?;
        let arch = match std::env::consts::ARCH {
            "x86_64" => "amd64",
            "aarch64" => "arm64",
            other => other,
        };
        Ok(match containerd_major()? {
            1 => self.config_v2(&runc, arch),
            _ => self.config_v3(&runc, arch),
        })
    }

    /// containerd 1.x: config version 2, CRI settings in the one CRI plugin.
    fn config_v2(&self, runc: &Path, arch: &str) -> String {
        let dir = self.dir.display();
        format!(
            r#"version = 2
root = "{dir}/root"
state = "{dir}/state"
oom_score = 0
imports = []
plugin_dir = ""
required_plugins = ["io.containerd.grpc.v1.cri"]
disabled_plugins = [
  "io.containerd.snapshotter.v1.aufs",
  "io.containerd.snapshotter.v1.btrfs",
  "io.containerd.snapshotter.v1.devmapper",
  "io.containerd.snapshotter.v1.zfs",
  "io.containerd.tracing.processor.v1.otlp",
  "io.containerd.internal.v1.tracing",
]

{sockets}
[plugins."io.containerd.grpc.v1.cri"]
  sandbox_image = "{pause}"
  disable_tcp_service = true
  stream_server_address = "127.0.0.1"
  stream_server_port = "0"
  enable_selinux = false
  disable_apparmor = true
  disable_hugetlb_controller = true
  tolerate_missing_hugetlb_controller = true
  restrict_oom_score_adj = {restrict_oom}
  [plugins."io.containerd.grpc.v1.cri".containerd]
    snapshotter = "{snapshotter}"
    default_runtime_name = "runc"
    disable_snapshot_annotations = true
    [plugins."io.containerd.grpc.v1.cri".containerd.runtimes.runc]
      runtime_type = "io.containerd.runc.v2"
      [plugins."io.containerd.grpc.v1.cri".containerd.runtimes.runc.options]
        BinaryName = "{runc}"
        Root = "{dir}/state/runc"
        SystemdCgroup = false
  [plugins."io.containerd.grpc.v1.cri".cni]
    bin_dir = "/usr/lib/cni"
    conf_dir = "{dir}/cni/net.d"
  [plugins."io.containerd.grpc.v1.cri".registry]
    config_path = "{dir}/certs.d"

{tail}"#,
            sockets = self.sockets(),
            tail = self.tail(arch),
            pause = images::PAUSE_IMAGE,
            restrict_oom = restrict_oom_score_adj(),
            snapshotter = snapshotter(),
            runc = runc.display(),
        )
    }

    /// containerd 2.x: config version 3, the same settings as
    /// [`Self::config_v2`]. CRI is split into an images plugin (snapshotter,
    /// sandbox image as `pinned_images.sandbox`, registry) and a runtime
    /// plugin (runtimes, CNI, security); the gRPC plugin keeps streaming.
    /// Plugins that 2.x dropped (aufs) are not named; `disabled_plugins`
    /// would ignore them, but `required_plugins` must name a real ID.
    /// Disabled besides: the erofs and blockfile snapshotters (new in 2.x,
    /// cannot work here) and NRI (new in 2.x, on by default; it would serve
    /// the host-wide /var/run/nri/nri.sock, shared by every instance).
    fn config_v3(&self, runc: &Path, arch: &str) -> String {
        let dir = self.dir.display();
        format!(
            r#"version = 3
root = "{dir}/root"
state = "{dir}/state"
oom_score = 0
imports = []
required_plugins = ["io.containerd.grpc.v1.cri"]
disabled_plugins = [
  "io.containerd.snapshotter.v1.blockfile",
  "io.containerd.snapshotter.v1.btrfs",
  "io.containerd.snapshotter.v1.devmapper",
  "io.containerd.snapshotter.v1.erofs",
  "io.containerd.snapshotter.v1.zfs",
  "io.containerd.differ.v1.erofs",
  "io.containerd.tracing.processor.v1.otlp",
  "io.containerd.internal.v1.tracing",
  "io.containerd.nri.v1.nri",
]

{sockets}
[plugins."io.containerd.grpc.v1.cri"]
  disable_tcp_service = true
  stream_server_address = "127.0.0.1"
  stream_server_port = "0"

[plugins."io.containerd.cri.v1.images"]
  snapshotter = "{snapshotter}"
  disable_snapshot_annotations = true
  [plugins."io.containerd.cri.v1.images".pinned_images]
    sandbox = "{pause}"
  [plugins."io.containerd.cri.v1.images".registry]
    config_path = "{dir}/certs.d"

[plugins."io.containerd.cri.v1.runtime"]
  enable_selinux = false
  disable_apparmor = true
  disable_hugetlb_controller = true
  tolerate_missing_hugetlb_controller = true
  restrict_oom_score_adj = {restrict_oom}
  [plugins."io.containerd.cri.v1.runtime".containerd]
    default_runtime_name = "runc"
    [plugins."io.containerd.cri.v1.runtime".containerd.runtimes.runc]
      runtime_type = "io.containerd.runc.v2"
      [plugins."io.containerd.cri.v1.runtime".containerd.runtimes.runc.options]
        BinaryName = "{runc}"
        Root = "{dir}/state/runc"
        SystemdCgroup = false
  [plugins."io.containerd.cri.v1.runtime".cni]
    bin_dirs = ["/usr/lib/cni"]
    conf_dir = "{dir}/cni/net.d"

{tail}"#,
            sockets = self.sockets(),
            tail = self.tail(arch),
            pause = images::PAUSE_IMAGE,
            restrict_oom = restrict_oom_score_adj(),
            snapshotter = snapshotter(),
            runc = runc.display(),
        )
    }

    /// The sections both config versions spell alike: this instance's own
    /// sockets, logging, and no metrics endpoint.
    fn sockets(&self) -> String {
        let dir = self.dir.display();
        format!(
            r#"[grpc]
  address = "{dir}/containerd.sock"

[ttrpc]
  address = "{dir}/containerd.sock.ttrpc"

[debug]
  address = ""
  level = "info"

[metrics]
  address = ""
"#
        )
    }

    /// The sections both config versions end with: the opt plugin's folder
    /// and the task platform.
    fn tail(&self, arch: &str) -> String {
        let dir = self.dir.display();
        format!(
            r#"[plugins."io.containerd.internal.v1.opt"]
  path = "{dir}/root/opt"

[plugins."io.containerd.runtime.v2.task"]
  platforms = ["linux/{arch}"]
"#
        )
    }

    /// Kills and deletes every task and container of this instance.
    fn remove_workloads(&self) {
        for id in self
            .ctr(&["-n", NAMESPACE, "tasks", "ls", "-q"])
            .unwrap_or_default()
            .lines()
        {
            let _ = self.ctr(&["-n", NAMESPACE, "tasks", "kill", "-s", "SIGKILL", id]);
        }
        for _ in 0..25 {
            let left = self
                .ctr(&["-n", NAMESPACE, "tasks", "ls", "-q"])
                .unwrap_or_default();
            if left.trim().is_empty() {
                break;
            }
            for id in left.lines() {
                let _ = self.ctr(&["-n", NAMESPACE, "tasks", "delete", "--force", id]);
            }
            std::thread::sleep(Duration::from_millis(100));
        }
        for id in self
            .ctr(&["-n", NAMESPACE, "containers", "ls", "-q"])
            .unwrap_or_default()
            .lines()
        {
            let _ = self.ctr(&["-n", NAMESPACE, "containers", "delete", id]);
        }
    }
}

impl Drop for Containerd {
    fn drop(&mut self) {
        if self.child.is_none() {
            // Paused by the test: bring it back so it can clean up its containers.
            let _ = self.launch();
        }
        self.remove_workloads();
        let _ = self.pause();
        // Whatever containerd could not remove: runc containers, shims that
        // still serve our socket, and mounts under our directory.
        let runc_root = self.dir.join("state/runc").join(NAMESPACE);
        if let Ok(out) = Command::new("runc")
            .arg("--root")
            .arg(&runc_root)
            .args(["list", "-q"])
            .output()
        {
            for id in String::from_utf8_lossy(&out.stdout).lines() {
                let _ = Command::new("runc")
                    .arg("--root")
                    .arg(&runc_root)
                    .args(["delete", "--force", id])
                    .output();
            }
        }
        kill_shims(&self.socket());
        unmount_under(&self.dir);
        let _ = fs::remove_dir_all(&self.dir);
    }
}

fn kill_shims(socket: &Path) {
    let needle = format!("-address {} ", socket.display());
    let Ok(entries) = fs::read_dir("/proc") else {
        return;
    };
    for entry in entries.flatten() {
        let Ok(pid) = entry.file_name().to_string_lossy().parse::<i32>() else {
            continue;
        };
        let cmdline = fs::read(entry.path().join("cmdline")).unwrap_or_default();
        let cmdline = String::from_utf8_lossy(&cmdline).replace('\0', " ");
        let is_shim = cmdline.starts_with("containerd-shim-runc-v2")
            || cmdline.contains("/containerd-shim-runc-v2 ");
        if is_shim && cmdline.contains(&needle) {
            let _ = kill(Pid::from_raw(pid), Signal::SIGKILL);
        }
    }
}

fn unmount_under(dir: &Path) {
    let prefix = dir.to_string_lossy().into_owned();
    let mounts = fs::read_to_string("/proc/self/mountinfo").unwrap_or_default();
    let mut points: Vec<&str> = mounts
        .lines()
        .filter_map(|line| line.split(' ').nth(4))
        .filter(|point| point.starts_with(&prefix))
        .collect();
    // Deepest first.
    points.sort_by_key(|p| std::cmp::Reverse(p.len()));
    for point in points {
        let _ = Command::new("umount").args(["-l", point]).output();
    }
}

/// Whether `binary` is on PATH.
pub fn on_path(binary: &str) -> bool {
    which(binary).is_ok()
}

/// The directory named by `CRR_TEST_CONTAINERD`, if any.
fn binaries_dir() -> Result<Option<PathBuf>> {
    match std::env::var_os(BINARIES_ENV) {
        Some(dir) if !dir.is_empty() => {
            let dir = PathBuf::from(dir);
            // A typo must not quietly test the system's containerd instead.
            if !dir.is_dir() {
                bail!("{BINARIES_ENV}={} is not a directory", dir.display());
            }
            Ok(Some(dir))
        }
        _ => Ok(None),
    }
}

/// containerd, its shim or ctr: from `CRR_TEST_CONTAINERD`, else found on PATH.
fn binary(name: &str) -> Result<PathBuf> {
    Ok(match binaries_dir()? {
        Some(dir) => dir.join(name),
        None => PathBuf::from(name),
    })
}

/// This process's PATH with `dir` first.
fn path_with(dir: &Path) -> Result<OsString> {
    let path = std::env::var_os("PATH").unwrap_or_default();
    let dirs = std::iter::once(dir.to_path_buf()).chain(std::env::split_paths(&path));
    std::env::join_paths(dirs).context("PATH with the containerd directory")
}

/// The major version of the containerd under test (1 or 2), which picks the
/// config format. Asked once per test binary: `containerd --version` prints
/// `containerd github.com/containerd/containerd/v2 2.1.9+unknown`.
pub fn containerd_major() -> Result<u32> {
    Ok(containerd_version()?.0)
}

/// The (major, minor) version of the containerd under test.
pub fn containerd_version() -> Result<(u32, u32)> {
    static VERSION: OnceLock<Result<(u32, u32), String>> = OnceLock::new();
    VERSION
        .get_or_init(|| {
            let containerd = binary("containerd").map_err(|e| format!("{e:#}"))?;
            let out = Command::new(&containerd)
                .arg("--version")
                .output()
                .map_err(|e| format!("run {} --version: {e}", containerd.display()))?;
            let text = String::from_utf8_lossy(&out.stdout).into_owned();
            // "containerd github.com/containerd/containerd/v2 v2.3.7 " or
            // "containerd github.com/containerd/containerd 1.6.20~ds1 ".
            let mut parts = text
                .split_whitespace()
                .nth(2)
                .unwrap_or_default()
                .trim_start_matches('v')
                .split(['.', '~', '+', '-'])
                .map(str::parse::<u32>);
            match (parts.next(), parts.next()) {
                (Some(Ok(major)), Some(Ok(minor))) => Ok((major, minor)),
                _ => Err(format!(
                    "no version in `{} --version`: {text:?}",
                    containerd.display()
                )),
            }
        })
        .clone()
        .map_err(anyhow::Error::msg)
}

/// Whether the containerd under test serves KEP-5825's streaming lists
/// (`StreamContainers` and the rest): 2.4 and later.
pub fn serves_streaming_lists() -> Result<bool> {
    Ok(containerd_version()? >= (2, 4))
}

fn which(binary: &str) -> Result<PathBuf> {
    let path = std::env::var_os("PATH").unwrap_or_default();
    std::env::split_paths(&path)
        .map(|dir| dir.join(binary))
        .find(|candidate| candidate.is_file())
        .with_context(|| format!("{binary} not found on PATH"))
}

/// CRI gives sandboxes oom_score_adj -998; without CAP_SYS_RESOURCE runc
/// cannot lower it, so have CRI clamp to containerd's own score instead.
fn restrict_oom_score_adj() -> bool {
    let status = fs::read_to_string("/proc/self/status").unwrap_or_default();
    let cap_eff = status
        .lines()
        .find_map(|l| l.strip_prefix("CapEff:"))
        .and_then(|hex| u64::from_str_radix(hex.trim(), 16).ok())
        .unwrap_or(0);
    const CAP_SYS_RESOURCE: u64 = 24;
    cap_eff & (1 << CAP_SYS_RESOURCE) == 0
}

/// overlayfs where the kernel can mount it on our temp dir, else native.
fn snapshotter() -> String {
    static CHOICE: OnceLock<String> = OnceLock::new();
    CHOICE
        .get_or_init(|| {
            let probe =
                std::env::temp_dir().join(format!("crr-overlay-probe-{}", std::process::id()));
            let dirs = ["lower", "upper", "work", "merged"].map(|d| probe.join(d));
            for d in &dirs {
                let _ = fs::create_dir_all(d);
            }
            let ok = Command::new("mount")
                .args(["-t", "overlay", "overlay", "-o"])
                .arg(format!(
                    "lowerdir={},upperdir={},workdir={}",
                    dirs[0].display(),
                    dirs[1].display(),
                    dirs[2].display()
                ))
                .arg(&dirs[3])
                .output()
                .is_ok_and(|o| o.status.success());
            if ok {
                let _ = Command::new("umount").arg(&dirs[3]).output();
            }
            let _ = fs::remove_dir_all(&probe);
            if ok { "overlayfs" } else { "native" }.to_owned()
        })
        .clone()
}

/// Asks the runtime every 2 ms until container `id` has exited; its
/// `finished_at` (ns since the epoch). Fails after `within`.
pub async fn exited_at(
    runtime: &mut crr_proxy::cri::RuntimeClient,
    id: &str,
    within: Duration,
) -> Result<i64> {
    let deadline = Instant::now() + within;
    loop {
        let status = runtime
            .container_status(crr_proxy::cri::v1::ContainerStatusRequest {
                container_id: id.to_owned(),
                verbose: false,
            })
            .await?
            .into_inner()
            .status
            .with_context(|| format!("no status of container {id}"))?;
        if status.finished_at != 0 {
            return Ok(status.finished_at);
        }
        if Instant::now() > deadline {
            bail!("container {id} did not exit within {within:?}");
        }
        tokio::time::sleep(Duration::from_millis(2)).await;
    }
}
