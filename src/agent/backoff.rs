//! How soon a failed watch is tried again.
//!
//! kube-runtime's default (client-go's reflector: 0.8 s doubling to 30 s)
//! resets only once two minutes pass without an error, so after an API
//! server outage of half a minute the next try may be 30 s away: CRRs
//! created as the server returns wait that long (seen from outside: 44 s).
//! Here the delay doubles from 0.5 s to at most 3 s (each with up to a fifth
//! more, so that nodes do not come back in step), and starts over with the
//! first event a watch delivers, so a relist after 410 costs no more than
//! the 0.5 s before it. At 3 s, 5 000 nodes' watches retry at under 2 000
//! requests a second between them while the API server is away.

use std::time::{Duration, SystemTime, UNIX_EPOCH};

use kube::runtime::utils::Backoff;

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

impl Iterator for WatchBackoff {
    type Item = Duration;

    fn next(&mut self) -> Option<Duration> {
        let delay = self.next;
        self.next = (self.next * 2).min(CAP);
        Some(delay + jitter(delay / 5))
    }
}

impl Backoff for WatchBackoff {
    fn reset(&mut self) {
        self.next = FIRST;
    }
}

/// Up to `max`, from the clock's nanoseconds: spread enough to keep nodes
/// apart, with no generator to seed.
fn jitter(max: Duration) -> Duration {
    let nanos = SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map_or(0, |t| t.subsec_nanos());
    let max = u32::try_from(max.as_nanos()).unwrap_or(u32::MAX).max(1);
    Duration::from_nanos(u64::from(nanos % max))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn delays_double_to_three_seconds_and_start_over_on_reset() {
        let mut backoff = WatchBackoff::default();
        let delays: Vec<Duration> = (&mut backoff).take(8).collect();
        let floors = [500, 1000, 2000, 3000, 3000, 3000, 3000, 3000];
        for (delay, floor) in delays.iter().zip(floors) {
            let floor = Duration::from_millis(floor);
            assert!(*delay >= floor && *delay <= floor + floor / 5, "{delays:?}");
        }
        backoff.reset();
        assert!(backoff.next().unwrap() < Duration::from_millis(601));
    }
}
