//! Token usage normalised across vendors, and its cost.
//!
//! Vendors count prompt-cache hits differently, and charging the same conversation
//! differently per vendor is a billing bug (field case 16). Every shape is mapped to four
//! disjoint counts:
//!
//! | vendor | reported | uncached input | cache read | cache write | output |
//! |---|---|---|---|---|---|
//! | OpenAI | `prompt_tokens` *includes* `prompt_tokens_details.cached_tokens` | prompt − cached | cached | 0 | `completion_tokens` |
//! | Anthropic | `input_tokens` *excludes* cache read and creation | `input_tokens` | `cache_read_input_tokens` | `cache_creation_input_tokens` | `output_tokens` |
//! | Gemini | `promptTokenCount` *includes* `cachedContentTokenCount` | prompt − cached | cached | 0 | candidates + thoughts |
//!
//! In a stream the counts are accumulated ([`StreamUsage`]): Anthropic reports input and
//! cache counts in `message_start` and cumulative counts in `message_delta` (later values
//! replace earlier ones); OpenAI reports once, in the usage-only chunk before `[DONE]`; Gemini
//! repeats `usageMetadata` on chunks, the last one being final. When a stream ends without any
//! usage report the record is [`UsageSource::Estimated`] from the router's estimate and the
//! text actually delivered, never zero (field case 15); when it is cut after Anthropic's
//! opening counts but before the final ones (client hung up, case 17a), input stays exact and
//! output is estimated from the delivered text (4 bytes per token).
//!
//! Cost ([`cost_micro_usd`]) is `Σ tokens × price per million tokens`, computed exactly in
//! integers and rounded *up* once to whole micro-USD, so it is identical however the same
//! usage was reported and never under-charges by rounding.

use serde::{Deserialize, Serialize};

use super::{anthropic, openai};

/// Where a usage record came from.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum UsageSource {
    /// The provider reported it.
    Reported,
    /// The provider reported nothing (interrupted stream, non-compliant server): estimated.
    Estimated,
}

/// Token usage in four disjoint counts (their sum is all tokens processed).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, Serialize, Deserialize)]
pub struct NormalizedUsage {
    /// Input tokens processed at the full input rate (cache writes not included).
    pub input_uncached: u64,
    /// Input tokens read from the prompt cache.
    pub cache_read: u64,
    /// Input tokens written to the prompt cache.
    pub cache_write: u64,
    /// Output tokens (reasoning included).
    pub output: u64,
    /// Reported or estimated.
    pub source: UsageSource,
}

impl NormalizedUsage {
    /// From an OpenAI `usage` object: `prompt_tokens` includes the cached tokens, so
    /// uncached = prompt − cached (saturating, in case a server reports cached > prompt).
    pub fn from_openai(u: &openai::Usage) -> Self {
        let cached = u
            .prompt_tokens_details
            .as_ref()
            .and_then(|d| d.cached_tokens)
            .unwrap_or(0);
        NormalizedUsage {
            input_uncached: u.prompt_tokens.saturating_sub(cached),
            cache_read: cached.min(u.prompt_tokens),
            cache_write: 0,
            output: u.completion_tokens,
            source: UsageSource::Reported,
        }
    }

    /// From an Anthropic `usage` object: `input_tokens` already excludes cache reads and
    /// writes. Missing fields count as 0.
    pub fn from_anthropic(u: &anthropic::Usage) -> Self {
        NormalizedUsage {
            input_uncached: u.input_tokens.unwrap_or(0),
            cache_read: u.cache_read_input_tokens.unwrap_or(0),
            cache_write: u.cache_creation_input_tokens.unwrap_or(0),
            output: u.output_tokens.unwrap_or(0),
            source: UsageSource::Reported,
        }
    }

    /// From a Gemini `usageMetadata` object: `promptTokenCount` includes
    /// `cachedContentTokenCount`; thinking tokens are billed as output.
    pub fn from_gemini(u: &GeminiUsageMetadata) -> Self {
        let cached = u.cached_content_token_count.unwrap_or(0);
        let prompt = u.prompt_token_count.unwrap_or(0);
        NormalizedUsage {
            input_uncached: prompt.saturating_sub(cached),
            cache_read: cached.min(prompt),
            cache_write: 0,
            output: u.candidates_token_count.unwrap_or(0) + u.thoughts_token_count.unwrap_or(0),
            source: UsageSource::Reported,
        }
    }

