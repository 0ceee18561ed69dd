"""Drives a Switchyard router with the official OpenAI Python SDK and prints one JSON line.

Usage: openai_client.py --base-url http://127.0.0.1:PORT --api-key KEY --chat-model M
                        [--cross-model M2] [--embed-model E]
(or SWITCHYARD_URL / SWITCHYARD_KEY in the environment).

Each check runs on its own; a failing check records its error and the others still run. The
output is {"sdk": "openai", "version": ..., "checks": {name: {"ok": bool, ...facts}}}. The client
has max_retries=0 so that SDK retries never hide a router bug. The Rust test (tests/tests/sdk.rs)
asserts on these facts; this script only reports what the SDK parsed.
"""

import argparse
import json
import os
import sys
import traceback

import openai

WEATHER_TOOL = {
    "type": "function",
    "function": {
        "name": "get_weather",
        "description": "Current weather for a city.",
        "parameters": {
            "type": "object",
            "properties": {"city": {"type": "string"}},
            "required": ["city"],
        },
    },
}


def messages(text):
    return [{"role": "user", "content": text}]


def chat(client, model):
    raw = client.chat.completions.with_raw_response.create(
        model=model, messages=messages("say hello"), max_tokens=32
    )
    r = raw.parse()
    return {
        "id": r.id,
        "object": r.object,
        "content": r.choices[0].message.content,
        "role": r.choices[0].message.role,
        "finish_reason": r.choices[0].finish_reason,
        "prompt_tokens": r.usage.prompt_tokens if r.usage else None,
        "completion_tokens": r.usage.completion_tokens if r.usage else None,
        "provider_header": raw.headers.get("x-switchyard-provider"),
        "attempts_header": raw.headers.get("x-switchyard-attempts"),
        "request_id_header": raw.headers.get("x-request-id"),
    }


def chat_stream(client, model, include_usage):
    kwargs = {}
    if include_usage:
        kwargs["stream_options"] = {"include_usage": True}
    stream = client.chat.completions.create(
        model=model, messages=messages("tell me a story"), max_tokens=32, stream=True, **kwargs
    )
    chunks = 0
    role_chunks = 0
    usage_chunks = 0
    usage = None
    text = []
    finish = []
    ids = set()
    for chunk in stream:
        chunks += 1
        ids.add(chunk.id)
        if chunk.usage is not None:
            usage_chunks += 1
            usage = {
                "prompt_tokens": chunk.usage.prompt_tokens,
                "completion_tokens": chunk.usage.completion_tokens,
            }
        for choice in chunk.choices:
            if choice.delta.role:
                role_chunks += 1
            if choice.delta.content:
                text.append(choice.delta.content)
            if choice.finish_reason:
                finish.append(choice.finish_reason)
    return {
        "chunks": chunks,
        "role_chunks": role_chunks,
        "usage_chunks": usage_chunks,
        "usage": usage,
        "content": "".join(text),
        "finish_reasons": finish,
        "distinct_ids": len(ids),
    }


def tools(client, model):
    r = client.chat.completions.create(
        model=model,
        messages=messages("what is the weather in Paris?"),
        tools=[WEATHER_TOOL],
        max_tokens=64,
    )
    msg = r.choices[0].message
    calls = msg.tool_calls or []
    return {
        "finish_reason": r.choices[0].finish_reason,
        "tool_calls": len(calls),
        "name": calls[0].function.name if calls else None,
        "arguments_json": bool(calls) and isinstance(json.loads(calls[0].function.arguments), dict),
        "call_id": calls[0].id if calls else None,
    }


def tools_stream(client, model):
    stream = client.chat.completions.create(
        model=model,
        messages=messages("what is the weather in Paris?"),
        tools=[WEATHER_TOOL],
        max_tokens=64,
        stream=True,
    )
    names = []
    args = {}
    finish = []
    for chunk in stream:
        for choice in chunk.choices:
            for tc in choice.delta.tool_calls or []:
                if tc.function and tc.function.name:
                    names.append(tc.function.name)
                if tc.function and tc.function.arguments:
                    args[tc.index] = args.get(tc.index, "") + tc.function.arguments
            if choice.finish_reason:
                finish.append(choice.finish_reason)
    parsed = [isinstance(json.loads(a), dict) for a in args.values()]
    return {"names": names, "arguments_json": parsed, "finish_reasons": finish}


def embeddings(client, model):
    # The SDK asks for base64 by default and decodes it; a float request is checked too.
    r = client.embeddings.create(model=model, input=["first text", "second text"])
    f = client.embeddings.create(model=model, input="one", encoding_format="float")
    return {
        "count": len(r.data),
        "dims": [len(d.embedding) for d in r.data],
        "indices": [d.index for d in r.data],
        "all_floats": all(isinstance(x, float) for d in r.data for x in d.embedding),
        "float_dims": len(f.data[0].embedding),
        "prompt_tokens": r.usage.prompt_tokens if r.usage else None,
    }


def models(client):
    return {"ids": sorted(m.id for m in client.models.list())}


def bad_key(base_url, model):
    c = openai.OpenAI(base_url=base_url, api_key="sk-wrong", max_retries=0, timeout=30)
    try:
        c.chat.completions.create(model=model, messages=messages("hi"))
    except openai.AuthenticationError as e:
        return {"status": e.status_code, "exception": type(e).__name__}
    return {"status": 200, "exception": None}


def unknown_model(client):
    try:
        client.chat.completions.create(model="no-such-model", messages=messages("hi"))
    except openai.NotFoundError as e:
        return {"status": e.status_code, "exception": type(e).__name__}
    except openai.APIStatusError as e:
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
    ap.add_argument("--chat-model", required=True)
    ap.add_argument("--cross-model", help="chat model served by an Anthropic provider")
    ap.add_argument("--embed-model")
    a = ap.parse_args()
    if not a.base_url or not a.api_key:
        ap.error("--base-url and --api-key (or SWITCHYARD_URL / SWITCHYARD_KEY) are required")
    base = a.base_url.rstrip("/") + "/v1"
    client = openai.OpenAI(base_url=base, api_key=a.api_key, max_retries=0, timeout=30)
    out = {}
    run("chat", lambda: chat(client, a.chat_model), out)
    run("chat_stream", lambda: chat_stream(client, a.chat_model, False), out)
    run("chat_stream_usage", lambda: chat_stream(client, a.chat_model, True), out)
    run("tools", lambda: tools(client, a.chat_model), out)
    run("tools_stream", lambda: tools_stream(client, a.chat_model), out)
    if a.cross_model:
        run("cross_chat", lambda: chat(client, a.cross_model), out)
        run("cross_stream_usage", lambda: chat_stream(client, a.cross_model, True), out)
        run("cross_tools", lambda: tools(client, a.cross_model), out)
    if a.embed_model:
        run("embeddings", lambda: embeddings(client, a.embed_model), out)
    run("models", lambda: models(client), out)
    run("bad_key", lambda: bad_key(base, a.chat_model), out)
    run("unknown_model", lambda: unknown_model(client), out)
    print(json.dumps({"sdk": "openai", "version": openai.__version__, "checks": out}))
    sys.stdout.flush()


if __name__ == "__main__":
    main()
