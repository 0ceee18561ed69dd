//! Per-stream translation of SSE events between dialects.
//!
//! A [`StreamTranslator`] is created per upstream attempt, fed every upstream item in order,
//! and returns the client-dialect items to send. It also accumulates the stream's usage
//! ([`StreamUsage`]) in every mode, so the dispatcher reconciles from one place.
//!
//! Anthropic → OpenAI: `message_start` → a role chunk (`{"role":"assistant","content":""}`);
//! text deltas → content chunks; a `tool_use` block start → a tool-call chunk with `id`,
//! `type` and `function.name` (the call's OpenAI index counts tool blocks in order);
//! `input_json_delta` → `function.arguments` fragments; `message_delta` → the finish chunk;
//! `message_stop` → the usage-only chunk (when the client asked for usage) and `[DONE]`.
//!
//! OpenAI → Anthropic: the first chunk → `message_start` (input usage is not known yet and
//! is reported as 0 there; the real counts follow in `message_delta.usage`, which newer
//! Anthropic streams also carry); content → a text block (`content_block_start`, deltas);
//! each new tool call (a delta with `id`) closes the open block and opens a `tool_use` block at
//! the next index, its argument fragments becoming `input_json_delta`s; the finish reason
//! closes the open block; `[DONE]` (or the end of input after a finish reason, for servers
//! that omit `[DONE]`) → `message_delta` with stop reason and usage, then `message_stop`.
//! Exactly one `message_start` is emitted and block indices increase by one per block.
//!
//! Same dialect: events are forwarded unchanged, except that an OpenAI usage-only chunk is
//! withheld when the client did not ask for it (the router always asks upstream, field case
//! 15).
//!
//! Comments are forwarded as comments (keep-alive); an `Incomplete` trailing event is never
//! forwarded. An upstream `error` event is translated into the client dialect's error event
//! and ends the translation without any success terminator.

use std::collections::HashMap;

use serde_json::{Map, Value, json};

use super::super::sse::{SseEvent, SseItem};
use super::super::usage::StreamUsage;
use super::super::{anthropic, openai};
use super::{TranslateError, anthropic_stop_to_openai, openai_finish_to_anthropic};

/// Stateful translator of one stream; see the module docs.
#[derive(Debug)]
pub struct StreamTranslator {
    mode: Mode,
    usage: StreamUsage,
    state: End,
    /// A stop marker (OpenAI `finish_reason`, Anthropic `message_delta`) was seen, so a clean
    /// end of input without the terminator is a complete answer, not a truncation.
    stop_seen: bool,
    /// The provider's finish reasons as it sent them (its own dialect), at most
    /// [`MAX_FINISH_REASONS`], for telemetry.
    finish_reasons: Vec<String>,
}

/// Finish reasons kept per stream: one per choice, and a provider that repeats them cannot grow
/// the list without bound.
const MAX_FINISH_REASONS: usize = 16;

fn note_finish(reasons: &mut Vec<String>, reason: Option<&str>) {
    if let Some(r) = reason
        && reasons.len() < MAX_FINISH_REASONS
    {
        reasons.push(r.to_owned());
    }
}

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum End {
    Open,
    Finished,
    Errored,
}

#[derive(Debug)]
enum Mode {
    OpenAiPassthrough { client_wants_usage: bool },
    AnthropicPassthrough,
    AnthropicToOpenAi(A2O),
    OpenAiToAnthropic(O2A),
}

impl StreamTranslator {
    /// Counts delivered output with `count` when the stream ends before usage is reported
    /// (see [`StreamUsage::count_with`]).
    pub fn count_output_with(mut self, count: fn(&str) -> u64) -> Self {
        self.usage.count_with(count);
        self
    }

    /// OpenAI upstream, OpenAI client. `client_wants_usage` is the value returned by
    /// [`openai::ChatRequest::force_include_usage`]; when false the usage-only chunk is
    /// withheld from the client (but still counted).
    pub fn openai_passthrough(client_wants_usage: bool) -> Self {
        Self::with(Mode::OpenAiPassthrough { client_wants_usage })
    }

