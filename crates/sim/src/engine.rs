//! The discrete-event loop.
//!
//! Virtual time in microseconds; a binary heap of `(time, sequence, event)` ordered by time and
//! then by insertion, so equal times resolve in a fixed order and a run is a pure function of
//! the scenario, the strategy and the seed. Four random sources are kept apart so that the
//! offered traffic and the providers' dice are identical for every strategy:
//! - session/request arrivals: a ChaCha8 stream consumed only by arrivals, in arrival order;
//! - per-turn gaps and provider dice: hashes of (seed, session, turn, attempt, provider);
//! - strategy randomness (p2c sampling): its own ChaCha8 stream.
//!
//! A chat turn's input is the session's whole context; the part the chosen provider still
//! holds in its prompt cache (the previous turn's prompt, if the previous turn was served there
//! less than the TTL ago) is cached, the rest is uncached and is what ITPM limits count.

use std::cmp::Reverse;
use std::collections::BinaryHeap;
use std::time::Duration;

use rand::{Rng, SeedableRng};
use rand_chacha::ChaCha8Rng;
use switchyard_core::time::Instant;

use crate::metrics::{
    Acc, FailureCounts, IntervalRow, Replay, ReplayAttempt, RunResult, RunSummary, percentile,
    ratio,
};
use crate::model::{AttemptInput, Outcome, ProviderState, hash, unit};
use crate::scenario::{Scenario, Traffic};
use crate::strategy::{Pick, Strategy, StrategyKind};
use crate::switchyard::{Switchyard, outcome_of, waited_out};
use switchyard_core::dispatch::{Action, Dispatch, Event, observe_latency, settle};
use switchyard_core::latency::LatencySample;
use switchyard_core::queue::QueueReason;

const NO_SESSION: u32 = u32::MAX;

/// Why a request failed client-visibly.
#[derive(Debug, Clone, Copy)]
enum Failure {
    AttemptsExhausted,
    QueueTimeout,
    NoCandidate,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord)]
enum Ev {
    Tick,
    Arrival,
    /// Arrival of scripted request `i` ([`Traffic::Script`]).
    Scripted(u32),
    Turn(u32),
    FirstByte(u32),
    AttemptDone(u32),
    /// Request `r` wakes from an [`Action::Wait`]; ignored unless the token is still the
    /// request's pending one (an early wake-up from its wait line replaces its timer).
    Resume(u32, u64),
}

#[derive(Debug, Clone, Copy)]
struct CacheEntry {
    expires: Duration,
    tokens: u64,
}

#[derive(Debug)]
struct Session {
    project: u32,
    turns: u32,
    turn: u32,
    context: u64,
    cache: Vec<Option<CacheEntry>>,
    last_provider: Option<usize>,
}

#[derive(Debug)]
struct Req {
    session: u32,
    project: u32,
    turn: u32,
    id: u64,
    start: Duration,
    attempts: u32,
    tried: u64,
    provider: usize,
    /// Whether the attempt in flight is spill-over ([`Action::Send`]'s `spill`).
    spill: bool,
    /// Whether the attempt in flight times out at the request deadline (a timeout is then the
    /// deadline passing, not the provider failing).
    at_deadline: bool,
    outcome: Outcome,
    sent: Duration,
    uncached: u64,
    cached: u64,
    /// When the attempt in flight shows its first byte, after `sent`.
    first_byte: Duration,
    /// The request's dispatch machine (`switchyard` runs only).
    machine: Option<Box<Dispatch>>,
    /// Its id in the wait lines: arrival number above, slot below.
    waiter: u64,
    /// The token of its pending [`Ev::Resume`], while it waits.
    resume: Option<u64>,
}

fn us(d: Duration) -> u64 {
    d.as_micros() as u64
}

fn instant(t: Duration) -> Instant {
    Instant::from_origin(t)
}

