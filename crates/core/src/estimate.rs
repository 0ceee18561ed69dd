//! Request estimation arithmetic (DESIGN §3 step 2, §4.7): image tokens by the vendors'
//! published formulas, per-message and per-tool overheads, worst-case cost, and a bounded
//! per-route correction learned from what providers actually report.
//!
//! The router counts text with a tokenizer and walks the request; everything here is the
//! tokenizer-free part, pure and deterministic, so the simulator and property tests can use it.
//!
//! **Images, OpenAI** (GPT-4o / GPT-4.1 / o-series "tile" models; OpenAI vision guide,
//! "Calculating costs", and the OpenAI cookbook's token-counting notes): `detail: low` costs a
//! flat 85 tokens. `high` (and `auto`, counted as `high` because the estimate is an upper bound)
//! first scales the image down to fit in a 2048 × 2048 square, then down again so the shortest
//! side is at most 768 px, and costs 170 tokens per 512-px tile plus 85. A 1024 × 1024 image →
//! 768 × 768 → 2 × 2 tiles → 765 tokens. Images are only ever scaled *down*. An image whose size is
//! unknown (a remote URL the router does not fetch) is charged the largest possible tile
//! count, 768 × 2048 → 2 × 4 tiles → 1445 tokens. Models billed by 32-px patches (the GPT-4.1 mini
//! family) or with other multipliers (GPT-4o mini) differ; the calibration absorbs that.
//!
//! **Images, Anthropic** (Claude vision guide, "Calculate image costs"): tokens ≈ width × height
//! / 750 after the API's resize, which scales an image down (aspect kept) until its long edge is
//! at most 1568 px and it is at most about 1.15 megapixels, i.e. about 1600 tokens. Here the
//! long edge is scaled first and the result capped at [`ANTHROPIC_IMAGE_MAX_TOKENS`]; an
//! image of unknown size costs the cap.
//!
//! **Overheads.** OpenAI's chat format adds 3 tokens per message (`<|start|>role<|message|>…
//! <|end|>`), 1 per `name`, and 3 to prime the reply (OpenAI cookbook, "How to count tokens
//! with tiktoken"). Tool definitions are counted by the router as their serialised JSON plus a
//! per-tool constant; the JSON is somewhat longer than the TypeScript-like rendering OpenAI
//! feeds the model, which keeps the estimate on the high side. Anthropic publishes the size of
//! the tool-use system prompt it adds when `tools` is non-empty (Claude tool-use docs, "Pricing":
//! 346 tokens for `auto`/`none`, 313 for `any`/`tool` on current models); its per-message framing
//! is not published, so a small constant is assumed and left to the calibration.
//!
//! **Cost** ([`worst_case_spend_micro_usd`]): all input at the uncached input price plus the
//! whole output allowance at the output price, summed exactly in integers and rounded up once
//! to whole micro-USD (the same rounding as the router's usage accounting), so a reservation
//! never under-reserves because of rounding.
//!
//! **Calibration** ([`Calibration`]): tokenizers differ by vendor (Claude's is not public; the
//! router uses OpenAI's `o200k_base` for every model), and overhead constants are guesses for
//! some dialects. Each route keeps an exponentially weighted moving average of
//! `actual input / raw estimate` and multiplies future raw estimates by it. Each sample and the
//! average are clamped to `[min, max]` (default 0.5..2.0), so one odd report (a provider that
//! counts a cached prefix differently, a bug, a hostile client) cannot move estimates by more
//! than the bound, and a stable ratio `r` inside the bound is approached geometrically: after
//! `n` settles the gap is `(1 − α)^n` of the initial one. Alternatives rejected: an unbounded
//! ratio (one bad report could make every later estimate zero or huge); a per-request
//! correction by prompt length buckets (more state, little gain for one route's traffic mix);
//! integer fixed-point EWMA (truncation leaves a bias of up to `1/α` units near the target).

