//! Quota buckets and all-or-nothing reservations: the decision half of the rate-limit broker
//! (DESIGN §3 steps 2, 6, 8 and §4.7; seed 001, "provider-neutral rate-limit broker").
//!
//! **Model.** A bucket is a scope (API key, tenant, route, provider, provider quota group) × a
//! dimension (requests, input tokens, output tokens, total tokens, concurrency, spend in
//! micro-USD) × a rule. A request's estimate ([`Demand`]) is *reserved* on every bucket that
//! applies to it — the caller lists them: the API key, the tenant and each ancestor, the route,
//! the chosen provider and its quota group — or on none of them. After the provider answers, the
//! reservation is *reconciled* with the reported [`Usage`]: unused estimate is credited back, an
//! overrun is charged. Abandoned reservations expire; a dropped request releases its
//! concurrency slot.
//!
//! **Rules.**
//! - [`Rule::TokenBucket`]: capacity `C` refilled continuously at `C / period`, starting full.
//!   No timers: the level is computed lazily from the last update and `now`,
//!   `level(now) = min(C, level(t) + C · (now − t) / period)`. Over any interval of length `t`
//!   it admits at most `C + C · t / period` units (the burst plus the refill), so it is the
//!   right model for providers that refill continuously (most per-minute vendor limits), and a
//!   smooth choice for tenant limits. Source: the token bucket (Turner, 1986; RFC 2697/2698).
//! - [`Rule::FixedWindow`]: at most `C` units per window. Windows are `period` long and aligned
//!   to the Unix epoch (a "per minute" window resets at every UTC minute), or, with `reset_at`,
//!   whole local days in a time zone starting at `hh:mm` (daily quotas, spend caps), computed
//!   with `chrono-tz` so days are 23 or 25 hours long across DST changes. Use it when the limit
//!   means "at most `C` in this minute/day" (field case 10), which a token bucket cannot promise.
//! - [`Rule::Concurrency`]: one slot per reservation, held until reconcile/release/expiry.
//!
//! **Arithmetic.** Token-bucket levels are exact integers: the level is stored in
//! unit-nanoseconds (`units × period_ns`, an `i128`), so refill adds `C × elapsed_ns` and a
//! demand `d` fits when `d × period_ns ≤ level`. No floating-point drift, so "admit exactly the
//! cap" holds exactly. The wait until a demand fits is `⌈(d × period_ns − level) / C⌉` ns; it
//! is a lower bound for `Retry-After` because nothing but time adds units to the bucket.
//!
//! **Overrun.** Reconciliation may charge more than was reserved (the estimate was low). The
//! bucket then goes *negative* and refuses everything, even zero-cost demands, until refill (or
//! the next window) brings it back to the demand. This keeps the long-run rate at the limit: the
//! overrun is paid for by waiting instead of being forgiven. Fixed windows charge an overrun to
//! the window current at reconciliation; a credit for a window that has already closed is
//! dropped (that window's usage no longer matters).
//!
//! **Aborted requests.** [`Ledger::release`] with `Some(usage)` charges what was really used
//! (field case 17); with `None` (nothing reported) it keeps the estimate, because charging 0
//! would let an uncounted request through for free (field case 15 forbids zero records).
//! [`Ledger::cancel`] is for a request that never left the router (every unit credited back).
//! Concurrency is freed on every exit path (field case 13).
//!
//! **Alternatives rejected.** GCRA (the generic cell rate algorithm of ATM, as used by
//! `governor` and redis-cell) stores one theoretical arrival time per bucket instead of a level;
//! for a token bucket it is the same admission decision (`TAT = now + (cap − level)/rate`) and a
//! Redis store may well keep it that way, but credits, header corrections and debts read more
//! plainly as level arithmetic. A sliding log of every admission is exact over any window but
//! costs memory per request; the sliding-window counter (two weighted fixed windows) is an
//! approximation that can overshoot. Checking buckets one by one and debiting as we go would
//! need a rollback on refusal; here every bucket is checked first and debited only when all
//! have room, so a refusal changes nothing.

use std::collections::HashMap;
use std::time::Duration;

use chrono::{DateTime, Days, NaiveDate, NaiveDateTime, NaiveTime, TimeZone, Utc};
use chrono_tz::Tz;
use smallvec::SmallVec;

use crate::time::Instant;

/// What a bucket counts.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Dimension {
    /// Requests (RPM, requests per day).
    Requests,
    /// Input (prompt) tokens (ITPM); cache reads count only with `count_cached_input`.
    InputTokens,
    /// Output (completion) tokens (OTPM).
    OutputTokens,
    /// Input + output tokens (same cache rule as input).
    TotalTokens,
    /// Requests in flight; must use [`Rule::Concurrency`].
    Concurrency,
    /// Spend in micro-USD (1 USD = 1,000,000).
    SpendMicroUsd,
}

impl Dimension {
    /// The dimension's name in reason codes and metrics: `requests`, `input_tokens`,
    /// `output_tokens`, `total_tokens`, `concurrency`, `spend`.
    pub const fn label(self) -> &'static str {
        match self {
            Dimension::Requests => "requests",
            Dimension::InputTokens => "input_tokens",
            Dimension::OutputTokens => "output_tokens",
            Dimension::TotalTokens => "total_tokens",
            Dimension::Concurrency => "concurrency",
            Dimension::SpendMicroUsd => "spend",
        }
    }
}

/// Who a bucket belongs to. The name is the resource's name (tenant, route, provider, quota
/// group) or an API key's *hash*, never the key itself.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub enum Scope {
    /// One API key (by hash).
    ApiKey(String),
    /// A TenantQuota (a tenant's ancestors are separate `Tenant` buckets in the same reservation).
    Tenant(String),
    /// A RoutingPolicy (public model name).
    Route(String),
    /// One LLMProvider's own limit.
    Provider(String),
    /// A limit several providers share (e.g. one cloud project).
    QuotaGroup(String),
}

