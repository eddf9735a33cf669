//! crictl (sigs.k8s.io/cri-tools), the CRI's command-line client, through
//! crr-proxy and directly against one private containerd: `run`, `exec`
//! with a large output, `logs`, `inspect`, `stats`, `stop`, `ps` and `rm`
//! print the same. Commands that make something (run, stop, rm) act on a
//! Pod of each route; their outputs match once IDs are set aside. Commands
//! that read act on one container by both routes and match byte for byte
//! (`stats` in its shape and IDs, its figures move).
#![allow(clippy::unwrap_used, clippy::expect_used)] // tests fail loudly by design

mod support;

use std::path::{Path, PathBuf};
use std::process::Command;

use serde_json::{Value, json};
use support::ProxyUnderTest;
use support::containerd::Containerd;
use support::images::BUSYBOX_IMAGE;

/// The lines the container logs before it idles.
const LOG_LINES: usize = 2000;
/// `exec`'s output: `seq 1 EXEC_LINES`, about 1.3 MB.
const EXEC_LINES: usize = 200_000;

/// crictl with a config of its own (the machine's /etc/crictl.yaml is not
/// read) naming one endpoint.
struct Crictl {
    config: PathBuf,
}

impl Crictl {
    fn to(endpoint: &str, dir: &Path, name: &str) -> Self {
        let config = dir.join(format!("{name}.yaml"));
        std::fs::write(
            &config,
            format!("runtime-endpoint: {endpoint}\nimage-endpoint: {endpoint}\ntimeout: 30\n"),
        )
        .unwrap();
        Self { config }
    }

    /// Runs `crictl <args>`; its stdout, after it succeeded.
    fn run(&self, args: &[&str]) -> Vec<u8> {
        let binary = std::env::var_os("CRR_TEST_CRICTL").map(PathBuf::from).expect(
            "CRR_TEST_CRICTL is not set: run the test command (scripts/test.sh), which builds crictl",
        );
        let out = Command::new(binary)
            .arg("--config")
            .arg(&self.config)
            .args(args)
            .output()
            .unwrap();
        assert!(
            out.status.success(),
            "crictl {args:?} ({}): {}",
            self.config.display(),
            String::from_utf8_lossy(&out.stderr)
        );
        out.stdout
    }

    fn text(&self, args: &[&str]) -> String {
        String::from_utf8(self.run(args)).unwrap()
    }

    fn json(&self, args: &[&str]) -> Value {
        serde_json::from_slice(&self.run(args)).unwrap()
    }
}

/// A Pod config and a container config of `name`, written to `dir`.
fn configs(dir: &Path, name: &str) -> (PathBuf, PathBuf) {
    let pod = dir.join(format!("{name}-pod.json"));
    let container = dir.join(format!("{name}-container.json"));
    std::fs::write(
        &pod,
        json!({
            "metadata": {"name": name, "namespace": "crictl", "uid": format!("uid-{name}"), "attempt": 0},
            "log_directory": dir.join(format!("{name}-logs")),
            "linux": {"security_context": {"namespace_options": {"network": 2}}},
        })
        .to_string(),
    )
    .unwrap();
    std::fs::write(
        &container,
        json!({
            "metadata": {"name": "app"},
            "image": {"image": BUSYBOX_IMAGE},
            "command": ["sh", "-c", format!(
                "seq 1 {LOG_LINES}; trap 'exit 0' TERM; while :; do sleep 0.1; done"
            )],
            "log_path": "app.log",
        })
        .to_string(),
    )
    .unwrap();
    (pod, container)
}

/// `text` with every ID of `ids` as `<id>`.
fn without(text: &str, ids: &[&str]) -> String {
    ids.iter()
        .fold(text.to_owned(), |text, id| text.replace(id, "<id>"))
}

