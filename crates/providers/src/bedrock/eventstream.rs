//! The AWS event-stream framing of `ConverseStream` and `InvokeModelWithResponseStream`
//! bodies (`application/vnd.amazon.eventstream`): binary frames with a prelude, typed headers
//! (`:message-type`, `:event-type`, `:exception-type`, `:content-type`) and a JSON payload,
//! each checked by CRC. Frames are decoded with `aws-smithy-eventstream`, the AWS SDK's own
//! decoder.
//!
//! [`EventFrames`] yields one [`Frame`] per message: an event (its type and JSON payload) or
//! an exception (its type and payload), which a 200 stream carries instead of an HTTP error
//! when the model fails mid-stream (throttling, `modelStreamErrorException`, validation).

use aws_smithy_eventstream::frame::{DecodedFrame, MessageFrameDecoder};
use aws_smithy_eventstream::smithy::parse_response_headers;
use bytes::{Bytes, BytesMut};

/// The content type of an event-stream body.
pub const CONTENT_TYPE: &str = "application/vnd.amazon.eventstream";

/// One decoded message.
#[derive(Debug, Clone, PartialEq)]
pub enum Frame {
    /// `:message-type event`: the event type (`chunk`, `messageStart`, `contentBlockDelta`…)
    /// and its JSON payload.
    Event {
        /// `:event-type`.
        kind: String,
        /// The payload bytes (JSON).
        payload: Bytes,
    },
    /// `:message-type exception` (or `error`): the exception type and its payload.
    Exception {
        /// `:exception-type` (`throttlingException`, `modelStreamErrorException`…).
        kind: String,
        /// The payload bytes (JSON with a `message`).
        payload: Bytes,
    },
    /// A frame that does not decode (bad CRC, bad length, unknown message type): the stream
    /// cannot be trusted past it.
    Invalid(String),
}

/// Incremental decoder: feed body chunks, get whole frames.
#[derive(Debug, Default)]
pub struct EventFrames {
    decoder: MessageFrameDecoder,
    buffer: BytesMut,
    broken: bool,
}

impl EventFrames {
    /// An empty decoder.
    pub fn new() -> Self {
        EventFrames::default()
    }

    /// Feeds `chunk`; returns every frame it completes. After an [`Frame::Invalid`] nothing
    /// more is decoded.
    pub fn push(&mut self, chunk: &[u8]) -> Vec<Frame> {
        let mut out = Vec::new();
        if self.broken {
            return out;
        }
        self.buffer.extend_from_slice(chunk);
        loop {
            match self.decoder.decode_frame(&mut self.buffer) {
                Ok(DecodedFrame::Incomplete) => break,
                Ok(DecodedFrame::Complete(message)) => {
                    let frame = match parse_response_headers(&message) {
                        Ok(h) => {
                            let kind = h.smithy_type.as_str().to_owned();
                            let payload = message.payload().clone();
                            match h.message_type.as_str() {
                                "event" => Frame::Event { kind, payload },
                                _ => Frame::Exception { kind, payload },
                            }
                        }
                        Err(e) => Frame::Invalid(e.to_string()),
                    };
                    let stop = matches!(frame, Frame::Invalid(_));
                    out.push(frame);
                    if stop {
                        self.broken = true;
                        break;
                    }
                }
                Err(e) => {
                    out.push(Frame::Invalid(e.to_string()));
                    self.broken = true;
                    break;
                }
            }
        }
        out
    }

    /// Whether bytes of an unfinished frame are left (the body was cut mid-frame).
    pub fn has_partial(&self) -> bool {
        !self.broken && !self.buffer.is_empty()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use aws_smithy_eventstream::frame::write_message_to;
    use aws_smithy_types::event_stream::{Header, HeaderValue, Message};

    fn frame(message_type: &str, kind: &str, payload: &str) -> Vec<u8> {
        let type_header = if message_type == "event" {
            ":event-type"
        } else {
            ":exception-type"
        };
        let m = Message::new(Bytes::from(payload.to_owned()))
            .add_header(Header::new(
                ":message-type",
                HeaderValue::String(message_type.to_owned().into()),
            ))
            .add_header(Header::new(
                type_header,
                HeaderValue::String(kind.to_owned().into()),
            ))
            .add_header(Header::new(
                ":content-type",
                HeaderValue::String("application/json".into()),
            ));
        let mut out = Vec::new();
        write_message_to(&m, &mut out).unwrap();
        out
    }

    #[test]
    fn frames_split_at_every_byte_decode_whole() {
        let mut body = frame("event", "messageStart", r#"{"role":"assistant"}"#);
        body.extend(frame(
            "exception",
            "throttlingException",
            r#"{"message":"slow"}"#,
        ));
        let mut d = EventFrames::new();
        let mut frames = Vec::new();
        for b in &body {
            frames.extend(d.push(std::slice::from_ref(b)));
        }
        assert_eq!(
            frames,
            vec![
                Frame::Event {
                    kind: "messageStart".into(),
                    payload: Bytes::from_static(br#"{"role":"assistant"}"#)
                },
                Frame::Exception {
                    kind: "throttlingException".into(),
                    payload: Bytes::from_static(br#"{"message":"slow"}"#)
                },
            ]
        );
        assert!(!d.has_partial());
    }

    #[test]
    fn corrupt_crc_is_invalid_and_stops() {
        let mut body = frame("event", "chunk", r#"{"bytes":"e30="}"#);
        let last = body.len() - 1;
        body[last] ^= 0xff;
        let mut d = EventFrames::new();
        let frames = d.push(&body);
        assert!(matches!(frames.as_slice(), [Frame::Invalid(_)]));
        assert!(d.push(&frame("event", "chunk", "{}")).is_empty());
    }

    #[test]
    fn cut_mid_frame_leaves_partial() {
        let body = frame("event", "chunk", r#"{"bytes":"e30="}"#);
        let mut d = EventFrames::new();
        assert!(d.push(&body[..body.len() - 3]).is_empty());
        assert!(d.has_partial());
    }
}
