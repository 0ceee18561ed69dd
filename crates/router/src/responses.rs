//! OpenAI Responses API (`POST /v1/responses`) as a translation over the chat path.
//!
//! A Responses request is rewritten into an OpenAI chat completions request ([`to_chat`]), which
//! then takes exactly the path of `/v1/chat/completions` (routing, sticky chain, reservations,
//! failover, and the chat → Anthropic / Vertex / Bedrock translation when the provider needs
//! it). The chat answer is rewritten into a Response object ([`from_chat`]) or, for a stream,
//! chat chunks into the Responses API's typed events ([`StreamTranslator`]).
//!
//! Shapes follow OpenAI's API reference for `POST /v1/responses` and the types of the official
//! `openai` Python SDK (`openai/types/responses/`). Nothing is stored: a request that needs a
//! stored response or conversation (`previous_response_id`, `conversation`, `background`,
//! `store: true`) or a feature the chat path cannot carry (built-in tools, reasoning settings,
//! structured output, unknown input items or fields) is refused with a 400
//! `invalid_request_error` that names the parameter ([`Refusal`]), never silently dropped.

use std::collections::BTreeMap;

use serde_json::{Map, Value, json};

/// Most input items accepted in one request (messages, function calls, call outputs). The body
/// size limit bounds the work as well; this bounds the item walk independently of it.
pub const MAX_INPUT_ITEMS: usize = 10_000;
/// Most content parts in one input message.
pub const MAX_CONTENT_PARTS: usize = 1_000;
/// Most tools in one request (OpenAI's own limit is 128 functions).
pub const MAX_TOOLS: usize = 512;
/// Largest `max_output_tokens` (the router's cap on `max_tokens`, `server::MAX_OUTPUT_TOKENS`).
pub const MAX_OUTPUT_TOKENS: u64 = 1_000_000;
/// Most `metadata` pairs (OpenAI's limit: 16 keys of ≤ 64 chars, values ≤ 512 chars).
pub const MAX_METADATA_KEYS: usize = 16;

/// A request the translation refuses: answered 400 in OpenAI's error shape,
/// `{"error":{"message","type":"invalid_request_error","param","code"}}`.
#[derive(Debug, Clone, PartialEq)]
pub struct Refusal {
    /// The offending parameter as a path (`previous_response_id`, `input[3].type`, `tools[0]`).
    pub param: String,
    /// Machine-readable code: `unsupported_parameter`, `unsupported_value` or `invalid_value`.
    pub code: &'static str,
    /// Human-readable message.
    pub message: String,
}

impl Refusal {
    fn unsupported(param: impl Into<String>, message: impl Into<String>) -> Self {
        Refusal {
            param: param.into(),
            code: "unsupported_parameter",
            message: message.into(),
        }
    }

    fn value(param: impl Into<String>, message: impl Into<String>) -> Self {
        Refusal {
            param: param.into(),
            code: "unsupported_value",
            message: message.into(),
        }
    }

    fn invalid(param: impl Into<String>, message: impl Into<String>) -> Self {
        Refusal {
            param: param.into(),
            code: "invalid_value",
            message: message.into(),
        }
    }

    /// The OpenAI error body for this refusal.
    pub fn body(&self) -> Value {
        json!({"error": {
            "message": self.message,
            "type": "invalid_request_error",
            "param": self.param,
            "code": self.code,
        }})
    }
}

/// The request fields a Response object echoes back (they are not sent upstream as such).
#[derive(Debug, Clone, Default, PartialEq)]
pub struct Echo {
    /// `instructions` as sent (a string or null).
    pub instructions: Value,
    /// `max_output_tokens` as sent.
    pub max_output_tokens: Value,
    /// `metadata` (an object of strings; `{}` when absent). Echoed only, never sent upstream.
    pub metadata: Value,
    /// `parallel_tool_calls` (default true).
    pub parallel_tool_calls: bool,
    /// `temperature` as sent.
    pub temperature: Value,
    /// `top_p` as sent.
    pub top_p: Value,
    /// `tool_choice` as sent (default `"auto"`).
    pub tool_choice: Value,
    /// `tools` as sent (default `[]`).
    pub tools: Value,
    /// `user` as sent.
    pub user: Value,
    /// Whether the client asked for a stream.
    pub stream: bool,
}

/// Fields accepted with any value and not forwarded (they change nothing the router does).
const IGNORED: &[&str] = &["stream_options"];

