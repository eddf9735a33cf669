//! Why a container restarted: for the containers crr-proxy stopped for a
//! CRR, kubelet is told reason `ContainerRecreateRequest` and message
//! `recreated by ContainerRecreateRequest <namespace>/<name>` instead of
//! containerd's `Error`/`Completed`, so the Pod's `lastState.terminated`
//! says what happened.
//!
//! The agent records each container ID it stopped in [`Recreated`], which
//! appends it to a small file so that the record survives restarts (kubelet
//! keeps asking about the old container until it is garbage-collected). The
//! proxy edits the statuses in ContainerStatus, PodSandboxStatus and
//! GetContainerEvents answers with [`Editor`], at the wire level (`wire`).

pub mod wire;

use std::path::Path;

use bytes::{BufMut, Bytes, BytesMut};

use crate::records::{Records, RecordsError};

pub use wire::{StatusResponse, Stopped};

use crate::restart_rules::Rewrite;

/// The reason kubelet is told.
pub const REASON: &str = "ContainerRecreateRequest";

/// A message longer than this is forwarded unedited (and so is the rest of
/// its stream): buffering it whole is not worth its memory.
const MAX_EDITED_MESSAGE: usize = 4 << 20;

/// The containers crr-proxy stopped, for which CRR, and which exit code to
/// report for each (a container ID to `<namespace>/<name>` and, where the
/// restart rules call for it, `;<rewrite>`), kept in a file of [`Records`]
/// (one `<container id> <value>` per line).
#[derive(Debug, Default)]
pub struct Recreated {
    records: Records,
}

impl Recreated {
    /// Records kept in memory only.
    pub fn in_memory() -> Self {
        Self::default()
    }

    /// Records kept in `file`, read back now.
    pub fn open(file: &Path) -> Result<Self, RecordsError> {
        Ok(Self {
            records: Records::open(file)?,
        })
    }

    /// Records that `container_id` was stopped for the CRR `namespace/name`,
    /// and which exit codes to report for it.
    pub fn record(
        &self,
        container_id: &str,
        crr: &str,
        rewrite: Option<Rewrite>,
    ) -> Result<(), RecordsError> {
        match rewrite {
            Some(rewrite) => self
                .records
                .insert(container_id, &format!("{crr};{}", rewrite.to_word())),
            None => self.records.insert(container_id, crr),
        }
    }

    /// What kubelet is told of `container_id`, if crr-proxy stopped it.
    pub fn stopped(&self, container_id: &str) -> Option<Stopped> {
        let value = self.records.get(container_id)?;
        // A record without a rewrite (and every record of older versions).
        let (crr, rewrite) = match value.split_once(';') {
            Some((crr, rewrite)) => (crr, Rewrite::from_word(rewrite)),
            None => (value.as_str(), None),
        };
        Some(Stopped {
            reason: REASON.to_owned(),
            message: format!("recreated by ContainerRecreateRequest {crr}"),
            rewrite,
        })
    }

    pub fn is_empty(&self) -> bool {
        self.records.is_empty()
    }
}

impl wire::Lookup for Recreated {
    fn stopped(&self, container_id: &str) -> Option<Stopped> {
        Recreated::stopped(self, container_id)
    }
}

/// Edits a response stream message by message: gRPC length-prefixed
/// messages are reassembled across DATA frames, edited, and handed on.
#[derive(Debug)]
pub struct Editor {
    kind: StatusResponse,
    buf: BytesMut,
    /// Set after a message too large to edit: from there on the stream
    /// passes as it comes (compressed messages only pass unedited).
    passthrough: bool,
}

impl Editor {
    pub fn new(kind: StatusResponse) -> Self {
        Self {
            kind,
            buf: BytesMut::new(),
            passthrough: false,
        }
    }

    /// Takes the next DATA frame; gives back what can be sent now (every
    /// complete message, edited where `lookup` asks for it), or `None`
    /// while a message is still incomplete.
    pub fn push(&mut self, data: Bytes, lookup: &dyn wire::Lookup) -> Option<Bytes> {
        if self.passthrough {
            return Some(data);
        }
        self.buf.extend_from_slice(&data);
        let mut out = BytesMut::new();
        while self.buf.len() >= 5 {
            let compressed = self.buf[0] != 0;
            let len =
                u32::from_be_bytes([self.buf[1], self.buf[2], self.buf[3], self.buf[4]]) as usize;
            if len > MAX_EDITED_MESSAGE {
                self.passthrough = true;
                out.extend_from_slice(&self.buf.split());
                break;
            }
            if self.buf.len() < 5 + len {
                break;
            }
            let message = self.buf.split_to(5 + len);
            let edited = (!compressed)
                .then(|| wire::edit_response(self.kind, &message[5..], lookup))
                .flatten();
            match edited {
                Some(body) => {
                    out.put_u8(0);
                    out.put_u32(body.len() as u32);
                    out.extend_from_slice(&body);
                }
                // Nothing before it: hand the bytes on without a copy.
                None if out.is_empty() => out = message,
                None => out.extend_from_slice(&message),
            }
        }
        (!out.is_empty()).then(|| out.freeze())
    }

