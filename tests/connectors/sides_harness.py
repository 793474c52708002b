"""The connector's two halves driven step by step without vLLM (``test_sides`` and the
cluster tests use it): a scheduler half on a real control plane, a worker half moving
real bytes, and a paged KV of torch tensors with random bytes."""

from __future__ import annotations

import time
from collections.abc import Callable
from pathlib import Path

import torch

from flatcake.cio.direct import aligned_buffer
from flatcake.clock import ManualClock
from flatcake.config import FlatCakeConfig, load_config
from flatcake.connectors.group_slots import StepSlots
from flatcake.connectors.scheduler_side import RequestView, SchedulerSide
from flatcake.connectors.worker_side import WorkerSide
from flatcake.control.keys import chain_block_keys
from flatcake.geometry import KVGeometry
from flatcake.plan.tasks import StepPlan

G = KVGeometry(num_layers=3, tokens_per_block=4, num_kv_heads=2, head_dim=8,
               dtype="float32", name="tiny")  # 512 bytes per block per layer
# The same layers with 4 KiB blocks: restores read straight into the slots, and writes
# go straight from them on the writer's threads.
G4K = KVGeometry(num_layers=3, tokens_per_block=4, num_kv_heads=2, head_dim=64,
                 dtype="float32", name="tiny")
SLOTS = 64


def settings(*overrides: str, infer: bool = True) -> FlatCakeConfig:
    base = ["store.memory_capacity_bytes=1048576", "store.ssd_capacity_bytes=67108864",
            "store.session_file_bytes=16777216", "placement.short_reply_threshold_tokens=512",
            "placement.shared_refcount_threshold=2", "placement.memory_copy_watermark=0"]
    return load_config(env={}, overrides=[*base, f"engine.infer_sessions={infer}",
                                          *overrides])


def random_kv(seed: int, g: KVGeometry = G, misalign: int = 0) -> list[torch.Tensor]:
    """The paged KV of a harness made with ``seed``: random bytes in every slot, each
    layer 4 KiB-aligned (zero-copy reads may go into it) plus ``misalign`` bytes."""
    gen = torch.Generator().manual_seed(seed)
    shape = (SLOTS, 2, g.tokens_per_block, g.num_kv_heads, g.head_dim)
    out = []
    for _ in range(g.num_layers):
        t = aligned_buffer(SLOTS * g.block_bytes // g.num_layers + misalign,
                           pin=False)[misalign:]
        out.append(t.view(torch.float32).view(shape).copy_(torch.rand(shape, generator=gen)))
    return out


class Harness:
    """One engine: a scheduler half, a worker half, and its paged KV (random bytes)."""

    def __init__(self, root: Path, s: FlatCakeConfig | None = None, seed: int = 0,
                 clock: ManualClock | None = None,
                 worker_config: FlatCakeConfig | None = None, g: KVGeometry = G,
                 misalign: int = 0) -> None:
        self.s = s if s is not None else settings()
        self.worker = WorkerSide(g, worker_config or self.s, root)
        self.sched = SchedulerSide(g, self.s, root, clock=clock)
        self.kv = random_kv(seed, g, misalign)
        self.worker.register(self.kv)
        self.reports: list[tuple[set[str], set[str], set[int]]] = []
        self.finished: set[str] = set()  # requests finished since the last step
        self.released: list[str] = []  # restores released to the engine, in order

    def step(self, before_forward: Callable[[], object] | None = None
             ) -> tuple[StepPlan, set[str], set[str], set[int]]:
        """One engine step: plan, execute (sync loads per layer), wait for background
        I/O, report back. ``before_forward``: what the engine thread does between
        starting the step's loads and its forward pass (no wait for a layer, no poll,
        so no deadline is acted on before it returns)."""
        finished, self.finished = self.finished, set()
        plan = self.sched.build_step()
        self.worker.start_step(plan)
        if before_forward is not None:
            before_forward()
        for layer in range(len(self.kv)):
            self.worker.wait_for_layer(layer)
        self.worker.end_step()
        deadline = time.monotonic() + 30
        while self.worker.pending() and time.monotonic() < deadline:
            self._report(finished)
            time.sleep(0.01)
        self._report(finished)
        all_s = set().union(*(r[0] for r in self.reports))
        all_r = set().union(*(r[1] for r in self.reports))
        all_i = set().union(*(r[2] for r in self.reports))
        self.reports = []
        return plan, all_s, all_r, all_i

    def _report(self, finished: set[str]) -> None:
        """What the connector does with a poll: the report to the books, and as the
        restores the engine may run, those FC-MAS's ready queue released."""
        sending, recving, invalid, report = self.worker.poll(finished)
        self.sched.on_report(report)
        released = self.sched.take_released(recving)
        self.released.extend(released)
        self.reports.append((sending, set(released), invalid))

    def block(self, layer: int, slot: int) -> bytes:
        return self.kv[layer][slot].contiguous().view(torch.uint8).numpy().tobytes()

    def recompute(self, slots: list[int]) -> dict[tuple[int, int], bytes]:
        """The engine recomputes ``slots`` (blocks a given-up load left): new bytes in
        every layer, returned by (layer, slot)."""
        for layer in range(len(self.kv)):
            for s in slots:
                self.kv[layer][s].fill_(7.0)
        return {(layer, s): self.block(layer, s) for layer in range(len(self.kv))
                for s in slots}

    def wait_late_reads(self, timeout_s: float = 10.0) -> None:
        """Until the reads of every given-up load ended (a released disk)."""
        deadline = time.monotonic() + timeout_s
        while self.worker.late_reads() and time.monotonic() < deadline:
            time.sleep(0.01)

    def close(self) -> None:
        self.worker.close()
        self.sched.close()


