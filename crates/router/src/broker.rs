//! The rate-limit broker in the request path (DESIGN §3 steps 2, 3, 6, 8 and §4.7; seed 001,
//! "provider-neutral rate-limit broker").
//!
//! The decisions live in `switchyard-core` ([`switchyard_core::quota`] for buckets and
//! reservations, [`switchyard_core::queue`] for the waiting room); the store
//! ([`switchyard_store::QuotaStore`], in-process or Redis) holds the bucket levels. This module
//! joins them to a request:
//!
//! - **Buckets of an attempt**: the tenant's and every ancestor's, the route's, and the chosen
//!   provider's own and its quota groups'. One reservation per attempt debits all of them or
//!   none. A refusal by a provider-side bucket means "skip this provider" (spill down the
//!   chain, nothing sent); a refusal by a tenant or route bucket stops the request.
//! - **Demand**: the estimate (tokenizer input, output allowance, worst-case spend at the
//!   provider's list prices), see [`demand`].
//! - **Settlement**: success reconciles with the reported usage (credit back or charge the
//!   overrun); a failed attempt is cancelled (the caller is not charged for a provider's
//!   refusal); a client abort releases with what was really used. The store's ticket releases
//!   itself if dropped, so no exit path keeps a concurrency slot.
//! - **Waiting room**: a request that found no room anywhere waits, when its tenant allows a
//!   queue, in its workload class; deficit round robin across tenants by weight decides who is
//!   woken when capacity may have freed (a settle on this replica, or the wait the binding
//!   bucket named). A woken request reserves again itself; if it still finds no room it waits
//!   again, keeping its deadline.

use std::collections::{HashMap, VecDeque};
use std::sync::Arc;
use std::sync::Mutex;
use std::time::Duration;

use switchyard_core::queue::{ClassConfig, Entry, EntryId, QueueReason, WaitingRoom};
use switchyard_core::quota::{BucketSpec, Demand, Dimension, Refusal, Rule, Usage};
use switchyard_store::{QuotaStore, Ticket};
use tokio::sync::{Notify, oneshot};

use crate::clock::Clock;
use crate::config::{ProviderConfig, Route, Tenant};
use crate::state::lock;
use crate::wire::usage::{NormalizedUsage, Pricing, cost_micro_usd};

/// How long past the request deadline a reservation may stay unsettled before the store
/// expires it (a crashed task, a lost settle).
const RESERVATION_GRACE: Duration = Duration::from_secs(30);

/// When the waiting room has entries and no known refill time, how often it is re-offered
/// capacity even if nothing settled here (other replicas free shared capacity). Each such
/// offer that finds no room costs the woken entry its place, so it is kept rare.
const QUEUE_POLL: Duration = Duration::from_secs(1);

/// DRR quantum in estimated tokens per unit of weight. Small against a typical request (a
/// few thousand tokens with its output allowance), so tenants interleave request by request
/// instead of one draining many small requests per turn; empty rounds are skipped in one step.
const DRR_QUANTUM: u64 = 256;

/// The broker: the quota store and the waiting room of one router process.
#[derive(Debug)]
pub struct Broker {
    store: QuotaStore,
    room: Mutex<Room>,
    freed: Notify,
    /// Settles since the pump last looked: each may have freed room for one waiting entry.
    freed_count: std::sync::atomic::AtomicUsize,
    /// Throttled and rejected requests per tenant key (`namespace/name`), since start.
    tenant_counts: Mutex<HashMap<String, TenantCounts>>,
}

/// What the broker did to one tenant's requests since this process started (status
/// `throttled` / `rejected`, issue 17 item 5).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct TenantCounts {
    /// Requests that waited in the tenant's queue (served or not in the end).
    pub throttled: u64,
    /// Requests refused because of the tenant: a tenant or API-key bucket (its own or an
    /// ancestor's) had no room, or its queue was full or its deadline passed.
    pub rejected: u64,
}

#[derive(Debug)]
struct Room {
    queue: WaitingRoom<oneshot::Sender<()>>,
    /// Waiting entries per tenant, oldest first (for shedding the tenant's oldest).
    by_tenant: HashMap<String, VecDeque<EntryId>>,
    /// The earliest moment a waiting entry's binding bucket refills by itself.
    next_refill: Option<switchyard_core::time::Instant>,
}

