//! Request estimation with a real tokenizer (DESIGN §3 step 2): input tokens, output allowance
//! and worst-case spend of a parsed request, reserved by the quota broker before sending.
//!
//! **Tokenizer.** OpenAI's `o200k_base` (GPT-4o, GPT-4.1, o-series, GPT-5), counted exactly as
//! tiktoken encodes it. It is used for every model: Claude's tokenizer is not public and
//! Gemini's differs, so for them `o200k_base` is a documented approximation that the per-route
//! [`Calibration`] (in `switchyard-core`) corrects from the usage providers report. The
//! vocabulary is loaded once per process, lazily ([`warm_up`] forces it at start-up), and only
//! when something configured needs exact tokens.
//!
//! The counter is tiktoken's own algorithm (Sennrich et al.'s byte-pair encoding as OpenAI
//! applies it: pre-tokenise with the encoding's pattern, then in each piece repeatedly join
//! the adjacent pair with the lowest rank) over a table of the 200k tokens' ranks keyed by a
//! 64-bit fingerprint (`Fingerprint`), about 4 MiB of heap. GitHub's `bpe-openai`, used before, needs its
//! Aho-Corasick automaton and pair tables for its backtracking encoder: 17 MiB of heap even
//! with the two automata counting never reads trimmed away, which alone kept a router with token
//! limits above the 50 MiB goal (issue 16). `bpe-openai` stays the vocabulary's source (the build
//! script writes the tokens in rank order from its copy) and the reference the property tests
//! compare counts and pieces with.
//!
//! **Speed.** A 4 KB chat request must be estimated in ≤ 20 µs (issue 5). Both tiktoken-rs and
//! `bpe-openai` spend most of their time outside the BPE proper: in the pre-tokenisation regex
//! (~50 ns per piece, ~45 µs for 4 KB here) and in setting up an encoder per piece. So:
//! - ASCII text (the common case for prompts, code and JSON schemas) is split by a hand-written
//!   scanner that implements the `o200k_base` pre-tokenisation pattern for ASCII exactly (a
//!   property test checks it against the regex on random ASCII); other text goes through a
//!   `regex-automata` regex (`O200K_PATTERNS`).
//! - A piece that is itself a vocabulary entry (most English words with their leading space,
//!   every single byte) counts 1 through a hash-set lookup, which is what tiktoken does first as
//!   well; only the others are merged, and their counts are remembered per thread.
//! - Segments of ≥ [`MEMO_MIN_BYTES`] (message texts, tool definitions, schemas) are memoised
//!   by content hash ([`count_segment`]), because chat clients resend the system prompt, the
//!   tools and the whole history with every turn: in a conversation only the new turn is
//!   tokenized. The uncached path is exact and is what the memo stores.
//!
//! **What is counted.** Message text, names, tool calls (name and arguments) and results, tool
//! definitions (their serialised JSON), response-format JSON schemas, system prompts, thinking
//! blocks, images by the vendors' formulas (size read from a `data:` URL's or base64 block's
//! header with `imagesize`; remote images charged the maximum for their detail level), and the
//! dialect's framing overheads ([`OPENAI_CHAT_OVERHEADS`], [`ANTHROPIC_MESSAGES_OVERHEADS`]).
//! Content parts of unknown types are counted by their string members, except inline binary
//! payloads (`data`, `file_data`, `data:` URLs), whose token cost depends on the media and is
//! left to the calibration.
//!
//! **Output allowance**: `max_completion_tokens`, else `max_tokens`, else the route default,
//! times `n` choices (OpenAI bills every choice); Anthropic's required `max_tokens`.
//!
//! Alternatives rejected: tiktoken-rs (same counts, ~160 µs per 4 KB here and a 150 ms load:
//! its `fancy-regex` pre-tokeniser dominates, it has no hook to replace it, and its two maps of
//! owned byte strings take more memory than `bpe-openai`); `bpe-openai` itself (above); bytes / 4 (off
//! by 2× for code, JSON and non-Latin scripts, more than the bounded calibration can absorb);
//! memoising whole requests (a conversation never repeats one; its segments repeat).

use std::cell::RefCell;
use std::collections::HashMap;
use std::num::NonZeroUsize;
use std::sync::{LazyLock, Mutex};

use base64::Engine as _;
use lru::LruCache;
use rustc_hash::FxBuildHasher;
use serde_json::Value;
use switchyard_core::estimate::{
    ANTHROPIC_MESSAGES_OVERHEADS, Calibration, EMBEDDINGS_OVERHEADS, ImageDetail,
    OPENAI_CHAT_OVERHEADS, Overheads, TokenPrices, anthropic_image_tokens, corrected,
    openai_image_tokens, worst_case_spend_micro_usd,
};
use switchyard_core::quota::Demand;
use xxhash_rust::xxh3::{xxh3_64_with_seed, xxh3_128};

use crate::wire::anthropic::{self, Block, ContentBlock, MessagesRequest, ToolResultContent};
use crate::wire::openai::{ChatRequest, ContentPart, EmbeddingsRequest, KnownPart, MessageContent};
use crate::wire::usage::Pricing;

/// Output allowance used when neither the request nor the route sets one.
pub const FALLBACK_OUTPUT_TOKENS: u64 = 4096;

/// Per-route inputs of an estimate.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct EstimateParams {
    /// Output allowance when the request sets no cap (the route's default), in tokens.
    pub default_output_tokens: u64,
    /// The model's prices (only `input` and `output` are used: the worst case is uncached).
    pub pricing: Pricing,
    /// The route's calibration ratio ([`Calibration::ratio`]); 1.0 for none.
    pub ratio: f64,
}

impl Default for EstimateParams {
    fn default() -> Self {
        EstimateParams {
            default_output_tokens: FALLBACK_OUTPUT_TOKENS,
            pricing: Pricing::default(),
            ratio: 1.0,
        }
    }
}

/// A request's estimate.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct Estimate {
    /// Tokenizer count plus framing overheads, before the calibration ratio. Keep it to settle
    /// the calibration ([`RouteCalibrations::settle`]).
    pub raw_input_tokens: u64,
    /// Input tokens to reserve: `⌈raw × ratio⌉`.
    pub input_tokens: u64,
    /// Output allowance in tokens.
    pub output_tokens: u64,
    /// Worst-case spend in micro-USD: all input uncached plus the whole output allowance.
    pub spend_micro_usd: u64,
    /// Bytes of text counted by the upper bound (one token per byte) instead of the
    /// tokenizer, because the request's exact budget ([`EXACT_BUDGET_BYTES`]) ran out; 0 for
    /// an exact estimate. A bounded estimate does not settle the route's calibration.
    pub bounded_bytes: u64,
}

impl Estimate {
    fn new(
        raw_input_tokens: u64,
        output_tokens: u64,
        params: &EstimateParams,
        counter: &Counter,
    ) -> Self {
        let input_tokens = corrected(raw_input_tokens, params.ratio);
        let prices = TokenPrices {
            input: params.pricing.input,
            output: params.pricing.output,
        };
        Estimate {
            raw_input_tokens,
            input_tokens,
            output_tokens,
            spend_micro_usd: worst_case_spend_micro_usd(input_tokens, output_tokens, prices),
            bounded_bytes: counter.bounded_bytes,
        }
    }

    /// The quota demand of one request: no input assumed cached (worst case).
    pub fn demand(&self) -> Demand {
        Demand {
            requests: 1,
            input_tokens: self.input_tokens,
            cached_input_tokens: 0,
            output_tokens: self.output_tokens,
            spend_micro_usd: self.spend_micro_usd,
        }
    }
}

/// Estimate of an OpenAI chat completions request.
pub fn estimate_openai_chat(req: &ChatRequest, params: &EstimateParams) -> Estimate {
    let mut c = Counter::new();
    let raw = openai_chat_input(req, &mut c);
    let output = openai_output_allowance(req, params.default_output_tokens);
    Estimate::new(raw, output, params, &c)
}

/// Estimate of an Anthropic Messages request.
pub fn estimate_anthropic_messages(req: &MessagesRequest, params: &EstimateParams) -> Estimate {
    let mut c = Counter::new();
    let raw = anthropic_messages_input(req, &mut c);
    Estimate::new(raw, req.max_tokens, params, &c)
}

/// Estimate of an OpenAI embeddings request (no output).
pub fn estimate_openai_embeddings(req: &EmbeddingsRequest, params: &EstimateParams) -> Estimate {
    let mut c = Counter::new();
    let raw = openai_embeddings_input(req, &mut c);
    Estimate::new(raw, 0, params, &c)
}

