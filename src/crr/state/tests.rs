//! Every branch of step D (container states), the kill loop (F–I) and the
//! picker, with their exact outputs.

use std::cell::RefCell;

use super::*;
use crate::crr::{ContainerRecreateRequestContainer, ContainerRecreateRequestContainerContext};

const SECOND: i64 = 1_000_000_000;
const NOW: i64 = 1_000 * SECOND;

fn spec(
    names: &[&str],
    strategy: ContainerRecreateRequestStrategy,
) -> ContainerRecreateRequestSpec {
    ContainerRecreateRequestSpec {
        pod_name: "web-0".into(),
        containers: names
            .iter()
            .map(|name| ContainerRecreateRequestContainer {
                name: (*name).into(),
                status_context: Some(ContainerRecreateRequestContainerContext {
                    container_id: format!("containerd://{name}-old"),
                    restart_count: 1,
                }),
                ..Default::default()
            })
            .collect(),
        strategy: Some(strategy),
        ..Default::default()
    }
}

fn running(name: &str, id: &str, restart_count: i32, started_secs_ago: i64) -> RuntimeContainer {
    RuntimeContainer {
        id: format!("containerd://{id}"),
        name: name.into(),
        restart_count,
        state: ContainerState::ContainerRunning,
        created_at: NOW - started_secs_ago * SECOND - SECOND,
        started_at: Some(NOW - started_secs_ago * SECOND),
    }
}

fn st(name: &str, phase: Phase, message: &str, is_killed: bool) -> ContainerRecreateState {
    ContainerRecreateState {
        name: name.into(),
        phase,
        message: message.into(),
        is_killed,
    }
}

fn sync(name: &str, id: &str, ready: bool) -> (String, SyncContainerStatus) {
    (
        name.into(),
        SyncContainerStatus {
            name: name.into(),
            ready,
            restart_count: 2,
            container_id: format!("containerd://{id}"),
        },
    )
}

fn one(
    strategy: ContainerRecreateRequestStrategy,
    previous: &[ContainerRecreateState],
    containers: Vec<RuntimeContainer>,
    synced: &[(String, SyncContainerStatus)],
) -> ContainerRecreateState {
    let states = current_states(
        &spec(&["app"], strategy),
        previous,
        &PodContainers::new(containers),
        &synced.iter().cloned().collect(),
        NOW,
    );
    assert_eq!(states.len(), 1);
    states.into_iter().next().unwrap()
}

// --- step D ---

#[test]
fn d1_terminal_states_are_kept_verbatim() {
    for prev in [
        st("app", Phase::Succeeded, "", true),
        st("app", Phase::Failed, "kill container error: boom", false),
    ] {
        let got = one(Default::default(), std::slice::from_ref(&prev), vec![], &[]);
        assert_eq!(got, prev);
    }
}

#[test]
fn d2_no_container_on_the_node_is_pending_with_a_message_and_keeps_is_killed() {
    assert_eq!(
        one(Default::default(), &[], vec![], &[]),
        st("app", Phase::Pending, NOT_FOUND_ON_NODE, false)
    );
    let prev = st("app", Phase::Recreating, "", true);
    assert_eq!(
        one(Default::default(), &[prev], vec![], &[]),
        st("app", Phase::Pending, NOT_FOUND_ON_NODE, true)
    );
}

#[test]
fn d3_an_exited_newest_container_is_recreating() {
    let mut exited = running("app", "app-old", 1, 10);
    exited.state = ContainerState::ContainerExited;
    assert_eq!(
        one(Default::default(), &[], vec![exited.clone()], &[]),
        st("app", Phase::Recreating, "", false)
    );
    // Even with forceRecreate: a stopped container is about to be restarted.
    let force = ContainerRecreateRequestStrategy {
        force_recreate: true,
        ..Default::default()
    };
    let prev = st("app", Phase::Pending, "", true);
    assert_eq!(
        one(force, &[prev], vec![exited], &[]),
        st("app", Phase::Recreating, "", true)
    );
}

#[test]
fn d4_force_recreate_is_pending_until_this_crr_killed_it() {
    let force = ContainerRecreateRequestStrategy {
        force_recreate: true,
        ..Default::default()
    };
    // Already a new container, but not killed by us: kill it anyway.
    let new = running("app", "app-new", 2, 100);
    assert_eq!(
        one(force.clone(), &[], vec![new.clone()], &[]),
        st("app", Phase::Pending, "", false)
    );
    let prev = st("app", Phase::Pending, "", false);
    assert_eq!(
        one(force.clone(), &[prev], vec![new.clone()], &[]),
        st("app", Phase::Pending, "", false)
    );
    // Killed by us: judged like any other (branch 5).
    let prev = st("app", Phase::Recreating, "", true);
    assert_eq!(
        one(force, &[prev], vec![new], &[]),
        st("app", Phase::Recreating, "", true)
    );
}