/// Translates a Responses request body into an OpenAI chat completions request body.
///
/// `input` (a string, or a list of `message` items with `input_text` / `output_text` /
/// `input_image` parts, `function_call` and `function_call_output` items) becomes `messages`,
/// `instructions` a leading system message, function `tools` chat tools, `tool_choice` its
/// chat form, `max_output_tokens` `max_tokens`; `temperature`, `top_p`, `parallel_tool_calls`
/// and `user` pass through; a stream asks for usage (`stream_options.include_usage`).
///
/// Errors: a [`Refusal`] naming the first parameter that cannot be honoured.
pub fn to_chat(request: &Map<String, Value>) -> Result<(Value, Echo), Refusal> {
    for (key, value) in request {
        let set = !value.is_null();
        match key.as_str() {
            "model"
            | "input"
            | "instructions"
            | "tools"
            | "tool_choice"
            | "max_output_tokens"
            | "temperature"
            | "top_p"
            | "stream"
            | "metadata"
            | "parallel_tool_calls"
            | "user" => {}
            k if IGNORED.contains(&k) => {}
            "previous_response_id" if set => {
                return Err(Refusal::unsupported(
                    "previous_response_id",
                    "previous_response_id is not supported: this gateway stores no responses; send the whole conversation in `input`",
                ));
            }
            "conversation" if set => {
                return Err(Refusal::unsupported(
                    "conversation",
                    "conversation is not supported: this gateway stores no conversations; send the whole conversation in `input`",
                ));
            }
            "background" if value != &Value::Bool(false) && set => {
                return Err(Refusal::unsupported(
                    "background",
                    "background responses are not supported by this gateway",
                ));
            }
            "store" if value == &Value::Bool(true) => {
                return Err(Refusal::value(
                    "store",
                    "store: true is not supported: this gateway stores no responses (omit `store` or send false)",
                ));
            }
            "store" | "background" | "previous_response_id" | "conversation" => {}
            "include" if value.as_array().is_some_and(|a| !a.is_empty()) => {
                return Err(Refusal::unsupported(
                    "include",
                    "include is not supported by this gateway",
                ));
            }
            "include" => {}
            "truncation" if set && value.as_str() != Some("disabled") => {
                return Err(Refusal::value(
                    "truncation",
                    "only truncation \"disabled\" is supported",
                ));
            }
            "truncation" => {}
            "text" => check_text(value)?,
            "service_tier" if !matches!(value.as_str(), None | Some("auto") | Some("default")) => {
                return Err(Refusal::value(
                    "service_tier",
                    "only service_tier \"auto\" or \"default\" is supported",
                ));
            }
            "service_tier" => {}
            // An explicit null for a parameter we do not know asks for its default.
            _ if !set => {}
            other => {
                return Err(Refusal::unsupported(
                    shown(other),
                    format!(
                        "the parameter {:?} is not supported by this gateway's Responses API",
                        shown(other)
                    ),
                ));
            }
        }
    }
    let model = match request.get("model") {
        Some(Value::String(m)) => m.clone(),
        _ => return Err(Refusal::invalid("model", "`model` must be a string")),
    };
    let mut messages: Vec<Value> = Vec::new();
    let instructions = request.get("instructions").cloned().unwrap_or(Value::Null);
    match &instructions {
        Value::Null => {}
        Value::String(s) => messages.push(json!({"role": "system", "content": s})),
        _ => {
            return Err(Refusal::invalid(
                "instructions",
                "`instructions` must be a string",
            ));
        }
    }
    match request.get("input") {
        Some(Value::String(s)) => messages.push(json!({"role": "user", "content": s})),
        Some(Value::Array(items)) => {
            if items.len() > MAX_INPUT_ITEMS {
                return Err(Refusal::invalid(
                    "input",
                    format!("`input` may hold at most {MAX_INPUT_ITEMS} items"),
                ));
            }
            for (i, item) in items.iter().enumerate() {
                push_item(&mut messages, i, item)?;
            }
        }
        _ => {
            return Err(Refusal::invalid(
                "input",
                "`input` must be a string or a list of input items",
            ));
        }
    }
    if messages.iter().all(|m| m["role"] == "system") {
        return Err(Refusal::invalid(
            "input",
            "`input` must contain at least one message",
        ));
    }
    let mut chat = Map::new();
    chat.insert("model".into(), Value::String(model));
    chat.insert("messages".into(), Value::Array(messages));
    let tools = request.get("tools").cloned().unwrap_or(Value::Null);
    let chat_tools = translate_tools(&tools)?;
    if !chat_tools.is_empty() {
        chat.insert("tools".into(), Value::Array(chat_tools));
    }
    let tool_choice = request.get("tool_choice").cloned().unwrap_or(Value::Null);
    if let Some(c) = translate_tool_choice(&tool_choice)? {
        chat.insert("tool_choice".into(), c);
    }
    let max_output_tokens = request
        .get("max_output_tokens")
        .cloned()
        .unwrap_or(Value::Null);
    match &max_output_tokens {
        Value::Null => {}
        Value::Number(n)
            if n.as_u64()
                .is_some_and(|n| (1..=MAX_OUTPUT_TOKENS).contains(&n)) =>
        {
            chat.insert("max_tokens".into(), max_output_tokens.clone());
        }
        _ => {
            return Err(Refusal::invalid(
                "max_output_tokens",
                format!("`max_output_tokens` must be an integer from 1 to {MAX_OUTPUT_TOKENS}"),
            ));
        }
    }
    for key in ["temperature", "top_p"] {
        match request.get(key) {
            None | Some(Value::Null) => {}
            Some(v @ Value::Number(_)) => {
                chat.insert(key.into(), v.clone());
            }
            Some(_) => {
                return Err(Refusal::invalid(key, format!("`{key}` must be a number")));
            }
        }
    }
    let parallel_tool_calls = match request.get("parallel_tool_calls") {
        None | Some(Value::Null) => true,
        Some(Value::Bool(b)) => {
            chat.insert("parallel_tool_calls".into(), Value::Bool(*b));
            *b
        }
        Some(_) => {
            return Err(Refusal::invalid(
                "parallel_tool_calls",
                "`parallel_tool_calls` must be a boolean",
            ));
        }
    };
    let user = request.get("user").cloned().unwrap_or(Value::Null);
    match &user {
        Value::Null => {}
        Value::String(_) => {
            chat.insert("user".into(), user.clone());
        }
        _ => return Err(Refusal::invalid("user", "`user` must be a string")),
    }
    let stream = match request.get("stream") {
        None | Some(Value::Null) | Some(Value::Bool(false)) => false,
        Some(Value::Bool(true)) => true,
        Some(_) => return Err(Refusal::invalid("stream", "`stream` must be a boolean")),
    };
    if stream {
        chat.insert("stream".into(), Value::Bool(true));
        chat.insert("stream_options".into(), json!({"include_usage": true}));
    }
    let metadata = request.get("metadata").cloned().unwrap_or(Value::Null);
    check_metadata(&metadata)?;
    let echo = Echo {
        instructions,
        max_output_tokens,
        metadata: if metadata.is_null() {
            json!({})
        } else {
            metadata
        },
        parallel_tool_calls,
        temperature: request.get("temperature").cloned().unwrap_or(Value::Null),
        top_p: request.get("top_p").cloned().unwrap_or(Value::Null),
        tool_choice: if tool_choice.is_null() {
            json!("auto")
        } else {
            tool_choice
        },
        tools: if tools.is_null() { json!([]) } else { tools },
        user,
        stream,
    };
    Ok((Value::Object(chat), echo))
}

