//! SSE stream adapter and stream classification on the field cases the dispatcher must get
//! right: a failure before content (18), a cut after content (19b), keep-alives without
//! content (21b).

// Test helpers outside #[test] fns are not covered by clippy.toml allow-*-in-tests.
#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]

use bytes::Bytes;
use futures::StreamExt;
use serde_json::json;
use switchyard_router::wire::classify::{StreamClass, classify};
use switchyard_router::wire::sse::{SseEvent, SseItem, SseReadError, parse_stream};
use switchyard_router::wire::{Dialect, error_event};

#[derive(Debug, PartialEq)]
struct Reset;

/// Collects `parse_stream` over `chunks`, optionally ending in a transport error.
async fn collect(chunks: Vec<&'static [u8]>, then_reset: bool) -> Vec<Result<SseItem, Reset>> {
    let mut parts: Vec<Result<Bytes, Reset>> = chunks
        .into_iter()
        .map(|c| Ok(Bytes::from_static(c)))
        .collect();
    if then_reset {
        parts.push(Err(Reset));
    }
    parse_stream(futures::stream::iter(parts))
        .map(|r| r.map_err(|SseReadError(e)| e))
        .collect()
        .await
}

#[tokio::test]
async fn parse_stream_split_events_reassembles_and_reports_incomplete_tail() {
    let items = collect(
        vec![
            b"event: content_block_delta\nda",
            b"ta: {\"a\":1}\n",
            b"\n: keep-alive\n\ndata: {\"b\":",
        ],
        false,
    )
    .await;
    assert_eq!(
        items,
        vec![
            Ok(SseItem::Event(SseEvent::new(
                Some("content_block_delta"),
                "{\"a\":1}"
            ))),
            Ok(SseItem::Comment(" keep-alive".into())),
            Ok(SseItem::Incomplete(SseEvent::data("{\"b\":"))),
        ]
    );
}

#[tokio::test]
async fn case19b_twenty_deltas_then_half_event_then_reset_yields_twenty_then_error() {
    let delta: &'static [u8] = b"data: {\"id\":\"c\",\"object\":\"chat.completion.chunk\",\"created\":1,\"model\":\"m\",\"choices\":[{\"index\":0,\"delta\":{\"content\":\"x\"},\"finish_reason\":null}]}\n\n";
    let mut chunks: Vec<&'static [u8]> = vec![delta; 20];
    // The 21st data line arrives without its terminating blank line, then the connection resets.
    chunks.push(b"data: {\"id\":\"c\",\"object\":\"chat.completion.chunk\",\"choi");
    let items = collect(chunks, true).await;
    assert_eq!(items.len(), 21);
    for item in &items[..20] {
        let item = item.as_ref().unwrap();
        assert_eq!(classify(Dialect::OpenAi, item), StreamClass::Content);
    }
    assert_eq!(items[20], Err(Reset));
    // What the dispatcher then sends: one separate, well-formed error event (no [DONE]).
    let ev = error_event(
        Dialect::OpenAi,
        502,
        "upstream connection reset",
        Some("upstream_reset"),
    );
    let v: serde_json::Value = serde_json::from_str(&ev.data).unwrap();
    assert_eq!(v["error"]["code"], "upstream_reset");
    let ev = error_event(Dialect::Anthropic, 502, "upstream connection reset", None);
    assert_eq!(ev.event.as_deref(), Some("error"));
    let v: serde_json::Value = serde_json::from_str(&ev.data).unwrap();
    assert_eq!(v["type"], "error");
}