#[test]
fn d5_a_new_id_or_a_higher_restart_count_is_recreating() {
    let by_id = running("app", "app-new", 1, 5);
    assert_eq!(
        one(Default::default(), &[], vec![by_id], &[]),
        st("app", Phase::Recreating, "", false)
    );
    let by_count = running("app", "app-old", 2, 5);
    let prev = st("app", Phase::Recreating, "", true);
    assert_eq!(
        one(Default::default(), &[prev], vec![by_count], &[]),
        st("app", Phase::Recreating, "", true)
    );
}

#[test]
fn d5_succeeds_when_synced_ready_and_started_long_enough() {
    let strategy = ContainerRecreateRequestStrategy {
        min_started_seconds: 10,
        ..Default::default()
    };
    let prev = [st("app", Phase::Recreating, "", true)];
    let new = |secs| running("app", "app-new", 2, secs);
    let ok = [sync("app", "app-new", true)];
    assert_eq!(
        one(strategy.clone(), &prev, vec![new(11)], &ok),
        st("app", Phase::Succeeded, "", true)
    );
    // Strictly greater than minStartedSeconds.
    assert_eq!(
        one(strategy.clone(), &prev, vec![new(10)], &ok),
        st("app", Phase::Recreating, "", true)
    );
    // Not ready, another ID synced, or nothing synced: still recreating.
    let not_ready = [sync("app", "app-new", false)];
    assert_eq!(
        one(strategy.clone(), &prev, vec![new(60)], &not_ready),
        st("app", Phase::Recreating, "", true)
    );
    let stale = [sync("app", "app-old", true)];
    assert_eq!(
        one(strategy.clone(), &prev, vec![new(60)], &stale),
        st("app", Phase::Recreating, "", true)
    );
    assert_eq!(
        one(strategy, &prev, vec![new(60)], &[]),
        st("app", Phase::Recreating, "", true)
    );
    // Without minStartedSeconds, any running time will do.
    assert_eq!(
        one(
            Default::default(),
            &[],
            vec![running("app", "app-new", 2, 1)],
            &[sync("app", "app-new", true)]
        ),
        st("app", Phase::Succeeded, "", false)
    );
}

#[test]
fn d5_a_created_container_without_start_time_counts_as_started_long_ago() {
    let mut created = running("app", "app-new", 2, 0);
    created.state = ContainerState::ContainerCreated;
    created.started_at = None;
    let strategy = ContainerRecreateRequestStrategy {
        min_started_seconds: 30,
        ..Default::default()
    };
    assert_eq!(
        one(
            strategy,
            &[],
            vec![created],
            &[sync("app", "app-new", true)]
        ),
        st("app", Phase::Succeeded, "", false)
    );
}

#[test]
fn d6_the_original_container_still_running_is_pending() {
    let same = running("app", "app-old", 1, 500);
    assert_eq!(
        one(Default::default(), &[], vec![same.clone()], &[]),
        st("app", Phase::Pending, "", false)
    );
    let prev = st("app", Phase::Pending, "", true);
    assert_eq!(
        one(Default::default(), &[prev], vec![same], &[]),
        st("app", Phase::Pending, "", true)
    );
}

#[test]
fn d_looks_at_the_newest_container_of_each_name_and_keeps_spec_order() {
    let mut old = running("app", "app-old", 1, 500);
    old.state = ContainerState::ContainerExited;
    let new = running("app", "app-new", 2, 5);
    let side = running("side", "side-old", 1, 500);
    let states = current_states(
        &spec(&["side", "app"], Default::default()),
        &[],
        &PodContainers::new(vec![old, side, new]),
        &HashMap::new(),
        NOW,
    );
    assert_eq!(
        states,
        [
            st("side", Phase::Pending, "", false),
            st("app", Phase::Recreating, "", false)
        ]
    );
}

// --- steps F to I ---

struct Kills {
    results: RefCell<Vec<Result<(), NotKilled<String>>>>,
    calls: RefCell<Vec<String>>,
}

impl Kills {
    fn new(results: Vec<Result<(), NotKilled<String>>>) -> Self {
        Self {
            results: RefCell::new(results),
            calls: RefCell::new(vec![]),
        }
    }

