//! Vertex AI: Claude (`publishers/anthropic`, `:rawPredict` / `:streamRawPredict`) and Gemini
//! (`publishers/google`, `:generateContent` / `:streamGenerateContent?alt=sse`).
//!
//! Paths: `POST /{v1|v1beta1}/projects/{P}/locations/{L}/publishers/{anthropic|google}/models/{M}:{method}`
//! (google-genai uses `v1beta1`, the anthropic SDK `v1`). The model comes from the path.
//!
//! Claude on Vertex: the body is Anthropic Messages without `model` and with
//! `anthropic_version: "vertex-2023-10-16"` (or an API date such as `2026-10-21`, which the
//! anthropic SDK's `AnthropicVertex` sends; anything else or nothing: 400 `INVALID_ARGUMENT`); the
//! answer (JSON or SSE, usage, `cache_control` accounting) is exactly the `/v1/messages` one.
//!
//! Gemini (`GenerateContentRequest`): `contents[].parts[]` (`text`, `inlineData`/`inline_data`
//! `{mimeType, data}`, `functionCall`, `functionResponse`), `systemInstruction`,
//! `tools[].functionDeclarations`, `toolConfig.functionCallingConfig` (`mode: NONE` suppresses
//! calls, `allowedFunctionNames[0]` picks one), `generationConfig` (`maxOutputTokens`,
//! `stopSequences`, `responseMimeType: application/json` with `responseSchema` /
//! `responseJsonSchema`: the text is a JSON instance of the schema). The answer is a
//! `GenerateContentResponse` `{candidates: [{content: {role: model, parts}, finishReason,
//! index}], usageMetadata, modelVersion, createTime, responseId}`; a stream is SSE `data:
//! <GenerateContentResponse>` chunks, one per token, each with the cumulative `usageMetadata`.
//!
//! Gemini token rules: text by [`crate::count_tokens`]; an inline image 258 tokens (Gemini's
//! figure for an image up to 384 px); inline audio 1 token per 1000 decoded bytes (Gemini's 32
//! tokens per second at 16 kHz 16-bit mono PCM), at least 1. `usageMetadata.promptTokenCount`
//! includes `cachedContentTokenCount` (implicit caching, automatic prefix mode);
//! `thoughtsTokenCount` (config `gemini_thoughts_tokens`) is separate and counted in
//! `totalTokenCount`. A request carrying inline audio counts as the `transcription` modality for
//! fault triggers and `modalities`.

use serde_json::{Value, json};

use crate::tokens::{Segment, count_tokens, json_segment, segment, text_segment};
use crate::wire::{Answer, ChatApi, Finish, token_text};

/// The one `anthropic_version` Claude on Vertex accepts.
pub(crate) const VERTEX_ANTHROPIC_VERSION: &str = "vertex-2023-10-16";

/// What a vendor path says: API, model and whether it streams.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct VendorRoute {
    pub(crate) api: ChatApi,
    pub(crate) model: String,
    pub(crate) stream: bool,
}

/// Parses a Vertex path; `Err` is the 404 message.
pub(crate) fn parse_path(path: &str, query: Option<&str>) -> Result<VendorRoute, String> {
    let not_found = || format!("The requested URL {path} was not found on this server.");
    let parts: Vec<&str> = path.trim_start_matches('/').split('/').collect();
    let [
        ver,
        "projects",
        _p,
        "locations",
        _l,
        "publishers",
        publisher,
        "models",
        last,
    ] = parts.as_slice()
    else {
        return Err(not_found());
    };
    if !matches!(*ver, "v1" | "v1beta1") {
        return Err(not_found());
    }
    let Some((model, method)) = last.split_once(':') else {
        return Err(not_found());
    };
    let model = percent_encoding::percent_decode_str(model)
        .decode_utf8_lossy()
        .into_owned();
    let (api, stream) = match (*publisher, method) {
        ("anthropic", "rawPredict") => (ChatApi::VertexClaude, false),
        ("anthropic", "streamRawPredict") => (ChatApi::VertexClaude, true),
        ("google", "generateContent") => (ChatApi::Gemini, false),
        ("google", "streamGenerateContent") => {
            let sse = query.unwrap_or("").split('&').any(|kv| kv == "alt=sse");
            if !sse {
                return Err(format!(
                    "{path}: this mock serves streamGenerateContent only as SSE (?alt=sse)"
                ));
            }
            (ChatApi::Gemini, true)
        }
        _ => return Err(not_found()),
    };
    Ok(VendorRoute { api, model, stream })
}

