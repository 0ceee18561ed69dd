//! Translation between the OpenAI chat-completions dialect and the Anthropic Messages dialect,
//! in both directions, for requests, responses and (in [`stream`]) SSE streams.
//!
//! Request mapping, OpenAI → Anthropic (the reverse mirrors it):
//! - `system`/`developer` messages → `system` (one text block each, in order);
//! - `user` text and `image_url` parts → text and image blocks (`data:` URLs become base64
//!   sources, other URLs `url` sources);
//! - assistant `tool_calls` → `tool_use` blocks (arguments string parsed into the `input`
//!   object); `tool` messages → `tool_result` blocks in a user turn; consecutive turns of the
//!   same role are merged, because Anthropic expects alternating turns with all tool results of
//!   one assistant turn in the next user turn;
//! - `tools[].function.parameters` → `tools[].input_schema`; `tool_choice` `auto`/`none`/
//!   `required`/named → `auto`/`none`/`any`/`tool`; `parallel_tool_calls: false` →
//!   `disable_parallel_tool_use: true`;
//! - `max_completion_tokens` (else `max_tokens`, else the route default, because Anthropic
//!   requires it) → `max_tokens`; `stop` → `stop_sequences`; `temperature` clamped to 0..=1
//!   (Anthropic's range; OpenAI allows up to 2); `user` → `metadata.user_id`.
//!
//! `response_format` `json_schema` → Anthropic structured outputs (`output_format`), `text` →
//! nothing (the default).
//!
//! Members with no counterpart are not silently lost: they are listed in
//! [`Translated::dropped`], and the dispatcher refuses the request with 400 naming them unless
//! the route opts into lossy translation (then they are listed in the
//! `x-switchyard-dropped-parameters` response header). Content the target cannot express
//! at all (e.g. `n > 1`, audio parts, Anthropic server tools) is a [`TranslateError`] that
//! the dispatcher answers with 400 rather than sending a different request.
//!
//! Response mapping: text blocks ↔ `message.content`, `tool_use` ↔ `tool_calls`, stop
//! reasons `end_turn`/`stop_sequence` ↔ `stop`, `max_tokens` ↔ `length`, `tool_use` ↔
//! `tool_calls`, `refusal` ↔ `content_filter`; usage through
//! [`NormalizedUsage`](super::usage::NormalizedUsage) so cache counts keep their meaning.
//!
//! Alternative rejected: a lossless intermediate representation of both dialects. The two
//! APIs evolve independently; a pairwise mapping of the members that matter, plus verbatim
//! pass-through for same-dialect traffic, keeps the lossy path small and visible.

mod stream;

pub use stream::StreamTranslator;

use serde_json::{Map, Value, json};

use super::usage::NormalizedUsage;
use super::{anthropic, openai};

/// Translation failure. `Unsupported` and `InvalidRequest` are client errors (400);
/// `InvalidUpstream` is a provider fault (the provider sent something that cannot be shown to
/// the client).
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum TranslateError {
    /// The request uses a feature the target dialect cannot express.
    #[error("unsupported when translating: {0}")]
    Unsupported(String),
    /// The request is malformed (e.g. tool arguments that are not JSON).
    #[error("invalid request: {0}")]
    InvalidRequest(String),
    /// The provider's response or stream cannot be translated.
    #[error("invalid upstream response: {0}")]
    InvalidUpstream(String),
}

/// A translated value plus the names of members that had no counterpart and were left out.
#[derive(Clone, Debug, PartialEq)]
pub struct Translated<T> {
    /// The translated value.
    pub value: T,
    /// Top-level members of the source that were dropped (for logging; never prompt content).
    pub dropped: Vec<String>,
}

/// Settings of request translation.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct RequestOptions {
    /// `max_tokens` sent to Anthropic when the OpenAI client set no output cap (the route's
    /// default output estimate, DESIGN §3.2).
    pub default_max_tokens: u64,
}

// ---------------------------------------------------------------------------------------------
// OpenAI request → Anthropic request

