"""FlatCake as SGLang's HiCache L3 backend, driven through SGLang's own host pool.

Runs in the SGLang virtualenv (``scripts/sglang_venv.sh``; ``make test`` builds it and
runs ``-m sglang``); skipped where SGLang is not installed. Every test loads the backend
as SGLang does (``--hicache-storage-backend dynamic``) and moves pages between SGLang's
``MHATokenToKVPoolHost`` and the store.
"""

from __future__ import annotations

import hashlib
from pathlib import Path

import pytest

from tests.connectors.sglang_helpers import (
    LAYERS,
    LAYOUTS,
    backend,
    chain,
    extra,
    host_pool,
    page_bytes,
    slots,
)

pytestmark = pytest.mark.sglang


@pytest.mark.parametrize("layout", LAYOUTS)
def test_round_trip_bit_exact_every_layout(tmp_path: Path, layout: str) -> None:
    pool = host_pool(layout)
    keys = chain(6)
    src = [3, 9, 4, 20, 21, 1]
    want = [page_bytes(pool, p) for p in src]
    b = backend(pool, tmp_path)
    # Two turns: the second batch extends the first (prefix_keys), as SGLang's backup sends.
    assert b.batch_set_v1(keys[:4], slots(src[:4]), extra([])) == [True] * 4
    assert b.batch_set_v1(keys[4:], slots(src[4:]), extra(keys[:4])) == [True] * 2
    assert b.batch_exists(keys, extra([])) == 6
    dst = [30, 31, 2, 12, 13, 25]
    before = page_bytes(pool, 0)
    assert b.batch_get_v1(keys, slots(dst), extra([])) == [True] * 6
    assert [page_bytes(pool, p) for p in dst] == want
    assert page_bytes(pool, 0) == before  # nothing else written
    # A batch that starts mid-chain reads the pages it names.
    assert b.batch_get_v1(keys[4:], slots([5, 6]), extra(keys[:4])) == [True, True]
    assert [page_bytes(pool, p) for p in (5, 6)] == want[4:]
    stats = b.get_stats()
    assert stats["pages_set"] == 6 and stats["pages_got"] == 8
    b.close()


def test_unknown_pages_miss_and_leading_run(tmp_path: Path) -> None:
    pool = host_pool("page_first")
    keys = chain(4)
    b = backend(pool, tmp_path)
    assert b.batch_set_v1(keys[:2], slots([1, 2]), extra([])) == [True, True]
    assert b.batch_exists(keys, extra([])) == 2
    assert b.batch_exists(chain(3, "other"), extra([])) == 0
    before = page_bytes(pool, 8)
    assert b.batch_get_v1(keys, slots([5, 6, 7, 8]), extra([])) == [True, True, False, False]
    assert page_bytes(pool, 8) == before
    b.close()


def test_restore_after_restart_within_read_bar(tmp_path: Path) -> None:
    """N pages written in T turns restore after a restart with <= layers x T reads."""
    pool = host_pool("layer_first")
    keys = chain(9)
    turns = [(0, 4), (4, 7), (7, 9)]
    src = list(range(1, 10))
    want = [page_bytes(pool, p) for p in src]
    b = backend(pool, tmp_path)
    for lo, hi in turns:
        assert b.batch_set_v1(keys[lo:hi], slots(src[lo:hi]), extra(keys[:lo])) == \
            [True] * (hi - lo)
    b.close()
    b = backend(pool, tmp_path)  # a new process: the store recovers its files
    assert b.batch_exists(keys, extra([])) == 9
    dst = list(range(20, 29))
    assert b.batch_get_v1(keys, slots(dst), extra([])) == [True] * 9
    assert [page_bytes(pool, p) for p in dst] == want
    stats = b.get_stats()
    assert 0 < stats["read_commands"] <= LAYERS * len(turns)
    b.close()


def test_a_session_continues_in_its_file_after_a_restart(tmp_path: Path) -> None:
    """The next turn of a session written before a restart goes into its file, and so
    does a batch branching off an older turn (the branch rule of ``control.signals``)."""
    pool = host_pool("layer_first")
    keys, branch = chain(9), chain(2, "branch")
    b = backend(pool, tmp_path)
    assert all(b.batch_set_v1(keys[:4], slots([1, 2, 3, 4]), extra([])))
    assert all(b.batch_set_v1(keys[4:7], slots([5, 6, 7]), extra(keys[:4])))
    b.close()
    b = backend(pool, tmp_path)  # a new process: nothing of the sessions in memory
    assert all(b.batch_set_v1(keys[7:], slots([8, 9]), extra(keys[:7])))
    sessions = tmp_path / "tp0-pp0" / "sessions"
    assert len(list(sessions.iterdir())) == 1
    assert all(b.batch_set_v1(branch, slots([10, 11]), extra(keys[:4])))
    assert len(list(sessions.iterdir())) == 1
    dst = list(range(20, 29))
    assert b.batch_get_v1(keys, slots(dst), extra([])) == [True] * 9
    assert [page_bytes(pool, p) for p in dst] == [page_bytes(pool, p) for p in range(1, 10)]
    b.close()