    /// Anthropic upstream, Anthropic client: events forwarded unchanged.
    pub fn anthropic_passthrough() -> Self {
        Self::with(Mode::AnthropicPassthrough)
    }

    /// Anthropic upstream, OpenAI client. `created` is the Unix time (seconds) stamped on every
    /// chunk; `client_wants_usage` whether the client set `stream_options.include_usage`.
    pub fn anthropic_to_openai(created: u64, client_wants_usage: bool) -> Self {
        Self::with(Mode::AnthropicToOpenAi(A2O {
            id: String::new(),
            model: String::new(),
            created,
            client_wants_usage,
            tool_index: HashMap::new(),
            next_tool: 0,
        }))
    }

    /// OpenAI-compatible upstream, Anthropic client.
    pub fn openai_to_anthropic() -> Self {
        Self::with(Mode::OpenAiToAnthropic(O2A::default()))
    }

    fn with(mode: Mode) -> Self {
        StreamTranslator {
            mode,
            usage: StreamUsage::new(),
            state: End::Open,
            stop_seen: false,
            finish_reasons: Vec::new(),
        }
    }

    /// Usage seen so far (reported, and the delivered content size for estimates).
    pub fn usage(&self) -> &StreamUsage {
        &self.usage
    }

    /// The finish reasons seen so far, in the client's dialect (OpenAI `finish_reason` values
    /// for an OpenAI client, Anthropic `stop_reason` values for an Anthropic one), one per
    /// choice that finished; empty before the end. Shape: at most 16 entries.
    pub fn finish_reasons(&self) -> Vec<String> {
        let map = |r: &String| match self.mode {
            Mode::AnthropicToOpenAi(_) => super::anthropic_stop_to_openai(r).to_owned(),
            Mode::OpenAiToAnthropic(_) => super::openai_finish_to_anthropic(r).to_owned(),
            Mode::OpenAiPassthrough { .. } | Mode::AnthropicPassthrough => r.clone(),
        };
        self.finish_reasons.iter().map(map).collect()
    }

    /// Whether the success terminator (`[DONE]` / `message_stop`) has been emitted.
    pub fn is_finished(&self) -> bool {
        self.state == End::Finished
    }

    /// Whether an upstream error event has been translated (the stream is over, failed).
    pub fn is_errored(&self) -> bool {
        self.state == End::Errored
    }

    /// Feeds one upstream item; returns the client items to send, in order. Items after the
    /// end (terminator or error) are ignored.
    ///
    /// Errors: [`TranslateError::InvalidUpstream`] when an event's data does not parse in the
    /// upstream dialect (only in translating modes; pass-through forwards it unchanged).
    pub fn push(&mut self, item: &SseItem) -> Result<Vec<SseItem>, TranslateError> {
        if self.state != End::Open {
            return Ok(Vec::new());
        }
        let ev = match item {
            SseItem::Comment(c) => return Ok(vec![SseItem::Comment(c.clone())]),
            SseItem::Incomplete(_) => return Ok(Vec::new()),
            SseItem::Event(ev) => ev,
        };
        let mut out = Vec::new();
        match &mut self.mode {
            Mode::OpenAiPassthrough { client_wants_usage } => {
                match scan_openai(ev)? {
                    None => self.state = End::Finished,
                    Some(chunk)
                        if chunk.error.is_some() || ev.event.as_deref() == Some("error") =>
                    {
                        self.state = End::Errored
                    }
                    Some(chunk) => {
                        self.usage.observe_openai_scan(&chunk);
                        self.stop_seen |= chunk.choices.iter().any(|c| c.finish_reason.is_some());
                        for c in &chunk.choices {
                            note_finish(&mut self.finish_reasons, c.finish_reason.as_deref());
                        }
                        if chunk.is_usage_only() && !*client_wants_usage {
                            return Ok(out);
                        }
                    }
                }
                out.push(item.clone());
            }
            Mode::AnthropicPassthrough => {
                let event = parse_anthropic(ev)?;
                self.usage.observe_anthropic(&event);
                match event {
                    anthropic::StreamEvent::MessageStop => self.state = End::Finished,
                    anthropic::StreamEvent::Error { .. } => self.state = End::Errored,
                    anthropic::StreamEvent::MessageDelta { delta, .. } => {
                        self.stop_seen = true;
                        note_finish(&mut self.finish_reasons, delta.stop_reason.as_deref());
                    }
                    _ => {}
                }
                out.push(item.clone());
            }
            Mode::AnthropicToOpenAi(t) => {
                let event = parse_anthropic(ev)?;
                self.usage.observe_anthropic(&event);
                if let anthropic::StreamEvent::MessageDelta { delta, .. } = &event {
                    self.stop_seen = true;
                    note_finish(&mut self.finish_reasons, delta.stop_reason.as_deref());
                }
                self.state = t.push(event, &self.usage, &mut out);
            }
            Mode::OpenAiToAnthropic(t) => {
                let data = parse_openai(ev)?;
                if let OpenAiData::Chunk(chunk) = &data {
                    self.usage.observe_openai(chunk);
                    for c in &chunk.choices {
                        note_finish(&mut self.finish_reasons, c.finish_reason.as_deref());
                    }
                }
                self.state = t.push(data, &self.usage, &mut out);
            }
        }
        Ok(out)
    }

