//! Standalone mode's cluster-wide duty (seeing new CRRs, claiming them for
//! the node that runs their Pod) is done by one node at a time: the holder
//! of a `coordination.k8s.io/v1` Lease whose holderIdentity is its node
//! name, as kube-scheduler and kube-controller-manager elect theirs.
//!
//! - The holder renews every renew period. It stops counting itself the
//!   holder once `duration − renew period` has passed since the start of
//!   its last successful renewal, which is before any other node may take
//!   the Lease (`renewTime + duration`).
//! - The others watch the Lease (one event per renewal, no request) and
//!   take it when it is released or once it would expire, after a little
//!   jitter so that thousands of nodes do not write in step. "Would
//!   expire" is judged as client-go's leader election judges it: by the
//!   follower's own monotonic clock, `duration` after it last saw the
//!   Lease change, never by comparing the holder's `renewTime` with its own
//!   wall clock (two nodes' clocks may disagree by more than a Lease lasts).
//! - Every write is conditional on the Lease's resourceVersion, so two
//!   nodes never both take it; deploy/base/node-policy.yaml lets only the
//!   current holderIdentity write unclaimed CRRs, so a holder that lost the
//!   Lease without knowing it (a partition) cannot claim either.
//! - On SIGTERM the holder gives the Lease up at once (no holder, duration
//!   1 s), as client-go's `ReleaseOnCancel` does.

use std::sync::Arc;
use std::time::Duration;

use futures_util::StreamExt;
use k8s_openapi::api::coordination::v1::{Lease, LeaseSpec};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::{MicroTime, ObjectMeta};
use k8s_openapi::jiff::{SignedDuration, Timestamp};
use kube::api::{Api, PostParams};
use kube::runtime::reflector::{self, ObjectRef, Store};
use kube::runtime::{WatchStreamExt, watcher};
use tokio::sync::watch;
use tokio::time::Instant;
use tracing::{debug, info, warn};

use super::backoff::{WatchBackoff, jitter};
use crate::metrics::Metrics;

/// The Lease and its timing (`--lease-*`).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct LeaseSettings {
    pub name: String,
    pub namespace: String,
    /// How long a holder's claim lasts without renewal.
    pub duration: Duration,
    /// How often the holder renews; less than `duration`.
    pub renew_period: Duration,
    /// How long after its claim a CRR may go unanswered by its node before
    /// the holder ends it (kruise-manager's `responseTimeout`, which counts
    /// from the CRR's creation).
    pub unanswered: Duration,
    /// The wall clock this node writes into the Lease.
    pub clock: WallClock,
}

/// The wall clock a node writes into `renewTime` and `acquireTime`, for
/// people and `crr-proxy check` to read; the election never compares it
/// with another node's. Tests skew it, as a node's clock may be.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct WallClock {
    ahead: SignedDuration,
}

impl WallClock {
    /// A clock that runs `ahead` of the system's (behind, if negative).
    pub fn skewed(ahead: SignedDuration) -> Self {
        Self { ahead }
    }

    fn now(self) -> Timestamp {
        let now = Timestamp::now();
        now.checked_add(self.ahead).unwrap_or(now)
    }
}

impl Default for LeaseSettings {
    fn default() -> Self {
        Self {
            name: crate::manifests::DEFAULT_LEASE_NAME.into(),
            namespace: crate::manifests::DEFAULT_LEASE_NAMESPACE.into(),
            duration: Duration::from_secs(15),
            renew_period: Duration::from_secs(5),
            unanswered: UNANSWERED,
            clock: WallClock::default(),
        }
    }
}

/// kruise-manager's `responseTimeout`.
pub const UNANSWERED: Duration = Duration::from_secs(60);

/// Whether this node holds the Lease, as the elector last knew it.
#[derive(Clone, Debug)]
pub(crate) struct Leadership {
    /// `Some(until)` while this node holds it (by the monotonic clock).
    until: watch::Receiver<Option<Instant>>,
}

impl Leadership {
    /// Holds the Lease at this moment.
    pub(crate) fn holds(&self) -> bool {
        holds(*self.until.borrow())
    }

    /// Returns once this node holds the Lease.
    pub(crate) async fn gained(&mut self) {
        loop {
            if self.holds() {
                return;
            }
            if self.until.changed().await.is_err() {
                std::future::pending::<()>().await;
            }
        }
    }

