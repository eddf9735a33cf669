//! Runs one preStop handler: exec, httpGet or sleep.

use std::net::IpAddr;
use std::time::Duration;

use k8s_openapi::api::core::v1::{ContainerPort, HTTPGetAction, LifecycleHandler};
use k8s_openapi::apimachinery::pkg::util::intstr::IntOrString;

use super::http::{Get, HookClient, Scheme};
use super::target::Target;
use crate::cri::RuntimeClient;
use crate::cri::v1::{
    ContainerFilter, ExecSyncRequest, ListContainersRequest, NamespaceMode, PodSandboxStatusRequest,
};

/// Which kind of handler ran.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum HookKind {
    Exec,
    HttpGet,
    Sleep,
    /// tcpSocket, or a handler with no action: kubelet cannot run it.
    Invalid,
}

/// How the hook ended.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum HookResult {
    Succeeded,
    /// The hook failed; the message is in kubelet's wording.
    Failed(String),
    /// Still running when the grace period ran out: cut short, as kubelet
    /// stops waiting then (not a failure).
    TimedOut,
}

/// What the preStop step did.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct HookReport {
    pub kind: HookKind,
    pub result: HookResult,
    /// Whole seconds spent, truncated as kubelet does.
    pub seconds: u64,
    /// The time spent, for metrics.
    pub took: std::time::Duration,
    /// An HTTPS hook answered in plain HTTP was retried over HTTP
    /// (kubelet's `LifecycleHTTPFallback` event).
    pub http_fallback: bool,
}

/// Everything a handler may need.
pub(super) struct HookContext<'a> {
    pub cri: RuntimeClient,
    pub http: &'a HookClient,
    pub target: &'a Target,
    pub ports: &'a [ContainerPort],
    pub node_address: IpAddr,
    /// The grace period: the hook's own bound, and ExecSync's timeout.
    pub grace: Duration,
}

pub(super) fn kind(handler: &LifecycleHandler) -> HookKind {
    if handler.exec.is_some() {
        HookKind::Exec
    } else if handler.http_get.is_some() {
        HookKind::HttpGet
    } else if handler.sleep.is_some() {
        HookKind::Sleep
    } else {
        HookKind::Invalid
    }
}

/// Runs `handler` to completion (the caller bounds it by the grace period).
/// Returns the failure message, if any, and whether HTTPS fell back to HTTP.
pub(super) async fn run(
    handler: &LifecycleHandler,
    ctx: HookContext<'_>,
) -> (Option<String>, bool) {
    if let Some(exec) = &handler.exec {
        let command = exec.command.clone().unwrap_or_default();
        return (run_exec(&command, ctx).await.err(), false);
    }
    if let Some(http_get) = &handler.http_get {
        return match run_http(http_get, &ctx).await {
            Ok(fell_back) => (None, fell_back),
            Err(error) => (
                Some(format!(
                    "Http lifecycle hook ({}) for Container {:?} in Pod {:?} failed - error: {error}, message: \"\"",
                    http_get.path.as_deref().unwrap_or(""),
                    ctx.target.name,
                    ctx.target.pod_display()
                )),
                false,
            ),
        };
    }
    if let Some(sleep) = &handler.sleep {
        // Negative seconds are rejected by the API server; treat them as 0.
        let seconds = u64::try_from(sleep.seconds).unwrap_or(0);
        tokio::time::sleep(Duration::from_secs(seconds)).await;
        return (None, false);
    }
    (
        Some(format!(
            "Cannot run handler: invalid handler: {}",
            describe(handler)
        )),
        false,
    )
}

async fn run_exec(command: &[String], mut ctx: HookContext<'_>) -> Result<(), String> {
    let failed = |error: String, output: &str| {
        format!(
            "Exec lifecycle hook ([{}]) for Container {:?} in Pod {:?} failed - error: {error}, message: {output:?}",
            command.join(" "),
            ctx.target.name,
            ctx.target.pod_display()
        )
    };
    // The runtime ends the exec when the grace period is over, so the hook
    // never outlives the stop that follows.
    let timeout = i64::try_from(ctx.grace.as_secs()).unwrap_or(i64::MAX);
    let response = ctx
        .cri
        .exec_sync(ExecSyncRequest {
            container_id: ctx.target.id.clone(),
            cmd: command.to_vec(),
            timeout,
        })
        .await;
    match response {
        Ok(response) => {
            let response = response.into_inner();
            if response.exit_code == 0 {
                return Ok(());
            }
            let stderr = String::from_utf8_lossy(&response.stderr);
            let mut output = String::from_utf8_lossy(&response.stdout).into_owned();
            output.push_str(&stderr);
            Err(failed(
                format!(
                    "command '{}' exited with {}: {stderr}",
                    command.join(" "),
                    response.exit_code
                ),
                &output,
            ))
        }
        Err(status) => Err(failed(
            format!(
                "rpc error: code = {:?} desc = {}",
                status.code(),
                status.message()
            ),
            "",
        )),
    }
}

