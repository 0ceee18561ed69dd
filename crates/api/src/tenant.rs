//! `TenantQuota`: one tenant (team, app, partner) with its keys, limits and fair share.

use k8s_openapi::apimachinery::pkg::apis::meta::v1::{Condition, Time};
use kube::{CustomResource, KubeSchema};
use schemars::JsonSchema;
use serde::{Deserialize, Serialize};

use crate::common::{DURATION_PATTERN, Limit, NAME_PATTERN, SecretKeyRef};

/// Desired state of a TenantQuota.
#[derive(CustomResource, Serialize, Deserialize, Clone, Debug, PartialEq, KubeSchema)]
#[kube(
    group = "switchyard.dev",
    version = "v1alpha1",
    kind = "TenantQuota",
    doc = "A tenant (team, app, partner) with its API keys, limits, workload class and fair-share weight.",
    plural = "tenantquotas",
    singular = "tenantquota",
    namespaced,
    status = "TenantQuotaStatus",
    shortname = "tq",
    shortname = "tenant",
    category = "switchyard",
    printcolumn = r#"{"name":"Ready","type":"string","jsonPath":".status.conditions[?(@.type==\"Ready\")].status"}"#,
    printcolumn = r#"{"name":"Status","type":"string","jsonPath":".status.conditions[?(@.type==\"Ready\")].message","priority":1}"#,
    printcolumn = r#"{"name":"Parent","type":"string","jsonPath":".spec.parent"}"#,
    printcolumn = r#"{"name":"Class","type":"string","jsonPath":".spec.workloadClass"}"#,
    printcolumn = r#"{"name":"Age","type":"date","jsonPath":".metadata.creationTimestamp"}"#
)]
#[serde(rename_all = "camelCase")]
#[x_kube(
    validation = kube::core::Rule::new("!has(self.limits) || self.limits.all(l, !has(l.quotaGroup))").message("quotaGroup is only meaningful on LLMProvider limits"),
    validation = kube::core::Rule::new("!has(self.apiKeys) || self.apiKeys.all(k, self.apiKeys.exists_one(j, j.name == k.name))").message("API key names must be unique"),
)]
pub struct TenantQuotaSpec {
    /// Parent tenant (a TenantQuota in the same namespace); its limits apply to this tenant too.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(length(min = 1, max = 253), regex(pattern = NAME_PATTERN))]
    pub parent: Option<String>,
    /// API keys that authenticate as this tenant. Only their SHA-256 hashes are held in memory.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    #[schemars(length(max = 64))]
    pub api_keys: Vec<ApiKey>,
    /// Buckets charged for every request of this tenant (and of its children).
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    #[schemars(length(max = 32))]
    pub limits: Vec<Limit>,
    /// Queue class for waiting work, such as `interactive`, `production` or `batch`
    /// (default `production`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(
        length(min = 1, max = 63),
        regex(pattern = r"^[a-z0-9]([-a-z0-9]*[a-z0-9])?$")
    )]
    pub workload_class: Option<String>,
    /// Fair-share weight within its workload class (deficit round robin; default 1).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(range(min = 1, max = 1000))]
    pub weight: Option<u32>,
    /// Waiting-room settings when a limit has no room.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub queue: Option<QueueSpec>,
    /// RoutingPolicy names this tenant may use; all when empty.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    #[schemars(length(max = 256))]
    pub allowed_routes: Vec<String>,
    /// Regions this tenant's requests may execute in; any when empty.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    #[schemars(length(max = 64))]
    pub allowed_regions: Vec<String>,
}

/// One API key of a tenant.
#[derive(Serialize, Deserialize, Clone, Debug, PartialEq, Eq, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct ApiKey {
    /// Label for the key, used in metrics and status (never the key itself).
    #[schemars(
        length(min = 1, max = 63),
        regex(pattern = r"^[a-z0-9]([-a-z0-9]*[a-z0-9])?$")
    )]
    pub name: String,
    /// Secret key holding the API key value.
    pub secret_ref: SecretKeyRef,
}

/// What happens when a queue is full.
#[derive(Serialize, Deserialize, Clone, Copy, Debug, PartialEq, Eq, JsonSchema, Default)]
#[serde(rename_all = "camelCase")]
pub enum OverloadAction {
    /// Reject the new request at once with 429 `queue_full`.
    #[default]
    Reject,
    /// Drop the oldest queued request of the same tenant to make room.
    ShedOldest,
}

