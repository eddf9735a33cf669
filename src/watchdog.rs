//! systemd's watchdog (`WatchdogSec=`): crr-proxy says it is alive
//! (`WATCHDOG=1`) only after its own socket answered a CRI call, so that a
//! relay that no longer serves (a wedged runtime thread, a stopped process)
//! is killed and started again. The socket is systemd's (socket
//! activation): kubelet's calls wait in its backlog meanwhile and are
//! answered by the next process.
//!
//! The probe runs on the relay's own runtime on purpose: when that runtime
//! cannot run it, it cannot serve kubelet either. An answer of any kind
//! counts, `UNAVAILABLE` for a runtime that is down included: restarting
//! crr-proxy would not bring containerd back.

use std::path::PathBuf;
use std::time::Duration;

use tracing::warn;

use crate::cri::{self, v1::VersionRequest};
use crate::proxy::Endpoint;

/// Pings per watchdog period: two may be lost before systemd acts.
const PROBES_PER_PERIOD: u32 = 3;

/// The watchdog systemd keeps on this process.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Watchdog {
    /// The time within which systemd wants each ping.
    pub period: Duration,
}

impl Watchdog {
    /// The watchdog systemd set for this process, from the environment.
    pub fn from_env() -> Option<Self> {
        let usec = std::env::var("WATCHDOG_USEC").ok();
        let pid = std::env::var("WATCHDOG_PID").ok();
        Self::from_values(usec.as_deref(), pid.as_deref(), std::process::id())
    }

    /// `WATCHDOG_USEC` (the period in microseconds) and `WATCHDOG_PID` (the
    /// process meant, when set: a child started by the service is not) as
    /// sd_watchdog_enabled(3) reads them.
    pub fn from_values(usec: Option<&str>, pid: Option<&str>, own: u32) -> Option<Self> {
        let usec: u64 = usec?.trim().parse().ok().filter(|u| *u > 0)?;
        if let Some(pid) = pid
            && pid.trim().parse::<u32>().ok() != Some(own)
        {
            return None;
        }
        Some(Self {
            period: Duration::from_micros(usec),
        })
    }

    /// How often to probe, and how long one probe may wait.
    pub fn probe_every(&self) -> Duration {
        self.period / PROBES_PER_PERIOD
    }

    /// Probes `socket` for ever, pinging systemd after each answer.
    pub async fn run(self, socket: PathBuf) {
        let every = self.probe_every();
        let endpoint = Endpoint::from_path(&socket);
        let mut ticks = tokio::time::interval(every);
        ticks.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
        loop {
            ticks.tick().await;
            match probe(&endpoint, every).await {
                Ok(()) => {
                    if let Err(error) = crate::notify::notify("WATCHDOG=1") {
                        warn!(%error, "could not ping systemd's watchdog");
                    }
                }
                Err(why) => {
                    warn!(socket = %socket.display(), why, "no answer on the socket; not pinging systemd's watchdog")
                }
            }
        }
    }
}

/// One CRI `Version` call on a new connection to crr-proxy's own socket:
/// `Ok` when the relay answered, whatever the runtime's answer.
async fn probe(endpoint: &Endpoint, within: Duration) -> Result<(), &'static str> {
    let mut client = cri::runtime_client(cri::channel(endpoint));
    let call = client.version(VersionRequest {
        version: "v1".to_owned(),
    });
    match tokio::time::timeout(within, call).await {
        Ok(Ok(_)) => Ok(()),
        // A status the relay sent has no source; one made on this side (a
        // connection refused or reset) carries its transport error.
        Ok(Err(status)) if std::error::Error::source(&status).is_none() => Ok(()),
        Ok(Err(_)) => Err("the connection failed"),
        Err(_) => Err("no answer in time"),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_period_is_systemds_and_only_for_the_process_it_names() {
        let twenty = Some(Watchdog {
            period: Duration::from_secs(20),
        });
        assert_eq!(Watchdog::from_values(Some("20000000"), None, 7), twenty);
        assert_eq!(
            Watchdog::from_values(Some("20000000"), Some("7"), 7),
            twenty
        );
        assert_eq!(Watchdog::from_values(Some("20000000"), Some("8"), 7), None);
        assert_eq!(Watchdog::from_values(Some("0"), None, 7), None);
        assert_eq!(Watchdog::from_values(Some("soon"), None, 7), None);
        assert_eq!(Watchdog::from_values(None, Some("7"), 7), None);
        assert_eq!(
            twenty.map(|w| w.probe_every()),
            Some(Duration::from_nanos(6_666_666_666))
        );
    }
}
