"""Drives a Switchyard router with the official Anthropic Python SDK and prints one JSON line.

Usage: anthropic_client.py --base-url http://127.0.0.1:PORT --api-key KEY --model M
                           [--cross-model M2]
(or SWITCHYARD_URL / SWITCHYARD_KEY). The SDK appends /v1/messages to the base URL and sends
the key as `x-api-key`. max_retries=0 so SDK retries never hide a router bug. Output:
{"sdk": "anthropic", "version": ..., "checks": {name: {"ok": bool, ...facts}}}.
"""

import argparse
import json
import os
import sys
import traceback

import anthropic

WEATHER_TOOL = {
    "name": "get_weather",
    "description": "Current weather for a city.",
    "input_schema": {
        "type": "object",
        "properties": {"city": {"type": "string"}},
        "required": ["city"],
    },
}


def messages(text):
    return [{"role": "user", "content": text}]


def create(client, model):
    raw = client.messages.with_raw_response.create(
        model=model, max_tokens=64, messages=messages("say hello")
    )
    m = raw.parse()
    texts = [b.text for b in m.content if b.type == "text"]
    return {
        "id": m.id,
        "type": m.type,
        "role": m.role,
        "text": "".join(texts),
        "stop_reason": m.stop_reason,
        "input_tokens": m.usage.input_tokens,
        "output_tokens": m.usage.output_tokens,
        "provider_header": raw.headers.get("x-switchyard-provider"),
        "attempts_header": raw.headers.get("x-switchyard-attempts"),
        "request_id_header": raw.headers.get("x-request-id"),
    }


def stream_helper(client, model):
    # The high-level helper accumulates events into a final message.
    counts = {}
    with client.messages.stream(
        model=model, max_tokens=64, messages=messages("tell me a story")
    ) as s:
        for event in s:
            counts[event.type] = counts.get(event.type, 0) + 1
        final = s.get_final_message()
    return {
        "events": counts,
        "text": "".join(b.text for b in final.content if b.type == "text"),
        "stop_reason": final.stop_reason,
        "input_tokens": final.usage.input_tokens,
        "output_tokens": final.usage.output_tokens,
    }


def stream_raw(client, model):
    # The low-level stream: exactly the server's events, parsed by the SDK.
    counts = {}
    text = []
    for event in client.messages.create(
        model=model, max_tokens=64, messages=messages("tell me a story"), stream=True
    ):
        counts[event.type] = counts.get(event.type, 0) + 1
        if event.type == "content_block_delta" and event.delta.type == "text_delta":
            text.append(event.delta.text)
    return {"events": counts, "text": "".join(text)}


def tools(client, model):
    m = client.messages.create(
        model=model,
        max_tokens=128,
        tools=[WEATHER_TOOL],
        messages=messages("what is the weather in Paris?"),
    )
    uses = [b for b in m.content if b.type == "tool_use"]
    return {
        "stop_reason": m.stop_reason,
        "tool_uses": len(uses),
        "name": uses[0].name if uses else None,
        "input_is_dict": bool(uses) and isinstance(uses[0].input, dict),
    }


def bad_key(base_url, model):
    c = anthropic.Anthropic(base_url=base_url, api_key="sk-wrong", max_retries=0, timeout=30)
    try:
        c.messages.create(model=model, max_tokens=16, messages=messages("hi"))
    except anthropic.AuthenticationError as e:
        return {"status": e.status_code, "exception": type(e).__name__}
    return {"status": 200, "exception": None}


def run(name, fn, out):
    try:
        facts = fn()
        facts["ok"] = True
    except Exception as e:  # noqa: BLE001 - every failure is reported, not raised
        facts = {"ok": False, "error": f"{type(e).__name__}: {e}", "trace": traceback.format_exc()}
    out[name] = facts


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--base-url", default=os.environ.get("SWITCHYARD_URL"))
    ap.add_argument("--api-key", default=os.environ.get("SWITCHYARD_KEY"))
    ap.add_argument("--model", required=True)
    ap.add_argument("--cross-model", help="model served by an OpenAI-compatible provider")
    a = ap.parse_args()
    if not a.base_url or not a.api_key:
        ap.error("--base-url and --api-key (or SWITCHYARD_URL / SWITCHYARD_KEY) are required")
    base = a.base_url.rstrip("/")
    client = anthropic.Anthropic(base_url=base, api_key=a.api_key, max_retries=0, timeout=30)
    out = {}
    run("create", lambda: create(client, a.model), out)
    run("stream_helper", lambda: stream_helper(client, a.model), out)
    run("stream_raw", lambda: stream_raw(client, a.model), out)
    run("tools", lambda: tools(client, a.model), out)
    if a.cross_model:
        run("cross_create", lambda: create(client, a.cross_model), out)
        run("cross_stream_raw", lambda: stream_raw(client, a.cross_model), out)
    run("bad_key", lambda: bad_key(base, a.model), out)
    print(json.dumps({"sdk": "anthropic", "version": anthropic.__version__, "checks": out}))
    sys.stdout.flush()


if __name__ == "__main__":
    main()
