//! The monitoring that ships in deploy/monitoring/: the alert rules pass
//! Prometheus's own checker and their unit tests (promtool, from
//! scripts/lib/promtool.sh), the PrometheusRule holds the same groups, and
//! every metric the rules and the Grafana dashboard query is one that a
//! running crr-proxy serves on /metrics, its client certificate's end
//! included (and followed when the certificate is renewed).
#![allow(clippy::unwrap_used, clippy::expect_used)] // tests fail loudly by design

mod support;

use std::collections::BTreeSet;
use std::path::{Path, PathBuf};
use std::process::Command;
use std::time::{Duration, Instant};

use serde_json::Value;
use support::apiserver::FakeApiServer;

const MONITORING: &str = concat!(env!("CARGO_MANIFEST_DIR"), "/deploy/monitoring");

fn promtool() -> PathBuf {
    let path = std::env::var_os("CRR_TEST_PROMTOOL")
        .map(PathBuf::from)
        .unwrap_or_else(|| "promtool".into());
    let runs = Command::new(&path).arg("--version").output();
    assert!(
        runs.is_ok_and(|o| o.status.success()),
        "{} does not run: scripts/test.sh installs promtool (ensure_promtool)",
        path.display()
    );
    path
}

fn yaml(name: &str) -> Value {
    let text = std::fs::read_to_string(Path::new(MONITORING).join(name)).unwrap();
    serde_saphyr::from_str(&text).unwrap()
}

fn ok(command: &mut Command) -> String {
    let out = command.output().unwrap();
    let text =
        String::from_utf8_lossy(&out.stdout).into_owned() + &String::from_utf8_lossy(&out.stderr);
    assert!(out.status.success(), "{command:?}:\n{text}");
    text
}

#[test]
fn the_rules_pass_promtool_and_their_unit_tests() {
    let promtool = promtool();
    let checked = ok(Command::new(&promtool)
        .args(["check", "rules", "rules.yaml"])
        .current_dir(MONITORING));
    assert!(checked.contains("SUCCESS: 12 rules found"), "{checked}");
    let tested = ok(Command::new(&promtool)
        .args(["test", "rules", "rules-test.yaml"])
        .current_dir(MONITORING));
    assert!(tested.contains("SUCCESS"), "{tested}");

    // Every alert has a unit test that expects it to fire.
    let tests = yaml("rules-test.yaml");
    let fired: BTreeSet<&str> = tests["tests"]
        .as_array()
        .unwrap()
        .iter()
        .flat_map(|t| t["alert_rule_test"].as_array().unwrap())
        .filter(|t| !t["exp_alerts"].as_array().unwrap().is_empty())
        .map(|t| t["alertname"].as_str().unwrap())
        .collect();
    let rules = yaml("rules.yaml");
    let alerts: BTreeSet<&str> = rules["groups"]
        .as_array()
        .unwrap()
        .iter()
        .flat_map(|g| g["rules"].as_array().unwrap())
        .map(|r| r["alert"].as_str().unwrap())
        .collect();
    assert_eq!(fired, alerts, "alerts without a test that fires them");

    // The PrometheusRule carries the same groups.
    let object = yaml("prometheusrule.yaml");
    assert_eq!(object["kind"], "PrometheusRule");
    assert_eq!(object["apiVersion"], "monitoring.coreos.com/v1");
    assert_eq!(object["spec"]["groups"], rules["groups"]);
}

/// The words of a PromQL expression that name crr-proxy's or the process's
/// metrics.
fn metric_names(expr: &str) -> Vec<String> {
    expr.split(|c: char| !(c.is_ascii_alphanumeric() || c == '_' || c == ':'))
        .filter(|w| w.starts_with("crr_proxy_") || w.starts_with("process_"))
        .map(str::to_owned)
        .collect()
}

/// Every expression of the rules and the dashboard.
fn queries() -> Vec<String> {
    let rules = yaml("rules.yaml");
    let mut exprs: Vec<String> = rules["groups"]
        .as_array()
        .unwrap()
        .iter()
        .flat_map(|g| g["rules"].as_array().unwrap())
        .map(|r| r["expr"].as_str().unwrap().to_owned())
        .collect();
    let dashboard: Value = serde_json::from_str(
        &std::fs::read_to_string(Path::new(MONITORING).join("dashboard.json")).unwrap(),
    )
    .unwrap();
    for panel in dashboard["panels"].as_array().unwrap() {
        for target in panel["targets"].as_array().into_iter().flatten() {
            exprs.push(target["expr"].as_str().unwrap().to_owned());
        }
    }
    exprs.push(
        dashboard["templating"]["list"][1]["query"]["query"]
            .as_str()
            .unwrap()
            .to_owned(),
    );
    exprs
}

