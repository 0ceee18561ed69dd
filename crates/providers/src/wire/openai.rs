//! OpenAI wire shapes: chat completions (request, response, `chat.completion.chunk` stream
//! chunks), embeddings, and the error body.
//!
//! Every request type keeps the fields this router does not interpret in a flattened `extra`
//! map, so a request passed through to an OpenAI-compatible provider carries everything the
//! client sent (vendor extensions such as `seed`, `logit_bias`, `reasoning_effort`, or fields
//! invented after this file was written). Response and chunk types do the same so a
//! same-dialect response re-serialises without loss.
//!
//! Content parts and tool definitions the router does not understand are kept as raw JSON
//! ([`ContentPart::Other`]) instead of failing to parse; translation to another dialect decides
//! whether such a part is an error.
//!
//! Source: the OpenAI API reference for `POST /v1/chat/completions` and `POST /v1/embeddings`.

use serde::{Deserialize, Serialize};
use serde_json::{Map, Value};

/// Unknown JSON members, kept verbatim.
pub type Extra = Map<String, Value>;

/// `POST /v1/chat/completions` request body.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct ChatRequest {
    /// Public model name as the client asked for it; the dispatcher swaps in the upstream name.
    pub model: String,
    /// Conversation, oldest first.
    pub messages: Vec<ChatMessage>,
    /// Legacy output cap in tokens.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub max_tokens: Option<u64>,
    /// Output cap in tokens (newer name; includes reasoning tokens).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub max_completion_tokens: Option<u64>,
    /// `true` asks for an SSE stream of [`ChatChunk`]s.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub stream: Option<bool>,
    /// Stream options; `include_usage` adds a final usage-only chunk.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub stream_options: Option<StreamOptions>,
    /// Sampling temperature, 0..=2.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub temperature: Option<f64>,
    /// Nucleus sampling mass, 0..=1.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub top_p: Option<f64>,
    /// Number of choices; anything but 1 cannot be translated to Anthropic.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub n: Option<u32>,
    /// Stop sequence(s).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub stop: Option<Stop>,
    /// Tool (function) definitions.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub tools: Option<Vec<Tool>>,
    /// `"auto"`, `"none"`, `"required"` or `{"type":"function","function":{"name":..}}`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub tool_choice: Option<Value>,
    /// `false` forbids several tool calls in one turn.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub parallel_tool_calls: Option<bool>,
    /// End-user identifier.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub user: Option<String>,
    /// Everything else the client sent.
    #[serde(flatten)]
    pub extra: Extra,
}

impl ChatRequest {
    /// Output-token cap the client asked for: `max_completion_tokens`, else `max_tokens`.
    pub fn output_cap(&self) -> Option<u64> {
        self.max_completion_tokens.or(self.max_tokens)
    }

    /// Whether the client asked for a stream.
    pub fn is_stream(&self) -> bool {
        self.stream == Some(true)
    }

    /// For a streaming request, forces `stream_options.include_usage = true` so the upstream
    /// always reports usage (field case 15: some OpenAI-compatible servers send no usage
    /// otherwise, and a stream must never be recorded with zero usage).
    ///
    /// Returns whether the *client* had asked for the usage chunk itself; when it had not,
    /// the dispatcher must not forward the usage-only chunk (see
    /// [`crate::wire::translate::StreamTranslator::openai_passthrough`]). For a non-streaming
    /// request nothing changes and the result is `false`.
    pub fn force_include_usage(&mut self) -> bool {
        if !self.is_stream() {
            return false;
        }
        let options = self
            .stream_options
            .get_or_insert_with(StreamOptions::default);
        let client_asked = options.include_usage == Some(true);
        options.include_usage = Some(true);
        client_asked
    }
}

/// `stream_options` of a chat request.
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
pub struct StreamOptions {
    /// Ask for a final chunk carrying usage and an empty `choices` array.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub include_usage: Option<bool>,
    /// Other stream options (e.g. `include_obfuscation`).
    #[serde(flatten)]
    pub extra: Extra,
}

