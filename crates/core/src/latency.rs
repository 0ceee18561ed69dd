//! Slowness as a signal (issue 18 item 2): which answers of a provider were clearly slower than
//! that provider usually is, and how long to wait for a first token before failing over.
//!
//! A provider that slows down without failing is invisible to an error-rate controller, and raw
//! latency is a poor signal: a 40 k-token cold prompt takes longer than a warm 2 k-token turn on
//! a healthy provider. So each provider keeps a **baseline model** of its own latency given the
//! work of the request, and every successful attempt is judged against it.
//!
//! **Model** (per provider, fitted online): ridge regression with exponential forgetting,
//!
//! ```text
//! total ≈ θ₀ + θ₁·uncached_k + θ₂·cached_k + θ₃·output_k        (seconds; k = thousands of tokens)
//! ttft  ≈ φ₀ + φ₁·uncached_k + φ₂·cached_k                        (streams only)
//! ```
//!
//! solved from exponentially weighted sufficient statistics `XᵀX`, `Xᵀy` (what is older than
//! now by `Δt` weighs `exp(−Δt/MEMORY)`, 4 hours: a memory in time, not in samples, so a busy
//! provider does not forget its normal within seconds; ridge `δ` on the diagonal). Keeping the statistics
//! instead of a recursive-least-squares covariance avoids covariance wind-up when a feature
//! is not excited (all outputs the same length): the ridge keeps that direction at 0. The token
//! counts are the provider's reported usage, so prompt length and cache hits are explained by
//! the model and do not read as slowness (the issue's "does not punish long prompts").
//!
//! **Judgement**: `r = observed / predicted` (the larger of the total and first-token ratios).
//! The sample is *slow* when `ln r − ln f_peers > ln SLOW_RATIO` (2×), where `f_peers ≥ 1` is the
//! median recent ratio of the route's other warm providers: when every provider is slower (a
//! global load spike, longer answers than the model knows), nobody is singled out. Judgement
//! starts after `WARMUP` samples.
//!
//! **Baseline under slowness**: a sample more than `ADOPT_RATIO` (1.35×) slower than predicted
//! is fed to the model at weight `SLOW_WEIGHT` (2 %). With the 4-hour memory neither a sudden
//! slowdown nor a creep (2 % per minute, the boiling frog: flagged at about twice the old
//! latency, unit-tested) becomes the new normal while it lasts; a change that persists for
//! several hours does, and the provider's weight returns. A shorter memory was tried and
//! rejected: at 30 minutes the baseline rode along with a creep and never flagged it. A daily
//! pattern that slows every provider alike is cancelled by the peer correction; one that slows
//! a single provider for hours is, by this definition, slowness.
//!
//! **Into the controller**: slow successes are soft errors with their own target
//! ([`SLOW_TARGET`], 2 % of successes): [`crate::dispatch::window_counts`] counts each as
//! `target_error_rate / SLOW_TARGET` of an error, so a provider whose every answer is slow looks
//! to the availability controller like one with a 25 % error rate (at the default 0.5 % target)
//! and loses weight within a few intervals, while one with a few slow outliers is not touched.
//! The same controller, gain schedule and cascade apply, so it recovers by itself: when its
//! answers are normal again the windows are clean and the ramp brings it back.
//!
//! **Adaptive first-token deadline** ([`LatencyModel::first_token_timeout`]): for a stream,
//! `FIRST_TOKEN_MULTIPLE × predicted ttft` with the whole input taken as uncached (the router
//! cannot know the cache state before sending), at least `FIRST_TOKEN_FLOOR`. It replaces a
//! fixed first-token deadline only when it is shorter, and only once the model is warm.
//!
//! Sources: Envoy's outlier detection (judge a host against its peers, not an absolute bar),
//! Netflix's gradient concurrency limiter (compare the current latency with a slowly learned
//! no-load baseline) and "The Tail at Scale" (Dean & Barroso, 2013: act on per-request
//! latency, not averages). Alternatives rejected: a fixed latency SLO (punishes long prompts
//! and slow-but-normal providers); p2c on raw latency (breaks cache affinity, and already the
//! embeddings strategy); TTFT per uncached input token (undefined for fully cached turns and
//! dominated by the fixed part for short ones); a recursive-least-squares filter (its
//! covariance winds up in unexcited directions under forgetting); hedged requests (a second
//! prefill of a 40 k-token context is not cheap; not built).

