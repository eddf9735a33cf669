//! Discovery: the API groups and versions the fake serves, as
//! `/api`, `/apis` and each group's resource list.

use super::*;

impl FakeApiServer {
    /// The group-versions that serve `resource` now.
    pub(super) fn served_versions(&self, resource: Resource) -> Vec<String> {
        match resource {
            Resource::Crr => self
                .crr_versions()
                .served()
                .iter()
                .map(|v| format!("apps.kruise.io/{v}"))
                .collect(),
            _ if self.serves(resource) => vec![resource.api_version().to_owned()],
            _ => Vec::new(),
        }
    }

    /// `GET /api` and `GET /apis`: the versions and groups served, as
    /// kubectl's discovery reads them.
    pub(super) fn root_discovery(&self, core: bool) -> Response<BoxBody<Bytes, Infallible>> {
        if core {
            return respond(
                200,
                &json!({"kind": "APIVersions", "versions": ["v1"], "serverAddressByClientCIDRs": []}),
            );
        }
        let mut groups: BTreeMap<String, Vec<String>> = BTreeMap::new();
        for resource in Resource::ALL {
            for group_version in self.served_versions(resource) {
                if let Some((group, version)) = group_version.split_once('/') {
                    let versions = groups.entry(group.to_owned()).or_default();
                    if !versions.iter().any(|v| v == version) {
                        versions.push(version.to_owned());
                    }
                }
            }
        }
        let groups: Vec<Value> = groups
            .into_iter()
            .map(|(name, versions)| {
                let versions: Vec<Value> = versions
                    .iter()
                    .map(|v| json!({"groupVersion": format!("{name}/{v}"), "version": v}))
                    .collect();
                json!({"name": name, "preferredVersion": versions[0], "versions": versions})
            })
            .collect();
        respond(
            200,
            &json!({"kind": "APIGroupList", "apiVersion": "v1", "groups": groups}),
        )
    }

    /// `GET /api/v1` or `GET /apis/<group>/<version>`: the resources served
    /// there.
    pub(super) fn discovery(
        &self,
        group_version: &str,
    ) -> Result<Response<BoxBody<Bytes, Infallible>>, ApiError> {
        let mut resources = Vec::new();
        for resource in Resource::ALL {
            if !self
                .served_versions(resource)
                .iter()
                .any(|gv| gv == group_version)
            {
                continue;
            }
            let (_, plural) = resource.group_resource();
            let namespaced = resource.namespaced();
            resources.push(json!({"name": plural, "singularName": resource.kind().to_lowercase(),
                "namespaced": namespaced, "kind": resource.kind(), "shortNames": resource.short_names(),
                "verbs": ["create", "delete", "get", "list", "patch", "update", "watch"]}));
            if resource.has_status() {
                resources.push(json!({"name": format!("{plural}/status"), "singularName": "",
                    "namespaced": namespaced, "kind": resource.kind(), "verbs": ["get", "patch", "update"]}));
            }
        }
        if resources.is_empty() && !group_version.starts_with("apps.kruise.io/") {
            return Err(ApiError::new(
                404,
                "NotFound",
                "the server could not find the requested resource",
            ));
        }
        let list = json!({"kind": "APIResourceList", "apiVersion": "v1", "groupVersion": group_version,
                          "resources": resources});
        Ok(respond(200, &list))
    }
}
