"""Drives a Switchyard router's Responses API (`POST /v1/responses`), `GET /v1/models/{id}`
and Anthropic `POST /v1/messages/count_tokens` with the official OpenAI and Anthropic Python
SDKs, and prints one JSON line.

Usage: openai_responses.py --base-url http://127.0.0.1:PORT --api-key KEY --model M [--model M2 ...]

For every model: a plain `client.responses.create`, a streamed one (`stream=True`, the typed
events collected), a function tool call round trip (the call, then its `function_call_output`
sent back), a streamed tool call, the refusal of `previous_response_id`, `models.retrieve`.
Once: `models.retrieve` of an unknown model and `messages.count_tokens`. The output is
{"checks": {name: {"ok": bool, ...facts}}}; tests/tests/responses.rs asserts on the facts.
"""

import argparse
import json
import sys
import traceback

import anthropic
import openai

WEATHER = {
    "type": "function",
    "name": "get_weather",
    "description": "Current weather for a city.",
    "parameters": {
        "type": "object",
        "properties": {"city": {"type": "string"}},
        "required": ["city"],
    },
}


def usage(u):
    if u is None:
        return None
    return {
        "input_tokens": u.input_tokens,
        "output_tokens": u.output_tokens,
        "total_tokens": u.total_tokens,
        "cached_tokens": u.input_tokens_details.cached_tokens,
    }


def create(client, model):
    raw = client.responses.with_raw_response.create(
        model=model,
        instructions="Answer briefly.",
        input="say hello",
        max_output_tokens=32,
        metadata={"run": "e2e"},
    )
    r = raw.parse()
    return {
        "id": r.id,
        "object": r.object,
        "status": r.status,
        "model": r.model,
        "created_at": r.created_at,
        "output_types": [o.type for o in r.output],
        "output_text": r.output_text,
        "metadata": r.metadata,
        "usage": usage(r.usage),
        "provider_header": raw.headers.get("x-switchyard-provider"),
    }


def stream(client, model):
    events = client.responses.create(
        model=model,
        input=[{"role": "user", "content": [{"type": "input_text", "text": "tell me a story"}]}],
        max_output_tokens=32,
        stream=True,
    )
    types = []
    seqs = []
    deltas = []
    done_text = None
    completed = None
    for ev in events:
        types.append(ev.type)
        seqs.append(ev.sequence_number)
        if ev.type == "response.output_text.delta":
            deltas.append(ev.delta)
        elif ev.type == "response.output_text.done":
            done_text = ev.text
        elif ev.type == "response.completed":
            completed = ev.response
    return {
        "types": types,
        "sequence_ok": seqs == list(range(len(seqs))),
        "delta_text": "".join(deltas),
        "done_text": done_text,
        "completed_status": completed.status if completed else None,
        "completed_text": completed.output_text if completed else None,
        "usage": usage(completed.usage) if completed else None,
    }


def tool_round_trip(client, model):
    first = client.responses.create(
        model=model, input="what is the weather in Paris?", tools=[WEATHER], max_output_tokens=64
    )
    calls = [o for o in first.output if o.type == "function_call"]
    call = calls[0]
    second = client.responses.create(
        model=model,
        input=[
            {"role": "user", "content": "what is the weather in Paris?"},
            {
                "type": "function_call",
                "call_id": call.call_id,
                "name": call.name,
                "arguments": call.arguments,
            },
            {"type": "function_call_output", "call_id": call.call_id, "output": "sunny, 21 C"},
        ],
        tools=[WEATHER],
        max_output_tokens=64,
    )
    return {
        "calls": len(calls),
        "name": call.name,
        "call_id_set": bool(call.call_id),
        "arguments_json": isinstance(json.loads(call.arguments), dict),
        "second_output_types": [o.type for o in second.output],
        "second_text": second.output_text,
        "second_status": second.status,
    }


def tool_stream(client, model):
    events = client.responses.create(
        model=model, input="what is the weather in Paris?", tools=[WEATHER], stream=True
    )
    types = []
    added = []
    args_done = []
    for ev in events:
        types.append(ev.type)
        if ev.type == "response.output_item.added":
            added.append(ev.item.type)
        if ev.type == "response.function_call_arguments.done":
            args_done.append(ev.arguments)
    return {
        "added": added,
        "args_done_json": [isinstance(json.loads(a), dict) for a in args_done],
        "last": types[-1] if types else None,
    }


def previous_response(client, model):
    try:
        client.responses.create(model=model, input="again", previous_response_id="resp_123")
    except openai.BadRequestError as e:
        return {
            "exception": type(e).__name__,
            "status": e.status_code,
            "param": e.param,
            "code": e.code,
            "type": e.type,
            "message": e.message,
        }
    return {"exception": None}


def builtin_tool(client, model):
    try:
        client.responses.create(model=model, input="x", tools=[{"type": "web_search"}])
    except openai.BadRequestError as e:
        return {"exception": type(e).__name__, "param": e.param}
    return {"exception": None}


def retrieve(client, model):
    m = client.models.retrieve(model)
    return {"id": m.id, "object": m.object}


def retrieve_unknown(client):
    try:
        client.models.retrieve("no-such-model")
    except openai.NotFoundError as e:
        return {"exception": type(e).__name__, "status": e.status_code, "code": e.code}
    return {"exception": None}


def count_tokens(base_url, api_key, model):
    client = anthropic.Anthropic(base_url=base_url, api_key=api_key, max_retries=0, timeout=30)
    short = client.messages.count_tokens(
        model=model, messages=[{"role": "user", "content": "hello"}]
    )
    long = client.messages.count_tokens(
        model=model,
        system="You are a careful assistant.",
        messages=[{"role": "user", "content": "hello " * 200}],
    )
    return {"short": short.input_tokens, "long": long.input_tokens}


def run(name, fn, out):
    try:
        facts = fn()
        facts["ok"] = True
    except Exception as e:  # noqa: BLE001 - every failure is reported, not raised
        facts = {"ok": False, "error": f"{type(e).__name__}: {e}", "trace": traceback.format_exc()}
    out[name] = facts


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--base-url", required=True)
    ap.add_argument("--api-key", required=True)
    ap.add_argument("--model", action="append", required=True)
    a = ap.parse_args()
    base = a.base_url.rstrip("/")
    client = openai.OpenAI(base_url=base + "/v1", api_key=a.api_key, max_retries=0, timeout=30)
    out = {}
    for m in a.model:
        run(f"create/{m}", lambda: create(client, m), out)
        run(f"stream/{m}", lambda: stream(client, m), out)
        run(f"tool_round_trip/{m}", lambda: tool_round_trip(client, m), out)
        run(f"tool_stream/{m}", lambda: tool_stream(client, m), out)
        run(f"previous_response/{m}", lambda: previous_response(client, m), out)
        run(f"builtin_tool/{m}", lambda: builtin_tool(client, m), out)
        run(f"retrieve/{m}", lambda: retrieve(client, m), out)
    run("retrieve_unknown", lambda: retrieve_unknown(client), out)
    run("count_tokens", lambda: count_tokens(base, a.api_key, a.model[0]), out)
    print(json.dumps({"openai": openai.__version__, "anthropic": anthropic.__version__, "checks": out}))
    sys.stdout.flush()


if __name__ == "__main__":
    main()
