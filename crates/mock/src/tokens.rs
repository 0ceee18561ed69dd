//! Deterministic token counting and prompt segmentation.
//!
//! Counting rule (an approximation, not any vendor's tokenizer): split the text on Unicode
//! whitespace; each word costs `ceil(chars / 4)` tokens, so `"word "` repeated n times is exactly
//! n tokens and a test can build a prompt of a chosen size. Non-text parts (tool definitions,
//! tool calls, images) are counted on their compact JSON serialization with the same rule. There
//! is no per-message overhead. Output tokens are not counted from text: each streamed content
//! delta (`token0`, ` token1`, ...) is one output token by definition.
//!
//! A prompt is flattened into [`Segment`]s in wire order (tools, system, then each message or
//! content block). The prompt cache hashes the chain of segments, so two requests share a cached
//! prefix exactly when their first k segments are equal.

use serde_json::Value;

/// Tokens in `text` under the whitespace / 4-character rule.
pub fn count_tokens(text: &str) -> u64 {
    text.split_whitespace()
        .map(|w| w.chars().count().div_ceil(4) as u64)
        .sum()
}

/// One cache-addressable piece of a prompt.
#[derive(Debug, Clone, PartialEq)]
pub(crate) struct Segment {
    /// Stable content hash (role + text).
    pub(crate) hash: u64,
    /// Tokens in this segment.
    pub(crate) tokens: u64,
    /// Anthropic `cache_control` breakpoint on this block, with its TTL if given.
    pub(crate) breakpoint: Option<Option<std::time::Duration>>,
}

/// 64-bit FNV-1a: stable across Rust versions and platforms, unlike `DefaultHasher`.
pub(crate) fn fnv1a(bytes: &[u8], seed: u64) -> u64 {
    let mut h = 0xcbf2_9ce4_8422_2325_u64 ^ seed;
    for b in bytes {
        h ^= u64::from(*b);
        h = h.wrapping_mul(0x0100_0000_01b3);
    }
    h
}

pub(crate) fn segment(
    role: &str,
    text: &str,
    tokens: u64,
    cache_control: Option<&Value>,
) -> Segment {
    let mut bytes = Vec::with_capacity(role.len() + 1 + text.len());
    bytes.extend_from_slice(role.as_bytes());
    bytes.push(0);
    bytes.extend_from_slice(text.as_bytes());
    let breakpoint = cache_control.filter(|c| !c.is_null()).map(|c| {
        c.get("ttl")
            .and_then(Value::as_str)
            .and_then(|t| humantime::parse_duration(t).ok())
    });
    Segment {
        hash: fnv1a(&bytes, 0),
        tokens,
        breakpoint,
    }
}

pub(crate) fn text_segment(role: &str, text: &str, cache_control: Option<&Value>) -> Segment {
    segment(role, text, count_tokens(text), cache_control)
}

pub(crate) fn json_segment(role: &str, value: &Value) -> Segment {
    let text = value.to_string();
    text_segment(role, &text, value.get("cache_control"))
}

/// Text of an OpenAI message `content` (string or array of parts).
pub(crate) fn openai_content_text(content: &Value) -> String {
    match content {
        Value::String(s) => s.clone(),
        Value::Array(parts) => parts
            .iter()
            .map(|p| match p.get("text").and_then(Value::as_str) {
                Some(t) => t.to_owned(),
                None => p.to_string(),
            })
            .collect::<Vec<_>>()
            .join(" "),
        Value::Null => String::new(),
        other => other.to_string(),
    }
}

/// Segments of an OpenAI chat request: each tool, then each message (content plus tool calls).
pub(crate) fn openai_chat_segments(body: &Value) -> Vec<Segment> {
    let mut out = Vec::new();
    for tool in body
        .get("tools")
        .and_then(Value::as_array)
        .into_iter()
        .flatten()
    {
        out.push(json_segment("tool_def", tool));
    }
    for msg in body
        .get("messages")
        .and_then(Value::as_array)
        .into_iter()
        .flatten()
    {
        let role = msg.get("role").and_then(Value::as_str).unwrap_or("user");
        let mut text = msg
            .get("content")
            .map(openai_content_text)
            .unwrap_or_default();
        if let Some(calls) = msg.get("tool_calls") {
            text.push(' ');
            text.push_str(&calls.to_string());
        }
        out.push(text_segment(role, &text, None));
    }
    out
}