/// Output allowance of an OpenAI request: (`max_completion_tokens`, else `max_tokens`, else
/// `default`) × `n` (at least 1), saturating.
pub fn openai_output_allowance(req: &ChatRequest, default: u64) -> u64 {
    let per_choice = req.output_cap().unwrap_or(default);
    per_choice.saturating_mul(u64::from(req.n.unwrap_or(1).max(1)))
}

/// Raw input tokens (before calibration) of an OpenAI chat request, within one request's
/// exact budget ([`EXACT_BUDGET_BYTES`]).
pub fn openai_chat_input_tokens(req: &ChatRequest) -> u64 {
    openai_chat_input(req, &mut Counter::new())
}

fn openai_chat_input(req: &ChatRequest, c: &mut Counter) -> u64 {
    let o: Overheads = OPENAI_CHAT_OVERHEADS;
    let mut total = o.per_request;
    for m in &req.messages {
        // The role is one token in o200k_base for every role name.
        total += o.per_message + 1;
        if let Some(name) = &m.name {
            total += o.per_name + c.text(name);
        }
        match &m.content {
            Some(MessageContent::Text(text)) => total += c.segment(text),
            Some(MessageContent::Parts(parts)) => {
                for part in parts {
                    total += match part {
                        ContentPart::Known(KnownPart::Text { text, .. }) => c.segment(text),
                        ContentPart::Known(KnownPart::ImageUrl { image_url, .. }) => {
                            let detail = image_url
                                .extra
                                .get("detail")
                                .and_then(Value::as_str)
                                .map_or(ImageDetail::Auto, ImageDetail::parse);
                            openai_image_tokens(data_url_image_size(&image_url.url), detail)
                        }
                        ContentPart::Other(value) => c.json_strings(value),
                    };
                }
            }
            None => {}
        }
        for call in m.tool_calls.iter().flatten() {
            total +=
                o.per_tool_call + c.text(&call.function.name) + c.segment(&call.function.arguments);
        }
        if let Some(Value::String(refusal)) = m.extra.get("refusal") {
            total += c.text(refusal);
        }
    }
    if let Some(tools) = req.tools.as_ref().filter(|t| !t.is_empty()) {
        total += o.tools_preamble;
        for tool in tools {
            total += o.per_tool + c.serialized(tool);
        }
    }
    if let Some(format) = req.extra.get("response_format") {
        // `{"type":"json_schema","json_schema":{name, schema, strict}}`: the schema is shown to
        // the model; `{"type":"json_object"}` / `"text"` cost next to nothing.
        if let Some(schema) = format.get("json_schema") {
            total += o.per_tool + c.serialized(schema);
        }
    }
    total
}

/// Raw input tokens (before calibration) of an Anthropic Messages request, within one
/// request's exact budget ([`EXACT_BUDGET_BYTES`]).
pub fn anthropic_messages_input_tokens(req: &MessagesRequest) -> u64 {
    anthropic_messages_input(req, &mut Counter::new())
}

fn anthropic_messages_input(req: &MessagesRequest, c: &mut Counter) -> u64 {
    let o: Overheads = ANTHROPIC_MESSAGES_OVERHEADS;
    let mut total = o.per_request;
    match &req.system {
        Some(anthropic::System::Text(text)) => total += c.segment(text),
        Some(anthropic::System::Blocks(blocks)) => {
            total += blocks
                .iter()
                .map(|b| anthropic_block_tokens(c, b))
                .sum::<u64>();
        }
        None => {}
    }
    for m in &req.messages {
        total += o.per_message;
        total += match &m.content {
            anthropic::MessageContent::Text(text) => c.segment(text),
            anthropic::MessageContent::Blocks(blocks) => blocks
                .iter()
                .map(|b| anthropic_block_tokens(c, b))
                .sum::<u64>(),
        };
    }
    if let Some(tools) = req.tools.as_ref().filter(|t| !t.is_empty()) {
        total += o.tools_preamble;
        for tool in tools {
            total += o.per_tool + c.serialized(tool);
        }
    }
    // Structured outputs (`output_format: {type: json_schema, schema}`) show the schema too.
    if let Some(format) = req.extra.get("output_format") {
        total += o.per_tool + c.serialized(format);
    }
    total
}

fn anthropic_block_tokens(c: &mut Counter, block: &ContentBlock) -> u64 {
    let o = ANTHROPIC_MESSAGES_OVERHEADS;
    match block {
        ContentBlock::Known(Block::Text { text, .. }) => c.segment(text),
        ContentBlock::Known(Block::Image { source, .. }) => {
            anthropic_image_tokens(anthropic_image_size(source))
        }
        ContentBlock::Known(Block::ToolUse { name, input, .. }) => {
            o.per_tool_call + c.text(name) + c.serialized(input)
        }
        ContentBlock::Known(Block::ToolResult { content, .. }) => {
            o.per_tool_call
                + match content {
                    Some(ToolResultContent::Text(text)) => c.segment(text),
                    Some(ToolResultContent::Blocks(blocks)) => blocks
                        .iter()
                        .map(|b| anthropic_block_tokens(c, b))
                        .sum::<u64>(),
                    None => 0,
                }
        }
        ContentBlock::Known(Block::Thinking { thinking, .. }) => c.segment(thinking),
        ContentBlock::Other(value) => c.json_strings(value),
    }
}

/// Raw input tokens of an OpenAI embeddings request: `input` as a string, a list of strings,
/// a token list (its length) or a list of token lists.
pub fn openai_embeddings_input_tokens(req: &EmbeddingsRequest) -> u64 {
    openai_embeddings_input(req, &mut Counter::new())
}

fn openai_embeddings_input(req: &EmbeddingsRequest, c: &mut Counter) -> u64 {
    let per_item = EMBEDDINGS_OVERHEADS.per_message;
    match &req.input {
        Value::String(text) => c.segment(text),
        Value::Array(items) => items
            .iter()
            .map(|item| {
                per_item
                    + match item {
                        Value::String(text) => c.segment(text),
                        Value::Array(ids) => ids.len() as u64,
                        Value::Number(_) => 1,
                        other => c.json_strings(other),
                    }
            })
            .sum(),
        other => c.json_strings(other),
    }
}

/// Pixel size of a `data:<type>;base64,<payload>` image, from its header; `None` for remote
/// URLs, other encodings and undecodable data.
pub fn data_url_image_size(url: &str) -> Option<(u32, u32)> {
    let rest = url.strip_prefix("data:")?;
    let (meta, payload) = rest.split_once(',')?;
    if !meta.ends_with(";base64") {
        return None;
    }
    base64_image_size(payload)
}

fn anthropic_image_size(source: &Value) -> Option<(u32, u32)> {
    if source.get("type").and_then(Value::as_str) != Some("base64") {
        return None;
    }
    base64_image_size(source.get("data")?.as_str()?)
}

/// Decodes growing prefixes of the base64 payload until `imagesize` finds the dimensions:
/// PNG, GIF and WebP keep them in the first few dozen bytes; a JPEG's frame header may come
/// after metadata segments, hence the larger retries.
fn base64_image_size(payload: &str) -> Option<(u32, u32)> {
    for prefix_chars in [1_024usize, 65_536, usize::MAX] {
        let end = if prefix_chars >= payload.len() {
            payload.len()
        } else {
            prefix_chars
        };
        let chunk = payload.get(..end)?;
        let engine = if end == payload.len() {
            &base64::engine::general_purpose::STANDARD
        } else {
            // A prefix is a whole number of 4-char groups, so no padding is expected.
            &base64::engine::general_purpose::STANDARD_NO_PAD
        };
        if let Ok(bytes) = engine.decode(chunk)
            && let Ok(size) = imagesize::blob_size(&bytes)
        {
            let w = u32::try_from(size.width).unwrap_or(u32::MAX);
            let h = u32::try_from(size.height).unwrap_or(u32::MAX);
            return Some((w, h));
        }
        if end == payload.len() {
            break;
        }
    }
    None
}

/// Per-route calibrations ([`Calibration`] from `switchyard-core`), shared by all requests of
/// a router: a short critical section per estimate (read the ratio) and per settle.
#[derive(Debug, Default)]
pub struct RouteCalibrations {
    routes: Mutex<HashMap<String, Calibration>>,
}