    /// Returns once this node no longer holds the Lease (released, taken,
    /// or not renewed in time).
    pub(crate) async fn lost(&mut self) {
        loop {
            let until = *self.until.borrow_and_update();
            let Some(until) = until.filter(|u| Instant::now() < *u) else {
                return;
            };
            tokio::select! {
                () = tokio::time::sleep_until(until) => {}
                changed = self.until.changed() => {
                    if changed.is_err() {
                        return;
                    }
                }
            }
        }
    }
}

/// Whether a holder counted on until `until` still is one.
fn holds(until: Option<Instant>) -> bool {
    until.is_some_and(|until| Instant::now() < until)
}

/// What to do with the Lease as read now.
#[derive(Debug, PartialEq, Eq)]
pub(crate) enum Step {
    /// Nobody holds it, or its holder let it expire: take it.
    Take,
    /// This node holds it: renew it.
    Renew,
    /// Another node holds it until `expires` (by this node's clock).
    Follow { holder: String, expires: Instant },
}

/// Decides on a Lease as node `me` reads it at `now`, having first seen it
/// as it is at `seen` (both by this node's monotonic clock): another
/// node's Lease expires `leaseDurationSeconds` after this node saw it last
/// change, whatever its `renewTime` says.
pub(crate) fn decide(spec: &LeaseSpec, me: &str, seen: Instant, now: Instant) -> Step {
    let holder = spec.holder_identity.as_deref().unwrap_or_default();
    if holder.is_empty() {
        return Step::Take;
    }
    if holder == me {
        return Step::Renew;
    }
    let lasts = u64::try_from(spec.lease_duration_seconds.unwrap_or(0)).unwrap_or(0);
    let expires = seen + Duration::from_secs(lasts);
    if expires <= now {
        Step::Take
    } else {
        Step::Follow {
            holder: holder.to_owned(),
            expires,
        }
    }
}

/// The Lease as this node last saw it change, and when (client-go's
/// observedRecord and observedTime).
struct Observed {
    spec: LeaseSpec,
    at: Instant,
}

/// What one round of the election found.
enum Round {
    /// This node holds it: the Lease as written.
    Holds(Box<Lease>),
    Follows {
        holder: String,
        expires: Instant,
    },
    /// Lost a race for the Lease: read it afresh now.
    Raced,
}

/// Runs the election for node `me` until `stop` turns true, then gives the
/// Lease up if this node holds it.
pub(crate) fn elect(
    api: Api<Lease>,
    settings: LeaseSettings,
    me: String,
    metrics: Arc<Metrics>,
    stop: watch::Receiver<bool>,
) -> (Leadership, tokio::task::JoinHandle<()>) {
    let (until, rx) = watch::channel(None);
    let (seen, changes) = watch_lease(&api, &settings.name);
    let elector = Elector {
        api,
        settings,
        me,
        metrics,
        until,
        seen,
        observed: None,
    };
    let task = tokio::spawn(elector.run(changes, stop));
    (Leadership { until: rx }, task)
}

/// The Lease as its watch last delivered it, and a count of its changes.
/// A follower decides from this copy: a node costs the API server one
/// watch event per renewal and no request while it follows, and learns of
/// a release at once.
fn watch_lease(api: &Api<Lease>, name: &str) -> (Store<Lease>, Changes) {
    let (store, writer) = reflector::store();
    let (bump, changes) = watch::channel(0u64);
    let stream = watcher(
        api.clone(),
        watcher::Config::default().fields(&format!("metadata.name={name}")),
    )
    .reflect(writer);
    let task = tokio::spawn(async move {
        let mut stream = std::pin::pin!(stream);
        let mut backoff = WatchBackoff::default();
        while let Some(event) = stream.next().await {
            match event {
                Ok(_) => {
                    backoff.reset();
                    bump.send_modify(|n| *n += 1);
                }
                Err(error) => {
                    let delay = backoff.after(&error);
                    debug!(%error, ?delay, "watch of the standalone Lease failed; retrying");
                    tokio::time::sleep(delay).await;
                }
            }
        }
    });
    (store, Changes { changes, task })
}

/// The Lease watch's change count; the watch ends with it.
struct Changes {
    changes: watch::Receiver<u64>,
    task: tokio::task::JoinHandle<()>,
}

impl Drop for Changes {
    fn drop(&mut self) {
        self.task.abort();
    }
}

struct Elector {
    api: Api<Lease>,
    settings: LeaseSettings,
    me: String,
    metrics: Arc<Metrics>,
    until: watch::Sender<Option<Instant>>,
    seen: Store<Lease>,
    observed: Option<Observed>,
}

