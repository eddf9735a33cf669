//! The unkind parts a test turns on: paged lists, lagging and expiring
//! watches, compaction, failed and raced writes, stalls, partitions and
//! outages.

use super::*;

impl FakeApiServer {
    /// From now on, lists answer `size` items a page, and each page after
    /// the first `delay` later: the reflector's store fills only once the
    /// last page is in (kube-runtime swaps it at InitDone).
    pub fn set_list_pages(&self, size: usize, delay: Duration) {
        *lock(&self.inner.pages) = Some((size, delay));
    }

    /// From now on, watches behave as `watches` says (lag, 410s, bookmarks).
    pub fn set_watches(&self, watches: Watches) {
        *lock(&self.inner.watches) = watches;
    }

    /// The next `count` writes to `resource` are refused with `code` (429
    /// Too Many Requests, or a 5xx), as an API server under load refuses them.
    pub fn fail_writes(&self, resource: Resource, code: u16, count: usize) {
        lock(&self.inner.faults).push(Fault {
            resource,
            code,
            left: count,
        });
    }

    /// The next `count` writes (PUT or PATCH) of a CRR's status lose a race:
    /// just before each, another writer updates the CRR (an annotation), so
    /// a write naming the resourceVersion it read gets 409 Conflict, as it
    /// would; one that names none goes over the other writer's change.
    pub fn race_status_updates(&self, count: usize) {
        self.race_status_updates_with(count, Arc::new(|_| true), |left| {
            let patch = json!({"metadata": {"annotations": {
                "test.crr-proxy/concurrent-write": left.to_string()
            }}});
            (patch, false)
        });
    }

    /// As [`race_status_updates`](Self::race_status_updates), for the writes
    /// whose body (object or patch) `matches`; the other writer applies the merge patch `other`
    /// makes (given the races left, and whether it patches the status).
    pub fn race_status_updates_with(
        &self,
        count: usize,
        matches: Arc<dyn Fn(&Value) -> bool + Send + Sync>,
        other: fn(usize) -> (Value, bool),
    ) {
        *lock(&self.inner.race) = Some(Race {
            left: count,
            matches,
            other,
        });
    }

    /// How many of the races `race_status_updates` asked for are still to come.
    pub fn races_left(&self) -> usize {
        lock(&self.inner.race).as_ref().map_or(0, |r| r.left)
    }

    /// How many of the failures `fail_writes` asked for are still to come.
    pub fn faults_left(&self) -> usize {
        lock(&self.inner.faults).iter().map(|f| f.left).sum()
    }

    /// Makes the server unreachable (every connection dropped) or reachable
    /// again.
    pub fn set_offline(&self, offline: bool) {
        self.inner
            .offline
            .store(offline, std::sync::atomic::Ordering::SeqCst);
        if offline {
            self.inner.reset.send_modify(|n| *n += 1);
        }
    }

    /// The other writer's patch, when the CRR status PUT `body` is to
    /// lose a race.
    pub(super) fn take_race(&self, body: &Value) -> Option<(Value, bool)> {
        let mut race = lock(&self.inner.race);
        let race = race.as_mut().filter(|r| r.left > 0 && (r.matches)(body))?;
        let other = (race.other)(race.left);
        race.left -= 1;
        Some(other)
    }

    /// While `cut`, every write of `user` (a user name, as `UserInfo`
    /// has it) is swallowed: never applied, never answered, as if a network
    /// partition dropped it on the way. Reads still pass.
    pub fn partition(&self, user: &str, cut: bool) {
        let mut partitioned = lock(&self.inner.partitioned);
        partitioned.retain(|u| u != user);
        if cut {
            partitioned.push(user.to_owned());
        }
    }

    pub(super) fn is_offline(&self) -> bool {
        self.inner.offline.load(std::sync::atomic::Ordering::SeqCst)
    }

    /// From now on, an HTTP write that `matches` is swallowed: it is never
    /// applied and never answered, as if the writer died just before the
    /// API server had it. The returned Notify fires at the first such write.
    pub fn stall_writes(&self, matches: WriteMatcher) -> Arc<tokio::sync::Notify> {
        let hit = Arc::new(tokio::sync::Notify::new());
        *lock(&self.inner.stall) = Some(Stall {
            matches,
            hit: Arc::clone(&hit),
        });
        hit
    }

    /// Writes go through again.
    pub fn clear_stall(&self) {
        *lock(&self.inner.stall) = None;
    }

    /// Forgets the history and ends every watch: resuming from any earlier
    /// resourceVersion now answers `410 Gone`, as after etcd compaction.
    pub fn compact(&self) {
        let mut store = lock(&self.inner.store);
        store.history.clear();
        // etcd revisions are shared by every resource, so others' writes move
        // them on: after compaction no resourceVersion a client holds is current.
        store.rv += 1;
        store.oldest = store.rv + 1;
        self.inner.reset.send_modify(|n| *n += 1);
    }
}
