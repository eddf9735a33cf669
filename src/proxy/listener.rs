//! The listening socket: inherited from systemd, or bound safely by us.

use std::io;
use std::os::unix::fs::{FileTypeExt, MetadataExt, PermissionsExt};
use std::path::{Path, PathBuf};

use tokio::net::UnixListener;
use tracing::{info, warn};

/// Socket file mode: kubelet (root) and the node's admin group, nobody else.
const SOCKET_MODE: u32 = 0o660;

#[derive(Debug, thiserror::Error)]
pub enum ListenError {
    #[error("{path}: another server is already listening there; refusing to take it over")]
    InUse { path: PathBuf },
    #[error("{path}: exists and is not a socket; refusing to replace it")]
    NotASocket { path: PathBuf },
    #[error(
        "{dir}: the socket's directory is writable by anyone; use a directory of its own (e.g. /run/crr-proxy)"
    )]
    WorldWritable { dir: PathBuf },
    #[error("{path}: {context}")]
    Io {
        path: PathBuf,
        context: &'static str,
        #[source]
        source: io::Error,
    },
    #[error("socket activation")]
    Activation(#[source] io::Error),
}

/// A listening unix socket and where it came from.
#[derive(Debug)]
pub struct Listener {
    listener: UnixListener,
    /// The socket file we created (absent when systemd owns it), with its
    /// inode so that we never remove a file some later process put there.
    owned: Option<(PathBuf, u64)>,
}

// === impl Listener ===

impl Listener {
    /// Takes the socket systemd passed (`LISTEN_FDS`), or binds `path`.
    pub fn open(path: &Path) -> Result<Self, ListenError> {
        if let Some(listener) = inherited()? {
            info!("serving the socket passed by systemd (socket activation)");
            return Ok(Self {
                listener,
                owned: None,
            });
        }
        Self::bind(path)
    }

    /// Binds `path` with mode 0660, replacing a stale socket file left by a
    /// dead process but never one a live server still answers on.
    pub fn bind(path: &Path) -> Result<Self, ListenError> {
        let io_err = |context| {
            let path = path.to_owned();
            move |source| ListenError::Io {
                path,
                context,
                source,
            }
        };
        if let Some(dir) = path.parent().filter(|d| !d.as_os_str().is_empty()) {
            std::fs::create_dir_all(dir).map_err(io_err("create parent directory"))?;
            // Anyone who can write there could swap the socket kubelet uses.
            let mode = std::fs::metadata(dir)
                .map_err(io_err("inspect parent directory"))?
                .permissions()
                .mode();
            if mode & 0o002 != 0 {
                return Err(ListenError::WorldWritable {
                    dir: dir.to_owned(),
                });
            }
        }
        match std::fs::symlink_metadata(path) {
            Ok(meta) if !meta.file_type().is_socket() => {
                return Err(ListenError::NotASocket {
                    path: path.to_owned(),
                });
            }
            Ok(_) => match std::os::unix::net::UnixStream::connect(path) {
                Ok(_) => {
                    return Err(ListenError::InUse {
                        path: path.to_owned(),
                    });
                }
                Err(e) if e.kind() == io::ErrorKind::ConnectionRefused => {
                    warn!(path = %path.display(), "replacing stale socket file");
                }
                Err(e) => return Err(io_err("probe existing socket")(e)),
            },
            Err(e) if e.kind() == io::ErrorKind::NotFound => {}
            Err(e) => return Err(io_err("inspect")(e)),
        }

        // Bind under a temporary name, set the mode, then rename into place:
        // the socket is never reachable with a wider mode than 0660.
        let tmp = temporary_name(path);
        let _ = std::fs::remove_file(&tmp);
        let listener = UnixListener::bind(&tmp).map_err(io_err("bind"))?;
        let placed = std::fs::set_permissions(&tmp, std::fs::Permissions::from_mode(SOCKET_MODE))
            .map_err(io_err("set socket mode"))
            .and_then(|()| std::fs::rename(&tmp, path).map_err(io_err("move socket into place")));
        if let Err(e) = placed {
            let _ = std::fs::remove_file(&tmp);
            return Err(e);
        }
        let inode = std::fs::symlink_metadata(path)
            .map_err(io_err("inspect"))?
            .ino();
        info!(path = %path.display(), "listening");
        Ok(Self {
            listener,
            owned: Some((path.to_owned(), inode)),
        })
    }

