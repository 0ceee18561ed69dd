//! Wire-format, streaming, cache and cancellation tests against a real mock over loopback.

// Test helpers outside #[test] fns are test code too; clippy.toml's test allowances miss them.
#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]

use std::time::Duration;

use futures::StreamExt;
use serde::Deserialize;
use serde_json::{Value, json};
use switchyard_mock::{
    Fault, FaultRule, FaultSet, MockConfig, MockHandle, MockProvider, StreamError, UsageStyle,
};

async fn start(cfg: MockConfig) -> MockHandle {
    MockProvider::start(cfg).await.unwrap()
}

fn client() -> reqwest::Client {
    reqwest::Client::new()
}

/// One SSE event: optional `event:` name and its single `data:` payload.
#[derive(Debug)]
struct Event {
    name: Option<String>,
    data: String,
}

/// Splits an SSE body into events; asserts the framing (every event ends with a blank line and
/// carries exactly one `data:` line that is one JSON object or `[DONE]`). Comments are skipped.
fn parse_sse(text: &str) -> Vec<Event> {
    assert!(
        text.ends_with("\n\n"),
        "stream must end with a blank line: {text:?}"
    );
    let mut out = Vec::new();
    for block in text.split("\n\n").filter(|b| !b.is_empty()) {
        let mut name = None;
        let mut data = Vec::new();
        for line in block.lines() {
            if line.starts_with(':') {
                continue;
            } else if let Some(n) = line.strip_prefix("event: ") {
                name = Some(n.to_owned());
            } else if let Some(d) = line.strip_prefix("data: ") {
                data.push(d.to_owned());
            } else {
                panic!("unexpected SSE line {line:?}");
            }
        }
        if data.is_empty() {
            continue;
        }
        assert_eq!(data.len(), 1, "one data line per event: {block:?}");
        let d = data.remove(0);
        if d != "[DONE]" {
            let v: Value = serde_json::from_str(&d).expect("data is JSON");
            assert!(v.is_object(), "data is one JSON object: {d}");
        }
        out.push(Event { name, data: d });
    }
    out
}

fn json_of(e: &Event) -> Value {
    serde_json::from_str(&e.data).unwrap()
}

#[derive(Debug, Deserialize)]
struct ChatCompletion {
    object: String,
    choices: Vec<Choice>,
    usage: OaUsage,
}
#[derive(Debug, Deserialize)]
struct Choice {
    message: ChatMessage,
    finish_reason: String,
}
#[derive(Debug, Deserialize)]
struct ChatMessage {
    role: String,
    content: Option<String>,
    #[serde(default)]
    tool_calls: Vec<ToolCall>,
}
#[derive(Debug, Deserialize)]
struct ToolCall {
    id: String,
    function: FunctionCall,
}
#[derive(Debug, Deserialize)]
struct FunctionCall {
    name: String,
    arguments: String,
}
#[derive(Debug, Deserialize)]
struct OaUsage {
    prompt_tokens: u64,
    completion_tokens: u64,
    total_tokens: u64,
    prompt_tokens_details: CachedDetails,
}
#[derive(Debug, Deserialize)]
struct CachedDetails {
    cached_tokens: u64,
}

#[derive(Debug, Deserialize)]
struct AnMessage {
    #[serde(rename = "type")]
    kind: String,
    content: Vec<AnBlock>,
    stop_reason: String,
    usage: AnUsage,
}
#[derive(Debug, Deserialize)]
struct AnBlock {
    #[serde(rename = "type")]
    kind: String,
    text: Option<String>,
    name: Option<String>,
}
#[derive(Debug, Deserialize, PartialEq)]
struct AnUsage {
    input_tokens: u64,
    cache_creation_input_tokens: u64,
    cache_read_input_tokens: u64,
    output_tokens: u64,
}

fn words(n: usize) -> String {
    vec!["word"; n].join(" ")
}

