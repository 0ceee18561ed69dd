//! Bedrock `Converse` / `ConverseStream` ⇄ the Anthropic Messages dialect.
//!
//! Converse is close to Messages, so the mapping is member by member:
//!
//! | Messages | Converse |
//! |---|---|
//! | `system` (string or text blocks) | `system[{text}]` |
//! | `messages[].content` text / image (base64) / `tool_use` / `tool_result` | `{text}` / `{image:{format, source:{bytes}}}` / `{toolUse:{toolUseId, name, input}}` / `{toolResult:{toolUseId, content[{text}\|{json}], status}}` |
//! | `cache_control` on a block or system block | a `{cachePoint:{type:"default"}}` after it |
//! | `tools[]`, `tool_choice` auto / any / tool | `toolConfig.tools[{toolSpec:{name, description, inputSchema:{json}}}]`, `toolChoice` `{auto}` / `{any}` / `{tool:{name}}` |
//! | `max_tokens`, `temperature`, `top_p`, `stop_sequences` | `inferenceConfig.maxTokens`, `temperature`, `topP`, `stopSequences` |
//! | `top_k` | `additionalModelRequestFields.top_k` |
//! | `metadata.user_id` | dropped (Converse has no such member; it identifies nobody upstream) |
//!
//! Refused with an error naming the member (never silently dropped): anything else at the
//! top level (`thinking`, `container`, `mcp_servers`, …), image sources other than base64,
//! `tool_choice: none`, and block types Converse has no form for. Use `bedrockApi: invoke`
//! for Anthropic models to keep every Messages feature.
//!
//! Back: `output.message.content` → content blocks, `stopReason` (`end_turn`, `tool_use`,
//! `max_tokens`, `stop_sequence`; `guardrail_intervened` and `content_filtered` →
//! `refusal`) and `usage` (`inputTokens` — uncached input, like Anthropic's
//! `input_tokens` —, `outputTokens`, `cacheReadInputTokens`, `cacheWriteInputTokens`). The
//! stream's `messageStart`, `contentBlockStart`, `contentBlockDelta`, `contentBlockStop`,
//! `messageStop` and `metadata` events become `message_start`, `content_block_start`
//! (synthesised for text blocks, which Converse does not open), `content_block_delta`,
//! `content_block_stop`, and one `message_delta` (stop reason + the usage from `metadata`)
//! followed by `message_stop`.
//!
//! Source: Amazon Bedrock API reference, `Converse` and `ConverseStream` (runtime).

use std::collections::BTreeSet;

use serde_json::{Map, Value, json};

use super::eventstream::Frame;
use crate::wire::sse::{SseEvent, SseItem};

/// A Messages request member that Converse cannot carry.
#[derive(Debug, thiserror::Error, PartialEq)]
#[error(
    "{0} cannot be sent to Bedrock Converse; remove it, or use bedrockApi: invoke for Anthropic models"
)]
pub struct Untranslatable(pub String);

fn cache_point() -> Value {
    json!({"cachePoint": {"type": "default"}})
}

fn has_cache_control(block: &Value) -> bool {
    block.get("cache_control").is_some_and(|c| !c.is_null())
}

fn image_format(media_type: &str) -> Option<&'static str> {
    match media_type {
        "image/png" => Some("png"),
        "image/jpeg" | "image/jpg" => Some("jpeg"),
        "image/gif" => Some("gif"),
        "image/webp" => Some("webp"),
        _ => None,
    }
}

