//! Prometheus metrics of the CRI data path and of the CRR agent, kept in
//! atomics so that counting a call costs a few nanoseconds and no lock.

use std::fmt::Write as _;
use std::sync::atomic::{AtomicI64, AtomicU64, Ordering};
use std::time::Duration;

use crate::cri::Method as CriMethod;

mod process;

/// The CRI methods counted by name; any other path counts as `other`, so a
/// client cannot grow the label set.
const METHODS: &[(&str, &str)] = &[
    ("RuntimeService", "Version"),
    ("RuntimeService", "RunPodSandbox"),
    ("RuntimeService", "StopPodSandbox"),
    ("RuntimeService", "RemovePodSandbox"),
    ("RuntimeService", "PodSandboxStatus"),
    ("RuntimeService", "ListPodSandbox"),
    ("RuntimeService", "CreateContainer"),
    ("RuntimeService", "StartContainer"),
    ("RuntimeService", "StopContainer"),
    ("RuntimeService", "RemoveContainer"),
    ("RuntimeService", "ListContainers"),
    ("RuntimeService", "ContainerStatus"),
    ("RuntimeService", "UpdateContainerResources"),
    ("RuntimeService", "ReopenContainerLog"),
    ("RuntimeService", "ExecSync"),
    ("RuntimeService", "Exec"),
    ("RuntimeService", "Attach"),
    ("RuntimeService", "PortForward"),
    ("RuntimeService", "ContainerStats"),
    ("RuntimeService", "ListContainerStats"),
    ("RuntimeService", "PodSandboxStats"),
    ("RuntimeService", "ListPodSandboxStats"),
    ("RuntimeService", "UpdateRuntimeConfig"),
    ("RuntimeService", "Status"),
    ("RuntimeService", "CheckpointContainer"),
    ("RuntimeService", "GetContainerEvents"),
    ("RuntimeService", "ListMetricDescriptors"),
    ("RuntimeService", "ListPodSandboxMetrics"),
    ("RuntimeService", "RuntimeConfig"),
    ("RuntimeService", "UpdatePodSandboxResources"),
    // Kubernetes 1.37's CRI: KEP-5825's streaming lists (kubelet's gate
    // CRIListStreaming; served from containerd 2.4) and the Pod checkpoints.
    ("RuntimeService", "StreamPodSandboxes"),
    ("RuntimeService", "StreamContainers"),
    ("RuntimeService", "StreamContainerStats"),
    ("RuntimeService", "StreamPodSandboxStats"),
    ("RuntimeService", "StreamPodSandboxMetrics"),
    ("RuntimeService", "CheckpointPod"),
    ("RuntimeService", "RestorePod"),
    ("ImageService", "ListImages"),
    ("ImageService", "ImageStatus"),
    ("ImageService", "PullImage"),
    ("ImageService", "RemoveImage"),
    ("ImageService", "ImageFsInfo"),
    ("ImageService", "StreamImages"),
];

/// Upper bounds of the latency buckets, in seconds.
const BUCKETS: &[f64] = &[
    0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0,
    120.0,
];

/// gRPC status code names, by number.
const CODES: &[&str] = &[
    "OK",
    "CANCELLED",
    "UNKNOWN",
    "INVALID_ARGUMENT",
    "DEADLINE_EXCEEDED",
    "NOT_FOUND",
    "ALREADY_EXISTS",
    "PERMISSION_DENIED",
    "RESOURCE_EXHAUSTED",
    "FAILED_PRECONDITION",
    "ABORTED",
    "OUT_OF_RANGE",
    "UNIMPLEMENTED",
    "INTERNAL",
    "UNAVAILABLE",
    "DATA_LOSS",
    "UNAUTHENTICATED",
];

/// A Prometheus histogram over `BUCKETS`.
struct Histogram {
    buckets: [AtomicU64; 16],
    sum_micros: AtomicU64,
    count: AtomicU64,
}

impl Default for Histogram {
    fn default() -> Self {
        Self {
            buckets: std::array::from_fn(|_| AtomicU64::new(0)),
            sum_micros: AtomicU64::new(0),
            count: AtomicU64::new(0),
        }
    }
}

