#!/usr/bin/env python3
"""A stand-in OTLP/HTTP collector for benchmarks: accepts every POST (to /v1/traces), answers
200 with an empty export response, and keeps nothing but counts, printed when it stops.

Usage: scripts/otlp-sink.py [PORT]   (default 4318, OTLP/HTTP's own)"""
import http.server
import signal
import sys

counts = {"requests": 0, "bytes": 0}


class Sink(http.server.BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"

    def do_POST(self):
        body = self.rfile.read(int(self.headers.get("content-length", 0)))
        counts["requests"] += 1
        counts["bytes"] += len(body)
        self.send_response(200)
        self.send_header("content-type", "application/x-protobuf")
        self.send_header("content-length", "0")
        self.end_headers()

    def log_message(self, *args):
        pass


def stop(*_):
    print(f"otlp-sink: {counts['requests']} requests, {counts['bytes']} bytes", flush=True)
    sys.exit(0)


signal.signal(signal.SIGTERM, stop)
signal.signal(signal.SIGINT, stop)
port = int(sys.argv[1]) if len(sys.argv) > 1 else 4318
http.server.ThreadingHTTPServer(("127.0.0.1", port), Sink).serve_forever()
