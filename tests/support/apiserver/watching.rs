//! Watches: a list's resourceVersion onwards, with the real server's 410,
//! bookmarks when asked, lag and expiry as a test sets them.

use super::*;

impl FakeApiServer {
    pub(super) fn watch(&self, request: WatchRequest) -> Response<BoxBody<Bytes, Infallible>> {
        let WatchRequest {
            resource,
            namespace,
            selector,
            from,
            timeout,
            bookmarks,
            view,
            view_version,
        } = request;
        let (tx, rx) = mpsc::channel::<Frame<Bytes>>(256);
        let watches = lock(&self.inner.watches).clone();
        let lag = watches.lag.get(&resource).copied().unwrap_or_default();
        let bookmark_every = watches
            .bookmarks
            .filter(|_| bookmarks)
            .unwrap_or(Duration::from_secs(3600));
        let shown_version = view_version.clone();
        let versions = self.crr_versions();
        let line = move |kind: &str, obj: &Value| {
            let obj = if kind == "ERROR" {
                obj.clone()
            } else {
                let mut shown = view.present(obj);
                if resource == Resource::Crr {
                    versions.apply_defaults(&mut shown);
                    shown["apiVersion"] = json!(shown_version);
                }
                shown
            };
            let mut text = json!({"type": kind, "object": obj}).to_string();
            text.push('\n');
            Frame::data(Bytes::from(text))
        };
        // Subscribe before reading the history, so that nothing falls between.
        let mut live = self.inner.changes.subscribe();
        let mut reset = self.inner.reset.subscribe();
        let (backlog, gone, from) = {
            let store = self.store();
            // The current objects first, as ADDED: the latest for a watch
            // without a resourceVersion, the watch cache's (lagging) state
            // for `0`; both are shown at once.
            let start = match from {
                Some(0) => Some(store.cached_rv(resource, lag)),
                Some(_) => None,
                None => Some(store.rv),
            };
            match (start, from) {
                (Some(start), _) => {
                    let current = store
                        .list_at(resource, namespace.as_deref(), &selector, start)
                        .unwrap_or_else(|| store.list(resource, namespace.as_deref(), &selector));
                    let now = tokio::time::Instant::now();
                    let shown = now.checked_sub(lag).unwrap_or(now);
                    let added = current.into_iter().map(|obj| Change {
                        rv: start,
                        resource,
                        kind: ChangeKind::Added,
                        old: None,
                        new: obj,
                        at: shown,
                    });
                    let later = store.history.iter().filter(|c| c.rv > start).cloned();
                    (added.chain(later).collect::<Vec<_>>(), false, start)
                }
                (None, Some(from)) if from + 1 < store.oldest => (Vec::new(), true, from),
                (None, from) => {
                    let from = from.unwrap_or_default();
                    let later = store.history.iter().filter(|c| c.rv > from).cloned();
                    (later.collect(), false, from)
                }
            }
        };
        let filter = move |change: &Change| -> Option<(&'static str, Value)> {
            if change.resource != resource {
                return None;
            }
            let in_scope = |obj: &Value| {
                namespace.as_deref().is_none_or(|ns| {
                    obj.pointer("/metadata/namespace").and_then(Value::as_str) == Some(ns)
                }) && selector.matches(obj)
            };
            let was = change.old.as_ref().is_some_and(&in_scope);
            let is = in_scope(&change.new);
            match (change.kind, was, is) {
                (ChangeKind::Deleted, true, _) => Some(("DELETED", change.new.clone())),
                (ChangeKind::Deleted, false, _) => None,
                (_, false, true) => Some(("ADDED", change.new.clone())),
                (_, true, true) => Some(("MODIFIED", change.new.clone())),
                // No longer matches: the watcher sees it go.
                (_, true, false) => Some(("DELETED", change.new.clone())),
                (_, false, false) => None,
            }
        };
        let expired = move |rv: u64| {
            ApiError::new(410, "Expired", format!("too old resource version: {rv}")).status()
        };
        let expired_count = Arc::clone(&self.inner.expired);
        let delivered_count = Arc::clone(&self.inner.delivered);
        let bookmark = move |rv: u64| {
            json!({"kind": resource.kind(), "apiVersion": view_version.clone(),
                   "metadata": {"resourceVersion": rv.to_string()}})
        };
        tokio::spawn(async move {
            if gone {
                let _ = tx.send(line("ERROR", &expired(from))).await;
                return;
            }
            let mut sent = from;
            let mut delivered = 0;
            // Sends one change (late when lagging); false once the watch is over.
            let deliver = async |change: &Change, sent: &mut u64, delivered: &mut usize| {
                tokio::time::sleep_until(change.at + lag).await;
                *sent = (*sent).max(change.rv);
                let Some((kind, obj)) = filter(change) else {
                    return true;
                };
                if tx.send(line(kind, &obj)).await.is_err() {
                    return false;
                }
                *lock(&delivered_count).entry(resource).or_default() += 1;
                *delivered += 1;
                if watches.gone_after.is_some_and(|n| *delivered >= n) {
                    expired_count.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
                    let _ = tx.send(line("ERROR", &expired(*sent))).await;
                    return false;
                }
                true
            };
            for change in backlog {
                if !deliver(&change, &mut sent, &mut delivered).await {
                    return;
                }
            }
            let deadline = tokio::time::sleep(timeout);
            tokio::pin!(deadline);
            let mut marks = tokio::time::interval(bookmark_every);
            marks.tick().await;
            loop {
                tokio::select! {
                    change = live.recv() => match change {
                        Ok(change) if change.rv > sent => {
                            if !deliver(&change, &mut sent, &mut delivered).await {
                                return;
                            }
                        }
                        Ok(_) => {}
                        // Lagged or closed: end the stream; the client resumes.
                        Err(_) => return,
                    },
                    _ = marks.tick() => {
                        if tx.send(line("BOOKMARK", &bookmark(sent))).await.is_err() {
                            return;
                        }
                    }
                    _ = reset.changed() => return,
                    () = &mut deadline => return,
                }
            }
        });
        Response::builder()
            .status(200)
            .header("content-type", "application/json")
            .body(BodyExt::boxed(super::super::upstream::Reply::from(rx)))
            .unwrap_or_default()
    }
}