#[tokio::test]
async fn openai_chat_non_stream_parses_with_usage_and_headers() {
    let mock = start(MockConfig {
        output_tokens: 5,
        ..MockConfig::default()
    })
    .await;
    let resp = client()
        .post(format!("{}/chat/completions", mock.openai_base_url()))
        .header("x-project-id", "p1")
        .bearer_auth("sk-test-abcd")
        .json(&json!({"model": "gpt-x", "messages": [{"role": "user", "content": words(12)}]}))
        .send()
        .await
        .unwrap();
    assert_eq!(resp.status(), 200);
    let h = resp.headers().clone();
    assert_eq!(h["x-ratelimit-limit-requests"], "10000");
    assert_eq!(h["x-ratelimit-remaining-requests"], "9999");
    let reset = h["x-ratelimit-reset-requests"].to_str().unwrap();
    assert!(reset.ends_with('s'), "go duration: {reset}");
    let body: ChatCompletion = resp.json().await.unwrap();
    assert_eq!(body.object, "chat.completion");
    assert_eq!(body.choices[0].message.role, "assistant");
    assert_eq!(
        body.choices[0].message.content.as_deref(),
        Some("token0 token1 token2 token3 token4")
    );
    assert_eq!(body.choices[0].finish_reason, "stop");
    assert_eq!(body.usage.prompt_tokens, 12);
    assert_eq!(body.usage.completion_tokens, 5);
    assert_eq!(body.usage.total_tokens, 17);
    let calls = mock.calls();
    assert_eq!(calls.len(), 1);
    assert_eq!(calls[0].project.as_deref(), Some("p1"));
    assert_eq!(calls[0].key_suffix.as_deref(), Some("abcd"));
    assert_eq!(calls[0].status, 200);
    assert_eq!(calls[0].usage.unwrap().prompt_tokens, 12);
    assert!(calls[0].cancelled_at.is_none());
}

#[tokio::test]
async fn openai_stream_without_include_usage_has_no_usage_chunk() {
    let mock = start(MockConfig {
        output_tokens: 3,
        ..MockConfig::default()
    })
    .await;
    let text = client()
        .post(format!("{}/chat/completions", mock.openai_base_url()))
        .json(
            &json!({"model": "m", "stream": true, "messages": [{"role": "user", "content": "hi"}]}),
        )
        .send()
        .await
        .unwrap()
        .text()
        .await
        .unwrap();
    let ev = parse_sse(&text);
    assert_eq!(ev.len(), 6, "role + 3 content + finish + DONE: {text}");
    let first = json_of(&ev[0]);
    assert_eq!(first["object"], "chat.completion.chunk");
    assert_eq!(
        first["choices"][0]["delta"],
        json!({"role": "assistant", "content": ""})
    );
    let content: String = ev[1..4]
        .iter()
        .map(|e| {
            json_of(e)["choices"][0]["delta"]["content"]
                .as_str()
                .unwrap()
                .to_owned()
        })
        .collect();
    assert_eq!(content, "token0 token1 token2");
    assert_eq!(json_of(&ev[4])["choices"][0]["finish_reason"], "stop");
    assert!(ev[..5].iter().all(|e| json_of(e).get("usage").is_none()));
    assert_eq!(ev[5].data, "[DONE]");
    let call = &mock.calls()[0];
    assert!(!call.include_usage_requested);
    assert_eq!(call.usage, None);
    assert_eq!(call.tokens_streamed, 3);
}

#[tokio::test]
async fn openai_stream_with_include_usage_ends_with_usage_only_chunk() {
    let mock = start(MockConfig {
        output_tokens: 2,
        ..MockConfig::default()
    })
    .await;
    let text = client()
        .post(format!("{}/chat/completions", mock.openai_base_url()))
        .json(
            &json!({"model": "m", "stream": true, "stream_options": {"include_usage": true},
            "messages": [{"role": "user", "content": words(7)}]}),
        )
        .send()
        .await
        .unwrap()
        .text()
        .await
        .unwrap();
    let ev = parse_sse(&text);
    assert_eq!(ev.len(), 6, "{text}");
    assert!(ev[..4].iter().all(|e| json_of(e)["usage"].is_null()));
    let usage_chunk = json_of(&ev[4]);
    assert_eq!(usage_chunk["choices"], json!([]));
    assert_eq!(usage_chunk["usage"]["prompt_tokens"], 7);
    assert_eq!(usage_chunk["usage"]["completion_tokens"], 2);
    assert_eq!(ev[5].data, "[DONE]");
    let call = &mock.calls()[0];
    assert!(call.include_usage_requested);
    assert_eq!(call.usage.unwrap().output_tokens, 2);
}

