//! Which runtime and image endpoints kubelet uses, found as kubelet finds
//! them rather than read from one file.
//!
//! kubelet layers its configuration (cmd/kubelet/app/server.go:
//! `loadConfigFile`, then `mergeKubeletConfigurations`, then
//! `kubeletConfigFlagPrecedence`): the `--config` file, then every `*.conf`
//! file under `--config-dir` in lexical order, each a JSON merge patch over
//! the result, then the command line's flags over all of it. kubelet's own
//! answer is its `/configz` (read through the API server's node proxy, when
//! the credentials may); otherwise the running kubelet's command line and
//! the files it names are layered the same way here, and where no kubelet
//! runs, the `--kubelet-config` file alone stands in.

use std::path::{Path, PathBuf};
use std::time::{Duration, SystemTime};

use serde_json::Value;

/// kubelet's `containerRuntimeEndpoint` when nothing sets it
/// (pkg/kubelet/apis/config/v1beta1 defaults, 1.27 and later).
pub const DEFAULT_RUNTIME: &str = "unix:///run/containerd/containerd.sock";

const RUNTIME_KEY: &str = "containerRuntimeEndpoint";
const IMAGE_KEY: &str = "imageServiceEndpoint";

/// The flags of kubelet's command line that decide its endpoints.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Flags {
    pub config: Option<String>,
    pub config_dir: Option<String>,
    pub runtime: Option<String>,
    pub image: Option<String>,
}

impl Flags {
    /// Reads `--flag=value` and `--flag value` (Go's pflag takes both, with
    /// one or two dashes); the last of a flag given twice wins, as in pflag.
    pub fn parse(args: &[String]) -> Self {
        let mut flags = Self::default();
        let mut args = args.iter();
        while let Some(arg) = args.next() {
            let Some(name) = arg.strip_prefix("--").or_else(|| arg.strip_prefix('-')) else {
                continue;
            };
            let (name, inline) = match name.split_once('=') {
                Some((name, value)) => (name, Some(value.to_owned())),
                None => (name, None),
            };
            let slot = match name {
                "config" => &mut flags.config,
                "config-dir" => &mut flags.config_dir,
                "container-runtime-endpoint" => &mut flags.runtime,
                "image-service-endpoint" => &mut flags.image,
                _ => continue,
            };
            let value = match inline {
                Some(value) => Some(value),
                None => args.next().cloned(),
            };
            if value.is_some() {
                *slot = value;
            }
        }
        flags
    }
}

/// Where an endpoint's value came from, for the report.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Source {
    /// kubelet's `/configz`.
    Configz,
    /// A flag on kubelet's command line.
    Flag(&'static str),
    /// A configuration file (the `--config` file or a drop-in).
    File(PathBuf),
    /// Nothing set it: kubelet's default.
    Default,
    /// The image endpoint, unset, follows the runtime endpoint.
    FollowsRuntime,
}

impl std::fmt::Display for Source {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Source::Configz => f.write_str("kubelet's /configz"),
            Source::Flag(flag) => write!(f, "flag --{flag}"),
            Source::File(path) => write!(f, "{}", path.display()),
            Source::Default => f.write_str("kubelet's default"),
            Source::FollowsRuntime => f.write_str("unset, so the runtime endpoint"),
        }
    }
}

/// One endpoint as kubelet has it.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Endpoint {
    pub value: String,
    pub source: Source,
}

/// kubelet's configuration as far as it could be learnt.
#[derive(Clone, Debug)]
pub struct Layered {
    /// The merged configuration (flags aside).
    pub config: Value,
    pub runtime: Endpoint,
    pub image: Endpoint,
    /// The files read, with their modification times.
    pub files: Vec<(PathBuf, Option<SystemTime>)>,
}

/// RFC 7386 JSON merge patch, as kubelet merges its drop-ins.
pub fn merge_patch(target: &mut Value, patch: &Value) {
    json_patch::merge(target, patch);
}

/// The endpoints of a configuration `config` whose keys were last set by
/// the files in `setters`, under the command line's `flags`: kubelet's
/// precedence, without I/O.
pub fn endpoints(
    config: &Value,
    setters: &std::collections::HashMap<&'static str, PathBuf>,
    flags: &Flags,
) -> (Endpoint, Endpoint) {
    let from = |key: &'static str, flag: &'static str, given: &Option<String>| {
        if let Some(value) = given {
            return Some(Endpoint {
                value: value.clone(),
                source: Source::Flag(flag),
            });
        }
        let value = config[key].as_str().filter(|v| !v.is_empty())?;
        Some(Endpoint {
            value: value.to_owned(),
            source: setters
                .get(key)
                .cloned()
                .map_or(Source::Configz, Source::File),
        })
    };
    let runtime =
        from(RUNTIME_KEY, "container-runtime-endpoint", &flags.runtime).unwrap_or(Endpoint {
            value: DEFAULT_RUNTIME.to_owned(),
            source: Source::Default,
        });
    // kubelet dials the runtime endpoint for images when none is set
    // (pkg/kubelet/kubelet.go, PreInitRuntimeService).
    let image = from(IMAGE_KEY, "image-service-endpoint", &flags.image).unwrap_or(Endpoint {
        value: runtime.value.clone(),
        source: Source::FollowsRuntime,
    });
    (runtime, image)
}

