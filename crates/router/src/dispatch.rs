//! Dispatch (DESIGN §3 steps 4–9): the executor of core's dispatch machine.
//!
//! Every routing decision — candidates, order, pauses, breakers, the probe gate, reservation
//! refusals, queueing, the attempt deadline, retry or fallback, what an outcome does to the
//! shared state — is made by [`switchyard_core::dispatch::Dispatch`], the same machine the
//! simulator runs. This module describes the request to it ([`Member`]s), lends it the
//! router's shared state (`RouterFleet`), does what it asks (reserve in the quota store, send
//! through the adapter, sleep, wait in the tenant's queue), reports each result back, settles
//! every attempt through [`settle`] and turns its [`Verdict`] into the client's error.

//! Streaming follows the "hold the preamble" rule: upstream events that carry no content
//! (role-only deltas, `message_start`, pings, keep-alives) are translated and held until the
//! first real content arrives. A provider that fails before that point — even after `200` and
//! a role chunk — is failed over invisibly; the client sees one coherent stream from the
//! provider that delivered content. After content has reached the client there is no retry:
//! the client gets a well-formed error event and the stream ends.

use std::sync::Arc;
use std::sync::atomic::Ordering;
use std::time::Duration;

use axum::body::Body;
use axum::http::{HeaderValue, StatusCode, header};
use axum::response::Response;
use bytes::{Bytes, BytesMut};
use futures::{FutureExt, StreamExt};
use serde_json::Value;
use smallvec::SmallVec;
use switchyard_core::breaker::CircuitBreaker;
use switchyard_core::budget::{FallbackThrottle, RetryBudget};
use switchyard_core::classify::{
    Classification, ErrorClass, TransportFailure, classify_stream_error_at, classify_transport,
};
use switchyard_core::dispatch::{
    Action, Count, Dispatch, Event, Failure, Fit, Fleet, Member, QueueTerms,
    Request as DispatchRequest, Reservation, Settled, Stop, Verdict, observe_latency, settle,
};
use switchyard_core::latency::{LatencyModel, LatencySample, peer_log_ratio};
use switchyard_core::p2c::P2c;
use switchyard_core::pause::Pauses;
use switchyard_core::queue::QueueReason;
use switchyard_core::quota::{Dimension, RateFigures, Scope};
use switchyard_core::waitline::{WaitLines, WaiterId};
use switchyard_store::Ticket;
use tokio::sync::Notify;
use tracing::Instrument;

use crate::app::App;
use crate::broker::{self, Broker};
use crate::config::{ProviderConfig, Route, Tenant};
use crate::request::{ApiError, ClientBody, ClientOp, ClientRequest, ratelimit_headers};
use crate::state::{Live, ProviderState, lock};
use crate::upstream::{Operation, ProviderKind, TransportError, UpstreamResponse};
use crate::wire::sse::{SseItem, encode_item};
use crate::wire::translate::{self, RequestOptions, StreamTranslator};
use crate::wire::usage::{NormalizedUsage, Pricing, UsageSource};
use crate::wire::{Dialect, anthropic, classify as stream_classify, error_event, openai};
use switchyard_providers::adapter::StreamDecoder;

/// Largest upstream body read into memory for a non-streamed response or an error.
const MAX_UPSTREAM_BODY: usize = 32 * 1024 * 1024;

/// What the machine said of one attempt: when it must end (its own share of the time, and the
/// request's deadline) and whether it is spill-over (for [`settle`]).
#[derive(Debug, Clone, Copy)]
struct AttemptPlan {
    /// The machine's `Action::Send::spill`: a capacity refusal then counts as full, not failed.
    spill: bool,
    attempt: switchyard_core::time::Instant,
    request: switchyard_core::time::Instant,
    /// A stream's adaptive first-token deadline (`switchyard_core::latency`), if any.
    first_token: Option<switchyard_core::time::Instant>,
}

/// Outcome of one attempt.
enum Attempt {
    /// Served; the response is ready for the client (non-streamed, or a committed stream).
    Served(Response),
    /// Failed before anything reached the client.
    Failed(Failure),
}

/// Bookkeeping of one upstream attempt; finishing it records the outcome exactly once, and
/// dropping it unfinished (client went away) records a cancellation.
struct AttemptGuard {
    app: Arc<App>,
    live: Arc<Live>,
    route: usize,
    provider: usize,
    started: tokio::time::Instant,
    /// Spill-over attempt ([`AttemptPlan::spill`]).
    spill: bool,
    done: bool,
    quota: Option<Reserved>,
    /// What was really used so far, for a settle when the client goes away mid-stream.
    partial: Option<NormalizedUsage>,
    /// Whether a success feeds the provider's latency baseline (chat and messages).
    learns_latency: bool,
    /// When the stream's first content arrived, after `started`.
    first_token: Option<Duration>,
    /// The request's and this attempt's OpenTelemetry spans (disabled when not exported).
    spans: crate::telemetry::Spans,
    /// Finish reasons of the answer, recorded on the spans (only read when they are exported).
    finish_reasons: Vec<String>,
    /// The request's log context, for the lines an attempt writes.
    log: RequestLog,
}

/// What a request's log lines are written under (with its route: its tenant and id), made into
/// a `request` span only when a line is written ([`RequestLog::span`]). An `info_span!` opened
/// for every request costs the default log layer a formatting of these fields and a registry
/// slot each time, about 3 % of the router's samples in the 2026-12-07 profile
/// (docs/profile.md), for lines that only failures write.
#[derive(Debug, Clone, Default)]
struct RequestLog {
    tenant: Option<Arc<crate::config::Tenant>>,
    request_id: String,
}

impl RequestLog {
    fn new(req: &ClientRequest) -> Self {
        RequestLog {
            tenant: req.tenant.clone(),
            request_id: req.request_id.clone(),
        }
    }

    /// The span the request's log lines go under, at info (the default level); none when the
    /// line is already under a span of the request's (with debug logging on, [`dispatch`]
    /// opens one with these fields and more).
    fn span(&self, route: &str) -> tracing::Span {
        if !tracing::Span::current().is_disabled() {
            return tracing::Span::none();
        }
        tracing::info_span!(
            "request",
            route = %route,
            tenant = self.tenant.as_ref().map_or("anonymous", |t| t.name.as_str()),
            request_id = %self.request_id,
        )
    }
}

/// A reservation held by an attempt, with what settling it needs.
struct Reserved {
    ticket: Ticket,
    pricing: Pricing,
    /// The input estimate, charged when the provider reports nothing.
    estimated_input: u64,
    /// The tenant charged (`namespace/name`), for the charge metric.
    tenant: Option<String>,
    /// The request's estimate and route, to calibrate the route's estimates.
    estimate: crate::estimate::Estimate,
    route: Arc<Route>,
}

impl Reserved {
    /// Reconciles with `usage` (the estimate when the provider reported none).
    fn settle_success(self, app: &App, usage: Option<&NormalizedUsage>) {
        let fallback = NormalizedUsage::estimated(self.estimated_input.max(1), 0);
        let usage = usage.unwrap_or(&fallback);
        self.record(app, usage);
        if usage.source != UsageSource::Estimated
            && let Some(error) =
                app.calibrations
                    .settle(&self.route.key, &self.estimate, usage.input_total())
        {
            app.metrics.estimation_error.observe(error.abs());
        }
        app.broker.reconcile(self.ticket, usage, self.pricing);
    }

    /// Releases after the client went away, charging `used`.
    fn settle_abandoned(self, app: &App, used: &NormalizedUsage) {
        self.record(app, used);
        app.broker.release(self.ticket, used, self.pricing);
    }

    /// Cancels: nothing was used.
    fn settle_unused(self, app: &App) {
        app.broker.cancel(self.ticket);
    }

    /// Adds what the tenant is charged to `switchyard_tenant_charged`.
    fn record(&self, app: &App, u: &NormalizedUsage) {
        let Some(tenant) = &self.tenant else {
            return;
        };
        let spend = broker::ledger_usage(u, self.pricing).spend_micro_usd;
        let source = broker::charge_source(u);
        tracing::debug!(target: "switchyard::ledger", %tenant, source, input_uncached = u.input_uncached, cache_read = u.cache_read, cache_write = u.cache_write, output = u.output, spend_micro_usd = spend, "charged");
        for (kind, n) in [
            ("input_uncached", u.input_uncached),
            ("cache_read", u.cache_read),
            ("cache_write", u.cache_write),
            ("output", u.output),
            ("spend_micro_usd", spend),
        ] {
            app.metrics
                .tenant_charged
                .get_or_create(&crate::metrics::TenantCharge {
                    tenant: tenant.clone(),
                    kind: kind.to_owned(),
                    source: source.to_owned(),
                })
                .inc_by(n);
        }
    }
}

