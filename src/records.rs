//! A small map of one-word keys to one-word values that outlives crr-proxy:
//! every record is appended to a file as `<key> <value>` and read back at
//! the next start. Only the newest [`KEEP`] records are kept; the file is
//! rewritten once it holds twice that many lines.
//!
//! Two locks: lookups (the data path's, for [`crate::reason`]) take the
//! map's lock only for memory work; the file's lock is held across its I/O
//! and serialises writers alone.

use std::collections::{HashMap, VecDeque};
use std::io::Write;
use std::path::{Path, PathBuf};
use std::sync::{Mutex, MutexGuard};

use tracing::warn;

/// Records kept: far more than the exited containers kubelet still asks
/// about on one node (it keeps one dead instance per container).
pub const KEEP: usize = 4096;

#[derive(Debug, thiserror::Error)]
pub enum RecordsError {
    #[error("reading {path}")]
    Read {
        path: PathBuf,
        #[source]
        source: std::io::Error,
    },
    #[error("writing {path}")]
    Write {
        path: PathBuf,
        #[source]
        source: std::io::Error,
    },
}

#[derive(Debug, Default)]
pub struct Records {
    entries: Mutex<Entries>,
    /// Where records are appended; `None` keeps them in memory only.
    file: Option<Mutex<RecordFile>>,
}

#[derive(Debug, Default)]
struct Entries {
    values: HashMap<String, String>,
    order: VecDeque<String>,
}

#[derive(Debug)]
struct RecordFile {
    path: PathBuf,
    /// Lines in the file, to know when to compact it.
    lines: usize,
}

impl Records {
    /// Records kept in memory only.
    pub fn in_memory() -> Self {
        Self::default()
    }

    /// Records kept in `file`, read back now. A missing file is an empty
    /// record; lines that are not records are skipped.
    pub fn open(file: &Path) -> Result<Self, RecordsError> {
        let text = match std::fs::read_to_string(file) {
            Ok(text) => text,
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => String::new(),
            Err(source) => {
                return Err(RecordsError::Read {
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
                Some((key, value))
                    if !key.is_empty() && !value.is_empty() && !value.contains(' ') =>
                {
                    entries.insert(key, value);
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

    /// Records `key` → `value` (both without spaces), replacing an earlier
    /// value; in memory even when the file cannot be written.
    pub fn insert(&self, key: &str, value: &str) -> Result<(), RecordsError> {
        let Some(file) = &self.file else {
            self.lock().insert(key, value);
            return Ok(());
        };
        // The file's lock first, so that records reach the file in the
        // order they reach memory.
        let mut file = file.lock().unwrap_or_else(|poisoned| poisoned.into_inner());
        let compacted = {
            let mut entries = self.lock();
            entries.insert(key, value);
            (file.lines >= 2 * KEEP).then(|| entries.text())
        };
        let path = file.path.clone();
        let write_error = |source| RecordsError::Write {
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
                .and_then(|mut f| f.write_all(format!("{key} {value}\n").as_bytes()))
                .map_err(write_error)?;
            file.lines += 1;
        }
        Ok(())
    }

    pub fn get(&self, key: &str) -> Option<String> {
        self.lock().values.get(key).cloned()
    }

    pub fn is_empty(&self) -> bool {
        self.lock().values.is_empty()
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
        for key in &self.order {
            if let Some(value) = self.values.get(key) {
                text.push_str(&format!("{key} {value}\n"));
            }
        }
        (text, self.order.len())
    }

    fn insert(&mut self, key: &str, value: &str) {
        if self
            .values
            .insert(key.to_owned(), value.to_owned())
            .is_none()
        {
            self.order.push_back(key.to_owned());
        }
        while self.order.len() > KEEP {
            if let Some(old) = self.order.pop_front() {
                self.values.remove(&old);
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::sync::Arc;

    /// While a record waits on its file (here a FIFO nobody reads, so the
    /// append cannot even open it), lookups still get their answers.
    #[test]
    fn a_record_waiting_on_its_file_does_not_block_lookups() {
        let dir = std::env::temp_dir().join(format!("crr-proxy-fifo-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&dir);
        std::fs::create_dir_all(&dir).unwrap();
        let file = dir.join("records");
        let records = Arc::new(Records::open(&file).unwrap());
        records.insert("abc", "shop/first").unwrap();
        std::fs::remove_file(&file).unwrap();
        let made = std::process::Command::new("mkfifo").arg(&file).status();
        assert!(made.unwrap().success());
        let (tid_tx, tid_rx) = std::sync::mpsc::channel();
        let writer = {
            let records = Arc::clone(&records);
            std::thread::spawn(move || {
                let _ = tid_tx.send(std::fs::read_link("/proc/thread-self").unwrap());
                records.insert("def", "shop/second")
            })
        };
        // The lookup below shows something only once the writer waits on
        // the FIFO: its thread asleep (its only sleep is opening the FIFO,
        // which waits for a reader).
        let stat = std::path::Path::new("/proc")
            .join(tid_rx.recv().unwrap())
            .join("stat");
        let deadline = std::time::Instant::now() + std::time::Duration::from_secs(5);
        loop {
            let text = std::fs::read_to_string(&stat).unwrap();
            let state = text.rsplit_once(')').unwrap().1.split_whitespace().next();
            if state == Some("S") {
                break;
            }
            assert!(
                std::time::Instant::now() < deadline,
                "the writer never waited: {text}"
            );
            std::thread::sleep(std::time::Duration::from_millis(5));
        }
        let (tx, rx) = std::sync::mpsc::channel();
        let reader = {
            let records = Arc::clone(&records);
            std::thread::spawn(move || tx.send(records.get("abc").is_some()))
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
        let dir = std::env::temp_dir().join(format!("crr-proxy-records-{}", std::process::id()));
        let file = dir.join("records");
        let _ = std::fs::remove_dir_all(&dir);
        let records = Records::open(&file).unwrap();
        assert!(records.is_empty());
        records.insert("abc", "shop/restart-app").unwrap();
        let reopened = Records::open(&file).unwrap();
        assert_eq!(reopened.get("abc").as_deref(), Some("shop/restart-app"));
        assert_eq!(reopened.get("def"), None);
        for i in 0..(2 * KEEP + 10) {
            reopened.insert(&format!("id-{i}"), "ns/crr").unwrap();
        }
        let lines = std::fs::read_to_string(&file).unwrap().lines().count();
        assert!(lines <= 2 * KEEP, "{lines} lines");
        let last = Records::open(&file).unwrap();
        assert!(last.get(&format!("id-{}", 2 * KEEP + 9)).is_some());
        assert!(last.get("abc").is_none(), "the oldest records are dropped");
        std::fs::write(&file, "garbage\n\nid ns/x extra\nok ns/y\n").unwrap();
        let messy = Records::open(&file).unwrap();
        assert!(messy.get("ok").is_some());
        assert!(messy.get("garbage").is_none() && messy.get("id").is_none());
        std::fs::remove_dir_all(&dir).unwrap();
    }
}
