//! The agent end to end, on a real containerd against the fake API server:
//! `--agent kruise` next to the kruise-manager and kubelet roles, and
//! `--agent standalone` with the kubelet role only. The scenarios are
//! OpenKruise's v1alpha1 e2e ones (crr-semantics.md §4), run in both modes
//! with the same expected states and timing relations.
#![allow(clippy::unwrap_used, clippy::expect_used)] // tests fail loudly by design

#[path = "../support/mod.rs"]
mod support;

mod admission;
mod faults;
mod kubelet;
mod upstream;
mod versions;
mod writers;

use std::sync::Arc;
use std::time::{Duration, Instant};

use crr_proxy::agent::{self, AgentConfig, Mode};
use crr_proxy::cri::v1::ContainerStatusRequest;
use crr_proxy::crr::client::ApiVersion;
use crr_proxy::kill::Killer;
use crr_proxy::metrics::Metrics;
use crr_proxy::proxy::{Proxy, Routes};
use crr_proxy::reason::Recreated;
use k8s_openapi::jiff::Timestamp;
use kube::api::{Api, DynamicObject, PostParams};
use serde_json::{Value, json};
use support::ProxyUnderTest;
use support::apiserver::{Conversion, CrrVersions, FakeApiServer, Resource, Watches};
use support::containerd::Containerd;
use support::kubelet::{ContainerSpec, Kubelet, PodSpec, RestartPolicy};
use support::roles::{self, KruiseManager, NAMESPACE, wait_for};

const NODE: &str = "node-a";
const NODE_TOKEN: &str = "node-a-token";

/// Fields drop in order: the roles stop before containerd is torn down.
struct Cluster {
    api: FakeApiServer,
    kubelet: Kubelet,
    /// kubelet's CRI path: crr-proxy in front of containerd, sharing the
    /// agent's record of recreated containers (kept in `recreated_file`).
    proxy: ProxyUnderTest,
    recreated_file: std::path::PathBuf,
    metrics: Arc<Metrics>,
    _manager: Option<KruiseManager>,
    mode: Mode,
    cri: crr_proxy::cri::RuntimeClient,
    recreated: Arc<Recreated>,
    agent: Option<tokio::task::JoinHandle<()>>,
    /// The standalone Lease's settings the agent starts with.
    lease: agent::LeaseSettings,
    ctrd: Containerd,
}

/// An agent mode, on a cluster of one CRR API: OpenKruise v1.9's
/// (v1alpha1 only), or one that stores v1beta1 (master's, converting by
/// webhook; crr-proxy's own CRD, converting nothing).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
struct Setup {
    mode: Mode,
    versions: CrrVersions,
}

impl From<Mode> for Setup {
    fn from(mode: Mode) -> Self {
        Setup {
            mode,
            versions: CrrVersions::V1alpha1Only,
        }
    }
}

impl Cluster {
    async fn new(setup: impl Into<Setup>) -> Self {
        let mut cluster = Self::without_agent(setup).await;
        cluster.start_agent().await;
        cluster
    }

    /// Starts crr-proxy's agent, and waits until its watches have synced.
    async fn start_agent(&mut self) {
        let (synced, mut ready) = tokio::sync::watch::channel(false);
        let config = AgentConfig {
            client: self.api.client_as(NODE_TOKEN),
            cri: self.cri.clone(),
            killer: Killer::new(self.cri.clone(), None),
            node_name: NODE.into(),
            mode: self.mode,
            recreated: Arc::clone(&self.recreated),
            kills: Arc::new(crr_proxy::records::Records::in_memory()),
            metrics: Arc::clone(&self.metrics),
            lease: self.lease.clone(),
            kubelet: agent::KubeletSettings {
                config: None,
                reads_rewrites: true,
            },
        };
        self.agent = Some(tokio::spawn(agent::run(
            config,
            synced,
            std::future::pending(),
        )));
        tokio::time::timeout(Duration::from_secs(10), ready.wait_for(|r| *r))
            .await
            .expect("the agent's watch synced")
            .unwrap();
    }

