//! Logging setup.

use std::io::IsTerminal;

use tracing_subscriber::EnvFilter;

use crate::config::LogFormat;

/// Installs the global subscriber: level from `CRR_PROXY_LOG` (then
/// `RUST_LOG`, then `info`), text or JSON lines on stderr.
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