impl RouteCalibrations {
    /// An empty table (every route starts at ratio 1.0).
    pub fn new() -> Self {
        RouteCalibrations::default()
    }

    /// The route's current ratio (1.0 for a route never settled).
    pub fn ratio(&self, route: &str) -> f64 {
        let routes = self.routes.lock().unwrap_or_else(|e| e.into_inner());
        routes.get(route).map_or(1.0, Calibration::ratio)
    }

    /// Feeds the provider-reported input (all of it: uncached + cache read + cache write) back
    /// into the route's calibration; returns the relative error of the reserved estimate,
    /// `(estimated − actual) / actual`, for the estimation-error metric (`None` when the
    /// provider reported no input, and for a bounded estimate — see [`Estimate::bounded_bytes`]
    /// — which measures the budget, not the tokenizer).
    pub fn settle(&self, route: &str, estimate: &Estimate, actual_input: u64) -> Option<f64> {
        if estimate.bounded_bytes > 0 {
            return None;
        }
        let mut routes = self.routes.lock().unwrap_or_else(|e| e.into_inner());
        if let Some(c) = routes.get_mut(route) {
            return c.settle(
                estimate.raw_input_tokens,
                estimate.input_tokens,
                actual_input,
            );
        }
        let mut c = Calibration::default();
        let error = c.settle(
            estimate.raw_input_tokens,
            estimate.input_tokens,
            actual_input,
        );
        routes.insert(route.to_owned(), c);
        error
    }

    /// A copy of the route's calibration, if it has been settled at least once.
    pub fn get(&self, route: &str) -> Option<Calibration> {
        let routes = self.routes.lock().unwrap_or_else(|e| e.into_inner());
        routes.get(route).cloned()
    }
}

// ---------------------------------------------------------------------------------------------
// Segment memo

/// Segments shorter than this are counted directly: a hash and a locked lookup cost about
/// 100 ns, what counting ~25 bytes costs.
pub const MEMO_MIN_BYTES: usize = 64;
const MEMO_SHARDS: usize = 16;
/// Entries per shard; 16 × 4096 segments of ~40 bytes of bookkeeping each ≈ 3 MB.
const MEMO_SHARD_CAPACITY: usize = 4096;

/// Token counts of recently seen long segments (a message's text, a tool definition, a
/// schema), keyed by the 128-bit xxh3 of their bytes. Chat clients resend the system prompt,
/// the tools and the whole history with every turn, so in a conversation only the newest
/// messages are actually tokenized. Sharded so that concurrent requests rarely share a lock;
/// each shard is an LRU.
struct SegmentMemo {
    shards: Vec<Mutex<LruCache<u128, u64, FxBuildHasher>>>,
}

static MEMO: LazyLock<SegmentMemo> = LazyLock::new(|| SegmentMemo {
    shards: (0..MEMO_SHARDS)
        .map(|_| {
            // The key is already a hash: Fx only spreads it over the buckets.
            Mutex::new(LruCache::with_hasher(
                NonZeroUsize::new(MEMO_SHARD_CAPACITY).unwrap_or(NonZeroUsize::MIN),
                FxBuildHasher,
            ))
        })
        .collect(),
});

impl SegmentMemo {
    fn shard(&self, key: u128) -> Option<&Mutex<LruCache<u128, u64, FxBuildHasher>>> {
        self.shards.get((key as usize) % MEMO_SHARDS)
    }
}

/// [`count_tokens`] through the segment memo (long segments only); exact, with no budget.
pub fn count_segment(text: &str) -> u64 {
    if text.len() < MEMO_MIN_BYTES {
        return count_tokens(text);
    }
    let key = xxh3_128(text.as_bytes());
    if let Some(n) = MEMO.get(key) {
        return n;
    }
    let n = count_tokens(text);
    MEMO.put(key, n);
    n
}

impl SegmentMemo {
    fn get(&self, key: u128) -> Option<u64> {
        let shard = self.shard(key)?;
        shard
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .get(&key)
            .copied()
    }

    /// Stores an exact count. Counted outside the lock: two requests racing on a new segment
    /// both count it, which is cheaper than holding a shard lock for the duration of a BPE.
    fn put(&self, key: u128, n: u64) {
        if let Some(shard) = self.shard(key) {
            shard.lock().unwrap_or_else(|e| e.into_inner()).put(key, n);
        }
    }
}

// ---------------------------------------------------------------------------------------------
// Per-request budget

/// Bytes of text one request may have tokenized exactly. Only memo misses draw on it (a
/// memoised segment costs a hash). 1 MiB is about 250 k tokens of English — more than the
/// context of most models — and tokenizing it costs one core a few milliseconds (ASCII) to a
/// few tens of milliseconds (other scripts; docs/estimation.md has the measured figures).
/// Text past the budget is counted by the upper bound of **one token per byte**, which holds
/// for every byte-level BPE (each token covers at least one byte): such a request reserves
/// more than it will use, never less (fail closed), and the reconciliation with reported
/// usage returns the difference.
pub const EXACT_BUDGET_BYTES: usize = 1 << 20;

/// Counts one request's text within its exact budget ([`EXACT_BUDGET_BYTES`]): the total
/// work of an estimate is linear in the request and bounded by the budget plus a hash of the
/// rest.
#[derive(Debug)]
struct Counter {
    remaining: usize,
    bounded_bytes: u64,
}

impl Counter {
    fn new() -> Self {
        Counter::with_budget(EXACT_BUDGET_BYTES)
    }

    fn with_budget(bytes: usize) -> Self {
        Counter {
            remaining: bytes,
            bounded_bytes: 0,
        }
    }

    /// The upper bound (one token per byte) for text that does not fit the budget.
    fn bound(&mut self, text: &str) -> u64 {
        let n = text.len() as u64;
        self.bounded_bytes = self.bounded_bytes.saturating_add(n);
        n
    }

    /// A short string (names, members of unknown parts), counted without the memo.
    fn text(&mut self, text: &str) -> u64 {
        match self.remaining.checked_sub(text.len()) {
            Some(rest) => {
                self.remaining = rest;
                count_tokens(text)
            }
            None => self.bound(text),
        }
    }

    /// A segment (message text, arguments, schema) through the memo: a hit costs no budget;
    /// a miss is tokenized if it fits, and only exact counts are memoised.
    fn segment(&mut self, text: &str) -> u64 {
        if text.len() < MEMO_MIN_BYTES {
            return self.text(text);
        }
        let key = xxh3_128(text.as_bytes());
        if let Some(n) = MEMO.get(key) {
            return n;
        }
        let Some(rest) = self.remaining.checked_sub(text.len()) else {
            return self.bound(text);
        };
        self.remaining = rest;
        let n = count_tokens(text);
        MEMO.put(key, n);
        n
    }

    /// Tokens of the JSON serialisation of `value` (tool definitions, schemas, tool
    /// arguments).
    fn serialized<T: serde::Serialize>(&mut self, value: &T) -> u64 {
        serde_json::to_string(value).map_or(0, |json| self.segment(&json))
    }

    /// Tokens of the string members of an uninterpreted part, skipping inline binary
    /// payloads.
    fn json_strings(&mut self, value: &Value) -> u64 {
        match value {
            Value::String(s) if s.starts_with("data:") => 0,
            Value::String(s) => self.text(s),
            Value::Array(items) => items.iter().map(|v| self.json_strings(v)).sum(),
            Value::Object(map) => map
                .iter()
                .filter(|(k, _)| !matches!(k.as_str(), "data" | "file_data"))
                .map(|(_, v)| self.json_strings(v))
                .sum(),
            _ => 0,
        }
    }
}

/// Empties this thread's memo of piece counts (for benchmarks of the merge: afterwards every
/// piece that is not one token is merged again).
pub fn clear_piece_memo() {
    PIECE_MEMO.with(|memo| {
        if let Ok(mut memo) = memo.try_borrow_mut() {
            memo.clear();
        }
    });
}

/// Empties the segment memo (for benchmarks and tests of the uncached path).
pub fn clear_memo() {
    for shard in &MEMO.shards {
        shard.lock().unwrap_or_else(|e| e.into_inner()).clear();
    }
}

// ---------------------------------------------------------------------------------------------
// Tokenizer

struct O200k {
    /// Every vocabulary entry's rank (its token id) by its [`Fingerprint`]: a piece found here
    /// is one token, and the merge looks up the ranks of the pairs it could join. About 4 MiB
    /// (a quarter million 16-byte slots).
    ranks: HashMap<u64, u32, FingerprintBuild>,
    fingerprint: Fingerprint,
    longest_token: usize,
    pretokenizer: Pretokenizer,
}

