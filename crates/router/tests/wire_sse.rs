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
