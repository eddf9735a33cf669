//! The command line. Every setting of `run` and `check` comes, in this order
//! of precedence, from a flag, from `CRR_PROXY_<FLAG>`, from the settings
//! file (`--config`, default `/etc/crr-proxy/config.toml`, optional), or
//! from the built-in default.

use std::net::SocketAddr;
use std::path::{Path, PathBuf};

use clap::parser::ValueSource;
use clap::{ArgMatches, Args, CommandFactory, Parser, Subcommand, ValueEnum};

use crate::RunConfig;
use crate::agent::AgentSettings;
use crate::cri::Endpoint;
use crate::proxy::Routes;
use crate::telemetry::LogFormat;

/// crr-proxy: a transparent CRI proxy for kubelet, and the node agent for
/// OpenKruise's ContainerRecreateRequest.
#[derive(Debug, Parser)]
#[command(name = "crr-proxy", version = crate::version::LONG, about, long_about = None)]
pub struct Cli {
    #[command(subcommand)]
    pub command: Command,
}

#[derive(Debug, Subcommand)]
pub enum Command {
    /// Serve the CRI proxy socket (and the agent, when enabled).
    Run(RunArgs),
    /// Check what crr-proxy depends on (runtime, socket path, kubelet,
    /// Kubernetes credentials and RBAC, CRD, node) and print a table; exits
    /// non-zero when a check fails. Takes the same settings as `run`.
    Check(CheckArgs),
    /// Print the ContainerRecreateRequest CRD (apply it with kubectl).
    Crd,
    /// Print the cluster objects of an agent mode (deploy/kruise or
    /// deploy/standalone, as `kubectl apply -k` applies them) for the
    /// Lease given (`kubectl apply -f -`).
    Manifests(ManifestsArgs),
    /// Restart containers of a Pod in place (a ContainerRecreateRequest),
    /// and follow it to its end. Also `kubectl crr restart` when this binary
    /// is on PATH as `kubectl-crr`.
    Restart(RestartArgs),
}

