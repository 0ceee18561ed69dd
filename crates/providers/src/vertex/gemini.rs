//! Gemini on Vertex AI: translation between the OpenAI chat-completions dialect (the router's
//! internal form) and Vertex AI's `generateContent` / `streamGenerateContent?alt=sse` bodies,
//! plus a speech-to-text request built on `generateContent` with inline audio.
//!
//! Pure functions and one state machine: JSON and bytes in, JSON and SSE items out; no I/O, no
//! clock (`created` arrives as an argument). URLs, OAuth and HTTP belong to the Vertex adapter.
//!
//! Source of the field names: the Vertex AI REST reference (`v1`) for `GenerateContentRequest`
//! (`contents`, `systemInstruction`, `tools[].functionDeclarations`,
//! `toolConfig.functionCallingConfig`, `generationConfig`), `Part` (`text`, `inlineData`,
//! `fileData`, `functionCall`, `functionResponse`, `thought`, `thoughtSignature`), `Schema` (a
//! subset of OpenAPI 3.0),
//! `GenerateContentResponse` (`candidates`, `promptFeedback`, `usageMetadata`, `modelVersion`,
//! `responseId`), `Candidate.FinishReason` and `UsageMetadata`. The request bodies of the unit
//! tests were also compared with the body the `google-genai` SDK (3.6.1, Vertex mode) builds
//! from the same content: equal but for what the SDK adds (`propertyOrdering`, an empty
//! `generationConfig`).
//!
//! # Request: OpenAI chat → `GenerateContentRequest` ([`encode_request`])
//! - `system` / `developer` messages → `systemInstruction.parts[]` (one text part per text,
//!   in order, wherever they stand in the conversation: Gemini has one system instruction);
//! - `user` → `contents[{role: "user"}]`, `assistant` → `contents[{role: "model"}]`; text parts
//!   → `text`; `image_url` `data:<mime>;base64,<data>` → `inlineData {mimeType, data}` (the
//!   base64 is checked); `http(s)://` and `gs://` image URLs → `fileData {mimeType, fileUri}`
//!   with the MIME type guessed from the extension (png, jpg/jpeg, webp, gif, heic, heif;
//!   `image/jpeg` otherwise); `input_audio {data, format: wav|mp3}` → `inlineData` with
//!   `audio/wav` / `audio/mp3`; the `detail` of an image is ignored;
//! - assistant `tool_calls` → `functionCall {name, args}` parts (`arguments` parsed; it must be
//!   a JSON object, an empty string counts as `{}`), with the call's
//!   `extra_content.google.thought_signature` as the part's `thoughtSignature` (see below);
//! - `tool` messages → `functionResponse {name, response: {content}}` parts in a user-role
//!   content; consecutive tool messages share one content (other turns are kept as sent, not
//!   merged). `name` is that of the most recent earlier assistant tool call with the same id
//!   (OpenAI tool messages carry only the id);
//!   `content` is the message text parsed as JSON, or `{"result": text}` when it is not JSON;
//! - `tools[].function` → `tools[{functionDeclarations[{name, description, parameters}]}]`;
//!   `tool_choice` `none` / `auto` / `required` / `{function: {name}}` →
//!   `toolConfig.functionCallingConfig.mode` `NONE` / `AUTO` / `ANY` / `ANY` with
//!   `allowedFunctionNames: [name]`;
//! - `generationConfig`: `max_completion_tokens` (else `max_tokens`) → `maxOutputTokens`
//!   (which, like OpenAI's cap, includes thinking tokens),
//!   `temperature`, `top_p` → `topP`, `stop` (string or list) → `stopSequences`, `n` →
//!   `candidateCount`, `seed`, `presence_penalty` → `presencePenalty`, `frequency_penalty` →
//!   `frequencyPenalty`, `response_format` `json_object` → `responseMimeType:
//!   application/json`, `json_schema` → the same plus `responseSchema`;
//! - `model` (it goes in the URL), `stream` (the method decides), `stream_options` (see
//!   [`GeminiStream::new`]) and `user` are dropped; a JSON `null` member counts as absent.
//!
//! JSON schemas (tool `parameters`, `response_format.json_schema.schema`) are rewritten into
//! Vertex's `Schema`, which is an OpenAPI 3.0 subset and rejects requests carrying other JSON
//! Schema keywords: local `$ref`s (`#/$defs/…`, `#/definitions/…`) are inlined (recursive
//! schemas are refused), `type: [T, "null"]` and `anyOf: [.., {type: null}]` become `nullable:
//! true`, `oneOf` becomes `anyOf`, a single-element `allOf` is merged, a string `const` becomes
//! a one-value `enum`, type names are upper-cased (`OBJECT`, `STRING`, …); keys in
//! [`SCHEMA_KEYS`] are kept and every other keyword (`additionalProperties`, `$schema`, `$id`,
//! `strict`, `examples`, `exclusiveMinimum`, `multipleOf`, `uniqueItems`, `not`, …) is
//! dropped, so constraints they express are not enforced by Gemini. A tool without properties
//! is declared without `parameters` (Gemini refuses an `OBJECT` whose `properties` are empty:
//! "should be non-empty for OBJECT type").
//!
//! Refused with [`GeminiError::Unsupported`] naming the member: `logit_bias`; `logprobs: true`
//! and `top_logprobs` > 0 (Gemini has `responseLogprobs` but its result is not translated
//! back); `parallel_tool_calls: false` (Gemini cannot be limited to one call); image URLs that
//! are neither base64 `data:` nor `http(s)://` / `gs://`; content parts other than text,
//! image and audio (e.g. `file`); tools other than functions; legacy `function` messages and
//! `functions` / `function_call`; and every top-level member not listed above (`metadata`,
//! `store`, `reasoning_effort`, `modalities`, `audio`, `prediction`, `service_tier`, …), so
//! nothing a client asked for is silently lost. [`GeminiError::InvalidRequest`] covers
//! malformed input (wrong types, bad base64, unknown `tool_call_id`, non-object arguments).
//!
//! # Response: `GenerateContentResponse` → `chat.completion` ([`decode_response`])
//! One choice per candidate (its `index`); content = the candidate's text parts joined, parts
//! with `thought: true` left out (`null` when the turn is only function calls); `functionCall`
//! parts → `tool_calls` with ids `call_<n>`, `n` counting the calls of that candidate from 0,
//! and the part's `thoughtSignature` in `extra_content.google.thought_signature`;
//! finish reasons `STOP` → `stop` (`tool_calls` when the candidate called functions),
//! `MAX_TOKENS` → `length`, `SAFETY` / `RECITATION` / `BLOCKLIST` / `PROHIBITED_CONTENT` /
//! `SPII` / `IMAGE_SAFETY` / `IMAGE_PROHIBITED_CONTENT` / `IMAGE_RECITATION` / `MODEL_ARMOR` →
//! `content_filter`, anything else (`OTHER`, `LANGUAGE`, `MALFORMED_FUNCTION_CALL`, …) →
//! `stop`. A prompt blocked by `promptFeedback.blockReason` (no candidates) is one choice with
//! empty content and `content_filter`. Parts that cannot be shown in chat completions
//! (`inlineData`, `fileData`, `executableCode`, `codeExecutionResult`) are an
//! [`GeminiError::InvalidResponse`]; parts carrying no data (e.g. only a `thoughtSignature`)
//! are skipped.
//!
//! Usage, from `usageMetadata` (absent → no `usage` member, never made-up zeros):
//! `prompt_tokens` = `promptTokenCount` (which already includes `cachedContentTokenCount`),
//! `prompt_tokens_details.cached_tokens` = `cachedContentTokenCount`, `completion_tokens` =
//! `candidatesTokenCount + thoughtsTokenCount` (thinking is billed as output but counted
//! apart), `completion_tokens_details.reasoning_tokens` = `thoughtsTokenCount`,
//! `total_tokens` = `totalTokenCount`. `toolUsePromptTokenCount` is not read (it counts
//! built-in tools, which this translation never sends).
//!
//! # Stream ([`GeminiStream`])
//! Every SSE event of `:streamGenerateContent?alt=sse` is a whole `GenerateContentResponse`
//! whose candidates hold the new parts only, while its `usageMetadata` is cumulative: the
//! stream keeps the last value seen and never adds them up.
//!
//! # Thought signatures
//! Gemini 3 models attach an opaque `thoughtSignature` to function-call parts and answer 400
//! when a later request replays the call without it. The OpenAI dialect has no place for it,
//! so it travels in `tool_calls[].extra_content.google.thought_signature`, the member Google's
//! own OpenAI-compatible endpoint uses: OpenAI SDKs keep unknown members of a message, so a
//! client that appends the assistant message to its history sends it back unchanged. A
//! history without signatures (written by hand, or from another provider) is sent as is; the
//! `skip_thought_signature_validator` sentinel Google documents for that case is not added.
//!
//! Not done: `reasoning_effort` → `thinkingConfig`, thought summaries → `reasoning_content`,
//! Gemini's logprobs.

use std::collections::HashMap;

use base64::Engine as _;
use serde_json::{Map, Value, json};

use crate::wire::sse::{SseEvent, SseItem, SseParser};

/// Translation failure. `Unsupported` and `InvalidRequest` are client errors (HTTP 400 in the
/// client's dialect, `param` filled from the member); `InvalidResponse` and `Blocked` come from
/// the provider's answer.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum GeminiError {
    /// The request uses a member or value Gemini on Vertex AI cannot express.
    #[error("unsupported by gemini on vertex ai: `{param}`: {reason}")]
    Unsupported {
        /// The member, as a path into the request (e.g. `messages[2].content[0].image_url.url`).
        param: String,
        /// Why it cannot be translated.
        reason: String,
    },
    /// The request is malformed (wrong type, bad base64, unknown `tool_call_id`, …).
    #[error("invalid request: `{param}`: {reason}")]
    InvalidRequest {
        /// The member, as a path into the request.
        param: String,
        /// What is wrong with it.
        reason: String,
    },
    /// The provider's body is not a `GenerateContentResponse` this module can translate.
    #[error("invalid gemini response: {0}")]
    InvalidResponse(String),
    /// The provider blocked the prompt or the output (transcription only; chat answers a block
    /// with `finish_reason: content_filter`). Holds Gemini's reason, e.g. `SAFETY`.
    #[error("gemini blocked the content: {0}")]
    Blocked(String),
}

fn unsupported(param: impl Into<String>, reason: impl Into<String>) -> GeminiError {
    GeminiError::Unsupported {
        param: param.into(),
        reason: reason.into(),
    }
}

fn invalid(param: impl Into<String>, reason: impl Into<String>) -> GeminiError {
    GeminiError::InvalidRequest {
        param: param.into(),
        reason: reason.into(),
    }
}

fn bad_response(reason: impl Into<String>) -> GeminiError {
    GeminiError::InvalidResponse(reason.into())
}

// ---------------------------------------------------------------------------------------------
// Request

/// Keys of Vertex AI's `Schema` object kept by the schema rewrite (REST reference, `Schema`);
/// every other JSON Schema keyword is dropped, see the module docs.
pub const SCHEMA_KEYS: &[&str] = &[
    "type",
    "format",
    "title",
    "description",
    "nullable",
    "default",
    "items",
    "minItems",
    "maxItems",
    "enum",
    "properties",
    "propertyOrdering",
    "required",
    "minProperties",
    "maxProperties",
    "minLength",
    "maxLength",
    "pattern",
    "example",
    "anyOf",
    "minimum",
    "maximum",
];

/// Nesting limit of the schema rewrite; deeper means a recursive `$ref` (Vertex's `Schema`
/// cannot express recursion) or an absurd schema.
const MAX_SCHEMA_DEPTH: usize = 32;

