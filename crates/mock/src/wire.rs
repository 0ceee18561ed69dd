//! Chat answers in three wire formats: OpenAI chat completions, Anthropic messages and OpenAI
//! Responses, as one JSON body or as server-sent events.
//!
//! SSE framing: OpenAI chat sends `data: <json>\n\n` per chunk and ends with `data: [DONE]`;
//! Anthropic and Responses send `event: <type>\ndata: <json>\n\n`. Every `data:` line holds
//! exactly one JSON object. Stream order per format:
//! - OpenAI chat: role-only chunk (`{"role":"assistant","content":""}`), one chunk per content
//!   token, a chunk with `finish_reason`, then — only if `stream_options.include_usage` — a chunk
//!   with `"choices": []` and the usage (every earlier chunk then carries `"usage": null`).
//! - Anthropic: `message_start` (input usage), `content_block_start`, `ping`,
//!   `content_block_delta`s (`text_delta`), `content_block_stop`, `message_delta` (`stop_reason`,
//!   cumulative `usage` with `output_tokens`), `message_stop`.
//! - Responses: `response.created`, `response.in_progress`, `response.output_item.added`,
//!   `response.content_part.added`, `response.output_text.delta`s, `..._text.done`,
//!   `response.content_part.done`, `response.output_item.done`, `response.completed` (usage;
//!   `response.incomplete` with `incomplete_details.reason = max_output_tokens` when cut short).

use bytes::Bytes;
use serde_json::{Value, json};

use crate::config::UsageStyle;
use crate::errors::ErrorSpec;
use crate::record::UsageRecord;

/// The chat-like APIs.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum ChatApi {
    OpenAiChat,
    Anthropic,
    Responses,
    /// Claude on Vertex AI (`:rawPredict`): Anthropic's wire format, model from the path.
    VertexClaude,
    /// Gemini on Vertex AI (`:generateContent`), see [`crate::vertex`].
    Gemini,
    /// Bedrock Converse / ConverseStream, see [`crate::bedrock`].
    Converse,
    /// Bedrock InvokeModel(WithResponseStream) with an Anthropic body: Anthropic JSON, or
    /// Anthropic events inside event-stream `chunk` frames.
    BedrockInvoke,
}

impl ChatApi {
    /// Whether the answer is Anthropic Messages (on any of the three routes).
    pub(crate) fn is_anthropic(self) -> bool {
        matches!(
            self,
            Self::Anthropic | Self::VertexClaude | Self::BedrockInvoke
        )
    }

