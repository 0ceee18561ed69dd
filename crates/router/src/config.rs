//! The routing snapshot: validated manifests and resolved secrets turned into the immutable
//! [`RoutingTable`] that request handlers read (STYLE pattern 7). A config source (the
//! standalone folder watcher, or reflectors in Kubernetes mode) builds a new table and swaps it
//! in; handlers never lock shared configuration.

use std::collections::{BTreeMap, HashMap};
use std::sync::Arc;
use std::time::Duration;

use kube::ResourceExt;
use sha2::{Digest, Sha256};
use switchyard_api::duration;
use switchyard_api::loader::Manifests;
use switchyard_api::policy::{FallbackErrorClass, ServiceType, Strategy};
use switchyard_api::provider::{Modality, ProviderApi};
use switchyard_api::tenant::OverloadAction;
use switchyard_api::{LLMProvider, Limit, LimitDimension, RoutingPolicy, TenantQuota};
use switchyard_core::availability::ControllerConfig;
use switchyard_core::breaker::BreakerConfig;
use switchyard_core::classify::ErrorClass;
use switchyard_core::dispatch::{DEFAULT_CACHE_HOLD, DEFAULT_PAUSE_WAIT};
use switchyard_core::quota::{BucketSpec, Dimension, Scope};

use crate::upstream::{ProviderKind, UpstreamClient};
use crate::wire::usage::Pricing;

pub use switchyard_providers::secrets::{InMemorySecrets, SecretSource};

/// A model as served by one provider.
#[derive(Debug, Clone)]
pub struct ModelConfig {
    /// Name sent upstream.
    pub upstream: String,
    /// Modalities handled, as declared; empty when the manifest declares none (then the model
    /// is assumed to handle whatever its routes send it).
    pub modalities: Vec<Modality>,
    /// List prices, when declared.
    pub pricing: Option<Pricing>,
    /// `contextWindow`: input plus output tokens the model takes, when declared. Output caps
    /// are clamped to what it leaves after the input estimate ([`crate::broker::output_budget`]).
    pub context_window: Option<u64>,
}

/// One provider, ready to call.
#[derive(Debug)]
pub struct ProviderConfig {
    /// `namespace/name`, the key of runtime state that outlives reloads.
    pub key: String,
    /// Object name.
    pub name: String,
    /// Namespace.
    pub namespace: String,
    /// Declared wire protocol.
    pub api: ProviderApi,
    /// The adapter, when this build can speak the protocol and the credentials resolved;
    /// otherwise why not (the provider is then never a candidate and its status says so).
    pub client: Result<UpstreamClient, String>,
    /// Execution region.
    pub region: Option<String>,
    /// Every region a request may execute in (the region itself when none are listed).
    pub execution_regions: Vec<String>,
    /// Public model name → how it is served.
    pub models: HashMap<String, ModelConfig>,
    /// Pause scopes: the provider key, then `group:<namespace>/<quotaGroup>` per quota group.
    pub pause_scopes: Vec<String>,
    /// Circuit-breaker settings.
    pub breaker: BreakerConfig,
    /// Active health probes, when `healthCheck.enabled` (see [`switchyard_providers::probe::plan`]).
    pub probes: Option<Arc<switchyard_providers::probe::ProbePlan>>,
    /// Provider-side quota buckets: its own limits and its quota groups' (shared by key).
    pub buckets: Vec<Arc<BucketSpec>>,
    /// `spec.timeouts.firstToken`, when set: bounds the wait for first content on this
    /// provider (the shorter of it and the route's wins, see
    /// [`ProviderConfig::first_token_timeout`]).
    pub first_token: Option<Duration>,
    /// Metadata generation the config was built from.
    pub generation: Option<i64>,
}

impl ProviderConfig {
    /// How long an attempt on this provider waits for first content: the route's first-token
    /// timeout, shortened by the provider's own `spec.timeouts.firstToken` when that is
    /// shorter (a slow provider may not stretch a route's promise; a fast one may tighten it).
    pub fn first_token_timeout(&self, route: &Route) -> Duration {
        self.first_token.map_or(route.first_token_timeout, |p| {
            p.min(route.first_token_timeout)
        })
    }

    /// The dialect chat bodies for upstream model `model` must be in, when the provider is
    /// usable.
    pub fn kind(&self, model: &str) -> Option<ProviderKind> {
        self.client.as_ref().ok().map(|c| c.kind(model))
    }

