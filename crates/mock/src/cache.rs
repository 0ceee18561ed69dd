//! Prompt-cache simulation, one cache per mock instance.
//!
//! Model: a prompt is a chain of segments s1..sm (see [`crate::tokens`]); prefix k is identified
//! by `H_k = fnv(H_{k-1}, hash(s_k))` seeded with the model name, and weighs
//! `C_k = tokens(s1..sk)`. An entry `H_k -> (C_k, expiry)` means "this prefix is cached".
//!
//! - Automatic mode (OpenAI chat, Responses, Gemini style): the read is the longest stored
//!   prefix of the request (`max C_k` with `H_k` live); afterwards every prefix of the request
//!   is stored, so turn n+1 of a conversation reads all of turn n's prompt. No write tokens are
//!   reported (OpenAI does not bill cache writes). Prefixes below `cache_min_tokens` are ignored.
//! - Explicit mode (Anthropic): only blocks carrying `cache_control` are breakpoints. The read is
//!   the longest stored prefix that ends at or before the last breakpoint; the write is the rest
//!   of the prompt up to that breakpoint (`cache_creation_input_tokens`), and every breakpoint's
//!   prefix is stored with its own TTL (`ttl: "1h"` or the default). A prompt without any
//!   breakpoint is neither read nor written, as with the real API.
//!
//! Every hit refreshes the entry's expiry, like both vendors do. Expired entries are pruned
//! lazily when the map grows.
//!
//! Rejected: "all messages but the last are cached" — it cannot express Anthropic breakpoints or
//! a first turn that writes the cache, and field case 16 needs exact read/write splits.

use std::collections::HashMap;
use std::time::Duration;

use tokio::time::Instant;

use crate::tokens::{Segment, fnv1a};

/// Token split of one prompt.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub(crate) struct CacheUsage {
    /// Whole prompt, cached or not.
    pub(crate) total: u64,
    /// Tokens read from cache.
    pub(crate) read: u64,
    /// Tokens written to cache (explicit mode only).
    pub(crate) written: u64,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum CacheMode {
    Automatic,
    Explicit,
}

#[derive(Debug, Default)]
pub(crate) struct PromptCache {
    entries: HashMap<u64, (u64, Instant)>,
}

const PRUNE_AT: usize = 100_000;

impl PromptCache {
    pub(crate) fn clear(&mut self) {
        self.entries.clear();
    }

    /// Accounts one prompt at `now` and updates the cache.
    pub(crate) fn account(
        &mut self,
        model: &str,
        segments: &[Segment],
        mode: CacheMode,
        default_ttl: Duration,
        min_tokens: u64,
        now: Instant,
    ) -> CacheUsage {
        let mut h = fnv1a(model.as_bytes(), 0x5eed);
        let mut cum = 0_u64;
        let prefixes: Vec<(u64, u64)> = segments
            .iter()
            .map(|s| {
                h = fnv1a(&s.hash.to_le_bytes(), h);
                cum += s.tokens;
                (h, cum)
            })
            .collect();
        let total = cum;
        let limit = match mode {
            CacheMode::Automatic => prefixes.len(),
            CacheMode::Explicit => match segments.iter().rposition(|s| s.breakpoint.is_some()) {
                Some(i) => i + 1,
                None => {
                    return CacheUsage {
                        total,
                        read: 0,
                        written: 0,
                    };
                }
            },
        };
        let mut read = 0;
        for (i, (hash, tokens)) in prefixes.iter().enumerate().take(limit).rev() {
            if *tokens < min_tokens && mode == CacheMode::Automatic {
                break;
            }
            if let Some((_, expiry)) = self.entries.get_mut(hash)
                && *expiry > now
            {
                let ttl = match mode {
                    CacheMode::Automatic => default_ttl,
                    CacheMode::Explicit => segments[i].breakpoint.flatten().unwrap_or(default_ttl),
                };
                *expiry = (*expiry).max(now + ttl);
                read = *tokens;
                break;
            }
        }
        if self.entries.len() > PRUNE_AT {
            self.entries.retain(|_, (_, e)| *e > now);
        }
        let written = match mode {
            CacheMode::Automatic => {
                for (hash, tokens) in &prefixes {
                    if *tokens >= min_tokens.max(1) {
                        self.store(*hash, *tokens, now + default_ttl);
                    }
                }
                0
            }
            CacheMode::Explicit => {
                for (seg, (hash, tokens)) in segments.iter().zip(&prefixes) {
                    if let Some(ttl) = seg.breakpoint {
                        self.store(*hash, *tokens, now + ttl.unwrap_or(default_ttl));
                    }
                }
                prefixes[limit - 1].1.saturating_sub(read)
            }
        };
        CacheUsage {
            total,
            read,
            written,
        }
    }

    fn store(&mut self, hash: u64, tokens: u64, expiry: Instant) {
        let e = self.entries.entry(hash).or_insert((tokens, expiry));
        e.1 = e.1.max(expiry);
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::tokens::{anthropic_segments, openai_chat_segments};
    use serde_json::json;

    const TTL: Duration = Duration::from_secs(300);

    #[test]
    fn automatic_second_turn_reads_first_prompt() {
        let mut c = PromptCache::default();
        let now = Instant::now();
        let t1 = json!({"messages": [{"role": "system", "content": "a b c d"},
            {"role": "user", "content": "e f"}]});
        let t2 = json!({"messages": [{"role": "system", "content": "a b c d"},
            {"role": "user", "content": "e f"}, {"role": "assistant", "content": "g"},
            {"role": "user", "content": "h i j"}]});
        let m = CacheMode::Automatic;
        let u1 = c.account("m", &openai_chat_segments(&t1), m, TTL, 0, now);
        assert_eq!(
            u1,
            CacheUsage {
                total: 6,
                read: 0,
                written: 0
            }
        );
        let u2 = c.account("m", &openai_chat_segments(&t2), m, TTL, 0, now);
        assert_eq!(
            u2,
            CacheUsage {
                total: 10,
                read: 6,
                written: 0
            }
        );
        // Another model does not share the cache; expiry ends the hit.
        assert_eq!(
            c.account("x", &openai_chat_segments(&t1), m, TTL, 0, now)
                .read,
            0
        );
        let later = now + TTL + Duration::from_secs(301);
        assert_eq!(
            c.account("m", &openai_chat_segments(&t2), m, TTL, 0, later)
                .read,
            0
        );
    }

    #[test]
    fn explicit_breakpoint_writes_then_reads_prefix_only() {
        let mut c = PromptCache::default();
        let now = Instant::now();
        let req = |tail: &str| {
            json!({"system": [{"type": "text", "text": "s s s s s",
                "cache_control": {"type": "ephemeral"}}],
                "messages": [{"role": "user", "content": tail}]})
        };
        let m = CacheMode::Explicit;
        let u1 = c.account("m", &anthropic_segments(&req("q q")), m, TTL, 0, now);
        assert_eq!(
            u1,
            CacheUsage {
                total: 7,
                read: 0,
                written: 5
            }
        );
        let u2 = c.account("m", &anthropic_segments(&req("r r r")), m, TTL, 0, now);
        assert_eq!(
            u2,
            CacheUsage {
                total: 8,
                read: 5,
                written: 0
            }
        );
        let none = json!({"messages": [{"role": "user", "content": "q q"}]});
        assert_eq!(
            c.account("m", &anthropic_segments(&none), m, TTL, 0, now),
            CacheUsage {
                total: 2,
                read: 0,
                written: 0
            }
        );
    }
}
