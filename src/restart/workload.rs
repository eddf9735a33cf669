//! `restart deployment/web -c app`: the Pods the workload owns, restarted
//! in waves. A wave starts only when the one before has completed (every
//! CRR, and its Pods Ready again with the containers restarted), and is as
//! big as `--max-unavailable` and every PodDisruptionBudget over those Pods
//! allow (`waves::next_wave`). Each CRR carries the run's id, so that the
//! same command with `--run-id` resumes: Pods the run restarted are skipped,
//! and its CRRs still under way are followed rather than made again.

use std::collections::{BTreeMap, HashSet};
use std::io::Write;
use std::time::{Duration, Instant};

use futures_util::StreamExt;
use k8s_openapi::api::apps::v1::ReplicaSet;
use k8s_openapi::api::core::v1::Pod;
use k8s_openapi::api::events::v1::Event;
use k8s_openapi::api::policy::v1::PodDisruptionBudget;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::LabelSelector;
use kube::ResourceExt;
use kube::api::{Api, ApiResource, DynamicObject, GroupVersionKind, ListParams};
use kube::runtime::watcher;
use serde_json::{Value, json};

use super::follow::{Outcome, Tracker};
use super::output::{Output, print};
use super::request::{self, CREATED_BY, TOOL};
use super::screen::Screen;
use super::seen::{Seen, active, budgets_over, controller, ready, restarts};
use super::target::{Kind, Target};
use super::waves::{Next, Progress, next_wave};
use super::{Change, Changes, DryRun, Ended, Options, Place, RestartError};
use crate::crr::{ContainerRecreateRequest, Phase};

/// The run a CRR belongs to.
pub const RUN: &str = "crr-proxy.io/run";
/// The UID of the workload whose Pod the CRR restarts.
pub const WORKLOAD_UID: &str = "crr-proxy.io/workload-uid";

/// The workload, as found, or the Pods a selector matches.
struct Workload {
    target: String,
    /// The workload's UID; for a selector, one made of the selector, so
    /// that a resumed run knows its CRRs.
    uid: String,
    /// Its label selector, as a query.
    selector: String,
    /// The UIDs a Pod's controller reference may name: the workload's, and
    /// a Deployment's ReplicaSets'; `None`: any Pod the selector matches.
    owners: Option<HashSet<String>>,
}