use std::time::Duration;

use crate::time::Instant;

/// Ratio to the baseline above which an answer is slow (after the peer correction).
pub const SLOW_RATIO: f64 = 2.0;

/// Fraction of successes allowed to be slow before the controller reacts (the soft target).
pub const SLOW_TARGET: f64 = 0.02;

/// Weight in the baseline of a sample slower than [`ADOPT_RATIO`] × predicted.
pub const SLOW_WEIGHT: f64 = 0.02;

/// Ratio to the baseline above which a sample is learned only at [`SLOW_WEIGHT`].
pub const ADOPT_RATIO: f64 = 1.35;

/// Samples before the model judges or sets deadlines.
pub const WARMUP: u64 = 30;

/// Time constant of the baseline's forgetting.
pub const MEMORY: Duration = Duration::from_secs(4 * 3600);

/// Multiple of the predicted first-token time that the adaptive deadline allows.
pub const FIRST_TOKEN_MULTIPLE: f64 = 4.0;

/// Lower bound of the adaptive first-token deadline.
pub const FIRST_TOKEN_FLOOR: Duration = Duration::from_secs(2);

/// Half-life, in judged samples, of the recent ratio used for the peer comparison.
const RECENT_SAMPLES: f64 = 50.0;

/// Ridge added to the diagonal, relative to the total weight.
const RIDGE: f64 = 1e-3;

/// What one successful attempt took and did.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct LatencySample {
    /// From sending the attempt to its last byte.
    pub total: Duration,
    /// From sending to the first content, for streams; `None` when not observed.
    pub first_token: Option<Duration>,
    /// Input tokens the provider did not read from its cache.
    pub uncached_input: u64,
    /// Input tokens read from the provider's cache.
    pub cached_input: u64,
    /// Output tokens.
    pub output: u64,
}

/// Exponentially weighted ridge regression over `N` features (see the module docs).
#[derive(Debug, Clone)]
struct Ridge<const N: usize> {
    xtx: [[f64; N]; N],
    xty: [f64; N],
    weight: f64,
    theta: Option<[f64; N]>,
}

impl<const N: usize> Ridge<N> {
    fn new() -> Self {
        Ridge {
            xtx: [[0.0; N]; N],
            xty: [0.0; N],
            weight: 0.0,
            theta: None,
        }
    }

    /// Forgets by `keep`, then adds `(x, y)` with weight `w`.
    fn add(&mut self, x: &[f64; N], y: f64, w: f64, keep: f64) {
        for i in 0..N {
            for j in 0..N {
                self.xtx[i][j] = self.xtx[i][j] * keep + w * x[i] * x[j];
            }
            self.xty[i] = self.xty[i] * keep + w * x[i] * y;
        }
        self.weight = self.weight * keep + w;
        self.theta = None;
    }

    fn predict(&mut self, x: &[f64; N]) -> Option<f64> {
        if self.theta.is_none() {
            self.theta = self.solve();
        }
        let t = self.theta?;
        Some(x.iter().zip(&t).map(|(a, b)| a * b).sum())
    }

    /// Gaussian elimination with partial pivoting on `(XᵀX + δI) θ = Xᵀy`.
    fn solve(&self) -> Option<[f64; N]> {
        let mut a = self.xtx;
        let mut b = self.xty;
        let delta = RIDGE * self.weight.max(1.0);
        for (i, row) in a.iter_mut().enumerate() {
            row[i] += delta;
        }
        for col in 0..N {
            let pivot = (col..N).max_by(|&i, &j| a[i][col].abs().total_cmp(&a[j][col].abs()))?;
            if a[pivot][col].abs() < 1e-12 {
                return None;
            }
            a.swap(col, pivot);
            b.swap(col, pivot);
            let pivot_row = a[col];
            for row in col + 1..N {
                let f = a[row][col] / pivot_row[col];
                for (v, p) in a[row][col..].iter_mut().zip(&pivot_row[col..]) {
                    *v -= f * p;
                }
                b[row] -= f * b[col];
            }
        }
        let mut x = [0.0; N];
        for row in (0..N).rev() {
            let s: f64 = (row + 1..N).map(|k| a[row][k] * x[k]).sum();
            x[row] = (b[row] - s) / a[row][row];
        }
        x.iter().all(|v| v.is_finite()).then_some(x)
    }
}