    /// Whether every region the provider may execute in is within `allowed` (empty = any).
    pub fn within_regions(&self, allowed: &[String]) -> bool {
        allowed.is_empty()
            || (!self.execution_regions.is_empty()
                && self.execution_regions.iter().all(|r| allowed.contains(r)))
    }
}

/// One provider of a route, in priority order.
#[derive(Debug, Clone)]
pub struct RouteProvider {
    /// Index into [`RoutingTable::providers`].
    pub index: usize,
    /// Model name sent upstream.
    pub upstream_model: String,
    /// Modalities the provider's model declares (empty = not declared, no filtering).
    pub modalities: Vec<Modality>,
    /// Whether the provider may serve this route at all, and why not.
    pub ineligible: Option<String>,
}

/// One RoutingPolicy, resolved.
#[derive(Debug)]
pub struct Route {
    /// `namespace/name`.
    pub key: String,
    /// Object name.
    pub name: String,
    /// Namespace.
    pub namespace: String,
    /// Public model name.
    pub model: String,
    /// Kind of traffic.
    pub service_type: ServiceType,
    /// Balancing strategy.
    pub strategy: Strategy,
    /// Providers in priority order.
    pub providers: Vec<RouteProvider>,
    /// Provider names in priority order, as hashed by the rendezvous chain.
    pub provider_names: Vec<String>,
    /// Priority tiers and static weights of `providers` (`providers[].priority`, `.weight`),
    /// when the policy sets any; `None` keeps the plain list cascade and chain.
    pub tiers: Option<switchyard_core::weights::Tiers>,
    /// Header carrying the project key.
    pub affinity_header: String,
    /// How long a chain stays pinned.
    pub pin: Duration,
    /// Controller interval.
    pub interval: Duration,
    /// Controller settings.
    pub controller: ControllerConfig,
    /// Error classes that move a request down its chain.
    pub fallback_on: Vec<ErrorClass>,
    /// Attempts per request, the first included.
    pub max_attempts: u32,
    /// Same-provider retries after a Retry-After.
    pub same_provider_retries: u32,
    /// Spill-over throttle: (rate per second, burst).
    pub throttle: Option<(f64, u32)>,
    /// Time from sending to the first content.
    pub first_token_timeout: Duration,
    /// Deadline of one client request.
    pub deadline: Duration,
    /// Output tokens assumed when the request sets none.
    pub default_max_tokens: u32,
    /// Regions requests may execute in (empty = any).
    pub allowed_regions: Vec<String>,
    /// Route-wide quota buckets (every tenant's requests on this route share them).
    pub buckets: Vec<Arc<BucketSpec>>,
    /// Limits that could not be built (`spec.limits[i]: why`): while any is listed the
    /// route refuses its requests (503 `quota_config_invalid`) and status says why.
    pub limit_problems: Vec<String>,
    /// Whether parameters without an equivalent in the provider's dialect are dropped (and
    /// listed in a response header) instead of refused (RoutingPolicy `lossyTranslation`).
    pub lossy_translation: bool,
    /// The dispatch machine's settings, from the fields above plus `cacheHold` and
    /// `pauseWait`.
    pub dispatch: switchyard_core::dispatch::Policy,
    /// Metadata generation the config was built from.
    pub generation: Option<i64>,
}

/// A tenant's queue settings (TenantQuota `queue`); `max_depth` 0 means no queueing.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct QueueSettings {
    /// Most entries of this tenant waiting at once.
    pub max_depth: usize,
    /// Longest wait in the queue.
    pub deadline: Duration,
    /// Shed the oldest waiting entry instead of refusing the new one when full.
    pub shed_oldest: bool,
}

/// One tenant.
#[derive(Debug)]
pub struct Tenant {
    /// `namespace/name`.
    pub key: String,
    /// Object name.
    pub name: String,
    /// Route names this tenant may use (empty = all), including its ancestors' restrictions.
    pub allowed_routes: Vec<Vec<String>>,
    /// Region allow-lists of the tenant and its ancestors (each non-empty one applies).
    pub allowed_regions: Vec<Vec<String>>,
    /// Metadata generation the config was built from.
    pub generation: Option<i64>,
    /// Keys that did not resolve, with the reason (reported in status).
    pub key_problems: Vec<String>,
    /// Quota buckets of the tenant and every ancestor (DESIGN §4.7: the hierarchy is part of
    /// every reservation).
    pub buckets: Vec<Arc<BucketSpec>>,
    /// Limits of the tenant or an ancestor that could not be built: while any is listed the
    /// tenant's requests are refused (503 `quota_config_invalid`) and status says why.
    pub limit_problems: Vec<String>,
    /// Workload class (`interactive`, `production`, `batch`, ...).
    pub class: String,
    /// Fair-share weight within its class (≥ 1).
    pub weight: u32,
    /// Queue settings.
    pub queue: QueueSettings,
}