impl Histogram {
    fn observe(&self, took: Duration) {
        let seconds = took.as_secs_f64();
        for (bucket, bound) in self.buckets.iter().zip(BUCKETS) {
            if seconds <= *bound {
                bucket.fetch_add(1, Ordering::Relaxed);
            }
        }
        self.sum_micros.fetch_add(
            u64::try_from(took.as_micros()).unwrap_or(u64::MAX),
            Ordering::Relaxed,
        );
        self.count.fetch_add(1, Ordering::Relaxed);
    }

    /// The series of one label set (`labels` without braces, may be empty).
    fn render(&self, out: &mut String, name: &str, labels: &str) {
        let sep = if labels.is_empty() { "" } else { "," };
        for (bucket, bound) in self.buckets.iter().zip(BUCKETS) {
            let n = bucket.load(Ordering::Relaxed);
            let _ = writeln!(out, "{name}_bucket{{{labels}{sep}le=\"{bound}\"}} {n}");
        }
        let count = self.count.load(Ordering::Relaxed);
        let _ = writeln!(out, "{name}_bucket{{{labels}{sep}le=\"+Inf\"}} {count}");
        let sum = self.sum_micros.load(Ordering::Relaxed) as f64 / 1e6;
        let braces = |s: &str| {
            if s.is_empty() {
                String::new()
            } else {
                format!("{{{s}}}")
            }
        };
        let _ = writeln!(out, "{name}_sum{} {sum}", braces(labels));
        let _ = writeln!(out, "{name}_count{} {count}", braces(labels));
    }
}

#[derive(Default)]
struct Method {
    codes: [AtomicU64; 17],
    latency: Histogram,
}

/// How a CRR ended, as `crr_proxy_crr_recreations_total{outcome}` counts it.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum CrrOutcome {
    /// Every container recreated.
    Succeeded,
    /// A container could not be recreated (failurePolicy decided the end).
    Failed,
    /// activeDeadlineSeconds ran out.
    DeadlineExceeded,
    /// The Pod was deleted first.
    PodGone,
    /// Refused before any kill: the webhook's checks, or no runtime.
    Refused,
}

impl CrrOutcome {
    const ALL: [CrrOutcome; 5] = [
        Self::Succeeded,
        Self::Failed,
        Self::DeadlineExceeded,
        Self::PodGone,
        Self::Refused,
    ];

    fn label(self) -> &'static str {
        match self {
            Self::Succeeded => "succeeded",
            Self::Failed => "failed",
            Self::DeadlineExceeded => "deadline_exceeded",
            Self::PodGone => "pod_gone",
            Self::Refused => "refused",
        }
    }
}

/// The agent's side.
#[derive(Default)]
struct Crr {
    reconciles: AtomicU64,
    sync_failures: AtomicU64,
    outcomes: [AtomicU64; 5],
    seen_to_stopped: Histogram,
    pre_stop: Histogram,
    pre_stop_failures: AtomicU64,
    active: AtomicI64,
    lease_held: AtomicI64,
    claims: AtomicU64,
    unclaimable: AtomicU64,
    unanswered: AtomicU64,
    /// Kruise mode: the kruise-daemon Pod on this node (`namespace/name`),
    /// whose CRR controller does this node's CRRs while it runs.
    kruise_daemon: std::sync::Mutex<Option<String>>,
}

/// The proxy's metrics; share one behind an `Arc`.
pub struct Metrics {
    /// One per entry of `METHODS`, then `other`.
    methods: Vec<Method>,
    in_flight: AtomicI64,
    upstream_connections: AtomicI64,
    crr: Crr,
    /// When the agent's client certificate ends, in seconds since the
    /// epoch; 0 while it has none (a token, or no agent).
    certificate_expiry: AtomicI64,
}

impl Default for Metrics {
    fn default() -> Self {
        Self {
            methods: (0..=METHODS.len()).map(|_| Method::default()).collect(),
            in_flight: AtomicI64::new(0),
            upstream_connections: AtomicI64::new(0),
            crr: Crr::default(),
            certificate_expiry: AtomicI64::new(0),
        }
    }
}

