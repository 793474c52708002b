"""Prompt tokens: a block id always becomes the same run of tokens, so two prompts share
exactly the tokens of the ids they share, and nothing else."""

from __future__ import annotations

import numpy as np
import pytest

from flatcake.loadgen import MIN_TOKEN_ID, TokenSpace


def test_the_same_block_id_gives_the_same_tokens_anywhere() -> None:
    space = TokenSpace(vocab_size=32000, seed=7)
    a = space.block_tokens([5, 9, 11], 16)
    b = space.block_tokens([11, 5], 16)
    assert a.shape == (3, 16)
    assert (a[0] == b[1]).all() and (a[2] == b[0]).all()
    assert not (a[0] == a[1]).all()
    # A new token space with the same seed agrees: nothing is kept between calls.
    assert (TokenSpace(32000, 7).block_tokens([9], 16)[0] == a[1]).all()


def test_reuse_between_prompts_is_exactly_the_shared_ids() -> None:
    space = TokenSpace(vocab_size=1 << 30)  # a collision would need 2**-30 luck
    first = space.prompt([1, 2, 3, 4], 8, tail_key=0, tail_tokens=5)
    second = space.prompt([1, 2, 3, 7, 8], 8, tail_key=1, tail_tokens=5)
    assert len(first) == 4 * 8 + 5 and len(second) == 5 * 8 + 5
    shared = next(i for i, (x, y) in enumerate(zip(first, second, strict=False)) if x != y)
    assert shared == 3 * 8
    # The tails are each request's own.
    assert first[-5:] != second[-5:]
    assert space.prompt([1, 2, 3, 4], 8, 0, 5) == first


def test_tokens_stay_inside_the_vocabulary_and_the_seed_changes_them() -> None:
    ids = np.arange(200, dtype=np.int64)
    small = TokenSpace(vocab_size=MIN_TOKEN_ID + 2).block_tokens(ids, 4)
    assert small.min() >= MIN_TOKEN_ID and small.max() < MIN_TOKEN_ID + 2
    big = TokenSpace(vocab_size=512, seed=0).block_tokens(ids, 4)
    assert big.min() >= MIN_TOKEN_ID and big.max() < 512
    assert not (TokenSpace(512, seed=1).block_tokens(ids, 4) == big).all()
    assert TokenSpace(512).tail_tokens(3, 0).shape == (0,)


@pytest.mark.parametrize("vocab", [0, MIN_TOKEN_ID + 1])
def test_a_vocabulary_too_small_is_refused(vocab: int) -> None:
    with pytest.raises(ValueError, match="vocab_size must be"):
        TokenSpace(vocab_size=vocab)


def test_block_tokens_must_be_positive() -> None:
    with pytest.raises(ValueError, match="block_tokens must be > 0"):
        TokenSpace(512).block_tokens([1], 0)