/// A client-supplied name as echoed in an error: at most 64 bytes, cut at a char boundary.
fn shown(name: &str) -> String {
    let mut cut = name.len().min(64);
    while !name.is_char_boundary(cut) {
        cut -= 1;
    }
    name[..cut].to_owned()
}

/// `text.format` must be plain text (structured output is not translated).
fn check_text(value: &Value) -> Result<(), Refusal> {
    let Some(text) = value.as_object() else {
        return if value.is_null() {
            Ok(())
        } else {
            Err(Refusal::invalid("text", "`text` must be an object"))
        };
    };
    for (k, v) in text {
        match k.as_str() {
            "format" => match v.get("type").and_then(Value::as_str) {
                Some("text") => {}
                None if v.is_null() => {}
                _ => {
                    return Err(Refusal::value(
                        "text.format",
                        "only text.format {\"type\": \"text\"} is supported (structured output is not)",
                    ));
                }
            },
            "verbosity" if v.is_null() || v == "medium" => {}
            _ => {
                return Err(Refusal::unsupported(
                    format!("text.{}", shown(k)),
                    format!("text.{} is not supported", shown(k)),
                ));
            }
        }
    }
    Ok(())
}

fn check_metadata(metadata: &Value) -> Result<(), Refusal> {
    match metadata {
        Value::Null => Ok(()),
        Value::Object(m)
            if m.len() <= MAX_METADATA_KEYS
                && m.iter()
                    .all(|(k, v)| k.len() <= 64 && v.as_str().is_some_and(|s| s.len() <= 512)) =>
        {
            Ok(())
        }
        _ => Err(Refusal::invalid(
            "metadata",
            format!(
                "`metadata` must be an object of at most {MAX_METADATA_KEYS} string values (keys ≤ 64, values ≤ 512 characters)"
            ),
        )),
    }
}

