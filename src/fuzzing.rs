//! Entry points for the fuzz targets in `fuzz/` (`scripts/fuzz.sh`), one
//! per parser of bytes crr-proxy does not control. They live here so that
//! the normal test suite compiles them and replays the seed and regression
//! corpora on stable Rust (see the tests below); the fuzzer itself needs
//! cargo-fuzz.
//!
//! Each entry panics only on a broken invariant: a panic is a finding.

use std::collections::HashMap;

use bytes::Bytes;
use k8s_openapi::api::core::v1::Pod;

use crate::cri::v1::{ContainerState, ContainerStatus};
use crate::crr::state::{self, PodContainers, RuntimeContainer};
use crate::crr::{ContainerRecreateRequest, SyncContainerStatus, admission};
use crate::kill::{self, Target, keys};
use crate::reason::{Editor, StatusResponse, Stopped, wire};

/// Every container ID counts as recreated, so that every well-formed exited
/// status is edited.
fn everyone(id: &str) -> Option<Stopped> {
    Some(Stopped {
        reason: "ContainerRecreateRequest".into(),
        message: format!("recreated by {id}"),
        rewrite: None,
    })
}

fn kind(selector: u8) -> StatusResponse {
    match selector % 3 {
        0 => StatusResponse::ContainerStatus,
        1 => StatusResponse::PodSandboxStatus,
        _ => StatusResponse::ContainerEvent,
    }
}

/// The wire editor on one response message (first byte: which response).
pub fn wire_edit(data: &[u8]) {
    let Some((&selector, message)) = data.split_first() else {
        return;
    };
    let kind = kind(selector);
    if let Some(edited) = wire::edit_response(kind, message, &everyone) {
        // An edit is final: editing again changes nothing.
        assert_eq!(wire::edit_response(kind, &edited, &everyone), None);
        // What prost could decode before, it decodes after.
        assert!(!decodes(kind, message) || decodes(kind, &edited));
    }
}

fn decodes(kind: StatusResponse, message: &[u8]) -> bool {
    use crate::cri::v1::{ContainerStatusResponse, PodSandboxStatusResponse};
    use prost::Message;
    match kind {
        StatusResponse::ContainerStatus => ContainerStatusResponse::decode(message).is_ok(),
        StatusResponse::PodSandboxStatus => PodSandboxStatusResponse::decode(message).is_ok(),
        StatusResponse::ContainerEvent => {
            crate::cri::v1::ContainerEventResponse::decode(message).is_ok()
        }
    }
}

/// The streaming editor on a response body cut into DATA frames (first
/// byte: frame size). With nothing recorded, bytes pass exactly.
pub fn editor_stream(data: &[u8]) {
    let Some((&size, body)) = data.split_first() else {
        return;
    };
    let size = usize::from(size.max(1));
    let nobody = |_: &str| None;
    let mut editor = Editor::new(StatusResponse::ContainerStatus);
    let mut out = Vec::new();
    for frame in body.chunks(size) {
        if let Some(bytes) = editor.push(Bytes::copy_from_slice(frame), &nobody) {
            out.extend_from_slice(&bytes);
        }
    }
    if let Some(rest) = editor.finish() {
        out.extend_from_slice(&rest);
    }
    assert_eq!(out, body, "an unedited stream must pass byte for byte");

    // With everyone recorded: no panic, and nothing lost before the end.
    let mut editor = Editor::new(StatusResponse::PodSandboxStatus);
    for frame in body.chunks(size) {
        let _ = editor.push(Bytes::copy_from_slice(frame), &everyone);
    }
    let _ = editor.finish();
}

/// kubelet's container labels and annotations as the kill engine reads
/// them: NUL-separated values for preStop, ports, grace periods, restart
/// count, in that order.
pub fn kubelet_annotations(data: &[u8]) {
    let text = String::from_utf8_lossy(data);
    let mut values = text.split('\0');
    let mut status = ContainerStatus {
        id: "fuzz".into(),
        state: ContainerState::ContainerRunning as i32,
        ..Default::default()
    };
    for key in [
        keys::PRE_STOP_HANDLER,
        keys::PORTS,
        keys::TERMINATION_GRACE_PERIOD,
        keys::DELETION_GRACE_PERIOD,
        keys::RESTART_COUNT,
    ] {
        if let Some(value) = values.next() {
            status.annotations.insert(key.into(), value.into());
        }
    }
    let target = Target::from_status(&status);
    let requested = values.next().and_then(|v| v.trim().parse().ok());
    let (grace, _) = kill::grace_period(requested, &target);
    assert!((0..=i64::from(i32::MAX)).contains(&grace), "grace {grace}");
    let timeout = kill::stop_timeout(grace, u64::from(data.first().copied().unwrap_or(0)));
    assert!(timeout >= 0);
}

