//! The fake's HTTP face: each request authenticated, authorized, admitted
//! and routed to the store, as kube-apiserver's handler chain does.

use super::*;

impl FakeApiServer {
    pub(super) async fn serve(
        &self,
        req: Request<Incoming>,
    ) -> Response<BoxBody<Bytes, Infallible>> {
        let token = req
            .headers()
            .get(http::header::AUTHORIZATION)
            .and_then(|v| v.to_str().ok())
            .and_then(|v| v.strip_prefix("Bearer "))
            .map(str::to_owned);
        let caller = match token {
            None => None,
            Some(token) => match lock(&self.inner.users).get(&token) {
                Some(user) => Some(user.clone()),
                None => {
                    let error = ApiError::new(401, "Unauthorized", "Unauthorized");
                    return respond(401, &error.status());
                }
            },
        };
        match CALLER.scope(caller, self.route(req)).await {
            Ok(response) => response,
            Err(error) => {
                let mut response = respond(error.code, &error.status());
                if error.code == 429 {
                    response
                        .headers_mut()
                        .insert("retry-after", http::HeaderValue::from_static("1"));
                }
                response
            }
        }
    }

    pub(super) async fn route(
        &self,
        req: Request<Incoming>,
    ) -> Result<Response<BoxBody<Bytes, Infallible>>, ApiError> {
        let mut written = None;
        let answer = self.route_write_logged(req, &mut written).await;
        if let Some(entry) = written {
            let code = match &answer {
                Ok(response) => response.status().as_u16(),
                Err(error) => error.code,
            };
            if let Some(w) = lock(&self.inner.writes).get_mut(entry) {
                w.code = Some(code);
            }
        }
        answer
    }

