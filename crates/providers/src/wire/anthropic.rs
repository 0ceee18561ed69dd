//! Anthropic Messages API wire shapes: request, response, stream events and the error body.
//!
//! As in [`crate::wire::openai`], requests and responses keep uninterpreted members in a
//! flattened `extra` map and content blocks of unknown `type` (documents, server tool
//! results, citations, ...) as raw JSON ([`ContentBlock::Other`]), so a same-dialect pass-through
//! loses nothing.
//!
//! Stream events are the SSE `data:` payloads of `POST /v1/messages` with `stream: true`:
//! `message_start`, `content_block_start`, `ping`, `content_block_delta` (`text_delta`,
//! `input_json_delta`, `thinking_delta`, `signature_delta`, ...), `content_block_stop`,
//! `message_delta`, `message_stop` and `error`. Unknown event or delta types parse as `Other`
//! rather than failing, because the API documents that new ones may appear.
//!
//! Source: the Anthropic API reference (Messages, Streaming Messages, Errors).

use serde::{Deserialize, Serialize};
use serde_json::{Map, Value};

/// Unknown JSON members, kept verbatim.
pub type Extra = Map<String, Value>;

/// Default `anthropic-version` header value.
pub const API_VERSION: &str = "2023-06-01";

/// `POST /v1/messages` request body.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct MessagesRequest {
    /// Public model name; the dispatcher swaps in the upstream name.
    pub model: String,
    /// Conversation turns, oldest first (user/assistant).
    pub messages: Vec<Message>,
    /// Output cap in tokens; required by the API (a request without it fails to parse, which
    /// is the API's own answer: 400 `invalid_request_error`).
    pub max_tokens: u64,
    /// System prompt: a string or text blocks (blocks may carry `cache_control`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub system: Option<System>,
    /// Custom stop sequences.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub stop_sequences: Option<Vec<String>>,
    /// `true` asks for an SSE stream of [`StreamEvent`]s.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub stream: Option<bool>,
    /// Sampling temperature, 0..=1.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub temperature: Option<f64>,
    /// Nucleus sampling mass.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub top_p: Option<f64>,
    /// Top-k sampling (no OpenAI equivalent).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub top_k: Option<u64>,
    /// Tool definitions.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub tools: Option<Vec<Tool>>,
    /// How the model may use tools.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub tool_choice: Option<ToolChoice>,
    /// `{"user_id": ..}`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub metadata: Option<Value>,
    /// Everything else the client sent (`thinking`, `service_tier`, `container`, ...).
    #[serde(flatten)]
    pub extra: Extra,
}

impl MessagesRequest {
    /// Whether the client asked for a stream.
    pub fn is_stream(&self) -> bool {
        self.stream == Some(true)
    }
}

/// `system`: a string or a list of text blocks.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[serde(untagged)]
pub enum System {
    /// Plain string.
    Text(String),
    /// Blocks (normally `text`, possibly with `cache_control`).
    Blocks(Vec<ContentBlock>),
}

impl System {
    /// All text of the system prompt, blocks joined by a blank line.
    pub fn joined_text(&self) -> String {
        match self {
            System::Text(s) => s.clone(),
            System::Blocks(blocks) => blocks
                .iter()
                .filter_map(ContentBlock::as_text)
                .collect::<Vec<_>>()
                .join("\n\n"),
        }
    }
}

/// Author of a turn.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum Role {
    /// End user (also carries tool results).
    User,
    /// Model.
    Assistant,
}

/// One turn of the conversation.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct Message {
    /// Author.
    pub role: Role,
    /// A string or content blocks.
    pub content: MessageContent,
    /// Other members.
    #[serde(flatten)]
    pub extra: Extra,
}

/// Turn content: a plain string or content blocks.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[serde(untagged)]
pub enum MessageContent {
    /// Plain text.
    Text(String),
    /// Blocks.
    Blocks(Vec<ContentBlock>),
}

