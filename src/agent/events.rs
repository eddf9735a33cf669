//! The agent's Events. A write the API server refuses is tried again a few
//! times in the background, so the work waits on one try at most.

use std::time::Duration;

use k8s_openapi::api::core::v1::ObjectReference;
use kube::runtime::events::{Event, EventType, Recorder};
use tracing::{debug, warn};

/// How long to wait before each further try of an Event write that failed.
const EVENT_RETRIES: [Duration; 4] = [
    Duration::from_secs(1),
    Duration::from_secs(2),
    Duration::from_secs(4),
    Duration::from_secs(8),
];

/// events.k8s.io refuses a note over 1 024 bytes and a reportingInstance
/// over 128 (an Event that breaks either is lost).
pub(crate) const NOTE_LIMIT: usize = 1024;
pub(crate) const INSTANCE_LIMIT: usize = 128;

pub(crate) struct Events {
    recorder: Recorder,
}

impl Events {
    pub(crate) fn new(recorder: Recorder) -> Self {
        Self { recorder }
    }

    /// Records an Event on `reference`; a write the API server refuses is
    /// tried again in the background, so that the caller goes on.
    pub(crate) async fn record(
        &self,
        reference: &ObjectReference,
        type_: EventType,
        reason: &str,
        note: String,
    ) {
        let note = truncated(note, NOTE_LIMIT, " ...");
        let event = || Event {
            type_,
            reason: reason.into(),
            note: Some(note.clone()),
            action: reason.into(),
            secondary: None,
        };
        let Err(error) = self.recorder.publish(&event(), reference).await else {
            return;
        };
        // kube's client retries 429 and 503 by itself; other failures (a 500
        // from an API server under load) are retried here, a few times as
        // client-go's broadcaster does.
        debug!(%error, reason, "could not record an Event; retrying");
        let (recorder, reference, event) = (self.recorder.clone(), reference.clone(), event());
        tokio::spawn(async move {
            let mut last = error;
            for delay in EVENT_RETRIES {
                tokio::time::sleep(delay).await;
                match recorder.publish(&event, &reference).await {
                    Ok(()) => return,
                    Err(error) => last = error,
                }
            }
            warn!(error = %last, reason = %event.reason, "could not record an Event");
        });
    }
}

/// `text` cut to at most `limit` bytes, ending in `suffix` when cut, as the
/// scheduler cuts its Event notes (here on a character boundary).
pub(crate) fn truncated(mut text: String, limit: usize, suffix: &str) -> String {
    if text.len() <= limit {
        return text;
    }
    let mut end = limit.saturating_sub(suffix.len());
    while !text.is_char_boundary(end) {
        end -= 1;
    }
    text.truncate(end);
    text.push_str(suffix);
    text
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn event_notes_and_instances_are_cut_to_what_the_api_server_takes() {
        let long = "é".repeat(700);
        let note = truncated(long.clone(), NOTE_LIMIT, " ...");
        assert!(
            note.len() <= NOTE_LIMIT && note.ends_with(" ..."),
            "{}",
            note.len()
        );
        assert!(long.starts_with(note.trim_end_matches(" ...")));
        assert_eq!(truncated("short".into(), NOTE_LIMIT, " ..."), "short");
        let node = truncated("n".repeat(253), INSTANCE_LIMIT, "");
        assert_eq!(node.len(), INSTANCE_LIMIT);
    }
}