/// One Messages content block as Converse blocks (a cache point follows a marked block).
fn block(b: &Value, out: &mut Vec<Value>) -> Result<(), Untranslatable> {
    let kind = b.get("type").and_then(Value::as_str).unwrap_or("");
    let converted = match kind {
        "text" => json!({"text": b.get("text").cloned().unwrap_or(Value::String(String::new()))}),
        "image" => {
            let source = b.get("source").cloned().unwrap_or(Value::Null);
            if source.get("type").and_then(Value::as_str) != Some("base64") {
                return Err(Untranslatable("an image source other than base64".into()));
            }
            let media = source
                .get("media_type")
                .and_then(Value::as_str)
                .unwrap_or("");
            let format = image_format(media)
                .ok_or_else(|| Untranslatable(format!("image media_type {media:?}")))?;
            json!({"image": {"format": format, "source": {"bytes": source.get("data").cloned().unwrap_or(Value::Null)}}})
        }
        "tool_use" => json!({"toolUse": {
            "toolUseId": b.get("id").cloned().unwrap_or(Value::Null),
            "name": b.get("name").cloned().unwrap_or(Value::Null),
            "input": b.get("input").cloned().unwrap_or_else(|| json!({})),
        }}),
        "tool_result" => {
            let content = match b.get("content") {
                None | Some(Value::Null) => vec![],
                Some(Value::String(s)) => vec![json!({"text": s})],
                Some(Value::Array(parts)) => {
                    let mut v = Vec::new();
                    for p in parts {
                        match p.get("type").and_then(Value::as_str) {
                            Some("text") => v.push(
                                json!({"text": p.get("text").cloned().unwrap_or(Value::Null)}),
                            ),
                            Some("image") => block(p, &mut v)?,
                            other => {
                                return Err(Untranslatable(format!(
                                    "a tool_result part of type {other:?}"
                                )));
                            }
                        }
                    }
                    v
                }
                Some(other) => vec![json!({"json": other})],
            };
            let status = if b.get("is_error").and_then(Value::as_bool) == Some(true) {
                "error"
            } else {
                "success"
            };
            json!({"toolResult": {
                "toolUseId": b.get("tool_use_id").cloned().unwrap_or(Value::Null),
                "content": content,
                "status": status,
            }})
        }
        other => return Err(Untranslatable(format!("a content block of type {other:?}"))),
    };
    out.push(converted);
    if has_cache_control(b) {
        out.push(cache_point());
    }
    Ok(())
}

fn blocks(content: &Value) -> Result<Vec<Value>, Untranslatable> {
    let mut out = Vec::new();
    match content {
        Value::String(s) => out.push(json!({"text": s})),
        Value::Array(items) => {
            for b in items {
                block(b, &mut out)?;
            }
        }
        _ => {
            return Err(Untranslatable(
                "message content that is neither text nor blocks".into(),
            ));
        }
    }
    Ok(out)
}

/// Members of a Messages request that are translated (or knowingly dropped).
const KNOWN: [&str; 12] = [
    "model",
    "messages",
    "system",
    "max_tokens",
    "temperature",
    "top_p",
    "top_k",
    "stop_sequences",
    "stream",
    "tools",
    "tool_choice",
    "metadata",
];

