"""The scaffolding the stand-in servers share: a threaded HTTP server on 127.0.0.1 with a
free port, started and stopped as a context manager, that answers JSON."""
from __future__ import annotations

import json
import threading
from http.server import ThreadingHTTPServer


class LoopbackServer:
    def __init__(self, handler_class):
        self.server = ThreadingHTTPServer(("127.0.0.1", 0), handler_class)
        self.thread = threading.Thread(target=self.server.serve_forever, daemon=True)

    @property
    def port(self) -> int:
        return self.server.server_port

    def __enter__(self):
        self.thread.start()
        return self

    def __exit__(self, *exc):
        self.server.shutdown()
        self.server.server_close()


def send_json(request, status: int, payload, headers: dict | None = None, body: bool = True) -> None:
    data = payload if isinstance(payload, bytes) else json.dumps(payload).encode()
    try:
        request.send_response(status)
        for key, value in {"Content-Type": "application/json", "Content-Length": str(len(data)),
                           **(headers or {})}.items():
            request.send_header(key, value)
        request.end_headers()
        if body:
            request.wfile.write(data)
    except (BrokenPipeError, ConnectionResetError):  # the client gave up (a timeout): fine
        pass
