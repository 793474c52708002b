"""A tiny OpenAI streaming server for the load-generator tests (a test double).

``FakeServer`` answers ``GET /v1/models`` and streaming ``POST /v1/completions`` on
127.0.0.1 the way vLLM does: a chunk per output token, then the usage chunk with
``prompt_tokens_details.cached_tokens`` and ``data: [DONE]``. Its prefix cache is exact
and unbounded at ``block`` tokens: a prompt's cached tokens are its longest prefix of
full blocks an earlier prompt had (at most all but the last token, as vLLM computes the
last one). Knobs make it fail the ways a real server does.
"""

from __future__ import annotations

import contextlib
import json
import threading
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any


class FakeServer:
    """Start with ``with FakeServer(...) as srv:``; ``srv.url`` is its root URL.

    Attributes:
        bodies: every completion request body received, in arrival order.
        paths: the path each was posted to (``/v1/completions``, ``/v1/chat/completions``;
            a chat's prompt is read back from its words, ``chat_body``).
        report_cached: include ``prompt_tokens_details`` in the usage chunk.
        status / message: answer every completion with this HTTP error instead.
        stall_s: sleep this long before the first token (a hung server).
        token_delay_s: seconds between streamed tokens.
    """

    def __init__(self, *, block: int = 16, vocab: int = 1000, max_model_len: int = 1024,
                 report_cached: bool = True, status: int = 200, message: str = "",
                 stall_s: float = 0.0, token_delay_s: float = 0.0) -> None:
        self.block, self.vocab, self.max_model_len = block, vocab, max_model_len
        self.report_cached, self.status, self.message = report_cached, status, message
        self.stall_s, self.token_delay_s = stall_s, token_delay_s
        self.bodies: list[dict[str, Any]] = []
        self.paths: list[str] = []
        self._cache: set[tuple[int, ...]] = set()
        self._lock = threading.Lock()
        self._httpd = ThreadingHTTPServer(("127.0.0.1", 0), self._handler())
        self._httpd.daemon_threads = True
        self._thread = threading.Thread(target=self._httpd.serve_forever, daemon=True)

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self._httpd.server_address[1]}"

    def __enter__(self) -> FakeServer:
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._httpd.shutdown()
        self._httpd.server_close()
        self._thread.join(timeout=10)

    def cached_tokens(self, prompt: list[int]) -> int:
        """Cache the prompt's full blocks and return how many of its tokens were cached."""
        with self._lock:
            hit = 0
            for end in range(self.block, len(prompt) + 1, self.block):
                key = tuple(prompt[:end])
                if key in self._cache and end == hit + self.block:
                    hit = end
                self._cache.add(key)
            return min(hit, len(prompt) - 1)

    def _handler(self) -> type[BaseHTTPRequestHandler]:
        srv = self

        class Handler(BaseHTTPRequestHandler):
            protocol_version = "HTTP/1.1"

            def log_message(self, format: str, *args: object) -> None:
                pass

            def _json(self, status: int, doc: dict[str, Any]) -> None:
                data = json.dumps(doc).encode()
                self.send_response(status)
                self.send_header("Content-Type", "application/json")
                self.send_header("Content-Length", str(len(data)))
                self.end_headers()
                self.wfile.write(data)

            def do_GET(self) -> None:
                self.close_connection = True  # one request per connection, as the client
                if self.path != "/v1/models":
                    self._json(404, {"detail": "Not Found"})
                    return
                self._json(200, {"object": "list", "data": [
                    {"id": "fake", "object": "model", "max_model_len": srv.max_model_len}]})

            def do_POST(self) -> None:
                self.close_connection = True
                body = json.loads(self.rfile.read(int(self.headers["Content-Length"])))
                srv.bodies.append(body)
                if srv.status != 200:
                    self._json(srv.status, {"error": {"message": srv.message,
                                                      "type": "BadRequestError"}})
                    return
                if "messages" in body:  # a chat: one word per token id (``chat_body``)
                    prompt = [int(w[1:]) for w in body["messages"][-1]["content"].split()]
                else:
                    prompt = body["prompt"]
                srv.paths.append(self.path)
                if any(t >= srv.vocab for t in prompt):
                    self._json(400, {"error": {"message": "Token id out of vocabulary"}})
                    return
                cached = srv.cached_tokens(prompt)
                # A client that gave up (its timeout) is told nothing more.
                with contextlib.suppress(BrokenPipeError, ConnectionResetError):
                    self._stream(body, prompt, cached)

            def _stream(self, body: dict[str, Any], prompt: list[int], cached: int) -> None:
                self.send_response(200)
                self.send_header("Content-Type", "text/event-stream")
                self.send_header("Transfer-Encoding", "chunked")
                self.end_headers()
                time.sleep(srv.stall_s)
                chat = "messages" in body
                if chat:  # a chat stream names the role first, before any token
                    self._event({"choices": [{"index": 0, "delta": {"role": "assistant",
                                                                    "content": ""}}]})
                    time.sleep(srv.token_delay_s)
                for k in range(body["max_tokens"]):
                    self._event({"choices": [{"index": 0, "delta": {"content": f" w{k}"}}]}
                                if chat else {"choices": [{"index": 0, "text": f" w{k}"}]})
                    time.sleep(srv.token_delay_s)
                usage: dict[str, Any] = {"prompt_tokens": len(prompt),
                                         "completion_tokens": body["max_tokens"]}
                if srv.report_cached:
                    usage["prompt_tokens_details"] = {"cached_tokens": cached}
                self._event({"choices": [], "usage": usage})
                self._chunk(b"data: [DONE]\n\n")
                self._chunk(b"")

            def _event(self, doc: dict[str, Any]) -> None:
                self._chunk(f"data: {json.dumps(doc)}\n\n".encode())

            def _chunk(self, data: bytes) -> None:
                self.wfile.write(f"{len(data):x}\r\n".encode() + data + b"\r\n")
                self.wfile.flush()

        return Handler