/// Translates an OpenAI chat-completions request (JSON) into a Vertex AI
/// `GenerateContentRequest` (JSON) for `:generateContent` or `:streamGenerateContent`; see the
/// module docs for the mapping.
///
/// Errors: [`GeminiError::Unsupported`] for members Gemini cannot express (named in `param`),
/// [`GeminiError::InvalidRequest`] for malformed members.
pub fn encode_request(chat: &Value) -> Result<Value, GeminiError> {
    let req = chat
        .as_object()
        .ok_or_else(|| invalid("body", "the request is not a JSON object"))?;
    let present = |key: &str| req.get(key).filter(|v| !v.is_null());

    let mut generation = Map::new();
    for (key, value) in req {
        if value.is_null() {
            continue;
        }
        match key.as_str() {
            // Dropped: the model is in the URL, the method decides streaming, the stream's
            // usage switch is GeminiStream's, and Gemini has no end-user id.
            "model" | "stream" | "stream_options" | "user" => {}
            // Handled below, after the loop.
            "messages" | "tools" | "tool_choice" | "max_tokens" | "max_completion_tokens" => {}
            "temperature" => {
                generation.insert("temperature".into(), number(key, value)?);
            }
            "top_p" => {
                generation.insert("topP".into(), number(key, value)?);
            }
            "presence_penalty" => {
                generation.insert("presencePenalty".into(), number(key, value)?);
            }
            "frequency_penalty" => {
                generation.insert("frequencyPenalty".into(), number(key, value)?);
            }
            "seed" => {
                let seed = value
                    .as_i64()
                    .ok_or_else(|| invalid(key, "must be an integer"))?;
                generation.insert("seed".into(), json!(seed));
            }
            "n" => {
                let n = value
                    .as_u64()
                    .filter(|n| *n >= 1)
                    .ok_or_else(|| invalid(key, "must be an integer of at least 1"))?;
                generation.insert("candidateCount".into(), json!(n));
            }
            "stop" => {
                let stops = match value {
                    Value::String(s) => vec![Value::String(s.clone())],
                    Value::Array(items) if items.iter().all(Value::is_string) => items.clone(),
                    _ => return Err(invalid(key, "must be a string or a list of strings")),
                };
                if !stops.is_empty() {
                    generation.insert("stopSequences".into(), Value::Array(stops));
                }
            }
            "response_format" => response_format(value, &mut generation)?,
            "parallel_tool_calls" => match value {
                Value::Bool(true) => {}
                Value::Bool(false) => {
                    return Err(unsupported(
                        key,
                        "gemini cannot be limited to one function call per turn",
                    ));
                }
                _ => return Err(invalid(key, "must be a boolean")),
            },
            "logprobs" => match value {
                Value::Bool(false) => {}
                Value::Bool(true) => {
                    return Err(unsupported(
                        key,
                        "log probabilities are not translated from gemini",
                    ));
                }
                _ => return Err(invalid(key, "must be a boolean")),
            },
            "top_logprobs" => {
                if value.as_u64() != Some(0) {
                    return Err(unsupported(
                        key,
                        "log probabilities are not translated from gemini",
                    ));
                }
            }
            "logit_bias" => return Err(unsupported(key, "gemini has no token bias")),
            "functions" | "function_call" => {
                return Err(unsupported(key, "legacy functions; use tools"));
            }
            other => {
                return Err(unsupported(
                    other,
                    "no gemini counterpart in this translation",
                ));
            }
        }
    }
    let cap = present("max_completion_tokens")
        .map(|v| ("max_completion_tokens", v))
        .or_else(|| present("max_tokens").map(|v| ("max_tokens", v)));
    if let Some((key, value)) = cap {
        let cap = value
            .as_u64()
            .filter(|n| *n >= 1)
            .ok_or_else(|| invalid(key, "must be an integer of at least 1"))?;
        generation.insert("maxOutputTokens".into(), json!(cap));
    }

    let messages = present("messages")
        .and_then(Value::as_array)
        .ok_or_else(|| invalid("messages", "must be a list of messages"))?;
    let (system, contents) = encode_messages(messages)?;

    let mut out = Map::new();
    out.insert("contents".into(), Value::Array(contents));
    if !system.is_empty() {
        out.insert("systemInstruction".into(), json!({ "parts": system }));
    }
    if let Some(tools) = present("tools") {
        let declarations = encode_tools(tools)?;
        if !declarations.is_empty() {
            out.insert(
                "tools".into(),
                json!([{ "functionDeclarations": declarations }]),
            );
        }
    }
    if let Some(choice) = present("tool_choice") {
        out.insert(
            "toolConfig".into(),
            json!({ "functionCallingConfig": encode_tool_choice(choice)? }),
        );
    }
    if !generation.is_empty() {
        out.insert("generationConfig".into(), Value::Object(generation));
    }
    Ok(Value::Object(out))
}

fn number(param: &str, value: &Value) -> Result<Value, GeminiError> {
    if value.is_number() {
        Ok(value.clone())
    } else {
        Err(invalid(param, "must be a number"))
    }
}

fn response_format(value: &Value, generation: &mut Map<String, Value>) -> Result<(), GeminiError> {
    let kind = value
        .get("type")
        .and_then(Value::as_str)
        .ok_or_else(|| invalid("response_format.type", "must be a string"))?;
    match kind {
        "text" => {}
        "json_object" => {
            generation.insert("responseMimeType".into(), json!("application/json"));
        }
        "json_schema" => {
            generation.insert("responseMimeType".into(), json!("application/json"));
            let schema = value
                .get("json_schema")
                .and_then(|s| s.get("schema"))
                .filter(|s| !s.is_null());
            if let Some(schema) = schema {
                let param = "response_format.json_schema.schema";
                generation.insert(
                    "responseSchema".into(),
                    clean_schema(schema, schema, 0, param)?,
                );
            }
        }
        other => {
            return Err(unsupported(
                "response_format.type",
                format!("`{other}` has no gemini counterpart"),
            ));
        }
    }
    Ok(())
}

/// Returns (`systemInstruction` parts, `contents`).
fn encode_messages(messages: &[Value]) -> Result<(Vec<Value>, Vec<Value>), GeminiError> {
    let mut system = Vec::new();
    let mut contents: Vec<Value> = Vec::new();
    // Tool call id → function name, the latest assistant call with that id winning (ids such
    // as `call_0` repeat across turns when they came from this module's responses).
    let mut call_names: HashMap<String, String> = HashMap::new();
    // Whether the last content holds function responses, for merging consecutive tool turns.
    let mut last_is_tool = false;

    for (i, msg) in messages.iter().enumerate() {
        let role = msg
            .get("role")
            .and_then(Value::as_str)
            .ok_or_else(|| invalid(format!("messages[{i}].role"), "must be a string"))?;
        let content = msg.get("content").filter(|c| !c.is_null());
        let content_param = format!("messages[{i}].content");
        match role {
            "system" | "developer" => {
                for text in text_of(content, &content_param)? {
                    system.push(json!({ "text": text }));
                }
            }
            "user" => {
                let parts = user_parts(content, &content_param)?;
                if !parts.is_empty() {
                    contents.push(json!({ "role": "user", "parts": parts }));
                    last_is_tool = false;
                }
            }
            "assistant" => {
                let mut parts: Vec<Value> = text_of(content, &content_param)?
                    .into_iter()
                    .map(|text| json!({ "text": text }))
                    .collect();
                let calls = msg.get("tool_calls").filter(|c| !c.is_null());
                if let Some(calls) = calls {
                    let calls = calls.as_array().ok_or_else(|| {
                        invalid(format!("messages[{i}].tool_calls"), "must be a list")
                    })?;
                    for (j, call) in calls.iter().enumerate() {
                        let param = format!("messages[{i}].tool_calls[{j}]");
                        let (id, name, args) = tool_call(call, &param)?;
                        call_names.insert(id, name.clone());
                        let mut part = json!({ "functionCall": { "name": name, "args": args } });
                        if let Some(signature) = thought_signature_of(call) {
                            part["thoughtSignature"] = json!(signature);
                        }
                        parts.push(part);
                    }
                }
                if !parts.is_empty() {
                    contents.push(json!({ "role": "model", "parts": parts }));
                    last_is_tool = false;
                }
            }
            "tool" => {
                let id = msg
                    .get("tool_call_id")
                    .and_then(Value::as_str)
                    .ok_or_else(|| {
                        invalid(format!("messages[{i}].tool_call_id"), "must be a string")
                    })?;
                let name = call_names.get(id).ok_or_else(|| {
                    invalid(
                        format!("messages[{i}].tool_call_id"),
                        format!("`{id}` matches no earlier assistant tool call"),
                    )
                })?;
                let text = text_of(content, &content_param)?.concat();
                let result = match serde_json::from_str::<Value>(&text) {
                    Ok(parsed) => parsed,
                    Err(_) => json!({ "result": text }),
                };
                let part = json!({
                    "functionResponse": { "name": name, "response": { "content": result } }
                });
                let merged = match contents.last_mut() {
                    Some(last) if last_is_tool => last
                        .get_mut("parts")
                        .and_then(Value::as_array_mut)
                        .map(|parts| parts.push(part.clone()))
                        .is_some(),
                    _ => false,
                };
                if !merged {
                    contents.push(json!({ "role": "user", "parts": [part] }));
                }
                last_is_tool = true;
            }
            "function" => {
                return Err(unsupported(
                    format!("messages[{i}].role"),
                    "legacy function messages; use tool messages",
                ));
            }
            other => {
                return Err(invalid(
                    format!("messages[{i}].role"),
                    format!("unknown role `{other}`"),
                ));
            }
        }
    }
    if contents.is_empty() {
        return Err(invalid(
            "messages",
            "gemini needs at least one non-empty user or assistant message",
        ));
    }
    Ok((system, contents))
}

/// The non-empty texts of a text-only content (a string, or a list of `text` / `refusal`
/// parts).
fn text_of(content: Option<&Value>, param: &str) -> Result<Vec<String>, GeminiError> {
    let mut texts = Vec::new();
    match content {
        None => {}
        Some(Value::String(s)) => texts.push(s.clone()),
        Some(Value::Array(parts)) => {
            for (j, part) in parts.iter().enumerate() {
                let kind = part.get("type").and_then(Value::as_str).unwrap_or("");
                let key = match kind {
                    "text" => "text",
                    "refusal" => "refusal",
                    other => {
                        return Err(unsupported(
                            format!("{param}[{j}].type"),
                            format!("`{other}` parts are not allowed in this message"),
                        ));
                    }
                };
                let text = part
                    .get(key)
                    .and_then(Value::as_str)
                    .ok_or_else(|| invalid(format!("{param}[{j}].{key}"), "must be a string"))?;
                texts.push(text.to_owned());
            }
        }
        Some(_) => return Err(invalid(param, "must be a string or a list of parts")),
    }
    texts.retain(|t| !t.is_empty());
    Ok(texts)
}