    /// Whether a stream is AWS event-stream frames rather than SSE.
    pub(crate) fn is_event_stream(self) -> bool {
        matches!(self, Self::Converse | Self::BedrockInvoke)
    }
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Finish {
    Stop,
    Length,
    ToolCall,
    /// A request stop sequence ended the answer.
    StopSequence,
}

/// Everything needed to render one answer.
#[derive(Debug, Clone)]
pub(crate) struct Answer {
    pub(crate) api: ChatApi,
    pub(crate) id: String,
    pub(crate) model: String,
    pub(crate) created: u64,
    /// Content tokens (`token0 token1 ...`); 0 for a tool call.
    pub(crate) text_tokens: u64,
    /// Name of the tool to call instead of answering with text.
    pub(crate) tool: Option<String>,
    pub(crate) finish: Finish,
    /// Usage to report; `None` = omit it (fault).
    pub(crate) usage: Option<UsageRecord>,
    pub(crate) usage_style: UsageStyle,
    pub(crate) include_usage: bool,
    /// Gemini `thoughtsTokenCount` (separate from the output tokens).
    pub(crate) thoughts_tokens: u64,
    /// Gemini JSON mode: the whole answer text (sent as one chunk).
    pub(crate) json_text: Option<String>,
    /// Request arrival, for Bedrock's `latencyMs`.
    pub(crate) t0: tokio::time::Instant,
    /// Converse: the request had a `cachePoint` (usage then names the cache fields).
    pub(crate) uses_cache: bool,
    /// Milliseconds from arrival to the first content token (Bedrock `firstByteLatency`).
    pub(crate) first_byte_ms: u64,
}

/// Text of content token `i`.
pub(crate) fn token_text(i: u64) -> String {
    if i == 0 {
        "token0".to_owned()
    } else {
        format!(" token{i}")
    }
}

const TOOL_ARGS: &str = "{}";

fn full_text(n: u64) -> String {
    (0..n).map(token_text).collect()
}

fn openai_usage(u: &UsageRecord) -> Value {
    json!({
        "prompt_tokens": u.prompt_tokens,
        "completion_tokens": u.output_tokens,
        "total_tokens": u.prompt_tokens + u.output_tokens,
        "prompt_tokens_details": {"cached_tokens": u.cached_tokens, "audio_tokens": 0},
        "completion_tokens_details": {"reasoning_tokens": 0, "audio_tokens": 0,
            "accepted_prediction_tokens": 0, "rejected_prediction_tokens": 0},
    })
}

fn gemini_usage(u: &UsageRecord) -> Value {
    json!({
        "promptTokenCount": u.prompt_tokens,
        "cachedContentTokenCount": u.cached_tokens,
        "candidatesTokenCount": u.output_tokens,
        "totalTokenCount": u.prompt_tokens + u.output_tokens,
    })
}

/// Anthropic `input_tokens` exclude both cache reads and cache writes.
fn anthropic_usage(u: &UsageRecord, output_tokens: u64) -> Value {
    json!({
        "input_tokens": u.prompt_tokens.saturating_sub(u.cached_tokens + u.cache_creation_tokens),
        "cache_creation_input_tokens": u.cache_creation_tokens,
        "cache_read_input_tokens": u.cached_tokens,
        "output_tokens": output_tokens,
    })
}

fn responses_usage(u: &UsageRecord) -> Value {
    json!({
        "input_tokens": u.prompt_tokens,
        "input_tokens_details": {"cached_tokens": u.cached_tokens},
        "output_tokens": u.output_tokens,
        "output_tokens_details": {"reasoning_tokens": 0},
        "total_tokens": u.prompt_tokens + u.output_tokens,
    })
}

impl Answer {
    fn call_id(&self) -> String {
        format!("call_{}", &self.id[self.id.len().saturating_sub(12)..])
    }

    fn anthropic_stop(&self) -> &'static str {
        match self.finish {
            Finish::Stop => "end_turn",
            Finish::Length => "max_tokens",
            Finish::ToolCall => "tool_use",
            Finish::StopSequence => "stop_sequence",
        }
    }

