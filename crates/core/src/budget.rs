//! Retry budget, fallback throttle and a continuous-refill token bucket (DESIGN §4.4).
//!
//! **Retry budget** (one per router): retries may be at most `ratio` × first attempts seen over a
//! sliding window, plus a floor of `min_retries_per_sec` × window so a quiet router can still
//! retry. First attempts deposit, retries withdraw. During an outage every request fails and
//! wants a retry; the budget caps the extra load at `ratio` instead of multiplying it by the
//! number of attempts. Source: Finagle's `RetryBudget` and linkerd's retry budgets (deposit per
//! request, withdraw per retry, time-bounded); the window here is a ring of
//! [`RING_BUCKETS`] buckets, so it forgets in steps of `window / RING_BUCKETS`.
//!
//! **Fallback throttle**: a token bucket on spill-over to lower-priority providers, so an outage
//! of the primary does not move its whole load onto the next provider in one go (seed 004).
//!
//! **[`TokenBucket`]**: one dimension, refilled continuously at `rate` per second up to `burst`.
//! The quota broker (§4.7) has its own multi-dimension, all-or-nothing buckets; this one serves
//! local throttles only.
//!
//! Alternatives rejected for the budget: a per-request attempt cap alone (bounds one request,
//! not the fleet: 3 attempts per request still triples load in an outage); an exact sliding log
//! of timestamps (memory proportional to traffic).

use std::time::Duration;

use crate::time::Instant;

/// Buckets in the sliding windows: the window forgets in steps of 1/10 of its length.
pub const RING_BUCKETS: usize = 10;

/// Counts of two kinds of events over a sliding window, kept in a ring of equal-width buckets.
///
/// Events older than the window (to bucket granularity) drop out as time advances. Time going
/// backwards (a caller bug) is treated as "no time passed".
#[derive(Debug, Clone)]
pub(crate) struct SlidingCounts {
    buckets: [[u64; 2]; RING_BUCKETS],
    bucket_nanos: u128,
    /// Bucket number (time / bucket width) of the newest bucket.
    head: u128,
}

impl SlidingCounts {
    pub(crate) fn new(window: Duration) -> Self {
        let bucket_nanos = (window.as_nanos() / RING_BUCKETS as u128).max(1);
        SlidingCounts {
            buckets: [[0; 2]; RING_BUCKETS],
            bucket_nanos,
            head: 0,
        }
    }

    fn advance(&mut self, now: Instant) {
        let epoch = now.since_origin().as_nanos() / self.bucket_nanos;
        if epoch <= self.head {
            return;
        }
        let stale = (epoch - self.head).min(RING_BUCKETS as u128) as usize;
        for step in 1..=stale {
            let idx = ((self.head + step as u128) % RING_BUCKETS as u128) as usize;
            self.buckets[idx] = [0; 2];
        }
        self.head = epoch;
    }

    /// Adds one event of kind `kind` (0 or 1) at `now`.
    pub(crate) fn add(&mut self, now: Instant, kind: usize) {
        self.advance(now);
        let idx = (self.head % RING_BUCKETS as u128) as usize;
        if let Some(slot) = self.buckets[idx].get_mut(kind) {
            *slot = slot.saturating_add(1);
        }
    }

    /// Totals of both kinds over the window ending at `now`.
    pub(crate) fn totals(&mut self, now: Instant) -> [u64; 2] {
        self.advance(now);
        self.buckets.iter().fold([0, 0], |acc, b| {
            [acc[0].saturating_add(b[0]), acc[1].saturating_add(b[1])]
        })
    }

    pub(crate) fn clear(&mut self) {
        self.buckets = [[0; 2]; RING_BUCKETS];
    }
}

const ATTEMPTS: usize = 0;
const RETRIES: usize = 1;

/// Router-wide retry budget: retries ≤ `ratio` × first attempts + `min_retries_per_sec` × window,
/// both counted over a sliding `window`.
#[derive(Debug, Clone)]
pub struct RetryBudget {
    ratio: f64,
    floor: f64,
    counts: SlidingCounts,
}