#[derive(Debug, Clone, Args)]
pub struct RestartArgs {
    /// What to restart: a Pod (`web-0`), or every Pod of a workload in
    /// waves (`deployment/web`, `sts/db`, `ds/agent`, `rs/web-5d8f`,
    /// `cloneset/shop`, `asts/db`).
    #[arg(
        value_name = "POD|KIND/NAME",
        value_parser = parse_target,
        required_unless_present = "selector"
    )]
    pub target: Option<crate::restart::target::Target>,

    /// Instead of a Pod or a workload: the Pods of the namespace this label
    /// selector matches (`-l app=web`, `-l 'tier in (web,api)'`), in waves
    /// as a workload's.
    #[arg(short = 'l', long, value_name = "SELECTOR", conflicts_with = "target")]
    pub selector: Option<String>,

    /// The containers to restart, in order: `-c app,sidecar` or `-c app -c
    /// sidecar` [default: the Pod's default container: the one its
    /// kubectl.kubernetes.io/default-container annotation names, or its only
    /// regular container]
    #[arg(short = 'c', long = "container", value_delimiter = ',')]
    pub containers: Vec<String>,

    /// One container at a time, each Ready before the next (orderedRecreate).
    #[arg(long)]
    pub ordered: bool,

    /// Restart even containers that are not running (forceRecreate).
    #[arg(long)]
    pub force: bool,

    /// A new container must have run this long (`5s`) to count (minStartedSeconds).
    #[arg(long, value_name = "DURATION")]
    pub min_started: Option<Seconds>,

    /// Take the Pod out of service this long before the kill (unreadyGracePeriodSeconds).
    #[arg(long, value_name = "DURATION")]
    pub unready_grace: Option<Seconds>,

    /// Give up after this long (activeDeadlineSeconds, at least 3s).
    #[arg(long, value_name = "DURATION")]
    pub deadline: Option<Seconds>,

    /// Stop following after this long (`90s`), as a failure; what was
    /// created goes on [default: no limit].
    #[arg(long, value_name = "DURATION")]
    pub timeout: Option<Seconds>,

    /// Delete the CRR this long after it ends (ttlSecondsAfterFinished).
    #[arg(long, value_name = "DURATION")]
    pub ttl: Option<Seconds>,

    /// When a container cannot be restarted: stop (Fail) or go on (Ignore).
    #[arg(long, value_enum)]
    pub failure_policy: Option<FailurePolicyArg>,

    /// A workload: how many of its Pods may be restarting or unready at
    /// once, a number or a percentage of its Pods (rounded down, at least 1).
    /// [default: 1]
    #[arg(long, value_name = "N|P%")]
    pub max_unavailable: Option<crate::restart::waves::MaxUnavailable>,

    /// A workload: go on after a failed restart (the exit status is still 1).
    #[arg(long)]
    pub continue_on_failure: bool,

    /// A workload: resume this run, skipping the Pods it restarted already.
    #[arg(long, value_name = "ID")]
    pub run_id: Option<String>,

    /// Follow the restart until it ends; `--wait=false` returns once the
    /// CRR is created, as kubectl spells it [default: when stdout is a
    /// terminal].
    #[arg(
        long,
        value_name = "BOOL",
        num_args = 0..=1,
        default_missing_value = "true",
        require_equals = true,
        overrides_with = "no_wait"
    )]
    pub wait: Option<bool>,

    /// Create the CRR and return (`--wait=false`).
    #[arg(long, overrides_with = "wait", hide = true)]
    pub no_wait: bool,

    /// Print the CRR (the created one, or the final one when followed);
    /// progress then goes to stderr.
    #[arg(short = 'o', long, value_enum)]
    pub output: Option<OutputArg>,

    /// `client`: print the CRR and send nothing; `server`: have the API
    /// server judge it without storing it.
    #[arg(long, value_enum, default_value = "none", num_args = 0..=1, default_missing_value = "client", require_equals = true)]
    pub dry_run: DryRunArg,

    /// kubeconfig [default: $KUBECONFIG, then ~/.kube/config, then in-cluster].
    #[arg(long)]
    pub kubeconfig: Option<PathBuf>,

    /// The kubeconfig context [default: its current context].
    #[arg(long)]
    pub context: Option<String>,

    /// The Pod's namespace [default: the context's].
    #[arg(short = 'n', long)]
    pub namespace: Option<String>,
}

fn parse_target(text: &str) -> Result<crate::restart::target::Target, String> {
    crate::restart::target::Target::parse(text).map_err(|e| e.to_string())
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, ValueEnum)]
pub enum FailurePolicyArg {
    Fail,
    Ignore,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, ValueEnum)]
pub enum OutputArg {
    Json,
    Yaml,
    /// `containerrecreaterequest.apps.kruise.io/NAME`, as `kubectl -o name`.
    Name,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, ValueEnum)]
pub enum DryRunArg {
    None,
    Client,
    Server,
}