impl Broker {
    /// A broker over `store`, with the default workload classes (`interactive`, `production`,
    /// `batch`) and a DRR quantum of 256 tokens per unit of weight.
    pub fn new(store: QuotaStore) -> Arc<Broker> {
        Arc::new(Broker {
            store,
            room: Mutex::new(Room {
                queue: WaitingRoom::new(
                    ClassConfig::defaults()
                        .into_iter()
                        .map(|c| ClassConfig {
                            quantum: DRR_QUANTUM,
                            ..c
                        })
                        .collect(),
                ),
                by_tenant: HashMap::new(),
                next_refill: None,
            }),
            freed: Notify::new(),
            freed_count: std::sync::atomic::AtomicUsize::new(0),
            tenant_counts: Mutex::new(HashMap::new()),
        })
    }

    /// Counts one request of `tenant` (its key) that waited in a queue and/or was rejected
    /// because of the tenant. Keys come from the configuration, so the map stays bounded by
    /// the number of TenantQuotas (a removed tenant's entry stays until restart).
    pub fn note_tenant(&self, tenant: &str, throttled: bool, rejected: bool) {
        if !throttled && !rejected {
            return;
        }
        let mut counts = lock(&self.tenant_counts);
        let c = match counts.get_mut(tenant) {
            Some(c) => c,
            None => counts.entry(tenant.to_owned()).or_default(),
        };
        c.throttled += u64::from(throttled);
        c.rejected += u64::from(rejected);
    }

    /// The counts of `tenant` (zero when nothing happened to it).
    pub fn tenant_counts(&self, tenant: &str) -> TenantCounts {
        lock(&self.tenant_counts)
            .get(tenant)
            .copied()
            .unwrap_or_default()
    }

    /// The store.
    pub fn store(&self) -> &QuotaStore {
        &self.store
    }

    /// The buckets one attempt reserves: tenant (+ ancestors), route, provider (+ groups).
    pub fn buckets(
        tenant: Option<&Tenant>,
        route: &Route,
        provider: &ProviderConfig,
    ) -> Vec<Arc<BucketSpec>> {
        let mut all: Vec<Arc<BucketSpec>> = Vec::new();
        if let Some(t) = tenant {
            all.extend(t.buckets.iter().cloned());
        }
        all.extend(route.buckets.iter().cloned());
        all.extend(provider.buckets.iter().cloned());
        all
    }

    /// Reserves `demand` on `buckets` (all or none) for at most the request deadline plus a
    /// grace period.
    ///
    /// # Errors
    /// The binding bucket's [`Refusal`].
    pub async fn reserve(
        &self,
        buckets: &[Arc<BucketSpec>],
        demand: Demand,
        deadline: Duration,
    ) -> Result<Ticket, Box<Refusal>> {
        self.store
            .reserve(buckets, demand, deadline + RESERVATION_GRACE)
            .await
    }

    /// Settles a served attempt with the usage the provider reported (or the estimate that
    /// stands in for it), priced at `pricing`.
    pub fn reconcile(self: &Arc<Self>, ticket: Ticket, usage: &NormalizedUsage, pricing: Pricing) {
        let usage = ledger_usage(usage, pricing);
        let me = self.clone();
        settle_now_or_later(async move {
            me.store.reconcile(ticket, usage).await;
            me.capacity_freed();
        });
    }

    /// Settles an attempt that failed before the provider did work for us: every unit is
    /// credited back.
    pub fn cancel(self: &Arc<Self>, ticket: Ticket) {
        let me = self.clone();
        settle_now_or_later(async move {
            me.store.cancel(ticket).await;
            me.capacity_freed();
        });
    }

    /// Settles an attempt the client abandoned: charges what was really used (field case 17).
    pub fn release(self: &Arc<Self>, ticket: Ticket, usage: &NormalizedUsage, pricing: Pricing) {
        let usage = ledger_usage(usage, pricing);
        let me = self.clone();
        settle_now_or_later(async move {
            me.store.release(ticket, Some(usage)).await;
            me.capacity_freed();
        });
    }

    /// Whether any request is waiting. While one is, newcomers that may queue join the queue
    /// instead of taking freed capacity first, so the DRR order decides who gets it.
    pub fn has_waiting(&self) -> bool {
        !lock(&self.room).queue.is_empty()
    }

    /// Capacity may have freed: wake the next waiting entry in DRR order.
    pub fn capacity_freed(&self) {
        self.freed_count
            .fetch_add(1, std::sync::atomic::Ordering::Relaxed);
        self.freed.notify_one();
    }