/// What went wrong reading kubelet's files.
#[derive(Debug, thiserror::Error)]
pub enum Error {
    #[error("{}: {source}", path.display())]
    Read {
        path: PathBuf,
        #[source]
        source: std::io::Error,
    },
    #[error("{}: {message}", path.display())]
    Parse { path: PathBuf, message: String },
}

fn read_yaml(path: &Path) -> Result<(Value, Option<SystemTime>), Error> {
    let text = std::fs::read_to_string(path).map_err(|source| Error::Read {
        path: path.to_owned(),
        source,
    })?;
    let modified = std::fs::metadata(path).and_then(|m| m.modified()).ok();
    let value: Value = serde_saphyr::from_str(&text).map_err(|e| Error::Parse {
        path: path.to_owned(),
        message: e.to_string(),
    })?;
    // An empty file is an empty configuration.
    Ok((if value.is_null() { Value::Null } else { value }, modified))
}

/// The `*.conf` files under `dir`, in the order kubelet walks them
/// (filepath.WalkDir: lexical, directories descended where they sort).
fn drop_ins(dir: &Path) -> Result<Vec<PathBuf>, Error> {
    let mut found = Vec::new();
    let mut entries: Vec<_> = std::fs::read_dir(dir)
        .map_err(|source| Error::Read {
            path: dir.to_owned(),
            source,
        })?
        .filter_map(Result::ok)
        .map(|e| e.path())
        .collect();
    entries.sort();
    for path in entries {
        if path.is_dir() {
            found.extend(drop_ins(&path)?);
        } else if path.extension().is_some_and(|e| e == "conf") {
            found.push(path);
        }
    }
    Ok(found)
}

/// Layers `config` (if any), the drop-ins of `config_dir` (if any) and
/// `flags`, as kubelet does when it starts.
pub fn layer(config: Option<&Path>, flags: &Flags, cwd: &Path) -> Result<Layered, Error> {
    let resolve = |p: &str| cwd.join(p);
    let mut merged = Value::Object(serde_json::Map::new());
    let mut setters = std::collections::HashMap::new();
    let mut files = Vec::new();
    let mut paths: Vec<PathBuf> = config.map(Path::to_owned).into_iter().collect();
    if let Some(dir) = &flags.config_dir {
        paths.extend(drop_ins(&resolve(dir))?);
    }
    for path in paths {
        let (value, modified) = read_yaml(&path)?;
        for key in [RUNTIME_KEY, IMAGE_KEY] {
            if value.get(key).is_some() {
                setters.insert(key, path.clone());
            }
        }
        merge_patch(&mut merged, &value);
        files.push((path, modified));
    }
    let (runtime, image) = endpoints(&merged, &setters, flags);
    Ok(Layered {
        config: merged,
        runtime,
        image,
        files,
    })
}

/// A running kubelet, from /proc.
#[derive(Clone, Debug)]
pub struct Process {
    pub pid: u32,
    pub args: Vec<String>,
    pub cwd: PathBuf,
    pub started: Option<SystemTime>,
}

/// The first process under `proc` whose name is `kubelet`.
pub fn running(proc: &Path) -> Option<Process> {
    let mut pids: Vec<u32> = std::fs::read_dir(proc)
        .ok()?
        .filter_map(Result::ok)
        .filter_map(|e| e.file_name().to_str()?.parse().ok())
        .collect();
    pids.sort_unstable();
    pids.into_iter().find_map(|pid| {
        let dir = proc.join(pid.to_string());
        let comm = std::fs::read_to_string(dir.join("comm")).ok()?;
        if comm.trim_end() != "kubelet" {
            return None;
        }
        let cmdline = std::fs::read(dir.join("cmdline")).ok()?;
        let args = cmdline
            .split(|b| *b == 0)
            .filter(|a| !a.is_empty())
            .map(|a| String::from_utf8_lossy(a).into_owned())
            .collect();
        let cwd = std::fs::read_link(dir.join("cwd")).unwrap_or_else(|_| PathBuf::from("/"));
        Some(Process {
            pid,
            args,
            cwd,
            started: started(proc, &dir),
        })
    })
}