/// Whether `v` is an Anthropic API date version (`YYYY-MM-DD`). The anthropic SDK's
/// `AnthropicVertex` / `AnthropicBedrock` (2.x) send their own API version (e.g. `2026-10-21`)
/// as `anthropic_version` rather than the platform strings, so both forms are accepted.
pub(crate) fn is_api_date_version(v: &str) -> bool {
    let b = v.as_bytes();
    b.len() == 10
        && b.iter().enumerate().all(|(i, c)| {
            if i == 4 || i == 7 {
                *c == b'-'
            } else {
                c.is_ascii_digit()
            }
        })
}

/// Checks a Claude-on-Vertex body (`anthropic_version` = `vertex-2023-10-16` or an API date);
/// `Err` is the 400 message.
pub(crate) fn check_claude_body(body: &Value) -> Result<(), String> {
    match body.get("anthropic_version").and_then(Value::as_str) {
        Some(VERTEX_ANTHROPIC_VERSION) => Ok(()),
        Some(v) if is_api_date_version(v) => Ok(()),
        Some(other) => Err(format!(
            "anthropic_version: Input should be '{VERTEX_ANTHROPIC_VERSION}', got '{other}'"
        )),
        None => Err(format!(
            "anthropic_version: Field required (Claude on Vertex AI takes \
             \"anthropic_version\": \"{VERTEX_ANTHROPIC_VERSION}\" in the body)"
        )),
    }
}

fn parts_of(content: &Value) -> impl Iterator<Item = &Value> {
    content
        .get("parts")
        .and_then(Value::as_array)
        .into_iter()
        .flatten()
}

fn inline_data(part: &Value) -> Option<&Value> {
    part.get("inlineData").or_else(|| part.get("inline_data"))
}

fn mime(inline: &Value) -> &str {
    inline
        .get("mimeType")
        .or_else(|| inline.get("mime_type"))
        .and_then(Value::as_str)
        .unwrap_or("")
}

/// Tokens of an inline blob (see the module docs).
fn inline_tokens(inline: &Value) -> u64 {
    let data = inline.get("data").and_then(Value::as_str).unwrap_or("");
    if mime(inline).starts_with("audio/") {
        // Base64: 4 characters carry 3 bytes, less the `=` padding.
        let padding = data.bytes().rev().take_while(|b| *b == b'=').count() as u64;
        let bytes = ((data.len() as u64) * 3 / 4).saturating_sub(padding);
        bytes.div_ceil(1000).max(1)
    } else {
        258
    }
}

fn part_segment(role: &str, part: &Value) -> Segment {
    if let Some(t) = part.get("text").and_then(Value::as_str) {
        return text_segment(role, t, None);
    }
    if let Some(inline) = inline_data(part) {
        let data = inline.get("data").and_then(Value::as_str).unwrap_or("");
        return segment(role, data, inline_tokens(inline), None);
    }
    json_segment(role, part)
}

fn declarations(body: &Value) -> Vec<&Value> {
    body.get("tools")
        .and_then(Value::as_array)
        .into_iter()
        .flatten()
        .filter_map(|t| {
            t.get("functionDeclarations")
                .or_else(|| t.get("function_declarations"))
                .and_then(Value::as_array)
        })
        .flatten()
        .collect()
}

