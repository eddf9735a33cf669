//! crr-proxy's release under a real systemd: a Debian root with systemd
//! (scripts/lib/nspawn.sh) booted with `systemd-nspawn --boot` on a
//! throw-away overlay, the .deb and then the tarball installed in it as an
//! operator installs them, and the units run by systemd as PID 1. The
//! machine reaches the test's own containerd through a bind of its socket;
//! the test reaches crr-proxy's socket through a bind of /run/crr-proxy.
#![allow(clippy::unwrap_used, clippy::expect_used)] // tests fail loudly by design

mod support;

use std::path::{Path, PathBuf};
use std::process::{Child, Command, Output, Stdio};
use std::time::{Duration, Instant};

use support::containerd::Containerd;
use support::peers::GrpcPeer;
use support::raw;

const BINARY: &str = env!("CARGO_BIN_EXE_crr-proxy");
const VERSION: &str = env!("CARGO_PKG_VERSION");
const PATH: &str = "/usr/sbin:/usr/bin:/sbin:/bin";
const KUBELET: &str = "apiVersion: kubelet.config.k8s.io/v1beta1\nkind: KubeletConfiguration\n\
                       containerRuntimeEndpoint: unix:///run/containerd/containerd.sock\n\
                       imageServiceEndpoint: unix:///run/containerd/containerd.sock\n";
/// kubelet's stand-in: a unit of that name, so that restarts are systemd's.
const KUBELET_UNIT: &str =
    "[Service]\nExecStart=/bin/sleep infinity\n\n[Install]\nWantedBy=multi-user.target\n";

fn root() -> PathBuf {
    let root = std::env::var_os("CRR_TEST_NSPAWN_ROOT")
        .map(PathBuf::from)
        .unwrap_or_else(|| "/var/cache/crr-proxy-test/nspawn-bookworm".into());
    assert!(
        root.join("usr/lib/systemd/systemd").exists(),
        "{} has no systemd: scripts/test.sh makes the root (ensure_nspawn_root)",
        root.display()
    );
    root
}

fn text(out: &Output) -> String {
    String::from_utf8_lossy(&out.stdout).into_owned() + &String::from_utf8_lossy(&out.stderr)
}

fn ok(command: &mut Command) -> String {
    let out = command.env("PATH", PATH).output().unwrap();
    assert!(out.status.success(), "{command:?} failed:\n{}", text(&out));
    text(&out)
}

/// A booted machine: systemd as PID 1 of its own namespaces, on an overlay
/// of the cached root that goes away with it.
struct Machine {
    dir: PathBuf,
    nspawn: Child,
    leader: u32,
}

impl Machine {
    /// Boots with `binds` (host path, path inside) and waits until systemd
    /// says the system is up.
    fn boot(dir: &Path, binds: &[(&Path, &str)]) -> Self {
        let merged = dir.join("merged");
        for sub in ["upper", "work", "merged"] {
            std::fs::create_dir_all(dir.join(sub)).unwrap();
        }
        ok(Command::new("mount")
            .args(["-t", "overlay", "overlay", "-o"])
            .arg(format!(
                "lowerdir={},upperdir={},workdir={}",
                root().display(),
                dir.join("upper").display(),
                dir.join("work").display()
            ))
            .arg(&merged));
        let console = std::fs::File::create(dir.join("console.log")).unwrap();
        let mut nspawn = Command::new("systemd-nspawn");
        nspawn
            .arg("-D")
            .arg(&merged)
            .args(["--boot", "--register=no", "--keep-unit", "--console=pipe"])
            .arg(format!("--machine=crr-{}", std::process::id()));
        for (host, inside) in binds {
            nspawn.arg(format!("--bind={}:{inside}", host.display()));
        }
        let nspawn = nspawn
            .env("PATH", PATH)
            .stdin(Stdio::null())
            .stdout(console.try_clone().unwrap())
            .stderr(console)
            .spawn()
            .unwrap();
        let mut machine = Self {
            dir: dir.to_owned(),
            leader: 0,
            nspawn,
        };
        let deadline = Instant::now() + Duration::from_secs(60);
        machine.leader = loop {
            if let Some(pid) = child_of(machine.nspawn.id()) {
                break pid;
            }
            assert!(Instant::now() < deadline, "no init:\n{}", machine.console());
            std::thread::sleep(Duration::from_millis(100));
        };
        loop {
            let state = machine.sh("systemctl is-system-running");
            let state = String::from_utf8_lossy(&state.stdout).trim().to_owned();
            if state == "running" || state == "degraded" {
                break;
            }
            assert!(
                Instant::now() < deadline,
                "systemd is {state:?}:\n{}",
                machine.console()
            );
            std::thread::sleep(Duration::from_millis(200));
        }
        machine
    }

