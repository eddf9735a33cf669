//! Whether kubelet starts a stopped container again, by its exit code: the
//! Pod's `restartPolicy`, the container's own `restartPolicy` and its
//! `restartPolicyRules` (KEP-5307), and the code the runtime reports.
//!
//! A CRR asks for a container to come back; crr-proxy stops it and kubelet
//! decides. So before a kill the agent asks [`plan`] whether any exit code
//! would bring the container back: if none would, the kill is refused with
//! the rule that keeps it down. If only some would, the proxy reports one of
//! them for the container it stopped (the real code stays in the status
//! message): a server that exits 0 on SIGTERM under `OnFailure` comes back.
//!
//! Pure: kubelet's decision on a Pod spec, and the choice of the code.

use std::fmt;

use k8s_openapi::api::core::v1::{Container, ContainerStatus, PodSpec, PodStatus};

/// The feature gate that makes kubelet read the container-level policy and
/// its rules (alpha in 1.34, beta and on by default since 1.35).
pub const RULES_GATE: &str = "ContainerRestartRules";

/// The feature gate that makes kubelet act on `RestartAllContainers` rules
/// (alpha and off in 1.35, beta and on by default since 1.36). Off, a code
/// that matches such a rule falls back to the container's own policy
/// (`ContainerShouldRestart`, pkg/api/v1/pod/util.go).
pub const RESTART_ALL_GATE: &str = "RestartAllContainersOnContainerExits";

/// The action of a `restartPolicyRules` entry that restarts the container.
const RESTART: &str = "Restart";
/// KEP-5532's action: kubelet kills every container of the Pod, without
/// their preStop hooks, and runs the init containers again. A code that
/// matches it is never one crr-proxy reports.
const RESTART_ALL_CONTAINERS: &str = "RestartAllContainers";

/// What kubelet of this node reads: with `rules` false (its feature gate
/// off), the Pod's policy alone, as before Kubernetes 1.34; with
/// `restart_all` false, `RestartAllContainers` rules are passed over.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Kubelet {
    pub rules: bool,
    pub restart_all: bool,
}

impl Default for Kubelet {
    fn default() -> Self {
        Self {
            rules: true,
            restart_all: true,
        }
    }
}

impl Kubelet {
    /// The gates as kubelet's configuration file sets them
    /// (`featureGates`). Unset, each is taken as on: its default since
    /// Kubernetes 1.35 and 1.36. On a kubelet 1.35 that leaves
    /// `RestartAllContainersOnContainerExits` unset (off), crr-proxy thus
    /// counts a `RestartAllContainers` code as one that restarts the whole
    /// Pod, which that kubelet does not do: it refuses more, never less.
    pub fn from_config(config: &serde_json::Value) -> Self {
        let gate = |name: &str| config["featureGates"][name].as_bool().unwrap_or(true);
        Self {
            rules: gate(RULES_GATE),
            restart_all: gate(RESTART_ALL_GATE),
        }
    }
}

/// The exit codes a process can report (0 to 255), as a set.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct ExitCodes([u64; 4]);

impl ExitCodes {
    pub fn contains(&self, code: i32) -> bool {
        u8::try_from(code).is_ok_and(|c| self.0[usize::from(c / 64)] & (1 << (c % 64)) != 0)
    }

    fn insert(&mut self, code: u8) {
        self.0[usize::from(code / 64)] |= 1 << (code % 64);
    }

    /// 64 hex digits, for a record.
    pub fn to_hex(&self) -> String {
        self.0.iter().map(|word| format!("{word:016x}")).collect()
    }

    pub fn from_hex(text: &str) -> Option<Self> {
        if text.len() != 64 || !text.is_ascii() {
            return None;
        }
        let mut words = [0u64; 4];
        for (i, word) in words.iter_mut().enumerate() {
            *word = u64::from_str_radix(&text[i * 16..(i + 1) * 16], 16).ok()?;
        }
        Some(Self(words))
    }
}

/// For a container crr-proxy stops: a code it exits with that is not in
/// `restarting` is reported as `reported`.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Rewrite {
    pub restarting: ExitCodes,
    pub reported: i32,
}

