"""Drives the mock's Vertex AI paths with the official clients and prints one JSON line:
google-auth service-account credentials (JWT-bearer grant at the mock's /token), the anthropic
SDK's AnthropicVertex (Claude rawPredict / streamRawPredict) and google-genai in Vertex mode
(Gemini generateContent / streamGenerateContent?alt=sse) (issue 11, item 5).

Usage: vertex_client.py --base-url http://127.0.0.1:PORT --key-file vertex-test-sa.json
                        --untrusted-key-file vertex-test-sa-untrusted.json
The key files' token_uri is rewritten to <base-url>/token in memory. Models with faults
injected by the driver (tests/tests/vendor_sdk.rs): gemini-exhausted (shared capacity),
gemini-quota (project quota), gemini-pt (provisioned throughput). Retries are off.
Output: {"sdk": "vertex", "versions": {...}, "checks": {name: {"ok": bool, ...}}}.
"""

import argparse
import base64
import json
import os
import sys
import traceback

import anthropic
import google.auth
import google.auth.transport.requests
from google import genai
from google.genai import errors as genai_errors
from google.genai import types
from google.oauth2 import service_account

PROJECT = "switchyard-test"
CLAUDE = "claude-sonnet-4@20250514"
GEMINI = "gemini-2.5-flash"
SCOPES = ["https://www.googleapis.com/auth/cloud-platform"]


def credentials(key_file, base_url):
    with open(key_file) as f:
        info = json.load(f)
    info["token_uri"] = f"{base_url}/token"
    return service_account.Credentials.from_service_account_info(info, scopes=SCOPES)


def token_grant(a):
    creds = credentials(a.key_file, a.base_url)
    creds.refresh(google.auth.transport.requests.Request())
    bad = credentials(a.untrusted_key_file, a.base_url)
    try:
        bad.refresh(google.auth.transport.requests.Request())
        untrusted = None
    except google.auth.exceptions.RefreshError as e:
        untrusted = str(e)
    return {
        "token_prefix": creds.token[:10],
        "expiry_set": creds.expiry is not None,
        "valid": creds.valid,
        "untrusted_error": untrusted,
    }


def metadata_token(a):
    # google-auth reads GCE_METADATA_HOST (set by the driver) at import time.
    from google.auth import compute_engine

    creds = compute_engine.Credentials()
    creds.refresh(google.auth.transport.requests.Request())
    return {"token_prefix": creds.token[:10], "email": creds.service_account_email}


def anthropic_vertex(a, creds):
    c = anthropic.AnthropicVertex(
        project_id=PROJECT, region="us-east5", base_url=f"{a.base_url}/v1",
        credentials=creds, max_retries=0, timeout=30)
    system = [{"type": "text", "text": "You are terse. " * 30, "cache_control": {"type": "ephemeral"}}]
    m1 = c.messages.create(model=CLAUDE, max_tokens=64, system=system,
                           messages=[{"role": "user", "content": "hello"}])
    m2 = c.messages.create(model=CLAUDE, max_tokens=64, system=system,
                           messages=[{"role": "user", "content": "hello again"}])
    with c.messages.stream(model=CLAUDE, max_tokens=64,
                           messages=[{"role": "user", "content": "tell me a story"}]) as s:
        streamed = "".join(s.text_stream)
        final = s.get_final_message()
    tool = c.messages.create(
        model=CLAUDE, max_tokens=64,
        tools=[{"name": "get_weather", "description": "weather",
                "input_schema": {"type": "object", "properties": {"city": {"type": "string"}}}}],
        messages=[{"role": "user", "content": "weather in Paris?"}])
    bad = anthropic.AnthropicVertex(
        project_id=PROJECT, region="us-east5", base_url=f"{a.base_url}/v1",
        access_token="ya29.not-a-real-token", max_retries=0, timeout=30)
    try:
        bad.messages.create(model=CLAUDE, max_tokens=8, messages=[{"role": "user", "content": "x"}])
        bad_status, bad_exc, bad_body = 200, None, None
    except anthropic.APIStatusError as e:
        bad_status, bad_exc, bad_body = e.status_code, type(e).__name__, e.body
    return {
        "text": "".join(b.text for b in m1.content if b.type == "text"),
        "model": m1.model,
        "first_usage": m1.usage.model_dump(),
        "second_usage": m2.usage.model_dump(),
        "stream_text": streamed,
        "stream_stop_reason": final.stop_reason,
        "stream_output_tokens": final.usage.output_tokens,
        "tool_stop_reason": tool.stop_reason,
        "tool_names": [b.name for b in tool.content if b.type == "tool_use"],
        "bad_token_status": bad_status,
        "bad_token_exception": bad_exc,
        "bad_token_body": bad_body,
    }


def genai_client(a, creds, location="us-central1"):
    return genai.Client(
        vertexai=True, project=PROJECT, location=location, credentials=creds,
        http_options=types.HttpOptions(
            base_url=a.base_url, api_version="v1",
            retry_options=types.HttpRetryOptions(attempts=1), timeout=30_000))


def usage(u):
    return {
        "prompt": u.prompt_token_count,
        "cached": u.cached_content_token_count,
        "candidates": u.candidates_token_count,
        "thoughts": u.thoughts_token_count,
        "total": u.total_token_count,
    }


