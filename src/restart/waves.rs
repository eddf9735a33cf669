//! How big the next wave of a workload's restart may be, and how far the run
//! has come. Pure decisions; `workload` does the reading and writing.

use std::fmt;
use std::str::FromStr;
use std::time::Duration;

/// `--max-unavailable`: how many of the workload's Pods may be restarting or
/// unready at once, as a count or a percentage of its Pods.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum MaxUnavailable {
    Count(u32),
    Percent(u32),
}

impl Default for MaxUnavailable {
    fn default() -> Self {
        MaxUnavailable::Count(1)
    }
}

#[derive(Debug, thiserror::Error, PartialEq, Eq)]
pub enum MaxUnavailableError {
    #[error("{0:?} is neither a number of Pods (2) nor a percentage (25%)")]
    Unreadable(String),
    #[error("must be at least 1 (or 1%): with 0 no Pod could ever be restarted")]
    Zero,
    #[error("a percentage must be at most 100%")]
    OverHundred,
}

impl FromStr for MaxUnavailable {
    type Err = MaxUnavailableError;

    fn from_str(text: &str) -> Result<Self, Self::Err> {
        let unreadable = || MaxUnavailableError::Unreadable(text.into());
        let (digits, percent) = match text.strip_suffix('%') {
            Some(digits) => (digits, true),
            None => (text, false),
        };
        let n: u32 = digits.parse().map_err(|_| unreadable())?;
        match (n, percent) {
            (0, _) => Err(MaxUnavailableError::Zero),
            (101.., true) => Err(MaxUnavailableError::OverHundred),
            (n, true) => Ok(MaxUnavailable::Percent(n)),
            (n, false) => Ok(MaxUnavailable::Count(n)),
        }
    }
}

impl fmt::Display for MaxUnavailable {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            MaxUnavailable::Count(n) => write!(f, "{n}"),
            MaxUnavailable::Percent(p) => write!(f, "{p}%"),
        }
    }
}

impl MaxUnavailable {
    /// As a number of Pods out of `total`: a percentage rounds down, as a
    /// Deployment's maxUnavailable does, but never below one Pod, or a small
    /// workload could not be restarted at all.
    pub fn of(self, total: usize) -> usize {
        match self {
            MaxUnavailable::Count(n) => usize::try_from(n).unwrap_or(usize::MAX),
            MaxUnavailable::Percent(p) => {
                (total.saturating_mul(usize::try_from(p).unwrap_or(100)) / 100).max(1)
            }
        }
    }
}

/// A PodDisruptionBudget that selects some of the workload's Pods, as its
/// status shows it.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Budget {
    pub name: String,
    /// `status.disruptionsAllowed`; `None` while the disruption controller
    /// has not seen the budget's latest generation (its number is not to be
    /// trusted, as the eviction API does not trust it either).
    pub allowed: Option<i32>,
}

/// What the run does next, between waves.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Next {
    /// Restart this many of the Pods left.
    Wave(usize),
    /// Nothing may start now: why, for the operator.
    Wait(String),
}

/// The next wave: as many of the `left` Pods as keep the workload within
/// `max` Pods unavailable (`unready` of its Pods are not Ready now) and
/// every budget at zero disruptions or more.
pub fn next_wave(max: usize, unready: usize, budgets: &[Budget], left: usize) -> Next {
    let mut size = left.min(max.saturating_sub(unready));
    if size == 0 {
        let pods = if unready == 1 { "Pod is" } else { "Pods are" };
        return Next::Wait(format!(
            "waiting: {unready} {pods} not Ready and --max-unavailable is {max}"
        ));
    }
    for budget in budgets {
        match budget.allowed {
            None => {
                return Next::Wait(format!(
                    "waiting: PodDisruptionBudget {} has a status older than its spec",
                    budget.name
                ));
            }
            Some(allowed) if allowed <= 0 => {
                return Next::Wait(format!(
                    "waiting: PodDisruptionBudget {} allows no disruption now",
                    budget.name
                ));
            }
            Some(allowed) => size = size.min(usize::try_from(allowed).unwrap_or(0)),
        }
    }
    Next::Wave(size)
}

/// How far a run has come, for the progress display.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct Progress {
    pub total: usize,
    /// Restarted, skipped (restarted already by this run, or gone) or
    /// failed: nothing more to do for them.
    pub done: usize,
    pub failed: usize,
    /// The wave under way (1-based), 0 before the first.
    pub wave: usize,
    pub wave_size: usize,
    /// How long each finished wave took.
    pub waves: Vec<Duration>,
}