pub async fn run(
    options: &Options,
    at: &Place,
    target: &Target,
    out: &mut (dyn Write + Send),
    progress: &mut (dyn Write + Send),
) -> Result<Ended, RestartError> {
    if !options.wait {
        return Err(RestartError::Usage(
            "a workload is restarted in waves, each waiting for the one before: --no-wait applies to one Pod only",
        ));
    }
    let workload = match target {
        Target::Workload(kind, name) => find(at, *kind, name).await?,
        Target::Selector(selector) => selected(at, selector).await?,
        Target::Pod(_) => return Err(RestartError::Usage("one Pod is not restarted in waves")),
    };
    let run = options
        .waves
        .run_id
        .clone()
        .unwrap_or_else(|| request::suffix(request::seed(), 8));
    let mut changes = Changes::new();
    let in_namespace = || watcher::Config::default();
    changes.add(
        at.crrs
            .watch_in(
                &at.namespace,
                in_namespace().labels(&format!("{RUN}={run}")),
            )
            .boxed(),
        |e| Change::Crr(Box::new(e)),
    );
    changes.add(
        watcher(
            Api::<Pod>::namespaced(at.client.clone(), &at.namespace),
            in_namespace().labels(&workload.selector),
        )
        .boxed(),
        |e| Change::Pod(Box::new(e)),
    );
    changes.add(
        watcher(
            Api::<PodDisruptionBudget>::namespaced(at.client.clone(), &at.namespace),
            in_namespace(),
        )
        .boxed(),
        |e| Change::Budget(Box::new(e)),
    );
    changes.add(
        watcher(
            Api::<Event>::namespaced(at.client.clone(), &at.namespace),
            in_namespace().fields("regarding.kind=Pod"),
        )
        .boxed(),
        |e| Change::Event(Box::new(e)),
    );
    let mut seen = Seen::default();
    // Every watch has listed: what the channel holds now is the cluster.
    changes.listed().await?;
    let mut listed = Vec::new();
    while let Ok(change) = changes.rx.try_recv() {
        listed.push(change);
    }
    // The Pods first: only Events about them are kept. (A stable sort:
    // each watch's own events stay in order.)
    listed.sort_by_key(|change| !matches!(change, Change::Pod(_)));
    for change in listed {
        seen.apply(change);
    }
    for crr in seen.crrs.items.values() {
        if crr.labels().get(WORKLOAD_UID) != Some(&workload.uid) {
            return Err(RestartError::OtherRun {
                run,
                target: workload.target,
            });
        }
    }
    let mut walk = Walk::plan(options, at, &workload, &run, &seen)?;
    if options.dry_run != DryRun::None {
        return walk.dry_run(at, &seen, out, progress).await;
    }
    walk.say(progress, &walk.opening())?;
    let interrupted = tokio::signal::ctrl_c();
    tokio::pin!(interrupted);
    let mut tick = tokio::time::interval(Duration::from_secs(1));
    loop {
        walk.step(at, &seen, progress).await?;
        if let Some(ended) = walk.ended(progress)? {
            if let Some(output) = options.output {
                let items: Vec<Value> = seen
                    .crrs
                    .items
                    .values()
                    .map(serde_json::to_value)
                    .collect::<Result<_, _>>()
                    .map_err(|e| RestartError::Render(Box::new(e)))?;
                print(
                    out,
                    output,
                    &json!({"apiVersion": "v1", "kind": "List", "items": items}),
                )?;
            }
            return Ok(ended);
        }
        tokio::select! {
            change = changes.rx.recv() => match change {
                Some(change) => seen.apply(change),
                None => return Err(RestartError::Unwatchable),
            },
            _ = tick.tick() => walk.refresh(progress)?,
            _ = &mut interrupted => {
                let flying = walk.in_flight();
                walk.screen.close();
                walk.say(progress, &format!(
                    "stopped following; {flying} restart(s) under way go on. Resume: the same command with --run-id {run}"
                ))?;
                return Ok(Ended::Interrupted);
            }
        }
    }
}

/// The workload named, its selector and who may own its Pods.
async fn find(at: &Place, kind: Kind, name: &str) -> Result<Workload, RestartError> {
    let resource = kind.resource();
    let gvk = GroupVersionKind::gvk(resource.group, resource.version, resource.kind);
    if kind.optional() {
        let served = at
            .client
            .list_api_group_resources(&format!("{}/{}", resource.group, resource.version))
            .await
            .map(|list| list.resources.iter().any(|r| r.name == resource.plural))
            .unwrap_or(false);
        if !served {
            return Err(RestartError::NotServed(kind));
        }
    }
    let api: Api<DynamicObject> = Api::namespaced_with(
        at.client.clone(),
        &at.namespace,
        &ApiResource::from_gvk_with_plural(&gvk, resource.plural),
    );
    let object = api
        .get_opt(name)
        .await?
        .ok_or_else(|| RestartError::NoWorkload {
            kind,
            name: name.to_owned(),
            namespace: at.namespace.clone(),
        })?;
    let uid = object.uid().unwrap_or_default();
    let selector: LabelSelector = object
        .data
        .pointer("/spec/selector")
        .cloned()
        .and_then(|s| serde_json::from_value(s).ok())
        .unwrap_or_default();
    let selector = selector_query(&selector)?;
    let mut owners = HashSet::from([uid.clone()]);
    if kind.owns_through_replica_sets() {
        let sets: Api<ReplicaSet> = Api::namespaced(at.client.clone(), &at.namespace);
        for set in sets.list(&ListParams::default().labels(&selector)).await? {
            if controller(set.owner_references()) == Some(uid.as_str()) {
                owners.extend(set.uid());
            }
        }
    }
    Ok(Workload {
        target: format!("{kind}/{name}"),
        uid,
        selector,
        owners: Some(owners),
    })
}