    fn console(&self) -> String {
        std::fs::read_to_string(self.dir.join("console.log")).unwrap_or_default()
    }

    fn merged(&self) -> PathBuf {
        self.dir.join("merged")
    }

    fn sh(&self, script: &str) -> Output {
        sh_in(self.leader, script)
    }

    /// `sh`, which must succeed; what it printed.
    fn ok(&self, script: &str) -> String {
        let out = self.sh(script);
        assert!(out.status.success(), "{script}:\n{}", text(&out));
        text(&out)
    }

    fn show(&self, unit: &str, property: &str) -> String {
        self.ok(&format!("systemctl show -P {property} {unit}"))
            .trim()
            .to_owned()
    }

    fn active(&self, unit: &str) -> String {
        let out = self.sh(&format!("systemctl is-active {unit}"));
        String::from_utf8_lossy(&out.stdout).trim().to_owned()
    }

    fn file(&self, path: &str) -> Option<String> {
        std::fs::read_to_string(self.merged().join(path.trim_start_matches('/'))).ok()
    }
}

impl Drop for Machine {
    fn drop(&mut self) {
        let _ = self.sh("systemctl poweroff --no-block");
        let deadline = Instant::now() + Duration::from_secs(20);
        while matches!(self.nspawn.try_wait(), Ok(None)) && Instant::now() < deadline {
            std::thread::sleep(Duration::from_millis(100));
        }
        if matches!(self.nspawn.try_wait(), Ok(None)) {
            let _ = Command::new("kill")
                .args(["-9", &self.leader.to_string()])
                .status();
            let _ = self.nspawn.kill();
            let _ = self.nspawn.wait();
        }
        let _ = Command::new("umount").arg(self.merged()).status();
        let _ = std::fs::remove_dir_all(&self.dir);
    }
}

/// `script` by /bin/sh inside the namespaces of the machine whose init is
/// `leader`, bounded.
fn sh_in(leader: u32, script: &str) -> Output {
    Command::new("nsenter")
        .arg(format!("--target={leader}"))
        .args(["--mount", "--uts", "--ipc", "--net", "--pid", "--"])
        .args(["timeout", "120", "/bin/sh", "-c", script])
        .env_clear()
        .env("PATH", PATH)
        .env("LANG", "C.UTF-8")
        .output()
        .unwrap()
}

/// The first process whose parent is `parent`.
fn child_of(parent: u32) -> Option<u32> {
    std::fs::read_dir("/proc")
        .ok()?
        .flatten()
        .find_map(|entry| {
            let pid: u32 = entry.file_name().to_str()?.parse().ok()?;
            let status = std::fs::read_to_string(entry.path().join("status")).ok()?;
            let ppid: u32 = status
                .lines()
                .find_map(|l| l.strip_prefix("PPid:"))?
                .trim()
                .parse()
                .ok()?;
            (ppid == parent).then_some(pid)
        })
}

/// One CRI Version call on a new connection; containerd's answer as
/// gRPC status and body.
async fn version(socket: &Path) -> Result<(), String> {
    version_within(socket, Duration::from_secs(10)).await
}

/// [`version`], waiting for the answer up to `within`.
async fn version_within(socket: &Path, within: Duration) -> Result<(), String> {
    let call = async {
        let mut sender = raw::connect(socket).await?;
        let request = raw::grpc_request(
            "/runtime.v1.RuntimeService/Version",
            &[],
            vec![0, 0, 0, 0, 0],
        );
        raw::record(raw::send(&mut sender, request).await?).await
    };
    match tokio::time::timeout(within, call).await {
        Ok(Ok(recorded)) => {
            let status = recorded
                .trailers
                .as_ref()
                .and_then(|t| t.get("grpc-status"))
                .and_then(|v| v.to_str().ok())
                .unwrap_or("none")
                .to_owned();
            let body = String::from_utf8_lossy(&recorded.data).into_owned();
            if status == "0" && body.contains("containerd") {
                Ok(())
            } else {
                Err(format!("grpc-status {status}, body {body:?}"))
            }
        }
        Ok(Err(error)) => Err(format!("{error:#}")),
        Err(_) => Err(format!("no answer in {within:?}")),
    }
}