    fn openai_finish(&self) -> &'static str {
        match self.finish {
            Finish::Stop | Finish::StopSequence => "stop",
            Finish::Length => "length",
            Finish::ToolCall => "tool_calls",
        }
    }

    /// Non-streaming body.
    pub(crate) fn json(&self) -> Value {
        match self.api {
            ChatApi::OpenAiChat => self.openai_json(),
            ChatApi::Anthropic | ChatApi::VertexClaude | ChatApi::BedrockInvoke => {
                self.anthropic_json()
            }
            ChatApi::Responses => self.responses_object(self.responses_final_status(), true),
            ChatApi::Gemini => crate::vertex::json_body(self),
            ChatApi::Converse => crate::bedrock::converse_json(self),
        }
    }

    fn openai_json(&self) -> Value {
        let message = match &self.tool {
            Some(name) => json!({"role": "assistant", "content": null, "refusal": null,
                "tool_calls": [{"id": self.call_id(), "type": "function",
                    "function": {"name": name, "arguments": TOOL_ARGS}}]}),
            None => json!({"role": "assistant", "content": full_text(self.text_tokens),
                "refusal": null}),
        };
        let mut body = json!({
            "id": self.id, "object": "chat.completion", "created": self.created,
            "model": self.model, "system_fingerprint": null,
            "choices": [{"index": 0, "message": message, "logprobs": null,
                "finish_reason": self.openai_finish()}],
        });
        if let (Some(u), Some(obj)) = (&self.usage, body.as_object_mut()) {
            match self.usage_style {
                UsageStyle::Openai => obj.insert("usage".to_owned(), openai_usage(u)),
                UsageStyle::Gemini => obj.insert("usageMetadata".to_owned(), gemini_usage(u)),
            };
        }
        body
    }

    fn anthropic_content(&self) -> Value {
        match &self.tool {
            Some(name) => json!([{"type": "tool_use", "id": format!("toolu_{}", self.call_id()),
                "name": name, "input": {}}]),
            None => json!([{"type": "text", "text": full_text(self.text_tokens)}]),
        }
    }

    fn anthropic_json(&self) -> Value {
        let mut body = json!({
            "id": self.id, "type": "message", "role": "assistant", "model": self.model,
            "content": self.anthropic_content(), "stop_reason": self.anthropic_stop(),
            "stop_sequence": null,
        });
        if let (Some(u), Some(obj)) = (&self.usage, body.as_object_mut()) {
            obj.insert("usage".to_owned(), anthropic_usage(u, u.output_tokens));
        }
        body
    }

    fn responses_item(&self, done: bool) -> Value {
        let status = if done { "completed" } else { "in_progress" };
        match &self.tool {
            Some(name) => json!({"type": "function_call", "id": format!("fc_{}", self.id),
                "call_id": self.call_id(), "name": name,
                "arguments": if done { TOOL_ARGS } else { "" }, "status": status}),
            None => {
                let content = if done {
                    json!([{"type": "output_text", "text": full_text(self.text_tokens),
                        "annotations": []}])
                } else {
                    json!([])
                };
                json!({"type": "message", "id": format!("msg_{}", self.id), "status": status,
                    "role": "assistant", "content": content})
            }
        }
    }

    fn responses_object(&self, status: &str, with_output: bool) -> Value {
        let output = if with_output {
            json!([self.responses_item(true)])
        } else {
            json!([])
        };
        let usage = match (&self.usage, status) {
            (Some(u), "completed" | "incomplete") => responses_usage(u),
            _ => Value::Null,
        };
        let incomplete = if status == "incomplete" {
            json!({"reason": "max_output_tokens"})
        } else {
            Value::Null
        };
        json!({"id": self.id, "object": "response", "created_at": self.created,
            "status": status, "model": self.model, "output": output, "usage": usage,
            "error": null, "incomplete_details": incomplete})
    }

    /// Terminal Responses status: `incomplete` when `max_output_tokens` cut the answer.
    fn responses_final_status(&self) -> &'static str {
        if self.finish == Finish::Length {
            "incomplete"
        } else {
            "completed"
        }
    }
}

/// SSE encoder for one answer; keeps the Responses `sequence_number`.
#[derive(Debug)]
pub(crate) struct Sse {
    pub(crate) answer: Answer,
    seq: u64,
}

fn data(v: &Value) -> Bytes {
    Bytes::from(format!("data: {v}\n\n"))
}

fn event(name: &str, v: &Value) -> Bytes {
    Bytes::from(format!("event: {name}\ndata: {v}\n\n"))
}

/// Gemini's SSE framing: `data: <json>` ended by a CRLF blank line, as Vertex sends it.
fn gemini_data(v: &Value) -> Bytes {
    Bytes::from(format!("data: {v}\r\n\r\n"))
}

/// The same event without its terminating blank line (a torn event, field case 19b).
pub(crate) fn torn(b: &Bytes) -> Bytes {
    let s = String::from_utf8_lossy(b);
    Bytes::from(s.trim_end_matches('\n').to_owned() + "\n")
}

impl Sse {
    pub(crate) fn new(answer: Answer) -> Self {
        Self { answer, seq: 0 }
    }

    fn chunk(&self, delta: Value, finish: Option<&str>) -> Value {
        let a = &self.answer;
        let mut c = json!({"id": a.id, "object": "chat.completion.chunk", "created": a.created,
            "model": a.model, "system_fingerprint": null,
            "choices": [{"index": 0, "delta": delta, "logprobs": null, "finish_reason": finish}]});
        if a.include_usage
            && a.usage_style == UsageStyle::Openai
            && let Some(obj) = c.as_object_mut()
        {
            obj.insert("usage".to_owned(), Value::Null);
        }
        c
    }

