//! Edits `reason`, `message` and, where the restart rules ask for it,
//! `exit_code` of CRI `ContainerStatus` messages in place, at the protobuf
//! wire level.
//!
//! Decoding into our generated types and encoding again would drop the
//! fields our proto does not know (a newer runtime's) and could reorder the
//! rest. Instead, a message is split into its fields as byte spans; spans
//! are copied as they are, and only the two edited strings and the lengths of
//! the messages that contain them are written anew. Anything that is not
//! well-formed protobuf is left alone: the editor answers `None` and the
//! caller forwards the original bytes.

use std::ops::Range;

use crate::cri::Method;
use crate::restart_rules::Rewrite;

/// CRI v1 field numbers (runtime/v1/api.proto).
mod field {
    pub const STATUS_ID: u32 = 1;
    pub const STATUS_STATE: u32 = 3;
    pub const STATUS_EXIT_CODE: u32 = 7;
    pub const STATUS_REASON: u32 = 10;
    pub const STATUS_MESSAGE: u32 = 11;
    /// `ContainerStatusResponse.status`.
    pub const CONTAINER_STATUS_RESPONSE_STATUS: u32 = 1;
    /// `PodSandboxStatusResponse.containers_statuses`.
    pub const SANDBOX_STATUS_RESPONSE_CONTAINERS: u32 = 3;
    /// `ContainerEventResponse.containers_statuses`.
    pub const EVENT_RESPONSE_CONTAINERS: u32 = 5;
}

/// `ContainerState.CONTAINER_EXITED`: kubelet reads reason and message only
/// from exited containers.
const CONTAINER_EXITED: u64 = 2;

const VARINT: u8 = 0;
const FIXED64: u8 = 1;
const LEN: u8 = 2;
const FIXED32: u8 = 5;

/// The responses that carry container statuses.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum StatusResponse {
    ContainerStatus,
    PodSandboxStatus,
    ContainerEvent,
}

impl StatusResponse {
    /// The response type of a CRI method, if it carries statuses. Only v1:
    /// the field numbers here are v1's, and kubelet has spoken nothing else
    /// since Kubernetes 1.26.
    pub fn for_method(method: Method<'_>) -> Option<Self> {
        if method.version != "v1" || method.service != "RuntimeService" {
            return None;
        }
        match method.name {
            "ContainerStatus" => Some(Self::ContainerStatus),
            "PodSandboxStatus" => Some(Self::PodSandboxStatus),
            "GetContainerEvents" => Some(Self::ContainerEvent),
            _ => None,
        }
    }

    fn status_field(self) -> u32 {
        match self {
            Self::ContainerStatus => field::CONTAINER_STATUS_RESPONSE_STATUS,
            Self::PodSandboxStatus => field::SANDBOX_STATUS_RESPONSE_CONTAINERS,
            Self::ContainerEvent => field::EVENT_RESPONSE_CONTAINERS,
        }
    }
}

/// What kubelet is told of an exited container crr-proxy stopped.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Stopped {
    pub reason: String,
    pub message: String,
    /// The exit code to report when the real one would keep it down.
    pub rewrite: Option<Rewrite>,
}

/// What to tell kubelet of an exited container, by ID.
pub trait Lookup {
    fn stopped(&self, container_id: &str) -> Option<Stopped>;
}

impl<F: Fn(&str) -> Option<Stopped>> Lookup for F {
    fn stopped(&self, container_id: &str) -> Option<Stopped> {
        self(container_id)
    }
}

/// The response message with the reason and message of each exited
/// container `lookup` knows replaced; `None` when nothing changed or the
/// message is not well-formed.
pub fn edit_response(kind: StatusResponse, message: &[u8], lookup: &dyn Lookup) -> Option<Vec<u8>> {
    let status_field = kind.status_field();
    let fields = parse(message)?;
    let mut out: Option<Vec<u8>> = None;
    let mut copied = 0;
    for f in &fields {
        if f.number != status_field || f.wire_type != LEN {
            continue;
        }
        if let Some(status) = edit_status(&message[f.value.clone()], lookup) {
            let out = out.get_or_insert_with(|| Vec::with_capacity(message.len() + 128));
            out.extend_from_slice(&message[copied..f.tag_end]);
            put_len(out, &status);
            copied = f.end;
        }
    }
    let mut out = out?;
    out.extend_from_slice(&message[copied..]);
    Some(out)
}