    /// Upstream ended cleanly (no transport error). When the upstream had signalled the end
    /// of the answer (finish reason / `message_delta`) but omitted its terminator (`[DONE]` /
    /// `message_stop`), as some OpenAI-compatible servers do, the missing terminator (and, for
    /// translated streams, the closing events) is returned and the stream counts as finished.
    /// Otherwise nothing is returned; check [`StreamTranslator::is_finished`] afterwards: if
    /// false, the stream was truncated and the dispatcher must send an error event.
    pub fn finish(&mut self) -> Vec<SseItem> {
        let mut out = Vec::new();
        if self.state != End::Open {
            return out;
        }
        match &mut self.mode {
            Mode::OpenAiToAnthropic(t) if t.stop_reason.is_some() => {
                self.state = t.push(OpenAiData::Done, &self.usage, &mut out);
            }
            Mode::AnthropicToOpenAi(t) if self.stop_seen => {
                self.state = t.push(anthropic::StreamEvent::MessageStop, &self.usage, &mut out);
            }
            Mode::OpenAiPassthrough { .. } if self.stop_seen => {
                out.push(SseItem::Event(SseEvent::data("[DONE]")));
                self.state = End::Finished;
            }
            Mode::AnthropicPassthrough if self.stop_seen => {
                out.push(json_event(
                    Some("message_stop"),
                    &json!({"type": "message_stop"}),
                ));
                self.state = End::Finished;
            }
            _ => {}
        }
        out
    }
}

enum OpenAiData {
    Chunk(Box<openai::ChatChunk>),
    Done,
    Error(Value),
}

fn parse_openai(ev: &SseEvent) -> Result<OpenAiData, TranslateError> {
    let data = ev.data.trim();
    if data == "[DONE]" {
        return Ok(OpenAiData::Done);
    }
    let value: Value = serde_json::from_str(data)
        .map_err(|e| TranslateError::InvalidUpstream(format!("stream data is not JSON: {e}")))?;
    if ev.event.as_deref() == Some("error") || value.get("error").is_some_and(|e| !e.is_null()) {
        return Ok(OpenAiData::Error(value));
    }
    serde_json::from_value(value)
        .map(|c| OpenAiData::Chunk(Box::new(c)))
        .map_err(|e| TranslateError::InvalidUpstream(format!("bad chat.completion.chunk: {e}")))
}