impl RestartArgs {
    /// The run `restart` makes; `terminal`: whether stdout is one (the
    /// default for `--wait`).
    pub fn options(&self, terminal: bool, live: bool) -> crate::restart::Options {
        use crate::restart::target::Target;
        use crate::restart::{Cluster, DryRun, Options, Output, WaveOptions, request::Request};
        let seconds = |s: &Option<Seconds>| s.map(|s| s.0);
        // clap holds one of the two (required_unless_present, conflicts_with).
        let target = match (&self.target, &self.selector) {
            (Some(target), _) => target.clone(),
            (None, selector) => Target::Selector(selector.clone().unwrap_or_default()),
        };
        let workload = !matches!(target, Target::Pod(_));
        Options {
            waves: WaveOptions {
                max_unavailable: self.max_unavailable,
                continue_on_failure: self.continue_on_failure,
                run_id: self.run_id.clone(),
            },
            live,
            timeout: seconds(&self.timeout),
            request: Request {
                pod: match &target {
                    Target::Pod(name) => name.clone(),
                    Target::Workload(..) | Target::Selector(_) => String::new(),
                },
                containers: self.containers.clone(),
                ordered: self.ordered,
                force: self.force,
                min_started: seconds(&self.min_started),
                unready_grace: seconds(&self.unready_grace),
                deadline: seconds(&self.deadline),
                ttl: seconds(&self.ttl),
                failure_policy: self.failure_policy.map(|p| match p {
                    FailurePolicyArg::Fail => crate::crr::FailurePolicy::Fail,
                    FailurePolicyArg::Ignore => crate::crr::FailurePolicy::Ignore,
                }),
            },
            cluster: Cluster {
                kubeconfig: self.kubeconfig.clone(),
                context: self.context.clone(),
                namespace: self.namespace.clone(),
            },
            // A workload's waves are always followed; `--no-wait` with one
            // is refused.
            wait: match (self.no_wait, self.wait) {
                (true, _) => false,
                (false, Some(wait)) => wait,
                (false, None) => terminal || workload,
            },
            output: self.output.map(|o| match o {
                OutputArg::Json => Output::Json,
                OutputArg::Yaml => Output::Yaml,
                OutputArg::Name => Output::Name,
            }),
            dry_run: match self.dry_run {
                DryRunArg::None => DryRun::None,
                DryRunArg::Client => DryRun::Client,
                DryRunArg::Server => DryRun::Server,
            },
            target,
        }
    }
}

#[derive(Debug, Clone, Args)]
pub struct CheckArgs {
    #[command(flatten)]
    pub run: RunArgs,

    /// The service's environment file (its unit's EnvironmentFile): its
    /// CRR_PROXY_* lines are checked as the service runs with them. This
    /// shell's variables and the flags win over it; it wins over --config.
    #[arg(long, default_value = DEFAULT_ENV_FILE)]
    pub env_file: PathBuf,

    /// Only what must hold before kubelet is pointed at crr-proxy (install.sh
    /// runs it): the runtime endpoint answers CRI Version, and crr-proxy's
    /// socket answers it for that same runtime. kubelet and the agent are not
    /// checked.
    #[arg(long)]
    pub before_switch: bool,
}

/// The standalone Lease, which `run` elects its claimer with and
/// `manifests` renders the cluster's objects for.
#[derive(Debug, Clone, Args)]
pub struct LeaseArgs {
    /// Standalone mode: the Lease that elects the one node claiming new CRRs
    /// for the nodes of their Pods (its holderIdentity is the node name).
    /// `crr-proxy manifests` renders deploy/ for it.
    #[arg(
        long,
        env = "CRR_PROXY_LEASE_NAME",
        default_value = crate::manifests::DEFAULT_LEASE_NAME
    )]
    pub lease_name: String,

    /// Standalone mode: the Lease's namespace, one of crr-proxy's own.
    #[arg(
        long,
        env = "CRR_PROXY_LEASE_NAMESPACE",
        default_value = crate::manifests::DEFAULT_LEASE_NAMESPACE
    )]
    pub lease_namespace: String,
}

impl LeaseArgs {
    pub fn lease(&self) -> Result<crate::manifests::LeaseRef, ConfigError> {
        Ok(crate::manifests::LeaseRef::new(
            &self.lease_name,
            &self.lease_namespace,
        )?)
    }
}

#[derive(Debug, Clone, Args)]
pub struct ManifestsArgs {
    /// Whose objects: `kruise` (next to OpenKruise) or `standalone` (with
    /// the CRD, the Lease's namespace and the standalone checks).
    #[arg(long, value_enum)]
    pub agent: ManifestsFor,

    /// Whose credentials the nodes' crr-proxy uses: `own` (the per-node
    /// identity scripts/node-identity.sh issues) or `kubelet` (kubelet's
    /// kubeconfig and rotating client certificate; kruise mode only).
    #[arg(long, value_enum, default_value = "own")]
    pub identity: IdentityFor,

    #[command(flatten)]
    pub lease: LeaseArgs,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, ValueEnum)]
pub enum IdentityFor {
    Own,
    Kubelet,
}