#[tokio::test]
async fn openai_tools_given_returns_tool_call_then_text_after_tool_result() {
    let mock = start(MockConfig::default()).await;
    let tools = json!([{"type": "function", "function": {"name": "get_weather",
        "parameters": {"type": "object", "properties": {}}}}]);
    let url = format!("{}/chat/completions", mock.openai_base_url());
    let body: ChatCompletion = client()
        .post(&url)
        .json(
            &json!({"model": "m", "tools": tools, "messages": [{"role": "user", "content": "x"}]}),
        )
        .send()
        .await
        .unwrap()
        .json()
        .await
        .unwrap();
    assert_eq!(body.choices[0].finish_reason, "tool_calls");
    let call = &body.choices[0].message.tool_calls[0];
    assert_eq!(call.function.name, "get_weather");
    assert_eq!(call.function.arguments, "{}");
    let msgs = json!([{"role": "user", "content": "x"},
        {"role": "assistant", "tool_calls": [{"id": call.id, "type": "function",
            "function": {"name": "get_weather", "arguments": "{}"}}]},
        {"role": "tool", "tool_call_id": call.id, "content": "sunny"}]);
    let after: ChatCompletion = client()
        .post(&url)
        .json(&json!({"model": "m", "tools": tools, "messages": msgs}))
        .send()
        .await
        .unwrap()
        .json()
        .await
        .unwrap();
    assert_eq!(after.choices[0].finish_reason, "stop");
    let none: ChatCompletion = client()
        .post(&url)
        .json(&json!({"model": "m", "tools": tools, "tool_choice": "none",
            "messages": [{"role": "user", "content": "x"}]}))
        .send()
        .await
        .unwrap()
        .json()
        .await
        .unwrap();
    assert!(none.choices[0].message.tool_calls.is_empty());
    // Streaming tool call: name first, then the arguments, then finish_reason tool_calls.
    let text = client()
        .post(&url)
        .json(&json!({"model": "m", "stream": true, "tools": tools,
            "messages": [{"role": "user", "content": "x"}]}))
        .send()
        .await
        .unwrap()
        .text()
        .await
        .unwrap();
    let ev = parse_sse(&text);
    assert_eq!(
        json_of(&ev[1])["choices"][0]["delta"]["tool_calls"][0]["function"]["name"],
        "get_weather"
    );
    assert_eq!(
        json_of(&ev[2])["choices"][0]["delta"]["tool_calls"][0]["function"]["arguments"],
        "{}"
    );
    assert_eq!(json_of(&ev[3])["choices"][0]["finish_reason"], "tool_calls");
}

