//! The operator's shared state and its two writers of status: the per-object sync (run by the
//! kind controllers on every change) and the control tick (run by the leader every interval).
//!
//! Both go through one pipeline (STYLE pattern 2): read the watch caches → validate the whole
//! world ([`crate::validate`]) → compute the object's wanted status ([`crate::status`]) →
//! apply it by server-side apply under the constant field manager `switchyard-operator`, only
//! when it differs from the stored one in more than timestamps, and only on the leader. Because
//! every write carries the object's *whole* status, the two writers never undo each other's
//! fields under the one field manager.

use std::collections::{BTreeMap, HashMap};
use std::fmt;
use std::sync::{Arc, Mutex, MutexGuard, PoisonError};
use std::time::Duration;

use chrono::{DateTime, Utc};
use kube::api::{Patch, PatchParams};
use kube::runtime::events::{Event, EventType, Recorder, Reporter};
use kube::runtime::reflector::Store;
use kube::{Api, Client, Resource, ResourceExt};
use serde::Serialize;
use serde::de::DeserializeOwned;
use serde_json::json;
use switchyard_api::common::{condition, field_manager, reason};
use switchyard_api::outcomes::OutcomeReport;
use switchyard_api::provider::ReplicaCounted;
use switchyard_api::tenant::LimitUsage;
use switchyard_api::{LLMProvider, RoutingPolicy, TenantQuota};

use crate::control::ControlState;
use crate::error::Error;
use crate::leader::Leadership;
use crate::metrics::{Metrics, ProviderLabel, ReplicaLabel, StateLabel};
use crate::outcomes::{Checkpoints, Collected, Collector, Targets, discover};
use crate::probes::Probes;
use crate::status::{
    availability_of, degraded_flag, key_of, needs_write, policy_status, provider_status,
    strip_timestamps, tenant_status,
};
use crate::tenants::{self, Book};
use crate::validate::{Judge, SecretAccess, SecretIndex, Verdicts, World};

/// Locks a mutex, recovering from poisoning: every critical section leaves its data whole.
pub(crate) fn lock<T>(m: &Mutex<T>) -> MutexGuard<'_, T> {
    m.lock().unwrap_or_else(PoisonError::into_inner)
}

/// Wall-clock source; injected so tests fix `lastTransitionTime` and tick times.
pub type Clock = Arc<dyn Fn() -> DateTime<Utc> + Send + Sync>;

/// The wall clock of a real process.
pub fn system_clock() -> Clock {
    // The process edge: status timestamps are wall-clock times by definition.
    Arc::new(Utc::now)
}

/// The watch caches of the three kinds.
#[derive(Debug, Clone)]
pub struct Stores {
    /// LLMProviders in scope.
    pub providers: Store<LLMProvider>,
    /// RoutingPolicies in scope.
    pub policies: Store<RoutingPolicy>,
    /// TenantQuotas in scope.
    pub tenants: Store<TenantQuota>,
}

/// What one status sync did.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Synced {
    /// The stored status already matched (timestamps aside); nothing was sent.
    Unchanged,
    /// A status patch was sent.
    Written,
    /// The status differs but this replica is not the leader; nothing was sent.
    NotLeader,
    /// The Secret cache has not completed its first list: nothing was computed or sent (the
    /// completed list re-syncs every object).
    Waiting,
}

impl Synced {
    fn label(self) -> &'static str {
        match self {
            Synced::Unchanged => "unchanged",
            Synced::Written => "written",
            Synced::NotLeader => "skipped_not_leader",
            Synced::Waiting => "skipped_secrets_syncing",
        }
    }
}

/// What one control tick did.
#[derive(Debug, Clone, Default)]
pub struct TickReport {
    /// Whether the tick ran (only the leader ticks).
    pub ran: bool,
    /// The collection round.
    pub collected: Collected,
    /// Statuses written.
    pub written: usize,
    /// Objects whose status write failed (they are retried next tick).
    pub failed: usize,
    /// Why replica discovery failed, when it did.
    pub discovery_error: Option<String>,
}

