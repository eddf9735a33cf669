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
    /// request made, if any: the cluster's own endpoints, or an object
    /// request, authorized, logged (with the faults a test set) and then
    /// served by its verb (`objects`).
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
        let body = body
            .collect()
            .await
            .map(|b| b.to_bytes())
            .unwrap_or_default();
        if let Some(answer) = self.cluster_endpoint(&parts.method, &path, &body) {
            return answer;
        }
        let target = self.target(&path, &query)?;
        self.authorize(&target.access(&parts.method, &query))?;
        if matches!(
            parts.method,
            Method::PUT | Method::PATCH | Method::POST | Method::DELETE
        ) {
            *written = Some(self.log_write(&parts, &body).await);
        }
        if parts.method != Method::GET {
            self.injected_fault(target.resource)?;
        }
        match (&parts.method, target.name) {
            (&Method::GET, None) => self.list_or_watch(&target, &query).await,
            (&Method::GET, Some(name)) => self
                .get(target.resource, &target.ns(), name)
                .ok_or_else(|| ApiError::not_found(target.resource, name))
                .and_then(|obj| target.ok(200, obj)),
            (&Method::POST, None) => self.create_request(&target, &query, &body),
            (&Method::PUT, Some(name)) => self.update_request(&target, name, &body),
            (&Method::PATCH, Some(name)) => {
                self.patch_request(&target, name, &parts.headers, &body)
            }
            (&Method::DELETE, Some(name)) => {
                let grace = serde_json::from_slice::<Value>(&body)
                    .ok()
                    .and_then(|options| options["gracePeriodSeconds"].as_i64())
                    .or_else(|| query.get("gracePeriodSeconds")?.parse().ok());
                self.delete_with_grace(target.resource, &target.ns(), name, grace)
                    .and_then(|obj| target.ok(200, obj))
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