/// Translates an OpenAI chat request into an Anthropic Messages request (see module docs).
///
/// Errors: [`TranslateError::Unsupported`] for `n > 1`, non-text system content, parts other
/// than text and images, legacy `function` messages and non-function tools;
/// [`TranslateError::InvalidRequest`] for tool-call arguments that are not a JSON object and
/// tool messages without `tool_call_id`.
pub fn openai_to_anthropic_request(
    req: openai::ChatRequest,
    opts: RequestOptions,
) -> Result<Translated<anthropic::MessagesRequest>, TranslateError> {
    if req.n.is_some_and(|n| n != 1) {
        return Err(TranslateError::Unsupported("n other than 1".into()));
    }
    let mut dropped: Vec<String> = req.extra.keys().cloned().collect();
    // `response_format`: plain text is Anthropic's default; a JSON schema maps to Anthropic's
    // structured outputs (`output_format: {type: json_schema, schema}`); `json_object` has no
    // equivalent and stays in `dropped`.
    let mut extra = Map::new();
    if let Some(format) = req.extra.get("response_format") {
        let kind = format.get("type").and_then(Value::as_str);
        let schema = format.pointer("/json_schema/schema");
        match (kind, schema) {
            (Some("text"), _) => dropped.retain(|k| k != "response_format"),
            (Some("json_schema"), Some(schema)) => {
                extra.insert(
                    "output_format".to_owned(),
                    json!({"type": "json_schema", "schema": schema}),
                );
                dropped.retain(|k| k != "response_format");
            }
            _ => {}
        }
    }
    dropped.sort();
    let max_tokens = req.output_cap().unwrap_or(opts.default_max_tokens);
    let mut system = Vec::new();
    let mut turns: Vec<anthropic::Message> = Vec::new();
    for msg in req.messages {
        match msg.role {
            openai::Role::System | openai::Role::Developer => {
                let text = match msg.content {
                    None => String::new(),
                    Some(openai::MessageContent::Text(t)) => t,
                    Some(openai::MessageContent::Parts(parts)) => {
                        let mut text = String::new();
                        for part in parts {
                            match part {
                                openai::ContentPart::Known(openai::KnownPart::Text {
                                    text: t,
                                    ..
                                }) => text.push_str(&t),
                                other => {
                                    return Err(TranslateError::Unsupported(format!(
                                        "system content part of type {}",
                                        part_type(&other)
                                    )));
                                }
                            }
                        }
                        text
                    }
                };
                // Anthropic rejects empty text blocks; an empty system message says nothing.
                if !text.is_empty() {
                    system.push(anthropic::ContentBlock::text(text));
                }
            }
            openai::Role::User => {
                let blocks = match msg.content {
                    None => Vec::new(),
                    Some(content) => user_content_to_blocks(content)?,
                };
                push_turn(&mut turns, anthropic::Role::User, blocks);
            }
            openai::Role::Assistant => {
                let mut blocks = Vec::new();
                if let Some(content) = msg.content {
                    let text = content.joined_text();
                    if !text.is_empty() {
                        blocks.push(anthropic::ContentBlock::text(text));
                    }
                }
                for call in msg.tool_calls.unwrap_or_default() {
                    blocks.push(anthropic::ContentBlock::Known(anthropic::Block::ToolUse {
                        input: parse_arguments(&call.function.arguments)
                            .map_err(TranslateError::InvalidRequest)?,
                        id: call.id,
                        name: call.function.name,
                        extra: Map::new(),
                    }));
                }
                push_turn(&mut turns, anthropic::Role::Assistant, blocks);
            }
            openai::Role::Tool => {
                let tool_use_id = msg.tool_call_id.ok_or_else(|| {
                    TranslateError::InvalidRequest("tool message without tool_call_id".into())
                })?;
                let text = msg.content.map(|c| c.joined_text()).unwrap_or_default();
                let block = anthropic::ContentBlock::Known(anthropic::Block::ToolResult {
                    tool_use_id,
                    content: Some(anthropic::ToolResultContent::Text(text)),
                    is_error: None,
                    extra: Map::new(),
                });
                push_turn(&mut turns, anthropic::Role::User, vec![block]);
            }
            openai::Role::Function => {
                return Err(TranslateError::Unsupported(
                    "legacy function messages".into(),
                ));
            }
        }
    }

    let tools = match req.tools {
        None => None,
        Some(tools) => Some(
            tools
                .into_iter()
                .map(|t| match (t.kind.as_str(), t.function) {
                    ("function", Some(f)) => Ok(anthropic::Tool {
                        name: f.name,
                        description: f.description,
                        input_schema: Some(
                            f.parameters
                                .unwrap_or_else(|| json!({"type": "object", "properties": {}})),
                        ),
                        extra: Map::new(),
                    }),
                    (kind, _) => Err(TranslateError::Unsupported(format!("tool of type {kind}"))),
                })
                .collect::<Result<Vec<_>, _>>()?,
        ),
    };
    let mut tool_choice = match req.tool_choice {
        None => None,
        Some(choice) => Some(openai_tool_choice_to_anthropic(&choice)?),
    };
    if req.parallel_tool_calls == Some(false) && tools.is_some() {
        let choice = tool_choice.get_or_insert_with(|| anthropic_tool_choice("auto"));
        if choice.kind != "none" {
            choice.disable_parallel_tool_use = Some(true);
        }
    }
    if req.stream_options.is_some() && req.stream != Some(true) {
        dropped.push("stream_options".into());
    }

    let system = match system.len() {
        0 => None,
        1 => system
            .pop()
            .and_then(|b| b.as_text().map(|t| anthropic::System::Text(t.to_owned()))),
        _ => Some(anthropic::System::Blocks(system)),
    };
    Ok(Translated {
        value: anthropic::MessagesRequest {
            model: req.model,
            messages: turns,
            max_tokens,
            system,
            stop_sequences: req.stop.map(openai::Stop::into_vec),
            stream: req.stream,
            temperature: req.temperature.map(|t| t.clamp(0.0, 1.0)),
            top_p: req.top_p,
            top_k: None,
            tools,
            tool_choice,
            metadata: req.user.map(|u| json!({"user_id": u})),
            extra,
        },
        dropped,
    })
}