impl std::fmt::Debug for Metrics {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Metrics").finish_non_exhaustive()
    }
}

impl Metrics {
    /// The index of a call's CRI method (any version), or of `other`.
    pub fn method_index(method: Option<CriMethod<'_>>) -> usize {
        let known = method.and_then(|call| {
            METHODS
                .iter()
                .position(|(s, m)| *s == call.service && *m == call.name)
        });
        known.unwrap_or(METHODS.len())
    }

    pub fn call_started(&self) {
        self.in_flight.fetch_add(1, Ordering::Relaxed);
    }

    /// Records a finished call: its gRPC code (0–16) and how long it took.
    pub fn call_finished(&self, method: usize, code: u32, took: Duration) {
        self.in_flight.fetch_sub(1, Ordering::Relaxed);
        let Some(m) = self.methods.get(method) else {
            return;
        };
        m.codes[code.min(16) as usize].fetch_add(1, Ordering::Relaxed);
        m.latency.observe(took);
    }

    /// One run of the agent's work for one Pod's CRRs.
    pub fn crr_reconciled(&self) {
        self.crr.reconciles.fetch_add(1, Ordering::Relaxed);
    }

    /// A run that failed (an API or runtime error); it is retried with a
    /// back-off.
    pub fn crr_sync_failed(&self) {
        self.crr.sync_failures.fetch_add(1, Ordering::Relaxed);
    }

    pub fn crr_completed(&self, outcome: CrrOutcome) {
        let i = CrrOutcome::ALL
            .iter()
            .position(|o| *o == outcome)
            .unwrap_or(0);
        self.crr.outcomes[i].fetch_add(1, Ordering::Relaxed);
    }

    /// A container stopped for a CRR, `since_seen` after the agent first saw it.
    pub fn container_stopped(&self, since_seen: Duration) {
        self.crr.seen_to_stopped.observe(since_seen);
    }

    pub fn pre_stop_finished(&self, took: Duration, failed: bool) {
        self.crr.pre_stop.observe(took);
        if failed {
            self.crr.pre_stop_failures.fetch_add(1, Ordering::Relaxed);
        }
    }

    /// Whether this node holds the standalone Lease.
    /// The kruise-daemon Pod found on this node, or `None`.
    pub fn set_kruise_daemon(&self, pod: Option<String>) {
        *self
            .crr
            .kruise_daemon
            .lock()
            .unwrap_or_else(|p| p.into_inner()) = pod;
    }

    /// The kruise-daemon Pod the agent stands aside for, if any.
    pub fn kruise_daemon(&self) -> Option<String> {
        self.crr
            .kruise_daemon
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .clone()
    }

    pub fn set_lease_held(&self, held: bool) {
        self.crr
            .lease_held
            .store(i64::from(held), Ordering::Relaxed);
    }

    /// A new CRR claimed for the node that runs its Pod (as the holder).
    pub fn crr_claimed(&self) {
        self.crr.claims.fetch_add(1, Ordering::Relaxed);
    }

    /// A CRR ended because no node can take it (as the holder).
    pub fn crr_unclaimable(&self) {
        self.crr.unclaimable.fetch_add(1, Ordering::Relaxed);
    }

    pub fn crr_unanswered(&self) {
        self.crr.unanswered.fetch_add(1, Ordering::Relaxed);
    }

    /// CRRs of this node not yet finished.
    pub fn set_active_crrs(&self, active: usize) {
        self.crr
            .active
            .store(i64::try_from(active).unwrap_or(i64::MAX), Ordering::Relaxed);
    }

    pub fn upstream_connected(&self) {
        self.upstream_connections.fetch_add(1, Ordering::Relaxed);
    }

    pub fn upstream_disconnected(&self) {
        self.upstream_connections.fetch_sub(1, Ordering::Relaxed);
    }

    /// The end of the client certificate the agent's requests use now
    /// (seconds since the epoch), or `None` when they use none.
    pub fn set_client_certificate_expiry(&self, expiry: Option<i64>) {
        self.certificate_expiry
            .store(expiry.unwrap_or(0), Ordering::Relaxed);
    }