    fn resp_event(&mut self, kind: &str, mut v: Value) -> Bytes {
        if let Some(obj) = v.as_object_mut() {
            obj.insert("type".to_owned(), json!(kind));
            obj.insert("sequence_number".to_owned(), json!(self.seq));
        }
        self.seq += 1;
        event(kind, &v)
    }

    /// An Anthropic event as SSE, or as an InvokeModelWithResponseStream `chunk` frame.
    fn anth(&self, name: &str, v: &Value) -> Bytes {
        if self.answer.api == ChatApi::BedrockInvoke {
            crate::eventstream::chunk_frame(v)
        } else {
            event(name, v)
        }
    }

    fn anthropic_message_start(&self) -> Bytes {
        let a = &self.answer;
        let mut msg = json!({"id": a.id, "type": "message", "role": "assistant", "model": a.model,
            "content": [], "stop_reason": null, "stop_sequence": null});
        if let (Some(u), Some(obj)) = (&a.usage, msg.as_object_mut()) {
            obj.insert("usage".to_owned(), anthropic_usage(u, 1));
        }
        self.anth(
            "message_start",
            &json!({"type": "message_start", "message": msg}),
        )
    }

    /// Events sent with the headers, before any content. `for_error` gives the shortened
    /// preamble that precedes an in-stream error (no content block is opened).
    pub(crate) fn preamble(&mut self, for_error: bool) -> Vec<Bytes> {
        match self.answer.api {
            ChatApi::OpenAiChat => {
                vec![data(
                    &self.chunk(json!({"role": "assistant", "content": ""}), None),
                )]
            }
            ChatApi::Anthropic | ChatApi::VertexClaude | ChatApi::BedrockInvoke => {
                let mut v = vec![self.anthropic_message_start()];
                if !for_error {
                    let block = match &self.answer.tool {
                        Some(name) => json!({"type": "tool_use",
                            "id": format!("toolu_{}", self.answer.call_id()),
                            "name": name, "input": {}}),
                        None => json!({"type": "text", "text": ""}),
                    };
                    v.push(self.anth(
                        "content_block_start",
                        &json!({"type": "content_block_start",
                        "index": 0, "content_block": block}),
                    ));
                }
                // Bedrock's chunk stream carries no pings.
                if self.answer.api != ChatApi::BedrockInvoke {
                    v.push(event("ping", &json!({"type": "ping"})));
                }
                v
            }
            ChatApi::Gemini => Vec::new(),
            ChatApi::Converse => crate::bedrock::converse_preamble(&self.answer, for_error),
            ChatApi::Responses => {
                let created = self.answer.responses_object("in_progress", false);
                let mut v = vec![
                    self.resp_event("response.created", json!({"response": created.clone()})),
                    self.resp_event("response.in_progress", json!({"response": created})),
                ];
                if !for_error {
                    let item = self.answer.responses_item(false);
                    v.push(self.resp_event(
                        "response.output_item.added",
                        json!({"output_index": 0, "item": item}),
                    ));
                    if self.answer.tool.is_none() {
                        let item_id = format!("msg_{}", self.answer.id);
                        v.push(self.resp_event(
                            "response.content_part.added",
                            json!({
                            "item_id": item_id, "output_index": 0, "content_index": 0,
                            "part": {"type": "output_text", "text": "", "annotations": []}}),
                        ));
                    }
                }
                v
            }
        }
    }

    /// Content delta `i` torn in half: an SSE event without its blank line, or half a frame.
    pub(crate) fn torn_delta(&mut self, i: u64) -> Bytes {
        let whole = self.delta(i);
        if self.answer.api.is_event_stream() {
            crate::eventstream::torn_frame(&whole)
        } else {
            torn(&whole)
        }
    }

