#!/usr/bin/env bash
# Creates (or refreshes) the Python venv at <repo>/.venv with the pinned official OpenAI and
# Anthropic SDKs, the vendor clients for Bedrock and Vertex AI (boto3, google-genai,
# google-auth; tests/tests/vendor_sdk.rs) and the chart-check tools (helm-python-sdk, kubernetes-validate) from
# tests/python/requirements.txt. The e2e tests in tests/tests/sdk.rs run
# their client scripts with <repo>/.venv/bin/python (override with SWITCHYARD_PYTHON).
#
# Idempotent: when the venv exists and already satisfies the requirements file (checked by a
# stamp holding the file's hash), it does nothing.
set -euo pipefail

root="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
venv="$root/.venv"
req="$root/tests/python/requirements.txt"
stamp="$venv/.requirements.sha256"
python="${PYTHON:-python3}"

want="$(sha256sum "$req" | cut -d' ' -f1)"
if [[ -x "$venv/bin/python" && -f "$stamp" && "$(cat "$stamp")" == "$want" ]]; then
    echo "venv: $venv is up to date"
    exit 0
fi

if [[ ! -x "$venv/bin/python" ]]; then
    echo "venv: creating $venv with $("$python" --version 2>&1)"
    "$python" -m venv "$venv"
fi
"$venv/bin/python" -m pip install --quiet --disable-pip-version-check --upgrade pip
"$venv/bin/python" -m pip install --quiet --disable-pip-version-check -r "$req"
echo "$want" > "$stamp"
"$venv/bin/python" -c 'import openai, anthropic; print("venv: openai", openai.__version__, "anthropic", anthropic.__version__)'
"$venv/bin/python" -c 'import boto3, google.auth, google.genai; print("venv: boto3", boto3.__version__, "google-genai", google.genai.__version__, "google-auth", google.auth.__version__)'
"$venv/bin/python" -c 'import helm_python; print("venv: helm-python-sdk", helm_python.__version__, "(Helm SDK", helm_python.helm_sdk_version() + ")")'
"$venv/bin/python" -c 'from opentelemetry.proto.collector.trace.v1 import trace_service_pb2; print("venv: opentelemetry-proto ok")'