impl TickReport {
    /// Counts one status sync of the tick: written, or failed (logged; retried next tick).
    fn tally(&mut self, synced: Result<Synced, Error>) {
        match synced {
            Ok(Synced::Written) => self.written += 1,
            Ok(_) => {}
            Err(e) => {
                tracing::warn!(error = %e, "status write failed; retried next interval");
                self.failed += 1;
            }
        }
    }
}

/// Settings of an [`Operator`] besides its client and caches.
#[derive(Clone)]
pub struct Settings {
    /// Where the routers are.
    pub targets: Targets,
    /// Who leads.
    pub leadership: Leadership,
    /// Identity reported on Events (the pod name).
    pub identity: String,
    /// Wall clock.
    pub clock: Clock,
}

impl fmt::Debug for Settings {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Settings")
            .field("targets", &self.targets)
            .field("leadership", &self.leadership)
            .field("identity", &self.identity)
            .finish_non_exhaustive()
    }
}

/// Shared state of one operator process; the context of every reconcile.
pub struct Operator {
    client: Client,
    stores: Stores,
    settings: Settings,
    secrets: Mutex<SecretIndex>,
    judge: Mutex<Judge>,
    control: Mutex<ControlState>,
    collector: tokio::sync::Mutex<Collector>,
    recorder: Recorder,
    failures: Mutex<HashMap<String, u32>>,
    recent: Mutex<HashMap<String, (serde_json::Value, tokio::time::Instant)>>,
    probes: Probes,
    /// Per TenantQuota key: the counts and usage this leader computed last (ahead of its watch
    /// cache, which may not have seen the last write yet).
    tenant_books: Mutex<HashMap<String, (Book, Vec<LimitUsage>)>>,
    /// Metrics served on `/metrics`.
    pub metrics: Metrics,
}

impl fmt::Debug for Operator {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Operator")
            .field("settings", &self.settings)
            .finish_non_exhaustive()
    }
}

/// Longest wait before an object whose sync keeps failing is tried again.
pub const MAX_BACKOFF: Duration = Duration::from_secs(300);
/// How long a status this replica wrote counts as "in flight" to its own watch cache: within
/// it, a sync that computes the same status again does not write it again (the cache had not
/// seen the first write yet). Past it, a stored status that differs is overwritten, whoever
/// changed it.
pub const RECENT_WRITE: Duration = Duration::from_secs(10);
/// First wait after a failed sync; doubled per consecutive failure.
pub const FIRST_BACKOFF: Duration = Duration::from_secs(1);

impl Operator {
    /// An operator over `stores` (filled by the controllers' watches, or by a test).
    pub fn new(client: Client, stores: Stores, settings: Settings) -> Self {
        let recorder = Recorder::new(
            client.clone(),
            Reporter {
                controller: field_manager::OPERATOR.to_owned(),
                instance: Some(settings.identity.clone()),
            },
        );
        Operator {
            client,
            stores,
            settings,
            secrets: Mutex::new(SecretIndex::default()),
            judge: Mutex::new(crate::validate::judge()),
            control: Mutex::new(ControlState::new()),
            collector: tokio::sync::Mutex::new(Collector::new()),
            recorder,
            failures: Mutex::new(HashMap::new()),
            recent: Mutex::new(HashMap::new()),
            probes: Probes::new(false),
            tenant_books: Mutex::new(HashMap::new()),
            metrics: Metrics::new(),
        }
    }

    /// This operator with active health probes on (`true`) or off (the default of
    /// [`Operator::new`]; `--no-probes`). With probes on, the Secret values of the scope are
    /// kept in memory (to build the probes' upstream clients) and `status.health` of every
    /// provider with `healthCheck.enabled` is written from the probes' verdicts
    /// ([`crate::probes`]).
    #[must_use]
    pub fn with_probes(mut self, enabled: bool) -> Self {
        self.probes = Probes::new(enabled);
        self
    }

    /// Whether active health probes are on.
    pub fn probes_enabled(&self) -> bool {
        self.probes.enabled
    }

    /// Records (`Some`: data key → value) or forgets (`None`) the values of one Secret, for
    /// the probes' credentials. Ignored when probes are off (values are then never kept).
    pub fn set_secret_values(
        &self,
        namespace: &str,
        name: &str,
        data: Option<std::collections::BTreeMap<String, String>>,
    ) {
        self.probes.set_secret(namespace, name, data);
    }

