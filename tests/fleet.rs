//! Standalone mode on many nodes at once: several crr-proxy agents in this
//! process, each with its own node name, identity and watches, against one
//! fake API server under deploy/base/node-policy.yaml, and one real containerd
//! behind the node that runs the Pods (node-0, with the kubelet role).
#![allow(clippy::unwrap_used, clippy::expect_used)] // tests fail loudly by design

mod support;

use std::sync::Arc;
use std::time::{Duration, Instant};

use crr_proxy::agent::{self, AgentConfig, LeaseSettings, Mode, WallClock};
use crr_proxy::kill::Killer;
use crr_proxy::metrics::Metrics;
use crr_proxy::proxy::{Proxy, Routes};
use crr_proxy::reason::Recreated;
use crr_proxy::records::Records;
use serde_json::{Value, json};
use support::ProxyUnderTest;
use support::apiserver::{FakeApiServer, Resource};
use support::containerd::Containerd;
use support::kubelet::{ContainerSpec, Kubelet, PodSpec};
use support::policy::UserInfo;
use support::roles::{NAMESPACE, wait_for};

/// A short Lease, so that failover fits in a test.
fn lease() -> LeaseSettings {
    LeaseSettings {
        duration: Duration::from_secs(3),
        renew_period: Duration::from_secs(1),
        ..LeaseSettings::default()
    }
}

fn node(i: usize) -> String {
    format!("node-{i}")
}

/// One simulated node's crr-proxy agent.
/// Each runs on a runtime of its own, so that killing it ends every task
/// it spawned at once, as a killed process's would.
struct NodeAgent {
    node: String,
    metrics: Arc<Metrics>,
    runtime: Option<tokio::runtime::Runtime>,
    task: tokio::task::JoinHandle<()>,
    stop: Option<tokio::sync::oneshot::Sender<()>>,
}

impl NodeAgent {
    /// One sample of its /metrics text, by series name.
    fn metric(&self, series: &str) -> f64 {
        let text = self.metrics.render();
        text.lines()
            .find_map(|l| l.strip_prefix(series)?.strip_prefix(' ')?.parse().ok())
            .unwrap_or_else(|| panic!("no {series} in\n{text}"))
    }

    fn holds_lease(&self) -> bool {
        self.metric("crr_proxy_standalone_lease_held") == 1.0
    }

    /// Kills it: every task it runs ends where it is, with no release of
    /// the Lease and no goodbye.
    fn kill(&mut self) {
        if let Some(runtime) = self.runtime.take() {
            runtime.shutdown_background();
        }
    }

    /// Stops it as SIGTERM does, and waits until it has.
    async fn stop(&mut self) {
        if let Some(stop) = self.stop.take() {
            let _ = stop.send(());
        }
        let _ = (&mut self.task).await;
    }
}

impl Drop for NodeAgent {
    fn drop(&mut self) {
        self.kill();
    }
}

/// `nodes` nodes; node-0 runs the Pods, on a real containerd.
struct Fleet {
    api: FakeApiServer,
    /// The election settings every node's agent starts with.
    lease: LeaseSettings,
    kubelet: Kubelet,
    agents: Vec<NodeAgent>,
    endpoint: crr_proxy::cri::Endpoint,
    _proxy: ProxyUnderTest,
    _ctrd: Arc<Containerd>,
}

impl Fleet {
    async fn start(ctrd: &Arc<Containerd>, nodes: usize) -> Self {
        Self::start_in_order(ctrd, &(0..nodes).collect::<Vec<_>>()).await
    }

    /// Starts the nodes in this order: the first one takes the Lease.
    async fn start_in_order(ctrd: &Arc<Containerd>, order: &[usize]) -> Self {
        Self::start_with(ctrd, order, lease()).await
    }

    async fn start_with(ctrd: &Arc<Containerd>, order: &[usize], lease: LeaseSettings) -> Self {
        let api = FakeApiServer::start().await;
        api.add_policies(support::apiserver::BASE_POLICIES);
        let proxy = ProxyUnderTest::serve(Proxy::new(Routes {
            runtime: ctrd.endpoint(),
            image: None,
        }));
        let kubelet = Kubelet::start(&api, proxy.client(), &node(0), ctrd.scratch("logs")).await;
        let mut fleet = Self {
            api,
            lease,
            kubelet,
            agents: Vec::new(),
            endpoint: ctrd.endpoint(),
            _proxy: proxy,
            _ctrd: Arc::clone(ctrd),
        };
        for &i in order {
            fleet.start_agent(i).await;
            if fleet.agents.len() == 1 {
                wait_for(Duration::from_secs(5), || fleet.holder())
                    .await
                    .expect("the first node takes the Lease");
            }
        }
        fleet
    }