impl IdentityFor {
    pub fn identity(self) -> crate::manifests::Identity {
        match self {
            Self::Own => crate::manifests::Identity::Own,
            Self::Kubelet => crate::manifests::Identity::Kubelet,
        }
    }
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, ValueEnum)]
pub enum ManifestsFor {
    Kruise,
    Standalone,
}

impl ManifestsFor {
    pub fn overlay(self) -> crate::manifests::Overlay {
        match self {
            Self::Kruise => crate::manifests::Overlay::Kruise,
            Self::Standalone => crate::manifests::Overlay::Standalone,
        }
    }
}

/// The environment file `crr-proxy.service` reads and `install.sh` writes.
pub const DEFAULT_ENV_FILE: &str = "/etc/crr-proxy/crr-proxy.env";

/// Where the settings file is looked for when `--config` is not given.
pub const DEFAULT_CONFIG_FILE: &str = "/etc/crr-proxy/config.toml";

#[derive(Debug, Clone, Args)]
pub struct RunArgs {
    /// Settings file (TOML, keys named as the flags: `runtime-endpoint =
    /// "unix:///..."`). Flags and CRR_PROXY_* variables win over it.
    #[arg(long, env = "CRR_PROXY_CONFIG", default_value = DEFAULT_CONFIG_FILE)]
    pub config: PathBuf,

    /// Unix socket kubelet connects to (its containerRuntimeEndpoint and
    /// imageServiceEndpoint). Ignored under systemd socket activation.
    #[arg(
        long,
        env = "CRR_PROXY_LISTEN",
        default_value = "/run/crr-proxy/crr-proxy.sock"
    )]
    pub listen: PathBuf,

    /// The real container runtime's CRI socket.
    #[arg(
        long,
        env = "CRR_PROXY_RUNTIME_ENDPOINT",
        default_value = "unix:///run/containerd/containerd.sock"
    )]
    pub runtime_endpoint: Endpoint,

    /// Where ImageService calls go [default: the runtime endpoint].
    #[arg(long, env = "CRR_PROXY_IMAGE_ENDPOINT")]
    pub image_endpoint: Option<Endpoint>,

    /// ContainerRecreateRequest agent: `off` (proxy only), `kruise` (next to
    /// OpenKruise's webhook and manager) or `standalone` (without OpenKruise).
    #[arg(long, env = "CRR_PROXY_AGENT", value_enum, default_value_t = AgentMode::Off)]
    pub agent: AgentMode,

    /// This node's name, as in the Pods' spec.nodeName (agent modes)
    /// [default: the host name, as kubelet's].
    #[arg(long, env = "CRR_PROXY_NODE_NAME")]
    pub node_name: Option<String>,

    /// kubelet's configuration file: `check` reads its runtime endpoints
    /// and back-off, the agent its feature gates before each kill.
    #[arg(
        long,
        env = "CRR_PROXY_KUBELET_CONFIG",
        default_value = "/var/lib/kubelet/config.yaml"
    )]
    pub kubelet_config: PathBuf,

    /// kubeconfig for the agent [default: $KUBECONFIG, ~/.kube/config, then in-cluster].
    #[arg(long, env = "CRR_PROXY_KUBECONFIG")]
    pub kubeconfig: Option<PathBuf>,

    /// Address for /metrics, /healthz and /readyz; `off` serves none. Keep
    /// it on loopback: nothing there is meant for other hosts.
    #[arg(
        long,
        env = "CRR_PROXY_METRICS_ADDR",
        default_value = "127.0.0.1:10221"
    )]
    pub metrics_addr: MetricsAddr,

    /// Tell kubelet why a container restarted: for containers stopped for a
    /// CRR, status answers carry reason `ContainerRecreateRequest` instead
    /// of the runtime's `Error`/`Completed`. `false` passes them unchanged.
    #[arg(long, env = "CRR_PROXY_REASON_REWRITE", default_value_t = true, action = clap::ArgAction::Set)]
    pub reason_rewrite: bool,

    /// Where crr-proxy keeps what must survive a restart: the containers it
    /// stopped (for the reason rewrite) and those whose kill began (so that
    /// a preStop hook runs at most once).
    #[arg(
        long,
        env = "CRR_PROXY_STATE_DIR",
        default_value = "/var/lib/crr-proxy"
    )]
    pub state_dir: PathBuf,

    #[command(flatten)]
    pub lease: LeaseArgs,

    /// Standalone mode: how long the Lease lasts unrenewed (`15s`, `1m`):
    /// the longest a new CRR waits for a claim after its holder dies.
    #[arg(long, env = "CRR_PROXY_LEASE_DURATION", default_value = "15s")]
    pub lease_duration: Seconds,

    /// Standalone mode: how often the holder renews the Lease; less than
    /// --lease-duration.
    #[arg(long, env = "CRR_PROXY_LEASE_RENEW_PERIOD", default_value = "5s")]
    pub lease_renew_period: Seconds,

    /// Log format on stderr. The level comes from CRR_PROXY_LOG (or RUST_LOG),
    /// e.g. `info` or `crr_proxy=debug`.
    #[arg(long, env = "CRR_PROXY_LOG_FORMAT", value_enum, default_value_t = LogFormat::Text)]
    pub log_format: LogFormat,
}