/// Appends the chat message(s) for input item `i`. Consecutive `function_call` items (and a
/// function call right after an assistant message) join one assistant message with several
/// `tool_calls`, as the chat API and Anthropic's tool-use turns expect.
fn push_item(messages: &mut Vec<Value>, i: usize, item: &Value) -> Result<(), Refusal> {
    let Some(obj) = item.as_object() else {
        return Err(Refusal::invalid(
            format!("input[{i}]"),
            "an input item must be an object",
        ));
    };
    let kind = match obj.get("type") {
        Some(Value::String(t)) => t.as_str(),
        // An easy input message ({"role", "content"}) has no type.
        None if obj.contains_key("role") => "message",
        _ => {
            return Err(Refusal::invalid(
                format!("input[{i}].type"),
                "an input item needs a `type`",
            ));
        }
    };
    let string_field = |name: &str| -> Result<String, Refusal> {
        match obj.get(name) {
            Some(Value::String(s)) => Ok(s.clone()),
            _ => Err(Refusal::invalid(
                format!("input[{i}].{name}"),
                format!("`{name}` must be a string"),
            )),
        }
    };
    match kind {
        "message" => {
            let role = match obj.get("role").and_then(Value::as_str) {
                Some("user") => "user",
                Some("assistant") => "assistant",
                Some("system" | "developer") => "system",
                _ => {
                    return Err(Refusal::invalid(
                        format!("input[{i}].role"),
                        "`role` must be user, assistant, system or developer",
                    ));
                }
            };
            let content = message_content(i, role, obj.get("content"))?;
            messages.push(json!({"role": role, "content": content}));
        }
        "function_call" => {
            let call = json!({
                "id": string_field("call_id")?,
                "type": "function",
                "function": {"name": string_field("name")?, "arguments": string_field("arguments")?},
            });
            match messages.last_mut() {
                Some(last) if last["role"] == "assistant" => {
                    let calls = last
                        .as_object_mut()
                        .map(|m| m.entry("tool_calls").or_insert_with(|| json!([])));
                    if let Some(Value::Array(calls)) = calls {
                        calls.push(call);
                    }
                }
                _ => messages
                    .push(json!({"role": "assistant", "content": null, "tool_calls": [call]})),
            }
        }
        "function_call_output" => {
            let output = match obj.get("output") {
                Some(Value::String(s)) => s.clone(),
                Some(Value::Array(parts)) => {
                    let mut text = String::new();
                    for (j, p) in parts.iter().enumerate() {
                        match (
                            p.get("type").and_then(Value::as_str),
                            p.get("text").and_then(Value::as_str),
                        ) {
                            (Some("input_text"), Some(t)) => text.push_str(t),
                            _ => {
                                return Err(Refusal::value(
                                    format!("input[{i}].output[{j}]"),
                                    "only input_text parts are supported in a function_call_output",
                                ));
                            }
                        }
                    }
                    text
                }
                _ => {
                    return Err(Refusal::invalid(
                        format!("input[{i}].output"),
                        "`output` must be a string or a list of input_text parts",
                    ));
                }
            };
            messages.push(json!({"role": "tool", "tool_call_id": string_field("call_id")?, "content": output}));
        }
        other => {
            return Err(Refusal::value(
                format!("input[{i}].type"),
                format!(
                    "the input item type {:?} is not supported (supported: message, function_call, function_call_output)",
                    shown(other)
                ),
            ));
        }
    }
    Ok(())
}

/// A message's content in chat form: a string stays a string; parts become chat parts
/// (`input_text` / `output_text` → text, `input_image` with an `image_url` → image_url).
fn message_content(i: usize, role: &str, content: Option<&Value>) -> Result<Value, Refusal> {
    let parts = match content {
        Some(Value::String(s)) => return Ok(Value::String(s.clone())),
        Some(Value::Array(parts)) => parts,
        _ => {
            return Err(Refusal::invalid(
                format!("input[{i}].content"),
                "`content` must be a string or a list of content parts",
            ));
        }
    };
    if parts.len() > MAX_CONTENT_PARTS {
        return Err(Refusal::invalid(
            format!("input[{i}].content"),
            format!("a message may hold at most {MAX_CONTENT_PARTS} content parts"),
        ));
    }
    let mut out = Vec::with_capacity(parts.len());
    let mut all_text = true;
    for (j, p) in parts.iter().enumerate() {
        let kind = p.get("type").and_then(Value::as_str);
        match (kind, p.get("text").and_then(Value::as_str)) {
            (Some("input_text" | "output_text"), Some(t)) => {
                out.push(json!({"type": "text", "text": t}));
            }
            (Some("input_image"), _) if role == "user" => {
                let Some(url) = p.get("image_url").and_then(Value::as_str) else {
                    return Err(Refusal::value(
                        format!("input[{i}].content[{j}].image_url"),
                        "an input_image needs an `image_url` (file_id is not supported)",
                    ));
                };
                let mut image = json!({"url": url});
                if let Some(d) = p.get("detail").and_then(Value::as_str)
                    && d != "auto"
                {
                    image["detail"] = json!(d);
                }
                all_text = false;
                out.push(json!({"type": "image_url", "image_url": image}));
            }
            _ => {
                return Err(Refusal::value(
                    format!("input[{i}].content[{j}].type"),
                    format!(
                        "the content part type {:?} is not supported here (supported: input_text, output_text, input_image with image_url)",
                        shown(kind.unwrap_or(""))
                    ),
                ));
            }
        }
    }
    // Text-only content is sent as one string: every upstream dialect takes that.
    if all_text {
        let text: String = out.iter().filter_map(|p| p["text"].as_str()).collect();
        return Ok(Value::String(text));
    }
    Ok(Value::Array(out))
}

