//! Estimation of a realistic ~4 KB OpenAI chat request (system prompt, several turns, a tool
//! call and its result, two tool definitions): issue 5's target is ≤ 20 µs per estimate.
//! Three cases: cold (nothing memoised), the next turn of a conversation (history memoised,
//! the last message new) and an exact repeat; also the tokenizer alone on all message text,
//! and JSON parsing of the same body for scale.
//! The first-call (vocabulary load) cost is printed once before the benchmarks run, because
//! criterion cannot repeat a process-wide one-time load.

// criterion_main! generates an undocumented `main`; the bench is test code.
#![allow(missing_docs, clippy::unwrap_used, clippy::print_stdout)]
// The one-time load is timed with the wall clock once, at the bench's process edge.
#![allow(clippy::disallowed_methods)]

use std::hint::black_box;

use criterion::{BatchSize, Criterion, Throughput, criterion_group, criterion_main};
use serde_json::json;
use switchyard_router::estimate::{
    EstimateParams, clear_piece_memo, count_tokens, estimate_openai_chat, openai_chat_input_tokens,
    warm_up,
};
use switchyard_router::wire::openai::{ChatRequest, MessageContent};
use switchyard_router::wire::usage::Pricing;

const SYSTEM: &str = "You are the support assistant of Acme Logistics. Answer questions about \
shipments, invoices and warehouse stock for the customer who is signed in. Always cite the order \
number, never invent tracking codes, and ask a clarifying question when a request is ambiguous. \
Use the tools when live data is needed; otherwise answer from the conversation. Keep answers \
under 200 words unless the customer asks for detail, and use metric units. If the customer asks \
about another company's orders, refuse politely. Dates are in ISO 8601 (2026-11-30), amounts in \
the invoice currency with two decimals. When a shipment is delayed, give the reason reported by \
the carrier, the expected new date if one is known, and what the customer can do to speed it up. \
Never share internal notes, staff names or the contents of other customers' records, and do not \
offer discounts or refunds yourself: hand those requests to a human agent with a short summary.";

const LAST_TURN: &str = "Great, thanks. One more thing: how many units of SKU FX-220 do we have \
in the Lyon warehouse, and when is the next replenishment due? We have a customer asking for 1,500 \
units by the end of the month and I don't want to promise something we can't ship.";

fn request_json() -> serde_json::Value {
    json!({
        "model": "gpt-4.1",
        "max_completion_tokens": 1024,
        "messages": [
            {"role": "system", "content": SYSTEM},
            {"role": "user", "content": "Hi, I need to know where order 48213 is. It was supposed to arrive on Tuesday at our Rotterdam warehouse but nothing showed up, and the dock team has been waiting since 7am."},
            {"role": "assistant", "content": null, "tool_calls": [{"id": "call_8f2a", "type": "function",
                "function": {"name": "track_shipment", "arguments": "{\"order_id\":\"48213\",\"include_events\":true}"}}]},
            {"role": "tool", "tool_call_id": "call_8f2a", "content": "{\"order_id\":\"48213\",\"status\":\"held_at_customs\",\"location\":\"Rotterdam, NL\",\"events\":[{\"at\":\"2026-11-23T14:20:00Z\",\"what\":\"departed Antwerp hub\"},{\"at\":\"2026-11-24T09:05:00Z\",\"what\":\"arrived at customs\"},{\"at\":\"2026-11-24T09:40:00Z\",\"what\":\"hold: commercial invoice missing HS code for line 3\"}]}"},
            {"role": "assistant", "content": "Order 48213 left the Antwerp hub on 2026-11-23 at 14:20 and has been held at customs in Rotterdam since 2026-11-24 09:40, because the commercial invoice is missing the HS code for line 3 (industrial fasteners). Once the code is supplied, release normally takes 4 to 8 hours."},
            {"role": "user", "content": "OK. The HS code is 7318.15.90. Can you add it, and also tell me whether invoice INV-2209 for the same order has been paid? Our finance team says they wired 12,480.00 EUR on the 3rd."},
            {"role": "assistant", "content": "I have attached HS code 7318.15.90 to line 3 of order 48213 and resubmitted the invoice to customs. Invoice INV-2209 shows a payment of 12,480.00 EUR received on 2026-11-04, matched and closed, so nothing is outstanding on that order."},
            {"role": "user", "content": "Perfect. For the record, the customs broker at Rotterdam asked us last time to send HS codes in the eight-digit format with dots, which is what I gave you. Please also note on the account that invoices for Lyon deliveries should go to accounts.lyon@example.com from now on."},
            {"role": "assistant", "content": "Noted: HS codes in the eight-digit dotted format for the Rotterdam broker, and invoices for Lyon deliveries will be sent to accounts.lyon@example.com from now on. The change applies to invoices issued after today; earlier ones keep their original recipient."},
            {"role": "user", "content": LAST_TURN}
        ],
        "tools": [
            {"type": "function", "function": {
                "name": "track_shipment",
                "description": "Look up the current status and event history of a shipment by order id.",
                "parameters": {"type": "object", "properties": {
                    "order_id": {"type": "string", "description": "Order number, digits only."},
                    "include_events": {"type": "boolean", "description": "Include the scan event history."}},
                    "required": ["order_id"], "additionalProperties": false}}},
            {"type": "function", "function": {
                "name": "check_stock",
                "description": "Units on hand and the next inbound replenishment for a SKU in one warehouse.",
                "parameters": {"type": "object", "properties": {
                    "sku": {"type": "string", "description": "Stock keeping unit, e.g. FX-220."},
                    "warehouse": {"type": "string", "enum": ["rotterdam", "lyon", "leipzig", "milan"]},
                    "include_inbound": {"type": "boolean"}},
                    "required": ["sku", "warehouse"], "additionalProperties": false}}}
        ],
        "temperature": 0.2
    })
}