    /// The cluster with its roles, before crr-proxy's agent starts.
    async fn without_agent(setup: impl Into<Setup>) -> Self {
        let Setup { mode, versions } = setup.into();
        support::init_logging();
        let ctrd = tokio::task::spawn_blocking(Containerd::start)
            .await
            .unwrap()
            .unwrap();
        // The agent writes as its node, under deploy/'s admission policies.
        let api = FakeApiServer::start_for_node(NODE, NODE_TOKEN).await;
        api.set_watches(Watches::unkind());
        api.set_crr_versions(versions);
        let cri = support::client(&ctrd.endpoint());
        let recreated_file = ctrd.scratch("state").join("recreated");
        let recreated = Arc::new(Recreated::open(&recreated_file).unwrap());
        let metrics = Arc::new(Metrics::default());
        let proxy = ProxyUnderTest::serve(
            Proxy::new(Routes {
                runtime: ctrd.endpoint(),
                image: None,
            })
            .with_reasons(Arc::clone(&recreated)),
        );
        let kubelet = Kubelet::start(&api, proxy.client(), NODE, ctrd.scratch("logs")).await;
        let manager = (mode == Mode::Kruise).then(|| KruiseManager::start(&api));
        Self {
            ctrd,
            api,
            kubelet,
            proxy,
            recreated_file,
            metrics,
            _manager: manager,
            mode,
            cri,
            recreated,
            agent: None,
            lease: agent::LeaseSettings::default(),
        }
    }

    /// The first Event in the namespace with `reason`.
    fn event(&self, reason: &str) -> Option<Value> {
        self.api
            .list(Resource::Event, Some(NAMESPACE), &Default::default())
            .into_iter()
            .find(|e| e["reason"] == reason)
    }

    /// Creates a CRR through the API (and so through the webhook).
    fn create(
        &self,
        name: &str,
        pod: &str,
        containers: &[&str],
        strategy: Value,
        extra: Value,
    ) -> Value {
        let mut spec = json!({"podName": pod, "containers": containers.iter().map(|c| json!({"name": c})).collect::<Vec<_>>()});
        if !strategy.is_null() {
            spec["strategy"] = strategy;
        }
        support::patch::merge_patch(&mut spec, &extra);
        self.api
            .create(
                Resource::Crr,
                NAMESPACE,
                json!({"metadata": {"name": name}, "spec": spec}),
            )
            .expect("create CRR")
    }

    /// The CRR once accepted (labelled by the webhook, or by crr-proxy in
    /// standalone mode). The Pod's uid label marks it: in standalone mode the
    /// claimer's node label comes first, in a write of its own, and the
    /// node's acceptance (or refusal) follows.
    async fn accepted(&self, name: &str) -> Value {
        wait_for(Duration::from_secs(10), || {
            self.crr(name)
                .filter(|c| c["metadata"]["labels"]["crr.apps.kruise.io/pod-uid"].is_string())
        })
        .await
        .unwrap_or_else(|| panic!("CRR {name} not accepted"))
    }

    /// One sample of the agent's /metrics text, by series name and labels.
    fn metric(&self, series: &str) -> f64 {
        let text = self.metrics.render();
        text.lines()
            .find_map(|l| l.strip_prefix(series)?.strip_prefix(' ')?.parse().ok())
            .unwrap_or_else(|| panic!("no {series} in\n{text}"))
    }

    /// Waits for a counter to reach `value`. A container's stop is counted
    /// when its StopContainer returns, which may be after the CRR completed
    /// from the Pod's status: the test must not read it in between.
    async fn metric_reaches(&self, series: &str, value: f64) {
        wait_for(Duration::from_secs(5), || {
            (self.metric(series) == value).then_some(())
        })
        .await
        .unwrap_or_else(|| panic!("{series} is {}, not {value}", self.metric(series)));
    }

    fn crr(&self, name: &str) -> Option<Value> {
        self.api.get(Resource::Crr, NAMESPACE, name)
    }

    fn pod(&self, name: &str) -> Value {
        self.api.get(Resource::Pod, NAMESPACE, name).unwrap()
    }

    async fn completed(&self, name: &str, limit: Duration) -> Value {
        wait_for(limit, || {
            self.crr(name).filter(|c| {
                c["status"]["phase"] == "Completed" && c["status"]["completionTime"].is_string()
            })
        })
        .await
        .unwrap_or_else(|| {
            panic!(
                "CRR {name} not completed in {limit:?}: {:?}",
                self.crr(name)
            )
        })
    }

