//! Well-known names: users and groups, finalizers, annotations and labels that more than one
//! component writes or reads (upstream's names).

// Users and groups (upstream's `k8s.io/apiserver/pkg/authentication/user`).
pub const ANONYMOUS: &str = "system:anonymous";
pub const UNAUTHENTICATED: &str = "system:unauthenticated";
pub const AUTHENTICATED: &str = "system:authenticated";
pub const MASTERS: &str = "system:masters";
pub const NODES: &str = "system:nodes";
pub const NODE_PREFIX: &str = "system:node:";
pub const SERVICE_ACCOUNT_PREFIX: &str = "system:serviceaccount:";
pub const SERVICE_ACCOUNTS: &str = "system:serviceaccounts";
pub const BOOTSTRAPPERS: &str = "system:bootstrappers";
/// The identity of in-process components calling through `ApiServer::client()`.
pub const APISERVER: &str = "system:apiserver";

/// The finalizer that keeps a PersistentVolumeClaim in use from going.
pub const PVC_PROTECTION: &str = "kubernetes.io/pvc-protection";
/// The finalizer that keeps a bound PersistentVolume from going.
pub const PV_PROTECTION: &str = "kubernetes.io/pv-protection";