/// OpenAI `detail: low` image cost, and the base cost added to every high-detail image.
pub const OPENAI_IMAGE_BASE_TOKENS: u64 = 85;
/// OpenAI cost per 512 × 512 tile of a high-detail image.
pub const OPENAI_IMAGE_TILE_TOKENS: u64 = 170;
/// OpenAI high-detail cost of an image whose size is unknown: 8 tiles (768 × 2048) + 85.
pub const OPENAI_IMAGE_MAX_TOKENS: u64 = OPENAI_IMAGE_BASE_TOKENS + 8 * OPENAI_IMAGE_TILE_TOKENS;
/// Anthropic's cap on one image after resizing (~1.15 MP / 750 px per token).
pub const ANTHROPIC_IMAGE_MAX_TOKENS: u64 = 1600;
/// Anthropic resizes images whose long edge exceeds this many pixels.
pub const ANTHROPIC_IMAGE_MAX_EDGE: u32 = 1568;
/// Anthropic's pixels per token.
pub const ANTHROPIC_PIXELS_PER_TOKEN: u64 = 750;

/// OpenAI `detail` of an image part.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum ImageDetail {
    /// 512 × 512 preview, flat cost.
    Low,
    /// Tiled, full cost.
    High,
    /// The model decides; estimated as [`ImageDetail::High`] (upper bound).
    #[default]
    Auto,
}

impl ImageDetail {
    /// Parses the `detail` member (`"low"`, `"high"`, `"auto"`); anything else is `Auto`.
    pub fn parse(text: &str) -> Self {
        match text {
            "low" => ImageDetail::Low,
            "high" => ImageDetail::High,
            _ => ImageDetail::Auto,
        }
    }
}

/// Input tokens of one image in an OpenAI request.
///
/// `size` is `(width, height)` in pixels when known (a data URL's header); `None` charges the
/// maximum for the detail level. A zero dimension counts as one pixel.
pub fn openai_image_tokens(size: Option<(u32, u32)>, detail: ImageDetail) -> u64 {
    if detail == ImageDetail::Low {
        return OPENAI_IMAGE_BASE_TOKENS;
    }
    let Some((w, h)) = size else {
        return OPENAI_IMAGE_MAX_TOKENS;
    };
    let (mut w, mut h) = (f64::from(w.max(1)), f64::from(h.max(1)));
    let longest = w.max(h);
    if longest > 2048.0 {
        let scale = 2048.0 / longest;
        w *= scale;
        h *= scale;
    }
    let shortest = w.min(h);
    if shortest > 768.0 {
        let scale = 768.0 / shortest;
        w *= scale;
        h *= scale;
    }
    // Tiles are counted on the scaled size; the float product of a scale and an integer can
    // land a hair above an exact multiple of 512 (e.g. 1536.0000001), so round to the pixel first.
    let tiles_w = (w.round() / 512.0).ceil() as u64;
    let tiles_h = (h.round() / 512.0).ceil() as u64;
    OPENAI_IMAGE_BASE_TOKENS + OPENAI_IMAGE_TILE_TOKENS * tiles_w.max(1) * tiles_h.max(1)
}

/// Input tokens of one image in an Anthropic request: `⌈w × h / 750⌉` after scaling the long
/// edge down to [`ANTHROPIC_IMAGE_MAX_EDGE`], capped at [`ANTHROPIC_IMAGE_MAX_TOKENS`].
/// `None` (remote URL, file reference) charges the cap.
pub fn anthropic_image_tokens(size: Option<(u32, u32)>) -> u64 {
    let Some((w, h)) = size else {
        return ANTHROPIC_IMAGE_MAX_TOKENS;
    };
    let (mut w, mut h) = (u64::from(w.max(1)), u64::from(h.max(1)));
    let longest = w.max(h);
    let edge = u64::from(ANTHROPIC_IMAGE_MAX_EDGE);
    if longest > edge {
        // Integer scaling, rounding the short side up so the estimate stays an upper bound.
        if w >= h {
            h = (h * edge).div_ceil(w);
            w = edge;
        } else {
            w = (w * edge).div_ceil(h);
            h = edge;
        }
    }
    (w * h)
        .div_ceil(ANTHROPIC_PIXELS_PER_TOKEN)
        .min(ANTHROPIC_IMAGE_MAX_TOKENS)
}