impl Rewrite {
    /// The code to report for `real`, when it differs.
    pub fn code_for(&self, real: i32) -> Option<i32> {
        (!self.restarting.contains(real) && real != self.reported).then_some(self.reported)
    }

    /// `<reported>:<64 hex digits>`, one word for a record.
    pub fn to_word(&self) -> String {
        format!("{}:{}", self.reported, self.restarting.to_hex())
    }

    pub fn from_word(word: &str) -> Option<Self> {
        let (reported, restarting) = word.split_once(':')?;
        Some(Self {
            reported: reported.parse().ok()?,
            restarting: ExitCodes::from_hex(restarting)?,
        })
    }
}

/// What stopping one container leads to.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Plan {
    /// kubelet starts it again whatever its exit code.
    Restarts,
    /// Only some codes restart it: report one of them when it exits with
    /// another.
    Rewrite(Rewrite),
    /// No code restarts it: it must not be stopped.
    StaysDown(StaysDown),
}

/// Why a stopped container would stay down; the text names the rule.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum StaysDown {
    PodNever,
    ContainerNever,
    /// Rules and a container policy that kubelet does not read (its gate
    /// is off), under the Pod's `Never`.
    PodNeverRulesIgnored,
    /// Every code that would restart it restarts the whole Pod.
    RestartsAll,
    /// An init container that is not a sidecar: it ran to completion.
    InitContainer,
    /// No container of that name in the Pod's spec.
    NotInSpec,
}

impl fmt::Display for StaysDown {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(match self {
            StaysDown::PodNever => "the Pod's restartPolicy is Never",
            StaysDown::ContainerNever => {
                "its restartPolicy is Never and none of its restartPolicyRules restarts it"
            }
            StaysDown::PodNeverRulesIgnored => {
                "the Pod's restartPolicy is Never, and this node's kubelet ignores the container's own restartPolicy (feature gate ContainerRestartRules is off)"
            }
            StaysDown::RestartsAll => {
                "every exit code that restarts it matches a RestartAllContainers rule, which would restart all of the Pod's containers (taken as on unless kubelet's configuration file sets the feature gate RestartAllContainersOnContainerExits off, as kubelet 1.35 has it by default)"
            }
            StaysDown::InitContainer => "it is an init container that is not a sidecar",
            StaysDown::NotInSpec => "it is not in the Pod's spec",
        })
    }
}

/// The codes crr-proxy prefers to report, in order: what a process killed
/// by SIGTERM or SIGKILL reports, then a plain failure; then any other.
const PREFERRED: [u8; 3] = [143, 137, 1];

/// A native sidecar: an init container with `restartPolicy: Always`, which
/// runs beside the others and is started again whenever it exits.
pub fn is_sidecar(container: &Container) -> bool {
    container.restart_policy.as_deref() == Some("Always")
}

/// The statuses of a Pod's containers, regular ones first, then the init
/// containers': native sidecars are reported with the init containers.
pub fn container_statuses(status: &PodStatus) -> impl Iterator<Item = &ContainerStatus> {
    let init = status.init_container_statuses.iter().flatten();
    status.container_statuses.iter().flatten().chain(init)
}