pub(crate) struct Engine<'a> {
    sc: &'a Scenario,
    kind: StrategyKind,
    /// The baseline's strategy, or `None` for `switchyard`, which runs `router`.
    strategy: Option<Box<dyn Strategy + 'a>>,
    router: Option<Switchyard>,
    now: Duration,
    seq: u64,
    heap: BinaryHeap<Reverse<(u64, u64, Ev)>>,
    providers: Vec<ProviderState>,
    sessions: Vec<Session>,
    reqs: Vec<Req>,
    free: Vec<u32>,
    arrivals: ChaCha8Rng,
    srng: ChaCha8Rng,
    next_request_id: u64,
    resume_seq: u64,
    acc: Acc,
    rows: Vec<IntervalRow>,
    interval_start: Duration,
    all_lat_ms: Vec<f32>,
    totals: RunSummary,
    /// Attempt and request log of scripted traffic.
    replay: Option<Replay>,
}

impl std::fmt::Debug for Engine<'_> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Engine")
            .field("scenario", &self.sc.name)
            .field("strategy", &self.kind)
            .field("now", &self.now)
            .finish_non_exhaustive()
    }
}

impl<'a> Engine<'a> {
    pub(crate) fn new(
        sc: &'a Scenario,
        kind: StrategyKind,
        strategy: Option<Box<dyn Strategy + 'a>>,
    ) -> Self {
        let n = sc.providers.len();
        Self {
            sc,
            kind,
            router: strategy.is_none().then(|| Switchyard::new(sc)),
            strategy,
            now: Duration::ZERO,
            seq: 0,
            heap: BinaryHeap::new(),
            providers: sc.providers.iter().map(ProviderState::new).collect(),
            sessions: Vec::new(),
            reqs: Vec::new(),
            free: Vec::new(),
            arrivals: ChaCha8Rng::seed_from_u64(hash(sc.seed, &[1])),
            srng: ChaCha8Rng::seed_from_u64(hash(sc.seed, &[2])),
            next_request_id: 0,
            resume_seq: 0,
            acc: Acc::new(n),
            rows: Vec::new(),
            interval_start: Duration::ZERO,
            all_lat_ms: Vec::new(),
            totals: RunSummary {
                scenario: sc.name.clone(),
                strategy: kind,
                requests: 0,
                client_errors: 0,
                client_error_rate: 0.0,
                affinity_turns: 0,
                affinity_same: 0,
                affinity_retention: 1.0,
                uncached_tokens: 0,
                input_tokens: 0,
                attempts: 0,
                rate_limited: 0,
                provider_errors: 0,
                p50_ms: 0.0,
                p95_ms: 0.0,
                p99_ms: 0.0,
                failures: FailureCounts::default(),
            },
            replay: match &sc.traffic {
                Traffic::Script(t) => Some(Replay {
                    attempts: Vec::new(),
                    served_by: vec![None; t.requests.len()],
                }),
                _ => None,
            },
        }
    }

    fn push(&mut self, at: Duration, ev: Ev) {
        if at > self.sc.duration {
            return;
        }
        self.seq += 1;
        self.heap.push(Reverse((us(at), self.seq, ev)));
    }

    pub(crate) fn run(mut self) -> RunResult {
        self.push(self.sc.interval, Ev::Tick);
        match &self.sc.traffic {
            Traffic::Script(t) => {
                for (i, r) in t.requests.iter().enumerate() {
                    self.push(r.at, Ev::Scripted(i as u32));
                }
            }
            _ => self.push(Duration::ZERO, Ev::Arrival),
        }
        while let Some(Reverse((t, _, ev))) = self.heap.pop() {
            self.now = Duration::from_micros(t);
            match ev {
                Ev::Tick => self.tick(),
                Ev::Arrival => self.arrival(),
                Ev::Scripted(i) => self.scripted(i),
                Ev::Turn(s) => self.turn(s),
                Ev::FirstByte(r) => {
                    let p = self.reqs[r as usize].provider;
                    if let (Some(router), Some(m)) =
                        (self.router.as_mut(), self.reqs[r as usize].machine.as_mut())
                    {
                        m.handle(&mut router.fleet, Event::FirstByte);
                    } else if let Some(strategy) = self.strategy.as_mut() {
                        strategy.on_first_byte(p, instant(self.now));
                    }
                }
                Ev::AttemptDone(r) => self.attempt_done(r),
                Ev::Resume(r, token) => {
                    if self.reqs[r as usize].resume != Some(token) {
                        // Replaced by an early wake-up, or the request is gone.
                        continue;
                    }
                    self.reqs[r as usize].resume = None;
                    if let (Some(router), Some(m)) =
                        (self.router.as_mut(), self.reqs[r as usize].machine.as_mut())
                    {
                        m.handle(&mut router.fleet, Event::Woke);
                    }
                    self.dispatch(r);
                }
            }
        }
        let mut s = self.totals;
        s.client_error_rate = ratio(s.client_errors, s.requests).unwrap_or(0.0);
        s.affinity_retention = ratio(s.affinity_same, s.affinity_turns).unwrap_or(1.0);
        s.p50_ms = percentile(&mut self.all_lat_ms, 0.50).unwrap_or(0.0);
        s.p95_ms = percentile(&mut self.all_lat_ms, 0.95).unwrap_or(0.0);
        s.p99_ms = percentile(&mut self.all_lat_ms, 0.99).unwrap_or(0.0);
        RunResult {
            providers: self.sc.providers.iter().map(|p| p.name.clone()).collect(),
            intervals: self.rows,
            summary: s,
            replay: self.replay.unwrap_or_default(),
        }
    }

