//! A small, faithful fake Kubernetes API server for the agent's tests.
//!
//! It keeps objects as JSON and follows the real semantics the agent and the
//! test roles rely on: resourceVersions, list + watch (resuming from a
//! resourceVersion, `410 Gone` once compacted, DELETED/ADDED when an object
//! stops/starts matching a label selector; and, as `set_watches` asks,
//! BOOKMARKs, a `410` every few events, and a watch that lags behind its
//! writes), label and field selectors, the
//! status subresource, JSON merge patch and JSON patch (`patch.rs`), list
//! reads by resourceVersion (`reads.rs`), `409 Conflict` on a stale
//! resourceVersion, finalizers, admission hooks (the webhook's place) and
//! Events. Tests reach it over HTTP through kube, and in-process through
//! the same operations.

use std::collections::{BTreeMap, HashMap, VecDeque};
use std::convert::Infallible;
use std::sync::{Arc, Mutex, MutexGuard};
use std::time::Duration;

use bytes::Bytes;
use http::{Method, Request, Response, StatusCode};
use http_body_util::{BodyExt, Full, combinators::BoxBody};
use hyper::body::{Frame, Incoming};
use hyper::service::service_fn;
use hyper_util::rt::TokioIo;
use serde_json::{Value, json};
use tokio::net::TcpListener;
use tokio::sync::{broadcast, mpsc, watch};

use super::patch::Patch;
pub use super::selectors::Selector;

mod admission;
mod authz;
mod discovery;
mod endpoints;
mod faults;
mod handler;
mod objects;
mod pruning;
mod watching;
use super::policy::{self, Attributes, Policy, UserInfo};
use super::reads::{self, Read};
use super::versions::View;
#[allow(unused_imports)] // each test binary uses a different part
pub use super::versions::{Conversion, CrrVersions};

/// deploy/base's objects that judge requests, as `kubectl apply -k
/// deploy/base` installs them: the claimer's namespace and Lease (held by
/// no node), then the node policies, which read that Lease.
pub const BASE_POLICIES: &str = concat!(
    include_str!("../../deploy/base/claimer.yaml"),
    "---\n",
    include_str!("../../deploy/base/node-policy.yaml")
);
use authz::Access;
/// How a write's request sees CRRs: the version it names, and what it asks
/// for unknown fields.
#[derive(Clone, Copy, Debug)]
struct Through {
    view: View,
    validation: FieldValidation,
}

impl Through {
    /// The tests' own writes: in the storage version, unknown fields dropped.
    const STORED: Through = Through {
        view: View::Stored,
        validation: FieldValidation::Drop,
    };
}

#[allow(unused_imports)] // KRUISE_V1_9_LACKS: for tests/real only
pub use pruning::{FieldValidation, KRUISE_V1_9_LACKS};

const HISTORY: usize = 10_000;

tokio::task_local! {
    /// Who sent the HTTP request being served; unset for in-process calls.
    static CALLER: Option<UserInfo>;
}

#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum Resource {
    Crr,
    Pod,
    Node,
    Event,
    CoreEvent,
    Lease,
    Deployment,
    ReplicaSet,
    StatefulSet,
    DaemonSet,
    PodDisruptionBudget,
    /// OpenKruise's, served only after `serve_kruise_workloads`.
    CloneSet,
    /// OpenKruise's Advanced StatefulSet (`statefulsets.apps.kruise.io`).
    AdvancedStatefulSet,
}

impl Resource {
    fn from_path(group_version: &str, plural: &str) -> Option<Self> {
        Some(match (group_version, plural) {
            ("apps.kruise.io/v1alpha1" | "apps.kruise.io/v1beta1", "containerrecreaterequests") => {
                Resource::Crr
            }
            ("v1", "pods") => Resource::Pod,
            ("v1", "nodes") => Resource::Node,
            ("v1", "events") => Resource::CoreEvent,
            ("events.k8s.io/v1", "events") => Resource::Event,
            ("coordination.k8s.io/v1", "leases") => Resource::Lease,
            ("apps/v1", "deployments") => Resource::Deployment,
            ("apps/v1", "replicasets") => Resource::ReplicaSet,
            ("apps/v1", "statefulsets") => Resource::StatefulSet,
            ("apps/v1", "daemonsets") => Resource::DaemonSet,
            ("policy/v1", "poddisruptionbudgets") => Resource::PodDisruptionBudget,
            ("apps.kruise.io/v1alpha1", "clonesets") => Resource::CloneSet,
            ("apps.kruise.io/v1beta1", "statefulsets") => Resource::AdvancedStatefulSet,
            _ => return None,
        })
    }

    /// Served from a CRD, not built into kube-apiserver.
    pub fn is_custom(self) -> bool {
        matches!(
            self,
            Resource::Crr | Resource::CloneSet | Resource::AdvancedStatefulSet
        )
    }

