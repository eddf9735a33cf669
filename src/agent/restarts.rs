//! Before a kill: would kubelet start the container again? The Pod's
//! restart rules (`restart_rules`) as this node's kubelet reads them decide
//! whether the kill goes ahead, and which exit code the proxy reports for
//! the stopped container.

use std::path::PathBuf;

use k8s_openapi::api::core::v1::PodSpec;
use tracing::warn;

use crate::restart_rules::{self, Kubelet, Plan, Rewrite};

/// What the agent knows of the node's kubelet.
#[derive(Clone, Debug, Default)]
pub struct KubeletSettings {
    /// kubelet's configuration file, read before each kill for its feature
    /// gates (kubeadm rewrites it); `None` or unreadable: their defaults.
    pub config: Option<PathBuf>,
    /// kubelet reads container statuses through this crr-proxy with its
    /// reason rewrite on, so that it can be told another exit code.
    pub reads_rewrites: bool,
}

impl KubeletSettings {
    /// The restart rules as kubelet reads them now.
    pub(crate) fn kubelet(&self) -> Kubelet {
        let Some(path) = &self.config else {
            return Kubelet::default();
        };
        let parsed = std::fs::read_to_string(path)
            .map_err(|e| e.to_string())
            .and_then(|text| {
                serde_saphyr::from_str::<serde_json::Value>(&text).map_err(|e| e.to_string())
            });
        match parsed {
            Ok(config) => Kubelet::from_config(&config),
            Err(error) => {
                warn!(file = %path.display(), %error, "kubelet's configuration is not readable; taking its feature gates' defaults");
                Kubelet::default()
            }
        }
    }
}

/// Whether `name` of a Pod with `spec` may be stopped, and which exit code
/// to report for it once stopped; `Err` is the container's message.
/// Without the spec (it could not be read) the kill goes ahead as before.
pub(crate) fn decide(
    settings: &KubeletSettings,
    spec: Option<&PodSpec>,
    name: &str,
) -> Result<Option<Rewrite>, String> {
    let Some(spec) = spec else {
        return Ok(None);
    };
    let why = match restart_rules::plan(spec, name, settings.kubelet()) {
        Plan::Restarts => return Ok(None),
        Plan::Rewrite(rewrite) if settings.reads_rewrites => return Ok(Some(rewrite)),
        Plan::Rewrite(rewrite) => format!(
            "only some exit codes restart it (such as {}), and with --reason-rewrite off crr-proxy cannot report one",
            rewrite.reported
        ),
        Plan::StaysDown(why) => why.to_string(),
    };
    Err(format!(
        "not recreated: {name} would not be started again: {why}"
    ))
}

#[cfg(test)]
mod tests {
    use serde_json::json;

    use super::*;

    #[test]
    fn refusals_name_the_rule_and_a_gate_off_in_kubelets_file_counts() {
        let spec: PodSpec = serde_json::from_value(json!({"restartPolicy": "OnFailure",
            "containers": [{"name": "app"}, {"name": "web", "restartPolicy": "Always"}]}))
        .unwrap();
        let mut settings = KubeletSettings {
            config: None,
            reads_rewrites: true,
        };
        assert_eq!(
            decide(&settings, Some(&spec), "app").map(|r| r.map(|r| r.reported)),
            Ok(Some(143))
        );
        assert_eq!(decide(&settings, Some(&spec), "web"), Ok(None));
        assert_eq!(decide(&settings, None, "app"), Ok(None));
        settings.reads_rewrites = false;
        assert_eq!(
            decide(&settings, Some(&spec), "app"),
            Err("not recreated: app would not be started again: only some exit codes restart it (such as 143), and with --reason-rewrite off crr-proxy cannot report one".into())
        );

        let dir = std::env::temp_dir().join(format!("crr-proxy-gates-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let file = dir.join("config.yaml");
        std::fs::write(
            &file,
            "kind: KubeletConfiguration\nfeatureGates:\n  ContainerRestartRules: false\n",
        )
        .unwrap();
        let never: PodSpec = serde_json::from_value(json!({"restartPolicy": "Never",
            "containers": [{"name": "app", "restartPolicy": "Always"}]}))
        .unwrap();
        let settings = KubeletSettings {
            config: Some(file.clone()),
            reads_rewrites: true,
        };
        assert_eq!(
            decide(&settings, Some(&never), "app"),
            Err("not recreated: app would not be started again: the Pod's restartPolicy is Never, and this node's kubelet ignores the container's own restartPolicy (feature gate ContainerRestartRules is off)".into())
        );
        std::fs::write(&file, "kind: KubeletConfiguration\n").unwrap();
        assert_eq!(decide(&settings, Some(&never), "app"), Ok(None));
        std::fs::remove_dir_all(&dir).unwrap();
    }
}