/// The Pods `selector` matches, as one set to walk. The API server parses
/// the selector: a list of one Pod has it refuse a bad one with its own
/// message at once (a watch would only retry). An empty one would be every
/// Pod of the namespace, and is refused here.
async fn selected(at: &Place, selector: &str) -> Result<Workload, RestartError> {
    if selector.trim().is_empty() {
        return Err(RestartError::Usage(
            "-l needs a selector (-l app=web): an empty one matches every Pod of the namespace",
        ));
    }
    Api::<Pod>::namespaced(at.client.clone(), &at.namespace)
        .list(&ListParams::default().labels(selector).limit(1))
        .await?;
    Ok(Workload {
        target: Target::Selector(selector.to_owned()).to_string(),
        uid: selector_uid(selector),
        selector: selector.to_owned(),
        owners: None,
    })
}

/// A label value that stands for `selector` in the run's CRRs (FNV-1a,
/// 64 bits): the same selector resumes the same run.
fn selector_uid(selector: &str) -> String {
    let hash = selector.bytes().fold(0xcbf2_9ce4_8422_2325_u64, |h, b| {
        (h ^ u64::from(b)).wrapping_mul(0x0100_0000_01b3)
    });
    format!("selector-{hash:016x}")
}

/// A LabelSelector as `?labelSelector=` spells it (kube's `Selector`); an
/// operator the API does not know is refused, not guessed at.
fn selector_query(selector: &LabelSelector) -> Result<String, RestartError> {
    kube::core::Selector::try_from(selector.clone())
        .map(|s| s.to_string())
        .map_err(|error| RestartError::Selector(error.0))
}

/// The order Pods are restarted in: by name, an ordinal as a number
/// (`web-2` before `web-10`).
fn in_order(name: &str) -> (String, u64) {
    match name
        .rsplit_once('-')
        .map(|(base, n)| (base, n.parse::<u64>()))
    {
        Some((base, Ok(ordinal))) => (base.to_owned(), ordinal),
        _ => (name.to_owned(), 0),
    }
}

/// A Pod's restart under way.
struct Flight {
    crr: String,
    tracker: Tracker,
    /// The containers' restart counts before, when this run created it.
    before: Option<BTreeMap<String, i32>>,
    since: Option<i64>,
    started: Instant,
    /// Whether the watch has shown the CRR yet.
    seen: bool,
    /// Once it has succeeded: the containers it recreated.
    recreated: Option<Vec<String>>,
}

enum Step {
    Left,
    Flying(Box<Flight>),
    Restarted,
    Skipped(&'static str),
    Failed(String),
}

/// One run through a workload.
struct Walk<'o> {
    options: &'o Options,
    run: String,
    target: String,
    owners: Option<HashSet<String>>,
    workload_uid: String,
    api_version: String,
    /// The containers restarted, as named or as the Pods default them.
    containers: String,
    /// The Pods, in the order they are restarted, and where each stands.
    pods: Vec<(String, Step)>,
    max: usize,
    started: Instant,
    wave_started: Instant,
    progress: Progress,
    /// The last waiting message said (said once, until it changes).
    waiting: Option<String>,
    screen: Screen,
    /// A restart failed: no wave starts after this one.
    stop: bool,
}