    /// Starts node `i`'s agent and waits until its watches have synced.
    async fn start_agent(&mut self, i: usize) {
        let lease = self.lease.clone();
        self.start_agent_with(i, lease).await;
    }

    /// Starts node `i`'s agent with election settings of its own (its
    /// clock skewed, say).
    async fn start_agent_with(&mut self, i: usize, lease: LeaseSettings) {
        let token = format!("{}-token", node(i));
        self.api.add_user(&token, UserInfo::node(&node(i)));
        let (synced, mut ready) = tokio::sync::watch::channel(false);
        let metrics = Arc::new(Metrics::default());
        let (stop, stopped) = tokio::sync::oneshot::channel::<()>();
        let shutdown = async move {
            let _ = stopped.await;
        };
        let runtime = tokio::runtime::Builder::new_multi_thread()
            .worker_threads(1)
            .enable_all()
            .build()
            .unwrap();
        let (api, endpoint, into) = (
            self.api.clone(),
            self.endpoint.clone(),
            Arc::clone(&metrics),
        );
        let task = runtime.spawn(async move {
            // Built on the node's runtime: their connections live there.
            let cri = support::client(&endpoint);
            let config = AgentConfig {
                client: api.client_as(&token),
                cri: cri.clone(),
                killer: Killer::new(cri, None),
                node_name: node(i),
                mode: Mode::Standalone,
                recreated: Arc::new(Recreated::in_memory()),
                kills: Arc::new(Records::in_memory()),
                metrics: into,
                lease,
                kubelet: agent::KubeletSettings::default(),
            };
            agent::run(config, synced, shutdown).await;
        });
        tokio::time::timeout(Duration::from_secs(20), ready.wait_for(|r| *r))
            .await
            .expect("the agent's watches synced")
            .unwrap();
        self.agents.push(NodeAgent {
            node: node(i),
            metrics,
            runtime: Some(runtime),
            task,
            stop: Some(stop),
        });
    }

    fn create(&self, name: &str, pod: &str, container: &str) {
        let spec = json!({"podName": pod, "containers": [{"name": container}]});
        self.api
            .create(
                Resource::Crr,
                NAMESPACE,
                json!({"metadata": {"name": name}, "spec": spec}),
            )
            .expect("create CRR");
    }

    fn agent_mut(&mut self, i: usize) -> &mut NodeAgent {
        self.agents
            .iter_mut()
            .find(|a| a.node == node(i))
            .expect("a started node")
    }

    fn agent(&self, i: usize) -> &NodeAgent {
        self.agents
            .iter()
            .find(|a| a.node == node(i))
            .expect("a started node")
    }

    /// The Lease's spec as the API server has it.
    fn lease_spec(&self) -> Value {
        self.api
            .get(Resource::Lease, "crr-proxy-system", "crr-proxy-claimer")
            .map(|l| l["spec"].clone())
            .unwrap_or_default()
    }

    /// The node that holds the Lease, by the Lease itself.
    fn holder(&self) -> Option<String> {
        self.api
            .get(Resource::Lease, "crr-proxy-system", "crr-proxy-claimer")?["spec"]["holderIdentity"]
            .as_str()
            .map(str::to_owned)
    }

    fn crr(&self, name: &str) -> Option<Value> {
        self.api.get(Resource::Crr, NAMESPACE, name)
    }

    /// The CRR once it is claimed for `node`.
    async fn claimed_for(&self, name: &str, node: &str) -> Value {
        wait_for(Duration::from_secs(5), || {
            self.crr(name)
                .filter(|c| c["metadata"]["labels"]["crr.apps.kruise.io/node-name"] == node)
        })
        .await
        .unwrap_or_else(|| panic!("CRR {name} not claimed for {node}: {:?}", self.crr(name)))
    }

