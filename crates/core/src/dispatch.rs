//! The per-request dispatch machine: DESIGN §3 steps 4–9 as one sans-IO state machine.
//!
//! The router and the simulator both run a request through [`Dispatch`]; neither makes a
//! routing decision of its own. The shape follows the sans-IO protocol crates (quinn-proto's
//! `Connection`, rustls's unbuffered API): the driver feeds facts in ([`Dispatch::handle`]
//! with an [`Event`]) together with the current time, and polls the next [`Action`] out
//! ([`Dispatch::poll`]). The machine reads no clock, owns no random number generator (the
//! driver lends one for jitter and p2c draws) and never awaits. State shared between requests
//! (pauses, circuit breakers, pinned chains, p2c scores, the retry budget, the fallback
//! throttle, the controller's window counts) is reached through the [`Fleet`] trait, which the
//! router implements over its locks and the simulator over plain values.
//!
//! One request, as the machine sees it:
//! 1. **Candidates** (step 4, static part): members whose provider serves the request
//!    ([`Fit::Serves`]); members outside the allowed regions are remembered for the error
//!    message. Active-probe health is fail-open: unhealthy members are dropped unless that
//!    would leave none.
//! 2. **Order** (step 5): the project's sticky chain ([`Fleet::chain`], weighted rendezvous
//!    with sliding pins) or, for [`Order::PowerOfTwoChoices`], the p2c pick among unpaused
//!    members with closed circuits followed by the rest in priority order.
//! 3. **Walk**: per member, in order — the request deadline, a pause (`Retry-After`, overload
//!    cooldown; counted as a skip, see [`Count::SkippedPaused`]), an open circuit, the single
//!    probe after a pause ([`Pauses::admit`], field case 2), the attempt limit, a half-open
//!    permit, the fallback throttle on spill-over, the retry budget on retries, then the
//!    reservation ([`Action::Reserve`], step 6) and the attempt ([`Action::Send`]).
//!    With `cache_hold`, the first attempt of a pinned project waits a short pause of its
//!    chain's head out instead of spilling its prompt cache.
//! 4. **Reservation refusals**: a provider-scope refusal skips to the next member; a tenant- or
//!    route-scope refusal ends the walk. When a tenant or route bucket refused, or every
//!    provider did before anything was sent, and the tenant has a queue, the request queues
//!    ([`Action::Queue`]) unless time alone cannot make room before the queue deadline.
//! 5. **Outcomes** (steps 8–9): a failure pauses the provider's scopes (capacity and quota
//!    answers pause every shared quota group), ends a probe, and [`next_attempt`] decides
//!    between the next member, a same-provider retry after a wait, or giving up. A request
//!    served below the head of its chain moves that member to the front (the project follows
//!    its prompt cache).
//!    A capacity refusal (429) is not a failure of the provider: it says the provider is full
//!    for now. Such an attempt does not use up `max_attempts` (up to [`MAX_CAPACITY_RESENDS`]
//!    per request), the member may be tried again once its pause is over, and while the request
//!    waits for room the retry budget paces its re-sends instead of dropping it. A full fleet
//!    thus sheds what does not fit into a wait (issue 18: during a primary outage the spill-over
//!    filled the secondaries, and requests that met two 429s failed at once).
//!    Such a refusal of a *spill-over* attempt (one sent below the request's first choice), or
//!    a skip of a provider paused by one, is counted as [`Count::FullOnSpill`], neither success
//!    nor error of that provider: it is full of traffic that failures elsewhere moved onto it.
//! 6. **Nothing served**: with `pause_wait`, a request whose every remaining member is paused
//!    or open waits for the earliest one to come back (bounded by the request deadline). A
//!    request that met a full provider waits for room until its deadline, not only for
//!    `pause_wait` (a queue with a deadline: room comes back with time, a failed provider may
//!    not). With a waiter id ([`Dispatch::with_waiter`]) and a fleet that keeps wait lines
//!    ([`Fleet::wait_lines`], [`crate::waitline`]), it waits in the full provider's FIFO line:
//!    only the head tries it, the driver wakes the next waiter early, a waiter keeps its place
//!    until its deadline and its attempts get all of the time left. Otherwise a [`Verdict`]
//!    says why, with the `Retry-After` to advertise.
//!
//! What an attempt's end does to breakers, p2c scores and window counts is [`settle`], which
//! the driver calls exactly once per sent attempt (also for a stream that ends long after the
//! machine is done, and for an attempt the client abandoned).

use std::time::Duration;

use rand::Rng;

use crate::breaker::{BreakerState, CircuitBreaker};
use crate::budget::{FallbackThrottle, RetryBudget};
use crate::chain::MoveCause;
use crate::classify::{Classification, ErrorClass};
use crate::latency::{Judgement, LatencyModel, LatencySample};
use crate::p2c::P2c;
use crate::pause::{
    Admission, AttemptContext, PausePolicy, Pauses, RetryDecision, RetryPolicy, next_attempt,
};
use crate::queue::QueueReason;
use crate::quota::{Refusal, Wait};
use crate::time::Instant;
use crate::waitline::{WaitLines, WaiterId};

/// How a route orders its members for one request.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum Order {
    /// The project's sticky weighted-rendezvous chain (chat; DESIGN §4.3).
    #[default]
    StickyChain,
    /// Power of two choices on latency-scored load (embeddings, rerank; DESIGN §4.6).
    PowerOfTwoChoices,
}

/// A set of [`ErrorClass`]es, as a bit set (one bit per position in [`ErrorClass::ALL`]).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct ClassSet(u16);

impl ClassSet {
    /// Every class.
    pub fn all() -> Self {
        ErrorClass::ALL.into_iter().collect()
    }

    /// Whether `class` is in the set.
    pub fn contains(self, class: ErrorClass) -> bool {
        self.0 & bit(class) != 0
    }
}

impl FromIterator<ErrorClass> for ClassSet {
    fn from_iter<I: IntoIterator<Item = ErrorClass>>(iter: I) -> Self {
        ClassSet(iter.into_iter().fold(0, |acc, c| acc | bit(c)))
    }
}

fn bit(class: ErrorClass) -> u16 {
    let i = ErrorClass::ALL
        .iter()
        .position(|c| *c == class)
        .unwrap_or(0);
    1 << i
}

/// A route's dispatch settings (RoutingPolicy), fixed for the life of a routing table.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Policy {
    /// How members are ordered.
    pub order: Order,
    /// Attempts per request, the first included (`maxAttempts`).
    pub max_attempts: u32,
    /// Classes that move a request down its chain (`fallbackOn`); any other class is returned
    /// to the client as the provider gave it.
    pub fallback_on: ClassSet,
    /// Same-provider retries and their backoff.
    pub retry: RetryPolicy,
    /// How long a failure pauses a provider scope.
    pub pause: PausePolicy,
    /// The request deadline from arrival (`deadline`), for messages.
    pub deadline: Duration,
    /// `cacheHold`: the first attempt of a project with a live pin waits up to this long for a
    /// paused head of its chain (where its prompt cache is) instead of spilling, provided the
    /// pause ends before the request's deadline. `None`: spill at once (DESIGN §3).
    pub cache_hold: Option<Duration>,
    /// `pauseWait`: when every remaining member is paused or has its circuit open, wait up to
    /// this long from arrival for the earliest to come back. A request that met a full
    /// provider (a 429, or a skip of a provider paused by one) waits for room until its
    /// deadline instead: room comes back with time, a failed provider may not. Zero: never
    /// wait, answer at once with the `Retry-After` of the earliest.
    pub pause_wait: Duration,
}