    fn tick(&mut self) {
        let (availability, weights) = match (&mut self.router, &mut self.strategy) {
            (Some(router), _) => {
                router.tick();
                (router.availability(), router.weights())
            }
            (None, Some(strategy)) => {
                strategy.tick(instant(self.now));
                (strategy.availability(), strategy.weights())
            }
            (None, None) => (None, None),
        };
        let row = self
            .acc
            .take_row(self.interval_start, availability, weights);
        self.rows.push(row);
        self.interval_start = self.now;
        self.push(self.now + self.sc.interval, Ev::Tick);
    }

    /// Draws an exponential gap with the given rate per second; a zero rate re-checks in 1 s
    /// so that a schedule that starts later is honoured.
    fn exp_gap(&mut self, per_sec: f64) -> Option<Duration> {
        if per_sec <= 0.0 {
            return None;
        }
        let u: f64 = self.arrivals.random::<f64>().max(f64::MIN_POSITIVE);
        Some(Duration::from_secs_f64(-u.ln() / per_sec))
    }

    fn arrival(&mut self) {
        let n = self.sc.providers.len();
        match &self.sc.traffic {
            Traffic::Sessions(t) => {
                let rate = t.sessions_per_minute.at(self.now) / 60.0;
                if let Some(gap) = self.exp_gap(rate) {
                    let project = self.arrivals.random_range(0..t.projects);
                    let turns = self.arrivals.random_range(t.turns[0]..=t.turns[1]);
                    let id = self.sessions.len() as u32;
                    self.sessions.push(Session {
                        project,
                        turns,
                        turn: 0,
                        context: t.initial_context,
                        cache: vec![None; n],
                        last_provider: None,
                    });
                    self.push(self.now, Ev::Turn(id));
                    self.push(self.now + gap, Ev::Arrival);
                } else {
                    self.push(self.now + Duration::from_secs(1), Ev::Arrival);
                }
            }
            Traffic::Poisson(t) => {
                let rate = t.requests_per_second.at(self.now);
                if let Some(gap) = self.exp_gap(rate) {
                    let id = self.next_request_id;
                    let project = (id % 1024) as u32;
                    let r = self.new_req(NO_SESSION, project, 0, id);
                    self.dispatch(r);
                    self.push(self.now + gap, Ev::Arrival);
                } else {
                    self.push(self.now + Duration::from_secs(1), Ev::Arrival);
                }
            }
            // Scripted requests arrive as their own events (`Ev::Scripted`).
            Traffic::Script(_) => {}
        }
    }

    fn scripted(&mut self, i: u32) {
        let Traffic::Script(t) = &self.sc.traffic else {
            return;
        };
        let project = t.requests[i as usize].project;
        let r = self.new_req(NO_SESSION, project, 0, u64::from(i));
        self.dispatch(r);
    }