    /// The CRR once it is completed (active or not).
    async fn completed(&self, name: &str, limit: Duration) -> Value {
        wait_for(limit, || {
            self.crr(name)
                .filter(|c| c["status"]["phase"] == "Completed")
        })
        .await
        .unwrap_or_else(|| {
            panic!(
                "CRR {name} not completed in {limit:?}: {:?}",
                self.crr(name)
            )
        })
    }

    /// The CRR once it is completed and no longer active.
    async fn finished(&self, name: &str, limit: Duration) -> Value {
        wait_for(limit, || {
            self.crr(name).filter(|c| {
                c["status"]["phase"] == "Completed"
                    && c["metadata"]["labels"]["crr.apps.kruise.io/active"].is_null()
            })
        })
        .await
        .unwrap_or_else(|| panic!("CRR {name} not finished in {limit:?}: {:?}", self.crr(name)))
    }
}

fn start_containerd() -> Arc<Containerd> {
    support::init_logging();
    Arc::new(Containerd::start().unwrap())
}

/// The CRR watch events the API server has sent, once their count has not
/// changed for half a second (the fan-out of the last write is over).
async fn settled_crr_events(api: &support::apiserver::FakeApiServer) -> u64 {
    let deadline = Instant::now() + Duration::from_secs(30);
    let (mut last, mut since) = (api.watch_events(Resource::Crr), Instant::now());
    loop {
        tokio::time::sleep(Duration::from_millis(50)).await;
        let now = api.watch_events(Resource::Crr);
        if now != last {
            (last, since) = (now, Instant::now());
        } else if since.elapsed() >= Duration::from_millis(500) {
            return now;
        }
        assert!(Instant::now() < deadline, "CRR watch events never settled");
    }
}

/// The watch events the API server sends per CRR do not grow with the
/// number of nodes. For N = 1, 10 and 50 nodes: one CRR that recreates a
/// container and four that node-0 refuses (no such container), each
/// followed to its end; the CRR watch events delivered to all nodes
/// together, per CRR, are printed and compared.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn watch_events_per_crr_do_not_grow_with_the_nodes() {
    let ctrd = tokio::task::spawn_blocking(start_containerd).await.unwrap();
    let mut per_crr = Vec::new();
    for nodes in [1, 10, 50] {
        let fleet = Fleet::start(&ctrd, nodes).await;
        // One containerd serves every round: a Pod name of its own each.
        let pod = format!("web-{nodes}");
        fleet
            .kubelet
            .run_pod(PodSpec::new(&pod, vec![ContainerSpec::graceful("app")]))
            .await;
        // The start-up's own events over first.
        let before = settled_crr_events(&fleet.api).await;
        let started = Instant::now();
        fleet.create("restart", &pod, "app");
        for i in 0..4 {
            fleet.create(&format!("refused-{i}"), &pod, "nosuch");
        }
        let done = fleet.finished("restart", Duration::from_secs(60)).await;
        assert_eq!(
            done["status"]["containerRecreateStates"],
            json!([{"name": "app", "phase": "Succeeded", "isKilled": true}])
        );
        for i in 0..4 {
            let refused = fleet
                .finished(&format!("refused-{i}"), Duration::from_secs(20))
                .await;
            assert_eq!(
                refused["status"]["message"],
                "container nosuch not found in Pod"
            );
        }
        let took = started.elapsed();
        // Whatever the last writes still fan out, counted once it is over.
        let events = settled_crr_events(&fleet.api).await - before;
        let each = events as f64 / 5.0;
        eprintln!(
            "fleet: {nodes} nodes: {events} CRR watch events for 5 CRRs ({each:.1} per CRR), all done in {took:.1?}"
        );
        per_crr.push((nodes, each));
    }
    let (_, one) = per_crr[0];
    for (nodes, each) in &per_crr {
        assert!(
            *each <= one + 1.0,
            "{each:.1} watch events per CRR at {nodes} nodes, {one:.1} at one: {per_crr:?}"
        );
    }
}

/// Per CRR, from the API server's own log of changes: the node labels it
/// was given in turn, and how often it was completed.
#[derive(Debug, Default)]
struct History {
    claims: Vec<(String, Instant)>,
    completions: usize,
}

