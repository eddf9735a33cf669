//! The HTTP GET of an httpGet lifecycle hook, as kubelet sends it.

use std::fmt;
use std::sync::Arc;

use bytes::Bytes;
use http::{Request, header};
use http_body_util::{BodyExt, Empty};
use hyper_util::rt::TokioIo;
use rustls::client::danger::{HandshakeSignatureValid, ServerCertVerified, ServerCertVerifier};
use rustls::pki_types::{CertificateDer, ServerName, UnixTime};
use rustls::{DigitallySignedStruct, SignatureScheme};
use tokio::io::{AsyncRead, AsyncWrite};
use tokio::net::TcpStream;
use tracing::debug;

/// kubelet reads at most this much of a hook's answer, and discards it.
const MAX_BODY: usize = 10 * 1024;

/// The User-Agent kubelet sends on lifecycle hooks (`kube-lifecycle/<major>.<minor>`).
pub const USER_AGENT: &str = "kube-lifecycle/1.33";

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Scheme {
    Http,
    Https,
}

impl fmt::Display for Scheme {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(match self {
            Scheme::Http => "http",
            Scheme::Https => "https",
        })
    }
}

/// A GET to send.
#[derive(Clone, Debug)]
pub struct Get {
    pub scheme: Scheme,
    pub host: String,
    pub port: u16,
    /// Path and query, as in `httpGet.path`.
    pub path: String,
    pub headers: Vec<(String, String)>,
}

#[derive(Debug, thiserror::Error)]
pub enum HttpError {
    #[error("dial tcp {authority}")]
    Connect {
        authority: String,
        #[source]
        source: std::io::Error,
    },
    #[error("tls handshake with {authority}")]
    Tls {
        authority: String,
        #[source]
        source: std::io::Error,
    },
    #[error("invalid request for {url}: {reason}")]
    Invalid { url: String, reason: String },
    #[error("GET {url}")]
    Request {
        url: String,
        #[source]
        source: hyper::Error,
    },
}

/// Sends hook GETs. Like kubelet, it does not verify HTTPS certificates:
/// the hook targets the Pod itself, which rarely has a certificate for its IP.
#[derive(Clone)]
pub struct HookClient {
    tls: tokio_rustls::TlsConnector,
}

// === impl Get ===

impl Get {
    fn authority(&self) -> String {
        if self.host.contains(':') {
            format!("[{}]:{}", self.host, self.port)
        } else {
            format!("{}:{}", self.host, self.port)
        }
    }

    fn path_and_query(&self) -> String {
        if self.path.starts_with('/') {
            self.path.clone()
        } else {
            format!("/{}", self.path)
        }
    }

    pub fn url(&self) -> String {
        format!(
            "{}://{}{}",
            self.scheme,
            self.authority(),
            self.path_and_query()
        )
    }
}

// === impl HookClient ===

impl Default for HookClient {
    fn default() -> Self {
        Self::new()
    }
}

impl HookClient {
    pub fn new() -> Self {
        let provider = Arc::new(rustls::crypto::ring::default_provider());
        let config = rustls::ClientConfig::builder_with_provider(Arc::clone(&provider))
            .with_safe_default_protocol_versions()
            .map(|builder| {
                builder
                    .dangerous()
                    .with_custom_certificate_verifier(Arc::new(AcceptAnyCertificate(provider)))
                    .with_no_client_auth()
            });
        let config = match config {
            Ok(config) => config,
            // ring supports the default protocol versions; this is unreachable
            // in practice, and a client without TLS 1.3 still works.
            Err(_) => rustls::ClientConfig::builder()
                .dangerous()
                .with_custom_certificate_verifier(Arc::new(AcceptAnyCertificate(Arc::new(
                    rustls::crypto::ring::default_provider(),
                ))))
                .with_no_client_auth(),
        };
        Self {
            tls: tokio_rustls::TlsConnector::from(Arc::new(config)),
        }
    }

    /// Sends `get` and reads (and drops) up to 10 KiB of the answer. The
    /// status code is not judged, as kubelet does not. An HTTPS GET answered
    /// in plain HTTP is retried over HTTP without the Authorization header;
    /// the returned flag says so.
    pub async fn get(&self, get: &Get) -> Result<bool, HttpError> {
        match self.send(get).await {
            Err(HttpError::Tls { source, .. })
                if get.scheme == Scheme::Https && is_plain_http(&source) =>
            {
                debug!(url = %get.url(), "HTTPS answered in plain HTTP, retrying over HTTP");
                let mut fallback = get.clone();
                fallback.scheme = Scheme::Http;
                fallback
                    .headers
                    .retain(|(name, _)| !name.eq_ignore_ascii_case(header::AUTHORIZATION.as_str()));
                self.send(&fallback).await.map(|()| true)
            }
            other => other.map(|()| false),
        }
    }

    async fn send(&self, get: &Get) -> Result<(), HttpError> {
        let authority = get.authority();
        let tcp = TcpStream::connect((get.host.as_str(), get.port))
            .await
            .map_err(|source| HttpError::Connect {
                authority: authority.clone(),
                source,
            })?;
        let _ = tcp.set_nodelay(true);
        match get.scheme {
            Scheme::Http => exchange(tcp, get).await,
            Scheme::Https => {
                let name =
                    ServerName::try_from(get.host.clone()).map_err(|e| HttpError::Invalid {
                        url: get.url(),
                        reason: e.to_string(),
                    })?;
                let tls = self
                    .tls
                    .connect(name, tcp)
                    .await
                    .map_err(|source| HttpError::Tls { authority, source })?;
                exchange(tls, get).await
            }
        }
    }
}