impl Elector {
    async fn run(mut self, mut changes: Changes, mut stop: watch::Receiver<bool>) {
        let renew = self.settings.renew_period;
        let mut following: Option<String> = None;
        // The base of the next write: the Lease as this node last wrote it,
        // or none (read it then).
        let mut mine: Option<Lease> = None;
        let mut fresh = true;
        loop {
            let started = Instant::now();
            // A round never outlasts the renew period: a hung API server
            // must not hold the holder past the time it may count itself one.
            let round = tokio::time::timeout(renew, self.round(mine.take(), fresh)).await;
            fresh = false;
            let next = match round {
                Ok(Ok(Round::Holds(lease))) => {
                    if !self.holds() {
                        info!(lease = %self.settings.name, "this node holds the standalone Lease");
                    }
                    following = None;
                    mine = Some(*lease);
                    let lasts = self.settings.duration.saturating_sub(renew);
                    self.set(Some(started + lasts));
                    renew
                }
                Ok(Ok(Round::Follows { holder, expires })) => {
                    if following.as_deref() != Some(holder.as_str()) {
                        info!(lease = %self.settings.name, %holder, "another node holds the standalone Lease");
                        following = Some(holder);
                    }
                    self.set(None);
                    expires.saturating_duration_since(Instant::now()) + jitter(renew / 2)
                }
                Ok(Ok(Round::Raced)) => {
                    fresh = true;
                    Duration::from_millis(50)
                }
                Ok(Err(error)) => {
                    warn!(%error, lease = %self.settings.name, "cannot read or write the standalone Lease; trying again");
                    fresh = true;
                    renew / 2
                }
                Err(_) => {
                    warn!(lease = %self.settings.name, "the API server did not answer about the standalone Lease in time");
                    fresh = true;
                    Duration::ZERO
                }
            };
            if !self.holds() {
                self.set(None);
            }
            changes.changes.borrow_and_update();
            let changed = tokio::select! {
                () = tokio::time::sleep(next) => false,
                // A follower looks again when the Lease changes (renewed,
                // released, taken).
                Ok(()) = changes.changes.changed(), if following.is_some() => true,
                _ = stop.wait_for(|stop| *stop) => break,
            };
            if changed {
                // After a little jitter, so that a release does not make
                // every node write at once.
                tokio::time::sleep(jitter(renew / 2)).await;
            }
        }
        if self.holds() {
            self.set(None);
            match tokio::time::timeout(renew, self.release()).await {
                Ok(Ok(())) => info!(lease = %self.settings.name, "gave the standalone Lease up"),
                Ok(Err(error)) => {
                    warn!(%error, "could not give the standalone Lease up; it expires by itself")
                }
                Err(_) => {
                    warn!("could not give the standalone Lease up in time; it expires by itself")
                }
            }
        }
        self.set(None);
    }

    fn holds(&self) -> bool {
        holds(*self.until.borrow())
    }

    fn set(&self, until: Option<Instant>) {
        self.metrics.set_lease_held(until.is_some());
        self.until.send_replace(until);
    }

    /// The Lease as the watch has it, unless `fresh` or the watch has none.
    async fn current(&self, fresh: bool) -> Result<Option<Lease>, kube::Error> {
        let key = ObjectRef::new(&self.settings.name).within(&self.settings.namespace);
        match self.seen.get(&key) {
            Some(seen) if !fresh => Ok(Some((*seen).clone())),
            _ => self.api.get_opt(&self.settings.name).await,
        }
    }

    /// Reads the Lease (from `mine`, this node's last write, when it holds
    /// it), decides, and writes if it is to be taken or renewed.
    async fn round(&mut self, mine: Option<Lease>, fresh: bool) -> Result<Round, kube::Error> {
        let now = self.settings.clock.now();
        let current = match mine {
            Some(mine) => Some(mine),
            None => self.current(fresh).await?,
        };
        let Some(mut lease) = current else {
            let lease = Lease {
                metadata: ObjectMeta {
                    name: Some(self.settings.name.clone()),
                    namespace: Some(self.settings.namespace.clone()),
                    ..ObjectMeta::default()
                },
                spec: Some(self.taken(&LeaseSpec::default(), now)),
            };
            return match self.api.create(&PostParams::default(), &lease).await {
                Ok(written) => Ok(Round::Holds(Box::new(written))),
                Err(kube::Error::Api(status)) if status.code == 409 => Ok(Round::Raced),
                Err(error) => Err(error),
            };
        };
        let spec = lease.spec.clone().unwrap_or_default();
        let seen = self.observe(&spec);
        let next = match decide(&spec, &self.me, seen, Instant::now()) {
            Step::Follow { holder, expires } => return Ok(Round::Follows { holder, expires }),
            Step::Take => {
                debug!(previous = ?spec.holder_identity, "taking the standalone Lease");
                self.taken(&spec, now)
            }
            Step::Renew => LeaseSpec {
                renew_time: Some(MicroTime(now)),
                lease_duration_seconds: Some(self.duration_seconds()),
                ..spec
            },
        };
        lease.spec = Some(next);
        match self
            .api
            .replace(&self.settings.name, &PostParams::default(), &lease)
            .await
        {
            Ok(written) => Ok(Round::Holds(Box::new(written))),
            Err(kube::Error::Api(status)) if status.code == 409 => Ok(Round::Raced),
            Err(error) => Err(error),
        }
    }

