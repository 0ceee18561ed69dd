//! Power of two choices with per-service scoring (DESIGN §4.6).
//!
//! Per request: with probability `exploration` pick one eligible provider uniformly (so idle
//! providers get fresh samples); otherwise sample two *distinct* eligible providers uniformly and
//! send to the one with the lower cost. Two random choices avoid the herding of "everyone picks the
//! global best" while cutting the maximum load from `log n / log log n` to `log log n`
//! (Mitzenmacher 1996; seed 002, Pinecone). Costs (lower is better):
//!
//! ```text
//! Latency:             peak_ewma_latency × (in_flight + 1) × (1 + error_penalty × error_rate)
//! ReliabilityAndLoad:  (in_flight + 1) / max_concurrency × (1 + error_penalty × error_rate)
//! ```
//!
//! `Latency` suits embeddings and rerankers, whose latency reflects the backend; LLM latency is
//! mostly the request's own doing (prompt size, output length, cache hits), so LLM policies score
//! reliability and load instead (seed 002).
//!
//! *Peak EWMA* (Finagle, linkerd's `linkerd/ewma`): a sample above the average replaces it at once,
//! one below pulls it down with weight `1 − exp(−Δt/τ)`, so a slowing backend is avoided at once
//! and trusted again only gradually. Failed requests raise the latency estimate but never lower it:
//! a backend that fails fast must not look fast. The error rate is an EWMA of the per-request
//! failure indicator with the same time constant (and a floor on the per-sample weight so a burst
//! at one instant still counts).
//!
//! Idle decay: between samples, latency and error rate relax toward a neutral prior
//! (`default_latency`, error rate 0) with time constant `decay`, so one bad spell does not keep a
//! provider out forever; exploration then supplies the fresh samples that confirm or refute it.
//!
//! In-flight counts are per provider and shared by every endpoint that uses the provider (field
//! case 24): [`P2c::on_start`] increments, [`P2c::on_finish`] / [`P2c::on_cancel`] decrement, and
//! the count saturates at zero, so a double finish (a caller bug) cannot make it negative and
//! attract all traffic.
//!
//! Ties: the pair is drawn in random order and the first is kept unless the second is strictly
//! better, so equal costs are broken uniformly at random without another draw.

use std::time::Duration;

use rand::Rng;

use crate::time::Instant;

/// What a p2c policy compares.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum ScoringMode {
    /// Peak-EWMA latency × (in-flight + 1), penalised by the error rate (embeddings, rerank).
    #[default]
    Latency,
    /// Error rate and in-flight relative to max concurrency (LLMs).
    ReliabilityAndLoad,
}

/// p2c settings.
#[derive(Debug, Clone, PartialEq)]
pub struct P2cConfig {
    /// Scoring rule.
    pub mode: ScoringMode,
    /// Fraction of picks sent to a uniformly random eligible provider (0.02 = 2 %).
    pub exploration: f64,
    /// Time constant with which idle scores relax toward the neutral prior.
    pub decay: Duration,
    /// Time constant of the latency and error-rate EWMAs.
    pub ewma_tau: Duration,
    /// Latency assumed for a provider without samples (the neutral prior).
    pub default_latency: Duration,
    /// Cost multiplier per unit error rate: cost × (1 + penalty × rate). 10 ⇒ 10 % errors doubles
    /// the cost; a provider failing everything costs 11× a clean one.
    pub error_penalty: f64,
}

impl Default for P2cConfig {
    /// Latency mode, 2 % exploration, 30 s idle decay, 10 s EWMA, 250 ms prior, penalty 10.
    ///
    /// τ = 10 s follows linkerd's default decay; 30 s of idle decay is one availability interval;
    /// 250 ms is a typical embedding round trip, so an unknown provider is neither shunned nor
    /// flooded.
    fn default() -> Self {
        P2cConfig {
            mode: ScoringMode::Latency,
            exploration: 0.02,
            decay: Duration::from_secs(30),
            ewma_tau: Duration::from_secs(10),
            default_latency: Duration::from_millis(250),
            error_penalty: 10.0,
        }
    }
}

/// Minimum weight of one sample in the error-rate EWMA (see module docs).
const MIN_ERROR_ALPHA: f64 = 0.05;

/// Recent load of one provider.
#[derive(Debug, Clone, PartialEq)]
pub struct LoadStats {
    /// Peak-EWMA latency in seconds, `None` before the first sample.
    latency_s: Option<f64>,
    /// EWMA of the failure indicator, in `[0, 1]`.
    error_rate: f64,
    /// Requests started and not yet finished; never negative (saturating).
    in_flight: u32,
    /// Concurrency the provider accepts; 0 = unknown (treated as 1 in the load ratio).
    max_concurrency: u32,
    /// Time of the last finished request (EWMA and decay reference).
    last_sample: Option<Instant>,
}