impl Tenant {
    /// Whether the tenant (and every ancestor) may use `route`.
    pub fn may_use(&self, route: &str) -> bool {
        self.allowed_routes
            .iter()
            .all(|list| list.is_empty() || list.iter().any(|r| r == route))
    }
}

/// The immutable routing snapshot.
#[derive(Debug, Default)]
pub struct RoutingTable {
    /// Providers.
    pub providers: Vec<Arc<ProviderConfig>>,
    /// Routes.
    pub routes: Vec<Arc<Route>>,
    /// Model name or alias → route index.
    pub by_model: HashMap<String, usize>,
    /// Tenants.
    pub tenants: Vec<Arc<Tenant>>,
    /// SHA-256 of an API key → tenant index. Keys themselves are not kept.
    pub by_key_hash: HashMap<[u8; 32], usize>,
    /// Problems found while building (shown by the standalone command and in status).
    pub warnings: Vec<String>,
    /// Revision of the configuration this table was built from, when the source has one
    /// (Kubernetes mode: a hash of the objects' uids and generations and of the referenced
    /// Secrets' resourceVersions), so replicas can be compared.
    pub revision: Option<String>,
    /// Whether anything configured needs a token estimate of each request: a token or spend
    /// bucket (a tenant's or ancestor's, a route's, a provider's or its quota groups'), a
    /// model's `contextWindow` (output caps are clamped to what the input leaves), or a tenant
    /// queue (its fair share is counted in tokens). When nothing does, requests are not
    /// tokenized and the tokenizer's vocabulary is never loaded (issue 16: pay only for what
    /// is configured); token usage then comes only from what providers report.
    pub needs_tokens: bool,
}

fn counts_tokens(b: &BucketSpec) -> bool {
    matches!(
        b.dimension,
        Dimension::InputTokens
            | Dimension::OutputTokens
            | Dimension::TotalTokens
            | Dimension::SpendMicroUsd
    )
}

/// SHA-256 of an API key, the only form in which keys are held.
pub fn key_hash(key: &str) -> [u8; 32] {
    Sha256::digest(key.as_bytes()).into()
}

fn class_of(c: FallbackErrorClass) -> Vec<ErrorClass> {
    match c {
        FallbackErrorClass::Capacity => vec![ErrorClass::Capacity],
        FallbackErrorClass::Overload => vec![ErrorClass::Overload],
        FallbackErrorClass::Timeout => vec![ErrorClass::Timeout, ErrorClass::Connect],
        FallbackErrorClass::Server => vec![ErrorClass::Server],
        FallbackErrorClass::Auth => vec![ErrorClass::Auth],
        FallbackErrorClass::Policy => vec![ErrorClass::Policy],
    }
}

/// A decimal USD amount (`"3"`, `"0.30"`, `"3.75"`) in micro-USD, exactly (no floats):
/// digits past the sixth decimal are dropped. `None` when the text is not a decimal.
pub fn usd_to_micro(text: &str) -> Option<u64> {
    let (whole, frac) = text.split_once('.').unwrap_or((text, ""));
    if whole.is_empty()
        || !whole.bytes().all(|b| b.is_ascii_digit())
        || !frac.bytes().all(|b| b.is_ascii_digit())
    {
        return None;
    }
    let mut micro = whole.parse::<u64>().ok()?.checked_mul(1_000_000)?;
    for (i, digit) in frac.bytes().take(6).enumerate() {
        let place = 10u64.pow(5 - u32::try_from(i).ok()?);
        micro = micro.checked_add(u64::from(digit - b'0') * place)?;
    }
    Some(micro)
}

fn pricing(p: &switchyard_api::provider::Pricing) -> Pricing {
    let input = usd_to_micro(&p.input_per_million).unwrap_or(0);
    Pricing {
        input,
        output: usd_to_micro(&p.output_per_million).unwrap_or(0),
        cache_read: p
            .cached_input_per_million
            .as_deref()
            .and_then(usd_to_micro)
            .unwrap_or(input),
        cache_write: p
            .cache_write_per_million
            .as_deref()
            .and_then(usd_to_micro)
            .unwrap_or(input),
    }
}

