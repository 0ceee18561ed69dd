//! Stream classification: is an upstream SSE item real content, preamble, an end marker or an
//! in-stream error?
//!
//! The dispatcher holds everything up to the first [`StreamClass::Content`] item (or a
//! successful [`StreamClass::Finish`]) in a buffer instead of sending it, so a stream that
//! fails before any content (field case 18: `message_start`, `ping`, then `event: error`
//! `overloaded_error`) or never produces any (case 21b: keep-alives and a role-only delta
//! forever) can fail over to the next provider without the client seeing two preambles.
//!
//! Rules:
//! - OpenAI: a chunk with a non-empty `delta.content`, any `delta.tool_calls`, or a non-empty
//!   `refusal`/`reasoning_content` is content; a role-only or empty delta is preamble; a chunk
//!   with a `finish_reason` and nothing else is a finish; the usage-only chunk is
//!   [`StreamClass::UsageOnly`]; `[DONE]` is a finish; a payload with an `error` member (or an
//!   event named `error`) is an error.
//! - Anthropic: `content_block_delta` is content, as is a `content_block_start` that already
//!   carries text or opens a `tool_use` block; `message_start`, `ping` and an empty text or
//!   thinking start are preamble; `content_block_stop`, `message_delta` and `message_stop` are
//!   finish markers; `error` is an error.
//! - Comments (`: keep-alive`) are preamble in both dialects; they prove liveness, not progress.

use serde_json::Value;

use super::sse::{SseEvent, SseItem};
use super::{Dialect, anthropic, openai};

/// Class of one upstream stream item.
#[derive(Clone, Debug, PartialEq)]
pub enum StreamClass {
    /// Not content: hold until content arrives (or drop on failover).
    Preamble,
    /// Real content: the first such item commits the stream to this provider.
    Content,
    /// OpenAI usage-only chunk (empty `choices`); forward only if the client asked for it.
    UsageOnly,
    /// A success marker (finish reason, `message_delta`, `message_stop`, `[DONE]`, block stop).
    Finish,
    /// An in-stream error; the JSON payload, for error classification.
    Error(Value),
    /// A data payload that does not parse as the dialect's event: a provider fault.
    Malformed,
    /// An unterminated event at end of input: the stream was cut (field case 19b).
    Incomplete,
}

/// Classifies one item of an upstream stream in `dialect`.
pub fn classify(dialect: Dialect, item: &SseItem) -> StreamClass {
    match item {
        SseItem::Comment(_) => StreamClass::Preamble,
        SseItem::Incomplete(_) => StreamClass::Incomplete,
        SseItem::Event(ev) => match dialect {
            Dialect::OpenAi => classify_openai(ev),
            Dialect::Anthropic => classify_anthropic(ev),
        },
    }
}

/// Classifies one OpenAI stream event.
pub fn classify_openai(ev: &SseEvent) -> StreamClass {
    let data = ev.data.trim();
    if data == "[DONE]" {
        return StreamClass::Finish;
    }
    // Fast path: the borrowed scan (only the members classification reads) succeeds for every
    // normal chunk; only the rare error or malformed payload pays for a second, untyped parse.
    let chunk = match serde_json::from_str::<openai::ChunkScan<'_>>(data) {
        Ok(chunk) if ev.event.as_deref() != Some("error") && chunk.error.is_none() => chunk,
        _ => {
            return match serde_json::from_str::<Value>(data) {
                Ok(value)
                    if ev.event.as_deref() == Some("error")
                        || value.get("error").is_some_and(|e| !e.is_null()) =>
                {
                    StreamClass::Error(value)
                }
                _ => StreamClass::Malformed,
            };
        }
    };
    if chunk.is_usage_only() {
        return StreamClass::UsageOnly;
    }
    let mut finished = false;
    for choice in &chunk.choices {
        if choice.delta.has_content() {
            return StreamClass::Content;
        }
        finished |= choice.finish_reason.is_some();
    }
    if finished {
        StreamClass::Finish
    } else {
        StreamClass::Preamble
    }
}

