//! What the proxy's two paths (the relay, and the hyper path for an image
//! endpoint of its own) share about one call: its record in the metrics,
//! the gRPC codes crr-proxy gives a call itself, the words of its
//! `UNAVAILABLE`, and whether its answer is edited.

use std::fmt::Display;
use std::sync::Arc;
use std::time::Instant;

use super::Endpoint;
use crate::cri::Method;
use crate::metrics::Metrics;
use crate::reason::{Editor, Recreated, StatusResponse};

/// gRPC status codes the proxy itself assigns to a call.
const CANCELLED: u32 = 1;
pub(super) const UNKNOWN: u32 = 2;
pub(super) const UNAVAILABLE: u32 = 14;

/// One call being counted: finished by its gRPC status, or as CANCELLED if
/// the client goes away first.
#[derive(Debug)]
pub(super) struct Call {
    metrics: Arc<Metrics>,
    method: usize,
    started: Instant,
    finished: bool,
}

impl Call {
    pub(super) fn start(metrics: &Arc<Metrics>, method: Option<Method<'_>>) -> Self {
        metrics.call_started();
        Self {
            metrics: Arc::clone(metrics),
            method: Metrics::method_index(method),
            started: Instant::now(),
            finished: false,
        }
    }

    pub(super) fn finish(&mut self, code: u32) {
        if !self.finished {
            self.finished = true;
            self.metrics
                .call_finished(self.method, code, self.started.elapsed());
        }
    }
}

impl Drop for Call {
    fn drop(&mut self) {
        self.finish(CANCELLED);
    }
}

/// Why a call ends `UNAVAILABLE`: the runtime endpoint, and `cause`.
pub(super) fn unavailable_message(endpoint: &Endpoint, cause: &dyn Display) -> String {
    format!("runtime endpoint {endpoint} is unavailable: {cause}")
}

/// The editor for the answer to a call of `method`, with the record it
/// reads. Only the three status answers pay for reading messages, and a
/// unary one only once a container was recreated; the method is checked
/// first, as it costs no lock. The event stream lives as long as kubelet,
/// so it is read from its start: a container recreated later is in it.
pub(super) fn editor_for(
    method: Option<Method<'_>>,
    recreated: Option<&Arc<Recreated>>,
) -> Option<(Editor, Arc<Recreated>)> {
    let kind = StatusResponse::for_method(method?)?;
    let recreated = recreated?;
    if kind != StatusResponse::ContainerEvent && recreated.is_empty() {
        return None;
    }
    Some((Editor::new(kind), Arc::clone(recreated)))
}
