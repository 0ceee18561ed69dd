//! The scripted provider: rate-limit buckets, outages, background errors and latency.
//!
//! A provider decides an attempt's fate when it is sent, from the scenario and from draws that
//! are hashed from the request's identity (session, turn, attempt, provider) rather than taken
//! from a shared stream. That way every strategy faces exactly the same dice for the same
//! request, and a strategy's choices cannot shift the randomness seen by later requests.

use std::time::Duration;

use std::collections::VecDeque;

use crate::scenario::{Admission, ProviderSpec, ScriptStep};

/// SplitMix64 finaliser: a fast, well-mixed 64-bit hash (Steele, Lea, Flood 2014).
pub(crate) fn mix(mut x: u64) -> u64 {
    x = x.wrapping_add(0x9E37_79B9_7F4A_7C15);
    x = (x ^ (x >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
    x = (x ^ (x >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
    x ^ (x >> 31)
}

/// Hash of several words, seeded.
pub(crate) fn hash(seed: u64, parts: &[u64]) -> u64 {
    parts.iter().fold(mix(seed), |h, &p| mix(h ^ p))
}

/// Uniform in the open interval (0, 1) from a hash.
pub(crate) fn unit(h: u64) -> f64 {
    ((h >> 11) as f64 + 0.5) / (1u64 << 53) as f64
}

/// Standard normal from two hashes (Box–Muller).
pub(crate) fn normal(h1: u64, h2: u64) -> f64 {
    let (u1, u2) = (unit(h1), unit(h2));
    (-2.0 * u1.ln()).sqrt() * (std::f64::consts::TAU * u2).cos()
}

/// How an attempt ended, as the router sees it.
#[derive(Debug, Clone, Copy, PartialEq)]
pub(crate) enum Outcome {
    /// 200 with a full answer.
    Ok,
    /// 429 with the provider's `Retry-After`.
    RateLimited { retry_after: Duration },
    /// 5xx (`status` 500/503).
    Server { status: u16 },
    /// No answer within the request timeout.
    Timeout,
    /// A 200 stream that broke: before any content (`content: false`, the router fails over)
    /// or after content reached the client (`content: true`, served but a provider failure).
    StreamCut {
        /// Whether content was delivered before the cut.
        content: bool,
    },
}

/// The fate of an attempt the provider's script decides: (outcome, time until the router
/// learns it, time of the first byte). Answers take the base latency (errors the error
/// latency), a timeout the whole `timeout`.
fn scripted(
    step: ScriptStep,
    spec: &ProviderSpec,
    timeout: Duration,
) -> (Outcome, Duration, Duration) {
    let (ok, err) = (spec.latency.base, spec.error_latency);
    match step {
        ScriptStep::Ok => (Outcome::Ok, ok, ok / 2),
        ScriptStep::RateLimited { retry_after } => (Outcome::RateLimited { retry_after }, err, err),
        ScriptStep::Server { status } => (Outcome::Server { status }, err, err),
        ScriptStep::Timeout => (Outcome::Timeout, timeout, timeout),
        ScriptStep::CutBeforeContent => (Outcome::StreamCut { content: false }, err, err),
        ScriptStep::CutAfterContent => (Outcome::StreamCut { content: true }, ok, ok / 2),
    }
}

/// A continuously refilled token bucket whose limit may change over time.
#[derive(Debug, Clone)]
struct Bucket {
    level: f64,
    last: Duration,
}

impl Bucket {
    /// Refills to `now` for a per-minute `limit` and a depth of `burst` worth of refill.
    /// Returns (level, capacity, rate per second).
    fn refill(&mut self, now: Duration, limit: f64, burst: Duration) -> (f64, f64) {
        let rate = limit / 60.0;
        let cap = (rate * burst.as_secs_f64()).max(1.0);
        let dt = now.saturating_sub(self.last).as_secs_f64();
        self.level = (self.level + rate * dt).min(cap);
        self.last = now;
        (cap, rate)
    }
}

/// Run-time state of one provider.
#[derive(Debug, Clone)]
pub(crate) struct ProviderState {
    rpm: Option<Bucket>,
    itpm: Option<Bucket>,
    /// Attempts currently being served.
    pub(crate) in_flight: u32,
    /// Scripted fates still to hand out ([`ProviderSpec::script`]).
    script: VecDeque<ScriptStep>,
}

/// Everything the provider needs to know about one attempt.
#[derive(Debug, Clone, Copy)]
pub(crate) struct AttemptInput {
    pub(crate) uncached: u64,
    pub(crate) cached: u64,
    pub(crate) output: u64,
    /// Identity hash of (request, attempt, provider) for this attempt's dice.
    pub(crate) dice: u64,
}

impl ProviderState {
    pub(crate) fn new(spec: &ProviderSpec) -> Self {
        let full = Bucket {
            level: f64::INFINITY,
            last: Duration::ZERO,
        };
        Self {
            rpm: spec.rpm.as_ref().map(|_| full.clone()),
            itpm: spec.itpm.as_ref().map(|_| full.clone()),
            in_flight: 0,
            script: spec.script.iter().copied().collect(),
        }
    }

    /// Decides the attempt's outcome, how long until the router learns it, and when the first
    /// byte arrives (response headers for errors; the end of prefill for a success, which is
    /// when a streaming router knows the provider accepted the work).
    ///
    /// Order of checks: outage window, rate-limit buckets (a rejected attempt consumes nothing),
    /// background errors, then latency against the timeout. Buckets are debited by admitted
    /// attempts, including those that later fail or time out, as real providers do.
    pub(crate) fn attempt(
        &mut self,
        spec: &ProviderSpec,
        now: Duration,
        timeout: Duration,
        inp: AttemptInput,
    ) -> (Outcome, Duration, Duration) {
        if let Some(step) = self.script.pop_front() {
            return scripted(step, spec, timeout);
        }
        let d = |salt: u64| mix(inp.dice ^ salt);
        for o in &spec.outages {
            if now >= o.start && now < o.end && unit(d(1)) < o.fraction {
                return (
                    Outcome::Server { status: o.status },
                    spec.error_latency,
                    spec.error_latency,
                );
            }
        }
        let mut wait = 0.0f64;
        let mut room = true;
        let rpm = spec.rpm.as_ref().map(|s| s.at(now)).zip(self.rpm.as_mut());
        let itpm = spec
            .itpm
            .as_ref()
            .map(|s| s.at(now))
            .zip(self.itpm.as_mut());
        let mut checks: [(Option<(f64, &mut Bucket)>, f64); 2] =
            [(rpm, 1.0), (itpm, inp.uncached as f64)];
        for (b, cost) in checks.iter_mut() {
            if let Some((limit, bucket)) = b {
                let (cap, rate) = bucket.refill(now, *limit, spec.burst);
                let need = match spec.admission {
                    // Anything positive admits; the debt is paid back by the refill.
                    Admission::Overdraft => f64::MIN_POSITIVE,
                    // A request larger than the whole bucket is admitted when the bucket is
                    // full, so it is slow but never starved.
                    Admission::Fit => cost.min(cap),
                };
                if bucket.level < need {
                    room = false;
                    let w = if rate > 0.0 {
                        (need - bucket.level) / rate
                    } else {
                        60.0
                    };
                    wait = wait.max(w);
                }
            }
        }
        if !room {
            let retry_after = spec
                .retry_after
                .unwrap_or_else(|| Duration::from_secs(wait.ceil().clamp(1.0, 60.0) as u64));
            return (
                Outcome::RateLimited { retry_after },
                spec.error_latency,
                spec.error_latency,
            );
        }
        for (b, cost) in checks.iter_mut() {
            if let Some((_, bucket)) = b {
                bucket.level -= *cost;
            }
        }
        if unit(d(2)) < spec.error_rate.at(now) {
            return (
                Outcome::Server { status: 500 },
                spec.error_latency,
                spec.error_latency,
            );
        }
        let l = &spec.latency;
        let ms = |o: Option<Duration>| o.map_or(0.0, |d| d.as_secs_f64());
        let prefill = l.base.as_secs_f64()
            + inp.uncached as f64 / 1000.0 * ms(l.per_1k_uncached)
            + inp.cached as f64 / 1000.0 * ms(l.per_1k_cached);
        let mut secs = prefill + inp.output as f64 * ms(l.per_output_token);
        let first_share = if secs > 0.0 { prefill / secs } else { 1.0 };
        secs *= l.factor.at(now);
        if l.jitter > 0.0 {
            secs *= (l.jitter * normal(d(3), d(4))).exp();
        }
        if let Some(c) = spec.concurrency {
            // Processor sharing: beyond `c` concurrent attempts everybody slows down in
            // proportion (this attempt included).
            secs *= ((self.in_flight + 1) as f64 / c as f64).max(1.0);
        }
        let latency = Duration::from_secs_f64(secs.max(0.0));
        if latency > timeout {
            (Outcome::Timeout, timeout, timeout)
        } else {
            (Outcome::Ok, latency, latency.mul_f64(first_share))
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::scenario::{LatencySpec, Outage, Schedule};

    fn spec() -> ProviderSpec {
        ProviderSpec {
            name: "p".into(),
            rpm: Some(Schedule::constant(60.0)),
            itpm: None,
            burst: Duration::from_secs(2),
            admission: Admission::Fit,
            retry_after: None,
            cache_ttl: Duration::from_secs(300),
            latency: LatencySpec {
                base: Duration::from_millis(100),
                per_1k_uncached: Some(Duration::from_millis(50)),
                per_1k_cached: None,
                per_output_token: None,
                jitter: 0.0,
                factor: Schedule::constant(1.0),
            },
            error_rate: Schedule::constant(0.0),
            outages: vec![Outage {
                start: Duration::from_secs(100),
                end: Duration::from_secs(200),
                status: 503,
                fraction: 1.0,
            }],
            concurrency: None,
            priority: None,
            weight: None,
            error_latency: Duration::from_millis(250),
            script: Vec::new(),
        }
    }

    fn input(n: u64) -> AttemptInput {
        AttemptInput {
            uncached: 2000,
            cached: 0,
            output: 0,
            dice: n,
        }
    }

    #[test]
    fn provider_bucket_empty_returns_429_with_refill_time() {
        let s = spec();
        let mut p = ProviderState::new(&s);
        let t = Duration::from_secs(10);
        let to = Duration::from_secs(60);
        // Depth = 2 s of a 1/s refill = 2 requests.
        assert_eq!(p.attempt(&s, t, to, input(1)).0, Outcome::Ok);
        assert_eq!(p.attempt(&s, t, to, input(2)).0, Outcome::Ok);
        assert_eq!(
            p.attempt(&s, t, to, input(3)).0,
            Outcome::RateLimited {
                retry_after: Duration::from_secs(1)
            }
        );
        assert_eq!(
            p.attempt(&s, t + Duration::from_secs(1), to, input(4)).0,
            Outcome::Ok
        );
    }

    #[test]
    fn provider_overdraft_admits_while_positive_and_waits_out_the_debt() {
        let mut s = spec();
        s.admission = Admission::Overdraft;
        s.rpm = None;
        // 60 000 uncached tokens/min = 1000/s, depth 2 s = 2000 tokens.
        s.itpm = Some(Schedule::constant(60_000.0));
        let mut p = ProviderState::new(&s);
        let t = Duration::from_secs(10);
        let to = Duration::from_secs(60);
        let big = |n| AttemptInput {
            uncached: 5000,
            cached: 0,
            output: 0,
            dice: n,
        };
        // Larger than the whole bucket, admitted because the bucket is positive: -3000 left.
        assert_eq!(p.attempt(&s, t, to, big(1)).0, Outcome::Ok);
        assert_eq!(
            p.attempt(&s, t, to, big(2)).0,
            Outcome::RateLimited {
                retry_after: Duration::from_secs(3)
            }
        );
        assert_eq!(
            p.attempt(&s, t + Duration::from_millis(3001), to, big(3)).0,
            Outcome::Ok
        );
    }

    #[test]
    fn provider_first_byte_is_the_prefill_share_of_latency() {
        let mut s = spec();
        s.latency.per_output_token = Some(Duration::from_millis(10));
        let mut p = ProviderState::new(&s);
        let inp = AttemptInput {
            uncached: 2000,
            cached: 0,
            output: 100,
            dice: 9,
        };
        let (o, l, fb) = p.attempt(&s, Duration::ZERO, Duration::from_secs(60), inp);
        assert_eq!(o, Outcome::Ok);
        // prefill 100 ms + 2 × 50 ms = 200 ms, decode 1000 ms.
        assert_eq!(l, Duration::from_millis(1200));
        assert_eq!(fb, Duration::from_millis(200));
    }

    #[test]
    fn provider_latency_counts_uncached_tokens() {
        let s = spec();
        let mut p = ProviderState::new(&s);
        let (o, l, _) = p.attempt(&s, Duration::ZERO, Duration::from_secs(60), input(1));
        assert_eq!(o, Outcome::Ok);
        assert_eq!(l, Duration::from_millis(200));
    }

    #[test]
    fn provider_in_outage_window_fails_with_its_status() {
        let s = spec();
        let mut p = ProviderState::new(&s);
        let (o, _, _) = p.attempt(
            &s,
            Duration::from_secs(150),
            Duration::from_secs(60),
            input(1),
        );
        assert_eq!(o, Outcome::Server { status: 503 });
    }

    #[test]
    fn hash_unit_is_inside_open_interval_and_spread() {
        let mean: f64 = (0..10_000u64).map(|i| unit(hash(7, &[i]))).sum::<f64>() / 10_000.0;
        assert!((mean - 0.5).abs() < 0.02, "{mean}");
    }
}