/// Function tools in chat form; any other tool type (`web_search`, `file_search`, `mcp`,
/// `computer_use_preview`, ...) is a built-in tool this gateway cannot run: refused.
fn translate_tools(tools: &Value) -> Result<Vec<Value>, Refusal> {
    let list = match tools {
        Value::Null => return Ok(Vec::new()),
        Value::Array(list) if list.len() <= MAX_TOOLS => list,
        _ => {
            return Err(Refusal::invalid(
                "tools",
                format!("`tools` must be a list of at most {MAX_TOOLS} tools"),
            ));
        }
    };
    let mut out = Vec::with_capacity(list.len());
    for (i, t) in list.iter().enumerate() {
        match t.get("type").and_then(Value::as_str) {
            Some("function") => {}
            Some(other) => {
                return Err(Refusal::value(
                    format!("tools[{i}].type"),
                    format!(
                        "the built-in tool {:?} is not supported by this gateway; only function tools are",
                        shown(other)
                    ),
                ));
            }
            None => {
                return Err(Refusal::invalid(
                    format!("tools[{i}].type"),
                    "a tool needs a `type`",
                ));
            }
        }
        let Some(name) = t.get("name").and_then(Value::as_str) else {
            return Err(Refusal::invalid(
                format!("tools[{i}].name"),
                "a function tool needs a `name`",
            ));
        };
        let mut function = json!({"name": name});
        if let Some(d) = t.get("description").filter(|d| !d.is_null()) {
            function["description"] = d.clone();
        }
        if let Some(p) = t.get("parameters").filter(|p| !p.is_null()) {
            function["parameters"] = p.clone();
        }
        // `strict: true` is a guarantee (schema-constrained arguments) only OpenAI gives: it is
        // forwarded, and a provider that cannot honour it refuses the request.
        if t.get("strict") == Some(&Value::Bool(true)) {
            function["strict"] = Value::Bool(true);
        }
        out.push(json!({"type": "function", "function": function}));
    }
    Ok(out)
}

/// `tool_choice` in chat form: the three strings pass, `{"type":"function","name":N}` becomes
/// `{"type":"function","function":{"name":N}}`; anything else is refused.
fn translate_tool_choice(choice: &Value) -> Result<Option<Value>, Refusal> {
    match choice {
        Value::Null => Ok(None),
        Value::String(s) if matches!(s.as_str(), "auto" | "none" | "required") => {
            Ok(Some(choice.clone()))
        }
        Value::Object(o) if o.get("type").and_then(Value::as_str) == Some("function") => {
            match o.get("name").and_then(Value::as_str) {
                Some(name) => Ok(Some(
                    json!({"type": "function", "function": {"name": name}}),
                )),
                None => Err(Refusal::invalid(
                    "tool_choice.name",
                    "a function tool_choice needs a `name`",
                )),
            }
        }
        _ => Err(Refusal::value(
            "tool_choice",
            "tool_choice must be \"auto\", \"none\", \"required\" or {\"type\": \"function\", \"name\": ...}",
        )),
    }
}

/// A fresh id with `prefix` (`resp_`, `msg_`, `fc_`): 128 random bits in hex.
pub fn new_id(prefix: &str) -> String {
    format!("{prefix}{:032x}", rand::random::<u128>())
}

/// The Response object's usage from a chat `usage` (`prompt_tokens` → `input_tokens`,
/// `prompt_tokens_details.cached_tokens` → `input_tokens_details.cached_tokens`, ...).
fn usage(chat_usage: &Value) -> Value {
    if chat_usage.is_null() {
        return Value::Null;
    }
    let n = |p: &str| chat_usage.pointer(p).and_then(Value::as_u64).unwrap_or(0);
    let input = n("/prompt_tokens");
    let output = n("/completion_tokens");
    json!({
        "input_tokens": input,
        "input_tokens_details": {"cached_tokens": n("/prompt_tokens_details/cached_tokens")},
        "output_tokens": output,
        "output_tokens_details": {"reasoning_tokens": n("/completion_tokens_details/reasoning_tokens")},
        "total_tokens": chat_usage.get("total_tokens").and_then(Value::as_u64).unwrap_or(input + output),
    })
}

/// Status and `incomplete_details` for a chat finish reason: `length` is incomplete
/// (`max_output_tokens`), `content_filter` incomplete (`content_filter`), anything else completed.
fn status_for(finish_reason: Option<&str>) -> (&'static str, Value) {
    match finish_reason {
        Some("length") => ("incomplete", json!({"reason": "max_output_tokens"})),
        Some("content_filter") => ("incomplete", json!({"reason": "content_filter"})),
        _ => ("completed", Value::Null),
    }
}