impl RoutingTable {
    /// Builds the snapshot from validated manifests, resolving secrets through `secrets`.
    ///
    /// Never fails: a provider whose credentials do not resolve, or whose API this build does
    /// not speak, stays in the table as ineligible with the reason (shown in status).
    pub fn build(m: &Manifests, secrets: &SecretSource) -> RoutingTable {
        let mut table = RoutingTable::default();
        let mut provider_index: HashMap<String, usize> = HashMap::new();
        for p in &m.providers {
            let config = build_provider(p, secrets);
            provider_index.insert(config.key.clone(), table.providers.len());
            table.providers.push(Arc::new(config));
        }
        for policy in &m.policies {
            let route = build_route(policy, &table.providers, &provider_index);
            let index = table.routes.len();
            for name in std::iter::once(&policy.spec.model).chain(&policy.spec.aliases) {
                if let Some(previous) = table.by_model.insert(name.clone(), index) {
                    table.warnings.push(format!(
                        "model {name:?} is claimed by RoutingPolicy {} and {}; the latter wins",
                        table.routes[previous].key, route.key
                    ));
                }
            }
            for problem in &route.limit_problems {
                table
                    .warnings
                    .push(format!("RoutingPolicy {}: {problem}", route.key));
            }
            table.routes.push(Arc::new(route));
        }
        let by_name: BTreeMap<(String, String), &TenantQuota> = m
            .tenants
            .iter()
            .map(|t| ((t.namespace().unwrap_or_default(), t.name_any()), t))
            .collect();
        for t in &m.tenants {
            let (tenant, keys) = build_tenant(t, &by_name, secrets);
            for problem in &tenant.limit_problems {
                table
                    .warnings
                    .push(format!("TenantQuota {}: {problem}", tenant.key));
            }
            for problem in &tenant.key_problems {
                table
                    .warnings
                    .push(format!("TenantQuota {}: {problem}", tenant.key));
            }
            let index = table.tenants.len();
            for key in keys {
                table.by_key_hash.insert(key_hash(&key), index);
            }
            table.tenants.push(Arc::new(tenant));
        }
        let spend_limited = table
            .tenants
            .iter()
            .flat_map(|t| &t.buckets)
            .chain(table.routes.iter().flat_map(|r| &r.buckets))
            .any(|b| b.dimension == Dimension::SpendMicroUsd);
        if spend_limited {
            for route in &table.routes {
                for rp in &route.providers {
                    let p = &table.providers[rp.index];
                    if p.models
                        .get(&route.model)
                        .is_some_and(|m| m.pricing.is_none())
                    {
                        table.warnings.push(format!(
                            "LLMProvider {} has no pricing for model {:?}: requests under a spend limit are never sent to it",
                            p.key, route.model
                        ));
                    }
                }
            }
        }
        table.needs_tokens = table
            .tenants
            .iter()
            .any(|t| t.queue.max_depth > 0 || t.buckets.iter().any(|b| counts_tokens(b)))
            || table
                .routes
                .iter()
                .any(|r| r.buckets.iter().any(|b| counts_tokens(b)))
            || table.providers.iter().any(|p| {
                p.buckets.iter().any(|b| counts_tokens(b))
                    || p.models.values().any(|m| m.context_window.is_some())
            });
        for p in &table.providers {
            if let Err(reason) = &p.client {
                table
                    .warnings
                    .push(format!("LLMProvider {} is not usable: {reason}", p.key));
            }
        }
        table
    }

    /// The route serving `model` (by name or alias).
    pub fn route(&self, model: &str) -> Option<&Arc<Route>> {
        self.by_model.get(model).and_then(|&i| self.routes.get(i))
    }

    /// The tenant owning `api_key`.
    pub fn tenant_for_key(&self, api_key: &str) -> Option<&Arc<Tenant>> {
        self.by_key_hash
            .get(&key_hash(api_key))
            .and_then(|&i| self.tenants.get(i))
    }
}