/// Prompt-format overheads of one client dialect, in tokens. All are added to the tokenizer's
/// count of the request's text before the calibration ratio applies.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Overheads {
    /// Per message (role markers and separators).
    pub per_message: u64,
    /// Per message that carries a `name`.
    pub per_name: u64,
    /// Once per request (reply priming).
    pub per_request: u64,
    /// Per tool definition (framing around its serialised JSON).
    pub per_tool: u64,
    /// Once when the request defines any tools (the vendor's tool-use preamble).
    pub tools_preamble: u64,
    /// Per tool call or tool result block inside messages (ids and framing).
    pub per_tool_call: u64,
}

/// OpenAI chat completions: 3 per message, 1 per name, 3 to prime the reply (OpenAI cookbook);
/// tools: the cookbook's function-counting notes give about 7 tokens to open each function
/// and 12 to close the list; rounded up to 10 per tool and 12 once here.
pub const OPENAI_CHAT_OVERHEADS: Overheads = Overheads {
    per_message: 3,
    per_name: 1,
    per_request: 3,
    per_tool: 10,
    tools_preamble: 12,
    per_tool_call: 8,
};

/// Anthropic Messages: the 346-token tool-use system prompt (Claude tool-use docs, largest
/// published figure for current models) when tools are present; per-message framing is not
/// published, so 4 per message and 3 per request are assumptions left to the calibration.
pub const ANTHROPIC_MESSAGES_OVERHEADS: Overheads = Overheads {
    per_message: 4,
    per_name: 0,
    per_request: 3,
    per_tool: 10,
    tools_preamble: 346,
    per_tool_call: 8,
};

/// Embeddings: no chat framing.
pub const EMBEDDINGS_OVERHEADS: Overheads = Overheads {
    per_message: 0,
    per_name: 0,
    per_request: 0,
    per_tool: 0,
    tools_preamble: 0,
    per_tool_call: 0,
};

/// Prices used for a worst-case reservation, in micro-USD per million tokens
/// (e.g. $3.00 / MTok = 3_000_000).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct TokenPrices {
    /// Uncached input.
    pub input: u64,
    /// Output.
    pub output: u64,
}

/// Worst-case spend in micro-USD: `⌈(input × price_in + output × price_out) / 10^6⌉`, computed
/// exactly in 128-bit integers, saturating at `u64::MAX`. Cache discounts are ignored (every
/// input token at the uncached price) because a reservation must cover the worst case.
pub fn worst_case_spend_micro_usd(
    input_tokens: u64,
    output_tokens: u64,
    prices: TokenPrices,
) -> u64 {
    let total = u128::from(input_tokens) * u128::from(prices.input)
        + u128::from(output_tokens) * u128::from(prices.output);
    u64::try_from(total.div_ceil(1_000_000)).unwrap_or(u64::MAX)
}

/// Default lower bound of the calibration ratio.
pub const CALIBRATION_MIN: f64 = 0.5;
/// Default upper bound of the calibration ratio.
pub const CALIBRATION_MAX: f64 = 2.0;
/// Default EWMA weight of a new sample: 0.1 forgets half of the past in about 7 settles and
/// keeps one outlier's effect to 10 % of its (already clamped) deviation.
pub const CALIBRATION_ALPHA: f64 = 0.1;

/// A bounded, per-route correction of input-token estimates: an EWMA of
/// `actual / raw estimate`, clamped to `[min, max]` (see the module docs).
///
/// Deterministic: the state after a sequence of [`Calibration::settle`] calls depends only on
/// that sequence.
#[derive(Debug, Clone, PartialEq)]
pub struct Calibration {
    ratio: f64,
    alpha: f64,
    min: f64,
    max: f64,
    samples: u64,
    last_relative_error: Option<f64>,
}

impl Default for Calibration {
    fn default() -> Self {
        Calibration::new(CALIBRATION_ALPHA, CALIBRATION_MIN, CALIBRATION_MAX)
    }
}