impl AttemptGuard {
    /// Starts the bookkeeping of an attempt the machine sent (its p2c start is the machine's).
    fn start(
        app: &Arc<App>,
        live: &Arc<Live>,
        route: usize,
        provider: usize,
        quota: Option<Reserved>,
    ) -> Self {
        let state = &live.providers[provider];
        state.counters.in_flight.fetch_add(1, Ordering::Relaxed);
        app.metrics
            .in_flight
            .get_or_create(&label(&live.table.providers[provider]))
            .inc();
        AttemptGuard {
            app: app.clone(),
            live: live.clone(),
            route,
            provider,
            started: tokio::time::Instant::now(),
            spill: false,
            done: false,
            quota,
            partial: None,
            learns_latency: false,
            first_token: None,
            spans: crate::telemetry::Spans::none(),
            finish_reasons: Vec::new(),
            log: RequestLog::default(),
        }
    }

    /// The span this attempt's log lines go under ([`RequestLog::span`]).
    fn log_span(&self) -> tracing::Span {
        self.log.span(&self.live.table.routes[self.route].key)
    }

    fn state(&self) -> &ProviderState {
        &self.live.providers[self.provider]
    }

    /// The machine's [`settle`]: breaker, p2c score and window counts for this attempt's end.
    fn settle(&self, end: Settled) {
        let mut fleet = RouterFleet {
            app: &self.app,
            live: &self.live,
            route: self.route,
            waiter: None,
        };
        let now = self.app.clock.now();
        settle(
            &mut fleet,
            self.provider,
            self.spill,
            end,
            now,
            self.started.elapsed(),
        );
    }

    fn config(&self) -> &ProviderConfig {
        &self.live.table.providers[self.provider]
    }

    fn leave(&mut self) {
        self.state()
            .counters
            .in_flight
            .fetch_sub(1, Ordering::Relaxed);
        self.app
            .metrics
            .in_flight
            .get_or_create(&label(self.config()))
            .dec();
        self.done = true;
    }

    fn succeed(mut self, usage: Option<&NormalizedUsage>) {
        self.spans.succeeded(usage, &self.finish_reasons);
        if let Some(q) = self.quota.take() {
            q.settle_success(&self.app, usage);
        }
        let elapsed = self.started.elapsed();
        self.settle(Settled::Success);
        if self.learns_latency
            && let Some(u) = usage
        {
            let sample = LatencySample {
                total: elapsed,
                first_token: self.first_token,
                uncached_input: u.input_uncached + u.cache_write,
                cached_input: u.cache_read,
                output: u.output,
            };
            let mut fleet = RouterFleet {
                app: &self.app,
                live: &self.live,
                route: self.route,
                waiter: None,
            };
            observe_latency(&mut fleet, self.provider, &sample, self.app.clock.now());
        }
        let provider = label(self.config());
        self.app
            .metrics
            .latency
            .get_or_create(&provider)
            .observe(elapsed.as_secs_f64());
        self.app
            .metrics
            .attempts
            .get_or_create(&outcome(self.config(), "success"))
            .inc();
        if let Some(u) = usage {
            for (kind, n) in [
                ("input_uncached", u.input_uncached),
                ("cache_read", u.cache_read),
                ("cache_write", u.cache_write),
                ("output", u.output),
            ] {
                self.app
                    .metrics
                    .tokens
                    .get_or_create(&crate::metrics::TokenLabels {
                        provider: provider.provider.clone(),
                        kind: kind.to_owned(),
                    })
                    .inc_by(n);
            }
        }
        self.leave();
    }

    fn fail(mut self, class: ErrorClass) {
        crate::telemetry::attempt_failed(&self.spans.attempt, class.metric_label(), None, None);
        if let Some(q) = self.quota.take() {
            match &self.partial {
                // Content reached the client before the failure: that much was used.
                Some(used) => q.settle_success(&self.app, Some(used)),
                None => q.settle_unused(&self.app),
            }
        }
        self.settle(Settled::Failure(class));
        self.app
            .metrics
            .attempts
            .get_or_create(&outcome(self.config(), class.metric_label()))
            .inc();
        self.leave();
    }
}

impl Drop for AttemptGuard {
    fn drop(&mut self) {
        if self.done {
            return;
        }
        if let Some(q) = self.quota.take() {
            // The client went away: charge what was really used — the prompt was sent, and
            // whatever output was delivered (field case 17) — and free the slots.
            let used = self
                .partial
                .unwrap_or_else(|| NormalizedUsage::estimated(q.estimated_input.max(1), 0));
            q.settle_abandoned(&self.app, &used);
        }
        self.settle(Settled::Cancelled);
        self.app
            .metrics
            .attempts
            .get_or_create(&outcome(self.config(), "cancelled"))
            .inc();
        self.log_span().in_scope(|| {
            tracing::info!(provider = %self.config().key, reason = "client_disconnected", "attempt cancelled");
        });
        self.leave();
    }
}

fn label(p: &ProviderConfig) -> crate::metrics::ProviderLabel {
    crate::metrics::ProviderLabel {
        provider: p.key.clone(),
    }
}

fn outcome(p: &ProviderConfig, outcome: &str) -> crate::metrics::ProviderOutcome {
    crate::metrics::ProviderOutcome {
        provider: p.key.clone(),
        outcome: outcome.to_owned(),
    }
}

/// Which upstream operation serves `op` on a provider of `kind`, if any.
fn operation(op: ClientOp, kind: ProviderKind) -> Option<Operation> {
    match (op, kind) {
        (ClientOp::Chat | ClientOp::Messages, ProviderKind::OpenAi) => {
            Some(Operation::ChatCompletions)
        }
        (ClientOp::Chat | ClientOp::Messages, ProviderKind::Anthropic) => Some(Operation::Messages),
        (ClientOp::Embeddings, ProviderKind::OpenAi) => Some(Operation::Embeddings),
        (ClientOp::Rerank, ProviderKind::OpenAi) => Some(Operation::Rerank),
        (ClientOp::Transcription, ProviderKind::OpenAi) => Some(Operation::Transcription),
        _ => None,
    }
}

/// Serves one client request along its route.
pub async fn dispatch(app: Arc<App>, route_index: usize, req: ClientRequest) -> Response {
    let live = app.runtime.live();
    let route = live.table.routes[route_index].clone();
    // Debug, like the line that closes it: at the default level the log context is opened
    // only for the lines that need it ([`RequestLog`]).
    let span = tracing::debug_span!(
        "request",
        route = %route.key,
        tenant = req.tenant.as_ref().map_or("anonymous", |t| t.name.as_str()),
        request_id = %req.request_id,
        stream = req.stream,
        provider = tracing::field::Empty,
        attempts = tracing::field::Empty,
    );
    let dialect = req.op.dialect();
    let request_id = req.request_id.clone();
    let start = app.clock.now();
    let otel = crate::telemetry::request_span(&route, &req);
    let (result, queued, waited) = execute(&app, &live, route_index, &route, &req, start, &otel)
        .instrument(span.clone())
        .await;
    let decision = match &result {
        Err((e, _, _)) if e.quota.is_some() || e.code.starts_with("queue_") => Some(e.code.clone()),
        _ if queued => Some("admitted_after_queue".to_owned()),
        _ => None,
    };
    if let Some(t) = &req.tenant {
        let rejected = match &result {
            Err((e, _, _)) => {
                e.code.starts_with("queue_")
                    || e.quota.as_ref().is_some_and(|r| {
                        matches!(
                            r.scope,
                            switchyard_core::quota::Scope::Tenant(_)
                                | switchyard_core::quota::Scope::ApiKey(_)
                        )
                    })
            }
            Ok(_) => false,
        };
        app.broker.note_tenant(&t.key, waited, rejected);
    }
    if let Some(outcome) = decision {
        app.metrics
            .quota_decisions
            .get_or_create(&crate::metrics::QuotaOutcome { outcome })
            .inc();
    }

    let (mut response, provider, attempts, outcome) = match result {
        Ok((response, provider, attempts)) => {
            (response, Some(provider), attempts, "success".to_owned())
        }
        Err((error, provider, attempts)) => {
            let code = error.code.clone();
            (error.into_response(dialect), provider, attempts, code)
        }
    };
    span.record("attempts", attempts);
    if let Some(p) = &provider {
        span.record("provider", p.as_str());
    }
    if !otel.is_disabled() {
        let config = provider
            .as_ref()
            .and_then(|key| live.table.providers.iter().find(|p| &p.key == key))
            .map(|p| &**p);
        crate::telemetry::request_finished(
            &otel,
            config,
            attempts,
            response.status().as_u16(),
            &outcome,
        );
    }
    span.in_scope(|| {
        // Debug, not info: formatting and writing a line per request costs about a fifth of
        // the router's CPU per request (docs/benchmarks.md); failed attempts log at info.
        tracing::debug!(status = response.status().as_u16(), outcome = %outcome, "request finished");
    });
    app.metrics
        .requests
        .get_or_create(&crate::metrics::RouteOutcome {
            route: route.key.clone(),
            outcome,
        })
        .inc();
    let headers = response.headers_mut();
    if let Some(p) = provider.and_then(|p| HeaderValue::from_str(&p).ok()) {
        headers.insert("x-switchyard-provider", p);
    }
    headers.insert("x-switchyard-attempts", HeaderValue::from(attempts));
    headers.insert(
        "x-switchyard-route",
        HeaderValue::from_str(&route.key).unwrap_or(HeaderValue::from_static("")),
    );
    if let Ok(id) = HeaderValue::from_str(&request_id) {
        headers.insert("x-request-id", id);
    }
    if let Some(names) = crate::state::lock(&req.dropped).as_deref()
        && let Ok(v) = HeaderValue::from_str(names)
    {
        headers.insert("x-switchyard-dropped-parameters", v);
    }
    response
}