/// Records each CRR's claims and completions until the returned handle is
/// dropped.
fn record_history(
    api: &FakeApiServer,
) -> Arc<std::sync::Mutex<std::collections::HashMap<String, History>>> {
    let seen = Arc::new(std::sync::Mutex::new(std::collections::HashMap::<
        String,
        History,
    >::new()));
    let mut changes = api.subscribe();
    let into = Arc::clone(&seen);
    tokio::spawn(async move {
        loop {
            let change = match changes.recv().await {
                Ok(change) => change,
                Err(tokio::sync::broadcast::error::RecvError::Lagged(n)) => {
                    panic!("the history missed {n} changes")
                }
                Err(_) => return,
            };
            if change.resource != Resource::Crr {
                continue;
            }
            let label =
                |obj: &Value| obj["metadata"]["labels"]["crr.apps.kruise.io/node-name"].clone();
            let done = |obj: &Value| obj["status"]["completionTime"].is_string();
            let old = change.old.clone().unwrap_or(Value::Null);
            let name = change.new["metadata"]["name"]
                .as_str()
                .unwrap_or_default()
                .to_owned();
            let mut seen = into.lock().unwrap();
            let entry = seen.entry(name).or_default();
            if label(&change.new) != label(&old) {
                let to = label(&change.new).as_str().unwrap_or("(none)").to_owned();
                entry.claims.push((to, Instant::now()));
            }
            if done(&change.new) && !done(&old)
                || done(&change.new)
                    && done(&old)
                    && change.new["status"]["completionTime"] != old["status"]["completionTime"]
            {
                entry.completions += 1;
            }
        }
    });
    seen
}

/// The holder is killed while CRRs are being created: another node takes
/// the Lease once it expires, and every CRR is claimed once, for node-0,
/// and completed once.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_killed_holder_is_replaced_and_no_crr_is_lost_or_claimed_twice() {
    let ctrd = tokio::task::spawn_blocking(start_containerd).await.unwrap();
    let mut fleet = Fleet::start_in_order(&ctrd, &[1, 0, 2]).await;
    assert_eq!(fleet.holder().as_deref(), Some("node-1"));
    fleet
        .kubelet
        .run_pod(PodSpec::new("web", vec![ContainerSpec::graceful("app")]))
        .await;
    let history = record_history(&fleet.api);
    let mut killed_at = None;
    let mut names = Vec::new();
    let started = Instant::now();
    for i in 0.. {
        let elapsed = started.elapsed();
        if elapsed > Duration::from_secs(8) {
            break;
        }
        if killed_at.is_none() && elapsed > Duration::from_secs(1) {
            fleet.agent_mut(1).kill();
            killed_at = Some(Instant::now());
        }
        let name = format!("crr-{i}");
        fleet.create(&name, "web", "nosuch");
        names.push(name);
        tokio::time::sleep(Duration::from_millis(150)).await;
    }
    let killed_at = killed_at.unwrap();
    for name in &names {
        let done = fleet.finished(name, Duration::from_secs(20)).await;
        assert_eq!(
            done["status"]["message"], "container nosuch not found in Pod",
            "{name}"
        );
    }
    tokio::time::sleep(Duration::from_millis(500)).await;
    let history = history.lock().unwrap();
    for name in &names {
        let h = &history[name];
        let claims: Vec<&str> = h.claims.iter().map(|(to, _)| to.as_str()).collect();
        assert_eq!(
            claims,
            ["node-0"],
            "{name}: claimed once, for its Pod's node"
        );
        assert_eq!(h.completions, 1, "{name}: completed once");
    }
    let next_claim = history
        .values()
        .flat_map(|h| h.claims.iter().map(|(_, at)| *at))
        .filter(|at| *at > killed_at)
        .min()
        .unwrap();
    let gap = next_claim - killed_at;
    let holder = fleet.holder().unwrap();
    assert_ne!(holder, "node-1");
    let lease = lease();
    eprintln!(
        "fleet: {} CRRs created over 8 s; holder node-1 killed at 1 s; {holder} claimed next {gap:.2?} after (Lease {:?}, renew {:?})",
        names.len(),
        lease.duration,
        lease.renew_period
    );
    assert!(
        gap <= lease.duration + lease.renew_period,
        "the next claim came {gap:?} after the holder died"
    );
    let claims: f64 = [0, 1, 2]
        .iter()
        .map(|&i| fleet.agent(i).metric("crr_proxy_crr_claims_total"))
        .sum();
    assert_eq!(claims, names.len() as f64, "claims counted by the nodes");
    assert!(fleet.agent(holder[5..].parse().unwrap()).holds_lease());
}

