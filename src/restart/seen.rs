//! The cluster as a workload run's watches show it (CRRs of the run, the
//! workload's Pods, the namespace's budgets and Pod Events), and what is read
//! from it: who controls a Pod, whether it is Ready, which budgets cover it.

use std::collections::{BTreeMap, HashSet};

use k8s_openapi::api::core::v1::Pod;
use k8s_openapi::api::events::v1::Event;
use k8s_openapi::api::policy::v1::PodDisruptionBudget;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::{LabelSelector, OwnerReference};
use kube::ResourceExt;
use kube::runtime::watcher;

use super::Change;
use super::follow::last_seen;
use super::waves::Budget;
use crate::crr::ContainerRecreateRequest;
use crate::listing::Listing;

/// The objects one watch has shown, as they are now, by name (or by the
/// key `key` makes). A relist (after a watch expired) replaces them once it
/// is complete.
pub struct Mirror<K> {
    pub items: BTreeMap<String, K>,
    listing: Listing<(String, K)>,
    key: fn(&K) -> String,
}

impl<K: kube::Resource> Default for Mirror<K> {
    fn default() -> Self {
        Self::keyed(|object| object.name_any())
    }
}

impl<K: kube::Resource> Mirror<K> {
    fn keyed(key: fn(&K) -> String) -> Self {
        Self {
            items: BTreeMap::new(),
            listing: Listing::default(),
            key,
        }
    }

    /// Takes `event`; an object `keep` refuses is not kept (and one kept
    /// before is forgotten).
    fn apply(&mut self, event: watcher::Event<K>, keep: impl Fn(&K) -> bool) {
        match event {
            watcher::Event::Init => self.listing.begin(),
            watcher::Event::InitApply(object) => {
                if keep(&object) {
                    self.listing.add(((self.key)(&object), object));
                }
            }
            watcher::Event::InitDone => self.items = self.listing.done().into_iter().collect(),
            watcher::Event::Apply(object) => {
                let key = (self.key)(&object);
                match keep(&object) {
                    true => self.items.insert(key, object),
                    false => self.items.remove(&key),
                };
            }
            watcher::Event::Delete(object) => {
                self.items.remove(&(self.key)(&object));
            }
        }
    }
}

/// The Pod an Event is about.
fn regarding(event: &Event) -> &str {
    event
        .regarding
        .as_ref()
        .and_then(|r| r.name.as_deref())
        .unwrap_or_default()
}

/// The cluster as the watches show it.
pub struct Seen {
    pub crrs: Mirror<ContainerRecreateRequest>,
    pub pods: Mirror<Pod>,
    pub budgets: Mirror<PodDisruptionBudget>,
    /// Events about the watched Pods only (the namespace may hold many
    /// more), by `<pod>/<event>`, so that one Pod's are a range.
    pub events: Mirror<Event>,
}

impl Default for Seen {
    fn default() -> Self {
        Self {
            crrs: Mirror::default(),
            pods: Mirror::default(),
            budgets: Mirror::default(),
            events: Mirror::keyed(|e| format!("{}/{}", regarding(e), e.name_any())),
        }
    }
}

impl Seen {
    pub fn apply(&mut self, change: Change) {
        fn all<K>(_: &K) -> bool {
            true
        }
        match change {
            Change::Crr(e) => self.crrs.apply(*e, all),
            Change::Pod(e) => self.pods.apply(*e, all),
            Change::Budget(e) => self.budgets.apply(*e, all),
            Change::Event(e) => {
                let pods = &self.pods.items;
                self.events.apply(*e, |e| pods.contains_key(regarding(e)));
            }
        }
    }

    /// The Pods seen whose controller is one of `owners` (`None`: every
    /// Pod seen; the Pod watch is selected already).
    pub fn owned_by<'a>(
        &'a self,
        owners: Option<&'a HashSet<String>>,
    ) -> impl Iterator<Item = &'a Pod> {
        self.pods.items.values().filter(move |p| {
            owners.is_none_or(|owners| {
                controller(p.owner_references()).is_some_and(|o| owners.contains(o))
            })
        })
    }

    /// The Pod's Events since `since` (Unix seconds).
    pub fn events_of(&self, pod: &str, since: Option<i64>) -> Vec<Event> {
        let from = format!("{pod}/");
        self.events
            .items
            .range(from.clone()..)
            .take_while(|(key, _)| key.starts_with(&from))
            .map(|(_, e)| e)
            .filter(|e| {
                last_seen(e)
                    .zip(since)
                    .is_some_and(|(at, since)| at >= since)
            })
            .cloned()
            .collect()
    }
}

pub fn ready(pod: &Pod) -> bool {
    pod.status
        .as_ref()
        .and_then(|s| s.conditions.as_ref())
        .is_some_and(|c| c.iter().any(|c| c.type_ == "Ready" && c.status == "True"))
}

