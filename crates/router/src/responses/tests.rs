use super::*;

fn map(v: Value) -> Map<String, Value> {
    match v {
        Value::Object(m) => m,
        _ => panic!("not an object"),
    }
}

fn refused(v: Value) -> Refusal {
    to_chat(&map(v)).expect_err("should be refused")
}

#[test]
fn a_string_input_with_instructions_becomes_system_and_user_messages() {
    let (chat, echo) = to_chat(&map(json!({
        "model": "m", "input": "hello", "instructions": "be brief",
        "max_output_tokens": 50, "temperature": 0.5, "top_p": 0.9,
        "metadata": {"k": "v"}
    })))
    .unwrap();
    assert_eq!(
        chat,
        json!({
            "model": "m",
            "messages": [{"role": "system", "content": "be brief"}, {"role": "user", "content": "hello"}],
            "max_tokens": 50, "temperature": 0.5, "top_p": 0.9,
        })
    );
    assert_eq!(echo.metadata, json!({"k": "v"}));
    assert_eq!(echo.tool_choice, json!("auto"));
    assert!(!echo.stream);
}

#[test]
fn items_become_chat_messages_with_tool_calls_joined() {
    let (chat, _) = to_chat(&map(json!({
        "model": "m",
        "stream": true,
        "input": [
            {"role": "developer", "content": "rules"},
            {"type": "message", "role": "user", "content": [
                {"type": "input_text", "text": "weather in "}, {"type": "input_text", "text": "Paris?"}]},
            {"type": "message", "role": "assistant", "content": [{"type": "output_text", "text": "checking"}]},
            {"type": "function_call", "call_id": "c1", "name": "get_weather", "arguments": "{\"city\":\"Paris\"}"},
            {"type": "function_call", "call_id": "c2", "name": "get_time", "arguments": "{}"},
            {"type": "function_call_output", "call_id": "c1", "output": "sunny"},
            {"type": "function_call_output", "call_id": "c2", "output": [{"type": "input_text", "text": "noon"}]},
        ],
        "tools": [{"type": "function", "name": "get_weather", "description": "d",
                   "parameters": {"type": "object"}, "strict": false}],
        "tool_choice": {"type": "function", "name": "get_weather"},
        "parallel_tool_calls": false,
    })))
    .unwrap();
    assert_eq!(
        chat["messages"],
        json!([
            {"role": "system", "content": "rules"},
            {"role": "user", "content": "weather in Paris?"},
            {"role": "assistant", "content": "checking", "tool_calls": [
                {"id": "c1", "type": "function", "function": {"name": "get_weather", "arguments": "{\"city\":\"Paris\"}"}},
                {"id": "c2", "type": "function", "function": {"name": "get_time", "arguments": "{}"}},
            ]},
            {"role": "tool", "tool_call_id": "c1", "content": "sunny"},
            {"role": "tool", "tool_call_id": "c2", "content": "noon"},
        ])
    );
    assert_eq!(
        chat["tools"],
        json!([{"type": "function", "function": {"name": "get_weather", "description": "d", "parameters": {"type": "object"}}}])
    );
    assert_eq!(
        chat["tool_choice"],
        json!({"type": "function", "function": {"name": "get_weather"}})
    );
    assert_eq!(chat["parallel_tool_calls"], json!(false));
    assert_eq!(chat["stream"], json!(true));
    assert_eq!(chat["stream_options"], json!({"include_usage": true}));
}

#[test]
fn what_cannot_be_honoured_is_refused_with_its_param() {
    let cases = [
        (
            json!({"model": "m", "input": "x", "previous_response_id": "resp_1"}),
            "previous_response_id",
        ),
        (
            json!({"model": "m", "input": "x", "conversation": "conv_1"}),
            "conversation",
        ),
        (
            json!({"model": "m", "input": "x", "background": true}),
            "background",
        ),
        (json!({"model": "m", "input": "x", "store": true}), "store"),
        (
            json!({"model": "m", "input": "x", "tools": [{"type": "web_search"}]}),
            "tools[0].type",
        ),
        (
            json!({"model": "m", "input": [{"type": "reasoning", "summary": []}]}),
            "input[0].type",
        ),
        (
            json!({"model": "m", "input": [{"role": "user", "content": [{"type": "input_file", "file_id": "f"}]}]}),
            "input[0].content[0].type",
        ),
        (
            json!({"model": "m", "input": "x", "reasoning": {"effort": "high"}}),
            "reasoning",
        ),
        (
            json!({"model": "m", "input": "x", "text": {"format": {"type": "json_object"}}}),
            "text.format",
        ),
        (
            json!({"model": "m", "input": "x", "max_output_tokens": 0}),
            "max_output_tokens",
        ),
        (
            json!({"model": "m", "input": "x", "tool_choice": {"type": "file_search"}}),
            "tool_choice",
        ),
        (json!({"model": "m", "input": 7}), "input"),
    ];
    for (request, param) in cases {
        let r = refused(request.clone());
        assert_eq!(r.param, param, "{request}");
        let body = r.body();
        assert_eq!(body["error"]["type"], "invalid_request_error");
        assert_eq!(body["error"]["param"], param);
    }
    assert_eq!(
        refused(json!({"model": "m", "input": "x", "previous_response_id": "r"})).code,
        "unsupported_parameter"
    );
}