/// `stop`: one string or a list.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[serde(untagged)]
pub enum Stop {
    /// A single stop sequence.
    One(String),
    /// Up to four stop sequences.
    Many(Vec<String>),
}

impl Stop {
    /// The sequences as a list.
    pub fn into_vec(self) -> Vec<String> {
        match self {
            Stop::One(s) => vec![s],
            Stop::Many(v) => v,
        }
    }
}

/// Author of a chat message.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum Role {
    /// Instructions (older name).
    System,
    /// Instructions (newer name for reasoning models).
    Developer,
    /// End user.
    User,
    /// Model output.
    Assistant,
    /// Result of a tool call.
    Tool,
    /// Legacy function result.
    Function,
}

/// One message of a chat request, or the message of a non-streaming response choice.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct ChatMessage {
    /// Author.
    pub role: Role,
    /// Text or content parts; absent (or null) for an assistant turn that only calls tools.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub content: Option<MessageContent>,
    /// Optional participant name.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub name: Option<String>,
    /// Tool calls made by an assistant turn.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub tool_calls: Option<Vec<ToolCall>>,
    /// For `role: tool`, the id of the call this message answers.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub tool_call_id: Option<String>,
    /// Other members (`refusal`, `audio`, `reasoning_content`, ...).
    #[serde(flatten)]
    pub extra: Extra,
}

impl ChatMessage {
    /// A message with only text content.
    pub fn text(role: Role, text: impl Into<String>) -> Self {
        ChatMessage {
            role,
            content: Some(MessageContent::Text(text.into())),
            name: None,
            tool_calls: None,
            tool_call_id: None,
            extra: Extra::new(),
        }
    }
}

/// Message content: a plain string or a list of parts.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[serde(untagged)]
pub enum MessageContent {
    /// Plain text.
    Text(String),
    /// Typed parts (text, images, audio, files).
    Parts(Vec<ContentPart>),
}

impl MessageContent {
    /// Concatenation of the text (string content, or all `text` parts, in order).
    pub fn joined_text(&self) -> String {
        match self {
            MessageContent::Text(s) => s.clone(),
            MessageContent::Parts(parts) => parts
                .iter()
                .filter_map(|p| match p {
                    ContentPart::Known(KnownPart::Text { text, .. }) => Some(text.as_str()),
                    _ => None,
                })
                .collect::<Vec<_>>()
                .join(""),
        }
    }
}

/// One content part; parts of unknown `type` are kept as raw JSON.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[serde(untagged)]
pub enum ContentPart {
    /// A part type this router interprets.
    Known(KnownPart),
    /// Any other part (`input_audio`, `file`, ...), passed through unchanged.
    Other(Value),
}

/// Content part types the router interprets.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[serde(tag = "type", rename_all = "snake_case")]
pub enum KnownPart {
    /// `{"type":"text","text":..}`
    Text {
        /// The text.
        text: String,
        /// Other members.
        #[serde(flatten)]
        extra: Extra,
    },
    /// `{"type":"image_url","image_url":{"url":..,"detail":..}}`; `url` may be a `data:` URL.
    ImageUrl {
        /// The image reference.
        image_url: ImageUrl,
        /// Other members.
        #[serde(flatten)]
        extra: Extra,
    },
}

/// Image reference of an `image_url` part.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct ImageUrl {
    /// `https://...` or `data:<media type>;base64,<data>`.
    pub url: String,
    /// Other members (`detail`).
    #[serde(flatten)]
    pub extra: Extra,
}

/// A tool definition.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct Tool {
    /// `"function"` for function tools; other kinds (`custom`) have no `function` member.
    #[serde(rename = "type")]
    pub kind: String,
    /// The function signature, for `type: function`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub function: Option<FunctionDef>,
    /// Other members.
    #[serde(flatten)]
    pub extra: Extra,
}

/// Signature of a function tool.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct FunctionDef {
    /// Function name.
    pub name: String,
    /// What the function does.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub description: Option<String>,
    /// JSON Schema of the arguments object.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub parameters: Option<Value>,
    /// Other members (`strict`).
    #[serde(flatten)]
    pub extra: Extra,
}