/// What stopping `name` of `pod` leads to, on a node whose kubelet reads
/// what `kubelet` says. A code that matches a `RestartAllContainers` rule
/// counts as one that keeps it down: kubelet would restart the whole Pod.
pub fn plan(pod: &PodSpec, name: &str, kubelet: Kubelet) -> Plan {
    let init = pod
        .init_containers
        .iter()
        .flatten()
        .find(|c| c.name == name);
    let (container, sidecar) = match init {
        // A sidecar (restartable init container) is started again whatever
        // its exit code or the Pod's policy (kuberuntime_container.go,
        // computeInitContainerActions); other init containers have ended.
        Some(init) if is_sidecar(init) => (init, true),
        Some(_) => return Plan::StaysDown(StaysDown::InitContainer),
        None => match pod.containers.iter().find(|c| c.name == name) {
            Some(container) => (container, false),
            None => return Plan::StaysDown(StaysDown::NotInSpec),
        },
    };
    let mut restarting = ExitCodes::default();
    let mut restarts_some = false;
    for code in 0..=u8::MAX {
        let restarts = sidecar || should_restart(container, pod, i32::from(code), kubelet);
        let all = kubelet.rules
            && kubelet.restart_all
            && restarts_all_containers(container, i32::from(code));
        restarts_some |= restarts || all;
        if restarts && !all {
            restarting.insert(code);
        }
    }
    if restarting == ExitCodes([u64::MAX; 4]) {
        return Plan::Restarts;
    }
    let reported = PREFERRED
        .into_iter()
        .chain(0..=u8::MAX)
        .find(|code| restarting.contains(i32::from(*code)));
    match reported {
        Some(code) => Plan::Rewrite(Rewrite {
            restarting,
            reported: i32::from(code),
        }),
        None => Plan::StaysDown(
            match (restarts_some, kubelet.rules, &container.restart_policy) {
                (true, _, _) => StaysDown::RestartsAll,
                (false, true, Some(_)) => StaysDown::ContainerNever,
                (false, false, Some(_)) => StaysDown::PodNeverRulesIgnored,
                (false, _, None) => StaysDown::PodNever,
            },
        ),
    }
}

/// kubelet's decision for an exited regular container:
/// `ShouldContainerBeRestarted` (pkg/kubelet/container/helpers.go), which
/// with the ContainerRestartRules gate on defers to `ContainerShouldRestart`
/// (pkg/api/v1/pod/util.go), and otherwise reads the Pod's policy alone.
pub fn should_restart(
    container: &Container,
    pod: &PodSpec,
    exit_code: i32,
    kubelet: Kubelet,
) -> bool {
    if kubelet.rules
        && let Some(policy) = container.restart_policy.as_deref()
    {
        // The first rule that matches decides if its action is Restart;
        // any other action falls through to the container's policy.
        if matching_rule(container, exit_code).is_some_and(|action| action == RESTART) {
            return true;
        }
        return match policy {
            "Always" => true,
            "OnFailure" => exit_code != 0,
            _ => false,
        };
    }
    match pod.restart_policy.as_deref() {
        Some("Never") => false,
        Some("OnFailure") => exit_code != 0,
        // Always, and the API server's default when unset.
        _ => true,
    }
}

/// Whether `exit_code` matches a rule whose action restarts every container
/// of the Pod (the first matching rule's action, as kubelet reads it).
fn restarts_all_containers(container: &Container, exit_code: i32) -> bool {
    container.restart_policy.is_some()
        && matching_rule(container, exit_code) == Some(RESTART_ALL_CONTAINERS)
}

/// The action of the first rule whose exit codes match
/// (`findMatchingContainerRestartRule`): `In` matches a listed code, `NotIn`
/// any other; a rule without exit codes or with another operator never does.
fn matching_rule(container: &Container, exit_code: i32) -> Option<&str> {
    container
        .restart_policy_rules
        .iter()
        .flatten()
        .find(|rule| {
            rule.exit_codes.as_ref().is_some_and(|codes| {
                let listed = codes.values.iter().flatten().any(|v| *v == exit_code);
                match codes.operator.as_str() {
                    "In" => listed,
                    "NotIn" => !listed,
                    _ => false,
                }
            })
        })
        .map(|rule| rule.action.as_str())
}

#[cfg(test)]
mod tests {
    use serde_json::json;

    use super::*;

    fn pod(spec: serde_json::Value) -> PodSpec {
        serde_json::from_value(spec).unwrap()
    }

    fn app(mut container: serde_json::Value) -> serde_json::Value {
        container["name"] = json!("app");
        container
    }

    const ON: Kubelet = Kubelet {
        rules: true,
        restart_all: true,
    };
    const OFF: Kubelet = Kubelet {
        rules: false,
        restart_all: true,
    };

    fn rewrite(plan: Plan) -> Rewrite {
        match plan {
            Plan::Rewrite(rewrite) => rewrite,
            other => panic!("not a rewrite: {other:?}"),
        }
    }