fn build_provider(p: &LLMProvider, secrets: &SecretSource) -> ProviderConfig {
    let namespace = p.namespace().unwrap_or_else(|| "default".to_owned());
    let name = p.name_any();
    let spec = &p.spec;
    let client = UpstreamClient::for_provider(spec, &namespace, secrets);
    let breaker = spec.circuit_breaker.clone().unwrap_or_default();
    let mut breaker_cfg = BreakerConfig::default();
    if let Some(n) = breaker.consecutive_failures {
        breaker_cfg.consecutive_failures = n;
    }
    if let Some(d) = breaker.cooldown.as_deref().and_then(duration::parse) {
        breaker_cfg.cooldown = d;
    }
    if let Some(d) = breaker.max_cooldown.as_deref().and_then(duration::parse) {
        breaker_cfg.max_cooldown = d;
    }
    if let Some(n) = breaker.half_open_trials {
        breaker_cfg.half_open_trials = n;
    }
    let key = format!("{namespace}/{name}");
    let mut buckets = Vec::new();
    let mut limit_problems = Vec::new();
    for (i, limit) in spec.limits.iter().enumerate() {
        let (bucket_key, scope) = match &limit.quota_group {
            Some(group) => (
                format!("group/{namespace}/{group}/{}", limit_id(limit, i)),
                Scope::QuotaGroup(format!("{namespace}/{group}")),
            ),
            None => (
                format!("provider/{key}/{}", limit_id(limit, i)),
                Scope::Provider(key.clone()),
            ),
        };
        match bucket_spec(limit, bucket_key, scope) {
            Ok(b) => buckets.push(Arc::new(b)),
            Err(e) => limit_problems.push(format!("spec.limits[{i}]: {e}")),
        }
    }
    // A limit that cannot be enforced makes the provider unusable (fail closed), with the
    // reason in status, rather than sending to it with the bucket left out.
    let client = if limit_problems.is_empty() {
        client
    } else {
        Err(format!(
            "a limit cannot be enforced: {}",
            limit_problems.join("; ")
        ))
    };
    let mut pause_scopes = vec![key.clone()];
    for group in spec.limits.iter().filter_map(|l| l.quota_group.as_ref()) {
        let scope = format!("group:{namespace}/{group}");
        if !pause_scopes.contains(&scope) {
            pause_scopes.push(scope);
        }
    }
    let execution_regions = if spec.execution_regions.is_empty() {
        spec.region.iter().cloned().collect()
    } else {
        spec.execution_regions.clone()
    };
    ProviderConfig {
        models: spec
            .models
            .iter()
            .map(|m| {
                (
                    m.name.clone(),
                    ModelConfig {
                        upstream: m.upstream_name.clone().unwrap_or_else(|| m.name.clone()),
                        modalities: m.modalities.clone(),
                        pricing: m.pricing.as_ref().map(pricing),
                        context_window: m.context_window.map(u64::from),
                    },
                )
            })
            .collect(),
        key,
        name,
        namespace,
        api: spec.api,
        client,
        region: spec.region.clone(),
        execution_regions,
        pause_scopes,
        breaker: breaker_cfg,
        probes: switchyard_providers::probe::plan(spec).map(Arc::new),
        buckets,
        first_token: spec
            .timeouts
            .as_ref()
            .and_then(|t| t.first_token.as_deref())
            .and_then(duration::parse),
        generation: p.metadata.generation,
    }
}

/// A limit's stable id within its resource: its name, else its position and dimension.
fn limit_id(limit: &Limit, index: usize) -> String {
    match &limit.name {
        Some(name) => name.clone(),
        None => format!("{index}-{}", dimension(limit.dimension).label()),
    }
}

fn dimension(d: LimitDimension) -> Dimension {
    d.into()
}

/// A CRD limit as a ledger bucket ([`Limit::bucket`], the verdict the loader shares), or why
/// it cannot be built: the object is then a configuration error (shown in status, its
/// requests refused), never served with the bucket left out.
pub fn bucket_spec(limit: &Limit, key: String, scope: Scope) -> Result<BucketSpec, String> {
    limit.bucket(key, scope)
}