impl Progress {
    /// About how long the rest takes: the waves left at the current wave
    /// size, each as long as the finished ones were on average. `None`
    /// before a wave has finished.
    pub fn left(&self) -> Option<Duration> {
        if self.waves.is_empty() || self.wave_size == 0 {
            return None;
        }
        let total: Duration = self.waves.iter().sum();
        let mean = total / u32::try_from(self.waves.len()).unwrap_or(u32::MAX);
        let pods = self.total.saturating_sub(self.done);
        if pods == 0 {
            return None;
        }
        let waves = pods.div_ceil(self.wave_size);
        Some(mean * u32::try_from(waves).unwrap_or(u32::MAX))
    }

    /// `Pods 2/6 done, wave 2 (2 Pods), 12.3s elapsed, about 8s left`.
    pub fn line(&self, elapsed: Duration) -> String {
        let mut line = format!("Pods {}/{} done", self.done, self.total);
        if self.failed > 0 {
            line.push_str(&format!(" ({} failed)", self.failed));
        }
        if self.wave > 0 {
            let pods = if self.wave_size == 1 { "Pod" } else { "Pods" };
            line.push_str(&format!(", wave {} ({} {pods})", self.wave, self.wave_size));
        }
        line.push_str(&format!(", {:.1}s elapsed", elapsed.as_secs_f64()));
        if let Some(left) = self.left() {
            line.push_str(&format!(", about {}s left", left.as_secs_f64().ceil()));
        }
        line
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn max_unavailable_is_a_count_or_a_percentage_and_never_zero() {
        assert_eq!("2".parse(), Ok(MaxUnavailable::Count(2)));
        assert_eq!("25%".parse(), Ok(MaxUnavailable::Percent(25)));
        assert_eq!(
            "0".parse::<MaxUnavailable>(),
            Err(MaxUnavailableError::Zero)
        );
        assert_eq!(
            "0%".parse::<MaxUnavailable>(),
            Err(MaxUnavailableError::Zero)
        );
        assert_eq!(
            "150%".parse::<MaxUnavailable>(),
            Err(MaxUnavailableError::OverHundred)
        );
        assert!(matches!(
            "-1".parse::<MaxUnavailable>(),
            Err(MaxUnavailableError::Unreadable(_))
        ));
        assert_eq!(MaxUnavailable::Percent(25).of(6), 1);
        assert_eq!(MaxUnavailable::Percent(50).of(6), 3);
        assert_eq!(MaxUnavailable::Percent(10).of(3), 1, "at least one Pod");
        assert_eq!(MaxUnavailable::Count(2).of(6), 2);
    }

    #[test]
    fn a_wave_keeps_within_max_unavailable_and_every_budget() {
        let budget = |allowed| Budget {
            name: "web".into(),
            allowed,
        };
        assert_eq!(next_wave(2, 0, &[], 6), Next::Wave(2));
        assert_eq!(next_wave(2, 0, &[], 1), Next::Wave(1), "only one left");
        assert_eq!(next_wave(2, 1, &[], 6), Next::Wave(1), "one is unready");
        assert!(
            matches!(next_wave(2, 2, &[], 6), Next::Wait(w) if w.contains("2 Pods are not Ready"))
        );
        assert_eq!(next_wave(2, 0, &[budget(Some(1))], 6), Next::Wave(1));
        assert_eq!(next_wave(2, 0, &[budget(Some(5))], 6), Next::Wave(2));
        assert!(matches!(
            next_wave(2, 0, &[budget(Some(0))], 6),
            Next::Wait(w) if w == "waiting: PodDisruptionBudget web allows no disruption now"
        ));
        assert!(matches!(
            next_wave(2, 0, &[budget(Some(3)), budget(None)], 6),
            Next::Wait(w) if w.contains("status older than its spec")
        ));
    }

    #[test]
    fn the_estimate_is_the_mean_wave_times_the_waves_left() {
        let mut progress = Progress {
            total: 6,
            done: 2,
            wave: 2,
            wave_size: 2,
            ..Progress::default()
        };
        assert_eq!(progress.left(), None, "no wave has finished");
        progress.waves = vec![Duration::from_secs(3), Duration::from_secs(5)];
        assert_eq!(progress.left(), Some(Duration::from_secs(8)));
        assert_eq!(
            progress.line(Duration::from_millis(8_300)),
            "Pods 2/6 done, wave 2 (2 Pods), 8.3s elapsed, about 8s left"
        );
        progress.done = 6;
        assert_eq!(progress.left(), None, "nothing is left");
    }
}