impl Scope {
    /// The kind of scope in reason codes: `api_key`, `tenant`, `route`, `provider`, `quota_group`.
    pub const fn kind_label(&self) -> &'static str {
        match self {
            Scope::ApiKey(_) => "api_key",
            Scope::Tenant(_) => "tenant",
            Scope::Route(_) => "route",
            Scope::Provider(_) => "provider",
            Scope::QuotaGroup(_) => "quota_group",
        }
    }

    /// The scope's name.
    pub fn name(&self) -> &str {
        match self {
            Scope::ApiKey(n)
            | Scope::Tenant(n)
            | Scope::Route(n)
            | Scope::Provider(n)
            | Scope::QuotaGroup(n) => n,
        }
    }

    /// Whether the limit is the provider's (a refusal means "spill to the next provider", not
    /// "the caller is over its quota").
    pub const fn is_provider_side(&self) -> bool {
        matches!(self, Scope::Provider(_) | Scope::QuotaGroup(_))
    }
}

/// How a bucket admits and refills. Capacities are in the dimension's unit (requests, tokens,
/// slots, micro-USD).
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Rule {
    /// Continuous refill: `capacity` per `period`, burst `capacity`, starts full.
    TokenBucket {
        /// Burst size and units refilled per `period`.
        capacity: u64,
        /// Refill period (> 0).
        period: Duration,
    },
    /// At most `capacity` per window; the window resets to 0 used at its end.
    FixedWindow {
        /// Units per window.
        capacity: u64,
        /// Window length (> 0); with `reset_at`, a whole number of days.
        period: Duration,
        /// Local reset time `(hour, minute)` in `tz`; `None` aligns windows to the Unix epoch
        /// in UTC and ignores `tz`.
        reset_at: Option<(u8, u8)>,
        /// Time zone of `reset_at`.
        tz: Tz,
    },
    /// Held until release: at most `limit` reservations at once.
    Concurrency {
        /// Maximum simultaneous reservations.
        limit: u64,
    },
}

impl Rule {
    fn same_kind(&self, other: &Rule) -> bool {
        std::mem::discriminant(self) == std::mem::discriminant(other)
    }
}

/// One bucket's configuration.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct BucketSpec {
    /// Stable unique name, e.g. `tenant/t1/input_tokens/1m`; re-registering a key updates it.
    pub key: String,
    /// Whose limit this is.
    pub scope: Scope,
    /// What it counts.
    pub dimension: Dimension,
    /// How it admits and refills.
    pub rule: Rule,
    /// Whether cache-read input tokens count toward input/total tokens (some vendors exclude
    /// them from ITPM). Cache writes always count.
    pub count_cached_input: bool,
}

/// A bucket interned by a [`Ledger`]; valid only for the ledger that issued it.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct BucketId(u32);

impl BucketId {
    /// The index inside its ledger (for metrics labels and debugging).
    pub const fn index(self) -> u32 {
        self.0
    }

    /// An id from a plain index. Stores that keep buckets elsewhere (Redis) use it to name the
    /// binding bucket of a [`Refusal`] by its position in the caller's bucket list.
    pub const fn from_index(index: u32) -> Self {
        BucketId(index)
    }
}

impl BucketSpec {
    /// Checks the spec the way [`Ledger::register`] does (period, reset time, dimension and
    /// rule agree), so a remote store applies the same rules. Errors: see [`SpecError`].
    pub fn validate(&self) -> Result<(), SpecError> {
        validate(self)
    }

    /// The reason code a refusal by this bucket carries, e.g. `tenant_input_tokens_per_minute`,
    /// `tenant_spend`, `tenant_concurrency`, `provider_capacity` (provider-side scopes never
    /// say more, so nothing about a provider's limits leaks to callers).
    pub fn reason_code(&self) -> String {
        reason_code(self)
    }

    /// Units this bucket takes for a reservation of `d`: requests, input (+ cache reads when
    /// `count_cached_input`), output, total, one concurrency slot, or micro-USD.
    pub fn demand_amount(&self, d: &Demand) -> u64 {
        let cached = if self.count_cached_input {
            d.cached_input_tokens
        } else {
            0
        };
        match self.dimension {
            Dimension::Requests => d.requests,
            Dimension::InputTokens => d.input_tokens.saturating_add(cached),
            Dimension::OutputTokens => d.output_tokens,
            Dimension::TotalTokens => d
                .input_tokens
                .saturating_add(cached)
                .saturating_add(d.output_tokens),
            Dimension::Concurrency => 1,
            Dimension::SpendMicroUsd => d.spend_micro_usd,
        }
    }

    /// Units this bucket is really charged for reported usage `u` of a reservation of `d`
    /// (requests count as sent: `d.requests`; input is uncached + cache writes, + cache reads
    /// when `count_cached_input`).
    pub fn usage_amount(&self, u: &Usage, d: &Demand) -> u64 {
        let cached = if self.count_cached_input {
            u.cache_read
        } else {
            0
        };
        let input = u
            .input_uncached
            .saturating_add(u.cache_write)
            .saturating_add(cached);
        match self.dimension {
            Dimension::Requests => d.requests,
            Dimension::InputTokens => input,
            Dimension::OutputTokens => u.output,
            Dimension::TotalTokens => input.saturating_add(u.output),
            Dimension::Concurrency => 1,
            Dimension::SpendMicroUsd => u.spend_micro_usd,
        }
    }
}

impl Rule {
    /// For a [`Rule::FixedWindow`], the window containing `wall`: `(epoch, start, end)`, where
    /// `epoch` numbers windows (window index since the Unix epoch, or the local day number a
    /// `reset_at` window starts on) and `end` is exclusive. `None` for other rules. Remote
    /// stores compute boundaries here so time zones and DST follow the same code.
    pub fn window_at(&self, wall: DateTime<Utc>) -> Option<(i64, DateTime<Utc>, DateTime<Utc>)> {
        match self {
            Rule::FixedWindow {
                period,
                reset_at,
                tz,
                ..
            } => Some(window_at(wall, *period, *reset_at, *tz)),
            _ => None,
        }
    }
}

/// A live reservation: slot and generation, so a settled id never matches a later reservation.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct ReservationId {
    slot: u32,
    generation: u32,
}

impl ReservationId {
    /// A stable 64-bit form for logs and for records kept by a remote store.
    pub const fn as_u64(self) -> u64 {
        ((self.generation as u64) << 32) | self.slot as u64
    }
}