/// The pass-through reading of an OpenAI stream event: `None` for `[DONE]`, else the chunk's
/// members the relay needs ([`openai::ChunkScan`]).
///
/// Errors: [`TranslateError::InvalidUpstream`] when the data is not JSON or those members have
/// the wrong types.
fn scan_openai(ev: &SseEvent) -> Result<Option<openai::ChunkScan<'_>>, TranslateError> {
    let data = ev.data.trim();
    if data == "[DONE]" {
        return Ok(None);
    }
    serde_json::from_str(data)
        .map(Some)
        .map_err(|e| TranslateError::InvalidUpstream(format!("bad chat.completion.chunk: {e}")))
}

fn parse_anthropic(ev: &SseEvent) -> Result<anthropic::StreamEvent, TranslateError> {
    serde_json::from_str(ev.data.trim())
        .map_err(|e| TranslateError::InvalidUpstream(format!("bad Anthropic stream event: {e}")))
}

fn json_event(name: Option<&str>, value: &impl serde::Serialize) -> SseItem {
    // Serialising these in-memory structs cannot fail; `{}` keeps the framing valid regardless.
    let data = serde_json::to_string(value).unwrap_or_else(|_| "{}".to_owned());
    SseItem::Event(SseEvent::new(name, data))
}

// ---------------------------------------------------------------------------------------------
// Anthropic → OpenAI

#[derive(Debug)]
struct A2O {
    id: String,
    model: String,
    created: u64,
    client_wants_usage: bool,
    /// Anthropic block index → OpenAI tool-call index.
    tool_index: HashMap<u32, u32>,
    next_tool: u32,
}

impl A2O {
    fn chunk(&self, delta: openai::Delta, finish_reason: Option<String>) -> SseItem {
        let chunk = openai::ChatChunk {
            id: self.id.clone(),
            object: "chat.completion.chunk".into(),
            created: self.created,
            model: self.model.clone(),
            choices: vec![openai::ChunkChoice {
                index: 0,
                delta,
                finish_reason,
                extra: Map::new(),
            }],
            usage: None,
            extra: Map::new(),
        };
        json_event(None, &chunk)
    }

    fn text(&self, text: String) -> SseItem {
        self.chunk(
            openai::Delta {
                content: Some(text),
                ..Default::default()
            },
            None,
        )
    }

    fn tool(&self, call: openai::ToolCallDelta) -> SseItem {
        self.chunk(
            openai::Delta {
                tool_calls: Some(vec![call]),
                ..Default::default()
            },
            None,
        )
    }

    fn push(
        &mut self,
        event: anthropic::StreamEvent,
        usage: &StreamUsage,
        out: &mut Vec<SseItem>,
    ) -> End {
        use anthropic::StreamEvent as E;
        match event {
            E::MessageStart { message } => {
                self.id = message.id;
                self.model = message.model;
                out.push(self.chunk(
                    openai::Delta {
                        role: Some(openai::Role::Assistant),
                        content: Some(String::new()),
                        ..Default::default()
                    },
                    None,
                ));
            }
            E::ContentBlockStart {
                index,
                content_block,
            } => match content_block {
                anthropic::ContentBlock::Known(anthropic::Block::Text { text, .. })
                    if !text.is_empty() =>
                {
                    out.push(self.text(text));
                }
                anthropic::ContentBlock::Known(anthropic::Block::ToolUse { id, name, .. }) => {
                    let k = self.next_tool;
                    self.next_tool += 1;
                    self.tool_index.insert(index, k);
                    out.push(self.tool(openai::ToolCallDelta {
                        index: k,
                        id: Some(id),
                        kind: Some("function".into()),
                        function: Some(openai::FunctionCallDelta {
                            name: Some(name),
                            arguments: Some(String::new()),
                        }),
                    }));
                }
                _ => {}
            },
            E::ContentBlockDelta { index, delta } => match delta {
                anthropic::BlockDelta::TextDelta { text } if !text.is_empty() => {
                    out.push(self.text(text));
                }
                anthropic::BlockDelta::InputJsonDelta { partial_json }
                    if !partial_json.is_empty() =>
                {
                    if let Some(&k) = self.tool_index.get(&index) {
                        out.push(self.tool(openai::ToolCallDelta {
                            index: k,
                            function: Some(openai::FunctionCallDelta {
                                name: None,
                                arguments: Some(partial_json),
                            }),
                            ..Default::default()
                        }));
                    }
                }
                _ => {}
            },
            E::MessageDelta { delta, .. } => {
                let reason =
                    anthropic_stop_to_openai(delta.stop_reason.as_deref().unwrap_or("end_turn"));
                out.push(self.chunk(openai::Delta::default(), Some(reason.to_owned())));
            }
            E::MessageStop => {
                if self.client_wants_usage {
                    let chunk = openai::ChatChunk {
                        id: self.id.clone(),
                        object: "chat.completion.chunk".into(),
                        created: self.created,
                        model: self.model.clone(),
                        choices: Vec::new(),
                        usage: Some(usage.finish(0).to_openai()),
                        extra: Map::new(),
                    };
                    out.push(json_event(None, &chunk));
                }
                out.push(SseItem::Event(SseEvent::data("[DONE]")));
                return End::Finished;
            }
            E::Error { error } => {
                let body = openai::ErrorBody {
                    error: openai::ErrorDetail {
                        message: error.message,
                        kind: Some(error.kind),
                        param: None,
                        code: None,
                    },
                };
                out.push(json_event(None, &body));
                return End::Errored;
            }
            E::ContentBlockStop { .. } | E::Ping | E::Other => {}
        }
        End::Open
    }
}

