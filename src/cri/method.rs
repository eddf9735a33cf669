//! CRI method paths as gRPC sends them in `:path`:
//! `/runtime.<version>.<Service>/<Method>`. Read once per call, by whoever
//! needs to know which call it is (routing, metrics, the status editor).

/// The method of a CRI call.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Method<'a> {
    /// The API version, `v1` today (`v1alpha2` before Kubernetes 1.26).
    pub version: &'a str,
    /// `RuntimeService` or `ImageService`.
    pub service: &'a str,
    pub name: &'a str,
}

impl<'a> Method<'a> {
    /// The CRI method `path` names; `None` for any other gRPC path.
    pub fn parse(path: &'a str) -> Option<Self> {
        let rest = path.strip_prefix("/runtime.")?;
        let (qualified, name) = rest.split_once('/')?;
        let (version, service) = qualified.split_once('.')?;
        if version.is_empty() || service.is_empty() || name.is_empty() || name.contains('/') {
            return None;
        }
        Some(Self {
            version,
            service,
            name,
        })
    }

    pub fn is_image_service(&self) -> bool {
        self.service == "ImageService"
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn cri_paths_parse_and_others_do_not() {
        let m = Method::parse("/runtime.v1.RuntimeService/ContainerStatus").unwrap();
        assert_eq!(
            (m.version, m.service, m.name),
            ("v1", "RuntimeService", "ContainerStatus")
        );
        assert!(!m.is_image_service());
        let old = Method::parse("/runtime.v1alpha2.ImageService/ListImages").unwrap();
        assert_eq!(old.version, "v1alpha2");
        assert!(old.is_image_service());
        for other in [
            "/other.v1.ImageService/PullImage",
            "/runtime.v1.ImageService",
            "/runtime.ImageService/PullImage",
            "/runtime.v1.RuntimeService/",
            "/runtime.v1.RuntimeService/A/B",
            "",
        ] {
            assert_eq!(Method::parse(other), None, "{other}");
        }
    }
}
