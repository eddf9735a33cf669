//! The Python peers of tests/peers/ (clients and a scripted runtime we did
//! not write), run with the interpreter of their virtualenv.

use std::io::{BufRead, BufReader, Write};
use std::path::{Path, PathBuf};
use std::process::{Child, ChildStdin, ChildStdout, Command, Stdio};

use serde_json::Value;

/// The interpreter of the peers' virtualenv (scripts/lib/peers.sh).
pub fn python() -> PathBuf {
    let python = std::env::var_os("CRR_TEST_PYTHON")
        .map(PathBuf::from)
        .unwrap_or_else(|| "/var/cache/crr-proxy-test/peers-venv/bin/python".into());
    assert!(
        python.exists(),
        "{} is missing: scripts/test.sh installs the Python peers (ensure_peers)",
        python.display()
    );
    python
}

pub fn script(name: &str) -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("tests/peers")
        .join(name)
}

pub fn peer_command(name: &str) -> Command {
    let mut command = Command::new(python());
    command.arg("-B").arg(script(name));
    command
}

/// A grpcio channel in a Python process, one call per line.
pub struct GrpcPeer {
    child: Child,
    stdin: ChildStdin,
    stdout: BufReader<ChildStdout>,
}

impl GrpcPeer {
    pub fn start(socket: &Path) -> Self {
        Self::start_with(socket, &[])
    }

    /// With more of grpc_peer.py's options (`--authority`, `--option`).
    pub fn start_with(socket: &Path, extra: &[&str]) -> Self {
        let mut child = peer_command("grpc_peer.py")
            .arg("--socket")
            .arg(socket)
            .args(extra)
            .stdin(Stdio::piped())
            .stdout(Stdio::piped())
            .spawn()
            .unwrap();
        let stdin = child.stdin.take().unwrap();
        let stdout = BufReader::new(child.stdout.take().unwrap());
        Self {
            child,
            stdin,
            stdout,
        }
    }

    /// One call on the channel; grpcio's answer as JSON.
    pub async fn call(&mut self, path: &str, timeout_s: u32) -> Value {
        tokio::task::block_in_place(move || self.call_blocking(path, timeout_s))
    }

    /// `call`, for a thread of its own.
    pub fn call_blocking(&mut self, path: &str, timeout_s: u32) -> Value {
        let line = format!("call {path} - {timeout_s}\n");
        self.stdin.write_all(line.as_bytes()).unwrap();
        self.stdin.flush().unwrap();
        let mut answer = String::new();
        self.stdout.read_line(&mut answer).unwrap();
        serde_json::from_str(&answer).unwrap_or_else(|e| panic!("{e}: {answer:?}"))
    }
}

impl Drop for GrpcPeer {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}
