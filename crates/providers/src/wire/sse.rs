//! Server-sent events: an incremental parser (bytes in, events out) and a writer.
//!
//! Algorithm (WHATWG HTML "server-sent events", event stream interpretation): the byte stream
//! is split into lines ending in CRLF, LF or a lone CR; a line starting with `:` is a comment;
//! otherwise `field: value` (one leading space of the value is dropped; a line with no colon
//! is a field with an empty value). `data` lines append to the data buffer joined by `\n`,
//! `event` sets the name, `id` the last event id, `retry` the reconnection time. A blank line
//! dispatches the event if any `data` line was seen. Bytes are buffered until a line ends, so
//! lines (and multi-byte UTF-8 characters) split across network chunks are reassembled; a CR
//! at the very end of a chunk is remembered so that a CRLF split across chunks counts once.
//!
//! Departures from the browser algorithm, each needed by the dispatcher:
//! - comments are reported ([`SseItem::Comment`]) instead of being swallowed, so keep-alives
//!   can be forwarded and classified as non-content (field case 21b);
//! - at end of input an event that was started but never terminated by a blank line is
//!   reported as [`SseItem::Incomplete`] instead of being silently dropped, so the caller can
//!   drop it *knowingly* and end the client stream with an error (field case 19b).
//!
//! Alternatives rejected: `eventsource-stream` and `sse-stream` are well kept but both discard
//! comments and drop the unterminated tail without telling, the two things above; the parser
//! is small enough that owning it costs less than working around either.

use bytes::{BufMut, Bytes, BytesMut};
use futures::{Stream, StreamExt};

/// One dispatched event.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct SseEvent {
    /// `event:` name; `None` means the default type `message` (OpenAI sends none).
    pub event: Option<String>,
    /// The `data:` lines joined by `\n`.
    pub data: String,
    /// `id:` field, if present in this event.
    pub id: Option<String>,
    /// `retry:` field in milliseconds, if present and numeric.
    pub retry: Option<u64>,
}

impl SseEvent {
    /// An event with data and an optional name.
    pub fn new(event: Option<&str>, data: impl Into<String>) -> Self {
        SseEvent {
            event: event.map(str::to_owned),
            data: data.into(),
            id: None,
            retry: None,
        }
    }

    /// An unnamed event (the OpenAI framing).
    pub fn data(data: impl Into<String>) -> Self {
        SseEvent::new(None, data)
    }

    /// The event's wire encoding; see [`encode_event`].
    pub fn to_bytes(&self) -> Bytes {
        let mut out = BytesMut::with_capacity(self.data.len() + 32);
        write_event(&mut out, self);
        out.freeze()
    }
}

/// What the parser yields.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum SseItem {
    /// A complete event (terminated by a blank line).
    Event(SseEvent),
    /// A comment line, without the leading `:` (e.g. ` keep-alive`).
    Comment(String),
    /// At end of input only: fields of an event that was never terminated. Its data may be a
    /// cut-off JSON document; callers should drop it and treat the stream as truncated.
    Incomplete(SseEvent),
}

/// Incremental SSE parser. Feed bytes with [`SseParser::push`]; call [`SseParser::finish`] at
/// end of input.
#[derive(Debug, Default)]
pub struct SseParser {
    /// Bytes of the current, not yet terminated line.
    line: Vec<u8>,
    /// The previous chunk ended in CR: a leading LF of the next chunk belongs to that CRLF.
    after_cr: bool,
    /// Whether the byte-order mark check at stream start is done.
    started: bool,
    /// Fields of the event being built.
    pending: SseEvent,
    /// Whether any `data` line was seen for the pending event.
    has_data: bool,
    /// Whether any field line was seen for the pending event (for the EOF report).
    has_fields: bool,
}

impl SseParser {
    /// A parser at stream start.
    pub fn new() -> Self {
        SseParser::default()
    }