impl<'o> Walk<'o> {
    /// The Pods the workload owns now, each checked before anything is
    /// created, and where this run (when resumed) left each.
    fn plan(
        options: &'o Options,
        at: &Place,
        workload: &Workload,
        run: &str,
        seen: &Seen,
    ) -> Result<Self, RestartError> {
        let target = workload.target.clone();
        let mut names: Vec<&Pod> = seen
            .owned_by(workload.owners.as_ref())
            .filter(|p| active(p))
            .collect();
        names.sort_by_key(|p| in_order(&p.name_any()));
        if names.is_empty() {
            return Err(RestartError::NoPods(target));
        }
        let api_version = at.crrs.version().api_resource().api_version;
        let mut pods = Vec::new();
        let mut containers: Vec<String> = Vec::new();
        for pod in names {
            let name = pod.name_any();
            let mut request = options.request.clone();
            request.pod = name.clone();
            // Bad input (a container the Pods do not have) ends the run
            // before anything is created.
            request.crr(pod, &api_version, "check")?;
            for container in request.containers_for(pod)? {
                if !containers.contains(&container) {
                    containers.push(container);
                }
            }
            let step = resumed(seen, &name);
            pods.push((name, step));
        }
        let total = pods.len();
        let done = pods
            .iter()
            .filter(|(_, s)| matches!(s, Step::Skipped(_)))
            .count();
        let now = Instant::now();
        Ok(Self {
            options,
            run: run.to_owned(),
            target,
            owners: workload.owners.clone(),
            workload_uid: workload.uid.clone(),
            api_version,
            containers: containers.join(","),
            max: options.waves.max_unavailable.unwrap_or_default().of(total),
            pods,
            started: now,
            wave_started: now,
            progress: Progress {
                total,
                done,
                ..Progress::default()
            },
            waiting: None,
            screen: Screen::new(options.live),
            stop: false,
        })
    }

    fn opening(&self) -> String {
        let skipped = self.progress.done;
        let mut line = format!(
            "run {}: restarting {} in {} Pods of {}, at most {} at a time",
            self.run, self.containers, self.progress.total, self.target, self.max
        );
        if skipped > 0 {
            line.push_str(&format!(" ({skipped} restarted by this run already)"));
        }
        line
    }

    fn in_flight(&self) -> usize {
        self.pods
            .iter()
            .filter(|(_, s)| matches!(s, Step::Flying(_)))
            .count()
    }

