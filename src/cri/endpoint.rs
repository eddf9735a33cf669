//! CRI endpoints as kubelet spells them: `unix:///path/to.sock`.

use std::fmt;
use std::path::{Path, PathBuf};
use std::str::FromStr;

/// A runtime endpoint: a unix socket path, shown as `unix://<path>`.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Endpoint {
    path: PathBuf,
}

#[derive(Debug, thiserror::Error, PartialEq, Eq)]
pub enum EndpointError {
    #[error("endpoint {0:?} is not supported: only unix:///absolute/path endpoints are")]
    Unsupported(String),
    #[error("endpoint {0:?} must name an absolute socket path")]
    NotAbsolute(String),
}

// === impl Endpoint ===

impl Endpoint {
    pub fn from_path(path: impl Into<PathBuf>) -> Self {
        Self { path: path.into() }
    }

    pub fn path(&self) -> &Path {
        &self.path
    }
}

impl FromStr for Endpoint {
    type Err = EndpointError;

    /// Accepts `unix:///path` and, like kubelet's older flag handling, a bare
    /// absolute path.
    fn from_str(s: &str) -> Result<Self, Self::Err> {
        let path = match s.split_once("://") {
            Some(("unix", path)) => path,
            Some(_) => return Err(EndpointError::Unsupported(s.to_owned())),
            None => s,
        };
        if !path.starts_with('/') {
            return Err(EndpointError::NotAbsolute(s.to_owned()));
        }
        Ok(Self::from_path(path))
    }
}

impl fmt::Display for Endpoint {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "unix://{}", self.path.display())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn parses_unix_urls_and_bare_paths() {
        let e: Endpoint = "unix:///run/containerd/containerd.sock".parse().unwrap();
        assert_eq!(e.path(), Path::new("/run/containerd/containerd.sock"));
        assert_eq!(e.to_string(), "unix:///run/containerd/containerd.sock");
        let bare: Endpoint = "/tmp/x.sock".parse().unwrap();
        assert_eq!(bare.to_string(), "unix:///tmp/x.sock");
    }

    #[test]
    fn rejects_other_schemes_and_relative_paths() {
        assert_eq!(
            "tcp://127.0.0.1:1".parse::<Endpoint>(),
            Err(EndpointError::Unsupported("tcp://127.0.0.1:1".into()))
        );
        assert_eq!(
            "unix://relative.sock".parse::<Endpoint>(),
            Err(EndpointError::NotAbsolute("unix://relative.sock".into()))
        );
        assert!("".parse::<Endpoint>().is_err());
    }
}