fn user_parts(content: Option<&Value>, param: &str) -> Result<Vec<Value>, GeminiError> {
    let parts = match content {
        None => return Ok(Vec::new()),
        Some(Value::String(s)) if s.is_empty() => return Ok(Vec::new()),
        Some(Value::String(s)) => return Ok(vec![json!({ "text": s })]),
        Some(Value::Array(parts)) => parts,
        Some(_) => return Err(invalid(param, "must be a string or a list of parts")),
    };
    let mut out = Vec::with_capacity(parts.len());
    for (j, part) in parts.iter().enumerate() {
        let param = format!("{param}[{j}]");
        let kind = part.get("type").and_then(Value::as_str).unwrap_or("");
        match kind {
            "text" => {
                let text = part
                    .get("text")
                    .and_then(Value::as_str)
                    .ok_or_else(|| invalid(format!("{param}.text"), "must be a string"))?;
                if !text.is_empty() {
                    out.push(json!({ "text": text }));
                }
            }
            "image_url" => {
                let image = part.get("image_url");
                let url = image
                    .and_then(|i| i.get("url"))
                    .or(image.filter(|i| i.is_string()))
                    .and_then(Value::as_str)
                    .ok_or_else(|| invalid(format!("{param}.image_url.url"), "must be a string"))?;
                out.push(image_part(url, &format!("{param}.image_url.url"))?);
            }
            "input_audio" => {
                let audio = part.get("input_audio");
                let data = audio
                    .and_then(|a| a.get("data"))
                    .and_then(Value::as_str)
                    .ok_or_else(|| {
                        invalid(format!("{param}.input_audio.data"), "must be a string")
                    })?;
                let format = audio
                    .and_then(|a| a.get("format"))
                    .and_then(Value::as_str)
                    .unwrap_or("");
                let mime = match format {
                    "wav" => "audio/wav",
                    "mp3" => "audio/mp3",
                    other => {
                        return Err(unsupported(
                            format!("{param}.input_audio.format"),
                            format!("`{other}`; wav and mp3 are translated"),
                        ));
                    }
                };
                check_base64(data, &format!("{param}.input_audio.data"))?;
                out.push(json!({ "inlineData": { "mimeType": mime, "data": data } }));
            }
            other => {
                return Err(unsupported(
                    format!("{param}.type"),
                    format!("`{other}` parts; text, image_url and input_audio are translated"),
                ));
            }
        }
    }
    Ok(out)
}

fn image_part(url: &str, param: &str) -> Result<Value, GeminiError> {
    if let Some(rest) = url.strip_prefix("data:") {
        let (header, data) = rest
            .split_once(',')
            .ok_or_else(|| invalid(param, "data URL without a comma"))?;
        let mime = header.strip_suffix(";base64").ok_or_else(|| {
            unsupported(param, "data URLs must be base64 (`data:<mime>;base64,…`)")
        })?;
        if mime.is_empty() {
            return Err(invalid(param, "data URL without a MIME type"));
        }
        check_base64(data, param)?;
        return Ok(json!({ "inlineData": { "mimeType": mime, "data": data } }));
    }
    let lower = url.to_ascii_lowercase();
    if ["https://", "http://", "gs://"]
        .iter()
        .any(|scheme| lower.starts_with(scheme))
    {
        return Ok(json!({ "fileData": { "mimeType": guess_image_mime(url), "fileUri": url } }));
    }
    Err(unsupported(
        param,
        "image URLs must be base64 data:, http(s):// or gs:// URLs",
    ))
}

/// MIME type of an image URL from its path's extension; `image/jpeg` when unknown (Vertex
/// needs one and JPEG is the commonest web image).
fn guess_image_mime(url: &str) -> &'static str {
    let path = url.split(['?', '#']).next().unwrap_or(url);
    let name = path.rsplit('/').next().unwrap_or(path);
    let ext = name
        .rsplit_once('.')
        .map(|(_, ext)| ext.to_ascii_lowercase())
        .unwrap_or_default();
    match ext.as_str() {
        "png" => "image/png",
        "webp" => "image/webp",
        "gif" => "image/gif",
        "heic" => "image/heic",
        "heif" => "image/heif",
        _ => "image/jpeg",
    }
}

fn check_base64(data: &str, param: &str) -> Result<(), GeminiError> {
    base64::engine::general_purpose::STANDARD
        .decode(data)
        .map(|_| ())
        .map_err(|e| invalid(param, format!("invalid base64: {e}")))
}

/// The Gemini `thoughtSignature` an OpenAI tool call carries back, in the member Google's own
/// OpenAI-compatible endpoint uses: `extra_content.google.thought_signature`.
fn thought_signature_of(call: &Value) -> Option<&str> {
    call.get("extra_content")?
        .get("google")?
        .get("thought_signature")?
        .as_str()
}

/// (id, name, parsed arguments) of an assistant tool call.
fn tool_call(call: &Value, param: &str) -> Result<(String, String, Value), GeminiError> {
    let kind = call
        .get("type")
        .and_then(Value::as_str)
        .unwrap_or("function");
    if kind != "function" {
        return Err(unsupported(
            format!("{param}.type"),
            format!("`{kind}` tool calls"),
        ));
    }
    let id = call
        .get("id")
        .and_then(Value::as_str)
        .ok_or_else(|| invalid(format!("{param}.id"), "must be a string"))?;
    let function = call.get("function");
    let name = function
        .and_then(|f| f.get("name"))
        .and_then(Value::as_str)
        .ok_or_else(|| invalid(format!("{param}.function.name"), "must be a string"))?;
    let arguments = function
        .and_then(|f| f.get("arguments"))
        .and_then(Value::as_str)
        .unwrap_or("");
    let args = if arguments.trim().is_empty() {
        json!({})
    } else {
        match serde_json::from_str::<Value>(arguments) {
            Ok(args @ Value::Object(_)) => args,
            _ => {
                return Err(invalid(
                    format!("{param}.function.arguments"),
                    "must be a JSON object",
                ));
            }
        }
    };
    Ok((id.to_owned(), name.to_owned(), args))
}

fn encode_tools(tools: &Value) -> Result<Vec<Value>, GeminiError> {
    let tools = tools
        .as_array()
        .ok_or_else(|| invalid("tools", "must be a list"))?;
    let mut declarations = Vec::with_capacity(tools.len());
    for (i, tool) in tools.iter().enumerate() {
        let kind = tool.get("type").and_then(Value::as_str).unwrap_or("");
        if kind != "function" {
            return Err(unsupported(
                format!("tools[{i}].type"),
                format!("`{kind}` tools; function tools are translated"),
            ));
        }
        let function = tool
            .get("function")
            .ok_or_else(|| invalid(format!("tools[{i}].function"), "missing"))?;
        let name = function
            .get("name")
            .and_then(Value::as_str)
            .ok_or_else(|| invalid(format!("tools[{i}].function.name"), "must be a string"))?;
        let mut declaration = Map::new();
        declaration.insert("name".into(), json!(name));
        if let Some(description) = function.get("description").and_then(Value::as_str) {
            declaration.insert("description".into(), json!(description));
        }
        if let Some(params) = function.get("parameters").filter(|p| !p.is_null()) {
            let param = format!("tools[{i}].function.parameters");
            let cleaned = clean_schema(params, params, 0, &param)?;
            let has_properties = cleaned
                .get("properties")
                .and_then(Value::as_object)
                .is_some_and(|p| !p.is_empty());
            let is_object = cleaned.get("type").and_then(Value::as_str) == Some("OBJECT");
            // Vertex refuses an OBJECT with empty properties; a function without arguments is
            // declared without parameters.
            if has_properties || !is_object {
                declaration.insert("parameters".into(), cleaned);
            }
        }
        declarations.push(Value::Object(declaration));
    }
    Ok(declarations)
}

fn encode_tool_choice(choice: &Value) -> Result<Value, GeminiError> {
    match choice {
        Value::String(mode) => match mode.as_str() {
            "none" => Ok(json!({ "mode": "NONE" })),
            "auto" => Ok(json!({ "mode": "AUTO" })),
            "required" => Ok(json!({ "mode": "ANY" })),
            other => Err(unsupported(
                "tool_choice",
                format!("`{other}`; none, auto, required or a named function"),
            )),
        },
        Value::Object(_) => {
            let name = choice
                .get("function")
                .and_then(|f| f.get("name"))
                .and_then(Value::as_str)
                .ok_or_else(|| {
                    unsupported(
                        "tool_choice",
                        "only {type: function, function: {name}} objects",
                    )
                })?;
            Ok(json!({ "mode": "ANY", "allowedFunctionNames": [name] }))
        }
        _ => Err(invalid("tool_choice", "must be a string or an object")),
    }
}

/// Rewrites a JSON Schema into Vertex's `Schema` (see the module docs). `root` is the
/// document local `$ref`s point into.
fn clean_schema(
    schema: &Value,
    root: &Value,
    depth: usize,
    param: &str,
) -> Result<Value, GeminiError> {
    if depth > MAX_SCHEMA_DEPTH {
        return Err(unsupported(
            param,
            format!("schema nested deeper than {MAX_SCHEMA_DEPTH} levels (a recursive $ref?)"),
        ));
    }
    let obj = match schema {
        Value::Object(obj) => obj,
        // `true` is the schema that allows anything.
        Value::Bool(true) => return Ok(json!({})),
        _ => return Err(invalid(param, "a schema must be a JSON object")),
    };
    if let Some(reference) = obj.get("$ref") {
        let target = reference
            .as_str()
            .and_then(|r| resolve_ref(root, r))
            .ok_or_else(|| {
                unsupported(
                    param,
                    format!("$ref {reference}; only #/$defs/… and #/definitions/… are inlined"),
                )
            })?;
        let mut inlined = clean_schema(target, root, depth + 1, param)?;
        // Keep an annotation written beside the $ref (pydantic puts descriptions there).
        if let (Some(map), Some(description)) = (inlined.as_object_mut(), obj.get("description")) {
            map.insert("description".into(), description.clone());
        }
        return Ok(inlined);
    }

    let mut out = Map::new();
    // Keys of a lone `anyOf` variant or `allOf` member; the schema's own keys win over them.
    let mut inherited = Map::new();
    let mut nullable = false;
    for (key, value) in obj {
        match key.as_str() {
            "type" => match value {
                Value::String(t) if t == "null" => nullable = true,
                Value::String(t) => {
                    out.insert("type".into(), json!(t.to_ascii_uppercase()));
                }
                Value::Array(types) => {
                    let mut named: Vec<&str> = Vec::new();
                    for t in types {
                        match t.as_str() {
                            Some("null") => nullable = true,
                            Some(t) => named.push(t),
                            None => return Err(invalid(param, "`type` entries must be strings")),
                        }
                    }
                    match named.as_slice() {
                        [] => {}
                        [one] => {
                            out.insert("type".into(), json!(one.to_ascii_uppercase()));
                        }
                        _ => {
                            let any: Vec<Value> = named
                                .iter()
                                .map(|t| json!({ "type": t.to_ascii_uppercase() }))
                                .collect();
                            out.insert("anyOf".into(), Value::Array(any));
                        }
                    }
                }
                _ => return Err(invalid(param, "`type` must be a string or a list")),
            },
            "properties" => {
                let props = value
                    .as_object()
                    .ok_or_else(|| invalid(param, "`properties` must be an object"))?;
                let mut cleaned = Map::new();
                for (name, prop) in props {
                    let sub = format!("{param}.properties.{name}");
                    cleaned.insert(name.clone(), clean_schema(prop, root, depth + 1, &sub)?);
                }
                out.insert("properties".into(), Value::Object(cleaned));
            }
            "items" => {
                if value.is_array() {
                    return Err(unsupported(
                        format!("{param}.items"),
                        "tuple schemas (items as a list)",
                    ));
                }
                let sub = format!("{param}.items");
                out.insert("items".into(), clean_schema(value, root, depth + 1, &sub)?);
            }
            "anyOf" | "oneOf" => {
                let variants = value
                    .as_array()
                    .ok_or_else(|| invalid(param, format!("`{key}` must be a list")))?;
                let mut any = Vec::with_capacity(variants.len());
                for (k, variant) in variants.iter().enumerate() {
                    let sub = format!("{param}.{key}[{k}]");
                    let cleaned = clean_schema(variant, root, depth + 1, &sub)?;
                    // `{type: null}` becomes `nullable`, the OpenAPI 3.0 spelling.
                    if cleaned.as_object().is_some_and(|m| {
                        m.len() == 1 && m.get("nullable") == Some(&Value::Bool(true))
                    }) {
                        nullable = true;
                    } else {
                        any.push(cleaned);
                    }
                }
                if let [Value::Object(only)] = any.as_slice() {
                    inherited.extend(only.clone());
                } else if !any.is_empty() {
                    out.insert("anyOf".into(), Value::Array(any));
                }
            }
            "allOf" => match value.as_array().map(Vec::as_slice) {
                Some([only]) => {
                    let sub = format!("{param}.allOf[0]");
                    if let Value::Object(inner) = clean_schema(only, root, depth + 1, &sub)? {
                        inherited.extend(inner);
                    }
                }
                _ => {
                    return Err(unsupported(
                        format!("{param}.allOf"),
                        "allOf with more than one schema",
                    ));
                }
            },
            "const" => match value {
                Value::String(s) => {
                    out.insert("enum".into(), json!([s]));
                }
                _ => return Err(unsupported(format!("{param}.const"), "non-string const")),
            },
            known if SCHEMA_KEYS.contains(&known) => {
                out.insert(key.clone(), value.clone());
            }
            // Everything else (additionalProperties, $schema, $defs, strict, …) is dropped.
            _ => {}
        }
    }
    for (key, value) in inherited {
        out.entry(key).or_insert(value);
    }
    if nullable {
        out.insert("nullable".into(), Value::Bool(true));
    }
    Ok(Value::Object(out))
}