// ---------------------------------------------------------------------------------------------
// OpenAI → Anthropic

#[derive(Debug, Default)]
struct O2A {
    started: bool,
    /// Index and kind of the open content block.
    open: Option<(u32, Open)>,
    next_block: u32,
    /// OpenAI tool-call index → Anthropic block index.
    tool_blocks: HashMap<u32, u32>,
    stop_reason: Option<String>,
}

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Open {
    Text,
    Tool,
}

impl O2A {
    fn start(&mut self, chunk: &openai::ChatChunk, out: &mut Vec<SseItem>) {
        if self.started {
            return;
        }
        self.started = true;
        let message = json!({
            "id": chunk.id, "type": "message", "role": "assistant", "model": chunk.model,
            "content": [], "stop_reason": null, "stop_sequence": null,
            "usage": {"input_tokens": 0, "output_tokens": 0},
        });
        out.push(json_event(
            Some("message_start"),
            &json!({"type": "message_start", "message": message}),
        ));
    }

    fn close(&mut self, out: &mut Vec<SseItem>) {
        if let Some((index, _)) = self.open.take() {
            out.push(json_event(
                Some("content_block_stop"),
                &json!({"type": "content_block_stop", "index": index}),
            ));
        }
    }

    fn open_block(&mut self, kind: Open, block: Value, out: &mut Vec<SseItem>) -> u32 {
        self.close(out);
        let index = self.next_block;
        self.next_block += 1;
        self.open = Some((index, kind));
        out.push(json_event(
            Some("content_block_start"),
            &json!({"type": "content_block_start", "index": index, "content_block": block}),
        ));
        index
    }

    fn delta(index: u32, delta: Value, out: &mut Vec<SseItem>) {
        out.push(json_event(
            Some("content_block_delta"),
            &json!({"type": "content_block_delta", "index": index, "delta": delta}),
        ));
    }

