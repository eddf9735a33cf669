//! The CRI's own validation suite, critest (sigs.k8s.io/cri-tools, written
//! by people who are not us), run twice on the containerd line of the test
//! run (`CRR_TEST_CONTAINERD`): against a fresh private containerd directly,
//! then against another through crr-proxy. Every spec must end the same way
//! both times: the same passes, the same failures, the same skips. A spec
//! that does not is excused only as the runtime's own flake: when a direct
//! run of the suite again ends it as the run through crr-proxy did.
//!
//! critest pulls its images from the registries it names. Here containerd
//! takes every registry from a private one on loopback (its `_default`
//! registry host), filled with stand-ins built from busybox under the same
//! paths and tags: the same users, groups and web servers where a spec
//! looks at them. An image critest names by digest cannot be made again,
//! so those specs fail, both ways alike.
//!
//! Exec, attach and port-forward: the `Exec`, `Attach` and `PortForward`
//! calls pass through crr-proxy, and their answer is a URL of containerd's
//! own streaming server, which critest then talks to directly, as kubelet
//! does. The test shows the calls in crr-proxy's metrics.
#![allow(clippy::unwrap_used, clippy::expect_used)] // tests fail loudly by design

mod support;

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::process::Command;

use serde_json::Value;
use support::ProxyUnderTest;
use support::containerd::Containerd;
use support::images::{build_variant, busybox_config, pause_config};
use support::metrics::cri_calls;
use support::registry::Registry;

/// The ginkgo seed of both runs: the same specs in the same order.
const SEED: &str = "1";
/// critest's parallel nodes (its `--parallel`, run by the ginkgo command;
/// upstream's CI runs 8). Most specs wait on the runtime.
const NODES: usize = 4;

/// Files an image adds to busybox: path, mode, content.
type Files = Vec<(&'static str, u32, Vec<u8>)>;

/// An image of the stand-ins: its path and tags, its config and the files
/// it adds to busybox.
struct StandIn {
    path: String,
    tags: &'static [&'static str],
    config: String,
    files: Files,
}

/// A web server's start script (its process has the script's name, as
/// `pidof nginx` wants): it writes its pid to
/// `/var/run/<name>.pid`, says its name on stderr (the log specs look for
/// it), serves `/www` on `port` and exits on SIGTERM.
fn web_server(name: &str, port: u16) -> Vec<u8> {
    format!(
        "#!/bin/sh\n\
         echo $$ > /var/run/{name}.pid\n\
         echo \"{name}: serving on port {port}\" >&2\n\
         httpd -f -p {port} -h /www &\n\
         child=$!\n\
         trap 'kill $child; exit 0' TERM INT\n\
         wait $child\n"
    )
    .into_bytes()
}