    pub fn api_version(self) -> &'static str {
        match self {
            Resource::Crr => "apps.kruise.io/v1alpha1",
            Resource::Event => "events.k8s.io/v1",
            Resource::Lease => "coordination.k8s.io/v1",
            Resource::Pod | Resource::Node | Resource::CoreEvent => "v1",
            Resource::Deployment
            | Resource::ReplicaSet
            | Resource::StatefulSet
            | Resource::DaemonSet => "apps/v1",
            Resource::PodDisruptionBudget => "policy/v1",
            Resource::CloneSet => "apps.kruise.io/v1alpha1",
            Resource::AdvancedStatefulSet => "apps.kruise.io/v1beta1",
        }
    }

    pub fn kind(self) -> &'static str {
        match self {
            Resource::Crr => "ContainerRecreateRequest",
            Resource::Pod => "Pod",
            Resource::Node => "Node",
            Resource::Event | Resource::CoreEvent => "Event",
            Resource::Lease => "Lease",
            Resource::Deployment => "Deployment",
            Resource::ReplicaSet => "ReplicaSet",
            Resource::StatefulSet | Resource::AdvancedStatefulSet => "StatefulSet",
            Resource::DaemonSet => "DaemonSet",
            Resource::PodDisruptionBudget => "PodDisruptionBudget",
            Resource::CloneSet => "CloneSet",
        }
    }

    /// The API group and plural, as admission sees them.
    fn group_resource(self) -> (&'static str, &'static str) {
        match self {
            Resource::Crr => ("apps.kruise.io", "containerrecreaterequests"),
            Resource::Pod => ("", "pods"),
            Resource::Node => ("", "nodes"),
            Resource::CoreEvent => ("", "events"),
            Resource::Event => ("events.k8s.io", "events"),
            Resource::Lease => ("coordination.k8s.io", "leases"),
            Resource::Deployment => ("apps", "deployments"),
            Resource::ReplicaSet => ("apps", "replicasets"),
            Resource::StatefulSet => ("apps", "statefulsets"),
            Resource::DaemonSet => ("apps", "daemonsets"),
            Resource::PodDisruptionBudget => ("policy", "poddisruptionbudgets"),
            Resource::CloneSet => ("apps.kruise.io", "clonesets"),
            Resource::AdvancedStatefulSet => ("apps.kruise.io", "statefulsets"),
        }
    }

    fn has_status(self) -> bool {
        !matches!(
            self,
            Resource::Event | Resource::CoreEvent | Resource::Lease
        )
    }

    const ALL: [Resource; 13] = [
        Resource::Crr,
        Resource::Pod,
        Resource::Node,
        Resource::Event,
        Resource::CoreEvent,
        Resource::Lease,
        Resource::Deployment,
        Resource::ReplicaSet,
        Resource::StatefulSet,
        Resource::DaemonSet,
        Resource::PodDisruptionBudget,
        Resource::CloneSet,
        Resource::AdvancedStatefulSet,
    ];

    /// kubectl's short names, as discovery lists them.
    fn short_names(self) -> &'static [&'static str] {
        match self {
            Resource::Crr => &["crr"],
            Resource::Pod => &["po"],
            Resource::Node => &["no"],
            Resource::Event | Resource::CoreEvent => &["ev"],
            Resource::Lease => &[],
            Resource::Deployment => &["deploy"],
            Resource::ReplicaSet => &["rs"],
            Resource::StatefulSet => &["sts"],
            Resource::DaemonSet => &["ds"],
            Resource::PodDisruptionBudget => &["pdb"],
            Resource::CloneSet => &["clone"],
            Resource::AdvancedStatefulSet => &["asts"],
        }
    }

    fn is_kruise_workload(self) -> bool {
        matches!(self, Resource::CloneSet | Resource::AdvancedStatefulSet)
    }

    fn namespaced(self) -> bool {
        self != Resource::Node
    }
}

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum ChangeKind {
    Added,
    Modified,
    Deleted,
}

/// One committed change, as watchers see it.
#[derive(Clone, Debug)]
pub struct Change {
    pub rv: u64,
    pub resource: Resource,
    pub kind: ChangeKind,
    pub old: Option<Value>,
    pub new: Value,
    /// When it was committed (a lagging watch delivers it later).
    pub at: tokio::time::Instant,
}

/// An API error, answered as a `Status` object.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct ApiError {
    pub code: u16,
    pub reason: &'static str,
    pub message: String,
}

impl ApiError {
    pub fn new(code: u16, reason: &'static str, message: impl Into<String>) -> Self {
        Self {
            code,
            reason,
            message: message.into(),
        }
    }

    fn not_found(resource: Resource, name: &str) -> Self {
        Self::new(
            404,
            "NotFound",
            format!("{} {name:?} not found", resource.kind()),
        )
    }

    fn status(&self) -> Value {
        json!({"kind": "Status", "apiVersion": "v1", "metadata": {}, "status": "Failure",
               "message": self.message, "reason": self.reason, "code": self.code})
    }
}

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Operation {
    Create,
    Update,
}

/// An admission hook: may change the object, or refuse it. It gets read
/// access to the store (a webhook GETs the Pod).
pub type Admission = Arc<
    dyn Fn(Operation, Resource, &mut Value, Option<&Value>, &Store) -> Result<(), ApiError>
        + Send
        + Sync,
>;

type Key = (Resource, String, String);

/// Matches a write by method, path and JSON body.
pub type WriteMatcher = Arc<dyn Fn(&Method, &str, &Value) -> bool + Send + Sync>;

/// Another writer that wins the next CRR status PUTs (`race_status_updates`).
struct Race {
    left: usize,
    matches: Arc<dyn Fn(&Value) -> bool + Send + Sync>,
    other: fn(usize) -> (Value, bool),
}

struct Stall {
    matches: WriteMatcher,
    hit: Arc<tokio::sync::Notify>,
}

/// The objects and their history.
pub struct Store {
    rv: u64,
    objects: BTreeMap<Key, Value>,
    history: VecDeque<Change>,
    /// The smallest resourceVersion a watch can still resume after.
    oldest: u64,
}

impl Store {
    /// The latest resourceVersion.
    pub fn rv(&self) -> u64 {
        self.rv
    }

    pub fn get(&self, resource: Resource, namespace: &str, name: &str) -> Option<&Value> {
        self.objects
            .get(&(resource, namespace.to_owned(), name.to_owned()))
    }

    pub fn list(
        &self,
        resource: Resource,
        namespace: Option<&str>,
        selector: &Selector,
    ) -> Vec<Value> {
        self.objects
            .iter()
            .filter(|((r, ns, _), obj)| {
                *r == resource && namespace.is_none_or(|n| n == ns) && selector.matches(obj)
            })
            .map(|(_, obj)| obj.clone())
            .collect()
    }

