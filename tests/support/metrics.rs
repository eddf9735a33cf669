//! crr-proxy's `/metrics` text, read back by tests.

use std::collections::BTreeMap;

use anyhow::{Context, Result, bail};

/// The `/metrics` text of the crr-proxy serving `addr` (`host:port`).
#[allow(dead_code)] // each test binary uses a different part
pub fn scrape(addr: &str) -> Result<String> {
    use std::io::{Read, Write};
    let mut stream = std::net::TcpStream::connect(addr)?;
    write!(stream, "GET /metrics HTTP/1.0\r\nHost: {addr}\r\n\r\n")?;
    let mut answer = String::new();
    stream.read_to_string(&mut answer)?;
    let (head, body) = answer
        .split_once("\r\n\r\n")
        .context("no HTTP answer from /metrics")?;
    if !head.starts_with("HTTP/1.1 200") && !head.starts_with("HTTP/1.0 200") {
        bail!("/metrics: {head}");
    }
    Ok(body.to_owned())
}

/// CRI calls by `Service/Method`, from a `/metrics` text.
pub fn cri_calls(metrics: &str) -> BTreeMap<String, u64> {
    let mut calls = BTreeMap::new();
    for ((method, _code), count) in cri_calls_by_code(metrics) {
        *calls.entry(method).or_default() += count;
    }
    calls
}

/// CRI calls by `Service/Method` and gRPC code (`OK`, `UNIMPLEMENTED`),
/// from a `/metrics` text.
pub fn cri_calls_by_code(metrics: &str) -> BTreeMap<(String, String), u64> {
    let mut calls = BTreeMap::new();
    for line in metrics.lines() {
        let Some(rest) = line.strip_prefix("crr_proxy_cri_requests_total{") else {
            continue;
        };
        let label = |name: &str| {
            rest.split(&format!("{name}=\""))
                .nth(1)
                .and_then(|v| v.split('"').next())
                .unwrap_or_default()
                .to_owned()
        };
        let count: u64 = line
            .rsplit(' ')
            .next()
            .and_then(|v| v.parse().ok())
            .unwrap_or_default();
        *calls
            .entry((
                format!("{}/{}", label("service"), label("method")),
                label("code"),
            ))
            .or_default() += count;
    }
    calls
}