/// One `ContainerStatus`, edited when it is an exited container `lookup`
/// knows and its reason, message or exit code differ from what kubelet is
/// to be told.
fn edit_status(status: &[u8], lookup: &dyn Lookup) -> Option<Vec<u8>> {
    let fields = parse(status)?;
    // Repeated scalars: the last one wins, as in every protobuf decoder.
    let last = |number: u32, wire_type: u8| {
        fields
            .iter()
            .rev()
            .find(|f| f.number == number && f.wire_type == wire_type)
    };
    let int = |number: u32| match last(number, VARINT) {
        Some(f) => varint(status, &mut { f.value.start }),
        None => Some(0),
    };
    if int(field::STATUS_STATE)? != CONTAINER_EXITED {
        return None;
    }
    let id = std::str::from_utf8(&status[last(field::STATUS_ID, LEN)?.value.clone()]).ok()?;
    let Stopped {
        reason,
        mut message,
        rewrite,
    } = lookup.stopped(id)?;
    // int32 on the wire: a negative value is sign-extended to 64 bits.
    let real = int(field::STATUS_EXIT_CODE)? as u32 as i32;
    let exit_code = rewrite.and_then(|r| r.code_for(real));
    if let Some(code) = exit_code {
        message = format!(
            "{message} (exit code {real}, reported as {code} so that kubelet starts it again)"
        );
    }
    let current = |number: u32| last(number, LEN).map_or(&[][..], |f| &status[f.value.clone()]);
    if current(field::STATUS_REASON) == reason.as_bytes()
        && current(field::STATUS_MESSAGE) == message.as_bytes()
        && exit_code.is_none()
    {
        return None;
    }

    let mut out = Vec::with_capacity(status.len() + reason.len() + message.len() + 8);
    let mut copied = 0;
    let (mut wrote_reason, mut wrote_message) = (false, false);
    for f in &fields {
        match (f.number, f.wire_type) {
            (field::STATUS_REASON, LEN) => {
                wrote_reason = true;
                out.extend_from_slice(&status[copied..f.tag_end]);
                put_len(&mut out, reason.as_bytes());
            }
            (field::STATUS_MESSAGE, LEN) => {
                wrote_message = true;
                out.extend_from_slice(&status[copied..f.tag_end]);
                put_len(&mut out, message.as_bytes());
            }
            // Dropped here, written once at the end (last one wins).
            (field::STATUS_EXIT_CODE, VARINT) if exit_code.is_some() => {
                out.extend_from_slice(&status[copied..f.start]);
            }
            _ => continue,
        }
        copied = f.end;
    }
    out.extend_from_slice(&status[copied..]);
    // proto3 leaves empty strings out: add the ones that were not there.
    for (wrote, number, value) in [
        (wrote_reason, field::STATUS_REASON, &reason),
        (wrote_message, field::STATUS_MESSAGE, &message),
    ] {
        if !wrote {
            put_varint(&mut out, u64::from(number << 3 | u32::from(LEN)));
            put_len(&mut out, value.as_bytes());
        }
    }
    if let Some(code) = exit_code {
        put_varint(&mut out, u64::from(field::STATUS_EXIT_CODE << 3));
        put_varint(&mut out, i64::from(code) as u64);
    }
    Some(out)
}

/// One field of a message, as spans into the message's bytes.
#[derive(Debug)]
struct Field {
    number: u32,
    wire_type: u8,
    /// Where its tag begins.
    start: usize,
    /// End of the tag (a LEN field's length follows it).
    tag_end: usize,
    /// The value: the payload of a LEN field, the encoded value otherwise.
    value: Range<usize>,
    end: usize,
}

/// The fields of a message; `None` unless it is well-formed to the end.
fn parse(message: &[u8]) -> Option<Vec<Field>> {
    let mut fields = Vec::new();
    let mut pos = 0;
    while pos < message.len() {
        let start = pos;
        let tag = varint(message, &mut pos)?;
        let number = u32::try_from(tag >> 3).ok().filter(|n| *n != 0)?;
        let wire_type = u8::try_from(tag & 7).ok()?;
        let tag_end = pos;
        let value = match wire_type {
            VARINT => {
                let start = pos;
                varint(message, &mut pos)?;
                start..pos
            }
            FIXED64 => pos..pos.checked_add(8)?,
            FIXED32 => pos..pos.checked_add(4)?,
            LEN => {
                let len = usize::try_from(varint(message, &mut pos)?).ok()?;
                pos..pos.checked_add(len)?
            }
            // Groups (3, 4) are not proto3; 6 and 7 do not exist.
            _ => return None,
        };
        if value.end > message.len() {
            return None;
        }
        pos = value.end;
        fields.push(Field {
            number,
            wire_type,
            start,
            tag_end,
            value,
            end: pos,
        });
    }
    Some(fields)
}

/// Reads a base-128 varint at `pos`, advancing it.
fn varint(buf: &[u8], pos: &mut usize) -> Option<u64> {
    let mut value = 0u64;
    for i in 0..10 {
        let byte = *buf.get(*pos)?;
        *pos += 1;
        if i == 9 && byte > 1 {
            // More than 64 bits.
            return None;
        }
        value |= u64::from(byte & 0x7f) << (7 * i);
        if byte & 0x80 == 0 {
            return Some(value);
        }
    }
    None
}