    /// `list` as it was at `rv`, undoing the later changes; `None` once the
    /// history no longer reaches back that far (etcd compacted it).
    pub fn list_at(
        &self,
        resource: Resource,
        namespace: Option<&str>,
        selector: &Selector,
        rv: u64,
    ) -> Option<Vec<Value>> {
        if rv >= self.rv {
            return Some(self.list(resource, namespace, selector));
        }
        if rv + 1 < self.oldest {
            return None;
        }
        let mut objects: BTreeMap<(String, String), Value> = self
            .objects
            .iter()
            .filter(|((r, _, _), _)| *r == resource)
            .map(|((_, ns, name), obj)| ((ns.clone(), name.clone()), obj.clone()))
            .collect();
        let later = self.history.iter().rev().take_while(|c| c.rv > rv);
        for change in later.filter(|c| c.resource == resource) {
            let meta = &change.new["metadata"];
            let text = |field: &str| meta[field].as_str().unwrap_or("").to_owned();
            let key = (scope(resource, &text("namespace")), text("name"));
            match (&change.kind, &change.old) {
                (ChangeKind::Added, _) => {
                    objects.remove(&key);
                }
                (_, Some(old)) => {
                    objects.insert(key, old.clone());
                }
                (_, None) => {}
            }
        }
        Some(
            objects
                .into_iter()
                .filter(|((ns, _), obj)| namespace.is_none_or(|n| n == ns) && selector.matches(obj))
                .map(|(_, obj)| obj)
                .collect(),
        )
    }

    /// The resourceVersion the watch cache of `resource` has reached when
    /// its watches lag `lag` behind the writes.
    fn cached_rv(&self, resource: Resource, lag: Duration) -> u64 {
        let now = tokio::time::Instant::now();
        self.history
            .iter()
            .find(|c| c.resource == resource && c.at + lag > now)
            .map_or(self.rv, |c| c.rv - 1)
    }
}

struct Inner {
    /// While set, the server is unreachable: connections are dropped.
    offline: std::sync::atomic::AtomicBool,
    /// "verb resource[/subresource]" a SelfSubjectAccessReview answers
    /// "not allowed" for; everything else is allowed.
    denied: Mutex<Vec<String>>,
    /// Bearer tokens and who they authenticate; requests without one act
    /// as a cluster admin (the tests' own clients).
    users: Mutex<HashMap<String, UserInfo>>,
    policies: Mutex<Vec<Arc<Policy>>>,
    /// Writes this matches are swallowed: never applied, never answered.
    stall: Mutex<Option<Stall>>,
    /// Users whose writes are cut off (`partition`).
    partitioned: Mutex<Vec<String>>,
    store: Mutex<Store>,
    changes: broadcast::Sender<Change>,
    admission: Mutex<Vec<Admission>>,
    /// Bumped to end every open watch (compaction).
    reset: watch::Sender<u64>,
    /// Lists answer at most this many items a page, each page after the
    /// first this much later (a large cluster's API server; see
    /// `set_list_pages`).
    pages: Mutex<Option<(usize, Duration)>>,
    /// Writes to answer with an error instead (`fail_writes`).
    faults: Mutex<Vec<Fault>>,
    /// CRR status PUTs still to be raced by another writer (`race_status_updates`).
    race: Mutex<Option<Race>>,
    /// How the watches behave (`set_watches`).
    watches: Mutex<Watches>,
    /// Every write that reached the server over HTTP, answered or not.
    writes: Mutex<Vec<Written>>,
    /// Watches ended with `410 Expired` so far.
    expired: Arc<std::sync::atomic::AtomicUsize>,
    /// Watch events (ADDED, MODIFIED, DELETED) delivered so far, by resource.
    delivered: Arc<Mutex<HashMap<Resource, u64>>>,
    /// HTTP requests served so far, by method (a watch is a `WATCH`).
    requests: Mutex<BTreeMap<String, u64>>,
    /// The User-Agent headers requests came with.
    user_agents: Mutex<std::collections::BTreeSet<String>>,
    /// Watches of CRRs opened so far: the apiVersion each watches through,
    /// and its label selector.
    crr_watches: Mutex<Vec<(String, String)>>,
    /// Which CRR versions are served, and how they convert.
    crr_versions: Mutex<CrrVersions>,
    /// CRDValidationRatcheting (beta 1.30, GA 1.33): an update may keep an
    /// invalid value the old object had. Off until set: an older server.
    ratcheting: std::sync::atomic::AtomicBool,
    /// Whether OpenKruise's CloneSet and Advanced StatefulSet are served.
    kruise_workloads: std::sync::atomic::AtomicBool,
    /// RBAC rules by user (`grant`).
    grants: Mutex<HashMap<String, Vec<Value>>>,
    /// Namespaces made since the start (`add_namespace`), beside the
    /// system ones and those of the objects a test seeded.
    namespaces: Mutex<std::collections::HashSet<String>>,
    /// What each node's kubelet answers on `/configz` (`set_configz`).
    configz: Mutex<HashMap<String, Value>>,
}

/// A watch as its request asked for it.
struct WatchRequest {
    resource: Resource,
    namespace: Option<String>,
    selector: Selector,
    /// The `resourceVersion` it names, if any.
    from: Option<u64>,
    timeout: Duration,
    /// `allowWatchBookmarks=true`.
    bookmarks: bool,
    /// How CRRs are shown, and the apiVersion of bookmarks.
    view: View,
    view_version: String,
}

/// One write request as it reached the server.
#[derive(Clone, Debug)]
pub struct Written {
    pub method: Method,
    pub path: String,
    pub body: Value,
    /// Who sent it (the authenticated user's name); `None` for the tests'
    /// own clients.
    pub user: Option<String>,
    /// When it arrived.
    pub at: tokio::time::Instant,
    /// The answer's status code; `None` while (or if never) answered.
    pub code: Option<u16>,
}

/// How the server's watches treat their clients; the default is the kind
/// server of a small cluster.
#[derive(Clone, Debug, Default)]
pub struct Watches {
    /// A watch of one of these resources delivers each event this long
    /// after its commit (a lagging watch cache).
    pub lag: HashMap<Resource, Duration>,
    /// Every watch ends with `410 Expired` after this many events (the
    /// watch cache's window passed by): the client must list again.
    pub gone_after: Option<usize>,
    /// A watch that allows bookmarks gets one this often.
    pub bookmarks: Option<Duration>,
}