/// Queue settings.
#[derive(Serialize, Deserialize, Clone, Debug, PartialEq, Eq, KubeSchema, Default)]
#[serde(rename_all = "camelCase")]
#[x_kube(validation = kube::core::Rule::new("!has(self.maxDepth) || self.maxDepth > 0 || !has(self.deadline)").message("a queue with maxDepth 0 takes no entries, so it cannot have a deadline"))]
pub struct QueueSpec {
    /// Most entries waiting at once for this tenant (default 0: no queueing, reject at once).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(range(min = 0, max = 100_000))]
    pub max_depth: Option<u32>,
    /// Longest wait before an entry is rejected with `queue_deadline` (default `30s`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(regex(pattern = DURATION_PATTERN))]
    pub deadline: Option<String>,
    /// What to do when the queue is full.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub overload_action: Option<OverloadAction>,
}

/// Observed state of a TenantQuota.
#[derive(Serialize, Deserialize, Clone, Debug, PartialEq, Default, KubeSchema)]
#[serde(rename_all = "camelCase")]
pub struct TenantQuotaStatus {
    /// Usage per limit in the current window.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub usage: Vec<LimitUsage>,
    /// Requests that waited in a queue: since the router started (standalone), or over the
    /// whole fleet since the operator first counted it (cluster; see `counted`).
    #[serde(default)]
    pub throttled: u64,
    /// Requests rejected by a limit of this tenant (same scope as `throttled`).
    #[serde(default)]
    pub rejected: u64,
    /// Cluster mode: how far the operator has counted each live router replica's
    /// `throttled` / `rejected` into the totals above, so a new leader or a missed interval
    /// counts every request exactly once. Written by the operator only.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    #[schemars(length(max = 256))]
    pub counted: Vec<TenantCounted>,
    /// When the figures were taken.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub last_update_time: Option<Time>,
    /// Standard conditions (`Ready`).
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    #[x_kube(merge_strategy = kube::core::ListMerge::Map(vec!["type".into()]))]
    pub conditions: Vec<Condition>,
    /// The `metadata.generation` this status was computed for.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub observed_generation: Option<i64>,
}

/// One router replica's tenant counters as far as the operator has counted them (the
/// figures of that replica's `GET /outcomes`, `crate::outcomes::TenantOutcomes`).
#[derive(Serialize, Deserialize, Clone, Debug, PartialEq, Eq, Default, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct TenantCounted {
    /// Replica identity as the router reports it (pod name, or host name outside a cluster).
    #[schemars(length(min = 1, max = 253))]
    pub replica: String,
    /// The replica process's start time (RFC 3339); another start time means it restarted.
    #[schemars(length(min = 1, max = 64))]
    pub started_at: String,
    /// Throttled requests counted.
    #[serde(default)]
    pub throttled: u64,
    /// Rejected requests counted.
    #[serde(default)]
    pub rejected: u64,
}

/// Usage of one limit of this tenant (its own limits, not its ancestors'), as the quota store
/// holds it when the figures were taken.
#[derive(Serialize, Deserialize, Clone, Debug, PartialEq, Eq, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct LimitUsage {
    /// The limit's name, or `<index>-<dimension>` when unnamed (as in its bucket key).
    pub limit: String,
    /// The limit's dimension, e.g. `requests`, `input_tokens`, `concurrency`, `spend_micro_usd`.
    #[serde(default, skip_serializing_if = "String::is_empty")]
    pub dimension: String,
    /// Units used in the current window (fixed window), drained from the bucket (token bucket:
    /// `amount - remaining`), or in flight (concurrency). Reservations not yet settled count.
    pub used: u64,
    /// The limit's amount.
    pub amount: u64,
    /// Units available now (0 while the bucket is in debt).
    #[serde(default)]
    pub remaining: u64,
    /// Refill period or window length, such as `60s`; absent for concurrency limits.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub window: Option<String>,
    /// Seconds until the bucket is full again (token bucket) or the window resets (fixed
    /// window), rounded up; 0 for concurrency.
    #[serde(default)]
    pub reset_after_seconds: u64,
}