/// A keyed 64-bit fingerprint of a byte string, with keys drawn once per process (from
/// `std`'s randomly keyed `RandomState`).
///
/// The vocabulary set and the piece memo keep fingerprints instead of the bytes. Two different
/// pieces share a fingerprint with probability near 2⁻⁶⁴ (a folded multiplication is a strong
/// mixer, not a proven universal hash), so with the 200k vocabulary entries a piece that is not
/// a token is taken for one with probability of the order of 10⁻¹⁴ (the count is then
/// low by a few tokens for that piece). The keys are secret and differ per process, so a client
/// cannot search offline for text whose fingerprints collide with single tokens.
///
/// Pieces of at most 16 bytes (98 % of the vocabulary, nearly all of ordinary text) are read as
/// two little-endian words, the first and the last 8 bytes (overlapping below 16, zero-padded
/// below 8), mixed by one keyed folded multiplication (the 128-bit product's halves XORed, the
/// mixing step of xxh3 and aHash) and XORed with the length, which tells apart the pieces
/// whose words are equal ("aaaaaaaa" and "aaaaaaaaa"); longer pieces go through seeded xxh3.
/// The fingerprint is already uniform, so the tables index by it directly
/// ([`switchyard_core::chain::FingerprintHasher`]).
#[derive(Debug, Clone, Copy)]
struct Fingerprint {
    keys: [u64; 3],
}

impl Fingerprint {
    fn random() -> Self {
        use std::hash::BuildHasher as _;
        let state = std::hash::RandomState::new();
        Fingerprint {
            keys: [0u64, 1, 2].map(|i| state.hash_one(i)),
        }
    }

    #[inline]
    fn of(self, bytes: &[u8]) -> u64 {
        let [k0, k1, k2] = self.keys;
        let n = bytes.len();
        let (head, tail) = match (bytes.first_chunk::<8>(), bytes.last_chunk::<8>()) {
            (Some(h), Some(t)) if n <= 16 => (u64::from_le_bytes(*h), u64::from_le_bytes(*t)),
            (Some(_), Some(_)) => return xxh3_64_with_seed(bytes, k2),
            // Byte by byte rather than copying into a buffer, which becomes a `memcpy` call
            // for a variable length.
            _ => (
                bytes
                    .iter()
                    .enumerate()
                    .fold(0u64, |acc, (i, &b)| acc | (u64::from(b) << (8 * i))),
                0,
            ),
        };
        let p = u128::from(head ^ k0) * u128::from(tail ^ k1);
        (p as u64) ^ ((p >> 64) as u64) ^ n as u64
    }
}

type FingerprintBuild = std::hash::BuildHasherDefault<switchyard_core::chain::FingerprintHasher>;

/// Every `o200k_base` token in rank order, each as one length byte and its bytes,
/// gzip-compressed (written by `build.rs` from `bpe-openai`'s copy; 1.04 MB of the binary,
/// read once at load).
static O200K_RANKS: &[u8] = include_bytes!(concat!(env!("OUT_DIR"), "/o200k_ranks.bin.gz"));

/// `o200k_base`'s pre-tokenisation as three patterns tried together, leftmost-first:
/// tiktoken's pattern, with its negative look-ahead `\s+(?!\S)` (which `regex-automata` cannot
/// express) written as `\s+\s` whose last character [`Pretokenizer`] gives back, and a plain
/// `\s+` for a whitespace run at the end. The same rewriting as `bpe-openai`'s, whose
/// pretokenizer the property tests compare against.
const O200K_PATTERNS: [&str; 3] = [
    concat!(
        "[^\\r\\n\\p{L}\\p{N}]?[\\p{Lu}\\p{Lt}\\p{Lm}\\p{Lo}\\p{M}]*[\\p{Ll}\\p{Lm}\\p{Lo}\\p{M}]+(?i:'s|'t|'re|'ve|'m|'ll|'d)?",
        "|[^\\r\\n\\p{L}\\p{N}]?[\\p{Lu}\\p{Lt}\\p{Lm}\\p{Lo}\\p{M}]+[\\p{Ll}\\p{Lm}\\p{Lo}\\p{M}]*(?i:'s|'t|'re|'ve|'m|'ll|'d)?",
        "|\\p{N}{1,3}",
        "| ?[^\\s\\p{L}\\p{N}]+[\\r\\n/]*",
        "|\\s*[\\r\\n]+",
        "|\\s+$",
    ),
    "\\s+\\s",
    "\\s+",
];

/// Index in [`O200K_PATTERNS`] of the pattern whose last matched character is a look-ahead.
const LOOKAHEAD_PATTERN: usize = 1;

/// The pre-tokeniser of text that is not all ASCII (ASCII goes through [`AsciiPieces`]).
struct Pretokenizer {
    regex: regex_automata::meta::Regex,
}

impl Pretokenizer {
    fn new() -> Self {
        let regex = regex_automata::meta::Regex::new_many(&O200K_PATTERNS)
            .unwrap_or_else(|e| unreachable!("o200k_base's patterns compile: {e}"));
        Pretokenizer { regex }
    }

    /// The pieces of `text`, in order, covering all of it: each is the longest anchored match
    /// at the end of the previous one (less the look-ahead character for
    /// [`LOOKAHEAD_PATTERN`]). Should nothing match (the patterns cover every character, so
    /// this is not expected), the rest is one piece: counted, never dropped.
    fn split<'a>(&'a self, text: &'a str) -> impl Iterator<Item = &'a str> + 'a {
        use regex_automata::{Anchored, Input};
        let mut at = 0;
        std::iter::from_fn(move || {
            let rest = text.get(at..).filter(|r| !r.is_empty())?;
            let end = match self.regex.find(Input::new(rest).anchored(Anchored::Yes)) {
                Some(m) if m.pattern().as_usize() == LOOKAHEAD_PATTERN => {
                    let matched = &rest[..m.end()];
                    let last = matched.chars().next_back().map_or(0, char::len_utf8);
                    // `\s+\s` spans two characters at least: one stays.
                    m.end() - last
                }
                Some(m) if m.end() > 0 => m.end(),
                _ => rest.len(),
            };
            at += end;
            Some(&rest[..end])
        })
    }
}

fn load_o200k() -> O200k {
    use std::io::Read as _;
    let mut raw = Vec::with_capacity(3 << 20);
    if let Err(e) = flate2::read::GzDecoder::new(O200K_RANKS).read_to_end(&mut raw) {
        unreachable!("build.rs wrote the embedded vocabulary: {e}");
    }
    let fingerprint = Fingerprint::random();
    let mut ranks = HashMap::with_capacity_and_hasher(200_000, FingerprintBuild::default());
    let mut longest_token = 0;
    let mut rest = raw.as_slice();
    let mut rank = 0u32;
    while let Some((&len, tail)) = rest.split_first() {
        let (token, tail) = tail.split_at(usize::from(len).min(tail.len()));
        longest_token = longest_token.max(token.len());
        ranks.insert(fingerprint.of(token), rank);
        rank += 1;
        rest = tail;
    }
    O200k {
        ranks,
        fingerprint,
        longest_token,
        pretokenizer: Pretokenizer::new(),
    }
}

static O200K: LazyLock<O200k> = LazyLock::new(|| {
    // Loaded once per process and kept to its end.
    let t = load_o200k();
    LOADED.store(true, std::sync::atomic::Ordering::Release);
    t
});

impl O200k {
    fn rank(&self, bytes: &[u8]) -> Option<u32> {
        if bytes.len() > self.longest_token {
            return None;
        }
        self.ranks.get(&self.fingerprint.of(bytes)).copied()
    }

