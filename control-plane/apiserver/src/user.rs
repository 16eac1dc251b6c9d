//! Who is making a request: the authenticated user as upstream's `user.Info`, carried in the
//! request's extensions from authentication to authorization, admission and audit.

use std::collections::BTreeMap;

/// The authenticated user of a request (upstream `k8s.io/apiserver/pkg/authentication/user.Info`).
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct UserInfo {
    pub name: String,
    pub uid: String,
    pub groups: Vec<String>,
    pub extra: BTreeMap<String, Vec<String>>,
}

use skiff_core::names;

impl UserInfo {
    pub fn new(name: impl Into<String>, groups: &[&str]) -> Self {
        UserInfo {
            name: name.into(),
            groups: groups.iter().map(|g| g.to_string()).collect(),
            ..Default::default()
        }
    }

    pub fn anonymous() -> Self {
        UserInfo::new(names::ANONYMOUS, &[names::UNAUTHENTICATED])
    }

    pub fn in_group(&self, group: &str) -> bool {
        self.groups.iter().any(|g| g == group)
    }

    /// The node name when this is a node's identity (`system:node:<name>` in `system:nodes`).
    pub fn node_name(&self) -> Option<&str> {
        self.name.strip_prefix(names::NODE_PREFIX).filter(|_| self.in_group(names::NODES))
    }
}