    /// Replaces every Secret value at once, keyed by (namespace, name); as
    /// [`Self::set_secret_values`].
    pub fn reset_secret_values(
        &self,
        all: std::collections::BTreeMap<
            (String, String),
            std::collections::BTreeMap<String, String>,
        >,
    ) {
        self.probes.reset_secrets(all);
    }

    /// Runs the probe loop ([`switchyard_providers::probe::run`]) over the cached providers with
    /// `healthCheck.enabled`, on the leader only (a follower probes nothing and its board
    /// empties). Returns at once when probes are off; otherwise runs until dropped.
    pub async fn run_probes(&self) {
        if !self.probes.enabled {
            return;
        }
        switchyard_providers::probe::run(&self.probes.board, self.probes.clock, || {
            if self.settings.leadership.is_leader() {
                self.probes.jobs(&self.stores.providers.state())
            } else {
                Vec::new()
            }
        })
        .await;
    }

    /// Syncs the status of every provider that is probed (so verdict changes and due
    /// `lastProbeTime` refreshes are written between control ticks). Returns how many were
    /// written, and the shortest probe interval among them (`None`: no provider is probed).
    pub async fn sync_probed(&self) -> (usize, Option<Duration>) {
        if !self.probes.enabled || !self.settings.leadership.is_leader() {
            return (0, None);
        }
        let providers: Vec<_> = self
            .stores
            .providers
            .state()
            .into_iter()
            .filter_map(|p| Probes::interval_of(&p).map(|i| (p, i)))
            .collect();
        let shortest = providers.iter().map(|(_, i)| *i).min();
        if providers.is_empty() {
            return (0, None);
        }
        let verdicts = self.verdicts();
        let mut written = 0;
        for (p, _) in &providers {
            match self.sync_provider_with(p, &verdicts).await {
                Ok(Synced::Written) => written += 1,
                Ok(_) => {}
                Err(e) => tracing::warn!(error = %e, "health status write failed; retried shortly"),
            }
        }
        (written, shortest)
    }

    /// The watch caches.
    pub fn stores(&self) -> &Stores {
        &self.stores
    }

    /// Who leads.
    pub fn leadership(&self) -> &Leadership {
        &self.settings.leadership
    }

    /// Changes the Secret index with `f`; returns what `f` returns (whether it changed).
    pub fn update_secrets(&self, f: impl FnOnce(&mut SecretIndex) -> bool) -> bool {
        f(&mut lock(&self.secrets))
    }

    /// Forgets the control loop's state (on losing leadership; the next term resumes from
    /// the stored status and its `status.counted` checkpoints).
    pub async fn step_down(&self) {
        lock(&self.control).clear();
        lock(&self.recent).clear();
        lock(&self.tenant_books).clear();
        self.probes.clear();
        self.collector.lock().await.clear();
    }

    fn world(&self) -> World {
        World {
            providers: self.stores.providers.state(),
            policies: self.stores.policies.state(),
            tenants: self.stores.tenants.state(),
            secrets: lock(&self.secrets).clone(),
        }
    }

    fn verdicts(&self) -> Verdicts {
        let world = self.world();
        lock(&self.judge).judge(&world).verdicts
    }

    /// Whether the Secret cache has completed a list (or failed for good with a permission
    /// error, which the verdict reports): until then no status is written, so a Secret is
    /// never reported missing from a cache that has not been filled.
    pub fn secrets_known(&self) -> bool {
        !matches!(lock(&self.secrets).access(), SecretAccess::Syncing)
    }

    /// Computes and, when needed, writes the status of one LLMProvider.
    ///
    /// # Errors
    /// [`Error::WriteStatus`] when the patch fails.
    pub async fn sync_provider(&self, p: &LLMProvider) -> Result<Synced, Error> {
        let verdicts = self.verdicts();
        self.sync_provider_with(p, &verdicts).await
    }