    /// Waits in the tenant's workload class until capacity may have freed for it.
    ///
    /// Returns `Ok(())` when woken: the caller reserves again (and waits again if it still
    /// finds no room). Otherwise the queue's reason:
    /// `queue_full` at once when the tenant allows no queue or its queue is full,
    /// `queue_deadline` when `deadline` passes first.
    ///
    /// # Errors
    /// The [`QueueReason`] of a refused or expired wait.
    pub async fn wait_turn(
        &self,
        clock: &Clock,
        tenant: &Tenant,
        cost: u64,
        deadline: switchyard_core::time::Instant,
        refill_after: Option<Duration>,
    ) -> Result<(), QueueReason> {
        if tenant.queue.max_depth == 0 {
            return Err(QueueReason::QueueFull);
        }
        let now = clock.now();
        if deadline <= now {
            return Err(QueueReason::QueueDeadline);
        }
        let (tx, rx) = oneshot::channel();
        let id = {
            let mut room = lock(&self.room);
            let waiting = room.by_tenant.get(&tenant.key).map_or(0, VecDeque::len);
            if waiting >= tenant.queue.max_depth {
                if !tenant.queue.shed_oldest {
                    return Err(QueueReason::QueueFull);
                }
                // Dropping the oldest entry's sender answers it `queue_full`.
                let oldest = room
                    .by_tenant
                    .get_mut(&tenant.key)
                    .and_then(VecDeque::pop_front);
                if let Some(old) = oldest {
                    room.queue.remove(old);
                }
            }
            let entry = Entry {
                class: tenant.class.clone(),
                tenant: tenant.key.clone(),
                weight: tenant.weight,
                cost: cost.max(1),
                deadline,
                payload: tx,
            };
            let pushed = match room.queue.push(entry, now) {
                Ok(p) => p,
                Err(refusal) => {
                    // An unconfigured class falls back to `production` rather than failing.
                    if refusal.reason != QueueReason::UnknownClass {
                        return Err(refusal.reason);
                    }
                    let mut entry = refusal.entry;
                    entry.class = "production".to_owned();
                    room.queue.push(entry, now).map_err(|r| r.reason)?
                }
            };
            if let Some(shed) = pushed.shed {
                forget(&mut room, &shed.entry.tenant, shed.id);
            }
            room.by_tenant
                .entry(tenant.key.clone())
                .or_default()
                .push_back(pushed.id);
            if let Some(wait) = refill_after {
                let at = now + wait;
                room.next_refill = Some(room.next_refill.map_or(at, |t| t.min(at)));
                self.freed.notify_one();
            }
            pushed.id
        };
        // If the client goes away while waiting, this future is dropped: the guard takes the
        // entry out at once, so it neither blocks its tenant's queue nor counts toward its depth.
        let mut waiting = Waiting {
            broker: self,
            tenant: &tenant.key,
            id,
            done: false,
        };
        let until = clock.to_tokio(deadline);
        let outcome = tokio::time::timeout_at(until, rx).await;
        waiting.done = true;
        let mut room = lock(&self.room);
        match outcome {
            Ok(Ok(())) => Ok(()),
            Ok(Err(_)) => {
                forget(&mut room, &tenant.key, id);
                Err(QueueReason::QueueFull)
            }
            Err(_) => {
                room.queue.remove(id);
                forget(&mut room, &tenant.key, id);
                Err(QueueReason::QueueDeadline)
            }
        }
    }

    /// The pump: wakes waiting entries in class priority and DRR order, one per settle seen
    /// here (each may have freed room for one), one when a waiting entry's bucket refills by
    /// itself, and one every [`QUEUE_POLL`] while entries wait (capacity freed elsewhere). The
    /// woken request reserves again itself. Runs until the process ends.
    pub async fn run_pump(self: Arc<Self>, clock: Clock) {
        use std::sync::atomic::Ordering;
        loop {
            let (waiting, refill) = {
                let room = lock(&self.room);
                (!room.queue.is_empty(), room.next_refill)
            };
            let mut offers = 0usize;
            if waiting {
                let poll = clock.now() + QUEUE_POLL;
                let until = refill.map_or(poll, |r| r.min(poll));
                let timed_out =
                    tokio::time::timeout_at(clock.to_tokio(until), self.freed.notified())
                        .await
                        .is_err();
                if timed_out {
                    offers = 1;
                }
            } else {
                self.freed.notified().await;
            }
            offers += self.freed_count.swap(0, Ordering::Relaxed);
            let now = clock.now();
            let mut room = lock(&self.room);
            if room.next_refill.is_some_and(|r| r <= now) {
                room.next_refill = None;
                offers = offers.max(1);
            }
            for gone in room.queue.expire(now) {
                // Dropping the sender lets the waiter's own timer answer `queue_deadline`.
                forget(&mut room, &gone.entry.tenant, gone.id);
            }
            // Offer heads in DRR order; each offer wakes one waiter that is still there (an
            // entry whose waiter left is popped and skipped, never left blocking its tenant).
            while offers > 0 {
                let Some(q) = room.queue.pop_ready(now, |_| true) else {
                    break;
                };
                forget(&mut room, &q.entry.tenant, q.id);
                if q.entry.payload.send(()).is_ok() {
                    offers -= 1;
                }
            }
        }
    }
}

