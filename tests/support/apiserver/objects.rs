//! The fake's object requests: what a path addresses, and each verb's
//! answer from the store, as the version the request names shows it.

use super::*;

/// What an object request addresses, read from its path and query.
pub(super) struct Target<'a> {
    group_version: String,
    plural: &'a str,
    pub(super) name: Option<&'a str>,
    subresource: Option<&'a str>,
    namespace: Option<String>,
    pub(super) resource: Resource,
    /// CRRs are seen through the version the request names.
    view: View,
    view_version: String,
    validation: FieldValidation,
    /// The status subresource.
    status: bool,
    versions: CrrVersions,
}

impl Target<'_> {
    pub(super) fn ns(&self) -> String {
        self.namespace.clone().unwrap_or_default()
    }

    /// The request as the authorizers see it.
    pub(super) fn access<'q>(
        &'q self,
        method: &Method,
        query: &'q BTreeMap<String, String>,
    ) -> Access<'q> {
        let verb = match (method, self.name) {
            (&Method::GET, Some(_)) => "get",
            (&Method::GET, None) if is_watch(query) => "watch",
            (&Method::GET, None) => "list",
            (&Method::POST, _) => "create",
            (&Method::PUT, _) => "update",
            (&Method::PATCH, _) => "patch",
            (&Method::DELETE, Some(_)) => "delete",
            _ => "deletecollection",
        };
        Access {
            verb,
            group_version: &self.group_version,
            plural: self.plural,
            subresource: self.subresource,
            name: self.name,
            namespace: self.namespace.as_deref(),
            field_selector: query.get("fieldSelector").map(String::as_str),
        }
    }

    /// A stored object as the request's version shows it: a CRR in the
    /// apiVersion asked for, whatever it is stored as.
    fn present(&self, obj: &Value) -> Value {
        let mut shown = self.view.present(obj);
        if self.resource == Resource::Crr {
            self.versions.apply_defaults(&mut shown);
            shown["apiVersion"] = json!(self.view_version);
        }
        shown
    }

    pub(super) fn ok(
        &self,
        code: u16,
        obj: Value,
    ) -> Result<Response<BoxBody<Bytes, Infallible>>, ApiError> {
        Ok(respond(code, &self.present(&obj)))
    }

    fn through(&self) -> Through {
        Through {
            view: self.view,
            validation: self.validation,
        }
    }
}

fn not_found() -> ApiError {
    ApiError::new(
        404,
        "NotFound",
        "the server could not find the requested resource",
    )
}

fn parse(body: &Bytes) -> Result<Value, ApiError> {
    serde_json::from_slice::<Value>(body)
        .map_err(|e| ApiError::new(400, "BadRequest", e.to_string()))
}