fn build_route(
    policy: &RoutingPolicy,
    providers: &[Arc<ProviderConfig>],
    index: &HashMap<String, usize>,
) -> Route {
    let namespace = policy.namespace().unwrap_or_else(|| "default".to_owned());
    let name = policy.name_any();
    let spec = &policy.spec;
    let mut limit_problems = Vec::new();
    let mut buckets = Vec::new();
    for (i, l) in spec.limits.iter().enumerate() {
        match bucket_spec(
            l,
            format!("route/{namespace}/{name}/{}", limit_id(l, i)),
            Scope::Route(format!("{namespace}/{name}")),
        ) {
            Ok(b) => buckets.push(Arc::new(b)),
            Err(e) => limit_problems.push(format!("spec.limits[{i}]: {e}")),
        }
    }
    let fallback = spec.fallback.clone().unwrap_or_default();
    let affinity = spec.affinity.clone().unwrap_or_default();
    let availability = spec.availability.clone().unwrap_or_default();
    let controller = availability.controller_config();
    let mut route_providers = Vec::new();
    let mut provider_names = Vec::new();
    let mut tier_fields = Vec::new();
    for entry in &spec.providers {
        let key = format!("{namespace}/{}", entry.name);
        let model = entry.model.clone().unwrap_or_else(|| spec.model.clone());
        // The loader guarantees the reference resolves; a miss here means a hand-built table.
        let Some(&i) = index.get(&key) else { continue };
        let provider = &providers[i];
        let served = provider.models.get(&model);
        let ineligible = if let Err(reason) = &provider.client {
            Some(reason.clone())
        } else if served.is_none() {
            Some(format!("does not serve model {model:?}"))
        } else if !provider.within_regions(&spec.allowed_regions) {
            Some(format!(
                "execution regions {:?} are not all within the allowed regions {:?}",
                provider.execution_regions, spec.allowed_regions
            ))
        } else {
            None
        };
        route_providers.push(RouteProvider {
            index: i,
            modalities: served.map(|m| m.modalities.clone()).unwrap_or_default(),
            upstream_model: served.map_or(model, |m| m.upstream.clone()),
            ineligible,
        });
        provider_names.push(entry.name.clone());
        tier_fields.push((entry.priority, entry.weight));
    }
    // The CRD's CEL rules refuse invalid tiers before this; a hand-built table that gets here
    // anyway is refused like a limit that cannot be built, never served without its tiers.
    let names: Vec<&str> = provider_names.iter().map(String::as_str).collect();
    let (priority, weight): (Vec<_>, Vec<_>) = tier_fields.into_iter().unzip();
    let tiers = switchyard_core::weights::Tiers::from_spec(&names, &priority, &weight)
        .unwrap_or_else(|e| {
            limit_problems.push(format!("spec.providers: {e}"));
            None
        });
    let strategy = spec.strategy.unwrap_or(match spec.service_type {
        ServiceType::Chat | ServiceType::Transcription => Strategy::StickyChain,
        ServiceType::Embedding | ServiceType::Rerank => Strategy::PowerOfTwoChoices,
    });
    let fallback_on: Vec<ErrorClass> = if fallback.on.is_empty() {
        ErrorClass::ALL
            .into_iter()
            .filter(|c| c.retry_elsewhere())
            .collect()
    } else {
        fallback.on.iter().flat_map(|c| class_of(*c)).collect()
    };
    let max_attempts = fallback.max_attempts.unwrap_or(3).max(1);
    let same_provider_retries = fallback.same_provider_retries.unwrap_or(0);
    let deadline = duration::or(spec.deadline.as_deref(), Duration::from_secs(60));
    let dispatch = switchyard_core::dispatch::Policy {
        order: match strategy {
            Strategy::StickyChain => switchyard_core::dispatch::Order::StickyChain,
            Strategy::PowerOfTwoChoices => switchyard_core::dispatch::Order::PowerOfTwoChoices,
        },
        max_attempts,
        fallback_on: fallback_on.iter().copied().collect(),
        retry: switchyard_core::pause::RetryPolicy {
            same_provider_retries,
            ..switchyard_core::pause::RetryPolicy::default()
        },
        pause: switchyard_core::pause::PausePolicy::default(),
        deadline,
        cache_hold: Some(duration::or(
            affinity.cache_hold.as_deref(),
            DEFAULT_CACHE_HOLD,
        ))
        .filter(|d| !d.is_zero()),
        pause_wait: duration::or(fallback.pause_wait.as_deref(), DEFAULT_PAUSE_WAIT),
    };
    Route {
        key: format!("{namespace}/{name}"),
        name,
        namespace,
        model: spec.model.clone(),
        service_type: spec.service_type,
        strategy,
        providers: route_providers,
        provider_names,
        tiers,
        affinity_header: affinity
            .header
            .unwrap_or_else(|| "x-project-id".to_owned())
            .to_ascii_lowercase(),
        pin: duration::or(affinity.pin_duration.as_deref(), Duration::from_secs(300)),
        interval: availability.interval(),
        controller,
        fallback_on,
        max_attempts,
        same_provider_retries,
        throttle: fallback.throttle_per_second.map(|rate| {
            (
                f64::from(rate),
                fallback.throttle_burst.unwrap_or(rate).max(1),
            )
        }),
        first_token_timeout: duration::or(
            fallback.first_token_timeout.as_deref(),
            Duration::from_secs(30),
        ),
        deadline,
        default_max_tokens: spec.default_max_tokens.unwrap_or(4096),
        allowed_regions: spec.allowed_regions.clone(),
        buckets,
        limit_problems,
        lossy_translation: spec.lossy_translation.unwrap_or(false),
        dispatch,
        generation: policy.metadata.generation,
    }
}

