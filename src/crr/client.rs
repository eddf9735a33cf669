//! Reading and writing CRRs in the version the cluster serves: v1beta1
//! where it is served (OpenKruise master, or crr-proxy's own CRD), else
//! v1alpha1 (OpenKruise v1.9). Both are the one Rust type of [`super`];
//! only the URL and the `apiVersion` written differ.

use futures_util::{Stream, TryStreamExt};
use kube::ResourceExt;
use kube::api::{
    Api, ApiResource, DeleteParams, DynamicObject, ListParams, Patch, PatchParams, PostParams,
};
use kube::runtime::watcher;
use serde_json::Value;
use tracing::warn;

use super::{ContainerRecreateRequest, GROUP, KIND, PLURAL};

/// A served version of the CRR API.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum ApiVersion {
    V1alpha1,
    V1beta1,
}

impl ApiVersion {
    pub fn as_str(self) -> &'static str {
        match self {
            ApiVersion::V1alpha1 => super::VERSION,
            ApiVersion::V1beta1 => super::v1beta1::VERSION,
        }
    }

    pub fn api_resource(self) -> ApiResource {
        ApiResource {
            group: GROUP.into(),
            version: self.as_str().into(),
            api_version: format!("{GROUP}/{}", self.as_str()),
            kind: KIND.into(),
            plural: PLURAL.into(),
        }
    }

    /// Which version to use: v1beta1 if the cluster lists CRRs under
    /// `apps.kruise.io/v1beta1` (OpenKruise v1.9 serves that group-version
    /// for other kinds, so the group-version alone proves nothing), else
    /// v1alpha1. Errors if neither serves them, and when the v1beta1 probe
    /// fails for any other reason than "not served": on a cluster that
    /// serves both, a transient failure (the first request on a connection
    /// the API server closed as it restarted) would otherwise read as "v1alpha1
    /// only" and turn every watch over to the older version, and back.
    pub async fn discover(client: &kube::Client) -> Result<Self, kube::Error> {
        for version in [ApiVersion::V1beta1, ApiVersion::V1alpha1] {
            match client
                .list_api_group_resources(&format!("{GROUP}/{}", version.as_str()))
                .await
            {
                Ok(list) if list.resources.iter().any(|r| r.name == PLURAL) => return Ok(version),
                Ok(_) => {}
                Err(kube::Error::Api(status)) if status.code == 404 => {}
                Err(error) => return Err(error),
            }
        }
        Err(kube::Error::Api(Box::new(kube::core::Status {
            code: 404,
            message: format!("{GROUP} does not serve {PLURAL}"),
            reason: "NotFound".into(),
            ..Default::default()
        })))
    }
}

/// CRRs through one served version.
#[derive(Clone)]
pub struct CrrClient {
    client: kube::Client,
    version: ApiVersion,
}

impl CrrClient {
    pub fn new(client: kube::Client, version: ApiVersion) -> Self {
        Self { client, version }
    }

    pub fn version(&self) -> ApiVersion {
        self.version
    }

    fn namespaced(&self, namespace: &str) -> Api<DynamicObject> {
        Api::namespaced_with(self.client.clone(), namespace, &self.version.api_resource())
    }

    fn of(&self, crr: &ContainerRecreateRequest) -> Api<DynamicObject> {
        self.namespaced(&crr.namespace().unwrap_or_default())
    }

