"""A streaming client for OpenAI-compatible completion servers (standard library only).

``probe`` asks ``GET /v1/models`` which model the server serves (and its
``max_model_len`` where vLLM reports it); ``stream_completion`` sends one streaming
``POST /v1/completions`` with a token-id prompt (``completion_body``), or
``POST /v1/chat/completions`` with the prompt as one user message (``chat_body``: what a
chat client sends), and times it::

    sent ──► first streamed token (TTFT) ──► ... ──► usage chunk, [DONE] (end-to-end)

The usage chunk (``stream_options.include_usage``) gives the prompt tokens the server
counted and ``prompt_tokens_details.cached_tokens`` (vLLM reports it when started with
``--enable-prompt-tokens-details``; ``None`` when absent). Every call has a socket
timeout and an overall deadline; a failure becomes a :class:`Reply` with ``error`` set,
never an exception (``probe`` raises :class:`ServerUnreachable`, a ``ConnectionError``,
with a one-line reason). One connection per request: a thread per request in flight.
"""

from __future__ import annotations

import http.client
import json
import socket
import time
from dataclasses import dataclass
from typing import Any
from urllib.parse import urlsplit

MAX_ERROR_BODY_BYTES = 64 << 10


class ServerUnreachable(ConnectionError):
    """The server cannot be reached or does not answer as an OpenAI server does."""


@dataclass(frozen=True, slots=True)
class Endpoint:
    """Where the server listens: ``scheme://host:port`` and an optional API key."""

    scheme: str
    host: str
    port: int
    api_key: str | None = None

    @classmethod
    def parse(cls, url: str, api_key: str | None = None) -> Endpoint:
        """``http://host:port``, ``host:port`` or either with a trailing ``/v1``."""
        text = url if "://" in url else f"http://{url}"
        parts = urlsplit(text)
        if parts.scheme not in ("http", "https") or not parts.hostname:
            raise ValueError(f"URL must look like http://host:port, got {url!r}")
        if parts.path.rstrip("/") not in ("", "/v1"):
            raise ValueError(f"URL must be the server's root (http://host:port), got {url!r}")
        try:
            port = parts.port or (443 if parts.scheme == "https" else 80)
        except ValueError:
            raise ValueError(f"URL has a bad port: {url!r}") from None
        return cls(parts.scheme, parts.hostname, port, api_key)

    @property
    def url(self) -> str:
        return f"{self.scheme}://{self.host}:{self.port}"

    def connect(self, timeout_s: float) -> http.client.HTTPConnection:
        kind = (http.client.HTTPSConnection if self.scheme == "https"
                else http.client.HTTPConnection)
        return kind(self.host, self.port, timeout=timeout_s)

    def headers(self) -> dict[str, str]:
        h = {"Content-Type": "application/json"}
        if self.api_key:
            h["Authorization"] = f"Bearer {self.api_key}"
        return h


@dataclass(frozen=True, slots=True)
class ServerInfo:
    """What ``GET /v1/models`` says: the first model's id and its context length."""

    model: str
    max_model_len: int | None


@dataclass(frozen=True, slots=True)
class Reply:
    """The outcome of one request (times in seconds from sending it).

    ``error`` is None on success; ``status`` is the HTTP status (0: no answer).
    """

    status: int
    ttft_s: float | None = None
    e2e_s: float | None = None
    prompt_tokens: int | None = None
    cached_tokens: int | None = None
    completion_tokens: int | None = None
    error: str | None = None

    @property
    def ok(self) -> bool:
        return self.error is None


def _why(exc: BaseException) -> str:
    if isinstance(exc, ConnectionRefusedError):
        return "connection refused"
    if isinstance(exc, (TimeoutError, socket.timeout)):
        return "timed out"
    return str(exc) or type(exc).__name__


def _error_message(status: int, body: bytes) -> str:
    """``HTTP 400: <the server's message>`` from an OpenAI-style error body."""
    text = body.decode("utf-8", "replace").strip()
    try:
        doc = json.loads(text)
    except ValueError:
        doc = None
    if isinstance(doc, dict):
        err = doc.get("error", doc)
        msg = err.get("message") or err.get("detail") if isinstance(err, dict) else err
        text = str(msg if msg is not None else doc.get("detail", text))
    return f"HTTP {status}: {' '.join(text.split())[:300] or 'no message'}"


def probe(endpoint: Endpoint, timeout_s: float) -> ServerInfo:
    """The model the server serves; raises :class:`ServerUnreachable`."""
    where = f"{endpoint.url}/v1/models"
    try:
        conn = endpoint.connect(timeout_s)
        try:
            conn.request("GET", "/v1/models", headers=endpoint.headers())
            resp = conn.getresponse()
            body = resp.read(MAX_ERROR_BODY_BYTES)
        finally:
            conn.close()
    except (OSError, http.client.HTTPException) as exc:
        raise ServerUnreachable(f"cannot reach {where}: {_why(exc)} "
                                "(is the server running?)") from None
    if resp.status != 200:
        raise ServerUnreachable(f"{where} answered {_error_message(resp.status, body)}")
    try:
        models = json.loads(body)["data"]
        first = models[0]
        name = str(first["id"])
    except (ValueError, KeyError, IndexError, TypeError):
        raise ServerUnreachable(f"{where} did not list a model (not an OpenAI-compatible "
                                "server?)") from None
    length = first.get("max_model_len")
    return ServerInfo(model=name, max_model_len=int(length) if isinstance(length, int) else None)


