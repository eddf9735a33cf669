//! The standard `process_*` series (as Prometheus's client libraries name
//! them), read from `/proc/self` at each scrape: CPU time, memory, file
//! descriptors and start time, for alerts on a leak, on descriptors running
//! out, and on restarts (a changed start time).

use std::fmt::Write as _;
use std::path::Path;

/// Clock ticks per second in `/proc/<pid>/stat`: the kernel reports them in
/// USER_HZ, which is 100 on every architecture Linux exposes to user space.
const USER_HZ: f64 = 100.0;

/// What one scrape reports.
#[derive(Debug, Default, PartialEq)]
pub(super) struct Process {
    pub cpu_seconds: f64,
    pub start_time_seconds: f64,
    pub resident_bytes: u64,
    pub virtual_bytes: u64,
    pub open_fds: u64,
    pub max_fds: Option<u64>,
}

impl Process {
    /// This process, from `proc` (`/proc`); `None` where the files cannot
    /// be read or parsed (then no series is rendered).
    pub(super) fn read(proc: &Path) -> Option<Self> {
        let own = proc.join("self");
        let stat = std::fs::read_to_string(own.join("stat")).ok()?;
        let status = std::fs::read_to_string(own.join("status")).ok()?;
        let boot = std::fs::read_to_string(proc.join("stat")).ok()?;
        let limits = std::fs::read_to_string(own.join("limits")).ok()?;
        let open_fds = std::fs::read_dir(own.join("fd")).ok()?.count() as u64;
        let times = Times::parse(&stat)?;
        let booted = boot_time(&boot)?;
        Some(Self {
            cpu_seconds: (times.utime + times.stime) as f64 / USER_HZ,
            start_time_seconds: booted as f64 + times.starttime as f64 / USER_HZ,
            resident_bytes: status_kib(&status, "VmRSS:")? * 1024,
            virtual_bytes: status_kib(&status, "VmSize:")? * 1024,
            // Listing fd/ opens one descriptor of its own.
            open_fds: open_fds.saturating_sub(1),
            max_fds: max_open_files(&limits),
        })
    }

    pub(super) fn render(&self, out: &mut String) {
        let mut series = |name: &str, kind: &str, help: &str, value: &dyn std::fmt::Display| {
            let _ = writeln!(out, "# HELP {name} {help}");
            let _ = writeln!(out, "# TYPE {name} {kind}");
            let _ = writeln!(out, "{name} {value}");
        };
        series(
            "process_cpu_seconds_total",
            "counter",
            "Total user and system CPU time spent in seconds.",
            &self.cpu_seconds,
        );
        series(
            "process_start_time_seconds",
            "gauge",
            "Start time of the process since unix epoch in seconds.",
            &self.start_time_seconds,
        );
        series(
            "process_resident_memory_bytes",
            "gauge",
            "Resident memory size in bytes.",
            &self.resident_bytes,
        );
        series(
            "process_virtual_memory_bytes",
            "gauge",
            "Virtual memory size in bytes.",
            &self.virtual_bytes,
        );
        series(
            "process_open_fds",
            "gauge",
            "Number of open file descriptors.",
            &self.open_fds,
        );
        if let Some(max) = self.max_fds {
            series(
                "process_max_fds",
                "gauge",
                "Maximum number of open file descriptors.",
                &max,
            );
        }
    }
}

/// The fields of `/proc/<pid>/stat` this reports, in clock ticks.
#[derive(Debug, PartialEq)]
struct Times {
    utime: u64,
    stime: u64,
    starttime: u64,
}

impl Times {
    /// The command name (field 2) is in parentheses and may hold spaces and
    /// parentheses itself, so the fields are counted from the last `)`:
    /// field 3 (state) is the first after it.
    fn parse(stat: &str) -> Option<Self> {
        let (_, rest) = stat.rsplit_once(')')?;
        let fields: Vec<&str> = rest.split_whitespace().collect();
        let field = |n: usize| fields.get(n - 3)?.parse().ok();
        Some(Self {
            utime: field(14)?,
            stime: field(15)?,
            starttime: field(22)?,
        })
    }
}