    /// Feeds one network chunk; returns the items it completes, in order.
    pub fn push(&mut self, chunk: &[u8]) -> Vec<SseItem> {
        let mut out = Vec::new();
        let mut bytes = chunk;
        if !self.started && !bytes.is_empty() {
            self.started = true;
            // A UTF-8 BOM may open the stream; it is not part of the first field name.
            if let Some(rest) = bytes.strip_prefix(b"\xEF\xBB\xBF".as_slice()) {
                bytes = rest;
            }
        }
        if self.after_cr {
            // The previous chunk ended in CR; an LF opening this chunk completes that CRLF.
            self.after_cr = false;
            if let Some(rest) = bytes.strip_prefix(b"\n".as_slice()) {
                bytes = rest;
            }
        }
        // Copy whole runs up to the next line ending instead of byte by byte.
        while let Some(pos) = bytes.iter().position(|&b| b == b'\n' || b == b'\r') {
            self.line.extend_from_slice(&bytes[..pos]);
            self.end_line(&mut out);
            let ending = bytes[pos];
            bytes = &bytes[pos + 1..];
            if ending == b'\r' {
                match bytes.first() {
                    Some(b'\n') => bytes = &bytes[1..],
                    Some(_) => {}
                    None => self.after_cr = true,
                }
            }
        }
        self.line.extend_from_slice(bytes);
        out
    }

    /// Ends the input: returns the unterminated trailing event (including a last line that
    /// had no line ending), if any. The parser is reset afterwards.
    pub fn finish(&mut self) -> Option<SseItem> {
        let mut out = Vec::new();
        if !self.line.is_empty() {
            // The last line lacked its line ending; interpret it so the report is complete.
            self.end_line(&mut out);
        }
        let item = if self.has_fields {
            Some(SseItem::Incomplete(std::mem::take(&mut self.pending)))
        } else {
            // A trailing comment without newline is still just a comment.
            out.pop()
        };
        *self = SseParser::default();
        item
    }

    fn end_line(&mut self, out: &mut Vec<SseItem>) {
        let line = std::mem::take(&mut self.line);
        if line.is_empty() {
            self.dispatch(out);
            return;
        }
        let text = String::from_utf8_lossy(&line);
        if let Some(comment) = text.strip_prefix(':') {
            out.push(SseItem::Comment(comment.to_owned()));
            return;
        }
        let (field, value) = match text.split_once(':') {
            Some((f, v)) => (f, v.strip_prefix(' ').unwrap_or(v)),
            None => (text.as_ref(), ""),
        };
        self.has_fields = true;
        match field {
            "data" => {
                if self.has_data {
                    self.pending.data.push('\n');
                }
                self.pending.data.push_str(value);
                self.has_data = true;
            }
            "event" => self.pending.event = Some(value.to_owned()),
            // An id containing NUL is ignored by the standard.
            "id" if !value.contains('\0') => self.pending.id = Some(value.to_owned()),
            "retry" => {
                if let Ok(ms) = value.parse::<u64>() {
                    self.pending.retry = Some(ms);
                }
            }
            _ => {}
        }
    }

    fn dispatch(&mut self, out: &mut Vec<SseItem>) {
        let event = std::mem::take(&mut self.pending);
        let had_data = std::mem::replace(&mut self.has_data, false);
        self.has_fields = false;
        if had_data {
            out.push(SseItem::Event(event));
        }
    }
}

/// Error of [`parse_stream`]: the underlying byte stream failed.
#[derive(Debug, thiserror::Error)]
#[error("failed to read event stream: {0}")]
pub struct SseReadError<E>(pub E);