    async fn active_removed(&self, name: &str) {
        wait_for(Duration::from_secs(5), || {
            self.crr(name)
                .filter(|c| c["metadata"]["labels"]["crr.apps.kruise.io/active"].is_null())
        })
        .await
        .unwrap_or_else(|| panic!("active label not removed from {name}"));
    }
}

impl Drop for Cluster {
    fn drop(&mut self) {
        if let Some(agent) = &self.agent {
            agent.abort();
        }
    }
}

fn states(crr: &Value) -> Value {
    crr["status"]["containerRecreateStates"].clone()
}

fn container_status(pod: &Value, name: &str) -> Value {
    pod["status"]["containerStatuses"]
        .as_array()
        .unwrap()
        .iter()
        .find(|c| c["name"] == name)
        .cloned()
        .unwrap()
}

fn seconds(stamp: &Value) -> i64 {
    stamp
        .as_str()
        .unwrap()
        .parse::<Timestamp>()
        .unwrap()
        .as_second()
}

/// "Both OK": each container recreated once, by us, with a new ID, and ready.
fn assert_recreated(crr: &Value, pod: &Value, names: &[&str]) {
    let expected: Vec<Value> = names
        .iter()
        .map(|n| json!({"name": n, "phase": "Succeeded", "isKilled": true}))
        .collect();
    assert_eq!(states(crr), json!(expected), "{crr:#}");
    assert_eq!(roles::condition(pod, "Ready").as_deref(), Some("True"));
    for (i, name) in names.iter().enumerate() {
        let status = container_status(pod, name);
        assert_eq!(status["restartCount"], 1, "{name}");
        assert_ne!(
            status["containerID"], crr["spec"]["containers"][i]["statusContext"]["containerID"],
            "{name}"
        );
    }
}

fn finished_at(pod: &Value, name: &str) -> i64 {
    seconds(&container_status(pod, name)["lastState"]["terminated"]["finishedAt"])
}

