"""Which signal, known when a turn is written, says the turn will be read back from the SSD?

    PYTHONPATH=src python scripts/continuation_signals.py [TRACE] [--rates 1,8]
        [--preset paper] [--host-gib G] [--runs 3] [--json OUT]

Issue 44 (write what will be read). TRACE defaults to the Mooncake conversation trace.
Per rate, on FlatCake in the replay (``flatcake replay TRACE --preset P --rate R``):

1. **Today's rule**, every store recorded with the signals it had when it was placed,
   and whether its SSD segment was later read back from the SSD (a memory copy serving it
   does not count) and whether a later request's prompt ran through its last block
   (the session continued, or its prefix was asked for again).
2. **Oracle**: written only what is read back. ``arithmetic`` is today's bytes written
   less those never read; ``replayed`` runs the trace again with every store that was
   never read placed in host memory and never written (memory reclaim drops it; a
   later store of its session writes the blocks it dropped, as today), so its hit rate
   is what keeping exactly those turns off the SSD keeps.
3. **Signals**: for each, the ROC AUC of "read back" among today's SSD stores, and at a
   few thresholds the rule "write now when the signal passes, else not yet": the share
   of stores and bytes written now, precision (written now and read back / written now)
   and recall (written now and read back / read back); and the AUC of all signals at
   once (a logistic fit on the first half of the stores, scored on the second).
4. **Rules replayed**: every first turn deferred (``placement.not_yet`` without its
   exceptions for agent contexts and shared prefixes), then
   the ``--runs`` signals with the AUC furthest from 0.5, each at its median (about
   half the stores written now), and the combined fit at its median; the deferred turns
   placed not yet: written to the SSD with their session's next SSD store, or dropped
   unwritten by memory reclaim first.

The placement a rule forces is a measurement override (``decide_placement`` is wrapped
for the run, nothing else changes): a deferred store gets the not-yet answer unless
memory is full; every other store gets today's rule.
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import math
import sys
from collections import Counter
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any
from unittest import mock

import numpy as np

import flatcake.control.stores as stores_module
from flatcake.config import FlatCakeConfig
from flatcake.control.address import Medium
from flatcake.control.placement import (
    Placement,
    PlacementRule,
    PlacementSignals,
    decide_placement,
)
from flatcake.control.types import StorePlan
from flatcake.replay.node.node import Node, Request, not_attached
from flatcake.replay.presets import ReplayPreset, get_preset
from flatcake.replay.simulate import replay_blocks, timed_run
from flatcake.replay.systems.flatcake import FlatCakeSystem
from flatcake.replay.systems.keys import keys_of
from flatcake.replay.workload.source import load_workload
from flatcake.replay.workload.trace import Workload

MOONCAKE = "../shared/traces/mooncake-fast25/conversation_trace.jsonl"
GB = 1e9
SIGNALS = ("turn_index", "context_tokens", "reply_tokens", "prev_reply_tokens",
           "session_age_s", "gap_s", "new_share", "prefix_seen", "class_share", "shared")
"""Signals a store has when it is placed (``Row``): the session's turn (inferred on a
trace without sessions), the prompt's tokens, the reply's just generated, the previous
reply's (NaN on a first turn), seconds since the session's first arrival, seconds from
its previous turn's end to this turn's arrival (NaN on a first turn; negative when the
turns overlapped), the share of the prompt's blocks not stored yet, requests seen so far
whose first block is this prompt's, the share of earlier stores of similar prompts
(same turn 0 / 1 / 2 / 3+, same power-of-two length) continued so far (NaN for the
first), and the live requests holding the first block not stored yet."""
THRESHOLD_QUANTILES = (0.25, 0.5, 0.75)
_NOT_YET = Placement(Medium.MEMORY, PlacementRule.NOT_YET)
Rule = Callable[[int, dict[str, float]], bool]
"""(request, signals of its store) -> write it now (False: defer it)."""


@dataclasses.dataclass(slots=True)
class Row:
    """One store: the signals it had when placed, then what became of it."""

    idx: int  # request
    signals: dict[str, float]
    medium: str = ""
    total_bytes: int = 0
    segment_id: int = -1
    read: bool = False  # its SSD segment was read back from the SSD
    continued: bool = False  # a later prompt ran through its last block


class Probe(FlatCakeSystem):
    """FlatCake in the replay, recording every store; ``rule`` (signals -> write now)
    defers the stores it says no to (placed not yet)."""

    def __init__(self, config: FlatCakeConfig, rule: Rule | None = None) -> None:
        super().__init__(config)
        self.rule = rule
        self.rows: list[Row] = []
        self.read_segments: set[int] = set()
        self.defer = False  # the store being prepared is deferred
        self._req: Request | None = None
        self._awaiting: dict[bytes, list[int]] = {}  # a store's last key -> rows
        self._arrived: set[int] = set()
        self._prefix_seen: Counter[bytes] = Counter()  # first key -> requests seen
        # "similar prompts": same turn (0, 1, 2, 3+) and power-of-two prompt length
        self._class_of: list[tuple[int, int]] = []
        self._class_rows: Counter[tuple[int, int]] = Counter()
        self._class_cont: Counter[tuple[int, int]] = Counter()
        self._seen_at: dict[int, int] = {}  # request -> prefix_seen on arrival
        self._first_s: dict[str, float] = {}  # session -> first arrival
        self._last_done_s: dict[str, float] = {}  # session -> last turn's end

    def attach(self, node: Node) -> None:
        super().attach(node)
        cp = self.cp
        if cp is None:
            raise not_attached(self.name)
        prepare, wear = cp.prepare_store, cp._wear
        read = wear.read

        def recording_read(hit: Any, ssd_bytes: int) -> None:
            if ssd_bytes:
                self.read_segments.update(r.segment.segment_id for r in hit.runs
                                          if r.segment.medium is Medium.SSD)
            read(hit, ssd_bytes)

        def recording_prepare(sid: str, keys: Any, **kw: Any) -> StorePlan | None:
            return self._prepare(prepare, sid, keys, **kw)

        wear.read = recording_read  # type: ignore[method-assign]
        cp.prepare_store = recording_prepare  # type: ignore[method-assign]

    def on_arrival(self, req: Request) -> None:
        if req.idx not in self._arrived:
            self._arrived.add(req.idx)
            keys = keys_of(self.keys, req.runs)
            for key in keys:
                for row in self._awaiting.pop(key, ()):
                    self.rows[row].continued = True
                    self._class_cont[self._class_of[row]] += 1
            if keys:
                self._seen_at[req.idx] = self._prefix_seen[keys[0]]
                self._prefix_seen[keys[0]] += 1
        super().on_arrival(req)

    def on_complete(self, req: Request) -> None:
        self._req = req
        try:
            super().on_complete(req)
        finally:
            self._req = None
            sid = self._sid(req)
            self._first_s.setdefault(sid, req.arrival_s)
            self._last_done_s[sid] = self.node.now if self.node is not None else 0.0

    def _sid(self, req: Request) -> str:
        return str(req.session) if req.session >= 0 else req.sys.turn.session_id

    def _prepare(self, prepare: Callable[..., StorePlan | None], sid: str, keys: Any,
                 **kw: Any) -> StorePlan | None:
        req = self._req
        if req is None or not keys:
            return prepare(sid, keys, **kw)
        shared = kw.get("shared_refcount", 1)
        turn, context = kw["turn_index"], kw["context_tokens"]
        cls = (min(turn, 3), max(int(context), 1).bit_length())
        hit = req.sys.hit.num_blocks
        rows = self._class_rows[cls]
        prev = kw.get("prev_reply_tokens")
        last = self._last_done_s.get(sid)
        signals = {
            "turn_index": float(turn),
            "context_tokens": float(context),
            "reply_tokens": float(req.output_tokens),
            "prev_reply_tokens": math.nan if prev is None else float(prev),
            "session_age_s": req.arrival_s - self._first_s.get(sid, req.arrival_s),
            "gap_s": math.nan if last is None else req.arrival_s - last,
            "new_share": max(0.0, 1.0 - hit / len(keys)),
            "prefix_seen": float(self._seen_at.get(req.idx, 0)),
            "class_share": self._class_cont[cls] / rows if rows else math.nan,
            # live requests holding the first block not stored yet
            "shared": float(shared(min(hit, len(keys) - 1)) if callable(shared) else shared),
        }
        self.defer = self.rule is not None and not self.rule(req.idx, signals)
        try:
            plan = prepare(sid, keys, **kw)
        finally:
            self.defer = False
        if plan is None:
            return None
        row = Row(req.idx, signals, plan.medium.name.lower(), plan.segment.total_bytes,
                  plan.segment.segment_id)
        self.rows.append(row)
        self._class_of.append(cls)
        self._class_rows[cls] += 1
        self._awaiting.setdefault(plan.segment.keys[-1], []).append(len(self.rows) - 1)
        return plan

    def finish_rows(self) -> list[Row]:
        for row in self.rows:
            row.read = row.segment_id in self.read_segments
        return self.rows


@contextmanager
def forced(probe: Probe) -> Iterator[None]:
    """``decide_placement`` with the probe's deferral: a deferred store is placed not
    yet unless memory is full; any other store by today's rule (``not_yet`` off)."""

    def decide(signals: PlacementSignals, cfg: Any) -> Placement:
        if probe.defer and not signals.memory_full:
            return _NOT_YET
        return decide_placement(signals, dataclasses.replace(cfg, not_yet=False))

    with mock.patch.object(stores_module, "decide_placement", decide):
        yield


