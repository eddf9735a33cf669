//! systemd's part for a socket-activated service, played by a small Python
//! supervisor: it binds and holds the listening socket and starts the
//! service with it as fd 3 (`LISTEN_FDS=1`, `LISTEN_PID`), as
//! crr-proxy.socket and crr-proxy.service do. SIGHUP restarts the service
//! while its socket unit stays active (SIGTERM, wait, a pause, start
//! again: the pause plays `RestartSec=`), keeping the socket: connections
//! made meanwhile wait in its backlog. SIGTERM stops the service, then the
//! supervisor.

use std::path::Path;
use std::process::Command;
use std::time::Duration;

const SUPERVISE: &str = r#"
import os, signal, socket, subprocess, sys, time
path, pause, binary, args = sys.argv[1], float(sys.argv[2]), sys.argv[3], sys.argv[4:]
asked = []
signal.signal(signal.SIGHUP, lambda *_: asked.append("restart"))
signal.signal(signal.SIGTERM, lambda *_: asked.append("stop"))
s = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
# Listening before the path appears: a client that sees it can connect.
s.bind(path + ".new")
s.listen(4096)
os.rename(path + ".new", path)
fd = s.fileno()
def setup():
    os.dup2(fd, 3)
    os.environ["LISTEN_FDS"] = "1"
    os.environ["LISTEN_PID"] = str(os.getpid())
def start():
    return subprocess.Popen([binary] + args, preexec_fn=setup, pass_fds=(3,))
child = start()
while True:
    while not asked:
        time.sleep(0.01)
    what = asked.pop(0)
    child.send_signal(signal.SIGTERM)
    child.wait()
    if what == "stop":
        break
    time.sleep(pause)
    child = start()
"#;

/// A command that runs `binary` (its arguments to be added) under the
/// supervisor, on the socket `socket`, pausing `pause` in each restart.
pub fn supervised(socket: &Path, pause: Duration, binary: &Path) -> Command {
    let mut command = Command::new("python3");
    command
        .args(["-c", SUPERVISE])
        .arg(socket)
        .arg(pause.as_secs_f64().to_string())
        .arg(binary);
    command
}