def completion_body(model: str, prompt: list[int], max_tokens: int, *,
                    session_id: str | None = None, ignore_eos: bool = True) -> dict[str, Any]:
    """The JSON body of one streaming completion of a token-id prompt."""
    body: dict[str, Any] = {
        "model": model, "prompt": prompt, "max_tokens": max_tokens, "temperature": 0.0,
        "stream": True, "stream_options": {"include_usage": True},
    }
    if ignore_eos:  # vLLM / SGLang: exactly max_tokens out, so requests cost alike
        body["ignore_eos"] = True
    if session_id is not None:
        # FlatCake's vLLM connector reads kv_transfer_params["session_id"]
        # (connectors/vllm.py); other servers ignore or reject the field.
        body["kv_transfer_params"] = {"session_id": session_id}
    return body


def chat_body(model: str, prompt: list[int], max_tokens: int, *,
              session_id: str | None = None, ignore_eos: bool = True) -> dict[str, Any]:
    """The JSON body of one streaming chat completion of a token-id prompt: one user
    message of a word per token id (``w<id>``; the same ids make the same text, so a
    prompt's reuse is the workload's). The server's tokenizer and chat template decide
    its token count (the usage chunk reports it): one token per word on the random
    model of ``scripts/loadgen_compare.py``, more on a real vocabulary."""
    body = completion_body(model, [], max_tokens, session_id=session_id,
                           ignore_eos=ignore_eos)
    del body["prompt"]
    body["messages"] = [{"role": "user", "content": " ".join(f"w{t}" for t in prompt)}]
    return body


def stream_completion(endpoint: Endpoint, body: dict[str, Any], timeout_s: float) -> Reply:
    """Send ``body`` to ``/v1/completions`` (``/v1/chat/completions`` when it holds
    ``messages``) and read its stream to the end."""
    start = time.perf_counter()
    deadline = start + timeout_s
    data = json.dumps(body, separators=(",", ":")).encode()
    path = "/v1/chat/completions" if "messages" in body else "/v1/completions"
    conn = endpoint.connect(timeout_s)
    try:
        conn.request("POST", path, body=data, headers=endpoint.headers())
        resp = conn.getresponse()
        if resp.status != 200:
            return Reply(status=resp.status, e2e_s=time.perf_counter() - start,
                         error=_error_message(resp.status, resp.read(MAX_ERROR_BODY_BYTES)))
        return _read_stream(resp, start, deadline)
    except (OSError, http.client.HTTPException) as exc:
        return Reply(status=0, e2e_s=time.perf_counter() - start, error=_why(exc))
    finally:
        conn.close()


def _read_stream(resp: http.client.HTTPResponse, start: float, deadline: float) -> Reply:
    ttft: float | None = None
    usage: dict[str, Any] = {}
    done = False
    while True:
        line = resp.readline()
        now = time.perf_counter()
        if not line:
            break
        if now > deadline:
            return Reply(status=200, ttft_s=ttft, e2e_s=now - start, error="timed out")
        text = line.strip()
        if not text.startswith(b"data:"):
            continue
        payload = text[5:].strip()
        if payload == b"[DONE]":
            done = True
            break
        try:
            chunk = json.loads(payload)
        except ValueError:
            return Reply(status=200, ttft_s=ttft, e2e_s=now - start,
                         error=f"bad stream chunk: {payload[:80]!r}")
        if not isinstance(chunk, dict):
            continue
        if "error" in chunk:
            return Reply(status=200, ttft_s=ttft, e2e_s=now - start,
                         error=_error_message(200, payload).replace("HTTP 200", "stream"))
        if ttft is None and _has_token(chunk):
            ttft = now - start
        if isinstance(chunk.get("usage"), dict):
            usage = chunk["usage"]
    end = time.perf_counter() - start
    if not done:
        return Reply(status=200, ttft_s=ttft, e2e_s=end, error="stream ended before [DONE]")
    if ttft is None:
        return Reply(status=200, e2e_s=end, error="no token streamed")
    details = usage.get("prompt_tokens_details")
    cached = details.get("cached_tokens") if isinstance(details, dict) else None
    return Reply(status=200, ttft_s=ttft, e2e_s=end,
                 prompt_tokens=_int(usage.get("prompt_tokens")),
                 cached_tokens=_int(cached), completion_tokens=_int(usage.get("completion_tokens")))


def _has_token(chunk: dict[str, Any]) -> bool:
    """A chunk that streams output: a completion's, or a chat delta beyond the first
    one naming only the role."""
    choices = chunk.get("choices")
    if not choices or not isinstance(choices[0], dict):
        return False
    delta = choices[0].get("delta")
    return not isinstance(delta, dict) or bool(delta.get("content")) or (
        "role" not in delta and delta.get("content") is not None)


def _int(value: object) -> int | None:
    return value if isinstance(value, int) and not isinstance(value, bool) else None