/// A request's estimated cost, reserved before sending (DESIGN §3 step 2). All counts are
/// upper-bound estimates: input from the tokenizer, output from `max_tokens`, spend in
/// micro-USD from the model's prices.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct Demand {
    /// Requests (normally 1).
    pub requests: u64,
    /// Input tokens not expected from the prompt cache (includes expected cache writes).
    pub input_tokens: u64,
    /// Input tokens expected to be cache reads.
    pub cached_input_tokens: u64,
    /// Output tokens (the output allowance, e.g. `max_tokens`).
    pub output_tokens: u64,
    /// Worst-case spend in micro-USD.
    pub spend_micro_usd: u64,
}

/// Usage the provider reported, normalised the same way for every vendor (field case 16):
/// `input_uncached` excludes both cache reads and cache writes.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct Usage {
    /// Input tokens processed without the cache.
    pub input_uncached: u64,
    /// Input tokens read from the prompt cache.
    pub cache_read: u64,
    /// Input tokens written to the prompt cache.
    pub cache_write: u64,
    /// Output tokens.
    pub output: u64,
    /// Actual spend in micro-USD.
    pub spend_micro_usd: u64,
}

/// How long until a refusing bucket could admit the demand.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Wait {
    /// Time alone makes room after this long (refill or window reset); a lower bound for
    /// `Retry-After`.
    After(Duration),
    /// A concurrency slot must be released first; the moment is unknown (queue, or answer with
    /// a short configured `Retry-After`).
    OnRelease,
    /// The demand exceeds the bucket's capacity: it will never fit.
    Never,
}

impl Wait {
    /// The wait in whole seconds rounded up (the `Retry-After` header value), when it is known.
    pub fn header_secs(self) -> Option<u64> {
        match self {
            Wait::After(d) => Some(d.as_secs() + u64::from(d.subsec_nanos() > 0)),
            Wait::OnRelease | Wait::Never => None,
        }
    }

    /// Ranking for "the binding bucket": never > longest time wait > release.
    fn rank(self) -> (u8, Duration) {
        match self {
            Wait::Never => (2, Duration::MAX),
            Wait::After(d) => (1, d),
            Wait::OnRelease => (0, Duration::ZERO),
        }
    }
}

/// Figures for `x-ratelimit-limit`, `x-ratelimit-remaining` and `x-ratelimit-reset`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct RateFigures {
    /// The bucket's capacity (units per period or window, or concurrency limit).
    pub limit: u64,
    /// Units available now (0 when the bucket is in debt).
    pub remaining: u64,
    /// Time until the bucket is full again (token bucket) or the window resets; zero for
    /// concurrency.
    pub reset_after: Duration,
}

/// Why a reservation was refused: the binding bucket and what to tell the caller.
///
/// When several buckets lack room, the binding one is the one with the longest wait
/// ([`Wait::Never`] first, then the longest [`Wait::After`], then [`Wait::OnRelease`]), so its
/// `Retry-After` is no shorter than the wait of any other refusing bucket.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Refusal {
    /// The binding bucket.
    pub bucket: BucketId,
    /// Its key.
    pub key: String,
    /// Its scope (for provider scopes, do not show the figures to tenants).
    pub scope: Scope,
    /// Its dimension.
    pub dimension: Dimension,
    /// Low-cardinality reason code, e.g. `tenant_input_tokens_per_minute`, `tenant_spend`,
    /// `tenant_concurrency`, `api_key_requests_per_day`, `provider_capacity`.
    pub reason: String,
    /// How long until this bucket has room for the demand.
    pub wait: Wait,
    /// The demand this bucket was asked for, in its unit.
    pub demanded: u64,
    /// Header figures of the binding bucket at the time of refusal.
    pub figures: RateFigures,
}

impl Refusal {
    /// `Retry-After` as a duration: `Some` only when time alone makes room.
    pub fn retry_after(&self) -> Option<Duration> {
        match self.wait {
            Wait::After(d) => Some(d),
            Wait::OnRelease | Wait::Never => None,
        }
    }

    /// Whether the demand can never fit this bucket (reject; queueing is pointless).
    pub fn exceeds_capacity(&self) -> bool {
        self.wait == Wait::Never
    }
}

/// Errors from [`Ledger::reserve`].
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum ReserveError {
    /// A bucket has no room; nothing was debited.
    #[error("quota refused by {}: {}", .0.key, .0.reason)]
    Refused(Box<Refusal>),
    /// A bucket id from another ledger (a caller bug); nothing was debited.
    #[error("unknown bucket {0:?}")]
    UnknownBucket(BucketId),
}

impl ReserveError {
    /// The refusal, if this is one.
    pub fn refusal(&self) -> Option<&Refusal> {
        match self {
            ReserveError::Refused(r) => Some(r),
            ReserveError::UnknownBucket(_) => None,
        }
    }
}

/// Errors from settling a reservation twice (or one that expired): the call changed nothing.
#[derive(Debug, Clone, Copy, PartialEq, Eq, thiserror::Error)]
pub enum SettleError {
    /// Already reconciled, released, cancelled or expired (or never issued by this ledger).
    #[error("reservation {} is not live (already settled or expired)", .0.as_u64())]
    NotLive(ReservationId),
}

/// Errors from [`Ledger::register`].
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum SpecError {
    /// A token bucket or window with a zero period.
    #[error("bucket {0}: period must be positive")]
    ZeroPeriod(String),
    /// A local reset time with a period that is not a whole number of days.
    #[error("bucket {0}: a reset time needs a period of whole days")]
    ResetNeedsWholeDays(String),
    /// A reset time outside 00:00..23:59.
    #[error("bucket {0}: reset time must be within 00:00..23:59")]
    BadResetTime(String),
    /// Concurrency dimension without the concurrency rule, or the reverse.
    #[error("bucket {0}: the concurrency dimension goes with the concurrency rule and only it")]
    DimensionRuleMismatch(String),
    /// Re-registering a key with another dimension (reservations in flight count the old one).
    #[error("bucket {0}: a registered bucket cannot change its dimension")]
    DimensionChanged(String),
    /// More than `u32::MAX` buckets.
    #[error("too many buckets")]
    TooManyBuckets,
}