impl Watches {
    /// A busy cluster's watches, as the agent's scenarios run them: a 410
    /// after every 4 events (so every scenario relists, often mid-CRR) and
    /// a bookmark every 300 ms.
    pub fn unkind() -> Self {
        Self {
            gone_after: Some(4),
            bookmarks: Some(Duration::from_millis(300)),
            ..Self::default()
        }
    }
}

/// The next `left` writes (POST, PUT, PATCH, DELETE) to `resource` are
/// answered `code` (429 comes with Retry-After, as a throttling API server
/// sends it), and not applied.
struct Fault {
    resource: Resource,
    code: u16,
    left: usize,
}

/// The fake API server; clones share it.
#[derive(Clone)]
pub struct FakeApiServer {
    pub url: String,
    inner: Arc<Inner>,
}

impl FakeApiServer {
    pub async fn start() -> Self {
        let listener = TcpListener::bind("127.0.0.1:0")
            .await
            .expect("bind fake API server");
        let url = format!("http://{}", listener.local_addr().expect("local address"));
        let inner = Arc::new(Inner {
            offline: std::sync::atomic::AtomicBool::new(false),
            denied: Mutex::new(Vec::new()),
            users: Mutex::new(HashMap::new()),
            policies: Mutex::new(Vec::new()),
            stall: Mutex::new(None),
            store: Mutex::new(Store {
                rv: 1,
                objects: BTreeMap::new(),
                history: VecDeque::new(),
                oldest: 1,
            }),
            changes: broadcast::channel(HISTORY).0,
            admission: Mutex::new(Vec::new()),
            reset: watch::channel(0).0,
            pages: Mutex::new(None),
            faults: Mutex::new(Vec::new()),
            race: Mutex::new(None),
            partitioned: Mutex::new(Vec::new()),
            delivered: Arc::default(),
            requests: Mutex::default(),
            user_agents: Mutex::default(),
            crr_watches: Mutex::default(),
            watches: Mutex::new(Watches::default()),
            writes: Mutex::new(Vec::new()),
            expired: Arc::default(),
            crr_versions: Mutex::new(CrrVersions::default()),
            ratcheting: std::sync::atomic::AtomicBool::new(false),
            kruise_workloads: std::sync::atomic::AtomicBool::new(false),
            grants: Mutex::new(HashMap::new()),
            namespaces: Mutex::new(std::collections::HashSet::new()),
            configz: Mutex::new(HashMap::new()),
        });
        let server = Self { url, inner };
        let handle = server.clone();
        tokio::spawn(async move {
            while let Ok((stream, _)) = listener.accept().await {
                // Subscribed before the check: a `set_offline` that comes
                // after it still drops this connection.
                let mut reset = handle.inner.reset.subscribe();
                if handle.is_offline() {
                    // Unreachable: the connection is dropped at once.
                    continue;
                }
                // kube-apiserver is a Go server, and Go turns Nagle's
                // algorithm off on every TCP connection (`src/net/tcpsock.go`,
                // `newTCPConn`: `setNoDelay(fd, true)`). With it on, a watch
                // event written while the last one is unacknowledged waited
                // for the client's delayed ACK (40 ms on Linux).
                let _ = stream.set_nodelay(true);
                let handle = handle.clone();
                tokio::spawn(async move {
                    let service = service_fn(move |req| {
                        let handle = handle.clone();
                        async move { Ok::<_, Infallible>(handle.serve(req).await) }
                    });
                    let connection = hyper::server::conn::http1::Builder::new()
                        .serve_connection(TokioIo::new(stream), service);
                    // Going offline (a reset) drops open connections too.
                    tokio::select! {
                        _ = connection => {}
                        _ = reset.changed() => {}
                    }
                });
            }
        });
        server
    }

    /// A server under deploy/base's policies, with the standalone Lease and
    /// its namespace, where `token` authenticates as `node`'s crr-proxy
    /// identity.
    pub async fn start_for_node(node: &str, token: &str) -> Self {
        let server = Self::start().await;
        server.add_policies(BASE_POLICIES);
        server.add_user(token, UserInfo::node(node));
        server
    }

    /// A server under the objects `crr-proxy manifests --agent kruise
    /// --identity kubelet` renders (its policies, and its roles' rules for
    /// kubelet's user), where `token` authenticates as `node`'s kubelet.
    #[allow(dead_code)] // each test binary uses a different part
    pub async fn start_for_kubelet(node: &str, token: &str) -> Self {
        use crr_proxy::manifests::{Identity, LeaseRef, Overlay, render};
        let server = Self::start().await;
        let rendered = render(Overlay::Kruise, &LeaseRef::default(), Identity::Kubelet)
            .expect("kruise mode renders for kubelet");
        server.add_policies(&rendered);
        let user = UserInfo::kubelet(node);
        server.grant(
            &user.username,
            &policy::rules_bound_to(&rendered, "system:nodes"),
        );
        server.add_user(token, user);
        server
    }

    /// A kube client for this server.
    pub fn client(&self) -> kube::Client {
        kube::Client::try_from(self.config()).expect("kube client")
    }

    /// A kube client that does not retry 429, 503 and 504 (kube's default
    /// client does), so that a test sees each answer as it came.
    pub fn client_without_retries(&self) -> kube::Client {
        let mut config = self.config();
        config.default_retry = false;
        kube::Client::try_from(config).expect("kube client")
    }

    /// A kube client that authenticates with a bearer token (see `add_user`).
    pub fn client_as(&self, token: &str) -> kube::Client {
        let mut config = self.config();
        let value = format!("Bearer {token}").parse().expect("header value");
        config.headers.push((http::header::AUTHORIZATION, value));
        kube::Client::try_from(config).expect("kube client")
    }