#[test]
fn defaults_the_sdk_sends_are_accepted() {
    // Explicit nulls and false / disabled values ask for what the gateway does anyway.
    let (chat, echo) = to_chat(&map(json!({
        "model": "m", "input": "x", "store": false, "background": false,
        "previous_response_id": null, "truncation": "disabled", "include": [],
        "text": {"format": {"type": "text"}}, "service_tier": "auto", "reasoning": null,
    })))
    .unwrap();
    assert_eq!(chat["messages"], json!([{"role": "user", "content": "x"}]));
    assert_eq!(echo.tools, json!([]));
}

#[test]
fn the_item_count_is_bounded() {
    let items: Vec<Value> = (0..=MAX_INPUT_ITEMS)
        .map(|_| json!({"role": "user", "content": "x"}))
        .collect();
    let r = refused(json!({"model": "m", "input": items}));
    assert_eq!(r.param, "input");
}

#[test]
fn a_chat_completion_becomes_a_response_object() {
    let chat = json!({
        "id": "chatcmpl-1", "object": "chat.completion", "created": 1700000000, "model": "m-up",
        "choices": [{"index": 0, "finish_reason": "tool_calls", "message": {
            "role": "assistant", "content": "let me check",
            "tool_calls": [{"id": "call_9", "type": "function",
                            "function": {"name": "get_weather", "arguments": "{\"city\":\"Oslo\"}"}}]}}],
        "usage": {"prompt_tokens": 20, "completion_tokens": 7, "total_tokens": 27,
                  "prompt_tokens_details": {"cached_tokens": 12}},
    });
    let echo = Echo {
        metadata: json!({"a": "b"}),
        ..Default::default()
    };
    let r = from_chat(&chat, &echo, "resp_x");
    assert_eq!(r["id"], "resp_x");
    assert_eq!(r["object"], "response");
    assert_eq!(r["created_at"], 1700000000);
    assert_eq!(r["status"], "completed");
    assert_eq!(r["model"], "m-up");
    assert_eq!(r["metadata"], json!({"a": "b"}));
    assert_eq!(r["output"][0]["type"], "message");
    assert_eq!(
        r["output"][0]["content"][0],
        json!({"type": "output_text", "text": "let me check", "annotations": [], "logprobs": []})
    );
    assert_eq!(r["output"][1]["type"], "function_call");
    assert_eq!(r["output"][1]["call_id"], "call_9");
    assert_eq!(r["output"][1]["name"], "get_weather");
    assert_eq!(r["output"][1]["arguments"], "{\"city\":\"Oslo\"}");
    assert_eq!(
        r["usage"],
        json!({"input_tokens": 20, "input_tokens_details": {"cached_tokens": 12},
               "output_tokens": 7, "output_tokens_details": {"reasoning_tokens": 0},
               "total_tokens": 27})
    );
}

#[test]
fn a_length_finish_is_incomplete() {
    let chat = json!({"created": 1, "model": "m", "choices": [{"finish_reason": "length",
        "message": {"role": "assistant", "content": "trunc"}}]});
    let r = from_chat(&chat, &Echo::default(), "resp_y");
    assert_eq!(r["status"], "incomplete");
    assert_eq!(
        r["incomplete_details"],
        json!({"reason": "max_output_tokens"})
    );
}

/// The events of an SSE byte string: (event name, data).
fn events(sse: &[u8]) -> Vec<(String, Value)> {
    let text = String::from_utf8(sse.to_vec()).unwrap();
    text.split("\n\n")
        .filter(|e| !e.is_empty())
        .map(|e| {
            let mut name = String::new();
            let mut data = Value::Null;
            for line in e.lines() {
                if let Some(n) = line.strip_prefix("event: ") {
                    name = n.to_owned();
                }
                if let Some(d) = line.strip_prefix("data: ") {
                    data = serde_json::from_str(d).unwrap();
                }
            }
            assert_eq!(data["type"], json!(name));
            (name, data)
        })
        .collect()
}

fn chunk(delta: Value, finish: Value) -> String {
    let c = json!({"id": "c", "object": "chat.completion.chunk", "created": 42, "model": "m-up",
                   "choices": [{"index": 0, "delta": delta, "finish_reason": finish}]});
    format!("data: {c}\n\n")
}

