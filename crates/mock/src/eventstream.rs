//! AWS event-stream framing (`application/vnd.amazon.eventstream`) for Bedrock's
//! ConverseStream and InvokeModelWithResponseStream, encoded with `aws-smithy-eventstream`.
//!
//! A frame is `total_len u32 | headers_len u32 | prelude CRC32 | headers | payload | CRC32`
//! (big-endian). Every frame the mock sends carries the three string headers Bedrock sends:
//! - an event: `:message-type: event`, `:event-type: <member>` (`messageStart`,
//!   `contentBlockDelta`, ..., or `chunk`), `:content-type: application/json`;
//! - an exception inside a 200 stream: `:message-type: exception`, `:exception-type: <member>`
//!   (`throttlingException`, `modelStreamErrorException`, ...), `:content-type:
//!   application/json`, payload `{"message": ...}`. botocore raises it as an
//!   `EventStreamError` whose code is the `:exception-type`.
//!
//! Source: AWS "Event stream encoding" (the vnd.amazon.eventstream spec) and the Bedrock
//! runtime API reference (ConverseStream / InvokeModelWithResponseStream response unions).

use aws_smithy_types::event_stream::{Header, HeaderValue, Message};
use bytes::Bytes;
use serde_json::Value;

/// Content type of a Bedrock streaming response.
pub(crate) const CONTENT_TYPE: &str = "application/vnd.amazon.eventstream";

fn header(name: &'static str, value: String) -> Header {
    Header::new(name, HeaderValue::String(value.into()))
}

fn encode(message: &Message) -> Bytes {
    let mut buf = Vec::with_capacity(message.payload().len() + 128);
    match aws_smithy_eventstream::frame::write_message_to(message, &mut buf) {
        Ok(()) => Bytes::from(buf),
        Err(e) => {
            // Only oversized headers/payloads fail; the mock's frames are small.
            tracing::error!(error = %e, "event-stream frame encoding failed");
            Bytes::new()
        }
    }
}

/// One `:message-type: event` frame with a JSON payload.
pub(crate) fn event_frame(event_type: &str, payload: &Value) -> Bytes {
    let message = Message::new(Bytes::from(payload.to_string()))
        .add_header(header(":event-type", event_type.to_owned()))
        .add_header(header(":content-type", "application/json".to_owned()))
        .add_header(header(":message-type", "event".to_owned()));
    encode(&message)
}

/// One `:message-type: exception` frame (an error inside a 200 stream).
pub(crate) fn exception_frame(exception_type: &str, payload: &Value) -> Bytes {
    let message = Message::new(Bytes::from(payload.to_string()))
        .add_header(header(":exception-type", exception_type.to_owned()))
        .add_header(header(":content-type", "application/json".to_owned()))
        .add_header(header(":message-type", "exception".to_owned()));
    encode(&message)
}

/// InvokeModelWithResponseStream `chunk` event: `{"bytes": base64(<Anthropic event JSON>)}`.
pub(crate) fn chunk_frame(inner: &Value) -> Bytes {
    use base64::Engine as _;
    let b64 = base64::engine::general_purpose::STANDARD.encode(inner.to_string());
    event_frame("chunk", &serde_json::json!({ "bytes": b64 }))
}

/// A frame cut in half: what a reset mid-frame leaves on the wire.
pub(crate) fn torn_frame(frame: &Bytes) -> Bytes {
    frame.slice(..frame.len() / 2)
}

#[cfg(test)]
mod tests {
    use super::*;
    use aws_smithy_eventstream::frame::{DecodedFrame, MessageFrameDecoder, read_message_from};
    use serde_json::json;

    fn string_header(m: &Message, name: &str) -> Option<String> {
        m.headers()
            .iter()
            .find(|h| h.name().as_str() == name)
            .and_then(|h| h.value().as_string().ok())
            .map(|s| s.as_str().to_owned())
    }

    #[test]
    fn event_frame_round_trips_headers_and_payload() {
        let payload = json!({"delta": {"text": "token0"}, "contentBlockIndex": 0});
        let frame = event_frame("contentBlockDelta", &payload);
        let m = read_message_from(frame.clone()).unwrap();
        assert_eq!(
            string_header(&m, ":event-type").as_deref(),
            Some("contentBlockDelta")
        );
        assert_eq!(string_header(&m, ":message-type").as_deref(), Some("event"));
        assert_eq!(
            string_header(&m, ":content-type").as_deref(),
            Some("application/json")
        );
        let back: Value = serde_json::from_slice(m.payload()).unwrap();
        assert_eq!(back, payload);
        // The prelude's total length is the frame's length.
        let total = u32::from_be_bytes([frame[0], frame[1], frame[2], frame[3]]);
        assert_eq!(total as usize, frame.len());
    }

    #[test]
    fn exception_and_chunk_frames_decode_in_one_buffer() {
        use base64::Engine as _;
        let inner = json!({"type": "message_stop"});
        let mut wire = Vec::new();
        wire.extend_from_slice(&chunk_frame(&inner));
        wire.extend_from_slice(&exception_frame(
            "throttlingException",
            &json!({"message": "Too many requests"}),
        ));
        let mut decoder = MessageFrameDecoder::new();
        let mut buf = Bytes::from(wire);
        let mut got = Vec::new();
        while let Ok(DecodedFrame::Complete(m)) = decoder.decode_frame(&mut buf) {
            got.push(m);
        }
        assert_eq!(got.len(), 2);
        assert_eq!(
            string_header(&got[0], ":event-type").as_deref(),
            Some("chunk")
        );
        let p: Value = serde_json::from_slice(got[0].payload()).unwrap();
        let decoded = base64::engine::general_purpose::STANDARD
            .decode(p["bytes"].as_str().unwrap())
            .unwrap();
        assert_eq!(serde_json::from_slice::<Value>(&decoded).unwrap(), inner);
        assert_eq!(
            string_header(&got[1], ":message-type").as_deref(),
            Some("exception")
        );
        assert_eq!(
            string_header(&got[1], ":exception-type").as_deref(),
            Some("throttlingException")
        );
    }

    #[test]
    fn torn_frame_fails_its_checksum() {
        let frame = event_frame("messageStop", &json!({"stopReason": "end_turn"}));
        assert!(read_message_from(torn_frame(&frame)).is_err());
    }
}
