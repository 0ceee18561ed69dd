//! Types shared by the three resources: limits, durations, secret references, conditions.

use kube::KubeSchema;
use schemars::JsonSchema;
use serde::{Deserialize, Serialize};

/// Pattern every duration field follows: one or more `<number><unit>` groups with units `ms`, `s`,
/// `m`, `h`, as Go and Kubernetes print them (`500ms`, `30s`, `5m`, `1h30m`).
pub const DURATION_PATTERN: &str = r"^([0-9]+(ms|s|m|h))+$";

/// Pattern of a limit's `period`: a duration that is not zero (at least one group has a digit
/// other than 0), so `0s`, `0m0s` and `00h` are refused by the API server's schema check as by
/// the loader. RE2 has no look-ahead, hence the spelled-out form: any groups, one group with a
/// non-zero digit, any groups.
pub const POSITIVE_DURATION_PATTERN: &str =
    r"^([0-9]+(ms|s|m|h))*0*[1-9][0-9]*(ms|s|m|h)([0-9]+(ms|s|m|h))*$";

/// Pattern for decimal amounts kept as strings so the spec carries no floats (`"3"`, `"0.25"`).
pub const DECIMAL_PATTERN: &str = r"^[0-9]{1,9}(\.[0-9]{1,9})?$";

/// Pattern for a Kubernetes object name (RFC 1123 subdomain, as the API server checks it).
pub const NAME_PATTERN: &str = r"^[a-z0-9]([-a-z0-9]*[a-z0-9])?(\.[a-z0-9]([-a-z0-9]*[a-z0-9])?)*$";

/// A reference to one key of a Kubernetes Secret in the resource's namespace.
///
/// In standalone mode the value is read from the environment variable
/// `SWITCHYARD_SECRET_<NAME>_<KEY>` (upper-cased, `-` and `.` turned into `_`) or from the file
/// `<secrets-dir>/<name>/<key>`.
#[derive(Serialize, Deserialize, Clone, Debug, PartialEq, Eq, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct SecretKeyRef {
    /// Name of the Secret, in the same namespace as the referring resource.
    #[schemars(length(min = 1, max = 253), regex(pattern = NAME_PATTERN))]
    pub name: String,
    /// Key inside the Secret's `data` whose value is used.
    #[schemars(length(min = 1, max = 253), regex(pattern = r"^[-._a-zA-Z0-9]+$"))]
    pub key: String,
}

/// What a bucket counts.
#[derive(Serialize, Deserialize, Clone, Copy, Debug, PartialEq, Eq, Hash, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub enum LimitDimension {
    /// Requests (RPM when the period is one minute).
    Requests,
    /// Input (prompt) tokens (ITPM when the period is one minute).
    InputTokens,
    /// Output (completion) tokens (OTPM when the period is one minute).
    OutputTokens,
    /// Input plus output tokens.
    TotalTokens,
    /// Requests in flight at once; held from admission until the response ends.
    Concurrency,
    /// Spend in micro-USD (1 USD = 1,000,000), priced from the model's pricing.
    SpendMicroUsd,
}

/// How a bucket refills.
#[derive(Serialize, Deserialize, Clone, Copy, Debug, PartialEq, Eq, Hash, JsonSchema, Default)]
#[serde(rename_all = "camelCase")]
pub enum LimitRule {
    /// Token bucket holding `amount` that refills continuously over `period`.
    #[default]
    TokenBucket,
    /// Fixed window of length `period` (default 24h) that resets at `resetAt` in `timeZone`;
    /// the usual shape of daily quotas and spend caps.
    FixedWindow,
    /// Held until release: `amount` units may be in use at once (only for `concurrency`).
    Concurrency,
}