#[tokio::test]
async fn anthropic_non_stream_and_stream_follow_messages_shapes() {
    let mock = start(MockConfig {
        output_tokens: 3,
        ..MockConfig::default()
    })
    .await;
    let url = format!("{}/v1/messages", mock.base_url());
    let req = json!({"model": "claude-x", "max_tokens": 2,
        "messages": [{"role": "user", "content": words(9)}]});
    let resp = client()
        .post(&url)
        .header("x-api-key", "k")
        .json(&req)
        .send()
        .await
        .unwrap();
    assert_eq!(resp.status(), 200);
    assert_eq!(
        resp.headers()["anthropic-ratelimit-requests-limit"],
        "10000"
    );
    let reset = resp.headers()["anthropic-ratelimit-requests-reset"]
        .to_str()
        .unwrap()
        .to_owned();
    assert!(
        chrono::DateTime::parse_from_rfc3339(&reset).is_ok(),
        "{reset}"
    );
    let msg: AnMessage = resp.json().await.unwrap();
    assert_eq!(msg.kind, "message");
    assert_eq!(msg.content[0].kind, "text");
    assert_eq!(msg.content[0].text.as_deref(), Some("token0 token1"));
    assert_eq!(msg.stop_reason, "max_tokens");
    assert_eq!(
        msg.usage,
        AnUsage {
            input_tokens: 9,
            cache_creation_input_tokens: 0,
            cache_read_input_tokens: 0,
            output_tokens: 2
        }
    );

    let mut sreq = req.clone();
    sreq["stream"] = json!(true);
    sreq["max_tokens"] = json!(100);
    let text = client()
        .post(&url)
        .json(&sreq)
        .send()
        .await
        .unwrap()
        .text()
        .await
        .unwrap();
    let ev = parse_sse(&text);
    let names: Vec<&str> = ev.iter().map(|e| e.name.as_deref().unwrap()).collect();
    assert_eq!(
        names,
        [
            "message_start",
            "content_block_start",
            "ping",
            "content_block_delta",
            "content_block_delta",
            "content_block_delta",
            "content_block_stop",
            "message_delta",
            "message_stop"
        ]
    );
    for e in &ev {
        assert_eq!(
            json_of(e)["type"],
            e.name.as_deref().unwrap(),
            "type matches event name"
        );
    }
    assert_eq!(json_of(&ev[0])["message"]["usage"]["input_tokens"], 9);
    assert_eq!(
        json_of(&ev[3])["delta"],
        json!({"type": "text_delta", "text": "token0"})
    );
    let delta = json_of(&ev[7]);
    assert_eq!(delta["delta"]["stop_reason"], "end_turn");
    assert_eq!(delta["usage"]["output_tokens"], 3);
    assert_eq!(mock.calls()[1].usage.unwrap().output_tokens, 3);
}

#[tokio::test]
async fn anthropic_tools_given_returns_tool_use() {
    let mock = start(MockConfig::default()).await;
    let msg: AnMessage = client()
        .post(format!("{}/v1/messages", mock.base_url()))
        .json(&json!({"model": "c", "max_tokens": 50,
            "tools": [{"name": "lookup", "input_schema": {"type": "object"}}],
            "messages": [{"role": "user", "content": "q"}]}))
        .send()
        .await
        .unwrap()
        .json()
        .await
        .unwrap();
    assert_eq!(msg.stop_reason, "tool_use");
    assert_eq!(msg.content[0].kind, "tool_use");
    assert_eq!(msg.content[0].name.as_deref(), Some("lookup"));
}

#[tokio::test]
async fn responses_stream_events_in_order_with_usage() {
    let mock = start(MockConfig {
        output_tokens: 2,
        ..MockConfig::default()
    })
    .await;
    let text = client()
        .post(format!("{}/responses", mock.openai_base_url()))
        .json(&json!({"model": "m", "stream": true, "input": words(4)}))
        .send()
        .await
        .unwrap()
        .text()
        .await
        .unwrap();
    let ev = parse_sse(&text);
    let names: Vec<&str> = ev.iter().map(|e| e.name.as_deref().unwrap()).collect();
    assert_eq!(
        names,
        [
            "response.created",
            "response.in_progress",
            "response.output_item.added",
            "response.content_part.added",
            "response.output_text.delta",
            "response.output_text.delta",
            "response.output_text.done",
            "response.content_part.done",
            "response.output_item.done",
            "response.completed"
        ]
    );
    let seqs: Vec<u64> = ev
        .iter()
        .map(|e| json_of(e)["sequence_number"].as_u64().unwrap())
        .collect();
    assert_eq!(seqs, (0..10).collect::<Vec<_>>());
    let done = json_of(&ev[9]);
    assert_eq!(done["response"]["usage"]["input_tokens"], 4);
    assert_eq!(done["response"]["usage"]["output_tokens"], 2);
    assert_eq!(
        done["response"]["output"][0]["content"][0]["text"],
        "token0 token1"
    );
}