/// The quota store a router starts with: in process, or Redis when `redis` is set.
///
/// An unreachable Redis at start is retried every 2 s (logged each time) rather than ending
/// the process: in Kubernetes a router that exits on a Redis outage would crash-loop, and one
/// that silently started on local buckets would multiply every limit by the replica count
/// without saying so. A running router that loses Redis falls back to its local share instead
/// (see `switchyard_store`). An invalid URL is an error at once.
///
/// # Errors
/// [`switchyard_store::StoreError::Url`] for a URL that does not parse.
pub async fn connect_store(
    redis: Option<&switchyard_store::RedisOptions>,
) -> Result<QuotaStore, switchyard_store::StoreError> {
    let Some(opts) = redis else {
        return Ok(QuotaStore::in_process());
    };
    loop {
        match QuotaStore::redis(opts.clone()).await {
            Ok(store) => return Ok(store),
            Err(e @ switchyard_store::StoreError::Url(_)) => return Err(e),
            Err(e) => {
                tracing::warn!(error = %e, "quota store: Redis unreachable at start; retrying in 2 s");
                tokio::time::sleep(Duration::from_secs(2)).await;
            }
        }
    }
}

/// Whether a Redis restart that loses this bucket's state matters beyond a short while: spend
/// limits (money already spent would be forgotten) and windows or refill periods of an hour or
/// more (a daily cap would reopen in full). Minute-scale buckets refill within their period
/// anyway, and concurrency slots are rebuilt by the live calls' lease renewals.
pub fn needs_persistence(b: &BucketSpec) -> bool {
    const LONG: Duration = Duration::from_secs(3600);
    if b.dimension == Dimension::SpendMicroUsd {
        return true;
    }
    match b.rule {
        Rule::TokenBucket { period, .. } | Rule::FixedWindow { period, .. } => period >= LONG,
        Rule::Concurrency { .. } => false,
    }
}

/// One provider-reported figure: `remaining` units of `dimension` and, when reported, the time
/// until the provider's bucket is full again or its window resets.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct ReportedLimit {
    /// Which dimension the header speaks for.
    pub dimension: Dimension,
    /// Units left.
    pub remaining: u64,
    /// Until reset, when the header gives it.
    pub reset_after: Option<Duration>,
    /// The provider's own limit for this dimension, when the header gives it.
    pub limit: Option<u64>,
}

/// Reads the provider's rate-limit headers (DESIGN §3 step 8):
/// `x-ratelimit-remaining-{requests,tokens}` with `x-ratelimit-reset-*` as Go durations
/// (OpenAI and compatible; "tokens" counts input + output) and
/// `anthropic-ratelimit-{requests,tokens,input-tokens,output-tokens}-remaining` with
/// `-reset` as RFC 3339 instants (Anthropic). Headers that do not parse are ignored.
pub fn reported_limits(
    headers: &http::HeaderMap,
    wall: chrono::DateTime<chrono::Utc>,
) -> Vec<ReportedLimit> {
    let text = |name: &str| headers.get(name).and_then(|v| v.to_str().ok());
    let mut out = Vec::new();
    for (suffix, dimension) in [
        ("requests", Dimension::Requests),
        ("tokens", Dimension::TotalTokens),
    ] {
        if let Some(remaining) =
            text(&format!("x-ratelimit-remaining-{suffix}")).and_then(|v| v.trim().parse().ok())
        {
            let reset_after = text(&format!("x-ratelimit-reset-{suffix}"))
                .and_then(|v| switchyard_core::retry_after::parse_go_duration(v.trim()));
            let limit =
                text(&format!("x-ratelimit-limit-{suffix}")).and_then(|v| v.trim().parse().ok());
            out.push(ReportedLimit {
                dimension,
                remaining,
                reset_after,
                limit,
            });
        }
    }
    for (dim, dimension) in [
        ("requests", Dimension::Requests),
        ("tokens", Dimension::TotalTokens),
        ("input-tokens", Dimension::InputTokens),
        ("output-tokens", Dimension::OutputTokens),
    ] {
        if let Some(remaining) = text(&format!("anthropic-ratelimit-{dim}-remaining"))
            .and_then(|v| v.trim().parse().ok())
        {
            let reset_after = text(&format!("anthropic-ratelimit-{dim}-reset"))
                .and_then(|v| chrono::DateTime::parse_from_rfc3339(v.trim()).ok())
                .and_then(|at| (at.with_timezone(&chrono::Utc) - wall).to_std().ok());
            let limit = text(&format!("anthropic-ratelimit-{dim}-limit"))
                .and_then(|v| v.trim().parse().ok());
            out.push(ReportedLimit {
                dimension,
                remaining,
                reset_after,
                limit,
            });
        }
    }
    out
}

