"""Drives the mock's Bedrock runtime with the official boto3 client and the anthropic SDK's
AnthropicBedrock, and prints one JSON line (issue 11, item 5: the mock's wire format is the
vendor's, proven by the vendor's own SDKs).

Usage: bedrock_client.py --endpoint http://127.0.0.1:PORT --region us-east-1
                         --access-key AKID --secret-key SECRET
Model ids with faults injected by the driver (tests/tests/vendor_sdk.rs): throttled.*,
quota.*, notready.* (HTTP errors), broken-stream.* (throttlingException frame after 3 deltas),
broken-invoke.* (modelStreamErrorException frame after 2 deltas).
Retries are off (botocore total_max_attempts=1, anthropic max_retries=0) so no SDK retry hides
a mock bug. Output: {"sdk": "boto3", "versions": {...}, "checks": {name: {"ok": bool, ...}}}.
"""

import argparse
import base64
import json
import sys
import time
import traceback

import anthropic
import boto3
import botocore
from botocore.config import Config
from botocore.exceptions import ClientError, EventStreamError

BASE = "anthropic.claude-sonnet-4-20250514-v1:0"
PROFILE = "us.anthropic.claude-sonnet-4-20250514-v1:0"
ARN = (
    "arn:aws:bedrock:us-east-1:123456789012:inference-profile/"
    "global.anthropic.claude-sonnet-4-20250514-v1:0"
)
WEATHER = {
    "toolSpec": {
        "name": "get_weather",
        "description": "Current weather for a city.",
        "inputSchema": {
            "json": {
                "type": "object",
                "properties": {"city": {"type": "string"}},
                "required": ["city"],
            }
        },
    }
}


def client(a, secret=None, key=None, token=None):
    return boto3.client(
        "bedrock-runtime",
        endpoint_url=a.endpoint,
        region_name=a.region,
        aws_access_key_id=key or a.access_key,
        aws_secret_access_key=secret or a.secret_key,
        aws_session_token=token,
        config=Config(retries={"total_max_attempts": 1}, read_timeout=30, connect_timeout=5),
    )


def user(text):
    return [{"role": "user", "content": [{"text": text}]}]


def converse(c):
    r = c.converse(modelId=BASE, messages=user("say hello"), inferenceConfig={"maxTokens": 64})
    content = r["output"]["message"]["content"]
    return {
        "role": r["output"]["message"]["role"],
        "text": "".join(b.get("text", "") for b in content),
        "stop_reason": r["stopReason"],
        "usage": r["usage"],
        "latency_ms": r["metrics"]["latencyMs"],
        "request_id": r["ResponseMetadata"]["RequestId"],
        "status": r["ResponseMetadata"]["HTTPStatusCode"],
    }


def converse_cache(c):
    system = [{"text": "You are a careful assistant. " * 20}, {"cachePoint": {"type": "default"}}]
    first = c.converse(modelId=PROFILE, system=system, messages=user("first question"))
    second = c.converse(modelId=PROFILE, system=system, messages=user("second question here"))
    return {"first": first["usage"], "second": second["usage"]}


def converse_tools(c):
    r = c.converse(
        modelId=ARN,
        messages=user("weather in Paris?"),
        toolConfig={"tools": [WEATHER], "toolChoice": {"auto": {}}},
    )
    uses = [b["toolUse"] for b in r["output"]["message"]["content"] if "toolUse" in b]
    return {
        "stop_reason": r["stopReason"],
        "names": [u["name"] for u in uses],
        "input_is_dict": bool(uses) and isinstance(uses[0]["input"], dict),
        "tool_use_id": uses[0]["toolUseId"] if uses else None,
    }


def converse_stream(c, model, tools=False):
    kwargs = {"modelId": model, "messages": user("tell me a story")}
    if tools:
        kwargs["toolConfig"] = {"tools": [WEATHER]}
    r = c.converse_stream(**kwargs)
    kinds, text, tool_input, names = [], "", "", []
    stop, usage, metrics, role = None, None, None, None
    for event in r["stream"]:
        (kind, body), = event.items()
        kinds.append(kind)
        if kind == "messageStart":
            role = body["role"]
        elif kind == "contentBlockStart":
            names.append(body["start"]["toolUse"]["name"])
        elif kind == "contentBlockDelta":
            text += body["delta"].get("text", "")
            tool_input += body["delta"].get("toolUse", {}).get("input", "")
        elif kind == "messageStop":
            stop = body["stopReason"]
        elif kind == "metadata":
            usage, metrics = body["usage"], body["metrics"]
    return {
        "content_type": r["ResponseMetadata"]["HTTPHeaders"].get("content-type"),
        "first": kinds[0] if kinds else None,
        "last": kinds[-1] if kinds else None,
        "deltas": kinds.count("contentBlockDelta"),
        "role": role,
        "text": text,
        "tool_names": names,
        "tool_input": tool_input,
        "stop_reason": stop,
        "usage": usage,
        "latency_ms": metrics and metrics["latencyMs"],
    }