fn part_type(part: &openai::ContentPart) -> String {
    match part {
        openai::ContentPart::Known(openai::KnownPart::Text { .. }) => "text".into(),
        openai::ContentPart::Known(openai::KnownPart::ImageUrl { .. }) => "image_url".into(),
        openai::ContentPart::Other(v) => v
            .get("type")
            .and_then(Value::as_str)
            .unwrap_or("unknown")
            .to_owned(),
    }
}

fn user_content_to_blocks(
    content: openai::MessageContent,
) -> Result<Vec<anthropic::ContentBlock>, TranslateError> {
    // Anthropic rejects empty text blocks, so empty text is left out (it carries nothing).
    match content {
        openai::MessageContent::Text(t) if t.is_empty() => Ok(Vec::new()),
        openai::MessageContent::Text(t) => Ok(vec![anthropic::ContentBlock::text(t)]),
        openai::MessageContent::Parts(parts) => parts
            .into_iter()
            .filter(|part| {
                !matches!(part, openai::ContentPart::Known(openai::KnownPart::Text { text, .. }) if text.is_empty())
            })
            .map(|part| match part {
                openai::ContentPart::Known(openai::KnownPart::Text { text, .. }) => {
                    Ok(anthropic::ContentBlock::text(text))
                }
                openai::ContentPart::Known(openai::KnownPart::ImageUrl { image_url, .. }) => {
                    Ok(anthropic::ContentBlock::Known(anthropic::Block::Image {
                        source: image_source(&image_url.url),
                        extra: Map::new(),
                    }))
                }
                other => Err(TranslateError::Unsupported(format!(
                    "content part of type {}",
                    part_type(&other)
                ))),
            })
            .collect(),
    }
}

/// `data:<media type>;base64,<data>` → base64 source; anything else → url source.
fn image_source(url: &str) -> Value {
    if let Some(rest) = url.strip_prefix("data:")
        && let Some((media_type, data)) = rest.split_once(";base64,")
    {
        return json!({"type": "base64", "media_type": media_type, "data": data});
    }
    json!({"type": "url", "url": url})
}