#[tokio::test]
async fn embeddings_deterministic_unit_vectors_float_and_base64() {
    use base64::Engine as _;
    let mock = start(MockConfig::default()).await;
    let url = format!("{}/embeddings", mock.openai_base_url());
    let get = |body: Value| {
        let url = url.clone();
        async move {
            client()
                .post(url)
                .json(&body)
                .send()
                .await
                .unwrap()
                .json::<Value>()
                .await
                .unwrap()
        }
    };
    let a = get(json!({"model": "e", "input": ["alpha beta", "gamma"], "dimensions": 4})).await;
    let b = get(json!({"model": "e", "input": ["alpha beta", "gamma"], "dimensions": 4})).await;
    assert_eq!(a, b);
    assert_eq!(a["object"], "list");
    // "alpha" (5 chars) = 2, "beta" = 1, "gamma" = 2.
    assert_eq!(a["usage"]["prompt_tokens"], 5);
    let v: Vec<f32> = serde_json::from_value(a["data"][0]["embedding"].clone()).unwrap();
    assert_eq!(v.len(), 4);
    let norm: f32 = v.iter().map(|x| x * x).sum::<f32>().sqrt();
    assert!((norm - 1.0).abs() < 1e-4, "unit length, got {norm}");
    assert_ne!(a["data"][0]["embedding"], a["data"][1]["embedding"]);
    let c = get(json!({"model": "e", "input": "alpha beta", "dimensions": 4,
        "encoding_format": "base64"}))
    .await;
    let bytes = base64::engine::general_purpose::STANDARD
        .decode(c["data"][0]["embedding"].as_str().unwrap())
        .unwrap();
    let decoded: Vec<f32> = bytes
        .chunks(4)
        .map(|c| f32::from_le_bytes(c.try_into().unwrap()))
        .collect();
    assert_eq!(decoded, v);
}

#[tokio::test]
async fn rerank_orders_by_overlap_and_honours_top_n() {
    let mock = start(MockConfig::default()).await;
    let body: Value = client()
        .post(format!("{}/v1/rerank", mock.base_url()))
        .json(&json!({"model": "r", "query": "red apple",
            "documents": ["blue sky", "red apple pie", "apple"], "top_n": 2,
            "return_documents": true}))
        .send()
        .await
        .unwrap()
        .json()
        .await
        .unwrap();
    let results = body["results"].as_array().unwrap();
    assert_eq!(results.len(), 2);
    assert_eq!(results[0]["index"], 1);
    assert_eq!(results[1]["index"], 2);
    assert!(results[0]["relevance_score"].as_f64() > results[1]["relevance_score"].as_f64());
    assert_eq!(results[0]["document"]["text"], "red apple pie");
}

#[tokio::test]
async fn openai_prompt_cache_second_turn_reports_cached_tokens() {
    let mock = start(MockConfig {
        output_tokens: 4,
        ..MockConfig::default()
    })
    .await;
    let url = format!("{}/chat/completions", mock.openai_base_url());
    let t1 = json!([{"role": "system", "content": words(2000)},
        {"role": "user", "content": words(455)}]);
    let u1: ChatCompletion = client()
        .post(&url)
        .json(&json!({"model": "m", "messages": t1}))
        .send()
        .await
        .unwrap()
        .json()
        .await
        .unwrap();
    assert_eq!(u1.usage.prompt_tokens, 2455);
    assert_eq!(u1.usage.prompt_tokens_details.cached_tokens, 0);
    let mut t2 = t1.as_array().unwrap().clone();
    t2.push(json!({"role": "user", "content": words(4)}));
    // Streaming second turn reports the same split in its usage chunk.
    let text = client()
        .post(&url)
        .json(&json!({"model": "m", "messages": t2, "stream": true,
            "stream_options": {"include_usage": true}}))
        .send()
        .await
        .unwrap()
        .text()
        .await
        .unwrap();
    let ev = parse_sse(&text);
    let usage = &json_of(&ev[ev.len() - 2])["usage"];
    assert_eq!(usage["prompt_tokens"], 2459);
    assert_eq!(usage["prompt_tokens_details"]["cached_tokens"], 2455);
    assert_eq!(mock.calls()[1].usage.unwrap().cached_tokens, 2455);
}