    async fn sync_provider_with(
        &self,
        p: &LLMProvider,
        verdicts: &Verdicts,
    ) -> Result<Synced, Error> {
        if !self.secrets_known() {
            return Ok(Synced::Waiting);
        }
        let (ns, name) = names(p);
        let figures = lock(&self.control).figures(&key_of(p)).cloned();
        let now = (self.settings.clock)();
        let problems = verdicts.problems("LLMProvider", &ns, &name);
        let mut wanted = provider_status(p, problems, figures.as_ref(), now);
        let mut force = false;
        if self.probes.enabled {
            let stored = p.status.as_ref().map_or(&[][..], |s| s.health.as_slice());
            wanted.health = self.probes.health_of(p, stored);
            force = self.probes.refresh_due(p, stored, &wanted.health);
        }
        if let Some(a) = wanted.availability {
            self.metrics
                .availability
                .get_or_create(&ProviderLabel {
                    provider: key_of(p),
                })
                .set(a);
        }
        let flip = degraded_change(
            p.status.as_ref().map(|s| s.conditions.as_slice()),
            &wanted.conditions,
        );
        let body = serde_json::to_value(&wanted).unwrap_or_default();
        let synced = self
            .apply(p, p.status.as_ref(), &wanted, body, force)
            .await?;
        if synced == Synced::Written {
            self.probes.wrote(p, &wanted.health);
        }
        if synced == Synced::Written
            && let Some(low) = flip
        {
            self.publish_degraded(p, low, &wanted.conditions).await;
        }
        Ok(synced)
    }

    /// Computes and, when needed, writes the status of one RoutingPolicy.
    ///
    /// # Errors
    /// [`Error::WriteStatus`] when the patch fails.
    pub async fn sync_policy(&self, policy: &RoutingPolicy) -> Result<Synced, Error> {
        let verdicts = self.verdicts();
        self.sync_policy_with(policy, &verdicts).await
    }

    async fn sync_policy_with(
        &self,
        policy: &RoutingPolicy,
        verdicts: &Verdicts,
    ) -> Result<Synced, Error> {
        if !self.secrets_known() {
            return Ok(Synced::Waiting);
        }
        let (ns, name) = names(policy);
        let now = (self.settings.clock)();
        let providers = self.stores.providers.state();
        let (wanted, flip) = {
            let control = lock(&self.control);
            let availability = |key: &str| {
                providers
                    .iter()
                    .find(|p| key_of(&***p) == key)
                    .map_or(0.0, |p| availability_of(p, control.figures(key)))
            };
            let wanted = policy_status(
                policy,
                verdicts.problems("RoutingPolicy", &ns, &name),
                verdicts.entries(&ns, &name),
                availability,
                control.last_tick(),
                now,
            );
            let flip = degraded_change(
                policy.status.as_ref().map(|s| s.conditions.as_slice()),
                &wanted.conditions,
            );
            (wanted, flip)
        };
        let body = serde_json::to_value(&wanted).unwrap_or_default();
        let synced = self
            .apply(policy, policy.status.as_ref(), &wanted, body, false)
            .await?;
        if synced == Synced::Written
            && let Some(low) = flip
        {
            self.publish_degraded(policy, low, &wanted.conditions).await;
        }
        Ok(synced)
    }

    /// Computes and, when needed, writes the status of one TenantQuota: `Ready`,
    /// `observedGeneration`, and the fleet's `usage`, `throttled`, `rejected` and `counted`
    /// as the last control tick computed them ([`crate::tenants`]; the stored figures until
    /// this leader has ticked).
    ///
    /// # Errors
    /// [`Error::WriteStatus`] when the patch fails.
    pub async fn sync_tenant(&self, t: &TenantQuota) -> Result<Synced, Error> {
        if !self.secrets_known() {
            return Ok(Synced::Waiting);
        }
        let verdicts = self.verdicts();
        let (ns, name) = names(t);
        let now = (self.settings.clock)();
        let mut wanted = tenant_status(t, verdicts.problems("TenantQuota", &ns, &name), now);
        if let Some((book, usage)) = lock(&self.tenant_books).get(&format!("{ns}/{name}")) {
            wanted.throttled = book.throttled;
            wanted.rejected = book.rejected;
            wanted.counted = book.counted.clone();
            wanted.usage = usage.clone();
            wanted.last_update_time = Some(crate::status::time(now));
        }
        let body = serde_json::to_value(&wanted).unwrap_or_default();
        self.apply(t, t.status.as_ref(), &wanted, body, false).await
    }