/// Segments of a `GenerateContentRequest`: each function declaration, the system instruction's
/// parts, then each part of each content.
pub(crate) fn gemini_segments(body: &Value) -> Vec<Segment> {
    let mut out: Vec<Segment> = declarations(body)
        .into_iter()
        .map(|d| json_segment("tool_def", d))
        .collect();
    let system = body
        .get("systemInstruction")
        .or_else(|| body.get("system_instruction"));
    if let Some(sys) = system {
        out.extend(parts_of(sys).map(|p| part_segment("system", p)));
    }
    for content in body
        .get("contents")
        .and_then(Value::as_array)
        .into_iter()
        .flatten()
    {
        let role = content
            .get("role")
            .and_then(Value::as_str)
            .unwrap_or("user");
        out.extend(parts_of(content).map(|p| part_segment(role, p)));
    }
    out
}

/// Whether any content carries inline audio (the request is speech to text).
pub(crate) fn has_audio(body: &Value) -> bool {
    body.get("contents")
        .and_then(Value::as_array)
        .into_iter()
        .flatten()
        .flat_map(parts_of)
        .filter_map(inline_data)
        .any(|i| mime(i).starts_with("audio/"))
}

/// The function to call: declarations present, mode not `NONE`, and the last content is not a
/// function response (so an agent loop ends after one call).
pub(crate) fn gemini_tool(body: &Value) -> Option<String> {
    let decls = declarations(body);
    let first = decls.first()?.get("name").and_then(Value::as_str)?;
    let config = body
        .pointer("/toolConfig/functionCallingConfig")
        .or_else(|| body.pointer("/tool_config/function_calling_config"));
    let mode = config
        .and_then(|c| c.get("mode"))
        .and_then(Value::as_str)
        .unwrap_or("AUTO");
    if mode.eq_ignore_ascii_case("none") {
        return None;
    }
    let last_is_response = body
        .get("contents")
        .and_then(Value::as_array)
        .and_then(|c| c.last())
        .is_some_and(|c| {
            parts_of(c).any(|p| {
                p.get("functionResponse").is_some() || p.get("function_response").is_some()
            })
        });
    if last_is_response {
        return None;
    }
    let allowed = config
        .and_then(|c| {
            c.get("allowedFunctionNames")
                .or_else(|| c.get("allowed_function_names"))
        })
        .and_then(|a| a.get(0))
        .and_then(Value::as_str);
    Some(allowed.unwrap_or(first).to_owned())
}

fn generation_config(body: &Value) -> Option<&Value> {
    body.get("generationConfig")
        .or_else(|| body.get("generation_config"))
}

/// `generationConfig.maxOutputTokens`.
pub(crate) fn gemini_max_tokens(body: &Value) -> Option<u64> {
    let g = generation_config(body)?;
    g.get("maxOutputTokens")
        .or_else(|| g.get("max_output_tokens"))
        .and_then(Value::as_u64)
}

/// `generationConfig.stopSequences`.
pub(crate) fn gemini_stop_sequences(body: &Value) -> Vec<String> {
    generation_config(body)
        .and_then(|g| g.get("stopSequences").or_else(|| g.get("stop_sequences")))
        .and_then(Value::as_array)
        .into_iter()
        .flatten()
        .filter_map(Value::as_str)
        .map(str::to_owned)
        .collect()
}

/// JSON mode: a JSON instance of the response schema (or `{"text": ...}` without one).
pub(crate) fn gemini_json_text(body: &Value, tokens: u64) -> Option<String> {
    let g = generation_config(body)?;
    let mime = g
        .get("responseMimeType")
        .or_else(|| g.get("response_mime_type"))
        .and_then(Value::as_str)?;
    if mime != "application/json" {
        return None;
    }
    let text: String = (0..tokens.max(1)).map(token_text).collect();
    let schema = g
        .get("responseSchema")
        .or_else(|| g.get("responseJsonSchema"))
        .or_else(|| g.get("response_schema"))
        .or_else(|| g.get("response_json_schema"));
    let value = match schema {
        Some(s) => schema_instance(s, &text, 0),
        None => json!({ "text": text }),
    };
    Some(value.to_string())
}