def replay(wl: Workload, preset: ReplayPreset, rate: float, rule: Rule | None,
           write_on_continue: bool = True) -> tuple[dict[str, Any], list[Row]]:
    """One FlatCake run with ``rule`` (None: today's); its metrics and stores. A store
    ``rule`` defers is placed not yet: with ``write_on_continue`` (the not-yet books
    on) written to the SSD with its session's next SSD store, else a plain memory home
    that only reclaim ends."""
    wl, geometry = replay_blocks(wl, preset)
    cfg = preset.flatcake_config()
    cfg = dataclasses.replace(cfg, placement=dataclasses.replace(
        cfg.placement, not_yet=rule is not None and write_on_continue,
        not_yet_write_back=False))
    probe = Probe(cfg, rule)
    node = Node(wl, probe, preset.node, geometry, rate, 0, think_cap_s=preset.think_cap_s)
    with forced(probe):
        m = timed_run(node.run, probe.extra_metrics, wl, "flatcake", rate, preset, 0)
    return m.to_dict(), probe.finish_rows()


def summary(d: dict[str, Any]) -> dict[str, Any]:
    return {"hit_pct": 100 * d["hit_rate_gpu"], "ttft_mean_s": d["ttft_mean_s"],
            "written_gb": d["ssd_write_bytes"] / GB, "read_gb": d["ssd_read_bytes"] / GB,
            "never_read_gb": d["ssd_never_read_bytes"] / GB,
            "placements": {k: v for k, v in d["placements"].items() if v}}