impl Broker {
    /// Lowers the provider's own buckets to what its headers report (never raises them), off
    /// the response path. Only provider and quota-group buckets of a reported dimension are
    /// touched, and only when the provider's reported limit is not larger than the bucket's
    /// (a manifest limit tighter than the provider's own is the operator's choice, and the
    /// provider's remaining says nothing about it). The reset time is used only when both
    /// limits agree: a provider counting in fixed windows reports the window's end, which
    /// would otherwise read as a near-empty token bucket.
    pub fn correct_provider(&self, buckets: &[Arc<BucketSpec>], reported: &[ReportedLimit]) {
        for r in reported {
            for b in buckets
                .iter()
                .filter(|b| b.scope.is_provider_side() && b.dimension == r.dimension)
            {
                let capacity = match b.rule {
                    Rule::TokenBucket { capacity, .. } | Rule::FixedWindow { capacity, .. } => {
                        capacity
                    }
                    Rule::Concurrency { .. } => continue,
                };
                if r.limit.is_some_and(|l| l > capacity) {
                    continue;
                }
                let reset = match r.limit {
                    Some(l) if l == capacity => r.reset_after.unwrap_or_default(),
                    _ => Duration::ZERO,
                };
                let store = self.store.clone();
                let bucket = b.clone();
                let remaining = r.remaining;
                settle_now_or_later(async move {
                    store.correct_from_headers(&bucket, remaining, reset).await;
                });
            }
        }
    }
}

/// Runs a settle at once when it needs no I/O (the in-process store completes on the first
/// poll), so the slot is free before the response reaches the client and its next request
/// finds it; otherwise (Redis) finishes it on a task, off the response path.
fn settle_now_or_later(settle: impl std::future::Future<Output = ()> + Send + 'static) {
    use futures::FutureExt as _;
    let mut settle = Box::pin(settle);
    if settle.as_mut().now_or_never().is_none() {
        tokio::spawn(settle);
    }
}

/// A queued request's place in the waiting room, removed when the request stops waiting for
/// any reason (including its future being dropped).
struct Waiting<'a> {
    broker: &'a Broker,
    tenant: &'a str,
    id: EntryId,
    done: bool,
}

impl Drop for Waiting<'_> {
    fn drop(&mut self) {
        if self.done {
            return;
        }
        let mut room = lock(&self.broker.room);
        room.queue.remove(self.id);
        forget(&mut room, self.tenant, self.id);
    }
}

fn forget(room: &mut Room, tenant: &str, id: EntryId) {
    if let Some(ids) = room.by_tenant.get_mut(tenant) {
        ids.retain(|&x| x != id);
        if ids.is_empty() {
            room.by_tenant.remove(tenant);
        }
    }
}

/// The `source` of a charge: `reported` when the provider's usage report stands behind every
/// count, `estimated` when any count is the tokenizer's or the router's estimate.
pub fn charge_source(u: &NormalizedUsage) -> &'static str {
    match u.source {
        crate::wire::usage::UsageSource::Reported => "reported",
        crate::wire::usage::UsageSource::Estimated => "estimated",
    }
}

/// The output cap of one attempt: what is reserved and what is forwarded.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct OutputBudget {
    /// Cap per choice to send upstream, as the one cap field the provider reads; `None`
    /// leaves the request without a cap (the client set none and nothing needed clamping).
    pub forward: Option<u64>,
    /// Output tokens to reserve: the per-choice cap (or the route's default) × choices.
    pub reserve: u64,
}

