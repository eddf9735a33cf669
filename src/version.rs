//! What this binary is: its version and the commit it was built from, for
//! `--version` and the `crr_proxy_build_info` metric.

/// The package's version.
pub const VERSION: &str = env!("CARGO_PKG_VERSION");

/// The commit built (12 hex digits), or `unknown` outside a git checkout
/// when the release script named none (build.rs).
pub const COMMIT: &str = env!("CRR_PROXY_COMMIT");

/// `--version`'s text after the program's name.
pub const LONG: &str = concat!(
    env!("CARGO_PKG_VERSION"),
    " (commit ",
    env!("CRR_PROXY_COMMIT"),
    ")"
);

/// Names crr-proxy to the API server in `config`'s requests, as client-go
/// names its programs: `crr-proxy/<version> (<part>; commit <commit>)`,
/// `part` being `agent`, `check` or `restart`. The API server's request
/// log and audit events show it; kube's client sends none of its own.
pub fn identify(config: &mut kube::Config, part: &str) {
    let agent = format!("crr-proxy/{VERSION} ({part}; commit {COMMIT})");
    if let Ok(value) = http::HeaderValue::from_str(&agent) {
        config
            .headers
            .retain(|(name, _)| name != http::header::USER_AGENT);
        config.headers.push((http::header::USER_AGENT, value));
    }
}