    /// Takes this round's reports into every tenant's book (see [`crate::tenants`]).
    /// `discovered`: the replica list was read (not a failed EndpointSlice list). Only a
    /// round in which the list was read and every replica on it answered can tell that a
    /// replica is gone; with no report at all, the previous usage figures stay.
    fn count_tenants(&self, tenants: &[Arc<TenantQuota>], collected: &Collected, discovered: bool) {
        let reports: Vec<&OutcomeReport> = collected.reports.iter().collect();
        let complete = discovered && collected.unreachable.is_empty() && !reports.is_empty();
        let mut books = lock(&self.tenant_books);
        let mut next = HashMap::new();
        for t in tenants {
            let (ns, name) = names(&**t);
            let key = format!("{ns}/{name}");
            let stored = Book::from_status(t.status.as_ref());
            let (base, before) = books
                .get(&key)
                .map_or((&stored, None), |(b, u)| (b, Some(u)));
            let book = base.absorb(&key, &reports, complete);
            let usage = if reports.is_empty() {
                before.cloned().unwrap_or_else(|| {
                    t.status
                        .as_ref()
                        .map(|s| s.usage.clone())
                        .unwrap_or_default()
                })
            } else {
                tenants::fleet_usage(&key, &reports)
            };
            next.insert(key, (book, usage));
        }
        *books = next;
    }

    async fn apply<K, S>(
        &self,
        obj: &K,
        current: Option<&S>,
        wanted: &S,
        body: serde_json::Value,
        force: bool,
    ) -> Result<Synced, Error>
    where
        K: Resource<DynamicType = (), Scope = kube::core::NamespaceResourceScope>
            + Clone
            + DeserializeOwned
            + fmt::Debug,
        S: Serialize,
    {
        let kind = K::kind(&()).into_owned();
        let (ns, name) = names(obj);
        let object = format!("{kind} {ns}/{name}");
        let mut stripped = serde_json::to_value(wanted).unwrap_or_default();
        strip_timestamps(&mut stripped);
        let just_written = lock(&self.recent)
            .get(&object)
            .is_some_and(|(v, at)| *v == stripped && at.elapsed() < RECENT_WRITE);
        // `force`: a write due for its timestamps alone (health `lastProbeTime` refresh).
        let synced = if !force && (!needs_write(current, wanted) || just_written) {
            Synced::Unchanged
        } else if !self.settings.leadership.is_leader() {
            Synced::NotLeader
        } else {
            let api: Api<K> = Api::namespaced(self.client.clone(), &ns);
            let patch = json!({
                "apiVersion": K::api_version(&()),
                "kind": kind,
                "status": body,
            });
            let params = PatchParams::apply(field_manager::OPERATOR).force();
            if let Err(source) = api
                .patch_status(&name, &params, &Patch::Apply(&patch))
                .await
            {
                self.metrics.sync(&kind, "write_failed");
                return Err(Error::WriteStatus { object, source });
            }
            tracing::debug!(kind = %kind, namespace = %ns, name = %name, "status written");
            lock(&self.recent).insert(object, (stripped, tokio::time::Instant::now()));
            Synced::Written
        };
        self.metrics.sync(&kind, synced.label());
        Ok(synced)
    }

    async fn publish_degraded<K>(
        &self,
        obj: &K,
        low: bool,
        conditions: &[k8s_openapi::apimachinery::pkg::apis::meta::v1::Condition],
    ) where
        K: Resource<DynamicType = ()>,
    {
        let note = conditions
            .iter()
            .find(|c| c.type_ == condition::DEGRADED)
            .map(|c| c.message.clone());
        let event = Event {
            type_: if low {
                EventType::Warning
            } else {
                EventType::Normal
            },
            reason: if low {
                reason::LOW_AVAILABILITY
            } else {
                reason::RECOVERED
            }
            .to_owned(),
            note,
            action: "ComputeAvailability".to_owned(),
            secondary: None,
        };
        if let Err(e) = self.recorder.publish(&event, &obj.object_ref(&())).await {
            let (ns, name) = names(obj);
            tracing::warn!(namespace = %ns, name = %name, error = %e, "failed to publish a Degraded event");
        }
    }