def anthropic_body(text, **extra):
    body = {
        "anthropic_version": "bedrock-2023-05-31",
        "max_tokens": 64,
        "messages": [{"role": "user", "content": text}],
    }
    body.update(extra)
    return json.dumps(body)


def invoke(c):
    r = c.invoke_model(modelId=ARN, body=anthropic_body("say hello"))
    msg = json.loads(r["body"].read())
    headers = r["ResponseMetadata"]["HTTPHeaders"]
    return {
        "type": msg["type"],
        "model": msg["model"],
        "text": "".join(b["text"] for b in msg["content"] if b["type"] == "text"),
        "usage": msg["usage"],
        "input_header": headers.get("x-amzn-bedrock-input-token-count"),
        "output_header": headers.get("x-amzn-bedrock-output-token-count"),
    }


def invoke_stream(c, model=PROFILE):
    r = c.invoke_model_with_response_stream(modelId=model, body=anthropic_body("tell me a story"))
    types, text, metrics, usage = [], "", None, None
    for event in r["body"]:
        inner = json.loads(base64.b64decode(event["chunk"]["bytes"]) if isinstance(
            event["chunk"]["bytes"], str) else event["chunk"]["bytes"])
        types.append(inner["type"])
        if inner["type"] == "content_block_delta":
            text += inner["delta"].get("text", "")
        if inner["type"] == "message_delta":
            usage = inner.get("usage")
        if inner["type"] == "message_stop":
            metrics = inner.get("amazon-bedrock-invocationMetrics")
    return {
        "content_type": r["contentType"],
        "types": types,
        "text": text,
        "usage": usage,
        "metrics": metrics,
    }


def expect_client_error(fn):
    try:
        fn()
    except ClientError as e:
        return {
            "code": e.response["Error"]["Code"],
            "message": e.response["Error"]["Message"],
            "status": e.response["ResponseMetadata"]["HTTPStatusCode"],
        }
    return {"code": None, "status": 200}


def stream_exception(c):
    r = c.converse_stream(modelId="broken-stream.model-v1:0", messages=user("hi"))
    deltas = 0
    try:
        for event in r["stream"]:
            if "contentBlockDelta" in event:
                deltas += 1
    except EventStreamError as e:
        return {
            "status": r["ResponseMetadata"]["HTTPStatusCode"],
            "deltas_before": deltas,
            "code": e.response["Error"]["Code"],
            "message": e.response["Error"]["Message"],
        }
    return {"status": r["ResponseMetadata"]["HTTPStatusCode"], "deltas_before": deltas,
            "code": None}


def invoke_stream_exception(c):
    r = c.invoke_model_with_response_stream(
        modelId="broken-invoke.model-v1:0", body=anthropic_body("hi"))
    deltas = 0
    try:
        for event in r["body"]:
            inner = json.loads(event["chunk"]["bytes"])
            deltas += inner["type"] == "content_block_delta"
    except EventStreamError as e:
        return {"status": r["ResponseMetadata"]["HTTPStatusCode"], "deltas_before": deltas,
                "code": e.response["Error"]["Code"], "message": e.response["Error"]["Message"]}
    return {"status": r["ResponseMetadata"]["HTTPStatusCode"], "deltas_before": deltas,
            "code": None}


def anthropic_bedrock_stream_exception(a):
    c = anthropic.AnthropicBedrock(
        aws_access_key=a.access_key, aws_secret_key=a.secret_key, aws_region=a.region,
        base_url=a.endpoint, max_retries=0, timeout=30)
    text = ""
    try:
        with c.messages.stream(model="broken-invoke.model-v1:0", max_tokens=64,
                               messages=[{"role": "user", "content": "hi"}]) as s:
            for chunk in s.text_stream:
                text += chunk
    except anthropic.APIError as e:
        body = getattr(e, "body", None)
        return {"text_before": text, "exception": type(e).__name__,
                "error_type": body.get("error", {}).get("type") if isinstance(body, dict) else None}
    return {"text_before": text, "exception": None}


def sts_then_converse(a):
    sts = boto3.client(
        "sts",
        endpoint_url=a.endpoint,
        region_name=a.region,
        aws_access_key_id="unused",
        aws_secret_access_key="unused",
        config=Config(retries={"total_max_attempts": 1}),
    )
    claims = {"sub": "system:serviceaccount:switchyard:router", "aud": "sts.amazonaws.com",
              "iss": "https://oidc.example.invalid", "exp": int(time.time()) + 600}
    seg = lambda d: base64.urlsafe_b64encode(json.dumps(d).encode()).rstrip(b"=").decode()  # noqa: E731
    jwt = f"{seg({'alg': 'RS256', 'typ': 'JWT'})}.{seg(claims)}.c2lnbmF0dXJl"
    r = sts.assume_role_with_web_identity(
        RoleArn="arn:aws:iam::123456789012:role/switchyard-bedrock",
        RoleSessionName="switchyard-test",
        WebIdentityToken=jwt,
    )
    creds = r["Credentials"]
    c = client(a, key=creds["AccessKeyId"], secret=creds["SecretAccessKey"],
               token=creds["SessionToken"])
    out = converse(c)
    forged = client(a, key=creds["AccessKeyId"], secret=creds["SecretAccessKey"],
                    token=creds["SessionToken"][:-4] + "AAAA")
    return {
        "access_key_prefix": creds["AccessKeyId"][:4],
        "expires_in_s": int(creds["Expiration"].timestamp() - time.time()),
        "assumed_role_arn": r["AssumedRoleUser"]["Arn"],
        "converse_text": out["text"],
        "forged_token": expect_client_error(
            lambda: forged.converse(modelId=BASE, messages=user("hi"))),
    }


