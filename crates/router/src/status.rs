//! Computed status of every resource, in the CRD status shapes, for `GET /status` and
//! `switchyard status`. In Kubernetes mode the operator writes the same shapes into the
//! resources' status subresources.

use chrono::{DateTime, Utc};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::Condition;
use serde::{Deserialize, Serialize};
use std::collections::HashMap;
use std::sync::Arc;
use switchyard_api::common::{condition, reason};
use switchyard_api::policy::{ProviderWeight, RoutingPolicyStatus};
use switchyard_api::provider::{LLMProviderStatus, WindowStatus};

use switchyard_api::tenant::{LimitUsage, TenantQuotaStatus};
use switchyard_core::quota::{BucketSpec, RateFigures, Rule, Scope};

use crate::app::App;
use crate::conditions::time;
use crate::state::lock;

/// Availability below which a provider is reported `Degraded`.
pub const DEGRADED_BELOW: f64 = 0.5;

/// One object's computed status.
#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct Named<S> {
    /// Namespace.
    pub namespace: String,
    /// Name.
    pub name: String,
    /// Status in the CRD shape.
    pub status: S,
}

/// Everything `GET /status` returns.
#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct StatusDocument {
    /// LLMProviders.
    pub providers: Vec<Named<LLMProviderStatus>>,
    /// RoutingPolicies.
    pub policies: Vec<Named<RoutingPolicyStatus>>,
    /// TenantQuotas.
    pub tenants: Vec<Named<TenantQuotaStatus>>,
    /// Configuration problems that did not stop serving (e.g. an invalid reload).
    pub messages: Vec<String>,
    /// Revision of the configuration being served, when the source has one (Kubernetes
    /// mode), so replicas can be compared.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub revision: Option<String>,
    /// How clients authenticate on this process.
    #[serde(default)]
    pub authentication: AuthenticationStatus,
}

/// The authentication mode of the process (a flag, never derived from the configuration).
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct AuthenticationStatus {
    /// Whether a request without an API key is served (`--allow-anonymous`).
    pub anonymous_allowed: bool,
    /// One line for people: what a request without a key gets.
    pub message: String,
}

/// "serving", or why the provider is taking no traffic right now: a Retry-After or exhaustion
/// pause on its scope (provider or quota group), or an open circuit.
fn serving_message(app: &App, p: &crate::config::ProviderConfig) -> String {
    let now = app.clock.now();
    let pauses = lock(&app.runtime.pauses);
    let paused = p
        .pause_scopes
        .iter()
        .filter_map(|scope| pauses.entry(scope, now).map(|e| (scope, e)))
        .filter(|(_, e)| e.until > now)
        .max_by_key(|(_, e)| e.until);
    match paused {
        Some((scope, e)) => format!(
            "serving; paused for {}s more after a {} answer (scope {scope})",
            e.until.saturating_since(now).as_secs().max(1),
            e.reason
        ),
        None => "serving".to_owned(),
    }
}

/// `HealthProbesValid`: False (reason `ProbeRejected`) while some modality's probe is refused
/// for its shape or cannot be built — a probe configuration problem, kept apart from the
/// provider's availability and health (field case 26).
fn probes_condition(app: &App, p: &crate::config::ProviderConfig, now: DateTime<Utc>) -> Condition {
    use switchyard_api::provider::health_reason;
    let problems = app.runtime.health.probe_problems(&p.key);
    let (valid, why, message) = if problems.is_empty() {
        (
            true,
            reason::RECONCILED,
            "no health probe was refused for its shape".to_owned(),
        )
    } else {
        let list: Vec<String> = problems
            .iter()
            .map(|(m, problem)| format!("{m:?}: {problem}"))
            .collect();
        (
            false,
            health_reason::PROBE_REJECTED,
            format!(
                "health probe configuration problem (not provider unavailability): {}",
                list.join("; ")
            ),
        )
    };
    app.transitions.condition(
        &p.key,
        health_reason::CONDITION_PROBES_VALID,
        valid,
        why,
        message,
        p.generation,
        now,
    )
}

/// One limit's usage from its bucket and the store's figures for it: `used` is
/// `limit - remaining` (what is drained, held or spent in the window), the window the rule's
/// period in seconds (none for concurrency), the reset rounded up to whole seconds.
pub fn limit_usage(tenant_key: &str, bucket: &BucketSpec, figures: RateFigures) -> LimitUsage {
    let prefix = format!("tenant/{tenant_key}/");
    let limit = bucket
        .key
        .strip_prefix(&prefix)
        .unwrap_or(&bucket.key)
        .to_owned();
    let window = match &bucket.rule {
        Rule::TokenBucket { period, .. } | Rule::FixedWindow { period, .. } => {
            Some(format!("{}s", period.as_secs()))
        }
        Rule::Concurrency { .. } => None,
    };
    let reset = figures.reset_after;
    LimitUsage {
        limit,
        dimension: bucket.dimension.label().to_owned(),
        used: figures.limit.saturating_sub(figures.remaining),
        amount: figures.limit,
        remaining: figures.remaining,
        window,
        reset_after_seconds: reset.as_secs() + u64::from(reset.subsec_nanos() > 0),
    }
}