/// Calls back to back for `for_how_long`, on a new connection each (our own
/// client) and on one grpcio channel (as kubelet keeps one), retrying
/// nothing: (calls ok, failures) of each.
async fn load(socket: &Path, for_how_long: Duration) -> ((u32, Vec<String>), (u32, Vec<String>)) {
    let until = Instant::now() + for_how_long;
    let ours = tokio::spawn({
        let socket = socket.to_owned();
        async move {
            let (mut ok, mut failed) = (0, Vec::new());
            while Instant::now() < until {
                match version(&socket).await {
                    Ok(()) => ok += 1,
                    Err(e) => failed.push(e),
                }
            }
            (ok, failed)
        }
    });
    let grpcio = tokio::task::spawn_blocking({
        let mut peer = GrpcPeer::start(socket);
        move || {
            let (mut ok, mut failed) = (0, Vec::new());
            while Instant::now() < until {
                let answer = peer.call_blocking("/runtime.v1.RuntimeService/Version", 10);
                match answer["code"].as_str() {
                    Some("OK") => ok += 1,
                    _ => failed.push(answer.to_string()),
                }
            }
            (ok, failed)
        }
    });
    (ours.await.unwrap(), grpcio.await.unwrap())
}

fn inode(path: &Path) -> u64 {
    use std::os::unix::fs::MetadataExt;
    std::fs::metadata(path).unwrap().ino()
}