    /// Number of tokens of one pre-tokenised piece: tiktoken's byte-pair merge. Start from
    /// single bytes (each a token of a byte-level BPE) and, while two adjacent parts together
    /// are a vocabulary entry, join the pair whose entry has the lowest rank (leftmost among
    /// equal ones); the parts left are the tokens. A binary heap of candidate pairs with lazy
    /// deletion makes this O(n log n) for a piece of n bytes instead of tiktoken's O(n²) rescan;
    /// a popped candidate is stale when its left part was joined away or now ends elsewhere
    /// (ranks are unique per byte string, so a changed pair never keeps its rank).
    fn merge_count(&self, piece: &[u8]) -> u64 {
        use std::cmp::Reverse;
        let n = piece.len();
        if n < 2 {
            return n as u64;
        }
        // Parts are named by their first byte's offset; `next[i]` is where part i ends.
        let mut next: Vec<usize> = (1..=n).collect();
        let mut prev: Vec<usize> = (0..n).map(|i| i.saturating_sub(1)).collect();
        let mut alive = vec![true; n];
        let mut pair: Vec<Option<u32>> = (0..n)
            .map(|i| piece.get(i..i + 2).and_then(|b| self.rank(b)))
            .collect();
        let mut heap: std::collections::BinaryHeap<Reverse<(u32, usize)>> = pair
            .iter()
            .enumerate()
            .filter_map(|(i, r)| r.map(|r| Reverse((r, i))))
            .collect();
        let mut tokens = n as u64;
        while let Some(Reverse((r, i))) = heap.pop() {
            if !alive[i] || pair[i] != Some(r) {
                continue;
            }
            let j = next[i];
            let k = next[j];
            alive[j] = false;
            next[i] = k;
            if k < n {
                prev[k] = i;
            }
            tokens -= 1;
            pair[i] = if k < n {
                self.rank(&piece[i..next[k]])
            } else {
                None
            };
            if let Some(r) = pair[i] {
                heap.push(Reverse((r, i)));
            }
            if i > 0 {
                let p = prev[i];
                pair[p] = self.rank(&piece[p..k]);
                if let Some(r) = pair[p] {
                    heap.push(Reverse((r, p)));
                }
            }
        }
        tokens
    }
}

/// About four bytes of UTF-8 per token (rounded up): the count used when nothing configured
/// needs exact tokens, so the vocabulary is not loaded just to label a metric.
pub fn approximate_tokens(text: &str) -> u64 {
    u64::try_from(text.len().div_ceil(4)).unwrap_or(u64::MAX)
}

/// Loads the tokenizer now instead of on the first request (call at start-up).
pub fn warm_up() {
    LazyLock::force(&O200K);
}

/// Whether the vocabulary is in memory: set once it has been loaded, by [`warm_up`] or by
/// the first exact count, and never cleared (exported as `switchyard_tokenizer_loaded`).
pub fn is_loaded() -> bool {
    LOADED.load(std::sync::atomic::Ordering::Acquire)
}

static LOADED: std::sync::atomic::AtomicBool = std::sync::atomic::AtomicBool::new(false);

/// Number of `o200k_base` tokens in `text` (ordinary text: special-token strings such as
/// `<|endoftext|>` count as the text they spell), identical to tiktoken's
/// `len(encode_ordinary(text))` as long as no pre-tokenised piece is longer than
/// [`MAX_BPE_PIECE_BYTES`] (longer ones are counted in windows, within a few tokens per
/// window). Linear in the length of `text`.
pub fn count_tokens(text: &str) -> u64 {
    let t = &*O200K;
    PIECE_MEMO.with(|memo| {
        // Only fails on re-entry, which cannot happen; then count without the memo.
        let mut memo = memo.try_borrow_mut().ok();
        let mut count_piece = |piece: &[u8]| -> u64 {
            // Every byte is a token of a byte-level BPE, so a 1-byte piece needs no lookup.
            if piece.len() == 1 {
                return 1;
            }
            if piece.len() > MAX_BPE_PIECE_BYTES {
                return count_long_piece(t, piece);
            }
            let key = t.fingerprint.of(piece);
            if piece.len() <= t.longest_token && t.ranks.contains_key(&key) {
                return 1;
            }
            let Some(memo) = memo.as_mut() else {
                return t.merge_count(piece);
            };
            if let Some(&n) = memo.get(&key) {
                return n;
            }
            let n = t.merge_count(piece);
            if memo.len() >= PIECE_MEMO_CAPACITY {
                memo.clear();
            }
            memo.insert(key, n);
            n
        };
        if text.is_ascii() {
            AsciiPieces::new(text.as_bytes())
                .map(&mut count_piece)
                .sum()
        } else {
            t.pretokenizer
                .split(text)
                .map(|p| count_piece(p.as_bytes()))
                .sum()
        }
    })
}

/// Longest piece merged whole. The merge costs O(n log n) in a piece's length, so longer pieces
/// (a run of random bytes or symbols is one piece of the pattern's punctuation class) are
/// counted in windows of this size cut at character boundaries, which keeps the work linear in
/// the text. A cut can only lose the merges across it, so the sum is the exact count plus at
/// most a few tokens per window (well under 1 %); text of words, code and prose never has
/// pieces this long.
pub const MAX_BPE_PIECE_BYTES: usize = 512;

fn count_long_piece(t: &O200k, piece: &[u8]) -> u64 {
    let mut total = 0u64;
    let mut rest = piece;
    while !rest.is_empty() {
        let mut cut = rest.len().min(MAX_BPE_PIECE_BYTES);
        // Back up to the start of a UTF-8 character (never past the start of the window).
        while cut < rest.len() && cut > 0 && (rest[cut] & 0xC0) == 0x80 {
            cut -= 1;
        }
        if cut == 0 {
            cut = rest.len().min(MAX_BPE_PIECE_BYTES);
        }
        let (window, tail) = rest.split_at(cut);
        total += t.merge_count(window);
        rest = tail;
    }
    total
}

/// Pieces per thread whose BPE count is remembered (≈ 20 bytes each).
const PIECE_MEMO_CAPACITY: usize = 65_536;

thread_local! {
    /// Counts of pieces that are not one token (rarer words such as " replenishment"), by
    /// [`Fingerprint`], per thread so that no lock is taken per piece. Merging a piece costs
    /// a few hundred ns (four small vectors, a heap, a fingerprint per candidate pair); a
    /// lookup ~5 ns. Emptied
    /// when full: words recur, so it refills with the current vocabulary at once.
    static PIECE_MEMO: RefCell<HashMap<u64, u64, FingerprintBuild>> =
        const { RefCell::new(HashMap::with_hasher(FingerprintBuild::new())) };
}

/// The `o200k_base` pre-tokenisation of ASCII text, without a regex. The pattern is an
/// alternation tried in order at each position (first alternative that matches wins):
///
/// 1. `[^\r\n\p{L}\p{N}]?[\p{Lu}…]*[\p{Ll}…]+(?i:'s|'t|'re|'ve|'m|'ll|'d)?` — a word with at
///    least one lower-case letter, optionally led by one non-letter, non-digit, non-newline
///    character (usually a space) and followed by a contraction;
/// 2. `[^\r\n\p{L}\p{N}]?[\p{Lu}…]+[\p{Ll}…]*(contraction)?` — an upper-case word;
/// 3. `\p{N}{1,3}` — up to three digits;
/// 4. ` ?[^\s\p{L}\p{N}]+[\r\n/]*` — punctuation, optionally after one space, with trailing
///    newlines or slashes;
/// 5. `\s*[\r\n]+` — whitespace up to and including its last newline;
/// 6. `\s+(?!\S)` — whitespace not followed by a non-space (i.e. all but the last character of a
///    run that precedes text, or a whole run at the end);
/// 7. `\s+`.
///
/// In ASCII, letters are `A-Z` (upper) and `a-z` (lower), digits `0-9`, and `\s` is
/// `\t \n \x0B \x0C \r` and space (Unicode `White_Space`).
struct AsciiPieces<'a> {
    s: &'a [u8],
    pos: usize,
}

impl<'a> AsciiPieces<'a> {
    fn new(s: &'a [u8]) -> Self {
        AsciiPieces { s, pos: 0 }
    }

    fn run(&self, mut i: usize, class: impl Fn(u8) -> bool) -> usize {
        while i < self.s.len() && class(self.s[i]) {
            i += 1;
        }
        i
    }

    /// Like [`run`](Self::run) but stops after `max` bytes.
    fn run_at_most(&self, i: usize, max: usize, class: impl Fn(u8) -> bool) -> usize {
        let limit = self.s.len().min(i.saturating_add(max));
        let mut j = i;
        while j < limit && class(self.s[j]) {
            j += 1;
        }
        j
    }

    fn at(&self, i: usize) -> Option<u8> {
        self.s.get(i).copied()
    }

