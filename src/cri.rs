//! crr-proxy's own CRI client, generated from `proto/`.
//!
//! Only crr-proxy's own calls (and its tests) use this: kubelet's traffic
//! passes through [`crate::proxy`] undecoded.

use std::io;

use hyper_util::rt::TokioIo;
use tokio::net::UnixStream;
use tonic::transport::{Channel, Uri};

pub mod endpoint;
pub mod method;

pub use endpoint::{Endpoint, EndpointError};
pub use method::Method;

/// The generated `runtime.v1` messages and clients.
#[allow(clippy::all, missing_docs)]
pub mod v1 {
    tonic::include_proto!("runtime.v1");
}

/// kubelet and containerd both cap gRPC messages at 16 MiB.
pub const MAX_MESSAGE_SIZE: usize = 16 << 20;

pub type RuntimeClient = v1::runtime_service_client::RuntimeServiceClient<Channel>;

/// A channel to `endpoint` that connects on first use and reconnects after
/// the runtime restarts.
pub fn channel(endpoint: &Endpoint) -> Channel {
    let path = endpoint.path().to_owned();
    // The URI is required by tonic but unused: the connector dials the socket.
    tonic::transport::Endpoint::from_static("http://localhost").connect_with_connector_lazy(
        tower::service_fn(move |_: Uri| {
            let path = path.clone();
            async move { Ok::<_, io::Error>(TokioIo::new(UnixStream::connect(path).await?)) }
        }),
    )
}

/// A RuntimeService client with kubelet's message limits.
pub fn runtime_client(channel: Channel) -> RuntimeClient {
    RuntimeClient::new(channel)
        .max_decoding_message_size(MAX_MESSAGE_SIZE)
        .max_encoding_message_size(MAX_MESSAGE_SIZE)
}