def auc(x: np.ndarray, y: np.ndarray) -> float:
    """P(a read-back store's signal > a never-read one's), ties half (NaN: excluded)."""
    ok = ~np.isnan(x)
    x, y = x[ok], y[ok]
    pos, neg = int(y.sum()), int((~y).sum())
    if not pos or not neg:
        return math.nan
    order = np.argsort(x, kind="stable")
    ranks = np.empty(len(x))
    xs = x[order]
    # average ranks over ties
    _, first, counts = np.unique(xs, return_index=True, return_counts=True)
    avg = first + (counts - 1) / 2.0 + 1
    ranks[order] = np.repeat(avg, counts)
    return float((ranks[y].sum() - pos * (pos + 1) / 2) / (pos * neg))


def threshold_rule(signal: str, thr: float, above: bool) -> Rule:
    """Write now when ``signal`` >= ``thr`` (``above``) or <= it; NaN: write now."""
    def rule(_idx: int, s: dict[str, float]) -> bool:
        v = s[signal]
        return math.isnan(v) or (v >= thr if above else v <= thr)
    return rule


def _features(signals: list[dict[str, float]]) -> np.ndarray:
    """Each signal, an unknown one 0 with a flag, and a constant."""
    raw = np.array([[s[n] for n in SIGNALS] for s in signals], dtype=np.float64)
    unknown = np.isnan(raw)
    return np.hstack([np.where(unknown, 0.0, raw), unknown, np.ones((len(raw), 1))])