/// A CRR whose Pod does not exist, and one whose Pod is not scheduled,
/// end Completed with the webhook's messages, unclaimed, within a few
/// seconds; only the Lease holder writes them, and it deletes the one
/// with a TTL once it passes.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn crrs_no_node_can_take_are_ended_by_the_holder_alone() {
    let ctrd = tokio::task::spawn_blocking(start_containerd).await.unwrap();
    let fleet = Fleet::start_in_order(&ctrd, &[1, 0, 2]).await;
    fleet
        .api
        .create(
            Resource::Pod,
            NAMESPACE,
            json!({"metadata": {"name": "unscheduled"},
                   "spec": {"containers": [{"name": "app", "image": "busybox"}]}}),
        )
        .unwrap();
    let created = Instant::now();
    fleet.create("ghost", "no-such-pod", "app");
    fleet.create("pending", "unscheduled", "app");
    let mut ttl = serde_json::Map::new();
    ttl.insert("ttlSecondsAfterFinished".into(), json!(1));
    fleet
        .api
        .create(
            Resource::Crr,
            NAMESPACE,
            json!({"metadata": {"name": "ghost-ttl"},
                   "spec": {"podName": "no-such-pod", "containers": [{"name": "app"}], "ttlSecondsAfterFinished": 1}}),
        )
        .unwrap();
    for (name, message) in [
        ("ghost", "no found Pod named no-such-pod"),
        (
            "pending",
            "not allowed to recreate containers in a pending Pod",
        ),
    ] {
        let done = fleet.finished(name, Duration::from_secs(5)).await;
        assert_eq!(done["status"]["message"], message);
        assert!(done["metadata"]["labels"]["crr.apps.kruise.io/node-name"].is_null());
    }
    eprintln!(
        "fleet: unclaimable CRRs ended {:.2?} after creation",
        created.elapsed()
    );
    wait_for(Duration::from_secs(5), || {
        fleet.crr("ghost-ttl").is_none().then_some(())
    })
    .await
    .expect("deleted by the holder after its TTL");
    let writers: std::collections::BTreeSet<String> = fleet
        .api
        .writes()
        .into_iter()
        .filter(|w| {
            ["ghost", "pending", "ghost-ttl"]
                .iter()
                .any(|n| w.path.contains(&format!("/containerrecreaterequests/{n}")))
        })
        .filter_map(|w| w.user)
        .collect();
    assert_eq!(writers, ["crr-proxy:node:node-1".to_owned()].into());
    assert_eq!(
        fleet.agent(1).metric("crr_proxy_crr_unclaimable_total"),
        3.0
    );
    assert_eq!(
        fleet.agent(0).metric("crr_proxy_crr_unclaimable_total"),
        0.0
    );
    assert_eq!(
        fleet.agent(2).metric("crr_proxy_crr_unclaimable_total"),
        0.0
    );
}

/// Waits until node `i` counts one unanswered CRR.
async fn unanswered_counted(fleet: &Fleet, i: usize) -> Option<()> {
    wait_for(Duration::from_secs(5), || {
        (fleet.agent(i).metric("crr_proxy_crr_unanswered_total") == 1.0).then_some(())
    })
    .await
}