    fn new_req(&mut self, session: u32, project: u32, turn: u32, id: u64) -> u32 {
        self.next_request_id += 1;
        let input_tokens = match (&self.sc.traffic, self.sessions.get(session as usize)) {
            (Traffic::Sessions(_), Some(sess)) => sess.context,
            (Traffic::Poisson(t), _) => t.input_tokens,
            (Traffic::Script(t), _) => t.input_tokens,
            _ => 0,
        };
        let slot = self.free.last().copied().unwrap_or(self.reqs.len() as u32);
        let waiter = (self.next_request_id << 32) | u64::from(slot);
        let req = Req {
            session,
            project,
            turn,
            id,
            start: self.now,
            attempts: 0,
            tried: 0,
            provider: 0,
            spill: false,
            at_deadline: false,
            outcome: Outcome::Ok,
            sent: self.now,
            uncached: 0,
            cached: 0,
            first_byte: Duration::ZERO,
            machine: self.router.as_ref().map(|router| {
                Box::new(router.request(project, instant(self.now), input_tokens, waiter))
            }),
            waiter,
            resume: None,
        };
        match self.free.pop() {
            Some(i) => {
                self.reqs[i as usize] = req;
                i
            }
            None => {
                self.reqs.push(req);
                (self.reqs.len() - 1) as u32
            }
        }
    }

    fn turn(&mut self, s: u32) {
        let sess = &self.sessions[s as usize];
        let (project, turn) = (sess.project, sess.turn);
        let id = self.next_request_id;
        let r = self.new_req(s, project, turn, id);
        self.dispatch(r);
    }

    fn dispatch(&mut self, r: u32) {
        if self.router.is_some() {
            return self.drive(r);
        }
        let now_i = instant(self.now);
        let req = &self.reqs[r as usize];
        let Some(strategy) = self.strategy.as_mut() else {
            return;
        };
        if req.attempts >= strategy.max_attempts() {
            self.fail(r, Failure::AttemptsExhausted);
            return;
        }
        let pick = strategy.pick(req.project, req.tried, now_i, &mut self.srng);
        match pick {
            Pick::Send(p) => self.send(r, p, self.sc.request_timeout, None),
            Pick::GiveUp => self.fail(r, Failure::NoCandidate),
        }
    }

    /// Runs the request's dispatch machine until it sends, waits or answers.
    fn drive(&mut self, r: u32) {
        let now = instant(self.now);
        let (Some(router), Some(m)) =
            (self.router.as_mut(), self.reqs[r as usize].machine.as_mut())
        else {
            return;
        };
        let action = loop {
            match m.poll(&mut router.fleet, now, &mut self.srng) {
                // Simulated providers keep their own limits and no tenant has a queue.
                Action::Reserve { .. } => m.handle(&mut router.fleet, Event::Reserved(Ok(()))),
                Action::Queue { .. } => m.handle(
                    &mut router.fleet,
                    Event::Queue(Err(QueueReason::QueueDeadline)),
                ),
                action => break action,
            }
        };
        match action {
            Action::Send {
                member,
                attempt_deadline,
                first_token_deadline,
                spill,
                deadline,
                ..
            } => {
                self.reqs[r as usize].spill = spill;
                let to_attempt_deadline = attempt_deadline.saturating_since(now);
                let timeout = self.sc.request_timeout.min(to_attempt_deadline);
                self.reqs[r as usize].at_deadline =
                    attempt_deadline >= deadline && timeout == to_attempt_deadline;
                let first_token = first_token_deadline.map(|d| d.saturating_since(now));
                self.send(r, member, timeout, first_token);
            }
            Action::Wait { until } => {
                // Events are kept in whole microseconds: round the wake-up up, or a pause that
                // ends within the current microsecond would wake the request in a loop.
                let at =
                    Duration::from_micros(until.since_origin().as_nanos().div_ceil(1000) as u64);
                self.resume_seq += 1;
                self.reqs[r as usize].resume = Some(self.resume_seq);
                self.push(
                    at.max(self.now + Duration::from_micros(1)),
                    Ev::Resume(r, self.resume_seq),
                );
            }
            Action::Served { .. } => self.finish(r, true),
            Action::Respond(verdict) => {
                let why = match waited_out(&verdict) {
                    None => Failure::AttemptsExhausted,
                    Some(true) => Failure::QueueTimeout,
                    Some(false) => Failure::NoCandidate,
                };
                self.fail(r, why);
            }
            Action::Reserve { .. } | Action::Queue { .. } => {}
        }
        self.deliver_wakes();
    }