/// When the process of `dir` started: its `starttime` (field 22 of
/// /proc/PID/stat, in clock ticks since boot) after /proc/stat's `btime`.
/// Ticks are USER_HZ, which Linux fixes at 100 for /proc on every
/// architecture it runs kubelet on.
fn started(proc: &Path, dir: &Path) -> Option<SystemTime> {
    const USER_HZ: u64 = 100;
    let stat = std::fs::read_to_string(dir.join("stat")).ok()?;
    // The name (field 2) may hold spaces and parentheses: count from the last ')'.
    let after = &stat[stat.rfind(')')? + 1..];
    let ticks: u64 = after.split_whitespace().nth(19)?.parse().ok()?;
    let boot: u64 = std::fs::read_to_string(proc.join("stat"))
        .ok()?
        .lines()
        .find_map(|l| l.strip_prefix("btime "))?
        .trim()
        .parse()
        .ok()?;
    Some(
        SystemTime::UNIX_EPOCH
            + Duration::from_secs(boot)
            + Duration::from_millis(ticks * 1000 / USER_HZ),
    )
}

/// The files among `layered`'s that set an endpoint and changed after
/// kubelet started: kubelet has not read what they say now.
pub fn changed_since(layered: &Layered, started: SystemTime) -> Vec<PathBuf> {
    // /proc's start time is whole seconds at best: allow one.
    let started = started + Duration::from_secs(1);
    let mut changed: Vec<PathBuf> = [&layered.runtime.source, &layered.image.source]
        .into_iter()
        .filter_map(|source| match source {
            Source::File(path) => Some(path),
            _ => None,
        })
        .filter(|path| {
            layered
                .files
                .iter()
                .any(|(p, modified)| p == *path && modified.is_some_and(|m| m > started))
        })
        .cloned()
        .collect();
    changed.dedup();
    changed
}

/// kubelet's `/configz` answer: `{"kubeletconfig": {...}}`.
pub fn from_configz(answer: &Value) -> Option<Layered> {
    let config = answer.get("kubeletconfig")?.clone();
    let (runtime, image) = endpoints(&config, &Default::default(), &Flags::default());
    Some(Layered {
        config,
        runtime,
        image,
        files: Vec::new(),
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    fn args(line: &str) -> Vec<String> {
        line.split_whitespace().map(str::to_owned).collect()
    }

    #[test]
    fn flags_in_either_spelling_and_the_last_one_wins() {
        let flags = Flags::parse(&args(
            "/usr/bin/kubelet --config=/var/lib/kubelet/config.yaml --config-dir /etc/kubernetes/kubelet.conf.d \
             -container-runtime-endpoint unix:///a.sock --node-ip=10.0.0.1 --container-runtime-endpoint=unix:///b.sock",
        ));
        assert_eq!(
            flags,
            Flags {
                config: Some("/var/lib/kubelet/config.yaml".into()),
                config_dir: Some("/etc/kubernetes/kubelet.conf.d".into()),
                runtime: Some("unix:///b.sock".into()),
                image: None,
            }
        );
    }

    #[test]
    fn drop_ins_patch_the_file_and_flags_win_over_both() {
        let mut config =
            json!({"containerRuntimeEndpoint": "unix:///file.sock", "featureGates": {"A": true}});
        merge_patch(
            &mut config,
            &json!({"imageServiceEndpoint": "unix:///drop.sock", "featureGates": {"B": true}}),
        );
        assert_eq!(config["featureGates"], json!({"A": true, "B": true}));
        let setters = [(IMAGE_KEY, PathBuf::from("/d/99.conf"))].into();
        let (runtime, image) = endpoints(&config, &setters, &Flags::default());
        assert_eq!(runtime.source, Source::Configz);
        assert_eq!(image.value, "unix:///drop.sock");
        assert_eq!(image.source, Source::File("/d/99.conf".into()));
        let flagged = Flags {
            image: Some("unix:///flag.sock".into()),
            ..Flags::default()
        };
        let (_, image) = endpoints(&config, &setters, &flagged);
        assert_eq!(image.value, "unix:///flag.sock");
        assert_eq!(image.source, Source::Flag("image-service-endpoint"));
    }

    #[test]
    fn unset_endpoints_are_kubelets_defaults() {
        let (runtime, image) = endpoints(&json!({}), &Default::default(), &Flags::default());
        assert_eq!(runtime.value, DEFAULT_RUNTIME);
        assert_eq!(runtime.source, Source::Default);
        assert_eq!(image.value, DEFAULT_RUNTIME);
        assert_eq!(image.source, Source::FollowsRuntime);
    }

    #[test]
    fn a_null_in_a_drop_in_removes_the_key() {
        let mut config = json!({"imageServiceEndpoint": "unix:///x.sock"});
        merge_patch(&mut config, &json!({"imageServiceEndpoint": null}));
        assert_eq!(config, json!({}));
    }

    #[test]
    fn this_processes_start_time_is_read_from_proc() {
        let me = std::process::id();
        let started = started(Path::new("/proc"), &Path::new("/proc").join(me.to_string()))
            .expect("a start time");
        let age = SystemTime::now()
            .duration_since(started)
            .expect("in the past");
        assert!(age < Duration::from_secs(3600), "{age:?}");
    }
}