    async fn run(
        &self,
        states: &[ContainerRecreateState],
        strategy: ContainerRecreateRequestStrategy,
        present: &[&str],
    ) -> PassEnd {
        let containers =
            PodContainers::new(present.iter().map(|n| running(n, n, 1, 100)).collect());
        kill_pass(states, &strategy, &containers, |name| {
            self.calls.borrow_mut().push(name);
            let result = self.results.borrow_mut().remove(0);
            async move { result }
        })
        .await
    }

    fn calls(&self) -> Vec<String> {
        self.calls.borrow().clone()
    }
}

fn ignore() -> ContainerRecreateRequestStrategy {
    ContainerRecreateRequestStrategy {
        failure_policy: Some(FailurePolicy::Ignore),
        ..Default::default()
    }
}

fn ordered() -> ContainerRecreateRequestStrategy {
    ContainerRecreateRequestStrategy {
        ordered_recreate: true,
        ..Default::default()
    }
}

#[tokio::test]
async fn f_kills_the_first_pending_container_and_stops_there() {
    let kills = Kills::new(vec![Ok(())]);
    let states = [
        st("a", Phase::Pending, "", false),
        st("b", Phase::Pending, "", false),
    ];
    let end = kills.run(&states, Default::default(), &["a", "b"]).await;
    assert_eq!(kills.calls(), ["a"]);
    assert_eq!(
        end,
        PassEnd::Patch(vec![
            st("a", Phase::Recreating, "", true),
            st("b", Phase::Pending, "", false)
        ])
    );
}

#[tokio::test]
async fn f_unordered_goes_past_recreating_containers_marking_them_killed() {
    let kills = Kills::new(vec![Ok(())]);
    let states = [
        st("a", Phase::Recreating, "", false),
        st("b", Phase::Pending, "", false),
    ];
    let end = kills.run(&states, Default::default(), &["a", "b"]).await;
    assert_eq!(kills.calls(), ["b"]);
    assert_eq!(
        end,
        PassEnd::Patch(vec![
            st("a", Phase::Recreating, "", true),
            st("b", Phase::Recreating, "", true)
        ])
    );
}

#[tokio::test]
async fn f_ordered_waits_for_a_recreating_container() {
    let kills = Kills::new(vec![]);
    let states = [
        st("a", Phase::Recreating, "", true),
        st("b", Phase::Pending, "", false),
    ];
    assert_eq!(
        kills.run(&states, ordered(), &["a", "b"]).await,
        PassEnd::Wait
    );
    assert!(kills.calls().is_empty());
    // Once `a` succeeded, `b` is killed.
    let kills = Kills::new(vec![Ok(())]);
    let states = [
        st("a", Phase::Succeeded, "", true),
        st("b", Phase::Pending, "", false),
    ];
    let end = kills.run(&states, ordered(), &["a", "b"]).await;
    assert_eq!(kills.calls(), ["b"]);
    assert_eq!(
        end,
        PassEnd::Patch(vec![
            st("a", Phase::Succeeded, "", true),
            st("b", Phase::Recreating, "", true)
        ])
    );
}

#[tokio::test]
async fn f_a_pending_container_missing_from_the_node_stops_the_pass() {
    let kills = Kills::new(vec![]);
    let states = [
        st("a", Phase::Pending, NOT_FOUND_ON_NODE, false),
        st("b", Phase::Pending, "", false),
    ];
    assert_eq!(
        kills.run(&states, Default::default(), &["b"]).await,
        PassEnd::Wait
    );
    assert!(kills.calls().is_empty());
}

#[tokio::test]
async fn f_a_failed_kill_fails_the_container() {
    // failurePolicy Fail: patch at once, the next pass completes.
    let kills = Kills::new(vec![Err(NotKilled::Failed("boom".into()))]);
    let states = [
        st("a", Phase::Pending, "", false),
        st("b", Phase::Pending, "", false),
    ];
    let end = kills.run(&states, Default::default(), &["a", "b"]).await;
    assert_eq!(
        end,
        PassEnd::Patch(vec![
            st("a", Phase::Failed, "kill container error: boom", false),
            st("b", Phase::Pending, "", false)
        ])
    );
    // failurePolicy Ignore: go on and kill the next one in the same pass.
    let kills = Kills::new(vec![Err(NotKilled::Failed("boom".into())), Ok(())]);
    let end = kills.run(&states, ignore(), &["a", "b"]).await;
    assert_eq!(kills.calls(), ["a", "b"]);
    assert_eq!(
        end,
        PassEnd::Patch(vec![
            st("a", Phase::Failed, "kill container error: boom", false),
            st("b", Phase::Recreating, "", true)
        ])
    );
}