/// The target of a local `$ref` (`#/$defs/Name`, `#/definitions/Name`, JSON-pointer escapes
/// decoded), if it points into `root`.
fn resolve_ref<'a>(root: &'a Value, reference: &str) -> Option<&'a Value> {
    let pointer = reference.strip_prefix('#')?;
    if !(pointer.starts_with("/$defs/") || pointer.starts_with("/definitions/")) {
        return None;
    }
    root.pointer(pointer)
}

// ---------------------------------------------------------------------------------------------
// Response

/// Finish reason of a Gemini candidate in OpenAI's vocabulary (module docs).
fn finish_reason(reason: &str, called_functions: bool) -> &'static str {
    match reason {
        "STOP" if called_functions => "tool_calls",
        "MAX_TOKENS" => "length",
        "SAFETY"
        | "RECITATION"
        | "BLOCKLIST"
        | "PROHIBITED_CONTENT"
        | "SPII"
        | "IMAGE_SAFETY"
        | "IMAGE_PROHIBITED_CONTENT"
        | "IMAGE_RECITATION"
        | "MODEL_ARMOR" => "content_filter",
        _ => "stop",
    }
}

/// What one candidate (or one streamed piece of it) says: joined text and function calls.
struct CandidateParts {
    text: String,
    /// In order.
    calls: Vec<Call>,
}

struct Call {
    name: String,
    args: Value,
    /// The part's `thoughtSignature`, which Gemini 3 models need back with the call.
    signature: Option<String>,
}

fn candidate_parts(candidate: &Value) -> Result<CandidateParts, GeminiError> {
    let mut out = CandidateParts {
        text: String::new(),
        calls: Vec::new(),
    };
    let parts = candidate
        .get("content")
        .and_then(|c| c.get("parts"))
        .and_then(Value::as_array);
    for part in parts.into_iter().flatten() {
        if part.get("thought").and_then(Value::as_bool) == Some(true) {
            continue;
        }
        if let Some(text) = part.get("text") {
            let text = text
                .as_str()
                .ok_or_else(|| bad_response("a part's `text` is not a string"))?;
            out.text.push_str(text);
        } else if let Some(call) = part.get("functionCall") {
            let name = call
                .get("name")
                .and_then(Value::as_str)
                .ok_or_else(|| bad_response("a functionCall without a name"))?;
            let args = match call.get("args") {
                None | Some(Value::Null) => json!({}),
                Some(args @ Value::Object(_)) => args.clone(),
                Some(_) => return Err(bad_response("a functionCall's args is not an object")),
            };
            let signature = part.get("thoughtSignature").and_then(Value::as_str);
            out.calls.push(Call {
                name: name.to_owned(),
                args,
                signature: signature.map(str::to_owned),
            });
        } else if let Some(kind) = [
            "inlineData",
            "fileData",
            "executableCode",
            "codeExecutionResult",
            "functionResponse",
        ]
        .into_iter()
        .find(|k| part.get(*k).is_some())
        {
            return Err(bad_response(format!(
                "a `{kind}` part cannot be shown as a chat completion"
            )));
        }
        // Else a part with no data (e.g. only a thoughtSignature): nothing to show.
    }
    Ok(out)
}

/// An OpenAI tool call for the `n`th call of a candidate; a thought signature goes in
/// `extra_content.google.thought_signature` (Google's OpenAI-compatible endpoint's member),
/// which [`encode_request`] reads back.
fn tool_call_json(n: usize, call: &Call) -> Value {
    let mut out = json!({
        "id": format!("call_{n}"),
        "type": "function",
        "function": { "name": call.name, "arguments": call.args.to_string() },
    });
    if let Some(signature) = &call.signature {
        out["extra_content"] = json!({ "google": { "thought_signature": signature } });
    }
    out
}

fn u64_member(usage: &Value, key: &str) -> Result<u64, GeminiError> {
    match usage.get(key) {
        None | Some(Value::Null) => Ok(0),
        Some(v) => v
            .as_u64()
            .ok_or_else(|| bad_response(format!("usageMetadata.{key} is not a count"))),
    }
}

/// OpenAI `usage` from Gemini's `usageMetadata` (module docs).
fn usage_json(meta: &Value) -> Result<Value, GeminiError> {
    let prompt = u64_member(meta, "promptTokenCount")?;
    let cached = u64_member(meta, "cachedContentTokenCount")?;
    let candidates = u64_member(meta, "candidatesTokenCount")?;
    let thoughts = u64_member(meta, "thoughtsTokenCount")?;
    let completion = candidates + thoughts;
    let total = match meta.get("totalTokenCount") {
        None | Some(Value::Null) => prompt + completion,
        Some(_) => u64_member(meta, "totalTokenCount")?,
    };
    Ok(json!({
        "prompt_tokens": prompt,
        "completion_tokens": completion,
        "total_tokens": total,
        "prompt_tokens_details": { "cached_tokens": cached },
        "completion_tokens_details": { "reasoning_tokens": thoughts },
    }))
}

fn parse_response(body: &[u8]) -> Result<Value, GeminiError> {
    let value: Value =
        serde_json::from_slice(body).map_err(|e| bad_response(format!("body is not JSON: {e}")))?;
    if !value.is_object() {
        return Err(bad_response("body is not a JSON object"));
    }
    if let Some(error) = value.get("error") {
        return Err(bad_response(format!("the body is an error: {error}")));
    }
    Ok(value)
}

fn completion_id(response: &Value, created: u64) -> String {
    match response.get("responseId").and_then(Value::as_str) {
        Some(id) => format!("chatcmpl-{id}"),
        None => format!("chatcmpl-gemini-{created}"),
    }
}

fn block_reason(response: &Value) -> Option<&str> {
    response
        .get("promptFeedback")
        .and_then(|f| f.get("blockReason"))
        .and_then(Value::as_str)
}

fn candidates_of(response: &Value) -> Result<&[Value], GeminiError> {
    match response.get("candidates") {
        None | Some(Value::Null) => Ok(&[]),
        Some(Value::Array(c)) => Ok(c),
        Some(_) => Err(bad_response("`candidates` is not a list")),
    }
}

/// Translates a Vertex AI `GenerateContentResponse` body into an OpenAI `chat.completion`
/// (JSON); see the module docs. `model` is used when the body has no `modelVersion`;
/// `created` is the Unix time in seconds for the `created` member.
///
/// Errors: [`GeminiError::InvalidResponse`] when the body is not JSON, is an error body,
/// has neither candidates nor a prompt block, or holds parts chat completions cannot show.
pub fn decode_response(body: &[u8], model: &str, created: u64) -> Result<Value, GeminiError> {
    let response = parse_response(body)?;
    let candidates = candidates_of(&response)?;
    let mut choices = Vec::with_capacity(candidates.len().max(1));
    if candidates.is_empty() {
        if block_reason(&response).is_none() {
            return Err(bad_response(
                "no candidates and no promptFeedback.blockReason",
            ));
        }
        choices.push(json!({
            "index": 0,
            "message": { "role": "assistant", "content": "" },
            "logprobs": null,
            "finish_reason": "content_filter",
        }));
    }
    for (pos, candidate) in candidates.iter().enumerate() {
        let index = candidate
            .get("index")
            .and_then(Value::as_u64)
            .unwrap_or(pos as u64);
        let parts = candidate_parts(candidate)?;
        let reason = candidate
            .get("finishReason")
            .and_then(Value::as_str)
            .unwrap_or("STOP");
        let finish = finish_reason(reason, !parts.calls.is_empty());
        let mut message = Map::new();
        message.insert("role".into(), json!("assistant"));
        let content = if parts.text.is_empty() && !parts.calls.is_empty() {
            Value::Null
        } else {
            Value::String(parts.text)
        };
        message.insert("content".into(), content);
        if !parts.calls.is_empty() {
            let calls: Vec<Value> = parts
                .calls
                .iter()
                .enumerate()
                .map(|(n, call)| tool_call_json(n, call))
                .collect();
            message.insert("tool_calls".into(), Value::Array(calls));
        }
        choices.push(json!({
            "index": index,
            "message": message,
            "logprobs": null,
            "finish_reason": finish,
        }));
    }
    let mut out = json!({
        "id": completion_id(&response, created),
        "object": "chat.completion",
        "created": created,
        "model": response.get("modelVersion").and_then(Value::as_str).unwrap_or(model),
        "choices": choices,
    });
    if let Some(meta) = response.get("usageMetadata").filter(|m| !m.is_null()) {
        out["usage"] = usage_json(meta)?;
    }
    Ok(out)
}

// ---------------------------------------------------------------------------------------------
// Stream

#[derive(Debug, Default)]
struct CandidateState {
    /// The role chunk was sent.
    started: bool,
    /// Function calls sent so far (the next call's index and id number).
    calls: usize,
    /// The finish chunk was sent.
    finished: bool,
}

/// Translates the body of `:streamGenerateContent?alt=sse` into OpenAI
/// `chat.completion.chunk` SSE events, incrementally.
///
/// Output, per candidate `index`: a role chunk (`delta: {role: "assistant"}`) when the
/// candidate first appears, one content chunk per upstream event with text (thought parts
/// left out), one chunk per function call (`tool_calls: [{index, id: "call_<n>", type,
/// function: {name, arguments}}]`, arguments complete in that one delta, as Gemini sends
/// whole calls), and a finish chunk (`delta: {}`, `finish_reason` as in [`decode_response`])
/// when Gemini gives a `finishReason`; a blocked prompt gives a role and a `content_filter`
/// finish chunk for index 0. At the end of the body, [`GeminiStream::finish`] emits the usage
/// chunk (`choices: []`, usage of the LAST `usageMetadata`, which Gemini sends cumulatively)
/// when `include_usage` and usage was seen, then `data: [DONE]`. Those two wait for the end of
/// the body because usage may follow the `finishReason` in a later event.
///
/// Failures never end with `[DONE]`: an upstream `{"error": {..}}` event is passed through
/// unchanged (Google's error shape, for the caller's classifier) and later input is ignored;
/// an event this module cannot translate becomes a Google-shaped error event
/// `{"error": {"code": 500, "status": "INTERNAL", "message": "switchyard: …"}}`; a body that
/// ends before every started candidate has a `finishReason` makes `finish` return only the
/// parser's [`SseItem::Incomplete`] tail if there is one, so the caller sees a cut stream.
/// Comments are passed through.
#[derive(Debug)]
pub struct GeminiStream {
    parser: SseParser,
    model: String,
    created: u64,
    include_usage: bool,
    id: Option<String>,
    /// Per candidate index.
    candidates: Vec<CandidateState>,
    /// OpenAI `usage` of the last `usageMetadata` seen.
    usage: Option<Value>,
    /// The prompt was blocked (`promptFeedback.blockReason` without candidates).
    blocked: bool,
    /// An error event was emitted; nothing more is sent.
    failed: bool,
    /// `[DONE]` was emitted.
    done: bool,
}