/// The output cap an attempt reserves and forwards (issue 14, item 6). The client's cap is the
/// OpenAI `max_completion_tokens`, else `max_tokens` (when both are sent, only the first is
/// forwarded, so the provider obeys the cap that was reserved), or Anthropic's `max_tokens`;
/// without one, the route's `defaultMaxTokens` is reserved. With the model's `contextWindow`
/// known, the cap is clamped to the window minus the input estimate (at least 1), and the
/// clamped cap is forwarded: a "no limit" cap neither over-reserves nor is refused when the
/// clamped value fits, and the provider never produces more than was reserved. Embeddings and
/// rerank reserve no output.
pub fn output_budget(
    req: &crate::request::ClientRequest,
    default: u64,
    context_window: Option<u64>,
) -> OutputBudget {
    use crate::request::ClientBody;
    let (cap, choices) = match &req.body {
        ClientBody::Chat(c) => (c.output_cap(), u64::from(c.n.unwrap_or(1).max(1))),
        ClientBody::Messages(m) => (Some(m.max_tokens), 1),
        ClientBody::Json(_) => {
            return OutputBudget {
                forward: None,
                reserve: req.output_allowance,
            };
        }
    };
    let base = cap.unwrap_or(default);
    let room = context_window.map(|w| w.saturating_sub(req.estimated_input_tokens).max(1));
    let per_choice = room.map_or(base, |r| base.min(r));
    let clamped = per_choice < base;
    OutputBudget {
        forward: (cap.is_some() || clamped).then_some(per_choice),
        reserve: per_choice.saturating_mul(choices),
    }
}

/// Puts `cap` into an OpenAI chat request as its only cap field: `max_completion_tokens`,
/// or `max_tokens` when that is the one the client used alone (older compatible servers read
/// only that one).
pub fn set_openai_cap(chat: &mut crate::wire::openai::ChatRequest, cap: Option<u64>) {
    let Some(cap) = cap else { return };
    if chat.max_tokens.is_some() && chat.max_completion_tokens.is_none() {
        chat.max_tokens = Some(cap);
    } else {
        chat.max_completion_tokens = Some(cap);
        chat.max_tokens = None;
    }
}

/// Normalised usage as ledger usage, with its cost.
pub fn ledger_usage(u: &NormalizedUsage, pricing: Pricing) -> Usage {
    Usage {
        input_uncached: u.input_uncached,
        cache_read: u.cache_read,
        cache_write: u.cache_write,
        output: u.output,
        spend_micro_usd: cost_micro_usd(u, &pricing),
    }
}