/// Segments of an OpenAI Responses request: `instructions`, then each `input` item.
pub(crate) fn responses_segments(body: &Value) -> Vec<Segment> {
    let mut out = Vec::new();
    for tool in body
        .get("tools")
        .and_then(Value::as_array)
        .into_iter()
        .flatten()
    {
        out.push(json_segment("tool_def", tool));
    }
    if let Some(instr) = body.get("instructions").and_then(Value::as_str) {
        out.push(text_segment("system", instr, None));
    }
    match body.get("input") {
        Some(Value::String(s)) => out.push(text_segment("user", s, None)),
        Some(Value::Array(items)) => {
            for item in items {
                let role = item.get("role").and_then(Value::as_str).unwrap_or("item");
                let text = item
                    .get("content")
                    .map(openai_content_text)
                    .unwrap_or_else(|| {
                        item.get("output")
                            .map(Value::to_string)
                            .unwrap_or_else(|| item.to_string())
                    });
                out.push(text_segment(role, &text, None));
            }
        }
        _ => {}
    }
    out
}

/// Segments of an Anthropic messages request: each tool, each system block, then each content
/// block of each message, carrying `cache_control` breakpoints.
pub(crate) fn anthropic_segments(body: &Value) -> Vec<Segment> {
    let mut out = Vec::new();
    for tool in body
        .get("tools")
        .and_then(Value::as_array)
        .into_iter()
        .flatten()
    {
        out.push(json_segment("tool_def", tool));
    }
    match body.get("system") {
        Some(Value::String(s)) => out.push(text_segment("system", s, None)),
        Some(Value::Array(blocks)) => out.extend(blocks.iter().map(|b| block("system", b))),
        _ => {}
    }
    for msg in body
        .get("messages")
        .and_then(Value::as_array)
        .into_iter()
        .flatten()
    {
        let role = msg.get("role").and_then(Value::as_str).unwrap_or("user");
        match msg.get("content") {
            Some(Value::String(s)) => out.push(text_segment(role, s, None)),
            Some(Value::Array(blocks)) => out.extend(blocks.iter().map(|b| block(role, b))),
            _ => {}
        }
    }
    out
}

fn block(role: &str, b: &Value) -> Segment {
    let cc = b.get("cache_control");
    match b.get("type").and_then(Value::as_str) {
        Some("text") => text_segment(
            role,
            b.get("text").and_then(Value::as_str).unwrap_or(""),
            cc,
        ),
        Some("tool_result") => {
            let text = b
                .get("content")
                .map(openai_content_text)
                .unwrap_or_default();
            text_segment(role, &text, cc)
        }
        _ => {
            // Hash and count the block without its marker, so moving a breakpoint does not
            // change the cached content.
            let mut bare = b.clone();
            if let Some(obj) = bare.as_object_mut() {
                obj.remove("cache_control");
            }
            let text = bare.to_string();
            segment(role, &text, count_tokens(&text), cc)
        }
    }
}

/// Texts to embed or rank: a string, an array of strings, or arrays of token ids.
pub(crate) fn input_texts(input: Option<&Value>) -> Vec<String> {
    match input {
        Some(Value::String(s)) => vec![s.clone()],
        Some(Value::Array(items)) if items.iter().all(Value::is_number) => {
            vec![
                items
                    .iter()
                    .map(Value::to_string)
                    .collect::<Vec<_>>()
                    .join(" "),
            ]
        }
        Some(Value::Array(items)) => items
            .iter()
            .map(|i| match i {
                Value::String(s) => s.clone(),
                Value::Object(_) => i
                    .get("text")
                    .and_then(Value::as_str)
                    .map_or_else(|| i.to_string(), str::to_owned),
                Value::Array(ids) => ids
                    .iter()
                    .map(Value::to_string)
                    .collect::<Vec<_>>()
                    .join(" "),
                other => other.to_string(),
            })
            .collect(),
        _ => Vec::new(),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    #[test]
    fn count_tokens_short_words_one_each_long_words_by_four_chars() {
        assert_eq!(count_tokens("word word word"), 3);
        assert_eq!(count_tokens("  abcdefghi\nxy "), 4);
        assert_eq!(count_tokens(""), 0);
    }

    #[test]
    fn anthropic_segments_breakpoint_ttl_read_and_marker_ignored_in_hash() {
        let with = json!({"messages": [{"role": "user", "content": [
            {"type": "text", "text": "a b", "cache_control": {"type": "ephemeral", "ttl": "1h"}}]}]});
        let without = json!({"messages": [{"role": "user", "content": [
            {"type": "text", "text": "a b"}]}]});
        let a = anthropic_segments(&with);
        let b = anthropic_segments(&without);
        assert_eq!(
            a[0].breakpoint,
            Some(Some(std::time::Duration::from_secs(3600)))
        );
        assert_eq!(b[0].breakpoint, None);
        assert_eq!(a[0].hash, b[0].hash);
        assert_eq!(a[0].tokens, 2);
    }
}
