//! A counting front proxy before a [`Cluster`]'s API server, for one client
//! identity: the client talks plain HTTP/1.1 to a loopback port (its
//! kubeconfig names `http://127.0.0.1:<port>` and no credentials), and the
//! proxy forwards each request over TLS as the API server's front proxy
//! (request-header authentication: a certificate named `front-proxy`,
//! `X-Remote-User` and `X-Remote-Group`), as kube-aggregator does. So the
//! API server sees the client as its own user, and the proxy sees what the
//! client asks and what each watch sends it: its requests by verb and
//! resource, and its watch events (JSON lines, or protobuf frames).

use std::collections::BTreeMap;
use std::pin::Pin;
use std::sync::{Arc, Mutex};
use std::task::{Context as TaskContext, Poll};

use anyhow::{Context, Result};
use bytes::Bytes;
use hyper::body::Incoming;
use hyper::body::{Body, Frame};
use hyper_util::rt::TokioIo;
use rustls::pki_types::pem::PemObject;
use rustls::pki_types::{CertificateDer, PrivateKeyDer, ServerName};
use tokio::net::{TcpListener, TcpStream};

use super::cluster::Cluster;

/// The CN the API server accepts request headers from
/// (`--requestheader-allowed-names`).
pub const FRONT_PROXY_NAME: &str = "front-proxy";

/// What one client asked and was sent.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Tally {
    /// Requests by `verb resource` (`get pods`, `watch containerrecreaterequests`, `patch .../status`).
    pub requests: BTreeMap<String, u64>,
    /// Events sent on the client's watches.
    pub watch_events: u64,
}

impl Tally {
    pub fn total_requests(&self) -> u64 {
        self.requests.values().sum()
    }

    /// What was counted since `before`.
    pub fn since(&self, before: &Tally) -> Tally {
        let requests = self
            .requests
            .iter()
            .map(|(k, v)| (k.clone(), v - before.requests.get(k).copied().unwrap_or(0)))
            .filter(|(_, v)| *v > 0)
            .collect();
        Tally {
            requests,
            watch_events: self.watch_events - before.watch_events,
        }
    }
}

/// A running front proxy; it stops with the process.
pub struct FrontProxy {
    /// `http://127.0.0.1:<port>`, for the client's kubeconfig.
    pub url: String,
    tally: Arc<Mutex<Tally>>,
}

impl FrontProxy {
    /// Serves a loopback port that forwards to `cluster`'s API server as
    /// `user` in `groups`.
    pub fn start(cluster: &Cluster, user: &str, groups: &[&str]) -> Result<Self> {
        let pair = cluster
            .pki
            .client(FRONT_PROXY_NAME, FRONT_PROXY_NAME, &[])?;
        let mut roots = rustls::RootCertStore::empty();
        for cert in CertificateDer::pem_file_iter(cluster.pki.ca().cert)? {
            roots.add(cert?)?;
        }
        let chain = CertificateDer::pem_file_iter(&pair.cert)?.collect::<Result<Vec<_>, _>>()?;
        let key = PrivateKeyDer::from_pem_file(&pair.key)?;
        let tls = rustls::ClientConfig::builder_with_provider(Arc::new(
            rustls::crypto::ring::default_provider(),
        ))
        .with_safe_default_protocol_versions()?
        .with_root_certificates(roots)
        .with_client_auth_cert(chain, key)?;
        let upstream = cluster
            .server
            .strip_prefix("https://")
            .context("the API server's URL")?
            .to_owned();
        let listener = std::net::TcpListener::bind("127.0.0.1:0")?;
        listener.set_nonblocking(true)?;
        let url = format!("http://{}", listener.local_addr()?);
        let tally = Arc::new(Mutex::new(Tally::default()));
        let route = Arc::new(Route {
            connector: tokio_rustls::TlsConnector::from(Arc::new(tls)),
            upstream,
            user: user.to_owned(),
            groups: groups.iter().map(|g| (*g).to_owned()).collect(),
            tally: tally.clone(),
        });
        let runtime = tokio::runtime::Builder::new_multi_thread()
            .worker_threads(1)
            .enable_all()
            .build()?;
        std::thread::spawn(move || {
            runtime.block_on(async move {
                let Ok(listener) = TcpListener::from_std(listener) else {
                    return;
                };
                while let Ok((client, _)) = listener.accept().await {
                    tokio::spawn(route.clone().serve(client));
                }
            });
        });
        Ok(Self { url, tally })
    }

    /// What the client has asked and been sent so far.
    pub fn tally(&self) -> Tally {
        self.tally.lock().unwrap_or_else(|p| p.into_inner()).clone()
    }
}

struct Route {
    connector: tokio_rustls::TlsConnector,
    upstream: String,
    user: String,
    groups: Vec<String>,
    tally: Arc<Mutex<Tally>>,
}

type Boxed = http_body_util::combinators::BoxBody<Bytes, hyper::Error>;