type RunResult = Result<(Response, String, u32), (ApiError, Option<String>, u32)>;

/// Waits for a turn in the tenant's queue, with the queue metrics.
async fn wait_in_queue(
    app: &App,
    tenant: &Tenant,
    cost: u64,
    deadline: switchyard_core::time::Instant,
    refill_after: Option<Duration>,
) -> Result<(), QueueReason> {
    // The gauge comes down however the wait ends, the client hanging up included.
    struct Depth<'a>(&'a App, crate::metrics::TenantLabel, tokio::time::Instant);
    impl Drop for Depth<'_> {
        fn drop(&mut self) {
            self.0.metrics.queue_depth.get_or_create(&self.1).dec();
            self.0
                .metrics
                .queue_wait
                .get_or_create(&self.1)
                .observe(self.2.elapsed().as_secs_f64());
        }
    }
    let label = crate::metrics::TenantLabel {
        tenant: tenant.key.clone(),
    };
    app.metrics.queue_depth.get_or_create(&label).inc();
    let _depth = Depth(app, label, tokio::time::Instant::now());
    app.broker
        .wait_turn(&app.clock, tenant, cost, deadline, refill_after)
        .await
}

/// The error of a request refused by its queue before any reservation was tried.
fn queue_error(reason: QueueReason, tenant: Option<&Tenant>) -> ApiError {
    let class = tenant.map_or_else(|| "tenant".to_owned(), |t| t.class.to_string());
    let mut e = ApiError::new(
        StatusCode::TOO_MANY_REQUESTS,
        reason.code(),
        format!("no capacity became free for this request while it waited in the {class} queue"),
    );
    e.retry_after = Some(Duration::from_secs(1));
    e
}

/// The router's shared state as the dispatch machine reaches it, for one route of one table:
/// pinned chains and weights of the route, pauses, breakers, p2c and the retry budget of the
/// router, the route's fallback throttle, the providers' outcome counters.
struct RouterFleet<'a> {
    app: &'a Arc<App>,
    live: &'a Live,
    route: usize,
    /// The request's place in the wait lines; `None` for settling an attempt's end.
    waiter: Option<&'a WaiterGuard<'a>>,
}

/// A request's place in the wait lines ([`crate::state::RouterLines`]): its id, and its
/// wake-up once it registered. Dropping it (the request ended, or its client went away and the
/// handler future was dropped) leaves every line, so the next waiter is woken. A request that
/// never waited never registered and never takes the lines' lock, here or anywhere.
struct WaiterGuard<'a> {
    app: &'a App,
    id: WaiterId,
    notify: std::sync::OnceLock<Arc<Notify>>,
}

impl WaiterGuard<'_> {
    /// Runs `f` on the lines, registering the wake-up on first use, and delivers the wake-ups
    /// it caused.
    fn with_lines<R>(&self, f: impl FnOnce(&mut WaitLines) -> R) -> R {
        let mut lines = lock(&self.app.runtime.lines);
        if self.notify.get().is_none() {
            let n = Arc::new(Notify::new());
            lines.register(self.id, n.clone());
            let _ = self.notify.set(n);
        }
        let r = f(&mut lines.lines);
        lines.wake();
        r
    }
}

impl Drop for WaiterGuard<'_> {
    fn drop(&mut self) {
        if self.notify.get().is_some() {
            lock(&self.app.runtime.lines).forget(self.id);
        }
    }
}

impl Fleet for RouterFleet<'_> {
    fn chain(&mut self, project: &str, now: switchyard_core::time::Instant) -> Vec<usize> {
        let route = &self.live.table.routes[self.route];
        let state = &self.live.routes[self.route];
        let weights = state.weights.load();
        // On the stack: this runs for every request (issue 16 item 2).
        let names: SmallVec<[&str; 8]> = route.provider_names.iter().map(String::as_str).collect();
        lock(&state.pins).route_chain(project, &names, &weights, route.tiers.as_ref(), now)
    }

    fn pinned(&mut self, project: &str, now: switchyard_core::time::Instant) -> bool {
        lock(&self.live.routes[self.route].pins)
            .peek(project, now)
            .is_some()
    }

    fn move_to_front(
        &mut self,
        project: &str,
        member: usize,
        cause: switchyard_core::chain::MoveCause,
        now: switchyard_core::time::Instant,
    ) -> bool {
        let tiers = self.live.table.routes[self.route].tiers.as_ref();
        lock(&self.live.routes[self.route].pins)
            .route_move_to_front(project, member, tiers, cause, now)
    }

    fn pauses<R>(&mut self, provider: usize, f: impl FnOnce(&mut Pauses, &[&str]) -> R) -> R {
        let p = &self.live.table.providers[provider];
        let scopes: SmallVec<[&str; 4]> = p.pause_scopes.iter().map(String::as_str).collect();
        f(&mut lock(&self.app.runtime.pauses), &scopes)
    }

    fn breaker<R>(&mut self, provider: usize, f: impl FnOnce(&mut CircuitBreaker) -> R) -> R {
        f(&mut lock(&self.live.providers[provider].breaker))
    }

    fn p2c<R>(&mut self, f: impl FnOnce(&mut P2c) -> R) -> R {
        f(&mut lock(&self.live.p2c))
    }

    fn retry_budget<R>(&mut self, f: impl FnOnce(&mut RetryBudget) -> R) -> Option<R> {
        Some(f(&mut lock(&self.app.runtime.budget)))
    }

    fn fallback_throttle<R>(&mut self, f: impl FnOnce(&mut FallbackThrottle) -> R) -> Option<R> {
        self.live.routes[self.route]
            .throttle
            .as_ref()
            .map(|t| f(&mut lock(t)))
    }

    fn count(&mut self, provider: usize, event: Count) {
        self.live.providers[provider].counters.count(event);
    }

    fn latency<R>(
        &mut self,
        provider: usize,
        f: impl FnOnce(&mut LatencyModel, f64) -> R,
    ) -> Option<R> {
        // Peers: every other provider this router serves through (their ratios are to their
        // own baselines, so providers of different speeds compare).
        let peers = peer_log_ratio(
            self.live
                .providers
                .iter()
                .enumerate()
                .filter(|(i, _)| *i != provider)
                .map(|(_, p)| p.recent_log_ratio()),
        );
        Some(self.live.providers[provider].with_latency(|m| f(m, peers)))
    }

    fn wait_lines<R>(&mut self, f: impl FnOnce(&mut WaitLines) -> R) -> Option<R> {
        self.waiter.map(|w| w.with_lines(f))
    }

    fn paused(&mut self, scope: &str, until: switchyard_core::time::Instant) {
        // Every replica honours it, not just this one (field case 8).
        crate::signals::publish_pause(self.app, scope, until);
    }

    fn breaker_opened(&mut self, provider: usize, until: switchyard_core::time::Instant) {
        let key = &self.live.table.providers[provider].key;
        crate::signals::publish_breaker_open(self.app, key, until);
    }
}