    /// From an OpenAI embeddings `usage` object (input only; embeddings have no prompt cache).
    pub fn from_openai_embeddings(u: &openai::EmbeddingsUsage) -> Self {
        NormalizedUsage {
            input_uncached: u.prompt_tokens,
            cache_read: 0,
            cache_write: 0,
            output: 0,
            source: UsageSource::Reported,
        }
    }

    /// An estimate (all input counted uncached).
    pub fn estimated(input: u64, output: u64) -> Self {
        NormalizedUsage {
            input_uncached: input,
            cache_read: 0,
            cache_write: 0,
            output,
            source: UsageSource::Estimated,
        }
    }

    /// All input tokens (uncached + cache read + cache write).
    pub fn input_total(&self) -> u64 {
        self.input_uncached + self.cache_read + self.cache_write
    }

    /// OpenAI `usage` object for this usage (what an OpenAI-dialect client is shown):
    /// `prompt_tokens` = all input, `cached_tokens` = cache read.
    pub fn to_openai(&self) -> openai::Usage {
        let prompt = self.input_total();
        openai::Usage {
            prompt_tokens: prompt,
            completion_tokens: self.output,
            total_tokens: prompt + self.output,
            prompt_tokens_details: Some(openai::PromptTokensDetails {
                cached_tokens: Some(self.cache_read),
                extra: Default::default(),
            }),
            extra: Default::default(),
        }
    }

    /// Anthropic `usage` object for this usage (what an Anthropic-dialect client is shown).
    pub fn to_anthropic(&self) -> anthropic::Usage {
        anthropic::Usage {
            input_tokens: Some(self.input_uncached),
            output_tokens: Some(self.output),
            cache_creation_input_tokens: Some(self.cache_write),
            cache_read_input_tokens: Some(self.cache_read),
            extra: Default::default(),
        }
    }
}

/// Gemini `usageMetadata` (camelCase on the wire); the members that matter for billing.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct GeminiUsageMetadata {
    /// All input tokens, cached ones included.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub prompt_token_count: Option<u64>,
    /// Input tokens served from the context cache.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub cached_content_token_count: Option<u64>,
    /// Output tokens of the candidates.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub candidates_token_count: Option<u64>,
    /// Thinking tokens (billed as output).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub thoughts_token_count: Option<u64>,
    /// Sum of all.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub total_token_count: Option<u64>,
}

/// The delivered text pieces of an OpenAI chunk, full ([`openai::ChatChunk`]) or scanned
/// ([`openai::ChunkScan`]), which have the same shape: every choice's content, then its tool
/// calls' argument pieces.
macro_rules! openai_texts {
    ($chunk:expr) => {
        $chunk.choices.iter().flat_map(|choice| {
            let args = choice
                .delta
                .tool_calls
                .iter()
                .flatten()
                .filter_map(|tc| tc.function.as_ref().and_then(|f| f.arguments.as_deref()));
            choice.delta.content.as_deref().into_iter().chain(args)
        })
    };
}

/// Usage accumulated over one stream, whatever the dialect.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
#[allow(unpredictable_function_pointer_comparisons)] // compared in tests for the figures only
pub struct StreamUsage {
    reported: Option<NormalizedUsage>,
    /// The report seen is the final one (OpenAI usage chunk, Anthropic `message_delta`,
    /// any Gemini report), not only Anthropic's opening `message_start` counts.
    final_seen: bool,
    /// Bytes of text and tool arguments seen in content deltas.
    delivered_bytes: u64,
    /// Tokens of those deltas (the tokenizer's count per delta), for the output estimate when
    /// the stream ends (or is cut) before usage is reported.
    delivered_tokens: u64,
    /// The tokenizer counting delivered deltas ([`Self::count_with`]); without one, four
    /// bytes per token.
    counter: Option<fn(&str) -> u64>,
}

impl StreamUsage {
    /// Nothing seen yet.
    pub fn new() -> Self {
        StreamUsage::default()
    }

    /// Counts delivered output with `count` (the router passes its tokenizer; the
    /// tokenizer lives with the request estimator, outside this crate).
    pub fn count_with(&mut self, count: fn(&str) -> u64) {
        self.counter = Some(count);
    }