impl MessageContent {
    /// The content as a list of blocks (a string becomes one text block).
    pub fn into_blocks(self) -> Vec<ContentBlock> {
        match self {
            MessageContent::Text(text) => vec![ContentBlock::text(text)],
            MessageContent::Blocks(blocks) => blocks,
        }
    }
}

/// One content block; blocks of a type the router does not interpret are kept as raw JSON.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[serde(untagged)]
pub enum ContentBlock {
    /// A block type this router interprets.
    Known(Block),
    /// Any other block (`document`, `redacted_thinking`, `server_tool_use`, ...).
    Other(Value),
}

impl ContentBlock {
    /// A plain text block.
    pub fn text(text: impl Into<String>) -> Self {
        ContentBlock::Known(Block::Text {
            text: text.into(),
            extra: Extra::new(),
        })
    }

    /// The text of a text block.
    pub fn as_text(&self) -> Option<&str> {
        match self {
            ContentBlock::Known(Block::Text { text, .. }) => Some(text),
            _ => None,
        }
    }
}

/// Content block types the router interprets.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[serde(tag = "type", rename_all = "snake_case")]
pub enum Block {
    /// Text.
    Text {
        /// The text.
        text: String,
        /// Other members (`cache_control`, `citations`).
        #[serde(flatten)]
        extra: Extra,
    },
    /// Image; `source` is `{"type":"base64","media_type","data"}` or `{"type":"url","url"}`.
    Image {
        /// Where the image comes from.
        source: Value,
        /// Other members (`cache_control`).
        #[serde(flatten)]
        extra: Extra,
    },
    /// A tool call made by the model.
    ToolUse {
        /// Call id (`toolu_...`).
        id: String,
        /// Tool name.
        name: String,
        /// Arguments object (`{}` in `content_block_start` of a stream).
        input: Value,
        /// Other members.
        #[serde(flatten)]
        extra: Extra,
    },
    /// Result of a tool call, sent in a user turn.
    ToolResult {
        /// Id of the `tool_use` it answers.
        tool_use_id: String,
        /// A string or blocks (text, image).
        #[serde(default, skip_serializing_if = "Option::is_none")]
        content: Option<ToolResultContent>,
        /// Whether the tool failed.
        #[serde(default, skip_serializing_if = "Option::is_none")]
        is_error: Option<bool>,
        /// Other members (`cache_control`).
        #[serde(flatten)]
        extra: Extra,
    },
    /// Extended thinking.
    Thinking {
        /// The reasoning text.
        thinking: String,
        /// Integrity signature.
        #[serde(default, skip_serializing_if = "Option::is_none")]
        signature: Option<String>,
        /// Other members.
        #[serde(flatten)]
        extra: Extra,
    },
}

/// `tool_result.content`: a string or blocks.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[serde(untagged)]
pub enum ToolResultContent {
    /// Plain text.
    Text(String),
    /// Blocks.
    Blocks(Vec<ContentBlock>),
}

impl ToolResultContent {
    /// Text of the result (blocks joined with a newline; non-text blocks ignored).
    pub fn joined_text(&self) -> String {
        match self {
            ToolResultContent::Text(s) => s.clone(),
            ToolResultContent::Blocks(blocks) => blocks
                .iter()
                .filter_map(ContentBlock::as_text)
                .collect::<Vec<_>>()
                .join("\n"),
        }
    }
}

/// A tool definition. Client tools have `input_schema`; server tools (web search, code
/// execution, ...) have a versioned `type` and no schema; both round-trip through `extra`.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct Tool {
    /// Tool name.
    pub name: String,
    /// What it does.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub description: Option<String>,
    /// JSON Schema of the input object (client tools).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub input_schema: Option<Value>,
    /// Other members (`type`, `cache_control`).
    #[serde(flatten)]
    pub extra: Extra,
}

