"""Where the worker's threads run (``store.thread_cpus``, ``cio.affinity``): an engine
thread bound to one core (as vLLM's CPU worker binds its compute thread) starts the
worker half, stores a turn and restores it from SSD and from memory; every FlatCake
thread then runs off that core (``auto``), on the named CPUs, or on the engine's core
(``inherit``). Bad settings are named."""

from __future__ import annotations

import os
import threading
from pathlib import Path

import pytest

from flatcake.cio.affinity import ThreadCpus
from flatcake.config import load_config
from tests.connectors.sides_harness import Harness, settings, ssd_hit_admitted

CPUS = frozenset(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else frozenset()
needs_two = pytest.mark.skipif(len(CPUS) < 2, reason="needs 2 CPUs this process may use")


def _run_bound_to(engine_cpu: int, tmp_path: Path, setting: str) -> dict[str, frozenset[int]]:
    """Drive the worker half from a thread bound to ``engine_cpu``; the CPUs of each
    FlatCake thread alive at the end, by thread name."""
    seen: dict[str, frozenset[int]] = {}
    failed: list[BaseException] = []
    # Threads an earlier test left running are not this worker half's.
    before = {t.native_id for t in threading.enumerate()}

    def engine() -> None:
        try:
            os.sched_setaffinity(0, {engine_cpu})
            h = Harness(tmp_path, settings(f"store.thread_cpus={setting}"))
            ssd_hit_admitted(h)
            plan, _, recving, _ = h.step()
            assert len(plan.loads) == 1 and recving == {"b"}
            for t in threading.enumerate():
                if (t.name.startswith("flatcake-") and t.native_id is not None
                        and t.native_id not in before):
                    seen[f"{t.name}#{t.native_id}"] = frozenset(
                        os.sched_getaffinity(t.native_id))
            h.close()
        except BaseException as exc:
            failed.append(exc)

    t = threading.Thread(target=engine)
    t.start()
    t.join(120)
    if failed:
        raise failed[0]
    assert seen, "no FlatCake thread ran"
    return seen


@needs_two
def test_auto_moves_every_flatcake_thread_off_the_engines_core(tmp_path: Path) -> None:
    engine_cpu = min(CPUS)
    seen = _run_bound_to(engine_cpu, tmp_path, "auto")
    names = {name.split("#")[0].rstrip("_0123456789") for name in seen}
    # restores, reads and the write queue all ran; none on the engine's core
    assert {"flatcake-restore", "flatcake-read", "flatcake-write"} <= names, names
    assert all(cpus == CPUS - {engine_cpu} for cpus in seen.values()), seen


@needs_two
def test_a_cpu_list_is_taken_and_inherit_stays_on_the_engines_core(tmp_path: Path) -> None:
    engine_cpu, other = sorted(CPUS)[:2]
    listed = _run_bound_to(engine_cpu, tmp_path / "a", str(other))
    assert set(listed.values()) == {frozenset({other})}, listed
    inherited = _run_bound_to(engine_cpu, tmp_path / "b", "inherit")
    assert set(inherited.values()) == {frozenset({engine_cpu})}, inherited


def test_auto_moves_only_where_the_starting_thread_is_bound() -> None:
    auto = ThreadCpus("auto")
    assert auto.target(frozenset({0}), frozenset({0, 1, 2, 3})) == {1, 2, 3}
    assert auto.target(frozenset({0, 1, 2, 3}), frozenset({0, 1, 2, 3})) is None
    assert auto.target(frozenset({0, 1}), frozenset({0, 1})) is None  # no binding
    assert ThreadCpus("inherit").target(frozenset({0}), frozenset({0, 1})) is None
    assert ThreadCpus("1,3-4").target(frozenset({0}), frozenset({0, 1})) == {1, 3, 4}


@pytest.mark.parametrize("bad", ["x", "1-", "3-1", "-1", "1,,2", ""])
def test_a_bad_setting_names_the_field(bad: str) -> None:
    with pytest.raises(ValueError, match=r"store\.thread_cpus"):
        load_config(env={}, overrides=[f"store.thread_cpus={bad}"])


def _flatcake_threads(before: set[int | None]) -> dict[int | None, str]:
    return {t.native_id: t.name.rstrip("_0123456789") for t in threading.enumerate()
            if t.name.startswith("flatcake-") and t.native_id not in before}


def test_registering_starts_the_load_threads_and_a_first_restore_starts_none(
        tmp_path: Path) -> None:
    before = {t.native_id for t in threading.enumerate()}
    h = Harness(tmp_path, settings("store.read_threads=3",
                                   "scheduler.max_restores_in_flight=2"))
    try:
        names = sorted(_flatcake_threads(before).values())
        assert names.count("flatcake-restore") == 2, names
        assert names.count("flatcake-read") == 3, names
        assert names.count("flatcake-sync-load") == 1, names
        ssd_hit_admitted(h)  # a turn stored on SSD, the next one's restore planned
        stored = _flatcake_threads(before)
        plan, _, recving, _ = h.step()  # the process's first restore
        assert len(plan.loads) == 1 and recving == {"b"}
        assert _flatcake_threads(before) == stored
    finally:
        h.close()