impl Calibration {
    /// A calibration starting at ratio 1 (or the nearest bound), with EWMA weight `alpha`
    /// (clamped to `(0, 1]`; NaN becomes the default) and bounds `[min, max]` (swapped if
    /// given in the wrong order; non-finite or non-positive bounds fall back to the defaults).
    pub fn new(alpha: f64, min: f64, max: f64) -> Self {
        let alpha = if alpha.is_nan() {
            CALIBRATION_ALPHA
        } else {
            alpha.clamp(f64::MIN_POSITIVE, 1.0)
        };
        let valid = |b: f64| b.is_finite() && b > 0.0;
        let (mut min, mut max) = if valid(min) && valid(max) {
            (min, max)
        } else {
            (CALIBRATION_MIN, CALIBRATION_MAX)
        };
        if min > max {
            std::mem::swap(&mut min, &mut max);
        }
        Calibration {
            ratio: 1.0_f64.clamp(min, max),
            alpha,
            min,
            max,
            samples: 0,
            last_relative_error: None,
        }
    }

    /// The current correction factor, always within `[min, max]`.
    pub fn ratio(&self) -> f64 {
        self.ratio
    }

    /// The bounds `(min, max)`.
    pub fn bounds(&self) -> (f64, f64) {
        (self.min, self.max)
    }

    /// Settles that contributed a sample.
    pub fn samples(&self) -> u64 {
        self.samples
    }

    /// `(estimated − actual) / actual` of the last settle with a non-zero actual count: positive
    /// when the estimate was high. For the estimation-error metric.
    pub fn last_relative_error(&self) -> Option<f64> {
        self.last_relative_error
    }

    /// Corrected estimate of a raw (tokenizer + overheads) input count: `⌈raw × ratio⌉`.
    pub fn apply(&self, raw_input_tokens: u64) -> u64 {
        corrected(raw_input_tokens, self.ratio)
    }

    /// Records the outcome of one request: `raw` is the uncorrected estimate, `estimated` the
    /// corrected one that was reserved, `actual` the input the provider reported (all input:
    /// uncached + cache read + cache write). Returns the relative error of `estimated`
    /// (`None` when `actual` is 0). A zero `raw` or `actual` carries no ratio information and
    /// leaves the ratio unchanged.
    pub fn settle(&mut self, raw: u64, estimated: u64, actual: u64) -> Option<f64> {
        if actual == 0 {
            return None;
        }
        let error = (estimated as f64 - actual as f64) / actual as f64;
        self.last_relative_error = Some(error);
        if raw > 0 {
            let sample = (actual as f64 / raw as f64).clamp(self.min, self.max);
            let next = self.ratio + self.alpha * (sample - self.ratio);
            self.ratio = next.clamp(self.min, self.max);
            self.samples += 1;
        }
        Some(error)
    }
}