/// Classifies one Anthropic stream event (by its JSON `type`; the SSE `event:` name is only
/// used to recognise an `error` whose body does not parse as an event).
pub fn classify_anthropic(ev: &SseEvent) -> StreamClass {
    let data = ev.data.trim();
    let Ok(event) = serde_json::from_str::<anthropic::StreamEvent>(data) else {
        // An error body that is not a well-formed event still counts as an error.
        return match serde_json::from_str::<Value>(data) {
            Ok(value) if ev.event.as_deref() == Some("error") || value.get("error").is_some() => {
                StreamClass::Error(value)
            }
            _ => StreamClass::Malformed,
        };
    };
    use anthropic::StreamEvent as E;
    match event {
        E::Error { error } => {
            StreamClass::Error(serde_json::json!({"type": "error", "error": error}))
        }
        _ if ev.event.as_deref() == Some("error") => {
            serde_json::from_str(data).map_or(StreamClass::Malformed, StreamClass::Error)
        }
        E::MessageStart { .. } | E::Ping | E::Other => StreamClass::Preamble,
        E::ContentBlockStart { content_block, .. } => match content_block {
            anthropic::ContentBlock::Known(anthropic::Block::Text { text, .. })
                if text.is_empty() =>
            {
                StreamClass::Preamble
            }
            anthropic::ContentBlock::Known(anthropic::Block::Thinking { thinking, .. })
                if thinking.is_empty() =>
            {
                StreamClass::Preamble
            }
            _ => StreamClass::Content,
        },
        E::ContentBlockDelta { .. } => StreamClass::Content,
        E::ContentBlockStop { .. } | E::MessageDelta { .. } | E::MessageStop => StreamClass::Finish,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn oa(data: &str) -> StreamClass {
        classify(Dialect::OpenAi, &SseItem::Event(SseEvent::data(data)))
    }

    fn an(name: &str, data: &str) -> StreamClass {
        classify(
            Dialect::Anthropic,
            &SseItem::Event(SseEvent::new(Some(name), data)),
        )
    }

    const HEAD: &str = r#""id":"c1","object":"chat.completion.chunk","created":1,"model":"m""#;

    #[test]
    fn classify_openai_role_only_delta_is_preamble() {
        let data = format!(
            r#"{{{HEAD},"choices":[{{"index":0,"delta":{{"role":"assistant","content":""}},"finish_reason":null}}]}}"#
        );
        assert_eq!(oa(&data), StreamClass::Preamble);
    }

    #[test]
    fn classify_openai_text_delta_is_content() {
        let data = format!(
            r#"{{{HEAD},"choices":[{{"index":0,"delta":{{"content":"Hi"}},"finish_reason":null}}]}}"#
        );
        assert_eq!(oa(&data), StreamClass::Content);
    }

    #[test]
    fn classify_openai_tool_call_delta_is_content() {
        let data = format!(
            r#"{{{HEAD},"choices":[{{"index":0,"delta":{{"tool_calls":[{{"index":0,"function":{{"arguments":"{{"}}}}]}}}}]}}"#
        );
        assert_eq!(oa(&data), StreamClass::Content);
    }

    #[test]
    fn classify_openai_refusal_and_reasoning_are_content_only_when_non_empty() {
        let delta = |d: &str| {
            oa(&format!(
                r#"{{{HEAD},"choices":[{{"index":0,"delta":{d},"finish_reason":null}}]}}"#
            ))
        };
        assert_eq!(delta(r#"{"refusal":"I can't"}"#), StreamClass::Content);
        assert_eq!(
            delta(r#"{"reasoning_content":"Let me"}"#),
            StreamClass::Content
        );
        assert_eq!(
            delta(r#"{"refusal":null,"content":""}"#),
            StreamClass::Preamble
        );
        assert_eq!(delta(r#"{"reasoning_content":""}"#), StreamClass::Preamble);
        // A server that puts something other than a string there has not delivered text.
        assert_eq!(
            delta(r#"{"refusal":{"a":[1,2]},"reasoning_content":7}"#),
            StreamClass::Preamble
        );
        assert_eq!(delta(r#"{"tool_calls":[]}"#), StreamClass::Preamble);
    }

    #[test]
    fn classify_openai_finish_usage_done_and_error() {
        let finish =
            format!(r#"{{{HEAD},"choices":[{{"index":0,"delta":{{}},"finish_reason":"stop"}}]}}"#);
        assert_eq!(oa(&finish), StreamClass::Finish);
        let usage = format!(
            r#"{{{HEAD},"choices":[],"usage":{{"prompt_tokens":1,"completion_tokens":2,"total_tokens":3}}}}"#
        );
        assert_eq!(oa(&usage), StreamClass::UsageOnly);
        assert_eq!(oa("[DONE]"), StreamClass::Finish);
        let err = r#"{"error":{"message":"overloaded","type":"server_error","code":null}}"#;
        assert_eq!(
            oa(err),
            StreamClass::Error(serde_json::from_str(err).unwrap())
        );
        assert_eq!(oa("{not json"), StreamClass::Malformed);
    }

    #[test]
    fn classify_openai_chunk_with_null_error_member_is_content() {
        let data = format!(
            r#"{{{HEAD},"error":null,"choices":[{{"index":0,"delta":{{"content":"Hi"}}}}]}}"#
        );
        assert_eq!(oa(&data), StreamClass::Content);
    }

    #[test]
    fn classify_comment_and_incomplete() {
        assert_eq!(
            classify(Dialect::OpenAi, &SseItem::Comment(" keep-alive".into())),
            StreamClass::Preamble
        );
        assert_eq!(
            classify(
                Dialect::Anthropic,
                &SseItem::Incomplete(SseEvent::data("{"))
            ),
            StreamClass::Incomplete
        );
    }

    #[test]
    fn classify_anthropic_preamble_events() {
        let start = r#"{"type":"message_start","message":{"id":"msg_1","type":"message","role":"assistant","model":"m","content":[],"stop_reason":null,"stop_sequence":null,"usage":{"input_tokens":4,"output_tokens":1}}}"#;
        assert_eq!(an("message_start", start), StreamClass::Preamble);
        assert_eq!(an("ping", r#"{"type":"ping"}"#), StreamClass::Preamble);
        let empty =
            r#"{"type":"content_block_start","index":0,"content_block":{"type":"text","text":""}}"#;
        assert_eq!(an("content_block_start", empty), StreamClass::Preamble);
    }

    #[test]
    fn classify_anthropic_content_and_tool_start() {
        let delta =
            r#"{"type":"content_block_delta","index":0,"delta":{"type":"text_delta","text":"Hi"}}"#;
        assert_eq!(an("content_block_delta", delta), StreamClass::Content);
        let tool = r#"{"type":"content_block_start","index":1,"content_block":{"type":"tool_use","id":"toolu_1","name":"f","input":{}}}"#;
        assert_eq!(an("content_block_start", tool), StreamClass::Content);
    }

    #[test]
    fn classify_anthropic_overloaded_error_returns_json() {
        let err = r#"{"type":"error","error":{"type":"overloaded_error","message":"Overloaded"}}"#;
        match an("error", err) {
            StreamClass::Error(v) => assert_eq!(v["error"]["type"], "overloaded_error"),
            other => panic!("expected error, got {other:?}"),
        }
    }

    #[test]
    fn classify_anthropic_end_markers_are_finish() {
        assert_eq!(
            an("message_stop", r#"{"type":"message_stop"}"#),
            StreamClass::Finish
        );
        let md = r#"{"type":"message_delta","delta":{"stop_reason":"end_turn","stop_sequence":null},"usage":{"output_tokens":23}}"#;
        assert_eq!(an("message_delta", md), StreamClass::Finish);
    }
}