/// `btime` of `/proc/stat`: when the system booted, in seconds since the
/// epoch.
fn boot_time(stat: &str) -> Option<u64> {
    stat.lines()
        .find_map(|l| l.strip_prefix("btime "))?
        .trim()
        .parse()
        .ok()
}

/// A `kB` line of `/proc/<pid>/status`.
fn status_kib(status: &str, key: &str) -> Option<u64> {
    status
        .lines()
        .find_map(|l| l.strip_prefix(key))?
        .split_whitespace()
        .next()?
        .parse()
        .ok()
}

/// The soft limit of `Max open files` in `/proc/<pid>/limits`; `None`
/// when unlimited.
fn max_open_files(limits: &str) -> Option<u64> {
    limits
        .lines()
        .find_map(|l| l.strip_prefix("Max open files"))?
        .split_whitespace()
        .next()?
        .parse()
        .ok()
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used, clippy::expect_used)] // tests fail loudly by design

    use super::*;

    #[test]
    fn a_command_name_with_spaces_and_parentheses_does_not_shift_the_fields() {
        let stat = "4242 (crr (proxy) x) S 1 4242 4242 0 -1 4194560 1771 0 0 0 \
                    250 75 0 0 20 0 9 0 123456 1009713152 4321 18446744073709551615";
        assert_eq!(
            Times::parse(stat),
            Some(Times {
                utime: 250,
                stime: 75,
                starttime: 123456
            })
        );
        assert_eq!(Times::parse("4242 (cut short"), None);
    }

    #[test]
    fn status_limits_and_boot_time_are_read_by_their_keys() {
        let status = "Name:\tcrr-proxy\nVmSize:\t  986048 kB\nVmRSS:\t   17284 kB\n";
        assert_eq!(status_kib(status, "VmRSS:"), Some(17284));
        assert_eq!(status_kib(status, "VmSize:"), Some(986048));
        assert_eq!(status_kib(status, "VmSwap:"), None);
        let limits = "Limit                     Soft Limit           Hard Limit           Units     \n\
                      Max open files            1048576              1048576              files     \n";
        assert_eq!(max_open_files(limits), Some(1_048_576));
        let unlimited =
            "Max open files            unlimited            unlimited            files     \n";
        assert_eq!(max_open_files(unlimited), None);
        assert_eq!(
            boot_time("cpu  1 2 3\nbtime 1764979200\nprocesses 9\n"),
            Some(1_764_979_200)
        );
    }

    #[test]
    fn this_process_is_read_from_proc() {
        let process = Process::read(Path::new("/proc")).unwrap();
        let now = std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .unwrap()
            .as_secs_f64();
        // Started before now, and not before the test binary could have.
        assert!(process.start_time_seconds <= now + 1.0, "{process:?}");
        assert!(process.start_time_seconds > now - 3600.0, "{process:?}");
        assert!(process.resident_bytes > 1 << 20, "{process:?}");
        assert!(
            process.virtual_bytes >= process.resident_bytes,
            "{process:?}"
        );
        // stdin, stdout and stderr at least; other tests open more meanwhile.
        assert!(process.open_fds >= 3, "{process:?}");
        assert!(
            process.max_fds.is_some_and(|max| max > process.open_fds),
            "{process:?}"
        );
        let mut out = String::new();
        process.render(&mut out);
        for name in [
            "process_cpu_seconds_total",
            "process_start_time_seconds",
            "process_resident_memory_bytes",
            "process_virtual_memory_bytes",
            "process_open_fds",
        ] {
            assert!(
                out.contains(&format!("\n{name} ")),
                "{name} missing:\n{out}"
            );
        }
    }
}