fn total_features(s: &LatencySample) -> [f64; 4] {
    [
        1.0,
        s.uncached_input as f64 / 1000.0,
        s.cached_input as f64 / 1000.0,
        s.output as f64 / 1000.0,
    ]
}

fn ttft_features(uncached: u64, cached: u64) -> [f64; 3] {
    [1.0, uncached as f64 / 1000.0, cached as f64 / 1000.0]
}

/// One provider's latency baseline and recent ratio. See the module docs.
#[derive(Debug, Clone)]
pub struct LatencyModel {
    last: Option<Instant>,
    total: Ridge<4>,
    ttft: Ridge<3>,
    samples: u64,
    ttft_samples: u64,
    /// EWMA of `ln r` over judged samples (0 = as usual).
    recent: f64,
    judged: u64,
}

impl Default for LatencyModel {
    fn default() -> Self {
        Self::new()
    }
}

/// The judgement of one sample by [`LatencyModel::observe`].
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Judgement {
    /// `ln(observed / predicted)`; `None` while the model is warming up.
    pub log_ratio: Option<f64>,
    /// Whether the sample counts as slow (after the peer correction).
    pub slow: bool,
}

impl LatencyModel {
    /// An empty (cold) model.
    pub fn new() -> Self {
        LatencyModel {
            last: None,
            total: Ridge::new(),
            ttft: Ridge::new(),
            samples: 0,
            ttft_samples: 0,
            recent: 0.0,
            judged: 0,
        }
    }

    /// Whether the model has seen [`WARMUP`] samples.
    pub fn warm(&self) -> bool {
        self.samples >= WARMUP
    }

    /// The recent `ln(observed / predicted)` (EWMA, 0 while cold): what peers compare with.
    pub fn recent_log_ratio(&self) -> Option<f64> {
        (self.judged >= WARMUP / 2).then_some(self.recent)
    }

    /// `ln(observed / predicted)` of a sample without learning from it; `None` while cold.
    pub fn log_ratio(&mut self, s: &LatencySample) -> Option<f64> {
        if !self.warm() {
            return None;
        }
        let ratio = |obs: Duration, pred: Option<f64>| {
            pred.filter(|p| *p > 1e-3)
                .map(|p| (obs.as_secs_f64().max(1e-3) / p).ln())
        };
        let total = ratio(s.total, self.total.predict(&total_features(s)));
        let ttft = match s.first_token {
            Some(t) if self.ttft_samples >= WARMUP => ratio(
                t,
                self.ttft
                    .predict(&ttft_features(s.uncached_input, s.cached_input)),
            ),
            _ => None,
        };
        match (total, ttft) {
            (Some(a), Some(b)) => Some(a.max(b)),
            (a, b) => a.or(b),
        }
    }

    /// Judges a successful attempt that ended at `now` against the baseline and the peers'
    /// recent ratio (`peer_log_ratio`, see [`peer_log_ratio`]), then learns from it.
    pub fn observe(&mut self, s: &LatencySample, peer_log_ratio: f64, now: Instant) -> Judgement {
        let log_ratio = self.log_ratio(s);
        let slow = log_ratio.is_some_and(|r| r - peer_log_ratio.max(0.0) > SLOW_RATIO.ln());
        if let Some(r) = log_ratio {
            let a = 1.0 - 0.5f64.powf(1.0 / RECENT_SAMPLES);
            self.recent += a * (r - self.recent);
            self.judged += 1;
        }
        let w = if log_ratio.is_some_and(|r| r > ADOPT_RATIO.ln()) {
            SLOW_WEIGHT
        } else {
            1.0
        };
        let elapsed = self
            .last
            .map_or(Duration::ZERO, |t| now.saturating_since(t));
        let keep = (-elapsed.as_secs_f64() / MEMORY.as_secs_f64()).exp();
        self.last = Some(self.last.map_or(now, |t| t.max(now)));
        self.total
            .add(&total_features(s), s.total.as_secs_f64(), w, keep);
        self.samples += 1;
        if let Some(t) = s.first_token {
            self.ttft.add(
                &ttft_features(s.uncached_input, s.cached_input),
                t.as_secs_f64(),
                w,
                keep,
            );
            self.ttft_samples += 1;
        }
        Judgement { log_ratio, slow }
    }