def fit_combined(rows: list[Row]) -> tuple[float, Callable[[dict[str, float]], float] | None]:
    """All signals at once: a logistic fit of "read back" on the SSD stores of the first
    half of the run (signals standardised); its AUC on the second half, and its score."""
    ssd = [r for r in rows if r.medium == "ssd"]
    if len(ssd) < 4:
        return math.nan, None
    x = _features([r.signals for r in ssd])
    half = len(ssd) // 2
    mu, sd = x[:half].mean(axis=0), x[:half].std(axis=0)
    mu[-1], sd = 0.0, np.where(sd > 0, sd, 1.0)
    x = (x - mu) / sd
    y = np.array([r.read for r in ssd], dtype=np.float64)
    w = np.zeros(x.shape[1])
    for _ in range(50):  # Newton steps, a small ridge keeps them defined
        p = 1 / (1 + np.exp(-x[:half] @ w))
        grad = x[:half].T @ (p - y[:half]) + 1e-3 * w
        hess = (x[:half].T * (p * (1 - p))) @ x[:half] + 1e-3 * np.eye(len(w))
        w -= np.linalg.solve(hess, grad)

    def score(signals: dict[str, float]) -> float:
        return float(((_features([signals])[0] - mu) / sd) @ w)

    return auc(x[half:] @ w, y[half:].astype(bool)), score


def signal_table(rows: list[Row]) -> tuple[list[dict[str, Any]], list[tuple[str, float, bool]]]:
    """Per signal: AUC of "read back" and of "continued" among SSD stores, and precision
    / recall of "read back" at quantile thresholds (in the direction its AUC says);
    the candidate rules (signal, threshold, above), the best AUC first, each at the
    threshold that writes about half the stores now."""
    ssd = [r for r in rows if r.medium == "ssd"]
    y = np.array([r.read for r in ssd], dtype=bool)
    cont = np.array([r.continued for r in ssd], dtype=bool)
    nbytes = np.array([r.total_bytes for r in ssd], dtype=np.float64)
    out: list[dict[str, Any]] = []
    cands: list[tuple[float, str, float, bool]] = []
    for name in SIGNALS:
        x = np.array([r.signals[name] for r in ssd], dtype=np.float64)
        a = auc(x, y)
        above = not a < 0.5
        finite = x[~np.isnan(x)]
        if not len(finite) or math.isnan(a):
            continue
        for thr in sorted(set(np.quantile(finite, THRESHOLD_QUANTILES).tolist())):
            now = np.isnan(x) | ((x >= thr) if above else (x <= thr))
            tp = int((now & y).sum())
            out.append({"signal": name, "auc_read": a, "auc_continued": auc(x, cont),
                        "write_now_if": f"{'>=' if above else '<='} {thr:g}",
                        "stores_now": float(now.mean()),
                        "bytes_now": float(nbytes[now].sum() / max(nbytes.sum(), 1)),
                        "precision": tp / max(int(now.sum()), 1),
                        "recall": tp / max(int(y.sum()), 1)})
        cands.append((abs(a - 0.5), name, float(np.quantile(finite, 0.5)), above))
    cands.sort(reverse=True)
    return out, [(n, q, ab) for _, n, q, ab in cands]


def run_rate(wl: Workload, preset: ReplayPreset, rate: float, runs: int) -> dict[str, Any]:
    """Today's rule, the oracle, the signals and ``runs`` rules at ``rate``."""
    base, rows = replay(wl, preset, rate, None)
    ssd = [r for r in rows if r.medium == "ssd"]
    read_idx = {r.idx for r in ssd if r.read}
    written = sum(r.total_bytes for r in ssd)
    kept = sum(r.total_bytes for r in ssd if r.read)
    first = [r for r in ssd if r.signals["turn_index"] == 0]
    result: dict[str, Any] = {
        "rate": rate, "today": summary(base),
        "stores": {"ssd": len(ssd), "read_back": sum(r.read for r in ssd),
                   "continued": sum(r.continued for r in ssd),
                   "first_turns": len(first), "first_turns_read": sum(r.read for r in first),
                   "first_turns_continued": sum(r.continued for r in first)},
        "oracle_arithmetic": {"written_gb": kept / GB, "of_today": kept / max(written, 1)},
    }
    oracle, _ = replay(wl, preset, rate, lambda idx, _s: idx in read_idx,
                       write_on_continue=False)
    result["oracle_replayed"] = summary(oracle)
    table, cands = signal_table(rows)
    result["signals"] = table
    result["combined_auc"], score = fit_combined(rows)
    result["rules"] = []
    # today's ``not_yet`` (every first turn deferred), then the best signals
    for name, thr, above in [("turn_index", 1.0, True), *cands[:runs]]:
        d, _ = replay(wl, preset, rate, threshold_rule(name, thr, above))
        result["rules"].append({"rule": f"write now if {name} {'>=' if above else '<='} "
                                f"{thr:g}", **summary(d)})
    if score is not None and runs:
        median = float(np.median([score(r.signals) for r in ssd]))
        d, _ = replay(wl, preset, rate, lambda _i, s: score(s) >= median)
        result["rules"].append({"rule": "write now if all signals combined >= their median",
                                **summary(d)})
    return result