/// The request's facts about each route member, for the dispatch machine (step 4, static
/// part): whether the provider may serve it (region allow-lists of route and tenant, declared
/// modalities, operation), its probe health, and what reserving there involves.
fn members(
    app: &App,
    live: &Live,
    route: &Route,
    req: &ClientRequest,
    start: switchyard_core::time::Instant,
) -> Vec<Member> {
    let tenant_restricts = req
        .tenant
        .as_ref()
        .is_some_and(|t| !t.allowed_regions.is_empty());
    let tenant_regions: Vec<String> = match &req.tenant {
        // Only regions every tenant allow-list (own and ancestors') agrees on.
        Some(t) if tenant_restricts => {
            let mut lists = t.allowed_regions.iter();
            let first = lists.next().cloned().unwrap_or_default();
            lists.fold(first, |acc, l| {
                acc.into_iter().filter(|r| l.contains(r)).collect()
            })
        }
        _ => Vec::new(),
    };
    let health = &app.runtime.health;
    let has_spend = |b: &[Arc<switchyard_core::quota::BucketSpec>]| {
        b.iter().any(|b| b.dimension == Dimension::SpendMicroUsd)
    };
    let tenant_buckets = req.tenant.as_ref().map_or(&[][..], |t| &t.buckets[..]);
    route
        .providers
        .iter()
        .map(|rp| {
            let p = &live.table.providers[rp.index];
            let fit = if rp.ineligible.is_some() {
                if p.within_regions(&route.allowed_regions) {
                    Fit::Unsuitable
                } else {
                    Fit::OutsideRegions
                }
            } else if tenant_restricts && !p.within_regions(&tenant_regions) {
                Fit::OutsideRegions
            } else if !rp.modalities.is_empty()
                && !req.modalities.iter().all(|m| rp.modalities.contains(m))
            {
                // A model that declares its modalities serves only those (DESIGN §4.8); one
                // that declares none is not filtered.
                Fit::Unsuitable
            } else if p
                .kind(&rp.upstream_model)
                .and_then(|k| operation(req.op, k))
                .is_some_and(|op| {
                    p.client
                        .as_ref()
                        .is_ok_and(|c| c.serves(op, &rp.upstream_model))
                })
            {
                Fit::Serves
            } else {
                Fit::Unsuitable
            };
            // Active-probe health for the request's modalities (DESIGN §4.8); unknown or
            // stale health admits, and the machine fails open when nobody is admitted.
            let healthy = health.is_empty() || health.admits_all(&p.key, &req.modalities, start);
            let reservation = if tenant_buckets.is_empty()
                && route.buckets.is_empty()
                && p.buckets.is_empty()
            {
                Reservation::None
            } else if p.models.get(&route.model).and_then(|m| m.pricing).is_none()
                && (has_spend(tenant_buckets) || has_spend(&route.buckets) || has_spend(&p.buckets))
            {
                Reservation::UnpricedSpend
            } else {
                Reservation::Required
            };
            Member {
                provider: rp.index,
                fit,
                healthy,
                reservation,
            }
        })
        .collect()
}

/// The executor: drives the request's [`Dispatch`] machine, doing what it asks — reserve in
/// the store, send through the adapter, sleep, wait in the tenant's queue — and reporting each
/// result back. Returns the response or error, and whether the request queued.
async fn execute(
    app: &Arc<App>,
    live: &Arc<Live>,
    route_index: usize,
    route: &Arc<Route>,
    req: &ClientRequest,
    start: switchyard_core::time::Instant,
    otel: &tracing::Span,
) -> (RunResult, bool, bool) {
    let clock = app.clock;
    // Time spent reserving before the next attempt, for its span.
    let mut reservation_wait = Duration::ZERO;
    // Whether the request really waited in its tenant's queue (a `queue_full` answer at the
    // door is a rejection, not a wait): the tenant's `throttled` count.
    let mut waited = false;
    let queue = req
        .tenant
        .as_ref()
        .filter(|t| t.queue.max_depth > 0)
        .map(|t| QueueTerms {
            deadline: t.queue.deadline,
            join_first: app.broker.has_waiting(),
        });
    // One relaxed increment; the lines' lock is only taken if the request ever waits.
    let waiter = WaiterGuard {
        app,
        id: app.runtime.next_waiter.fetch_add(1, Ordering::Relaxed),
        notify: std::sync::OnceLock::new(),
    };
    let mut machine = Dispatch::new(
        route.dispatch,
        DispatchRequest {
            project: req.project.clone(),
            start,
            members: members(app, live, route, req, start),
            queue,
            stream_input: (req.stream && matches!(req.op, ClientOp::Chat | ClientOp::Messages))
                .then_some(req.estimated_input_tokens),
        },
    )
    .with_waiter(waiter.id);
    let mut fleet = RouterFleet {
        app,
        live,
        route: route_index,
        waiter: Some(&waiter),
    };
    let mut reserved: Option<Reserved> = None;
    let mut caller_figures: Option<RateFigures> = None;
    let mut served: Option<Response> = None;
    let provider_key = |pos: Option<usize>| {
        pos.map(|pos| live.table.providers[route.providers[pos].index].key.clone())
    };
    loop {
        // The thread's generator is borrowed for the call only: the future stays `Send`.
        let action = machine.poll(&mut fleet, clock.now(), &mut rand::rng());
        match action {
            Action::Reserve { member } => {
                let provider = &live.table.providers[route.providers[member].index];
                let model = provider.models.get(&route.model);
                let pricing = model.and_then(|m| m.pricing).unwrap_or_default();
                let buckets = Broker::buckets(req.tenant.as_deref(), route, provider);
                let window = model.and_then(|m| m.context_window);
                let output =
                    broker::output_budget(req, u64::from(route.default_max_tokens), window);
                let demand =
                    broker::demand(req.estimated_input_tokens, output.reserve, Some(pricing));
                let reserve_start = clock.now();
                let reserved_result = app.broker.reserve(&buckets, demand, route.deadline).await;
                reservation_wait += clock.now().saturating_since(reserve_start);
                let result = match reserved_result {
                    Ok(ticket) => {
                        // The caller's own tightest bucket after this debit, for the success
                        // headers; shared (route, provider) buckets say nothing about the caller.
                        caller_figures = ticket.tightest().and_then(|(pos, f)| {
                            let b = buckets.get(pos)?;
                            matches!(b.scope, Scope::Tenant(_) | Scope::ApiKey(_)).then_some(f)
                        });
                        reserved = Some(Reserved {
                            ticket,
                            pricing,
                            estimated_input: req.estimated_input_tokens,
                            tenant: req.tenant.as_ref().map(|t| t.key.clone()),
                            estimate: req.estimate,
                            route: route.clone(),
                        });
                        Ok(())
                    }
                    Err(refusal) => {
                        if refusal.scope.is_provider_side() {
                            tracing::debug!(provider = %provider.key, bucket = %refusal.key, "provider has no room; skipped");
                        }
                        Err(refusal)
                    }
                };
                machine.handle(&mut fleet, Event::Reserved(result));
            }
            Action::Send {
                member,
                attempt_deadline,
                first_token_deadline,
                deadline,
                retry,
                spill,
            } => {
                if retry {
                    app.metrics
                        .retries
                        .get_or_create(&crate::metrics::RouteLabel {
                            route: route.key.clone(),
                        })
                        .inc();
                }
                let rp = &route.providers[member];
                let key = &live.table.providers[rp.index].key;
                let attempt_span =
                    tracing::debug_span!("attempt", provider = %key, n = machine.attempts());
                let spans = crate::telemetry::Spans {
                    attempt: crate::telemetry::attempt_span(
                        otel,
                        req.op,
                        crate::telemetry::AttemptFacts {
                            provider: &live.table.providers[rp.index],
                            upstream_model: &rp.upstream_model,
                            position: machine.chain_position(member).unwrap_or(member),
                            attempt: machine.attempts(),
                            reservation_wait_ms: u64::try_from(
                                std::mem::take(&mut reservation_wait).as_millis(),
                            )
                            .unwrap_or(u64::MAX),
                        },
                    ),
                    request: otel.clone(),
                };
                let result = attempt(
                    app,
                    live,
                    route_index,
                    route,
                    rp.index,
                    &rp.upstream_model,
                    req,
                    AttemptPlan {
                        spill,
                        attempt: attempt_deadline,
                        request: deadline,
                        first_token: first_token_deadline,
                    },
                    reserved.take(),
                    spans.clone(),
                )
                .instrument(attempt_span)
                .await;
                let finished = match result {
                    Attempt::Served(response) => {
                        served = Some(response);
                        Ok(())
                    }
                    Attempt::Failed(failure) => {
                        let c = &failure.classification;
                        crate::telemetry::attempt_failed(
                            &spans.attempt,
                            c.class.metric_label(),
                            c.code.as_deref(),
                            failure.status,
                        );
                        if c.class != ErrorClass::Deadline {
                            RequestLog::new(req).span(&route.key).in_scope(|| {
                                tracing::info!(provider = %key, class = %c.class, code = c.code.as_deref().unwrap_or(""), "attempt failed");
                            });
                        }
                        Err(failure)
                    }
                };
                machine.handle(&mut fleet, Event::Finished(finished));
            }
            Action::Wait { until } => {
                let sleep = tokio::time::sleep_until(clock.to_tokio(until));
                match waiter.notify.get().cloned() {
                    // In a wait line: the line wakes it early when it becomes the head.
                    Some(notify) => {
                        tokio::select! {
                            () = sleep => {}
                            () = notify.notified() => {}
                        }
                    }
                    None => sleep.await,
                }
                machine.handle(&mut fleet, Event::Woke);
            }
            Action::Queue {
                deadline,
                refill_after,
            } => {
                let turn = match req.tenant.as_deref() {
                    Some(tenant) => {
                        let cost = req.estimated_input_tokens + req.output_allowance;
                        let turn = wait_in_queue(app, tenant, cost, deadline, refill_after).await;
                        waited |= !matches!(turn, Err(QueueReason::QueueFull));
                        turn
                    }
                    None => Err(QueueReason::UnknownClass),
                };
                machine.handle(&mut fleet, Event::Queue(turn));
            }
            Action::Served {
                member,
                fallback,
                affinity_break,
            } => {
                let label = crate::metrics::RouteLabel {
                    route: route.key.clone(),
                };
                if fallback {
                    app.metrics.fallbacks.get_or_create(&label).inc();
                }
                if affinity_break {
                    app.metrics.affinity_breaks.get_or_create(&label).inc();
                }
                let Some(mut response) = served.take() else {
                    let e = ApiError::new(
                        StatusCode::INTERNAL_SERVER_ERROR,
                        "internal",
                        "served without a response",
                    );
                    return (Err((e, None, machine.attempts())), machine.queued(), waited);
                };
                if let Some(f) = &caller_figures {
                    ratelimit_headers(response.headers_mut(), f);
                }
                let key = provider_key(Some(member)).unwrap_or_default();
                return (
                    Ok((response, key, machine.attempts())),
                    machine.queued(),
                    waited,
                );
            }
            Action::Respond(verdict) => {
                let error = verdict_error(verdict, route, req.tenant.as_deref());
                let last = provider_key(machine.last_member());
                return (
                    Err((error, last, machine.attempts())),
                    machine.queued(),
                    waited,
                );
            }
        }
    }
}