def stored_turn(h: Harness) -> list[int]:
    """Session ``s``'s first turn, 4 full blocks + 1 token in slots 1-5, written to SSD
    (first-turn placement) and durable; returns its tokens."""
    turn0 = list(range(100, 117))
    p = finish(h, "a", turn0, [1, 2, 3, 4, 5], out=3, session="s")
    assert p["placement"] == "ssd:first_turn"
    h.step()
    return turn0


def ssd_hit_admitted(h: Harness) -> RequestView:
    """Session ``s``'s first turn, 3 full blocks + 1 token in slots 5-8, durable on SSD
    (first-turn placement); then its second turn ``b`` looked up (an async SSD hit of
    12 tokens) and admitted into slots 20-24. Returns ``b``."""
    turn0 = list(range(100, 113))
    finish(h, "a", turn0, [5, 6, 7, 8], out=3, session="s")
    h.step()
    v = view("b", tokens(turn0, 8, 200), session="s")
    assert h.sched.num_matched_tokens(v, 0) == (12, True)
    h.sched.after_alloc("b", [20, 21, 22, 23, 24], 12)
    return v


def tokens(prefix: list[int], n: int, start: int) -> list[int]:
    return prefix + list(range(start, start + n))


def view(rid: str, toks: list[int], *, prompt: int | None = None, out: int = 0,
         computed: int = 0, session: str | None = None) -> RequestView:
    keys = tuple(chain_block_keys(toks, G.tokens_per_block, "tiny"))
    return RequestView(rid, keys, len(toks), prompt if prompt is not None else len(toks),
                       out, computed, session)


def end(h: Harness, v: RequestView, slots: list[int] | None = None) -> tuple[bool, dict]:
    """``v``'s prompt was computed in the step just planned (its store is planned when
    ``slots`` are given: the prompt's full blocks sit in them), then it finished."""
    if slots is not None:
        h.sched.prompt_computed(v, slots)
    delay, params = h.sched.request_finished(v)
    h.finished.add(v.request_id)
    assert params is not None
    return delay, params


def finish(h: Harness, rid: str, toks: list[int], slots: list[int], *, out: int,
           session: str | None = None) -> dict:
    """A turn whose prompt is ``toks`` ran: lookup (it missed), its prompt computed and
    its store planned, then it finished with an ``out``-token reply."""
    v = view(rid, toks, out=out, computed=len(toks), session=session)
    h.sched.num_matched_tokens(v, 0)
    delay, params = end(h, v, slots)
    return params["flatcake"] | {"delay": delay}


def grouped_step(worker: WorkerSide, sched: SchedulerSide, slots: StepSlots,
                 after: object = None) -> tuple[set[str], set[str]]:
    """One step of an engine of several KV cache groups (every load async); ``after``
    runs when the forward pass ends (the engine reusing a slot). Returns (finished
    loads, failed requests)."""
    worker.start_step(sched.build_step(), slots)
    worker.end_step()
    if callable(after):
        after()
    recving: set[str] = set()
    deadline = time.monotonic() + 60
    while True:
        _s, r, _i, report = worker.poll()
        sched.on_report(report)
        sched.take_released(r)  # as vLLM does (``update_connector_output``)
        recving |= r
        if not worker.pending() or time.monotonic() > deadline:
            break
        time.sleep(0.01)
    return recving, worker.take_failed_requests()