/// A request's demand on one provider: `input` estimated tokens (all assumed uncached, the
/// worst case), the `output` allowance, and the worst-case spend at the provider's prices.
pub fn demand(input: u64, output: u64, pricing: Option<Pricing>) -> Demand {
    let spend = pricing.map_or(0, |p| {
        cost_micro_usd(&NormalizedUsage::estimated(input, output), &p)
    });
    Demand {
        requests: 1,
        input_tokens: input,
        cached_input_tokens: 0,
        output_tokens: output,
        spend_micro_usd: spend,
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::wire::usage::{GeminiUsageMetadata, StreamUsage};
    use crate::wire::{anthropic, openai};
    use switchyard_core::quota::{Dimension, Rule, Scope};

    fn bucket(key: &str, dimension: Dimension, count_cached_input: bool) -> Arc<BucketSpec> {
        Arc::new(BucketSpec {
            key: key.to_owned(),
            scope: Scope::Tenant("t".to_owned()),
            dimension,
            // A window, not a refilling bucket: the figures read back exactly what was charged.
            rule: Rule::FixedWindow {
                capacity: 1_000_000_000,
                period: Duration::from_secs(86_400),
                reset_at: None,
                tz: chrono_tz::UTC,
            },
            count_cached_input,
        })
    }

    /// Field case 16: 2,455 cached + 4 new input tokens, 23 output, as each vendor reports it.
    fn reports() -> Vec<(&'static str, NormalizedUsage)> {
        let oa: openai::Usage = serde_json::from_value(serde_json::json!({
            "prompt_tokens": 2459, "completion_tokens": 23, "total_tokens": 2482,
            "prompt_tokens_details": {"cached_tokens": 2455}}))
        .unwrap();
        let an: anthropic::Usage = serde_json::from_value(serde_json::json!({
            "input_tokens": 4, "output_tokens": 23,
            "cache_read_input_tokens": 2455, "cache_creation_input_tokens": 0}))
        .unwrap();
        let gm: GeminiUsageMetadata = serde_json::from_value(serde_json::json!({
            "promptTokenCount": 2459, "cachedContentTokenCount": 2455,
            "candidatesTokenCount": 23, "totalTokenCount": 2482}))
        .unwrap();
        // Streaming: OpenAI's final usage-only chunk, Anthropic's start + delta, Gemini's last
        // chunk metadata.
        let mut s_oa = StreamUsage::new();
        let chunk: openai::ChatChunk = serde_json::from_value(serde_json::json!({
            "id": "c", "object": "chat.completion.chunk", "created": 1, "model": "m",
            "choices": [], "usage": serde_json::to_value(&oa).unwrap()}))
        .unwrap();
        s_oa.observe_openai(&chunk);
        let mut s_an = StreamUsage::new();
        for event in [
            serde_json::json!({"type": "message_start", "message": {"id": "m", "type": "message",
                "role": "assistant", "model": "x", "content": [], "usage": {"input_tokens": 4,
                "output_tokens": 1, "cache_read_input_tokens": 2455,
                "cache_creation_input_tokens": 0}}}),
            serde_json::json!({"type": "message_delta", "delta": {"stop_reason": "end_turn"},
                "usage": {"output_tokens": 23}}),
            serde_json::json!({"type": "message_stop"}),
        ] {
            s_an.observe_anthropic(&serde_json::from_value(event).unwrap());
        }
        let mut s_gm = StreamUsage::new();
        s_gm.observe_gemini(&gm);
        vec![
            ("openai", NormalizedUsage::from_openai(&oa)),
            ("anthropic", NormalizedUsage::from_anthropic(&an)),
            ("gemini", NormalizedUsage::from_gemini(&gm)),
            ("openai-stream", s_oa.finish(1)),
            ("anthropic-stream", s_an.finish(1)),
            ("gemini-stream", s_gm.finish(1)),
        ]
    }

    #[test]
    fn reported_limits_openai_and_anthropic_headers() {
        let wall = chrono::DateTime::parse_from_rfc3339("2026-11-30T12:00:00Z")
            .unwrap()
            .with_timezone(&chrono::Utc);
        let mut h = http::HeaderMap::new();
        h.insert("x-ratelimit-remaining-requests", "3".parse().unwrap());
        h.insert("x-ratelimit-reset-requests", "6m0s".parse().unwrap());
        h.insert(
            "anthropic-ratelimit-input-tokens-remaining",
            "900".parse().unwrap(),
        );
        h.insert(
            "anthropic-ratelimit-input-tokens-reset",
            "2026-11-30T12:00:30Z".parse().unwrap(),
        );
        h.insert("x-ratelimit-remaining-tokens", "nonsense".parse().unwrap());
        let r = reported_limits(&h, wall);
        assert_eq!(
            r,
            vec![
                ReportedLimit {
                    dimension: Dimension::Requests,
                    remaining: 3,
                    reset_after: Some(Duration::from_secs(360)),
                    limit: None,
                },
                ReportedLimit {
                    dimension: Dimension::InputTokens,
                    remaining: 900,
                    reset_after: Some(Duration::from_secs(30)),
                    limit: None,
                },
            ]
        );
    }

    #[tokio::test]
    async fn usage_shapes_same_real_usage_give_same_ledger_rows_and_cost() {
        let pricing = Pricing {
            input: 3_000_000,
            output: 15_000_000,
            cache_read: 300_000,
            cache_write: 3_750_000,
        };
        let mut rows = Vec::new();
        for (name, usage) in reports() {
            let store = QuotaStore::in_process();
            let broker = Broker::new(store.clone());
            let buckets = vec![
                bucket("uncached-input", Dimension::InputTokens, false),
                bucket("all-input", Dimension::InputTokens, true),
                bucket("output", Dimension::OutputTokens, true),
                bucket("spend", Dimension::SpendMicroUsd, true),
            ];
            let ticket = broker
                .reserve(
                    &buckets,
                    demand(3000, 100, Some(pricing)),
                    Duration::from_secs(60),
                )
                .await
                .unwrap();
            let row = ledger_usage(&usage, pricing);
            store.reconcile(ticket, row).await;
            let mut used = Vec::new();
            for b in &buckets {
                let f = store.figures(b).await.unwrap();
                used.push(f.limit - f.remaining);
            }
            assert_eq!(store.in_flight(), 0, "{name}");
            rows.push((name, row, used));
        }
        // 4 × $3 + 2,455 × $0.30 + 23 × $15 per MTok = 1,093.5 µUSD, rounded up once.
        let expected = Usage {
            input_uncached: 4,
            cache_read: 2455,
            cache_write: 0,
            output: 23,
            spend_micro_usd: 1094,
        };
        for (name, row, used) in &rows {
            assert_eq!(*row, expected, "{name}");
            assert_eq!(used, &vec![4, 2459, 23, 1094], "{name}: bucket usage");
        }
    }

    #[test]
    fn tenant_counts_add_up_per_tenant_and_ignore_plain_admissions() {
        let broker = Broker::new(QuotaStore::in_process());
        broker.note_tenant("ns/a", true, false);
        broker.note_tenant("ns/a", true, true);
        broker.note_tenant("ns/a", false, true);
        broker.note_tenant("ns/b", false, false);
        assert_eq!(
            broker.tenant_counts("ns/a"),
            TenantCounts {
                throttled: 2,
                rejected: 2
            }
        );
        assert_eq!(broker.tenant_counts("ns/b"), TenantCounts::default());
        assert!(
            !lock(&broker.tenant_counts).contains_key("ns/b"),
            "an admitted request adds no entry"
        );
    }
}

#[cfg(test)]
mod output_tests {
    use super::*;
    use crate::request::{ClientBody, ClientOp, ClientRequest};

    fn chat(body: serde_json::Value, input: u64) -> ClientRequest {
        ClientRequest {
            op: ClientOp::Chat,
            body: ClientBody::Chat(Box::new(serde_json::from_value(body).unwrap())),
            stream: false,
            client_wants_usage: false,
            project: String::new(),
            tenant: None,
            request_id: String::new(),
            modalities: Vec::new(),
            estimated_input_tokens: input,
            output_allowance: 0,
            estimate: crate::estimate::Estimate::default(),
            fingerprint: 0,
            dropped: Default::default(),
            trace: Default::default(),
        }
    }

    #[test]
    fn output_budget_uses_the_forwarded_cap_and_clamps_to_the_window() {
        let msgs = serde_json::json!([{"role": "user", "content": "hi"}]);
        // Both caps: max_completion_tokens is reserved and is the only one forwarded.
        let both = chat(
            serde_json::json!({"model": "m", "messages": msgs, "max_tokens": 40,
                "max_completion_tokens": 10, "n": 3}),
            100,
        );
        let b = output_budget(&both, 4096, None);
        assert_eq!(
            b,
            OutputBudget {
                forward: Some(10),
                reserve: 30
            }
        );
        let crate::request::ClientBody::Chat(c) = &both.body else {
            unreachable!()
        };
        let mut c = (**c).clone();
        set_openai_cap(&mut c, b.forward);
        assert_eq!((c.max_tokens, c.max_completion_tokens), (None, Some(10)));
        // A huge cap with a 1,000-token window and 300 input tokens: 700 per choice.
        let huge = chat(
            serde_json::json!({"model": "m", "messages": msgs, "max_tokens": 1000000}),
            300,
        );
        let b = output_budget(&huge, 4096, Some(1000));
        assert_eq!(
            b,
            OutputBudget {
                forward: Some(700),
                reserve: 700
            }
        );
        let crate::request::ClientBody::Chat(c) = &huge.body else {
            unreachable!()
        };
        let mut c = (**c).clone();
        set_openai_cap(&mut c, b.forward);
        assert_eq!(
            (c.max_tokens, c.max_completion_tokens),
            (Some(700), None),
            "the client's own field"
        );
        // No cap: the route default is reserved and nothing is forwarded, unless the window
        // leaves less than the default.
        let none = chat(serde_json::json!({"model": "m", "messages": msgs}), 300);
        assert_eq!(
            output_budget(&none, 512, Some(100_000)),
            OutputBudget {
                forward: None,
                reserve: 512
            }
        );
        assert_eq!(
            output_budget(&none, 4096, Some(1000)),
            OutputBudget {
                forward: Some(700),
                reserve: 700
            }
        );
        // Input beyond the window still leaves a cap of 1 (the provider answers the error).
        assert_eq!(output_budget(&none, 4096, Some(200)).reserve, 1);
    }
}
