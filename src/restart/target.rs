//! What `restart` is pointed at: a Pod (`web-0`, `pod/web-0`), a workload
//! (`deployment/web`, `sts/db`, `cloneset/shop`), spelled as kubectl
//! spells resources, or the Pods a label selector matches (`-l app=web`).

use std::fmt;

#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Target {
    Pod(String),
    Workload(Kind, String),
    /// The Pods of the namespace that a label selector matches, walked as
    /// a workload's are.
    Selector(String),
}

/// The workloads whose Pods `restart` walks through.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Kind {
    Deployment,
    StatefulSet,
    DaemonSet,
    ReplicaSet,
    /// OpenKruise's, when its CRD is installed.
    CloneSet,
    /// OpenKruise's Advanced StatefulSet (`statefulsets.apps.kruise.io`).
    AdvancedStatefulSet,
}

#[derive(Debug, thiserror::Error, PartialEq, Eq)]
pub enum TargetError {
    #[error(
        "unknown workload kind {0:?}: restart a pod, deployment, statefulset, daemonset, replicaset, cloneset or advancedstatefulset (asts)"
    )]
    UnknownKind(String),
    #[error("{0:?} names no object: give KIND/NAME or a Pod's name")]
    NoName(String),
}

/// How kubectl's discovery names a resource (group, version, kind, plural).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Resource {
    pub group: &'static str,
    pub version: &'static str,
    pub kind: &'static str,
    pub plural: &'static str,
}

impl Kind {
    fn parse(text: &str) -> Option<Self> {
        Some(match text.to_ascii_lowercase().as_str() {
            "deployment" | "deployments" | "deploy" | "deployment.apps" | "deployments.apps" => {
                Kind::Deployment
            }
            "statefulset" | "statefulsets" | "sts" | "statefulset.apps" | "statefulsets.apps" => {
                Kind::StatefulSet
            }
            "daemonset" | "daemonsets" | "ds" | "daemonset.apps" | "daemonsets.apps" => {
                Kind::DaemonSet
            }
            "replicaset" | "replicasets" | "rs" | "replicaset.apps" | "replicasets.apps" => {
                Kind::ReplicaSet
            }
            "cloneset"
            | "clonesets"
            | "clone"
            | "cloneset.apps.kruise.io"
            | "clonesets.apps.kruise.io" => Kind::CloneSet,
            "advancedstatefulset"
            | "advancedstatefulsets"
            | "asts"
            | "statefulset.apps.kruise.io"
            | "statefulsets.apps.kruise.io" => Kind::AdvancedStatefulSet,
            _ => return None,
        })
    }

    pub fn resource(self) -> Resource {
        let apps = |kind, plural| Resource {
            group: "apps",
            version: "v1",
            kind,
            plural,
        };
        match self {
            Kind::Deployment => apps("Deployment", "deployments"),
            Kind::StatefulSet => apps("StatefulSet", "statefulsets"),
            Kind::DaemonSet => apps("DaemonSet", "daemonsets"),
            Kind::ReplicaSet => apps("ReplicaSet", "replicasets"),
            Kind::CloneSet => Resource {
                group: "apps.kruise.io",
                version: "v1alpha1",
                kind: "CloneSet",
                plural: "clonesets",
            },
            Kind::AdvancedStatefulSet => Resource {
                group: "apps.kruise.io",
                version: "v1beta1",
                kind: "StatefulSet",
                plural: "statefulsets",
            },
        }
    }

    /// Only OpenKruise's kinds may be missing from a cluster.
    pub fn optional(self) -> bool {
        matches!(self, Kind::CloneSet | Kind::AdvancedStatefulSet)
    }

    /// Whether its Pods are owned through ReplicaSets.
    pub fn owns_through_replica_sets(self) -> bool {
        self == Kind::Deployment
    }
}

impl fmt::Display for Kind {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(match self {
            Kind::Deployment => "deployment",
            Kind::StatefulSet => "statefulset",
            Kind::DaemonSet => "daemonset",
            Kind::ReplicaSet => "replicaset",
            Kind::CloneSet => "cloneset",
            Kind::AdvancedStatefulSet => "statefulset.apps.kruise.io",
        })
    }
}

impl Target {
    pub fn parse(text: &str) -> Result<Self, TargetError> {
        let Some((kind, name)) = text.split_once('/') else {
            return if text.is_empty() {
                Err(TargetError::NoName(text.into()))
            } else {
                Ok(Target::Pod(text.into()))
            };
        };
        if name.is_empty() || name.contains('/') {
            return Err(TargetError::NoName(text.into()));
        }
        if matches!(kind.to_ascii_lowercase().as_str(), "pod" | "pods" | "po") {
            return Ok(Target::Pod(name.into()));
        }
        let kind = Kind::parse(kind).ok_or_else(|| TargetError::UnknownKind(kind.into()))?;
        Ok(Target::Workload(kind, name.into()))
    }
}

impl fmt::Display for Target {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Target::Pod(name) => write!(f, "pod/{name}"),
            Target::Workload(kind, name) => write!(f, "{kind}/{name}"),
            Target::Selector(selector) => write!(f, "pods -l {selector}"),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn targets_are_spelled_as_kubectl_spells_resources() {
        let workload = |kind, name: &str| Ok(Target::Workload(kind, name.into()));
        assert_eq!(Target::parse("web-0"), Ok(Target::Pod("web-0".into())));
        assert_eq!(Target::parse("po/web-0"), Ok(Target::Pod("web-0".into())));
        assert_eq!(
            Target::parse("deploy/web"),
            workload(Kind::Deployment, "web")
        );
        assert_eq!(
            Target::parse("Deployment.apps/web"),
            workload(Kind::Deployment, "web")
        );
        assert_eq!(Target::parse("sts/db"), workload(Kind::StatefulSet, "db"));
        assert_eq!(
            Target::parse("ds/agent"),
            workload(Kind::DaemonSet, "agent")
        );
        assert_eq!(
            Target::parse("rs/web-1"),
            workload(Kind::ReplicaSet, "web-1")
        );
        assert_eq!(
            Target::parse("clone/shop"),
            workload(Kind::CloneSet, "shop")
        );
        assert_eq!(
            Target::parse("statefulsets.apps.kruise.io/db"),
            workload(Kind::AdvancedStatefulSet, "db")
        );
        assert_eq!(
            Target::parse("job/backup"),
            Err(TargetError::UnknownKind("job".into()))
        );
        assert_eq!(
            Target::parse("deployment/"),
            Err(TargetError::NoName("deployment/".into()))
        );
        assert_eq!(
            Target::parse("deployment/a/b"),
            Err(TargetError::NoName("deployment/a/b".into()))
        );
    }
}