/// A P-256 certificate for `days` at `dir/cert.pem` (key at `dir/key.pem`,
/// both replaced at once, as kubelet's store does); when it ends, in
/// seconds since the epoch, as openssl reads it.
fn certificate(dir: &Path, days: u32) -> i64 {
    let part = dir.join("part");
    std::fs::create_dir_all(&part).unwrap();
    ok(Command::new("openssl")
        .args([
            "req",
            "-x509",
            "-newkey",
            "ec",
            "-pkeyopt",
            "ec_paramgen_curve:prime256v1",
        ])
        .args([
            "-nodes",
            "-subj",
            "/CN=crr-proxy:node:node-a",
            "-days",
            &days.to_string(),
        ])
        .arg("-keyout")
        .arg(part.join("key.pem"))
        .arg("-out")
        .arg(part.join("cert.pem")));
    std::fs::rename(part.join("key.pem"), dir.join("key.pem")).unwrap();
    std::fs::rename(part.join("cert.pem"), dir.join("cert.pem")).unwrap();
    let end = ok(Command::new("openssl")
        .args(["x509", "-noout", "-enddate", "-in"])
        .arg(dir.join("cert.pem")));
    let end = end.trim().strip_prefix("notAfter=").unwrap().to_owned();
    ok(Command::new("date").args(["-u", "-d", &end, "+%s"]))
        .trim()
        .parse()
        .unwrap()
}

fn expiry_sample(metrics: &str) -> Option<i64> {
    metrics
        .lines()
        .find_map(|l| l.strip_prefix("crr_proxy_client_certificate_expiry_timestamp_seconds "))
        .and_then(|v| v.trim().parse().ok())
}

/// /metrics at `addr` once it shows the client certificate ending at
/// `want`. The agent looks at its files at once after a 401, and every
/// minute in any case.
fn wait_for_expiry(addr: &str, log: &Path, want: i64) -> String {
    let deadline = Instant::now() + Duration::from_secs(75);
    loop {
        let metrics = support::metrics::scrape(addr).ok();
        if let Some(metrics) = metrics
            .as_deref()
            .filter(|m| expiry_sample(m) == Some(want))
        {
            return metrics.to_owned();
        }
        assert!(
            Instant::now() < deadline,
            "no certificate end {want} in /metrics: {:?}\nlog: {}",
            metrics.as_deref().map(expiry_sample),
            std::fs::read_to_string(log).unwrap_or_default()
        );
        std::thread::sleep(Duration::from_millis(200));
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn every_metric_the_rules_and_dashboard_query_is_served() {
    // A token the fake API server does not know: each agent request gets
    // 401, which makes the agent look at its files again at once.
    let api = FakeApiServer::start_for_node("node-a", "node-a-token").await;
    let socket = support::temp_socket("monitoring");
    let dir = socket.parent().unwrap().to_owned();
    let ends = certificate(&dir, 10);
    let kubeconfig = dir.join("kubeconfig");
    std::fs::write(
        &kubeconfig,
        format!(
            "apiVersion: v1\nkind: Config\nclusters: [{{name: fake, cluster: {{server: \"{}\"}}}}]\n\
             users: [{{name: u, user: {{token: revoked, client-certificate: {}, client-key: {}}}}}]\n\
             contexts: [{{name: c, context: {{cluster: fake, user: u}}}}]\ncurrent-context: c\n",
            api.url,
            dir.join("cert.pem").display(),
            dir.join("key.pem").display()
        ),
    )
    .unwrap();
    let addr = format!(
        "127.0.0.1:{}",
        support::cluster::free_port("127.0.0.1").unwrap()
    );
    let _daemon = support::Daemon(
        Command::new(env!("CARGO_BIN_EXE_crr-proxy"))
            .arg("run")
            .arg("--listen")
            .arg(&socket)
            .arg("--runtime-endpoint")
            .arg(format!("unix://{}", dir.join("no-runtime.sock").display()))
            .args(["--agent", "kruise", "--node-name", "node-a", "--kubeconfig"])
            .arg(&kubeconfig)
            .arg("--state-dir")
            .arg(dir.join("state"))
            .args(["--metrics-addr", &addr])
            .stdout(std::process::Stdio::null())
            .stderr(std::fs::File::create(dir.join("log")).unwrap())
            .spawn()
            .unwrap(),
    );
    let wait = |want: i64| {
        let (addr, log) = (addr.clone(), dir.join("log"));
        tokio::task::spawn_blocking(move || wait_for_expiry(&addr, &log, want))
    };
    let metrics = wait(ends).await.unwrap();

    let served: BTreeSet<String> = metrics
        .lines()
        .filter_map(|l| l.strip_prefix("# TYPE "))
        .flat_map(|l| {
            let mut words = l.split_whitespace();
            let name = words.next().unwrap().to_owned();
            match words.next() {
                Some("histogram") => ["_bucket", "_sum", "_count"]
                    .iter()
                    .map(|s| format!("{name}{s}"))
                    .chain([name.clone()])
                    .collect(),
                _ => vec![name],
            }
        })
        .collect();
    for name in [
        "process_cpu_seconds_total",
        "process_resident_memory_bytes",
        "process_open_fds",
        "process_max_fds",
        "process_start_time_seconds",
    ] {
        assert!(served.contains(name), "{name} is not served");
    }
    let queries = queries();
    assert!(queries.len() > 30, "{queries:?}");
    for expr in &queries {
        for name in metric_names(expr) {
            assert!(served.contains(&name), "{name} in {expr} is not served");
        }
    }

    // Renewed behind the same file names: followed.
    let renewed = certificate(&dir, 30);
    assert_ne!(renewed, ends);
    wait(renewed).await.unwrap();
    support::remove_socket_dir(&socket);
}