/// RoutingPolicy `affinity.cacheHold` default: 5 s. Chosen by the simulator's sweep over
/// {0 s, 5 s} × pauseWait {0 s, 30 s} and seeds 1–5 on every shipped scenario (docs/simulation.md,
/// "Choosing the cacheHold and pauseWait defaults"): best or tied everywhere, and without it
/// most seeds of `primary-60pct` fall into a cache-miss cascade.
pub const DEFAULT_CACHE_HOLD: Duration = Duration::from_secs(5);

/// RoutingPolicy `fallback.pauseWait` default: 30 s, from the same sweep as
/// [`DEFAULT_CACHE_HOLD`] (primary-outage mean client errors 3.9 % → 2.0 % against 0 s).
pub const DEFAULT_PAUSE_WAIT: Duration = Duration::from_secs(30);

/// Capacity refusals (429s) per request that do not use up `maxAttempts`: each is followed by
/// a wait for that provider's own pause to end (at least its Retry-After), so they are few per
/// minute of deadline; the cap keeps the work one request can cause bounded whatever the pauses
/// are. 16, not the earlier 4: in `primary-outage` with a 115 s deadline and a 110 s
/// `pauseWait` (measured before the wait-until-deadline rule, which has the same effect
/// there), 4 left 0.31 % of the requests failed against 0.07 % with 16.
pub const MAX_CAPACITY_RESENDS: u32 = 16;

/// How long a request waiting for capacity waits before asking the retry budget again.
const BUDGET_RECHECK: Duration = Duration::from_millis(500);

impl Default for Policy {
    /// The bare machine: sticky chain, 3 attempts, fall back on every provider-side class, one
    /// same-provider retry, default pauses, 300 s deadline, no cache hold, no pause wait. The
    /// RoutingPolicy defaults the router and simulator use add [`DEFAULT_CACHE_HOLD`] and
    /// [`DEFAULT_PAUSE_WAIT`].
    fn default() -> Self {
        Policy {
            order: Order::StickyChain,
            max_attempts: 3,
            fallback_on: ErrorClass::ALL
                .into_iter()
                .filter(|c| c.is_provider_side())
                .collect(),
            retry: RetryPolicy::default(),
            pause: PausePolicy::default(),
            deadline: Duration::from_secs(300),
            cache_hold: None,
            pause_wait: Duration::ZERO,
        }
    }
}

/// Whether a member's provider can serve this request at all.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Fit {
    /// It can.
    Serves,
    /// It runs outside the regions the route or the tenant allows.
    OutsideRegions,
    /// It cannot (wrong modality, unsupported operation, ineligible for another reason).
    Unsuitable,
}

/// What reserving capacity on a member involves.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Reservation {
    /// No bucket applies: send without reserving.
    None,
    /// Reserve in the tenant's, route's and provider's buckets first ([`Action::Reserve`]).
    Required,
    /// A spend limit applies but the model has no price: never send there.
    UnpricedSpend,
}

/// The request's facts about one route member (a route position).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Member {
    /// The provider's index in the fleet (breakers, pauses, p2c, counts).
    pub provider: usize,
    /// Whether it can serve this request.
    pub fit: Fit,
    /// Whether active probes admit it for the request's modalities (unknown health admits).
    pub healthy: bool,
    /// What sending there needs from the quota store.
    pub reservation: Reservation,
}

/// The tenant's queue, when it has one.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct QueueTerms {
    /// Longest wait in the queue.
    pub deadline: Duration,
    /// Others are already waiting: take a turn behind them before trying (fair shares hold
    /// only if newcomers cannot jump the queue).
    pub join_first: bool,
}

/// One request's arrival facts.
#[derive(Debug, Clone)]
pub struct Request {
    /// The project key the chain is pinned by.
    pub project: String,
    /// Arrival time.
    pub start: Instant,
    /// The route members, in priority order.
    pub members: Vec<Member>,
    /// The tenant's queue, if any.
    pub queue: Option<QueueTerms>,
    /// For a streamed request, its input tokens (estimated): the adaptive first-token deadline
    /// applies ([`crate::latency::LatencyModel::first_token_timeout`]). `None` for a request
    /// whose answer arrives whole, where the first byte says nothing about the provider's pace.
    pub stream_input: Option<u64>,
}

/// An outcome event of the walk, counted into the provider's controller window.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Count {
    /// A successful attempt.
    Success,
    /// A failed attempt of this class.
    Error(ErrorClass),
    /// An attempt ended by the client going away.
    Cancelled,
    /// A request skipped the provider because it was paused (or its single probe was out).
    SkippedPaused,
    /// A request skipped the provider because its circuit was open (or had no trial permit).
    SkippedOpen,
    /// A success that was clearly slower than the provider's baseline ([`observe_latency`]);
    /// counted besides its [`Count::Success`].
    Slow,
    /// A capacity refusal (429) of a spill-over attempt, or a skip of a provider paused by
    /// one, by a request whose first choice was another provider: the provider is full of
    /// traffic that failures elsewhere moved onto it, not failing (issue 18). Neither a
    /// success nor an error in the controller window ([`window_counts`]).
    FullOnSpill,
}

/// The state shared between requests, as the machine reaches it. Provider arguments are fleet
/// indices ([`Member::provider`]); member arguments are route positions.
pub trait Fleet {
    /// The project's chain over route positions ([`crate::chain::ChainPins::chain`] with the
    /// route's current weights); pins it if it was not.
    fn chain(&mut self, project: &str, now: Instant) -> Vec<usize>;
    /// Whether the project has a live pin (before [`Fleet::chain`] would create one).
    fn pinned(&mut self, project: &str, now: Instant) -> bool;
    /// Moves `member` to the front of the project's pinned chain; `true` if it was not already
    /// at the front (an affinity break). A weight-0 member of a tiered route is never moved
    /// ([`crate::weights::Tiers::is_standby`]).
    fn move_to_front(
        &mut self,
        project: &str,
        member: usize,
        cause: MoveCause,
        now: Instant,
    ) -> bool;
    /// Runs `f` on the pause table with the provider's pause scopes (own scope first, then its
    /// quota groups).
    fn pauses<R>(&mut self, provider: usize, f: impl FnOnce(&mut Pauses, &[&str]) -> R) -> R;
    /// Runs `f` on the provider's circuit breaker.
    fn breaker<R>(&mut self, provider: usize, f: impl FnOnce(&mut CircuitBreaker) -> R) -> R;
    /// Runs `f` on the p2c scores (indexed by provider).
    fn p2c<R>(&mut self, f: impl FnOnce(&mut P2c) -> R) -> R;
    /// Runs `f` on the retry budget; `None` when there is none.
    fn retry_budget<R>(&mut self, f: impl FnOnce(&mut RetryBudget) -> R) -> Option<R>;
    /// Runs `f` on the route's fallback throttle; `None` when it has none.
    fn fallback_throttle<R>(&mut self, f: impl FnOnce(&mut FallbackThrottle) -> R) -> Option<R>;
    /// Counts an event into the provider's controller window.
    fn count(&mut self, provider: usize, event: Count);
    /// Runs `f` on the fleet's wait lines ([`crate::waitline`]); `None` when it keeps none
    /// (the default: the request then waits to its own timer, as without lines). The machine
    /// calls it only for a request with a waiter id ([`Dispatch::with_waiter`]) that meets a
    /// full provider or a non-empty line, and afterwards until it is done.
    fn wait_lines<R>(&mut self, _f: impl FnOnce(&mut WaitLines) -> R) -> Option<R> {
        None
    }
    /// A scope was paused until `until` (the router tells its other replicas, field case 8).
    fn paused(&mut self, _scope: &str, _until: Instant) {}
    /// The provider's circuit opened until `until`.
    fn breaker_opened(&mut self, _provider: usize, _until: Instant) {}
    /// Runs `f` on the provider's latency model ([`crate::latency`]) with its peers' reference
    /// log-ratio ([`crate::latency::peer_log_ratio`] over the other providers); `None` when the fleet keeps no
    /// latency models.
    fn latency<R>(
        &mut self,
        _provider: usize,
        _f: impl FnOnce(&mut LatencyModel, f64) -> R,
    ) -> Option<R> {
        None
    }
}