/// A `stats` answer with its figures and times set aside: the keys, the
/// IDs and the names stay.
fn shape(value: &Value) -> Value {
    match value {
        Value::Object(map) => {
            Value::Object(map.iter().map(|(k, v)| (k.clone(), shape(v))).collect())
        }
        Value::Array(items) => Value::Array(items.iter().map(shape).collect()),
        Value::Number(_) => json!(0),
        Value::String(s) if s.chars().all(|c| c.is_ascii_digit()) => json!("0"),
        other => other.clone(),
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn crictl_prints_the_same_through_crr_proxy_as_directly() {
    support::init_logging();
    let ctrd = tokio::task::spawn_blocking(Containerd::start)
        .await
        .unwrap()
        .unwrap();
    let proxy = ProxyUnderTest::to(ctrd.endpoint());
    let dir = support::fresh_dir("crr-crictl").unwrap();
    let direct = Crictl::to(&ctrd.endpoint().to_string(), &dir, "direct");
    let proxied = Crictl::to(&proxy.endpoint().to_string(), &dir, "proxied");

    let dir2 = dir.clone();
    tokio::task::spawn_blocking(move || {
        let dir = dir2;
        // run: one Pod by each route.
        let (pod_a, ctr_a) = configs(&dir, "by-direct");
        let (pod_b, ctr_b) = configs(&dir, "by-proxy");
        let run = |crictl: &Crictl, ctr: &Path, pod: &Path| {
            crictl.text(&[
                "run",
                "--no-pull",
                ctr.to_str().unwrap(),
                pod.to_str().unwrap(),
            ])
        };
        let out_a = run(&direct, &ctr_a, &pod_a);
        let out_b = run(&proxied, &ctr_b, &pod_b);
        let a = out_a.trim().to_owned();
        let b = out_b.trim().to_owned();
        assert_eq!(a.len(), 64, "crictl run printed {out_a:?}");
        assert_eq!(without(&out_a, &[&a]), without(&out_b, &[&b]));
        let pods = direct.json(&["pods", "-o", "json"]);
        let pod_ids: Vec<String> = pods["items"]
            .as_array()
            .unwrap()
            .iter()
            .map(|p| p["id"].as_str().unwrap().to_owned())
            .collect();
        assert_eq!(pod_ids.len(), 2, "{pods:#}");

        // Reads: the same container by both routes.
        for id in [&a, &b] {
            let wait = std::time::Instant::now();
            while direct.text(&["logs", id]).lines().count() < LOG_LINES {
                assert!(wait.elapsed().as_secs() < 30, "{id} did not log its lines");
                std::thread::sleep(std::time::Duration::from_millis(100));
            }
            let seq = format!("seq 1 {EXEC_LINES}");
            let exec = ["exec", id, "sh", "-c", &seq];
            let big = direct.run(&exec);
            assert_eq!(big.iter().filter(|b| **b == b'\n').count(), EXEC_LINES);
            assert!(
                big == proxied.run(&exec),
                "exec's output differs through crr-proxy"
            );
            for read in [
                &["logs", id][..],
                &["inspect", "-o", "json", id],
                &["ps", "-a", "-o", "json"],
                &["pods", "-o", "json"],
                &["inspectp", "-o", "json", &pod_ids[0]],
                &["images", "-o", "json"],
            ] {
                assert_eq!(
                    direct.text(read),
                    proxied.text(read),
                    "crictl {read:?} differs through crr-proxy"
                );
            }
            let stats = ["stats", "-o", "json", "--id", id];
            // containerd 2.x gives `usageNanoCores` once it has a sample
            // to compare with: the first answer has none.
            direct.run(&stats);
            let stats_direct = direct.json(&stats);
            assert_eq!(shape(&stats_direct), shape(&proxied.json(&stats)));
            assert_eq!(
                stats_direct["stats"][0]["attributes"]["id"],
                json!(id),
                "{stats_direct:#}"
            );
        }

        // stop and rm: each route its own container, then its Pod.
        let stopped_a = direct.text(&["stop", &a]);
        let stopped_b = proxied.text(&["stop", &b]);
        assert_eq!(without(&stopped_a, &[&a]), without(&stopped_b, &[&b]));
        let ps = ["ps", "-a", "-o", "json"];
        let listed = direct.json(&ps);
        assert_eq!(listed, proxied.json(&ps));
        for container in listed["containers"].as_array().unwrap() {
            assert_eq!(container["state"], "CONTAINER_EXITED", "{listed:#}");
        }
        let removed_a = direct.text(&["rm", &a]);
        let removed_b = proxied.text(&["rm", &b]);
        assert_eq!(without(&removed_a, &[&a]), without(&removed_b, &[&b]));
        assert_eq!(direct.text(&["ps", "-a", "-q"]), "");
        assert_eq!(proxied.text(&["ps", "-a", "-q"]), "");
        let gone_a = direct.text(&["rmp", "-f", &pod_ids[0]]);
        let gone_b = proxied.text(&["rmp", "-f", &pod_ids[1]]);
        assert_eq!(
            without(&gone_a, &[&pod_ids[0]]),
            without(&gone_b, &[&pod_ids[1]])
        );
        assert_eq!(proxied.text(&["pods", "-q"]), "");
    })
    .await
    .unwrap();
    proxy.stop().await;
    let _ = std::fs::remove_dir_all(&dir);
}