macro_rules! in_both_modes {
    ($($name:ident),* $(,)?) => {
        mod kruise_master {
            const SETUP: super::Setup = super::Setup {
                mode: super::Mode::Kruise,
                versions: super::CrrVersions::Both(super::Conversion::Webhook),
            };
            $(
                #[tokio::test(flavor = "multi_thread", worker_threads = 4)]
                async fn $name() {
                    super::$name(SETUP).await
                }
            )*

            #[tokio::test(flavor = "multi_thread", worker_threads = 4)]
            async fn both_versions_complete_with_typed_fields_and_no_legacy_annotations() {
                super::both_versions_complete_with_typed_fields_and_no_legacy_annotations(SETUP).await
            }

            #[tokio::test(flavor = "multi_thread", worker_threads = 4)]
            async fn v1alpha1_readers_see_the_grace_as_its_annotation() {
                super::v1alpha1_readers_see_the_grace_as_its_annotation().await
            }

            #[tokio::test(flavor = "multi_thread", worker_threads = 4)]
            async fn an_openkruise_upgrade_moves_the_agent_to_v1beta1() {
                super::an_openkruise_upgrade_moves_the_agent_to_v1beta1().await
            }

            #[tokio::test(flavor = "multi_thread", worker_threads = 4)]
            async fn v1beta1_status_writes_read_afresh_and_try_four_times() {
                super::v1beta1_status_writes_read_afresh_and_try_four_times(SETUP).await
            }

            #[tokio::test(flavor = "multi_thread", worker_threads = 4)]
            async fn v1beta1_another_writers_completion_is_kept() {
                super::v1beta1_another_writers_completion_is_kept(SETUP).await
            }
        }

        mod standalone_v1beta1 {
            const SETUP: super::Setup = super::Setup {
                mode: super::Mode::Standalone,
                versions: super::CrrVersions::Both(super::Conversion::None),
            };
            $(
                #[tokio::test(flavor = "multi_thread", worker_threads = 4)]
                async fn $name() {
                    super::$name(SETUP).await
                }
            )*

            #[tokio::test(flavor = "multi_thread", worker_threads = 4)]
            async fn both_versions_complete_with_typed_fields_and_no_legacy_annotations() {
                super::both_versions_complete_with_typed_fields_and_no_legacy_annotations(SETUP).await
            }

            #[tokio::test(flavor = "multi_thread", worker_threads = 4)]
            async fn a_crr_stored_before_the_crd_upgrade_completes() {
                super::a_crr_stored_before_the_crd_upgrade_completes().await
            }
            #[tokio::test(flavor = "multi_thread", worker_threads = 4)]
            async fn another_writers_condition_is_kept() {
                super::v1beta1_another_writers_condition_is_kept(SETUP).await
            }


            #[tokio::test(flavor = "multi_thread", worker_threads = 4)]
            async fn v1beta1_status_writes_read_afresh_and_try_four_times() {
                super::v1beta1_status_writes_read_afresh_and_try_four_times(SETUP).await
            }

            #[tokio::test(flavor = "multi_thread", worker_threads = 4)]
            async fn v1beta1_another_writers_completion_is_kept() {
                super::v1beta1_another_writers_completion_is_kept(SETUP).await
            }
        }

        mod kruise {
            $(
                #[tokio::test(flavor = "multi_thread", worker_threads = 4)]
                async fn $name() {
                    super::$name(super::Mode::Kruise.into()).await
                }
            )*

            #[tokio::test(flavor = "multi_thread", worker_threads = 4)]
            async fn bad_crrs_get_their_documented_outcome_and_delay_no_one() {
                super::bad_crrs_get_their_documented_outcome_and_delay_no_one().await
            }

            #[tokio::test(flavor = "multi_thread", worker_threads = 4)]
            async fn stands_aside_while_kruise_daemon_runs_on_the_node() {
                super::kruise_stands_aside_while_kruise_daemon_runs_on_the_node().await
            }
        }

        mod standalone {
            $(
                #[tokio::test(flavor = "multi_thread", worker_threads = 4)]
                async fn $name() {
                    super::$name(super::Mode::Standalone.into()).await
                }
            )*

            #[tokio::test(flavor = "multi_thread", worker_threads = 4)]
            async fn refusals_complete_with_the_webhooks_messages() {
                super::standalone_refusals_complete_with_the_webhooks_messages().await
            }

            #[tokio::test(flavor = "multi_thread", worker_threads = 4)]
            async fn a_crr_before_the_containers_started_is_refused() {
                super::standalone_a_crr_before_the_containers_started_is_refused().await
            }

            #[tokio::test(flavor = "multi_thread", worker_threads = 4)]
            async fn hostile_crrs_get_documented_outcomes() {
                super::standalone_hostile_crrs_get_documented_outcomes().await
            }

            /// On crr-proxy's own v1beta1 CRD, and on both containerd lines.
            #[tokio::test(flavor = "multi_thread", worker_threads = 4)]
            async fn invalid_crrs_are_refused_at_create_or_ended_once() {
                super::standalone_v1beta1_invalid_crrs_are_refused_at_create_or_ended_once().await
            }
        }
    };
}

use admission::*;
use faults::*;
use kubelet::*;
use upstream::*;
use versions::*;
use writers::*;

in_both_modes!(
    the_pod_says_why_its_container_restarted,
    an_api_server_outage_only_delays_crrs,
    e2e_1a_simple_container_with_min_started_seconds_and_ttl,
    e2e_1b_two_containers_without_strategy,
    e2e_2a_unordered_does_not_wait_for_readiness,
    e2e_2b_ordered_waits_for_the_previous_container,
    e2e_3a_pre_stop_runs_fully_and_kills_are_sequential,
    e2e_3b_active_deadline_completes_while_the_kill_goes_on,
    e2e_3c_unready_grace_and_a_short_termination_grace,
    e2e_4a_and_4b_force_recreate,
    two_crrs_for_one_pod_back_to_back_both_complete,
    a_watch_compacted_mid_recreate_relists_and_loses_nothing,
    a_sleep_pre_stop_is_honoured,
    a_failed_hook_with_long_output_is_recorded_cut_to_size,
    an_empty_unready_stamp_counts_as_none,
    crrs_that_exist_before_the_agent_starts_are_taken_at_once,
    a_refused_event_write_is_retried,
    a_lagging_cache_does_not_complete_a_crr_twice,
    a_pass_goes_on_from_its_own_writes,
    a_second_crr_within_kubelets_back_off_waits_for_it,
    restart_policies_decide_what_a_crr_does,
    native_sidecars_are_recreated_like_any_container,
    a_pod_deleted_mid_recreate_completes_the_crr,
    another_writers_states_are_decided_on_not_written_over,
);