/// `--metrics-addr`: an address, or `off`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct MetricsAddr(pub Option<SocketAddr>);

impl std::str::FromStr for MetricsAddr {
    type Err = std::net::AddrParseError;

    fn from_str(s: &str) -> Result<Self, Self::Err> {
        match s {
            "off" | "" => Ok(Self(None)),
            addr => addr.parse().map(|a| Self(Some(a))),
        }
    }
}

/// A duration as kubectl takes one (`500ms`, `1.5s`, `2m`, `1h30m`; jiff's
/// friendly format, which also reads `2 mins`), or whole seconds (`15`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Seconds(pub std::time::Duration);

impl std::str::FromStr for Seconds {
    type Err = String;

    fn from_str(s: &str) -> Result<Self, Self::Err> {
        let s = s.trim();
        if !s.is_empty() && s.bytes().all(|b| b.is_ascii_digit()) {
            return s
                .parse()
                .map(|n| Self(std::time::Duration::from_secs(n)))
                .map_err(|_| format!("{s:?}: too many seconds"));
        }
        // Go's spelling, as kubectl writes it, is a part of jiff's friendly
        // format; never negative.
        use k8s_openapi::jiff::fmt::friendly::SpanParser;
        static PARSER: SpanParser = SpanParser::new();
        PARSER
            .parse_unsigned_duration(s)
            .map(Self)
            .map_err(|error| {
                format!("{s:?}: expected a duration such as 15s, 500ms, 1.5s or 1h30m ({error})")
            })
    }
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, ValueEnum)]
pub enum AgentMode {
    Off,
    Kruise,
    Standalone,
}

#[derive(Debug, thiserror::Error, PartialEq, Eq)]
pub enum ConfigError {
    #[error("{path}: {reason}")]
    File { path: String, reason: String },
    #[error("--agent needs this node's name: set --node-name (CRR_PROXY_NODE_NAME)")]
    NoNodeName,
    #[error(
        "--lease-renew-period ({renew:?}) must be shorter than --lease-duration ({duration:?}), and the duration at least 1s"
    )]
    LeaseTiming {
        renew: std::time::Duration,
        duration: std::time::Duration,
    },
    #[error(transparent)]
    Manifest(#[from] crate::manifests::ManifestError),
}

// === impl RunArgs ===