fn build_tenant(
    t: &TenantQuota,
    by_name: &BTreeMap<(String, String), &TenantQuota>,
    secrets: &SecretSource,
) -> (Tenant, Vec<String>) {
    let namespace = t.namespace().unwrap_or_else(|| "default".to_owned());
    let name = t.name_any();
    let mut allowed_routes = Vec::new();
    let mut allowed_regions = Vec::new();
    let mut buckets = Vec::new();
    let mut limit_problems = Vec::new();
    let mut current = Some(t);
    let mut hops = 0;
    while let Some(node) = current {
        allowed_routes.push(node.spec.allowed_routes.clone());
        allowed_regions.push(node.spec.allowed_regions.clone());
        let node_key = format!("{namespace}/{}", node.name_any());
        for (i, l) in node.spec.limits.iter().enumerate() {
            match bucket_spec(
                l,
                format!("tenant/{node_key}/{}", limit_id(l, i)),
                Scope::Tenant(node_key.clone()),
            ) {
                Ok(b) => buckets.push(Arc::new(b)),
                Err(e) => {
                    limit_problems.push(format!("TenantQuota {node_key} spec.limits[{i}]: {e}"))
                }
            }
        }
        hops += 1;
        // The loader refuses cycles; the bound guards hand-built input.
        if hops > by_name.len() {
            break;
        }
        current = node
            .spec
            .parent
            .as_ref()
            .and_then(|p| by_name.get(&(namespace.clone(), p.clone())).copied());
    }
    let mut keys = Vec::new();
    let mut key_problems = Vec::new();
    for k in &t.spec.api_keys {
        match secrets.resolve_in(&namespace, &k.secret_ref) {
            Ok(v) if !v.is_empty() => keys.push(v),
            Ok(_) => key_problems.push(format!("API key {:?} is empty", k.name)),
            Err(e) => key_problems.push(format!("API key {:?}: {e}", k.name)),
        }
    }
    let tenant = Tenant {
        key: format!("{namespace}/{name}"),
        name,
        allowed_routes,
        allowed_regions: allowed_regions
            .into_iter()
            .filter(|r| !r.is_empty())
            .collect(),
        generation: t.metadata.generation,
        key_problems,
        limit_problems,
        buckets,
        class: t
            .spec
            .workload_class
            .clone()
            .unwrap_or_else(|| "production".to_owned()),
        weight: t.spec.weight.unwrap_or(1).max(1),
        queue: {
            let q = t.spec.queue.clone().unwrap_or_default();
            QueueSettings {
                max_depth: q.max_depth.unwrap_or(0) as usize,
                deadline: duration::or(q.deadline.as_deref(), Duration::from_secs(30)),
                shed_oldest: q.overload_action == Some(OverloadAction::ShedOldest),
            }
        },
    };
    (tenant, keys)
}

#[cfg(test)]
mod tests {
    use super::*;
    use switchyard_api::SecretKeyRef;

    #[test]
    fn usd_to_micro_decimals_exact() {
        assert_eq!(usd_to_micro("3"), Some(3_000_000));
        assert_eq!(usd_to_micro("0.30"), Some(300_000));
        assert_eq!(usd_to_micro("3.75"), Some(3_750_000));
        assert_eq!(usd_to_micro("0.0000015"), Some(1));
        assert_eq!(usd_to_micro("x"), None);
        assert_eq!(usd_to_micro(".5"), None);
    }

    #[test]
    fn secret_env_name_upper_snake() {
        let r = SecretKeyRef {
            name: "acme-keys".into(),
            key: "prod.key".into(),
        };
        assert_eq!(
            SecretSource::env_name(&r),
            "SWITCHYARD_SECRET_ACME_KEYS_PROD_KEY"
        );
    }