/// A Response object around `output`.
fn response_object(
    id: &str,
    created_at: u64,
    model: &str,
    (status, incomplete): (&str, Value),
    output: Vec<Value>,
    usage: Value,
    echo: &Echo,
) -> Value {
    json!({
        "id": id,
        "object": "response",
        "created_at": created_at,
        "status": status,
        "error": null,
        "incomplete_details": incomplete,
        "instructions": echo.instructions,
        "max_output_tokens": echo.max_output_tokens,
        "metadata": echo.metadata,
        "model": model,
        "output": output,
        "parallel_tool_calls": echo.parallel_tool_calls,
        "previous_response_id": null,
        "store": false,
        "temperature": echo.temperature,
        "top_p": echo.top_p,
        "text": {"format": {"type": "text"}},
        "tool_choice": echo.tool_choice,
        "tools": echo.tools,
        "truncation": "disabled",
        "usage": usage,
        "user": echo.user,
    })
}

fn message_item(id: &str, text: &str, status: &str) -> Value {
    json!({
        "id": id,
        "type": "message",
        "status": status,
        "role": "assistant",
        "content": [{"type": "output_text", "text": text, "annotations": [], "logprobs": []}],
    })
}

fn call_item(id: &str, call_id: &str, name: &str, arguments: &str, status: &str) -> Value {
    json!({
        "id": id,
        "type": "function_call",
        "status": status,
        "call_id": call_id,
        "name": name,
        "arguments": arguments,
    })
}

/// A chat completion (OpenAI shape, as the router answers `/v1/chat/completions`) as a Response
/// object: the first choice's text as one `message` item with an `output_text` part, each tool
/// call as a `function_call` item (`call_id` = the chat tool call id), usage renamed.
pub fn from_chat(chat: &Value, echo: &Echo, response_id: &str) -> Value {
    let choice = &chat["choices"][0];
    let message = &choice["message"];
    let mut output = Vec::new();
    if let Some(text) = message["content"].as_str().filter(|t| !t.is_empty()) {
        output.push(message_item(&new_id("msg_"), text, "completed"));
    }
    if let Some(calls) = message["tool_calls"].as_array() {
        for c in calls {
            output.push(call_item(
                &new_id("fc_"),
                c["id"].as_str().unwrap_or_default(),
                c["function"]["name"].as_str().unwrap_or_default(),
                c["function"]["arguments"].as_str().unwrap_or_default(),
                "completed",
            ));
        }
    }
    let (status, incomplete) = status_for(choice["finish_reason"].as_str());
    response_object(
        response_id,
        chat["created"].as_u64().unwrap_or(0),
        chat["model"].as_str().unwrap_or_default(),
        (status, incomplete),
        output,
        usage(&chat["usage"]),
        echo,
    )
}

/// One open output item of a stream.
#[derive(Debug)]
enum Open {
    Text {
        output_index: usize,
        id: String,
        text: String,
    },
    Call {
        output_index: usize,
        id: String,
        call_id: String,
        name: String,
        arguments: String,
    },
}

/// Translates the router's chat SSE stream (`data: {chunk}` events, `data: [DONE]`, or an
/// in-stream `data: {"error":..}`) into the Responses API's typed SSE events, incrementally:
/// `response.created` and `response.in_progress` on the first chunk; per text run
/// `response.output_item.added`, `response.content_part.added`, `response.output_text.delta`s,
/// then `.output_text.done`, `.content_part.done`, `.output_item.done`; per tool call
/// `output_item.added`, `response.function_call_arguments.delta`s, `.done`, `output_item.done`;
/// at the end `response.completed` (or `response.incomplete` / `response.failed`). Every event
/// carries `sequence_number` from 0.
#[derive(Debug)]
pub struct StreamTranslator {
    echo: Echo,
    response_id: String,
    seq: u64,
    started: bool,
    finished: bool,
    created_at: u64,
    model: String,
    buffer: Vec<u8>,
    /// Bytes of `buffer` already searched for an event end.
    scanned: usize,
    open: Vec<Open>,
    /// Chat tool-call index → position in `open`.
    calls: BTreeMap<u64, usize>,
    done: Vec<(usize, Value)>,
    next_index: usize,
    finish_reason: Option<String>,
    usage: Value,
}

/// Most bytes of one upstream SSE event held while waiting for its end (the router's own
/// chunks are far smaller); a longer event fails the stream instead of growing the buffer.
pub const MAX_EVENT_BYTES: usize = 4 * 1024 * 1024;

impl StreamTranslator {
    /// A translator for one stream.
    pub fn new(echo: Echo, response_id: String) -> Self {
        StreamTranslator {
            echo,
            response_id,
            seq: 0,
            started: false,
            finished: false,
            created_at: 0,
            model: String::new(),
            buffer: Vec::new(),
            scanned: 0,
            open: Vec::new(),
            calls: BTreeMap::new(),
            done: Vec::new(),
            next_index: 0,
            finish_reason: None,
            usage: Value::Null,
        }
    }

    /// Whether a terminal event (`response.completed` / `.incomplete` / `.failed`) was sent.
    pub fn is_finished(&self) -> bool {
        self.finished
    }

