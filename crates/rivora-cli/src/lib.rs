//! `rivora`: Rivora's lifecycle on a cluster, over the Helm chart this
//! binary embeds (one version: the binary's) and the `helm` executable,
//! with the user's kubeconfig and context. The flows (install, upgrade,
//! uninstall, crds) are in [`lifecycle`]; `status` in [`status`].

pub mod chart;
pub mod helm;
pub mod lifecycle;
pub mod status;

/// The names the chart gives its objects (helm/templates/_helpers.tpl).
pub mod names {
    pub const RIVORAD: &str = "rivorad";
    pub const CONTROLLER: &str = "rivora-controller";
    /// On a CRD `rivora install` created (it did not exist before): the
    /// release, `NAMESPACE/RELEASE`. `rivora uninstall` removes only
    /// these, and `rivora upgrade` updates them.
    pub const INSTALLED_BY: &str = "rivora.io/installed-by";
    /// On a namespace `rivora install` created: `rivora uninstall`
    /// deletes it.
    pub const CREATED_BY: &str = "rivora.io/created-by";
    pub const DEFAULT_NAMESPACE: &str = "rivora-system";
    pub const DEFAULT_RELEASE: &str = "rivora";
    pub const FIELD_MANAGER: &str = "rivora";
}
