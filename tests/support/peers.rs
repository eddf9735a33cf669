//! The Python peers of tests/peers/ (clients and a scripted runtime we did
//! not write), run with the interpreter of their virtualenv.

use std::io::{BufRead, BufReader, Write};
use std::path::{Path, PathBuf};
use std::process::{Child, ChildStdin, ChildStdout, Command, Stdio};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

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
        self.call_with(path, &[], timeout_s)
    }

    /// A unary call with `request` as its message.
    pub fn call_with(&mut self, path: &str, request: &[u8], timeout_s: u32) -> Value {
        self.command("call", path, request, timeout_s);
        self.answer()
    }

    /// A server-streaming call: `on_message` sees each response as grpcio
    /// hands it over, before the next is read; then the call's end.
    pub fn stream(
        &mut self,
        path: &str,
        request: &[u8],
        timeout_s: u32,
        mut on_message: impl FnMut(usize, &[u8]),
    ) -> (Vec<Vec<u8>>, Value) {
        self.command("stream", path, request, timeout_s);
        let mut messages = Vec::new();
        loop {
            let line = self.answer();
            let Some(message) = line["message"].as_str() else {
                return (messages, line);
            };
            let message = from_hex(message);
            on_message(messages.len(), &message);
            messages.push(message);
        }
    }

    fn command(&mut self, verb: &str, path: &str, request: &[u8], timeout_s: u32) {
        let request = if request.is_empty() {
            "-".to_owned()
        } else {
            to_hex(request)
        };
        let line = format!("{verb} {path} {request} {timeout_s}\n");
        self.stdin.write_all(line.as_bytes()).unwrap();
        self.stdin.flush().unwrap();
    }

    fn answer(&mut self) -> Value {
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

/// Runs h2_peer.py's client `scenario` against the proxy at `socket` to its
/// end: its JSON figures, or what it said went wrong.
pub async fn h2_peer(scenario: &str, socket: &Path, extra: &[&str]) -> Result<Value, String> {
    let mut args = vec![scenario.to_owned(), "--socket".into()];
    args.push(socket.display().to_string());
    args.extend(extra.iter().map(|s| s.to_string()));
    tokio::task::spawn_blocking(move || {
        let out = peer_command("h2_peer.py").args(&args).output().unwrap();
        let stderr = String::from_utf8_lossy(&out.stderr).trim().to_owned();
        match out.status.success() {
            true => Ok(serde_json::from_slice(&out.stdout).unwrap()),
            false => Err(format!("h2_peer {args:?}: {}: {stderr}", out.status)),
        }
    })
    .await
    .unwrap()
}

/// cri_runtime.py: a grpcio server speaking the newest CRI calls, which
/// reports each call it served.
pub struct CriRuntime {
    pub socket: PathBuf,
    release_dir: PathBuf,
    child: Child,
    calls: Arc<Mutex<Vec<Value>>>,
}

impl CriRuntime {
    pub fn start(extra: &[&str]) -> Self {
        let socket = super::temp_socket("cri-runtime");
        let release_dir = socket.with_file_name("release");
        std::fs::create_dir_all(&release_dir).unwrap();
        let mut child = peer_command("cri_runtime.py")
            .arg("--socket")
            .arg(&socket)
            .arg("--release-dir")
            .arg(&release_dir)
            .args(extra)
            .stdout(Stdio::piped())
            .spawn()
            .unwrap();
        let mut stdout = BufReader::new(child.stdout.take().unwrap());
        let mut ready = String::new();
        stdout.read_line(&mut ready).unwrap();
        assert_eq!(ready.trim(), "ready", "cri_runtime.py did not start");
        let calls = Arc::new(Mutex::new(Vec::new()));
        let record = Arc::clone(&calls);
        std::thread::spawn(move || {
            for line in stdout.lines().map_while(Result::ok) {
                let call: Value = serde_json::from_str(&line).unwrap_or(Value::String(line));
                record.lock().unwrap().push(call);
            }
        });
        Self {
            socket,
            release_dir,
            child,
            calls,
        }
    }

    pub fn endpoint(&self) -> crr_proxy::proxy::Endpoint {
        crr_proxy::proxy::Endpoint::from_path(&self.socket)
    }

    /// The file whose existence lets the stream of `path` go on past its
    /// first response.
    pub fn release_file(&self, path: &str) -> PathBuf {
        self.release_dir.join(path.rsplit('/').next().unwrap())
    }

    pub fn release(&self, path: &str) {
        std::fs::write(self.release_file(path), b"released").unwrap();
    }

    /// The runtime's report of the next call of `path` to end, waited for
    /// (and taken, so that the next look finds the call after it).
    pub fn ended(&self, path: &str) -> Value {
        let deadline = Instant::now() + Duration::from_secs(30);
        loop {
            {
                let mut calls = self.calls.lock().unwrap();
                if let Some(at) = calls.iter().position(|c| c["method"] == path) {
                    return calls.remove(at);
                }
            }
            assert!(Instant::now() < deadline, "cri_runtime.py: no {path} ended");
            std::thread::sleep(Duration::from_millis(10));
        }
    }
}

impl Drop for CriRuntime {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
        super::remove_socket_dir(&self.socket);
    }
}

pub fn to_hex(bytes: &[u8]) -> String {
    bytes.iter().map(|b| format!("{b:02x}")).collect()
}

pub fn from_hex(text: &str) -> Vec<u8> {
    (0..text.len())
        .step_by(2)
        .map(|i| u8::from_str_radix(&text[i..i + 2], 16).expect("hex"))
        .collect()
}