impl RetryBudget {
    /// A budget allowing `ratio` retries per first attempt (0.2 = 20 %; negative or NaN → 0)
    /// over a sliding `window` (10 s typical), plus `min_retries_per_sec` retries per second of
    /// window regardless of traffic.
    pub fn new(ratio: f64, window: Duration, min_retries_per_sec: u32) -> Self {
        let ratio = if ratio.is_nan() { 0.0 } else { ratio.max(0.0) };
        RetryBudget {
            ratio,
            floor: f64::from(min_retries_per_sec) * window.as_secs_f64(),
            counts: SlidingCounts::new(window),
        }
    }

    /// Records a first attempt (a deposit). Retries are not recorded here.
    pub fn record_attempt(&mut self, now: Instant) {
        self.counts.add(now, ATTEMPTS);
    }

    /// Asks to send one retry at `now`: `true` (and the retry is counted) when the budget has
    /// room, `false` otherwise (the caller returns the last error instead of retrying).
    pub fn try_withdraw(&mut self, now: Instant) -> bool {
        let [attempts, retries] = self.counts.totals(now);
        let allowed = self.ratio * attempts as f64 + self.floor;
        if (retries as f64) + 1.0 <= allowed {
            self.counts.add(now, RETRIES);
            true
        } else {
            false
        }
    }

    /// Retries still allowed at `now` (rounded down), for metrics and decision headers.
    pub fn remaining(&mut self, now: Instant) -> u64 {
        let [attempts, retries] = self.counts.totals(now);
        let allowed = (self.ratio * attempts as f64 + self.floor).floor();
        (allowed - retries as f64).max(0.0) as u64
    }
}

/// A token bucket refilled continuously at `rate_per_sec` up to `burst` tokens; starts full.
///
/// One dimension, local state only. The quota broker keeps its own multi-dimension buckets with
/// reservations and reconciliation; this type is for local throttles such as
/// [`FallbackThrottle`].
#[derive(Debug, Clone)]
pub struct TokenBucket {
    rate_per_sec: f64,
    burst: f64,
    tokens: f64,
    last: Option<Instant>,
}

impl TokenBucket {
    /// A full bucket of capacity `burst` refilling at `rate_per_sec` (negative or NaN → 0).
    pub fn new(rate_per_sec: f64, burst: f64) -> Self {
        let clean = |x: f64| if x.is_nan() { 0.0 } else { x.max(0.0) };
        let burst = clean(burst);
        TokenBucket {
            rate_per_sec: clean(rate_per_sec),
            burst,
            tokens: burst,
            last: None,
        }
    }

    fn refill(&mut self, now: Instant) {
        if let Some(last) = self.last {
            let dt = now.saturating_since(last).as_secs_f64();
            self.tokens = (self.tokens + dt * self.rate_per_sec).min(self.burst);
        }
        // Time going backwards keeps the later reading, so tokens are never credited twice.
        self.last = Some(self.last.map_or(now, |l| l.max(now)));
    }

    /// Takes `n` tokens at `now` if available (all or nothing).
    pub fn try_acquire_n(&mut self, n: f64, now: Instant) -> bool {
        self.refill(now);
        if n <= self.tokens {
            self.tokens -= n.max(0.0);
            true
        } else {
            false
        }
    }

    /// Takes one token at `now` if available.
    pub fn try_acquire(&mut self, now: Instant) -> bool {
        self.try_acquire_n(1.0, now)
    }

    /// Tokens available at `now`.
    pub fn available(&mut self, now: Instant) -> f64 {
        self.refill(now);
        self.tokens
    }

    /// How long from `now` until `n` tokens are available (zero if they are; `None` if never,
    /// i.e. `n` exceeds the burst or the rate is zero).
    pub fn time_until(&mut self, n: f64, now: Instant) -> Option<Duration> {
        self.refill(now);
        if n <= self.tokens {
            return Some(Duration::ZERO);
        }
        if n > self.burst || self.rate_per_sec <= 0.0 {
            return None;
        }
        Duration::try_from_secs_f64((n - self.tokens) / self.rate_per_sec).ok()
    }
}

/// Throttle on spill-over from a provider to a lower-priority one: at most `rate_per_sec`
/// fallbacks per second on average, with bursts up to `burst`.
#[derive(Debug, Clone)]
pub struct FallbackThrottle {
    bucket: TokenBucket,
}

impl FallbackThrottle {
    /// A throttle admitting `rate_per_sec` fallbacks per second with bursts of `burst`.
    pub fn new(rate_per_sec: f64, burst: u32) -> Self {
        FallbackThrottle {
            bucket: TokenBucket::new(rate_per_sec, f64::from(burst)),
        }
    }