    fn emit(&mut self, out: &mut Vec<u8>, kind: &str, mut event: Value) {
        event["type"] = json!(kind);
        event["sequence_number"] = json!(self.seq);
        self.seq += 1;
        out.extend_from_slice(b"event: ");
        out.extend_from_slice(kind.as_bytes());
        out.extend_from_slice(b"\ndata: ");
        out.extend_from_slice(event.to_string().as_bytes());
        out.extend_from_slice(b"\n\n");
    }

    fn snapshot(&self, status: &str, incomplete: Value, output: Vec<Value>, usage: Value) -> Value {
        response_object(
            &self.response_id,
            self.created_at,
            &self.model,
            (status, incomplete),
            output,
            usage,
            &self.echo,
        )
    }

    fn start(&mut self, out: &mut Vec<u8>, chunk: &Value) {
        if self.started {
            return;
        }
        self.started = true;
        self.created_at = chunk["created"].as_u64().unwrap_or(0);
        self.model = chunk["model"].as_str().unwrap_or_default().to_owned();
        let r = self.snapshot("in_progress", Value::Null, Vec::new(), Value::Null);
        self.emit(out, "response.created", json!({"response": r.clone()}));
        self.emit(out, "response.in_progress", json!({"response": r}));
    }

    /// Feeds raw bytes of the chat stream; returns the Responses events they complete.
    pub fn push(&mut self, bytes: &[u8]) -> Vec<u8> {
        let mut out = Vec::new();
        if self.finished {
            return out;
        }
        self.buffer.extend_from_slice(bytes);
        // Resume the search where the last one stopped (three bytes back, for a separator
        // split across pushes): the scan is linear in the bytes received.
        while let Some(end) = find_event_end(&self.buffer, self.scanned.saturating_sub(3)) {
            let event: Vec<u8> = self.buffer.drain(..end.0).collect();
            self.buffer.drain(..end.1);
            self.scanned = 0;
            self.event(&mut out, &event);
            if self.finished {
                return out;
            }
        }
        self.scanned = self.buffer.len();
        if self.buffer.len() > MAX_EVENT_BYTES {
            self.fail(&mut out, "the upstream stream sent an oversized event");
        }
        out
    }

    /// The stream ended (or broke): closes what is open. A stream that ended without
    /// `[DONE]` and without a finish reason is reported as `response.failed`.
    pub fn finish(&mut self) -> Vec<u8> {
        let mut out = Vec::new();
        if self.finished {
            return out;
        }
        if self.finish_reason.is_some() {
            self.complete(&mut out);
        } else {
            self.fail(
                &mut out,
                "the upstream stream ended before the response was complete",
            );
        }
        out
    }

    fn event(&mut self, out: &mut Vec<u8>, raw: &[u8]) {
        let text = String::from_utf8_lossy(raw);
        let mut data = String::new();
        for line in text.lines() {
            if let Some(d) = line.strip_prefix("data:") {
                if !data.is_empty() {
                    data.push('\n');
                }
                data.push_str(d.strip_prefix(' ').unwrap_or(d));
            }
        }
        if data.is_empty() {
            return;
        }
        if data == "[DONE]" {
            self.complete(out);
            return;
        }
        let Ok(chunk) = serde_json::from_str::<Value>(&data) else {
            self.fail(out, "the upstream stream sent an unparseable event");
            return;
        };
        if let Some(e) = chunk.get("error") {
            let message = e["message"]
                .as_str()
                .unwrap_or("the provider failed mid-stream");
            self.fail(out, message);
            return;
        }
        self.chunk(out, &chunk);
    }

    fn chunk(&mut self, out: &mut Vec<u8>, chunk: &Value) {
        self.start(out, chunk);
        if !chunk["usage"].is_null() {
            self.usage = usage(&chunk["usage"]);
        }
        let Some(choice) = chunk["choices"].as_array().and_then(|c| c.first()) else {
            return;
        };
        let delta = &choice["delta"];
        if let Some(text) = delta["content"].as_str().filter(|t| !t.is_empty()) {
            self.text_delta(out, text);
        }
        if let Some(calls) = delta["tool_calls"].as_array() {
            for c in calls {
                self.call_delta(out, c);
            }
        }
        if let Some(f) = choice["finish_reason"].as_str() {
            self.finish_reason = Some(f.to_owned());
        }
    }

    fn text_delta(&mut self, out: &mut Vec<u8>, text: &str) {
        let open_text = self
            .open
            .iter()
            .position(|o| matches!(o, Open::Text { .. }));
        let pos = match open_text {
            Some(p) => p,
            None => {
                let output_index = self.next_index;
                self.next_index += 1;
                let id = new_id("msg_");
                let item = json!({"id": id, "type": "message", "status": "in_progress", "role": "assistant", "content": []});
                self.emit(
                    out,
                    "response.output_item.added",
                    json!({"output_index": output_index, "item": item}),
                );
                self.emit(
                    out,
                    "response.content_part.added",
                    json!({"item_id": id, "output_index": output_index, "content_index": 0,
                           "part": {"type": "output_text", "text": "", "annotations": [], "logprobs": []}}),
                );
                self.open.push(Open::Text {
                    output_index,
                    id,
                    text: String::new(),
                });
                self.open.len() - 1
            }
        };
        if let Some(Open::Text {
            output_index,
            id,
            text: acc,
        }) = self.open.get_mut(pos)
        {
            acc.push_str(text);
            let event = json!({"item_id": id, "output_index": *output_index, "content_index": 0,
                               "delta": text, "logprobs": []});
            self.emit(out, "response.output_text.delta", event);
        }
    }