impl GeminiStream {
    /// A translator for one stream. `model` is reported until the body names its
    /// `modelVersion`; `created` is the Unix time in seconds for every chunk;
    /// `include_usage` is the client's `stream_options.include_usage`.
    pub fn new(model: &str, created: u64, include_usage: bool) -> Self {
        GeminiStream {
            parser: SseParser::new(),
            model: model.to_owned(),
            created,
            include_usage,
            id: None,
            candidates: Vec::new(),
            usage: None,
            blocked: false,
            failed: false,
            done: false,
        }
    }

    /// Feeds one network chunk of the upstream body; returns the OpenAI SSE items it completes.
    pub fn push(&mut self, chunk: &[u8]) -> Vec<SseItem> {
        let mut out = Vec::new();
        for item in self.parser.push(chunk) {
            if self.failed || self.done {
                break;
            }
            match item {
                SseItem::Event(event) => self.on_event(&event.data, &mut out),
                other => out.push(other),
            }
        }
        out
    }

    /// Ends the body: the usage chunk and `[DONE]` when the stream completed, otherwise only
    /// the parser's unterminated tail (see the type's docs).
    pub fn finish(&mut self) -> Vec<SseItem> {
        let tail = self.parser.finish();
        if self.failed || self.done {
            return Vec::new();
        }
        let mut out = Vec::new();
        match tail {
            Some(incomplete @ SseItem::Incomplete(_)) => return vec![incomplete],
            // A trailing comment is harmless; forward it either way.
            Some(comment) => out.push(comment),
            None => {}
        }
        if !self.complete() {
            return out;
        }
        if self.include_usage
            && let Some(usage) = self.usage.take()
        {
            let mut chunk = self.chunk(Vec::new());
            chunk["usage"] = usage;
            out.push(event(&chunk));
        }
        out.push(SseItem::Event(SseEvent::data("[DONE]")));
        self.done = true;
        out
    }

    /// Whether the upstream said it was done: a blocked prompt, or every candidate that
    /// started has a finish reason.
    fn complete(&self) -> bool {
        self.blocked
            || (self.candidates.iter().any(|c| c.started)
                && self
                    .candidates
                    .iter()
                    .filter(|c| c.started)
                    .all(|c| c.finished))
    }

    fn on_event(&mut self, data: &str, out: &mut Vec<SseItem>) {
        let value: Value = match serde_json::from_str(data) {
            Ok(v @ Value::Object(_)) => v,
            Ok(_) | Err(_) => {
                self.fail("an event is not a JSON object", out);
                return;
            }
        };
        if value.get("error").is_some() {
            out.push(SseItem::Event(SseEvent::data(data)));
            self.failed = true;
            return;
        }
        if let Err(e) = self.on_response(&value, out) {
            self.fail(&e.to_string(), out);
        }
    }

    fn fail(&mut self, message: &str, out: &mut Vec<SseItem>) {
        let error = json!({
            "error": {
                "code": 500,
                "status": "INTERNAL",
                "message": format!("switchyard: {message}"),
            }
        });
        out.push(event(&error));
        self.failed = true;
    }

    fn on_response(&mut self, response: &Value, out: &mut Vec<SseItem>) -> Result<(), GeminiError> {
        if self.id.is_none() {
            self.id = Some(completion_id(response, self.created));
            if let Some(version) = response.get("modelVersion").and_then(Value::as_str) {
                self.model = version.to_owned();
            }
        }
        if let Some(meta) = response.get("usageMetadata").filter(|m| !m.is_null()) {
            // Cumulative: the last value replaces the previous one.
            self.usage = Some(usage_json(meta)?);
        }
        let candidates = candidates_of(response)?;
        if candidates.is_empty() && block_reason(response).is_some() && !self.blocked {
            self.blocked = true;
            out.push(event(&self.choice_chunk(
                0,
                json!({ "role": "assistant" }),
                None,
            )));
            out.push(event(&self.choice_chunk(
                0,
                json!({}),
                Some("content_filter"),
            )));
            return Ok(());
        }
        for (pos, candidate) in candidates.iter().enumerate() {
            let index = candidate
                .get("index")
                .and_then(Value::as_u64)
                .unwrap_or(pos as u64);
            let slot = usize::try_from(index)
                .ok()
                .filter(|i| *i < 64)
                .ok_or_else(|| bad_response(format!("candidate index {index} out of range")))?;
            if self.candidates.len() <= slot {
                self.candidates
                    .resize_with(slot + 1, CandidateState::default);
            }
            if self.candidates[slot].finished {
                continue;
            }
            let parts = candidate_parts(candidate)?;
            if !self.candidates[slot].started {
                self.candidates[slot].started = true;
                out.push(event(&self.choice_chunk(
                    index,
                    json!({ "role": "assistant" }),
                    None,
                )));
            }
            if !parts.text.is_empty() {
                let delta = json!({ "content": parts.text });
                out.push(event(&self.choice_chunk(index, delta, None)));
            }
            for call in &parts.calls {
                let n = self.candidates[slot].calls;
                self.candidates[slot].calls += 1;
                let mut call = tool_call_json(n, call);
                call["index"] = json!(n);
                let delta = json!({ "tool_calls": [call] });
                out.push(event(&self.choice_chunk(index, delta, None)));
            }
            if let Some(reason) = candidate.get("finishReason").and_then(Value::as_str) {
                let state = &mut self.candidates[slot];
                state.finished = true;
                let finish = finish_reason(reason, state.calls > 0);
                out.push(event(&self.choice_chunk(index, json!({}), Some(finish))));
            }
        }
        Ok(())
    }

    fn chunk(&self, choices: Vec<Value>) -> Value {
        json!({
            "id": self.id.clone().unwrap_or_else(|| format!("chatcmpl-gemini-{}", self.created)),
            "object": "chat.completion.chunk",
            "created": self.created,
            "model": self.model,
            "choices": choices,
        })
    }

    fn choice_chunk(&self, index: u64, delta: Value, finish: Option<&str>) -> Value {
        self.chunk(vec![json!({
            "index": index,
            "delta": delta,
            "logprobs": null,
            "finish_reason": finish,
        })])
    }
}

fn event(value: &Value) -> SseItem {
    SseItem::Event(SseEvent::data(value.to_string()))
}

// ---------------------------------------------------------------------------------------------
// Transcription

/// A `generateContent` request asking Gemini for a verbatim transcript of `audio_base64` (the
/// audio bytes in standard base64, sent as `inlineData` with `mime_type`, e.g. `audio/wav`,
/// `audio/mp3`, `audio/flac`). `language` (ISO-639-1, as OpenAI's `language` field) and
/// `prompt` (OpenAI's `prompt`: spelling hints or the previous segment) are added to the
/// instruction; `temperature` is 0 for the most literal output.
pub fn encode_transcription(
    audio_base64: &str,
    mime_type: &str,
    language: Option<&str>,
    prompt: Option<&str>,
) -> Value {
    let mut instruction = String::from(
        "Transcribe the speech in this audio verbatim. Answer with the transcript text only: \
         no introduction, labels, timestamps, translation or commentary.",
    );
    if let Some(language) = language.filter(|l| !l.is_empty()) {
        instruction.push_str(&format!(
            " The audio is in the language with code `{language}`."
        ));
    }
    if let Some(prompt) = prompt.filter(|p| !p.is_empty()) {
        instruction.push_str(&format!(
            " Context for spelling and style, not to be transcribed: {prompt}"
        ));
    }
    json!({
        "contents": [{
            "role": "user",
            "parts": [
                { "text": instruction },
                { "inlineData": { "mimeType": mime_type, "data": audio_base64 } },
            ],
        }],
        "generationConfig": { "temperature": 0 },
    })
}

/// The transcript from the `generateContent` response to [`encode_transcription`]: the first
/// candidate's text (thought parts left out), trimmed, with (input, output) tokens:
/// `promptTokenCount` and `candidatesTokenCount + thoughtsTokenCount` (0 when the body has no
/// `usageMetadata`).
///
/// Errors: [`GeminiError::Blocked`] when the prompt or the output was blocked (a content
/// filter finish reason), [`GeminiError::InvalidResponse`] for a malformed or error body, no
/// candidate, a function call, or a transcript cut at the output limit (`MAX_TOKENS`).
pub fn decode_transcription(body: &[u8]) -> Result<(String, (u64, u64)), GeminiError> {
    let response = parse_response(body)?;
    let candidates = candidates_of(&response)?;
    let Some(candidate) = candidates.first() else {
        return Err(match block_reason(&response) {
            Some(reason) => GeminiError::Blocked(reason.to_owned()),
            None => bad_response("no candidates"),
        });
    };
    let reason = candidate
        .get("finishReason")
        .and_then(Value::as_str)
        .unwrap_or("STOP");
    match finish_reason(reason, false) {
        "content_filter" => return Err(GeminiError::Blocked(reason.to_owned())),
        "length" => {
            return Err(bad_response(
                "the transcript was cut at the output token limit",
            ));
        }
        _ => {}
    }
    let parts = candidate_parts(candidate)?;
    if !parts.calls.is_empty() {
        return Err(bad_response("a function call instead of a transcript"));
    }
    let (input, output) = match response.get("usageMetadata").filter(|m| !m.is_null()) {
        Some(meta) => (
            u64_member(meta, "promptTokenCount")?,
            u64_member(meta, "candidatesTokenCount")? + u64_member(meta, "thoughtsTokenCount")?,
        ),
        None => (0, 0),
    };
    Ok((parts.text.trim().to_owned(), (input, output)))
}

#[cfg(test)]
mod tests {
    use super::*;

    // A 1×1 transparent PNG.
    const PNG_B64: &str = "iVBORw0KGgoAAAANSUhEUgAAAAEAAAABCAQAAAC1HAwCAAAAC0lEQVR42mNkYAAAAAYAAjCB0C8AAAAASUVORK5CYII=";
    // "RIFF" + a few bytes, enough to be valid base64 standing in for a WAV file.
    const WAV_B64: &str = "UklGRiQAAABXQVZFZm10IBAAAAABAAEAQB8AAIA+AAACABAAZGF0YQAAAAA=";

    fn data_events(items: &[SseItem]) -> Vec<Value> {
        items
            .iter()
            .map(|item| match item {
                SseItem::Event(ev) if ev.data == "[DONE]" => json!("[DONE]"),
                SseItem::Event(ev) => serde_json::from_str(&ev.data).unwrap(),
                other => panic!("unexpected item {other:?}"),
            })
            .collect()
    }

    fn sse(values: &[Value]) -> Vec<u8> {
        let mut body = Vec::new();
        for v in values {
            // Vertex frames events with CRLF line endings.
            body.extend_from_slice(format!("data: {v}\r\n\r\n").as_bytes());
        }
        body
    }

    fn err_param(err: GeminiError) -> String {
        match err {
            GeminiError::Unsupported { param, .. } | GeminiError::InvalidRequest { param, .. } => {
                param
            }
            other => panic!("not a request error: {other:?}"),
        }
    }

    // ---- encode_request ---------------------------------------------------------------------