/// The client-facing error for a [`Verdict`] (step 9), in dialect-neutral form.
fn verdict_error(verdict: Verdict, route: &Route, tenant: Option<&Tenant>) -> ApiError {
    match verdict {
        Verdict::NoProvider { region_excluded } => {
            let (code, message) = if region_excluded {
                (
                    "region_unavailable",
                    "no provider of this model may serve requests within the allowed regions"
                        .to_owned(),
                )
            } else {
                (
                    "no_provider",
                    format!("no provider of route {} can serve this request", route.key),
                )
            };
            ApiError::new(StatusCode::FORBIDDEN, code, message)
        }
        Verdict::Quota {
            refusal,
            retry_after,
            queue,
        } => {
            let mut e = ApiError::quota(refusal);
            if retry_after.is_some() {
                e.retry_after = retry_after;
            }
            if let Some(reason) = queue {
                let code = reason.code();
                e.message = format!("{} (queue: {code})", e.message);
                e.code = code.to_owned();
            }
            e
        }
        Verdict::QueueExpired { reason } => queue_error(reason, tenant),
        Verdict::Unpriced => ApiError::new(
            StatusCode::SERVICE_UNAVAILABLE,
            "spend_limit_unpriced",
            format!(
                "a spend limit applies to this request but no provider of route {} has list prices for the model; add pricing to the LLMProvider's models",
                route.key
            ),
        ),
        Verdict::Deadline { retry_after } => {
            let mut e = ApiError::new(
                StatusCode::GATEWAY_TIMEOUT,
                "deadline_exceeded",
                format!(
                    "the request deadline of {:?} passed before any provider answered",
                    route.deadline
                ),
            );
            e.retry_after = retry_after;
            e
        }
        Verdict::Rejected(failure) => client_error(&failure),
        Verdict::Exhausted {
            last,
            region_excluded,
            retry_after,
            stop,
        } => {
            let mut e = exhausted_error(&last.classification, region_excluded);
            e.retry_after = retry_after.or(e.retry_after);
            if let Some(stop @ (Stop::RetryBudget | Stop::FallbackThrottled)) = stop {
                e.message = format!("{} (further attempts refused: {})", e.message, stop.code());
            }
            e
        }
        Verdict::FallbackThrottled { retry_after } => {
            // The providers above are paused or open and spill-over is at its throttle.
            let mut e = ApiError::new(
                StatusCode::TOO_MANY_REQUESTS,
                "fallback_throttled",
                "the preferred providers are unavailable and spill-over to the others is at its configured rate",
            );
            e.retry_after = Some(retry_after);
            e
        }
        Verdict::Unavailable {
            region_excluded: true,
            ..
        } => exhausted_error(&Classification::new(ErrorClass::Overload), true),
        Verdict::Unavailable { retry_after, .. } => {
            // Every candidate was paused or had its circuit open: nothing was sent.
            let mut e = ApiError::new(
                StatusCode::SERVICE_UNAVAILABLE,
                "providers_unavailable",
                "every provider of this route is paused after rate limiting or has its circuit open",
            );
            match retry_after {
                Some(wait) => {
                    e.status = StatusCode::TOO_MANY_REQUESTS;
                    e.code = "provider_capacity".to_owned();
                    e.retry_after = Some(wait);
                }
                None => e.retry_after = Some(Duration::from_secs(1)),
            }
            e
        }
    }
}

/// The error shown when every attempt failed, by the class of the last failure.
fn exhausted_error(c: &Classification, region_excluded: bool) -> ApiError {
    let detail = c.message.clone().unwrap_or_default();
    let (status, code, message) = match c.class {
        _ if region_excluded => (
            StatusCode::FORBIDDEN,
            "region_unavailable",
            "every provider within the allowed regions failed; providers outside them are not used"
                .to_owned(),
        ),
        ErrorClass::Capacity => (
            StatusCode::TOO_MANY_REQUESTS,
            "provider_capacity",
            format!("every provider is rate limiting: {detail}"),
        ),
        ErrorClass::Policy => (
            StatusCode::TOO_MANY_REQUESTS,
            "provider_quota_exhausted",
            format!("provider quota exhausted: {detail}"),
        ),
        ErrorClass::Overload => (
            StatusCode::SERVICE_UNAVAILABLE,
            "provider_overloaded",
            format!("every provider is overloaded: {detail}"),
        ),
        ErrorClass::Timeout | ErrorClass::Deadline => (
            StatusCode::GATEWAY_TIMEOUT,
            "provider_timeout",
            "providers did not answer in time".to_owned(),
        ),
        ErrorClass::Connect => (
            StatusCode::BAD_GATEWAY,
            "provider_unreachable",
            "could not connect to any provider".to_owned(),
        ),
        ErrorClass::Auth => (
            StatusCode::BAD_GATEWAY,
            "provider_auth",
            "providers refused our credentials".to_owned(),
        ),
        ErrorClass::Server | ErrorClass::Request => (
            StatusCode::BAD_GATEWAY,
            "provider_error",
            format!("providers failed: {detail}"),
        ),
    };
    ApiError::new(status, code, message)
}

/// A request error (or a class the route does not fail over on) returned to the client as
/// the provider gave it, in the client's dialect.
fn client_error(f: &Failure) -> ApiError {
    let c = &f.classification;
    let status = f
        .status
        .and_then(|s| StatusCode::from_u16(s).ok())
        .unwrap_or(match c.class {
            ErrorClass::Request => StatusCode::BAD_REQUEST,
            _ => StatusCode::BAD_GATEWAY,
        });
    let code = c
        .code
        .clone()
        .unwrap_or_else(|| c.class.metric_label().to_owned());
    let mut e = ApiError::new(
        status,
        &code,
        c.message
            .clone()
            .unwrap_or_else(|| "the provider rejected the request".to_owned()),
    );
    e.retry_after = c.retry_after;
    e
}