/// A bucket id that this ledger did not issue.
#[derive(Debug, Clone, Copy, PartialEq, Eq, thiserror::Error)]
#[error("unknown bucket {0:?}")]
pub struct UnknownBucket(pub BucketId);

/// The estimate of a settled reservation, for estimation-error metrics.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Settled {
    /// What was reserved.
    pub demand: Demand,
}

/// A reservation removed by [`Ledger::expire`]: its estimate stays charged, its concurrency
/// slots are freed. Returned so the caller can log and count it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Expired {
    /// The reservation.
    pub id: ReservationId,
    /// Its estimate (kept as the charge).
    pub demand: Demand,
    /// When it expired.
    pub expires_at: Instant,
    /// The buckets it held.
    pub buckets: Vec<BucketId>,
}

const NANOS_PER_DAY: u64 = 86_400 * 1_000_000_000;

#[derive(Debug, Clone)]
enum State {
    /// Level in unit-nanoseconds (units × `period_ns`); may be negative after an overrun.
    Token {
        capacity: u64,
        period_ns: i128,
        level: i128,
        updated: Instant,
    },
    Window {
        capacity: u64,
        used: u64,
        /// Identifies the current window (window index, or the local day number it starts on).
        epoch: i64,
        start: DateTime<Utc>,
        end: DateTime<Utc>,
    },
    Held {
        limit: u64,
        held: u64,
    },
}

#[derive(Debug, Clone)]
struct Bucket {
    spec: BucketSpec,
    reason: String,
    state: State,
}

fn dur_nanos_i128(d: Duration) -> i128 {
    i128::try_from(d.as_nanos()).unwrap_or(i128::MAX)
}

fn nanos_to_duration(n: i128) -> Duration {
    if n <= 0 {
        Duration::ZERO
    } else {
        Duration::from_nanos(u64::try_from(n).unwrap_or(u64::MAX))
    }
}

fn ceil_div(a: i128, b: i128) -> i128 {
    if b <= 0 {
        return i128::MAX;
    }
    let q = a.div_euclid(b);
    if a.rem_euclid(b) == 0 {
        q
    } else {
        q.saturating_add(1)
    }
}

fn to_i64(x: i128) -> i64 {
    i64::try_from(x).unwrap_or(if x < 0 { i64::MIN } else { i64::MAX })
}

fn period_word(rule: &Rule) -> Option<&'static str> {
    let period = match rule {
        Rule::TokenBucket { period, .. } | Rule::FixedWindow { period, .. } => *period,
        Rule::Concurrency { .. } => return None,
    };
    match period.as_nanos() {
        1_000_000_000 => Some("second"),
        60_000_000_000 => Some("minute"),
        3_600_000_000_000 => Some("hour"),
        86_400_000_000_000 => Some("day"),
        _ => None,
    }
}

/// Reason code for refusals by this bucket (computed once at registration).
fn reason_code(spec: &BucketSpec) -> String {
    if spec.scope.is_provider_side() {
        return "provider_capacity".to_owned();
    }
    let scope = spec.scope.kind_label();
    let dim = spec.dimension.label();
    match spec.dimension {
        Dimension::Concurrency | Dimension::SpendMicroUsd => format!("{scope}_{dim}"),
        _ => match period_word(&spec.rule) {
            Some(word) => format!("{scope}_{dim}_per_{word}"),
            None => format!("{scope}_{dim}"),
        },
    }
}

fn validate(spec: &BucketSpec) -> Result<(), SpecError> {
    let key = || spec.key.clone();
    let is_conc_rule = matches!(spec.rule, Rule::Concurrency { .. });
    if is_conc_rule != (spec.dimension == Dimension::Concurrency) {
        return Err(SpecError::DimensionRuleMismatch(key()));
    }
    match &spec.rule {
        Rule::TokenBucket { period, .. } if period.is_zero() => Err(SpecError::ZeroPeriod(key())),
        Rule::FixedWindow {
            period, reset_at, ..
        } => {
            if period.is_zero() {
                return Err(SpecError::ZeroPeriod(key()));
            }
            if let Some((h, m)) = reset_at {
                if *h > 23 || *m > 59 {
                    return Err(SpecError::BadResetTime(key()));
                }
                let ns = period.as_nanos();
                if ns % u128::from(NANOS_PER_DAY) != 0 {
                    return Err(SpecError::ResetNeedsWholeDays(key()));
                }
            }
            Ok(())
        }
        _ => Ok(()),
    }
}

/// The UTC instant of local `date hh:mm` in `tz`. In a DST gap (the local time does not exist)
/// the first valid minute after it; when ambiguous (clocks go back) the earlier instant.
fn local_boundary(tz: Tz, date: NaiveDate, h: u8, m: u8) -> DateTime<Utc> {
    let time = NaiveTime::from_hms_opt(u32::from(h), u32::from(m), 0).unwrap_or(NaiveTime::MIN);
    let mut naive = NaiveDateTime::new(date, time);
    // Gaps are at most a day long (Samoa skipped 2011-12-30); step by minutes past them.
    for _ in 0..(26 * 60) {
        if let Some(t) = tz.from_local_datetime(&naive).earliest() {
            return t.with_timezone(&Utc);
        }
        naive += chrono::TimeDelta::minutes(1);
    }
    Utc.from_utc_datetime(&NaiveDateTime::new(date, time))
}