/// A release of the suite's binary (scripts/release.sh) and a machine
/// booted to install it: the release at /dist, the test's containerd
/// socket at `runtime`, and crr-proxy's socket folder bound out to
/// `socket`'s. (Bound in that order, the machine goes before containerd.)
async fn released(name: &str, runtime: &str) -> (Containerd, Machine, PathBuf, String) {
    let ctrd = tokio::task::spawn_blocking(Containerd::start)
        .await
        .unwrap()
        .unwrap();
    let dir = ctrd.scratch(name);
    let dist = dir.join("dist");
    ok(Command::new("bash")
        .arg(concat!(env!("CARGO_MANIFEST_DIR"), "/scripts/release.sh"))
        .args(["--binary", BINARY, "--allow-dirty", "--out"])
        .arg(&dist));
    let arch = ok(Command::new("dpkg").arg("--print-architecture"))
        .trim()
        .to_owned();
    let run = dir.join("run");
    std::fs::create_dir_all(&run).unwrap();
    let machine = Machine::boot(
        &dir.join("machine"),
        &[
            (&ctrd.socket(), runtime),
            (&run, "/run/crr-proxy"),
            (&dist, "/dist"),
        ],
    );
    (ctrd, machine, run.join("crr-proxy.sock"), arch)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_release_installs_and_runs_under_a_real_systemd() {
    let (_ctrd, machine, socket, arch) =
        released("systemd", "/run/containerd/containerd.sock").await;
    machine.ok(&format!(
        "mkdir -p /var/lib/kubelet && printf '{}' >/var/lib/kubelet/config.yaml && \
         printf '{}' >/etc/systemd/system/kubelet.service && systemctl daemon-reload && \
         systemctl enable --now kubelet.service",
        KUBELET.replace('\n', "\\n"),
        KUBELET_UNIT.replace('\n', "\\n")
    ));

    // The .deb: the socket listens, the service waits for its first call,
    // kubelet is left alone.
    machine.ok(&format!("dpkg -i /dist/crr-proxy_{VERSION}_{arch}.deb"));
    assert_eq!(machine.active("crr-proxy.socket"), "active");
    assert_eq!(machine.active("crr-proxy.service"), "inactive");
    assert_eq!(
        machine.file("/var/lib/kubelet/config.yaml").unwrap(),
        KUBELET
    );
    version(&socket).await.unwrap();
    assert_eq!(machine.active("crr-proxy.service"), "active");

    // systemctl restart under calls back to back: none fails.
    let listening = inode(&socket);
    let restarts = tokio::task::spawn_blocking({
        let leader = machine.leader;
        move || {
            for _ in 0..3 {
                std::thread::sleep(Duration::from_millis(900));
                let out = sh_in(leader, "systemctl restart crr-proxy.service");
                assert!(out.status.success(), "{}", text(&out));
            }
        }
    });
    let ((ok_calls, failed), (grpcio_ok, grpcio_failed)) =
        load(&socket, Duration::from_secs(4)).await;
    restarts.await.unwrap();
    eprintln!(
        "systemctl restart x3 under load: {ok_calls} calls ok, {} failed; grpcio on one channel: \
         {grpcio_ok} ok, {} failed",
        failed.len(),
        grpcio_failed.len()
    );
    assert!(
        failed.is_empty(),
        "calls failed across restarts: {:?}",
        &failed[..failed.len().min(3)]
    );
    assert!(
        grpcio_failed.is_empty(),
        "grpcio calls failed: {:?}",
        &grpcio_failed[..grpcio_failed.len().min(3)]
    );
    assert!(
        ok_calls > 20 && grpcio_ok > 20,
        "too little load: {ok_calls}, {grpcio_ok}"
    );
    assert_eq!(inode(&socket), listening, "the socket was made again");

    // kill -9 of the daemon (as the OOM killer or a crash ends it):
    // systemd starts it again; the socket stays. (Not `systemctl kill`,
    // which signals every process in the unit's cgroup, and once failed
    // here: "Failed to send signal SIGKILL to auxiliary processes:
    // Input/output error".)
    let before = machine.show("crr-proxy.service", "MainPID");
    machine.ok(&format!("kill -KILL {before}"));
    let deadline = Instant::now() + Duration::from_secs(20);
    loop {
        let pid = machine.show("crr-proxy.service", "MainPID");
        if machine.active("crr-proxy.service") == "active" && pid != before && pid != "0" {
            break;
        }
        assert!(Instant::now() < deadline, "not started again after kill -9");
        std::thread::sleep(Duration::from_millis(100));
    }
    assert_eq!(machine.show("crr-proxy.service", "NRestarts"), "1");
    assert_eq!(machine.active("crr-proxy.socket"), "active");
    assert_eq!(inode(&socket), listening);
    version(&socket).await.unwrap();

    // Wedged (SIGSTOP): no answer on the socket, so no watchdog ping;
    // systemd kills it after WatchdogSec and starts it again. A call made
    // meanwhile waits in the socket's backlog and is answered then.
    let before = machine.show("crr-proxy.service", "MainPID");
    machine.ok(&format!("kill -STOP {before}"));
    let stopped = Instant::now();
    let waiting = tokio::spawn({
        let socket = socket.clone();
        async move { version_within(&socket, Duration::from_secs(120)).await }
    });
    let deadline = stopped + Duration::from_secs(120);
    loop {
        let pid = machine.show("crr-proxy.service", "MainPID");
        if machine.active("crr-proxy.service") == "active" && pid != before && pid != "0" {
            break;
        }
        assert!(
            Instant::now() < deadline,
            "a stopped crr-proxy was not replaced"
        );
        std::thread::sleep(Duration::from_millis(200));
    }
    let replaced = stopped.elapsed();
    waiting.await.unwrap().unwrap();
    eprintln!("SIGSTOP: replaced after {replaced:?}, the waiting call answered");
    assert!(
        replaced >= Duration::from_secs(15),
        "replaced before the watchdog's period: {replaced:?}"
    );
    assert_eq!(machine.show("crr-proxy.service", "NRestarts"), "2");
    let journal = machine.ok("journalctl --no-pager -u crr-proxy.service");
    assert!(journal.contains("Watchdog timeout"), "{journal}");
    assert_eq!(inode(&socket), listening);

    // The hardening systemd itself scores for the running service.
    let security = machine.ok("systemd-analyze security --no-pager crr-proxy.service");
    let score: f64 = security
        .lines()
        .find_map(|l| l.strip_prefix("→ Overall exposure level for crr-proxy.service: "))
        .and_then(|rest| rest.split_whitespace().next())
        .and_then(|n| n.parse().ok())
        .unwrap_or_else(|| panic!("no score in:\n{security}"));
    eprintln!("systemd-analyze security crr-proxy.service (running): {score}");
    assert!(score <= 1.8, "{security}");

    // The .deb's installer switches kubelet; the package is then not
    // removed, until kubelet is put back.
    let kubelet_started = machine.show("kubelet.service", "ExecMainStartTimestampMonotonic");
    machine.ok("/usr/share/crr-proxy/scripts/install.sh --kubelet-only");
    let switched = machine.file("/var/lib/kubelet/config.yaml").unwrap();
    assert!(
        switched.contains("containerRuntimeEndpoint: unix:///run/crr-proxy/crr-proxy.sock"),
        "{switched}"
    );
    assert_ne!(
        machine.show("kubelet.service", "ExecMainStartTimestampMonotonic"),
        kubelet_started
    );
    let refused = machine.sh("dpkg -r crr-proxy");
    assert!(!refused.status.success(), "{}", text(&refused));
    assert_eq!(machine.active("crr-proxy.socket"), "active");
    // The package's crr-proxy under kubelet's identity, on a node that has
    // no /etc/kubernetes yet: it still serves.
    machine.ok("/usr/share/crr-proxy/scripts/install.sh --kubelet-only --identity kubelet");
    let dropin = "/etc/systemd/system/crr-proxy.service.d/kubelet-identity.conf";
    assert!(machine.file(dropin).is_some());
    version(&socket).await.unwrap();
    assert_eq!(machine.active("crr-proxy.service"), "active");
    machine.ok("/usr/share/crr-proxy/scripts/install.sh --kubelet-only --uninstall");
    assert_eq!(
        machine.file("/var/lib/kubelet/config.yaml").unwrap(),
        KUBELET
    );
    machine.ok("dpkg --purge crr-proxy");
    assert_eq!(machine.active("crr-proxy.socket"), "inactive");
    assert!(!socket.exists());
    assert!(machine.file("/etc/crr-proxy/crr-proxy.env").is_none());
    assert!(
        machine.file(dropin).is_none(),
        "the purge leaves the drop-in"
    );

    // The tarball, with no checkout and no toolchain: its install.sh
    // switches kubelet and restarts it; --uninstall puts both back.
    let tarball = format!("crr-proxy-{VERSION}-linux-{arch}");
    machine.ok(&format!(
        "cd /opt && tar xzf /dist/{tarball}.tar.gz && /opt/{tarball}/scripts/install.sh"
    ));
    assert_eq!(machine.active("crr-proxy.socket"), "active");
    assert_eq!(machine.active("crr-proxy.service"), "active");
    assert!(
        machine
            .file("/var/lib/kubelet/config.yaml")
            .unwrap()
            .contains("imageServiceEndpoint: unix:///run/crr-proxy/crr-proxy.sock")
    );
    version(&socket).await.unwrap();
    let again = machine.ok(&format!("/opt/{tarball}/scripts/install.sh"));
    assert!(again.contains("kubelet is not restarted"), "{again}");

    // kubeadm's credentials as a node holds them when the service starts
    // (InaccessiblePaths= hides only what exists then): the service reads
    // none by default; under kubelet's identity, kubelet's kubeconfig and
    // client certificate (through its link) and nothing else.
    machine.ok(
        "mkdir -p /etc/kubernetes/pki /var/lib/kubelet/pki && \
         echo admin > /etc/kubernetes/admin.conf && echo ca > /etc/kubernetes/pki/ca.key && \
         mkdir -p /etc/kubernetes/tmp/kubeadm-backup-etcd && \
         echo etcd > /etc/kubernetes/tmp/kubeadm-backup-etcd/db && \
         echo serving > /var/lib/kubelet/pki/kubelet.key && \
         echo client > /var/lib/kubelet/pki/kubelet-client-2026-12-05-00-00-00.pem && \
         ln -sf kubelet-client-2026-12-05-00-00-00.pem /var/lib/kubelet/pki/kubelet-client-current.pem && \
         printf 'apiVersion: v1\nkind: Config\n' > /etc/kubernetes/kubelet.conf && \
         systemctl restart crr-proxy.service",
    );
    // Made inaccessible, a file reads as empty even to root (an empty
    // directory or file is mounted over it), so its text is what tells.
    let readable = |path: &str| {
        let pid = machine.show("crr-proxy.service", "MainPID");
        let out = machine.sh(&format!("nsenter -t {pid} -m cat {path}"));
        out.status.success() && !out.stdout.is_empty()
    };
    let kubelets = [
        "/etc/kubernetes/kubelet.conf",
        "/var/lib/kubelet/pki/kubelet-client-current.pem",
    ];
    let others = [
        "/etc/kubernetes/admin.conf",
        "/etc/kubernetes/pki/ca.key",
        "/etc/kubernetes/tmp/kubeadm-backup-etcd/db",
        "/var/lib/kubelet/pki/kubelet.key",
    ];
    for path in kubelets.iter().chain(&others) {
        assert!(!readable(path), "{path} is readable to the service");
    }
    let before = machine.show("crr-proxy.service", "MainPID");
    machine.ok(&format!(
        "/opt/{tarball}/scripts/install.sh --identity kubelet"
    ));
    assert_ne!(machine.show("crr-proxy.service", "MainPID"), before);
    for path in kubelets {
        assert!(readable(path), "{path} is not readable to the service");
    }
    for path in others {
        assert!(!readable(path), "{path} is readable to the service");
    }
    assert!(
        machine
            .file("/etc/crr-proxy/crr-proxy.env")
            .unwrap()
            .contains("CRR_PROXY_KUBECONFIG=/etc/kubernetes/kubelet.conf")
    );
    version(&socket).await.unwrap();
    let kubelet_started = machine.show("kubelet.service", "ExecMainStartTimestampMonotonic");
    machine.ok(&format!("/opt/{tarball}/scripts/install.sh --uninstall"));
    assert_eq!(
        machine.file("/var/lib/kubelet/config.yaml").unwrap(),
        KUBELET
    );
    assert_ne!(
        machine.show("kubelet.service", "ExecMainStartTimestampMonotonic"),
        kubelet_started
    );
    assert_eq!(machine.active("crr-proxy.socket"), "inactive");
    let units = machine.ok("systemctl list-unit-files 'crr-proxy*' --no-legend || true");
    assert!(units.trim().is_empty(), "{units}");
    assert!(
        machine
            .file("/etc/systemd/system/crr-proxy.service.d/kubelet-identity.conf")
            .is_none()
    );
    drop(machine);
}

/// kubelet's runtime, as a CRI-O node's kubeadm flags name it, with
/// kubelet in a unit of another name (found from its running process): the
/// tarball's install.sh carries it into crr-proxy's settings and points
/// kubelet at crr-proxy only once crr-proxy answers for that runtime. The
/// docs' bypass (`scripts/install.sh --bypass`) points kubelet straight
/// back and keeps crr-proxy running with its settings; `--kubelet-only`
/// undoes it; `--uninstall` restarts kubelet on its runtime while crr-proxy's
/// socket still answers, and only then stops it.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_switch_carries_kubelets_runtime_and_the_bypass_keeps_crr_proxy() {
    const RUNTIME: &str = "unix:///run/elsewhere/runtime.sock";
    const FLAGS: &str = "/var/lib/kubelet/kubeadm-flags.env";
    let docs = std::fs::read_to_string(concat!(env!("CARGO_MANIFEST_DIR"), "/docs/installing.md"))
        .unwrap();
    for command in [
        "sudo scripts/install.sh --bypass",
        "sudo scripts/install.sh --kubelet-only",
        "sudo scripts/install.sh --uninstall",
    ] {
        assert!(
            docs.contains(command),
            "docs/installing.md lost {command:?}"
        );
    }
    // containerd answers only where kubelet's flag will say, never at
    // crr-proxy's default endpoint.
    let (_ctrd, machine, socket, arch) =
        released("systemd-carry", RUNTIME.trim_start_matches("unix://")).await;
    // kubelet's stand-in notes, each time it starts, whether crr-proxy's
    // socket is there.
    // Its unit is named otherwise and its binary is in /opt/bin (as on
    // Flatcar): install.sh finds the unit from the running process.
    let unit = "[Service]\nExecStartPre=/bin/sh -c 'systemctl is-active crr-proxy.socket >>/run/kubelet-saw || true'\n\
                ExecStart=/opt/bin/kubelet infinity\n\n[Install]\nWantedBy=multi-user.target\n";
    let config = "apiVersion: kubelet.config.k8s.io/v1beta1\nkind: KubeletConfiguration\ncgroupDriver: systemd\n";
    let absent = "KUBELET_KUBEADM_ARGS=\"--container-runtime-endpoint=unix:///run/crio/crio.sock --node-ip=10.0.0.5\"\n";
    let flags = absent.replace("unix:///run/crio/crio.sock", RUNTIME);
    for (path, content) in [
        ("/var/lib/kubelet/config.yaml", config),
        (FLAGS, absent),
        ("/etc/systemd/system/node-kubelet.service", unit),
    ] {
        let path = machine.merged().join(path.trim_start_matches('/'));
        std::fs::create_dir_all(path.parent().unwrap()).unwrap();
        std::fs::write(path, content).unwrap();
    }
    machine.ok(
        "mkdir -p /opt/bin && ln -sf /bin/sleep /opt/bin/kubelet && \
         systemctl daemon-reload && systemctl enable --now node-kubelet.service",
    );
    let tarball = format!("crr-proxy-{VERSION}-linux-{arch}");
    machine.ok(&format!("cd /opt && tar xzf /dist/{tarball}.tar.gz"));
    let install =
        |args: &str| machine.sh(&format!("cd /opt/{tarball} && scripts/install.sh {args}"));
    let started = || machine.show("node-kubelet.service", "ExecMainStartTimestampMonotonic");
    // Though the units' Before= does not name it, kubelet's unit starts
    // after crr-proxy's socket listens: sockets.target comes before
    // basic.target.
    let after = machine.show("node-kubelet.service", "After");
    assert!(after.contains("basic.target"), "{after}");

    // kubelet's runtime does not answer: kubelet is left as it is.
    let kubelet_started = started();
    let refused = install("");
    let said = text(&refused);
    assert!(!refused.status.success(), "{said}");
    assert!(
        said.contains("kubelet is left as it is") && said.contains("unix:///run/crio/crio.sock"),
        "{said}"
    );
    assert_eq!(machine.file(FLAGS).unwrap(), absent);
    assert_eq!(started(), kubelet_started, "kubelet was restarted");
    assert!(
        machine
            .file("/etc/crr-proxy/crr-proxy.env")
            .unwrap()
            .contains("CRR_PROXY_RUNTIME_ENDPOINT=unix:///run/crio/crio.sock\n")
    );

    // The flag corrected: carried, checked through crr-proxy, switched.
    machine.ok(&format!(
        "sed -i 's|unix:///run/crio/crio.sock|{RUNTIME}|' {FLAGS}"
    ));
    let out = install("");
    let said = text(&out);
    assert!(out.status.success(), "{said}");
    assert!(said.contains("the same runtime"), "{said}");
    assert!(
        machine
            .file("/etc/crr-proxy/crr-proxy.env")
            .unwrap()
            .contains(&format!("CRR_PROXY_RUNTIME_ENDPOINT={RUNTIME}\n"))
    );
    assert!(
        machine
            .file(FLAGS)
            .unwrap()
            .contains("--container-runtime-endpoint=unix:///run/crr-proxy/crr-proxy.sock"),
        "{said}"
    );
    assert_ne!(started(), kubelet_started);
    version(&socket).await.unwrap();
    let before = machine.show("crr-proxy.socket", "Before");
    assert!(before.contains("sockets.target"), "{before}");

    // The bypass, with crr-proxy wedged: kubelet back on its runtime,
    // crr-proxy kept as it is.
    let settings = machine.file("/etc/crr-proxy/crr-proxy.env").unwrap();
    let pid = machine.show("crr-proxy.service", "MainPID");
    let kubelet_started = started();
    machine.ok(&format!("kill -STOP {pid}"));
    let out = install("--bypass");
    machine.ok(&format!("kill -CONT {pid}"));
    assert!(out.status.success(), "{}", text(&out));
    assert_eq!(machine.file(FLAGS).unwrap(), flags);
    assert_ne!(started(), kubelet_started);
    assert_eq!(machine.show("crr-proxy.service", "MainPID"), pid);
    assert_eq!(machine.active("crr-proxy.socket"), "active");
    assert_eq!(
        machine.file("/etc/crr-proxy/crr-proxy.env").unwrap(),
        settings
    );
    assert!(machine.merged().join("usr/local/bin/crr-proxy").is_file());
    version(&socket).await.unwrap();

    let out = install("--kubelet-only");
    assert!(out.status.success(), "{}", text(&out));
    assert!(
        machine
            .file(FLAGS)
            .unwrap()
            .contains("--container-runtime-endpoint=unix:///run/crr-proxy/crr-proxy.sock")
    );

    // Uninstalled: kubelet restarted while the socket still listened.
    let out = install("--uninstall");
    assert!(out.status.success(), "{}", text(&out));
    assert_eq!(machine.file(FLAGS).unwrap(), flags);
    let saw = machine.ok("cat /run/kubelet-saw");
    assert_eq!(
        saw.lines().last(),
        Some("active"),
        "kubelet's starts saw: {saw}"
    );
    assert_eq!(machine.active("crr-proxy.socket"), "inactive");
    drop(machine);
}
