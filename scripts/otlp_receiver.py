#!/usr/bin/env python3
"""A minimal OTLP/HTTP trace receiver: decodes what exporters POST to /v1/traces with the
official `opentelemetry-proto` package and appends every span to a JSON-lines file.

Usage: otlp_receiver.py OUT.jsonl [--port N] [--port-file FILE]

Listens on 127.0.0.1 (port 0: any free one); the chosen port is printed on stdout as
`listening on PORT` and, with --port-file, written there once the server is up. Accepts
`application/x-protobuf` (gzip-encoded or not) and answers an empty ExportTraceServiceResponse,
as a collector does. One line per span:

  {"service": "kvgate", "scope": "kvgate", "name": "kvgate.decide", "kind": "INTERNAL",
   "trace_id": "<32 hex>", "span_id": "<16 hex>", "parent_span_id": "<16 hex or empty>",
   "start_ns": ..., "end_ns": ..., "status": "UNSET|OK|ERROR", "status_message": "...",
   "attributes": {"key": value, ...}}

Used by crates/kvgate/tests/otel_traces.rs and scripts/real-vllm/otel_trace.sh.
"""
import argparse
import gzip
import json
import os
import sys
import threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

from opentelemetry.proto.collector.trace.v1.trace_service_pb2 import (
    ExportTraceServiceRequest,
    ExportTraceServiceResponse,
)
from opentelemetry.proto.trace.v1.trace_pb2 import Span, Status

LOCK = threading.Lock()


def any_value(v):
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
            for s in ss.spans:
                yield {
                    "service": resource.get("service.name", ""),
                    "scope": ss.scope.name,
                    "name": s.name,
                    "kind": Span.SpanKind.Name(s.kind).removeprefix("SPAN_KIND_"),
                    "trace_id": s.trace_id.hex(),
                    "span_id": s.span_id.hex(),
                    "parent_span_id": s.parent_span_id.hex(),
                    "start_ns": s.start_time_unix_nano,
                    "end_ns": s.end_time_unix_nano,
                    "status": Status.StatusCode.Name(s.status.code).removeprefix(
                        "STATUS_CODE_"
                    ),
                    "status_message": s.status.message,
                    "attributes": attributes(s.attributes),
                }


def handler(out_path):
    class Handler(BaseHTTPRequestHandler):
        def do_POST(self):
            length = int(self.headers.get("content-length") or 0)
            body = self.rfile.read(length)
            if self.headers.get("content-encoding") == "gzip":
                body = gzip.decompress(body)
            if self.path != "/v1/traces":
                self.send_error(404)
                return
            request = ExportTraceServiceRequest()
            try:
                request.ParseFromString(body)
            except Exception as e:  # a malformed export: the exporter's bug, say so
                self.send_error(400, f"cannot decode ExportTraceServiceRequest: {e}")
                return
            lines = [json.dumps(s, sort_keys=True) for s in spans_of(request)]
            with LOCK, open(out_path, "a") as f:
                for line in lines:
                    f.write(line + "\n")
            answer = ExportTraceServiceResponse().SerializeToString()
            self.send_response(200)
            self.send_header("content-type", "application/x-protobuf")
            self.send_header("content-length", str(len(answer)))
            self.end_headers()
            self.wfile.write(answer)

        def log_message(self, *args):
            pass

    return Handler


def main():
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("out")
    p.add_argument("--port", type=int, default=0)
    p.add_argument("--port-file")
    a = p.parse_args()
    server = ThreadingHTTPServer(("127.0.0.1", a.port), handler(a.out))
    port = server.server_address[1]
    print(f"listening on {port}", flush=True)
    if a.port_file:
        with open(a.port_file + ".tmp", "w") as f:
            f.write(str(port))
        os.replace(a.port_file + ".tmp", a.port_file)
    try:
        server.serve_forever()
    except KeyboardInterrupt:
        sys.exit(0)


if __name__ == "__main__":
    main()
