//! Bedrock runtime: Converse, ConverseStream, InvokeModel, InvokeModelWithResponseStream.
//!
//! Paths: `POST /model/{modelId}/converse`, `/converse-stream`, `/invoke`,
//! `/invoke-with-response-stream`. `modelId` arrives percent-encoded (clients encode `:` and
//! `/`) and may be a base id (`anthropic.claude-sonnet-4-20250514-v1:0`), a cross-region
//! inference profile (`us.` / `eu.` / `apac.` / `global.` prefix) or an ARN (foundation model,
//! inference profile, provisioned model); the answer's model is the base id.
//!
//! Converse request: `messages[].content[]` blocks `text`, `image`, `document`, `toolUse`,
//! `toolResult`, `cachePoint`; `system[]` (`text`, `cachePoint`); `inferenceConfig`
//! (`maxTokens`, `stopSequences`); `toolConfig` (`tools[].toolSpec`, `cachePoint`,
//! `toolChoice` `auto` / `any` / `tool.name`). A `cachePoint` block is a cache breakpoint on the
//! block before it (explicit mode, like Anthropic's `cache_control`). Answer: `{output: {message:
//! {role, content}}, stopReason, usage: {inputTokens, outputTokens, totalTokens,
//! cacheReadInputTokens, cacheWriteInputTokens}, metrics: {latencyMs}}`; `inputTokens` excludes
//! cache reads and writes, `totalTokens` includes them. ConverseStream sends event-stream frames
//! `messageStart`, (`contentBlockStart` for a tool use), `contentBlockDelta`s,
//! `contentBlockStop`, `messageStop`, `metadata` (usage + metrics).
//!
//! Invoke body: Anthropic Messages without `model` / `stream`, with `anthropic_version:
//! "bedrock-2023-05-31"` or an API date (what `AnthropicBedrock` 2.x sends, e.g. `2026-10-21`);
//! 400 `ValidationException` "Malformed input request" otherwise. The
//! JSON answer is the `/v1/messages` one plus `X-Amzn-Bedrock-{Input,Output}-Token-Count`,
//! `-Invocation-Latency` and `-Cache-{Read,Write}-Input-Token-Count` headers; the stream is
//! `chunk` frames whose `bytes` is base64 of each Anthropic SSE event's JSON, the
//! `message_stop` one carrying `amazon-bedrock-invocationMetrics`.

use std::time::Duration;

use bytes::Bytes;
use serde_json::{Value, json};

use crate::errors::ErrorSpec;
use crate::eventstream::{event_frame, exception_frame};
use crate::tokens::{Segment, json_segment, openai_content_text, text_segment};
use crate::vertex::VendorRoute;
use crate::wire::{Answer, ChatApi, Finish, token_text};

/// The one `anthropic_version` InvokeModel accepts for Claude.
pub(crate) const BEDROCK_ANTHROPIC_VERSION: &str = "bedrock-2023-05-31";

/// Parses a Bedrock runtime path; `Err` is the 404 message.
pub(crate) fn parse_path(path: &str) -> Result<VendorRoute, String> {
    let unknown = || format!("Unable to determine service/operation name to be authorized: {path}");
    let rest = path.strip_prefix("/model/").ok_or_else(unknown)?;
    let (encoded, op) = rest.rsplit_once('/').ok_or_else(unknown)?;
    let model = percent_encoding::percent_decode_str(encoded)
        .decode_utf8_lossy()
        .into_owned();
    let (api, stream) = match op {
        "converse" => (ChatApi::Converse, false),
        "converse-stream" => (ChatApi::Converse, true),
        "invoke" => (ChatApi::BedrockInvoke, false),
        "invoke-with-response-stream" => (ChatApi::BedrockInvoke, true),
        _ => return Err(unknown()),
    };
    if model.is_empty() {
        return Err(unknown());
    }
    Ok(VendorRoute { api, model, stream })
}

/// The base model id of a model id, inference profile id or ARN.
pub(crate) fn base_model_id(id: &str) -> &str {
    let tail = if id.starts_with("arn:") {
        id.rsplit('/').next().unwrap_or(id)
    } else {
        id
    };
    for prefix in [
        "us-gov.", "us.", "eu.", "apac.", "global.", "jp.", "au.", "ca.",
    ] {
        if let Some(rest) = tail.strip_prefix(prefix) {
            return rest;
        }
    }
    tail
}

