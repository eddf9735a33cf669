//! Logging setup.

use std::io::IsTerminal;

use tracing_subscriber::EnvFilter;

/// An error and every source under it, `outer: inner: innermost`, for
/// logs: each of crr-proxy's errors states only its own part.
pub struct Chain<'a>(pub &'a (dyn std::error::Error + 'static));

impl std::fmt::Display for Chain<'_> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "{}", self.0)?;
        let mut next = self.0.source();
        while let Some(source) = next {
            write!(f, ": {source}")?;
            next = source.source();
        }
        Ok(())
    }
}

/// Installs the global subscriber: level from `CRR_PROXY_LOG` (then
/// `RUST_LOG`, then `info`), text or JSON lines on stderr.
/// How log lines are written.
#[derive(Debug, Clone, Copy, PartialEq, Eq, clap::ValueEnum)]
pub enum LogFormat {
    Text,
    Json,
}

pub fn init(format: LogFormat) {
    let filter = ["CRR_PROXY_LOG", "RUST_LOG"]
        .iter()
        .find_map(|var| std::env::var(var).ok())
        .and_then(|spec| EnvFilter::try_new(spec).ok())
        .unwrap_or_else(|| EnvFilter::new("info"));
    let builder = tracing_subscriber::fmt()
        .with_env_filter(filter)
        // Colour only on a terminal: journald and log files get plain text.
        .with_ansi(std::io::stderr().is_terminal())
        .with_writer(std::io::stderr);
    // A second init (tests) keeps the first subscriber; that is fine.
    let _ = match format {
        LogFormat::Text => builder.try_init(),
        LogFormat::Json => builder.json().try_init(),
    };
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn an_error_states_its_own_part_and_the_chain_states_each_once() {
        let error = crate::records::RecordsError::Write {
            path: "/var/lib/crr-proxy/kills".into(),
            source: std::io::Error::other("disk full"),
        };
        assert_eq!(error.to_string(), "writing /var/lib/crr-proxy/kills");
        assert_eq!(
            Chain(&error).to_string(),
            "writing /var/lib/crr-proxy/kills: disk full"
        );
    }
}
