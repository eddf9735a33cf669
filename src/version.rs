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