/// Checks an InvokeModel body for Claude; `Err` is the ValidationException message.
pub(crate) fn check_invoke_body(body: &Value) -> Result<(), String> {
    for key in ["model", "stream"] {
        if body.get(key).is_some() {
            return Err(format!(
                "Malformed input request: #: extraneous key [{key}] is not permitted, please \
                 reformat your input and try again."
            ));
        }
    }
    match body.get("anthropic_version").and_then(Value::as_str) {
        Some(BEDROCK_ANTHROPIC_VERSION) => Ok(()),
        Some(v) if crate::vertex::is_api_date_version(v) => Ok(()),
        Some(other) => Err(format!(
            "Malformed input request: #/anthropic_version: {other} is not a valid enum value, \
             please reformat your input and try again."
        )),
        None => Err(
            "Malformed input request: #: required key [anthropic_version] not found, please \
             reformat your input and try again."
                .to_owned(),
        ),
    }
}

/// Checks a Converse body; `Err` is the ValidationException message.
pub(crate) fn check_converse_body(body: &Value) -> Result<(), String> {
    match body.get("messages").and_then(Value::as_array) {
        Some(m) if !m.is_empty() => Ok(()),
        _ => Err(
            "1 validation error detected: Value null at 'messages' failed to satisfy \
             constraint: Member must not be null"
                .to_owned(),
        ),
    }
}

fn cache_point_ttl(block: &Value) -> Option<Option<Duration>> {
    let cp = block.get("cachePoint")?;
    Some(
        cp.get("ttl")
            .and_then(Value::as_str)
            .and_then(|t| humantime::parse_duration(t).ok()),
    )
}

fn mark_previous(out: &mut [Segment], ttl: Option<Duration>) {
    if let Some(last) = out.last_mut() {
        last.breakpoint = Some(ttl);
    }
}

fn block_segment(role: &str, block: &Value) -> Segment {
    if let Some(t) = block.get("text").and_then(Value::as_str) {
        return text_segment(role, t, None);
    }
    if let Some(r) = block.get("toolResult") {
        let text = r
            .get("content")
            .and_then(Value::as_array)
            .map(|c| {
                c.iter()
                    .map(|b| match b.get("text").and_then(Value::as_str) {
                        Some(t) => t.to_owned(),
                        None => openai_content_text(b),
                    })
                    .collect::<Vec<_>>()
                    .join(" ")
            })
            .unwrap_or_default();
        return text_segment(role, &text, None);
    }
    json_segment(role, block)
}

/// Segments of a Converse request: tools, system blocks, then every content block;
/// `cachePoint` blocks turn the previous segment into a breakpoint.
pub(crate) fn converse_segments(body: &Value) -> Vec<Segment> {
    let mut out: Vec<Segment> = Vec::new();
    for tool in body
        .pointer("/toolConfig/tools")
        .and_then(Value::as_array)
        .into_iter()
        .flatten()
    {
        match cache_point_ttl(tool) {
            Some(ttl) => mark_previous(&mut out, ttl),
            None => out.push(json_segment("tool_def", tool)),
        }
    }
    for block in body
        .get("system")
        .and_then(Value::as_array)
        .into_iter()
        .flatten()
    {
        match cache_point_ttl(block) {
            Some(ttl) => mark_previous(&mut out, ttl),
            None => out.push(block_segment("system", block)),
        }
    }
    for msg in body
        .get("messages")
        .and_then(Value::as_array)
        .into_iter()
        .flatten()
    {
        let role = msg.get("role").and_then(Value::as_str).unwrap_or("user");
        for block in msg
            .get("content")
            .and_then(Value::as_array)
            .into_iter()
            .flatten()
        {
            match cache_point_ttl(block) {
                Some(ttl) => mark_previous(&mut out, ttl),
                None => out.push(block_segment(role, block)),
            }
        }
    }
    out
}

/// Whether a Converse request has any `cachePoint` (its usage then names the cache fields).
pub(crate) fn converse_uses_cache(body: &Value) -> bool {
    converse_segments(body)
        .iter()
        .any(|s| s.breakpoint.is_some())
}

/// The tool to call: tools given and the last message is not a tool result; `toolChoice.tool`
/// names one, otherwise the first.
pub(crate) fn converse_tool(body: &Value) -> Option<String> {
    let tools = body
        .pointer("/toolConfig/tools")
        .and_then(Value::as_array)?;
    let first = tools
        .iter()
        .find_map(|t| t.pointer("/toolSpec/name").and_then(Value::as_str))?;
    let last_is_result = body
        .get("messages")
        .and_then(Value::as_array)
        .and_then(|m| m.last())
        .and_then(|m| m.get("content"))
        .and_then(Value::as_array)
        .is_some_and(|blocks| blocks.iter().any(|b| b.get("toolResult").is_some()));
    if last_is_result {
        return None;
    }
    let named = body
        .pointer("/toolConfig/toolChoice/tool/name")
        .and_then(Value::as_str);
    Some(named.unwrap_or(first).to_owned())
}

