"""Hypothesis profiles for the whole suite, picked by ``HYPOTHESIS_PROFILE``:

    ci   (the default: ``make test`` and CI) today's settings, unchanged: Hypothesis' own
         defaults (100 examples, a 200 ms deadline, the example database in
         .hypothesis/), or its own ``ci`` profile (derandomized, no deadline, no
         database) where Hypothesis detects a CI service and loads that one itself.
         Explicit per-test ``@settings`` and ``Machine.TestCase.settings`` apply as they
         are.
    dev  the inner loop (``make check-fast``): 10 examples and no deadline for every
         property and stateful test, those with explicit settings included (their other
         settings, such as the step count, are kept).

This file is loaded before any test module, so the profile is in place when the test
modules build their ``settings(...)`` objects (which inherit the profile's values).

At the end of a run, one line says how many cluster tests skipped for want of
``redis-server`` (or its client) and how to install it, as ``.ci/run`` does.
"""

from __future__ import annotations

import os
from collections.abc import Iterable

import pytest
from hypothesis import settings

DEV_MAX_EXAMPLES = 10

settings.register_profile("ci", settings.get_profile(settings.get_current_profile_name()))
settings.register_profile("dev", max_examples=DEV_MAX_EXAMPLES, deadline=None)
settings.load_profile(os.environ.get("HYPOTHESIS_PROFILE", "ci"))


def _capped(explicit: settings) -> settings:
    return settings(explicit, max_examples=min(explicit.max_examples, DEV_MAX_EXAMPLES),
                    deadline=None)


def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    """Under ``dev``, cap the examples of tests that set their own (explicit settings
    win over any profile). Hypothesis reads a ``@given`` test's settings from the
    attribute ``@settings`` sets, and a state machine's from ``TestCase.settings``."""
    if settings.get_current_profile_name() != "dev":
        return
    for item in items:
        test = getattr(getattr(item, "obj", None), "__func__", getattr(item, "obj", None))
        if not getattr(test, "is_hypothesis_test", False):
            continue
        if getattr(test, "_hypothesis_state_machine_class", None) is not None:
            case = item.cls  # type: ignore[attr-defined]
            case.settings = _capped(case.settings)
        else:
            test._hypothesis_internal_use_settings = _capped(  # type: ignore[union-attr]
                test._hypothesis_internal_use_settings)  # type: ignore[union-attr]


def redis_skip_line(skipped: Iterable[pytest.TestReport], why: str | None) -> str | None:
    """``N cluster tests skipped: <why>`` when ``why`` (``redis_available``'s reason)
    is the reason of some of ``skipped``; None otherwise."""
    if not why:
        return None
    n = sum(1 for r in skipped if isinstance(r.longrepr, tuple) and why in str(r.longrepr[-1]))
    return f"{n} cluster test{'s' * (n != 1)} skipped: {why}" if n else None


def pytest_terminal_summary(terminalreporter: pytest.TerminalReporter) -> None:
    from flatcake.cluster import redis_available

    line = redis_skip_line(terminalreporter.stats.get("skipped", []), redis_available())
    if line:
        terminalreporter.write_line(line, yellow=True, bold=True)