pub fn restarts(pod: &Pod) -> BTreeMap<String, i32> {
    pod.status
        .iter()
        .flat_map(crate::restart_rules::container_statuses)
        .map(|c| (c.name.clone(), c.restart_count))
        .collect()
}

pub fn active(pod: &Pod) -> bool {
    pod.metadata.deletion_timestamp.is_none()
        && !matches!(
            pod.status.as_ref().and_then(|s| s.phase.as_deref()),
            Some("Succeeded" | "Failed")
        )
}

/// The UID the controller reference names.
pub fn controller(references: &[OwnerReference]) -> Option<&str> {
    references
        .iter()
        .find(|r| r.controller == Some(true))
        .map(|r| r.uid.as_str())
}

/// The budgets of `budgets` that select any of `pods`.
pub fn budgets_over<'a>(
    budgets: impl Iterator<Item = &'a PodDisruptionBudget>,
    pods: &[&Pod],
) -> Vec<Budget> {
    budgets
        .filter(|b| {
            let selector = b.spec.as_ref().and_then(|s| s.selector.as_ref());
            pods.iter()
                .any(|p| selector.is_some_and(|s| selects(s, p.labels())))
        })
        .map(|b| {
            let status = b.status.as_ref();
            let current = status
                .and_then(|s| s.observed_generation)
                .zip(b.metadata.generation)
                .is_some_and(|(seen, generation)| seen >= generation);
            Budget {
                name: b.name_any(),
                allowed: status
                    .filter(|_| current)
                    .and_then(|s| s.disruptions_allowed),
            }
        })
        .collect()
}

/// Whether `selector` selects `labels`, as the API server matches (an
/// empty selector selects all, as a PDB's does in policy/v1; one the API
/// server would not have stored selects nothing).
fn selects(selector: &LabelSelector, labels: &BTreeMap<String, String>) -> bool {
    use kube::core::SelectorExt;
    kube::core::Selector::try_from(selector.clone()).is_ok_and(|s| s.matches(labels))
}

#[cfg(test)]
pub(super) mod tests {
    use super::*;
    use k8s_openapi::apimachinery::pkg::apis::meta::v1::LabelSelectorRequirement;

    /// `app=web,tier in (a,b),!canary`.
    pub(in crate::restart) fn web_tier_not_canary() -> LabelSelector {
        LabelSelector {
            match_labels: Some(BTreeMap::from([("app".into(), "web".into())])),
            match_expressions: Some(vec![
                LabelSelectorRequirement {
                    key: "tier".into(),
                    operator: "In".into(),
                    values: Some(vec!["a".into(), "b".into()]),
                },
                LabelSelectorRequirement {
                    key: "canary".into(),
                    operator: "DoesNotExist".into(),
                    values: None,
                },
            ]),
        }
    }

    /// Only Events about the watched Pods are kept, and each Pod's are
    /// found as a range of their own.
    #[test]
    fn events_of_other_pods_are_not_kept() {
        let pod = |name: &str| -> Pod {
            serde_json::from_value(serde_json::json!({"metadata": {"name": name}})).unwrap()
        };
        let event = |name: &str, about: &str| -> Event {
            serde_json::from_value(serde_json::json!({
                "metadata": {"name": name},
                "eventTime": "2026-12-03T10:00:00.000000Z",
                "regarding": {"kind": "Pod", "name": about},
            }))
            .unwrap()
        };
        let mut seen = Seen::default();
        for name in ["web-1", "web-10"] {
            let change = watcher::Event::Apply(pod(name));
            seen.apply(Change::Pod(Box::new(change)));
        }
        for (name, about) in [
            ("a", "web-1"),
            ("b", "web-10"),
            ("c", "other"),
            ("d", "web-1"),
        ] {
            let change = watcher::Event::Apply(event(name, about));
            seen.apply(Change::Event(Box::new(change)));
        }
        assert_eq!(seen.events.items.len(), 3, "the other Pod's is not kept");
        let names = |pod| -> Vec<String> {
            seen.events_of(pod, Some(0))
                .iter()
                .map(|e| e.name_any())
                .collect()
        };
        assert_eq!(names("web-1"), ["a", "d"]);
        assert_eq!(names("web-10"), ["b"]);
    }

    #[test]
    fn selectors_match_as_the_api_server_matches() {
        let selector = web_tier_not_canary();
        let labels = |pairs: &[(&str, &str)]| {
            pairs
                .iter()
                .map(|(k, v)| (k.to_string(), v.to_string()))
                .collect::<BTreeMap<_, _>>()
        };
        assert!(selects(
            &selector,
            &labels(&[("app", "web"), ("tier", "a")])
        ));
        assert!(!selects(
            &selector,
            &labels(&[("app", "web"), ("tier", "c")])
        ));
        assert!(!selects(
            &selector,
            &labels(&[("app", "web"), ("tier", "a"), ("canary", "1")])
        ));
        assert!(
            selects(&LabelSelector::default(), &labels(&[])),
            "an empty selector selects all"
        );
    }
}