#[tokio::test]
async fn anthropic_prompt_cache_writes_then_reads_breakpoint_prefix() {
    let mock = start(MockConfig {
        output_tokens: 23,
        ..MockConfig::default()
    })
    .await;
    let url = format!("{}/v1/messages", mock.base_url());
    let req = |tail: &str| {
        json!({"model": "c", "max_tokens": 100,
            "system": [{"type": "text", "text": words(2455),
                "cache_control": {"type": "ephemeral", "ttl": "1h"}}],
            "messages": [{"role": "user", "content": tail}]})
    };
    let first: AnMessage = client()
        .post(&url)
        .json(&req("a b c d"))
        .send()
        .await
        .unwrap()
        .json()
        .await
        .unwrap();
    assert_eq!(
        first.usage,
        AnUsage {
            input_tokens: 4,
            cache_creation_input_tokens: 2455,
            cache_read_input_tokens: 0,
            output_tokens: 23
        }
    );
    let second: AnMessage = client()
        .post(&url)
        .json(&req("e f g h"))
        .send()
        .await
        .unwrap()
        .json()
        .await
        .unwrap();
    assert_eq!(
        second.usage,
        AnUsage {
            input_tokens: 4,
            cache_creation_input_tokens: 0,
            cache_read_input_tokens: 2455,
            output_tokens: 23
        }
    );
    // Streaming: message_start carries the same input split.
    let mut s = req("i j k l");
    s["stream"] = json!(true);
    let ev = parse_sse(
        &client()
            .post(&url)
            .json(&s)
            .send()
            .await
            .unwrap()
            .text()
            .await
            .unwrap(),
    );
    let u = &json_of(&ev[0])["message"]["usage"];
    assert_eq!(u["input_tokens"], 4);
    assert_eq!(u["cache_read_input_tokens"], 2455);
    assert_eq!(u["cache_creation_input_tokens"], 0);
}

#[tokio::test]
async fn anthropic_implicit_breakpoint_caches_without_cache_control() {
    let mock = start(MockConfig {
        anthropic_implicit_breakpoint: true,
        ..MockConfig::default()
    })
    .await;
    let url = format!("{}/v1/messages", mock.base_url());
    let t1 = json!([{"role": "user", "content": words(100)}]);
    let mut t2 = t1.as_array().unwrap().clone();
    t2.push(json!({"role": "assistant", "content": words(16)}));
    t2.push(json!({"role": "user", "content": words(3)}));
    let first: AnMessage = client()
        .post(&url)
        .json(&json!({"model": "c", "max_tokens": 16, "messages": t1}))
        .send()
        .await
        .unwrap()
        .json()
        .await
        .unwrap();
    assert_eq!(first.usage.cache_creation_input_tokens, 100);
    assert_eq!(first.usage.input_tokens, 0);
    let second: AnMessage = client()
        .post(&url)
        .json(&json!({"model": "c", "max_tokens": 16, "messages": t2}))
        .send()
        .await
        .unwrap()
        .json()
        .await
        .unwrap();
    assert_eq!(second.usage.cache_read_input_tokens, 100);
    assert_eq!(second.usage.cache_creation_input_tokens, 19);
    assert_eq!(second.usage.input_tokens, 0);
}

#[tokio::test]
async fn gemini_usage_style_reports_usage_metadata() {
    let mock = start(MockConfig {
        output_tokens: 23,
        usage_style: UsageStyle::Gemini,
        ..MockConfig::default()
    })
    .await;
    let url = format!("{}/chat/completions", mock.openai_base_url());
    let base = json!([{"role": "user", "content": words(2455)}]);
    client()
        .post(&url)
        .json(&json!({"model": "g", "messages": base}))
        .send()
        .await
        .unwrap();
    let mut msgs = base.as_array().unwrap().clone();
    msgs.push(json!({"role": "user", "content": words(4)}));
    let body: Value = client()
        .post(&url)
        .json(&json!({"model": "g", "messages": msgs}))
        .send()
        .await
        .unwrap()
        .json()
        .await
        .unwrap();
    assert!(body.get("usage").is_none());
    assert_eq!(
        body["usageMetadata"],
        json!({"promptTokenCount": 2459, "cachedContentTokenCount": 2455,
            "candidatesTokenCount": 23, "totalTokenCount": 2482})
    );
    let text = client()
        .post(&url)
        .json(&json!({"model": "g", "messages": msgs, "stream": true}))
        .send()
        .await
        .unwrap()
        .text()
        .await
        .unwrap();
    let ev = parse_sse(&text);
    let last = json_of(&ev[ev.len() - 2]);
    // The identical prompt was seen on the previous call, so all of it is cached now.
    assert_eq!(last["usageMetadata"]["cachedContentTokenCount"], 2459);
    assert_eq!(last["choices"][0]["finish_reason"], "stop");
}