/// Tool arguments as an object: an empty string is `{}` (some servers send that for
/// argument-less calls); anything else must be a JSON object.
fn parse_arguments(arguments: &str) -> Result<Value, String> {
    if arguments.trim().is_empty() {
        return Ok(json!({}));
    }
    match serde_json::from_str::<Value>(arguments) {
        Ok(v @ Value::Object(_)) => Ok(v),
        Ok(_) => Err("tool call arguments are not a JSON object".into()),
        Err(e) => Err(format!("tool call arguments are not valid JSON: {e}")),
    }
}

/// Appends blocks as a turn of `role`, merging into the previous turn when it has the same
/// role. Empty block lists add nothing.
fn push_turn(
    turns: &mut Vec<anthropic::Message>,
    role: anthropic::Role,
    blocks: Vec<anthropic::ContentBlock>,
) {
    if blocks.is_empty() {
        return;
    }
    if let Some(last) = turns.last_mut()
        && last.role == role
    {
        let content =
            std::mem::replace(&mut last.content, anthropic::MessageContent::Blocks(vec![]));
        let mut merged = content.into_blocks();
        merged.extend(blocks);
        last.content = anthropic::MessageContent::Blocks(merged);
        return;
    }
    turns.push(anthropic::Message {
        role,
        content: anthropic::MessageContent::Blocks(blocks),
        extra: Map::new(),
    });
}

fn anthropic_tool_choice(kind: &str) -> anthropic::ToolChoice {
    anthropic::ToolChoice {
        kind: kind.to_owned(),
        name: None,
        disable_parallel_tool_use: None,
        extra: Map::new(),
    }
}

fn openai_tool_choice_to_anthropic(
    choice: &Value,
) -> Result<anthropic::ToolChoice, TranslateError> {
    match choice {
        Value::String(s) => match s.as_str() {
            "auto" => Ok(anthropic_tool_choice("auto")),
            "none" => Ok(anthropic_tool_choice("none")),
            "required" => Ok(anthropic_tool_choice("any")),
            other => Err(TranslateError::Unsupported(format!("tool_choice {other}"))),
        },
        Value::Object(o) => {
            let name = o
                .get("function")
                .and_then(|f| f.get("name"))
                .and_then(Value::as_str)
                .ok_or_else(|| {
                    TranslateError::Unsupported("tool_choice without function name".into())
                })?;
            let mut c = anthropic_tool_choice("tool");
            c.name = Some(name.to_owned());
            Ok(c)
        }
        _ => Err(TranslateError::InvalidRequest(
            "tool_choice has an invalid shape".into(),
        )),
    }
}

// ---------------------------------------------------------------------------------------------
// Anthropic response → OpenAI response

/// OpenAI `finish_reason` for an Anthropic `stop_reason`.
pub fn anthropic_stop_to_openai(stop_reason: &str) -> &'static str {
    match stop_reason {
        "max_tokens" | "model_context_window_exceeded" => "length",
        "tool_use" => "tool_calls",
        "refusal" => "content_filter",
        // end_turn, stop_sequence, pause_turn and future reasons: a normal stop.
        _ => "stop",
    }
}

/// Anthropic `stop_reason` for an OpenAI `finish_reason`.
pub fn openai_finish_to_anthropic(finish_reason: &str) -> &'static str {
    match finish_reason {
        "length" => "max_tokens",
        "tool_calls" | "function_call" => "tool_use",
        "content_filter" => "refusal",
        _ => "end_turn",
    }
}