    /// Length of a contraction (`'s`, `'t`, `'re`, `'ve`, `'m`, `'ll`, `'d`, any case) at `i`.
    fn contraction(&self, i: usize) -> usize {
        if self.at(i) != Some(b'\'') {
            return 0;
        }
        let lower = |j: usize| self.at(j).map(|b| b.to_ascii_lowercase());
        match lower(i + 1) {
            Some(b's' | b't' | b'm' | b'd') => 2,
            Some(b'r') if lower(i + 2) == Some(b'e') => 3,
            Some(b'v') if lower(i + 2) == Some(b'e') => 3,
            Some(b'l') if lower(i + 2) == Some(b'l') => 3,
            _ => 0,
        }
    }

    fn piece_end(&self, i: usize) -> usize {
        let c = self.s[i];
        let next = self.at(i + 1);
        // Alternatives 1 and 2: a word, optionally with one leading prefix character.
        let word_start = if is_letter(c) {
            Some(i)
        } else if is_prefix(c) && next.is_some_and(is_letter) {
            Some(i + 1)
        } else {
            None
        };
        if let Some(j) = word_start {
            let upper_end = self.run(j, |b| b.is_ascii_uppercase());
            let end = self.run(upper_end, |b| b.is_ascii_lowercase());
            return end + self.contraction(end);
        }
        // 3: digits, at most three.
        // Bounded scan: the run's end is never looked for, so a long run of digits costs one
        // pass in all (scanning it to the end for every three-digit piece was quadratic).
        if c.is_ascii_digit() {
            return self.run_at_most(i, 3, |b| b.is_ascii_digit());
        }
        // 4: punctuation, optionally after one space.
        let punct_start = if is_other(c) {
            Some(i)
        } else if c == b' ' && next.is_some_and(is_other) {
            Some(i + 1)
        } else {
            None
        };
        if let Some(j) = punct_start {
            let end = self.run(j, is_other);
            return self.run(end, |b| matches!(b, b'\r' | b'\n' | b'/'));
        }
        // 5–7: whitespace (the only class left).
        let ws_end = self.run(i, is_space);
        if let Some(last_newline) = self.s[i..ws_end]
            .iter()
            .rposition(|&b| b == b'\r' || b == b'\n')
        {
            return i + last_newline + 1;
        }
        if ws_end == self.s.len() || ws_end - i == 1 {
            ws_end
        } else {
            ws_end - 1
        }
    }
}

impl<'a> Iterator for AsciiPieces<'a> {
    type Item = &'a [u8];

    fn next(&mut self) -> Option<&'a [u8]> {
        if self.pos >= self.s.len() {
            return None;
        }
        let start = self.pos;
        // Every alternative consumes at least one byte; `max` keeps that obvious.
        let end = self.piece_end(start).max(start + 1);
        self.pos = end;
        self.s.get(start..end)
    }
}

fn is_letter(b: u8) -> bool {
    b.is_ascii_alphabetic()
}

fn is_space(b: u8) -> bool {
    matches!(b, b'\t' | b'\n' | 0x0B | 0x0C | b'\r' | b' ')
}

/// `[^\s\p{L}\p{N}]`: punctuation, symbols and control characters.
fn is_other(b: u8) -> bool {
    !is_space(b) && !b.is_ascii_alphanumeric()
}

