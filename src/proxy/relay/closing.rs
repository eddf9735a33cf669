//! How a relayed connection ends, apart from the frames that pass: the
//! GOAWAYs the client was sent (RFC 9113 §6.8), shutdown's drain, and the
//! client's protocol failure. Each decision here is pure; the frames it
//! decides on go through the caller's `Outbound`.

use super::RelayError;
use super::outbound::Outbound;
use crate::proxy::frame;

/// The payload of the drain's PING, which the relay answers itself.
pub(super) const DRAIN_PING: [u8; 8] = *b"crr-drn\0";

#[derive(Debug, Default)]
pub(super) struct Closing {
    /// The highest stream the client opened.
    last_client_stream: u32,
    /// The last stream the runtime said it would process.
    upstream_last: Option<u32>,
    /// The lowest last-stream ID the client was sent.
    sent: Option<u32>,
    drain: Drain,
    failure: Option<Failure>,
}

/// Shutdown as RFC 9113 §6.8 describes it: a GOAWAY saying every stream
/// may still come, a PING, and once the client has acknowledged it (so
/// that every stream it opened before it saw the first GOAWAY has arrived)
/// a GOAWAY naming the last stream that will be answered. A stream above
/// it was never passed on, so the client may send it again elsewhere.
#[derive(Debug, Default, Clone, Copy, PartialEq, Eq)]
enum Drain {
    #[default]
    Serving,
    /// The first GOAWAY and the PING went; the ACK is awaited.
    Pinged,
    /// The final GOAWAY went, naming `last`: the connection ends with its
    /// last call.
    Final { last: u32 },
}

/// The client broke the protocol: why, for the GOAWAY that ends the
/// connection once the answers the relay holds have gone.
#[derive(Debug)]
struct Failure {
    code: u32,
    message: String,
    /// The GOAWAY is queued.
    told: bool,
    /// The client's frames can still be read (for the credit that lets
    /// held answers go).
    reads: bool,
}

impl Closing {
    // --- streams and GOAWAYs ---

    /// The highest stream the client opened (0: none yet).
    pub(super) fn last_client_stream(&self) -> u32 {
        self.last_client_stream
    }

    /// A request header block on `stream`: true when it opens a stream,
    /// which is counted; false for trailers, or a stream the runtime
    /// will refuse (not above the last one).
    pub(super) fn opens(&mut self, stream: u32) -> bool {
        if stream <= self.last_client_stream {
            return false;
        }
        self.last_client_stream = stream;
        true
    }

    /// HEADERS on `stream` may pass: once the final GOAWAY has named the
    /// last stream, a stream above it is the client's error.
    pub(super) fn admits(&self, stream: u32) -> Result<(), RelayError> {
        match self.drain {
            Drain::Final { last } if stream > last.max(self.last_client_stream) => {
                Err(RelayError::AfterGoaway(stream))
            }
            _ => Ok(()),
        }
    }

    /// The runtime's GOAWAY named `last`: the last-stream ID the client
    /// may be told (never more than one it was sent before, or its HTTP/2
    /// stack rejects it).
    pub(super) fn upstream_goaway(&mut self, last: u32) -> u32 {
        self.upstream_last = Some(last);
        self.next(last)
    }

    /// The streams the runtime may have processed are those up to this.
    pub(super) fn processed_upstream(&self) -> u32 {
        self.upstream_last.unwrap_or(frame::MAX_STREAM)
    }

    /// Tells the client no stream after `last` was or will be processed.
    pub(super) fn goaway(&mut self, out: &mut Outbound, last: u32, code: u32, debug: &[u8]) {
        let last = self.next(last);
        out.own(|out| frame::goaway(last, code, debug, out));
    }

    fn next(&mut self, last: u32) -> u32 {
        let last = self.sent.map_or(last, |sent| sent.min(last));
        self.sent = Some(last);
        last
    }

    // --- shutdown's drain ---

    /// Shutdown: tell the client to open no more streams here (the largest
    /// stream ID first) and ask for a PING's ACK.
    pub(super) fn drain(&mut self, out: &mut Outbound) {
        if self.drain != Drain::Serving {
            return;
        }
        self.drain = Drain::Pinged;
        self.goaway(out, frame::MAX_STREAM, frame::NO_ERROR, b"");
        out.own(|out| frame::put(out, frame::PING, 0, 0, &DRAIN_PING));
    }

    /// The client acknowledged the drain's PING (or did not in time): every
    /// stream it opened in time has arrived (`opening`: one whose header
    /// block is still coming), and the final GOAWAY names the last of them.
    pub(super) fn drain_acked(&mut self, out: &mut Outbound, opening: Option<u32>) {
        if self.drain != Drain::Pinged {
            return;
        }
        let last = self.last_client_stream.max(opening.unwrap_or(0));
        self.drain = Drain::Final { last };
        self.goaway(out, last, frame::NO_ERROR, b"");
    }

    /// The drain's PING went and its ACK is awaited.
    pub(super) fn pinged(&self) -> bool {
        self.drain == Drain::Pinged
    }

    /// The final GOAWAY went: the connection ends with its last call.
    pub(super) fn is_final(&self) -> bool {
        matches!(self.drain, Drain::Final { .. })
    }

    // --- the client's failure ---

    /// The client broke the protocol with `error`; true when its frames
    /// can still be read for credit.
    pub(super) fn fail(&mut self, error: &RelayError) -> bool {
        let reads = error.framing_intact();
        self.failure = Some(Failure {
            code: error.code(),
            message: error.to_string(),
            told: false,
            reads,
        });
        reads
    }