/// Translates an Anthropic response into an OpenAI `chat.completion`. `created` is the Unix
/// time in seconds to stamp (the caller's clock; Anthropic responses carry none). Thinking
/// and unknown blocks are not shown to the OpenAI client.
pub fn anthropic_to_openai_response(
    resp: anthropic::MessagesResponse,
    created: u64,
) -> openai::ChatResponse {
    let mut text = String::new();
    let mut calls = Vec::new();
    for block in resp.content {
        match block {
            anthropic::ContentBlock::Known(anthropic::Block::Text { text: t, .. }) => {
                text.push_str(&t)
            }
            anthropic::ContentBlock::Known(anthropic::Block::ToolUse {
                id, name, input, ..
            }) => calls.push(openai::ToolCall {
                id,
                kind: "function".into(),
                function: openai::FunctionCall {
                    name,
                    arguments: input.to_string(),
                },
            }),
            _ => {}
        }
    }
    let message = openai::ChatMessage {
        role: openai::Role::Assistant,
        content: if text.is_empty() && !calls.is_empty() {
            None
        } else {
            Some(openai::MessageContent::Text(text))
        },
        name: None,
        tool_calls: (!calls.is_empty()).then_some(calls),
        tool_call_id: None,
        extra: Map::new(),
    };
    openai::ChatResponse {
        id: resp.id,
        object: "chat.completion".into(),
        created,
        model: resp.model,
        choices: vec![openai::Choice {
            index: 0,
            message,
            finish_reason: Some(
                anthropic_stop_to_openai(resp.stop_reason.as_deref().unwrap_or("end_turn"))
                    .to_owned(),
            ),
            extra: Map::new(),
        }],
        usage: Some(NormalizedUsage::from_anthropic(&resp.usage).to_openai()),
        extra: Map::new(),
    }
}

// ---------------------------------------------------------------------------------------------
// Anthropic request → OpenAI request

/// Translates an Anthropic Messages request into an OpenAI chat request for an
/// OpenAI-compatible provider. `max_tokens` is sent as `max_tokens` (the name every
/// OpenAI-compatible server accepts). A streaming request always gets
/// `stream_options.include_usage: true`, since the Anthropic client expects usage in
/// `message_delta`.
///
/// Errors: [`TranslateError::Unsupported`] for server tools (no `input_schema`) and content
/// blocks other than text, image, `tool_use`, `tool_result` and thinking (thinking is dropped).
pub fn anthropic_to_openai_request(
    req: anthropic::MessagesRequest,
) -> Result<Translated<openai::ChatRequest>, TranslateError> {
    let mut dropped: Vec<String> = req.extra.keys().cloned().collect();
    if req.top_k.is_some() {
        dropped.push("top_k".into());
    }
    let mut messages = Vec::new();
    if let Some(system) = req.system {
        messages.push(openai::ChatMessage::text(
            openai::Role::System,
            system.joined_text(),
        ));
    }
    for msg in req.messages {
        match msg.role {
            anthropic::Role::User => user_turn_to_openai(msg.content, &mut messages)?,
            anthropic::Role::Assistant => messages.push(assistant_turn_to_openai(msg.content)?),
        }
    }
    let tools = match req.tools {
        None => None,
        Some(tools) => Some(
            tools
                .into_iter()
                .map(|t| match t.input_schema {
                    Some(schema) => Ok(openai::Tool {
                        kind: "function".into(),
                        function: Some(openai::FunctionDef {
                            name: t.name,
                            description: t.description,
                            parameters: Some(schema),
                            extra: Map::new(),
                        }),
                        extra: Map::new(),
                    }),
                    None => Err(TranslateError::Unsupported(format!(
                        "server tool {}",
                        t.name
                    ))),
                })
                .collect::<Result<Vec<_>, _>>()?,
        ),
    };
    let (tool_choice, parallel_tool_calls) = match req.tool_choice {
        None => (None, None),
        Some(c) => {
            let choice = match c.kind.as_str() {
                "auto" => json!("auto"),
                "none" => json!("none"),
                "any" => json!("required"),
                "tool" => {
                    json!({"type": "function", "function": {"name": c.name.unwrap_or_default()}})
                }
                other => return Err(TranslateError::Unsupported(format!("tool_choice {other}"))),
            };
            (Some(choice), c.disable_parallel_tool_use.map(|d| !d))
        }
    };
    let user = req
        .metadata
        .as_ref()
        .and_then(|m| m.get("user_id"))
        .and_then(Value::as_str)
        .map(str::to_owned);
    let stream = req.stream;
    Ok(Translated {
        value: openai::ChatRequest {
            model: req.model,
            messages,
            max_tokens: Some(req.max_tokens),
            max_completion_tokens: None,
            stream,
            stream_options: (stream == Some(true)).then(|| openai::StreamOptions {
                include_usage: Some(true),
                extra: Map::new(),
            }),
            temperature: req.temperature,
            top_p: req.top_p,
            n: None,
            stop: req.stop_sequences.map(openai::Stop::Many),
            tools,
            tool_choice,
            parallel_tool_calls,
            user,
            extra: Map::new(),
        },
        dropped,
    })
}

