"""The streaming client against the fake OpenAI server: TTFT before the end, the
server's cached tokens, and every failure as a one-line reason, never an exception."""

from __future__ import annotations

import socket
import time

import pytest

from flatcake.loadgen import Endpoint, ServerUnreachable, completion_body, probe
from flatcake.loadgen import stream_completion as send
from tests.loadgen.helpers import FakeServer


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def test_a_second_visit_reports_its_cached_prefix() -> None:
    with FakeServer(token_delay_s=0.02) as srv:
        ep = Endpoint.parse(srv.url)
        info = probe(ep, 5)
        assert (info.model, info.max_model_len) == ("fake", 1024)
        prompt = list(range(10, 74))  # 64 tokens, 4 blocks of 16
        first = send(ep, completion_body("fake", prompt, 5), 10)
        again = send(ep, completion_body("fake", prompt[:48] + [7] * 16, 5,
                                         session_id="alice"), 10)
    assert first.ok and first.cached_tokens == 0 and first.prompt_tokens == 64
    assert first.completion_tokens == 5
    assert first.ttft_s is not None and first.e2e_s is not None
    assert first.e2e_s - first.ttft_s >= 4 * 0.02  # the first token came before the rest
    assert again.ok and again.cached_tokens == 48
    body = srv.bodies[1]
    assert body["stream"] is True and body["stream_options"] == {"include_usage": True}
    assert body["kv_transfer_params"] == {"session_id": "alice"}
    assert "kv_transfer_params" not in srv.bodies[0] and body["ignore_eos"] is True


def test_missing_cached_tokens_are_none() -> None:
    with FakeServer(report_cached=False) as srv:
        reply = send(Endpoint.parse(srv.url), completion_body("fake", [5] * 20, 2), 10)
    assert reply.ok and reply.cached_tokens is None and reply.prompt_tokens == 20


def test_an_error_answer_is_a_reply_with_the_servers_message() -> None:
    with FakeServer(status=400, message="This model's maximum context length is 1024") as srv:
        reply = send(Endpoint.parse(srv.url), completion_body("fake", [5] * 20, 2), 10)
    assert not reply.ok and reply.status == 400
    assert reply.error == "HTTP 400: This model's maximum context length is 1024"


def test_a_server_that_is_down() -> None:
    ep = Endpoint.parse(f"127.0.0.1:{free_port()}")
    reply = send(ep, completion_body("m", [5], 1), 5)
    assert reply.status == 0 and reply.error == "connection refused"
    with pytest.raises(ServerUnreachable, match=r"cannot reach http://127\.0\.0\.1:\d+/v1/"
                                                r"models: connection refused \(is the"):
        probe(ep, 5)


def test_a_hung_server_times_out_within_the_timeout() -> None:
    with FakeServer(stall_s=3.0) as srv:
        start = time.perf_counter()
        reply = send(Endpoint.parse(srv.url), completion_body("fake", [5] * 20, 2), 0.3)
        assert time.perf_counter() - start < 2.0
    assert reply.error == "timed out" and reply.ttft_s is None


@pytest.mark.parametrize(("url", "root"), [
    ("http://127.0.0.1:8000", "http://127.0.0.1:8000"),
    ("localhost:9000/v1/", "http://localhost:9000"),
    ("https://example.org", "https://example.org:443"),
])
def test_urls(url: str, root: str) -> None:
    assert Endpoint.parse(url).url == root


@pytest.mark.parametrize(("url", "message"), [
    ("ftp://host:1", "must look like http://host:port"),
    ("http://host:1/v1/completions", "must be the server's root"),
    ("http://host:port", "bad port"),
])
def test_bad_urls(url: str, message: str) -> None:
    with pytest.raises(ValueError, match=message):
        Endpoint.parse(url)


def test_a_chat_client_sends_messages_and_times_its_first_token() -> None:
    from flatcake.loadgen import chat_body

    with FakeServer(token_delay_s=0.05) as srv:
        ep = Endpoint.parse(srv.url)
        prompt = list(range(10, 74))  # 64 tokens, 4 blocks of 16
        first = send(ep, chat_body("fake", prompt, 2), 10)
        again = send(ep, chat_body("fake", prompt[:48] + [7] * 16, 2, session_id="a"), 10)
    assert srv.paths == ["/v1/chat/completions"] * 2
    body = srv.bodies[0]
    assert "prompt" not in body
    assert body["messages"] == [{"role": "user", "content": " ".join(f"w{t}" for t in prompt)}]
    assert body["stream_options"] == {"include_usage": True} and body["ignore_eos"] is True
    assert srv.bodies[1]["kv_transfer_params"] == {"session_id": "a"}
    assert first.ok and first.prompt_tokens == 64 and first.cached_tokens == 0
    assert again.ok and again.cached_tokens == 48  # the same ids, the same text
    # The role chunk comes at once; TTFT is the first token's, a token delay later.
    assert first.ttft_s is not None and first.ttft_s >= 0.05