    /// Moves the restarts under way on, and starts the next wave when the
    /// last one is over.
    async fn step(
        &mut self,
        at: &Place,
        seen: &Seen,
        out: &mut (dyn Write + Send),
    ) -> Result<(), RestartError> {
        let mut lines = Vec::new();
        let mut finished = 0;
        for (name, step) in &mut self.pods {
            let Step::Flying(flight) = step else {
                continue;
            };
            let Some(next) = land(name, flight, seen) else {
                continue;
            };
            finished += 1;
            let took = flight.started.elapsed().as_secs_f64();
            match &next {
                Step::Restarted => {
                    let summary: Vec<String> = flight
                        .tracker
                        .summary()
                        .into_iter()
                        .filter(|l| !l.starts_with("steps: "))
                        .collect();
                    lines.push(format!(
                        "{name}: restarted in {took:.1}s: {}",
                        summary.join("; ")
                    ));
                }
                Step::Failed(why) => lines.push(format!("{name}: FAILED after {took:.1}s: {why}")),
                Step::Skipped(why) => lines.push(format!("{name}: skipped, {why}")),
                _ => {}
            }
            *step = next;
        }
        if finished > 0 {
            self.count();
        }
        for line in lines {
            self.say(out, &line)?;
        }
        if self.in_flight() > 0 || self.stop {
            return Ok(());
        }
        if self.progress.wave > 0 && finished > 0 {
            self.progress.waves.push(self.wave_started.elapsed());
        }
        if self.progress.failed > 0 && !self.options.waves.continue_on_failure {
            self.stop = true;
            return Ok(());
        }
        // Pods gone since the plan have nothing to restart.
        for (name, step) in &mut self.pods {
            if matches!(step, Step::Left) && !seen.pods.items.get(name).is_some_and(active) {
                *step = Step::Skipped("the Pod is gone");
            }
        }
        self.count();
        let left: Vec<usize> = (0..self.pods.len())
            .filter(|&i| matches!(self.pods[i].1, Step::Left))
            .collect();
        if left.is_empty() {
            return Ok(());
        }
        let owned: Vec<&Pod> = seen.owned_by(self.owners.as_ref()).collect();
        let unready = owned.iter().filter(|p| !ready(p)).count();
        let cached = budgets_over(seen.budgets.items.values(), &owned);
        let mut next = next_wave(self.max, unready, &cached, left.len());
        if let Next::Wave(_) = next {
            // The watch's copy of the budgets may be behind: they are read
            // afresh just before the wave's CRRs are created.
            let api = Api::<PodDisruptionBudget>::namespaced(at.client.clone(), &at.namespace);
            next = match api.list(&ListParams::default()).await {
                Ok(fresh) => {
                    let budgets = budgets_over(fresh.items.iter(), &owned);
                    next_wave(self.max, unready, &budgets, left.len())
                }
                Err(error) => Next::Wait(format!(
                    "waiting: cannot read the PodDisruptionBudgets: {error}"
                )),
            };
        }
        let size = match next {
            Next::Wave(size) => size,
            Next::Wait(why) => {
                if self.waiting.as_ref() != Some(&why) {
                    self.say(out, &why)?;
                    self.waiting = Some(why);
                }
                return Ok(());
            }
        };
        self.waiting = None;
        self.progress.wave += 1;
        self.progress.wave_size = size;
        self.wave_started = Instant::now();
        let wave: Vec<usize> = left.into_iter().take(size).collect();
        let names: Vec<&str> = wave.iter().map(|&i| self.pods[i].0.as_str()).collect();
        let line = format!("wave {}: {}", self.progress.wave, names.join(", "));
        self.say(out, &line)?;
        for i in wave {
            let name = self.pods[i].0.clone();
            let step = match self.launch(at, seen, &name).await {
                Ok(flight) => Step::Flying(Box::new(flight)),
                Err(why) => {
                    self.say(out, &format!("{name}: FAILED: {why}"))?;
                    Step::Failed(why)
                }
            };
            self.pods[i].1 = step;
        }
        self.count();
        Ok(())
    }

    /// Creates the CRR for `pod`, labelled with the run.
    async fn launch(&self, at: &Place, seen: &Seen, pod: &str) -> Result<Flight, String> {
        let Some(object) = seen.pods.items.get(pod) else {
            return Err("the Pod is gone".into());
        };
        let body = self.body(object, pod).map_err(|e| e.to_string())?;
        let created = at
            .crrs
            .create(&at.namespace, &body, false)
            .await
            .map_err(|e| match e {
                kube::Error::Api(status) => status.message,
                other => other.to_string(),
            })?;
        Ok(Flight {
            crr: created.name_any(),
            tracker: Tracker::default(),
            before: Some(restarts(object)),
            since: created.creation_timestamp().map(|t| t.0.as_second()),
            started: Instant::now(),
            seen: false,
            recreated: None,
        })
    }

    fn body(&self, pod: &Pod, name: &str) -> Result<Value, RestartError> {
        let mut request = self.options.request.clone();
        request.pod = name.to_owned();
        let crr_name = request.name(request::seed());
        let mut body = request.crr(pod, &self.api_version, &crr_name)?;
        body["metadata"]["labels"] = json!({
            CREATED_BY: TOOL, RUN: self.run, WORKLOAD_UID: self.workload_uid,
        });
        Ok(body)
    }

    /// Counts where the Pods stand.
    fn count(&mut self) {
        self.progress.done = self
            .pods
            .iter()
            .filter(|(_, s)| !matches!(s, Step::Left | Step::Flying(_)))
            .count();
        self.progress.failed = self
            .pods
            .iter()
            .filter(|(_, s)| matches!(s, Step::Failed(_)))
            .count();
    }