def markdown(res: dict[str, Any]) -> str:
    t, o = res["today"], res["oracle_replayed"]
    lines = [f"### {res['rate']:g} req/s", "",
             "| run | hit % | mean TTFT s | GB written | GB read back | never read | "
             "written / today | written / read |", "|---|---|---|---|---|---|---|---|"]

    def line(name: str, s: dict[str, float]) -> str:
        return (f"| {name} | {s['hit_pct']:.2f} | {s['ttft_mean_s']:.4f} | "
                f"{s['written_gb']:.1f} | {s['read_gb']:.1f} | {s['never_read_gb']:.1f} | "
                f"{s['written_gb'] / t['written_gb']:.3f} | "
                f"{s['written_gb'] / max(s['read_gb'], 1e-9):.2f} |")

    lines.append(line("today's rule", t))
    oa = res["oracle_arithmetic"]
    lines.append(f"| oracle, arithmetic | = | = | {oa['written_gb']:.1f} | = | 0 | "
                 f"{oa['of_today']:.3f} | |")
    lines.append(line("oracle, replayed", o))
    for r in res["rules"]:
        lines.append(line(r["rule"], r))
    st = res["stores"]
    lines += ["", f"SSD stores today: {st['ssd']}, read back {st['read_back']}, "
              f"continued {st['continued']}; first turns {st['first_turns']}, read back "
              f"{st['first_turns_read']}, continued {st['first_turns_continued']}. All "
              f"signals combined (logistic, fit on the first half of the stores): AUC "
              f"read back {res['combined_auc']:.3f} on the second half.", "",
              "| signal | AUC read back | AUC continued | write now if | stores now | "
              "bytes now | precision | recall |", "|---|---|---|---|---|---|---|---|"]
    for s in res["signals"]:
        lines.append(f"| {s['signal']} | {s['auc_read']:.3f} | {s['auc_continued']:.3f} | "
                     f"{s['write_now_if']} | "
                     f"{s['stores_now']:.3f} | {s['bytes_now']:.3f} | "
                     f"{s['precision']:.3f} | {s['recall']:.3f} |")
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("trace", nargs="?", default=MOONCAKE)
    ap.add_argument("--rates", default="1,8")
    ap.add_argument("--preset", default="paper")
    ap.add_argument("--runs", type=int, default=3,
                    help="signals (best AUC first) whose rule is replayed")
    ap.add_argument("--host-gib", type=float,
                    help="host memory of the node in GiB (default: the preset's)")
    ap.add_argument("--json", help="write the raw results here")
    args = ap.parse_args(argv)
    try:
        preset = get_preset(args.preset)
        if args.host_gib is not None:
            if not args.host_gib > 0:
                raise ValueError(f"--host-gib must be > 0, got {args.host_gib}")
            preset = preset.with_node(host_memory_bytes=int(args.host_gib * 2**30))
        rates = [float(r) for r in args.rates.split(",") if r]
        wl = load_workload(Path(args.trace))[0]
    except (ValueError, FileNotFoundError) as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2
    results = []
    for rate in rates:
        res = run_rate(wl, preset, rate, args.runs)
        results.append(res)
        print(markdown(res), flush=True)
        print()
    if args.json:
        Path(args.json).write_text(json.dumps(results, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
