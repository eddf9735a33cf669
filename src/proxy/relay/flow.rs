//! Flow control of the answers the relay edits (RFC 9113 §5.2, §6.9).
//!
//! An edit changes an answer's length, so the runtime's idea of the
//! client's windows no longer matches the client's. For edited streams the
//! relay runs flow control itself: it credits the runtime for what it
//! received, sends the client no more than the client's windows allow, and
//! keeps back the client's connection credit for the bytes it sent in the
//! runtime's place. Unedited streams keep end-to-end flow control: the
//! client's stream credit passes through, and only the connection window,
//! which both kinds share, is tracked here too.
//!
//! The runtime's connection credit for edited bytes is kept here too
//! (`RuntimeCredit`). Pure arithmetic: the relay decides what to write.

use super::super::frame;

/// The client's windows as the relay has spent them.
#[derive(Debug)]
pub(super) struct ClientFlow {
    /// The connection window.
    connection: i64,
    /// Connection credit the client will return for edited bytes; the
    /// relay credited the runtime for those itself, so it keeps this back.
    owed: i64,
    /// SETTINGS_INITIAL_WINDOW_SIZE: what an edited stream's window starts at.
    initial: i64,
}

/// Edited bytes the relay holds before it stops crediting the runtime's
/// connection window for more.
pub(super) const HELD_LIMIT: usize = 1 << 20;

/// The runtime's connection credit for edited bytes: returned at once, as
/// the bytes are out of the connection window's way in the relay, but kept
/// back while the relay holds more than `HELD_LIMIT` in all, which bounds
/// what a client that never reads can make the relay hold.
#[derive(Debug, Default)]
pub(super) struct RuntimeCredit {
    kept: u32,
}

impl RuntimeCredit {
    /// `bytes` edited bytes came while the relay holds `held`: the
    /// connection credit to return now, if any.
    pub(super) fn received(&mut self, bytes: u32, held: usize) -> Option<u32> {
        if held <= HELD_LIMIT {
            return (bytes > 0).then_some(bytes);
        }
        self.kept = self.kept.saturating_add(bytes);
        None
    }

    /// The relay holds `held` now: the credit kept back that may go.
    pub(super) fn release(&mut self, held: usize) -> Option<u32> {
        (self.kept > 0 && held <= HELD_LIMIT).then(|| std::mem::take(&mut self.kept))
    }
}

/// An edited stream's window at the client.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) struct Window(i64);

impl Default for ClientFlow {
    fn default() -> Self {
        Self {
            connection: frame::DEFAULT_WINDOW,
            owed: 0,
            initial: frame::DEFAULT_WINDOW,
        }
    }
}

impl ClientFlow {
    /// A new edited stream's window.
    pub fn open(&self) -> Window {
        Window(self.initial)
    }

    /// How many DATA bytes the client takes now: on an edited stream
    /// (`Some`, its window) or an unedited one, whose own window the runtime
    /// keeps to.
    pub fn room(&self, stream: Option<Window>) -> usize {
        let room = match stream {
            Some(Window(window)) => self.connection.min(window),
            None => self.connection,
        };
        usize::try_from(room).unwrap_or(0)
    }

    /// `len` DATA bytes went to the client.
    pub fn spend(&mut self, len: usize, stream: Option<&mut Window>) {
        let len = i64::try_from(len).unwrap_or(i64::MAX);
        self.connection -= len;
        if let Some(Window(window)) = stream {
            *window -= len;
            self.owed += len;
        }
    }

    /// The client credited the connection: what of it the runtime is owed
    /// (the rest repays bytes the relay sent for edits).
    pub fn credit(&mut self, increment: u32) -> u32 {
        let increment = i64::from(increment);
        self.connection += increment;
        let repaid = self.owed.min(increment);
        self.owed -= repaid;
        u32::try_from(increment - repaid).unwrap_or(0)
    }

    /// The client changed SETTINGS_INITIAL_WINDOW_SIZE: every edited
    /// stream's window moves by the returned delta (RFC 9113 §6.9.2).
    pub fn initial_window(&mut self, value: u32) -> i64 {
        let delta = i64::from(value) - self.initial;
        self.initial = i64::from(value);
        delta
    }
}

impl Window {
    pub fn grow(&mut self, by: i64) {
        self.0 += by;
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn edited_bytes_spend_both_windows_and_are_repaid_first() {
        let mut flow = ClientFlow::default();
        let mut stream = flow.open();
        assert_eq!(flow.room(Some(stream)), 65_535);
        flow.spend(1_000, Some(&mut stream));
        assert_eq!(stream, Window(64_535));
        assert_eq!(flow.room(None), 64_535);
        // The client returns 1 500 bytes of connection credit: 1 000 repay
        // the edit, 500 belong to the runtime.
        assert_eq!(flow.credit(1_500), 500);
        assert_eq!(flow.room(None), 66_035);
        assert_eq!(flow.credit(10), 10);
    }

    #[test]
    fn edited_credit_goes_at_once_until_the_relay_holds_too_much() {
        let mut credit = RuntimeCredit::default();
        assert_eq!(credit.received(100, HELD_LIMIT), Some(100));
        assert_eq!(credit.received(100, HELD_LIMIT + 1), None);
        assert_eq!(credit.received(50, HELD_LIMIT + 1), None);
        assert_eq!(credit.release(HELD_LIMIT + 1), None);
        assert_eq!(credit.release(HELD_LIMIT), Some(150));
        // Kept credit goes once.
        assert_eq!(credit.release(0), None);
    }

    #[test]
    fn no_credit_is_lost_or_given_twice() {
        let mut credit = RuntimeCredit::default();
        let (mut received, mut returned) = (0u32, 0u32);
        for (i, held) in [0, HELD_LIMIT * 2, HELD_LIMIT + 1, 10, HELD_LIMIT * 3, 0]
            .into_iter()
            .cycle()
            .take(60)
            .enumerate()
        {
            let bytes = (i as u32 % 7) * 1_000;
            received += bytes;
            returned += credit.received(bytes, held).unwrap_or(0);
            if i % 4 == 0 {
                returned += credit.release(held).unwrap_or(0);
            }
        }
        returned += credit.release(0).unwrap_or(0);
        assert_eq!(returned, received);
    }

    #[test]
    fn unedited_bytes_spend_the_connection_only() {
        let mut flow = ClientFlow::default();
        flow.spend(65_535, None);
        assert_eq!(flow.room(None), 0);
        assert_eq!(flow.credit(100), 100);
        assert_eq!(flow.room(None), 100);
    }

    #[test]
    fn the_stream_window_bounds_an_edited_stream() {
        let mut flow = ClientFlow::default();
        assert_eq!(flow.initial_window(16), 16 - 65_535);
        let mut stream = flow.open();
        assert_eq!(flow.room(Some(stream)), 16);
        flow.spend(16, Some(&mut stream));
        assert_eq!(flow.room(Some(stream)), 0);
        // A larger initial window lifts every open stream (§6.9.2), and a
        // window may go negative when it shrinks.
        stream.grow(flow.initial_window(1 << 20));
        assert_eq!(flow.room(Some(stream)), 65_535 - 16);
        stream.grow(flow.initial_window(0));
        assert_eq!(flow.room(Some(stream)), 0);
    }
}
