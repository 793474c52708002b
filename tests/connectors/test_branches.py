"""Branches of a stored prefix through the connector's two halves (no vLLM): requests
without a session id that repeat a stored prompt with another question. Their tails join
the session that owns the prompt, so a working set of prompts costs one session file
per prompt, and a branch restores from that file in ``layers x (turns + 1)`` commands."""

from __future__ import annotations

from pathlib import Path

from flatcake.cio.names import SESSIONS_DIR
from flatcake.connectors.scheduler_side import RequestView
from tests.connectors.sides_harness import G, Harness, end, finish, settings, view

PROMPTS = 3
QUESTIONS = 5
PROMPT_TOKENS = 16  # 4 blocks
SLOTS = [1, 2, 3, 4, 5]  # every request's full blocks sit here: block i in slot 1 + i


def prompt(k: int) -> list[int]:
    return list(range(1000 * (k + 1), 1000 * (k + 1) + PROMPT_TOKENS))


def question(j: int) -> list[int]:
    return list(range(100 + 10 * j, 105 + 10 * j))  # one full block and one token


def session_files(root: Path) -> list[Path]:
    return sorted(p for p in (root / SESSIONS_DIR).iterdir() if p.is_file())


def run_working_set(h: Harness) -> list[dict]:
    """Every prompt asked with every question, prompts interleaved; each request's
    store is written before the next request looks up."""
    params = []
    for j in range(QUESTIONS):
        for k in range(PROMPTS):
            params.append(finish(h, f"r{k}-{j}", prompt(k) + question(j), SLOTS, out=8))
            h.step()
    return params


def test_a_working_set_of_prompts_with_rotating_questions_costs_a_file_per_prompt(
        tmp_path: Path) -> None:
    h = Harness(tmp_path)
    params = run_working_set(h)
    # Each prompt's first request starts a session; every later one is a branch of it.
    sessions = {p["session_id"] for p in params}
    assert len(sessions) == PROMPTS
    assert len(session_files(tmp_path)) == PROMPTS
    firsts, branches = params[:PROMPTS], params[PROMPTS:]
    assert all(p["placement"] == "ssd:first_turn" for p in firsts)
    assert all(p["placement"].startswith("ssd:") and p["placement"] != "ssd:first_turn"
               for p in branches)
    assert all(p["stored_blocks"] == 1 for p in branches)  # the question's full block
    h.close()


def test_without_the_cap_each_branch_is_a_session_of_its_own(tmp_path: Path) -> None:
    h = Harness(tmp_path, settings("placement.branch_tail_tokens=0"))
    params = run_working_set(h)
    assert len({p["session_id"] for p in params}) == PROMPTS * QUESTIONS
    assert len(session_files(tmp_path)) == PROMPTS * QUESTIONS
    h.close()


def test_a_branch_restores_from_its_session_file_in_layers_times_turns_plus_one(
        tmp_path: Path) -> None:
    h = Harness(tmp_path)
    params = run_working_set(h)
    want = {(layer, i): h.block(layer, SLOTS[i]) for layer in range(G.num_layers)
            for i in range(len(SLOTS))}
    # Question 2's conversation goes on: its history is the prompt's first turn plus
    # its own branch tail, both in prompt 1's session file.
    toks = prompt(1) + question(2) + list(range(500, 510))
    v = view("next", toks)
    assert h.sched.num_matched_tokens(v, 0) == (20, True)
    slots = list(range(30, 37))
    h.sched.after_alloc("next", slots, 20)
    plan, _, recving, invalid = h.step()
    (task,) = plan.loads
    turns = 1  # the history's turns; the branch tail is the one more
    assert task.read_plan.num_commands <= G.num_layers * (turns + 1)
    assert recving == {"next"} and invalid == set()
    for (layer, i), raw in want.items():
        assert h.block(layer, slots[i]) == raw
    _, p = end(h, RequestView("next", v.keys, len(toks), len(toks), 0, len(toks), None),
               slots)
    # A branch going on is a conversation: from here on it has a session (file) of its
    # own, placed as the turn after the branch's (its 8-token reply is a chat's).
    p = p["flatcake"]
    assert p["session_inferred"] and p["turn_index"] >= 1 and p["stored_blocks"] == 2
    assert p["session_id"] not in {q["session_id"] for q in params}
    assert p["placement"] == "memory:short_reply"
    h.close()