fn block_type(block: &anthropic::ContentBlock) -> String {
    match block {
        anthropic::ContentBlock::Known(b) => serde_json::to_value(b)
            .ok()
            .and_then(|v| v.get("type").and_then(Value::as_str).map(str::to_owned))
            .unwrap_or_default(),
        anthropic::ContentBlock::Other(v) => v
            .get("type")
            .and_then(Value::as_str)
            .unwrap_or("unknown")
            .to_owned(),
    }
}

/// A user turn becomes its tool results as `tool` messages (first, because OpenAI wants them
/// right after the assistant turn that called the tools), then one user message with the rest.
fn user_turn_to_openai(
    content: anthropic::MessageContent,
    out: &mut Vec<openai::ChatMessage>,
) -> Result<(), TranslateError> {
    let blocks = match content {
        anthropic::MessageContent::Text(t) => {
            out.push(openai::ChatMessage::text(openai::Role::User, t));
            return Ok(());
        }
        anthropic::MessageContent::Blocks(b) => b,
    };
    let mut parts = Vec::new();
    for block in blocks {
        match block {
            anthropic::ContentBlock::Known(anthropic::Block::Text { text, .. }) => {
                parts.push(openai::ContentPart::Known(openai::KnownPart::Text {
                    text,
                    extra: Map::new(),
                }))
            }
            anthropic::ContentBlock::Known(anthropic::Block::Image { source, .. }) => {
                parts.push(openai::ContentPart::Known(openai::KnownPart::ImageUrl {
                    image_url: openai::ImageUrl {
                        url: image_url_of(&source)?,
                        extra: Map::new(),
                    },
                    extra: Map::new(),
                }))
            }
            anthropic::ContentBlock::Known(anthropic::Block::ToolResult {
                tool_use_id,
                content,
                ..
            }) => {
                // OpenAI tool messages carry text only; an image in a tool result would be
                // lost, so it is refused rather than dropped.
                if let Some(anthropic::ToolResultContent::Blocks(blocks)) = &content
                    && let Some(other) = blocks.iter().find(|b| b.as_text().is_none())
                {
                    return Err(TranslateError::Unsupported(format!(
                        "tool_result content block of type {}",
                        block_type(other)
                    )));
                }
                let mut msg = openai::ChatMessage::text(
                    openai::Role::Tool,
                    content.map(|c| c.joined_text()).unwrap_or_default(),
                );
                msg.tool_call_id = Some(tool_use_id);
                out.push(msg);
            }
            other => {
                return Err(TranslateError::Unsupported(format!(
                    "user content block of type {}",
                    block_type(&other)
                )));
            }
        }
    }
    match parts.len() {
        0 => {}
        1 if matches!(
            parts[0],
            openai::ContentPart::Known(openai::KnownPart::Text { .. })
        ) =>
        {
            let text = openai::MessageContent::Parts(parts).joined_text();
            out.push(openai::ChatMessage::text(openai::Role::User, text));
        }
        _ => {
            let mut msg = openai::ChatMessage::text(openai::Role::User, "");
            msg.content = Some(openai::MessageContent::Parts(parts));
            out.push(msg);
        }
    }
    Ok(())
}

fn image_url_of(source: &Value) -> Result<String, TranslateError> {
    match source.get("type").and_then(Value::as_str) {
        Some("base64") => {
            let media = source
                .get("media_type")
                .and_then(Value::as_str)
                .unwrap_or("image/png");
            let data = source
                .get("data")
                .and_then(Value::as_str)
                .unwrap_or_default();
            Ok(format!("data:{media};base64,{data}"))
        }
        Some("url") => Ok(source
            .get("url")
            .and_then(Value::as_str)
            .unwrap_or_default()
            .to_owned()),
        other => Err(TranslateError::Unsupported(format!(
            "image source of type {}",
            other.unwrap_or("unknown")
        ))),
    }
}

