"""``flatcake loadgen``: real traffic against any OpenAI-compatible server.

A workload (a trace's sessions, the built-in generator's, or a working set) becomes
token-id prompts whose reuse is exactly the workload's (``prompts``); the driver sends
them at a rate or a concurrency, each session's turns in order (``driver``), over
streaming ``/v1/completions`` or ``/v1/chat/completions`` (``client``); each request's
TTFT, latency and the server's ``cached_tokens`` go to a JSONL file, and a summary (TTFT
percentiles, cached share, req/s) to a table, JSON and a plot (``summary``,
``output``)::

    from flatcake.loadgen import Endpoint, Pacing, TokenSpace, run, working_set
"""

from flatcake.loadgen.client import (
    Endpoint,
    Reply,
    ServerInfo,
    ServerUnreachable,
    chat_body,
    completion_body,
    probe,
    stream_completion,
)
from flatcake.loadgen.driver import ABORT_AFTER, Job, Pacing, Record, RunResult, run
from flatcake.loadgen.prompts import MIN_TOKEN_ID, TokenSpace
from flatcake.loadgen.sessions import builtin_trace, fit_block_tokens, trace_workload
from flatcake.loadgen.summary import Summary, percentile, summarize, table
from flatcake.loadgen.working_set import ORDERS, working_set
from flatcake.loadgen.workload import Session, Turn, Workload

__all__ = [
    "ABORT_AFTER",
    "MIN_TOKEN_ID",
    "ORDERS",
    "Endpoint",
    "Job",
    "Pacing",
    "Record",
    "Reply",
    "RunResult",
    "ServerInfo",
    "ServerUnreachable",
    "Session",
    "Summary",
    "TokenSpace",
    "Turn",
    "Workload",
    "builtin_trace",
    "chat_body",
    "completion_body",
    "fit_block_tokens",
    "percentile",
    "probe",
    "run",
    "stream_completion",
    "summarize",
    "table",
    "trace_workload",
    "working_set",
]