    /// Early wake-ups from the wait lines become virtual-time events now, replacing the
    /// woken requests' own timers.
    fn deliver_wakes(&mut self) {
        let Some(router) = self.router.as_mut() else {
            return;
        };
        for id in router.take_woken() {
            let r = (id & 0xffff_ffff) as u32;
            let Some(req) = self.reqs.get_mut(r as usize) else {
                continue;
            };
            if req.waiter != id || req.resume.is_none() {
                // Not waiting (sending, or done): it will see the line when it next walks.
                continue;
            }
            self.resume_seq += 1;
            req.resume = Some(self.resume_seq);
            self.push(self.now, Ev::Resume(r, self.resume_seq));
        }
    }

    /// Sends request `r`'s next attempt to provider `p`: it times out after `timeout`, or after
    /// `first_token` when its first byte comes later than that (the adaptive first-token
    /// deadline of a stream; the provider has admitted the work and debited its buckets).
    fn send(&mut self, r: u32, p: usize, timeout: Duration, first_token: Option<Duration>) {
        let sc = self.sc;
        let spec = &sc.providers[p];
        let now = self.now;
        let req = &mut self.reqs[r as usize];
        let (uncached, cached, output) =
            match (&sc.traffic, self.sessions.get(req.session as usize)) {
                (Traffic::Sessions(t), Some(sess)) => {
                    let hit = sess.cache[p]
                        .filter(|c| c.expires > now)
                        .map_or(0, |c| c.tokens.min(sess.context));
                    (sess.context - hit, hit, t.output_tokens)
                }
                (Traffic::Poisson(t), _) => (t.input_tokens, 0, 0),
                (Traffic::Script(t), _) => (t.input_tokens, 0, 0),
                _ => (0, 0, 0),
            };
        // Session requests are identified by (session, turn), Poisson requests by arrival id,
        // so the dice do not depend on the order in which a strategy's requests were created.
        let dice = if req.session == NO_SESSION {
            hash(sc.seed, &[req.id, u64::from(req.attempts), p as u64])
        } else {
            let (s, t) = (u64::from(req.session), u64::from(req.turn));
            hash(sc.seed, &[s, t, u64::from(req.attempts), p as u64])
        };
        let (mut outcome, mut latency, mut first_byte) = self.providers[p].attempt(
            spec,
            now,
            timeout,
            AttemptInput {
                uncached,
                cached,
                output,
                dice,
            },
        );
        if let Some(ft) = first_token
            && matches!(outcome, Outcome::Ok | Outcome::StreamCut { .. })
            && first_byte > ft
        {
            (outcome, latency, first_byte) = (Outcome::Timeout, ft, ft);
            // The first-token deadline ended it, not the request deadline.
            req.at_deadline = false;
        }
        if let Some(log) = self.replay.as_mut() {
            log.attempts.push(ReplayAttempt {
                request: req.id,
                provider: p,
                at: now,
            });
        }
        req.attempts += 1;
        req.tried |= 1u64 << p;
        req.provider = p;
        req.outcome = outcome;
        req.sent = now;
        req.uncached = uncached;
        req.cached = cached;
        req.first_byte = first_byte;
        self.providers[p].in_flight += 1;
        if let Some(strategy) = self.strategy.as_mut() {
            strategy.on_start(p, instant(now));
        }
        self.acc.prov[p].attempts += 1;
        self.totals.attempts += 1;
        if matches!(outcome, Outcome::Ok | Outcome::StreamCut { content: true }) {
            // Pushed first, so it is handled first even when it coincides with the end.
            self.push(now + first_byte, Ev::FirstByte(r));
        }
        self.push(now + latency, Ev::AttemptDone(r));
    }

