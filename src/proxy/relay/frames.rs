//! Reading what came on a socket: the client's connection preface, then
//! whole frames, each handed on once it is all there.

use super::super::frame::{self, Head};
use super::super::socket::Inbox;
use super::RelayError;

/// Takes the client's connection preface from the front of `inbox`:
/// `Ok(true)` once it has come whole (and is consumed), `Ok(false)` while
/// what came may still be its start.
pub(super) fn take_preface(inbox: &mut Inbox) -> Result<bool, RelayError> {
    match frame::preface(inbox.data()) {
        None => Err(RelayError::Preface),
        Some(false) => Ok(false),
        Some(true) => {
            inbox.consume(frame::PREFACE.len());
            Ok(true)
        }
    }
}

/// Hands each whole frame at the front of `inbox` (head and all its bytes)
/// to `each`, in order, consuming it once handled, up to a frame still
/// coming. A frame longer than `limit` is the peer's error. The relay's
/// two directions and the stand-in read frames this one way.
pub(super) fn each_frame(
    inbox: &mut Inbox,
    limit: usize,
    mut each: impl FnMut(Head, &[u8]) -> Result<(), RelayError>,
) -> Result<(), RelayError> {
    while let Some((head, frame)) =
        frame::next(inbox.data(), limit).map_err(|len| RelayError::FrameTooLarge { len, limit })?
    {
        each(head, frame)?;
        inbox.consume(frame.len());
    }
    Ok(())
}
