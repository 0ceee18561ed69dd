//! The outcome protocol between router replicas and the operator (DESIGN §2).
//!
//! Every router serves `GET /outcomes` (JSON, [`OutcomeReport`]) with **monotonic** counters per
//! LLMProvider since the process started. The operator scrapes every replica each control
//! interval and takes deltas between two scrapes of the same replica; a different
//! `startedAt` (or a counter that went down) means the replica restarted, and the new counters
//! are then the delta since the restart. Counters are cumulative rather than per-window so a
//! missed scrape loses nothing: the next delta covers both windows.
//!
//! Shape (camelCase JSON):
//! ```json
//! {"replica":"router-7d9c-abcde","startedAt":"2026-11-30T11:00:00Z",
//!  "providers":{"team-a/anthropic-east":{"successes":120,"cancelled":3,"inFlight":2,
//!    "errors":{"capacity":4,"server":1},"slow":7}}}
//! ```
//! Since issue 17 the report also carries `tenants` (per TenantQuota: cumulative `throttled`
//! and `rejected`, and `usage` of its own limits now) and `quotaStore` (`redis`, `in_process`
//! or `local_fallback`), from which the operator writes `TenantQuota.status` in a cluster.
//!
//! `errors` is keyed by the error class names of `switchyard_core::classify::ErrorClass`
//! (`capacity`, `overload`, `timeout`, `connect`, `server`, `auth`, `policy`, `request`,
//! `deadline`); a missing class is 0.

use std::collections::BTreeMap;

use chrono::{DateTime, Utc};
use serde::{Deserialize, Serialize};

/// Path of the outcome endpoint on every router.
pub const OUTCOMES_PATH: &str = "/outcomes";

/// One router replica's cumulative outcome counters.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct OutcomeReport {
    /// Replica identity (pod name, or host name outside a cluster).
    pub replica: String,
    /// When this process started; a change between scrapes means the counters were reset.
    pub started_at: DateTime<Utc>,
    /// Counters per provider, keyed by `namespace/name` of the LLMProvider.
    #[serde(default)]
    pub providers: BTreeMap<String, ProviderOutcomes>,
    /// Per TenantQuota (`namespace/name`): its throttled / rejected counters and the usage of
    /// its own limits. Absent in older routers' reports.
    #[serde(default, skip_serializing_if = "BTreeMap::is_empty")]
    pub tenants: BTreeMap<String, TenantOutcomes>,
    /// Where the usage figures come from: `redis` (shared by every replica, so any one
    /// replica's figures are the fleet's), `in_process` or `local_fallback` (this replica's
    /// own buckets; the operator adds them up). Absent = `in_process`.
    #[serde(default = "in_process", skip_serializing_if = "String::is_empty")]
    pub quota_store: String,
}

fn in_process() -> String {
    "in_process".to_owned()
}

/// One tenant on one replica: cumulative counts since the process started, and the usage of
/// the tenant's own limits now (`crate::tenant::LimitUsage`, as in `TenantQuota.status`).
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct TenantOutcomes {
    /// Requests that waited in the tenant's queue.
    #[serde(default)]
    pub throttled: u64,
    /// Requests refused because of the tenant's limits or queue.
    #[serde(default)]
    pub rejected: u64,
    /// Usage per own limit, in the store's current window.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub usage: Vec<crate::tenant::LimitUsage>,
}

/// Cumulative counters of one provider on one replica.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct ProviderOutcomes {
    /// Successful attempts.
    #[serde(default)]
    pub successes: u64,
    /// Failed attempts by error class name.
    #[serde(default)]
    pub errors: BTreeMap<String, u64>,
    /// Attempts ended because the client went away (not counted against the provider).
    #[serde(default)]
    pub cancelled: u64,
    /// Attempts in flight at the time of the scrape (a gauge, not a counter).
    #[serde(default)]
    pub in_flight: i64,
    /// Successes that were clearly slower than the provider's latency baseline on this
    /// replica (`switchyard_core::latency`; also counted in `successes`). Absent = 0 (older
    /// routers).
    #[serde(default)]
    pub slow: u64,
    /// Capacity refusals (429) of spill-over attempts, and skips of a provider paused by one,
    /// by requests whose first choice was another provider: the provider was full of traffic
    /// that failures elsewhere moved onto it. Not in `errors`, not counted by the availability
    /// controller. Absent = 0 (older routers).
    #[serde(default)]
    pub full_on_spill: u64,
}

impl ProviderOutcomes {
    /// The counter of one error class (0 when absent).
    pub fn errors_of(&self, class: &str) -> u64 {
        self.errors.get(class).copied().unwrap_or(0)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn report_round_trips_documented_shape() {
        let text = r#"{"replica":"r1","startedAt":"2026-11-30T11:00:00Z",
            "providers":{"team-a/p":{"successes":120,"cancelled":3,"inFlight":2,
            "errors":{"capacity":4,"server":1}}}}"#;
        let report: OutcomeReport = serde_json::from_str(text).unwrap();
        let p = &report.providers["team-a/p"];
        assert_eq!(p.successes, 120);
        assert_eq!(p.errors_of("capacity"), 4);
        assert_eq!(p.errors_of("overload"), 0);
        let again: OutcomeReport =
            serde_json::from_str(&serde_json::to_string(&report).unwrap()).unwrap();
        assert_eq!(again, report);
    }
}