    fn attempt_done(&mut self, r: u32) {
        let req = &self.reqs[r as usize];
        let (p, spill, outcome, at_deadline) =
            (req.provider, req.spill, req.outcome, req.at_deadline);
        let latency = self.now.saturating_sub(req.sent);
        let output = match &self.sc.traffic {
            Traffic::Sessions(t) => t.output_tokens,
            _ => 0,
        };
        let sample = LatencySample {
            total: latency,
            first_token: Some(req.first_byte),
            uncached_input: req.uncached,
            cached_input: req.cached,
            output,
        };
        self.providers[p].in_flight = self.providers[p].in_flight.saturating_sub(1);
        if let (Some(router), Some(m)) =
            (self.router.as_mut(), self.reqs[r as usize].machine.as_mut())
        {
            let (end, finished) = outcome_of(outcome, at_deadline);
            settle(&mut router.fleet, p, spill, end, instant(self.now), latency);
            if matches!(outcome, Outcome::Ok) {
                observe_latency(&mut router.fleet, p, &sample, instant(self.now));
            }
            m.handle(&mut router.fleet, Event::Finished(finished));
        } else if let Some(strategy) = self.strategy.as_mut() {
            strategy.on_finish(p, instant(self.now), latency, outcome);
        }
        match outcome {
            Outcome::Ok => {
                self.acc.prov[p].served += 1;
                if self.router.is_some() {
                    self.drive(r);
                } else {
                    self.finish(r, true);
                }
            }
            Outcome::RateLimited { .. } => {
                self.acc.prov[p].rate_limited += 1;
                self.totals.rate_limited += 1;
                self.dispatch(r);
            }
            Outcome::Server { .. } | Outcome::Timeout | Outcome::StreamCut { content: false } => {
                self.acc.prov[p].errors += 1;
                self.totals.provider_errors += 1;
                self.dispatch(r);
            }
            // Content reached the client: the request is served (it cannot move any more) and
            // the provider failed it.
            Outcome::StreamCut { content: true } => {
                self.acc.prov[p].errors += 1;
                self.totals.provider_errors += 1;
                if self.router.is_some() {
                    self.drive(r);
                } else {
                    self.finish(r, true);
                }
            }
        }
    }

    fn fail(&mut self, r: u32, why: Failure) {
        let f = &mut self.totals.failures;
        match why {
            Failure::AttemptsExhausted => f.attempts_exhausted += 1,
            Failure::QueueTimeout => f.queue_timeout += 1,
            Failure::NoCandidate => f.no_candidate += 1,
        }
        self.finish(r, false);
    }

    fn finish(&mut self, r: u32, ok: bool) {
        let sc = self.sc;
        let now = self.now;
        self.free.push(r);
        let req = &self.reqs[r as usize];
        if let Some(log) = self.replay.as_mut()
            && ok
            && let Some(slot) = log.served_by.get_mut(req.id as usize)
        {
            *slot = Some(req.provider);
        }
        self.acc.requests += 1;
        self.totals.requests += 1;
        if ok {
            let lat = (now.saturating_sub(req.start).as_secs_f64() * 1000.0) as f32;
            self.acc.lat_ms.push(lat);
            self.all_lat_ms.push(lat);
            self.acc.uncached += req.uncached;
            self.acc.input += req.uncached + req.cached;
            self.totals.uncached_tokens += req.uncached;
            self.totals.input_tokens += req.uncached + req.cached;
            if let Some(strategy) = self.strategy.as_mut() {
                strategy.on_served(req.project, req.provider, instant(now));
            }
        } else {
            self.acc.client_errors += 1;
            self.totals.client_errors += 1;
        }
        let (session, provider) = (req.session, req.provider);
        let Traffic::Sessions(t) = &sc.traffic else {
            return;
        };
        let Some(sess) = self.sessions.get_mut(session as usize) else {
            return;
        };
        if ok {
            if let Some(prev) = sess.last_provider {
                self.acc.aff_turns += 1;
                self.totals.affinity_turns += 1;
                if prev == provider {
                    self.acc.aff_same += 1;
                    self.totals.affinity_same += 1;
                }
            }
            sess.last_provider = Some(provider);
            sess.cache[provider] = Some(CacheEntry {
                expires: now + sc.providers[provider].cache_ttl,
                tokens: sess.context,
            });
        }
        // The agent keeps its own context whether or not the turn was served.
        sess.context += t.output_tokens + t.tokens_per_turn;
        sess.turn += 1;
        if sess.turn < sess.turns {
            let u = unit(hash(
                sc.seed,
                &[u64::from(session), u64::from(sess.turn), 99],
            ));
            let mean = t.turn_gap.as_secs_f64();
            let gap = Duration::from_secs_f64(-u.ln() * mean).max(t.min_gap.unwrap_or_default());
            self.push(now + gap, Ev::Turn(session));
        }
    }
}