    /// The Prometheus text exposition.
    pub fn render(&self) -> String {
        let mut out = String::new();
        let label = |i: usize| match METHODS.get(i) {
            Some((service, method)) => format!("service=\"{service}\",method=\"{method}\""),
            None => "service=\"other\",method=\"other\"".to_owned(),
        };
        out.push_str("# HELP crr_proxy_build_info The version and commit this crr-proxy was built from; always 1.\n");
        out.push_str("# TYPE crr_proxy_build_info gauge\n");
        out.push_str(&format!(
            "crr_proxy_build_info{{version=\"{}\",commit=\"{}\"}} 1\n",
            crate::version::VERSION,
            crate::version::COMMIT
        ));
        out.push_str("# HELP crr_proxy_cri_requests_total CRI calls through the proxy, by method and gRPC code.\n");
        out.push_str("# TYPE crr_proxy_cri_requests_total counter\n");
        for (i, m) in self.methods.iter().enumerate() {
            for (code, count) in m.codes.iter().enumerate() {
                let count = count.load(Ordering::Relaxed);
                if count > 0 {
                    let _ = writeln!(
                        out,
                        "crr_proxy_cri_requests_total{{{},code=\"{}\"}} {count}",
                        label(i),
                        CODES[code]
                    );
                }
            }
        }
        out.push_str("# HELP crr_proxy_cri_request_duration_seconds Time from a call's arrival to its last byte, as seen through the proxy.\n");
        out.push_str("# TYPE crr_proxy_cri_request_duration_seconds histogram\n");
        for (i, m) in self.methods.iter().enumerate() {
            if m.latency.count.load(Ordering::Relaxed) > 0 {
                m.latency.render(
                    &mut out,
                    "crr_proxy_cri_request_duration_seconds",
                    &label(i),
                );
            }
        }
        scalar(
            &mut out,
            "crr_proxy_cri_in_flight_requests",
            "gauge",
            "CRI calls in progress.",
            self.in_flight.load(Ordering::Relaxed),
        );
        scalar(
            &mut out,
            "crr_proxy_upstream_connections",
            "gauge",
            "Open HTTP/2 connections to the runtime.",
            self.upstream_connections.load(Ordering::Relaxed),
        );
        self.render_crr(&mut out);
        out.push_str("# HELP crr_proxy_client_certificate_expiry_timestamp_seconds When the client certificate of the agent's kubeconfig expires (seconds since the epoch); no sample while it uses none.\n");
        out.push_str("# TYPE crr_proxy_client_certificate_expiry_timestamp_seconds gauge\n");
        match self.certificate_expiry.load(Ordering::Relaxed) {
            0 => {}
            expiry => {
                let _ = writeln!(
                    out,
                    "crr_proxy_client_certificate_expiry_timestamp_seconds {expiry}"
                );
            }
        }
        if let Some(process) = process::Process::read(std::path::Path::new("/proc")) {
            process.render(&mut out);
        }
        out
    }