/// The tenant's own buckets (not its ancestors', which have their own TenantQuota status).
pub fn own_buckets(tenant: &crate::config::Tenant) -> impl Iterator<Item = &Arc<BucketSpec>> {
    tenant
        .buckets
        .iter()
        .filter(|b| matches!(&b.scope, Scope::Tenant(k) if *k == tenant.key))
}

/// Usage of every tenant's own limits, by tenant key, read from the quota store (in-process,
/// or Redis with every replica's reservations; the local share while Redis fails).
pub async fn tenant_usage(app: &App) -> HashMap<String, Vec<LimitUsage>> {
    let live = app.runtime.live();
    let mut out = HashMap::new();
    for tenant in &live.table.tenants {
        let mut usage = Vec::new();
        for b in own_buckets(tenant) {
            if let Some(f) = app.broker.store().figures(b).await {
                usage.push(limit_usage(&tenant.key, b, f));
            }
        }
        out.insert(tenant.key.clone(), usage);
    }
    out
}

/// Computes the status of every resource now, without tenant usage (see
/// [`snapshot_with_usage`]).
pub fn snapshot(app: &App) -> StatusDocument {
    snapshot_with_usage(app, &HashMap::new())
}

/// Computes the status of every resource now; tenants get `usage` (from [`tenant_usage`]),
/// and their `throttled` / `rejected` counts since this process started.
pub fn snapshot_with_usage(app: &App, usage: &HashMap<String, Vec<LimitUsage>>) -> StatusDocument {
    let live = app.runtime.live();
    let now = app.clock.wall();
    let t = &app.transitions;
    let providers = live
        .table
        .providers
        .iter()
        .zip(&live.providers)
        .map(|(p, s)| {
            let availability = s.availability();
            let window = s.last_window();
            let flap = s.flap();
            let ready = match &p.client {
                Ok(c) if let Some(problem) = c.credential_problem() => t.condition(
                    &p.key,
                    condition::READY,
                    false,
                    reason::CREDENTIALS_REJECTED,
                    problem,
                    p.generation,
                    now,
                ),
                Ok(_) => t.condition(
                    &p.key,
                    condition::READY,
                    true,
                    reason::RECONCILED,
                    serving_message(app, p),
                    p.generation,
                    now,
                ),
                Err(why) => {
                    let r = if why.contains("secret") {
                        reason::SECRET_UNAVAILABLE
                    } else {
                        reason::INVALID_SPEC
                    };
                    t.condition(
                        &p.key,
                        condition::READY,
                        false,
                        r,
                        why.clone(),
                        p.generation,
                        now,
                    )
                }
            };
            let degraded = availability < DEGRADED_BELOW;
            let degraded = t.condition(
                &p.key,
                condition::DEGRADED,
                degraded,
                if degraded {
                    reason::LOW_AVAILABILITY
                } else {
                    reason::RECOVERED
                },
                format!("availability {availability:.3}"),
                p.generation,
                now,
            );
            let mut conditions = vec![ready, degraded];
            if p.probes.is_some() {
                conditions.push(probes_condition(app, p, now));
            }
            let mut status = LLMProviderStatus {
                availability: Some(availability),
                last_window: window.report.map(|r| WindowStatus {
                    successes: window.successes,
                    errors: window.errors,
                    score: r.score,
                }),
                flap_penalty: None,
                flap_suppressed: None,
                health: app.runtime.health.status(&p.key, app.clock.now()),
                last_update_time: window.report.map(|_| time(now)),
                conditions,
                observed_generation: p.generation,
                counted: Vec::new(),
            };
            status.set_flap(flap);
            Named {
                namespace: p.namespace.clone(),
                name: p.name.clone(),
                status,
            }
        })
        .collect();
    let policies = live
        .table
        .routes
        .iter()
        .zip(&live.routes)
        .map(|(r, s)| {
            let weights = s.weights.load();
            let entries: Vec<ProviderWeight> = r
                .providers
                .iter()
                .zip(&r.provider_names)
                .enumerate()
                .map(|(i, (rp, name))| ProviderWeight {
                    name: name.clone(),
                    availability: live
                        .providers
                        .get(rp.index)
                        .map_or(0.0, |p| p.availability()),
                    weight: weights.get(i).copied().unwrap_or(0.0),
                    eligible: rp.ineligible.is_none(),
                    reason: rp.ineligible.clone(),
                })
                .collect();
            let usable = entries.iter().filter(|e| e.eligible).count();
            let ready = if !r.limit_problems.is_empty() {
                t.condition(
                    &r.key,
                    condition::READY,
                    false,
                    reason::INVALID_SPEC,
                    format!(
                        "a limit cannot be enforced, requests are refused: {}",
                        r.limit_problems.join("; ")
                    ),
                    r.generation,
                    now,
                )
            } else if usable > 0 {
                t.condition(
                    &r.key,
                    condition::READY,
                    true,
                    reason::RECONCILED,
                    format!("{usable} of {} providers eligible", entries.len()),
                    r.generation,
                    now,
                )
            } else {
                t.condition(
                    &r.key,
                    condition::READY,
                    false,
                    reason::INVALID_SPEC,
                    "no eligible provider".to_owned(),
                    r.generation,
                    now,
                )
            };
            let best = entries
                .iter()
                .filter(|e| e.eligible)
                .map(|e| e.availability)
                .fold(0.0, f64::max);
            let degraded = best < DEGRADED_BELOW;
            let degraded = t.condition(
                &r.key,
                condition::DEGRADED,
                degraded,
                if degraded {
                    reason::LOW_AVAILABILITY
                } else {
                    reason::RECOVERED
                },
                format!("best provider availability {best:.3}"),
                r.generation,
                now,
            );
            let computed = *lock(&s.computed_at);
            Named {
                namespace: r.namespace.clone(),
                name: r.name.clone(),
                status: RoutingPolicyStatus {
                    providers: entries,
                    last_update_time: computed.map(time),
                    conditions: vec![ready, degraded],
                    observed_generation: r.generation,
                },
            }
        })
        .collect();
    let tenants = live
        .table
        .tenants
        .iter()
        .map(|tenant| {
            let ready = if !tenant.limit_problems.is_empty() {
                t.condition(
                    &tenant.key,
                    condition::READY,
                    false,
                    reason::INVALID_SPEC,
                    format!(
                        "a limit cannot be enforced, requests are refused: {}",
                        tenant.limit_problems.join("; ")
                    ),
                    tenant.generation,
                    now,
                )
            } else if tenant.key_problems.is_empty() {
                t.condition(
                    &tenant.key,
                    condition::READY,
                    true,
                    reason::RECONCILED,
                    "keys resolved".to_owned(),
                    tenant.generation,
                    now,
                )
            } else {
                t.condition(
                    &tenant.key,
                    condition::READY,
                    false,
                    reason::SECRET_UNAVAILABLE,
                    tenant.key_problems.join("; "),
                    tenant.generation,
                    now,
                )
            };
            let (namespace, name) = tenant
                .key
                .split_once('/')
                .unwrap_or(("default", &tenant.key));
            Named {
                namespace: namespace.to_owned(),
                name: name.to_owned(),
                status: {
                    let counts = app.broker.tenant_counts(&tenant.key);
                    TenantQuotaStatus {
                        usage: usage.get(&tenant.key).cloned().unwrap_or_default(),
                        throttled: counts.throttled,
                        rejected: counts.rejected,
                        counted: Vec::new(),
                        last_update_time: Some(time(now)),
                        conditions: vec![ready],
                        observed_generation: tenant.generation,
                    }
                },
            }
        })
        .collect();
    let mut messages = live.table.warnings.clone();
    messages.extend(lock(&app.config_messages).iter().cloned());
    StatusDocument {
        providers,
        policies,
        tenants,
        messages,
        revision: live.table.revision.clone(),
        authentication: AuthenticationStatus {
            anonymous_allowed: app.serve.allow_anonymous,
            message: if app.serve.allow_anonymous {
                "requests without an API key are served as anonymous (--allow-anonymous)".to_owned()
            } else {
                "an API key of a TenantQuota is required on every request".to_owned()
            },
        },
    }
}