    #[test]
    fn the_pods_policy_alone() {
        let always = pod(json!({"containers": [app(json!({}))]}));
        assert_eq!(plan(&always, "app", ON), Plan::Restarts);
        let never = pod(json!({"restartPolicy": "Never", "containers": [app(json!({}))]}));
        assert_eq!(
            plan(&never, "app", ON),
            Plan::StaysDown(StaysDown::PodNever)
        );
        let on_failure = pod(json!({"restartPolicy": "OnFailure", "containers": [app(json!({}))]}));
        let rewrite = rewrite(plan(&on_failure, "app", ON));
        assert_eq!(rewrite.reported, 143);
        assert_eq!(rewrite.code_for(0), Some(143));
        assert_eq!(rewrite.code_for(143), None);
        assert_eq!(rewrite.code_for(2), None);
        assert_eq!(plan(&on_failure, "app", OFF), Plan::Rewrite(rewrite));
    }

    #[test]
    fn the_containers_policy_and_rules_win_when_kubelet_reads_them() {
        // Never, with a rule that restarts on 42 only.
        let spec = pod(json!({"restartPolicy": "Never", "containers": [app(json!({
            "restartPolicy": "Never",
            "restartPolicyRules": [{"action": "Restart", "exitCodes": {"operator": "In", "values": [42]}}]
        }))]}));
        let rewrite = rewrite(plan(&spec, "app", ON));
        assert_eq!(rewrite.reported, 42);
        assert_eq!(rewrite.code_for(0), Some(42));
        assert_eq!(rewrite.code_for(42), None);
        // The same Pod on a kubelet with the gate off: the Pod's Never.
        assert_eq!(
            plan(&spec, "app", OFF),
            Plan::StaysDown(StaysDown::PodNeverRulesIgnored)
        );
        // The container's Always overrides the Pod's Never.
        let always = pod(
            json!({"restartPolicy": "Never", "containers": [app(json!({"restartPolicy": "Always"}))]}),
        );
        assert_eq!(plan(&always, "app", ON), Plan::Restarts);
        // The container's Never overrides the Pod's Always.
        let never = pod(json!({"containers": [app(json!({"restartPolicy": "Never"}))]}));
        assert_eq!(
            plan(&never, "app", ON),
            Plan::StaysDown(StaysDown::ContainerNever)
        );
        assert_eq!(plan(&never, "app", OFF), Plan::Restarts);
    }

    #[test]
    fn the_first_matching_rule_decides_and_restart_all_codes_are_never_reported() {
        // OnFailure, but 143 and 137 restart every container (KEP-5532),
        // and NotIn [0, 1, 143, 137] restarts: 2 is the first that fits.
        let spec = pod(json!({"containers": [app(json!({
            "restartPolicy": "Never",
            "restartPolicyRules": [
                {"action": "RestartAllContainers", "exitCodes": {"operator": "In", "values": [143, 137]}},
                {"action": "Restart", "exitCodes": {"operator": "NotIn", "values": [0, 1, 143, 137]}}
            ]
        }))]}));
        let rewrite = rewrite(plan(&spec, "app", ON));
        assert_eq!(rewrite.reported, 2);
        assert!(!rewrite.restarting.contains(143));
        assert!(!rewrite.restarting.contains(1));
        assert!(rewrite.restarting.contains(255));
        // Only RestartAllContainers codes would bring it back: refused.
        let only_all = pod(json!({"containers": [app(json!({
            "restartPolicy": "Never",
            "restartPolicyRules": [{"action": "RestartAllContainers", "exitCodes": {"operator": "NotIn", "values": []}}]
        }))]}));
        assert_eq!(
            plan(&only_all, "app", ON),
            Plan::StaysDown(StaysDown::RestartsAll)
        );
        // OnFailure restarts 143, but a RestartAllContainers rule comes
        // first for it: a real 143 is reported as 137.
        let on_failure = pod(json!({"containers": [app(json!({
            "restartPolicy": "OnFailure",
            "restartPolicyRules": [{"action": "RestartAllContainers", "exitCodes": {"operator": "In", "values": [143]}}]
        }))]}));
        let rewrite = self::rewrite(plan(&on_failure, "app", ON));
        assert_eq!(rewrite.reported, 137);
        assert_eq!(rewrite.code_for(143), Some(137));
        assert_eq!(rewrite.code_for(0), Some(137));
        assert_eq!(rewrite.code_for(1), None);
    }