    /// Counts one delta of delivered output. Deltas are usually whole tokens, so the sum of
    /// per-delta counts is close to the count of the whole text.
    fn deliver(&mut self, text: &str) {
        self.delivered_bytes += text.len() as u64;
        self.delivered_tokens += self.counter.unwrap_or(bytes_per_token_estimate)(text);
    }

    /// Observes one OpenAI chunk: content sizes, and the usage if the chunk carries any.
    pub fn observe_openai(&mut self, chunk: &openai::ChatChunk) {
        self.observe_openai_parts(openai_texts!(chunk), chunk.usage.as_ref());
    }

    /// [`Self::observe_openai`] for the pass-through reading of a chunk
    /// ([`openai::ChunkScan`]); the same counts.
    pub(crate) fn observe_openai_scan(&mut self, chunk: &openai::ChunkScan<'_>) {
        self.observe_openai_parts(openai_texts!(chunk), chunk.usage.as_ref());
    }

    /// One OpenAI chunk's delivered text pieces (content, tool arguments) and its usage.
    fn observe_openai_parts<'t>(
        &mut self,
        texts: impl Iterator<Item = &'t str>,
        usage: Option<&openai::Usage>,
    ) {
        for text in texts {
            self.deliver(text);
        }
        if let Some(u) = usage {
            self.reported = Some(NormalizedUsage::from_openai(u));
            self.final_seen = true;
        }
    }

    /// Observes one Anthropic event: `message_start` sets all counts, `message_delta`
    /// replaces the counts it carries (they are cumulative).
    pub fn observe_anthropic(&mut self, event: &anthropic::StreamEvent) {
        match event {
            anthropic::StreamEvent::MessageStart { message } => {
                self.reported = Some(NormalizedUsage::from_anthropic(&message.usage));
            }
            anthropic::StreamEvent::MessageDelta { usage: Some(u), .. } => {
                let base = self
                    .reported
                    .get_or_insert_with(|| NormalizedUsage::from_anthropic(u));
                if let Some(v) = u.input_tokens {
                    base.input_uncached = v;
                }
                if let Some(v) = u.cache_read_input_tokens {
                    base.cache_read = v;
                }
                if let Some(v) = u.cache_creation_input_tokens {
                    base.cache_write = v;
                }
                if let Some(v) = u.output_tokens {
                    base.output = v;
                }
                self.final_seen = true;
            }
            anthropic::StreamEvent::ContentBlockDelta { delta, .. } => match delta {
                anthropic::BlockDelta::TextDelta { text } => self.deliver(text),
                anthropic::BlockDelta::InputJsonDelta { partial_json } => {
                    self.deliver(partial_json);
                }
                anthropic::BlockDelta::ThinkingDelta { thinking } => self.deliver(thinking),
                _ => {}
            },
            _ => {}
        }
    }

    /// Observes one Gemini `usageMetadata` (each report supersedes the previous one).
    pub fn observe_gemini(&mut self, meta: &GeminiUsageMetadata) {
        self.reported = Some(NormalizedUsage::from_gemini(meta));
        self.final_seen = true;
    }

    /// The usage reported so far, if any.
    pub fn reported(&self) -> Option<NormalizedUsage> {
        self.reported
    }

    /// Bytes of content seen so far.
    pub fn delivered_bytes(&self) -> u64 {
        self.delivered_bytes
    }

    /// Whether the final usage report was seen (the stream was not cut before it).
    pub fn is_final(&self) -> bool {
        self.final_seen
    }

    /// Usage to record when the stream is over, however it ended:
    /// - final report seen → that report, as reported (even 0/0, field case 17c);
    /// - only Anthropic's opening counts seen (stream cut, e.g. the client hung up, case 17a)
    ///   → the exact input and cache counts, output = max(reported, the tokenizer's count of
    ///   the delivered deltas), marked [`UsageSource::Estimated`];
    /// - nothing reported → `estimated_input` (the router's estimate, at least 1) and the
    ///   delivered-output count (at least 1), marked estimated: never zero (case 15).
    pub fn finish(&self, estimated_input: u64) -> NormalizedUsage {
        let estimated_output = self.delivered_tokens.max(1);
        match self.reported {
            Some(u) if self.final_seen => u,
            Some(u) => NormalizedUsage {
                output: u.output.max(estimated_output),
                source: UsageSource::Estimated,
                ..u
            },
            None => NormalizedUsage::estimated(estimated_input.max(1), estimated_output),
        }
    }
}