/// Judges a successful attempt's latency against the provider's baseline and its peers
/// ([`crate::latency`]), learns from it, and counts [`Count::Slow`] when it was slow. Call it
/// besides [`settle`] for attempts that ended (at `now`) in [`Settled::Success`]; `None` when the fleet
/// keeps no latency models.
pub fn observe_latency(
    fleet: &mut impl Fleet,
    provider: usize,
    sample: &LatencySample,
    now: Instant,
) -> Option<Judgement> {
    let j = fleet.latency(provider, |model, peers| model.observe(sample, peers, now))?;
    if j.slow {
        fleet.count(provider, Count::Slow);
    }
    Some(j)
}

/// How an attempt that was sent ended, for [`settle`].
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Settled {
    /// The provider served it (a stream: it finished cleanly).
    Success,
    /// It failed with this class (also after a stream committed).
    Failure(ErrorClass),
    /// The client went away first.
    Cancelled,
}

/// What the end of one sent attempt does to the provider's breaker, p2c score and window
/// counts. Call exactly once per [`Action::Send`], whenever the attempt really ends.
///
/// A capacity or quota answer (429) is a penalty, not an eviction (STYLE pattern 8): the pause
/// steers traffic away, the breaker only gets its permit back. Request and deadline failures
/// are not the provider's fault and do not count against its breaker or score. With `spill`
/// (the [`Action::Send`] flag), a capacity answer counts as [`Count::FullOnSpill`], not as an
/// error: the provider is full of traffic moved onto it by failures elsewhere.
pub fn settle(
    fleet: &mut impl Fleet,
    provider: usize,
    spill: bool,
    end: Settled,
    now: Instant,
    latency: Duration,
) {
    match end {
        Settled::Success => {
            fleet.count(provider, Count::Success);
            fleet.breaker(provider, |b| b.on_success(now));
            fleet.p2c(|p| p.on_finish(provider, now, latency, true));
        }
        Settled::Failure(class) => {
            fleet.count(
                provider,
                if spill && class == ErrorClass::Capacity {
                    Count::FullOnSpill
                } else {
                    Count::Error(class)
                },
            );
            let penalised = class.is_provider_side();
            let breaks = penalised && !matches!(class, ErrorClass::Capacity | ErrorClass::Policy);
            let opened = fleet.breaker(provider, |b| {
                if !breaks {
                    b.on_cancel(now);
                    return None;
                }
                let was_open = matches!(b.state(now), BreakerState::Open { .. });
                b.on_failure(now);
                match b.state(now) {
                    BreakerState::Open { until } if !was_open => Some(until),
                    _ => None,
                }
            });
            if let Some(until) = opened {
                fleet.breaker_opened(provider, until);
            }
            fleet.p2c(|p| p.on_finish(provider, now, latency, !penalised));
        }
        Settled::Cancelled => {
            fleet.count(provider, Count::Cancelled);
            fleet.breaker(provider, |b| b.on_cancel(now));
            fleet.p2c(|p| p.on_cancel(provider, now));
        }
    }
}

/// A failed attempt as the machine keeps it: its classification and, when the provider
/// answered, its HTTP status.
#[derive(Debug, Clone, PartialEq)]
pub struct Failure {
    /// Class, hints and message.
    pub classification: Classification,
    /// The provider's HTTP status, if it answered.
    pub status: Option<u16>,
}

/// Why further attempts stopped before the chain was exhausted.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Stop {
    /// The attempt limit was reached.
    MaxAttempts,
    /// The router-wide retry budget refused a retry.
    RetryBudget,
    /// The route's fallback throttle refused a spill-over.
    FallbackThrottled,
}

impl Stop {
    /// `max_attempts`, `retry_budget_exhausted` or `fallback_throttled`.
    pub const fn code(self) -> &'static str {
        match self {
            Stop::MaxAttempts => "max_attempts",
            Stop::RetryBudget => "retry_budget_exhausted",
            Stop::FallbackThrottled => "fallback_throttled",
        }
    }
}

/// Why a request was not served, with what to advertise. The driver turns it into the client
/// dialect's error (status, code, message).
#[derive(Debug, Clone, PartialEq)]
pub enum Verdict {
    /// No member can serve the request; `region_excluded` when some were left out only for
    /// their region.
    NoProvider {
        /// Whether region restrictions removed candidates.
        region_excluded: bool,
    },
    /// A bucket refused: the tenant's or route's (maybe after queueing: `queue` says how the
    /// wait ended), or every provider's before anything was sent. `retry_after` is the
    /// refusal's own wait, lowered to the earliest pause end when providers were also paused.
    Quota {
        /// The binding refusal.
        refusal: Box<Refusal>,
        /// `Retry-After` to advertise.
        retry_after: Option<Duration>,
        /// How the queue wait ended, if the request queued.
        queue: Option<QueueReason>,
    },
    /// The request queued behind others before trying, and got no turn.
    QueueExpired {
        /// Why the wait ended.
        reason: QueueReason,
    },
    /// A spend limit applies and no member has list prices for the model.
    Unpriced,
    /// The request deadline passed.
    Deadline {
        /// `Retry-After` to advertise.
        retry_after: Option<Duration>,
    },
    /// A failure that is not failed over (request errors, classes outside `fallbackOn`),
    /// returned as the provider gave it.
    Rejected(Failure),
    /// Every attempt failed; the last failure decides the answer.
    Exhausted {
        /// The last failure.
        last: Failure,
        /// Whether region restrictions removed candidates.
        region_excluded: bool,
        /// `Retry-After` to advertise.
        retry_after: Option<Duration>,
        /// Why the walk stopped early, if it did.
        stop: Option<Stop>,
    },
    /// Nothing was sent: the members above were paused or open and spill-over is throttled.
    FallbackThrottled {
        /// `Retry-After` to advertise.
        retry_after: Duration,
    },
    /// Nothing was sent: every member is paused or has its circuit open (`retry_after`: the
    /// earliest pause end, if one was paused), or only members outside the regions remain.
    Unavailable {
        /// `Retry-After` of the earliest pause end, when a member was paused.
        retry_after: Option<Duration>,
        /// Whether region restrictions removed candidates.
        region_excluded: bool,
    },
}