/// `inferenceConfig.maxTokens`.
pub(crate) fn converse_max_tokens(body: &Value) -> Option<u64> {
    body.pointer("/inferenceConfig/maxTokens")
        .and_then(Value::as_u64)
}

/// `inferenceConfig.stopSequences` (Converse) or `stop_sequences` (Anthropic bodies).
pub(crate) fn stop_sequences(body: &Value) -> Vec<String> {
    body.pointer("/inferenceConfig/stopSequences")
        .or_else(|| body.get("stop_sequences"))
        .and_then(Value::as_array)
        .into_iter()
        .flatten()
        .filter_map(Value::as_str)
        .map(str::to_owned)
        .collect()
}

fn stop_reason(a: &Answer) -> &'static str {
    match a.finish {
        Finish::Stop => "end_turn",
        Finish::Length => "max_tokens",
        Finish::ToolCall => "tool_use",
        Finish::StopSequence => "stop_sequence",
    }
}

fn tool_use_id(a: &Answer) -> String {
    format!("tooluse_{}", &a.id[a.id.len().saturating_sub(12)..])
}

/// Milliseconds since the request arrived.
fn latency_ms(a: &Answer) -> u64 {
    u64::try_from(a.t0.elapsed().as_millis()).unwrap_or(u64::MAX)
}

fn converse_usage(a: &Answer) -> Option<Value> {
    let u = a.usage.as_ref()?;
    let input = u
        .prompt_tokens
        .saturating_sub(u.cached_tokens + u.cache_creation_tokens);
    let mut v = json!({
        "inputTokens": input,
        "outputTokens": u.output_tokens,
        "totalTokens": input + u.output_tokens + u.cached_tokens + u.cache_creation_tokens,
    });
    if (a.uses_cache || u.cached_tokens > 0 || u.cache_creation_tokens > 0)
        && let Some(obj) = v.as_object_mut()
    {
        obj.insert("cacheReadInputTokens".to_owned(), json!(u.cached_tokens));
        obj.insert(
            "cacheWriteInputTokens".to_owned(),
            json!(u.cache_creation_tokens),
        );
    }
    Some(v)
}

/// Non-streaming Converse answer.
pub(crate) fn converse_json(a: &Answer) -> Value {
    let content = match &a.tool {
        Some(name) => {
            json!([{"toolUse": {"toolUseId": tool_use_id(a), "name": name, "input": {}}}])
        }
        None => json!([{"text": (0..a.text_tokens).map(token_text).collect::<String>()}]),
    };
    let mut body = json!({
        "output": {"message": {"role": "assistant", "content": content}},
        "stopReason": stop_reason(a),
        "metrics": {"latencyMs": latency_ms(a)},
    });
    if let (Some(u), Some(obj)) = (converse_usage(a), body.as_object_mut()) {
        obj.insert("usage".to_owned(), u);
    }
    body
}

/// ConverseStream frames sent before content.
pub(crate) fn converse_preamble(a: &Answer, for_error: bool) -> Vec<Bytes> {
    let mut v = vec![event_frame("messageStart", &json!({"role": "assistant"}))];
    if let (Some(name), false) = (&a.tool, for_error) {
        v.push(event_frame(
            "contentBlockStart",
            &json!({"start": {"toolUse": {"toolUseId": tool_use_id(a), "name": name}},
                "contentBlockIndex": 0}),
        ));
    }
    v
}

/// ConverseStream text delta for token `i`.
pub(crate) fn converse_delta(i: u64) -> Bytes {
    event_frame(
        "contentBlockDelta",
        &json!({"delta": {"text": token_text(i)}, "contentBlockIndex": 0}),
    )
}

/// ConverseStream tool-use input delta.
pub(crate) fn converse_tool_delta() -> Bytes {
    event_frame(
        "contentBlockDelta",
        &json!({"delta": {"toolUse": {"input": "{}"}}, "contentBlockIndex": 0}),
    )
}

/// ConverseStream closing frames.
pub(crate) fn converse_finish(a: &Answer) -> Vec<Bytes> {
    let mut meta = json!({"metrics": {"latencyMs": latency_ms(a)}});
    if let (Some(u), Some(obj)) = (converse_usage(a), meta.as_object_mut()) {
        obj.insert("usage".to_owned(), u);
    }
    vec![
        event_frame("contentBlockStop", &json!({"contentBlockIndex": 0})),
        event_frame("messageStop", &json!({"stopReason": stop_reason(a)})),
        event_frame("metadata", &meta),
    ]
}