/// The fixed window containing `wall`: (epoch, start, end).
fn window_at(
    wall: DateTime<Utc>,
    period: Duration,
    reset_at: Option<(u8, u8)>,
    tz: Tz,
) -> (i64, DateTime<Utc>, DateTime<Utc>) {
    match reset_at {
        None => {
            let p = dur_nanos_i128(period).max(1);
            let t = i128::from(
                wall.timestamp_nanos_opt()
                    .unwrap_or(wall.timestamp().saturating_mul(1_000_000_000)),
            );
            let idx = t.div_euclid(p);
            let at = |i: i128| DateTime::from_timestamp_nanos(to_i64(i.saturating_mul(p)));
            (to_i64(idx), at(idx), at(idx.saturating_add(1)))
        }
        Some((h, m)) => {
            let days = (period.as_nanos() / u128::from(NANOS_PER_DAY)).max(1);
            let days = i64::try_from(days).unwrap_or(i64::MAX);
            let mut date = wall.with_timezone(&tz).date_naive();
            if wall < local_boundary(tz, date, h, m) {
                date = date.pred_opt().unwrap_or(date);
            }
            let day_no = date.signed_duration_since(NaiveDate::default()).num_days();
            let start_no = day_no - day_no.rem_euclid(days);
            let start_date = date
                .checked_sub_days(Days::new(u64::try_from(day_no - start_no).unwrap_or(0)))
                .unwrap_or(date);
            let end_date = start_date
                .checked_add_days(Days::new(u64::try_from(days).unwrap_or(1)))
                .unwrap_or(start_date);
            (
                start_no,
                local_boundary(tz, start_date, h, m),
                local_boundary(tz, end_date, h, m),
            )
        }
    }
}

fn fresh_state(rule: &Rule, now: Instant, wall: DateTime<Utc>) -> State {
    match rule {
        Rule::TokenBucket { capacity, period } => {
            let period_ns = dur_nanos_i128(*period).max(1);
            State::Token {
                capacity: *capacity,
                period_ns,
                level: i128::from(*capacity).saturating_mul(period_ns),
                updated: now,
            }
        }
        Rule::FixedWindow {
            capacity,
            period,
            reset_at,
            tz,
        } => {
            let (epoch, start, end) = window_at(wall, *period, *reset_at, *tz);
            State::Window {
                capacity: *capacity,
                used: 0,
                epoch,
                start,
                end,
            }
        }
        Rule::Concurrency { limit } => State::Held {
            limit: *limit,
            held: 0,
        },
    }
}

impl Bucket {
    /// Brings the state to `now`/`wall`: token refill, window roll. Time going backwards is
    /// treated as no time passing (never credits twice, never reopens an old window).
    fn advance(&mut self, now: Instant, wall: DateTime<Utc>) {
        match &mut self.state {
            State::Token {
                capacity,
                period_ns,
                level,
                updated,
            } => {
                if now > *updated {
                    let dt = dur_nanos_i128(now.saturating_since(*updated));
                    let cap = i128::from(*capacity).saturating_mul(*period_ns);
                    *level = level
                        .saturating_add(i128::from(*capacity).saturating_mul(dt))
                        .min(cap);
                    *updated = now;
                }
            }
            State::Window {
                used,
                epoch,
                start,
                end,
                ..
            } => {
                if wall >= *end {
                    if let Rule::FixedWindow {
                        period,
                        reset_at,
                        tz,
                        ..
                    } = &self.spec.rule
                    {
                        let (e, s, n) = window_at(wall, *period, *reset_at, *tz);
                        *epoch = e;
                        *start = s;
                        *end = n;
                    }
                    *used = 0;
                }
            }
            State::Held { .. } => {}
        }
    }

    fn demand_amount(&self, d: &Demand) -> u64 {
        self.spec.demand_amount(d)
    }

    fn usage_amount(&self, u: &Usage, d: &Demand) -> u64 {
        self.spec.usage_amount(u, d)
    }

    /// `None` when `amount` fits now, else how long until it would.
    fn check(&self, amount: u64, wall: DateTime<Utc>) -> Option<Wait> {
        match &self.state {
            State::Token {
                capacity,
                period_ns,
                level,
                ..
            } => {
                let need = i128::from(amount).saturating_mul(*period_ns);
                if need <= *level {
                    None
                } else if amount > *capacity || *capacity == 0 {
                    Some(Wait::Never)
                } else {
                    let wait = ceil_div(need - *level, i128::from(*capacity));
                    Some(Wait::After(nanos_to_duration(wait)))
                }
            }
            State::Window {
                capacity,
                used,
                end,
                ..
            } => {
                if used.saturating_add(amount) <= *capacity {
                    None
                } else if amount > *capacity {
                    Some(Wait::Never)
                } else {
                    Some(Wait::After(
                        (*end - wall).to_std().unwrap_or(Duration::ZERO),
                    ))
                }
            }
            State::Held { limit, held } => {
                if held.saturating_add(amount) <= *limit {
                    None
                } else if amount > *limit {
                    Some(Wait::Never)
                } else {
                    Some(Wait::OnRelease)
                }
            }
        }
    }

    /// Returns the window epoch the debit went to (0 for other rules).
    fn debit(&mut self, amount: u64) -> i64 {
        match &mut self.state {
            State::Token {
                period_ns, level, ..
            } => {
                *level = level.saturating_sub(i128::from(amount).saturating_mul(*period_ns));
                0
            }
            State::Window { used, epoch, .. } => {
                *used = used.saturating_add(amount);
                *epoch
            }
            State::Held { held, .. } => {
                *held = held.saturating_add(amount);
                0
            }
        }
    }

    /// Replaces a reserved `reserved` by `actual` (state already advanced).
    fn settle(&mut self, reserved: u64, actual: u64, charge_epoch: i64) {
        match &mut self.state {
            State::Token {
                capacity,
                period_ns,
                level,
                ..
            } => {
                let delta = (i128::from(reserved) - i128::from(actual)).saturating_mul(*period_ns);
                let cap = i128::from(*capacity).saturating_mul(*period_ns);
                // A credit never lifts the level above capacity; an overrun may go negative.
                *level = level.saturating_add(delta).min(cap);
            }
            State::Window { used, epoch, .. } => {
                if *epoch == charge_epoch {
                    *used = used.saturating_sub(reserved).saturating_add(actual);
                } else {
                    *used = used.saturating_add(actual.saturating_sub(reserved));
                }
            }
            State::Held { held, .. } => {
                *held = held.saturating_sub(reserved);
            }
        }
    }

    /// Signed units available now (negative when in debt).
    fn level(&self) -> i64 {
        match &self.state {
            State::Token {
                period_ns, level, ..
            } => to_i64(level.div_euclid(*period_ns)),
            State::Window { capacity, used, .. } => {
                to_i64(i128::from(*capacity) - i128::from(*used))
            }
            State::Held { limit, held } => to_i64(i128::from(*limit) - i128::from(*held)),
        }
    }