#[test]
fn a_chat_stream_becomes_typed_events_in_order() {
    let mut t = StreamTranslator::new(Echo::default(), "resp_s".into());
    let mut out = Vec::new();
    let usage = json!({"id": "c", "object": "chat.completion.chunk", "created": 42, "model": "m-up", "choices": [],
                       "usage": {"prompt_tokens": 5, "completion_tokens": 3, "total_tokens": 8,
                                 "prompt_tokens_details": {"cached_tokens": 2}}});
    let stream = [
        chunk(json!({"role": "assistant", "content": ""}), Value::Null),
        chunk(json!({"content": "Hel"}), Value::Null),
        chunk(json!({"content": "lo"}), Value::Null),
        chunk(
            json!({"tool_calls": [{"index": 0, "id": "call_1", "type": "function",
                                    "function": {"name": "f", "arguments": ""}}]}),
            Value::Null,
        ),
        chunk(
            json!({"tool_calls": [{"index": 0, "function": {"arguments": "{\"a\":"}}]}),
            Value::Null,
        ),
        chunk(
            json!({"tool_calls": [{"index": 0, "function": {"arguments": "1}"}}]}),
            json!("tool_calls"),
        ),
        format!("data: {usage}\n\n"),
        "data: [DONE]\n\n".to_owned(),
    ]
    .concat();
    // Fed in awkward pieces: events split across pushes.
    for piece in stream.as_bytes().chunks(7) {
        out.extend(t.push(piece));
    }
    out.extend(t.finish());
    let ev = events(&out);
    let names: Vec<&str> = ev.iter().map(|(n, _)| n.as_str()).collect();
    assert_eq!(
        names,
        [
            "response.created",
            "response.in_progress",
            "response.output_item.added",
            "response.content_part.added",
            "response.output_text.delta",
            "response.output_text.delta",
            "response.output_item.added",
            "response.function_call_arguments.delta",
            "response.function_call_arguments.delta",
            "response.output_text.done",
            "response.content_part.done",
            "response.output_item.done",
            "response.function_call_arguments.done",
            "response.output_item.done",
            "response.completed",
        ]
    );
    for (i, (_, e)) in ev.iter().enumerate() {
        assert_eq!(e["sequence_number"], json!(i));
    }
    assert_eq!(ev[0].1["response"]["status"], "in_progress");
    assert_eq!(ev[0].1["response"]["created_at"], 42);
    assert_eq!(ev[4].1["delta"], "Hel");
    assert_eq!(ev[6].1["output_index"], 1);
    assert_eq!(ev[6].1["item"]["call_id"], "call_1");
    assert_eq!(ev[9].1["text"], "Hello");
    assert_eq!(ev[12].1["arguments"], "{\"a\":1}");
    let done = &ev[14].1["response"];
    assert_eq!(done["status"], "completed");
    assert_eq!(done["output"][0]["content"][0]["text"], "Hello");
    assert_eq!(done["output"][1]["arguments"], "{\"a\":1}");
    assert_eq!(done["usage"]["input_tokens"], 5);
    assert_eq!(done["usage"]["input_tokens_details"]["cached_tokens"], 2);
    assert_eq!(done["usage"]["total_tokens"], 8);
    assert!(t.is_finished());
}

#[test]
fn a_broken_or_failed_stream_ends_with_response_failed() {
    let mut t = StreamTranslator::new(Echo::default(), "resp_f".into());
    let mut out = t.push(chunk(json!({"content": "partial"}), Value::Null).as_bytes());
    out.extend(t.finish());
    let ev = events(&out);
    assert_eq!(ev.last().unwrap().0, "response.failed");
    assert_eq!(ev.last().unwrap().1["response"]["status"], "failed");

    let mut t = StreamTranslator::new(Echo::default(), "resp_g".into());
    let out =
        t.push(b"data: {\"error\":{\"message\":\"overloaded\",\"type\":\"server_error\"}}\n\n");
    let ev = events(&out);
    assert_eq!(ev.last().unwrap().0, "response.failed");
    assert_eq!(
        ev.last().unwrap().1["response"]["error"]["message"],
        "overloaded"
    );
    assert!(t.is_finished());
}

#[test]
fn an_oversized_event_fails_the_stream_instead_of_growing() {
    let mut t = StreamTranslator::new(Echo::default(), "resp_o".into());
    let mut out = Vec::new();
    let piece = vec![b'x'; 1024 * 1024];
    for _ in 0..5 {
        out.extend(t.push(&piece));
    }
    assert!(t.is_finished());
    assert_eq!(events(&out).last().unwrap().0, "response.failed");
}