    /// Issue 16 item 1: requests are tokenized only when something configured counts tokens.
    #[test]
    fn token_estimates_only_when_a_limit_window_or_queue_needs_them() {
        let provider = |extra: serde_json::Value| -> LLMProvider {
            let mut spec = serde_json::json!({"api": "openai", "endpoint": "http://127.0.0.1:9",
                "models": [{"name": "m"}]});
            for (k, v) in extra.as_object().unwrap() {
                spec[k] = v.clone();
            }
            serde_json::from_value(serde_json::json!({
                "apiVersion": "switchyard.dev/v1alpha1", "kind": "LLMProvider",
                "metadata": {"name": "p", "namespace": "ns"}, "spec": spec}))
            .unwrap()
        };
        let tenant = |spec: serde_json::Value| -> TenantQuota {
            serde_json::from_value(serde_json::json!({
                "apiVersion": "switchyard.dev/v1alpha1", "kind": "TenantQuota",
                "metadata": {"name": "t", "namespace": "ns"}, "spec": spec}))
            .unwrap()
        };
        let needs = |providers: Vec<LLMProvider>, tenants: Vec<TenantQuota>| {
            let m = Manifests {
                providers,
                tenants,
                ..Default::default()
            };
            RoutingTable::build(&m, &SecretSource::default()).needs_tokens
        };
        let no_extra = serde_json::json!({});
        // Nothing, or only request and concurrency limits: no tokenizer.
        assert!(!needs(vec![provider(no_extra.clone())], vec![]));
        assert!(!needs(
            vec![provider(serde_json::json!({"limits": [
                {"dimension": "requests", "amount": 5, "period": "60s"}]}))],
            vec![tenant(serde_json::json!({"limits": [
                {"dimension": "requests", "amount": 5, "period": "60s"}]}))]
        ));
        // A token limit on the provider or the tenant, a context window, a tenant queue.
        assert!(needs(
            vec![provider(serde_json::json!({"limits": [
                {"dimension": "inputTokens", "amount": 5000, "period": "60s"}]}))],
            vec![]
        ));
        assert!(needs(
            vec![provider(no_extra.clone())],
            vec![tenant(serde_json::json!({"limits": [
                {"dimension": "outputTokens", "amount": 5000, "period": "60s"}]}))]
        ));
        assert!(needs(
            vec![provider(
                serde_json::json!({"models": [{"name": "m", "contextWindow": 8000}]})
            )],
            vec![]
        ));
        assert!(needs(
            vec![provider(no_extra)],
            vec![tenant(
                serde_json::json!({"queue": {"maxDepth": 10, "deadline": "5s"}})
            )]
        ));
    }

    /// Issue 12 item 8: objects that reach the router without the loader (Kubernetes mode,
    /// a CRD applied before the schema refused `0s`) with a limit that cannot be built are
    /// configuration errors for their object; no bucket is silently left out.
    #[test]
    fn unbuildable_limits_are_object_errors_not_dropped_buckets() {
        let m = Manifests {
            providers: vec![
                serde_json::from_value(serde_json::json!({
                    "apiVersion": "switchyard.dev/v1alpha1", "kind": "LLMProvider",
                    "metadata": {"name": "p", "namespace": "ns"},
                    "spec": {"api": "openai", "endpoint": "http://127.0.0.1:9",
                        "models": [{"name": "m"}],
                        "limits": [{"dimension": "requests", "amount": 5, "period": "0s"}]}
                }))
                .unwrap(),
            ],
            policies: vec![
                serde_json::from_value(serde_json::json!({
                    "apiVersion": "switchyard.dev/v1alpha1", "kind": "RoutingPolicy",
                    "metadata": {"name": "r", "namespace": "ns"},
                    "spec": {"model": "m", "providers": [{"name": "p"}],
                        "limits": [{"dimension": "requests", "amount": 5, "period": "0m0s"}]}
                }))
                .unwrap(),
            ],
            tenants: vec![
                serde_json::from_value(serde_json::json!({
                    "apiVersion": "switchyard.dev/v1alpha1", "kind": "TenantQuota",
                    "metadata": {"name": "t", "namespace": "ns"},
                    "spec": {"limits": [
                        {"dimension": "requests", "amount": 5, "period": "60s"},
                        {"dimension": "requests", "amount": 5, "period": "0s"}]}
                }))
                .unwrap(),
            ],
            ..Default::default()
        };
        let table = RoutingTable::build(&m, &SecretSource::default());
        let p = &table.providers[0];
        assert!(
            p.client
                .as_ref()
                .is_err_and(|e| e.contains("spec.limits[0]: period \"0s\" is zero")),
            "{:?}",
            p.client.as_ref().err()
        );
        let r = &table.routes[0];
        assert!(r.buckets.is_empty());
        assert_eq!(
            r.limit_problems,
            vec!["spec.limits[0]: period \"0m0s\" is zero".to_owned()]
        );
        let t = &table.tenants[0];
        assert_eq!(t.buckets.len(), 1, "the valid limit is built");
        assert_eq!(
            t.limit_problems,
            vec!["TenantQuota ns/t spec.limits[1]: period \"0s\" is zero".to_owned()]
        );
        assert!(
            table
                .warnings
                .iter()
                .any(|w| w.contains("TenantQuota ns/t") && w.contains("is zero")),
            "{:?}",
            table.warnings
        );
    }
}