/// A CRR as the API server might send it, through the webhook's checks and
/// the daemon's state computation; plus the sync-container-statuses
/// annotation kruise-manager writes.
pub fn crr_json(data: &[u8]) {
    let _ = serde_json::from_slice::<Vec<SyncContainerStatus>>(data);
    let Ok(crr) = serde_json::from_slice::<ContainerRecreateRequest>(data) else {
        return;
    };
    let pod: Pod = serde_json::from_value(serde_json::json!({
        "metadata": {"name": crr.spec.pod_name, "namespace": "default", "uid": "u"},
        "spec": {"nodeName": "n", "containers": [{"name": "app"}, {"name": "sidecar"}]},
        "status": {"containerStatuses": [
            {"name": "app", "ready": true, "restartCount": 0, "image": "", "imageID": "", "containerID": "containerd://a"},
            {"name": "sidecar", "ready": false, "restartCount": 2, "image": "", "imageID": "", "containerID": "containerd://s"}
        ]}
    }))
    .unwrap_or_default();
    let containers = PodContainers::new(vec![
        RuntimeContainer {
            id: "containerd://a".into(),
            name: "app".into(),
            restart_count: 0,
            state: ContainerState::ContainerRunning,
            created_at: 1,
            started_at: Some(2),
        },
        RuntimeContainer {
            id: "containerd://s".into(),
            name: "sidecar".into(),
            restart_count: 2,
            state: ContainerState::ContainerExited,
            created_at: 3,
            started_at: None,
        },
    ]);
    let _ = admission::admit(&crr, &pod, &containers);
    let previous = crr
        .status
        .as_ref()
        .map(|s| s.container_recreate_states.clone())
        .unwrap_or_default();
    let states =
        state::current_states(&crr.spec, &previous, &containers, &HashMap::new(), i64::MAX);
    assert_eq!(states.len(), crr.spec.containers.len());
}

/// HPACK header blocks (first byte: block size), as the relay decodes them
/// from both sides of every connection.
pub fn hpack(data: &[u8]) {
    crate::proxy::hpack::fuzz(data);
}

/// Both sides of a relayed connection at once (see `proxy::relay::fuzz`).
pub fn relay_frames(data: &[u8]) {
    crate::proxy::relay::fuzz(data);
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Replays the committed seed and regression inputs of each target.
    fn replay(target: &str, run: fn(&[u8])) -> usize {
        let mut count = 0;
        for dir in ["corpus", "regressions"] {
            let dir = std::path::Path::new(env!("CARGO_MANIFEST_DIR"))
                .join("fuzz")
                .join(dir)
                .join(target);
            let Ok(entries) = std::fs::read_dir(&dir) else {
                continue;
            };
            for entry in entries.flatten() {
                let data = std::fs::read(entry.path()).unwrap_or_default();
                run(&data);
                count += 1;
            }
        }
        count
    }

    /// Cheap deterministic noise, so that every target also sees inputs
    /// nobody wrote, even on stable Rust without the fuzzer.
    fn noise(run: fn(&[u8]), seeds: &[Vec<u8>]) {
        let mut state = 0x2545_f491_4f6c_dd1d_u64;
        let mut next = move || {
            state ^= state << 13;
            state ^= state >> 7;
            state ^= state << 17;
            state
        };
        for round in 0..2000 {
            let mut data = seeds
                .get(round % seeds.len().max(1))
                .cloned()
                .unwrap_or_default();
            for _ in 0..(next() % 4) {
                let pos = (next() as usize) % (data.len() + 1);
                match next() % 3 {
                    0 if pos < data.len() => data[pos] = next() as u8,
                    1 => data.insert(pos, next() as u8),
                    _ => data.truncate(pos),
                }
            }
            run(&data);
        }
    }

    fn seeds(target: &str) -> Vec<Vec<u8>> {
        let dir = std::path::Path::new(env!("CARGO_MANIFEST_DIR"))
            .join("fuzz/corpus")
            .join(target);
        std::fs::read_dir(dir)
            .map(|entries| {
                entries
                    .flatten()
                    .filter_map(|e| std::fs::read(e.path()).ok())
                    .collect()
            })
            .unwrap_or_default()
    }

    #[test]
    fn every_target_survives_its_corpus_and_noise() {
        type Target = (&'static str, fn(&[u8]));
        let targets: [Target; 6] = [
            ("hpack", hpack),
            ("relay_frames", relay_frames),
            ("wire_edit", wire_edit),
            ("editor_stream", editor_stream),
            ("kubelet_annotations", kubelet_annotations),
            ("crr_json", crr_json),
        ];
        for (name, run) in targets {
            assert!(replay(name, run) > 0, "no seed corpus for {name}");
            noise(run, &seeds(name));
        }
    }
}