/// Builds the upstream body for `kind` from the client's request.
fn upstream_body(
    req: &ClientRequest,
    kind: ProviderKind,
    model: &str,
    route: &Route,
    cap: Option<u64>,
) -> Result<Bytes, ApiError> {
    let bad = |e: translate::TranslateError| {
        ApiError::new(
            StatusCode::BAD_REQUEST,
            "unsupported_translation",
            e.to_string(),
        )
    };
    let json = |v: Result<Vec<u8>, serde_json::Error>| {
        v.map(Bytes::from).map_err(|e| {
            ApiError::new(StatusCode::INTERNAL_SERVER_ERROR, "internal", e.to_string())
        })
    };
    match (&req.body, kind) {
        (ClientBody::Chat(chat), ProviderKind::OpenAi) => {
            let mut chat = (**chat).clone();
            chat.model = model.to_owned();
            broker::set_openai_cap(&mut chat, cap);
            chat.force_include_usage();
            json(serde_json::to_vec(&chat))
        }
        (ClientBody::Chat(chat), ProviderKind::Anthropic) => {
            let opts = RequestOptions {
                default_max_tokens: u64::from(route.default_max_tokens),
            };
            let mut chat = (**chat).clone();
            broker::set_openai_cap(&mut chat, cap);
            let translated = translate::openai_to_anthropic_request(chat, opts).map_err(bad)?;
            let mut translated = lossless_or_allowed(translated, route, req, "Anthropic")?;
            translated.model = model.to_owned();
            json(serde_json::to_vec(&translated))
        }
        (ClientBody::Messages(m), ProviderKind::Anthropic) => {
            let mut m = (**m).clone();
            m.model = model.to_owned();
            m.max_tokens = cap.unwrap_or(m.max_tokens);
            json(serde_json::to_vec(&m))
        }
        (ClientBody::Messages(m), ProviderKind::OpenAi) => {
            let translated = translate::anthropic_to_openai_request((**m).clone()).map_err(bad)?;
            let mut translated = lossless_or_allowed(translated, route, req, "OpenAI")?;
            translated.model = model.to_owned();
            broker::set_openai_cap(&mut translated, cap);
            translated.force_include_usage();
            json(serde_json::to_vec(&translated))
        }
        (ClientBody::Json(map), _) => {
            let mut map = map.clone();
            map.insert("model".to_owned(), Value::String(model.to_owned()));
            json(serde_json::to_vec(&map))
        }
    }
}

/// A translation that dropped parameters is refused with 400 naming them, unless the route
/// opts into lossy translation; then the names are kept for the
/// `x-switchyard-dropped-parameters` response header (issue 12 item 6).
fn lossless_or_allowed<T>(
    translated: translate::Translated<T>,
    route: &Route,
    req: &ClientRequest,
    target: &str,
) -> Result<T, ApiError> {
    if translated.dropped.is_empty() {
        return Ok(translated.value);
    }
    let names = translated.dropped.join(", ");
    if !route.lossy_translation {
        return Err(ApiError::new(
            StatusCode::BAD_REQUEST,
            "unsupported_parameter",
            format!(
                "the model {:?} is served by an {target} provider, which has no equivalent for: \
                 {names}; remove them, or set `lossyTranslation: true` on RoutingPolicy {} to \
                 have them dropped",
                route.model, route.key
            ),
        ));
    }
    *crate::state::lock(&req.dropped) = Some(names);
    Ok(translated.value)
}

fn unix_now(app: &App) -> u64 {
    u64::try_from(app.clock.wall().timestamp()).unwrap_or(0)
}

/// One upstream attempt.
#[allow(clippy::too_many_arguments)]
async fn attempt(
    app: &Arc<App>,
    live: &Arc<Live>,
    route_index: usize,
    route: &Route,
    provider_index: usize,
    model: &str,
    req: &ClientRequest,
    plan: AttemptPlan,
    quota: Option<Reserved>,
    spans: crate::telemetry::Spans,
) -> Attempt {
    let deadline = plan.request;
    let provider = &live.table.providers[provider_index];
    // Every attempt the machine sent is settled exactly once, also when nothing leaves (the
    // reservation is then credited back in full).
    let mut guard = AttemptGuard::start(app, live, route_index, provider_index, quota);
    guard.spill = plan.spill;
    guard.spans = spans;
    guard.log = RequestLog::new(req);
    guard.learns_latency = matches!(req.op, ClientOp::Chat | ClientOp::Messages);
    let Ok(client) = provider.client.as_ref() else {
        return fail(guard, Classification::new(ErrorClass::Auth));
    };
    let kind = client.kind(model);
    let Some(op) = operation(req.op, kind).filter(|&op| client.serves(op, model)) else {
        return fail(guard, Classification::new(ErrorClass::Request));
    };
    let window = provider
        .models
        .get(&route.model)
        .and_then(|m| m.context_window);
    let cap = broker::output_budget(req, u64::from(route.default_max_tokens), window).forward;
    let body = match upstream_body(req, kind, model, route, cap) {
        Ok(b) => b,
        Err(e) => {
            guard.fail(ErrorClass::Request);
            return Attempt::Failed(Failure {
                classification: Classification {
                    message: Some(e.message),
                    code: Some(e.code),
                    ..Classification::new(ErrorClass::Request)
                },
                status: Some(e.status.as_u16()),
            });
        }
    };
    let now = app.clock.now();
    let remaining = deadline.saturating_since(now);
    let streaming = req.stream && matches!(req.op, ClientOp::Chat | ClientOp::Messages);
    // A whole non-streamed answer is bounded by the attempt's share of the deadline; a stream
    // until its first content by that share and the first-token timeout, whichever ends first
    // (once content flows it may run to the request deadline: it can no longer move).
    let attempt_remaining = plan.attempt.min(deadline).saturating_since(now);
    let header_budget = if streaming {
        let adaptive = plan
            .first_token
            .map_or(Duration::MAX, |t| t.saturating_since(now));
        provider
            .first_token_timeout(route)
            .min(attempt_remaining)
            .min(adaptive)
    } else {
        attempt_remaining
    };
    let first_token_deadline = tokio::time::Instant::now() + header_budget;
    let attempt_end = app.clock.to_tokio(plan.attempt.min(deadline));
    // A timeout is the provider's fault (Timeout) unless it is the request's own deadline.
    let timed_out = |budget: Duration| {
        if budget < remaining {
            if streaming {
                classify_transport(TransportFailure::FirstTokenTimeout)
            } else {
                classify_transport(TransportFailure::ResponseTimeout)
            }
        } else {
            classify_transport(TransportFailure::RequestDeadline)
        }
    };
    let sent = tokio::time::timeout_at(
        first_token_deadline,
        client.send_with_headers(
            op,
            model,
            body,
            streaming,
            &crate::telemetry::upstream_headers(&guard.spans.attempt, &req.trace),
        ),
    )
    .await;
    let response = match sent {
        Err(_) => return fail(guard, timed_out(header_budget)),
        Ok(Err(e)) => return fail(guard, transport_class(&e)),
        Ok(Ok(r)) => r,
    };
    if !provider.buckets.is_empty() {
        // The provider's own view of its limits corrects ours (never upward).
        let reported = broker::reported_limits(&response.headers, app.clock.wall());
        app.broker.correct_provider(&provider.buckets, &reported);
    }
    if !response.status.is_success() {
        let status = response.status;
        let headers = response.headers.clone();
        let body = tokio::time::timeout_at(
            app.clock.to_tokio(deadline),
            response.collect(MAX_UPSTREAM_BODY),
        )
        .await;
        let body = match body {
            Ok(Ok(b)) => b,
            _ => Bytes::new(),
        };
        let c = client
            .adapter()
            .classify(status, &headers, &body, app.clock.wall());
        let class = c.class;
        let failure = Failure {
            classification: c,
            status: Some(status.as_u16()),
        };
        guard.fail(class);
        return Attempt::Failed(failure);
    }
    crate::telemetry::response_model(&guard.spans, model);
    if streaming {
        if let Err(message) = client.adapter().accepts_stream(&response.headers) {
            let c = Classification {
                message: Some(message),
                code: Some("invalid_upstream_stream".to_owned()),
                ..Classification::new(ErrorClass::Server)
            };
            return fail(guard, c);
        }
        let decoder = client.adapter().stream_decoder(op, model);
        stream_attempt(
            app,
            guard,
            kind,
            req,
            response,
            decoder,
            first_token_deadline,
            deadline,
        )
        .await
    } else {
        // Field case 17: a client that leaves while the body is read cancels the upstream
        // call (the provider stops generating); the reservation is settled by the guard's drop
        // with the input estimate, marked `estimated` in the ledger.
        let body = tokio::time::timeout_at(attempt_end, response.collect(MAX_UPSTREAM_BODY)).await;
        let body = match body {
            Err(_) => return fail(guard, timed_out(attempt_remaining)),
            Ok(Err(e)) => return fail(guard, transport_class(&e)),
            Ok(Ok(b)) => b,
        };
        let body = match client.adapter().decode(op, model, body) {
            Ok(b) => b,
            Err(message) => {
                let c = Classification {
                    message: Some(message),
                    code: Some("invalid_upstream_response".to_owned()),
                    ..Classification::new(ErrorClass::Server)
                };
                return fail(guard, c);
            }
        };
        match translate_response(app, req.op, kind, &body) {
            Ok((bytes, usage)) => {
                if !guard.spans.attempt.is_disabled() {
                    guard.finish_reasons = crate::telemetry::finish_reasons(req.op, &bytes);
                }
                guard.succeed(usage.as_ref());
                if let (ClientOp::Transcription, ClientBody::Json(map)) = (req.op, &req.body) {
                    return Attempt::Served(crate::transcription::client_response(map, bytes));
                }
                let mut response = Response::new(Body::from(bytes));
                response.headers_mut().insert(
                    header::CONTENT_TYPE,
                    HeaderValue::from_static("application/json"),
                );
                Attempt::Served(response)
            }
            Err(message) => fail(
                guard,
                Classification {
                    message: Some(message),
                    code: Some("invalid_upstream_response".to_owned()),
                    ..Classification::new(ErrorClass::Server)
                },
            ),
        }
    }
}

