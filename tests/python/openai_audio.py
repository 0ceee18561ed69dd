"""Drives a Switchyard router's speech-to-text endpoint with the official OpenAI Python SDK
(`client.audio.transcriptions.create`) and prints one JSON line.

Usage: openai_audio.py --base-url http://127.0.0.1:PORT --api-key KEY --model M

The output is {"sdk": "openai", "version": ..., "checks": {name: {"ok": bool, ...facts}}}; each
check runs on its own. max_retries=0 so SDK retries never hide a router bug. The Rust test
(tests/tests/sdk.rs) asserts on these facts; this script only reports what the SDK parsed.
"""

import argparse
import io
import json
import os
import struct
import traceback

import openai


def silent_wav(millis):
    """RIFF/WAVE, 16 kHz mono 16-bit PCM silence."""
    data_len = 16 * millis * 2
    header = b"RIFF" + struct.pack("<I", 36 + data_len) + b"WAVEfmt "
    header += struct.pack("<IHHIIHH", 16, 1, 1, 16000, 32000, 2, 16)
    header += b"data" + struct.pack("<I", data_len)
    return header + b"\x00" * data_len


def transcribe_json(client, model):
    raw = client.audio.transcriptions.with_raw_response.create(
        model=model, file=("clip.wav", silent_wav(1000), "audio/wav"), language="ja"
    )
    r = raw.parse()
    usage = getattr(r, "usage", None)
    return {
        "type": type(r).__name__,
        "text": r.text,
        "usage_type": getattr(usage, "type", None),
        "input_tokens": getattr(usage, "input_tokens", None),
        "provider_header": raw.headers.get("x-switchyard-provider"),
        "attempts_header": raw.headers.get("x-switchyard-attempts"),
        "content_type": raw.headers.get("content-type"),
    }


def transcribe_text(client, model):
    # A file object, as most callers pass it.
    f = io.BytesIO(silent_wav(500))
    f.name = "clip.wav"
    r = client.audio.transcriptions.create(model=model, file=f, response_format="text")
    return {"type": type(r).__name__, "text": r}


def transcribe_unsupported_format(client, model):
    try:
        client.audio.transcriptions.create(
            model=model, file=("clip.wav", silent_wav(100), "audio/wav"), response_format="srt"
        )
    except openai.BadRequestError as e:
        body = e.body if isinstance(e.body, dict) else {}
        return {
            "status": e.status_code,
            "message": body.get("message") or str(e),
            "error_type": body.get("type"),
        }
    return {"status": None}


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--base-url", default=os.environ.get("SWITCHYARD_URL"))
    ap.add_argument("--api-key", default=os.environ.get("SWITCHYARD_KEY"))
    ap.add_argument("--model", required=True)
    args = ap.parse_args()
    client = openai.OpenAI(
        base_url=args.base_url.rstrip("/") + "/v1", api_key=args.api_key, max_retries=0, timeout=60
    )
    checks = {}
    for name, fn in [
        ("transcribe_json", transcribe_json),
        ("transcribe_text", transcribe_text),
        ("transcribe_unsupported_format", transcribe_unsupported_format),
    ]:
        try:
            checks[name] = {"ok": True, **fn(client, args.model)}
        except Exception as e:  # noqa: BLE001 - every failure is reported, not raised
            checks[name] = {"ok": False, "error": repr(e), "trace": traceback.format_exc()}
    print(json.dumps({"sdk": "openai", "version": openai.__version__, "checks": checks}))


if __name__ == "__main__":
    main()
