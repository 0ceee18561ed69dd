"""A minimal OTLP/HTTP trace receiver for the tracing tests (tests/tests/otel.rs).

Usage: otlp_receiver.py OUT.jsonl
       otlp_receiver.py --count COUNT.txt   (bench/load.sh: only count the spans)

Listens on 127.0.0.1 (a free port), prints `listening <port>` on stdout once ready, and serves
`POST /v1/traces` with `Content-Type: application/x-protobuf`. Each request body is decoded with
the official protobuf definitions (`opentelemetry-proto`) as an ExportTraceServiceRequest; every
span becomes one JSON line in OUT.jsonl:

    {"service": "...", "scope": "...", "name": "...", "kind": "SPAN_KIND_SERVER",
     "trace_id": "<32 hex>", "span_id": "<16 hex>", "parent_span_id": "<16 hex or empty>",
     "attributes": {"key": value, ...}, "status": "STATUS_CODE_UNSET"}

With `--count`, spans are decoded and counted but not written: COUNT.txt holds the running total
of spans received, rewritten after every export (what bench/load.sh compares with the requests
the traced router served, to see whether its exporter dropped any).

Anything else (another path, a body that does not decode) is answered 400 and logged to stderr,
so a malformed export fails the test instead of vanishing.
"""

import json
import sys
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from threading import Lock

from opentelemetry.proto.collector.trace.v1 import trace_service_pb2
from opentelemetry.proto.trace.v1 import trace_pb2

OUT_LOCK = Lock()
COUNT_ONLY = len(sys.argv) > 2 and sys.argv[1] == "--count"
OUT_PATH = sys.argv[2] if COUNT_ONLY else sys.argv[1]
SPANS_SEEN = 0


def any_value(v):
    """An OTLP AnyValue as a plain JSON value."""
    kind = v.WhichOneof("value")
    if kind is None:
        return None
    if kind == "array_value":
        return [any_value(x) for x in v.array_value.values]
    if kind == "kvlist_value":
        return {kv.key: any_value(kv.value) for kv in v.kvlist_value.values}
    if kind == "bytes_value":
        return v.bytes_value.hex()
    return getattr(v, kind)


def attributes(kvs):
    return {kv.key: any_value(kv.value) for kv in kvs}


def spans_of(request):
    for rs in request.resource_spans:
        resource = attributes(rs.resource.attributes)
        for ss in rs.scope_spans:
            for span in ss.spans:
                yield {
                    "service": resource.get("service.name"),
                    "scope": ss.scope.name,
                    "name": span.name,
                    "kind": trace_pb2.Span.SpanKind.Name(span.kind),
                    "trace_id": span.trace_id.hex(),
                    "span_id": span.span_id.hex(),
                    "parent_span_id": span.parent_span_id.hex(),
                    "attributes": attributes(span.attributes),
                    "status": trace_pb2.Status.StatusCode.Name(span.status.code),
                }


class Handler(BaseHTTPRequestHandler):
    def do_POST(self):  # noqa: N802 (http.server's naming)
        length = int(self.headers.get("Content-Length") or 0)
        body = self.rfile.read(length)
        if self.path != "/v1/traces":
            return self.fail(404, f"unexpected path {self.path}")
        if self.headers.get("Content-Type") != "application/x-protobuf":
            return self.fail(415, f"unexpected content type {self.headers.get('Content-Type')}")
        request = trace_service_pb2.ExportTraceServiceRequest()
        try:
            request.ParseFromString(body)
        except Exception as e:  # a decode error of any kind is the test's failure
            return self.fail(400, f"body does not decode: {e}")
        global SPANS_SEEN
        with OUT_LOCK:
            if COUNT_ONLY:
                SPANS_SEEN += sum(
                    len(ss.spans) for rs in request.resource_spans for ss in rs.scope_spans
                )
                with open(OUT_PATH, "w", encoding="utf-8") as out:
                    out.write(f"{SPANS_SEEN}\n")
            else:
                with open(OUT_PATH, "a", encoding="utf-8") as out:
                    for span in spans_of(request):
                        out.write(json.dumps(span) + "\n")
        reply = trace_service_pb2.ExportTraceServiceResponse().SerializeToString()
        self.send_response(200)
        self.send_header("Content-Type", "application/x-protobuf")
        self.send_header("Content-Length", str(len(reply)))
        self.end_headers()
        self.wfile.write(reply)

    def fail(self, code, msg):
        print(f"otlp_receiver: {msg}", file=sys.stderr, flush=True)
        self.send_response(code)
        self.send_header("Content-Length", "0")
        self.end_headers()

    def log_message(self, *args):
        pass


def main():
    server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    print(f"listening {server.server_address[1]}", flush=True)
    server.serve_forever()


if __name__ == "__main__":
    main()
