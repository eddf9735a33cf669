//! How soon a failed watch is tried again.
//!
//! kube-runtime's default (client-go's reflector: 0.8 s doubling to 30 s)
//! resets only once two minutes pass without an error, so after an API
//! server outage of half a minute the next try may be 30 s away: CRRs
//! created as the server returns wait that long (seen from outside: 44 s).
//! Here the delay doubles from 0.5 s to at most 3 s (each with up to a fifth
//! more, so that nodes do not come back in step), and starts over with the
//! first event a watch delivers. A 410 (the watch's resourceVersion is
//! compacted away) is no failure of the server: the relist it calls for
//! starts at once. At 3 s, 5 000 nodes' watches retry at under 2 000
//! requests a second between them while the API server is away.
//!
//! kube-runtime's `StreamBackoff` cannot tell errors apart, so the agent's
//! `follow` waits [`WatchBackoff::after`] itself before it reads on.

use std::time::{Duration, SystemTime, UNIX_EPOCH};

use kube::runtime::watcher;

const FIRST: Duration = Duration::from_millis(500);
const CAP: Duration = Duration::from_secs(3);

#[derive(Debug)]
pub(crate) struct WatchBackoff {
    next: Duration,
}

impl Default for WatchBackoff {
    fn default() -> Self {
        Self { next: FIRST }
    }
}

impl WatchBackoff {
    /// How long to wait before the watch tries again after `error`.
    pub(crate) fn after(&mut self, error: &watcher::Error) -> Duration {
        if is_gone(error) {
            return Duration::ZERO;
        }
        self.after_failure()
    }

    /// How long to wait after any other failed request to the API server.
    pub(crate) fn after_failure(&mut self) -> Duration {
        let delay = self.next;
        self.next = (self.next * 2).min(CAP);
        delay + jitter(delay / 5)
    }

    /// The watch delivered an event: the server is back.
    pub(crate) fn reset(&mut self) {
        self.next = FIRST;
    }
}

/// `410 Gone`, in the watch stream or in answer to starting one.
fn is_gone(error: &watcher::Error) -> bool {
    match error {
        watcher::Error::WatchError(status) => status.code == 410,
        watcher::Error::WatchStartFailed(kube::Error::Api(status))
        | watcher::Error::WatchFailed(kube::Error::Api(status)) => status.code == 410,
        _ => false,
    }
}

/// Up to `max`, from the clock's nanoseconds: spread enough to keep nodes
/// apart, with no generator to seed.
pub(crate) fn jitter(max: Duration) -> Duration {
    let nanos = SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map_or(0, |t| t.subsec_nanos());
    let max = u32::try_from(max.as_nanos()).unwrap_or(u32::MAX).max(1);
    Duration::from_nanos(u64::from(nanos % max))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn failed() -> watcher::Error {
        watcher::Error::WatchFailed(kube::Error::LinesCodecMaxLineLengthExceeded)
    }

    fn gone() -> watcher::Error {
        let status = kube::core::Status {
            code: 410,
            ..Default::default()
        };
        watcher::Error::WatchError(Box::new(status))
    }

    #[test]
    fn delays_double_to_three_seconds_and_start_over_on_reset() {
        let mut backoff = WatchBackoff::default();
        let delays: Vec<Duration> = (0..8).map(|_| backoff.after(&failed())).collect();
        let floors = [500, 1000, 2000, 3000, 3000, 3000, 3000, 3000];
        for (delay, floor) in delays.iter().zip(floors) {
            let floor = Duration::from_millis(floor);
            assert!(*delay >= floor && *delay <= floor + floor / 5, "{delays:?}");
        }
        backoff.reset();
        assert!(backoff.after(&failed()) < Duration::from_millis(601));
    }

    #[test]
    fn a_410_relists_at_once_and_leaves_the_delay_as_it_was() {
        let mut backoff = WatchBackoff::default();
        backoff.after(&failed());
        assert_eq!(backoff.after(&gone()), Duration::ZERO);
        assert!(backoff.after(&failed()) >= Duration::from_secs(1));
    }
}