    /// What is left when the stream ends (an incomplete message, sent as
    /// it came).
    pub fn finish(&mut self) -> Option<Bytes> {
        (!self.buf.is_empty()).then(|| self.buf.split().freeze())
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::cri::v1::{ContainerState, ContainerStatus, ContainerStatusResponse};
    use prost::Message;

    fn framed(message: &[u8]) -> Vec<u8> {
        let mut out = vec![0];
        out.extend_from_slice(&(message.len() as u32).to_be_bytes());
        out.extend_from_slice(message);
        out
    }

    fn response(id: &str) -> Vec<u8> {
        ContainerStatusResponse {
            status: Some(ContainerStatus {
                id: id.into(),
                state: ContainerState::ContainerExited as i32,
                reason: "Error".into(),
                ..Default::default()
            }),
            info: Default::default(),
        }
        .encode_to_vec()
    }

    #[test]
    fn records_name_their_crr_and_survive_a_reopen() {
        let dir = std::env::temp_dir().join(format!("crr-proxy-reason-{}", std::process::id()));
        let file = dir.join("recreated");
        let _ = std::fs::remove_dir_all(&dir);
        let recreated = Recreated::open(&file).unwrap();
        assert!(recreated.is_empty());
        recreated.record("abc", "shop/restart-app", None).unwrap();
        let rewrite = Rewrite::from_word(&format!("143:fffffffffffffffe{}", "f".repeat(48)));
        recreated.record("ghi", "shop/once", rewrite).unwrap();
        let reopened = Recreated::open(&file).unwrap();
        assert_eq!(
            reopened.stopped("abc"),
            Some(Stopped {
                reason: REASON.into(),
                message: "recreated by ContainerRecreateRequest shop/restart-app".into(),
                rewrite: None,
            })
        );
        let once = reopened.stopped("ghi").unwrap();
        assert_eq!(
            once.message,
            "recreated by ContainerRecreateRequest shop/once"
        );
        assert_eq!(once.rewrite, rewrite);
        assert!(rewrite.is_some());
        assert_eq!(reopened.stopped("def"), None);
        std::fs::remove_dir_all(&dir).unwrap();
    }

    #[test]
    fn messages_split_across_frames_are_reassembled_and_edited() {
        let recreated = Recreated::in_memory();
        recreated.record("stopped", "ns/crr", None).unwrap();
        let mut stream = framed(&response("other"));
        stream.extend(framed(&response("stopped")));
        stream.extend(framed(&response("other")));
        for split in [1, 3, 7, stream.len() / 2, stream.len() - 1] {
            let mut editor = Editor::new(StatusResponse::ContainerStatus);
            let mut out = Vec::new();
            for chunk in stream.chunks(split) {
                if let Some(bytes) = editor.push(Bytes::copy_from_slice(chunk), &recreated) {
                    out.extend_from_slice(&bytes);
                }
            }
            assert_eq!(editor.finish(), None);
            let mut expected = framed(&response("other"));
            let edited = wire::edit_response(
                StatusResponse::ContainerStatus,
                &response("stopped"),
                &recreated,
            )
            .unwrap();
            expected.extend(framed(&edited));
            expected.extend(framed(&response("other")));
            assert_eq!(out, expected, "split {split}");
        }
    }

    #[test]
    fn compressed_truncated_and_huge_messages_pass_unchanged() {
        let recreated = Recreated::in_memory();
        recreated.record("stopped", "ns/crr", None).unwrap();
        let mut compressed = framed(&response("stopped"));
        compressed[0] = 1;
        let mut editor = Editor::new(StatusResponse::ContainerStatus);
        assert_eq!(
            editor
                .push(Bytes::from(compressed.clone()), &recreated)
                .unwrap(),
            compressed
        );

        let whole = framed(&response("stopped"));
        let mut editor = Editor::new(StatusResponse::ContainerStatus);
        assert_eq!(
            editor.push(Bytes::copy_from_slice(&whole[..9]), &recreated),
            None
        );
        assert_eq!(editor.finish().unwrap(), &whole[..9]);

        let mut huge = vec![0, 0xff, 0xff, 0xff, 0xff];
        huge.extend_from_slice(&[1, 2, 3]);
        let mut editor = Editor::new(StatusResponse::ContainerStatus);
        assert_eq!(
            editor.push(Bytes::from(huge.clone()), &recreated).unwrap(),
            huge
        );
        let after = framed(&response("stopped"));
        assert_eq!(
            editor.push(Bytes::from(after.clone()), &recreated).unwrap(),
            after
        );
    }
}
