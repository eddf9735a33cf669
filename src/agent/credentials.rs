//! The agent's API client: its configuration (the kubeconfig named, else
//! the usual places, else the in-cluster account), and its credentials
//! followed as they change on disk.
//!
//! kube reads a client certificate once, when a client is built. Under
//! kubelet's identity the kubeconfig names `kubelet-client-current.pem`,
//! which kubelet replaces with a new certificate at 70–90 % of the old
//! one's life (client-go's `certificate_manager.go`,
//! `nextRotationDeadline`); an operator may also rewrite crr-proxy's own
//! kubeconfig with a new credential. A daemon that runs for months must
//! take either without a restart, which would cut kubelet's CRI calls
//! short. So the agent's requests go through a client that is built again
//! when the kubeconfig, or a file it names, has changed: looked at every
//! minute, and at once after the API server answers 401. Requests in
//! flight (a watch) finish on the client they began on.

use std::path::{Path, PathBuf};
use std::sync::{Arc, RwLock};
use std::task::{Context, Poll};
use std::time::Duration;

use futures_util::future::BoxFuture;
use http::{Request, Response, StatusCode};
use kube::client::Body;
use kube::config::{KubeConfigOptions, Kubeconfig};
use tokio::sync::Notify;
use tracing::{debug, error, info, warn};

use super::error::AgentError;
use crate::metrics::Metrics;
use crate::telemetry::Chain;

/// How often the files are compared with those the client was built from.
/// kubelet renews its certificate weeks before the old one expires, so a
/// minute is prompt; a 401 asks at once.
const EVERY: Duration = Duration::from_secs(60);

/// The least time between two looks, so that a run of 401s (a credential
/// revoked for good) reads the files once a second at most.
const PAUSE: Duration = Duration::from_secs(1);

/// The Kubernetes client configuration: `kubeconfig` (`--kubeconfig`),
/// else `$KUBECONFIG` or `~/.kube/config`, else the in-cluster service
/// account.
pub async fn kube_config(kubeconfig: Option<&Path>) -> Result<kube::Config, AgentError> {
    match kubeconfig {
        Some(path) => kube_config_at(path).await,
        None => inferred_config().await,
    }
}

/// Without `--kubeconfig`: `$KUBECONFIG` or `~/.kube/config`, else the
/// in-cluster service account.
async fn inferred_config() -> Result<kube::Config, AgentError> {
    let mut config = kube::Config::infer()
        .await
        .map_err(|e| AgentError::KubeConfig(e.to_string()))?;
    crate::version::identify(&mut config, "agent");
    Ok(config)
}

/// The Kubernetes client configuration of the kubeconfig at `path`.
async fn kube_config_at(path: &Path) -> Result<kube::Config, AgentError> {
    let bad =
        |e: &dyn std::fmt::Display| AgentError::KubeConfig(format!("{}: {e}", path.display()));
    let kubeconfig = Kubeconfig::read_from(path).map_err(|e| bad(&e))?;
    let mut config =
        kube::Config::from_custom_kubeconfig(kubeconfig, &KubeConfigOptions::default())
            .await
            .map_err(|e| bad(&e))?;
    crate::version::identify(&mut config, "agent");
    Ok(config)
}

/// The agent's Kubernetes client, once its configuration can be read: a
/// named kubeconfig is followed as its credentials change (kubelet's
/// rotating certificate); without one, the in-cluster or default
/// configuration. Until then each failure is logged, and tried again after
/// 1 s, doubling up to a minute.
pub(super) async fn client_when_configured(
    kubeconfig: Option<&Path>,
    metrics: &Arc<Metrics>,
) -> kube::Client {
    let mut delay = Duration::from_secs(1);
    loop {
        let client = match kubeconfig {
            Some(path) => following(path, Arc::clone(metrics)).await,
            None => inferred_config()
                .await
                .and_then(|config| kube::Client::try_from(config).map_err(AgentError::Kube)),
        };
        match client {
            Ok(client) => return client,
            Err(error) => {
                error!(
                    error = %Chain(&error),
                    retry_in = ?delay,
                    "the agent cannot build its Kubernetes client; the proxy serves without it meanwhile"
                );
                tokio::time::sleep(delay).await;
                delay = (delay * 2).min(Duration::from_secs(60));
            }
        }
    }
}

/// Looks in a row that could not read the files before that is a warning
/// (each look is about 2 s apart).
const UNREAD_WARN: u32 = 5;

/// A client for `kubeconfig` whose credentials follow the files. `metrics`
/// learns when the client certificate in use expires.
pub(crate) async fn following(
    kubeconfig: &Path,
    metrics: Arc<Metrics>,
) -> Result<kube::Client, AgentError> {
    let sources = Sources::read(kubeconfig).await?;
    let config = kube_config_at(kubeconfig).await?;
    let namespace = config.default_namespace.clone();
    let (client, expiry) = client_for(config)?;
    metrics.set_client_certificate_expiry(expiry);
    let shared = Arc::new(Shared {
        client: RwLock::new(client),
        stale: Notify::new(),
        metrics,
    });
    tokio::spawn(watch(kubeconfig.to_owned(), sources, Arc::clone(&shared)));
    Ok(kube::Client::new(Following { shared }, namespace))
}

