//! The relay under a real kubelet (v1.37) and kubectl, over crr-proxy with
//! the agent off, on a private containerd.

use std::io::{BufRead, BufReader, Read, Write};
use std::net::TcpStream;
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use support::cluster::{Cluster, binary};
use support::node::{Agent, Node, node_ready};

use super::*;

/// How long kubelet may still report the runtime's own downtime (a crr-proxy
/// or containerd just started again) before its CRI calls must succeed.
const SETTLE: Duration = Duration::from_secs(5);

/// Checks for `period` that the node stays Ready and the Pod stays Ready
/// without a restart, and that after the first [`SETTLE`] kubelet logs no
/// failed CRI call (gRPC's `rpc error`).
fn holds_steady(cluster: &mut Cluster, node: &mut Node, period: Duration, during: &str) {
    let started = Instant::now();
    let mut settled_at = None;
    while started.elapsed() < period {
        node.check().unwrap();
        assert!(
            node_ready(cluster, &node.name).unwrap(),
            "node {} not Ready {during}",
            node.name
        );
        let pod = cluster.get(&["pod", "web", "-n", "relay"]).unwrap();
        assert_eq!(
            restart_count(&pod, "app"),
            0,
            "the Pod restarted {during}: {pod:#}"
        );
        if settled_at.is_none() && started.elapsed() >= SETTLE {
            settled_at = Some(kubelet_log(node).len());
        }
        std::thread::sleep(Duration::from_millis(500));
    }
    let log = kubelet_log(node);
    let since = &log[settled_at.unwrap_or(log.len()).min(log.len())..];
    let failed: Vec<&str> = since.lines().filter(|l| l.contains("rpc error")).collect();
    assert!(
        failed.is_empty(),
        "kubelet's failed CRI calls {during}, once settled:\n{}",
        failed.join("\n")
    );
}

fn kubelet_log(node: &Node) -> String {
    std::fs::read_to_string(node.kubelet_log()).unwrap_or_default()
}

/// Real parts: etcd, kube-apiserver, kube-controller-manager, kubelet,
/// kubectl, containerd, runc, Debian's CNI bridge plugin.
#[test]
fn a_real_kubelet_runs_its_pods_through_crr_proxy_and_rides_out_its_restarts() {
    let mut cluster = Cluster::start().unwrap();
    cluster.namespace("relay").unwrap();
    let mut node = Node::start(&mut cluster, "node-a", crr_proxy(), Agent::Off).unwrap();

    cluster
        .apply(&web_pod("relay", "web", "node-a").to_string())
        .unwrap();
    let pod = wait_pod_ready(&mut cluster, "relay", "web").unwrap();
    assert!(
        pod["status"]["podIP"]
            .as_str()
            .is_some_and(|ip| ip.starts_with("10.244.")),
        "{pod:#}"
    );

    // Logs, exec and the stats summary: kubelet's own CRI calls through
    // crr-proxy, and the API server's streams to kubelet.
    let logs = cluster.kubectl(&["logs", "web", "-n", "relay"]).unwrap();
    assert!(logs.starts_with("started\n"), "{logs}");
    let exec = cluster
        .kubectl(&[
            "exec",
            "web",
            "-n",
            "relay",
            "--",
            "sh",
            "-c",
            "echo out; echo err >&2",
        ])
        .unwrap();
    assert_eq!(exec, "out\n");
    let summary: Value = serde_json::from_str(
        &cluster
            .kubectl(&["get", "--raw", "/api/v1/nodes/node-a/proxy/stats/summary"])
            .unwrap(),
    )
    .unwrap();
    let pods = summary["pods"].as_array().unwrap();
    assert!(
        pods.iter()
            .any(|p| p["podRef"]["name"] == "web" && p["containers"][0]["name"] == "app"),
        "{summary:#}"
    );

    // port-forward: kubelet's PortForward through crr-proxy, then the
    // stream from the API server through kubelet to containerd's server.
    let page = port_forward_get(&cluster, "relay", "web", 8080);
    assert!(
        page.starts_with("HTTP/1.") && page.contains(" 200 "),
        "{page}"
    );

    // An ephemeral container (kubectl debug): kubelet creates and starts it
    // in the running Pod through crr-proxy.
    cluster
        .kubectl(&[
            "debug",
            "web",
            "-n",
            "relay",
            "-c",
            "debugger",
            "--image",
            BUSYBOX_IMAGE,
            "--image-pull-policy",
            "Never",
            "--",
            "sh",
            "-c",
            "echo debugging; sleep 3600",
        ])
        .unwrap();
    cluster
        .wait(
            "the ephemeral container to run",
            Duration::from_secs(60),
            |c| {
                let pod = c.get(&["pod", "web", "-n", "relay"])?;
                Ok(
                    pod["status"]["ephemeralContainerStatuses"][0]["state"]["running"]
                        .is_object()
                        .then_some(()),
                )
            },
        )
        .unwrap();
    let debug_logs = cluster
        .kubectl(&["logs", "web", "-n", "relay", "-c", "debugger"])
        .unwrap();
    assert_eq!(debug_logs, "debugging\n");

    holds_steady(
        &mut cluster,
        &mut node,
        Duration::from_secs(10),
        "before any restart",
    );

    // crr-proxy killed and started again: kubelet reconnects.
    node.kill_proxy().unwrap();
    std::thread::sleep(Duration::from_secs(2));
    node.start_proxy().unwrap();
    holds_steady(
        &mut cluster,
        &mut node,
        Duration::from_secs(10),
        "after crr-proxy's kill -9",
    );
    // Stopped as its service stops it, and started.
    node.stop_proxy();
    node.start_proxy().unwrap();
    holds_steady(
        &mut cluster,
        &mut node,
        Duration::from_secs(10),
        "after crr-proxy's restart",
    );
    // containerd restarted behind crr-proxy.
    node.containerd.pause().unwrap();
    std::thread::sleep(Duration::from_secs(2));
    node.containerd.resume().unwrap();
    holds_steady(
        &mut cluster,
        &mut node,
        Duration::from_secs(10),
        "after containerd's restart",
    );
    let exec = cluster
        .kubectl(&["exec", "web", "-n", "relay", "--", "echo", "again"])
        .unwrap();
    assert_eq!(exec, "again\n");

    // Deleted with grace: the container ends on SIGTERM, the Pod goes.
    let started = Instant::now();
    cluster
        .kubectl(&[
            "delete",
            "pod",
            "web",
            "-n",
            "relay",
            "--wait=true",
            "--timeout=60s",
        ])
        .unwrap();
    assert!(
        started.elapsed() < Duration::from_secs(30),
        "deletion took {:?}",
        started.elapsed()
    );
    assert!(
        node.containerd
            .ctr(&["-n", "k8s.io", "tasks", "ls", "-q"])
            .unwrap()
            .trim()
            .is_empty()
    );
}