    /// The listener to serve, and a guard that removes our socket file when
    /// dropped.
    pub fn into_parts(self) -> (UnixListener, SocketFile) {
        (self.listener, SocketFile(self.owned))
    }
}

/// Removes the socket file crr-proxy created, when it still is ours.
#[derive(Debug)]
pub struct SocketFile(Option<(PathBuf, u64)>);

impl Drop for SocketFile {
    fn drop(&mut self) {
        if let Some((path, inode)) = &self.0 {
            let ours = std::fs::symlink_metadata(path).is_ok_and(|m| m.ino() == *inode);
            if ours {
                let _ = std::fs::remove_file(path);
            }
        }
    }
}

fn temporary_name(path: &Path) -> PathBuf {
    let mut name = path.file_name().unwrap_or_default().to_os_string();
    name.push(format!(".{}.tmp", std::process::id()));
    path.with_file_name(name)
}

/// The first socket passed by systemd, if `LISTEN_FDS`/`LISTEN_PID` name us.
fn inherited() -> Result<Option<UnixListener>, ListenError> {
    let mut fds = listenfd::ListenFd::from_env();
    if fds.len() == 0 {
        return Ok(None);
    }
    let std_listener = fds
        .take_unix_listener(0)
        .map_err(ListenError::Activation)?
        .ok_or_else(|| ListenError::Activation(io::Error::other("fd 3 is not a unix socket")))?;
    std_listener
        .set_nonblocking(true)
        .map_err(ListenError::Activation)?;
    UnixListener::from_std(std_listener)
        .map(Some)
        .map_err(ListenError::Activation)
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A socket path two levels below a fresh directory, removed on drop.
    struct Scratch(PathBuf);

    impl Scratch {
        fn new(name: &str) -> Self {
            let dir = std::env::temp_dir()
                .join(format!("crr-proxy-listener-{}-{name}", std::process::id()));
            let _ = std::fs::remove_dir_all(&dir);
            Self(dir)
        }

        fn socket(&self) -> PathBuf {
            self.0.join("sub/proxy.sock")
        }
    }

    impl Drop for Scratch {
        fn drop(&mut self) {
            let _ = std::fs::remove_dir_all(&self.0);
        }
    }

    #[tokio::test]
    async fn binds_with_mode_0660_and_removes_its_file() {
        let scratch = Scratch::new("mode");
        let path = scratch.socket();
        let (listener, file) = Listener::bind(&path).unwrap().into_parts();
        let mode = std::fs::metadata(&path).unwrap().permissions().mode() & 0o777;
        assert_eq!(mode, 0o660);
        drop(listener);
        drop(file);
        assert!(!path.exists());
    }

    #[tokio::test]
    async fn replaces_a_stale_socket_but_not_a_live_one() {
        let scratch = Scratch::new("stale");
        let path = scratch.socket();
        std::fs::create_dir_all(path.parent().unwrap()).unwrap();
        // A socket file whose server is gone: bind, then drop the listener.
        drop(std::os::unix::net::UnixListener::bind(&path).unwrap());
        assert!(path.exists());
        let live = Listener::bind(&path).unwrap();
        match Listener::bind(&path) {
            Err(ListenError::InUse { .. }) => {}
            other => panic!("expected InUse, got {other:?}"),
        }
        drop(live);
    }

    #[tokio::test]
    async fn refuses_a_world_writable_directory() {
        let scratch = Scratch::new("world");
        let path = scratch.socket();
        let dir = path.parent().unwrap();
        std::fs::create_dir_all(dir).unwrap();
        std::fs::set_permissions(dir, std::fs::Permissions::from_mode(0o1777)).unwrap();
        assert!(matches!(
            Listener::bind(&path),
            Err(ListenError::WorldWritable { .. })
        ));
        assert!(!path.exists());
    }

    #[tokio::test]
    async fn refuses_to_replace_a_regular_file() {
        let scratch = Scratch::new("file");
        let path = scratch.socket();
        std::fs::create_dir_all(path.parent().unwrap()).unwrap();
        std::fs::write(&path, b"keep me").unwrap();
        assert!(matches!(
            Listener::bind(&path),
            Err(ListenError::NotASocket { .. })
        ));
        assert_eq!(std::fs::read(&path).unwrap(), b"keep me");
    }
}