/// What the driver must do next.
#[derive(Debug, Clone, PartialEq)]
pub enum Action {
    /// Reserve the request's demand for `member` (tenant, route and provider buckets, all or
    /// none), then report [`Event::Reserved`].
    Reserve {
        /// Route position.
        member: usize,
    },
    /// Send one attempt to `member`; end it by `attempt_deadline` unless content is flowing,
    /// then report [`Event::Finished`] (and later call [`settle`]).
    Send {
        /// Route position.
        member: usize,
        /// When this attempt must have answered (half of the time left while a fallback is
        /// possible, else the request deadline).
        attempt_deadline: Instant,
        /// For a stream ([`Request::stream_input`]) while a fallback is possible: when its
        /// first token must have arrived, from the provider's latency baseline
        /// ([`crate::latency::LatencyModel::first_token_timeout`]); `None` = no adaptive bound.
        first_token_deadline: Option<Instant>,
        /// The request deadline.
        deadline: Instant,
        /// Whether this is a retry (not the request's first attempt).
        retry: bool,
        /// Whether `member` is not the request's first choice: the attempt is spill-over from
        /// the members before it. Pass it to [`settle`].
        spill: bool,
    },
    /// Sleep until `until`, then report [`Event::Woke`].
    Wait {
        /// When to wake.
        until: Instant,
    },
    /// Wait for a turn in the tenant's queue until `deadline` (a refill is expected after
    /// `refill_after`), then report [`Event::Queue`].
    Queue {
        /// The queue deadline.
        deadline: Instant,
        /// When the binding bucket refills, if known.
        refill_after: Option<Duration>,
    },
    /// Served by `member`: the response goes to the client.
    Served {
        /// Route position.
        member: usize,
        /// Whether it was not the request's first choice.
        fallback: bool,
        /// Whether the project's pinned chain changed head (it follows its cache).
        affinity_break: bool,
    },
    /// Not served: answer with this verdict.
    Respond(Verdict),
}

/// A fact for the machine.
#[derive(Debug, Clone, PartialEq)]
pub enum Event {
    /// The reservation of the last [`Action::Reserve`] succeeded (`Ok`) or was refused.
    Reserved(Result<(), Box<Refusal>>),
    /// The attempt of the last [`Action::Send`] ended or committed.
    Finished(Result<(), Failure>),
    /// The first content of the attempt in flight arrived (ends a probe early).
    FirstByte,
    /// The wait of the last [`Action::Wait`] is over.
    Woke,
    /// The queue wait of the last [`Action::Queue`] ended: a turn (`Ok`) or not.
    Queue(Result<(), QueueReason>),
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Phase {
    Begin,
    Walk,
    Reserving,
    Sending,
    Backoff,
    PauseWait,
    Queued { first: bool },
    Done,
}

/// Per-walk bookkeeping (reset when a queued request gets its turn).
#[derive(Debug, Default)]
struct Walk {
    order: Vec<usize>,
    first_choice: Option<usize>,
    /// Some member above the serving one failed the request (an error other than a capacity
    /// refusal, or an open circuit), as opposed to only being full: the affinity move's cause.
    failure_seen: bool,
    n: usize,
    same_used: u32,
    admission: Option<Admission>,
    consecutive_failures: u32,
    last: Option<Failure>,
    give_up_hint: Option<Duration>,
    skipped_wait: Option<Duration>,
    wake: Option<Instant>,
    stop: Option<Stop>,
    deadline_passed: bool,
    provider_refusal: Option<Box<Refusal>>,
    quota_refusal: Option<Box<Refusal>>,
    unpriced: bool,
    gave_up: bool,
    /// A member was skipped because the request is behind others in its wait line: the wait
    /// may last until the deadline (an early wake-up ends it).
    line_wait: bool,
}

/// One request's dispatch machine (module docs).
#[derive(Debug)]
pub struct Dispatch {
    policy: Policy,
    req: Request,
    deadline: Instant,
    candidates: Vec<usize>,
    region_excluded: bool,
    phase: Phase,
    event: Option<Event>,
    waiting: Option<Action>,
    walk: Walk,
    tried: Vec<bool>,
    attempts: u32,
    /// Attempts that ended in a capacity refusal ([`ErrorClass::Capacity`]); they do not use
    /// up `max_attempts` (at most [`MAX_CAPACITY_RESENDS`] of them).
    capacity_refusals: u32,
    /// Whether a full provider (a capacity refusal, or a skip of a provider paused by one)
    /// stood in the way: the request then waits for room until its deadline, not only for
    /// `pause_wait`.
    met_full: bool,
    /// Per member: its last attempt of this request was a capacity refusal, so it may be tried
    /// again once its pause is over.
    refused_full: Vec<bool>,
    last_member: Option<usize>,
    queued: bool,
    queue_deadline: Option<Instant>,
    pinned_at_start: bool,
    /// The request's id in the fleet's wait lines ([`Dispatch::with_waiter`]).
    waiter: Option<WaiterId>,
    /// It joined a line since it started: it must leave them when done.
    in_lines: bool,
    /// Its attempt in flight holds a window slot of a line.
    line_slot: bool,
}

impl Dispatch {
    /// A machine for `req` under `policy`; the request deadline is `req.start + policy.deadline`.
    pub fn new(policy: Policy, req: Request) -> Self {
        let deadline = req.start + policy.deadline;
        let n = req.members.len();
        Dispatch {
            policy,
            req,
            deadline,
            candidates: Vec::new(),
            region_excluded: false,
            phase: Phase::Begin,
            event: None,
            waiting: None,
            walk: Walk::default(),
            tried: vec![false; n],
            attempts: 0,
            capacity_refusals: 0,
            met_full: false,
            refused_full: vec![false; n],
            last_member: None,
            queued: false,
            queue_deadline: None,
            pinned_at_start: false,
            waiter: None,
            in_lines: false,
            line_slot: false,
        }
    }

    /// Gives the request the id `id` in the fleet's wait lines ([`crate::waitline`]): when it
    /// would wait for a full provider it joins that provider's line and tries it only as the
    /// line's head; the driver wakes it early when [`WaitLines::take_woken`] names `id`
    /// (deliver it as [`Event::Woke`] to a request waiting in [`Action::Wait`]). Without an
    /// id, or in a fleet without lines, it waits to its own timer.
    pub fn with_waiter(mut self, id: WaiterId) -> Self {
        self.waiter = Some(id);
        self
    }

    /// Whether the request has joined a wait line (the driver must make sure it leaves them:
    /// [`WaitLines::leave`] when it is dropped before it is done).
    pub fn in_wait_lines(&self) -> bool {
        self.in_lines
    }

    /// Attempts sent so far.
    pub fn attempts(&self) -> u32 {
        self.attempts
    }

    /// Attempts that count against `max_attempts`: every attempt but the capacity refusals
    /// (at most [`MAX_CAPACITY_RESENDS`]) that were waited out.
    fn spent(&self) -> u32 {
        self.attempts - self.capacity_refusals
    }