    fn push(&mut self, data: OpenAiData, usage: &StreamUsage, out: &mut Vec<SseItem>) -> End {
        match data {
            OpenAiData::Error(value) => {
                let detail = value.get("error").unwrap_or(&value);
                let message = detail
                    .get("message")
                    .and_then(Value::as_str)
                    .unwrap_or("upstream error")
                    .to_owned();
                let kind = anthropic_error_type_of(detail);
                out.push(json_event(
                    Some("error"),
                    &anthropic::ErrorBody::with_type(kind, message),
                ));
                End::Errored
            }
            OpenAiData::Done => {
                if !self.started {
                    // `[DONE]` with no chunk at all: still one well-formed (empty) message.
                    self.start(
                        &openai::ChatChunk {
                            id: String::new(),
                            object: String::new(),
                            created: 0,
                            model: String::new(),
                            choices: Vec::new(),
                            usage: None,
                            extra: Map::new(),
                        },
                        out,
                    );
                }
                self.close(out);
                let stop = self
                    .stop_reason
                    .clone()
                    .unwrap_or_else(|| "end_turn".to_owned());
                let usage = usage
                    .reported()
                    .map(|u| u.to_anthropic())
                    .unwrap_or_else(|| anthropic::Usage {
                        output_tokens: Some(0),
                        ..Default::default()
                    });
                out.push(json_event(
                    Some("message_delta"),
                    &json!({"type": "message_delta",
                        "delta": {"stop_reason": stop, "stop_sequence": null},
                        "usage": usage}),
                ));
                out.push(json_event(
                    Some("message_stop"),
                    &json!({"type": "message_stop"}),
                ));
                End::Finished
            }
            OpenAiData::Chunk(chunk) => {
                // A chunk without choices (Azure's opening `prompt_filter_results`, the usage
                // chunk) adds no content and carries no reliable header; wait for a real one.
                if chunk.choices.is_empty() {
                    return End::Open;
                }
                self.start(&chunk, out);
                // Only the first choice is translated (`n > 1` is refused at request time).
                let Some(choice) = chunk.choices.into_iter().find(|c| c.index == 0) else {
                    return End::Open;
                };
                if let Some(text) = choice.delta.content.filter(|t| !t.is_empty()) {
                    let index = match self.open {
                        Some((i, Open::Text)) => i,
                        _ => self.open_block(Open::Text, json!({"type": "text", "text": ""}), out),
                    };
                    Self::delta(index, json!({"type": "text_delta", "text": text}), out);
                }
                for call in choice.delta.tool_calls.unwrap_or_default() {
                    let function = call.function.unwrap_or_default();
                    let index = match self.tool_blocks.get(&call.index) {
                        Some(&i) if call.id.is_none() => i,
                        _ => {
                            let id = call.id.unwrap_or_else(|| format!("call_{}", call.index));
                            let block = json!({"type": "tool_use", "id": id,
                                "name": function.name.clone().unwrap_or_default(), "input": {}});
                            let i = self.open_block(Open::Tool, block, out);
                            self.tool_blocks.insert(call.index, i);
                            i
                        }
                    };
                    if let Some(args) = function.arguments.filter(|a| !a.is_empty()) {
                        Self::delta(
                            index,
                            json!({"type": "input_json_delta", "partial_json": args}),
                            out,
                        );
                    }
                }
                if let Some(reason) = choice.finish_reason {
                    self.stop_reason = Some(openai_finish_to_anthropic(&reason).to_owned());
                    self.close(out);
                }
                End::Open
            }
        }
    }
}