fn fail(guard: AttemptGuard, c: Classification) -> Attempt {
    guard.fail(c.class);
    Attempt::Failed(Failure {
        classification: c,
        status: None,
    })
}

fn transport_class(e: &TransportError) -> Classification {
    let kind = match e {
        TransportError::Connect(_) => TransportFailure::Connect,
        TransportError::Timeout => TransportFailure::ResponseTimeout,
        // Nothing reached the model: the provider's credentials are broken (an auth fault of
        // that provider, failed over like a 401).
        TransportError::Credentials(m) => {
            return Classification {
                message: Some(m.clone()),
                code: Some("provider_credentials".to_owned()),
                ..Classification::new(ErrorClass::Auth)
            };
        }
        _ => TransportFailure::ConnectionReset,
    };
    Classification {
        message: Some(e.to_string()),
        ..classify_transport(kind)
    }
}

/// The `usage` member of an OpenAI response; every other member is skipped while parsing.
#[derive(serde::Deserialize)]
struct UsageOnly {
    #[serde(default)]
    usage: Option<openai::Usage>,
}

/// The `usage` member of an OpenAI embeddings response; the vectors are skipped unbuilt.
#[derive(serde::Deserialize)]
struct EmbeddingsUsageOnly {
    #[serde(default)]
    usage: Option<openai::EmbeddingsUsage>,
}

/// Translates a whole upstream response into the client's dialect, with its usage.
fn translate_response(
    app: &App,
    op: ClientOp,
    kind: ProviderKind,
    body: &Bytes,
) -> Result<(Bytes, Option<NormalizedUsage>), String> {
    let parse_err = |e: serde_json::Error| format!("provider response does not parse: {e}");
    match (op, kind) {
        (ClientOp::Chat, ProviderKind::OpenAi) => {
            // Passed through unchanged: read only the usage, skipping the rest unbuilt.
            let r: UsageOnly = serde_json::from_slice(body).map_err(parse_err)?;
            Ok((
                body.clone(),
                r.usage.as_ref().map(NormalizedUsage::from_openai),
            ))
        }
        (ClientOp::Chat, ProviderKind::Anthropic) => {
            let r: anthropic::MessagesResponse = serde_json::from_slice(body).map_err(parse_err)?;
            let usage = NormalizedUsage::from_anthropic(&r.usage);
            let out = translate::anthropic_to_openai_response(r, unix_now(app));
            Ok((
                Bytes::from(serde_json::to_vec(&out).map_err(parse_err)?),
                Some(usage),
            ))
        }
        (ClientOp::Messages, ProviderKind::Anthropic) => {
            let r: anthropic::MessagesResponse = serde_json::from_slice(body).map_err(parse_err)?;
            Ok((
                body.clone(),
                Some(NormalizedUsage::from_anthropic(&r.usage)),
            ))
        }
        (ClientOp::Messages, ProviderKind::OpenAi) => {
            let r: openai::ChatResponse = serde_json::from_slice(body).map_err(parse_err)?;
            let usage = r.usage.as_ref().map(NormalizedUsage::from_openai);
            let out = translate::openai_to_anthropic_response(r).map_err(|e| e.to_string())?;
            Ok((
                Bytes::from(serde_json::to_vec(&out).map_err(parse_err)?),
                usage,
            ))
        }
        (ClientOp::Embeddings, _) => {
            // Typed, so the vectors are skipped unbuilt (a `Value` tree of every float cost more
            // than the rest of the answer); a `usage` of another shape still reads as 0 tokens.
            let prompt = match serde_json::from_slice::<EmbeddingsUsageOnly>(body) {
                Ok(r) => r.usage.map_or(0, |u| u.prompt_tokens),
                Err(_) => serde_json::from_slice::<Value>(body)
                    .map_err(parse_err)?
                    .pointer("/usage/prompt_tokens")
                    .and_then(Value::as_u64)
                    .unwrap_or(0),
            };
            Ok((
                body.clone(),
                Some(NormalizedUsage {
                    input_uncached: prompt,
                    ..NormalizedUsage::estimated(0, 0)
                }),
            ))
        }
        (ClientOp::Rerank, _) => {
            let _: serde::de::IgnoredAny = serde_json::from_slice(body).map_err(parse_err)?;
            Ok((body.clone(), None))
        }
        (ClientOp::Transcription, _) => {
            // Every adapter answers OpenAI's `{"text", "usage"}`.
            let usage = crate::transcription::usage_of(body)?;
            Ok((body.clone(), usage))
        }
    }
}

fn translator(
    app: &App,
    op: ClientOp,
    kind: ProviderKind,
    client_wants_usage: bool,
) -> StreamTranslator {
    match (op, kind) {
        (ClientOp::Messages, ProviderKind::Anthropic) => StreamTranslator::anthropic_passthrough(),
        (ClientOp::Messages, ProviderKind::OpenAi) => StreamTranslator::openai_to_anthropic(),
        (_, ProviderKind::Anthropic) => {
            StreamTranslator::anthropic_to_openai(unix_now(app), client_wants_usage)
        }
        (_, ProviderKind::OpenAi) => StreamTranslator::openai_passthrough(client_wants_usage),
    }
}

fn provider_dialect(kind: ProviderKind) -> Dialect {
    match kind {
        ProviderKind::OpenAi => Dialect::OpenAi,
        ProviderKind::Anthropic => Dialect::Anthropic,
    }
}

/// Reads a stream up to its first content (holding the preamble), then commits it.
#[allow(clippy::too_many_arguments)]
async fn stream_attempt(
    app: &Arc<App>,
    mut guard: AttemptGuard,
    kind: ProviderKind,
    req: &ClientRequest,
    response: UpstreamResponse,
    mut parser: Box<dyn StreamDecoder>,
    first_token_deadline: tokio::time::Instant,
    deadline: switchyard_core::time::Instant,
) -> Attempt {
    let upstream_dialect = provider_dialect(kind);
    // Delivered output of a stream cut before usage is counted with the router's tokenizer
    // when something configured counts tokens; otherwise at about four bytes per token, so a
    // cut stream never loads the vocabulary on the request path (issue 16 item 1).
    let count: fn(&str) -> u64 = if app.runtime.live().table.needs_tokens {
        crate::estimate::count_tokens
    } else {
        crate::estimate::approximate_tokens
    };
    let mut translator =
        translator(app, req.op, kind, req.client_wants_usage).count_output_with(count);
    let mut body = response.body;
    let mut held = BytesMut::new();
    let sent_at = guard.started;
    loop {
        let chunk = match tokio::time::timeout_at(first_token_deadline, body.next()).await {
            Err(_) => {
                let remaining = deadline.saturating_since(app.clock.now());
                let c = if remaining.is_zero() {
                    classify_transport(TransportFailure::RequestDeadline)
                } else {
                    classify_transport(TransportFailure::FirstTokenTimeout)
                };
                return fail(guard, c);
            }
            Ok(None) => {
                let c = Classification {
                    message: Some("stream ended before any content".to_owned()),
                    code: Some("empty_stream".to_owned()),
                    ..Classification::new(ErrorClass::Server)
                };
                return fail(guard, c);
            }
            Ok(Some(Err(e))) => return fail(guard, transport_class(&e)),
            Ok(Some(Ok(chunk))) => chunk,
        };
        let items = parser.push(&chunk);
        for (i, item) in items.iter().enumerate() {
            match stream_classify::classify(upstream_dialect, item) {
                stream_classify::StreamClass::Error(payload) => {
                    // Usage the provider reported before failing (e.g. in a stream's start
                    // event) was billed: it is charged as this attempt's own line (issue 14).
                    guard.partial = translator.usage().reported();
                    return fail(guard, classify_stream_error_at(&payload, app.clock.wall()));
                }
                stream_classify::StreamClass::Malformed
                | stream_classify::StreamClass::Incomplete => {
                    let c = Classification {
                        message: Some("malformed stream event before content".to_owned()),
                        code: Some("malformed_stream".to_owned()),
                        ..Classification::new(ErrorClass::Server)
                    };
                    return fail(guard, c);
                }
                class => {
                    if let SseItem::Comment(_) = item {
                        // Keep-alives before content prove liveness only; they are not held.
                        continue;
                    }
                    match translator.push(item) {
                        Ok(out) => out
                            .iter()
                            .for_each(|o| held.extend_from_slice(&encode_item(o))),
                        Err(e) => {
                            let c = Classification {
                                message: Some(e.to_string()),
                                code: Some("invalid_upstream_stream".to_owned()),
                                ..Classification::new(ErrorClass::Server)
                            };
                            return fail(guard, c);
                        }
                    }
                    if matches!(
                        class,
                        stream_classify::StreamClass::Content
                            | stream_classify::StreamClass::Finish
                    ) {
                        let rest: Vec<SseItem> = items[i + 1..].to_vec();
                        app.metrics
                            .ttft
                            .get_or_create(&label(guard.config()))
                            .observe(sent_at.elapsed().as_secs_f64());
                        guard.first_token = Some(guard.started.elapsed());
                        return Attempt::Served(commit(
                            app.clone(),
                            guard,
                            req.op.dialect(),
                            translator,
                            parser,
                            body,
                            held.freeze(),
                            rest,
                            deadline,
                            req.estimated_input_tokens,
                        ));
                    }
                }
            }
        }
    }
}