    /// The route position of the last attempt, if any.
    pub fn last_member(&self) -> Option<usize> {
        self.last_member
    }

    /// Where `member` (a route position) stands in this request's chain: 0 = its head, `None`
    /// before the chain is drawn or when `member` is not in it.
    pub fn chain_position(&self, member: usize) -> Option<usize> {
        self.walk.order.iter().position(|&m| m == member)
    }

    /// Whether the request waited in its tenant's queue.
    pub fn queued(&self) -> bool {
        self.queued
    }

    /// The request deadline.
    pub fn deadline(&self) -> Instant {
        self.deadline
    }

    /// Feeds a fact; the next [`Dispatch::poll`] acts on it. [`Event::FirstByte`] takes effect
    /// at once (the attempt stays in flight).
    pub fn handle(&mut self, fleet: &mut impl Fleet, event: Event) {
        if event == Event::FirstByte {
            if self.phase == Phase::Sending {
                self.probe_over(fleet);
            }
            return;
        }
        self.event = Some(event);
    }

    /// The next action at `now`. Polling again without the event an action waits for returns
    /// that action again; after [`Action::Served`] or [`Action::Respond`] the machine is done
    /// and returns the same answer.
    pub fn poll(&mut self, fleet: &mut impl Fleet, now: Instant, rng: &mut impl Rng) -> Action {
        let action = self.poll_inner(fleet, now, rng);
        if self.phase == Phase::Done
            && self.in_lines
            && let Some(id) = self.waiter
        {
            // Served, failed or out of time: out of every line, and the next is woken.
            fleet.wait_lines(|l| l.leave(id));
            self.in_lines = false;
            self.line_slot = false;
        }
        action
    }

    fn poll_inner(&mut self, fleet: &mut impl Fleet, now: Instant, rng: &mut impl Rng) -> Action {
        loop {
            match self.phase {
                Phase::Begin => {
                    if let Some(v) = self.filter(fleet, now) {
                        return self.respond(v);
                    }
                    if let Some(q) = self.req.queue.filter(|q| q.join_first) {
                        let deadline = self.deadline.min(self.req.start + q.deadline);
                        self.queue_deadline = Some(deadline);
                        self.queued = true;
                        self.phase = Phase::Queued { first: true };
                        return self.wait_for(Action::Queue {
                            deadline,
                            refill_after: None,
                        });
                    }
                    self.begin_walk(fleet, now, rng);
                }
                Phase::Walk => {
                    if let Some(action) = self.step(fleet, now) {
                        return action;
                    }
                }
                Phase::Done => {
                    return self
                        .waiting
                        .clone()
                        .unwrap_or(Action::Respond(Verdict::NoProvider {
                            region_excluded: false,
                        }));
                }
                _ => {
                    let Some(event) = self.event.take() else {
                        return self.waiting.clone().unwrap_or(Action::Wait { until: now });
                    };
                    if let Some(action) = self.on_event(fleet, event, now, rng) {
                        return action;
                    }
                }
            }
        }
    }

    fn wait_for(&mut self, action: Action) -> Action {
        self.waiting = Some(action.clone());
        action
    }

    fn respond(&mut self, verdict: Verdict) -> Action {
        self.phase = Phase::Done;
        self.wait_for(Action::Respond(verdict))
    }

    /// Step 4's static part: which members may serve at all, health fail-open.
    fn filter(&mut self, _fleet: &mut impl Fleet, _now: Instant) -> Option<Verdict> {
        let mut region_excluded = false;
        let serving: Vec<usize> = (0..self.req.members.len())
            .filter(|&pos| match self.req.members[pos].fit {
                Fit::Serves => true,
                Fit::OutsideRegions => {
                    region_excluded = true;
                    false
                }
                Fit::Unsuitable => false,
            })
            .collect();
        // A provider freshly probed unhealthy is left out unless that leaves nobody: probes
        // calling everyone unhealthy are likelier wrong than everyone being down.
        let healthy: Vec<usize> = serving
            .iter()
            .copied()
            .filter(|&pos| self.req.members[pos].healthy)
            .collect();
        self.candidates = if healthy.is_empty() { serving } else { healthy };
        self.region_excluded = region_excluded;
        if self.candidates.is_empty() {
            return Some(Verdict::NoProvider { region_excluded });
        }
        None
    }

    /// Step 5: orders the candidates for a fresh walk.
    fn begin_walk(&mut self, fleet: &mut impl Fleet, now: Instant, rng: &mut impl Rng) {
        if self.attempts == 0 && self.policy.cache_hold.is_some() {
            // Asked before `chain` pins it: only a pin from an earlier request holds a cache.
            self.pinned_at_start = fleet.pinned(&self.req.project, now);
        }
        let order = match self.policy.order {
            Order::StickyChain => fleet
                .chain(&self.req.project, now)
                .into_iter()
                .filter(|pos| self.candidates.contains(pos))
                .collect(),
            Order::PowerOfTwoChoices => {
                let members = &self.req.members;
                let eligible: Vec<usize> = self
                    .candidates
                    .iter()
                    .map(|&pos| members[pos].provider)
                    .filter(|&i| {
                        !fleet.pauses(i, |p, scopes| p.is_paused(scopes, now))
                            && !fleet
                                .breaker(i, |b| matches!(b.state(now), BreakerState::Open { .. }))
                    })
                    .collect();
                let picked = fleet.p2c(|p| p.pick(&eligible, now, rng));
                let mut order: Vec<usize> = Vec::with_capacity(self.candidates.len());
                if let Some(i) = picked
                    && let Some(pos) = self
                        .candidates
                        .iter()
                        .copied()
                        .find(|&pos| members[pos].provider == i)
                {
                    order.push(pos);
                }
                let first = order.first().copied();
                order.extend(
                    self.candidates
                        .iter()
                        .copied()
                        .filter(|&p| Some(p) != first),
                );
                order
            }
        };
        self.walk.first_choice = order.first().copied();
        self.walk.order = order;
        self.walk.n = 0;
        self.walk.same_used = 0;
        self.walk.line_wait = false;
        self.phase = Phase::Walk;
    }

    /// The wait-line key of `provider`: its own pause scope (the first of its scopes).
    fn line_scope(fleet: &mut impl Fleet, provider: usize) -> String {
        fleet.pauses(provider, |_, scopes| {
            scopes.first().map(|s| (*s).to_owned()).unwrap_or_default()
        })
    }

    /// Joins `provider`'s wait line; whether the request is now its head. `None` without a
    /// waiter id or lines.
    fn join_line(&mut self, fleet: &mut impl Fleet, provider: usize, now: Instant) -> Option<bool> {
        let id = self.waiter?;
        let scope = Self::line_scope(fleet, provider);
        let head = fleet.wait_lines(|l| {
            l.join(&scope, id, now);
            l.is_head(&scope, id)
        })?;
        self.in_lines = true;
        Some(head)
    }

    /// Waits behind others in a line: until woken early, at the latest until the deadline.
    fn wait_in_line(&mut self) {
        self.walk.line_wait = true;
        self.wake_at(self.deadline);
    }

    fn wake_at(&mut self, until: Instant) {
        self.walk.wake = Some(self.walk.wake.map_or(until, |w| w.min(until)));
    }