/// A value valid for an OpenAPI / JSON-schema subset: object properties (all of them), arrays
/// of one item, enums' first value, strings = `text`, numbers 0, booleans false.
fn schema_instance(schema: &Value, text: &str, depth: usize) -> Value {
    if depth > 8 {
        return Value::Null;
    }
    if let Some(first) = schema.get("enum").and_then(|e| e.get(0)) {
        return first.clone();
    }
    let ty = schema
        .get("type")
        .and_then(|t| t.as_str().or_else(|| t.get(0).and_then(Value::as_str)))
        .unwrap_or(if schema.get("properties").is_some() {
            "object"
        } else {
            "string"
        })
        .to_ascii_lowercase();
    match ty.as_str() {
        "object" => {
            let mut obj = serde_json::Map::new();
            if let Some(props) = schema.get("properties").and_then(Value::as_object) {
                for (k, v) in props {
                    obj.insert(k.clone(), schema_instance(v, text, depth + 1));
                }
            }
            Value::Object(obj)
        }
        "array" => {
            let item = schema
                .get("items")
                .map_or(json!(text), |i| schema_instance(i, text, depth + 1));
            json!([item])
        }
        "integer" | "number" => json!(0),
        "boolean" => json!(false),
        "null" => Value::Null,
        _ => json!(text),
    }
}

fn finish_reason(a: &Answer) -> &'static str {
    match a.finish {
        Finish::Length => "MAX_TOKENS",
        Finish::Stop | Finish::ToolCall | Finish::StopSequence => "STOP",
    }
}

/// `usageMetadata` with `candidates` output tokens so far.
fn usage_metadata(a: &Answer, candidates: u64) -> Option<Value> {
    let u = a.usage.as_ref()?;
    let mut m = json!({
        "promptTokenCount": u.prompt_tokens,
        "candidatesTokenCount": candidates,
        "totalTokenCount": u.prompt_tokens + candidates + a.thoughts_tokens,
        "trafficType": "ON_DEMAND",
    });
    if let Some(obj) = m.as_object_mut() {
        if u.cached_tokens > 0 {
            obj.insert("cachedContentTokenCount".to_owned(), json!(u.cached_tokens));
        }
        if a.thoughts_tokens > 0 {
            obj.insert("thoughtsTokenCount".to_owned(), json!(a.thoughts_tokens));
        }
    }
    Some(m)
}

fn response(a: &Answer, parts: Value, finish: Option<&str>, candidates: u64) -> Value {
    let mut candidate = json!({"content": {"role": "model", "parts": parts}, "index": 0});
    if let (Some(f), Some(obj)) = (finish, candidate.as_object_mut()) {
        obj.insert("finishReason".to_owned(), json!(f));
    }
    let created = chrono::DateTime::from_timestamp(i64::try_from(a.created).unwrap_or(0), 0)
        .map(|t| t.to_rfc3339_opts(chrono::SecondsFormat::Micros, true))
        .unwrap_or_default();
    let mut r = json!({"candidates": [candidate], "modelVersion": a.model,
        "createTime": created, "responseId": a.id});
    if let (Some(u), Some(obj)) = (usage_metadata(a, candidates), r.as_object_mut()) {
        obj.insert("usageMetadata".to_owned(), u);
    }
    r
}

fn function_call_part(name: &str) -> Value {
    json!({"functionCall": {"name": name, "args": {}}})
}

/// Text of the whole answer (JSON-mode text or `token0 token1 ...`).
pub(crate) fn answer_text(a: &Answer) -> String {
    match &a.json_text {
        Some(t) => t.clone(),
        None => (0..a.text_tokens).map(token_text).collect(),
    }
}

/// Output tokens reported for an answer.
fn output_tokens(a: &Answer) -> u64 {
    a.usage.map_or(a.text_tokens, |u| u.output_tokens)
}

/// Non-streaming `GenerateContentResponse`.
pub(crate) fn json_body(a: &Answer) -> Value {
    let parts = match &a.tool {
        Some(name) => json!([function_call_part(name)]),
        None => json!([{"text": answer_text(a)}]),
    };
    response(a, parts, Some(finish_reason(a)), output_tokens(a))
}

