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

use std::collections::{HashMap, VecDeque};
use std::io::Write;
use std::path::{Path, PathBuf};
use std::sync::{Mutex, MutexGuard};

use bytes::{BufMut, Bytes, BytesMut};
use tracing::warn;

pub use wire::StatusResponse;

/// The reason kubelet is told.
pub const REASON: &str = "ContainerRecreateRequest";

/// Records kept: far more than the exited containers kubelet still asks
/// about on one node (it keeps one dead instance per container).
const KEEP: usize = 4096;

/// A message longer than this is forwarded unedited (and so is the rest of
/// its stream): buffering it whole is not worth its memory.
const MAX_EDITED_MESSAGE: usize = 4 << 20;

#[derive(Debug, thiserror::Error)]
pub enum ReasonError {
    #[error("reading {path}: {source}")]
    Read {
        path: PathBuf,
        source: std::io::Error,
    },
    #[error("writing {path}: {source}")]
    Write {
        path: PathBuf,
        source: std::io::Error,
    },
}

/// The containers crr-proxy stopped, and for which CRR.
///
/// Two locks: the data path reads `entries` on every status answer it
/// edits, so `entries` is held only for memory work; the file's lock is
/// held across its I/O and serialises writers alone.
#[derive(Debug, Default)]
pub struct Recreated {
    entries: Mutex<Entries>,
    /// Where records are appended; `None` keeps them in memory only.
    file: Option<Mutex<RecordFile>>,
}

#[derive(Debug, Default)]
struct Entries {
    crr: HashMap<String, String>,
    order: VecDeque<String>,
}

#[derive(Debug)]
struct RecordFile {
    path: PathBuf,
    /// Lines in the file, to know when to compact it.
    lines: usize,
}

impl Recreated {
    /// Records kept in memory only.
    pub fn in_memory() -> Self {
        Self::default()
    }

    /// Records kept in `file` (one `<container id> <namespace>/<name>` per
    /// line), read back now. A missing file is an empty record; lines that
    /// are not records are skipped.
    pub fn open(file: &Path) -> Result<Self, ReasonError> {
        let text = match std::fs::read_to_string(file) {
            Ok(text) => text,
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => String::new(),
            Err(source) => {
                return Err(ReasonError::Read {
                    path: file.to_owned(),
                    source,
                });
            }
        };
        let mut entries = Entries::default();
        let mut lines = 0;
        for line in text.lines() {
            lines += 1;
            match line.split_once(' ') {
                Some((id, crr)) if !id.is_empty() && !crr.is_empty() && !crr.contains(' ') => {
                    entries.insert(id, crr);
                }
                _ => warn!(file = %file.display(), line, "skipping a malformed record"),
            }
        }
        Ok(Self {
            entries: Mutex::new(entries),
            file: Some(Mutex::new(RecordFile {
                path: file.to_owned(),
                lines,
            })),
        })
    }

    /// Records that `container_id` was stopped for the CRR `namespace/name`.
    pub fn record(&self, container_id: &str, crr: &str) -> Result<(), ReasonError> {
        let Some(file) = &self.file else {
            self.lock().insert(container_id, crr);
            return Ok(());
        };
        // The file's lock first, so that records reach the file in the
        // order they reach memory.
        let mut file = file.lock().unwrap_or_else(|poisoned| poisoned.into_inner());
        let compacted = {
            let mut entries = self.lock();
            entries.insert(container_id, crr);
            (file.lines >= 2 * KEEP).then(|| entries.text())
        };
        let path = file.path.clone();
        let write_error = |source| ReasonError::Write {
            path: path.clone(),
            source,
        };
        if let Some((text, lines)) = compacted {
            // Rewritten whole, then renamed over: a crash leaves either file.
            let tmp = path.with_extension("tmp");
            std::fs::write(&tmp, text).map_err(write_error)?;
            std::fs::rename(&tmp, &path).map_err(write_error)?;
            file.lines = lines;
        } else {
            if let Some(dir) = path.parent() {
                std::fs::create_dir_all(dir).map_err(write_error)?;
            }
            std::fs::OpenOptions::new()
                .create(true)
                .append(true)
                .open(&path)
                .and_then(|mut f| f.write_all(format!("{container_id} {crr}\n").as_bytes()))
                .map_err(write_error)?;
            file.lines += 1;
        }
        Ok(())
    }

    /// The reason and message for `container_id`, if crr-proxy stopped it.
    pub fn reason(&self, container_id: &str) -> Option<(String, String)> {
        let entries = self.lock();
        let crr = entries.crr.get(container_id)?;
        Some((
            REASON.to_owned(),
            format!("recreated by ContainerRecreateRequest {crr}"),
        ))
    }