    /// How the run ended, once it has.
    fn ended(&mut self, out: &mut (dyn Write + Send)) -> Result<Option<Ended>, RestartError> {
        let over = self.in_flight() == 0
            && (self.stop || self.pods.iter().all(|(_, s)| !matches!(s, Step::Left)));
        if !over {
            return Ok(None);
        }
        self.screen.close();
        let took = self.started.elapsed().as_secs_f64();
        let restarted = self
            .pods
            .iter()
            .filter(|(_, s)| matches!(s, Step::Restarted))
            .count();
        let skipped = self
            .pods
            .iter()
            .filter(|(_, s)| matches!(s, Step::Skipped(_)))
            .count();
        let left = self
            .pods
            .iter()
            .filter(|(_, s)| matches!(s, Step::Left))
            .count();
        let failed: Vec<String> = self
            .pods
            .iter()
            .filter_map(|(n, s)| match s {
                Step::Failed(why) => Some(format!("{n}: {why}")),
                _ => None,
            })
            .collect();
        let mut line = format!(
            "{}: {restarted} restarted, {skipped} skipped, {} failed",
            self.target,
            failed.len()
        );
        if left > 0 {
            line.push_str(&format!(", {left} not restarted"));
        }
        line.push_str(&format!(" in {took:.1}s (run {})", self.run));
        self.say(out, &line)?;
        if failed.is_empty() {
            return Ok(Some(Ended::Done));
        }
        if left > 0 {
            self.say(
                out,
                &format!(
                    "stopped at the first failed restart. Resume: the same command with --run-id {} (or --continue-on-failure)",
                    self.run
                ),
            )?;
        }
        Ok(Some(Ended::Failed(failed.join("; "))))
    }

    /// Prints `line` to stay, and the progress after it.
    fn say(&mut self, out: &mut (dyn Write + Send), line: &str) -> Result<(), RestartError> {
        let status = self.progress.line(self.started.elapsed());
        self.screen
            .say(out, line, &status)
            .map_err(RestartError::Output)
    }

    /// Redraws the live status line (the elapsed time moves on).
    fn refresh(&mut self, out: &mut (dyn Write + Send)) -> Result<(), RestartError> {
        let status = self.progress.line(self.started.elapsed());
        self.screen
            .refresh(out, &status)
            .map_err(RestartError::Output)
    }

    /// `--dry-run`: the CRRs the run would create, judged by the client or
    /// by the API server; nothing is stored.
    async fn dry_run(
        &self,
        at: &Place,
        seen: &Seen,
        out: &mut (dyn Write + Send),
        progress: &mut (dyn Write + Send),
    ) -> Result<Ended, RestartError> {
        let mut items = Vec::new();
        for (name, step) in &self.pods {
            if !matches!(step, Step::Left) {
                continue;
            }
            let Some(pod) = seen.pods.items.get(name) else {
                continue;
            };
            let mut body = self.body(pod, name)?;
            body["metadata"]["namespace"] = json!(at.namespace);
            if self.options.dry_run == DryRun::Server {
                let created = at.crrs.create(&at.namespace, &body, true).await?;
                writeln!(
                    progress,
                    "containerrecreaterequest/{} created in {} (server dry run)",
                    created.name_any(),
                    at.namespace
                )
                .map_err(RestartError::Output)?;
            }
            items.push(body);
        }
        let how = match self.options.dry_run {
            DryRun::Server => "server dry run",
            _ => "client dry run",
        };
        writeln!(
            progress,
            "{} containerrecreaterequests would be created in {} for {}, in waves of at most {} ({how})",
            items.len(),
            at.namespace,
            self.target,
            self.max
        )
        .map_err(RestartError::Output)?;
        if self.options.dry_run == DryRun::Client || self.options.output.is_some() {
            let output = self.options.output.unwrap_or(Output::Yaml);
            print(
                out,
                output,
                &json!({"apiVersion": "v1", "kind": "List", "items": items}),
            )?;
        }
        Ok(Ended::Done)
    }
}