/// A complete tool call in an assistant message.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct ToolCall {
    /// Call id, echoed by the `tool` message that answers it.
    pub id: String,
    /// `"function"`.
    #[serde(rename = "type")]
    pub kind: String,
    /// Function name and arguments.
    pub function: FunctionCall,
}

/// Function name and JSON-encoded arguments of a tool call.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct FunctionCall {
    /// Function name.
    pub name: String,
    /// Arguments as a JSON *string* (not an object), as the API sends them.
    pub arguments: String,
}

/// Token usage of a chat completion (also of the usage-only stream chunk).
///
/// `prompt_tokens` *includes* `prompt_tokens_details.cached_tokens`; see
/// [`crate::wire::usage::NormalizedUsage::from_openai`].
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
pub struct Usage {
    /// All input tokens, cached ones included.
    #[serde(default)]
    pub prompt_tokens: u64,
    /// Output tokens (reasoning included).
    #[serde(default)]
    pub completion_tokens: u64,
    /// Sum of both.
    #[serde(default)]
    pub total_tokens: u64,
    /// Breakdown of the input.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub prompt_tokens_details: Option<PromptTokensDetails>,
    /// Other members (`completion_tokens_details`, vendor fields).
    #[serde(flatten)]
    pub extra: Extra,
}

/// `usage.prompt_tokens_details`.
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
pub struct PromptTokensDetails {
    /// Input tokens served from the prompt cache (a subset of `prompt_tokens`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub cached_tokens: Option<u64>,
    /// Other members (`audio_tokens`).
    #[serde(flatten)]
    pub extra: Extra,
}

/// Non-streaming `chat.completion` response.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct ChatResponse {
    /// Completion id (`chatcmpl-...`). Header members default when absent (lenient towards
    /// OpenAI-compatible servers).
    #[serde(default)]
    pub id: String,
    /// `"chat.completion"`.
    #[serde(default)]
    pub object: String,
    /// Unix seconds.
    #[serde(default)]
    pub created: u64,
    /// Model that answered.
    #[serde(default)]
    pub model: String,
    /// Choices (one unless `n` > 1).
    pub choices: Vec<Choice>,
    /// Token usage.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub usage: Option<Usage>,
    /// Other members (`system_fingerprint`, `service_tier`).
    #[serde(flatten)]
    pub extra: Extra,
}

/// One choice of a non-streaming response.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct Choice {
    /// Choice index (0 when a server omits it).
    #[serde(default)]
    pub index: u32,
    /// The assistant message.
    pub message: ChatMessage,
    /// `stop`, `length`, `tool_calls`, `content_filter`, ...
    #[serde(default)]
    pub finish_reason: Option<String>,
    /// Other members (`logprobs`).
    #[serde(flatten)]
    pub extra: Extra,
}

/// One `chat.completion.chunk` of a stream (the `data:` payload of one SSE event).
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct ChatChunk {
    /// Completion id, the same on every chunk. (Defaulted when absent, like the next three
    /// members: OpenAI-compatible servers are not all strict, and Azure opens streams with a
    /// `prompt_filter_results` chunk whose header fields are empty.)
    #[serde(default)]
    pub id: String,
    /// `"chat.completion.chunk"`.
    #[serde(default)]
    pub object: String,
    /// Unix seconds.
    #[serde(default)]
    pub created: u64,
    /// Model that answers.
    #[serde(default)]
    pub model: String,
    /// Choice deltas; empty on the usage-only chunk.
    #[serde(default)]
    pub choices: Vec<ChunkChoice>,
    /// Usage: `null`/absent except on the final usage-only chunk.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub usage: Option<Usage>,
    /// Other members.
    #[serde(flatten)]
    pub extra: Extra,
}

impl ChatChunk {
    /// The final chunk requested by `stream_options.include_usage`: no choices, usage set.
    pub fn is_usage_only(&self) -> bool {
        self.choices.is_empty() && self.usage.is_some()
    }
}