    /// Backoff before retrying a failed sync of `key`, doubling per consecutive failure.
    pub fn backoff(&self, key: &str) -> Duration {
        let mut failures = lock(&self.failures);
        let n = failures.entry(key.to_owned()).or_insert(0);
        *n = n.saturating_add(1);
        let factor = 1u32
            .checked_shl(n.saturating_sub(1).min(16))
            .unwrap_or(u32::MAX);
        FIRST_BACKOFF.saturating_mul(factor).min(MAX_BACKOFF)
    }

    /// Clears the failure count of `key` after a good sync.
    pub fn succeeded(&self, key: &str) {
        lock(&self.failures).remove(key);
    }

    /// One control tick (leader only): discover and scrape the routers, step every provider's
    /// availability controller, and sync the status of every provider and policy.
    pub async fn tick(&self) -> TickReport {
        if !self.settings.leadership.is_leader() {
            return TickReport::default();
        }
        let now = (self.settings.clock)();
        let mut report = TickReport {
            ran: true,
            ..TickReport::default()
        };
        let addresses = match discover(&self.client, &self.settings.targets).await {
            Ok(a) => a,
            Err(e) => {
                tracing::warn!(error = %e, "failed to list router endpoints; no outcomes this interval");
                report.discovery_error = Some(e.to_string());
                Vec::new()
            }
        };
        let providers = self.stores.providers.state();
        let checkpoints = checkpoints(&providers);
        let mut collector = self.collector.lock().await;
        let collected = collector.collect(&addresses, &checkpoints).await;
        for address in collected.unreachable.keys() {
            self.metrics
                .scrape_failures
                .get_or_create(&ReplicaLabel {
                    replica: address.clone(),
                })
                .inc();
        }
        let reachable = i64::try_from(collected.scraped.len()).unwrap_or(i64::MAX);
        let unreachable = i64::try_from(collected.unreachable.len()).unwrap_or(i64::MAX);
        self.metrics
            .replicas
            .get_or_create(&StateLabel {
                state: "reachable".to_owned(),
            })
            .set(reachable);
        self.metrics
            .replicas
            .get_or_create(&StateLabel {
                state: "unreachable".to_owned(),
            })
            .set(unreachable);
        let policies = self.stores.policies.state();
        lock(&self.control).step(
            &providers,
            &policies,
            &collected.providers,
            |key| collector.counted(key),
            now,
        );
        drop(collector);
        self.metrics.ticks.inc();
        let verdicts = self.verdicts();
        for p in &providers {
            report.tally(self.sync_provider_with(p, &verdicts).await);
        }
        for policy in &policies {
            report.tally(self.sync_policy_with(policy, &verdicts).await);
        }
        let tenants = self.stores.tenants.state();
        self.count_tenants(&tenants, &collected, report.discovery_error.is_none());
        for t in &tenants {
            report.tally(self.sync_tenant(t).await);
        }
        tracing::debug!(
            replicas = collected.scraped.len(),
            unreachable = collected.unreachable.len(),
            written = report.written,
            "control tick"
        );
        report.collected = collected;
        report
    }
}

/// The `status.counted` of every provider, by provider key and replica name.
fn checkpoints(providers: &[Arc<LLMProvider>]) -> Checkpoints {
    providers
        .iter()
        .filter_map(|p| {
            let status = p.status.as_ref()?;
            let mut by_replica: BTreeMap<String, Vec<ReplicaCounted>> = BTreeMap::new();
            for c in &status.counted {
                by_replica
                    .entry(c.replica.clone())
                    .or_default()
                    .push(c.clone());
            }
            Some((key_of(&**p), by_replica))
        })
        .collect()
}

fn names<K: Resource>(o: &K) -> (String, String) {
    (
        o.namespace().unwrap_or_else(|| "default".to_owned()),
        o.name_any(),
    )
}

/// `Some(new flag)` when `Degraded` flips between the stored and the wanted conditions; a
/// first status that is not degraded is no transition.
fn degraded_change(
    current: Option<&[k8s_openapi::apimachinery::pkg::apis::meta::v1::Condition]>,
    wanted: &[k8s_openapi::apimachinery::pkg::apis::meta::v1::Condition],
) -> Option<bool> {
    let before = current.and_then(degraded_flag).unwrap_or(false);
    let after = degraded_flag(wanted)?;
    (before != after).then_some(after)
}