/// `kubectl port-forward` to the Pod's `port` on a local port kubectl picks,
/// and one HTTP GET through it; the answer's text.
fn port_forward_get(cluster: &Cluster, namespace: &str, pod: &str, port: u16) -> String {
    let mut forward = Command::new(binary("kubectl").unwrap())
        .arg("--kubeconfig")
        .arg(cluster.admin_kubeconfig())
        .args(["port-forward", "-n", namespace, pod, &format!(":{port}")])
        .stdout(Stdio::piped())
        .stderr(Stdio::inherit())
        .spawn()
        .unwrap();
    // "Forwarding from 127.0.0.1:41234 -> 8080"
    // (Its output stays open: kubectl writes a line for each connection,
    // and ends on a closed pipe.)
    let mut output = BufReader::new(forward.stdout.take().unwrap());
    let mut line = String::new();
    output.read_line(&mut line).unwrap();
    let local = line
        .split_whitespace()
        .nth(2)
        .unwrap_or_else(|| panic!("kubectl port-forward said {line:?}"))
        .to_owned();
    let mut stream = TcpStream::connect(&local).unwrap();
    stream
        .set_read_timeout(Some(Duration::from_secs(20)))
        .unwrap();
    stream.write_all(b"GET / HTTP/1.0\r\n\r\n").unwrap();
    let mut page = String::new();
    let _ = stream.read_to_string(&mut page);
    let _ = forward.kill();
    let _ = forward.wait();
    drop(output);
    page
}

/// Real parts: etcd, kube-apiserver, kube-controller-manager, kubelet,
/// kubectl, containerd, runc, Debian's CNI bridge plugin; systemd's socket
/// activation played by support::activation. crr-proxy restarted five times
/// by its service's own mechanism, down a second each time (as long as
/// systemd keeps it down after it exits, `RestartSec=1`) while the socket
/// is kept: kubelet's calls wait in the socket's backlog,
/// so kubelet logs no failed CRI call at all, the node stays Ready and the
/// Pod (probed by exec and HTTP) never restarts.
#[test]
fn restarted_with_its_socket_kept_crr_proxy_fails_no_call_of_kubelets() {
    let mut cluster = Cluster::start().unwrap();
    cluster.namespace("relay").unwrap();
    let mut node = Node::start_activated(&mut cluster, "node-a", crr_proxy(), Agent::Off).unwrap();
    cluster
        .apply(&web_pod("relay", "web", "node-a").to_string())
        .unwrap();
    wait_pod_ready(&mut cluster, "relay", "web").unwrap();
    // kubelet's start-up is over (its first calls may meet a runtime that
    // is still starting): from here on, no failure at all.
    std::thread::sleep(SETTLE);
    let from = kubelet_log(&node).len();
    for restart in 1..=5 {
        node.restart_proxy().unwrap();
        let started = Instant::now();
        while started.elapsed() < Duration::from_secs(3) {
            node.check().unwrap();
            assert!(
                node_ready(&cluster, &node.name).unwrap(),
                "node not Ready after restart {restart}"
            );
            let pod = cluster.get(&["pod", "web", "-n", "relay"]).unwrap();
            assert_eq!(restart_count(&pod, "app"), 0, "{pod:#}");
            std::thread::sleep(Duration::from_millis(300));
        }
    }
    let exec = cluster
        .kubectl(&["exec", "web", "-n", "relay", "--", "echo", "through"])
        .unwrap();
    assert_eq!(exec, "through\n");
    let log = kubelet_log(&node);
    let failed: Vec<&str> = log[from..]
        .lines()
        .filter(|l| l.contains("rpc error"))
        .collect();
    assert!(
        failed.is_empty(),
        "kubelet's failed CRI calls across restarts with the socket kept:\n{}",
        failed.join("\n")
    );
    // Each restart was one: the supervisor started crr-proxy six times.
    let proxy_log = std::fs::read_to_string(node.proxy_log()).unwrap();
    assert_eq!(
        proxy_log.matches("socket passed by systemd").count(),
        6,
        "{proxy_log}"
    );
}