/// The members of one `chat.completion.chunk` that a pass-through stream needs (finish
/// reasons, delivered text for the output estimate, usage, an in-band error), read without
/// building the whole chunk: strings borrow from the event data where they hold no escapes and
/// every other member is skipped. The relay forwards the original event, so nothing else is
/// needed; a [`ChatChunk`] costs a `serde_json::Value` tree per event on a hot path.
#[derive(Debug, Default, Deserialize)]
pub(crate) struct ChunkScan<'a> {
    /// Choice deltas; empty on the usage-only chunk.
    #[serde(default, borrow)]
    pub choices: Vec<ChoiceScan<'a>>,
    /// Usage, on the final usage-only chunk.
    #[serde(default)]
    pub usage: Option<Usage>,
    /// A non-null `error` member: the server reported an error in-band.
    #[serde(default)]
    pub error: Option<serde::de::IgnoredAny>,
}

/// One choice of a [`ChunkScan`].
#[derive(Debug, Default, Deserialize)]
pub(crate) struct ChoiceScan<'a> {
    /// What this chunk adds.
    #[serde(default, borrow)]
    pub delta: DeltaScan<'a>,
    /// Set on the last chunk of the choice.
    #[serde(default, borrow)]
    pub finish_reason: Option<std::borrow::Cow<'a, str>>,
}

/// The delivered text of one choice delta of a [`ChunkScan`].
#[derive(Debug, Default, Deserialize)]
pub(crate) struct DeltaScan<'a> {
    /// Next piece of text.
    #[serde(default, borrow)]
    pub content: Option<std::borrow::Cow<'a, str>>,
    /// Next pieces of tool calls: only their argument text.
    #[serde(default, borrow)]
    pub tool_calls: Option<Vec<ToolCallScan<'a>>>,
    /// A non-empty `refusal` string (any other value, `null` or absent: `false`).
    #[serde(default, rename = "refusal", deserialize_with = "non_empty_string")]
    pub has_refusal: bool,
    /// A non-empty `reasoning_content` string, as reasoning models stream their thinking.
    #[serde(
        default,
        rename = "reasoning_content",
        deserialize_with = "non_empty_string"
    )]
    pub has_reasoning: bool,
}

impl DeltaScan<'_> {
    /// Whether the delta delivers anything (text, tool calls, a refusal, reasoning): what
    /// commits a stream ([`crate::wire::classify`]).
    pub(crate) fn has_content(&self) -> bool {
        self.content.as_deref().is_some_and(|c| !c.is_empty())
            || self.tool_calls.as_ref().is_some_and(|t| !t.is_empty())
            || self.has_refusal
            || self.has_reasoning
    }
}

/// Reads any JSON value: `true` for a non-empty string, `false` for anything else (skipped
/// without building it).
fn non_empty_string<'de, D: serde::Deserializer<'de>>(d: D) -> Result<bool, D::Error> {
    struct NonEmpty;
    impl<'de> serde::de::Visitor<'de> for NonEmpty {
        type Value = bool;
        fn expecting(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
            f.write_str("any JSON value")
        }
        fn visit_str<E: serde::de::Error>(self, v: &str) -> Result<bool, E> {
            Ok(!v.is_empty())
        }
        fn visit_bool<E: serde::de::Error>(self, _: bool) -> Result<bool, E> {
            Ok(false)
        }
        fn visit_i64<E: serde::de::Error>(self, _: i64) -> Result<bool, E> {
            Ok(false)
        }
        fn visit_u64<E: serde::de::Error>(self, _: u64) -> Result<bool, E> {
            Ok(false)
        }
        fn visit_f64<E: serde::de::Error>(self, _: f64) -> Result<bool, E> {
            Ok(false)
        }
        fn visit_unit<E: serde::de::Error>(self) -> Result<bool, E> {
            Ok(false)
        }
        fn visit_none<E: serde::de::Error>(self) -> Result<bool, E> {
            Ok(false)
        }
        fn visit_seq<A: serde::de::SeqAccess<'de>>(self, mut seq: A) -> Result<bool, A::Error> {
            while seq.next_element::<serde::de::IgnoredAny>()?.is_some() {}
            Ok(false)
        }
        fn visit_map<A: serde::de::MapAccess<'de>>(self, mut map: A) -> Result<bool, A::Error> {
            while map
                .next_entry::<serde::de::IgnoredAny, serde::de::IgnoredAny>()?
                .is_some()
            {}
            Ok(false)
        }
    }
    d.deserialize_any(NonEmpty)
}