    fn skip(&mut self) {
        self.walk.n += 1;
        self.walk.same_used = 0;
        self.walk.admission = None;
    }

    /// Looks at the member at the walk's cursor; `None` moves on.
    fn step(&mut self, fleet: &mut impl Fleet, now: Instant) -> Option<Action> {
        let Some(&pos) = self.walk.order.get(self.walk.n) else {
            return Some(self.walk_over(now));
        };
        if self.tried[pos] && self.walk.same_used == 0 && !self.refused_full[pos] {
            self.skip();
            return None;
        }
        if now >= self.deadline {
            self.walk.deadline_passed = true;
            return Some(self.walk_over(now));
        }
        let provider = self.req.members[pos].provider;
        let head = self.walk.n == 0 && self.attempts == 0 && self.pinned_at_start;
        // The provider's own word first (a Retry-After or overload cooldown), then its circuit,
        // then the single probe after a pause (field case 2): an open circuit does not use up
        // the probe.
        let paused = fleet.pauses(provider, |p, scopes| p.paused_until(scopes, now));
        // Wait lines (crate::waitline): a provider paused by a capacity refusal, or one with
        // others waiting for it, is tried only by its line's head. A request that has never
        // waited asks only the fleet's cheap `lines_waiting` hint for an unpaused provider.
        let mut behind = false;
        if let Some(id) = self.waiter {
            let full = paused.is_some()
                && fleet.pauses(provider, |p, scopes| p.reason(scopes, now))
                    == Some(ErrorClass::Capacity);
            if full {
                behind = self.join_line(fleet, provider, now) == Some(false);
            } else if paused.is_none() && self.in_lines {
                let scope = Self::line_scope(fleet, provider);
                let remaining = self.deadline.saturating_since(now);
                let gate = fleet.wait_lines(|l| {
                    if l.doomed(&scope, id, remaining) {
                        l.leave_line(&scope, id);
                        return LineGate::Doomed;
                    }
                    if !l.is_waiting(&scope) || l.may_try(&scope, id) {
                        return LineGate::Open;
                    }
                    l.join(&scope, id, now);
                    LineGate::Behind
                });
                if gate == Some(LineGate::Doomed) {
                    // Its turn came too late for an answer before its deadline: the room goes
                    // to the next waiter, and this provider is not tried again.
                    self.refused_full[pos] = false;
                    self.tried[pos] = true;
                    self.skip();
                    return None;
                }
                if gate == Some(LineGate::Behind) {
                    // Others wait for this provider (it was full a moment ago): take a place
                    // behind them instead of jumping the line.
                    self.in_lines = true;
                    self.met_full = true;
                    fleet.count(
                        provider,
                        if Some(pos) != self.walk.first_choice {
                            Count::FullOnSpill
                        } else {
                            Count::SkippedPaused
                        },
                    );
                    self.wait_in_line();
                    self.skip();
                    return None;
                }
            }
        }
        let gated = match paused {
            Some(until) => Some(until),
            None if matches!(
                fleet.breaker(provider, |b| b.state(now)),
                BreakerState::Open { .. }
            ) =>
            {
                None
            }
            None => match fleet.pauses(provider, |p, scopes| p.admit(scopes, now)) {
                Admission::Paused { until } => Some(until),
                admission => {
                    self.walk.admission = Some(admission);
                    None
                }
            },
        };
        if let Some(until) = gated {
            if head
                && let Some(hold) = self.policy.cache_hold
                && until.saturating_since(now) <= hold
                && until < self.deadline
            {
                // The chain's head holds the project's prompt cache: wait out a short pause,
                // unless it outlasts the request (then waiting only turns a spill into a
                // client error).
                self.phase = Phase::PauseWait;
                return Some(self.wait_for(Action::Wait { until }));
            }
            // A provider full of spill-over (paused by a 429) skipped by a request that did
            // not choose it first is full, not failing.
            let capacity = fleet.pauses(provider, |p, scopes| p.reason(scopes, now))
                == Some(ErrorClass::Capacity);
            self.met_full |= capacity;
            fleet.count(
                provider,
                if capacity && Some(pos) != self.walk.first_choice {
                    Count::FullOnSpill
                } else {
                    Count::SkippedPaused
                },
            );
            let wait = until.saturating_since(now);
            self.walk.skipped_wait = Some(self.walk.skipped_wait.map_or(wait, |w| w.min(wait)));
            if behind && until < self.deadline {
                // Not the line's head: the head's send or departure wakes it, not the pause end
                // (a pause that outlasts the deadline leaves nothing to wait for).
                self.wait_in_line();
            } else {
                self.wake_at(until);
            }
            self.skip();
            return None;
        }
        if let BreakerState::Open { until } = fleet.breaker(provider, |b| b.state(now)) {
            self.walk.failure_seen = true;
            fleet.count(provider, Count::SkippedOpen);
            self.wake_at(until);
            self.skip();
            return None;
        }
        if self.spent() >= self.policy.max_attempts {
            self.walk.stop = Some(Stop::MaxAttempts);
            return Some(self.walk_over(now));
        }
        if !fleet.breaker(provider, |b| b.try_acquire(now)) {
            // Half-open with every trial permit out.
            fleet.count(provider, Count::SkippedOpen);
            self.wake_at(now + Duration::from_secs(1));
            self.skip();
            return None;
        }
        // Spill-over below the first choice is throttled whether the members above failed or
        // were skipped (field case 2): an outage of the primary must not topple the next one.
        let spill = Some(pos) != self.walk.first_choice && self.walk.same_used == 0;
        if spill && fleet.fallback_throttle(|t| t.try_acquire(now)) == Some(false) {
            fleet.breaker(provider, |b| b.on_cancel(now));
            self.walk.stop = Some(Stop::FallbackThrottled);
            return Some(self.walk_over(now));
        }
        if self.attempts == 0 {
            fleet.retry_budget(|b| b.record_attempt(now));
        } else if fleet.retry_budget(|b| b.try_withdraw(now)) == Some(false) {
            fleet.breaker(provider, |b| b.on_cancel(now));
            if self.capacity_refusals > 0 {
                // Waiting for room after a rate limit: the budget paces the re-sends (it
                // refills with first attempts and its floor), it does not drop the request.
                self.wake_at(now + BUDGET_RECHECK);
                self.skip();
                return None;
            }
            self.walk.stop = Some(Stop::RetryBudget);
            return Some(self.walk_over(now));
        }
        match self.req.members[pos].reservation {
            Reservation::None => Some(self.send(fleet, pos, now)),
            Reservation::Required => {
                self.phase = Phase::Reserving;
                Some(self.wait_for(Action::Reserve { member: pos }))
            }
            Reservation::UnpricedSpend => {
                // A spend limit cannot be kept on a model without prices: never send.
                fleet.breaker(provider, |b| b.on_cancel(now));
                self.walk.unpriced = true;
                self.skip();
                None
            }
        }
    }