    /// The CRRs matching `config`, in every namespace.
    pub fn watch(
        &self,
        config: watcher::Config,
    ) -> impl Stream<Item = Result<watcher::Event<ContainerRecreateRequest>, watcher::Error>>
    + Send
    + 'static {
        let api = Api::<DynamicObject>::all_with(self.client.clone(), &self.version.api_resource());
        Self::parsed(api, config)
    }

    /// The CRRs matching `config` in `namespace`.
    pub fn watch_in(
        &self,
        namespace: &str,
        config: watcher::Config,
    ) -> impl Stream<Item = Result<watcher::Event<ContainerRecreateRequest>, watcher::Error>>
    + Send
    + 'static {
        Self::parsed(self.namespaced(namespace), config)
    }

    fn parsed(
        api: Api<DynamicObject>,
        config: watcher::Config,
    ) -> impl Stream<Item = Result<watcher::Event<ContainerRecreateRequest>, watcher::Error>>
    + Send
    + 'static {
        // An object that does not parse (written past the schema) is
        // skipped: it must not stop the watch of every other CRR.
        watcher(api, config).try_filter_map(|event| async move {
            Ok(match event {
                watcher::Event::Apply(obj) => parse(obj).map(watcher::Event::Apply),
                watcher::Event::Delete(obj) => parse(obj).map(watcher::Event::Delete),
                watcher::Event::InitApply(obj) => parse(obj).map(watcher::Event::InitApply),
                watcher::Event::Init => Some(watcher::Event::Init),
                watcher::Event::InitDone => Some(watcher::Event::InitDone),
            })
        })
    }

    /// Creates `body` (a CRR in this version's JSON) in `namespace`; with
    /// `dry_run`, judged by the API server and its admission, not stored.
    pub async fn create(
        &self,
        namespace: &str,
        body: &Value,
        dry_run: bool,
    ) -> Result<ContainerRecreateRequest, kube::Error> {
        let body: DynamicObject =
            serde_json::from_value(body.clone()).map_err(kube::Error::SerdeError)?;
        let params = PostParams {
            dry_run,
            ..PostParams::default()
        };
        parse_object(self.namespaced(namespace).create(&params, &body).await?)
    }

    /// The CRRs matching `selector`, in every namespace (one LIST, paged).
    pub async fn list(&self, selector: &str) -> Result<Vec<ContainerRecreateRequest>, kube::Error> {
        let api = Api::<DynamicObject>::all_with(self.client.clone(), &self.version.api_resource());
        let mut params = ListParams::default().labels(selector).limit(500);
        let mut found = Vec::new();
        loop {
            let page = api.list(&params).await?;
            found.extend(page.items.into_iter().filter_map(parse));
            match page.metadata.continue_.filter(|c| !c.is_empty()) {
                Some(token) => params = params.continue_token(&token),
                None => return Ok(found),
            }
        }
    }

    pub async fn get(
        &self,
        namespace: &str,
        name: &str,
    ) -> Result<Option<ContainerRecreateRequest>, kube::Error> {
        match self.namespaced(namespace).get_opt(name).await? {
            Some(obj) => Ok(Some(parse_object(obj)?)),
            None => Ok(None),
        }
    }

    /// PUT of the status subresource, `crr`'s resourceVersion the
    /// precondition.
    pub async fn replace_status(
        &self,
        crr: &ContainerRecreateRequest,
    ) -> Result<ContainerRecreateRequest, kube::Error> {
        let mut body = serde_json::to_value(crr).map_err(kube::Error::SerdeError)?;
        body["apiVersion"] = Value::String(self.version.api_resource().api_version);
        let body: DynamicObject = serde_json::from_value(body).map_err(kube::Error::SerdeError)?;
        let written = self
            .of(crr)
            .replace_status(&crr.name_any(), &PostParams::default(), &body)
            .await?;
        parse_object(written)
    }

    /// A JSON merge patch of the status subresource.
    pub async fn patch_status(
        &self,
        crr: &ContainerRecreateRequest,
        patch: &Value,
    ) -> Result<ContainerRecreateRequest, kube::Error> {
        let written = self
            .of(crr)
            .patch_status(
                &crr.name_any(),
                &PatchParams::default(),
                &Patch::Merge(patch),
            )
            .await?;
        parse_object(written)
    }

    /// A JSON merge patch of the main resource (metadata, spec).
    pub async fn patch(
        &self,
        crr: &ContainerRecreateRequest,
        patch: &Value,
    ) -> Result<ContainerRecreateRequest, kube::Error> {
        let written = self
            .of(crr)
            .patch(
                &crr.name_any(),
                &PatchParams::default(),
                &Patch::Merge(patch),
            )
            .await?;
        parse_object(written)
    }

    /// Deletes `crr`; one already gone is no error.
    pub async fn delete(&self, crr: &ContainerRecreateRequest) -> Result<(), kube::Error> {
        match self
            .of(crr)
            .delete(&crr.name_any(), &DeleteParams::default())
            .await
        {
            Ok(_) => Ok(()),
            Err(kube::Error::Api(status)) if status.code == 404 => Ok(()),
            Err(error) => Err(error),
        }
    }
}

fn parse_object(obj: DynamicObject) -> Result<ContainerRecreateRequest, kube::Error> {
    serde_json::to_value(obj)
        .and_then(serde_json::from_value)
        .map_err(kube::Error::SerdeError)
}

/// `obj` as a CRR, or `None` (logged) when it is not one.
fn parse(obj: DynamicObject) -> Option<ContainerRecreateRequest> {
    let name = format!("{}/{}", obj.namespace().unwrap_or_default(), obj.name_any());
    parse_object(obj)
        .inspect_err(|error| warn!(crr = %name, %error, "skipping a CRR that does not parse"))
        .ok()
}

#[cfg(test)]
mod tests {
    use std::convert::Infallible;

    use bytes::Bytes;
    use http_body_util::Full;
    use serde_json::json;

    use super::*;

    /// A cluster that serves CRRs in both versions, whose answer to the
    /// v1beta1 probe is `v1beta1`.
    fn cluster(v1beta1: (u16, Value)) -> kube::Client {
        let service = tower::service_fn(move |request: http::Request<kube::client::Body>| {
            let version = request.uri().path().rsplit('/').next().unwrap_or_default();
            let (code, body) = match version {
                "v1beta1" => v1beta1.clone(),
                version => served(version),
            };
            let answer = http::Response::builder()
                .status(code)
                .body(Full::new(Bytes::from(body.to_string())));
            async move { Ok::<_, Infallible>(answer.unwrap_or_default()) }
        });
        kube::Client::new(service, "default")
    }

    fn status(code: u16, reason: &str) -> (u16, Value) {
        let body = json!({
            "kind": "Status", "apiVersion": "v1", "status": "Failure",
            "message": reason, "reason": reason, "code": code,
        });
        (code, body)
    }

    #[tokio::test]
    async fn v1beta1_where_served_else_v1alpha1_and_no_guess_after_a_failure() {
        let both = cluster(served("v1beta1"));
        assert_eq!(
            ApiVersion::discover(&both).await.ok(),
            Some(ApiVersion::V1beta1)
        );

        let not_served = cluster(status(404, "NotFound"));
        assert_eq!(
            ApiVersion::discover(&not_served).await.ok(),
            Some(ApiVersion::V1alpha1)
        );

        // The v1beta1 probe failed: no answer, rather than v1alpha1.
        let failing = cluster(status(503, "ServiceUnavailable"));
        match ApiVersion::discover(&failing).await {
            Err(kube::Error::Api(status)) => assert_eq!(status.code, 503),
            other => panic!("{other:?}"),
        }
    }

    /// Discovery's answer for a group-version that serves CRRs.
    fn served(version: &str) -> (u16, Value) {
        let body = json!({
            "kind": "APIResourceList",
            "groupVersion": format!("{GROUP}/{version}"),
            "resources": [{
                "name": PLURAL, "singularName": "", "namespaced": true,
                "kind": KIND, "verbs": ["get", "list", "watch"],
            }],
        });
        (200, body)
    }
}