/// The argument text of one tool-call delta of a [`ChunkScan`].
#[derive(Debug, Default, Deserialize)]
pub(crate) struct ToolCallScan<'a> {
    /// `{"arguments": ...}`; the name and id are not needed.
    #[serde(default, borrow)]
    pub function: Option<FunctionScan<'a>>,
}

/// The argument text of one tool-call function delta.
#[derive(Debug, Default, Deserialize)]
pub(crate) struct FunctionScan<'a> {
    /// Next piece of the JSON arguments.
    #[serde(default, borrow)]
    pub arguments: Option<std::borrow::Cow<'a, str>>,
}

impl ChunkScan<'_> {
    /// The final chunk requested by `stream_options.include_usage`: no choices, usage set.
    pub(crate) fn is_usage_only(&self) -> bool {
        self.choices.is_empty() && self.usage.is_some()
    }
}

/// One choice delta of a stream chunk.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct ChunkChoice {
    /// Choice index (0 when a server omits it).
    #[serde(default)]
    pub index: u32,
    /// What this chunk adds.
    #[serde(default)]
    pub delta: Delta,
    /// Set on the last chunk of the choice.
    #[serde(default)]
    pub finish_reason: Option<String>,
    /// Other members (`logprobs`).
    #[serde(flatten)]
    pub extra: Extra,
}

/// Incremental message content in a stream chunk.
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
pub struct Delta {
    /// `"assistant"` on the first chunk only.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub role: Option<Role>,
    /// Next piece of text.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub content: Option<String>,
    /// Next pieces of tool calls.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub tool_calls: Option<Vec<ToolCallDelta>>,
    /// Other members (`refusal`, `reasoning_content`).
    #[serde(flatten)]
    pub extra: Extra,
}

/// Incremental tool call: the first delta of a call carries `id`, `type` and `function.name`;
/// later ones append to `function.arguments`. `index` ties the pieces together.
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
pub struct ToolCallDelta {
    /// Position of the call in the message's `tool_calls` (0 when a server omits it, as
    /// some single-call implementations do).
    #[serde(default)]
    pub index: u32,
    /// Call id (first delta only).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub id: Option<String>,
    /// `"function"` (first delta only).
    #[serde(rename = "type", default, skip_serializing_if = "Option::is_none")]
    pub kind: Option<String>,
    /// Name (first delta) and argument fragment.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub function: Option<FunctionCallDelta>,
}

/// Name and argument fragment of a [`ToolCallDelta`].
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
pub struct FunctionCallDelta {
    /// Function name (first delta only).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub name: Option<String>,
    /// Next fragment of the JSON arguments string.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub arguments: Option<String>,
}

/// `POST /v1/embeddings` request body.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct EmbeddingsRequest {
    /// Public model name.
    pub model: String,
    /// A string, a list of strings, a token list or a list of token lists.
    pub input: Value,
    /// `float` (default) or `base64`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub encoding_format: Option<String>,
    /// Output dimensions for models that support shortening.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub dimensions: Option<u32>,
    /// End-user identifier.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub user: Option<String>,
    /// Everything else the client sent.
    #[serde(flatten)]
    pub extra: Extra,
}

/// `POST /v1/embeddings` response body.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct EmbeddingsResponse {
    /// `"list"`.
    pub object: String,
    /// One embedding per input.
    pub data: Vec<Embedding>,
    /// Model that answered.
    pub model: String,
    /// Token usage (input only).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub usage: Option<EmbeddingsUsage>,
    /// Other members.
    #[serde(flatten)]
    pub extra: Extra,
}