impl RunArgs {
    /// Checks the flags together and turns them into what `run` needs.
    pub fn validate(&self) -> Result<RunConfig, ConfigError> {
        let agent = match self.agent {
            AgentMode::Off => None,
            AgentMode::Kruise | AgentMode::Standalone => {
                let node_name = self
                    .node_name
                    .clone()
                    .filter(|n| !n.trim().is_empty())
                    .or_else(host_name)
                    .ok_or(ConfigError::NoNodeName)?;
                Some(AgentSettings {
                    node_name,
                    kubeconfig: self.kubeconfig.clone(),
                    mode: if self.agent == AgentMode::Kruise {
                        crate::agent::Mode::Kruise
                    } else {
                        crate::agent::Mode::Standalone
                    },
                    kills_file: self.state_dir.join("kills"),
                    lease: self.lease()?,
                    kubelet: crate::agent::KubeletSettings {
                        config: Some(self.kubelet_config.clone()),
                        reads_rewrites: self.reason_rewrite,
                    },
                })
            }
        };
        // Sending images to the same socket twice would only cost a second
        // connection; treat it as "not set".
        let image = self
            .image_endpoint
            .clone()
            .filter(|image| *image != self.runtime_endpoint);
        Ok(RunConfig {
            listen: self.listen.clone(),
            routes: Routes {
                runtime: self.runtime_endpoint.clone(),
                image,
            },
            agent,
            metrics_addr: self.metrics_addr.0,
            recreated_file: self
                .reason_rewrite
                .then(|| self.state_dir.join("recreated")),
        })
    }
}

impl RunArgs {
    fn lease(&self) -> Result<crate::agent::LeaseSettings, ConfigError> {
        let (duration, renew) = (self.lease_duration.0, self.lease_renew_period.0);
        if renew >= duration || duration < std::time::Duration::from_secs(1) || renew.is_zero() {
            return Err(ConfigError::LeaseTiming { renew, duration });
        }
        let lease = self.lease.lease()?;
        Ok(crate::agent::LeaseSettings {
            name: lease.name().to_owned(),
            namespace: lease.namespace().to_owned(),
            duration,
            renew_period: renew,
            ..crate::agent::LeaseSettings::default()
        })
    }
}

/// Parses the command line, filling the settings neither a flag nor a
/// variable gave from the settings file.
pub fn parse(argv: Vec<std::ffi::OsString>) -> Result<Cli, ParseError> {
    let matches = command_for(&argv).try_get_matches_from(&argv)?;
    let Some((name, sub)) = matches.subcommand() else {
        return Ok(<Cli as clap::FromArgMatches>::from_arg_matches(&matches)?);
    };
    if !matches!(name, "run" | "check") {
        return Ok(<Cli as clap::FromArgMatches>::from_arg_matches(&matches)?);
    }
    let mut argv = argv;
    // Settings the environment file gave; the settings file's come after.
    let mut given = std::collections::HashSet::new();
    if name == "check" {
        for (id, value) in environment_file(sub)? {
            argv.push(format!("--{}={value}", id.replace('_', "-")).into());
            given.insert(id);
        }
    }
    let Some(text) = optional_file(sub, "config")? else {
        return Ok(Cli::try_parse_from(argv)?);
    };
    let path: PathBuf = sub
        .get_one::<PathBuf>("config")
        .cloned()
        .unwrap_or_default();
    let table: toml::Table = toml::from_str(&text).map_err(|e| file_error(&path, e.to_string()))?;
    for (key, value) in table {
        let known = Cli::command().find_subcommand(name).is_some_and(|c| {
            c.get_arguments()
                .any(|a| a.get_id() == key.replace('-', "_").as_str())
        });
        if !known || key == "config" {
            return Err(file_error(&path, format!("unknown setting {key:?}")));
        }
        let id = key.replace('-', "_");
        if !from_default(sub, &id) || given.contains(&id) {
            continue;
        }
        let value = match value {
            toml::Value::String(s) => s,
            toml::Value::Integer(n) => n.to_string(),
            toml::Value::Boolean(b) => b.to_string(),
            other => {
                let kind = other.type_str();
                return Err(file_error(
                    &path,
                    format!("{key}: expected a string, got a {kind}"),
                ));
            }
        };
        argv.push(format!("--{key}={value}").into());
    }
    Ok(Cli::try_parse_from(argv)?)
}