/// Scheduler turns a committed stream gives the upstream connection before it flushes what it
/// holds to the client.
///
/// hyper hands a response body over one chunk at a time from the connection's own task, so a
/// chunk already read from the socket is not ready for the stream until that task has run,
/// which takes two turns (the stream's demand reaches the task, then the task decodes and
/// sends). Without these turns every SSE event of a fast provider cost its own write on the
/// client socket: 13 `writev` per 8-token stream from the bench mock (`strace`), against one
/// read of the whole answer upstream. When nothing is in flight the turns cost a few
/// microseconds before the flush; a provider pacing its tokens is not slowed by more.
const YIELDS_BEFORE_FLUSH: u32 = 3;

/// Turns a committed upstream stream into the client's response body.
#[allow(clippy::too_many_arguments)]
fn commit(
    app: Arc<App>,
    guard: AttemptGuard,
    client_dialect: Dialect,
    mut translator: StreamTranslator,
    mut parser: Box<dyn StreamDecoder>,
    mut upstream: crate::upstream::UpstreamBody,
    held: Bytes,
    rest: Vec<SseItem>,
    deadline: switchyard_core::time::Instant,
    estimated_input: u64,
) -> Response {
    // Output is written in as few frames as possible: everything the provider has already
    // sent is translated into one buffer, which is flushed only when the next read would
    // wait. Each frame is a write on the client socket, and with an eager provider a frame per
    // event doubled the router's CPU per stream (docs/benchmarks.md).
    let stream = async_stream::stream! {
        let mut guard = Some(guard);
        let mut out = BytesMut::from(&held[..]);
        let mut pending = rest;
        let mut failure: Option<(ErrorClass, String)> = None;
        'pump: loop {
            for item in pending.drain(..) {
                if let SseItem::Incomplete(_) = item {
                    failure = Some((ErrorClass::Server, "the provider's stream was cut mid-event".to_owned()));
                    break 'pump;
                }
                match translator.push(&item) {
                    Ok(items) => items.iter().for_each(|o| out.extend_from_slice(&encode_item(o))),
                    Err(e) => {
                        failure = Some((ErrorClass::Server, e.to_string()));
                        break 'pump;
                    }
                }
                if translator.is_errored() {
                    failure = Some((ErrorClass::Server, "the provider reported an error mid-stream".to_owned()));
                    break 'pump;
                }
            }
            if translator.is_finished() {
                break 'pump;
            }
            // Before a flush, give the upstream connection's task a chance to hand over what
            // it has already read ([`YIELDS_BEFORE_FLUSH`]).
            let mut next = upstream.next().now_or_never();
            let mut tries = 0;
            while next.is_none() && !out.is_empty() && tries < YIELDS_BEFORE_FLUSH {
                tries += 1;
                tokio::task::yield_now().await;
                next = upstream.next().now_or_never();
            }
            let next = match next {
                Some(next) => next,
                None => {
                    // The client may go away at either await below: what it got so far is
                    // what gets charged then (field case 17).
                    if let Some(g) = guard.as_mut() {
                        g.partial = Some(translator.usage().finish(estimated_input));
                    }
                    if !out.is_empty() {
                        yield Ok::<Bytes, std::convert::Infallible>(out.split().freeze());
                    }
                    match tokio::time::timeout_at(app.clock.to_tokio(deadline), upstream.next()).await {
                        Ok(next) => next,
                        Err(_) => {
                            failure = Some((ErrorClass::Deadline, "the request deadline passed mid-stream".to_owned()));
                            break 'pump;
                        }
                    }
                }
            };
            match next {
                None => {
                    // A clean end of the body. A half event left in the parser is dropped; a
                    // provider that signalled the end but omitted its terminator gets one from
                    // the translator; anything else was truncated.
                    let mut tail = None;
                    for item in parser.finish() {
                        match item {
                            SseItem::Incomplete(_) => tail = Some(item),
                            other => match translator.push(&other) {
                                Ok(items) => items.iter().for_each(|o| out.extend_from_slice(&encode_item(o))),
                                Err(e) => {
                                    failure = Some((ErrorClass::Server, e.to_string()));
                                    break 'pump;
                                }
                            },
                        }
                    }
                    if !translator.is_finished() {
                        translator.finish().iter().for_each(|o| out.extend_from_slice(&encode_item(o)));
                    }
                    if !translator.is_finished() {
                        let what = if tail.is_some() { "was cut mid-event" } else { "ended without finishing" };
                        failure = Some((ErrorClass::Server, format!("the provider's stream {what}")));
                    }
                    break 'pump;
                }
                Some(Err(e)) => {
                    failure = Some((ErrorClass::Connect, format!("the provider's stream broke: {e}")));
                    break 'pump;
                }
                Some(Ok(chunk)) => pending.extend(parser.push(&chunk)),
            }
        }
        // Never record a stream as zero usage: reported figures when final, else estimates
        // (field cases 15, 17).
        let usage = translator.usage().finish(estimated_input);
        let mut log = None;
        if let Some(mut g) = guard.take() {
            if failure.is_some() {
                log = Some(g.log_span());
            }
            g.partial = Some(usage);
            if !g.spans.request.is_disabled() {
                g.finish_reasons = translator.finish_reasons();
            }
            match &failure {
                None => g.succeed(Some(&usage)),
                Some((class, _)) => g.fail(*class),
            }
        }
        if let Some((class, message)) = &failure {
            log.unwrap_or_else(tracing::Span::none).in_scope(|| {
                tracing::warn!(class = %class, "stream failed after content; ending it with an error event");
            });
            let status = if *class == ErrorClass::Deadline { 504 } else { 502 };
            let event = error_event(client_dialect, status, message, Some("stream_interrupted"));
            out.extend_from_slice(&encode_item(&SseItem::Event(event)));
        }
        if !out.is_empty() {
            yield Ok(out.split().freeze());
        }
    };
    let mut response = Response::new(Body::from_stream(stream));
    let headers = response.headers_mut();
    headers.insert(
        header::CONTENT_TYPE,
        HeaderValue::from_static("text/event-stream"),
    );
    headers.insert(header::CACHE_CONTROL, HeaderValue::from_static("no-cache"));
    response
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn exhausted_error_class_maps_to_status_and_code() {
        let cases = [
            (
                ErrorClass::Capacity,
                StatusCode::TOO_MANY_REQUESTS,
                "provider_capacity",
            ),
            (
                ErrorClass::Policy,
                StatusCode::TOO_MANY_REQUESTS,
                "provider_quota_exhausted",
            ),
            (
                ErrorClass::Overload,
                StatusCode::SERVICE_UNAVAILABLE,
                "provider_overloaded",
            ),
            (
                ErrorClass::Timeout,
                StatusCode::GATEWAY_TIMEOUT,
                "provider_timeout",
            ),
            (
                ErrorClass::Connect,
                StatusCode::BAD_GATEWAY,
                "provider_unreachable",
            ),
            (
                ErrorClass::Server,
                StatusCode::BAD_GATEWAY,
                "provider_error",
            ),
        ];
        for (class, status, code) in cases {
            let e = exhausted_error(&Classification::new(class), false);
            assert_eq!((e.status, e.code.as_str()), (status, code), "{class}");
        }
        let e = exhausted_error(&Classification::new(ErrorClass::Overload), true);
        assert_eq!(
            (e.status, e.code.as_str()),
            (StatusCode::FORBIDDEN, "region_unavailable")
        );
    }
}