    /// Content delta for token `i`.
    pub(crate) fn delta(&mut self, i: u64) -> Bytes {
        let text = token_text(i);
        match self.answer.api {
            ChatApi::OpenAiChat => data(&self.chunk(json!({"content": text}), None)),
            ChatApi::Anthropic | ChatApi::VertexClaude | ChatApi::BedrockInvoke => self.anth(
                "content_block_delta",
                &json!({
                "type": "content_block_delta", "index": 0,
                "delta": {"type": "text_delta", "text": text}}),
            ),
            ChatApi::Gemini => gemini_data(&crate::vertex::delta_chunk(&self.answer, i)),
            ChatApi::Converse => crate::bedrock::converse_delta(i),
            ChatApi::Responses => {
                let item_id = format!("msg_{}", self.answer.id);
                self.resp_event(
                    "response.output_text.delta",
                    json!({"item_id": item_id,
                    "output_index": 0, "content_index": 0, "delta": text, "logprobs": []}),
                )
            }
        }
    }

    /// Tool-call events (name, then the arguments).
    pub(crate) fn tool_call(&mut self) -> Vec<Bytes> {
        let Some(name) = self.answer.tool.clone() else {
            return Vec::new();
        };
        let call_id = self.answer.call_id();
        match self.answer.api {
            ChatApi::OpenAiChat => vec![
                data(&self.chunk(
                    json!({"tool_calls": [{"index": 0, "id": call_id,
                    "type": "function", "function": {"name": name, "arguments": ""}}]}),
                    None,
                )),
                data(&self.chunk(
                    json!({"tool_calls": [{"index": 0,
                    "function": {"arguments": TOOL_ARGS}}]}),
                    None,
                )),
            ],
            ChatApi::Anthropic | ChatApi::VertexClaude | ChatApi::BedrockInvoke => vec![self.anth(
                "content_block_delta",
                &json!({
                "type": "content_block_delta", "index": 0,
                "delta": {"type": "input_json_delta", "partial_json": TOOL_ARGS}}),
            )],
            ChatApi::Gemini => vec![gemini_data(&crate::vertex::tool_chunk(&self.answer))],
            ChatApi::Converse => vec![crate::bedrock::converse_tool_delta()],
            ChatApi::Responses => {
                let item_id = format!("fc_{}", self.answer.id);
                vec![
                    self.resp_event(
                        "response.function_call_arguments.delta",
                        json!({
                        "item_id": item_id, "output_index": 0, "delta": TOOL_ARGS}),
                    ),
                    self.resp_event(
                        "response.function_call_arguments.done",
                        json!({
                        "item_id": item_id, "output_index": 0, "arguments": TOOL_ARGS}),
                    ),
                ]
            }
        }
    }