    fn send(&mut self, fleet: &mut impl Fleet, pos: usize, now: Instant) -> Action {
        let retry = self.attempts > 0;
        self.attempts += 1;
        self.tried[pos] = true;
        self.last_member = Some(pos);
        let provider = self.req.members[pos].provider;
        if self.in_lines
            && let Some(id) = self.waiter
        {
            // Out of every line (the next heads are woken); a slot of this provider's line
            // while the attempt is in flight.
            let scope = Self::line_scope(fleet, provider);
            self.line_slot = fleet
                .wait_lines(|l| l.sent(id, &scope, now))
                .unwrap_or(false);
        }
        fleet.p2c(|p| p.on_start(provider, now));
        // A non-streamed answer shows nothing until it is complete, so a hung provider is only
        // noticed by a timeout: while another member could still be tried, one attempt may use
        // at most half of the time left, leaving the rest for a fallback.
        let remaining = self.deadline.saturating_since(now);
        // A request that waited in a line for a full provider gets the rest of its time: the
        // fallbacks were full too, and the oldest requests are the ones the lines send first,
        // so halving their little time left turns them into timeouts that open the circuit of
        // a provider that is only full.
        let fallback_possible = !self.in_lines
            && self.spent() < self.policy.max_attempts
            && self.unpaused_after(fleet, self.walk.n + 1, now);
        let attempt_deadline = if fallback_possible {
            now + remaining / 2
        } else {
            self.deadline
        };
        // A stream shows its first token after prefill: while a fallback is possible, a
        // provider far slower than its own baseline is left before any content.
        let first_token_deadline = self
            .req
            .stream_input
            .filter(|_| fallback_possible)
            .and_then(|input| {
                fleet
                    .latency(provider, |model, _| model.first_token_timeout(input))
                    .flatten()
            })
            .map(|t| attempt_deadline.min(now + t));
        self.phase = Phase::Sending;
        self.wait_for(Action::Send {
            member: pos,
            attempt_deadline,
            first_token_deadline,
            deadline: self.deadline,
            retry,
            spill: Some(pos) != self.walk.first_choice,
        })
    }

    /// Whether a member after cursor `from` is not paused now.
    fn unpaused_after(&self, fleet: &mut impl Fleet, from: usize, now: Instant) -> bool {
        self.walk.order.iter().skip(from).any(|&pos| {
            let provider = self.req.members[pos].provider;
            !fleet.pauses(provider, |p, scopes| p.is_paused(scopes, now))
        })
    }

    fn probe_over(&mut self, fleet: &mut impl Fleet) {
        if self.walk.admission == Some(Admission::Probe)
            && let Some(pos) = self.last_member
        {
            let provider = self.req.members[pos].provider;
            fleet.pauses(provider, |p, scopes| p.probe_succeeded(scopes));
            self.walk.admission = Some(Admission::Open);
        }
    }

    fn on_event(
        &mut self,
        fleet: &mut impl Fleet,
        event: Event,
        now: Instant,
        rng: &mut impl Rng,
    ) -> Option<Action> {
        if self.phase == Phase::Sending
            && matches!(event, Event::Finished(_))
            && self.line_slot
            && let Some(id) = self.waiter
        {
            self.line_slot = false;
            let served = matches!(event, Event::Finished(Ok(())));
            fleet.wait_lines(|l| l.attempt_done(id, now, served));
        }
        match (self.phase, event) {
            (Phase::Reserving, Event::Reserved(Ok(()))) => {
                let pos = self.walk.order[self.walk.n];
                Some(self.send(fleet, pos, now))
            }
            (Phase::Reserving, Event::Reserved(Err(refusal))) => {
                let pos = self.walk.order[self.walk.n];
                fleet.breaker(self.req.members[pos].provider, |b| b.on_cancel(now));
                self.phase = Phase::Walk;
                if refusal.scope.is_provider_side() {
                    let shorter = self
                        .walk
                        .provider_refusal
                        .as_ref()
                        .is_none_or(|r| wait_key(refusal.wait) < wait_key(r.wait));
                    if shorter {
                        self.walk.provider_refusal = Some(refusal);
                    }
                    self.skip();
                    return None;
                }
                self.walk.quota_refusal = Some(refusal);
                Some(self.walk_over(now))
            }
            (Phase::Sending, Event::Finished(Ok(()))) => {
                self.probe_over(fleet);
                let pos = self.walk.order[self.walk.n];
                let fallback = Some(pos) != self.walk.first_choice;
                let cause = if self.walk.failure_seen {
                    MoveCause::Failure
                } else {
                    MoveCause::Capacity
                };
                let affinity_break = fallback
                    && self.policy.order == Order::StickyChain
                    && fleet.move_to_front(&self.req.project, pos, cause, now);
                self.phase = Phase::Done;
                Some(self.wait_for(Action::Served {
                    member: pos,
                    fallback,
                    affinity_break,
                }))
            }
            (Phase::Sending, Event::Finished(Err(failure))) => {
                self.failed(fleet, failure, now, rng)
            }
            (Phase::Backoff, Event::Woke) => {
                // Same member again: the cursor stays, the pause it waited out is over.
                self.phase = Phase::Walk;
                None
            }
            (Phase::PauseWait, Event::Woke) => {
                self.walk.wake = None;
                self.walk.skipped_wait = None;
                self.walk.line_wait = false;
                self.begin_walk(fleet, now, rng);
                None
            }
            (Phase::Queued { .. }, Event::Queue(Ok(()))) => {
                // A turn: start over, as a fresh walk.
                let tries = self.req.members.len();
                self.walk = Walk::default();
                self.tried = vec![false; tries];
                self.refused_full = vec![false; tries];
                self.attempts = 0;
                self.capacity_refusals = 0;
                self.begin_walk(fleet, now, rng);
                None
            }
            (Phase::Queued { first: true }, Event::Queue(Err(reason))) => {
                Some(self.respond(Verdict::QueueExpired { reason }))
            }
            (Phase::Queued { first: false }, Event::Queue(Err(reason))) => {
                match self.walk.quota_refusal.take() {
                    Some(refusal) => {
                        let retry_after = refusal.retry_after();
                        Some(self.respond(Verdict::Quota {
                            refusal,
                            retry_after,
                            queue: Some(reason),
                        }))
                    }
                    None => Some(self.respond(Verdict::QueueExpired { reason })),
                }
            }
            (phase, _) => {
                // An event the phase does not wait for: ignore it, keep waiting.
                self.phase = phase;
                self.waiting.clone()
            }
        }
    }