    #[test]
    fn with_restart_all_off_its_codes_fall_back_to_the_containers_policy() {
        // kubelet 1.35's default: RestartAllContainers rules are passed over.
        let gate_off = Kubelet {
            rules: true,
            restart_all: false,
        };
        let all_codes = |policy: &str| {
            pod(json!({"containers": [app(json!({
                "restartPolicy": policy,
                "restartPolicyRules": [{"action": "RestartAllContainers", "exitCodes": {"operator": "NotIn", "values": []}}]
            }))]}))
        };
        assert_eq!(
            plan(&all_codes("Always"), "app", ON),
            Plan::StaysDown(StaysDown::RestartsAll)
        );
        assert_eq!(plan(&all_codes("Always"), "app", gate_off), Plan::Restarts);
        assert_eq!(
            plan(&all_codes("Never"), "app", gate_off),
            Plan::StaysDown(StaysDown::ContainerNever)
        );
        // OnFailure: 143 restarts it alone again, and is reported as itself.
        let rewrite = rewrite(plan(&all_codes("OnFailure"), "app", gate_off));
        assert_eq!(rewrite.reported, 143);
        assert_eq!(rewrite.code_for(143), None);
        assert_eq!(rewrite.code_for(0), Some(143));
    }

    #[test]
    fn sidecars_always_come_back_and_other_init_containers_never() {
        let spec = pod(json!({"restartPolicy": "Never",
            "initContainers": [{"name": "proxy", "restartPolicy": "Always"}, {"name": "setup"}],
            "containers": [app(json!({}))]}));
        assert_eq!(plan(&spec, "proxy", ON), Plan::Restarts);
        // A sidecar whose clean exit restarts the whole Pod reports 143.
        let restarting_all = pod(json!({
            "initContainers": [{"name": "proxy", "restartPolicy": "Always", "restartPolicyRules": [
                {"action": "RestartAllContainers", "exitCodes": {"operator": "In", "values": [0]}}]}],
            "containers": [app(json!({}))]}));
        let rewrite = rewrite(plan(&restarting_all, "proxy", ON));
        assert_eq!(
            (rewrite.code_for(0), rewrite.code_for(143)),
            (Some(143), None)
        );
        assert_eq!(plan(&restarting_all, "proxy", OFF), Plan::Restarts);
        assert_eq!(
            plan(&spec, "setup", ON),
            Plan::StaysDown(StaysDown::InitContainer)
        );
        assert_eq!(
            plan(&spec, "nope", ON),
            Plan::StaysDown(StaysDown::NotInSpec)
        );
    }

    #[test]
    fn rewrites_and_gates_read_back() {
        let rewrite = Rewrite {
            restarting: {
                let mut codes = ExitCodes::default();
                for code in [1, 63, 64, 200, 255] {
                    codes.insert(code);
                }
                codes
            },
            reported: 1,
        };
        let word = rewrite.to_word();
        assert!(!word.contains(' '));
        assert_eq!(Rewrite::from_word(&word), Some(rewrite));
        assert_eq!(Rewrite::from_word("1:zz"), None);
        assert_eq!(Rewrite::from_word("x"), None);
        assert!(!rewrite.restarting.contains(-1) && !rewrite.restarting.contains(256));
        assert_eq!(Kubelet::from_config(&json!({})), ON);
        assert_eq!(
            Kubelet::from_config(&json!({"featureGates": {RULES_GATE: false}})),
            OFF
        );
        assert_eq!(
            Kubelet::from_config(&json!({"featureGates": {RESTART_ALL_GATE: false}})),
            Kubelet {
                rules: true,
                restart_all: false
            }
        );
    }
}