#[tokio::test]
async fn case18_preamble_then_overload_error_has_no_content_before_error() {
    let start = json!({"type": "message_start", "message": {"id": "msg_1", "type": "message",
        "role": "assistant", "model": "m", "content": [], "stop_reason": null, "stop_sequence": null,
        "usage": {"input_tokens": 10, "output_tokens": 1}}});
    let wire = format!(
        "event: message_start\ndata: {start}\n\n\
         event: ping\ndata: {{\"type\": \"ping\"}}\n\n\
         event: error\ndata: {{\"type\": \"error\", \"error\": {{\"type\": \"overloaded_error\", \"message\": \"Overloaded\"}}}}\n\n"
    );
    let leaked: &'static [u8] = Box::leak(wire.into_bytes().into_boxed_slice());
    let items = collect(vec![leaked], false).await;
    let classes: Vec<StreamClass> = items
        .iter()
        .map(|i| classify(Dialect::Anthropic, i.as_ref().unwrap()))
        .collect();
    assert_eq!(classes[0], StreamClass::Preamble);
    assert_eq!(classes[1], StreamClass::Preamble);
    match &classes[2] {
        StreamClass::Error(v) => assert_eq!(v["error"]["type"], "overloaded_error"),
        other => panic!("expected error, got {other:?}"),
    }
    assert_eq!(classes.len(), 3);
}

#[tokio::test]
async fn case21b_keepalives_and_role_only_deltas_never_count_as_content() {
    let mut chunks: Vec<&'static [u8]> = Vec::new();
    for _ in 0..5 {
        chunks.push(b": keep-alive\n\n");
        chunks.push(b"data: {\"id\":\"c\",\"object\":\"chat.completion.chunk\",\"created\":1,\"model\":\"m\",\"choices\":[{\"index\":0,\"delta\":{\"role\":\"assistant\"},\"finish_reason\":null}]}\n\n");
    }
    let items = collect(chunks, false).await;
    assert_eq!(items.len(), 10);
    for item in &items {
        assert_eq!(
            classify(Dialect::OpenAi, item.as_ref().unwrap()),
            StreamClass::Preamble
        );
    }
}

/// Small deterministic generator (64-bit LCG) so the chunking test needs no extra crate and
/// every failure reproduces from its seed.
struct Lcg(u64);

impl Lcg {
    fn next(&mut self, bound: usize) -> usize {
        self.0 = self
            .0
            .wrapping_mul(6_364_136_223_846_793_005)
            .wrapping_add(1_442_695_040_888_963_407);
        ((self.0 >> 33) as usize) % bound
    }
}

#[test]
fn parser_any_chunking_and_line_endings_yield_the_same_items() {
    use switchyard_router::wire::sse::SseParser;
    let payloads = [
        "{\"type\":\"ping\"}",
        "multi\nline\ndata",
        " leading space kept",
        "unicode \u{e9}\u{1f600} \u{4e2d}",
        "",
        "[DONE]",
    ];
    for seed in 0..300u64 {
        let mut rng = Lcg(seed);
        let mut wire = Vec::new();
        let mut expected = Vec::new();
        for _ in 0..1 + rng.next(8) {
            let eol: &[u8] = [b"\n".as_slice(), b"\r\n", b"\r"][rng.next(3)];
            if rng.next(4) == 0 {
                wire.extend_from_slice(b": keep-alive");
                wire.extend_from_slice(eol);
                expected.push(SseItem::Comment(" keep-alive".into()));
            }
            let name = ["", "content_block_delta", "error"][rng.next(3)];
            let data = payloads[rng.next(payloads.len())];
            if !name.is_empty() {
                wire.extend_from_slice(format!("event: {name}").as_bytes());
                wire.extend_from_slice(eol);
            }
            for line in data.split('\n') {
                wire.extend_from_slice(format!("data: {line}").as_bytes());
                wire.extend_from_slice(eol);
            }
            wire.extend_from_slice(eol);
            expected.push(SseItem::Event(SseEvent::new(
                (!name.is_empty()).then_some(name),
                data,
            )));
        }
        // The stream closes with an LF-terminated event so it never ends on a bare CR, whose
        // meaning (CR or the first half of CRLF) only the next byte would settle.
        wire.extend_from_slice(b"data: end\n\n");
        expected.push(SseItem::Event(SseEvent::data("end")));

        let mut parser = SseParser::new();
        let mut got = Vec::new();
        let mut rest = wire.as_slice();
        while !rest.is_empty() {
            let n = 1 + rng.next(rest.len().min(16));
            got.extend(parser.push(&rest[..n]));
            rest = &rest[n..];
        }
        assert_eq!(parser.finish(), None, "seed {seed}");
        assert_eq!(got, expected, "seed {seed}");
    }
}