impl Default for LoadStats {
    fn default() -> Self {
        LoadStats {
            latency_s: None,
            error_rate: 0.0,
            in_flight: 0,
            max_concurrency: 0,
            last_sample: None,
        }
    }
}

impl LoadStats {
    /// Requests in flight.
    pub fn in_flight(&self) -> u32 {
        self.in_flight
    }

    /// Configured max concurrency (0 = unknown).
    pub fn max_concurrency(&self) -> u32 {
        self.max_concurrency
    }

    /// Peak-EWMA latency without idle decay, `None` before the first sample.
    pub fn raw_latency(&self) -> Option<Duration> {
        self.latency_s
            .and_then(|s| Duration::try_from_secs_f64(s).ok())
    }

    /// Error-rate EWMA without idle decay, in `[0, 1]`.
    pub fn raw_error_rate(&self) -> f64 {
        self.error_rate
    }

    /// Latency (s) and error rate relaxed toward the prior for the idle time up to `now`.
    fn decayed(&self, now: Instant, cfg: &P2cConfig) -> (f64, f64) {
        let prior = cfg.default_latency.as_secs_f64();
        let (Some(lat), Some(last)) = (self.latency_s, self.last_sample) else {
            return (prior, self.error_rate);
        };
        let keep = retention(now.saturating_since(last), cfg.decay);
        (prior + (lat - prior) * keep, self.error_rate * keep)
    }
}

/// `exp(−Δt/τ)`: the weight an old value keeps after `dt`; τ = 0 forgets at once.
fn retention(dt: Duration, tau: Duration) -> f64 {
    let tau = tau.as_secs_f64();
    if tau <= 0.0 {
        0.0
    } else {
        (-dt.as_secs_f64() / tau).exp()
    }
}

/// Power-of-two-choices picker over `n` providers (indices `0..n`). See the module docs.
#[derive(Debug, Clone)]
pub struct P2c {
    cfg: P2cConfig,
    stats: Vec<LoadStats>,
}

impl P2c {
    /// A picker for `n` providers with no history.
    pub fn new(n: usize, cfg: P2cConfig) -> Self {
        P2c {
            cfg,
            stats: vec![LoadStats::default(); n],
        }
    }

    /// The settings.
    pub fn config(&self) -> &P2cConfig {
        &self.cfg
    }

    /// Number of providers.
    pub fn len(&self) -> usize {
        self.stats.len()
    }

    /// Whether there are no providers.
    pub fn is_empty(&self) -> bool {
        self.stats.is_empty()
    }

    /// Stats of provider `i`, `None` when out of range.
    pub fn stats(&self, i: usize) -> Option<&LoadStats> {
        self.stats.get(i)
    }

    /// Sets provider `i`'s max concurrency (0 = unknown). Out-of-range indices are ignored.
    pub fn set_max_concurrency(&mut self, i: usize, max: u32) {
        if let Some(s) = self.stats.get_mut(i) {
            s.max_concurrency = max;
        }
    }

    /// Requests in flight at provider `i` (0 when out of range).
    pub fn in_flight(&self, i: usize) -> u32 {
        self.stats.get(i).map_or(0, |s| s.in_flight)
    }

    /// Cost of provider `i` at `now` under the configured mode (lower is better). Out-of-range
    /// indices cost `+∞`.
    pub fn cost(&self, i: usize, now: Instant) -> f64 {
        let Some(s) = self.stats.get(i) else {
            return f64::INFINITY;
        };
        let (latency, error_rate) = s.decayed(now, &self.cfg);
        let penalty = 1.0 + self.cfg.error_penalty.max(0.0) * error_rate;
        let pending = f64::from(s.in_flight) + 1.0;
        match self.cfg.mode {
            ScoringMode::Latency => latency * pending * penalty,
            ScoringMode::ReliabilityAndLoad => {
                pending / f64::from(s.max_concurrency.max(1)) * penalty
            }
        }
    }

    /// Two distinct entries of `eligible`, uniformly at random and in random order; `None` when
    /// `eligible` has fewer than two entries. `eligible` must not repeat an index.
    pub fn pick_pair(&self, eligible: &[usize], rng: &mut impl Rng) -> Option<(usize, usize)> {
        let n = eligible.len();
        if n < 2 {
            return None;
        }
        let a = rng.random_range(0..n);
        let mut b = rng.random_range(0..n - 1);
        if b >= a {
            b += 1;
        }
        Some((eligible[a], eligible[b]))
    }