impl Route {
    /// One client connection, on one upstream connection of its own
    /// (HTTP/1.1: a connection's requests come one after another).
    async fn serve(self: Arc<Self>, client: TcpStream) {
        let Ok(tcp) = TcpStream::connect(&self.upstream).await else {
            return;
        };
        // Without these, Nagle's algorithm holds a response's last small
        // write until the peer's delayed ACK: 40 ms a response.
        let _ = (tcp.set_nodelay(true), client.set_nodelay(true));
        let Ok(name) = ServerName::try_from("127.0.0.1") else {
            return;
        };
        let Ok(tls) = self.connector.connect(name, tcp).await else {
            return;
        };
        let Ok((sender, connection)) =
            hyper::client::conn::http1::handshake::<_, Incoming>(TokioIo::new(tls)).await
        else {
            return;
        };
        tokio::spawn(connection);
        let sender = Arc::new(tokio::sync::Mutex::new(sender));
        let service = hyper::service::service_fn(move |request: hyper::Request<Incoming>| {
            let this = self.clone();
            let sender = sender.clone();
            async move { this.forward(request, &sender).await }
        });
        let _ = hyper::server::conn::http1::Builder::new()
            .serve_connection(TokioIo::new(client), service)
            .await;
    }

    async fn forward(
        &self,
        mut request: hyper::Request<Incoming>,
        sender: &tokio::sync::Mutex<hyper::client::conn::http1::SendRequest<Incoming>>,
    ) -> Result<hyper::Response<Boxed>, hyper::Error> {
        let verb = verb(request.method(), request.uri());
        let watch = verb == "watch";
        let key = format!("{verb} {}", resource(request.uri().path()));
        *self
            .tally
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .requests
            .entry(key)
            .or_default() += 1;
        let headers = request.headers_mut();
        headers.remove(http::header::AUTHORIZATION);
        for name in ["x-remote-user", "x-remote-group"] {
            headers.remove(name);
        }
        if let Ok(user) = http::HeaderValue::from_str(&self.user) {
            headers.insert("x-remote-user", user);
        }
        for group in &self.groups {
            if let Ok(group) = http::HeaderValue::from_str(group) {
                headers.append("x-remote-group", group);
            }
        }
        let response = sender.lock().await.send_request(request).await?;
        let protobuf = response
            .headers()
            .get(http::header::CONTENT_TYPE)
            .and_then(|v| v.to_str().ok())
            .is_some_and(|t| t.contains("protobuf"));
        Ok(response.map(|body| {
            if watch {
                let counted = Counted {
                    inner: body,
                    tally: self.tally.clone(),
                    protobuf,
                    pending: Vec::new(),
                };
                http_body_util::BodyExt::boxed(counted)
            } else {
                http_body_util::BodyExt::boxed(body)
            }
        }))
    }
}

/// The Kubernetes verb of a request.
fn verb(method: &http::Method, uri: &http::Uri) -> &'static str {
    let query = uri.query().unwrap_or_default();
    let watch = query
        .split('&')
        .any(|p| p == "watch=true" || p == "watch=1");
    match *method {
        http::Method::GET if watch => "watch",
        http::Method::GET => "get",
        http::Method::POST => "create",
        http::Method::PUT => "update",
        http::Method::PATCH => "patch",
        http::Method::DELETE => "delete",
        _ => "other",
    }
}

/// The resource of an API path, with its subresource: `pods`,
/// `containerrecreaterequests/status`, `leases`.
fn resource(path: &str) -> String {
    let segments: Vec<&str> = path.trim_matches('/').split('/').collect();
    // api/v1/... or apis/group/version/...
    let rest = match segments.first() {
        Some(&"api") => segments.get(2..),
        Some(&"apis") => segments.get(3..),
        _ => None,
    }
    .unwrap_or_default();
    let rest = match rest {
        ["namespaces", _, tail @ ..] if !tail.is_empty() => tail,
        other => other,
    };
    match rest {
        [resource, _, sub, ..] => format!("{resource}/{sub}"),
        [resource, ..] => (*resource).to_owned(),
        [] => path.to_owned(),
    }
}

/// A watch's body, counting the events it carries: a JSON watch stream is
/// one event per line; a protobuf one is frames, each a 4-byte big-endian
/// length and that many bytes.
struct Counted {
    inner: Incoming,
    tally: Arc<Mutex<Tally>>,
    protobuf: bool,
    pending: Vec<u8>,
}

impl Counted {
    fn count(&mut self, data: &[u8]) {
        let events = if self.protobuf {
            self.pending.extend_from_slice(data);
            let mut events = 0;
            while let Some(head) = self.pending.get(..4) {
                let length = u32::from_be_bytes([head[0], head[1], head[2], head[3]]) as usize;
                if self.pending.len() < 4 + length {
                    break;
                }
                self.pending.drain(..4 + length);
                events += 1;
            }
            events
        } else {
            data.iter().filter(|b| **b == b'\n').count() as u64
        };
        self.tally
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .watch_events += events;
    }
}

impl Body for Counted {
    type Data = Bytes;
    type Error = hyper::Error;

    fn poll_frame(
        mut self: Pin<&mut Self>,
        cx: &mut TaskContext<'_>,
    ) -> Poll<Option<Result<Frame<Bytes>, hyper::Error>>> {
        let polled = Pin::new(&mut self.inner).poll_frame(cx);
        if let Poll::Ready(Some(Ok(frame))) = &polled
            && let Some(data) = frame.data_ref()
        {
            let data = data.clone();
            self.count(&data);
        }
        polled
    }
}