/// One rate-limit or quota bucket: a dimension, an amount and a refill rule.
///
/// The scope (API key, tenant, route, provider or quota group) comes from the resource that
/// declares the limit.
#[derive(Serialize, Deserialize, Clone, Debug, PartialEq, Eq, KubeSchema)]
#[serde(rename_all = "camelCase")]
#[x_kube(
    validation = kube::core::Rule::new("self.rule != 'tokenBucket' || has(self.period)").message("a token bucket needs a period"),
    validation = kube::core::Rule::new("self.rule != 'concurrency' || !has(self.period)").message("a concurrency limit must not have a period"),
    validation = kube::core::Rule::new("(self.rule == 'concurrency') == (self.dimension == 'concurrency')").message("the concurrency dimension must use the concurrency rule, and only it"),
    validation = kube::core::Rule::new("!has(self.resetAt) || self.rule == 'fixedWindow'").message("resetAt applies only to a fixedWindow limit"),
    validation = kube::core::Rule::new("!has(self.timeZone) || has(self.resetAt)").message("timeZone needs resetAt"),
)]
pub struct Limit {
    /// Optional name, shown in status and in rejection reasons.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(
        length(min = 1, max = 63),
        regex(pattern = r"^[a-z0-9]([-a-z0-9]*[a-z0-9])?$")
    )]
    pub name: Option<String>,
    /// The dimension this bucket counts.
    pub dimension: LimitDimension,
    /// Capacity of the bucket, in units of the dimension (requests, tokens, requests in flight
    /// or micro-USD).
    #[schemars(range(min = 1))]
    pub amount: u64,
    /// Refill rule; `tokenBucket` unless stated.
    #[serde(default)]
    pub rule: LimitRule,
    /// Refill period of a token bucket, or window length of a fixed window (default 24h), as a
    /// duration string such as `60s` or `24h`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(length(max = 32), regex(pattern = POSITIVE_DURATION_PATTERN))]
    pub period: Option<String>,
    /// Local time `HH:MM` at which a fixed window resets (daily quotas).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(regex(pattern = r"^([01][0-9]|2[0-3]):[0-5][0-9]$"))]
    pub reset_at: Option<String>,
    /// IANA time zone of `resetAt`, such as `Europe/Berlin`; UTC when absent.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(
        length(min = 1, max = 64),
        regex(pattern = r"^[A-Za-z][A-Za-z0-9_+-]*(/[A-Za-z0-9_+-]+)*$")
    )]
    pub time_zone: Option<String>,
    /// Whether input tokens served from the provider's prompt cache count against this bucket
    /// (most providers do not count them against input-token limits). Defaults to true.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub count_cached_input: Option<bool>,
    /// Providers whose limits share one upstream quota (one account or project) name the same
    /// group here; the bucket is then held once for the whole group. Only on LLMProvider.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(
        length(min = 1, max = 63),
        regex(pattern = r"^[a-z0-9]([-a-z0-9]*[a-z0-9])?$")
    )]
    pub quota_group: Option<String>,
}

/// Condition types written by Switchyard.
pub mod condition {
    /// Summary condition: the resource is valid, its references resolve and it is in use.
    pub const READY: &str = "Ready";
    /// A provider's availability is below the degraded threshold, or a policy has no healthy
    /// provider.
    pub const DEGRADED: &str = "Degraded";
    /// Availability below which a provider is reported `Degraded` (and a policy whose best
    /// eligible provider is below it). The standalone router's status uses the same figure.
    pub const DEGRADED_BELOW: f64 = 0.5;
}

/// A wall-clock time in the Kubernetes `Time` type, truncated to whole milliseconds (what the
/// API server keeps); out-of-range times become the Unix epoch.
pub fn k8s_time(
    at: chrono::DateTime<chrono::Utc>,
) -> k8s_openapi::apimachinery::pkg::apis::meta::v1::Time {
    k8s_openapi::apimachinery::pkg::apis::meta::v1::Time(
        k8s_openapi::jiff::Timestamp::from_millisecond(at.timestamp_millis())
            .unwrap_or(k8s_openapi::jiff::Timestamp::UNIX_EPOCH),
    )
}

/// One status condition of `type_` (`"True"` when `status`), with `since` as its
/// `lastTransitionTime`; how `since` is kept across updates is the caller's (the operator reads
/// the object's current conditions, the standalone router remembers them in memory).
pub fn new_condition(
    type_: &str,
    status: bool,
    reason: &str,
    message: String,
    generation: Option<i64>,
    since: k8s_openapi::apimachinery::pkg::apis::meta::v1::Time,
) -> k8s_openapi::apimachinery::pkg::apis::meta::v1::Condition {
    k8s_openapi::apimachinery::pkg::apis::meta::v1::Condition {
        type_: type_.to_owned(),
        status: if status { "True" } else { "False" }.to_owned(),
        reason: reason.to_owned(),
        message,
        last_transition_time: since,
        observed_generation: generation,
    }
}

/// CamelCase reasons used in conditions.
pub mod reason {
    /// The object is valid and serving.
    pub const RECONCILED: &str = "Reconciled";
    /// The spec failed validation.
    pub const INVALID_SPEC: &str = "InvalidSpec";
    /// A referenced object (provider, parent tenant, Secret) does not exist.
    pub const DANGLING_REFERENCE: &str = "DanglingReference";
    /// A referenced Secret, or the key named in the reference, does not exist.
    pub const SECRET_NOT_FOUND: &str = "SecretNotFound";
    /// A referenced Secret could not be read.
    pub const SECRET_UNAVAILABLE: &str = "SecretUnavailable";
    /// The Secret API cannot be read at all (listing or watching Secrets was refused, 403 or
    /// 404): the service account lacks get/list/watch on secrets. Not the same as a Secret
    /// that does not exist.
    pub const SECRETS_FORBIDDEN: &str = "SecretsForbidden";
    /// The Secret cache has not completed its first list; nothing is said about Secrets yet.
    pub const SECRETS_SYNCING: &str = "SecretsSyncing";
    /// Availability fell below the degraded threshold.
    /// The provider's settings cannot work with its API (a region that is not a region
    /// name, no project, an endpoint that is not a URL, keys that do not parse).
    pub const PROVIDER_UNUSABLE: &str = "ProviderUnusable";
    /// Credentials could not be obtained or the provider refused them (token endpoint or STS
    /// refused, 401/403 answers).
    pub const CREDENTIALS_REJECTED: &str = "CredentialsRejected";
    pub const LOW_AVAILABILITY: &str = "LowAvailability";
    /// Availability is back above the threshold.
    pub const RECOVERED: &str = "Recovered";
}

