"""Which CPUs FlatCake's background threads run on (``store.thread_cpus``).

An engine on a CPU binds its compute threads to cores (vLLM's CPU worker: one OpenMP
thread per core of ``VLLM_CPU_OMP_THREADS_BIND``, bound from the worker's start), and a
thread inherits the CPUs of the thread that starts it. Left alone, FlatCake's restore,
read, crc and write threads, started from the engine's thread, would share its compute
core and take their time from the forward pass. ``ThreadCpus.pin`` runs first in each
thread the executor starts from an engine's thread (its restore, all-memory load and
remote pools, the worker's write queue) and moves it:

    ``auto`` (default)  off the starting thread's CPUs onto the other CPUs the process
                        was started with (its parent's, which the engine's binding does
                        not narrow), where the starting thread is bound to fewer of
                        them; otherwise (no binding, or it covers every CPU) nothing
                        moves
    ``inherit``         never moves (the threads share the starting thread's CPUs)
    ``0,2-3``           onto exactly these CPUs

Threads a pinned thread starts (the reader's ``preadv`` threads, crc threads, the
writer's chunk threads) inherit its CPUs. With several engine ranks bound on one
machine, ``auto`` may move one rank's threads onto another rank's cores: name the
reserved cores instead.

A pool starts its threads one per task, on its first tasks, unless ``start_threads``
starts them all at once: the engine's worker half does so when it registers its KV
(``Executor.start_threads``), from the engine's thread, so a first restore starts
(and pins) none.
"""

from __future__ import annotations

import logging
import os
import threading
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field

from flatcake.config import THREAD_CPUS_WORDS, parse_cpu_list

logger = logging.getLogger(__name__)

AUTO, INHERIT = THREAD_CPUS_WORDS


def _started_cpus() -> frozenset[int]:
    """The CPUs this process was started with: its parent's (an engine's binding
    narrows the worker's own threads only); all online CPUs if that cannot be read."""
    try:
        return frozenset(os.sched_getaffinity(os.getppid()))
    except OSError:
        return frozenset(range(os.cpu_count() or 1))


@dataclass(slots=True)
class ThreadCpus:
    """One store's ``store.thread_cpus`` setting, applied by each thread it starts."""

    setting: str = AUTO
    _logged: bool = field(default=False, repr=False)
    _lock: threading.Lock = field(default_factory=threading.Lock, repr=False)

    def __post_init__(self) -> None:
        if self.setting not in THREAD_CPUS_WORDS:
            parse_cpu_list(self.setting)  # the config checked it; a direct caller too

    def target(self, own: frozenset[int], started: frozenset[int]) -> frozenset[int] | None:
        """The CPUs a thread now on ``own`` moves to (None: it stays), for a process
        started on ``started``."""
        if self.setting == INHERIT:
            return None
        if self.setting != AUTO:
            return parse_cpu_list(self.setting)
        return (started - own) or None  # empty: own covers every CPU, nothing to move

    def pin(self) -> None:
        """Move the calling thread as the setting says (see the module docstring). A
        move the kernel refuses (CPUs outside the process's cpuset) is logged once and
        the thread keeps its CPUs."""
        if not hasattr(os, "sched_setaffinity") or self.setting == INHERIT:
            return
        own = frozenset(os.sched_getaffinity(0))
        to = self.target(own, _started_cpus() if self.setting == AUTO else own)
        if to is None or to == own:
            return
        try:
            os.sched_setaffinity(0, to)
        except OSError as exc:
            self._log_once(logging.WARNING, "FlatCake threads stay on CPUs %s: moving them "
                           "to %s (store.thread_cpus=%s) failed: %s", _text(own), _text(to),
                           self.setting, exc)
            return
        self._log_once(logging.INFO, "FlatCake threads run on CPUs %s, off the starting "
                       "thread's %s (store.thread_cpus=%s)", _text(to), _text(own),
                       self.setting)

    def pool(self, max_workers: int, name: str) -> ThreadPoolExecutor:
        """A thread pool whose threads ``pin`` themselves first."""
        return ThreadPoolExecutor(max_workers, thread_name_prefix=name, initializer=self.pin)

    def _log_once(self, level: int, msg: str, *args: object) -> None:
        with self._lock:
            if self._logged:
                return
            self._logged = True
        logger.log(level, msg, *args)


def start_threads(pool: ThreadPoolExecutor, num_threads: int,
                  timeout_s: float = 30.0) -> None:
    """Start ``num_threads`` threads of ``pool`` (at most its ``max_workers``) now, each
    running the pool's initializer (``ThreadCpus.pin``) as it starts. Each of them takes
    one task that waits until all of them run it, so no task lands on a thread another
    one started: the pool starts every thread it lacks. Threads it already has count. A
    thread that does not start within ``timeout_s`` is logged; the pool then starts it
    with a later task, as it would have."""
    barrier = threading.Barrier(num_threads + 1)
    for _ in range(num_threads):
        pool.submit(barrier.wait, timeout_s)
    try:
        barrier.wait(timeout_s)
    except threading.BrokenBarrierError:
        logger.warning("FlatCake started fewer than %d threads of a pool within %.0f s; "
                       "the rest start with its first tasks", num_threads, timeout_s)


def _text(cpus: frozenset[int]) -> str:
    return ",".join(map(str, sorted(cpus)))
