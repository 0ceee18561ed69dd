//! Provider wire formats: serde shapes of the OpenAI and Anthropic APIs, SSE framing,
//! translation between the two dialects, usage normalisation and stream classification.
//!
//! Everything here is pure (no I/O, no clock): bytes and JSON in, bytes and JSON out, so the
//! dispatcher can be tested against recorded streams.

pub mod anthropic;
pub mod classify;
pub mod openai;
pub mod sse;
pub mod transcription;
pub mod translate;
pub mod usage;

use bytes::Bytes;
use serde::{Deserialize, Serialize};

/// An API dialect spoken by a client or a provider.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum Dialect {
    /// OpenAI chat completions (and OpenAI-compatible servers).
    OpenAi,
    /// Anthropic Messages.
    Anthropic,
}

/// JSON error body in `dialect`'s shape for an HTTP `status` (one mapping for every error the
/// router returns; STYLE pattern 9). `code` is the machine-readable reason: OpenAI puts it in
/// `error.code`; Anthropic's shape has no such member, so it is prefixed to the message.
pub fn error_body(dialect: Dialect, status: u16, message: &str, code: Option<&str>) -> Bytes {
    let value = match dialect {
        Dialect::OpenAi => {
            serde_json::to_vec(&openai::ErrorBody::for_status(status, message, code))
        }
        Dialect::Anthropic => {
            let message = match code {
                Some(code) => format!("{code}: {message}"),
                None => message.to_owned(),
            };
            serde_json::to_vec(&anthropic::ErrorBody::for_status(status, message))
        }
    };
    // Serialising these plain structs cannot fail; an empty body is the harmless fallback.
    Bytes::from(value.unwrap_or_default())
}

/// In-stream error event in `dialect`'s framing, for a stream that already sent content and
/// must end with an error (DESIGN §3.9, field case 19b): Anthropic `event: error` with the
/// error body; OpenAI an unnamed event whose data is `{"error":{..}}`. Neither is followed by a
/// success terminator (`message_stop` / `[DONE]`).
pub fn error_event(
    dialect: Dialect,
    status: u16,
    message: &str,
    code: Option<&str>,
) -> sse::SseEvent {
    let body = error_body(dialect, status, message, code);
    let data = String::from_utf8_lossy(&body).into_owned();
    match dialect {
        Dialect::OpenAi => sse::SseEvent::data(data),
        Dialect::Anthropic => sse::SseEvent::new(Some("error"), data),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::{Value, json};

    #[test]
    fn error_body_openai_shape_has_code() {
        let body = error_body(Dialect::OpenAi, 503, "no provider", Some("all_overloaded"));
        let v: Value = serde_json::from_slice(&body).unwrap();
        assert_eq!(
            v,
            json!({"error": {"message": "no provider", "type": "overloaded_error",
                "param": null, "code": "all_overloaded"}})
        );
    }

    #[test]
    fn error_event_anthropic_is_named_error() {
        let ev = error_event(Dialect::Anthropic, 529, "Overloaded", None);
        assert_eq!(ev.event.as_deref(), Some("error"));
        let v: Value = serde_json::from_str(&ev.data).unwrap();
        assert_eq!(v["error"]["type"], "overloaded_error");
        assert_eq!(v["type"], "error");
    }
}