    fn config(&self) -> kube::Config {
        let mut config = kube::Config::new(self.url.parse().expect("server URL"));
        config.default_namespace = "default".into();
        config
    }

    /// From now on, CRRs are served (and new ones stored) as `versions`
    /// says; set it before creating any.
    pub fn set_crr_versions(&self, versions: CrrVersions) {
        *lock(&self.inner.crr_versions) = versions;
    }

    /// From now on, OpenKruise's CloneSet and Advanced StatefulSet are
    /// served (their CRDs installed); until then they are not found.
    pub fn serve_kruise_workloads(&self) {
        self.inner
            .kruise_workloads
            .store(true, std::sync::atomic::Ordering::SeqCst);
    }

    fn serves(&self, resource: Resource) -> bool {
        !resource.is_kruise_workload()
            || self
                .inner
                .kruise_workloads
                .load(std::sync::atomic::Ordering::SeqCst)
    }

    pub fn crr_versions(&self) -> CrrVersions {
        *lock(&self.inner.crr_versions)
    }

    /// `node`'s kubelet answers `/configz` with `config` (its
    /// KubeletConfiguration) through the node proxy.
    pub fn set_configz(&self, node: &str, config: Value) {
        lock(&self.inner.configz).insert(node.to_owned(), config);
    }

    /// `/api/v1/nodes/NODE/proxy/PATH`: kube-apiserver authorizes it as the
    /// request's verb on `nodes/proxy` (pkg/registry/core/node/rest/proxy.go,
    /// ProxyREST), finds the Node (404 without one) and relays to its
    /// kubelet; a kubelet that is not there is a 503. Only `/configz` is
    /// played here, as kubelet serves it (pkg/kubelet/server/server.go,
    /// InstallDebuggingHandlers: `{"kubeletconfig": ...}`).
    fn node_proxy(
        &self,
        method: &Method,
        node: &str,
        rest: &[&str],
    ) -> Result<Response<BoxBody<Bytes, Infallible>>, ApiError> {
        let verb = match *method {
            Method::GET => "get",
            Method::POST => "create",
            Method::PUT => "update",
            Method::PATCH => "patch",
            Method::DELETE => "delete",
            _ => "get",
        };
        self.authorize(&Access {
            verb,
            group_version: "v1",
            plural: "nodes",
            subresource: Some("proxy"),
            name: Some(node),
            namespace: None,
            field_selector: None,
        })?;
        if self.get(Resource::Node, "", node).is_none() {
            return Err(ApiError::not_found(Resource::Node, node));
        }
        let Some(config) = lock(&self.inner.configz).get(node).cloned() else {
            return Err(ApiError::new(
                503,
                "ServiceUnavailable",
                format!(
                    "error trying to reach service: dial tcp {node}:10250: connect: connection refused"
                ),
            ));
        };
        match rest {
            ["configz"] if *method == Method::GET => {
                Ok(respond(200, &json!({"kubeletconfig": config})))
            }
            _ => Err(ApiError::new(404, "NotFound", "404 page not found")),
        }
    }

    /// Whether a CRR write through `view` is a v1beta1 request, which
    /// v1beta1's schema judges (a v1alpha1 one is judged by v1alpha1's).
    fn stored_api_version(&self, resource: Resource) -> String {
        match resource {
            Resource::Crr => format!("apps.kruise.io/{}", self.crr_versions().storage()),
            _ => resource.api_version().to_owned(),
        }
    }

    /// How many watch events (ADDED, MODIFIED, DELETED; not BOOKMARKs) of
    /// `resource` every watch together has been sent so far: what the API
    /// server fans out.
    pub fn watch_events(&self, resource: Resource) -> u64 {
        lock(&self.inner.delivered)
            .get(&resource)
            .copied()
            .unwrap_or_default()
    }

    /// The HTTP requests served so far, by method (`WATCH` for a watch).
    pub fn requests(&self) -> BTreeMap<String, u64> {
        lock(&self.inner.requests).clone()
    }

    /// The User-Agent headers requests have come with so far.
    pub fn user_agents(&self) -> std::collections::BTreeSet<String> {
        lock(&self.inner.user_agents).clone()
    }

    /// How many watches of CRRs through `version` (`v1alpha1`, `v1beta1`)
    /// whose label selector contains `selecting` have been opened so far.
    pub fn crr_watches(&self, version: &str, selecting: &str) -> usize {
        let api_version = format!("apps.kruise.io/{version}");
        lock(&self.inner.crr_watches)
            .iter()
            .filter(|(v, selector)| *v == api_version && selector.contains(selecting))
            .count()
    }

    /// How many watches ended with `410 Expired` so far.
    pub fn watches_expired(&self) -> usize {
        self.inner
            .expired
            .load(std::sync::atomic::Ordering::Relaxed)
    }

    /// The write requests that reached the server over HTTP so far.
    pub fn writes(&self) -> Vec<Written> {
        lock(&self.inner.writes).clone()
    }

    pub fn subscribe(&self) -> broadcast::Receiver<Change> {
        self.inner.changes.subscribe()
    }

