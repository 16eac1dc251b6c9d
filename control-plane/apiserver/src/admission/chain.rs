//! The admission chain: the built-in plugins in upstream's order, run phase by phase.

use std::sync::Arc;

use super::certificates::{CsrAuthority, CsrRequester};
use super::escalation::RbacEscalation;
use super::limitranger::LimitRanger;
use super::namespace::NamespaceLifecycle;
use super::noderestriction::NodeRestriction;
use super::priority::Priority;
use super::serviceaccount::ServiceAccount;
use super::storage_protection::StorageObjectInUseProtection;
use super::webhook::{MutatingWebhooks, ValidatingWebhooks};
use super::{AdmissionRequest, MutatingPlugin, Operation, Resource, ValidatingPlugin};
use crate::authz::Authorizer;
use crate::state::State;
use crate::status::ApiResult;
use crate::user::UserInfo;

/// The ordered plugins.
pub struct Chain {
    mutating: Vec<Box<dyn MutatingPlugin>>,
    validating: Vec<Box<dyn ValidatingPlugin>>,
}

impl Chain {
    /// The default chain, in upstream's plugin order.
    /// RBAC escalation checks ask `authz`, the apiserver's authorizers.
    pub fn builtin(authz: Arc<Authorizer>) -> Chain {
        Chain {
            mutating: vec![
                Box::new(NamespaceLifecycle::default()),
                Box::new(LimitRanger),
                Box::new(ServiceAccount),
                Box::new(StorageObjectInUseProtection),
                Box::new(Priority::default()),
                Box::new(MutatingWebhooks),
                // Upstream's strategy, after every mutation: the requester is who asked.
                Box::new(CsrRequester),
            ],
            validating: vec![
                Box::new(NodeRestriction),
                Box::new(RbacEscalation { authz: authz.clone() }),
                Box::new(CsrAuthority { authz }),
                Box::new(LimitRanger),
                Box::new(Priority::default()),
                Box::new(ValidatingWebhooks),
            ],
        }
    }

    pub fn new(
        mutating: Vec<Box<dyn MutatingPlugin>>,
        validating: Vec<Box<dyn ValidatingPlugin>>,
    ) -> Chain {
        Chain { mutating, validating }
    }

    /// The names of the plugins, mutating then validating.
    pub fn plugin_names(&self) -> Vec<&'static str> {
        self.mutating
            .iter()
            .map(|p| p.name())
            .chain(self.validating.iter().map(|p| p.name()))
            .collect()
    }

    /// Whether any mutating plugin would look at this request.
    pub fn mutates(&self, state: &State, op: Operation, r: Resource<'_>, user: &UserInfo) -> bool {
        self.mutating.iter().any(|p| p.handles(op, r) && p.active(state, user))
    }

    /// Whether any validating plugin would look at this request.
    pub fn validates(
        &self,
        state: &State,
        op: Operation,
        r: Resource<'_>,
        user: &UserInfo,
    ) -> bool {
        self.validating.iter().any(|p| p.handles(op, r) && p.active(state, user))
    }

    /// The mutating phase.
    pub async fn admit(&self, state: &State, req: &mut AdmissionRequest) -> ApiResult<()> {
        for p in &self.mutating {
            if p.handles(req.operation, req.resource()) && p.active(state, &req.user) {
                p.admit(state, req).await?;
            }
        }
        Ok(())
    }

    /// The validating phase.
    pub async fn validate(&self, state: &State, req: &AdmissionRequest) -> ApiResult<()> {
        for p in &self.validating {
            if p.handles(req.operation, req.resource()) && p.active(state, &req.user) {
                p.validate(state, req).await?;
            }
        }
        Ok(())
    }
}