#[tokio::test]
async fn client_drop_mid_stream_records_cancellation_within_one_second() {
    let mock = start(MockConfig {
        output_tokens: 600,
        tokens_per_sec: 20.0,
        ..MockConfig::default()
    })
    .await;
    let resp = client()
        .post(format!("{}/chat/completions", mock.openai_base_url()))
        .json(
            &json!({"model": "m", "stream": true, "messages": [{"role": "user", "content": "x"}]}),
        )
        .send()
        .await
        .unwrap();
    let mut body = resp.bytes_stream();
    let mut seen = String::new();
    while seen.matches("token").count() < 5 {
        seen.push_str(&String::from_utf8_lossy(
            &body.next().await.unwrap().unwrap(),
        ));
    }
    drop(body);
    let dropped_at = tokio::time::Instant::now();
    let mut rec = None;
    while dropped_at.elapsed() < Duration::from_secs(1) {
        let c = mock.calls().remove(0);
        if c.cancelled_at.is_some() {
            rec = Some(c);
            break;
        }
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    let rec = rec.expect("cancellation recorded within 1 s");
    assert!(
        (5..20).contains(&rec.tokens_streamed),
        "tokens {}",
        rec.tokens_streamed
    );
    assert_eq!(rec.usage, None);
    assert_eq!(mock.stats().in_flight, 0);
}

#[tokio::test]
async fn ttft_and_pace_delay_first_and_last_token() {
    let mock = start(MockConfig {
        output_tokens: 5,
        tokens_per_sec: 20.0,
        ttft_ms: 500,
        ..MockConfig::default()
    })
    .await;
    let t0 = tokio::time::Instant::now();
    let resp = client()
        .post(format!("{}/chat/completions", mock.openai_base_url()))
        .json(
            &json!({"model": "m", "stream": true, "messages": [{"role": "user", "content": "x"}]}),
        )
        .send()
        .await
        .unwrap();
    let headers_at = t0.elapsed();
    let mut body = resp.bytes_stream();
    let mut first_token = None;
    let mut seen = String::new();
    while let Some(chunk) = body.next().await {
        seen.push_str(&String::from_utf8_lossy(&chunk.unwrap()));
        if first_token.is_none() && seen.contains("token0") {
            first_token = Some(t0.elapsed());
        }
    }
    let end = t0.elapsed();
    assert!(
        headers_at < Duration::from_millis(250),
        "headers at {headers_at:?}"
    );
    let ft = first_token.unwrap();
    assert!(ft >= Duration::from_millis(300), "first token at {ft:?}");
    // 4 more tokens at 50 ms each after the first.
    assert!(end >= Duration::from_millis(500), "end at {end:?}");
}

#[tokio::test]
async fn stream_error_before_content_anthropic_preamble_then_error_event() {
    let mock = start(MockConfig {
        faults: FaultSet::fail_all(Fault::StreamErrorBeforeContent {
            error: StreamError::Overloaded,
        }),
        ..MockConfig::default()
    })
    .await;
    let resp = client()
        .post(format!("{}/v1/messages", mock.base_url()))
        .json(&json!({"model": "c", "max_tokens": 10, "stream": true,
            "messages": [{"role": "user", "content": "x"}]}))
        .send()
        .await
        .unwrap();
    assert_eq!(resp.status(), 200);
    let ev = parse_sse(&resp.text().await.unwrap());
    let names: Vec<&str> = ev.iter().map(|e| e.name.as_deref().unwrap()).collect();
    assert_eq!(names, ["message_start", "ping", "error"]);
    assert_eq!(json_of(&ev[2])["error"]["type"], "overloaded_error");
    assert_eq!(mock.calls()[0].fault, ["stream_error_before_content"]);
}

#[tokio::test]
async fn stream_error_before_content_openai_and_responses_shapes() {
    let mock = start(MockConfig {
        faults: FaultSet::fail_all(Fault::StreamErrorBeforeContent {
            error: StreamError::InsufficientQuota,
        }),
        ..MockConfig::default()
    })
    .await;
    let text = client()
        .post(format!("{}/chat/completions", mock.openai_base_url()))
        .json(
            &json!({"model": "m", "stream": true, "messages": [{"role": "user", "content": "x"}]}),
        )
        .send()
        .await
        .unwrap()
        .text()
        .await
        .unwrap();
    let ev = parse_sse(&text);
    assert_eq!(ev.len(), 2, "{text}");
    assert_eq!(json_of(&ev[0])["choices"][0]["delta"]["role"], "assistant");
    assert_eq!(json_of(&ev[1])["error"]["code"], "insufficient_quota");

    let text = client()
        .post(format!("{}/responses", mock.openai_base_url()))
        .json(&json!({"model": "m", "stream": true, "input": "x"}))
        .send()
        .await
        .unwrap()
        .text()
        .await
        .unwrap();
    let ev = parse_sse(&text);
    let names: Vec<&str> = ev.iter().map(|e| e.name.as_deref().unwrap()).collect();
    assert_eq!(
        names,
        [
            "response.created",
            "response.in_progress",
            "response.failed"
        ]
    );
    assert_eq!(
        json_of(&ev[2])["response"]["error"]["code"],
        "insufficient_quota"
    );
    assert_eq!(json_of(&ev[2])["response"]["status"], "failed");

    // The same fault on a non-streaming request is a plain HTTP error.
    let resp = client()
        .post(format!("{}/chat/completions", mock.openai_base_url()))
        .json(&json!({"model": "m", "messages": [{"role": "user", "content": "x"}]}))
        .send()
        .await
        .unwrap();
    assert_eq!(resp.status(), 429);
}

#[tokio::test]
async fn cut_mid_stream_sends_n_deltas_torn_line_then_resets() {
    let mock = start(MockConfig {
        output_tokens: 100,
        faults: FaultSet::rules([FaultRule::always(Fault::CutMidStream { after_deltas: 20 })]),
        ..MockConfig::default()
    })
    .await;
    let resp = client()
        .post(format!("{}/v1/messages", mock.base_url()))
        .json(&json!({"model": "c", "max_tokens": 500, "stream": true,
            "messages": [{"role": "user", "content": "x"}]}))
        .send()
        .await
        .unwrap();
    let mut body = resp.bytes_stream();
    let mut text = String::new();
    let mut errored = false;
    while let Some(chunk) = body.next().await {
        match chunk {
            Ok(b) => text.push_str(&String::from_utf8_lossy(&b)),
            Err(_) => {
                errored = true;
                break;
            }
        }
    }
    assert!(errored, "body ends with a transport error");
    let (complete, torn) = text.rsplit_once("\n\n").unwrap();
    let ev = parse_sse(&format!("{complete}\n\n"));
    let deltas = ev
        .iter()
        .filter(|e| e.name.as_deref() == Some("content_block_delta"))
        .count();
    assert_eq!(deltas, 20);
    assert!(
        torn.starts_with("event: content_block_delta\ndata: {"),
        "torn: {torn:?}"
    );
    assert!(torn.ends_with("}\n") && !torn.ends_with("\n\n"));
    assert!(!text.contains("message_stop"));
    let call = &mock.calls()[0];
    assert_eq!(call.tokens_streamed, 20);
    assert!(
        call.cancelled_at.is_none(),
        "the mock cut it, not the client"
    );
}