    #[test]
    fn encode_request_full_conversation_maps_every_member() {
        let chat = json!({
            "model": "gemini-2.5-flash",
            "stream": true,
            "stream_options": {"include_usage": true},
            "user": "tenant-7",
            "messages": [
                {"role": "system", "content": "You are a terse weather bot."},
                {"role": "developer", "content": [{"type": "text", "text": "Use metric units."}]},
                {"role": "user", "content": [
                    {"type": "text", "text": "Weather in Paris and Oslo? Also, what is in these?"},
                    {"type": "image_url", "image_url": {"url": format!("data:image/png;base64,{PNG_B64}"), "detail": "low"}},
                    {"type": "image_url", "image_url": {"url": "https://example.com/pics/sky.webp?size=large"}}
                ]},
                {"role": "assistant", "content": null, "tool_calls": [
                    {"id": "call_a", "type": "function", "function": {"name": "get_weather", "arguments": "{\"city\":\"Paris\"}"}},
                    {"id": "call_b", "type": "function", "function": {"name": "get_weather", "arguments": "{\"city\":\"Oslo\"}"}}
                ]},
                {"role": "tool", "tool_call_id": "call_a", "content": "{\"temp_c\": 18}"},
                {"role": "tool", "tool_call_id": "call_b", "content": "light rain"},
                {"role": "assistant", "content": "Paris 18 °C; Oslo light rain."},
                {"role": "user", "content": "Thanks"}
            ],
            "tools": [{"type": "function", "function": {
                "name": "get_weather",
                "description": "Current weather for a city",
                "strict": true,
                "parameters": {
                    "$schema": "http://json-schema.org/draft-07/schema#",
                    "type": "object",
                    "properties": {
                        "city": {"type": "string", "description": "City name"},
                        "unit": {"type": ["string", "null"], "enum": ["c", "f"]}
                    },
                    "required": ["city"],
                    "additionalProperties": false
                }
            }}],
            "tool_choice": "required",
            "max_tokens": 100,
            "max_completion_tokens": 256,
            "temperature": 0.3,
            "top_p": 0.9,
            "stop": "END",
            "n": 1,
            "seed": 42,
            "presence_penalty": 0.5,
            "frequency_penalty": -0.25,
            "parallel_tool_calls": true
        });
        let got = encode_request(&chat).unwrap();
        let want = json!({
            "systemInstruction": {"parts": [
                {"text": "You are a terse weather bot."},
                {"text": "Use metric units."}
            ]},
            "contents": [
                {"role": "user", "parts": [
                    {"text": "Weather in Paris and Oslo? Also, what is in these?"},
                    {"inlineData": {"mimeType": "image/png", "data": PNG_B64}},
                    {"fileData": {"mimeType": "image/webp", "fileUri": "https://example.com/pics/sky.webp?size=large"}}
                ]},
                {"role": "model", "parts": [
                    {"functionCall": {"name": "get_weather", "args": {"city": "Paris"}}},
                    {"functionCall": {"name": "get_weather", "args": {"city": "Oslo"}}}
                ]},
                {"role": "user", "parts": [
                    {"functionResponse": {"name": "get_weather", "response": {"content": {"temp_c": 18}}}},
                    {"functionResponse": {"name": "get_weather", "response": {"content": {"result": "light rain"}}}}
                ]},
                {"role": "model", "parts": [{"text": "Paris 18 °C; Oslo light rain."}]},
                {"role": "user", "parts": [{"text": "Thanks"}]}
            ],
            "tools": [{"functionDeclarations": [{
                "name": "get_weather",
                "description": "Current weather for a city",
                "parameters": {
                    "type": "OBJECT",
                    "properties": {
                        "city": {"type": "STRING", "description": "City name"},
                        "unit": {"type": "STRING", "enum": ["c", "f"], "nullable": true}
                    },
                    "required": ["city"]
                }
            }]}],
            "toolConfig": {"functionCallingConfig": {"mode": "ANY"}},
            "generationConfig": {
                "maxOutputTokens": 256,
                "temperature": 0.3,
                "topP": 0.9,
                "stopSequences": ["END"],
                "candidateCount": 1,
                "seed": 42,
                "presencePenalty": 0.5,
                "frequencyPenalty": -0.25
            }
        });
        assert_eq!(got, want);
    }

    #[test]
    fn encode_request_tool_choice_modes_map_to_function_calling_config() {
        let base = |choice: Value| {
            json!({
                "messages": [{"role": "user", "content": "hi"}],
                "tools": [{"type": "function", "function": {"name": "lookup",
                    "parameters": {"type": "object", "properties": {"q": {"type": "string"}}}}}],
                "tool_choice": choice
            })
        };
        let config = |choice: Value| {
            encode_request(&base(choice)).unwrap()["toolConfig"]["functionCallingConfig"].clone()
        };
        assert_eq!(config(json!("none")), json!({"mode": "NONE"}));
        assert_eq!(config(json!("auto")), json!({"mode": "AUTO"}));
        assert_eq!(config(json!("required")), json!({"mode": "ANY"}));
        assert_eq!(
            config(json!({"type": "function", "function": {"name": "lookup"}})),
            json!({"mode": "ANY", "allowedFunctionNames": ["lookup"]})
        );
        let err = encode_request(&base(json!("sometimes"))).unwrap_err();
        assert_eq!(err_param(err), "tool_choice");
    }

    #[test]
    fn encode_request_audio_parts_become_inline_data() {
        let chat = json!({"messages": [{"role": "user", "content": [
            {"type": "text", "text": "What is said?"},
            {"type": "input_audio", "input_audio": {"data": WAV_B64, "format": "wav"}},
            {"type": "input_audio", "input_audio": {"data": WAV_B64, "format": "mp3"}}
        ]}]});
        let got = encode_request(&chat).unwrap();
        assert_eq!(
            got["contents"][0]["parts"],
            json!([
                {"text": "What is said?"},
                {"inlineData": {"mimeType": "audio/wav", "data": WAV_B64}},
                {"inlineData": {"mimeType": "audio/mp3", "data": WAV_B64}}
            ])
        );
        assert!(got.get("generationConfig").is_none());
    }

    #[test]
    fn encode_request_response_format_sets_mime_and_cleaned_schema() {
        let json_object = json!({"messages": [{"role": "user", "content": "x"}],
            "response_format": {"type": "json_object"}});
        assert_eq!(
            encode_request(&json_object).unwrap()["generationConfig"],
            json!({"responseMimeType": "application/json"})
        );
        // A pydantic-style schema: $defs + $ref, Optional as anyOf with null, strict.
        let json_schema = json!({"messages": [{"role": "user", "content": "x"}],
        "response_format": {"type": "json_schema", "json_schema": {
            "name": "Trip", "strict": true,
            "schema": {
                "$defs": {"City": {"type": "object", "title": "City",
                    "properties": {"name": {"type": "string"}},
                    "required": ["name"], "additionalProperties": false}},
                "type": "object",
                "properties": {
                    "from": {"$ref": "#/$defs/City", "description": "departure"},
                    "note": {"anyOf": [{"type": "string"}, {"type": "null"}], "default": null,
                             "title": "Note"},
                    "legs": {"type": "array", "items": {"$ref": "#/$defs/City"}, "minItems": 1},
                    "kind": {"const": "trip"}
                },
                "required": ["from", "legs", "kind"],
                "additionalProperties": false
            }
        }}});
        let got = encode_request(&json_schema).unwrap();
        let city = json!({"type": "OBJECT", "title": "City",
            "properties": {"name": {"type": "STRING"}}, "required": ["name"]});
        let mut from = city.clone();
        from["description"] = json!("departure");
        assert_eq!(
            got["generationConfig"],
            json!({
                "responseMimeType": "application/json",
                "responseSchema": {
                    "type": "OBJECT",
                    "properties": {
                        "from": from,
                        "note": {"type": "STRING", "default": null, "title": "Note", "nullable": true},
                        "legs": {"type": "ARRAY", "items": city, "minItems": 1},
                        "kind": {"enum": ["trip"]}
                    },
                    "required": ["from", "legs", "kind"]
                }
            })
        );
    }

    #[test]
    fn encode_request_recursive_ref_is_refused() {
        let chat = json!({"messages": [{"role": "user", "content": "x"}],
        "tools": [{"type": "function", "function": {"name": "tree", "parameters": {
            "$defs": {"Node": {"type": "object", "properties": {
                "children": {"type": "array", "items": {"$ref": "#/$defs/Node"}}}}},
            "$ref": "#/$defs/Node"
        }}}]});
        let err = encode_request(&chat).unwrap_err();
        assert!(matches!(err, GeminiError::Unsupported { .. }), "{err:?}");
        assert!(err.to_string().contains("recursive"), "{err}");
    }

    #[test]
    fn encode_request_tool_without_arguments_has_no_parameters() {
        let chat = json!({"messages": [{"role": "user", "content": "time?"}],
            "tools": [{"type": "function", "function": {"name": "now",
                "parameters": {"type": "object", "properties": {}, "additionalProperties": false}}}]});
        assert_eq!(
            encode_request(&chat).unwrap()["tools"],
            json!([{"functionDeclarations": [{"name": "now"}]}])
        );
    }

    #[test]
    fn encode_request_stop_list_and_max_tokens_alone() {
        let chat = json!({"messages": [{"role": "user", "content": "count"}],
            "stop": ["7", "eight"], "max_tokens": 64, "n": 2});
        assert_eq!(
            encode_request(&chat).unwrap()["generationConfig"],
            json!({"stopSequences": ["7", "eight"], "maxOutputTokens": 64, "candidateCount": 2})
        );
    }

    #[test]
    fn encode_request_refuses_what_gemini_cannot_express() {
        let with = |key: &str, value: Value| {
            let mut chat = json!({"messages": [{"role": "user", "content": "hi"}]});
            chat[key] = value;
            encode_request(&chat).unwrap_err()
        };
        for (key, value) in [
            ("logit_bias", json!({"50256": -100})),
            ("logprobs", json!(true)),
            ("top_logprobs", json!(3)),
            ("parallel_tool_calls", json!(false)),
            ("metadata", json!({"k": "v"})),
            ("reasoning_effort", json!("low")),
            ("functions", json!([])),
        ] {
            let err = with(key, value);
            assert!(
                matches!(err, GeminiError::Unsupported { .. }),
                "{key}: {err:?}"
            );
            assert!(
                err.to_string().contains(&format!("`{key}`")),
                "{key}: {err}"
            );
        }
        // Harmless values of the same members pass.
        let ok = json!({"messages": [{"role": "user", "content": "hi"}],
            "logprobs": false, "logit_bias": null, "top_logprobs": 0});
        assert!(encode_request(&ok).is_ok());
    }

    #[test]
    fn encode_request_refuses_unexpressible_content() {
        let user = |part: Value| json!({"messages": [{"role": "user", "content": [part]}]});
        let err = encode_request(&user(
            json!({"type": "image_url", "image_url": {"url": "ftp://example.com/a.png"}}),
        ))
        .unwrap_err();
        assert!(matches!(err, GeminiError::Unsupported { .. }));
        assert_eq!(err_param(err), "messages[0].content[0].image_url.url");

        let err = encode_request(&user(
            json!({"type": "image_url", "image_url": {"url": "data:image/png,rawbytes"}}),
        ))
        .unwrap_err();
        assert!(matches!(err, GeminiError::Unsupported { .. }));

        let err = encode_request(&user(
            json!({"type": "image_url", "image_url": {"url": "data:image/png;base64,@@@"}}),
        ))
        .unwrap_err();
        assert!(matches!(err, GeminiError::InvalidRequest { .. }));
        assert!(err.to_string().contains("base64"));

        let err = encode_request(&user(
            json!({"type": "input_audio", "input_audio": {"data": WAV_B64, "format": "ogg"}}),
        ))
        .unwrap_err();
        assert_eq!(err_param(err), "messages[0].content[0].input_audio.format");

        let err = encode_request(&user(
            json!({"type": "file", "file": {"file_id": "file-123"}}),
        ))
        .unwrap_err();
        assert_eq!(err_param(err), "messages[0].content[0].type");

        let err = encode_request(&json!({"messages": [{"role": "user", "content": "x"}],
            "tools": [{"type": "web_search"}]}))
        .unwrap_err();
        assert_eq!(err_param(err), "tools[0].type");
    }