    fn call_delta(&mut self, out: &mut Vec<u8>, c: &Value) {
        let index = c["index"].as_u64().unwrap_or(0);
        let pos = match self.calls.get(&index) {
            Some(&p) => p,
            None => {
                let output_index = self.next_index;
                self.next_index += 1;
                let id = new_id("fc_");
                let call_id = c["id"].as_str().unwrap_or_default().to_owned();
                let name = c["function"]["name"]
                    .as_str()
                    .unwrap_or_default()
                    .to_owned();
                let item = call_item(&id, &call_id, &name, "", "in_progress");
                self.emit(
                    out,
                    "response.output_item.added",
                    json!({"output_index": output_index, "item": item}),
                );
                self.open.push(Open::Call {
                    output_index,
                    id,
                    call_id,
                    name,
                    arguments: String::new(),
                });
                let p = self.open.len() - 1;
                self.calls.insert(index, p);
                p
            }
        };
        let Some(args) = c["function"]["arguments"]
            .as_str()
            .filter(|a| !a.is_empty())
        else {
            return;
        };
        if let Some(Open::Call {
            output_index,
            id,
            arguments,
            ..
        }) = self.open.get_mut(pos)
        {
            arguments.push_str(args);
            let event = json!({"item_id": id, "output_index": *output_index, "delta": args});
            self.emit(out, "response.function_call_arguments.delta", event);
        }
    }

    /// Closes every open item in output order, then sends the terminal event.
    fn complete(&mut self, out: &mut Vec<u8>) {
        let open = std::mem::take(&mut self.open);
        for o in open {
            match o {
                Open::Text {
                    output_index,
                    id,
                    text,
                } => {
                    let part = json!({"type": "output_text", "text": text, "annotations": [], "logprobs": []});
                    self.emit(
                        out,
                        "response.output_text.done",
                        json!({"item_id": id, "output_index": output_index, "content_index": 0, "text": text, "logprobs": []}),
                    );
                    self.emit(
                        out,
                        "response.content_part.done",
                        json!({"item_id": id, "output_index": output_index, "content_index": 0, "part": part}),
                    );
                    let item = message_item(&id, &text, "completed");
                    self.emit(
                        out,
                        "response.output_item.done",
                        json!({"output_index": output_index, "item": item.clone()}),
                    );
                    self.done.push((output_index, item));
                }
                Open::Call {
                    output_index,
                    id,
                    call_id,
                    name,
                    arguments,
                } => {
                    self.emit(
                        out,
                        "response.function_call_arguments.done",
                        json!({"item_id": id, "output_index": output_index, "name": name, "arguments": arguments}),
                    );
                    let item = call_item(&id, &call_id, &name, &arguments, "completed");
                    self.emit(
                        out,
                        "response.output_item.done",
                        json!({"output_index": output_index, "item": item.clone()}),
                    );
                    self.done.push((output_index, item));
                }
            }
        }
        self.done.sort_by_key(|(i, _)| *i);
        let output: Vec<Value> = self.done.iter().map(|(_, v)| v.clone()).collect();
        let (status, incomplete) = status_for(self.finish_reason.as_deref());
        let r = self.snapshot(status, incomplete, output, self.usage.clone());
        let kind = if status == "completed" {
            "response.completed"
        } else {
            "response.incomplete"
        };
        self.emit(out, kind, json!({"response": r}));
        self.finished = true;
    }

    fn fail(&mut self, out: &mut Vec<u8>, message: &str) {
        if !self.started {
            self.start(out, &Value::Null);
        }
        let mut r = self.snapshot("failed", Value::Null, Vec::new(), self.usage.clone());
        r["error"] = json!({"code": "server_error", "message": message});
        self.emit(out, "response.failed", json!({"response": r}));
        self.finished = true;
    }
}

/// End of the first SSE event in `buf`: (length of the event, length of its separator).
/// Searches from byte `from`.
fn find_event_end(buf: &[u8], from: usize) -> Option<(usize, usize)> {
    (from..buf.len()).find_map(|i| {
        let rest = buf.get(i..)?;
        if rest.starts_with(b"\n\n") {
            Some((i, 2))
        } else if rest.starts_with(b"\r\n\r\n") {
            Some((i, 4))
        } else {
            None
        }
    })
}

#[cfg(test)]
mod tests;