/// A Messages request (JSON) as a Converse request body.
///
/// Errors: [`Untranslatable`] naming the first member or block Converse cannot carry.
pub fn encode_request(m: &Value) -> Result<Value, Untranslatable> {
    let obj = m
        .as_object()
        .ok_or_else(|| Untranslatable("a request that is not a JSON object".into()))?;
    let known: BTreeSet<&str> = KNOWN.into_iter().collect();
    if let Some(extra) = obj.keys().find(|k| !known.contains(k.as_str())) {
        return Err(Untranslatable(format!("member {extra:?}")));
    }
    let mut out = Map::new();
    let mut messages = Vec::new();
    for msg in obj
        .get("messages")
        .and_then(Value::as_array)
        .into_iter()
        .flatten()
    {
        let role = msg.get("role").and_then(Value::as_str).unwrap_or("user");
        messages.push(json!({
            "role": role,
            "content": blocks(msg.get("content").unwrap_or(&Value::Null))?,
        }));
    }
    out.insert("messages".into(), Value::Array(messages));
    match obj.get("system") {
        None | Some(Value::Null) => {}
        Some(Value::String(s)) => {
            out.insert("system".into(), json!([{"text": s}]));
        }
        Some(Value::Array(items)) => {
            let mut sys = Vec::new();
            for b in items {
                sys.push(json!({"text": b.get("text").cloned().unwrap_or(Value::Null)}));
                if has_cache_control(b) {
                    sys.push(cache_point());
                }
            }
            out.insert("system".into(), Value::Array(sys));
        }
        Some(_) => return Err(Untranslatable("a system prompt of another shape".into())),
    }
    let mut inference = Map::new();
    for (from, to) in [
        ("max_tokens", "maxTokens"),
        ("temperature", "temperature"),
        ("top_p", "topP"),
        ("stop_sequences", "stopSequences"),
    ] {
        if let Some(v) = obj.get(from).filter(|v| !v.is_null()) {
            inference.insert(to.into(), v.clone());
        }
    }
    if !inference.is_empty() {
        out.insert("inferenceConfig".into(), Value::Object(inference));
    }
    if let Some(k) = obj.get("top_k").filter(|v| !v.is_null()) {
        out.insert("additionalModelRequestFields".into(), json!({"top_k": k}));
    }
    if let Some(tools) = obj.get("tools").and_then(Value::as_array) {
        let mut specs = Vec::new();
        for t in tools {
            if t.get("type")
                .and_then(Value::as_str)
                .is_some_and(|ty| ty != "custom")
            {
                return Err(Untranslatable(format!(
                    "server tool {:?}",
                    t.get("type").and_then(Value::as_str).unwrap_or("")
                )));
            }
            let mut spec = Map::new();
            spec.insert("name".into(), t.get("name").cloned().unwrap_or(Value::Null));
            if let Some(d) = t.get("description") {
                spec.insert("description".into(), d.clone());
            }
            spec.insert(
                "inputSchema".into(),
                json!({"json": t.get("input_schema").cloned().unwrap_or_else(|| json!({"type": "object"}))}),
            );
            specs.push(json!({"toolSpec": spec}));
            if has_cache_control(t) {
                specs.push(cache_point());
            }
        }
        let mut config = Map::new();
        config.insert("tools".into(), Value::Array(specs));
        if let Some(choice) = obj.get("tool_choice").filter(|v| !v.is_null()) {
            let c = match choice.get("type").and_then(Value::as_str) {
                Some("auto") => json!({"auto": {}}),
                Some("any") => json!({"any": {}}),
                Some("tool") => {
                    json!({"tool": {"name": choice.get("name").cloned().unwrap_or(Value::Null)}})
                }
                other => return Err(Untranslatable(format!("tool_choice {other:?}"))),
            };
            config.insert("toolChoice".into(), c);
        }
        out.insert("toolConfig".into(), Value::Object(config));
    } else if obj.get("tool_choice").is_some_and(|v| !v.is_null()) {
        return Err(Untranslatable("tool_choice without tools".into()));
    }
    Ok(Value::Object(out))
}

/// Converse `stopReason` → Anthropic `stop_reason`.
pub fn stop_reason(r: &str) -> &'static str {
    match r {
        "tool_use" => "tool_use",
        "max_tokens" | "model_context_window_exceeded" => "max_tokens",
        "stop_sequence" => "stop_sequence",
        "guardrail_intervened" | "content_filtered" => "refusal",
        _ => "end_turn",
    }
}

/// Converse `usage` → Anthropic `usage`.
pub fn usage(u: &Value) -> Value {
    let n = |k: &str| u.get(k).and_then(Value::as_u64).unwrap_or(0);
    json!({
        "input_tokens": n("inputTokens"),
        "output_tokens": n("outputTokens"),
        "cache_read_input_tokens": n("cacheReadInputTokens"),
        "cache_creation_input_tokens": n("cacheWriteInputTokens"),
    })
}

fn content_block(b: &Value) -> Option<Value> {
    if let Some(t) = b.get("text") {
        return Some(json!({"type": "text", "text": t}));
    }
    if let Some(t) = b.get("toolUse") {
        return Some(
            json!({"type": "tool_use", "id": t.get("toolUseId"), "name": t.get("name"), "input": t.get("input").cloned().unwrap_or_else(|| json!({}))}),
        );
    }
    if let Some(r) = b.get("reasoningContent") {
        let text = r
            .pointer("/reasoningText/text")
            .cloned()
            .unwrap_or(Value::String(String::new()));
        let sig = r
            .pointer("/reasoningText/signature")
            .cloned()
            .unwrap_or(Value::String(String::new()));
        return Some(json!({"type": "thinking", "thinking": text, "signature": sig}));
    }
    None
}