async fn run_http(action: &HTTPGetAction, ctx: &HookContext<'_>) -> Result<bool, String> {
    let host = match action.host.as_deref().filter(|h| !h.is_empty()) {
        Some(host) => host.to_owned(),
        None => pod_address(ctx).await?.to_string(),
    };
    let port = resolve_port(&action.port, ctx.ports)?;
    let scheme = match action
        .scheme
        .as_deref()
        .map(str::to_ascii_lowercase)
        .as_deref()
    {
        None | Some("") | Some("http") => Scheme::Http,
        Some("https") => Scheme::Https,
        Some(other) => return Err(format!("unsupported scheme {other:?}")),
    };
    let headers = action
        .http_headers
        .iter()
        .flatten()
        .map(|h| (h.name.clone(), h.value.clone()))
        .collect();
    let get = Get {
        scheme,
        host,
        port,
        path: action.path.clone().unwrap_or_default(),
        headers,
    };
    ctx.http
        .get(&get)
        .await
        .map_err(|e| crate::telemetry::Chain(&e).to_string())
}

/// The port of an httpGet hook: a number, a numeric string, or the name of
/// one of the container's ports; an empty name means 80.
pub(super) fn resolve_port(port: &IntOrString, ports: &[ContainerPort]) -> Result<u16, String> {
    let number = match port {
        IntOrString::Int(n) => i64::from(*n),
        IntOrString::String(s) if s.is_empty() => 80,
        IntOrString::String(s) => match s.parse::<i64>() {
            Ok(n) => n,
            Err(_) => ports
                .iter()
                .find(|p| p.name.as_deref() == Some(s.as_str()))
                .map(|p| i64::from(p.container_port))
                .ok_or_else(|| format!("couldn't find port: {s:?} in the container's ports"))?,
        },
    };
    u16::try_from(number)
        .ok()
        .filter(|p| *p > 0)
        .ok_or_else(|| format!("invalid port number: {number}"))
}

/// The Pod's IP from its sandbox; the node's address for host-network Pods.
async fn pod_address(ctx: &HookContext<'_>) -> Result<IpAddr, String> {
    let mut cri = ctx.cri.clone();
    let containers = cri
        .list_containers(ListContainersRequest {
            filter: Some(ContainerFilter {
                id: ctx.target.id.clone(),
                ..Default::default()
            }),
        })
        .await
        .map_err(|s| format!("failed to find the pod sandbox: {}", s.message()))?
        .into_inner()
        .containers;
    let sandbox_id = containers
        .first()
        .map(|c| c.pod_sandbox_id.clone())
        .ok_or("failed to find the pod sandbox of the container")?;
    let sandbox = cri
        .pod_sandbox_status(PodSandboxStatusRequest {
            pod_sandbox_id: sandbox_id,
            verbose: false,
        })
        .await
        .map_err(|s| format!("failed to get the pod sandbox status: {}", s.message()))?
        .into_inner()
        .status
        .unwrap_or_default();
    let host_network = sandbox
        .linux
        .as_ref()
        .and_then(|l| l.namespaces.as_ref())
        .and_then(|n| n.options.as_ref())
        .is_some_and(|o| o.network() == NamespaceMode::Node);
    if host_network {
        return Ok(ctx.node_address);
    }
    let ip = sandbox.network.map(|n| n.ip).unwrap_or_default();
    ip.parse()
        .map_err(|_| format!("failed to find networking container: pod IP {ip:?}"))
}

/// A short description of a handler with nothing runnable in it.
fn describe(handler: &LifecycleHandler) -> String {
    match &handler.tcp_socket {
        Some(tcp) => format!("tcpSocket to port {}", port_text(&tcp.port)),
        None => "no action".to_owned(),
    }
}

fn port_text(port: &IntOrString) -> String {
    match port {
        IntOrString::Int(n) => n.to_string(),
        IntOrString::String(s) => s.clone(),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn port(name: &str, number: i32) -> ContainerPort {
        ContainerPort {
            name: Some(name.into()),
            container_port: number,
            ..Default::default()
        }
    }

    #[test]
    fn ports_resolve_by_number_string_and_name() {
        let ports = [port("http", 8080), port("admin", 9000)];
        assert_eq!(resolve_port(&IntOrString::Int(81), &ports), Ok(81));
        assert_eq!(
            resolve_port(&IntOrString::String("82".into()), &ports),
            Ok(82)
        );
        assert_eq!(
            resolve_port(&IntOrString::String("admin".into()), &ports),
            Ok(9000)
        );
        assert_eq!(
            resolve_port(&IntOrString::String(String::new()), &ports),
            Ok(80)
        );
        assert!(resolve_port(&IntOrString::String("nope".into()), &ports).is_err());
        assert!(resolve_port(&IntOrString::Int(0), &ports).is_err());
        assert!(resolve_port(&IntOrString::Int(70000), &ports).is_err());
        assert!(resolve_port(&IntOrString::Int(-1), &ports).is_err());
    }

    #[test]
    fn handler_kinds() {
        let json = |s: &str| serde_json::from_str::<LifecycleHandler>(s).unwrap();
        assert_eq!(
            kind(&json(r#"{"exec":{"command":["true"]}}"#)),
            HookKind::Exec
        );
        assert_eq!(kind(&json(r#"{"httpGet":{"port":80}}"#)), HookKind::HttpGet);
        assert_eq!(kind(&json(r#"{"sleep":{"seconds":1}}"#)), HookKind::Sleep);
        assert_eq!(
            kind(&json(r#"{"tcpSocket":{"port":80}}"#)),
            HookKind::Invalid
        );
        assert_eq!(kind(&json("{}")), HookKind::Invalid);
    }
}