/// Field managers used for server-side apply; constant so that ownership never moves.
pub mod field_manager {
    /// The operator's status writes.
    pub const OPERATOR: &str = "switchyard-operator";
}

/// API group of every Switchyard resource.
pub const GROUP: &str = "switchyard.dev";
/// Version of the resources defined in this crate.
pub const VERSION: &str = "v1alpha1";

impl Limit {
    /// The ledger bucket this limit declares, or why it cannot be built (a period of zero or
    /// beyond the duration range, a reset time on a window that is not whole days, an unknown
    /// time zone). The one verdict the loader, the operator and the router share: a limit that
    /// cannot be built makes its object invalid; it is never left out of reservations.
    ///
    /// Defaults when absent: a token bucket refills over one minute, a fixed window lasts a
    /// day, `resetAt` is in UTC.
    ///
    /// # Errors
    /// A lower-case sentence naming the field (`period`, `resetAt`, `timeZone`).
    pub fn bucket(
        &self,
        key: String,
        scope: switchyard_core::quota::Scope,
    ) -> Result<switchyard_core::quota::BucketSpec, String> {
        use std::time::Duration;
        use switchyard_core::quota::{BucketSpec, Rule};
        let period = match self.period.as_deref() {
            None => None,
            Some(text) => match crate::duration::parse(text) {
                Some(d) if !d.is_zero() => Some(d),
                Some(_) => return Err(format!("period {text:?} is zero")),
                None => return Err(format!("period {text:?} is not a duration in range")),
            },
        };
        let rule = match self.rule {
            LimitRule::TokenBucket => Rule::TokenBucket {
                capacity: self.amount,
                period: period.unwrap_or(Duration::from_secs(60)),
            },
            LimitRule::FixedWindow => Rule::FixedWindow {
                capacity: self.amount,
                period: period.unwrap_or(Duration::from_secs(86_400)),
                reset_at: match self.reset_at.as_deref() {
                    None => None,
                    Some(t) => Some(
                        t.split_once(':')
                            .and_then(|(h, m)| Some((h.parse().ok()?, m.parse().ok()?)))
                            .ok_or_else(|| format!("resetAt {t:?} is not HH:MM"))?,
                    ),
                },
                tz: match self.time_zone.as_deref() {
                    None => chrono_tz::UTC,
                    Some(z) => z
                        .parse()
                        .map_err(|_| format!("timeZone {z:?} is not an IANA time zone name"))?,
                },
            },
            LimitRule::Concurrency => Rule::Concurrency { limit: self.amount },
        };
        let spec = BucketSpec {
            key,
            scope,
            dimension: self.dimension.into(),
            rule,
            count_cached_input: self.count_cached_input.unwrap_or(true),
        };
        spec.validate().map_err(|e| {
            use switchyard_core::quota::SpecError;
            match e {
                SpecError::ZeroPeriod(_) => "period must be positive".to_owned(),
                SpecError::ResetNeedsWholeDays(_) => {
                    "resetAt needs a period of whole days".to_owned()
                }
                SpecError::BadResetTime(_) => "resetAt must be within 00:00..23:59".to_owned(),
                SpecError::DimensionRuleMismatch(_) => {
                    "the concurrency dimension goes with the concurrency rule and only it"
                        .to_owned()
                }
                other => other.to_string(),
            }
        })?;
        Ok(spec)
    }
}

impl From<LimitDimension> for switchyard_core::quota::Dimension {
    fn from(d: LimitDimension) -> Self {
        use switchyard_core::quota::Dimension;
        match d {
            LimitDimension::Requests => Dimension::Requests,
            LimitDimension::InputTokens => Dimension::InputTokens,
            LimitDimension::OutputTokens => Dimension::OutputTokens,
            LimitDimension::TotalTokens => Dimension::TotalTokens,
            LimitDimension::Concurrency => Dimension::Concurrency,
            LimitDimension::SpendMicroUsd => Dimension::SpendMicroUsd,
        }
    }
}