/// Adapts a byte stream into a stream of SSE items. At end of input, an unterminated trailing
/// event is yielded as [`SseItem::Incomplete`]. A transport error is yielded once (after any
/// items completed before it) and ends the stream; the partial event it cut off is *not*
/// reported as `Incomplete`, because the error already says the stream is truncated.
pub fn parse_stream<S, E>(bytes: S) -> impl Stream<Item = Result<SseItem, SseReadError<E>>>
where
    S: Stream<Item = Result<Bytes, E>> + Unpin,
{
    futures::stream::unfold(
        (
            bytes,
            SseParser::new(),
            std::collections::VecDeque::new(),
            false,
        ),
        |(mut bytes, mut parser, mut queue, mut done)| async move {
            loop {
                if let Some(item) = queue.pop_front() {
                    return Some((Ok(item), (bytes, parser, queue, done)));
                }
                if done {
                    return None;
                }
                match bytes.next().await {
                    Some(Ok(chunk)) => queue.extend(parser.push(&chunk)),
                    Some(Err(e)) => {
                        done = true;
                        return Some((Err(SseReadError(e)), (bytes, parser, queue, done)));
                    }
                    None => {
                        done = true;
                        queue.extend(parser.finish());
                    }
                }
            }
        },
    )
}

/// Appends the wire encoding of `event` to `out`: optional `event:` line, one `data:` line per
/// line of `data` (so embedded newlines survive), then a blank line. `id`/`retry` are written
/// when set.
pub fn write_event(out: &mut BytesMut, event: &SseEvent) {
    if let Some(name) = &event.event {
        out.put_slice(b"event: ");
        out.put_slice(name.as_bytes());
        out.put_u8(b'\n');
    }
    if let Some(id) = &event.id {
        out.put_slice(b"id: ");
        out.put_slice(id.as_bytes());
        out.put_u8(b'\n');
    }
    if let Some(retry) = event.retry {
        out.put_slice(format!("retry: {retry}\n").as_bytes());
    }
    // `split('\n')` yields one empty piece for empty data, so an empty event still has a
    // `data:` line and is dispatched by the receiver.
    for line in event.data.split('\n') {
        let line = line.strip_suffix('\r').unwrap_or(line);
        out.put_slice(b"data: ");
        out.put_slice(line.as_bytes());
        out.put_u8(b'\n');
    }
    out.put_u8(b'\n');
}

/// Wire encoding of an event with an optional name and data.
pub fn encode_event(event: Option<&str>, data: &str) -> Bytes {
    SseEvent::new(event, data).to_bytes()
}

/// Wire encoding of a comment line (e.g. a keep-alive: `encode_comment(" keep-alive")`).
pub fn encode_comment(text: &str) -> Bytes {
    let mut out = BytesMut::with_capacity(text.len() + 3);
    out.put_u8(b':');
    // A newline would end the comment early and turn the rest into a field line.
    out.put_slice(text.replace(['\r', '\n'], " ").as_bytes());
    out.put_slice(b"\n\n");
    out.freeze()
}

