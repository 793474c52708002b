"""The write comparison of ``flatcake bench``: FlatCake's turn writes and the device's
sequential O_DIRECT write of the same number of bytes, side by side in rounds.

One sample of each is not a verdict on a disk shared with other jobs (the device's
sequential write swung from 2.4 to 3.7 GB/s between runs minutes apart here), so the
bench takes ``rounds`` pairs, alternating which of the two goes first, and compares
the medians, as it does for restores. Round 0 is the pair the rest of the run uses
(the device file the restores read, the store they restore from); the other rounds
write to throw-away files removed at once.
"""

from __future__ import annotations

import os
import shutil
import statistics
from collections.abc import Callable, Sequence
from dataclasses import dataclass

import torch

from flatcake.bench import device as dev
from flatcake.bench.flatcake_side import FlatcakeSide
from flatcake.geometry import KVGeometry


@dataclass(frozen=True, slots=True)
class WriteSample:
    """One round: the device's sequential write and FlatCake's turn writes."""

    device_gbps: float
    flatcake_bytes: int
    flatcake_s: float
    flatcake_cpu_s: float

    @property
    def flatcake_gbps(self) -> float:
        return self.flatcake_bytes / self.flatcake_s / 1e9 if self.flatcake_s > 0 else 0.0


def timed_turn_writes(fc: FlatcakeSide, cpu_s: Callable[[], float]) -> tuple[int, float, float]:
    """``fc.write_turns()`` with this process's CPU seconds: (bytes, wall s, CPU s)."""
    cpu0 = cpu_s()
    written, seconds = fc.write_turns()
    return written, seconds, cpu_s() - cpu0


def extra_rounds(root: str, geometry: KVGeometry, source: Sequence[torch.Tensor], *,
                 rounds: int, num_turns: int, device_bytes: int, chunk_bytes: int,
                 in_flight: int, seed: int, cpu_s: Callable[[], float]) -> list[WriteSample]:
    """Rounds 1 .. ``rounds - 1``: each a fresh device file and a fresh store under
    ``root``, both removed after the round; odd rounds write FlatCake's turns first."""
    samples = []
    for r in range(1, rounds):
        path = os.path.join(root, f"device-write-{r}.bin")
        store = FlatcakeSide(os.path.join(root, f"store-write-{r}"), geometry, source,
                             num_turns=num_turns, read_threads=1, seed=seed)
        try:
            if r % 2:
                written, seconds, cpu = timed_turn_writes(store, cpu_s)
            gbps = dev.write_sequential(path, device_bytes, chunk_bytes=chunk_bytes,
                                        in_flight=in_flight, seed=seed + r).gbps
            if not r % 2:
                written, seconds, cpu = timed_turn_writes(store, cpu_s)
        finally:
            store.close()
            shutil.rmtree(os.path.join(root, f"store-write-{r}"), ignore_errors=True)
            if os.path.exists(path):
                os.unlink(path)
        samples.append(WriteSample(gbps, written, seconds, cpu))
    return samples


def medians(samples: Sequence[WriteSample]) -> WriteSample:
    """The median of each figure over the rounds (FlatCake's by its seconds)."""
    if not samples:
        raise ValueError("medians of no write rounds")
    return WriteSample(
        statistics.median(s.device_gbps for s in samples), samples[0].flatcake_bytes,
        statistics.median(s.flatcake_s for s in samples),
        statistics.median(s.flatcake_cpu_s for s in samples))


def rounds_note(samples: Sequence[WriteSample]) -> str:
    """One line for the report: every round's two figures."""
    pairs = ", ".join(f"{s.flatcake_gbps:.2f}/{s.device_gbps:.2f}" for s in samples)
    return (f"write rounds (flatcake/device GB/s, medians compared): {pairs}")