fn put_varint(out: &mut Vec<u8>, mut value: u64) {
    while value >= 0x80 {
        out.push((value as u8) | 0x80);
        value >>= 7;
    }
    out.push(value as u8);
}

fn put_len(out: &mut Vec<u8>, bytes: &[u8]) {
    put_varint(out, bytes.len() as u64);
    out.extend_from_slice(bytes);
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::cri::v1::{
        ContainerMetadata, ContainerState, ContainerStatus, ContainerStatusResponse, ImageSpec,
        PodSandboxStatusResponse,
    };
    use prost::Message;

    const REASON: &str = "ContainerRecreateRequest";

    fn lookup(id: &str) -> Option<Stopped> {
        (id == "stopped").then(|| Stopped {
            reason: REASON.to_owned(),
            message: "recreated by ContainerRecreateRequest ns/crr".to_owned(),
            rewrite: None,
        })
    }

    fn status(id: &str, state: ContainerState, reason: &str) -> ContainerStatus {
        ContainerStatus {
            id: id.into(),
            metadata: Some(ContainerMetadata {
                name: "app".into(),
                attempt: 1,
            }),
            state: state as i32,
            created_at: 1,
            finished_at: 2,
            exit_code: 143,
            image: Some(ImageSpec {
                image: "busybox".into(),
                ..Default::default()
            }),
            image_ref: "sha256:abc".into(),
            reason: reason.into(),
            ..Default::default()
        }
    }

    /// Removes fields 10 and 11 from a ContainerStatus's bytes, to compare the rest.
    fn without_reason(bytes: &[u8]) -> Vec<u8> {
        let mut out = Vec::new();
        let mut start = 0;
        for f in parse(bytes).unwrap() {
            if f.number != 10 && f.number != 11 {
                out.extend_from_slice(&bytes[start..f.end]);
            }
            start = f.end;
        }
        out
    }

    #[test]
    fn an_exited_container_it_knows_gets_the_new_reason_and_message() {
        let response = ContainerStatusResponse {
            status: Some(status("stopped", ContainerState::ContainerExited, "Error")),
            info: [("k".to_owned(), "v".to_owned())].into(),
        };
        let bytes = response.encode_to_vec();
        let edited = edit_response(StatusResponse::ContainerStatus, &bytes, &lookup).unwrap();
        let decoded = ContainerStatusResponse::decode(&edited[..]).unwrap();
        let got = decoded.status.unwrap();
        assert_eq!(got.reason, REASON);
        assert_eq!(got.message, "recreated by ContainerRecreateRequest ns/crr");
        let mut expected = status("stopped", ContainerState::ContainerExited, REASON);
        expected.message = got.message.clone();
        assert_eq!(got, expected);
        assert_eq!(decoded.info, response.info);
        // Once edited, a second pass changes nothing.
        assert_eq!(
            edit_response(StatusResponse::ContainerStatus, &edited, &lookup),
            None
        );
    }

    #[test]
    fn running_unknown_and_malformed_containers_are_left_alone() {
        for status in [
            status("stopped", ContainerState::ContainerRunning, ""),
            status("other", ContainerState::ContainerExited, "Completed"),
        ] {
            let bytes = ContainerStatusResponse {
                status: Some(status),
                info: Default::default(),
            }
            .encode_to_vec();
            assert_eq!(
                edit_response(StatusResponse::ContainerStatus, &bytes, &lookup),
                None
            );
        }
        let bytes = ContainerStatusResponse {
            status: Some(status("stopped", ContainerState::ContainerExited, "Error")),
            info: Default::default(),
        }
        .encode_to_vec();
        for cut in 1..bytes.len() {
            // Truncated: not well-formed, so not edited (and no panic).
            let _ = edit_response(StatusResponse::ContainerStatus, &bytes[..cut], &lookup);
        }
        assert_eq!(
            edit_response(StatusResponse::ContainerStatus, &[0x08], &lookup),
            None
        );
        assert_eq!(
            edit_response(StatusResponse::ContainerStatus, &[0x0b, 0x00], &lookup),
            None
        );
        assert_eq!(
            edit_response(StatusResponse::ContainerStatus, &[0xff; 11], &lookup),
            None
        );
    }

    #[test]
    fn unknown_fields_and_other_containers_keep_their_bytes() {
        let mut stopped = status("stopped", ContainerState::ContainerExited, "").encode_to_vec();
        // Fields our proto does not know: 99 (varint), 100 (bytes), 101 (fixed32).
        stopped.extend_from_slice(&[
            0x98, 0x06, 0x2a, 0xa2, 0x06, 0x03, b'x', b'y', b'z', 0xad, 0x06, 1, 2, 3, 4,
        ]);
        let other = status("other", ContainerState::ContainerExited, "Completed").encode_to_vec();
        let mut response = Vec::new();
        for (number, body) in [(3u32, &stopped), (3, &other)] {
            put_varint(&mut response, u64::from(number << 3 | 2));
            put_len(&mut response, body);
        }
        // An unknown top-level field after them.
        response.extend_from_slice(&[0xf8, 0x07, 0x01]);
        let edited = edit_response(StatusResponse::PodSandboxStatus, &response, &lookup).unwrap();

        let fields = parse(&edited).unwrap();
        assert_eq!(fields.len(), 3);
        let first = &edited[fields[0].value.clone()];
        assert_eq!(without_reason(first), without_reason(&stopped));
        assert_eq!(&edited[fields[1].value.clone()], &other[..]);
        assert_eq!(&edited[fields[2].tag_end - 2..], &[0xf8, 0x07, 0x01]);
        let decoded = PodSandboxStatusResponse::decode(&edited[..]).unwrap();
        assert_eq!(decoded.containers_statuses[0].reason, REASON);
        assert_eq!(decoded.containers_statuses[1].reason, "Completed");
    }

    /// Under `OnFailure` a clean exit would keep the container down: kubelet
    /// reads 143, and the message keeps the real code.
    #[test]
    fn an_exit_code_that_keeps_it_down_is_reported_as_one_that_does_not() {
        let rewrite =
            Rewrite::from_word(&format!("143:fffffffffffffffe{}", "f".repeat(48))).unwrap();
        let rewriting = move |id: &str| {
            lookup(id).map(|stopped| Stopped {
                rewrite: Some(rewrite),
                ..stopped
            })
        };
        for (real, reported, message) in [
            (
                0,
                143,
                "recreated by ContainerRecreateRequest ns/crr (exit code 0, reported as 143 so that kubelet starts it again)",
            ),
            (1, 1, "recreated by ContainerRecreateRequest ns/crr"),
            (2, 2, "recreated by ContainerRecreateRequest ns/crr"),
            // Outside 0 to 255 nothing is known of it: a code that restarts.
            (
                -1,
                143,
                "recreated by ContainerRecreateRequest ns/crr (exit code -1, reported as 143 so that kubelet starts it again)",
            ),
        ] {
            let mut exited = status("stopped", ContainerState::ContainerExited, "Completed");
            exited.exit_code = real;
            let mut bytes = exited.encode_to_vec();
            // An unknown field after the status's own survives the edit.
            bytes.extend_from_slice(&[0x98, 0x01, 0x13]);
            let response = {
                let mut out = Vec::new();
                put_varint(&mut out, 1 << 3 | 2);
                put_len(&mut out, &bytes);
                out
            };
            let edited =
                edit_response(StatusResponse::ContainerStatus, &response, &rewriting).unwrap();
            let got = ContainerStatusResponse::decode(&edited[..])
                .unwrap()
                .status
                .unwrap();
            assert_eq!((got.exit_code, got.message.as_str()), (reported, message));
            assert_eq!(got.reason, REASON);
            let fields = parse(&edited[parse(&edited).unwrap()[0].value.clone()]).unwrap();
            assert_eq!(fields.iter().filter(|f| f.number == 7).count(), 1);
            assert!(
                fields.iter().any(|f| f.number == 19),
                "the unknown field is kept"
            );
        }
        // The same code wherever kubelet reads it: PodSandboxStatus and
        // GetContainerEvents carry the statuses in fields 3 and 5.
        for (kind, number) in [
            (StatusResponse::PodSandboxStatus, 3u32),
            (StatusResponse::ContainerEvent, 5),
        ] {
            let mut exited = status("stopped", ContainerState::ContainerExited, "Completed");
            exited.exit_code = 0;
            let mut response = Vec::new();
            put_varint(&mut response, u64::from(number << 3 | 2));
            put_len(&mut response, &exited.encode_to_vec());
            let edited = edit_response(kind, &response, &rewriting).unwrap();
            let inner = &edited[parse(&edited).unwrap()[0].value.clone()];
            let got = ContainerStatus::decode(inner).unwrap();
            assert_eq!(got.exit_code, 143, "{kind:?}");
        }
        // Without a rewrite, a clean exit stays 0.
        let bytes = ContainerStatusResponse {
            status: Some(ContainerStatus {
                exit_code: 0,
                ..status("stopped", ContainerState::ContainerExited, "Completed")
            }),
            info: Default::default(),
        }
        .encode_to_vec();
        let edited = edit_response(StatusResponse::ContainerStatus, &bytes, &lookup).unwrap();
        let got = ContainerStatusResponse::decode(&edited[..])
            .unwrap()
            .status
            .unwrap();
        assert_eq!(got.exit_code, 0);
    }
}