    /// The provider to send to: `None` when `eligible` is empty, the only entry when there is
    /// one, a uniformly random entry with probability `exploration`, else the cheaper of
    /// [`pick_pair`](Self::pick_pair) (ties at random). `eligible` lists provider indices without
    /// repeats.
    pub fn pick(&self, eligible: &[usize], now: Instant, rng: &mut impl Rng) -> Option<usize> {
        match eligible {
            [] => return None,
            [only] => return Some(*only),
            _ => {}
        }
        let explore = self.cfg.exploration;
        if explore > 0.0 && rng.random::<f64>() < explore {
            return Some(eligible[rng.random_range(0..eligible.len())]);
        }
        let (a, b) = self.pick_pair(eligible, rng)?;
        Some(if self.cost(b, now) < self.cost(a, now) {
            b
        } else {
            a
        })
    }

    /// A request to provider `i` starts at `now`.
    pub fn on_start(&mut self, i: usize, _now: Instant) {
        if let Some(s) = self.stats.get_mut(i) {
            s.in_flight = s.in_flight.saturating_add(1);
        }
    }

    /// A request started without an outcome that says anything about the provider (client
    /// cancelled, short-circuited locally): releases its in-flight slot only.
    pub fn on_cancel(&mut self, i: usize, _now: Instant) {
        if let Some(s) = self.stats.get_mut(i) {
            s.in_flight = s.in_flight.saturating_sub(1);
        }
    }