    fn figures(&self, wall: DateTime<Utc>) -> RateFigures {
        let remaining = u64::try_from(self.level().max(0)).unwrap_or(0);
        match &self.state {
            State::Token {
                capacity,
                period_ns,
                level,
                ..
            } => {
                let cap = i128::from(*capacity).saturating_mul(*period_ns);
                let to_full = ceil_div(cap - *level, i128::from(*capacity).max(1));
                RateFigures {
                    limit: *capacity,
                    remaining,
                    reset_after: nanos_to_duration(to_full),
                }
            }
            State::Window { capacity, end, .. } => RateFigures {
                limit: *capacity,
                remaining,
                reset_after: (*end - wall).to_std().unwrap_or(Duration::ZERO),
            },
            State::Held { limit, .. } => RateFigures {
                limit: *limit,
                remaining,
                reset_after: Duration::ZERO,
            },
        }
    }
}

#[derive(Debug, Clone, Copy)]
struct Charge {
    bucket: u32,
    amount: u64,
    epoch: i64,
}

#[derive(Debug, Clone)]
struct Reservation {
    charges: SmallVec<[Charge; 6]>,
    demand: Demand,
    expires_at: Instant,
}

#[derive(Debug, Clone, Default)]
struct Slot {
    generation: u32,
    live: Option<Reservation>,
}

#[derive(Debug, Clone, Copy)]
enum Settlement<'a> {
    Actual(&'a Usage),
    KeepEstimate,
    Nothing,
}

/// The in-process bucket store and reservation book (one router; a Redis store for several
/// replicas applies the same rules in one script per reservation).
///
/// All methods take `now` (monotonic, for refill and expiry) and, where fixed windows may roll,
/// `wall` (UTC wall clock, for window boundaries). Reserve and settle are O(buckets in the
/// reservation) with no allocation on success; [`Ledger::expire`] is O(1) when nothing is due
/// and O(live reservations) otherwise.
#[derive(Debug, Clone, Default)]
pub struct Ledger {
    buckets: Vec<Bucket>,
    by_key: HashMap<String, BucketId>,
    slots: Vec<Slot>,
    free: Vec<u32>,
    live: usize,
    /// A lower bound on the earliest live expiry (`None`: nothing live).
    next_expiry: Option<Instant>,
}

impl Ledger {
    /// An empty ledger.
    pub fn new() -> Self {
        Self::default()
    }

    /// Adds a bucket, or updates the bucket with the same key, and returns its id.
    ///
    /// A new bucket starts full (token bucket), at 0 used in the window containing `wall`, or
    /// with no slots held. An update with the same kind of rule keeps what is consumed
    /// (`capacity − available`) so a config reload neither refills nor drains; a change of
    /// rule kind starts afresh. Errors: see [`SpecError`].
    pub fn register(
        &mut self,
        spec: BucketSpec,
        now: Instant,
        wall: DateTime<Utc>,
    ) -> Result<BucketId, SpecError> {
        validate(&spec)?;
        if let Some(&id) = self.by_key.get(&spec.key) {
            let Some(bucket) = self.buckets.get_mut(id.0 as usize) else {
                return Err(SpecError::TooManyBuckets);
            };
            if bucket.spec.dimension != spec.dimension {
                return Err(SpecError::DimensionChanged(spec.key));
            }
            bucket.advance(now, wall);
            let mut state = fresh_state(&spec.rule, now, wall);
            if bucket.spec.rule.same_kind(&spec.rule) {
                carry_consumption(&bucket.state, &mut state);
            }
            bucket.reason = reason_code(&spec);
            bucket.spec = spec;
            bucket.state = state;
            return Ok(id);
        }
        let index = u32::try_from(self.buckets.len()).map_err(|_| SpecError::TooManyBuckets)?;
        let id = BucketId(index);
        self.by_key.insert(spec.key.clone(), id);
        self.buckets.push(Bucket {
            reason: reason_code(&spec),
            state: fresh_state(&spec.rule, now, wall),
            spec,
        });
        Ok(id)
    }

    /// The id of the bucket registered under `key`.
    pub fn bucket_id(&self, key: &str) -> Option<BucketId> {
        self.by_key.get(key).copied()
    }

    /// The spec of a bucket.
    pub fn spec(&self, id: BucketId) -> Option<&BucketSpec> {
        self.buckets.get(id.0 as usize).map(|b| &b.spec)
    }

    /// Number of live (unsettled, unexpired) reservations.
    pub fn in_flight(&self) -> usize {
        self.live
    }

    /// Reserves `demand` on every bucket in `buckets`, or on none (all-or-nothing).
    ///
    /// Every bucket is brought to `now`/`wall` and checked first; only when all have room is
    /// each debited (token and window dimensions by their share of `demand`, concurrency by one
    /// slot). A bucket listed twice is charged once. The reservation lives until reconciled,
    /// released, cancelled, or `expires_at` passes ([`Ledger::expire`]).
    ///
    /// Errors: [`ReserveError::Refused`] naming the binding bucket (see [`Refusal`]), with no
    /// bucket changed; [`ReserveError::UnknownBucket`] for an id from another ledger.
    pub fn reserve(
        &mut self,
        buckets: &[BucketId],
        demand: Demand,
        now: Instant,
        wall: DateTime<Utc>,
        expires_at: Instant,
    ) -> Result<ReservationId, ReserveError> {
        let mut worst: Option<(u32, u64, Wait)> = None;
        for (i, &id) in buckets.iter().enumerate() {
            if buckets[..i].contains(&id) {
                continue;
            }
            let Some(bucket) = self.buckets.get_mut(id.0 as usize) else {
                return Err(ReserveError::UnknownBucket(id));
            };
            bucket.advance(now, wall);
            let amount = bucket.demand_amount(&demand);
            if let Some(wait) = bucket.check(amount, wall)
                && worst.is_none_or(|(_, _, w)| wait.rank() > w.rank())
            {
                worst = Some((id.0, amount, wait));
            }
        }
        if let Some((index, demanded, wait)) = worst {
            return Err(self.refusal(index, demanded, wait, wall));
        }
        let mut charges = SmallVec::new();
        for (i, &id) in buckets.iter().enumerate() {
            if buckets[..i].contains(&id) {
                continue;
            }
            if let Some(bucket) = self.buckets.get_mut(id.0 as usize) {
                let amount = bucket.demand_amount(&demand);
                let epoch = bucket.debit(amount);
                charges.push(Charge {
                    bucket: id.0,
                    amount,
                    epoch,
                });
            }
        }
        let reservation = Reservation {
            charges,
            demand,
            expires_at,
        };
        self.next_expiry = Some(self.next_expiry.map_or(expires_at, |e| e.min(expires_at)));
        self.live += 1;
        if let Some(slot_no) = self.free.pop()
            && let Some(slot) = self.slots.get_mut(slot_no as usize)
        {
            slot.live = Some(reservation);
            return Ok(ReservationId {
                slot: slot_no,
                generation: slot.generation,
            });
        }
        let slot_no = u32::try_from(self.slots.len()).unwrap_or(u32::MAX);
        self.slots.push(Slot {
            generation: 0,
            live: Some(reservation),
        });
        Ok(ReservationId {
            slot: slot_no,
            generation: 0,
        })
    }