    pub fn is_empty(&self) -> bool {
        self.lock().crr.is_empty()
    }

    fn lock(&self) -> MutexGuard<'_, Entries> {
        self.entries
            .lock()
            .unwrap_or_else(|poisoned| poisoned.into_inner())
    }
}

impl Entries {
    /// The records as the file holds them, and how many lines that is.
    fn text(&self) -> (String, usize) {
        let mut text = String::new();
        for id in &self.order {
            if let Some(crr) = self.crr.get(id) {
                text.push_str(&format!("{id} {crr}\n"));
            }
        }
        (text, self.order.len())
    }

    fn insert(&mut self, id: &str, crr: &str) {
        if self.crr.insert(id.to_owned(), crr.to_owned()).is_none() {
            self.order.push_back(id.to_owned());
        }
        while self.order.len() > KEEP {
            if let Some(old) = self.order.pop_front() {
                self.crr.remove(&old);
            }
        }
    }
}

impl wire::Lookup for Recreated {
    fn reason(&self, container_id: &str) -> Option<(String, String)> {
        Recreated::reason(self, container_id)
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
    use std::sync::Arc;

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

    /// While a record waits on its file (here a FIFO nobody reads, so the
    /// append cannot even open it), the data path still gets its answers.
    #[test]
    fn a_record_waiting_on_its_file_does_not_block_lookups() {
        let dir = std::env::temp_dir().join(format!("crr-proxy-fifo-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&dir);
        std::fs::create_dir_all(&dir).unwrap();
        let file = dir.join("recreated");
        let recreated = Arc::new(Recreated::open(&file).unwrap());
        recreated.record("abc", "shop/first").unwrap();
        std::fs::remove_file(&file).unwrap();
        let made = std::process::Command::new("mkfifo").arg(&file).status();
        assert!(made.unwrap().success());
        let writer = {
            let recreated = Arc::clone(&recreated);
            std::thread::spawn(move || recreated.record("def", "shop/second"))
        };
        std::thread::sleep(std::time::Duration::from_millis(100));
        let (tx, rx) = std::sync::mpsc::channel();
        let reader = {
            let recreated = Arc::clone(&recreated);
            std::thread::spawn(move || tx.send(recreated.reason("abc").is_some()))
        };
        let answered = rx.recv_timeout(std::time::Duration::from_secs(5));
        // Lets the writer finish either way: open the FIFO's reading end.
        let drained = std::fs::read_to_string(&file).unwrap();
        assert_eq!(answered, Ok(true), "the lookup waited for the file");
        assert_eq!(drained, "def shop/second\n");
        writer.join().unwrap().unwrap();
        reader.join().unwrap().unwrap();
        std::fs::remove_dir_all(&dir).unwrap();
    }

    #[test]
    fn records_survive_a_reopen_and_are_compacted() {
        let dir = std::env::temp_dir().join(format!("crr-proxy-reason-{}", std::process::id()));
        let file = dir.join("recreated");
        let _ = std::fs::remove_dir_all(&dir);
        let recreated = Recreated::open(&file).unwrap();
        assert!(recreated.is_empty());
        recreated.record("abc", "shop/restart-app").unwrap();
        let reopened = Recreated::open(&file).unwrap();
        assert_eq!(
            reopened.reason("abc"),
            Some((
                REASON.into(),
                "recreated by ContainerRecreateRequest shop/restart-app".into()
            ))
        );
        assert_eq!(reopened.reason("def"), None);
        for i in 0..(2 * KEEP + 10) {
            reopened.record(&format!("id-{i}"), "ns/crr").unwrap();
        }
        let lines = std::fs::read_to_string(&file).unwrap().lines().count();
        assert!(lines <= 2 * KEEP, "{lines} lines");
        let last = Recreated::open(&file).unwrap();
        assert!(last.reason(&format!("id-{}", 2 * KEEP + 9)).is_some());
        assert!(
            last.reason("abc").is_none(),
            "the oldest records are dropped"
        );
        std::fs::write(&file, "garbage\n\nid ns/x extra\nok ns/y\n").unwrap();
        let messy = Recreated::open(&file).unwrap();
        assert!(messy.reason("ok").is_some());
        assert!(messy.reason("garbage").is_none() && messy.reason("id").is_none());
        std::fs::remove_dir_all(&dir).unwrap();
    }

    #[test]
    fn messages_split_across_frames_are_reassembled_and_edited() {
        let recreated = Recreated::in_memory();
        recreated.record("stopped", "ns/crr").unwrap();
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
        recreated.record("stopped", "ns/crr").unwrap();
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