    /// Steps 8–9 for a failed attempt.
    fn failed(
        &mut self,
        fleet: &mut impl Fleet,
        failure: Failure,
        now: Instant,
        rng: &mut impl Rng,
    ) -> Option<Action> {
        let pos = self.walk.order[self.walk.n];
        let provider = self.req.members[pos].provider;
        let c = &failure.classification;
        self.phase = Phase::Walk;
        if c.class == ErrorClass::Deadline {
            // The request's own deadline passed during the attempt: nothing more can be tried.
            self.walk.last = Some(failure);
            self.walk.deadline_passed = true;
            return Some(self.walk_over(now));
        }
        self.walk.consecutive_failures += 1;
        self.walk.failure_seen |= c.class != ErrorClass::Capacity;
        // A full provider (a rate limit, not a failure) sheds this request; once its pause
        // is over it may take the request after all, within `pauseWait` and the deadline,
        // without using up an attempt: spill on, queue, never drop what could fit.
        let full = c.class == ErrorClass::Capacity && self.capacity_refusals < MAX_CAPACITY_RESENDS;
        self.refused_full[pos] = full;
        if full {
            self.capacity_refusals += 1;
        }
        self.met_full |= c.class == ErrorClass::Capacity;
        // A full provider: wait for it in its line (at the front again with the old ticket).
        let behind = full && self.join_line(fleet, provider, now) == Some(false);
        if let Some(pause) = self.policy.pause.scope_pause(c, rng) {
            // Capacity and exhaustion answers speak for the whole upstream quota: pause the
            // provider and every quota group it shares (field case 2).
            let shared = matches!(c.class, ErrorClass::Capacity | ErrorClass::Policy);
            let class = c.class;
            let paused: Vec<(String, Instant)> = fleet.pauses(provider, |p, scopes| {
                let k = if shared { scopes.len() } else { 1 };
                scopes
                    .iter()
                    .take(k)
                    .map(|s| ((*s).to_owned(), p.pause(s, pause, now, class)))
                    .collect()
            });
            let mut lined = false;
            for (scope, until) in paused {
                fleet.paused(&scope, until);
                if full && behind && until < self.deadline {
                    lined = true;
                } else if full {
                    self.wake_at(until);
                }
            }
            if lined {
                self.wait_in_line();
            }
            self.walk.admission = Some(Admission::Open);
        } else {
            // The provider answered without asking for a pause: the probe is over.
            self.probe_over(fleet);
        }
        if c.class == ErrorClass::Request || !self.policy.fallback_on.contains(c.class) {
            return Some(self.respond(Verdict::Rejected(failure)));
        }
        let ctx = AttemptContext {
            now,
            deadline: self.deadline,
            same_provider_retries_used: self.walk.same_used,
            consecutive_failures: self.walk.consecutive_failures,
            next_provider_available: self.unpaused_after(fleet, self.walk.n + 1, now),
            scope_paused_until: fleet.pauses(provider, |p, scopes| p.paused_until(scopes, now)),
        };
        let decision = next_attempt(&self.policy.retry, c, &ctx, rng);
        self.walk.last = Some(failure);
        match decision {
            RetryDecision::NextProvider => {
                self.skip();
                None
            }
            RetryDecision::SameProviderAfter(wait) => {
                self.walk.same_used += 1;
                self.phase = Phase::Backoff;
                Some(self.wait_for(Action::Wait { until: now + wait }))
            }
            RetryDecision::GiveUp { retry_after } if full && now < self.deadline => {
                // Nobody else can take it now, but the full provider (or another) may within
                // `pauseWait`: walk on, and the walk's end waits for the earliest pause.
                self.walk.give_up_hint = retry_after;
                self.skip();
                None
            }
            RetryDecision::GiveUp { retry_after } => {
                self.walk.give_up_hint = retry_after;
                self.walk.gave_up = true;
                Some(self.walk_over(now))
            }
        }
    }

    /// The walk ended without serving: queue, wait for a pause to end, or say why (step 9).
    fn walk_over(&mut self, now: Instant) -> Action {
        // A bucket refused: the tenant's or route's, or every provider's before anything was
        // sent (nobody has room): queue or reject (step 6).
        let w = &mut self.walk;
        let nothing_sent = w.last.is_none() && w.stop.is_none() && !w.deadline_passed;
        let (refusal, provider_side) = match (w.quota_refusal.take(), w.provider_refusal.take()) {
            (Some(r), _) => (Some(r), false),
            (None, Some(r)) if nothing_sent => (Some(r), true),
            (None, _) => (None, false),
        };
        if let Some(refusal) = refusal {
            if self.attempts == 0
                && let Some(q) = self.req.queue
                && refusal.wait != Wait::Never
            {
                // The queue's deadline runs from the first time the request queued, however
                // often it is woken and finds no room again.
                let deadline = *self
                    .queue_deadline
                    .get_or_insert_with(|| self.deadline.min(now + q.deadline));
                // Time alone cannot make room before the deadline: answer now, not then.
                let too_late = matches!(refusal.wait, Wait::After(d) if now + d > deadline);
                if !too_late {
                    let refill_after = refusal.retry_after();
                    self.walk.quota_refusal = Some(refusal);
                    self.queued = true;
                    self.phase = Phase::Queued { first: false };
                    return self.wait_for(Action::Queue {
                        deadline,
                        refill_after,
                    });
                }
            }
            let retry_after = match (provider_side, self.walk.skipped_wait, refusal.retry_after()) {
                // Another provider's pause may end before this bucket has room.
                (true, Some(pause), Some(wait)) => Some(wait.min(pause)),
                (_, _, wait) => wait,
            };
            return self.respond(Verdict::Quota {
                refusal,
                retry_after,
                queue: None,
            });
        }
        let w = &mut self.walk;
        if nothing_sent && w.unpriced {
            return self.respond(Verdict::Unpriced);
        }
        // Everything left is paused or open: wait for the earliest to come back, if allowed.
        if !w.gave_up
            && w.stop.is_none()
            && !w.deadline_passed
            && let Some(wake) = w.wake
        {
            // Room at a full provider is a matter of time (a queue with a deadline); a failed
            // provider's return is not, so that wait is bounded by `pause_wait`.
            let limit = if self.met_full && !self.policy.pause_wait.is_zero() {
                self.deadline
            } else {
                self.deadline.min(self.req.start + self.policy.pause_wait)
            };
            let at = wake.max(now + Duration::from_millis(1));
            // Waking at the deadline would only turn the last refusal into a deadline error,
            // unless the request waits behind others in a line: an early wake-up may come first.
            if at <= limit && (at < self.deadline || w.line_wait) {
                self.phase = Phase::PauseWait;
                return self.wait_for(Action::Wait { until: at });
            }
        }
        let verdict = if w.deadline_passed {
            Verdict::Deadline {
                retry_after: w.give_up_hint.or(w.skipped_wait),
            }
        } else {
            match (w.last.take(), w.stop) {
                (Some(last), stop) => Verdict::Exhausted {
                    retry_after: w
                        .give_up_hint
                        .or(last.classification.retry_after)
                        .or(w.skipped_wait),
                    last,
                    region_excluded: self.region_excluded,
                    stop,
                },
                (None, _) if self.region_excluded => Verdict::Unavailable {
                    retry_after: None,
                    region_excluded: true,
                },
                (None, Some(Stop::FallbackThrottled)) => Verdict::FallbackThrottled {
                    retry_after: w.skipped_wait.unwrap_or(Duration::from_secs(1)),
                },
                (None, _) => Verdict::Unavailable {
                    retry_after: w.skipped_wait,
                    region_excluded: false,
                },
            }
        };
        self.respond(verdict)
    }
}

/// What a wait line says about trying a provider now.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum LineGate {
    /// Try it (no line, or the request is its head and the window has room).
    Open,
    /// Others are ahead: wait.
    Behind,
    /// The head, but too late for an answer before its deadline.
    Doomed,
}

/// Orders refusal waits from soonest to never: a slot release, then a known wait, then never.
fn wait_key(w: Wait) -> (u8, Duration) {
    match w {
        Wait::OnRelease => (0, Duration::ZERO),
        Wait::After(d) => (1, d),
        Wait::Never => (2, Duration::MAX),
    }
}

mod local;

pub use local::{LocalFleet, Tally, window_counts};

#[cfg(test)]
mod tests;