/// Where a resumed run left `pod`: restarted (skip it), under way (follow
/// it), or not yet or failed (restart it).
fn resumed(seen: &Seen, pod: &str) -> Step {
    let last = seen
        .crrs
        .items
        .values()
        .filter(|c| c.spec.pod_name == pod)
        .max_by_key(|c| c.creation_timestamp().map(|t| t.0));
    let Some(crr) = last else {
        return Step::Left;
    };
    let status = crr.status.as_ref();
    let completed = status.is_some_and(|s| s.phase == Phase::Completed);
    if !completed {
        return Step::Flying(Box::new(Flight {
            crr: crr.name_any(),
            tracker: Tracker::default(),
            before: None,
            since: crr.creation_timestamp().map(|t| t.0.as_second()),
            started: Instant::now(),
            seen: true,
            recreated: None,
        }));
    }
    // Judged as when followed: with the Pod's Events (a failed preStop
    // hook is a failed restart, to be tried again).
    let mut tracker = Tracker::default();
    let since = crr.creation_timestamp().map(|t| t.0.as_second());
    tracker.observe(
        Duration::ZERO,
        crr,
        seen.pods.items.get(pod),
        &seen.events_of(pod, since),
    );
    match tracker.outcome(crr) {
        Some(Outcome::Succeeded) => Step::Skipped("restarted by this run already"),
        _ => Step::Left,
    }
}

/// Where `flight` stands now: `None` while under way.
fn land(pod: &str, flight: &mut Flight, seen: &Seen) -> Option<Step> {
    match seen.crrs.items.get(&flight.crr) {
        Some(crr) => {
            flight.seen = true;
            if flight.before.is_none() {
                // A resumed run never read the Pod before: the counts the
                // CRR was accepted with are the "before".
                flight.before = accepted_counts(crr);
            }
            let object = seen.pods.items.get(pod);
            let events = seen.events_of(pod, flight.since);
            flight
                .tracker
                .observe(flight.started.elapsed(), crr, object, &events);
            match flight.tracker.outcome(crr)? {
                Outcome::Failed(why) => return Some(Step::Failed(why)),
                Outcome::Succeeded => {
                    flight.recreated = Some(
                        crr.status
                            .iter()
                            .flat_map(|s| &s.container_recreate_states)
                            .filter(|state| state.phase == Phase::Succeeded)
                            .map(|state| state.name.clone())
                            .collect(),
                    );
                }
            }
        }
        // Not shown by the watch yet.
        None if !flight.seen => return None,
        // Deleted after it succeeded (a short --ttl): the Pod still has
        // to be Ready again.
        None if flight.recreated.is_some() => {}
        None => {
            return Some(Step::Failed(format!(
                "containerrecreaterequest {} was deleted",
                flight.crr
            )));
        }
    }
    let Some(object) = seen.pods.items.get(pod) else {
        return Some(Step::Skipped("the Pod is gone"));
    };
    // Ready again, and Ready as the restarted containers: a Ready read from
    // before the kill does not count.
    let now = restarts(object);
    let restarted = match (&flight.before, &flight.recreated) {
        (Some(before), Some(recreated)) => recreated
            .iter()
            .all(|name| now.get(name) > before.get(name)),
        // Nothing to compare with: a Ready Pod proves nothing.
        _ => false,
    };
    (ready(object) && restarted).then_some(Step::Restarted)
}