    pub fn store(&self) -> MutexGuard<'_, Store> {
        lock(&self.inner.store)
    }

    pub fn get(&self, resource: Resource, namespace: &str, name: &str) -> Option<Value> {
        self.store().get(resource, namespace, name).cloned()
    }

    pub fn list(
        &self,
        resource: Resource,
        namespace: Option<&str>,
        selector: &Selector,
    ) -> Vec<Value> {
        self.store().list(resource, namespace, selector)
    }

    pub fn create(
        &self,
        resource: Resource,
        namespace: &str,
        obj: Value,
    ) -> Result<Value, ApiError> {
        let hooks = lock(&self.inner.admission).clone();
        self.create_with(resource, namespace, obj, &hooks, false)
    }

    /// Creates without admission hooks, as if no webhook were installed.
    pub fn create_unchecked(
        &self,
        resource: Resource,
        namespace: &str,
        obj: Value,
    ) -> Result<Value, ApiError> {
        self.create_with(resource, namespace, obj, &[], false)
    }

    /// Creates `obj` after `hooks`; with `dry_run` (`?dryRun=All`), judged
    /// and answered as created, but not stored.
    fn create_with(
        &self,
        resource: Resource,
        namespace: &str,
        mut obj: Value,
        hooks: &[Admission],
        dry_run: bool,
    ) -> Result<Value, ApiError> {
        let mut store = lock(&self.inner.store);
        let mut name = obj
            .pointer("/metadata/name")
            .and_then(Value::as_str)
            .unwrap_or_default()
            .to_owned();
        let generate = obj
            .pointer("/metadata/generateName")
            .and_then(Value::as_str)
            .unwrap_or_default()
            .to_owned();
        if name.is_empty() && !generate.is_empty() {
            // Five characters of the API server's alphabet, here from the
            // resourceVersion so that names never repeat.
            const ALPHABET: &[u8] = b"bcdfghjklmnpqrstvwxz2456789";
            let mut n = store.rv + 1;
            let suffix: String = (0..5)
                .map(|_| {
                    let c = ALPHABET[(n % ALPHABET.len() as u64) as usize] as char;
                    n /= ALPHABET.len() as u64;
                    c
                })
                .collect();
            name = format!("{generate}{suffix}");
            obj["metadata"]["name"] = json!(name);
        }
        if name.is_empty() {
            return Err(ApiError::new(
                422,
                "Invalid",
                "metadata.name: Required value",
            ));
        }
        if resource == Resource::Event {
            validate_event(&obj)?;
        }
        let key = (resource, scope(resource, namespace), name.clone());
        for hook in hooks {
            hook(Operation::Create, resource, &mut obj, None, &store)?;
        }
        self.admit_policies(&store, "CREATE", &key, false, Some(&obj), None)?;
        // Only then storage: kube-apiserver admits a create before it
        // writes, so a refused create of an existing name is refused, not
        // a conflict.
        if store.objects.contains_key(&key) {
            return Err(ApiError::new(
                409,
                "AlreadyExists",
                format!("{} {name:?} already exists", resource.kind()),
            ));
        }
        obj["apiVersion"] = json!(self.stored_api_version(resource));
        obj["kind"] = json!(resource.kind());
        let meta = &mut obj["metadata"];
        meta["namespace"] = json!(key.1);
        if meta.get("uid").is_none() {
            meta["uid"] = json!(format!("uid-{}-{}", name, store.rv));
        }
        meta["creationTimestamp"] = json!(now());
        meta["generation"] = json!(1);
        if resource.has_status() && resource != Resource::Node {
            // Status is set through the status subresource only.
            if let Some(obj) = obj.as_object_mut() {
                obj.remove("status");
            }
        }
        if dry_run {
            return Ok(obj);
        }
        Ok(self.commit(&mut store, key, ChangeKind::Added, None, obj))
    }

    /// PUT: the object, or with `status` only its status.
    pub fn update(
        &self,
        resource: Resource,
        namespace: &str,
        name: &str,
        obj: Value,
        status: bool,
    ) -> Result<Value, ApiError> {
        self.update_as(Through::STORED, resource, namespace, name, obj, status)
    }

    fn update_as(
        &self,
        request: Through,
        resource: Resource,
        namespace: &str,
        name: &str,
        obj: Value,
        status: bool,
    ) -> Result<Value, ApiError> {
        let Through { view, validation } = request;
        self.modify(resource, namespace, name, status, |stored| {
            let current = &view.present(stored);
            let requested = resource_version(&obj);
            if requested.is_empty() && resource == Resource::Crr {
                return Err(ApiError::new(
                    422,
                    "Invalid",
                    "metadata.resourceVersion: must be specified for an update",
                ));
            }
            let mut next = obj.clone();
            // A custom resource's status subresource keeps all but status
            // of the stored object, and its main resource keeps the stored
            // status (staging/src/k8s.io/apiextensions-apiserver/pkg/registry/
            // customresource/status_strategy.go and strategy.go,
            // `PrepareForUpdate`); built-in kinds' strategies do the same.
            if status {
                let mut updated = current.clone();
                updated["status"] = next.get("status").cloned().unwrap_or(Value::Null);
                next = updated;
            } else {
                // The main resource never changes status or immutable metadata.
                if resource.has_status() {
                    next["status"] = current.get("status").cloned().unwrap_or(Value::Null);
                }
                for field in [
                    "uid",
                    "creationTimestamp",
                    "namespace",
                    "name",
                    "deletionTimestamp",
                ] {
                    next["metadata"][field] = current["metadata"]
                        .get(field)
                        .cloned()
                        .unwrap_or(Value::Null);
                }
            }
            // Judged by the schema of the version it names.
            self.admit_crr(
                resource,
                view,
                &mut next,
                Some(current),
                validation,
                pruning::Write::Object,
            )?;
            Ok((view.store(&next), requested.to_owned()))
        })
    }

    /// JSON merge patch of the object, or with `status` of its status.
    pub fn patch(
        &self,
        resource: Resource,
        namespace: &str,
        name: &str,
        patch: &Value,
        status: bool,
    ) -> Result<Value, ApiError> {
        let patch = Patch::Merge(patch.clone());
        self.patch_as(Through::STORED, resource, namespace, name, &patch, status)
    }

    fn patch_as(
        &self,
        request: Through,
        resource: Resource,
        namespace: &str,
        name: &str,
        patch: &Patch,
        status: bool,
    ) -> Result<Value, ApiError> {
        let Through { view, validation } = request;
        self.modify(resource, namespace, name, status, |stored| {
            let current = &view.present(stored);
            let patched = patch.apply(current)?;
            let requested = resource_version(&patched).to_owned();
            // As a PUT of the patched object: the status subresource keeps
            // everything but status, the main resource keeps status.
            let mut next = if status {
                let mut next = current.clone();
                next["status"] = patched.get("status").cloned().unwrap_or(Value::Null);
                next
            } else {
                let mut next = patched;
                if resource.has_status() {
                    next["status"] = current.get("status").cloned().unwrap_or(Value::Null);
                }
                next
            };
            if next["status"].is_null() {
                if let Some(obj) = next.as_object_mut() {
                    obj.remove("status");
                }
            }
            // Judged by the schema of the version it names.
            self.admit_crr(
                resource,
                view,
                &mut next,
                Some(current),
                validation,
                pruning::Write::Patch,
            )?;
            Ok((view.store(&next), requested))
        })
    }

    fn modify(
        &self,
        resource: Resource,
        namespace: &str,
        name: &str,
        status: bool,
        change: impl FnOnce(&Value) -> Result<(Value, String), ApiError>,
    ) -> Result<Value, ApiError> {
        let hooks = lock(&self.inner.admission).clone();
        let mut store = lock(&self.inner.store);
        let key = (resource, scope(resource, namespace), name.to_owned());
        let current = store
            .objects
            .get(&key)
            .cloned()
            .ok_or_else(|| ApiError::not_found(resource, name))?;
        let (mut next, requested) = change(&current)?;
        if resource == Resource::Crr {
            // Every write stores the storage version.
            next["apiVersion"] = json!(self.stored_api_version(resource));
        }
        let current_rv = current["metadata"]["resourceVersion"]
            .as_str()
            .unwrap_or("")
            .to_owned();
        if !requested.is_empty() && requested != current_rv {
            return Err(ApiError::new(
                409,
                "Conflict",
                format!(
                    "Operation cannot be fulfilled on {} {name:?}: the object has been modified; please apply your changes to the latest version and try again",
                    resource.kind()
                ),
            ));
        }
        next["metadata"]["resourceVersion"] = current["metadata"]["resourceVersion"].clone();
        if resource == Resource::Event {
            // A repeated Event comes back as a patch with its series.
            validate_event(&next)?;
        }
        // Admission judges a write even when it changes nothing.
        self.admit_policies(&store, "UPDATE", &key, status, Some(&next), Some(&current))?;
        if next == current {
            // A no-op write does not bump the resourceVersion.
            return Ok(current);
        }
        // metadata.generation counts changes of the spec (the API server's
        // strategies bump it; a status write or a metadata change does not).
        next["metadata"]["generation"] = current["metadata"]["generation"].clone();
        if !status && next.get("spec") != current.get("spec") {
            let generation = current["metadata"]["generation"].as_i64().unwrap_or(1);
            next["metadata"]["generation"] = json!(generation + 1);
        }
        if !status {
            for hook in &hooks {
                hook(
                    Operation::Update,
                    resource,
                    &mut next,
                    Some(&current),
                    &store,
                )?;
            }
        }
        let finalizers_gone = next
            .pointer("/metadata/finalizers")
            .and_then(Value::as_array)
            .is_none_or(|f| f.is_empty());
        // The last finalizer of a deleted object gone: it goes, unless it is
        // a Pod still in its grace period (its kubelet has yet to delete it).
        let in_grace = current
            .pointer("/metadata/deletionGracePeriodSeconds")
            .and_then(Value::as_i64)
            .is_some_and(|grace| grace > 0);
        if next
            .pointer("/metadata/deletionTimestamp")
            .is_some_and(|t| !t.is_null())
            && finalizers_gone
            && !in_grace
        {
            store.objects.remove(&key);
            return Ok(self.commit_removal(&mut store, key, current, next));
        }
        Ok(self.commit(&mut store, key, ChangeKind::Modified, Some(current), next))
    }

    /// DELETE with the default grace: a scheduled Pod is only marked
    /// (see [`FakeApiServer::delete_with_grace`]).
    pub fn delete(
        &self,
        resource: Resource,
        namespace: &str,
        name: &str,
    ) -> Result<Value, ApiError> {
        self.delete_with_grace(resource, namespace, name, None)
    }

    /// DELETE with DeleteOptions' `gracePeriodSeconds`. A Pod bound to a
    /// node is deleted gracefully, as the real server does: it gets
    /// `deletionTimestamp` (now + grace) and `deletionGracePeriodSeconds`
    /// (the Pod's terminationGracePeriodSeconds unless `grace` says
    /// otherwise) and stays until its kubelet deletes it with grace 0.
    /// Other objects go at once, or wait for their finalizers.
    pub fn delete_with_grace(
        &self,
        resource: Resource,
        namespace: &str,
        name: &str,
        grace: Option<i64>,
    ) -> Result<Value, ApiError> {
        let mut store = lock(&self.inner.store);
        let key = (resource, scope(resource, namespace), name.to_owned());
        let current = store
            .objects
            .get(&key)
            .cloned()
            .ok_or_else(|| ApiError::not_found(resource, name))?;
        self.admit_policies(&store, "DELETE", &key, false, None, Some(&current))?;
        let has_finalizers = current
            .pointer("/metadata/finalizers")
            .and_then(Value::as_array)
            .is_some_and(|f| !f.is_empty());
        let grace = grace
            .or_else(|| {
                current
                    .pointer("/spec/terminationGracePeriodSeconds")?
                    .as_i64()
            })
            .unwrap_or(30)
            .max(0);
        let graceful = resource == Resource::Pod
            && current
                .pointer("/spec/nodeName")
                .is_some_and(Value::is_string)
            && grace > 0;
        let marked = current
            .pointer("/metadata/deletionGracePeriodSeconds")
            .and_then(Value::as_i64);
        if resource == Resource::Pod && marked.is_some() && grace == 0 && has_finalizers {
            // kubelet's final delete; the finalizers still hold the Pod.
            let mut next = current.clone();
            next["metadata"]["deletionGracePeriodSeconds"] = json!(0);
            return Ok(self.commit(&mut store, key, ChangeKind::Modified, Some(current), next));
        }
        if graceful {
            // A second delete may only shorten the grace.
            if marked.is_some_and(|m| m <= grace) {
                return Ok(current);
            }
            let at = k8s_openapi::jiff::Timestamp::now()
                + k8s_openapi::jiff::SignedDuration::from_secs(grace);
            let mut next = current.clone();
            next["metadata"]["deletionTimestamp"] =
                json!(at.strftime("%Y-%m-%dT%H:%M:%SZ").to_string());
            next["metadata"]["deletionGracePeriodSeconds"] = json!(grace);
            return Ok(self.commit(&mut store, key, ChangeKind::Modified, Some(current), next));
        }
        if has_finalizers {
            if current.pointer("/metadata/deletionTimestamp").is_some() {
                return Ok(current);
            }
            let mut next = current.clone();
            next["metadata"]["deletionTimestamp"] = json!(now());
            return Ok(self.commit(&mut store, key, ChangeKind::Modified, Some(current), next));
        }
        store.objects.remove(&key);
        let next = current.clone();
        Ok(self.commit_removal(&mut store, key, current, next))
    }

    fn commit(
        &self,
        store: &mut Store,
        key: Key,
        kind: ChangeKind,
        old: Option<Value>,
        mut obj: Value,
    ) -> Value {
        store.rv += 1;
        obj["metadata"]["resourceVersion"] = json!(store.rv.to_string());
        store.objects.insert(key.clone(), obj.clone());
        self.record(store, key.0, kind, old, obj.clone());
        obj
    }

    fn commit_removal(&self, store: &mut Store, key: Key, old: Value, mut obj: Value) -> Value {
        store.rv += 1;
        obj["metadata"]["resourceVersion"] = json!(store.rv.to_string());
        self.record(store, key.0, ChangeKind::Deleted, Some(old), obj.clone());
        obj
    }

    fn record(
        &self,
        store: &mut Store,
        resource: Resource,
        kind: ChangeKind,
        old: Option<Value>,
        new: Value,
    ) {
        let change = Change {
            rv: store.rv,
            resource,
            kind,
            old,
            new,
            at: tokio::time::Instant::now(),
        };
        store.history.push_back(change.clone());
        while store.history.len() > HISTORY {
            if let Some(dropped) = store.history.pop_front() {
                store.oldest = dropped.rv + 1;
            }
        }
        let _ = self.inner.changes.send(change);
    }

    // === HTTP ===
}