/// Anthropic error type for an OpenAI-style error object, from its `type`/`code`.
fn anthropic_error_type_of(detail: &Value) -> &'static str {
    let field = |k: &str| {
        detail
            .get(k)
            .and_then(Value::as_str)
            .unwrap_or_default()
            .to_owned()
    };
    let text = format!("{} {}", field("type"), field("code")).to_ascii_lowercase();
    if text.contains("overload") || text.contains("unavailable") {
        "overloaded_error"
    } else if text.contains("rate_limit") || text.contains("quota") {
        "rate_limit_error"
    } else if text.contains("invalid_request") {
        "invalid_request_error"
    } else {
        "api_error"
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn anthropic_error_type_of_maps_overload_and_quota() {
        assert_eq!(
            anthropic_error_type_of(
                &json!({"type": "server_error", "code": "server_is_overloaded"})
            ),
            "overloaded_error"
        );
        assert_eq!(
            anthropic_error_type_of(&json!({"type": "insufficient_quota"})),
            "rate_limit_error"
        );
        assert_eq!(
            anthropic_error_type_of(&json!({"message": "x"})),
            "api_error"
        );
    }

    #[test]
    fn finish_reasons_are_reported_in_the_clients_dialect_and_bounded() {
        let openai_stop = SseItem::Event(SseEvent::data(
            r#"{"id":"c","object":"chat.completion.chunk","created":1,"model":"m","choices":[{"index":0,"delta":{},"finish_reason":"length"}]}"#,
        ));
        let delta = SseItem::Event(SseEvent {
            event: Some("message_delta".to_owned()),
            ..SseEvent::data(
                r#"{"type":"message_delta","delta":{"stop_reason":"max_tokens","stop_sequence":null},"usage":{"output_tokens":3}}"#,
            )
        });
        let mut t = StreamTranslator::openai_passthrough(true);
        assert!(t.finish_reasons().is_empty());
        t.push(&openai_stop).unwrap();
        assert_eq!(t.finish_reasons(), ["length"]);
        let mut t = StreamTranslator::openai_to_anthropic();
        t.push(&openai_stop).unwrap();
        assert_eq!(t.finish_reasons(), ["max_tokens"]);
        let mut t = StreamTranslator::anthropic_passthrough();
        t.push(&delta).unwrap();
        assert_eq!(t.finish_reasons(), ["max_tokens"]);
        let mut t = StreamTranslator::anthropic_to_openai(1, false);
        t.push(&delta).unwrap();
        assert_eq!(t.finish_reasons(), ["length"]);
        // A provider repeating finish chunks cannot grow the list past its bound.
        let mut t = StreamTranslator::openai_passthrough(true);
        for _ in 0..100 {
            t.push(&openai_stop).unwrap();
        }
        assert_eq!(t.finish_reasons().len(), MAX_FINISH_REASONS);
    }

    #[test]
    fn openai_passthrough_reads_usage_text_errors_and_forwards_events_unchanged() {
        let event = |data: &str| SseItem::Event(SseEvent::data(data));
        // Escaped text (no borrow possible), a tool-call argument, unknown members, a null error.
        let text = event(
            r#"{"id":"c","choices":[{"index":0,"delta":{"content":"h\u00e9llo","tool_calls":[{"index":0,"function":{"name":"f","arguments":"{\"a\":1}"}}]},"logprobs":null,"finish_reason":null}],"error":null,"system_fingerprint":"x"}"#,
        );
        let usage = event(
            r#"{"id":"c","choices":[],"usage":{"prompt_tokens":11,"completion_tokens":5,"total_tokens":16}}"#,
        );
        let mut t = StreamTranslator::openai_passthrough(false);
        assert_eq!(t.push(&text).unwrap(), vec![text.clone()]);
        assert!(!t.is_errored());
        // "héllo" (6 bytes) + `{"a":1}` (7 bytes) delivered.
        assert_eq!(t.usage().delivered_bytes(), 13);
        // A usage-only chunk is read but not forwarded to a client that did not ask for it.
        assert!(t.push(&usage).unwrap().is_empty());
        let u = t.usage().reported().unwrap();
        assert_eq!((u.input_uncached, u.output), (11, 5));
        let mut t = StreamTranslator::openai_passthrough(true);
        assert_eq!(t.push(&usage).unwrap(), vec![usage.clone()]);
        // An in-band error ends the stream as failed; a chunk that is not JSON is refused.
        let mut t = StreamTranslator::openai_passthrough(true);
        t.push(&event(
            r#"{"error":{"message":"overloaded","type":"server_error"}}"#,
        ))
        .unwrap();
        assert!(t.is_errored());
        let mut t = StreamTranslator::openai_passthrough(true);
        assert!(t.push(&event("{not json")).is_err());
        assert!(
            t.push(&event(r#"{"choices":[{"finish_reason":7}]}"#))
                .is_err()
        );
    }

    #[test]
    fn push_after_finish_is_ignored() {
        let mut t = StreamTranslator::openai_passthrough(true);
        t.push(&SseItem::Event(SseEvent::data("[DONE]"))).unwrap();
        assert!(t.is_finished());
        let out = t.push(&SseItem::Event(SseEvent::data("[DONE]"))).unwrap();
        assert!(out.is_empty());
    }
}