fn cond<'a>(conditions: &'a [Condition], kind: &str) -> Option<&'a Condition> {
    conditions.iter().find(|c| c.type_ == kind)
}

/// Renders a status document as the tables `switchyard status` prints.
pub fn render_table(doc: &StatusDocument) -> String {
    use std::fmt::Write as _;

    use switchyard_api::provider::health_reason;
    let mut out = String::new();
    if !doc.authentication.message.is_empty() {
        let _ = writeln!(out, "AUTHENTICATION: {}\n", doc.authentication.message);
    }
    let _ = writeln!(out, "LLMPROVIDERS");
    let _ = writeln!(
        out,
        "{:<32} {:<6} {:>12} {:>9} {:>7}  STATUS",
        "NAME", "READY", "AVAILABILITY", "SUCCESSES", "ERRORS"
    );
    for p in &doc.providers {
        let ready = cond(&p.status.conditions, condition::READY);
        let w = p.status.last_window.clone().unwrap_or_default();
        let _ = writeln!(
            out,
            "{:<32} {:<6} {:>12.3} {:>9} {:>7}  {}",
            format!("{}/{}", p.namespace, p.name),
            ready.map_or("?", |c| c.status.as_str()),
            p.status.availability.unwrap_or(1.0),
            w.successes,
            w.errors,
            ready.map_or("", |c| c.message.as_str()),
        );
        if !p.status.health.is_empty() {
            let modalities: Vec<String> = p
                .status
                .health
                .iter()
                .map(|h| {
                    let modality = format!("{:?}", h.modality).to_lowercase();
                    match h.reason.as_deref() {
                        Some(r) if r != health_reason::PROBE_SUCCEEDED => {
                            format!("{modality}={:?}({r})", h.state)
                        }
                        _ => format!("{modality}={:?}", h.state),
                    }
                })
                .collect();
            let _ = writeln!(out, "{:<32} health: {}", "", modalities.join(" "));
        }
    }
    let _ = writeln!(out, "\nROUTINGPOLICIES");
    let _ = writeln!(
        out,
        "{:<32} {:<6} WEIGHTS (provider=weight/availability)",
        "NAME", "READY"
    );
    for r in &doc.policies {
        let ready = cond(&r.status.conditions, condition::READY);
        let weights: Vec<String> = r
            .status
            .providers
            .iter()
            .map(|p| {
                if p.eligible {
                    format!("{}={:.3}/{:.3}", p.name, p.weight, p.availability)
                } else {
                    format!("{}=ineligible", p.name)
                }
            })
            .collect();
        let _ = writeln!(
            out,
            "{:<32} {:<6} {}",
            format!("{}/{}", r.namespace, r.name),
            ready.map_or("?", |c| c.status.as_str()),
            weights.join(" ")
        );
    }
    let _ = writeln!(out, "\nTENANTQUOTAS");
    let _ = writeln!(out, "{:<32} {:<6} STATUS", "NAME", "READY");
    for t in &doc.tenants {
        let ready = cond(&t.status.conditions, condition::READY);
        let _ = writeln!(
            out,
            "{:<32} {:<6} {}",
            format!("{}/{}", t.namespace, t.name),
            ready.map_or("?", |c| c.status.as_str()),
            ready.map_or("", |c| c.message.as_str())
        );
    }
    if !doc.messages.is_empty() {
        let _ = writeln!(out, "\nMESSAGES");
        for m in &doc.messages {
            let _ = writeln!(out, "  {m}");
        }
    }
    out
}