/// Wire encoding of one parser item (an `Incomplete` item encodes as nothing: it must not be
/// forwarded).
pub fn encode_item(item: &SseItem) -> Bytes {
    match item {
        SseItem::Event(ev) => ev.to_bytes(),
        SseItem::Comment(c) => encode_comment(c),
        SseItem::Incomplete(_) => Bytes::new(),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn events(items: &[SseItem]) -> Vec<&SseEvent> {
        items
            .iter()
            .filter_map(|i| match i {
                SseItem::Event(e) => Some(e),
                _ => None,
            })
            .collect()
    }

    #[test]
    fn push_whole_event_yields_it() {
        let mut p = SseParser::new();
        let items = p.push(b"event: ping\ndata: {\"type\":\"ping\"}\n\n");
        assert_eq!(
            items,
            vec![SseItem::Event(SseEvent::new(
                Some("ping"),
                "{\"type\":\"ping\"}"
            ))]
        );
        assert_eq!(p.finish(), None);
    }

    #[test]
    fn push_byte_by_byte_yields_same_events() {
        let input = b"event: a\r\ndata: x\r\n\r\ndata: y\ndata: z\n\n: keep-alive\r\rdata: w\r\r";
        let mut whole = SseParser::new();
        let expected = whole.push(input);
        let mut p = SseParser::new();
        let mut got = Vec::new();
        for b in input.iter() {
            got.extend(p.push(std::slice::from_ref(b)));
        }
        assert_eq!(got, expected);
        let evs = events(&got);
        assert_eq!(evs.len(), 3);
        assert_eq!(evs[0].event.as_deref(), Some("a"));
        assert_eq!(evs[0].data, "x");
        assert_eq!(evs[1].data, "y\nz");
        assert_eq!(evs[2].data, "w");
        assert!(got.contains(&SseItem::Comment(" keep-alive".to_owned())));
    }

    #[test]
    fn push_crlf_split_across_chunks_counts_once() {
        let mut p = SseParser::new();
        let mut items = p.push(b"data: a\r");
        items.extend(p.push(b"\n\r"));
        items.extend(p.push(b"\n"));
        assert_eq!(items, vec![SseItem::Event(SseEvent::data("a"))]);
    }

    #[test]
    fn push_multibyte_char_split_across_chunks_is_reassembled() {
        let text = "data: h\u{e9}llo \u{1f600}\n\n".as_bytes();
        let mut p = SseParser::new();
        let mut items = p.push(&text[..8]);
        items.extend(p.push(&text[8..]));
        assert_eq!(
            items,
            vec![SseItem::Event(SseEvent::data("h\u{e9}llo \u{1f600}"))]
        );
    }

    #[test]
    fn push_field_without_space_or_colon_is_parsed_per_spec() {
        let mut p = SseParser::new();
        let items = p.push(b"data:tight\ndata\nretry: 250\nid: 7\nunknown: z\n\n");
        let ev = SseEvent {
            event: None,
            data: "tight\n".to_owned(),
            id: Some("7".to_owned()),
            retry: Some(250),
        };
        assert_eq!(items, vec![SseItem::Event(ev)]);
    }

    #[test]
    fn push_event_without_data_is_not_dispatched() {
        let mut p = SseParser::new();
        assert!(p.push(b"event: lonely\n\n").is_empty());
    }

    #[test]
    fn push_leading_bom_is_ignored() {
        let mut p = SseParser::new();
        let items = p.push(b"\xEF\xBB\xBFdata: x\n\n");
        assert_eq!(items, vec![SseItem::Event(SseEvent::data("x"))]);
    }

    #[test]
    fn finish_unterminated_data_line_reports_incomplete() {
        let mut p = SseParser::new();
        let items = p.push(b"data: {\"n\":20}\n\ndata: {\"n\":2");
        assert_eq!(items, vec![SseItem::Event(SseEvent::data("{\"n\":20}"))]);
        assert_eq!(
            p.finish(),
            Some(SseItem::Incomplete(SseEvent::data("{\"n\":2")))
        );
    }

    #[test]
    fn finish_data_line_without_blank_line_reports_incomplete() {
        let mut p = SseParser::new();
        assert!(p.push(b"event: content_block_delta\ndata: {}\n").is_empty());
        assert_eq!(
            p.finish(),
            Some(SseItem::Incomplete(SseEvent::new(
                Some("content_block_delta"),
                "{}"
            )))
        );
    }

    #[test]
    fn finish_after_clean_end_reports_nothing() {
        let mut p = SseParser::new();
        p.push(b"data: [DONE]\n\n");
        assert_eq!(p.finish(), None);
    }

    #[test]
    fn write_event_multiline_data_round_trips() {
        let ev = SseEvent::new(Some("message_delta"), "line1\nline2\n");
        let bytes = ev.to_bytes();
        assert_eq!(
            &bytes[..],
            b"event: message_delta\ndata: line1\ndata: line2\ndata: \n\n"
        );
        let mut p = SseParser::new();
        assert_eq!(p.push(&bytes), vec![SseItem::Event(ev)]);
    }

    #[test]
    fn encode_comment_with_newline_stays_one_comment() {
        let mut p = SseParser::new();
        let items = p.push(&encode_comment(" a\nb"));
        assert_eq!(items, vec![SseItem::Comment(" a b".to_owned())]);
    }
}