/// SSE chunk for content token `i` (a JSON-mode answer is one chunk, `i = 0`).
pub(crate) fn delta_chunk(a: &Answer, i: u64) -> Value {
    let text = if a.json_text.is_some() {
        answer_text(a)
    } else {
        token_text(i)
    };
    let so_far = if a.json_text.is_some() {
        output_tokens(a)
    } else {
        i + 1
    };
    response(a, json!([{ "text": text }]), None, so_far)
}

/// SSE chunk carrying the function call.
pub(crate) fn tool_chunk(a: &Answer) -> Value {
    let name = a.tool.as_deref().unwrap_or_default();
    response(a, json!([function_call_part(name)]), None, output_tokens(a))
}

/// Last SSE chunk: `finishReason` and the final usage.
pub(crate) fn final_chunk(a: &Answer) -> Value {
    response(
        a,
        json!([{"text": ""}]),
        Some(finish_reason(a)),
        output_tokens(a),
    )
}

/// Output tokens of a JSON-mode text.
pub(crate) fn json_text_tokens(text: &str) -> u64 {
    count_tokens(text).max(1)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn parse_path_reads_model_method_and_stream() {
        let r = parse_path(
            "/v1/projects/p/locations/us-east5/publishers/anthropic/models/claude-sonnet-4@20250514:streamRawPredict",
            None,
        )
        .unwrap();
        assert_eq!(
            r,
            VendorRoute {
                api: ChatApi::VertexClaude,
                model: "claude-sonnet-4@20250514".to_owned(),
                stream: true
            }
        );
        let g = parse_path(
            "/v1beta1/projects/p/locations/global/publishers/google/models/gemini-2.5-flash:streamGenerateContent",
            Some("alt=sse"),
        )
        .unwrap();
        assert_eq!((g.api, g.stream), (ChatApi::Gemini, true));
        assert!(
            parse_path(
                "/v1/projects/p/locations/l/publishers/google/models/m:predict",
                None
            )
            .is_err()
        );
        assert!(
            parse_path(
                "/v1/projects/p/locations/l/publishers/google/models/m:streamGenerateContent",
                None
            )
            .is_err()
        );
    }

    #[test]
    fn gemini_segments_count_text_images_audio_and_tool_choice() {
        let audio = "A".repeat(4000); // 3000 bytes -> 3 tokens
        let body = json!({
            "systemInstruction": {"parts": [{"text": "be brief"}]},
            "contents": [{"role": "user", "parts": [
                {"text": "a b c"},
                {"inlineData": {"mimeType": "image/png", "data": "AAAA"}},
                {"inline_data": {"mime_type": "audio/wav", "data": audio}}]}],
            "tools": [{"functionDeclarations": [{"name": "get_weather", "parameters": {}}]}],
        });
        let segs = gemini_segments(&body);
        let tokens: Vec<u64> = segs.iter().map(|s| s.tokens).collect();
        assert_eq!(tokens[1..], [3, 3, 258, 3]);
        assert!(has_audio(&body));
        assert_eq!(gemini_tool(&body).as_deref(), Some("get_weather"));
        let mut none = body.clone();
        none["toolConfig"] = json!({"functionCallingConfig": {"mode": "NONE"}});
        assert_eq!(gemini_tool(&none), None);
    }

    #[test]
    fn json_mode_text_follows_schema() {
        let body = json!({"generationConfig": {"responseMimeType": "application/json",
            "responseSchema": {"type": "OBJECT", "properties": {
                "city": {"type": "STRING"}, "n": {"type": "INTEGER"},
                "tags": {"type": "ARRAY", "items": {"type": "STRING", "enum": ["x"]}}}}}});
        let text = gemini_json_text(&body, 2).unwrap();
        let v: Value = serde_json::from_str(&text).unwrap();
        assert_eq!(v, json!({"city": "token0 token1", "n": 0, "tags": ["x"]}));
    }
}