def anthropic_bedrock(a):
    c = anthropic.AnthropicBedrock(
        aws_access_key=a.access_key,
        aws_secret_key=a.secret_key,
        aws_region=a.region,
        base_url=a.endpoint,
        max_retries=0,
        timeout=30,
    )
    m = c.messages.create(model=PROFILE, max_tokens=64, messages=[{"role": "user", "content": "hi"}])
    with c.messages.stream(model=ARN, max_tokens=64,
                           messages=[{"role": "user", "content": "tell me a story"}]) as s:
        streamed = "".join(s.text_stream)
        final = s.get_final_message()
    wrong = anthropic.AnthropicBedrock(
        aws_access_key=a.access_key, aws_secret_key="wrong-secret", aws_region=a.region,
        base_url=a.endpoint, max_retries=0, timeout=30)
    try:
        wrong.messages.create(model=BASE, max_tokens=8, messages=[{"role": "user", "content": "x"}])
        wrong_status = 200
        wrong_exc = None
    except anthropic.APIStatusError as e:
        wrong_status, wrong_exc = e.status_code, type(e).__name__
    return {
        "create_text": "".join(b.text for b in m.content if b.type == "text"),
        "create_model": m.model,
        "create_usage": {"input": m.usage.input_tokens, "output": m.usage.output_tokens},
        "stream_text": streamed,
        "stream_stop_reason": final.stop_reason,
        "stream_output_tokens": final.usage.output_tokens,
        "wrong_secret_status": wrong_status,
        "wrong_secret_exception": wrong_exc,
    }


def run(name, fn, out):
    try:
        facts = fn()
        facts["ok"] = True
    except Exception as e:  # noqa: BLE001 - every failure is reported, not raised
        facts = {"ok": False, "error": f"{type(e).__name__}: {e}", "trace": traceback.format_exc()}
    out[name] = facts


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--endpoint", required=True)
    ap.add_argument("--region", default="us-east-1")
    ap.add_argument("--access-key", required=True)
    ap.add_argument("--secret-key", required=True)
    a = ap.parse_args()
    c = client(a)
    out = {}
    run("converse", lambda: converse(c), out)
    run("converse_cache", lambda: converse_cache(c), out)
    run("converse_tools", lambda: converse_tools(c), out)
    run("converse_stream", lambda: converse_stream(c, PROFILE), out)
    run("converse_stream_tools", lambda: converse_stream(c, BASE, tools=True), out)
    run("invoke", lambda: invoke(c), out)
    run("invoke_stream", lambda: invoke_stream(c), out)
    run("wrong_secret", lambda: expect_client_error(
        lambda: client(a, secret="wrong-secret").converse(modelId=BASE, messages=user("hi"))), out)
    run("unknown_key", lambda: expect_client_error(
        lambda: client(a, key="AKIAUNKNOWNKEY000000").converse(modelId=BASE, messages=user("hi"))),
        out)
    run("wrong_region", lambda: expect_client_error(
        lambda: boto3.client(
            "bedrock-runtime", endpoint_url=a.endpoint, region_name="eu-west-1",
            aws_access_key_id=a.access_key, aws_secret_access_key=a.secret_key,
            config=Config(retries={"total_max_attempts": 1}),
        ).converse(modelId=BASE, messages=user("hi"))), out)
    run("throttled", lambda: expect_client_error(
        lambda: c.converse(modelId="throttled.model-v1:0", messages=user("hi"))), out)
    run("quota", lambda: expect_client_error(
        lambda: c.converse(modelId="quota.model-v1:0", messages=user("hi"))), out)
    run("not_ready", lambda: expect_client_error(
        lambda: c.invoke_model(modelId="notready.model-v1:0", body=anthropic_body("hi"))), out)
    run("invoke_no_version", lambda: expect_client_error(
        lambda: c.invoke_model(modelId=BASE, body=json.dumps(
            {"max_tokens": 8, "messages": [{"role": "user", "content": "hi"}]}))), out)
    run("stream_exception", lambda: stream_exception(c), out)
    run("invoke_stream_exception", lambda: invoke_stream_exception(c), out)
    run("anthropic_bedrock_stream_exception", lambda: anthropic_bedrock_stream_exception(a), out)
    run("sts", lambda: sts_then_converse(a), out)
    run("anthropic_bedrock", lambda: anthropic_bedrock(a), out)
    versions = {"boto3": boto3.__version__, "botocore": botocore.__version__,
                "anthropic": anthropic.__version__}
    print(json.dumps({"sdk": "boto3", "versions": versions, "checks": out}, default=str))
    sys.stdout.flush()


if __name__ == "__main__":
    main()