    /// When this node first saw the Lease as `spec` has it.
    fn observe(&mut self, spec: &LeaseSpec) -> Instant {
        match &self.observed {
            Some(observed) if observed.spec == *spec => observed.at,
            _ => {
                let at = Instant::now();
                self.observed = Some(Observed {
                    spec: spec.clone(),
                    at,
                });
                at
            }
        }
    }

    /// `spec` as this node takes it over.
    fn taken(&self, spec: &LeaseSpec, now: Timestamp) -> LeaseSpec {
        LeaseSpec {
            holder_identity: Some(self.me.clone()),
            lease_duration_seconds: Some(self.duration_seconds()),
            acquire_time: Some(MicroTime(now)),
            renew_time: Some(MicroTime(now)),
            lease_transitions: Some(spec.lease_transitions.unwrap_or(0) + 1),
            ..spec.clone()
        }
    }

    fn duration_seconds(&self) -> i32 {
        i32::try_from(self.settings.duration.as_secs().max(1)).unwrap_or(i32::MAX)
    }

    /// No holder, and a Lease that lasts a second: the next node takes it
    /// as soon as it sees the change.
    async fn release(&self) -> Result<(), kube::Error> {
        let Some(mut lease) = self.api.get_opt(&self.settings.name).await? else {
            return Ok(());
        };
        let spec = lease.spec.clone().unwrap_or_default();
        if spec.holder_identity.as_deref() != Some(self.me.as_str()) {
            return Ok(());
        }
        lease.spec = Some(LeaseSpec {
            holder_identity: None,
            lease_duration_seconds: Some(1),
            renew_time: Some(MicroTime(self.settings.clock.now())),
            ..spec
        });
        self.api
            .replace(&self.settings.name, &PostParams::default(), &lease)
            .await
            .map(drop)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn spec(holder: Option<&str>, renewed: Option<&str>, seconds: i32) -> LeaseSpec {
        LeaseSpec {
            holder_identity: holder.map(str::to_owned),
            renew_time: renewed.map(|t| MicroTime(t.parse().unwrap())),
            lease_duration_seconds: Some(seconds),
            ..LeaseSpec::default()
        }
    }

    /// Expiry counts from when this node saw the Lease change, so the
    /// holder's renewTime, a minute off either way, changes nothing.
    #[test]
    fn a_free_or_expired_lease_is_taken_and_a_live_one_followed() {
        let seen = Instant::now();
        let at = |secs| seen + Duration::from_secs(secs);
        let me = "node-a";
        let renewed = |t| spec(Some("node-b"), Some(t), 15);
        assert_eq!(decide(&spec(None, None, 15), me, seen, at(0)), Step::Take);
        assert_eq!(
            decide(&spec(Some(""), None, 15), me, seen, at(0)),
            Step::Take
        );
        assert_eq!(
            decide(
                &spec(Some(me), Some("2026-12-01T10:00:00Z"), 15),
                me,
                seen,
                at(60)
            ),
            Step::Renew,
            "its own Lease is renewed, even late"
        );
        for renew_time in [
            "2026-12-01T09:59:00Z",
            "2026-12-01T10:01:00Z",
            "1970-01-01T00:00:00Z",
        ] {
            assert_eq!(
                decide(&renewed(renew_time), me, seen, at(14)),
                Step::Follow {
                    holder: "node-b".into(),
                    expires: at(15)
                },
                "renewed {renew_time}"
            );
            assert_eq!(
                decide(&renewed(renew_time), me, seen, at(15)),
                Step::Take,
                "expired exactly now"
            );
        }
        assert_eq!(
            decide(&spec(Some("node-b"), None, 15), me, seen, at(3)),
            Step::Follow {
                holder: "node-b".into(),
                expires: at(15)
            },
            "never renewed nor acquired: it still gets its duration"
        );
        // A released Lease: no holder, one second.
        let released = spec(None, Some("2026-12-01T10:00:19Z"), 1);
        assert_eq!(decide(&released, me, seen, at(0)), Step::Take);
    }
}