fn respond(code: u16, body: &Value) -> Response<BoxBody<Bytes, Infallible>> {
    Response::builder()
        .status(StatusCode::from_u16(code).unwrap_or(StatusCode::INTERNAL_SERVER_ERROR))
        .header("content-type", "application/json")
        .body(BodyExt::boxed(Full::new(Bytes::from(body.to_string()))))
        .unwrap_or_default()
}

/// `?watch=true` (or `1`).
fn is_watch(query: &BTreeMap<String, String>) -> bool {
    matches!(query.get("watch").map(String::as_str), Some("true" | "1"))
}

/// The resourceVersion a write names as its precondition ("" for none).
fn resource_version(obj: &Value) -> &str {
    obj.pointer("/metadata/resourceVersion")
        .and_then(Value::as_str)
        .unwrap_or("")
}

fn scope(resource: Resource, namespace: &str) -> String {
    if resource.namespaced() {
        namespace.to_owned()
    } else {
        String::new()
    }
}

fn lock<T>(mutex: &Mutex<T>) -> MutexGuard<'_, T> {
    mutex
        .lock()
        .unwrap_or_else(|poisoned| poisoned.into_inner())
}

/// RFC 3339 at whole seconds, as metav1.Time is written.
pub fn now() -> String {
    k8s_openapi::jiff::Timestamp::now()
        .strftime("%Y-%m-%dT%H:%M:%SZ")
        .to_string()
}

