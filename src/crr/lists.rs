//! The lists in a CRR's status that more than one writer changes: the
//! per-container states (this agent, a second pass of it, kruise-daemon
//! beside it), the v1beta1 conditions (kruise-manager's and the agent's)
//! and the container status snapshot.
//!
//! A JSON merge patch replaces a list whole, so one written from a stale
//! copy drops whatever another writer put there since. The agent writes a
//! list only conditional on the resourceVersion of the copy it computed it
//! from; after a conflict it reads the CRR afresh and carries its own
//! change onto the fresh list (`rebase`): the entries it changed replace
//! theirs, and every other entry stays as the other writer left it.

use k8s_openapi::apimachinery::pkg::apis::meta::v1::Condition;

use super::{ContainerRecreateRequestStatus, ContainerRecreateState, SyncContainerStatus};

/// One list of the status: its JSON name, how to find it, and the key of
/// its entries (the CRD's `listMapKey`).
pub struct StatusList<T: 'static> {
    pub field: &'static str,
    pub get: fn(&ContainerRecreateRequestStatus) -> &[T],
    pub key: fn(&T) -> &str,
}

pub const STATES: StatusList<ContainerRecreateState> = StatusList {
    field: "containerRecreateStates",
    get: |status| &status.container_recreate_states,
    key: |state| &state.name,
};

pub const CONDITIONS: StatusList<Condition> = StatusList {
    field: "conditions",
    get: |status| &status.conditions,
    key: |condition| &condition.type_,
};

pub const SNAPSHOT: StatusList<SyncContainerStatus> = StatusList {
    field: "containerStatusSnapshot",
    get: |status| &status.container_status_snapshot,
    key: |container| &container.name,
};

/// Carries the change from `base` to `ours` onto `theirs` (the list as
/// another writer left it since `base` was read), entry by entry: an
/// entry this writer added, changed or removed is so in the result; every
/// other entry is theirs. Where both changed one entry, this writer's
/// change wins (it is the one deciding now, from the fresh copy).
pub fn rebase<T: Clone + PartialEq>(
    base: &[T],
    ours: &[T],
    theirs: &[T],
    key: impl Fn(&T) -> &str,
) -> Vec<T> {
    let find = |list: &'_ [T], k: &str| list.iter().find(|e| key(e) == k).cloned();
    let mut out = Vec::with_capacity(theirs.len().max(ours.len()));
    for entry in theirs {
        let k = key(entry);
        match (find(base, k), find(ours, k)) {
            // Changed or added by this writer.
            (before, Some(mine)) if before.as_ref() != Some(&mine) => out.push(mine),
            // Removed by this writer, and left alone by theirs.
            (Some(before), None) if before == *entry => {}
            _ => out.push(entry.clone()),
        }
    }
    for mine in ours {
        let k = key(mine);
        if theirs.iter().any(|e| key(e) == k) {
            continue;
        }
        // Added by this writer, or changed where theirs removed it; one
        // it kept as it was stays removed.
        if find(base, k).as_ref() != Some(mine) {
            out.push(mine.clone());
        }
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    fn list(entries: &[(&str, u32)]) -> Vec<(String, u32)> {
        entries.iter().map(|(k, v)| ((*k).to_owned(), *v)).collect()
    }

    fn key(entry: &(String, u32)) -> &str {
        &entry.0
    }

    #[test]
    fn their_entries_survive_and_ours_apply() {
        let base = list(&[("a", 1), ("b", 1)]);
        // We moved a on; they moved b on and added c.
        let ours = list(&[("a", 2), ("b", 1)]);
        let theirs = list(&[("a", 1), ("b", 3), ("c", 1)]);
        assert_eq!(
            rebase(&base, &ours, &theirs, key),
            list(&[("a", 2), ("b", 3), ("c", 1)])
        );
        // Nothing read yet: ours are added after theirs.
        assert_eq!(
            rebase(&[], &list(&[("a", 1)]), &list(&[("k", 9)]), key),
            list(&[("k", 9), ("a", 1)])
        );
        // Both changed a: ours wins.
        assert_eq!(
            rebase(&base, &ours, &list(&[("a", 5), ("b", 1)]), key),
            list(&[("a", 2), ("b", 1)])
        );
    }

    #[test]
    fn removals_apply_only_to_what_the_remover_saw() {
        let base = list(&[("a", 1), ("b", 1)]);
        // We removed b; they left it alone: gone.
        assert_eq!(
            rebase(&base, &list(&[("a", 1)]), &base, key),
            list(&[("a", 1)])
        );
        // We removed b; they changed it: theirs stays.
        let theirs = list(&[("a", 1), ("b", 2)]);
        assert_eq!(rebase(&base, &list(&[("a", 1)]), &theirs, key), theirs);
        // They removed b, which we kept as it was: gone; which we changed: ours.
        let theirs = list(&[("a", 1)]);
        assert_eq!(rebase(&base, &base, &theirs, key), list(&[("a", 1)]));
        let ours = list(&[("a", 1), ("b", 4)]);
        assert_eq!(rebase(&base, &ours, &theirs, key), ours);
    }
}