impl FakeApiServer {
    /// What `path` addresses, if this server serves it; a CRR watch is
    /// noted (`crr_watches`).
    pub(super) fn target<'a>(
        &self,
        path: &'a [&'a str],
        query: &BTreeMap<String, String>,
    ) -> Result<Target<'a>, ApiError> {
        let (group_version, rest) = match path {
            ["api", version, rest @ ..] => ((*version).to_owned(), rest),
            ["apis", group, version, rest @ ..] => (format!("{group}/{version}"), rest),
            _ => return Err(not_found()),
        };
        let (namespace, rest) = match rest {
            ["namespaces", ns, rest @ ..] if !rest.is_empty() => (Some((*ns).to_owned()), rest),
            rest => (None, rest),
        };
        let (plural, name, subresource) = match rest {
            [plural] => (*plural, None, None),
            [plural, name] => (*plural, Some(*name), None),
            [plural, name, sub] => (*plural, Some(*name), Some(*sub)),
            _ => return Err(not_found()),
        };
        let resource = Resource::from_path(&group_version, plural)
            .filter(|r| self.serves(*r))
            .ok_or_else(not_found)?;
        let versions = self.crr_versions();
        let view = if resource == Resource::Crr {
            let version = group_version.rsplit('/').next().unwrap_or_default();
            versions.view(version).ok_or_else(not_found)?
        } else {
            View::Stored
        };
        let view_version = match view {
            View::Alpha(_) => "apps.kruise.io/v1alpha1".to_owned(),
            View::Stored => self.stored_api_version(resource),
        };
        if resource == Resource::Crr && is_watch(query) {
            let selector = query.get("labelSelector").cloned().unwrap_or_default();
            lock(&self.inner.crr_watches).push((view_version.clone(), selector));
        }
        let validation =
            FieldValidation::from_query(query.get("fieldValidation").map(String::as_str));
        let status = match subresource {
            None => false,
            Some("status") if resource.has_status() => true,
            Some(_) => return Err(ApiError::new(404, "NotFound", "no such subresource")),
        };
        Ok(Target {
            group_version,
            plural,
            name,
            subresource,
            namespace,
            resource,
            view,
            view_version,
            validation,
            status,
            versions,
        })
    }

    /// Notes a write in the log (its entry's index); a write a test stalls,
    /// or one from a user cut off by a partition, never returns.
    pub(super) async fn log_write(&self, parts: &http::request::Parts, body: &Bytes) -> usize {
        let body = serde_json::from_slice::<Value>(body).unwrap_or(Value::Null);
        let user = CALLER
            .try_with(|c| c.as_ref().map(|u| u.username.clone()))
            .ok()
            .flatten();
        let entry = {
            let mut writes = lock(&self.inner.writes);
            writes.push(Written {
                method: parts.method.clone(),
                path: parts.uri.path().to_owned(),
                body: body.clone(),
                user: user.clone(),
                at: tokio::time::Instant::now(),
                code: None,
            });
            writes.len() - 1
        };
        let stalled = lock(&self.inner.stall)
            .as_ref()
            .filter(|s| (s.matches)(&parts.method, parts.uri.path(), &body))
            .map(|s| Arc::clone(&s.hit));
        if let Some(hit) = stalled {
            hit.notify_one();
            std::future::pending::<()>().await;
        }
        let cut = user
            .as_ref()
            .is_some_and(|u| lock(&self.inner.partitioned).contains(u));
        if cut {
            std::future::pending::<()>().await;
        }
        entry
    }

    /// The next failure a test set for writes of `resource`, if any is left.
    pub(super) fn injected_fault(&self, resource: Resource) -> Result<(), ApiError> {
        let mut faults = lock(&self.inner.faults);
        let Some(fault) = faults
            .iter_mut()
            .find(|f| f.resource == resource && f.left > 0)
        else {
            return Ok(());
        };
        fault.left -= 1;
        let (reason, message) = match fault.code {
            429 => (
                "TooManyRequests",
                "the server has received too many requests",
            ),
            _ => (
                "InternalError",
                "an error on the server has prevented the request",
            ),
        };
        Err(ApiError::new(fault.code, reason, message))
    }

    /// A list, a page of one, or a watch.
    pub(super) async fn list_or_watch(
        &self,
        target: &Target<'_>,
        query: &BTreeMap<String, String>,
    ) -> Result<Response<BoxBody<Bytes, Infallible>>, ApiError> {
        let (resource, namespace, view) = (target.resource, target.namespace.clone(), target.view);
        let view_version = target.view_version.clone();
        let selector = Selector::parse(
            resource,
            query.get("labelSelector").map(String::as_str),
            query.get("fieldSelector").map(String::as_str),
        )
        .map_err(|message| ApiError::new(400, "BadRequest", message))?;
        if is_watch(query) {
            let from = match query.get("resourceVersion").map(String::as_str) {
                None | Some("") => None,
                Some(rv) => Some(reads::resource_version(rv)?),
            };
            let timeout = query
                .get("timeoutSeconds")
                .and_then(|v| v.parse().ok())
                .unwrap_or(290);
            let bookmarks = query.get("allowWatchBookmarks").map(String::as_str) == Some("true");
            return Ok(self.watch(WatchRequest {
                resource,
                namespace,
                selector,
                from,
                timeout: Duration::from_secs(timeout),
                bookmarks,
                view,
                view_version,
            }));
        }
        let pages = *lock(&self.inner.pages);
        // `continue` is "<resourceVersion>/<offset>": later pages
        // are read at the first page's version, as etcd reads them.
        let from = query.get("continue").and_then(|token| {
            let (rv, offset) = token.split_once('/')?;
            Some((rv.parse::<u64>().ok()?, offset.parse::<usize>().ok()?))
        });
        let read = Read::parse(
            query.get("resourceVersion").map(String::as_str),
            query.get("resourceVersionMatch").map(String::as_str),
            query.contains_key("continue"),
        )?;
        if let (Some((_, delay)), Some(_)) = (pages, from) {
            tokio::time::sleep(delay).await;
        }
        let (rv, offset, mut items) = match from {
            Some((rv, offset)) => {
                let items = self
                    .store()
                    .list_at(resource, namespace.as_deref(), &selector, rv)
                    .ok_or_else(|| reads::expired("the continue token's resourceVersion"))?;
                (rv, offset, items)
            }
            None => {
                let (rv, items) = self
                    .read(resource, namespace.as_deref(), &selector, read)
                    .await?;
                (rv, 0, items)
            }
        };
        let limit = query.get("limit").and_then(|l| l.parse::<usize>().ok());
        let size = [limit, pages.map(|(size, _)| size)]
            .into_iter()
            .flatten()
            .min()
            .unwrap_or(usize::MAX)
            .max(1);
        let mut metadata = json!({"resourceVersion": rv.to_string()});
        let rest = items.split_off(offset.min(items.len()));
        items = rest;
        if items.len() > size {
            items.truncate(size);
            metadata["continue"] = json!(format!("{rv}/{}", offset + size));
        }
        let items: Vec<Value> = items.iter().map(|o| target.present(o)).collect();
        let list = json!({"kind": format!("{}List", resource.kind()), "apiVersion": view_version,
                                  "metadata": metadata, "items": items});
        target.ok(200, list)
    }

    pub(super) fn create_request(
        &self,
        target: &Target<'_>,
        query: &BTreeMap<String, String>,
        body: &Bytes,
    ) -> Result<Response<BoxBody<Bytes, Infallible>>, ApiError> {
        let ns = target.ns();
        let mut body = parse(body)?;
        self.admit_crr(
            target.resource,
            target.view,
            &mut body,
            None,
            target.validation,
            pruning::Write::Object,
        )?;
        let obj = target.view.store(&body);
        let hooks = lock(&self.inner.admission).clone();
        let dry_run = query.get("dryRun").map(String::as_str) == Some("All");
        self.admit_namespace(&self.store(), target.resource, &ns)?;
        self.create_with(target.resource, &ns, obj, &hooks, dry_run)
            .and_then(|obj| target.ok(201, obj))
    }

    /// A write a test set to race a CRR status write (`take_race`) lands
    /// first, as another writer's would.
    fn race_ahead(&self, target: &Target<'_>, name: &str, body: &Value) -> Result<(), ApiError> {
        let raced = target.resource == Resource::Crr && target.status;
        if let Some((other, on_status)) = raced.then(|| self.take_race(body)).flatten() {
            self.patch(target.resource, &target.ns(), name, &other, on_status)?;
        }
        Ok(())
    }

    pub(super) fn update_request(
        &self,
        target: &Target<'_>,
        name: &str,
        body: &Bytes,
    ) -> Result<Response<BoxBody<Bytes, Infallible>>, ApiError> {
        let ns = target.ns();
        let body = parse(body)?;
        self.race_ahead(target, name, &body)?;
        self.update_as(
            target.through(),
            target.resource,
            &ns,
            name,
            body,
            target.status,
        )
        .and_then(|obj| target.ok(200, obj))
    }

    pub(super) fn patch_request(
        &self,
        target: &Target<'_>,
        name: &str,
        headers: &http::HeaderMap,
        body: &Bytes,
    ) -> Result<Response<BoxBody<Bytes, Infallible>>, ApiError> {
        let (resource, status, ns) = (target.resource, target.status, target.ns());
        let content_type = headers
            .get("content-type")
            .and_then(|v| v.to_str().ok())
            .unwrap_or("");
        // Custom resources take no strategic merge patch: it needs
        // the Go types' patch strategies (staging/src/k8s.io/
        // apiextensions-apiserver/pkg/apiserver/customresource_handler.go,
        // whose supported patch types leave it out).
        let merge = content_type.starts_with("application/merge-patch+json");
        let strategic = content_type.starts_with("application/strategic-merge-patch+json");
        let json_patch = content_type.starts_with("application/json-patch+json");
        let accepted = merge || json_patch || (strategic && !resource.is_custom());
        if !accepted {
            return Err(ApiError::new(
                415,
                "UnsupportedMediaType",
                format!("patch type {content_type}"),
            ));
        }
        let body = parse(body)?;
        self.race_ahead(target, name, &body)?;
        let patch = if json_patch {
            Patch::Json(body)
        } else {
            Patch::Merge(body)
        };
        self.patch_as(target.through(), resource, &ns, name, &patch, status)
            .and_then(|obj| target.ok(200, obj))
    }
}