    /// `route`, noting in `written` which entry of the write log the
    /// request made, if any.
    pub(super) async fn route_write_logged(
        &self,
        req: Request<Incoming>,
        written: &mut Option<usize>,
    ) -> Result<Response<BoxBody<Bytes, Infallible>>, ApiError> {
        let (parts, body) = req.into_parts();
        let path: Vec<&str> = parts.uri.path().trim_matches('/').split('/').collect();
        let query: BTreeMap<String, String> = parts
            .uri
            .query()
            .map(|q| {
                q.split('&')
                    .filter_map(|kv| kv.split_once('='))
                    .map(|(k, v)| (k.to_owned(), percent_decode(v)))
                    .collect()
            })
            .unwrap_or_default();
        let method = if is_watch(&query) {
            "WATCH".to_owned()
        } else {
            parts.method.to_string()
        };
        *lock(&self.inner.requests).entry(method).or_default() += 1;
        if let Some(agent) = parts.headers.get(hyper::header::USER_AGENT) {
            lock(&self.inner.user_agents)
                .insert(String::from_utf8_lossy(agent.as_bytes()).into_owned());
        }
        if path == ["version"] {
            let info = json!({"major": "1", "minor": "33", "gitVersion": "v1.33.0", "gitCommit": "fake",
                "gitTreeState": "clean", "buildDate": "2026-01-01T00:00:00Z", "goVersion": "go1.24",
                "compiler": "gc", "platform": "linux/amd64"});
            return Ok(respond(200, &info));
        }
        if parts.method == Method::POST
            && path
                == [
                    "apis",
                    "authorization.k8s.io",
                    "v1",
                    "selfsubjectaccessreviews",
                ]
        {
            let body = body
                .collect()
                .await
                .map(|b| b.to_bytes())
                .unwrap_or_default();
            let mut review: Value = serde_json::from_slice(&body)
                .map_err(|e| ApiError::new(400, "BadRequest", e.to_string()))?;
            let attributes = &review["spec"]["resourceAttributes"];
            let mut rule = format!(
                "{} {}",
                attributes["verb"].as_str().unwrap_or(""),
                attributes["resource"].as_str().unwrap_or("")
            );
            if let Some(sub) = attributes["subresource"].as_str().filter(|s| !s.is_empty()) {
                rule = format!("{rule}/{sub}");
            }
            // Answered by the same authorizers as the request would be.
            let group = attributes["group"].as_str().unwrap_or("");
            let group_version = if group.is_empty() {
                "v1".to_owned()
            } else {
                format!("{group}/v1")
            };
            let as_request = self
                .authorize(&Access {
                    verb: attributes["verb"].as_str().unwrap_or(""),
                    group_version: &group_version,
                    plural: attributes["resource"].as_str().unwrap_or(""),
                    subresource: attributes["subresource"].as_str().filter(|s| !s.is_empty()),
                    name: attributes["name"].as_str().filter(|s| !s.is_empty()),
                    namespace: attributes["namespace"].as_str().filter(|s| !s.is_empty()),
                    field_selector: attributes["fieldSelector"]["rawSelector"].as_str(),
                })
                .is_ok();
            let allowed = as_request && !lock(&self.inner.denied).contains(&rule);
            review["status"] = json!({"allowed": allowed});
            return Ok(respond(201, &review));
        }
        if parts.method == Method::POST
            && path == ["apis", "authentication.k8s.io", "v1", "selfsubjectreviews"]
        {
            let user = CALLER
                .try_with(Clone::clone)
                .ok()
                .flatten()
                .unwrap_or(UserInfo {
                    username: "kubernetes-admin".into(),
                    groups: vec!["system:masters".into(), "system:authenticated".into()],
                });
            let review = json!({"apiVersion": "authentication.k8s.io/v1", "kind": "SelfSubjectReview",
                                "metadata": {"creationTimestamp": null}, "status": {"userInfo": user}});
            return Ok(respond(201, &review));
        }
        if let ["api", "v1", "nodes", node, "proxy", rest @ ..] = path.as_slice() {
            return self.node_proxy(&parts.method, node, rest);
        }
        match path.as_slice() {
            ["api"] => return Ok(self.root_discovery(true)),
            ["apis"] => return Ok(self.root_discovery(false)),
            ["api", "v1"] => return self.discovery("v1"),
            ["apis", group, version] => return self.discovery(&format!("{group}/{version}")),
            _ => {}
        }
        let (group_version, rest) = match path.as_slice() {
            ["api", version, rest @ ..] => ((*version).to_owned(), rest),
            ["apis", group, version, rest @ ..] => (format!("{group}/{version}"), rest),
            _ => {
                return Err(ApiError::new(
                    404,
                    "NotFound",
                    "the server could not find the requested resource",
                ));
            }
        };
        let (namespace, rest) = match rest {
            ["namespaces", ns, rest @ ..] if !rest.is_empty() => (Some((*ns).to_owned()), rest),
            rest => (None, rest),
        };
        let (plural, name, subresource) = match rest {
            [plural] => (*plural, None, None),
            [plural, name] => (*plural, Some(*name), None),
            [plural, name, sub] => (*plural, Some(*name), Some(*sub)),
            _ => {
                return Err(ApiError::new(
                    404,
                    "NotFound",
                    "the server could not find the requested resource",
                ));
            }
        };
        let resource = Resource::from_path(&group_version, plural)
            .filter(|r| self.serves(*r))
            .ok_or_else(|| {
                ApiError::new(
                    404,
                    "NotFound",
                    "the server could not find the requested resource",
                )
            })?;
        // CRRs are seen through the version the request names.
        let view = if resource == Resource::Crr {
            let version = group_version.rsplit('/').next().unwrap_or_default();
            self.crr_versions().view(version).ok_or_else(|| {
                ApiError::new(
                    404,
                    "NotFound",
                    "the server could not find the requested resource",
                )
            })?
        } else {
            View::Stored
        };
        let view_version = match view {
            View::Alpha(_) => "apps.kruise.io/v1alpha1".to_owned(),
            View::Stored => self.stored_api_version(resource),
        };
        if resource == Resource::Crr && is_watch(&query) {
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
        let verb = match (&parts.method, name) {
            (&Method::GET, Some(_)) => "get",
            (&Method::GET, None)
                if matches!(query.get("watch").map(String::as_str), Some("true" | "1")) =>
            {
                "watch"
            }
            (&Method::GET, None) => "list",
            (&Method::POST, _) => "create",
            (&Method::PUT, _) => "update",
            (&Method::PATCH, _) => "patch",
            (&Method::DELETE, Some(_)) => "delete",
            _ => "deletecollection",
        };
        self.authorize(&Access {
            verb,
            group_version: &group_version,
            plural,
            subresource,
            name,
            namespace: namespace.as_deref(),
            field_selector: query.get("fieldSelector").map(String::as_str),
        })?;
        let body = body
            .collect()
            .await
            .map(|b| b.to_bytes())
            .unwrap_or_default();
        let parse = || {
            serde_json::from_slice::<Value>(&body)
                .map_err(|e| ApiError::new(400, "BadRequest", e.to_string()))
        };
        if matches!(
            parts.method,
            Method::PUT | Method::PATCH | Method::POST | Method::DELETE
        ) {
            let body = serde_json::from_slice::<Value>(&body).unwrap_or(Value::Null);
            let user = CALLER
                .try_with(|c| c.as_ref().map(|u| u.username.clone()))
                .ok()
                .flatten();
            *written = {
                let mut writes = lock(&self.inner.writes);
                writes.push(Written {
                    method: parts.method.clone(),
                    path: parts.uri.path().to_owned(),
                    body: body.clone(),
                    user: user.clone(),
                    at: tokio::time::Instant::now(),
                    code: None,
                });
                Some(writes.len() - 1)
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
        }
        if parts.method != Method::GET {
            let mut faults = lock(&self.inner.faults);
            if let Some(fault) = faults
                .iter_mut()
                .find(|f| f.resource == resource && f.left > 0)
            {
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
                return Err(ApiError::new(fault.code, reason, message));
            }
        }
        let ns = namespace.clone().unwrap_or_default();
        // A CRR shows the apiVersion asked for, whatever it is stored as.
        let versions = self.crr_versions();
        let present = |obj: &Value| {
            let mut shown = view.present(obj);
            if resource == Resource::Crr {
                versions.apply_defaults(&mut shown);
                shown["apiVersion"] = json!(view_version);
            }
            shown
        };
        let ok = |code: u16, obj: Value| Ok(respond(code, &present(&obj)));
        match (&parts.method, name) {
            (&Method::GET, None) => {
                let selector = Selector::parse(
                    resource,
                    query.get("labelSelector").map(String::as_str),
                    query.get("fieldSelector").map(String::as_str),
                )
                .map_err(|message| ApiError::new(400, "BadRequest", message))?;
                if is_watch(&query) {
                    let from = match query.get("resourceVersion").map(String::as_str) {
                        None | Some("") => None,
                        Some(rv) => Some(reads::resource_version(rv)?),
                    };
                    let timeout = query
                        .get("timeoutSeconds")
                        .and_then(|v| v.parse().ok())
                        .unwrap_or(290);
                    let bookmarks =
                        query.get("allowWatchBookmarks").map(String::as_str) == Some("true");
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
                            .ok_or_else(|| {
                                reads::expired("the continue token's resourceVersion")
                            })?;
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
                let items: Vec<Value> = items.iter().map(present).collect();
                let list = json!({"kind": format!("{}List", resource.kind()), "apiVersion": view_version,
                                  "metadata": metadata, "items": items});
                ok(200, list)
            }
            (&Method::GET, Some(name)) => self
                .get(resource, &ns, name)
                .ok_or_else(|| ApiError::not_found(resource, name))
                .and_then(|obj| ok(200, obj)),
            (&Method::POST, None) => {
                let mut body = parse()?;
                self.admit_crr(
                    resource,
                    view,
                    &mut body,
                    None,
                    validation,
                    pruning::Write::Object,
                )?;
                let obj = view.store(&body);
                let hooks = lock(&self.inner.admission).clone();
                let dry_run = query.get("dryRun").map(String::as_str) == Some("All");
                self.admit_namespace(&self.store(), resource, &ns)?;
                self.create_with(resource, &ns, obj, &hooks, dry_run)
                    .and_then(|obj| ok(201, obj))
            }
            (&Method::PUT, Some(name)) => {
                let body = parse()?;
                let raced = resource == Resource::Crr && status;
                if let Some((other, on_status)) = raced.then(|| self.take_race(&body)).flatten() {
                    self.patch(resource, &ns, name, &other, on_status)?;
                }
                self.update_as(
                    Through { view, validation },
                    resource,
                    &ns,
                    name,
                    body,
                    status,
                )
                .and_then(|obj| ok(200, obj))
            }
            (&Method::PATCH, Some(name)) => {
                let content_type = parts
                    .headers
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
                let body = parse()?;
                let raced = resource == Resource::Crr && status;
                if let Some((other, on_status)) = raced.then(|| self.take_race(&body)).flatten() {
                    self.patch(resource, &ns, name, &other, on_status)?;
                }
                let patch = if json_patch {
                    Patch::Json(body)
                } else {
                    Patch::Merge(body)
                };
                self.patch_as(
                    Through { view, validation },
                    resource,
                    &ns,
                    name,
                    &patch,
                    status,
                )
                .and_then(|obj| ok(200, obj))
            }
            (&Method::DELETE, Some(name)) => {
                let grace = serde_json::from_slice::<Value>(&body)
                    .ok()
                    .and_then(|options| options["gracePeriodSeconds"].as_i64())
                    .or_else(|| query.get("gracePeriodSeconds")?.parse().ok());
                self.delete_with_grace(resource, &ns, name, grace)
                    .and_then(|obj| ok(200, obj))
            }
            _ => Err(ApiError::new(405, "MethodNotAllowed", "method not allowed")),
        }
    }

    /// The state a list's `read` asks for: its resourceVersion and objects.
    pub(super) async fn read(
        &self,
        resource: Resource,
        namespace: Option<&str>,
        selector: &Selector,
        read: Read,
    ) -> Result<(u64, Vec<Value>), ApiError> {
        let lag = lock(&self.inner.watches)
            .lag
            .get(&resource)
            .copied()
            .unwrap_or_default();
        let waited = tokio::time::Instant::now() + reads::CACHE_WAIT;
        loop {
            let served = {
                let store = self.store();
                let cached = store.cached_rv(resource, lag);
                match read {
                    Read::Latest => Some(store.rv),
                    Read::Cached => Some(cached),
                    Read::NotOlderThan(n) if cached >= n => Some(cached),
                    Read::NotOlderThan(n) if tokio::time::Instant::now() >= waited => {
                        return Err(reads::too_large(n, cached));
                    }
                    Read::NotOlderThan(_) => None,
                    Read::Exact(n) if n > store.rv => return Err(reads::too_large(n, store.rv)),
                    Read::Exact(n) => Some(n),
                }
                .map(|rv| (rv, store.list_at(resource, namespace, selector, rv)))
            };
            match served {
                Some((rv, Some(items))) => return Ok((rv, items)),
                Some((rv, None)) => return Err(reads::expired(&format!("resourceVersion {rv}"))),
                None => tokio::time::sleep(Duration::from_millis(20)).await,
            }
        }
    }
}