/// An exception frame inside a 200 Bedrock stream.
pub(crate) fn stream_exception(e: &ErrorSpec) -> Bytes {
    let name = e.aws_exception();
    let mut member = String::with_capacity(name.len());
    let mut chars = name.chars();
    if let Some(c) = chars.next() {
        member.push(c.to_ascii_lowercase());
    }
    member.extend(chars);
    let mut payload = json!({"message": e.message});
    if name == "ModelStreamErrorException"
        && let Some(obj) = payload.as_object_mut()
    {
        obj.insert("originalStatusCode".to_owned(), json!(500));
        obj.insert("originalMessage".to_owned(), json!(e.message));
    }
    exception_frame(&member, &payload)
}

/// `amazon-bedrock-invocationMetrics` of the last InvokeModelWithResponseStream chunk.
pub(crate) fn invocation_metrics(a: &Answer) -> Value {
    let u = a.usage.unwrap_or_default();
    let latency = latency_ms(a);
    json!({
        "inputTokenCount": u.prompt_tokens.saturating_sub(u.cached_tokens + u.cache_creation_tokens),
        "outputTokenCount": u.output_tokens,
        "invocationLatency": latency,
        "firstByteLatency": latency.min(a.first_byte_ms),
        "cacheReadInputTokenCount": u.cached_tokens,
        "cacheWriteInputTokenCount": u.cache_creation_tokens,
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    #[test]
    fn parse_path_decodes_every_model_id_form() {
        let base = parse_path("/model/anthropic.claude-sonnet-4-20250514-v1%3A0/converse").unwrap();
        assert_eq!(base.model, "anthropic.claude-sonnet-4-20250514-v1:0");
        assert_eq!((base.api, base.stream), (ChatApi::Converse, false));
        let profile = parse_path(
            "/model/us.anthropic.claude-sonnet-4-20250514-v1%3A0/invoke-with-response-stream",
        )
        .unwrap();
        assert_eq!(
            (profile.api, profile.stream),
            (ChatApi::BedrockInvoke, true)
        );
        assert_eq!(
            base_model_id(&profile.model),
            "anthropic.claude-sonnet-4-20250514-v1:0"
        );
        let arn = parse_path(
            "/model/arn%3Aaws%3Abedrock%3Aus-east-1%3A123456789012%3Ainference-profile%2Fglobal.anthropic.claude-sonnet-4-20250514-v1%3A0/converse-stream",
        )
        .unwrap();
        assert_eq!(
            arn.model,
            "arn:aws:bedrock:us-east-1:123456789012:inference-profile/global.anthropic.claude-sonnet-4-20250514-v1:0"
        );
        assert_eq!(
            base_model_id(&arn.model),
            "anthropic.claude-sonnet-4-20250514-v1:0"
        );
        assert!(parse_path("/model/x/predict").is_err());
    }

    #[test]
    fn converse_cache_points_mark_previous_block() {
        let body = json!({
            "system": [{"text": "s s s s"}, {"cachePoint": {"type": "default"}}],
            "messages": [{"role": "user", "content": [{"text": "a b"}]}],
            "toolConfig": {"tools": [{"toolSpec": {"name": "get_weather",
                "inputSchema": {"json": {"type": "object"}}}}]},
        });
        let segs = converse_segments(&body);
        assert_eq!(segs.len(), 3);
        assert_eq!(segs[1].tokens, 4);
        assert_eq!(segs[1].breakpoint, Some(None));
        assert_eq!(segs[2].breakpoint, None);
        assert_eq!(converse_tool(&body).as_deref(), Some("get_weather"));
        assert!(converse_uses_cache(&body));
    }

    #[test]
    fn invoke_body_requires_bedrock_version_and_no_model() {
        assert!(check_invoke_body(&json!({"anthropic_version": "bedrock-2023-05-31"})).is_ok());
        assert!(check_invoke_body(&json!({"anthropic_version": "2026-10-21"})).is_ok());
        let e = check_invoke_body(&json!({"anthropic_version": "bedrock-2023"})).unwrap_err();
        assert!(e.contains("not a valid enum value"), "{e}");
        let e = check_invoke_body(&json!({"max_tokens": 5})).unwrap_err();
        assert!(e.contains("required key [anthropic_version]"), "{e}");
        let e =
            check_invoke_body(&json!({"anthropic_version": "bedrock-2023-05-31", "model": "x"}))
                .unwrap_err();
        assert!(e.contains("extraneous key [model]"), "{e}");
    }
}