    /// How long a stream with `input_tokens` of input may wait for its first token here:
    /// [`FIRST_TOKEN_MULTIPLE`] × the predicted first-token time with all input uncached, at
    /// least [`FIRST_TOKEN_FLOOR`]; `None` until the first-token model is warm.
    pub fn first_token_timeout(&mut self, input_tokens: u64) -> Option<Duration> {
        if self.ttft_samples < WARMUP {
            return None;
        }
        let p = self.ttft.predict(&ttft_features(input_tokens, 0))?;
        if !p.is_finite() || p <= 0.0 {
            return None;
        }
        Some(Duration::from_secs_f64((FIRST_TOKEN_MULTIPLE * p).min(3600.0)).max(FIRST_TOKEN_FLOOR))
    }
}

/// The peer reference of a provider: the median of its peers' recent log-ratios
/// ([`LatencyModel::recent_log_ratio`]; `None` = no reference yet), 0 when none has one.
pub fn peer_log_ratio(peers: impl IntoIterator<Item = Option<f64>>) -> f64 {
    let mut v: Vec<f64> = peers.into_iter().flatten().collect();
    if v.is_empty() {
        return 0.0;
    }
    v.sort_by(f64::total_cmp);
    let n = v.len();
    if n % 2 == 1 {
        v[n / 2]
    } else {
        (v[n / 2 - 1] + v[n / 2]) / 2.0
    }
}