/// The images critest pulls, by path and tag (its registries are all one
/// here), as critest's own image folders build them where a spec looks.
fn stand_ins() -> Vec<StandIn> {
    const STAGING: &str = "k8s-staging-cri-tools";
    const E2E: &str = "e2e-test-images";
    let arch = match std::env::consts::ARCH {
        "x86_64" => "amd64",
        "aarch64" => "arm64",
        other => other,
    };
    let shell = || busybox_config(r#""Cmd":["sh"]"#);
    // A web server answering 200 on `/` at `port`, as nginx and httpd do.
    let web = |name: &'static str, port: u16| {
        // nginx's process is `nginx`; httpd's image starts `httpd-foreground`.
        let script = if name == "nginx" {
            "usr/sbin/nginx"
        } else {
            "usr/sbin/httpd-foreground"
        };
        // nginx's first process shows `master process` in its command
        // line, which a spec waits for.
        let args = if name == "nginx" {
            r#","-g","master process""#
        } else {
            ""
        };
        (
            busybox_config(&format!(r#""Cmd":["/{script}"{args}]"#)),
            vec![
                ("www/index.html", 0o644, b"<h1>stand-in</h1>\n".to_vec()),
                ("var/run/.keep", 0o644, Vec::new()),
                (script, 0o755, web_server(name, port)),
            ],
        )
    };
    // busybox's users and groups, and those the user images name.
    let passwd = b"root:x:0:0:root:/root:/bin/sh\n\
        www-data:x:33:33:www-data:/var/www:/bin/false\n\
        default-user:x:1000:1000::/home/default-user:/bin/sh\n\
        nobody:x:65534:65534:nobody:/nonexistent:/bin/false\n"
        .to_vec();
    let group = b"root:x:0:\nwww-data:x:33:\nusers:x:100:\ndefault-user:x:1000:\n\
        group-defined-in-image:x:50000:default-user\nnogroup:x:65534:\n"
        .to_vec();
    let user = |user: &str| {
        (
            busybox_config(&format!(r#""Cmd":["sh"],"User":"{user}""#)),
            vec![
                ("etc/passwd", 0o644, passwd.clone()),
                ("etc/group", 0o644, group.clone()),
            ],
        )
    };
    let mut images = Vec::new();
    let mut add = |path: String, tags, (config, files): (String, Files)| {
        images.push(StandIn {
            path,
            tags,
            config,
            files,
        });
    };
    add(format!("{E2E}/busybox"), &["1.29-2"], (shell(), vec![]));
    add(format!("{E2E}/nginx"), &["1.14-2"], web("nginx", 80));
    add(format!("{E2E}/httpd"), &["2.4.39-4"], web("httpd", 80));
    add(
        format!("{STAGING}/hostnet-nginx-{arch}"),
        &["latest"],
        web("nginx", 12003),
    );
    add(
        format!("{STAGING}/test-image-latest"),
        &["latest"],
        (shell(), vec![]),
    );
    add(
        format!("{STAGING}/test-image-tag"),
        &["test", "all"],
        (shell(), vec![]),
    );
    // One image under three tags.
    add(
        format!("{STAGING}/test-image-tags"),
        &["1", "2", "3"],
        (shell(), vec![]),
    );
    // Three images: their configs differ.
    for (n, name) in ["test-image-1", "test-image-2", "test-image-3"]
        .iter()
        .enumerate()
    {
        let config = busybox_config(&format!(r#""Cmd":["sh"],"Labels":{{"n":"{n}"}}"#));
        add(format!("{STAGING}/{name}"), &["latest"], (config, vec![]));
    }
    add(
        format!("{STAGING}/test-image-user-uid"),
        &["latest"],
        user("1002"),
    );
    add(
        format!("{STAGING}/test-image-user-username"),
        &["latest"],
        user("www-data"),
    );
    add(
        format!("{STAGING}/test-image-user-uid-group"),
        &["latest"],
        user("1003:users"),
    );
    add(
        format!("{STAGING}/test-image-user-username-group"),
        &["latest"],
        user("www-data:users"),
    );
    add(
        format!("{STAGING}/test-image-predefined-group"),
        &["latest"],
        user("default-user"),
    );
    add("pause".to_owned(), &["3.9"], (pause_config(), vec![]));
    images
}

/// A registry holding every stand-in under each of its tags.
fn registry() -> Registry {
    let registry = Registry::start().unwrap();
    let dir = support::fresh_dir("crr-critest-images").unwrap();
    for image in stand_ins() {
        let archive = dir.join(format!("{}.oci.tar", image.path.replace('/', "_")));
        let files: Vec<(&str, u32, &[u8])> = image
            .files
            .iter()
            .map(|(p, m, c)| (*p, *m, c.as_slice()))
            .collect();
        let name = format!("{}:{}", image.path, image.tags[0]);
        build_variant(&archive, &name, &image.config, &files).unwrap();
        for tag in image.tags {
            registry
                .push(&archive, &format!("{}:{tag}", image.path))
                .unwrap();
        }
    }
    let _ = std::fs::remove_dir_all(&dir);
    registry
}

/// A containerd with a pod network (bridge, host ports, loopback), as
/// critest's networking specs need; the bridge goes with it.
struct Runtime {
    ctrd: Containerd,
    bridge: String,
}

impl Drop for Runtime {
    fn drop(&mut self) {
        let _ = Command::new("ip")
            .args(["link", "del", &self.bridge])
            .status();
    }
}

fn containerd(n: u8, registry: &Registry) -> Runtime {
    let ctrd = Containerd::start().unwrap();
    // Every registry critest names is the private one.
    let default = ctrd.registry_hosts_dir().join("_default");
    std::fs::create_dir_all(&default).unwrap();
    std::fs::write(
        default.join("hosts.toml"),
        format!(
            // `server` takes the registry's own place: a pull of an image
            // the private one lacks fails here instead of going out.
            "server = \"http://{host}\"\n\n\
             [host.\"http://{host}\"]\n  capabilities = [\"pull\", \"resolve\"]\n",
            host = registry.host
        ),
    )
    .unwrap();
    // A bridge name is at most 15 bytes.
    let bridge = format!("crrct{}n{n}", std::process::id() % 100_000);
    std::fs::write(
        ctrd.cni_conf_dir().join("10-critest.conflist"),
        format!(
            r#"{{"cniVersion": "1.0.0", "name": "critest", "plugins": [
  {{"type": "bridge", "bridge": "{bridge}", "isGateway": true, "ipMasq": true,
    "ipam": {{"type": "host-local", "ranges": [[{{"subnet": "10.246.{n}.0/24"}}]],
              "dataDir": "{ipam}"}}}},
  {{"type": "portmap", "capabilities": {{"portMappings": true}}}},
  {{"type": "loopback"}}
]}}"#,
            ipam = ctrd.scratch("ipam").display(),
        ),
    )
    .unwrap();
    Runtime { ctrd, bridge }
}

/// Runs the whole of critest against `endpoint`; returns each spec's outcome (`passed`, `failed`, `skipped`,
/// ...) by its full text, and keeps its output in `log`.
fn critest(endpoint: &str, dir: &Path, log: &str) -> BTreeMap<String, String> {
    let binary = std::env::var_os("CRR_TEST_CRITEST").map(PathBuf::from).expect(
        "CRR_TEST_CRITEST is not set: run the test command (scripts/test.sh), which builds critest",
    );
    let report = dir.join(format!("{log}.json"));
    let output = std::fs::File::create(dir.join(format!("{log}.log"))).unwrap();
    let ginkgo = std::env::var_os("CRR_TEST_GINKGO").map(PathBuf::from).expect(
        "CRR_TEST_GINKGO is not set: run the test command (scripts/test.sh), which builds ginkgo",
    );
    let path = std::env::join_paths(std::iter::once(ginkgo.parent().unwrap().to_owned()).chain(
        std::env::split_paths(&std::env::var_os("PATH").unwrap_or_default()),
    ))
    .unwrap();
    let status = Command::new(&binary)
        .env("PATH", path)
        .arg(format!("--parallel={NODES}"))
        .args(["--runtime-endpoint", endpoint, "--image-endpoint", endpoint])
        .arg(format!("--ginkgo.seed={SEED}"))
        .arg(format!("--ginkgo.json-report={}", report.display()))
        .arg("--ginkgo.no-color")
        // Its default config, /etc/crictl.yaml, is the machine's.
        .arg(format!("--config={}", dir.join("crictl.yaml").display()))
        .current_dir(dir)
        .stdout(output.try_clone().unwrap())
        .stderr(output)
        .status()
        .unwrap();
    // critest exits non-zero when a spec fails; the report says which.
    let text = std::fs::read_to_string(&report)
        .unwrap_or_else(|e| panic!("critest wrote no report ({status}): {e}; see {log}.log"));
    outcomes(&serde_json::from_str(&text).unwrap())
}

/// Between a spec's containers' texts and its own, in its name.
const LEAF: &str = " | ";

/// Direct runs of the whole suite, at most, to tell the runtime's own flake
/// from a difference crr-proxy makes.
const AGAIN: usize = 4;

/// The specs of `differ` (by name, with the outcome through crr-proxy)
/// that are the runtime's own flake: a direct run of the whole suite, on a
/// fresh containerd, ends them as the run through crr-proxy did (the same
/// test differing between two direct runs, under the same load). Returns
/// the direct outcomes seen of each.
fn direct_runs_show(
    registry: &Registry,
    dir: &Path,
    differ: &BTreeMap<String, Option<String>>,
) -> BTreeMap<String, (bool, Vec<String>)> {
    let mut seen: BTreeMap<String, (bool, Vec<String>)> = differ
        .keys()
        .map(|spec| (spec.clone(), (false, Vec::new())))
        .collect();
    for n in 0..AGAIN {
        if seen.values().all(|(flake, _)| *flake) {
            break;
        }
        let fresh = containerd(3 + n as u8, registry);
        let endpoint = fresh.ctrd.endpoint().to_string();
        let again = critest(&endpoint, dir, &format!("again-{n}"));
        for (spec, (flake, outcomes)) in seen.iter_mut().filter(|(_, (flake, _))| !*flake) {
            let outcome = again.get(spec).cloned();
            *flake = outcome == differ[spec];
            outcomes.push(outcome.unwrap_or_else(|| "not run".to_owned()));
        }
    }
    seen
}

/// Each spec's state by its text (its containers' texts, then its own);
/// prints the failures and the slowest specs, for the reader of a run.
fn outcomes(report: &Value) -> BTreeMap<String, String> {
    let mut took = Vec::new();
    let mut specs = BTreeMap::new();
    for suite in report.as_array().into_iter().flatten() {
        for spec in suite["SpecReports"].as_array().into_iter().flatten() {
            if spec["LeafNodeType"] != "It" {
                continue;
            }
            let containers: Vec<&str> = spec["ContainerHierarchyTexts"]
                .as_array()
                .into_iter()
                .flatten()
                .filter_map(Value::as_str)
                .collect();
            let leaf = spec["LeafNodeText"].as_str().unwrap_or_default();
            let name = format!("{}{LEAF}{leaf}", containers.join(" "));
            let state = spec["State"].as_str().unwrap_or("unknown").to_owned();
            let nanos = spec["RunTime"].as_u64().unwrap_or_default();
            took.push((nanos / 1_000_000_000, state.clone(), name.clone()));
            specs.insert(name, state);
        }
    }
    took.sort();
    for (seconds, state, spec) in took.iter().rev().take(8) {
        eprintln!("  slowest: {seconds} s {state}: {spec}");
    }
    for (_, _, spec) in took.iter().filter(|(_, state, _)| state == "failed") {
        eprintln!("  failed: {spec}");
    }
    specs
}

fn count(outcomes: &BTreeMap<String, String>) -> BTreeMap<&str, usize> {
    let mut by_state = BTreeMap::new();
    for state in outcomes.values() {
        *by_state.entry(state.as_str()).or_default() += 1;
    }
    by_state
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn critest_ends_every_spec_through_crr_proxy_as_directly() {
    support::init_logging();
    let dir = support::fresh_dir("crr-critest").unwrap();
    let registry = tokio::task::spawn_blocking(registry).await.unwrap();

    let plain = containerd(1, &registry);
    let endpoint = plain.ctrd.endpoint().to_string();
    let direct = {
        let dir = dir.clone();
        tokio::task::spawn_blocking(move || critest(&endpoint, &dir, "direct"))
            .await
            .unwrap()
    };

    drop(plain);
    let behind = containerd(2, &registry);
    let proxy = ProxyUnderTest::to(behind.ctrd.endpoint());
    let endpoint = proxy.endpoint().to_string();
    let proxied = {
        let dir = dir.clone();
        tokio::task::spawn_blocking(move || critest(&endpoint, &dir, "proxied"))
            .await
            .unwrap()
    };
    let calls = cri_calls(&proxy.metrics.render());
    proxy.stop().await;

    eprintln!(
        "critest on containerd {:?}: directly {:?}, through crr-proxy {:?}",
        support::containerd::containerd_version().unwrap_or_default(),
        count(&direct),
        count(&proxied)
    );
    assert!(direct.len() > 50, "critest ran too few specs: {direct:#?}");
    assert!(
        direct.values().filter(|s| *s == "passed").count() > direct.len() / 2,
        "most specs must pass directly, or the comparison says little: {direct:#?}"
    );
    let differ: BTreeMap<String, Option<String>> = direct
        .keys()
        .chain(proxied.keys())
        .filter(|spec| direct.get(*spec) != proxied.get(*spec))
        .map(|spec| (spec.clone(), proxied.get(spec).cloned()))
        .collect();
    let judged = tokio::task::block_in_place(|| direct_runs_show(&registry, &dir, &differ));
    let mut unexplained = Vec::new();
    for (spec, (flake, seen)) in judged {
        let line = format!(
            "{spec}: directly {:?}, through crr-proxy {:?}; directly again: {seen:?}",
            direct.get(&spec),
            proxied.get(&spec)
        );
        if flake {
            eprintln!("  the runtime's own flake: {line}");
        } else {
            unexplained.push(line);
        }
    }
    assert!(
        unexplained.is_empty(),
        "specs that ended otherwise through crr-proxy, and never so directly (logs in {}):\n{}",
        dir.display(),
        unexplained.join("\n")
    );
    // The streaming calls went through crr-proxy; their streams did not.
    for method in ["Exec", "Attach", "PortForward", "ExecSync"] {
        let key = format!("RuntimeService/{method}");
        assert!(
            calls.get(&key).copied().unwrap_or(0) > 0,
            "{key} not seen: {calls:#?}"
        );
    }
    // CRR_TEST_KEEP=1 keeps critest's logs and reports, as it keeps a
    // cluster's files.
    if std::env::var_os("CRR_TEST_KEEP").is_none() {
        let _ = std::fs::remove_dir_all(&dir);
    }
}