/// A CRR claimed for a node whose crr-proxy is down (here: not started) is
/// ended by the Lease holder once it has gone unanswered for the set time
/// (kruise-manager's 60 s; 4 s here), with kruise-manager's message; a CRR
/// its node answers is left to it; a holder that takes over ends the
/// unanswered claims its predecessor made.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn claims_their_node_never_takes_up_are_ended_by_the_holder() {
    let ctrd = tokio::task::spawn_blocking(start_containerd).await.unwrap();
    let settings = LeaseSettings {
        unanswered: Duration::from_secs(4),
        ..lease()
    };
    // node-0 runs the Pod, and its crr-proxy is down.
    let mut fleet = Fleet::start_with(&ctrd, &[1, 2], settings).await;
    assert_eq!(fleet.holder().as_deref(), Some("node-1"));
    fleet
        .kubelet
        .run_pod(PodSpec::new("web", vec![ContainerSpec::graceful("app")]))
        .await;
    let created = Instant::now();
    fleet.create("unanswered", "web", "app");
    let claimed = fleet.claimed_for("unanswered", "node-0").await;
    assert!(claimed["status"]["phase"].is_null(), "{claimed}");
    let done = fleet.completed("unanswered", Duration::from_secs(15)).await;
    let waited = created.elapsed();
    assert!(waited >= Duration::from_secs(3), "{waited:?}");
    assert_eq!(
        done["status"]["message"],
        "daemon has not responded for a long time"
    );
    assert!(done["status"]["completionTime"].is_string());
    // Counted once the write has returned to the holder.
    unanswered_counted(&fleet, 1)
        .await
        .expect("counted by node-1");

    // The holder is killed with a claim in waiting: the new holder ends it.
    fleet.create("handed-over", "web", "app");
    fleet.claimed_for("handed-over", "node-0").await;
    fleet.agent_mut(1).kill();
    let done = fleet
        .completed("handed-over", Duration::from_secs(30))
        .await;
    assert_eq!(
        done["status"]["message"],
        "daemon has not responded for a long time"
    );
    assert_eq!(fleet.holder().as_deref(), Some("node-2"));
    unanswered_counted(&fleet, 2)
        .await
        .expect("counted by node-2");

    // Once node-0's crr-proxy runs, its CRRs are answered and recreated.
    fleet.start_agent(0).await;
    fleet.create("answered", "web", "app");
    let done = fleet.finished("answered", Duration::from_secs(30)).await;
    assert!(done["status"]["message"].is_null(), "{done}");
    assert_eq!(
        done["status"]["containerRecreateStates"][0]["phase"],
        "Succeeded"
    );
    tokio::time::sleep(Duration::from_secs(5)).await;
    assert_eq!(fleet.agent(2).metric("crr_proxy_crr_unanswered_total"), 1.0);
}

/// The holder's writes are cut off (a partition): it stops claiming once
/// its Lease can no longer be counted on, the other node takes the Lease
/// when it expires and claims what was created meanwhile; once the
/// partition heals the old holder follows, and never claims again.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_partitioned_holder_cannot_claim_after_its_lease_expired() {
    let ctrd = tokio::task::spawn_blocking(start_containerd).await.unwrap();
    let fleet = Fleet::start_in_order(&ctrd, &[1, 0]).await;
    fleet
        .kubelet
        .run_pod(PodSpec::new("web", vec![ContainerSpec::graceful("app")]))
        .await;
    let old = "crr-proxy:node:node-1";
    fleet.api.partition(old, true);
    let cut = tokio::time::Instant::now();
    let cut_wall = k8s_openapi::jiff::Timestamp::now();
    // Its last renewal: none can land from now on.
    let renewed = fleet
        .api
        .get(Resource::Lease, "crr-proxy-system", "crr-proxy-claimer")
        .unwrap()["spec"]["renewTime"]
        .clone();
    fleet.create("during", "web", "nosuch");
    let lease = lease();
    wait_for(
        lease.duration + lease.renew_period + Duration::from_secs(2),
        || (fleet.holder().as_deref() == Some("node-0")).then_some(()),
    )
    .await
    .expect("node-0 takes the Lease once it expires");
    let taken = tokio::time::Instant::now();
    assert!(
        !fleet.agent(1).holds_lease(),
        "the old holder knows it may not claim"
    );
    let done = fleet.finished("during", Duration::from_secs(10)).await;
    assert_eq!(
        done["status"]["message"],
        "container nosuch not found in Pod"
    );
    fleet.api.partition(old, false);
    fleet.create("after", "web", "nosuch");
    fleet.finished("after", Duration::from_secs(10)).await;
    // The old holder's Lease was last renewed at `renewed`, before the cut:
    // it expired a Lease duration after that, which is where its writes
    // must have stopped.
    let renewed: k8s_openapi::jiff::Timestamp = renewed.as_str().unwrap().parse().unwrap();
    let before_cut = Duration::try_from(cut_wall.duration_since(renewed)).unwrap();
    assert!(
        before_cut < lease.duration,
        "renewed {before_cut:?} before the cut"
    );
    let expired = cut - before_cut + lease.duration;
    assert!(expired <= taken, "node-0 took the Lease before it expired");
    let late: Vec<_> = fleet
        .api
        .writes()
        .into_iter()
        .filter(|w| w.user.as_deref() == Some(old) && w.at >= expired)
        .filter(|w| w.path.contains("/containerrecreaterequests/"))
        .map(|w| (w.method, w.path, w.code))
        .collect();
    assert!(
        late.is_empty(),
        "the old holder wrote CRRs after its Lease expired: {late:?}"
    );
    assert_eq!(fleet.agent(1).metric("crr_proxy_crr_claims_total"), 0.0);
    assert_eq!(fleet.agent(0).metric("crr_proxy_crr_claims_total"), 2.0);
    tokio::time::sleep(lease.renew_period * 2).await;
    assert_eq!(fleet.holder().as_deref(), Some("node-0"));
    assert!(!fleet.agent(1).holds_lease());
}