/// `tool_choice`: `{"type":"auto"|"any"|"tool"|"none", "name"?, "disable_parallel_tool_use"?}`.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct ToolChoice {
    /// `auto`, `any`, `tool` or `none`.
    #[serde(rename = "type")]
    pub kind: String,
    /// Tool name for `type: tool`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub name: Option<String>,
    /// `true` allows at most one tool call.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub disable_parallel_tool_use: Option<bool>,
    /// Other members.
    #[serde(flatten)]
    pub extra: Extra,
}

/// Token usage. `input_tokens` *excludes* cache reads and cache writes, which are reported
/// separately; see [`crate::wire::usage::NormalizedUsage::from_anthropic`].
///
/// All fields are optional because `message_delta` carries only the fields that changed
/// (historically only `output_tokens`); the values present are cumulative.
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
pub struct Usage {
    /// Uncached input tokens.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub input_tokens: Option<u64>,
    /// Output tokens.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub output_tokens: Option<u64>,
    /// Input tokens written to the prompt cache.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub cache_creation_input_tokens: Option<u64>,
    /// Input tokens read from the prompt cache.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub cache_read_input_tokens: Option<u64>,
    /// Other members (`cache_creation` breakdown, `server_tool_use`, `service_tier`).
    #[serde(flatten)]
    pub extra: Extra,
}

/// Non-streaming response, also the `message` of `message_start`.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct MessagesResponse {
    /// Message id (`msg_...`).
    pub id: String,
    /// `"message"`.
    #[serde(rename = "type")]
    pub kind: String,
    /// `Assistant`.
    pub role: Role,
    /// Model that answered.
    pub model: String,
    /// Output blocks (empty in `message_start`).
    pub content: Vec<ContentBlock>,
    /// `end_turn`, `max_tokens`, `stop_sequence`, `tool_use`, `pause_turn`, `refusal`.
    #[serde(default)]
    pub stop_reason: Option<String>,
    /// The stop sequence that matched.
    #[serde(default)]
    pub stop_sequence: Option<String>,
    /// Token usage.
    #[serde(default)]
    pub usage: Usage,
    /// Other members (`container`).
    #[serde(flatten)]
    pub extra: Extra,
}

/// One stream event (the JSON `data:` of one SSE event; its `type` equals the SSE `event:`
/// name).
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[serde(tag = "type", rename_all = "snake_case")]
pub enum StreamEvent {
    /// First event: the message shell with input usage.
    MessageStart {
        /// Message with empty `content`.
        message: MessagesResponse,
    },
    /// A content block opens at `index`.
    ContentBlockStart {
        /// Block position.
        index: u32,
        /// Initial block (empty text, or `tool_use` with `input: {}`).
        content_block: ContentBlock,
    },
    /// Keep-alive.
    Ping,
    /// Incremental content of the block at `index`.
    ContentBlockDelta {
        /// Block position.
        index: u32,
        /// The delta.
        delta: BlockDelta,
    },
    /// The block at `index` is complete.
    ContentBlockStop {
        /// Block position.
        index: u32,
    },
    /// Top-level changes at the end: stop reason and cumulative usage.
    MessageDelta {
        /// `stop_reason`, `stop_sequence`.
        delta: MessageDeltaBody,
        /// Cumulative usage (at least `output_tokens`).
        #[serde(default, skip_serializing_if = "Option::is_none")]
        usage: Option<Usage>,
    },
    /// Last event of a successful stream.
    MessageStop,
    /// In-stream error (e.g. `overloaded_error` after a 200 status line).
    Error {
        /// Error type and message.
        error: ErrorDetail,
    },
    /// An event type this router does not know; ignored by translation.
    #[serde(other)]
    Other,
}

/// `delta` of a `content_block_delta` event.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[serde(tag = "type", rename_all = "snake_case")]
pub enum BlockDelta {
    /// More text of a text block.
    TextDelta {
        /// The text fragment.
        text: String,
    },
    /// More of a `tool_use` input, as a fragment of a JSON document.
    InputJsonDelta {
        /// The fragment (may be empty).
        partial_json: String,
    },
    /// More extended-thinking text.
    ThinkingDelta {
        /// The fragment.
        thinking: String,
    },
    /// Thinking signature.
    SignatureDelta {
        /// The signature.
        signature: String,
    },
    /// A delta type this router does not know (`citations_delta`, ...).
    #[serde(other)]
    Other,
}

