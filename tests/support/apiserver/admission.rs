//! Admission, in kube-apiserver's order: NamespaceLifecycle, the CRD's schema
//! (with ratcheting), the webhooks' place (admission hooks), and
//! ValidatingAdmissionPolicies evaluated with a real CEL interpreter.

use super::*;

impl FakeApiServer {
    /// Turns CRD validation ratcheting on or off.
    pub fn set_ratcheting(&self, on: bool) {
        self.inner
            .ratcheting
            .store(on, std::sync::atomic::Ordering::SeqCst);
    }

    /// What a CRR write in `view` is judged by: v1beta1's schema, or with
    /// crr-proxy's own CRD (no conversion webhook) a v1alpha1 write by the
    /// same spec checks; kruise's v1alpha1 schemas have none of them.
    pub(super) fn crr_checks(
        &self,
        resource: Resource,
        view: View,
    ) -> Option<super::super::versions::Checks> {
        use super::super::versions::Checks;
        if resource != Resource::Crr {
            return None;
        }
        match (view, self.crr_versions()) {
            (_, CrrVersions::V1alpha1Only) => None,
            (View::Stored, CrrVersions::Both(_)) => Some(Checks::V1beta1),
            (View::Alpha(Conversion::None), _) => Some(Checks::Spec),
            (View::Alpha(Conversion::Webhook), _) => None,
        }
    }

    /// The CRD's part in a CRR write: the fields its schema lacks pruned
    /// (or, under Strict, the write refused), then its checks.
    pub(super) fn admit_crr(
        &self,
        resource: Resource,
        view: View,
        next: &mut Value,
        old: Option<&Value>,
        validation: FieldValidation,
        write: pruning::Write,
    ) -> Result<(), ApiError> {
        if resource != Resource::Crr {
            return Ok(());
        }
        let version = match view {
            View::Stored => self.crr_versions().storage(),
            View::Alpha(_) => "v1alpha1",
        };
        let crd = match self.crr_versions() {
            CrrVersions::V1alpha1Only => pruning::Crd::KruiseV1_9,
            CrrVersions::Both(_) => pruning::Crd::Ours,
        };
        pruning::prune_crr(next, crd, version, validation, write)?;
        let Some(checks) = self.crr_checks(resource, view) else {
            return Ok(());
        };
        let ratcheting = self
            .inner
            .ratcheting
            .load(std::sync::atomic::Ordering::SeqCst);
        super::super::versions::validate(next, checks, old.filter(|_| ratcheting))
    }

    /// A Namespace, as `kubectl apply -k deploy/standalone` makes
    /// crr-proxy-system.
    pub fn add_namespace(&self, name: &str) {
        lock(&self.inner.namespaces).insert(name.to_owned());
    }

    /// NamespaceLifecycle: nothing is created in a namespace that does not
    /// exist (kube-apiserver's plugin/pkg/admission/namespace/lifecycle/
    /// admission.go, `Lifecycle.Admit`, answers NotFound for the
    /// namespace). The namespaces kube-apiserver makes at start
    /// (pkg/controlplane/controller/systemnamespaces) exist, as do those
    /// added and those of the objects a test seeded.
    pub(super) fn admit_namespace(
        &self,
        store: &Store,
        resource: Resource,
        namespace: &str,
    ) -> Result<(), ApiError> {
        const SYSTEM: [&str; 4] = ["default", "kube-system", "kube-public", "kube-node-lease"];
        let exists = !resource.namespaced()
            || SYSTEM.contains(&namespace)
            || lock(&self.inner.namespaces).contains(namespace)
            || store.objects.keys().any(|(_, ns, _)| ns == namespace);
        if exists {
            Ok(())
        } else {
            Err(ApiError::new(
                404,
                "NotFound",
                format!("namespaces {namespace:?} not found"),
            ))
        }
    }

    /// Installs the ValidatingAdmissionPolicies (with their bindings) of a
    /// manifest, and the Namespaces and Leases it ships, as `kubectl apply`
    /// would. The policies judge HTTP requests of authenticated users.
    pub fn add_policies(&self, manifest: &str) {
        let loaded = policy::load(manifest);
        assert!(!loaded.is_empty(), "no bound policy in the manifest");
        lock(&self.inner.policies).extend(loaded.into_iter().map(Arc::new));
        let documents: Vec<Value> =
            serde_saphyr::from_multiple(manifest).expect("the manifest is YAML");
        for document in documents {
            let name = document["metadata"]["name"].as_str().unwrap_or_default();
            let namespace = document["metadata"]["namespace"]
                .as_str()
                .unwrap_or_default();
            if document["kind"] == "Namespace" {
                self.add_namespace(name);
            } else if document["kind"] == "Lease" {
                self.create_unchecked(Resource::Lease, namespace, document.clone())
                    .expect("the manifest's Lease");
            }
        }
    }

    /// The policies' verdict on a write by the current HTTP caller.
    #[allow(clippy::too_many_arguments)]
    pub(super) fn admit_policies(
        &self,
        store: &Store,
        operation: &'static str,
        (resource, namespace, name): &Key,
        status: bool,
        object: Option<&Value>,
        old_object: Option<&Value>,
    ) -> Result<(), ApiError> {
        let Ok(Some(user)) = CALLER.try_with(Clone::clone) else {
            return Ok(());
        };
        let (group, plural) = resource.group_resource();
        let attrs = Attributes {
            operation,
            group,
            resource: plural,
            subresource: if status { "status" } else { "" },
            namespace,
            name,
            object,
            old_object,
            user: &user,
            params: &|kind, namespace, name| {
                let resource = [Resource::Lease, Resource::Pod, Resource::Node]
                    .into_iter()
                    .find(|r| r.kind() == kind)?;
                store.get(resource, namespace, name).cloned()
            },
        };
        let policies = lock(&self.inner.policies).clone();
        policies.iter().try_for_each(|p| p.admit(&attrs))
    }

    pub fn add_admission(&self, hook: Admission) {
        lock(&self.inner.admission).push(hook);
    }

    /// Removes every admission hook (the webhook's server went away).
    pub fn clear_admission(&self) {
        lock(&self.inner.admission).clear();
    }
}