def gemini(a, creds):
    c = genai_client(a, creds)
    cfg = types.GenerateContentConfig(system_instruction="You are a careful assistant. " * 10,
                                      max_output_tokens=64)
    r1 = c.models.generate_content(model=GEMINI, contents="first question", config=cfg)
    r2 = c.models.generate_content(
        model=GEMINI,
        contents=[types.Content(role="user", parts=[types.Part(text="first question")]),
                  types.Content(role="model", parts=[types.Part(text=r1.text)]),
                  types.Content(role="user", parts=[types.Part(text="and a second one")])],
        config=cfg)
    short = c.models.generate_content(
        model=GEMINI, contents="long answer please",
        config=types.GenerateContentConfig(max_output_tokens=3))
    return {
        "text": r1.text,
        "finish_reason": str(r1.candidates[0].finish_reason.value),
        "model_version": r1.model_version,
        "first_usage": usage(r1.usage_metadata),
        "second_usage": usage(r2.usage_metadata),
        "short_text": short.text,
        "short_finish_reason": str(short.candidates[0].finish_reason.value),
    }


def gemini_stream(a, creds):
    c = genai_client(a, creds, location="europe-west4")
    chunks, text, usages, finish = 0, "", [], None
    for ch in c.models.generate_content_stream(model=GEMINI, contents="tell me a story"):
        chunks += 1
        text += ch.text or ""
        if ch.usage_metadata:
            usages.append(usage(ch.usage_metadata))
        if ch.candidates and ch.candidates[0].finish_reason:
            finish = str(ch.candidates[0].finish_reason.value)
    return {"chunks": chunks, "text": text, "usages": usages, "finish_reason": finish}


def gemini_tools(a, creds):
    c = genai_client(a, creds)
    weather = types.FunctionDeclaration(
        name="get_weather", description="Current weather for a city.",
        parameters=types.Schema(type="OBJECT", properties={"city": types.Schema(type="STRING")}))
    cfg = types.GenerateContentConfig(
        tools=[types.Tool(function_declarations=[weather])],
        automatic_function_calling=types.AutomaticFunctionCallingConfig(disable=True))
    r = c.models.generate_content(model=GEMINI, contents="weather in Paris?", config=cfg)
    calls = r.function_calls or []
    after = c.models.generate_content(
        model=GEMINI,
        contents=[
            types.Content(role="user", parts=[types.Part(text="weather in Paris?")]),
            types.Content(role="model", parts=[types.Part(function_call=calls[0])]),
            types.Content(role="user", parts=[types.Part.from_function_response(
                name="get_weather", response={"temp_c": 18})]),
        ],
        config=cfg)
    streamed = []
    for ch in c.models.generate_content_stream(model=GEMINI, contents="weather?", config=cfg):
        streamed.extend(fc.name for fc in (ch.function_calls or []))
    return {
        "names": [fc.name for fc in calls],
        "args_is_dict": bool(calls) and isinstance(calls[0].args, dict),
        "after_result_text": after.text,
        "after_result_calls": len(after.function_calls or []),
        "stream_names": streamed,
    }


def gemini_json_and_audio(a, creds):
    c = genai_client(a, creds)
    schema = types.Schema(type="OBJECT", properties={
        "city": types.Schema(type="STRING"), "temp_c": types.Schema(type="INTEGER")})
    r = c.models.generate_content(
        model=GEMINI, contents="weather as JSON",
        config=types.GenerateContentConfig(response_mime_type="application/json",
                                           response_schema=schema))
    wav = base64.b64decode(a.audio_b64) if a.audio_b64 else b"RIFF" + bytes(31996)
    audio = c.models.generate_content(
        model=GEMINI,
        contents=[types.Content(role="user", parts=[
            types.Part(text="Transcribe this audio."),
            types.Part.from_bytes(data=wav, mime_type="audio/wav")])])
    return {
        "json": json.loads(r.text),
        "audio_text": audio.text,
        "audio_prompt_tokens": audio.usage_metadata.prompt_token_count,
        "audio_bytes": len(wav),
    }


def gemini_errors(a, creds):
    c = genai_client(a, creds)
    out = {}
    for model in ["gemini-exhausted", "gemini-quota", "gemini-pt"]:
        try:
            c.models.generate_content(model=model, contents="hi")
            out[model] = {"code": 200}
        except genai_errors.APIError as e:
            out[model] = {"code": e.code, "status": e.status, "message": e.message}
    bad = genai.Client(
        vertexai=True, project=PROJECT, location="us-central1",
        credentials=google.oauth2.credentials.Credentials("ya29.forged"),
        http_options=types.HttpOptions(base_url=a.base_url, api_version="v1",
                                       retry_options=types.HttpRetryOptions(attempts=1)))
    try:
        bad.models.generate_content(model=GEMINI, contents="hi")
        out["forged_token"] = {"code": 200}
    except genai_errors.APIError as e:
        out["forged_token"] = {"code": e.code, "status": e.status}
    return out


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
    ap.add_argument("--key-file", required=True)
    ap.add_argument("--untrusted-key-file", required=True)
    ap.add_argument("--audio-b64", default=None)
    a = ap.parse_args()
    a.base_url = a.base_url.rstrip("/")
    import google.oauth2.credentials  # noqa: F401 - used by gemini_errors

    creds = credentials(a.key_file, a.base_url)
    out = {}
    run("token_grant", lambda: token_grant(a), out)
    if os.environ.get("GCE_METADATA_HOST"):
        run("metadata_token", lambda: metadata_token(a), out)
    run("anthropic_vertex", lambda: anthropic_vertex(a, creds), out)
    run("gemini", lambda: gemini(a, creds), out)
    run("gemini_stream", lambda: gemini_stream(a, creds), out)
    run("gemini_tools", lambda: gemini_tools(a, creds), out)
    run("gemini_json_audio", lambda: gemini_json_and_audio(a, creds), out)
    run("gemini_errors", lambda: gemini_errors(a, creds), out)
    versions = {"google-genai": genai.__version__, "google-auth": google.auth.__version__,
                "anthropic": anthropic.__version__}
    print(json.dumps({"sdk": "vertex", "versions": versions, "checks": out}, default=str))
    sys.stdout.flush()


if __name__ == "__main__":
    main()