    /// A request to provider `i` finished at `now` after `latency`, successfully or not
    /// (provider-side failure). Releases its in-flight slot and updates the EWMAs.
    pub fn on_finish(&mut self, i: usize, now: Instant, latency: Duration, ok: bool) {
        let cfg = &self.cfg;
        let Some(s) = self.stats.get_mut(i) else {
            return;
        };
        s.in_flight = s.in_flight.saturating_sub(1);
        let (base_latency, base_errors) = s.decayed(now, cfg);
        let dt = s
            .last_sample
            .map_or(Duration::MAX, |t| now.saturating_since(t));
        let keep = retention(dt, cfg.ewma_tau);
        let sample = latency.as_secs_f64();
        let had_latency = s.latency_s.is_some();
        s.latency_s = Some(if !had_latency {
            sample
        } else if sample > base_latency {
            // Peak: jump up at once, whether the request failed or not.
            sample
        } else if ok {
            base_latency * keep + sample * (1.0 - keep)
        } else {
            base_latency
        });
        let alpha = (1.0 - keep).max(MIN_ERROR_ALPHA);
        let failed = if ok { 0.0 } else { 1.0 };
        s.error_rate = (base_errors * (1.0 - alpha) + failed * alpha).clamp(0.0, 1.0);
        s.last_sample = Some(s.last_sample.map_or(now, |t| t.max(now)));
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use rand::SeedableRng;
    use rand_chacha::ChaCha8Rng;

    fn at(ms: u64) -> Instant {
        Instant::from_millis(ms)
    }

    fn no_explore(mode: ScoringMode) -> P2cConfig {
        P2cConfig {
            mode,
            exploration: 0.0,
            ..P2cConfig::default()
        }
    }

    #[test]
    fn pick_no_eligible_none_one_eligible_it() {
        let p = P2c::new(3, P2cConfig::default());
        let mut rng = ChaCha8Rng::seed_from_u64(1);
        assert_eq!(p.pick(&[], at(0), &mut rng), None);
        assert_eq!(p.pick(&[2], at(0), &mut rng), Some(2));
        assert_eq!(p.pick_pair(&[2], &mut rng), None);
    }

    #[test]
    fn pick_two_providers_prefers_faster() {
        let mut p = P2c::new(2, no_explore(ScoringMode::Latency));
        p.on_start(0, at(0));
        p.on_finish(0, at(100), Duration::from_millis(100), true);
        p.on_start(1, at(0));
        p.on_finish(1, at(900), Duration::from_millis(900), true);
        let mut rng = ChaCha8Rng::seed_from_u64(7);
        for _ in 0..100 {
            assert_eq!(p.pick(&[0, 1], at(1_000), &mut rng), Some(0));
        }
    }

    #[test]
    fn pick_in_flight_steers_away_from_busy() {
        let mut p = P2c::new(2, no_explore(ScoringMode::Latency));
        for _ in 0..3 {
            p.on_start(0, at(0));
        }
        let mut rng = ChaCha8Rng::seed_from_u64(3);
        assert_eq!(p.pick(&[0, 1], at(0), &mut rng), Some(1));
        assert_eq!(p.in_flight(0), 3);
    }

    #[test]
    fn pick_equal_scores_split_evenly() {
        let p = P2c::new(2, no_explore(ScoringMode::Latency));
        let mut rng = ChaCha8Rng::seed_from_u64(11);
        let zeros = (0..10_000)
            .filter(|_| p.pick(&[0, 1], at(0), &mut rng) == Some(0))
            .count();
        // Binomial(10 000, 0.5): sd = 50; ±300 is 6 sd.
        assert!((4_700..=5_300).contains(&zeros), "{zeros}");
    }

    #[test]
    fn pick_exploration_reaches_worst_provider() {
        let cfg = P2cConfig {
            exploration: 0.1,
            ..P2cConfig::default()
        };
        let mut p = P2c::new(2, cfg);
        p.on_finish(1, at(0), Duration::from_secs(30), false);
        let mut rng = ChaCha8Rng::seed_from_u64(5);
        let worst = (0..10_000)
            .filter(|_| p.pick(&[0, 1], at(0), &mut rng) == Some(1))
            .count();
        // Exploration 10 % × 1/2 = 5 % ≈ 500 picks; the pair itself never prefers 1.
        assert!((350..=650).contains(&worst), "{worst}");
    }

    #[test]
    fn in_flight_double_finish_never_negative() {
        let mut p = P2c::new(1, P2cConfig::default());
        p.on_start(0, at(0));
        p.on_finish(0, at(10), Duration::from_millis(10), true);
        p.on_finish(0, at(11), Duration::from_millis(10), true);
        p.on_cancel(0, at(12));
        assert_eq!(p.in_flight(0), 0);
        // Out-of-range indices are ignored, not a panic.
        p.on_start(5, at(0));
        p.on_finish(5, at(0), Duration::ZERO, true);
        assert_eq!(p.in_flight(5), 0);
        assert_eq!(p.cost(5, at(0)), f64::INFINITY);
    }

    #[test]
    fn peak_ewma_jumps_up_decays_down() {
        let mut p = P2c::new(1, P2cConfig::default());
        let ms = Duration::from_millis;
        p.on_finish(0, at(0), ms(100), true);
        p.on_finish(0, at(1_000), ms(1_000), true);
        let peak = p.stats(0).and_then(LoadStats::raw_latency).unwrap();
        assert_eq!(peak, ms(1_000));
        // 10 s later (one τ) a 100 ms sample: new = prior-decayed base × e⁻¹ + 0.1 × (1 − e⁻¹).
        p.on_finish(0, at(11_000), ms(100), true);
        let lat = p
            .stats(0)
            .and_then(LoadStats::raw_latency)
            .unwrap()
            .as_secs_f64();
        let keep_idle = (-10.0f64 / 30.0).exp();
        let base = 0.25 + (1.0 - 0.25) * keep_idle;
        let keep = (-1.0f64).exp();
        let want = base * keep + 0.1 * (1.0 - keep);
        assert!((lat - want).abs() < 1e-9, "{lat} vs {want}");
        assert!(lat < 1.0 && lat > 0.1);
    }

    #[test]
    fn failed_fast_request_does_not_lower_latency() {
        let mut p = P2c::new(1, P2cConfig::default());
        let ms = Duration::from_millis;
        p.on_finish(0, at(0), ms(500), true);
        p.on_finish(0, at(10), ms(1), false);
        let lat = p.stats(0).and_then(LoadStats::raw_latency).unwrap();
        assert!(lat >= ms(499), "{lat:?}");
        assert!(p.stats(0).unwrap().raw_error_rate() > 0.0);
    }

    #[test]
    fn idle_scores_decay_toward_prior() {
        let cfg = P2cConfig::default();
        let mut p = P2c::new(1, cfg.clone());
        p.on_finish(0, at(0), Duration::from_secs(5), false);
        let fresh = p.cost(0, at(0));
        let idle = p.cost(0, at(600_000));
        let prior = cfg.default_latency.as_secs_f64();
        assert!(fresh > 5.0);
        assert!((idle - prior).abs() < 1e-6, "{idle}");
    }

    #[test]
    fn reliability_mode_prefers_fewer_errors_and_spare_concurrency() {
        let mut p = P2c::new(2, no_explore(ScoringMode::ReliabilityAndLoad));
        p.set_max_concurrency(0, 10);
        p.set_max_concurrency(1, 10);
        // Provider 0 is slow but clean; provider 1 fast with failures.
        p.on_finish(0, at(0), Duration::from_secs(20), true);
        for t in 0..5 {
            p.on_finish(1, at(t), Duration::from_millis(50), false);
        }
        assert!(p.cost(0, at(4)) < p.cost(1, at(4)));
        // With 8 of 10 slots busy provider 0 costs 0.9, still below provider 1's error-penalised
        // 0.1 × (1 + 10 × rate).
        for _ in 0..8 {
            p.on_start(0, at(4));
        }
        let err = p.stats(1).unwrap().raw_error_rate();
        assert!(err > 0.99);
        let c1 = 0.1 * (1.0 + 10.0 * err);
        assert!((p.cost(1, at(4)) - c1).abs() < 1e-9);
        assert!((p.cost(0, at(4)) - 0.9).abs() < 1e-9);
    }
}
