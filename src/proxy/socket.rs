//! The relay's two sockets and its read buffers.
//!
//! Tokio's `UnixStream` registers for writability as well as readability.
//! On a unix socket the writer is woken every time its peer reads, so a
//! relay that mostly never waits to write would wake up twice per call for
//! nothing. A `Socket` is registered for readability only; writes are tried
//! directly, and only while one would block does it also wait to write.

use std::future::poll_fn;
use std::io::{self, Read, Write};
use std::net::Shutdown;
use std::os::unix::net::UnixStream;
use std::task::{Context, Poll, ready};
use std::time::Duration;

use tokio::io::Interest;
use tokio::io::unix::AsyncFd;

pub(super) struct Socket {
    /// `None` only while being registered anew.
    fd: Option<AsyncFd<UnixStream>>,
    /// Registered for writability too (a write would block).
    waiting_to_write: bool,
}

impl Socket {
    pub fn new(stream: tokio::net::UnixStream) -> io::Result<Self> {
        Ok(Self {
            fd: Some(registered(stream.into_std()?, Interest::READABLE)?),
            waiting_to_write: false,
        })
    }

    fn fd(&self) -> io::Result<&AsyncFd<UnixStream>> {
        self.fd
            .as_ref()
            .ok_or_else(|| io::Error::from(io::ErrorKind::NotConnected))
    }

    fn register(&mut self, interest: Interest) -> io::Result<()> {
        let stream = self
            .fd
            .take()
            .ok_or_else(|| io::Error::from(io::ErrorKind::NotConnected))?
            .into_inner();
        self.fd = Some(registered(stream, interest)?);
        Ok(())
    }

    /// One read into `inbox`. A short read means the socket is drained, so
    /// the next poll waits for readiness instead of trying a futile read.
    pub fn poll_read(
        &mut self,
        cx: &mut Context<'_>,
        inbox: &mut Inbox,
    ) -> Poll<io::Result<usize>> {
        let fd = self.fd()?;
        loop {
            let mut guard = ready!(fd.poll_read_ready(cx))?;
            let spare = inbox.spare(READ_CHUNK);
            let room = spare.len();
            match guard.get_inner().read(spare) {
                Ok(n) => {
                    if 0 < n && n < room {
                        guard.clear_ready();
                    }
                    inbox.filled(n);
                    return Poll::Ready(Ok(n));
                }
                Err(e) if e.kind() == io::ErrorKind::WouldBlock => guard.clear_ready(),
                Err(e) => return Poll::Ready(Err(e)),
            }
        }
    }

    /// Writes what it can of `data`.
    pub fn poll_write(&mut self, cx: &mut Context<'_>, data: &[u8]) -> Poll<io::Result<usize>> {
        if !self.waiting_to_write {
            match self.fd()?.get_ref().write(data) {
                Err(e) if e.kind() == io::ErrorKind::WouldBlock => {
                    self.register(Interest::READABLE | Interest::WRITABLE)?;
                    self.waiting_to_write = true;
                }
                written => return Poll::Ready(written),
            }
        }
        let fd = self.fd()?;
        loop {
            let mut guard = ready!(fd.poll_write_ready(cx))?;
            match guard.try_io(|stream| stream.get_ref().write(data)) {
                Ok(written) => return Poll::Ready(written),
                Err(_would_block) => continue,
            }
        }
    }

    /// Everything queued is written: stop waking up for writability.
    pub fn drained(&mut self) -> io::Result<()> {
        if self.waiting_to_write {
            self.waiting_to_write = false;
            self.register(Interest::READABLE)?;
        }
        Ok(())
    }

    pub fn shutdown_write(&self) {
        if let Ok(fd) = self.fd() {
            let _ = fd.get_ref().shutdown(Shutdown::Write);
        }
    }

    /// Ends the connection so that what was written reaches the peer.
    ///
    /// Linux fails the peer's reads with ECONNRESET when a unix socket is
    /// closed while bytes it received wait unread, and the peer may lose
    /// what it had not read yet, a final GOAWAY included. So unless the
    /// peer has already finished (`peer_done`), the socket says it is done
    /// and reads, discarding, until the peer closes too (at most `CLOSE_LINGER`).
    pub async fn close(mut self, peer_done: bool) {
        self.shutdown_write();
        if peer_done {
            return;
        }
        let mut scratch = Inbox::default();
        let discard = poll_fn(|cx| {
            loop {
                match ready!(self.poll_read(cx, &mut scratch)) {
                    Ok(0) | Err(_) => return Poll::Ready(()),
                    Ok(n) => scratch.consume(n),
                }
            }
        });
        let _ = tokio::time::timeout(CLOSE_LINGER, discard).await;
    }
}

/// How long `Socket::close` waits for the peer to close.
const CLOSE_LINGER: Duration = Duration::from_secs(1);

/// Registers `stream` with the runtime for `interest` only.
///
/// Tokio deprecated the safe constructor in favour of an `unsafe` one whose
/// contract is that the descriptor stays open and the same for as long as
/// the `AsyncFd` lives. A std `UnixStream` owns its descriptor and the
/// `AsyncFd` owns the stream, so that holds, and this crate stays free of
/// `unsafe`.
#[allow(deprecated)]
fn registered(stream: UnixStream, interest: Interest) -> io::Result<AsyncFd<UnixStream>> {
    AsyncFd::with_interest(stream, interest)
}

/// Reads are at least this large.
const READ_CHUNK: usize = 64 << 10;

/// Bytes read and not yet handled. The buffer is zeroed once, as it grows,
/// and reused.
#[derive(Default)]
pub(super) struct Inbox {
    buf: Vec<u8>,
    start: usize,
    end: usize,
}

impl Inbox {
    pub fn data(&self) -> &[u8] {
        &self.buf[self.start..self.end]
    }

    pub fn consume(&mut self, n: usize) {
        self.start = (self.start + n).min(self.end);
        if self.start == self.end {
            self.start = 0;
            self.end = 0;
        }
    }

    /// At least `want` bytes of room after the data.
    pub fn spare(&mut self, want: usize) -> &mut [u8] {
        if self.buf.len() - self.end < want {
            if self.start > 0 {
                // Only when it frees room: at 0 it would move it all for nothing.
                self.buf.copy_within(self.start..self.end, 0);
                self.end -= self.start;
                self.start = 0;
            }
            if self.buf.len() - self.end < want {
                self.buf.resize(self.end + want, 0);
            }
        }
        &mut self.buf[self.end..]
    }

    pub fn filled(&mut self, n: usize) {
        self.end = (self.end + n).min(self.buf.len());
    }

    pub fn extend(&mut self, bytes: &[u8]) {
        self.spare(bytes.len())[..bytes.len()].copy_from_slice(bytes);
        self.filled(bytes.len());
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_inbox_compacts_and_grows() {
        let mut inbox = Inbox::default();
        inbox.extend(b"hello world");
        inbox.consume(6);
        assert_eq!(inbox.data(), b"world");
        let room = inbox.spare(READ_CHUNK).len();
        assert!(room >= READ_CHUNK);
        inbox.spare(3)[..3].copy_from_slice(b"!!!");
        inbox.filled(3);
        assert_eq!(inbox.data(), b"world!!!");
        inbox.consume(100);
        assert_eq!(inbox.data(), b"");
    }
}