/// A client for `config`, and when its client certificate ends.
fn client_for(config: kube::Config) -> Result<(kube::Client, Option<i64>), AgentError> {
    let expiry = certificate_expiry(&config);
    let client = kube::Client::try_from(config).map_err(AgentError::Kube)?;
    Ok((client, expiry))
}

/// When the client certificate `config` authenticates with ends, in
/// seconds since the epoch: the first certificate of its PEM (kubelet's
/// `kubelet-client-current.pem` holds the key beside it). `None` without
/// one, or where it cannot be read (the client build reports that).
fn certificate_expiry(config: &kube::Config) -> Option<i64> {
    use base64::Engine as _;
    let auth = &config.auth_info;
    let pem = match (&auth.client_certificate_data, &auth.client_certificate) {
        (Some(data), _) => base64::engine::general_purpose::STANDARD
            .decode(data.trim())
            .ok()?,
        (None, Some(path)) => std::fs::read(path).ok()?,
        (None, None) => return None,
    };
    pem_expiry(&pem)
}

fn pem_expiry(pem: &[u8]) -> Option<i64> {
    use x509_cert::der::Decode as _;
    let block = pem::parse_many(pem)
        .ok()?
        .into_iter()
        .find(|block| block.tag() == "CERTIFICATE")?;
    let certificate = x509_cert::Certificate::from_der(block.contents()).ok()?;
    let end = certificate
        .tbs_certificate()
        .validity()
        .not_after
        .to_unix_duration();
    i64::try_from(end.as_secs()).ok()
}

/// The client in use, and the signal that it may be out of date.
struct Shared {
    client: RwLock<kube::Client>,
    stale: Notify,
    metrics: Arc<Metrics>,
}

impl Shared {
    fn current(&self) -> kube::Client {
        // A poisoned lock still holds a whole client.
        match self.client.read() {
            Ok(client) => client.clone(),
            Err(poisoned) => poisoned.into_inner().clone(),
        }
    }

    fn replace(&self, client: kube::Client) {
        match self.client.write() {
            Ok(mut current) => *current = client,
            Err(poisoned) => *poisoned.into_inner() = client,
        }
    }
}

/// Each request on the client of the moment.
#[derive(Clone)]
struct Following {
    shared: Arc<Shared>,
}

impl tower::Service<Request<Body>> for Following {
    type Response = Response<Body>;
    type Error = kube::Error;
    type Future = BoxFuture<'static, Result<Response<Body>, kube::Error>>;

    fn poll_ready(&mut self, _: &mut Context<'_>) -> Poll<Result<(), Self::Error>> {
        Poll::Ready(Ok(()))
    }

    fn call(&mut self, request: Request<Body>) -> Self::Future {
        let client = self.shared.current();
        let shared = Arc::clone(&self.shared);
        Box::pin(async move {
            let response = client.send(request).await?;
            if response.status() == StatusCode::UNAUTHORIZED {
                shared.stale.notify_one();
            }
            Ok(response)
        })
    }
}

/// Builds the client again whenever the files differ from those it was
/// built from. A failed build keeps the client in use.
async fn watch(kubeconfig: PathBuf, mut built_from: Sources, shared: Arc<Shared>) {
    // Looks in a row that could not read the files.
    let mut unread = 0u32;
    loop {
        tokio::select! {
            () = tokio::time::sleep(EVERY) => {}
            () = shared.stale.notified() => {}
        }
        let read = Sources::read(&kubeconfig).await;
        unread = if read.is_ok() { 0 } else { unread + 1 };
        match read {
            // A file missing for a moment (a swap under way) is looked at
            // again; missing for longer, the credentials in use may expire
            // unnoticed, which is said (then once a minute).
            Err(error) => {
                if unread >= UNREAD_WARN && (unread - UNREAD_WARN) % 30 == 0 {
                    warn!(error = %Chain(&error), tries = unread, "cannot read the kubeconfig's files: the credentials in use are kept, and may expire");
                } else {
                    debug!(error = %Chain(&error), "cannot read the kubeconfig's files now; looking again");
                }
                tokio::time::sleep(PAUSE).await;
                shared.stale.notify_one();
            }
            Ok(now) if now == built_from => {}
            Ok(now) => match kube_config_at(&kubeconfig).await.and_then(client_for) {
                Ok((client, expiry)) => {
                    shared.replace(client);
                    shared.metrics.set_client_certificate_expiry(expiry);
                    built_from = now;
                    info!(kubeconfig = %kubeconfig.display(), "the kubeconfig or a credential it names changed; new requests use it");
                }
                Err(error) => {
                    warn!(error = %Chain(&error), "the kubeconfig changed but cannot be used; keeping the credentials in use");
                    built_from = now;
                }
            },
        }
        tokio::time::sleep(PAUSE).await;
    }
}

