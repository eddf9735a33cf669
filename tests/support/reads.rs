//! Which state a list is served from, chosen by its `resourceVersion` and
//! `resourceVersionMatch` as kube-apiserver chooses it:
//!
//! - unset: a quorum read, the latest state;
//! - `0` (bare or `NotOlderThan`): whatever the watch cache holds, however
//!   far it lags;
//! - `N` (bare or `NotOlderThan`): the watch cache once it has reached `N`;
//!   it waits up to 3 s for that and then answers `504 Too large resource
//!   version` (staging/src/k8s.io/apiserver/pkg/storage/cacher/watch_cache.go,
//!   `waitUntilFreshAndBlock` and `blockTimeout`);
//! - `N` with `Exact`: the state at `N` from storage, `410 Expired` once
//!   compacted.
//!
//! The request is checked first as
//! staging/src/k8s.io/apimachinery/pkg/apis/meta/internalversion/validation/validation.go
//! (`ValidateListOptions`) checks it, answered `422 Invalid` (the handler in
//! staging/src/k8s.io/apiserver/pkg/endpoints/handlers/get.go wraps the
//! errors as an invalid `ListOptions`). A continued list names no
//! resourceVersion of its own: its token carries the first page's
//! (staging/src/k8s.io/apiserver/pkg/storage/etcd3/store.go, `GetList`).

use std::time::Duration;

use super::apiserver::ApiError;

/// How long a `NotOlderThan` list waits for the watch cache.
pub const CACHE_WAIT: Duration = Duration::from_secs(3);

/// The state a list asks for.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Read {
    Latest,
    Cached,
    NotOlderThan(u64),
    Exact(u64),
}

impl Read {
    /// The list's query parameters; `continued` when it has a `continue`.
    pub fn parse(
        resource_version: Option<&str>,
        matching: Option<&str>,
        continued: bool,
    ) -> Result<Self, ApiError> {
        let rv = resource_version.unwrap_or("");
        let matching = matching.unwrap_or("");
        let invalid = |message: String| {
            ApiError::new(
                422,
                "Invalid",
                format!("ListOptions.meta.k8s.io \"\" is invalid: {message}"),
            )
        };
        if !matching.is_empty() {
            if rv.is_empty() {
                return Err(invalid(
                    "resourceVersionMatch: Forbidden: resourceVersionMatch is forbidden unless \
                     resourceVersion is provided"
                        .into(),
                ));
            }
            if continued {
                return Err(invalid(
                    "resourceVersionMatch: Forbidden: resourceVersionMatch is forbidden when \
                     continue is provided"
                        .into(),
                ));
            }
            if matching != "Exact" && matching != "NotOlderThan" {
                return Err(invalid(format!(
                    "resourceVersionMatch: Unsupported value: {matching:?}: supported values: \
                     \"Exact\", \"NotOlderThan\", \"\""
                )));
            }
            if matching == "Exact" && rv == "0" {
                return Err(invalid(
                    "resourceVersionMatch: Forbidden: resourceVersionMatch \"exact\" is forbidden \
                     for resourceVersion \"0\""
                        .into(),
                ));
            }
        }
        if continued && !rv.is_empty() && rv != "0" {
            return Err(ApiError::new(
                400,
                "BadRequest",
                "specifying resource version is not allowed when using continue",
            ));
        }
        if rv.is_empty() {
            return Ok(Self::Latest);
        }
        Ok(match (self::resource_version(rv)?, matching) {
            (0, _) => Self::Cached,
            (n, "Exact") => Self::Exact(n),
            (n, _) => Self::NotOlderThan(n),
        })
    }
}

/// A request's `resourceVersion`, which this server keeps as a number.
pub fn resource_version(rv: &str) -> Result<u64, ApiError> {
    rv.parse().map_err(|_| {
        ApiError::new(
            400,
            "BadRequest",
            format!("invalid resource version {rv:?}"),
        )
    })
}

/// The watch cache has not reached `wanted` in time.
pub fn too_large(wanted: u64, current: u64) -> ApiError {
    ApiError::new(
        504,
        "Timeout",
        format!("Too large resource version: {wanted}, current: {current}"),
    )
}

/// The state asked for was compacted.
pub fn expired(what: &str) -> ApiError {
    ApiError::new(410, "Expired", format!("{what} is too old"))
}