/// `delta` of a `message_delta` event.
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
pub struct MessageDeltaBody {
    /// Why the model stopped.
    #[serde(default)]
    pub stop_reason: Option<String>,
    /// The stop sequence that matched.
    #[serde(default)]
    pub stop_sequence: Option<String>,
    /// Other members.
    #[serde(flatten)]
    pub extra: Extra,
}

/// Anthropic error body: `{"type":"error","error":{"type","message"}}`.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct ErrorBody {
    /// `"error"`.
    #[serde(rename = "type")]
    pub kind: String,
    /// The error.
    pub error: ErrorDetail,
}

/// Inner object of [`ErrorBody`] and of the stream `error` event.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct ErrorDetail {
    /// `invalid_request_error`, `overloaded_error`, ...
    #[serde(rename = "type")]
    pub kind: String,
    /// Human-readable message.
    pub message: String,
}

impl ErrorBody {
    /// Error body for an HTTP status with the API's type name for that status
    /// ([`error_type_for_status`]).
    pub fn for_status(status: u16, message: impl Into<String>) -> Self {
        ErrorBody::with_type(error_type_for_status(status), message)
    }

    /// Error body with an explicit type name.
    pub fn with_type(kind: &str, message: impl Into<String>) -> Self {
        ErrorBody {
            kind: "error".to_owned(),
            error: ErrorDetail {
                kind: kind.to_owned(),
                message: message.into(),
            },
        }
    }
}

/// The Anthropic error type for an HTTP status, per the API's error table: 400
/// `invalid_request_error` (also any other 4xx not listed), 401 `authentication_error`, 403
/// `permission_error`, 404 `not_found_error`, 413 `request_too_large`, 429 `rate_limit_error`,
/// 500 `api_error` (also other 5xx), 529 `overloaded_error`. 503 maps to `overloaded_error` as
/// well, because this router answers 503 when every provider is overloaded (field case 19a).
pub fn error_type_for_status(status: u16) -> &'static str {
    match status {
        401 => "authentication_error",
        403 => "permission_error",
        404 => "not_found_error",
        413 => "request_too_large",
        429 => "rate_limit_error",
        400..=499 => "invalid_request_error",
        503 | 529 => "overloaded_error",
        _ => "api_error",
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    #[test]
    fn error_type_for_status_covers_documented_table() {
        let table = [
            (400, "invalid_request_error"),
            (401, "authentication_error"),
            (403, "permission_error"),
            (404, "not_found_error"),
            (413, "request_too_large"),
            (422, "invalid_request_error"),
            (429, "rate_limit_error"),
            (500, "api_error"),
            (502, "api_error"),
            (503, "overloaded_error"),
            (529, "overloaded_error"),
        ];
        for (status, kind) in table {
            assert_eq!(error_type_for_status(status), kind, "status {status}");
        }
    }

    #[test]
    fn error_body_for_529_serialises_in_api_shape() {
        let body = ErrorBody::for_status(529, "Overloaded");
        assert_eq!(
            serde_json::to_value(&body).unwrap(),
            json!({"type": "error", "error": {"type": "overloaded_error", "message": "Overloaded"}})
        );
    }

    #[test]
    fn stream_event_unknown_type_parses_as_other() {
        let ev: StreamEvent =
            serde_json::from_value(json!({"type": "future_event", "x": 1})).unwrap();
        assert_eq!(ev, StreamEvent::Other);
    }

    #[test]
    fn content_block_unknown_type_is_kept_verbatim() {
        let raw = json!({"type": "document", "source": {"type": "text", "data": "x"}});
        let block: ContentBlock = serde_json::from_value(raw.clone()).unwrap();
        assert_eq!(block, ContentBlock::Other(raw.clone()));
        assert_eq!(serde_json::to_value(&block).unwrap(), raw);
    }
}