#[tokio::test]
async fn f_a_failed_container_completes_the_crr_unless_ignored() {
    let states = [
        st("a", Phase::Failed, "x", false),
        st("b", Phase::Pending, "", false),
    ];
    let kills = Kills::new(vec![]);
    assert_eq!(
        kills.run(&states, Default::default(), &["a", "b"]).await,
        PassEnd::Complete
    );
    assert!(kills.calls().is_empty());
    let kills = Kills::new(vec![Ok(())]);
    let end = kills.run(&states, ignore(), &["a", "b"]).await;
    assert_eq!(kills.calls(), ["b"]);
    assert_eq!(
        end,
        PassEnd::Patch(vec![
            st("a", Phase::Failed, "x", false),
            st("b", Phase::Recreating, "", true)
        ])
    );
}

#[tokio::test]
async fn h_all_done_completes_and_i_requeues_for_min_started_seconds() {
    let kills = Kills::new(vec![]);
    let done = [
        st("a", Phase::Succeeded, "", true),
        st("b", Phase::Failed, "x", false),
    ];
    assert_eq!(
        kills.run(&done, ignore(), &["a", "b"]).await,
        PassEnd::Complete
    );

    let waiting = [st("a", Phase::Recreating, "", true)];
    assert_eq!(
        kills.run(&waiting, Default::default(), &["a"]).await,
        PassEnd::Wait
    );
    let strategy = ContainerRecreateRequestStrategy {
        min_started_seconds: 7,
        ..Default::default()
    };
    assert_eq!(
        kills.run(&waiting, strategy, &["a"]).await,
        PassEnd::Requeue(Duration::from_secs(7))
    );
    assert!(kills.calls().is_empty());
}

// --- pick ---

fn cand(name: &str, phase: Phase, created: i64, finished: bool) -> Candidate {
    Candidate {
        name: name.into(),
        phase,
        created,
        finished,
    }
}

#[test]
fn pick_prefers_recreating_then_pending_then_oldest_new() {
    let all = |_: &str| true;
    let crrs = [
        cand("new-old", Phase::New, 1, false),
        cand("pending", Phase::Pending, 5, false),
        cand("recreating", Phase::Recreating, 9, false),
        cand("new-young", Phase::New, 3, false),
    ];
    let got = pick(&crrs, all);
    assert_eq!(got.picked.as_deref(), Some("recreating"));
    assert_eq!(got.set_pending, ["new-old", "new-young"]);

    let got = pick(
        &[
            cand("b", Phase::New, 2, false),
            cand("a", Phase::New, 1, false),
        ],
        all,
    );
    assert_eq!(got.picked.as_deref(), Some("a"));
    assert_eq!(got.set_pending, ["b"]);
}

#[test]
fn pick_skips_finished_crrs() {
    let all = |_: &str| true;
    let crrs = [
        cand("done", Phase::Completed, 0, true),
        cand("next", Phase::Pending, 5, false),
    ];
    let got = pick(&crrs, all);
    assert_eq!(got.picked.as_deref(), Some("next"));
    assert!(got.set_pending.is_empty());
    assert_eq!(
        pick(&[cand("done", Phase::Recreating, 0, true)], all),
        Pick::default()
    );
}

#[test]
fn pick_stops_at_a_crr_whose_cache_lags_our_write() {
    let crrs = [
        cand("recreating", Phase::Recreating, 1, false),
        cand("lagging", Phase::New, 2, false),
        cand("later", Phase::New, 3, false),
    ];
    let got = pick(&crrs, |name| name != "lagging");
    assert_eq!(got.picked.as_deref(), Some("recreating"));
    assert!(got.set_pending.is_empty(), "{got:?}");
    assert_eq!(pick(&crrs, |name| name != "recreating"), Pick::default());
}

#[tokio::test]
async fn f_a_refused_kill_fails_the_container_with_its_own_message() {
    let why = "not recreated: app would not be started again: the Pod's restartPolicy is Never";
    let kills = Kills::new(vec![Err(NotKilled::Refused(why.into()))]);
    let states = [st("a", Phase::Pending, "", false)];
    let end = kills.run(&states, Default::default(), &["a"]).await;
    assert_eq!(
        end,
        PassEnd::Patch(vec![st("a", Phase::Failed, why, false)])
    );
}