    fn refusal(&self, index: u32, demanded: u64, wait: Wait, wall: DateTime<Utc>) -> ReserveError {
        match self.buckets.get(index as usize) {
            Some(b) => ReserveError::Refused(Box::new(Refusal {
                bucket: BucketId(index),
                key: b.spec.key.clone(),
                scope: b.spec.scope.clone(),
                dimension: b.spec.dimension,
                reason: b.reason.clone(),
                wait,
                demanded,
                figures: b.figures(wall),
            })),
            None => ReserveError::UnknownBucket(BucketId(index)),
        }
    }

    /// Settles a reservation with the provider's reported usage: each bucket is credited the
    /// unused estimate or charged the overrun (see the module docs on overrun), and
    /// concurrency is released. `requests` buckets keep their charge (the request was sent).
    ///
    /// Errors: [`SettleError::NotLive`] if already settled or expired; nothing changes.
    pub fn reconcile(
        &mut self,
        id: ReservationId,
        actual: Usage,
        now: Instant,
        wall: DateTime<Utc>,
    ) -> Result<Settled, SettleError> {
        self.settle(id, Settlement::Actual(&actual), now, wall)
    }

    /// Settles an aborted request (client disconnect, upstream error, deadline). With
    /// `Some(usage)` — what the provider reported or what was counted on the stream — it
    /// charges that, like [`Ledger::reconcile`]; with `None` it keeps the estimate as the
    /// charge (never zero for a request that may have been processed). Concurrency is released
    /// either way.
    ///
    /// Errors: [`SettleError::NotLive`] if already settled or expired; nothing changes.
    pub fn release(
        &mut self,
        id: ReservationId,
        used: Option<Usage>,
        now: Instant,
        wall: DateTime<Utc>,
    ) -> Result<Settled, SettleError> {
        match used {
            Some(u) => self.settle(id, Settlement::Actual(&u), now, wall),
            None => self.settle(id, Settlement::KeepEstimate, now, wall),
        }
    }

    /// Settles a reservation whose request was never sent (e.g. the connection to the
    /// provider failed, or the router gave up before dispatch): every bucket, requests
    /// included, is credited in full and concurrency is released.
    ///
    /// Errors: [`SettleError::NotLive`] if already settled or expired; nothing changes.
    pub fn cancel(
        &mut self,
        id: ReservationId,
        now: Instant,
        wall: DateTime<Utc>,
    ) -> Result<Settled, SettleError> {
        self.settle(id, Settlement::Nothing, now, wall)
    }

    fn take(&mut self, id: ReservationId) -> Option<Reservation> {
        let slot = self.slots.get_mut(id.slot as usize)?;
        if slot.generation != id.generation {
            return None;
        }
        let reservation = slot.live.take()?;
        slot.generation = slot.generation.wrapping_add(1);
        self.free.push(id.slot);
        self.live = self.live.saturating_sub(1);
        if self.live == 0 {
            self.next_expiry = None;
        }
        Some(reservation)
    }

    fn settle(
        &mut self,
        id: ReservationId,
        how: Settlement<'_>,
        now: Instant,
        wall: DateTime<Utc>,
    ) -> Result<Settled, SettleError> {
        let reservation = self.take(id).ok_or(SettleError::NotLive(id))?;
        self.apply(&reservation, how, now, wall);
        Ok(Settled {
            demand: reservation.demand,
        })
    }

    fn apply(
        &mut self,
        reservation: &Reservation,
        how: Settlement<'_>,
        now: Instant,
        wall: DateTime<Utc>,
    ) {
        for charge in &reservation.charges {
            let Some(bucket) = self.buckets.get_mut(charge.bucket as usize) else {
                continue;
            };
            let actual = match (bucket.spec.dimension, how) {
                (Dimension::Concurrency, _) | (_, Settlement::Nothing) => 0,
                (_, Settlement::KeepEstimate) => continue,
                (_, Settlement::Actual(u)) => bucket.usage_amount(u, &reservation.demand),
            };
            if actual == charge.amount {
                continue;
            }
            bucket.advance(now, wall);
            bucket.settle(charge.amount, actual, charge.epoch);
        }
    }