/// How many errors `slow` slow successes are worth in a controller window with target error
/// rate `target_error_rate` (see the module docs), rounded to whole errors.
pub fn slow_as_errors(slow: u64, target_error_rate: f64) -> u64 {
    (slow as f64 * target_error_rate / SLOW_TARGET).round() as u64
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A provider answering in `factor × (0.8 s + 30 ms/1k uncached + 3 ms/1k cached + 20 ms
    /// per output token)`, first token at the prefill share.
    fn sample(factor: f64, uncached: u64, cached: u64, output: u64, jitter: f64) -> LatencySample {
        let prefill = 0.8 + 0.03 * uncached as f64 / 1000.0 + 0.003 * cached as f64 / 1000.0;
        let total = (prefill + 0.02 * output as f64) * factor * jitter;
        LatencySample {
            total: Duration::from_secs_f64(total),
            first_token: Some(Duration::from_secs_f64(prefill * factor * jitter)),
            uncached_input: uncached,
            cached_input: cached,
            output,
        }
    }

    /// Deterministic pseudo-random mix of prompt shapes and a ±20 % jitter.
    fn mix(i: u64) -> (u64, u64, u64, f64) {
        let h = i.wrapping_mul(0x9E37_79B9_7F4A_7C15) >> 33;
        let uncached = [1_500, 3_000, 15_000, 40_000][(h % 4) as usize];
        let cached = [0, 15_000, 30_000][((h >> 4) % 3) as usize];
        let output = [100, 400, 800][((h >> 8) % 3) as usize];
        let jitter = 0.8 + 0.4 * ((h >> 12) % 1000) as f64 / 1000.0;
        (uncached, cached, output, jitter)
    }

    /// Sample `i` ends at `i` × 1 s.
    fn at(i: u64) -> Instant {
        Instant::from_origin(Duration::from_secs(i))
    }

    fn trained() -> LatencyModel {
        let mut m = LatencyModel::new();
        for i in 0..400 {
            let (u, c, o, j) = mix(i);
            m.observe(&sample(1.0, u, c, o, j), 0.0, at(i));
        }
        m
    }

    #[test]
    fn long_prompts_and_long_answers_are_not_slow() {
        let mut m = trained();
        let mut slow = 0;
        for i in 400..1400 {
            let (u, c, o, j) = mix(i);
            slow += u64::from(m.observe(&sample(1.0, u, c, o, j), 0.0, at(i)).slow);
        }
        assert_eq!(slow, 0);
        // A 100 k-token cold prompt with a long answer, never seen at that size.
        let r = m.log_ratio(&sample(1.0, 100_000, 0, 2_000, 1.0)).unwrap();
        assert!(r.abs() < 0.2, "log ratio {r}");
    }

    #[test]
    fn a_provider_three_times_slower_is_slow_on_every_answer() {
        let mut m = trained();
        let mut slow = 0;
        for i in 400..600 {
            let (u, c, o, j) = mix(i);
            slow += u64::from(m.observe(&sample(3.0, u, c, o, j), 0.0, at(i)).slow);
        }
        assert_eq!(
            slow, 200,
            "the slowdown must not become the baseline within minutes"
        );
        // And back to normal: nothing is slow, and the recent ratio returns towards 0.
        let mut slow = 0;
        for i in 600..800 {
            let (u, c, o, j) = mix(i);
            slow += u64::from(m.observe(&sample(1.0, u, c, o, j), 0.0, at(i)).slow);
        }
        assert_eq!(slow, 0);
        assert!(m.recent_log_ratio().unwrap().abs() < 0.1);
    }

    #[test]
    fn a_slow_creep_does_not_become_the_baseline() {
        // One answer per second; from t = 400 s the provider slows by 2 % per minute.
        let mut m = trained();
        let mut first_slow = None;
        for i in 400..(400 + 90 * 60) {
            let factor = 1.0 + 0.02 * (i - 400) as f64 / 60.0;
            let (u, c, o, j) = mix(i);
            if m.observe(&sample(factor, u, c, o, j), 0.0, at(i)).slow && first_slow.is_none() {
                first_slow = Some(factor);
            }
        }
        // Slow answers start once the provider is about twice as slow as it was, not later.
        let f = first_slow.expect("a 2.8x slowdown must be seen");
        assert!((1.8..2.5).contains(&f), "first slow at factor {f}");
    }

    #[test]
    fn a_slowdown_shared_by_the_peers_is_not_slowness() {
        let mut m = trained();
        let peers_ln = 3.0f64.ln();
        for i in 400..500 {
            let (u, c, o, j) = mix(i);
            assert!(!m.observe(&sample(3.0, u, c, o, j), peers_ln, at(i)).slow);
        }
    }

    #[test]
    fn first_token_deadline_follows_the_baseline_and_the_input() {
        assert_eq!(
            LatencyModel::new().first_token_timeout(1_000),
            None,
            "cold: no adaptive deadline"
        );
        let mut m = trained();
        assert!(m.warm());
        let short = m.first_token_timeout(1_000).unwrap();
        let long = m.first_token_timeout(100_000).unwrap();
        // 4 × (0.8 + 0.03) s ≈ 3.3 s; 4 × (0.8 + 3.0) s ≈ 15.2 s.
        assert!((3.0..3.7).contains(&short.as_secs_f64()), "{short:?}");
        assert!((14.0..16.5).contains(&long.as_secs_f64()), "{long:?}");
    }

    #[test]
    fn peers_median_and_soft_error_weight() {
        let warm = trained();
        let cold = LatencyModel::new();
        assert_eq!(cold.recent_log_ratio(), None);
        assert!(warm.recent_log_ratio().unwrap().abs() < 0.1);
        assert_eq!(peer_log_ratio([None, Some(0.1), Some(0.7), Some(0.5)]), 0.5);
        assert!(
            (peer_log_ratio([Some(0.1), Some(0.7), Some(0.2), None, Some(0.3)]) - 0.25).abs()
                < 1e-12
        );
        assert_eq!(peer_log_ratio([None, None]), 0.0);
        // 100 % slow at the default 0.5 % target: 25 errors per 100 successes.
        assert_eq!(slow_as_errors(100, 0.005), 25);
        assert_eq!(slow_as_errors(1, 0.005), 0);
    }
}