/// A holder that stops (SIGTERM) gives the Lease up: the other node takes
/// it as soon as it sees the release, well before the Lease would expire.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_stopped_holder_hands_the_lease_over_at_once() {
    let ctrd = tokio::task::spawn_blocking(start_containerd).await.unwrap();
    let mut fleet = Fleet::start_in_order(&ctrd, &[1, 0]).await;
    assert_eq!(fleet.holder().as_deref(), Some("node-1"));
    let stopping = Instant::now();
    let index = fleet
        .agents
        .iter()
        .position(|a| a.node == "node-1")
        .unwrap();
    fleet.agents[index].stop().await;
    assert!(!fleet.agent(1).holds_lease());
    wait_for(Duration::from_secs(10), || {
        (fleet.holder().as_deref() == Some("node-0")).then_some(())
    })
    .await
    .expect("node-0 takes the Lease");
    let gap = stopping.elapsed();
    let lease = lease();
    eprintln!(
        "fleet: node-1 stopped; node-0 held the Lease {gap:.2?} later (Lease {:?})",
        lease.duration
    );
    assert!(
        gap < lease.renew_period + lease.renew_period / 2,
        "taken {gap:?} after the stop: the release was not seen"
    );
    fleet
        .kubelet
        .run_pod(PodSpec::new("web", vec![ContainerSpec::graceful("app")]))
        .await;
    fleet.create("after", "web", "nosuch");
    fleet.finished("after", Duration::from_secs(10)).await;
    assert_eq!(fleet.agent(0).metric("crr_proxy_crr_claims_total"), 1.0);
}

/// A claim is conditional on the CRR's resourceVersion: when the holder's
/// copy is behind (here someone annotates the CRR while the holder's watch
/// lags), its claim is refused with a conflict and made again from the
/// newer copy, never over it.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_claim_from_a_stale_copy_conflicts_and_is_made_again() {
    let ctrd = tokio::task::spawn_blocking(start_containerd).await.unwrap();
    let fleet = Fleet::start_in_order(&ctrd, &[1, 0]).await;
    fleet
        .kubelet
        .run_pod(PodSpec::new("web", vec![ContainerSpec::graceful("app")]))
        .await;
    let mut watches = support::apiserver::Watches::default();
    watches
        .lag
        .insert(Resource::Crr, Duration::from_millis(500));
    fleet.api.set_watches(watches);
    // Watches take their lag when they start: end the running ones.
    fleet.api.compact();
    tokio::time::sleep(Duration::from_secs(1)).await;
    fleet.create("raced", "web", "nosuch");
    // Committed before the holder sees the CRR (at 500 ms), delivered after.
    tokio::time::sleep(Duration::from_millis(250)).await;
    let note = json!({"metadata": {"annotations": {"example.com/note": "changed meanwhile"}}});
    fleet
        .api
        .patch(Resource::Crr, NAMESPACE, "raced", &note, false)
        .unwrap();
    let done = fleet.finished("raced", Duration::from_secs(20)).await;
    assert_eq!(
        done["metadata"]["annotations"]["example.com/note"],
        "changed meanwhile"
    );
    let claims: Vec<Option<u16>> = fleet
        .api
        .writes()
        .into_iter()
        .filter(|w| {
            w.user.as_deref() == Some("crr-proxy:node:node-1")
                && w.path.ends_with("/containerrecreaterequests/raced")
        })
        .map(|w| w.code)
        .collect();
    assert_eq!(
        claims,
        [Some(409), Some(200)],
        "the holder's claims of the CRR"
    );
}

/// Node `i`'s election settings, its wall clock `ahead` seconds off.
fn skewed(ahead: i64) -> LeaseSettings {
    LeaseSettings {
        clock: WallClock::skewed(k8s_openapi::jiff::SignedDuration::from_secs(ahead)),
        ..lease()
    }
}