    pub(super) fn failed(&self) -> bool {
        self.failure.is_some()
    }

    /// The failure's GOAWAY is queued.
    pub(super) fn told(&self) -> bool {
        self.failure.as_ref().is_some_and(|f| f.told)
    }

    /// After a failure, the client's frames are still read (for credit)
    /// until its GOAWAY is queued.
    pub(super) fn reads_after_failure(&self) -> bool {
        self.failure.as_ref().is_some_and(|f| f.reads && !f.told)
    }

    /// A frame after the failure could not be read: no more are.
    pub(super) fn unreadable(&mut self) {
        if let Some(failure) = self.failure.as_mut() {
            failure.reads = false;
        }
    }

    /// After a failure, its GOAWAY goes once nothing is `held` any more.
    pub(super) fn settle(&mut self, out: &mut Outbound, held: bool) {
        let last = self.last_client_stream;
        let Some(failure) = self.failure.as_mut().filter(|f| !f.told && !held) else {
            return;
        };
        failure.told = true;
        let (code, message) = (failure.code, std::mem::take(&mut failure.message));
        self.goaway(out, last, code, message.as_bytes());
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::proxy::frame::{HEAD_LEN, Head};

    /// The frames `out` holds, in order; an outbound towards the runtime
    /// is open from the start, so what is written shows at once.
    fn frames(out: &Outbound) -> Vec<(Head, Vec<u8>)> {
        let mut buf = out.data();
        let mut found = Vec::new();
        while let Ok(Some((head, frame))) = frame::next(buf, frame::MAX_FRAME_LIMIT) {
            found.push((head, frame[HEAD_LEN..].to_vec()));
            buf = &buf[frame.len()..];
        }
        found
    }

    /// A GOAWAY's last stream, code and debug data.
    fn goaway(payload: &[u8]) -> (u32, u32, Vec<u8>) {
        let word = |at: usize| u32::from_be_bytes(payload[at..at + 4].try_into().unwrap());
        (word(0), word(4), payload[8..].to_vec())
    }

    #[test]
    fn a_drain_is_a_goaway_and_a_ping_then_a_final_goaway_naming_the_last_stream() {
        let (mut closing, mut out) = (Closing::default(), Outbound::to_runtime());
        assert!(closing.opens(1) && closing.opens(3));
        assert!(!closing.opens(3), "trailers open nothing");
        closing.drain(&mut out);
        closing.drain(&mut out);
        assert!(closing.pinged());
        let sent = frames(&out);
        assert_eq!(sent.len(), 2, "{sent:?}");
        assert_eq!(sent[0].0.kind, frame::GOAWAY);
        assert_eq!(
            goaway(&sent[0].1),
            (frame::MAX_STREAM, frame::NO_ERROR, vec![])
        );
        assert_eq!(
            (sent[1].0.kind, sent[1].1.as_slice()),
            (frame::PING, &DRAIN_PING[..])
        );
        // Stream 5 was on its way when the client saw the first GOAWAY.
        closing.admits(5).unwrap();
        closing.drain_acked(&mut out, Some(5));
        closing.drain_acked(&mut out, Some(9));
        assert!(closing.is_final() && !closing.pinged());
        let sent = frames(&out);
        assert_eq!(sent.len(), 3, "{sent:?}");
        assert_eq!(goaway(&sent[2].1), (5, frame::NO_ERROR, vec![]));
        closing.admits(5).unwrap();
        assert!(matches!(closing.admits(7), Err(RelayError::AfterGoaway(7))));
    }

    #[test]
    fn the_last_stream_the_client_is_told_never_rises() {
        let (mut closing, mut out) = (Closing::default(), Outbound::to_runtime());
        assert_eq!(closing.processed_upstream(), frame::MAX_STREAM);
        assert_eq!(closing.upstream_goaway(7), 7);
        assert_eq!(closing.processed_upstream(), 7);
        assert_eq!(closing.upstream_goaway(9), 7);
        closing.goaway(&mut out, 11, frame::NO_ERROR, b"");
        closing.goaway(&mut out, 3, frame::NO_ERROR, b"");
        let told: Vec<u32> = frames(&out).iter().map(|(_, p)| goaway(p).0).collect();
        assert_eq!(told, [7, 3]);
    }

    #[test]
    fn a_failure_is_told_once_nothing_is_held_and_only_once() {
        let (mut closing, mut out) = (Closing::default(), Outbound::to_runtime());
        closing.opens(3);
        let error = RelayError::AfterGoaway(5);
        assert!(closing.fail(&error), "its framing is intact");
        assert!(closing.failed() && closing.reads_after_failure() && !closing.told());
        closing.settle(&mut out, true);
        assert!(out.is_empty(), "an answer is still held");
        closing.settle(&mut out, false);
        closing.settle(&mut out, false);
        assert!(closing.told() && !closing.reads_after_failure());
        let sent = frames(&out);
        assert_eq!(sent.len(), 1, "{sent:?}");
        let expected = (3, frame::PROTOCOL_ERROR, error.to_string().into_bytes());
        assert_eq!(goaway(&sent[0].1), expected);

        let mut torn = Closing::default();
        assert!(!torn.fail(&RelayError::Preface));
        assert!(!torn.reads_after_failure());
        let mut unreadable = Closing::default();
        unreadable.fail(&error);
        unreadable.unreadable();
        assert!(!unreadable.reads_after_failure());
    }
}