/// The text of the file that argument `id` names; `None` when it is the
/// default file and there is none (a file asked for by name must exist).
fn optional_file(matches: &ArgMatches, id: &str) -> Result<Option<String>, ParseError> {
    let path: PathBuf = matches.get_one::<PathBuf>(id).cloned().unwrap_or_default();
    match std::fs::read_to_string(&path) {
        Ok(text) => Ok(Some(text)),
        Err(error) if error.kind() == std::io::ErrorKind::NotFound && from_default(matches, id) => {
            Ok(None)
        }
        Err(error) => Err(file_error(&path, error.to_string())),
    }
}

/// The command line as its name calls for: on PATH as `kubectl-crr`,
/// kubectl runs it for `kubectl crr ...`, whose user restarts containers;
/// the node's commands (run, check, crd) still work there but are not shown.
fn command_for(argv: &[std::ffi::OsString]) -> clap::Command {
    let command = Cli::command();
    let called = argv
        .first()
        .and_then(|a| Path::new(a).file_name())
        .and_then(|n| n.to_str())
        .unwrap_or_default();
    if !called.starts_with(crate::restart::request::TOOL) {
        return command;
    }
    command
        .name("kubectl crr")
        .bin_name("kubectl crr")
        .display_name("kubectl crr")
        .about("Restart containers of Pods in place, with ContainerRecreateRequests")
        .mut_subcommand("run", |c| c.hide(true))
        .mut_subcommand("check", |c| c.hide(true))
        .mut_subcommand("crd", |c| c.hide(true))
        .mut_subcommand("manifests", |c| c.hide(true))
        .mut_subcommand("restart", |c| {
            c.about("Restart containers of a Pod, or of a workload's Pods in waves, in place, and follow it to its end")
        })
}

/// The settings of `check`'s `--env-file` that neither a flag nor this
/// process's environment gave, as (argument id, value). The file is read
/// as systemd reads an EnvironmentFile: `NAME=value` lines, `#` and `;`
/// comments, a value optionally in quotes. Names that are not crr-proxy's
/// settings (`CRR_PROXY_LOG`, `RUST_LOG`) are left to the service.
fn environment_file(sub: &ArgMatches) -> Result<Vec<(String, String)>, ParseError> {
    let Some(text) = optional_file(sub, "env_file")? else {
        return Ok(Vec::new());
    };
    let command = Cli::command();
    let Some(check) = command.find_subcommand("check") else {
        return Ok(Vec::new());
    };
    let mut settings = Vec::new();
    for line in text.lines().map(str::trim) {
        if line.is_empty() || line.starts_with('#') || line.starts_with(';') {
            continue;
        }
        let Some((name, value)) = line.split_once('=') else {
            continue;
        };
        let value = value.trim();
        let value = ['"', '\'']
            .iter()
            .find_map(|q| value.strip_prefix(*q).and_then(|v| v.strip_suffix(*q)))
            .unwrap_or(value);
        let Some(arg) = check
            .get_arguments()
            .find(|a| a.get_env().is_some_and(|env| env == name.trim()))
        else {
            continue;
        };
        let id = arg.get_id().as_str().to_owned();
        if from_default(sub, &id) {
            // A name given twice: the last line wins, as systemd reads it.
            settings.retain(|(earlier, _)| *earlier != id);
            settings.push((id, value.to_owned()));
        }
    }
    Ok(settings)
}

fn from_default(matches: &ArgMatches, id: &str) -> bool {
    matches!(
        matches.value_source(id),
        None | Some(ValueSource::DefaultValue)
    )
}

fn file_error(path: &std::path::Path, reason: String) -> ParseError {
    ParseError::Config(ConfigError::File {
        path: path.display().to_string(),
        reason,
    })
}

#[derive(Debug, thiserror::Error)]
pub enum ParseError {
    #[error(transparent)]
    Clap(#[from] clap::Error),
    #[error(transparent)]
    Config(#[from] ConfigError),
}

/// The host name, lower-cased: kubelet's default node name.
fn host_name() -> Option<String> {
    std::fs::read_to_string("/proc/sys/kernel/hostname")
        .ok()
        .map(|name| name.trim().to_lowercase())
        .filter(|name| !name.is_empty())
}

#[cfg(test)]
mod tests;