fn bench_estimate(c: &mut Criterion) {
    let started = std::time::Instant::now();
    warm_up();
    println!("tokenizer first load (o200k_base): {:?}", started.elapsed());

    let body = serde_json::to_vec(&request_json()).unwrap();
    let req: ChatRequest = serde_json::from_slice(&body).unwrap();
    let params = EstimateParams {
        default_output_tokens: 4096,
        pricing: Pricing {
            input: 2_000_000,
            output: 8_000_000,
            cache_read: 500_000,
            cache_write: 2_000_000,
        },
        ratio: 1.07,
    };
    println!(
        "request body: {} bytes, estimated input tokens (raw): {}",
        body.len(),
        openai_chat_input_tokens(&req)
    );
    let text: String = req
        .messages
        .iter()
        .filter_map(|m| m.content.as_ref().map(|c| c.joined_text()))
        .collect::<Vec<_>>()
        .join("\n");

    let mut g = c.benchmark_group("estimate_chat_4kb");
    g.throughput(Throughput::Bytes(body.len() as u64));
    // Nothing memoised: every message and tool description starts with a number unique to the
    // iteration, so every segment misses the memo (which stays full of earlier iterations', as
    // in a busy router) and is tokenized.
    let mut unique = 0u64;
    g.bench_function("estimate_openai_chat_cold", |b| {
        b.iter_batched_ref(
            || {
                unique += 1;
                let mut fresh = req.clone();
                for m in &mut fresh.messages {
                    if let Some(MessageContent::Text(t)) = &mut m.content {
                        *t = format!("{unique} {t}");
                    }
                }
                for tool in fresh.tools.iter_mut().flatten() {
                    if let Some(f) = &mut tool.function {
                        f.description = Some(format!(
                            "{unique} {}",
                            f.description.as_deref().unwrap_or("")
                        ));
                    }
                }
                fresh
            },
            |fresh| estimate_openai_chat(black_box(fresh), &params),
            BatchSize::SmallInput,
        )
    });
    // The next turn of a conversation: system prompt, tools and history seen before, the last
    // user message new (a unique text of the same length each iteration).
    let mut turn = 0u64;
    g.bench_function("estimate_openai_chat_next_turn", |b| {
        // `_ref`: the cloned request is dropped outside the timed section.
        b.iter_batched_ref(
            || {
                turn += 1;
                let mut next = req.clone();
                if let Some(last) = next.messages.last_mut() {
                    last.content = Some(MessageContent::Text(format!("{turn} {LAST_TURN}")));
                }
                next
            },
            |next| estimate_openai_chat(black_box(next), &params),
            BatchSize::SmallInput,
        )
    });
    // The same request again (a retry, or a client resending): every segment memoised.
    g.bench_function("estimate_openai_chat_repeat", |b| {
        b.iter(|| estimate_openai_chat(black_box(&req), &params))
    });
    g.bench_function("count_tokens_all_message_text", |b| {
        b.iter(|| count_tokens(black_box(&text)))
    });
    // The merge itself: the same text with this thread's piece memo emptied before each run,
    // so every piece that is not a single token is merged again.
    g.bench_function("count_tokens_all_message_text_piece_memo_cold", |b| {
        b.iter_batched(
            clear_piece_memo,
            |()| count_tokens(black_box(&text)),
            BatchSize::SmallInput,
        )
    });
    // Hostile input: 4 KB of punctuation without spaces is one piece of the pattern, merged in
    // windows of 512 bytes (memo emptied each run).
    let symbols: String = "#!$%&*+=?@^|~<>".chars().cycle().take(4096).collect();
    g.bench_function("count_tokens_4kb_symbol_run_cold", |b| {
        b.iter_batched(
            clear_piece_memo,
            |()| count_tokens(black_box(&symbols)),
            BatchSize::SmallInput,
        )
    });
    g.bench_function("parse_request_for_scale", |b| {
        b.iter(|| serde_json::from_slice::<ChatRequest>(black_box(&body)).unwrap())
    });
    g.finish();
}

criterion_group!(benches, bench_estimate);
criterion_main!(benches);