/// `⌈raw × ratio⌉`, saturating; a non-finite or negative ratio leaves `raw` unchanged.
pub fn corrected(raw: u64, ratio: f64) -> u64 {
    if !ratio.is_finite() || ratio < 0.0 {
        return raw;
    }
    let value = (raw as f64 * ratio).ceil();
    if value >= u64::MAX as f64 {
        u64::MAX
    } else {
        value as u64
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn openai_image_1024_square_high_is_765() {
        assert_eq!(
            openai_image_tokens(Some((1024, 1024)), ImageDetail::High),
            765
        );
    }

    #[test]
    fn openai_image_2048x4096_high_is_1105() {
        // OpenAI's own worked example: → 1024 × 2048 → 768 × 1536 → 2 × 3 tiles.
        assert_eq!(
            openai_image_tokens(Some((2048, 4096)), ImageDetail::High),
            1105
        );
    }

    #[test]
    fn openai_image_low_detail_is_flat_85() {
        assert_eq!(
            openai_image_tokens(Some((4000, 3000)), ImageDetail::Low),
            85
        );
        assert_eq!(openai_image_tokens(None, ImageDetail::Low), 85);
    }

    #[test]
    fn openai_image_small_is_not_upscaled() {
        // 512 × 512 stays one tile.
        assert_eq!(
            openai_image_tokens(Some((512, 512)), ImageDetail::Auto),
            255
        );
        assert_eq!(openai_image_tokens(Some((0, 0)), ImageDetail::High), 255);
    }

    #[test]
    fn openai_image_unknown_size_is_maximum() {
        assert_eq!(openai_image_tokens(None, ImageDetail::High), 1445);
        assert_eq!(openai_image_tokens(None, ImageDetail::Auto), 1445);
        // No known size costs more than the unknown-size charge.
        for (w, h) in [
            (768, 2048),
            (100, 20000),
            (20000, 100),
            (5000, 5000),
            (1, 1),
        ] {
            assert!(openai_image_tokens(Some((w, h)), ImageDetail::High) <= 1445);
        }
    }

    #[test]
    fn anthropic_image_follows_area_over_750() {
        // Anthropic's table: 200 × 200 ≈ 54, 1000 × 1000 ≈ 1334.
        assert_eq!(anthropic_image_tokens(Some((200, 200))), 54);
        assert_eq!(anthropic_image_tokens(Some((1000, 1000))), 1334);
        assert_eq!(anthropic_image_tokens(Some((1092, 1092))), 1590);
    }

    #[test]
    fn anthropic_image_large_is_capped() {
        assert_eq!(anthropic_image_tokens(Some((4000, 3000))), 1600);
        assert_eq!(anthropic_image_tokens(None), 1600);
        // Long edge 3136 → 1568, short 100 → 50: 1568 × 50 / 750 → 105.
        assert_eq!(anthropic_image_tokens(Some((3136, 100))), 105);
    }

    #[test]
    fn worst_case_spend_sums_exactly_and_rounds_up_once() {
        let prices = TokenPrices {
            input: 3_000_000,
            output: 15_000_000,
        };
        // 1000 × 3 + 500 × 15 = 10_500 micro-USD exactly.
        assert_eq!(worst_case_spend_micro_usd(1000, 500, prices), 10_500);
        // 1 × 0.15 + 1 × 0.6 = 0.75 → 1.
        let cheap = TokenPrices {
            input: 150_000,
            output: 600_000,
        };
        assert_eq!(worst_case_spend_micro_usd(1, 1, cheap), 1);
        assert_eq!(worst_case_spend_micro_usd(0, 0, cheap), 0);
        assert_eq!(
            worst_case_spend_micro_usd(u64::MAX, u64::MAX, prices),
            u64::MAX
        );
    }

    #[test]
    fn calibration_starts_at_one_and_applies_ceiling() {
        let c = Calibration::default();
        assert_eq!(c.ratio(), 1.0);
        assert_eq!(c.apply(1000), 1000);
        assert_eq!(corrected(1000, 1.2345), 1235);
    }

    #[test]
    fn calibration_outlier_is_bounded() {
        let mut c = Calibration::default();
        c.settle(100, 100, 1_000_000);
        // The sample is clamped to 2.0, then weighted by 0.1: 1 + 0.1 × (2 − 1).
        assert!((c.ratio() - 1.1).abs() < 1e-12);
        for _ in 0..1000 {
            c.settle(100, 100, 1_000_000);
        }
        assert!(c.ratio() <= 2.0 && 2.0 - c.ratio() < 1e-9);
    }

    #[test]
    fn calibration_zero_actual_is_ignored() {
        let mut c = Calibration::default();
        assert_eq!(c.settle(100, 100, 0), None);
        assert_eq!(c.settle(0, 0, 50), Some(-1.0));
        assert_eq!((c.ratio(), c.samples()), (1.0, 0));
    }

    #[test]
    fn calibration_relative_error_is_of_reserved_estimate() {
        let mut c = Calibration::default();
        assert_eq!(c.settle(100, 120, 100), Some(0.2));
        assert_eq!(c.last_relative_error(), Some(0.2));
    }

    #[test]
    fn calibration_bad_parameters_fall_back() {
        let c = Calibration::new(f64::NAN, 3.0, 0.25);
        assert_eq!(c.bounds(), (0.25, 3.0));
        let c = Calibration::new(0.5, f64::INFINITY, -1.0);
        assert_eq!(c.bounds(), (CALIBRATION_MIN, CALIBRATION_MAX));
        let c = Calibration::new(0.5, 1.5, 3.0);
        assert_eq!(c.ratio(), 1.5);
    }
}