/// One embedding vector.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct Embedding {
    /// `"embedding"`.
    pub object: String,
    /// Position of the input it embeds.
    pub index: u32,
    /// A float array, or a base64 string when `encoding_format: base64`.
    pub embedding: Value,
}

/// Usage of an embeddings call.
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
pub struct EmbeddingsUsage {
    /// Input tokens.
    #[serde(default)]
    pub prompt_tokens: u64,
    /// Same as `prompt_tokens`.
    #[serde(default)]
    pub total_tokens: u64,
}

/// OpenAI error body: `{"error":{"message","type","param","code"}}`.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct ErrorBody {
    /// The error.
    pub error: ErrorDetail,
}

/// Inner object of [`ErrorBody`]. `param` and `code` are always serialised (as `null` when
/// unset) because the official SDKs read them as present-but-nullable.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct ErrorDetail {
    /// Human-readable message.
    pub message: String,
    /// Error type, e.g. `invalid_request_error`.
    #[serde(rename = "type", default)]
    pub kind: Option<String>,
    /// Offending parameter.
    #[serde(default)]
    pub param: Option<String>,
    /// Machine-readable code, e.g. `rate_limit_exceeded`, `insufficient_quota`. Some servers
    /// send a number here, hence `Value`.
    #[serde(default)]
    pub code: Option<Value>,
}

impl ErrorBody {
    /// Error body for an HTTP status with the conventional `type` for that status
    /// ([`error_type_for_status`]) and an optional machine-readable `code`.
    pub fn for_status(status: u16, message: impl Into<String>, code: Option<&str>) -> Self {
        ErrorBody {
            error: ErrorDetail {
                message: message.into(),
                kind: Some(error_type_for_status(status).to_owned()),
                param: None,
                code: code.map(|c| Value::String(c.to_owned())),
            },
        }
    }
}

/// Conventional OpenAI error `type` for an HTTP status. The SDKs pick the exception class
/// from the status; the type is informational, so the names follow the API's own usage.
pub fn error_type_for_status(status: u16) -> &'static str {
    match status {
        401 => "authentication_error",
        403 => "permission_error",
        404 => "not_found_error",
        429 => "rate_limit_error",
        400..=499 => "invalid_request_error",
        503 | 529 => "overloaded_error",
        _ => "server_error",
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    #[test]
    fn force_include_usage_client_did_not_ask_sets_flag_and_reports_false() {
        let mut req: ChatRequest = serde_json::from_value(json!({
            "model": "m", "messages": [], "stream": true
        }))
        .unwrap();
        assert!(!req.force_include_usage());
        assert_eq!(
            serde_json::to_value(&req).unwrap()["stream_options"],
            json!({"include_usage": true})
        );
    }

    #[test]
    fn force_include_usage_client_asked_reports_true() {
        let mut req: ChatRequest = serde_json::from_value(json!({
            "model": "m", "messages": [], "stream": true,
            "stream_options": {"include_usage": true, "include_obfuscation": false}
        }))
        .unwrap();
        assert!(req.force_include_usage());
        assert_eq!(
            serde_json::to_value(&req).unwrap()["stream_options"],
            json!({"include_usage": true, "include_obfuscation": false})
        );
    }

    #[test]
    fn force_include_usage_non_stream_leaves_request_unchanged() {
        let mut req: ChatRequest =
            serde_json::from_value(json!({"model": "m", "messages": []})).unwrap();
        assert!(!req.force_include_usage());
        assert!(req.stream_options.is_none());
    }

    #[test]
    fn error_body_for_429_has_rate_limit_type_and_null_param() {
        let body = ErrorBody::for_status(429, "slow down", Some("rate_limit_exceeded"));
        assert_eq!(
            serde_json::to_value(&body).unwrap(),
            json!({"error": {"message": "slow down", "type": "rate_limit_error",
                "param": null, "code": "rate_limit_exceeded"}})
        );
    }
}
