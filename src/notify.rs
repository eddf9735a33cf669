//! systemd's readiness protocol (`sd_notify(3)`): with `Type=notify`,
//! systemd waits for `READY=1` before it starts kubelet (`Before=`), and
//! `STOPPING=1` tells it a stop has begun.

use std::io;
use std::os::unix::net::UnixDatagram;

use tracing::debug;

/// Sends `state` (e.g. `READY=1`) to `$NOTIFY_SOCKET`, when systemd set it.
/// Without systemd this does nothing.
pub fn notify(state: &str) -> io::Result<()> {
    let Some(path) = std::env::var_os("NOTIFY_SOCKET") else {
        return Ok(());
    };
    let socket = UnixDatagram::unbound()?;
    // A receiver whose queue is full must not stall the thread (the relay
    // runs on it): the state is dropped with an error instead.
    socket.set_nonblocking(true)?;
    let bytes = path.as_encoded_bytes();
    match bytes.strip_prefix(b"@") {
        // An abstract socket: "@name" stands for a leading NUL byte.
        Some(name) => {
            use std::os::linux::net::SocketAddrExt;
            let addr = std::os::unix::net::SocketAddr::from_abstract_name(name)?;
            socket.send_to_addr(state.as_bytes(), &addr)?;
        }
        None => {
            socket.send_to(state.as_bytes(), &path)?;
        }
    }
    debug!(state, "notified systemd");
    Ok(())
}