    fn render_crr(&self, out: &mut String) {
        let crr = &self.crr;
        scalar(
            out,
            "crr_proxy_crr_reconciles_total",
            "counter",
            "Runs of the agent's work for one Pod's CRRs.",
            crr.reconciles.load(Ordering::Relaxed),
        );
        scalar(
            out,
            "crr_proxy_crr_reconcile_failures_total",
            "counter",
            "Runs that failed on an API server or runtime error, to be retried with a back-off.",
            crr.sync_failures.load(Ordering::Relaxed),
        );
        out.push_str(
            "# HELP crr_proxy_crr_recreations_total CRRs completed by this node, by outcome.\n",
        );
        out.push_str("# TYPE crr_proxy_crr_recreations_total counter\n");
        for (outcome, count) in CrrOutcome::ALL.iter().zip(&crr.outcomes) {
            let _ = writeln!(
                out,
                "crr_proxy_crr_recreations_total{{outcome=\"{}\"}} {}",
                outcome.label(),
                count.load(Ordering::Relaxed)
            );
        }
        out.push_str("# HELP crr_proxy_crr_seen_to_stopped_seconds Time from the agent first seeing a CRR to StopContainer returning for one of its containers.\n");
        out.push_str("# TYPE crr_proxy_crr_seen_to_stopped_seconds histogram\n");
        crr.seen_to_stopped
            .render(out, "crr_proxy_crr_seen_to_stopped_seconds", "");
        out.push_str("# HELP crr_proxy_prestop_hook_duration_seconds preStop hooks run for CRRs, start to end.\n");
        out.push_str("# TYPE crr_proxy_prestop_hook_duration_seconds histogram\n");
        crr.pre_stop
            .render(out, "crr_proxy_prestop_hook_duration_seconds", "");
        scalar(
            out,
            "crr_proxy_prestop_hook_failures_total",
            "counter",
            "preStop hooks that failed (the kill went on).",
            crr.pre_stop_failures.load(Ordering::Relaxed),
        );
        scalar(
            out,
            "crr_proxy_crrs_active",
            "gauge",
            "CRRs of this node not yet completed.",
            crr.active.load(Ordering::Relaxed),
        );
        scalar(
            out,
            "crr_proxy_kruise_daemon_on_node",
            "gauge",
            "1 while a kruise-daemon Pod runs on this node (kruise mode): its CRR controller does this node's CRRs, and crr-proxy's agent stands aside.",
            i64::from(self.kruise_daemon().is_some()),
        );
        scalar(
            out,
            "crr_proxy_standalone_lease_held",
            "gauge",
            "1 while this node holds the standalone Lease (it claims new CRRs for their nodes).",
            crr.lease_held.load(Ordering::Relaxed),
        );
        scalar(
            out,
            "crr_proxy_crr_claims_total",
            "counter",
            "New CRRs this node claimed for the node that runs their Pod, as the Lease holder.",
            crr.claims.load(Ordering::Relaxed),
        );
        scalar(
            out,
            "crr_proxy_crr_unclaimable_total",
            "counter",
            "CRRs this node ended, as the Lease holder, because no node can take them (no such Pod, or not scheduled).",
            crr.unclaimable.load(Ordering::Relaxed),
        );
        scalar(
            out,
            "crr_proxy_crr_unanswered_total",
            "counter",
            "CRRs this node ended, as the Lease holder, because the node they were claimed for did not take them up within 60 s.",
            crr.unanswered.load(Ordering::Relaxed),
        );
    }
}