/// What a client is built from: the kubeconfig's bytes, and those of each
/// file it names for a credential or for the server's CA.
#[derive(Debug, PartialEq, Eq)]
struct Sources(Vec<(PathBuf, Vec<u8>)>);

impl Sources {
    async fn read(kubeconfig: &Path) -> Result<Self, AgentError> {
        let kubeconfig = kubeconfig.to_owned();
        tokio::task::spawn_blocking(move || Self::read_now(&kubeconfig))
            .await
            .map_err(|e| AgentError::KubeConfig(e.to_string()))?
    }

    fn read_now(kubeconfig: &Path) -> Result<Self, AgentError> {
        let read = |path: &Path| {
            std::fs::read(path)
                .map_err(|e| AgentError::KubeConfig(format!("{}: {e}", path.display())))
        };
        let mut files = vec![(kubeconfig.to_owned(), read(kubeconfig)?)];
        let parsed = Kubeconfig::read_from(kubeconfig)
            .map_err(|e| AgentError::KubeConfig(format!("{}: {e}", kubeconfig.display())))?;
        // Only what the current context uses, as the client is built from
        // it: another context's missing file is none of the agent's business.
        let context = parsed
            .contexts
            .iter()
            .find(|c| Some(&c.name) == parsed.current_context.as_ref())
            .and_then(|c| c.context.as_ref());
        let user = context.and_then(|c| c.user.as_ref());
        let cluster = context.map(|c| &c.cluster);
        let named = parsed
            .auth_infos
            .iter()
            .filter(|a| Some(&a.name) == user)
            .filter_map(|a| a.auth_info.as_ref())
            .flat_map(|a| [&a.client_certificate, &a.client_key, &a.token_file])
            .chain(
                parsed
                    .clusters
                    .iter()
                    .filter(|c| Some(&c.name) == cluster)
                    .filter_map(|c| c.cluster.as_ref())
                    .map(|c| &c.certificate_authority),
            )
            .flatten();
        for path in named {
            let path = PathBuf::from(path);
            if !files.iter().any(|(seen, _)| *seen == path) {
                let bytes = read(&path)?;
                files.push((path, bytes));
            }
        }
        Ok(Self(files))
    }
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used, clippy::expect_used)] // tests fail loudly by design

    use super::*;

    fn kubeconfig(dir: &Path, cert: &str) -> PathBuf {
        let path = dir.join("kubelet.conf");
        let text = format!(
            "apiVersion: v1\nkind: Config\nclusters:\n- name: c\n  cluster:\n    server: https://127.0.0.1:6443\n\
             users:\n- name: default-auth\n  user:\n    client-certificate: {cert}\n    client-key: {cert}\n\
             contexts:\n- name: x\n  context:\n    cluster: c\n    user: default-auth\ncurrent-context: x\n"
        );
        std::fs::write(&path, text).unwrap();
        path
    }

    #[test]
    fn a_renewed_certificate_behind_the_same_name_is_a_change() {
        let dir =
            std::env::temp_dir().join(format!("crr-proxy-credentials-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&dir);
        std::fs::create_dir_all(&dir).unwrap();
        let first = dir.join("kubelet-client-2026-01-01.pem");
        let second = dir.join("kubelet-client-2026-10-01.pem");
        std::fs::write(&first, "first").unwrap();
        std::fs::write(&second, "second").unwrap();
        let current = dir.join("kubelet-client-current.pem");
        std::os::unix::fs::symlink(&first, &current).unwrap();
        // Relative to the kubeconfig's folder, as kube reads it.
        let path = kubeconfig(&dir, "kubelet-client-current.pem");
        let before = Sources::read_now(&path).unwrap();
        assert_eq!(before.0.len(), 2, "{before:?}");
        assert_eq!(Sources::read_now(&path).unwrap(), before);
        // As kubelet's certificate store swaps it: the link goes, then comes
        // back to the new file.
        std::fs::remove_file(&current).unwrap();
        assert!(Sources::read_now(&path).is_err());
        std::os::unix::fs::symlink(&second, &current).unwrap();
        assert_ne!(Sources::read_now(&path).unwrap(), before);

        // Another context's user and its missing file play no part.
        let mut text = std::fs::read_to_string(&path).unwrap();
        text = text.replace(
            "contexts:",
            "- name: other\n  user:\n    client-certificate: /nowhere/other.pem\ncontexts:",
        );
        std::fs::write(&path, text).unwrap();
        assert_eq!(Sources::read_now(&path).unwrap().0.len(), 2);
        std::fs::remove_dir_all(&dir).unwrap();
    }
}