    #[test]
    fn encode_request_rejects_malformed_tool_turns() {
        let orphan = json!({"messages": [
            {"role": "user", "content": "hi"},
            {"role": "tool", "tool_call_id": "call_zz", "content": "42"}
        ]});
        let err = encode_request(&orphan).unwrap_err();
        assert!(matches!(err, GeminiError::InvalidRequest { .. }));
        assert!(err.to_string().contains("call_zz"), "{err}");

        let bad_args = json!({"messages": [
            {"role": "user", "content": "hi"},
            {"role": "assistant", "tool_calls": [{"id": "c", "type": "function",
                "function": {"name": "f", "arguments": "[1, 2"}}]}
        ]});
        assert_eq!(
            err_param(encode_request(&bad_args).unwrap_err()),
            "messages[1].tool_calls[0].function.arguments"
        );

        let no_turns = json!({"messages": [{"role": "system", "content": "be nice"}]});
        assert_eq!(
            err_param(encode_request(&no_turns).unwrap_err()),
            "messages"
        );

        let bad_temp =
            json!({"messages": [{"role": "user", "content": "x"}], "temperature": "hot"});
        assert_eq!(
            err_param(encode_request(&bad_temp).unwrap_err()),
            "temperature"
        );
    }

    #[test]
    fn encode_request_repeated_call_ids_take_the_latest_name() {
        // Ids from this module's responses restart at call_0 every turn.
        let chat = json!({"messages": [
            {"role": "user", "content": "a"},
            {"role": "assistant", "tool_calls": [{"id": "call_0", "type": "function",
                "function": {"name": "first", "arguments": "{}"}}]},
            {"role": "tool", "tool_call_id": "call_0", "content": "1"},
            {"role": "assistant", "tool_calls": [{"id": "call_0", "type": "function",
                "function": {"name": "second", "arguments": ""}}]},
            {"role": "tool", "tool_call_id": "call_0", "content": "2"}
        ]});
        let got = encode_request(&chat).unwrap();
        let contents = got["contents"].as_array().unwrap();
        assert_eq!(contents.len(), 5);
        assert_eq!(contents[2]["parts"][0]["functionResponse"]["name"], "first");
        assert_eq!(
            contents[2]["parts"][0]["functionResponse"]["response"],
            json!({"content": 1})
        );
        assert_eq!(
            contents[3]["parts"][0]["functionCall"],
            json!({"name": "second", "args": {}})
        );
        assert_eq!(
            contents[4]["parts"][0]["functionResponse"]["name"],
            "second"
        );
    }

    #[test]
    fn guess_image_mime_reads_extension_or_defaults_to_jpeg() {
        assert_eq!(guess_image_mime("https://x.test/a/B.PNG"), "image/png");
        assert_eq!(guess_image_mime("gs://bucket/c.heic#frag"), "image/heic");
        assert_eq!(guess_image_mime("https://x.test/photo.jpeg"), "image/jpeg");
        assert_eq!(guess_image_mime("https://x.test/image?id=3"), "image/jpeg");
    }

    // ---- decode_response --------------------------------------------------------------------

    #[test]
    fn decode_response_text_with_thoughts_and_cached_usage() {
        let body = json!({
            "candidates": [{
                "content": {"role": "model", "parts": [
                    {"text": "Let me think about units...", "thought": true},
                    {"text": "Paris is 18 °C "},
                    {"text": "and sunny."}
                ]},
                "finishReason": "STOP",
                "avgLogprobs": -0.12
            }],
            "usageMetadata": {
                "promptTokenCount": 1200,
                "cachedContentTokenCount": 1024,
                "candidatesTokenCount": 9,
                "thoughtsTokenCount": 31,
                "totalTokenCount": 1240,
                "trafficType": "ON_DEMAND"
            },
            "modelVersion": "gemini-2.5-flash-001",
            "createTime": "2026-12-01T23:00:00.000000Z",
            "responseId": "abc123"
        });
        let got = decode_response(
            body.to_string().as_bytes(),
            "gemini-2.5-flash",
            1_764_630_000,
        )
        .unwrap();
        assert_eq!(
            got,
            json!({
                "id": "chatcmpl-abc123",
                "object": "chat.completion",
                "created": 1_764_630_000u64,
                "model": "gemini-2.5-flash-001",
                "choices": [{
                    "index": 0,
                    "message": {"role": "assistant", "content": "Paris is 18 °C and sunny."},
                    "logprobs": null,
                    "finish_reason": "stop"
                }],
                "usage": {
                    "prompt_tokens": 1200,
                    "completion_tokens": 40,
                    "total_tokens": 1240,
                    "prompt_tokens_details": {"cached_tokens": 1024},
                    "completion_tokens_details": {"reasoning_tokens": 31}
                }
            })
        );
    }

    #[test]
    fn decode_response_function_calls_become_tool_calls() {
        let body = json!({
            "candidates": [{
                "content": {"role": "model", "parts": [
                    {"functionCall": {"name": "get_weather", "args": {"city": "Paris"}},
                     "thoughtSignature": "c2lnbmF0dXJl"},
                    {"functionCall": {"name": "get_time", "args": {}}}
                ]},
                "finishReason": "STOP"
            }],
            "usageMetadata": {"promptTokenCount": 50, "candidatesTokenCount": 12, "totalTokenCount": 62}
        });
        let got = decode_response(body.to_string().as_bytes(), "gemini-2.5-pro", 7).unwrap();
        assert_eq!(got["id"], "chatcmpl-gemini-7");
        assert_eq!(got["model"], "gemini-2.5-pro");
        assert_eq!(
            got["choices"][0],
            json!({
                "index": 0,
                "message": {"role": "assistant", "content": null, "tool_calls": [
                    {"id": "call_0", "type": "function",
                     "function": {"name": "get_weather", "arguments": "{\"city\":\"Paris\"}"},
                     "extra_content": {"google": {"thought_signature": "c2lnbmF0dXJl"}}},
                    {"id": "call_1", "type": "function",
                     "function": {"name": "get_time", "arguments": "{}"}}
                ]},
                "logprobs": null,
                "finish_reason": "tool_calls"
            })
        );
        assert_eq!(
            got["usage"],
            json!({"prompt_tokens": 50, "completion_tokens": 12, "total_tokens": 62,
                "prompt_tokens_details": {"cached_tokens": 0},
                "completion_tokens_details": {"reasoning_tokens": 0}})
        );
    }

    #[test]
    fn thought_signature_round_trips_through_the_openai_history() {
        // Turn 1: Gemini 3 calls a function and signs the call.
        let turn1 = json!({"candidates": [{"content": {"role": "model", "parts": [
            {"functionCall": {"name": "lookup", "args": {"q": "rust"}}, "thoughtSignature": "Q2lRQmpz"}
        ]}, "finishReason": "STOP"}]});
        let reply = decode_response(turn1.to_string().as_bytes(), "gemini-3-pro", 1).unwrap();
        // Turn 2: the client appends the assistant message as received plus the tool result.
        let chat = json!({"messages": [
            {"role": "user", "content": "search rust"},
            reply["choices"][0]["message"].clone(),
            {"role": "tool", "tool_call_id": "call_0", "content": "{\"hits\": 3}"}
        ]});
        let got = encode_request(&chat).unwrap();
        assert_eq!(
            got["contents"][1],
            json!({"role": "model", "parts": [{"functionCall": {"name": "lookup", "args": {"q": "rust"}},
                "thoughtSignature": "Q2lRQmpz"}]})
        );
        assert_eq!(
            got["contents"][2]["parts"][0]["functionResponse"],
            json!({"name": "lookup", "response": {"content": {"hits": 3}}})
        );
    }

    #[test]
    fn decode_response_finish_reasons_and_candidates_by_index() {
        let body = json!({"candidates": [
            {"index": 0, "content": {"role": "model", "parts": [{"text": "one two"}]}, "finishReason": "MAX_TOKENS"},
            {"index": 1, "content": {"role": "model", "parts": [{"text": "partial"}]}, "finishReason": "SAFETY"},
            {"index": 2, "content": {"role": "model", "parts": [{"text": "x"}]}, "finishReason": "RECITATION"},
            {"index": 3, "finishReason": "SPII"},
            {"index": 4, "content": {"role": "model", "parts": [{"text": "y"}]}, "finishReason": "OTHER"}
        ]});
        let got = decode_response(body.to_string().as_bytes(), "m", 1).unwrap();
        let reasons: Vec<&str> = got["choices"]
            .as_array()
            .unwrap()
            .iter()
            .map(|c| c["finish_reason"].as_str().unwrap())
            .collect();
        assert_eq!(
            reasons,
            [
                "length",
                "content_filter",
                "content_filter",
                "content_filter",
                "stop"
            ]
        );
        assert_eq!(got["choices"][1]["index"], 1);
        assert_eq!(got["choices"][3]["message"]["content"], "");
        assert!(
            got.get("usage").is_none(),
            "no usageMetadata, no made-up usage"
        );
    }

    #[test]
    fn decode_response_blocked_prompt_is_content_filter() {
        let body = json!({
            "promptFeedback": {"blockReason": "PROHIBITED_CONTENT",
                "blockReasonMessage": "The prompt was blocked"},
            "usageMetadata": {"promptTokenCount": 8, "totalTokenCount": 8},
            "modelVersion": "gemini-2.5-flash",
            "responseId": "blk"
        });
        let got = decode_response(body.to_string().as_bytes(), "x", 3).unwrap();
        assert_eq!(
            got["choices"],
            json!([{"index": 0, "message": {"role": "assistant", "content": ""},
                "logprobs": null, "finish_reason": "content_filter"}])
        );
        assert_eq!(got["usage"]["prompt_tokens"], 8);
        assert_eq!(got["usage"]["completion_tokens"], 0);
    }

    #[test]
    fn decode_response_rejects_malformed_and_unshowable_bodies() {
        for body in [
            b"not json".to_vec(),
            b"[]".to_vec(),
            br#"{"error":{"code":429,"status":"RESOURCE_EXHAUSTED","message":"quota"}}"#.to_vec(),
            br#"{"candidates":[]}"#.to_vec(),
            br#"{"candidates":[{"content":{"parts":[{"inlineData":{"mimeType":"image/png","data":"AA=="}}]},"finishReason":"STOP"}]}"#.to_vec(),
            br#"{"candidates":[{"finishReason":"STOP"}],"usageMetadata":{"promptTokenCount":-1}}"#.to_vec(),
        ] {
            let err = decode_response(&body, "m", 1).unwrap_err();
            assert!(
                matches!(err, GeminiError::InvalidResponse(_)),
                "{}: {err:?}",
                String::from_utf8_lossy(&body)
            );
        }
    }

    // ---- GeminiStream -----------------------------------------------------------------------

    #[test]
    fn stream_text_takes_last_cumulative_usage() {
        let body = sse(&[
            json!({"candidates": [{"content": {"role": "model", "parts": [{"text": "The sky"}]}}],
                "usageMetadata": {"promptTokenCount": 10, "candidatesTokenCount": 2, "totalTokenCount": 12, "trafficType": "ON_DEMAND"},
                "modelVersion": "gemini-2.5-flash", "createTime": "2026-12-01T23:00:00Z", "responseId": "r1"}),
            json!({"candidates": [{"content": {"role": "model", "parts": [{"text": " is blue"}]}}],
                "usageMetadata": {"promptTokenCount": 10, "candidatesTokenCount": 5, "totalTokenCount": 15},
                "modelVersion": "gemini-2.5-flash", "responseId": "r1"}),
            json!({"candidates": [{"content": {"role": "model", "parts": [{"text": "."}]}, "finishReason": "STOP"}],
                "usageMetadata": {"promptTokenCount": 10, "cachedContentTokenCount": 4, "candidatesTokenCount": 6,
                    "thoughtsTokenCount": 20, "totalTokenCount": 36},
                "modelVersion": "gemini-2.5-flash", "responseId": "r1"}),
        ]);
        let mut stream = GeminiStream::new("gemini-flash", 99, true);
        let mut items = Vec::new();
        // Odd network chunk sizes: events and CRLFs are split across pushes.
        for piece in body.chunks(7) {
            items.extend(stream.push(piece));
        }
        items.extend(stream.finish());
        let chunk = |choices: Value| {
            json!({"id": "chatcmpl-r1", "object": "chat.completion.chunk", "created": 99,
                "model": "gemini-2.5-flash", "choices": choices})
        };
        let delta = |delta: Value, finish: Value| {
            chunk(json!([{"index": 0, "delta": delta, "logprobs": null, "finish_reason": finish}]))
        };
        let mut usage_chunk = chunk(json!([]));
        usage_chunk["usage"] = json!({
            "prompt_tokens": 10, "completion_tokens": 26, "total_tokens": 36,
            "prompt_tokens_details": {"cached_tokens": 4},
            "completion_tokens_details": {"reasoning_tokens": 20}
        });
        assert_eq!(
            data_events(&items),
            vec![
                delta(json!({"role": "assistant"}), Value::Null),
                delta(json!({"content": "The sky"}), Value::Null),
                delta(json!({"content": " is blue"}), Value::Null),
                delta(json!({"content": "."}), Value::Null),
                delta(json!({}), json!("stop")),
                usage_chunk,
                json!("[DONE]"),
            ]
        );
    }

