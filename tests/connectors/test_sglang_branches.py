"""Branches of a stored prefix through the SGLang backend: the same session rule as the
vLLM connector's (``control.signals``). A working set of prompts asked with rotating
questions, each request backed up as SGLang does (its prompt's new pages, then its
reply's), costs one session file per prompt, and a branch restores from that file in
``layers x (turns + 1)`` commands."""

from __future__ import annotations

import hashlib
from pathlib import Path

import pytest

from tests.connectors.sglang_helpers import (
    LAYERS,
    backend,
    chain,
    extra,
    host_pool,
    page_bytes,
    slots,
)

pytestmark = pytest.mark.sglang

PROMPTS, QUESTIONS, PROMPT_PAGES = 3, 5, 4


def then(prev: list[str], label: str) -> str:
    """The page key after ``prev`` (chained, as SGLang hashes pages)."""
    return hashlib.sha256(bytes.fromhex(prev[-1]) + label.encode()).hexdigest()


def session_files(root: Path) -> list[Path]:
    return sorted(p for p in (root / "tp0-pp0" / "sessions").iterdir() if p.is_file())


def ask(b: object, prompt: list[str], j: int, page: int) -> list[str]:
    """One request: the question's page after the prompt, then the reply's page (the
    prompt's pages are stored once, with its first request). Returns its pages."""
    question = then(prompt, f"q{j}")
    history = prompt if j else []
    new = [question] if j else [*prompt, question]
    src = list(range(page + PROMPT_PAGES + 1 - len(new), page + PROMPT_PAGES + 1))
    assert all(b.batch_set_v1(new, slots(src), extra(history)))  # type: ignore[attr-defined]
    reply = then([*prompt, question], "reply")
    assert all(b.batch_set_v1([reply], slots([page + 8]),  # type: ignore[attr-defined]
                              extra([*prompt, question])))
    return [*prompt, question, reply]


def test_a_working_set_with_rotating_questions_costs_a_file_per_prompt(
        tmp_path: Path) -> None:
    pool = host_pool("layer_first")
    b = backend(pool, tmp_path)
    prompts = [chain(PROMPT_PAGES, f"prompt{k}") for k in range(PROMPTS)]
    last = {}
    for j in range(QUESTIONS):
        for k, prompt in enumerate(prompts):
            last[k] = ask(b, prompt, j, 1 + k * 10)
    # The old rule made a file per request (a branch off the prompt's first turn
    # started a session): PROMPTS x QUESTIONS.
    assert len(session_files(tmp_path)) == PROMPTS
    # The first prompt's last branch goes on: its history and its next question stay in
    # that prompt's file too (SGLang names no request, so a reply and a next turn look
    # alike). A cold restore of it reads layers x segments commands at most: the
    # prompt's first turn and the branch's three parts.
    pages = last[0]
    nxt = then(pages, "next")
    assert all(b.batch_set_v1([nxt], slots([40]), extra(pages)))
    assert len(session_files(tmp_path)) == PROMPTS
    b.close()
    b = backend(pool, tmp_path)  # a new process: a cold restore, from the files
    want = [page_bytes(pool, p) for p in (1, 2, 3, 4, 5, 9, 40)]
    dst = list(range(50, 57))
    assert b.batch_get_v1([*pages, nxt], slots(dst), extra([])) == [True] * 7
    assert [page_bytes(pool, p) for p in dst] == want
    assert 0 < b.get_stats()["read_commands"] <= LAYERS * 4
    b.close()


def test_without_the_cap_each_branch_is_a_session_of_its_own(tmp_path: Path) -> None:
    pool = host_pool("layer_first")
    b = backend(pool, tmp_path, placement={"branch_tail_tokens": 0})
    prompt = chain(PROMPT_PAGES, "prompt")
    for j in range(QUESTIONS):
        ask(b, prompt, j, 1)
    assert len(session_files(tmp_path)) > QUESTIONS
    b.close()
