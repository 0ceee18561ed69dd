//! Switchyard custom resources and the manifest loader.
//!
//! Three namespaced kinds in group `switchyard.dev`, version `v1alpha1` (DESIGN §1):
//! [`LLMProvider`], [`RoutingPolicy`] and [`TenantQuota`]. Their OpenAPI schemas (with CEL
//! `x-kubernetes-validations`) are generated from these types by `switchyard crdgen` into
//! `crds/`. The [`loader`] validates a folder of manifests the way the API server would, for the
//! standalone mode that runs without a cluster.

// The schema derives generate private copies of the spec types, which trips `unreachable_pub`.
#![allow(unreachable_pub)]

pub mod common;
pub mod crd;
pub mod duration;
pub mod loader;
pub mod outcomes;
pub mod policy;
pub mod provider;
pub mod tenant;
pub mod verdict;

pub use common::{Limit, LimitDimension, LimitRule, SecretKeyRef};
pub use policy::{RoutingPolicy, RoutingPolicySpec, RoutingPolicyStatus};
pub use provider::{LLMProvider, LLMProviderSpec, LLMProviderStatus};
pub use tenant::{TenantQuota, TenantQuotaSpec, TenantQuotaStatus};