    #[test]
    fn stream_function_call_is_one_tool_call_delta() {
        let body = sse(&[
            json!({"candidates": [{"content": {"role": "model", "parts": [
                {"text": "thinking about it", "thought": true}]}}],
                "usageMetadata": {"promptTokenCount": 30, "thoughtsTokenCount": 8, "totalTokenCount": 38},
                "responseId": "fc"}),
            json!({"candidates": [{"content": {"role": "model", "parts": [
                {"functionCall": {"name": "get_weather", "args": {"city": "Oslo", "unit": "c"}},
                 "thoughtSignature": "c2ln"},
                {"functionCall": {"name": "get_weather", "args": {"city": "Bergen"}}}]}}],
                "usageMetadata": {"promptTokenCount": 30, "candidatesTokenCount": 14, "thoughtsTokenCount": 8, "totalTokenCount": 52},
                "responseId": "fc"}),
            json!({"candidates": [{"content": {"role": "model", "parts": [{"text": ""}]}, "finishReason": "STOP"}],
                "usageMetadata": {"promptTokenCount": 30, "candidatesTokenCount": 14, "thoughtsTokenCount": 8, "totalTokenCount": 52},
                "responseId": "fc"}),
        ]);
        let mut stream = GeminiStream::new("gemini-2.5-pro", 5, false);
        let mut items = stream.push(&body);
        items.extend(stream.finish());
        let events = data_events(&items);
        let deltas: Vec<Value> = events
            .iter()
            .filter(|e| e.is_object())
            .map(|e| e["choices"][0]["delta"].clone())
            .collect();
        assert_eq!(
            deltas,
            vec![
                json!({"role": "assistant"}),
                json!({"tool_calls": [{"index": 0, "id": "call_0", "type": "function",
                    "function": {"name": "get_weather", "arguments": "{\"city\":\"Oslo\",\"unit\":\"c\"}"},
                    "extra_content": {"google": {"thought_signature": "c2ln"}}}]}),
                json!({"tool_calls": [{"index": 1, "id": "call_1", "type": "function",
                    "function": {"name": "get_weather", "arguments": "{\"city\":\"Bergen\"}"}}]}),
                json!({}),
            ]
        );
        assert_eq!(events[3]["choices"][0]["finish_reason"], "tool_calls");
        assert_eq!(events[0]["model"], "gemini-2.5-pro");
        // include_usage is false: no usage chunk, still [DONE].
        assert_eq!(events.len(), 5);
        assert_eq!(events[4], json!("[DONE]"));
    }

    #[test]
    fn stream_output_does_not_depend_on_network_chunking() {
        let body = sse(&[
            json!({"candidates": [{"content": {"parts": [{"text": "Grüß "}]}}], "responseId": "s"}),
            json!({"candidates": [{"content": {"parts": [{"text": "Gott"},
                {"functionCall": {"name": "f", "args": {"x": 1}}}]}, "finishReason": "STOP"}],
                "usageMetadata": {"promptTokenCount": 2, "candidatesTokenCount": 3, "totalTokenCount": 5}}),
        ]);
        let run = |pieces: &[&[u8]]| {
            let mut stream = GeminiStream::new("m", 1, true);
            let mut items: Vec<SseItem> = pieces.iter().flat_map(|p| stream.push(p)).collect();
            items.extend(stream.finish());
            items
        };
        let whole = run(&[&body]);
        assert_eq!(data_events(&whole).len(), 7);
        // Every split point, including inside the multi-byte "ü" and between CR and LF.
        for at in 0..=body.len() {
            let (a, b) = body.split_at(at);
            assert_eq!(run(&[a, b]), whole, "split at {at}");
        }
    }

    #[test]
    fn stream_cut_before_finish_reason_never_says_done() {
        let first = sse(&[
            json!({"candidates": [{"content": {"parts": [{"text": "Hel"}]}}],
            "usageMetadata": {"promptTokenCount": 3, "candidatesTokenCount": 1, "totalTokenCount": 4}}),
        ]);
        // Cut at an event boundary: finish has nothing to add.
        let mut stream = GeminiStream::new("m", 1, true);
        assert_eq!(stream.push(&first).len(), 2);
        assert_eq!(stream.finish(), Vec::new());

        // Cut in the middle of an event: the parser's Incomplete tail is handed back.
        let mut stream = GeminiStream::new("m", 1, true);
        stream.push(&first);
        assert!(
            stream
                .push(br#"data: {"candidates": [{"content": {"parts": [{"te"#)
                .is_empty()
        );
        let tail = stream.finish();
        assert_eq!(tail.len(), 1);
        assert!(
            matches!(&tail[0], SseItem::Incomplete(ev) if ev.data.starts_with("{\"candidates\""))
        );
    }

    #[test]
    fn stream_error_event_is_passed_through_without_done() {
        let error = r#"{"error":{"code":429,"status":"RESOURCE_EXHAUSTED","message":"Resource exhausted. Please try again later."}}"#;
        let mut body = sse(&[json!({"candidates": [{"content": {"parts": [{"text": "Hi"}]}}]})]);
        body.extend_from_slice(format!("data: {error}\r\n\r\n").as_bytes());
        body.extend_from_slice(&sse(&[json!({"candidates": [{"content": {"parts": [{"text": "late"}]}, "finishReason": "STOP"}]})]));
        let mut stream = GeminiStream::new("m", 1, true);
        let mut items = stream.push(&body);
        items.extend(stream.finish());
        assert_eq!(items.len(), 3, "{items:?}");
        assert_eq!(items[2], SseItem::Event(SseEvent::data(error)));
    }

    #[test]
    fn stream_undecodable_event_becomes_google_shaped_error() {
        let mut stream = GeminiStream::new("m", 1, true);
        let items = stream.push(b"data: {\"candidates\": 5}\n\n");
        let events = data_events(&items);
        assert_eq!(events.len(), 1);
        assert_eq!(events[0]["error"]["code"], 500);
        assert_eq!(events[0]["error"]["status"], "INTERNAL");
        assert!(stream.finish().is_empty());
    }

    #[test]
    fn stream_blocked_prompt_finishes_with_content_filter() {
        let body = sse(&[json!({"promptFeedback": {"blockReason": "SAFETY"},
            "usageMetadata": {"promptTokenCount": 6, "totalTokenCount": 6}, "responseId": "b"})]);
        let mut stream = GeminiStream::new("m", 2, true);
        let mut items = stream.push(&body);
        items.extend(stream.finish());
        let events = data_events(&items);
        assert_eq!(events.len(), 4);
        assert_eq!(events[1]["choices"][0]["finish_reason"], "content_filter");
        assert_eq!(events[2]["usage"]["prompt_tokens"], 6);
        assert_eq!(events[3], json!("[DONE]"));
    }

    #[test]
    fn stream_two_candidates_finish_independently() {
        let body = sse(&[
            json!({"candidates": [
                {"index": 0, "content": {"parts": [{"text": "A"}]}},
                {"index": 1, "content": {"parts": [{"text": "B"}]}, "finishReason": "MAX_TOKENS"}]}),
            json!({"candidates": [{"index": 0, "content": {"parts": [{"text": "A2"}]}}]}),
        ]);
        let mut stream = GeminiStream::new("m", 1, false);
        let items = stream.push(&body);
        let events = data_events(&items);
        let finishes: Vec<(Value, Value)> = events
            .iter()
            .filter(|e| !e["choices"][0]["finish_reason"].is_null())
            .map(|e| {
                (
                    e["choices"][0]["index"].clone(),
                    e["choices"][0]["finish_reason"].clone(),
                )
            })
            .collect();
        assert_eq!(finishes, vec![(json!(1), json!("length"))]);
        // Candidate 0 never finished: no [DONE].
        assert!(stream.finish().is_empty());
    }

    // ---- transcription ----------------------------------------------------------------------

    #[test]
    fn encode_transcription_builds_instruction_and_inline_audio() {
        let got =
            encode_transcription(WAV_B64, "audio/wav", Some("de"), Some("Names: Jürgen, Qi."));
        let parts = &got["contents"][0]["parts"];
        let instruction = parts[0]["text"].as_str().unwrap();
        assert!(instruction.contains("verbatim"), "{instruction}");
        assert!(instruction.contains("`de`"), "{instruction}");
        assert!(instruction.contains("Names: Jürgen, Qi."), "{instruction}");
        assert_eq!(
            parts[1],
            json!({"inlineData": {"mimeType": "audio/wav", "data": WAV_B64}})
        );
        assert_eq!(got["contents"][0]["role"], "user");
        assert_eq!(got["generationConfig"], json!({"temperature": 0}));

        let plain = encode_transcription(WAV_B64, "audio/mp3", None, Some(""));
        let text = plain["contents"][0]["parts"][0]["text"].as_str().unwrap();
        assert!(
            !text.contains("language") && !text.contains("Context"),
            "{text}"
        );
    }

    #[test]
    fn decode_transcription_returns_trimmed_text_and_tokens() {
        let body = json!({
            "candidates": [{"content": {"role": "model", "parts": [{"text": "  Hallo, hier spricht Jürgen.\n"}]},
                "finishReason": "STOP"}],
            "usageMetadata": {"promptTokenCount": 160, "candidatesTokenCount": 9,
                "thoughtsTokenCount": 3, "totalTokenCount": 172,
                "promptTokensDetails": [{"modality": "AUDIO", "tokenCount": 150}, {"modality": "TEXT", "tokenCount": 10}]}
        });
        assert_eq!(
            decode_transcription(body.to_string().as_bytes()).unwrap(),
            ("Hallo, hier spricht Jürgen.".to_owned(), (160, 12))
        );
    }

    #[test]
    fn decode_transcription_refuses_blocked_cut_and_empty_answers() {
        let blocked = json!({"promptFeedback": {"blockReason": "SAFETY"}});
        assert_eq!(
            decode_transcription(blocked.to_string().as_bytes()).unwrap_err(),
            GeminiError::Blocked("SAFETY".into())
        );
        let filtered = json!({"candidates": [{"finishReason": "RECITATION"}]});
        assert_eq!(
            decode_transcription(filtered.to_string().as_bytes()).unwrap_err(),
            GeminiError::Blocked("RECITATION".into())
        );
        let cut = json!({"candidates": [{"content": {"parts": [{"text": "and then"}]}, "finishReason": "MAX_TOKENS"}]});
        assert!(matches!(
            decode_transcription(cut.to_string().as_bytes()).unwrap_err(),
            GeminiError::InvalidResponse(_)
        ));
        assert!(matches!(
            decode_transcription(b"{}").unwrap_err(),
            GeminiError::InvalidResponse(_)
        ));
    }
}