    /// Removes every reservation whose `expires_at` ≤ `now` (abandoned: the caller never
    /// settled it). Estimates stay charged; concurrency slots are freed. Returns them so the
    /// caller can log and count them. O(1) when nothing is due.
    pub fn expire(&mut self, now: Instant) -> Vec<Expired> {
        let mut out = Vec::new();
        match self.next_expiry {
            Some(due) if due <= now => {}
            _ => return out,
        }
        let mut next: Option<Instant> = None;
        for slot_no in 0..self.slots.len() {
            let Some(slot) = self.slots.get(slot_no) else {
                continue;
            };
            let Some(r) = &slot.live else { continue };
            if r.expires_at > now {
                next = Some(next.map_or(r.expires_at, |n| n.min(r.expires_at)));
                continue;
            }
            let id = ReservationId {
                slot: u32::try_from(slot_no).unwrap_or(u32::MAX),
                generation: slot.generation,
            };
            if let Some(reservation) = self.take(id) {
                // Windows are untouched by a kept estimate, so no wall clock is needed here.
                self.apply(
                    &reservation,
                    Settlement::KeepEstimate,
                    now,
                    DateTime::<Utc>::MIN_UTC,
                );
                out.push(Expired {
                    id,
                    demand: reservation.demand,
                    expires_at: reservation.expires_at,
                    buckets: reservation
                        .charges
                        .iter()
                        .map(|c| BucketId(c.bucket))
                        .collect(),
                });
            }
        }
        self.next_expiry = next;
        out
    }

    /// Header figures of a bucket at `now`/`wall` (limit, remaining, time to reset).
    pub fn remaining(
        &mut self,
        bucket: BucketId,
        now: Instant,
        wall: DateTime<Utc>,
    ) -> Option<RateFigures> {
        let b = self.buckets.get_mut(bucket.0 as usize)?;
        b.advance(now, wall);
        Some(b.figures(wall))
    }

    /// The caller's tightest bucket among `buckets` at `now`/`wall`, for the
    /// `x-ratelimit-*` headers of a successful response: the one with the smallest
    /// `remaining / limit`. Provider-side buckets are skipped (they are not the caller's to
    /// see) and so are concurrency buckets (no reset to report). `None` if nothing is left.
    pub fn tightest(
        &mut self,
        buckets: &[BucketId],
        now: Instant,
        wall: DateTime<Utc>,
    ) -> Option<(BucketId, RateFigures)> {
        let mut best: Option<(BucketId, RateFigures)> = None;
        for &id in buckets {
            let Some(b) = self.buckets.get_mut(id.0 as usize) else {
                continue;
            };
            if b.spec.scope.is_provider_side() || b.spec.dimension == Dimension::Concurrency {
                continue;
            }
            b.advance(now, wall);
            let f = b.figures(wall);
            // remaining/limit < best.remaining/best.limit, compared without division.
            let tighter = best.is_none_or(|(_, g)| {
                u128::from(f.remaining) * u128::from(g.limit.max(1))
                    < u128::from(g.remaining) * u128::from(f.limit.max(1))
            });
            if tighter {
                best = Some((id, f));
            }
        }
        best
    }

    /// Signed units available at `now`/`wall`, rounded down (negative while in debt after an
    /// overrun; for concurrency, free slots).
    pub fn level(&mut self, bucket: BucketId, now: Instant, wall: DateTime<Utc>) -> Option<i64> {
        let b = self.buckets.get_mut(bucket.0 as usize)?;
        b.advance(now, wall);
        Some(b.level())
    }

    /// Concurrency slots held on a bucket (0 for other rules).
    pub fn held(&self, bucket: BucketId) -> Option<u64> {
        let b = self.buckets.get(bucket.0 as usize)?;
        Some(match b.state {
            State::Held { held, .. } => held,
            _ => 0,
        })
    }

    /// Calibrates a provider bucket from the provider's rate-limit headers (DESIGN §3 step 8):
    /// `remaining` units left and, when given, `reset_in` until the provider's bucket is full
    /// (token bucket) or its window resets (fixed window). The more pessimistic of the local
    /// and reported view wins: the level is only ever lowered (token bucket: to
    /// `min(local, remaining, capacity − rate × reset_in)`; window: used raised to
    /// `capacity − remaining` and the window end pushed out to `wall + reset_in`).
    /// Concurrency buckets are left alone. Returns whether anything changed.
    ///
    /// Headers are a correction, not the source of truth (seed 001): a limit the provider does
    /// not report keeps its configured model, and a later header never raises the level.
    pub fn correct_from_headers(
        &mut self,
        bucket: BucketId,
        remaining: u64,
        reset_in: Option<Duration>,
        now: Instant,
        wall: DateTime<Utc>,
    ) -> Result<bool, UnknownBucket> {
        let b = self
            .buckets
            .get_mut(bucket.0 as usize)
            .ok_or(UnknownBucket(bucket))?;
        b.advance(now, wall);
        match &mut b.state {
            State::Token {
                capacity,
                period_ns,
                level,
                ..
            } => {
                let mut target = i128::from(remaining).saturating_mul(*period_ns);
                if let Some(r) = reset_in {
                    let cap = i128::from(*capacity).saturating_mul(*period_ns);
                    let missing = i128::from(*capacity).saturating_mul(dur_nanos_i128(r));
                    target = target.min(cap.saturating_sub(missing));
                }
                if target < *level {
                    *level = target;
                    return Ok(true);
                }
                Ok(false)
            }
            State::Window {
                capacity,
                used,
                end,
                ..
            } => {
                let mut changed = false;
                let floor = capacity.saturating_sub(remaining);
                if floor > *used {
                    *used = floor;
                    changed = true;
                }
                if let Some(r) = reset_in.and_then(|r| chrono::TimeDelta::from_std(r).ok()) {
                    let reported = wall + r;
                    if reported > *end {
                        *end = reported;
                        changed = true;
                    }
                }
                Ok(changed)
            }
            State::Held { .. } => Ok(false),
        }
    }
}

/// Moves what an old bucket had consumed into the fresh state of its new configuration.
fn carry_consumption(old: &State, new: &mut State) {
    match (old, new) {
        (
            State::Token {
                capacity: oc,
                period_ns: op,
                level: ol,
                ..
            },
            State::Token {
                capacity: nc,
                period_ns: np,
                level: nl,
                ..
            },
        ) => {
            let cap_old = i128::from(*oc).saturating_mul(*op);
            // Consumed units, rounded up so a reload never hands out a fraction for free.
            let consumed = ceil_div(cap_old - *ol, *op);
            *nl = (i128::from(*nc) - consumed).saturating_mul(*np);
        }
        (State::Window { used: ou, .. }, State::Window { used: nu, .. }) => *nu = *ou,
        (State::Held { held: oh, .. }, State::Held { held: nh, .. }) => *nh = *oh,
        _ => {}
    }
}