/// List prices of one model in micro-USD per million tokens (e.g. $3.00/MTok = 3_000_000).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Hash, Serialize, Deserialize)]
pub struct Pricing {
    /// Uncached input.
    pub input: u64,
    /// Output.
    pub output: u64,
    /// Cache read.
    pub cache_read: u64,
    /// Cache write.
    pub cache_write: u64,
}

/// Cost of `usage` at `pricing`, in micro-USD: the exact sum of `tokens × price` over the four
/// counts, divided by one million and rounded up (so the result never under-charges and does
/// not depend on how the usage was reported). Saturates at `u64::MAX`.
pub fn cost_micro_usd(usage: &NormalizedUsage, pricing: &Pricing) -> u64 {
    let total = u128::from(usage.input_uncached) * u128::from(pricing.input)
        + u128::from(usage.cache_read) * u128::from(pricing.cache_read)
        + u128::from(usage.cache_write) * u128::from(pricing.cache_write)
        + u128::from(usage.output) * u128::from(pricing.output);
    u64::try_from(total.div_ceil(1_000_000)).unwrap_or(u64::MAX)
}

/// Output tokens of a delta when no tokenizer was given: one per four bytes, rounded up.
fn bytes_per_token_estimate(text: &str) -> u64 {
    (text.len() as u64).div_ceil(4)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn from_openai_cached_exceeds_prompt_saturates() {
        let u = openai::Usage {
            prompt_tokens: 10,
            completion_tokens: 1,
            total_tokens: 11,
            prompt_tokens_details: Some(openai::PromptTokensDetails {
                cached_tokens: Some(12),
                extra: Default::default(),
            }),
            extra: Default::default(),
        };
        let n = NormalizedUsage::from_openai(&u);
        assert_eq!((n.input_uncached, n.cache_read), (0, 10));
    }

    #[test]
    fn cost_micro_usd_rounds_up_once() {
        // 1 token at $3/MTok = 3 micro-USD; 1 token at $0.30/MTok = 0.3 → total 3.3 → 4.
        let usage = NormalizedUsage {
            input_uncached: 1,
            cache_read: 1,
            cache_write: 0,
            output: 0,
            source: UsageSource::Reported,
        };
        let pricing = Pricing {
            input: 3_000_000,
            output: 15_000_000,
            cache_read: 300_000,
            cache_write: 3_750_000,
        };
        assert_eq!(cost_micro_usd(&usage, &pricing), 4);
    }

    #[test]
    fn finish_anthropic_cut_after_start_keeps_input_and_estimates_output() {
        let mut s = StreamUsage::new();
        let start: anthropic::StreamEvent = serde_json::from_value(serde_json::json!({
            "type": "message_start", "message": {"id": "m", "type": "message", "role": "assistant",
            "model": "x", "content": [], "usage": {"input_tokens": 1200, "output_tokens": 1}}}))
        .unwrap();
        s.observe_anthropic(&start);
        for _ in 0..400 {
            let delta: anthropic::StreamEvent = serde_json::from_value(serde_json::json!({
                "type": "content_block_delta", "index": 0,
                "delta": {"type": "text_delta", "text": "word"}}))
            .unwrap();
            s.observe_anthropic(&delta);
        }
        assert!(!s.is_final());
        let u = s.finish(5);
        assert_eq!(
            (u.input_uncached, u.output, u.source),
            (1200, 400, UsageSource::Estimated)
        );
    }

    #[test]
    fn finish_without_report_estimates_nonzero() {
        let s = StreamUsage::new();
        let u = s.finish(0);
        assert_eq!(u.source, UsageSource::Estimated);
        assert!(u.input_uncached >= 1 && u.output >= 1);
    }

    #[test]
    fn normalized_round_trips_through_both_client_shapes() {
        let n = NormalizedUsage {
            input_uncached: 4,
            cache_read: 2455,
            cache_write: 7,
            output: 23,
            source: UsageSource::Reported,
        };
        assert_eq!(NormalizedUsage::from_anthropic(&n.to_anthropic()), n);
        let via_openai = NormalizedUsage::from_openai(&n.to_openai());
        // OpenAI has no cache-write field: writes show as uncached input.
        assert_eq!(via_openai.input_uncached, 11);
        assert_eq!(via_openai.cache_read, 2455);
    }
}