/// A Converse response body as an Anthropic message response (JSON).
///
/// Errors: a message when the body does not parse or has no `output.message`.
pub fn decode_response(body: &[u8], model: &str, id: &str) -> Result<Value, String> {
    let v: Value = serde_json::from_slice(body)
        .map_err(|e| format!("Converse response does not parse: {e}"))?;
    let message = v
        .pointer("/output/message")
        .ok_or("Converse response has no output.message")?;
    let content: Vec<Value> = message
        .get("content")
        .and_then(Value::as_array)
        .into_iter()
        .flatten()
        .filter_map(content_block)
        .collect();
    Ok(json!({
        "id": id,
        "type": "message",
        "role": "assistant",
        "model": model,
        "content": content,
        "stop_reason": stop_reason(v.get("stopReason").and_then(Value::as_str).unwrap_or("")),
        "stop_sequence": null,
        "usage": usage(v.get("usage").unwrap_or(&Value::Null)),
    }))
}

fn event(kind: &str, data: Value) -> SseItem {
    SseItem::Event(SseEvent::new(Some(kind), data.to_string()))
}

/// An Anthropic `error` event for an exception frame: `error.type` is the exception's name,
/// which core's classifier maps (`throttlingException` → capacity, …).
pub fn exception_event(kind: &str, payload: &[u8]) -> SseItem {
    let message = serde_json::from_slice::<Value>(payload)
        .ok()
        .and_then(|v| v.get("message").or_else(|| v.get("Message")).cloned())
        .unwrap_or_else(|| Value::String(String::from_utf8_lossy(payload).into_owned()));
    event(
        "error",
        json!({"type": "error", "error": {"type": kind, "message": message}}),
    )
}

/// ConverseStream events → Anthropic stream events.
#[derive(Debug)]
pub struct ConverseStream {
    model: String,
    id: String,
    /// Indices of content blocks opened so far.
    open: BTreeSet<u64>,
    stop: Option<String>,
    done: bool,
}

impl ConverseStream {
    /// A translator for one stream of `model`; `id` becomes the message id.
    pub fn new(model: &str, id: String) -> Self {
        ConverseStream {
            model: model.to_owned(),
            id,
            open: BTreeSet::new(),
            stop: None,
            done: false,
        }
    }

    /// Whether `message_stop` has been emitted.
    pub fn is_done(&self) -> bool {
        self.done
    }

    /// Translates one frame.
    pub fn frame(&mut self, f: &Frame) -> Vec<SseItem> {
        let (kind, payload) = match f {
            Frame::Event { kind, payload } => (kind.as_str(), payload),
            Frame::Exception { kind, payload } => return vec![exception_event(kind, payload)],
            Frame::Invalid(why) => {
                return vec![exception_event(
                    "invalidStreamFrame",
                    json!({"message": why}).to_string().as_bytes(),
                )];
            }
        };
        let Ok(v) = serde_json::from_slice::<Value>(payload) else {
            return vec![exception_event(
                "invalidStreamFrame",
                br#"{"message":"event payload is not JSON"}"#,
            )];
        };
        let index = v
            .get("contentBlockIndex")
            .and_then(Value::as_u64)
            .unwrap_or(0);
        let mut out = Vec::new();
        match kind {
            "messageStart" => out.push(event(
                "message_start",
                json!({"type": "message_start", "message": {
                    "id": self.id, "type": "message", "role": "assistant", "model": self.model,
                    "content": [], "stop_reason": null, "stop_sequence": null,
                    "usage": {"input_tokens": 0, "output_tokens": 0}}}),
            )),
            "contentBlockStart" => {
                let start = v.get("start").cloned().unwrap_or(Value::Null);
                let block = if let Some(t) = start.get("toolUse") {
                    json!({"type": "tool_use", "id": t.get("toolUseId"), "name": t.get("name"), "input": {}})
                } else {
                    json!({"type": "text", "text": ""})
                };
                self.open.insert(index);
                out.push(event(
                    "content_block_start",
                    json!({"type": "content_block_start", "index": index, "content_block": block}),
                ));
            }
            "contentBlockDelta" => {
                let delta = v.get("delta").cloned().unwrap_or(Value::Null);
                if !self.open.contains(&index) {
                    let block = if delta.get("reasoningContent").is_some() {
                        json!({"type": "thinking", "thinking": "", "signature": ""})
                    } else {
                        json!({"type": "text", "text": ""})
                    };
                    self.open.insert(index);
                    out.push(event(
                        "content_block_start",
                        json!({"type": "content_block_start", "index": index, "content_block": block}),
                    ));
                }
                let d = if let Some(t) = delta.get("text") {
                    json!({"type": "text_delta", "text": t})
                } else if let Some(t) = delta.pointer("/toolUse/input") {
                    json!({"type": "input_json_delta", "partial_json": t})
                } else if let Some(t) = delta.pointer("/reasoningContent/text") {
                    json!({"type": "thinking_delta", "thinking": t})
                } else if let Some(t) = delta.pointer("/reasoningContent/signature") {
                    json!({"type": "signature_delta", "signature": t})
                } else {
                    return out;
                };
                out.push(event(
                    "content_block_delta",
                    json!({"type": "content_block_delta", "index": index, "delta": d}),
                ));
            }
            "contentBlockStop" => {
                self.open.remove(&index);
                out.push(event(
                    "content_block_stop",
                    json!({"type": "content_block_stop", "index": index}),
                ));
            }
            "messageStop" => {
                self.stop = Some(
                    stop_reason(v.get("stopReason").and_then(Value::as_str).unwrap_or(""))
                        .to_owned(),
                );
            }
            "metadata" => {
                out.extend(self.end(Some(usage(v.get("usage").unwrap_or(&Value::Null)))));
            }
            _ => {}
        }
        out
    }

