"""A loopback OpenAI-compatible ``/v1/chat/completions`` server for protocol tests.

Its answers come from a Python function the test installs (``server.reply``), and it can be told
to fail the next requests with a status code. It speaks the real protocol over real HTTP.
"""

from __future__ import annotations

import contextlib
import json
import threading
from collections.abc import Callable, Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer


class ChatServer(ThreadingHTTPServer):
    """Holds the reply function, queued failures and the requests it saw."""

    reply: Callable[[list[dict]], str]
    fail_next: list[int]
    requests: list[dict]


class _Handler(BaseHTTPRequestHandler):
    server: ChatServer

    def log_message(self, *args: object) -> None:  # keep test output clean
        pass

    def do_POST(self) -> None:
        body = json.loads(self.rfile.read(int(self.headers["Content-Length"])))
        self.server.requests.append(body)
        if self.path != "/v1/chat/completions":
            return self._send(404, {"error": {"message": f"no route {self.path}"}})
        if self.server.fail_next:
            code = self.server.fail_next.pop(0)
            return self._send(code, {"object": "error", "message": "injected", "code": code})
        content = self.server.reply(body["messages"])
        self._send(
            200,
            {
                "id": "chatcmpl-test",
                "object": "chat.completion",
                "model": body.get("model", "judge"),
                "choices": [
                    {
                        "index": 0,
                        "message": {"role": "assistant", "content": content},
                        "finish_reason": "stop",
                    }
                ],
                "usage": {"prompt_tokens": 0, "completion_tokens": 0, "total_tokens": 0},
            },
        )

    def _send(self, code: int, payload: dict) -> None:
        data = json.dumps(payload).encode()
        self.send_response(code)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(data)))
        self.end_headers()
        self.wfile.write(data)


@contextlib.contextmanager
def chat_server(reply: Callable[[list[dict]], str]) -> Iterator[ChatServer]:
    """Serve on a free loopback port in a thread; ``server.server_address`` has the port."""
    server = ChatServer(("127.0.0.1", 0), _Handler)
    server.reply = reply
    server.fail_next = []
    server.requests = []
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        yield server
    finally:
        server.shutdown()
        server.server_close()