async fn exchange<S>(io: S, get: &Get) -> Result<(), HttpError>
where
    S: AsyncRead + AsyncWrite + Unpin + Send + 'static,
{
    let url = get.url();
    let request_error = |source| HttpError::Request {
        url: url.clone(),
        source,
    };
    let (mut sender, connection) = hyper::client::conn::http1::handshake(TokioIo::new(io))
        .await
        .map_err(request_error)?;
    tokio::spawn(async move {
        let _ = connection.await;
    });
    let mut request = Request::get(get.path_and_query())
        .header(header::HOST, get.authority())
        .header(header::USER_AGENT, USER_AGENT)
        .header(header::ACCEPT, "*/*");
    for (name, value) in &get.headers {
        request = request.header(name.as_str(), value.as_str());
    }
    let request = request
        .body(Empty::<Bytes>::new())
        .map_err(|e| HttpError::Invalid {
            url: url.clone(),
            reason: e.to_string(),
        })?;
    let response = sender.send_request(request).await.map_err(request_error)?;
    let mut body = response.into_body();
    let mut read = 0;
    while read < MAX_BODY {
        match body.frame().await {
            Some(Ok(frame)) => read += frame.data_ref().map_or(0, Bytes::len),
            Some(Err(source)) => return Err(request_error(source)),
            None => break,
        }
    }
    Ok(())
}

/// True when a TLS handshake failed because the server answered in plain
/// HTTP (its first bytes are not a TLS record).
fn is_plain_http(error: &std::io::Error) -> bool {
    error
        .get_ref()
        .and_then(|inner| inner.downcast_ref::<rustls::Error>())
        .is_some_and(|e| matches!(e, rustls::Error::InvalidMessage(_)))
}

/// kubelet's hook client skips certificate verification; so does ours.
#[derive(Debug)]
struct AcceptAnyCertificate(Arc<rustls::crypto::CryptoProvider>);

impl ServerCertVerifier for AcceptAnyCertificate {
    fn verify_server_cert(
        &self,
        _end_entity: &CertificateDer<'_>,
        _intermediates: &[CertificateDer<'_>],
        _server_name: &ServerName<'_>,
        _ocsp_response: &[u8],
        _now: UnixTime,
    ) -> Result<ServerCertVerified, rustls::Error> {
        Ok(ServerCertVerified::assertion())
    }

    fn verify_tls12_signature(
        &self,
        message: &[u8],
        cert: &CertificateDer<'_>,
        dss: &DigitallySignedStruct,
    ) -> Result<HandshakeSignatureValid, rustls::Error> {
        rustls::crypto::verify_tls12_signature(
            message,
            cert,
            dss,
            &self.0.signature_verification_algorithms,
        )
    }

    fn verify_tls13_signature(
        &self,
        message: &[u8],
        cert: &CertificateDer<'_>,
        dss: &DigitallySignedStruct,
    ) -> Result<HandshakeSignatureValid, rustls::Error> {
        rustls::crypto::verify_tls13_signature(
            message,
            cert,
            dss,
            &self.0.signature_verification_algorithms,
        )
    }

    fn supported_verify_schemes(&self) -> Vec<SignatureScheme> {
        self.0.signature_verification_algorithms.supported_schemes()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn get(host: &str, path: &str) -> Get {
        Get {
            scheme: Scheme::Http,
            host: host.into(),
            port: 8080,
            path: path.into(),
            headers: vec![],
        }
    }

    #[test]
    fn urls_join_host_port_and_path_as_kubelet_does() {
        assert_eq!(
            get("10.0.0.7", "quit?now=1").url(),
            "http://10.0.0.7:8080/quit?now=1"
        );
        assert_eq!(get("fd00::7", "/quit").url(), "http://[fd00::7]:8080/quit");
        assert_eq!(get("web", "").url(), "http://web:8080/");
    }

    #[tokio::test]
    async fn https_answered_in_plain_http_falls_back_without_authorization() {
        use tokio::io::{AsyncReadExt, AsyncWriteExt};
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let port = listener.local_addr().unwrap().port();
        let server = tokio::spawn(async move {
            let mut requests = Vec::new();
            for _ in 0..2 {
                let (mut socket, _) = listener.accept().await.unwrap();
                let mut buf = vec![0; 4096];
                let n = socket.read(&mut buf).await.unwrap();
                requests.push(String::from_utf8_lossy(&buf[..n]).into_owned());
                let _ = socket
                    .write_all(b"HTTP/1.1 400 Bad Request\r\nContent-Length: 0\r\nConnection: close\r\n\r\n")
                    .await;
            }
            requests
        });
        let client = HookClient::new();
        let fell_back = client
            .get(&Get {
                scheme: Scheme::Https,
                host: "127.0.0.1".into(),
                port,
                path: "/hook".into(),
                headers: vec![
                    ("Authorization".into(), "Bearer x".into()),
                    ("X-Hook".into(), "1".into()),
                ],
            })
            .await
            .unwrap();
        assert!(fell_back);
        let requests = server.await.unwrap();
        let plain = &requests[1];
        assert!(plain.starts_with("GET /hook HTTP/1.1\r\n"), "{plain}");
        assert!(plain.to_ascii_lowercase().contains("x-hook: 1"), "{plain}");
        assert!(
            !plain.to_ascii_lowercase().contains("authorization"),
            "{plain}"
        );
        assert!(plain.contains(USER_AGENT), "{plain}");
    }
}
