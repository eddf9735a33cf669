//! Generates the CRI client from proto/ with a pure-Rust protobuf compiler, so
//! a fresh machine needs no system `protoc`; and names the commit built, so
//! that an operator can tell what each node runs.

use std::process::Command;

fn main() -> Result<(), Box<dyn std::error::Error>> {
    println!("cargo:rerun-if-changed=proto");
    let descriptors = protox::compile(["runtime/v1/api.proto"], ["proto"])?;
    tonic_prost_build::configure()
        .build_server(false)
        .compile_fds(descriptors)?;
    println!("cargo:rustc-env=CRR_PROXY_COMMIT={}", commit());
    Ok(())
}

/// `CRR_PROXY_COMMIT` when set (a build from a release tarball, which has no
/// git history), else the checkout's HEAD, else `unknown`.
fn commit() -> String {
    println!("cargo:rerun-if-env-changed=CRR_PROXY_COMMIT");
    if let Ok(commit) = std::env::var("CRR_PROXY_COMMIT") {
        return commit;
    }
    // Built again when HEAD moves: HEAD itself, the branch it names, and
    // packed refs. Only files that exist are named (cargo would otherwise
    // run this script on every build).
    let branch = git(&["symbolic-ref", "-q", "HEAD"]);
    for name in ["HEAD", "packed-refs"].into_iter().chain(branch.as_deref()) {
        if let Some(path) = git(&["rev-parse", "--git-path", name])
            && std::path::Path::new(&path).exists()
        {
            println!("cargo:rerun-if-changed={path}");
        }
    }
    git(&["rev-parse", "--short=12", "HEAD"]).unwrap_or_else(|| "unknown".into())
}

/// What `git args` prints in the package's folder, when it succeeds.
fn git(args: &[&str]) -> Option<String> {
    let dir = std::env::var("CARGO_MANIFEST_DIR").ok()?;
    let out = Command::new("git")
        .arg("-C")
        .arg(&dir)
        .args(args)
        .output()
        .ok()?;
    let text = String::from_utf8(out.stdout).ok()?;
    let text = text.trim();
    (out.status.success() && !text.is_empty()).then(|| {
        // --git-path answers relative to the package's folder.
        if args.first() == Some(&"rev-parse") && args.get(1) == Some(&"--git-path") {
            std::path::Path::new(&dir).join(text).display().to_string()
        } else {
            text.to_owned()
        }
    })
}