#[cfg(test)]
mod tests {
    use std::time::Duration;

    use switchyard_core::quota::{BucketSpec, Dimension, RateFigures, Rule, Scope};

    use super::limit_usage;

    fn bucket(key: &str, dimension: Dimension, rule: Rule) -> BucketSpec {
        BucketSpec {
            key: key.to_owned(),
            scope: Scope::Tenant("ns/t".to_owned()),
            dimension,
            rule,
            count_cached_input: true,
        }
    }

    #[test]
    fn fixed_window_usage_is_limit_minus_remaining_with_the_window_and_reset() {
        let b = bucket(
            "tenant/ns/t/daily",
            Dimension::InputTokens,
            Rule::FixedWindow {
                capacity: 1000,
                period: Duration::from_secs(86_400),
                reset_at: None,
                tz: chrono_tz::UTC,
            },
        );
        let u = limit_usage(
            "ns/t",
            &b,
            RateFigures {
                limit: 1000,
                remaining: 250,
                reset_after: Duration::from_millis(4_200),
            },
        );
        assert_eq!(u.limit, "daily");
        assert_eq!(u.dimension, "input_tokens");
        assert_eq!((u.used, u.amount, u.remaining), (750, 1000, 250));
        assert_eq!(u.window.as_deref(), Some("86400s"));
        assert_eq!(u.reset_after_seconds, 5, "rounded up");
    }

    #[test]
    fn concurrency_usage_has_no_window_and_a_bucket_in_debt_shows_all_used() {
        let c = bucket(
            "tenant/ns/t/0-concurrency",
            Dimension::Concurrency,
            Rule::Concurrency { limit: 4 },
        );
        let u = limit_usage(
            "ns/t",
            &c,
            RateFigures {
                limit: 4,
                remaining: 1,
                reset_after: Duration::ZERO,
            },
        );
        assert_eq!(u.limit, "0-concurrency");
        assert_eq!((u.used, u.remaining, u.window), (3, 1, None));
        assert_eq!(u.reset_after_seconds, 0);
        // In debt the store reports 0 remaining: everything is used, never more than the amount.
        let u = limit_usage(
            "ns/t",
            &c,
            RateFigures {
                limit: 4,
                remaining: 0,
                reset_after: Duration::ZERO,
            },
        );
        assert_eq!((u.used, u.amount), (4, 4));
    }
}