    /// Asks to send one fallback at `now`; `false` means "do not spill this request".
    pub fn try_acquire(&mut self, now: Instant) -> bool {
        self.bucket.try_acquire(now)
    }

    /// Fallbacks available at `now`.
    pub fn available(&mut self, now: Instant) -> f64 {
        self.bucket.available(now)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn at(ms: u64) -> Instant {
        Instant::from_millis(ms)
    }

    #[test]
    fn retry_budget_ratio_of_attempts_limits_retries() {
        let mut b = RetryBudget::new(0.2, Duration::from_secs(10), 0);
        for _ in 0..100 {
            b.record_attempt(at(0));
        }
        let granted = (0..50).filter(|_| b.try_withdraw(at(1))).count();
        assert_eq!(granted, 20);
        assert_eq!(b.remaining(at(1)), 0);
    }

    #[test]
    fn retry_budget_no_traffic_floor_applies() {
        let mut b = RetryBudget::new(0.2, Duration::from_secs(10), 1);
        // Floor: 1/s × 10 s = 10 retries with no first attempts at all.
        let granted = (0..30).filter(|_| b.try_withdraw(at(0))).count();
        assert_eq!(granted, 10);
    }

    #[test]
    fn retry_budget_window_slides_old_attempts_expire() {
        let mut b = RetryBudget::new(0.5, Duration::from_secs(10), 0);
        for _ in 0..10 {
            b.record_attempt(at(0));
        }
        assert!(b.try_withdraw(at(5_000)));
        // At 11 s the deposits have left the window but the withdrawal at 5 s has not.
        b.record_attempt(at(11_000));
        b.record_attempt(at(11_000));
        assert!(!b.try_withdraw(at(11_000)));
        // At 16 s the withdrawal has left too: 2 deposits × 0.5 = one retry.
        assert!(b.try_withdraw(at(16_000)));
        assert!(!b.try_withdraw(at(16_000)));
    }

    #[test]
    fn retry_budget_invalid_ratio_treated_as_zero() {
        let mut b = RetryBudget::new(f64::NAN, Duration::from_secs(10), 0);
        b.record_attempt(at(0));
        assert!(!b.try_withdraw(at(0)));
    }

    #[test]
    fn sliding_counts_time_backwards_counts_in_head() {
        let mut c = SlidingCounts::new(Duration::from_secs(10));
        c.add(at(9_000), 0);
        c.add(at(1_000), 0);
        assert_eq!(c.totals(at(9_000)), [2, 0]);
        assert_eq!(c.totals(at(100_000)), [0, 0]);
        c.add(at(100_000), 1);
        c.clear();
        assert_eq!(c.totals(at(100_000)), [0, 0]);
    }

    #[test]
    fn fallback_throttle_burst_then_rate() {
        let mut t = FallbackThrottle::new(2.0, 3);
        let burst = (0..10).filter(|_| t.try_acquire(at(0))).count();
        assert_eq!(burst, 3);
        // 2 tokens/s: after 500 ms exactly one token.
        assert!(t.try_acquire(at(500)));
        assert!(!t.try_acquire(at(500)));
        // After 10 s the bucket is full again but no fuller than the burst.
        assert!((t.available(at(10_500)) - 3.0).abs() < 1e-9);
    }

    #[test]
    fn token_bucket_time_until_reports_wait() {
        let mut b = TokenBucket::new(4.0, 8.0);
        assert!(b.try_acquire_n(8.0, at(0)));
        assert_eq!(b.time_until(2.0, at(0)), Some(Duration::from_millis(500)));
        assert_eq!(b.time_until(9.0, at(0)), None);
        assert_eq!(TokenBucket::new(0.0, 1.0).time_until(2.0, at(0)), None);
        assert!(!b.try_acquire(at(100)));
        assert!(b.try_acquire(at(250)));
    }

    #[test]
    fn token_bucket_time_backwards_does_not_credit_twice() {
        let mut b = TokenBucket::new(1.0, 10.0);
        assert!(b.try_acquire_n(10.0, at(5_000)));
        assert!(!b.try_acquire(at(1_000)));
        assert!(b.try_acquire(at(6_000)));
        assert!(!b.try_acquire(at(6_000)));
    }
}