/// One series without labels, with its HELP and TYPE lines.
fn scalar(out: &mut String, name: &str, kind: &str, help: &str, value: impl std::fmt::Display) {
    let _ = writeln!(out, "# HELP {name} {help}");
    let _ = writeln!(out, "# TYPE {name} {kind}");
    let _ = writeln!(out, "{name} {value}");
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_build_is_named_in_the_metrics() {
        let text = Metrics::default().render();
        let line = format!(
            "crr_proxy_build_info{{version=\"{}\",commit=\"{}\"}} 1\n",
            env!("CARGO_PKG_VERSION"),
            crate::version::COMMIT
        );
        assert!(text.contains(&line), "{text}");
        // Built from this checkout: a commit, not `unknown`.
        assert!(
            crate::version::COMMIT.len() == 12
                && crate::version::COMMIT
                    .bytes()
                    .all(|b| b.is_ascii_hexdigit()),
            "{}",
            crate::version::COMMIT
        );
    }

    #[test]
    fn methods_are_named_and_everything_else_is_other() {
        assert_eq!(
            METHODS[Metrics::method_index(CriMethod::parse("/runtime.v1.RuntimeService/Version"))]
                .1,
            "Version"
        );
        assert_eq!(
            METHODS[Metrics::method_index(CriMethod::parse("/runtime.v1.ImageService/PullImage"))]
                .1,
            "PullImage"
        );
        // Kubernetes 1.37's streaming lists have names of their own.
        assert_eq!(
            METHODS[Metrics::method_index(CriMethod::parse(
                "/runtime.v1.RuntimeService/StreamContainers"
            ))]
            .1,
            "StreamContainers"
        );
        assert_eq!(
            METHODS
                [Metrics::method_index(CriMethod::parse("/runtime.v1.ImageService/StreamImages"))]
            .1,
            "StreamImages"
        );
        assert_eq!(
            Metrics::method_index(CriMethod::parse("/runtime.v1.RuntimeService/NoSuch")),
            METHODS.len()
        );
        assert_eq!(
            Metrics::method_index(CriMethod::parse("/any/thing")),
            METHODS.len()
        );
    }

    #[test]
    fn renders_counters_histograms_and_gauges() {
        let metrics = Metrics::default();
        let version = Metrics::method_index(CriMethod::parse("/runtime.v1.RuntimeService/Version"));
        metrics.call_started();
        metrics.call_finished(version, 0, Duration::from_micros(300));
        metrics.call_started();
        metrics.call_finished(version, 14, Duration::from_millis(3));
        metrics.call_started();
        metrics.upstream_connected();
        let text = metrics.render();
        for line in [
            r#"crr_proxy_cri_requests_total{service="RuntimeService",method="Version",code="OK"} 1"#,
            r#"crr_proxy_cri_requests_total{service="RuntimeService",method="Version",code="UNAVAILABLE"} 1"#,
            r#"crr_proxy_cri_request_duration_seconds_bucket{service="RuntimeService",method="Version",le="0.0005"} 1"#,
            r#"crr_proxy_cri_request_duration_seconds_bucket{service="RuntimeService",method="Version",le="0.005"} 2"#,
            r#"crr_proxy_cri_request_duration_seconds_bucket{service="RuntimeService",method="Version",le="+Inf"} 2"#,
            r#"crr_proxy_cri_request_duration_seconds_count{service="RuntimeService",method="Version"} 2"#,
            "crr_proxy_cri_in_flight_requests 1",
            "crr_proxy_upstream_connections 1",
        ] {
            assert!(text.lines().any(|l| l == line), "missing {line}:\n{text}");
        }
    }

    #[test]
    fn renders_the_agents_series_from_zero() {
        let metrics = Metrics::default();
        let text = metrics.render();
        for line in [
            "crr_proxy_crr_reconciles_total 0",
            r#"crr_proxy_crr_recreations_total{outcome="succeeded"} 0"#,
            r#"crr_proxy_crr_recreations_total{outcome="pod_gone"} 0"#,
            "crr_proxy_crr_seen_to_stopped_seconds_count 0",
            "crr_proxy_crrs_active 0",
        ] {
            assert!(text.lines().any(|l| l == line), "missing {line}:\n{text}");
        }
        metrics.crr_reconciled();
        metrics.crr_sync_failed();
        metrics.set_lease_held(true);
        metrics.set_kruise_daemon(Some("kruise-system/kruise-daemon-x".into()));
        metrics.crr_claimed();
        metrics.crr_unclaimable();
        metrics.crr_unanswered();
        metrics.crr_completed(CrrOutcome::DeadlineExceeded);
        metrics.container_stopped(Duration::from_millis(12));
        metrics.pre_stop_finished(Duration::from_secs(3), true);
        metrics.set_active_crrs(4);
        let text = metrics.render();
        for line in [
            "crr_proxy_crr_reconciles_total 1",
            "crr_proxy_crr_reconcile_failures_total 1",
            "crr_proxy_standalone_lease_held 1",
            "crr_proxy_kruise_daemon_on_node 1",
            "crr_proxy_crr_claims_total 1",
            "crr_proxy_crr_unclaimable_total 1",
            "crr_proxy_crr_unanswered_total 1",
            r#"crr_proxy_crr_recreations_total{outcome="deadline_exceeded"} 1"#,
            r#"crr_proxy_crr_seen_to_stopped_seconds_bucket{le="0.01"} 0"#,
            r#"crr_proxy_crr_seen_to_stopped_seconds_bucket{le="0.025"} 1"#,
            "crr_proxy_crr_seen_to_stopped_seconds_sum 0.012",
            "crr_proxy_prestop_hook_duration_seconds_count 1",
            "crr_proxy_prestop_hook_failures_total 1",
            "crr_proxy_crrs_active 4",
        ] {
            assert!(text.lines().any(|l| l == line), "missing {line}:\n{text}");
        }
    }
}
