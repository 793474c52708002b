"""The working set: N prompts revisited in order (or at random), each visit with a
question of its own."""

from __future__ import annotations

import itertools

import pytest

from flatcake.loadgen import TokenSpace, working_set

SPACE = TokenSpace(vocab_size=1 << 30)


def visits(n: int, **kw: object) -> list:
    wl = working_set(num_prompts=3, prompt_tokens=64, suffix_tokens=4, max_tokens=2,
                     tokens=SPACE, budget_tokens=1000, **kw)
    return [(s, wl.prompt(s.turns[0])) for s in itertools.islice(wl.sessions, n)]


def test_round_robin_revisits_the_same_prompt_with_a_new_question() -> None:
    got = visits(7)
    assert [s.name for s, _ in got] == ["ws-0", "ws-1", "ws-2", "ws-0", "ws-1", "ws-2",
                                        "ws-0"]
    (_, a), (_, b), (_, again) = got[0], got[1], got[3]
    assert len(a) == 68 and again[:64] == a[:64] and again[64:] != a[64:]
    assert b[:64] != a[:64]


def test_another_seed_gives_other_tokens_and_other_session_ids() -> None:
    wl = working_set(num_prompts=2, prompt_tokens=64, suffix_tokens=0, max_tokens=2,
                     tokens=TokenSpace(1 << 30, seed=5), budget_tokens=1000, seed=5)
    s = next(wl.sessions)
    assert s.name == "ws-0-s5" and wl.prompt(s.turns[0]) != visits(1)[0][1]


def test_random_order_is_seeded() -> None:
    one = [s.name for s, _ in visits(20, order="random", seed=3)]
    assert one == [s.name for s, _ in visits(20, order="random", seed=3)]
    assert set(one) == {"ws-0", "ws-1", "ws-2"} and one != sorted(one)


@pytest.mark.parametrize(("kw", "message"), [
    ({"num_prompts": 0}, "--working-set must be > 0"),
    ({"prompt_tokens": 997}, "exceed the context budget"),
    ({"suffix_tokens": -1}, "--suffix-tokens must be >= 0"),
    ({"order": "lru"}, "--order must be one of"),
])
def test_bad_working_sets_are_refused(kw: dict, message: str) -> None:
    args = {"num_prompts": 3, "prompt_tokens": 64, "suffix_tokens": 4, "max_tokens": 2,
            "tokens": SPACE, "budget_tokens": 1000, **kw}
    with pytest.raises(ValueError, match=message):
        working_set(**args)