    /// The closing events, once: `message_delta` with the stop reason and `usage` (when
    /// known), then `message_stop`. Nothing before `messageStop` was seen.
    pub fn end(&mut self, usage: Option<Value>) -> Vec<SseItem> {
        let Some(stop) = self.stop.clone() else {
            return Vec::new();
        };
        if self.done {
            return Vec::new();
        }
        self.done = true;
        let mut delta =
            json!({"type": "message_delta", "delta": {"stop_reason": stop, "stop_sequence": null}});
        if let Some(u) = usage {
            delta["usage"] = u;
        }
        vec![
            event("message_delta", delta),
            event("message_stop", json!({"type": "message_stop"})),
        ]
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use bytes::Bytes;

    #[test]
    fn encode_request_maps_blocks_tools_and_cache_points() {
        let m = json!({
            "model": "x", "max_tokens": 100, "temperature": 0.5, "top_k": 5,
            "stop_sequences": ["END"], "stream": true,
            "system": [{"type": "text", "text": "be brief", "cache_control": {"type": "ephemeral"}}],
            "tools": [{"name": "get_weather", "description": "w", "input_schema": {"type": "object"}}],
            "tool_choice": {"type": "tool", "name": "get_weather"},
            "messages": [
                {"role": "user", "content": [
                    {"type": "text", "text": "hi"},
                    {"type": "image", "source": {"type": "base64", "media_type": "image/png", "data": "AAAA"}}]},
                {"role": "assistant", "content": [{"type": "tool_use", "id": "t1", "name": "get_weather", "input": {"city": "Oslo"}}]},
                {"role": "user", "content": [{"type": "tool_result", "tool_use_id": "t1", "content": "rain", "is_error": false}]}
            ]
        });
        let c = encode_request(&m).unwrap();
        assert_eq!(
            c["system"],
            json!([{"text": "be brief"}, {"cachePoint": {"type": "default"}}])
        );
        assert_eq!(
            c["inferenceConfig"],
            json!({"maxTokens": 100, "temperature": 0.5, "stopSequences": ["END"]})
        );
        assert_eq!(c["additionalModelRequestFields"], json!({"top_k": 5}));
        assert_eq!(
            c["messages"][0]["content"][1],
            json!({"image": {"format": "png", "source": {"bytes": "AAAA"}}})
        );
        assert_eq!(
            c["messages"][1]["content"][0]["toolUse"]["input"],
            json!({"city": "Oslo"})
        );
        assert_eq!(
            c["messages"][2]["content"][0]["toolResult"],
            json!({"toolUseId": "t1", "content": [{"text": "rain"}], "status": "success"})
        );
        assert_eq!(
            c["toolConfig"]["toolChoice"],
            json!({"tool": {"name": "get_weather"}})
        );
        assert_eq!(
            c["toolConfig"]["tools"][0]["toolSpec"]["inputSchema"],
            json!({"json": {"type": "object"}})
        );
        assert!(c.get("model").is_none() && c.get("stream").is_none());
    }

    #[test]
    fn encode_request_refuses_what_converse_cannot_carry() {
        let e = encode_request(&json!({"model": "x", "max_tokens": 1, "messages": [], "thinking": {"type": "enabled"}})).unwrap_err();
        assert!(e.to_string().contains("\"thinking\""), "{e}");
        let e = encode_request(
            &json!({"model": "x", "max_tokens": 1, "messages": [{"role": "user", "content": [
            {"type": "image", "source": {"type": "url", "url": "https://x"}}]}]}),
        )
        .unwrap_err();
        assert!(e.to_string().contains("base64"), "{e}");
    }

    #[test]
    fn decode_response_maps_content_stop_and_usage() {
        let body = json!({
            "output": {"message": {"role": "assistant", "content": [
                {"text": "hello"}, {"toolUse": {"toolUseId": "t9", "name": "f", "input": {"a": 1}}}]}},
            "stopReason": "tool_use",
            "usage": {"inputTokens": 12, "outputTokens": 7, "totalTokens": 19, "cacheReadInputTokens": 100, "cacheWriteInputTokens": 5},
            "metrics": {"latencyMs": 40}
        });
        let r = decode_response(body.to_string().as_bytes(), "m", "msg_1").unwrap();
        assert_eq!(r["content"][0], json!({"type": "text", "text": "hello"}));
        assert_eq!(r["content"][1]["type"], "tool_use");
        assert_eq!(r["stop_reason"], "tool_use");
        assert_eq!(
            r["usage"],
            json!({"input_tokens": 12, "output_tokens": 7, "cache_read_input_tokens": 100, "cache_creation_input_tokens": 5})
        );
        let parsed: crate::wire::anthropic::MessagesResponse = serde_json::from_value(r).unwrap();
        assert_eq!(parsed.usage.output_tokens, Some(7));
    }

    fn ev(kind: &str, v: Value) -> Frame {
        Frame::Event {
            kind: kind.into(),
            payload: Bytes::from(v.to_string()),
        }
    }

    #[test]
    fn stream_events_become_anthropic_events_with_final_usage() {
        let mut s = ConverseStream::new("m", "msg_1".into());
        let mut out = Vec::new();
        for f in [
            ev("messageStart", json!({"role": "assistant"})),
            ev(
                "contentBlockDelta",
                json!({"contentBlockIndex": 0, "delta": {"text": "hel"}}),
            ),
            ev(
                "contentBlockDelta",
                json!({"contentBlockIndex": 0, "delta": {"text": "lo"}}),
            ),
            ev("contentBlockStop", json!({"contentBlockIndex": 0})),
            ev("messageStop", json!({"stopReason": "end_turn"})),
            ev(
                "metadata",
                json!({"usage": {"inputTokens": 3, "outputTokens": 2, "cacheReadInputTokens": 10}, "metrics": {"latencyMs": 5}}),
            ),
        ] {
            out.extend(s.frame(&f));
        }
        let kinds: Vec<String> = out
            .iter()
            .map(|i| match i {
                SseItem::Event(e) => e.event.clone().unwrap_or_default(),
                _ => String::new(),
            })
            .collect();
        assert_eq!(
            kinds,
            [
                "message_start",
                "content_block_start",
                "content_block_delta",
                "content_block_delta",
                "content_block_stop",
                "message_delta",
                "message_stop"
            ]
        );
        let mut usage = crate::wire::usage::StreamUsage::new();
        for i in &out {
            if let SseItem::Event(e) = i {
                let parsed: crate::wire::anthropic::StreamEvent =
                    serde_json::from_str(&e.data).unwrap();
                usage.observe_anthropic(&parsed);
            }
        }
        let u = usage.finish(0);
        assert_eq!((u.input_uncached, u.cache_read, u.output), (3, 10, 2));
        assert!(s.is_done());
    }

    #[test]
    fn exception_frame_is_an_error_event_core_classifies() {
        let mut s = ConverseStream::new("m", "msg_1".into());
        let out = s.frame(&Frame::Exception {
            kind: "throttlingException".into(),
            payload: Bytes::from_static(br#"{"message":"Too many tokens"}"#),
        });
        let SseItem::Event(e) = &out[0] else { panic!() };
        assert_eq!(e.event.as_deref(), Some("error"));
        let v: Value = serde_json::from_str(&e.data).unwrap();
        let c = switchyard_core::classify::classify_stream_error(&v);
        assert_eq!(c.class, switchyard_core::classify::ErrorClass::Capacity);
    }
}