fn percent_decode(text: &str) -> String {
    let bytes = text.as_bytes();
    let mut out = Vec::with_capacity(bytes.len());
    let mut i = 0;
    while i < bytes.len() {
        match bytes[i] {
            b'%' if i + 2 < bytes.len() => match u8::from_str_radix(&text[i + 1..i + 3], 16) {
                Ok(b) => {
                    out.push(b);
                    i += 3;
                    continue;
                }
                Err(_) => out.push(b'%'),
            },
            b'+' => out.push(b' '),
            b => out.push(b),
        }
        i += 1;
    }
    String::from_utf8_lossy(&out).into_owned()
}

/// events.k8s.io/v1's validation of the fields whose size is bounded
/// (k8s.io/kubernetes pkg/apis/core/validation, ValidateEventCreate): an
/// Event that breaks one is refused, and lost.
fn validate_event(event: &Value) -> Result<(), ApiError> {
    let invalid = |message: String| Err(ApiError::new(422, "Invalid", message));
    let text = |field: &str| event.get(field).and_then(Value::as_str).unwrap_or("");
    for (field, limit) in [
        ("note", 1024),
        ("reportingController", 128),
        ("reportingInstance", 128),
        ("action", 128),
        ("reason", 128),
    ] {
        let len = text(field).len();
        if len > limit {
            return invalid(format!(
                "{field}: Too long: may not be more than {limit} bytes"
            ));
        }
        if len == 0 && field != "note" {
            return invalid(format!("{field}: Required value"));
        }
    }
    if text("eventTime").is_empty() {
        return invalid("eventTime: Required value".into());
    }
    if !matches!(text("type"), "Normal" | "Warning") {
        return invalid(format!(
            "type: Unsupported value: {:?}: supported values: \"Normal\", \"Warning\"",
            text("type")
        ));
    }
    if let Some(series) = event.get("series").filter(|s| !s.is_null()) {
        if series["count"].as_i64().is_none_or(|count| count < 2) {
            return invalid("series.count: Invalid value: should be at least 2".into());
        }
        if !series["lastObservedTime"].is_string() {
            return invalid("series.lastObservedTime: Required value".into());
        }
    }
    Ok(())
}