fn assistant_turn_to_openai(
    content: anthropic::MessageContent,
) -> Result<openai::ChatMessage, TranslateError> {
    let mut text = String::new();
    let mut calls = Vec::new();
    for block in content.into_blocks() {
        match block {
            anthropic::ContentBlock::Known(anthropic::Block::Text { text: t, .. }) => {
                text.push_str(&t)
            }
            anthropic::ContentBlock::Known(anthropic::Block::ToolUse {
                id, name, input, ..
            }) => calls.push(openai::ToolCall {
                id,
                kind: "function".into(),
                function: openai::FunctionCall {
                    name,
                    arguments: input.to_string(),
                },
            }),
            // Thinking is the model's private reasoning; OpenAI-compatible servers take none.
            anthropic::ContentBlock::Known(anthropic::Block::Thinking { .. }) => {}
            other => {
                return Err(TranslateError::Unsupported(format!(
                    "assistant content block of type {}",
                    block_type(&other)
                )));
            }
        }
    }
    let mut msg = openai::ChatMessage::text(openai::Role::Assistant, text);
    if !calls.is_empty() {
        if msg
            .content
            .as_ref()
            .is_some_and(|c| c.joined_text().is_empty())
        {
            msg.content = None;
        }
        msg.tool_calls = Some(calls);
    }
    Ok(msg)
}

// ---------------------------------------------------------------------------------------------
// OpenAI response → Anthropic response

/// Translates an OpenAI `chat.completion` (first choice) into an Anthropic message.
///
/// Errors: [`TranslateError::InvalidUpstream`] when there is no choice or a tool call's
/// arguments are not a JSON object.
pub fn openai_to_anthropic_response(
    resp: openai::ChatResponse,
) -> Result<anthropic::MessagesResponse, TranslateError> {
    let choice = resp
        .choices
        .into_iter()
        .next()
        .ok_or_else(|| TranslateError::InvalidUpstream("response has no choices".into()))?;
    let mut content = Vec::new();
    if let Some(c) = &choice.message.content {
        let text = c.joined_text();
        if !text.is_empty() {
            content.push(anthropic::ContentBlock::text(text));
        }
    }
    for call in choice.message.tool_calls.unwrap_or_default() {
        content.push(anthropic::ContentBlock::Known(anthropic::Block::ToolUse {
            input: parse_arguments(&call.function.arguments)
                .map_err(TranslateError::InvalidUpstream)?,
            id: call.id,
            name: call.function.name,
            extra: Map::new(),
        }));
    }
    let usage = resp
        .usage
        .as_ref()
        .map(NormalizedUsage::from_openai)
        .map(|u| u.to_anthropic())
        .unwrap_or_default();
    Ok(anthropic::MessagesResponse {
        id: resp.id,
        kind: "message".into(),
        role: anthropic::Role::Assistant,
        model: resp.model,
        content,
        stop_reason: Some(
            openai_finish_to_anthropic(choice.finish_reason.as_deref().unwrap_or("stop"))
                .to_owned(),
        ),
        stop_sequence: None,
        usage,
        extra: Map::new(),
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn image_source_data_url_becomes_base64() {
        assert_eq!(
            image_source("data:image/jpeg;base64,QUJD"),
            json!({"type": "base64", "media_type": "image/jpeg", "data": "QUJD"})
        );
        assert_eq!(
            image_source("https://x.invalid/a.png"),
            json!({"type": "url", "url": "https://x.invalid/a.png"})
        );
    }

    #[test]
    fn parse_arguments_empty_is_empty_object_and_array_is_error() {
        assert_eq!(parse_arguments(""), Ok(json!({})));
        assert!(parse_arguments("[1]").is_err());
        assert!(parse_arguments("{\"a\":").is_err());
    }

    #[test]
    fn stop_reason_maps_both_ways() {
        for (a, o) in [
            ("end_turn", "stop"),
            ("max_tokens", "length"),
            ("tool_use", "tool_calls"),
            ("refusal", "content_filter"),
        ] {
            assert_eq!(anthropic_stop_to_openai(a), o);
            assert_eq!(openai_finish_to_anthropic(o), a);
        }
    }
}