/// The restart counts `crr` was accepted with (its containers'
/// `statusContext`, which the webhook or the agent fills in), if it has
/// them all.
fn accepted_counts(crr: &ContainerRecreateRequest) -> Option<BTreeMap<String, i32>> {
    crr.spec
        .containers
        .iter()
        .map(|c| Some((c.name.clone(), c.status_context.as_ref()?.restart_count)))
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn selectors_become_queries() {
        use k8s_openapi::apimachinery::pkg::apis::meta::v1::LabelSelectorRequirement;
        let selector = super::super::seen::tests::web_tier_not_canary();
        assert_eq!(
            selector_query(&selector).unwrap(),
            "app=web,tier in (a,b),!canary"
        );
        let expression = |operator: &str, values: Option<&[&str]>| LabelSelector {
            match_expressions: Some(vec![LabelSelectorRequirement {
                key: "k".into(),
                operator: operator.into(),
                values: values.map(|v| v.iter().map(|s| s.to_string()).collect()),
            }]),
            ..Default::default()
        };
        for (operator, values, query) in [
            ("In", Some(&["b", "a"][..]), "k in (a,b)"),
            ("NotIn", Some(&["a"][..]), "k notin (a)"),
            ("Exists", None, "k"),
            ("DoesNotExist", None, "!k"),
        ] {
            assert_eq!(
                selector_query(&expression(operator, values)).unwrap(),
                query
            );
        }
        // Once read as `!k`: a selector that matched what it should not.
        for (operator, values) in [("Gt", Some(&["1"][..])), ("exists", None), ("In", None)] {
            assert!(
                selector_query(&expression(operator, values)).is_err(),
                "{operator} {values:?}"
            );
        }
    }

    /// A resumed run follows a CRR it did not create: the Pod is Ready and
    /// the CRR succeeded, but the Pod still shows the restart count the CRR
    /// was accepted with, so the restart has not landed yet.
    #[test]
    fn a_resumed_flight_lands_only_once_the_counts_have_moved() {
        let crr: ContainerRecreateRequest = serde_json::from_value(serde_json::json!({
            "apiVersion": "apps.kruise.io/v1alpha1",
            "kind": "ContainerRecreateRequest",
            "metadata": {"name": "web-0-restart", "namespace": "default"},
            "spec": {"podName": "web-0", "containers": [
                {"name": "app", "statusContext": {"containerID": "containerd://a", "restartCount": 2}}
            ]},
            "status": {"phase": "Completed", "completionTime": "2026-12-03T10:00:00Z",
                       "containerRecreateStates": [{"name": "app", "phase": "Succeeded", "isKilled": true}]}
        }))
        .unwrap();
        let pod = |restarts: i32| -> Pod {
            serde_json::from_value(serde_json::json!({
                "metadata": {"name": "web-0", "namespace": "default"},
                "status": {"phase": "Running",
                           "conditions": [{"type": "Ready", "status": "True"}],
                           "containerStatuses": [{"name": "app", "ready": true, "restartCount": restarts,
                                                  "image": "i", "imageID": "", "containerID": "containerd://b"}]}
            }))
            .unwrap()
        };
        let mut seen = Seen::default();
        seen.crrs.items.insert(crr.name_any(), crr.clone());
        let mut flight = Flight {
            crr: crr.name_any(),
            tracker: Tracker::default(),
            before: None,
            since: None,
            started: Instant::now(),
            seen: true,
            recreated: None,
        };
        seen.pods.items.insert("web-0".into(), pod(2));
        assert!(
            land("web-0", &mut flight, &seen).is_none(),
            "not restarted yet"
        );
        assert_eq!(flight.before, Some(BTreeMap::from([("app".into(), 2)])));
        seen.pods.items.insert("web-0".into(), pod(3));
        assert!(matches!(
            land("web-0", &mut flight, &seen),
            Some(Step::Restarted)
        ));
    }

    #[test]
    fn pods_go_in_name_order_with_ordinals_as_numbers() {
        let mut names = vec!["web-10", "web-2", "api-x7k2b", "web-1", "api-b4c9d"];
        names.sort_by_key(|n| in_order(n));
        assert_eq!(
            names,
            ["api-b4c9d", "api-x7k2b", "web-1", "web-2", "web-10"]
        );
    }
}