/// A follower whose clock runs 30 s ahead reads the holder's renewTime as
/// long past; it judges by when it saw the Lease change instead, and never
/// takes a Lease that is being renewed.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_follower_whose_clock_runs_ahead_takes_no_live_lease() {
    let ctrd = tokio::task::spawn_blocking(start_containerd).await.unwrap();
    let mut fleet = Fleet::start(&ctrd, 1).await;
    assert_eq!(fleet.holder().as_deref(), Some("node-0"));
    fleet.start_agent_with(1, skewed(30)).await;
    let lease = lease();
    let watched = Instant::now();
    while watched.elapsed() < lease.duration * 3 {
        assert_eq!(
            fleet.holder().as_deref(),
            Some("node-0"),
            "{}",
            fleet.lease_spec()
        );
        assert!(!fleet.agent(1).holds_lease());
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    assert_eq!(fleet.lease_spec()["leaseTransitions"], 1);
}

/// A follower whose clock runs 30 s behind reads the holder's renewTime as
/// far ahead; once the holder dies it still takes the Lease a Lease's
/// duration after the last renewal it saw, not 30 s later.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_follower_whose_clock_runs_behind_takes_over_in_time() {
    let ctrd = tokio::task::spawn_blocking(start_containerd).await.unwrap();
    let mut fleet = Fleet::start(&ctrd, 1).await;
    fleet.start_agent_with(1, skewed(-30)).await;
    // It sees a renewal or two first.
    tokio::time::sleep(Duration::from_secs(2)).await;
    fleet.agent_mut(0).kill();
    let killed = Instant::now();
    let lease = lease();
    let limit = lease.duration + lease.renew_period * 2 + Duration::from_secs(1);
    wait_for(limit, || {
        (fleet.holder().as_deref() == Some("node-1")).then_some(())
    })
    .await
    .unwrap_or_else(|| panic!("node-1 took nothing in {limit:?}: {}", fleet.lease_spec()));
    eprintln!(
        "fleet: node-1 (30 s behind) took the Lease {:.2?} after node-0 died",
        killed.elapsed()
    );
}

/// SIGTERM on the holder while one of its kills runs an 8 s preStop hook:
/// the Lease goes to the other node at once, and the kill still finishes
/// (and is written) before the agent is gone.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_stopping_holder_gives_the_lease_up_before_its_kills_finish() {
    let ctrd = tokio::task::spawn_blocking(start_containerd).await.unwrap();
    let mut fleet = Fleet::start(&ctrd, 2).await;
    assert_eq!(fleet.holder().as_deref(), Some("node-0"));
    let mut app = ContainerSpec::graceful("app");
    app.pre_stop = Some(json!({"exec": {"command": ["sleep", "8"]}}));
    fleet.kubelet.run_pod(PodSpec::new("web", vec![app])).await;
    fleet.create("slow", "web", "app");
    wait_for(Duration::from_secs(10), || {
        fleet
            .crr("slow")
            .filter(|c| c["status"]["phase"] == "Recreating")
    })
    .await
    .expect("the kill begins");
    // Into the preStop hook.
    tokio::time::sleep(Duration::from_secs(1)).await;
    let index = fleet
        .agents
        .iter()
        .position(|a| a.node == "node-0")
        .unwrap();
    let mut holder = fleet.agents.remove(index);
    let stopping = Instant::now();
    let stopped = tokio::spawn(async move {
        holder.stop().await;
        holder
    });
    let lease = lease();
    wait_for(lease.renew_period * 2, || {
        (fleet.holder().as_deref() == Some("node-1")).then_some(())
    })
    .await
    .unwrap_or_else(|| panic!("node-1 did not take the Lease: {}", fleet.lease_spec()));
    let handed = stopping.elapsed();
    assert!(!stopped.is_finished(), "the agent waits for its kill");
    let holder = stopped.await.unwrap();
    let gone = stopping.elapsed();
    assert!(!holder.holds_lease());
    // The kill finished and was written before the agent was gone (the
    // rest, seeing the container back, is for its next start).
    let slow = fleet.crr("slow").unwrap();
    assert_eq!(
        slow["status"]["containerRecreateStates"][0]["isKilled"], true,
        "{slow}"
    );
    eprintln!("fleet: the Lease went {handed:.2?} after SIGTERM, the agent {gone:.2?}");
}