def test_corrupted_segment_is_a_miss_from_that_page_on(tmp_path: Path) -> None:
    pool = host_pool("page_first")
    keys = chain(6)
    b = backend(pool, tmp_path)
    assert all(b.batch_set_v1(keys[:3], slots([1, 2, 3]), extra([])))
    assert all(b.batch_set_v1(keys[3:], slots([4, 5, 6]), extra(keys[:3])))
    b.close()
    files = sorted(p for p in tmp_path.rglob("*") if p.is_file() and p.stat().st_size > 8192)
    assert files
    victim = files[0]
    data = bytearray(victim.read_bytes())
    data[-4096 - 100] ^= 0xFF  # inside the last segment's data
    victim.write_bytes(bytes(data))
    b = backend(pool, tmp_path)
    dst = [10, 11, 12, 13, 14, 15]
    before = [page_bytes(pool, p) for p in dst]
    got = b.batch_get_v1(keys, slots(dst), extra([]))
    assert got == [True, True, True, False, False, False]
    assert [page_bytes(pool, p) for p in dst[3:]] == before[3:]  # never copied in
    assert b.batch_exists(keys, extra([])) == 3
    assert b.get_stats()["damaged_segments"] >= 1
    b.close()


def test_layouts_and_tenants_never_share_pages(tmp_path: Path) -> None:
    keys = chain(3)
    first = host_pool("layer_first")
    b = backend(first, tmp_path, tenant="a")
    assert all(b.batch_set_v1(keys, slots([1, 2, 3]), extra([])))
    b.close()
    other_layout = backend(host_pool("page_first"), tmp_path, tenant="a")
    assert other_layout.batch_exists(keys, extra([])) == 0
    assert other_layout.batch_get_v1(keys, slots([4, 5, 6]), extra([])) == [False] * 3
    other_layout.close()
    other_tenant = backend(first, tmp_path, tenant="b")
    assert other_tenant.batch_exists(keys, extra([])) == 0
    other_tenant.close()
    same = backend(first, tmp_path, tenant="a")
    assert same.batch_exists(keys, extra([])) == 3
    same.clear()
    assert same.batch_exists(keys, extra([])) == 0
    same.close()


def test_bad_extra_config_is_a_clear_error(tmp_path: Path) -> None:
    pool = host_pool("page_first")
    with pytest.raises(ValueError, match="unknown hicache-storage-backend-extra-config key"):
        backend(pool, tmp_path, colour="red")
    with pytest.raises(ValueError, match="store"):
        backend(pool, tmp_path, **{"store.read_threads": 0})


def test_backup_and_prefetch_threads_at_once(tmp_path: Path) -> None:
    """Writers and readers on separate threads (SGLang's backup and prefetch threads):
    every read is a leading run of True, and what it loaded is bit-exact."""
    import threading

    pool = host_pool("page_first_direct")
    b = backend(pool, tmp_path)
    sessions = [chain(4, f"s{i}") for i in range(4)]
    src = {i: [1 + 4 * i + j for j in range(4)] for i in range(4)}
    want = {i: [page_bytes(pool, p) for p in src[i]] for i in range(4)}
    errors: list[str] = []

    def backup(i: int) -> None:
        keys = sessions[i]
        for lo in (0, 2):
            if b.batch_set_v1(keys[lo:lo + 2], slots(src[i][lo:lo + 2]),
                              extra(keys[:lo])) != [True, True]:
                errors.append(f"set {i} {lo}")

    def prefetch(i: int) -> None:
        dst = [40 + 4 * i + j for j in range(4)]
        for _ in range(5):
            got = b.batch_get_v1(sessions[i], slots(dst), extra([]))
            n = got.count(True)
            if got != [True] * n + [False] * (4 - n):
                errors.append(f"get {i}: {got}")
            if [page_bytes(pool, p) for p in dst[:n]] != want[i][:n]:
                errors.append(f"bytes {i}")

    threads = [threading.Thread(target=f, args=(i,)) for i in range(4)
               for f in (backup, prefetch)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert errors == []
    for i in range(4):
        assert b.batch_exists(sessions[i], extra([])) == 4
    b.close()


# Branches of a stored prefix: the same session rule as the vLLM connector's
# (``control.signals``). A working set of prompts asked with rotating questions, each
# request backed up as SGLang does (its prompt's new pages, then its reply's), costs one
# session file per prompt, and a branch restores from that file in
# ``layers x (turns + 1)`` commands.

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