    /// Closing events; returns them and the usage they carry (if any reached the wire).
    pub(crate) fn finish(&mut self) -> (Vec<Bytes>, Option<UsageRecord>) {
        let usage = self.answer.usage;
        match self.answer.api {
            ChatApi::OpenAiChat => {
                let mut last = self.chunk(json!({}), Some(self.answer.openai_finish()));
                let mut sent = None;
                if self.answer.usage_style == UsageStyle::Gemini
                    && let (Some(u), Some(obj)) = (&usage, last.as_object_mut())
                {
                    obj.insert("usageMetadata".to_owned(), gemini_usage(u));
                    sent = usage;
                }
                let mut v = vec![data(&last)];
                if self.answer.include_usage
                    && self.answer.usage_style == UsageStyle::Openai
                    && let Some(u) = &usage
                {
                    let a = &self.answer;
                    v.push(data(&json!({"id": a.id, "object": "chat.completion.chunk",
                        "created": a.created, "model": a.model, "system_fingerprint": null,
                        "choices": [], "usage": openai_usage(u)})));
                    sent = usage;
                }
                v.push(Bytes::from_static(b"data: [DONE]\n\n"));
                (v, sent)
            }
            ChatApi::Anthropic | ChatApi::VertexClaude | ChatApi::BedrockInvoke => {
                let mut delta = json!({"type": "message_delta",
                    "delta": {"stop_reason": self.answer.anthropic_stop(), "stop_sequence": null}});
                if let (Some(u), Some(obj)) = (&usage, delta.as_object_mut()) {
                    // Cumulative counts, as the current API repeats them at the end.
                    obj.insert("usage".to_owned(), anthropic_usage(u, u.output_tokens));
                }
                let mut stop = json!({"type": "message_stop"});
                if self.answer.api == ChatApi::BedrockInvoke
                    && let Some(obj) = stop.as_object_mut()
                {
                    obj.insert(
                        "amazon-bedrock-invocationMetrics".to_owned(),
                        crate::bedrock::invocation_metrics(&self.answer),
                    );
                }
                let v = vec![
                    self.anth(
                        "content_block_stop",
                        &json!({"type": "content_block_stop", "index": 0}),
                    ),
                    self.anth("message_delta", &delta),
                    self.anth("message_stop", &stop),
                ];
                (v, usage)
            }
            ChatApi::Gemini => (
                vec![gemini_data(&crate::vertex::final_chunk(&self.answer))],
                usage,
            ),
            ChatApi::Converse => (crate::bedrock::converse_finish(&self.answer), usage),
            ChatApi::Responses => {
                let item = self.answer.responses_item(true);
                let mut v = Vec::new();
                if self.answer.tool.is_none() {
                    let item_id = format!("msg_{}", self.answer.id);
                    let text = full_text(self.answer.text_tokens);
                    v.push(self.resp_event(
                        "response.output_text.done",
                        json!({
                        "item_id": item_id, "output_index": 0, "content_index": 0, "text": text}),
                    ));
                    v.push(self.resp_event(
                        "response.content_part.done",
                        json!({
                        "item_id": item_id, "output_index": 0, "content_index": 0,
                        "part": {"type": "output_text", "text": text, "annotations": []}}),
                    ));
                }
                v.push(self.resp_event(
                    "response.output_item.done",
                    json!({"output_index": 0, "item": item}),
                ));
                let status = self.answer.responses_final_status();
                let done = self.answer.responses_object(status, true);
                let name = format!("response.{status}");
                v.push(self.resp_event(&name, json!({"response": done})));
                (v, usage)
            }
        }
    }

    /// An in-stream error event in the format's own shape.
    pub(crate) fn error(&mut self, e: &ErrorSpec) -> Vec<Bytes> {
        match self.answer.api {
            ChatApi::OpenAiChat => vec![data(&json!({"error": {"message": e.message,
                "type": e.openai_type, "param": null, "code": e.openai_code}}))],
            ChatApi::BedrockInvoke | ChatApi::Converse => {
                vec![crate::bedrock::stream_exception(e)]
            }
            ChatApi::Gemini => vec![gemini_data(&e.body(crate::errors::Dialect::Google, ""))],
            ChatApi::Anthropic | ChatApi::VertexClaude => vec![event(
                "error",
                &json!({"type": "error",
                "error": {"type": e.anthropic_type, "message": e.message}}),
            )],
            ChatApi::Responses => {
                let mut failed = self.answer.responses_object("failed", false);
                if let Some(obj) = failed.as_object_mut() {
                    obj.insert(
                        "error".to_owned(),
                        json!({
                        "code": e.openai_code.clone().unwrap_or_else(|| e.openai_type.clone()),
                        "message": e.message}),
                    );
                }
                vec![self.resp_event("response.failed", json!({"response": failed}))]
            }
        }
    }

    /// One keep-alive beat: an SSE comment plus a content-free event.
    pub(crate) fn keep_alive(&mut self) -> Vec<Bytes> {
        let comment = Bytes::from_static(b": keep-alive\n\n");
        match self.answer.api {
            ChatApi::OpenAiChat => vec![
                comment,
                data(&self.chunk(json!({"role": "assistant", "content": ""}), None)),
            ],
            ChatApi::Anthropic | ChatApi::VertexClaude => {
                vec![comment, event("ping", &json!({"type": "ping"}))]
            }
            ChatApi::Responses | ChatApi::Gemini => vec![comment],
            // An event stream has no comment frame; a hung Bedrock stream is silent.
            ChatApi::Converse | ChatApi::BedrockInvoke => Vec::new(),
        }
    }
}