/// `[^\r\n\p{L}\p{N}]`: anything but newlines, letters and digits.
fn is_prefix(b: u8) -> bool {
    b != b'\r' && b != b'\n' && !b.is_ascii_alphanumeric()
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;
    use serde_json::json;

    fn chat(body: Value) -> ChatRequest {
        serde_json::from_value(body).unwrap()
    }

    fn regex_pieces(text: &str) -> Vec<&str> {
        bpe_openai::o200k_base().split(text).collect()
    }

    fn ascii_pieces(text: &str) -> Vec<&str> {
        AsciiPieces::new(text.as_bytes())
            .map(|p| std::str::from_utf8(p).unwrap())
            .collect()
    }

    #[test]
    fn count_segment_long_text_equals_uncached_count_on_hit_and_miss() {
        let text = "A system prompt that is long enough to be memoised. ".repeat(10);
        let expected = bpe_openai::o200k_base().count(text.as_str()) as u64;
        assert_eq!(count_segment(&text), expected);
        assert_eq!(count_segment(&text), expected);
        assert_eq!(count_segment("hello world"), 2);
    }

    #[test]
    fn fingerprints_tell_lengths_and_overlaps_apart_and_depend_on_the_keys() {
        let f = Fingerprint::random();
        let pieces = [
            &b"ab"[..],
            b"ab\0",
            b"abcdefgh",
            b"abcdefghi",
            b"bcdefghia",
            b"",
            &[b'x'; 17],
        ];
        let prints: Vec<u64> = pieces.iter().map(|p| f.of(p)).collect();
        for (i, a) in prints.iter().enumerate() {
            for b in &prints[i + 1..] {
                assert_ne!(a, b);
            }
        }
        assert_eq!(f.of(b"hello world"), f.of(b"hello world"));
        let g = Fingerprint::random();
        assert_ne!(f.of(b"hello world"), g.of(b"hello world"));
    }

    #[test]
    fn count_tokens_hello_world_is_two() {
        // tiktoken: o200k_base.encode("hello world") == [24912, 2375].
        assert_eq!(count_tokens("hello world"), 2);
        assert_eq!(count_tokens(""), 0);
    }

    #[test]
    fn count_tokens_matches_full_bpe_on_mixed_text() {
        let texts = [
            "The quick brown fox jumps over the lazy dog.",
            "  indented\n\n\tcode() { return x /= 2; } // don't\r\n",
            "Ünïcödé text, 東京 and emoji 🎉 mixed with ASCII.",
            "HTTPRequest parseJSON IDs 12345678 they'LL we've I'M",
            "{\"type\":\"object\",\"properties\":{\"city\":{\"type\":\"string\"}}}",
        ];
        for text in texts {
            let expected = bpe_openai::o200k_base().count(text) as u64;
            assert_eq!(count_tokens(text), expected, "{text:?}");
        }
    }

    #[test]
    fn ascii_pieces_known_cases_match_regex() {
        for text in [
            "hello world",
            "  hello",
            "a  \n  b",
            "x\n\n\ny ",
            "don't STOP'S he'Ll",
            "(hello) [WORLD]! ...\n/path//to\n",
            "1234567 3.14159",
            "\x0b\x0c \t\x00\x1f\x7f",
            "end with spaces   ",
            "'s 're 'x",
        ] {
            assert_eq!(ascii_pieces(text), regex_pieces(text), "{text:?}");
        }
    }

    proptest! {
        #[test]
        fn ascii_pieces_random_ascii_matches_regex(
            text in "[a-zA-Z0-9 \t\r\n\x0b\x0c'sStTrReEvVmMlLdD/.,:;!?(){}\"#_\\-\x00\x1f\x7f]{0,64}"
        ) {
            prop_assert_eq!(ascii_pieces(&text), regex_pieces(&text));
        }

        #[test]
        fn count_tokens_random_unicode_matches_bpe(text in "\\PC{0,80}") {
            prop_assert_eq!(count_tokens(&text), bpe_openai::o200k_base().count(text.as_str()) as u64);
        }

        #[test]
        fn count_tokens_random_ascii_matches_bpe(text in "[ -~\n\t]{0,200}") {
            prop_assert_eq!(count_tokens(&text), bpe_openai::o200k_base().count(text.as_str()) as u64);
        }

        #[test]
        fn pretokenizer_random_unicode_matches_bpe_openai(text in "(\\PC|\\s){0,120}") {
            let ours: Vec<&str> = O200K.pretokenizer.split(&text).collect();
            prop_assert_eq!(ours, regex_pieces(&text));
        }

        /// Pieces glued from real tokens (two to twelve, by id) are the hard case for a
        /// merge: many candidate pairs, most of them not the encoding's. The merge must count
        /// each exactly as `bpe-openai`'s backtracking encoder does.
        #[test]
        fn merge_counts_glued_tokens_like_bpe_openai(
            ids in proptest::collection::vec(0u32..199_998, 2..12)
        ) {
            let bpe = &bpe_openai::o200k_base().bpe;
            let piece: Vec<u8> = ids.iter().flat_map(|&id| bpe.token_bytes(id).to_vec()).collect();
            prop_assert_eq!(O200K.merge_count(&piece), bpe.count(&piece) as u64);
        }
    }

    #[test]
    fn merge_of_every_token_is_one_and_of_repeated_bytes_matches_bpe_openai() {
        let bpe = &bpe_openai::o200k_base().bpe;
        for id in (0..199_998u32).step_by(7) {
            assert_eq!(O200K.merge_count(bpe.token_bytes(id)), 1, "token {id}");
        }
        for unit in [&b"a"[..], b"ab", b" =", b"\xe6\x97", b"0", b"\t "] {
            for n in [2usize, 3, 7, 16, 61, 200, 511] {
                let piece = unit.repeat(n);
                assert_eq!(
                    O200K.merge_count(&piece),
                    bpe.count(&piece) as u64,
                    "{unit:?} x {n}"
                );
            }
        }
    }

    #[test]
    fn estimate_openai_tools_raise_input() {
        let base = json!({"model": "m", "messages": [
            {"role": "system", "content": "You are helpful."},
            {"role": "user", "content": "What is the weather in Paris?"}
        ]});
        let mut with_tools = base.clone();
        with_tools["tools"] = json!([{"type": "function", "function": {
            "name": "get_weather", "description": "Current weather for a city",
            "parameters": {"type": "object", "properties": {"city": {"type": "string"}},
                "required": ["city"]}}}]);
        let plain = openai_chat_input_tokens(&chat(base));
        let tooled = openai_chat_input_tokens(&chat(with_tools.clone()));
        let tool_json = serde_json::to_string(&with_tools["tools"][0]).unwrap();
        assert_eq!(
            tooled - plain,
            OPENAI_CHAT_OVERHEADS.tools_preamble
                + OPENAI_CHAT_OVERHEADS.per_tool
                + count_tokens(&tool_json)
        );
    }

    #[test]
    fn estimate_openai_messages_add_overheads_and_text() {
        let req = chat(json!({"model": "m", "messages": [
            {"role": "system", "content": "hello world"},
            {"role": "user", "content": "hello world", "name": "bob"}
        ]}));
        // 3 (priming) + 2 × (3 + 1 role + 2 text) + (1 + 1 for "bob").
        assert_eq!(openai_chat_input_tokens(&req), 3 + 2 * 6 + 2);
    }

    #[test]
    fn estimate_openai_response_format_schema_counts() {
        let schema = json!({"name": "answer", "schema": {"type": "object",
            "properties": {"answer": {"type": "string"}}}});
        let base = json!({"model": "m", "messages": [{"role": "user", "content": "hi"}]});
        let mut with_format = base.clone();
        with_format["response_format"] = json!({"type": "json_schema", "json_schema": schema});
        let diff =
            openai_chat_input_tokens(&chat(with_format)) - openai_chat_input_tokens(&chat(base));
        assert_eq!(
            diff,
            OPENAI_CHAT_OVERHEADS.per_tool + count_tokens(&serde_json::to_string(&schema).unwrap())
        );
    }

    #[test]
    fn estimate_openai_unknown_part_counts_text_members_not_payloads() {
        let req = chat(
            json!({"model": "m", "messages": [{"role": "user", "content": [
                {"type": "input_audio", "input_audio": {"data": "UklGRiQAAABXQVZFZm10IBAAAAABAAEA", "format": "wav"}},
                {"type": "file", "file": {"file_data": "data:application/pdf;base64,JVBERi0x", "filename": "report"}}
            ]}]}),
        );
        // Framing 3 + 3 + 1, then "input_audio", "wav", "file", "report" and the part types.
        let expected = 7
            + count_tokens("input_audio")
            + count_tokens("wav")
            + count_tokens("file")
            + count_tokens("report");
        assert_eq!(openai_chat_input_tokens(&req), expected);
    }

    #[test]
    fn estimate_openai_tool_calls_and_results_count() {
        let req = chat(json!({"model": "m", "messages": [
            {"role": "assistant", "content": null, "tool_calls": [{"id": "call_1", "type": "function",
                "function": {"name": "get_weather", "arguments": "{\"city\":\"Paris\"}"}}]},
            {"role": "tool", "tool_call_id": "call_1", "content": "18 degrees and sunny"}
        ]}));
        let expected = 3
            + 2 * 4
            + OPENAI_CHAT_OVERHEADS.per_tool_call
            + count_tokens("get_weather")
            + count_tokens("{\"city\":\"Paris\"}")
            + count_tokens("18 degrees and sunny");
        assert_eq!(openai_chat_input_tokens(&req), expected);
    }

    /// A 1×1 PNG header rewritten to `w × h` (imagesize reads only the IHDR chunk).
    fn png_data_url(w: u32, h: u32) -> String {
        let mut png = vec![0x89, b'P', b'N', b'G', 0x0D, 0x0A, 0x1A, 0x0A];
        png.extend_from_slice(&13u32.to_be_bytes());
        png.extend_from_slice(b"IHDR");
        png.extend_from_slice(&w.to_be_bytes());
        png.extend_from_slice(&h.to_be_bytes());
        png.extend_from_slice(&[8, 6, 0, 0, 0, 0, 0, 0, 0]);
        png.extend(std::iter::repeat_n(0u8, 3000));
        format!(
            "data:image/png;base64,{}",
            base64::engine::general_purpose::STANDARD.encode(&png)
        )
    }

    #[test]
    fn data_url_image_size_reads_png_header() {
        assert_eq!(
            data_url_image_size(&png_data_url(1024, 768)),
            Some((1024, 768))
        );
        assert_eq!(data_url_image_size("https://example.com/cat.png"), None);
        assert_eq!(data_url_image_size("data:image/png;base64,!!!!"), None);
    }

    #[test]
    fn estimate_openai_image_follows_tile_formula() {
        let image = |url: String, detail: &str| {
            chat(
                json!({"model": "m", "messages": [{"role": "user", "content": [
                {"type": "image_url", "image_url": {"url": url, "detail": detail}}]}]}),
            )
        };
        let framing = 3 + 3 + 1;
        let high = openai_chat_input_tokens(&image(png_data_url(1024, 1024), "high"));
        assert_eq!(high - framing, 765);
        let low = openai_chat_input_tokens(&image(png_data_url(1024, 1024), "low"));
        assert_eq!(low - framing, 85);
        let remote = openai_chat_input_tokens(&image("https://x.test/a.png".into(), "auto"));
        assert_eq!(remote - framing, 1445);
    }

    #[test]
    fn estimate_anthropic_counts_system_tools_images_and_results() {
        let png = png_data_url(1000, 1000);
        let data = png.split_once(',').unwrap().1;
        let req: MessagesRequest = serde_json::from_value(json!({
            "model": "claude", "max_tokens": 1024,
            "system": [{"type": "text", "text": "hello world"}],
            "tools": [{"name": "get_weather", "description": "Weather",
                "input_schema": {"type": "object"}}],
            "messages": [
                {"role": "user", "content": [
                    {"type": "text", "text": "hello world"},
                    {"type": "image", "source": {"type": "base64", "media_type": "image/png", "data": data}}]},
                {"role": "assistant", "content": [
                    {"type": "tool_use", "id": "toolu_1", "name": "get_weather", "input": {"city": "Paris"}}]},
                {"role": "user", "content": [
                    {"type": "tool_result", "tool_use_id": "toolu_1", "content": "sunny"}]}
            ]
        }))
        .unwrap();
        let o = ANTHROPIC_MESSAGES_OVERHEADS;
        let tool_json = serde_json::to_string(&req.tools.as_ref().unwrap()[0]).unwrap();
        let expected = o.per_request
            + 2
            + 3 * o.per_message
            + 2
            + 1334
            + o.per_tool_call
            + count_tokens("get_weather")
            + count_tokens("{\"city\":\"Paris\"}")
            + o.per_tool_call
            + count_tokens("sunny")
            + o.tools_preamble
            + o.per_tool
            + count_tokens(&tool_json);
        assert_eq!(anthropic_messages_input_tokens(&req), expected);
        let est = estimate_anthropic_messages(&req, &EstimateParams::default());
        assert_eq!(est.output_tokens, 1024);
    }

    #[test]
    fn output_allowance_prefers_completion_cap_then_max_then_default_times_n() {
        let base = json!({"model": "m", "messages": [{"role": "user", "content": "hi"}]});
        assert_eq!(openai_output_allowance(&chat(base.clone()), 777), 777);
        let mut b = base.clone();
        b["max_tokens"] = json!(100);
        assert_eq!(openai_output_allowance(&chat(b.clone()), 777), 100);
        b["max_completion_tokens"] = json!(50);
        assert_eq!(openai_output_allowance(&chat(b.clone()), 777), 50);
        b["n"] = json!(3);
        assert_eq!(openai_output_allowance(&chat(b), 777), 150);
    }

    #[test]
    fn estimate_cost_is_exact_micro_usd_and_demand_matches() {
        let req = chat(json!({"model": "m", "max_tokens": 500,
            "messages": [{"role": "user", "content": "hello world"}]}));
        let params = EstimateParams {
            default_output_tokens: 1,
            pricing: Pricing {
                input: 2_500_000,
                output: 10_000_000,
                cache_read: 1_250_000,
                cache_write: 2_500_000,
            },
            ratio: 1.0,
        };
        let est = estimate_openai_chat(&req, &params);
        // 3 + 3 + 1 + 2 = 9 input tokens.
        assert_eq!(
            (est.raw_input_tokens, est.input_tokens, est.output_tokens),
            (9, 9, 500)
        );
        // 9 × 2.5 + 500 × 10 = 22.5 + 5000 → 5023 (rounded up once).
        assert_eq!(est.spend_micro_usd, 5023);
        let d = est.demand();
        assert_eq!(
            (
                d.requests,
                d.input_tokens,
                d.cached_input_tokens,
                d.output_tokens,
                d.spend_micro_usd
            ),
            (1, 9, 0, 500, 5023)
        );
        let scaled = estimate_openai_chat(
            &req,
            &EstimateParams {
                ratio: 1.5,
                ..params
            },
        );
        assert_eq!((scaled.raw_input_tokens, scaled.input_tokens), (9, 14));
    }

    #[test]
    fn estimate_embeddings_counts_strings_and_token_lists() {
        let req: EmbeddingsRequest = serde_json::from_value(json!({"model": "e",
            "input": ["hello world", [1, 2, 3, 4]]}))
        .unwrap();
        let est = estimate_openai_embeddings(&req, &EstimateParams::default());
        assert_eq!((est.input_tokens, est.output_tokens), (6, 0));
    }

    #[test]
    fn long_digit_run_splits_in_threes_like_the_regex() {
        // 400 000 digits: the case that took ~13 s when every piece rescanned the run.
        let text = "7".repeat(400_000);
        let pieces = ascii_pieces(&text);
        assert_eq!(pieces.len(), 133_334);
        assert!(pieces[..133_333].iter().all(|p| *p == "777"));
        assert_eq!(pieces[133_333], "7");
        // Digits inside other text: runs still cut in threes, separators kept.
        for text in ["12345678 3.14159", "x1234567y", "0000000000\n"] {
            assert_eq!(ascii_pieces(text), regex_pieces(text), "{text:?}");
        }
        assert_eq!(
            count_tokens(&"7".repeat(30_000)),
            bpe_openai::o200k_base().count("7".repeat(30_000).as_str()) as u64
        );
    }

    proptest! {
        #[test]
        fn ascii_pieces_long_runs_match_regex(
            unit in "[a-zA-Z0-9 \n'!/.]{1,3}",
            repeat in 1usize..2_000,
            tail in "[a-z0-9 ]{0,3}",
        ) {
            let text = format!("{}{tail}", unit.repeat(repeat));
            prop_assert_eq!(ascii_pieces(&text), regex_pieces(&text));
        }
    }

    /// Held by the tests that empty the process-wide segment memo or depend on its content.
    static MEMO_TEST_LOCK: Mutex<()> = Mutex::new(());

    fn user_chat(text: &str) -> ChatRequest {
        chat(json!({"model": "m", "messages": [{"role": "user", "content": text}]}))
    }

    #[test]
    fn estimate_within_budget_is_exact_and_past_it_is_the_byte_bound() {
        let _memo = MEMO_TEST_LOCK.lock().unwrap_or_else(|e| e.into_inner());
        clear_memo();
        // Within the budget: the exact count, not bounded.
        let small = "hello world ".repeat(1_000);
        let est = estimate_openai_chat(&user_chat(&small), &EstimateParams::default());
        assert_eq!(est.bounded_bytes, 0);
        assert_eq!(est.raw_input_tokens, 7 + count_tokens(&small));
        // Past the budget: the segment is counted as one token per byte (an upper bound:
        // the exact count of this text is a third of it), and flagged.
        let huge = "7".repeat(EXACT_BUDGET_BYTES + 1);
        let exact = count_tokens(&huge);
        let est = estimate_openai_chat(&user_chat(&huge), &EstimateParams::default());
        assert_eq!(est.bounded_bytes, huge.len() as u64);
        assert_eq!(est.raw_input_tokens, 7 + huge.len() as u64);
        assert!(est.raw_input_tokens >= exact, "the bound is an upper bound");
        // Nothing bounded is memoised: the same text again is bounded again.
        let again = estimate_openai_chat(&user_chat(&huge), &EstimateParams::default());
        assert_eq!(again.bounded_bytes, huge.len() as u64);
    }

    #[test]
    fn budget_is_per_request_and_shared_by_its_segments() {
        let _memo = MEMO_TEST_LOCK.lock().unwrap_or_else(|e| e.into_inner());
        clear_memo();
        // Two messages of 600 KiB each: the first is tokenized, the second does not fit the
        // rest of the budget and is bounded; a later small message still fits.
        let a = "a b ".repeat(150 * 1024);
        let b = "c d ".repeat(150 * 1024);
        let req = chat(json!({"model": "m", "messages": [
            {"role": "user", "content": a},
            {"role": "user", "content": b},
            {"role": "user", "content": "hello world"}
        ]}));
        let est = estimate_openai_chat(&req, &EstimateParams::default());
        assert_eq!(est.bounded_bytes, b.len() as u64);
        assert_eq!(
            est.raw_input_tokens,
            3 + 3 * 4 + count_tokens(&a) + b.len() as u64 + 2
        );
        // A memoised segment costs no budget: now `a` is a hit, so `b` fits.
        let req2 = chat(json!({"model": "m", "messages": [
            {"role": "user", "content": a},
            {"role": "user", "content": b}
        ]}));
        clear_memo();
        let _ = count_segment(&a);
        let est2 = estimate_openai_chat(&req2, &EstimateParams::default());
        assert_eq!(est2.bounded_bytes, 0);
        // Short strings draw on the same budget.
        let mut c = Counter::with_budget(12);
        assert_eq!(c.text("hello world"), 2);
        assert_eq!(c.text("hello"), 5, "past the budget: one per byte");
        assert_eq!(c.text("x"), 1);
        assert_eq!(c.bounded_bytes, 5);
    }

    #[test]
    fn long_pieces_are_counted_in_windows_close_to_exact() {
        // One piece each (a run of the punctuation class, of CJK, of letters).
        for text in ["🎉".repeat(3_000), "東京".repeat(2_000), "ab".repeat(4_000)] {
            let exact = bpe_openai::o200k_base().count(text.as_str()) as u64;
            let windows = count_tokens(&text);
            let cuts = (text.len() / MAX_BPE_PIECE_BYTES) as u64 + 1;
            assert!(
                windows >= exact.saturating_sub(cuts) && windows <= exact + 2 * cuts,
                "{} bytes: {windows} vs exact {exact}",
                text.len()
            );
        }
        // Pieces up to the window size stay exact.
        let short = "🎉".repeat(MAX_BPE_PIECE_BYTES / 4);
        assert_eq!(
            count_tokens(&short),
            bpe_openai::o200k_base().count(short.as_str()) as u64
        );
    }

    #[test]
    fn bounded_estimate_does_not_settle_calibration() {
        let table = RouteCalibrations::new();
        let est = Estimate {
            raw_input_tokens: 2_000_000,
            input_tokens: 2_000_000,
            bounded_bytes: 2_000_000,
            ..Estimate::default()
        };
        assert_eq!(table.settle("r", &est, 700_000), None);
        assert_eq!(table.ratio("r"), 1.0);
        assert!(table.get("r").is_none());
    }

    #[test]
    fn route_calibrations_settle_moves_ratio_within_bounds() {
        let table = RouteCalibrations::new();
        assert_eq!(table.ratio("r"), 1.0);
        let est = Estimate {
            raw_input_tokens: 100,
            input_tokens: 100,
            output_tokens: 0,
            spend_micro_usd: 0,
            bounded_bytes: 0,
        };
        assert_eq!(table.settle("r", &est, 125), Some(-0.2));
        assert!((table.ratio("r") - 1.025).abs() < 1e-12);
        for _ in 0..500 {
            table.settle("r", &est, 100_000);
        }
        assert!(table.ratio("r") <= 2.0 && table.ratio("r") > 1.99);
        assert_eq!(table.ratio("other"), 1.0);
    }
}
