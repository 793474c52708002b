"""Request traces: one numpy trace model, readers, a workload generator, reuse analysis.

Typical use::

    from flatcake.traces import read_trace, generate_workload, analyze_trace
    trace = read_trace("weka_claude_code_traces.jsonl.gz")   # format detected
    for s in range(trace.num_sessions):
        for i in trace.requests_of_session(s):
            ids = trace.blocks(i)            # int64 block ids of request i
"""

from flatcake.traces.analyze import TraceAnalysis, TraceStats, analyze_trace
from flatcake.traces.generator import (
    AgentParams,
    ChatParams,
    LogNormal,
    ServiceParams,
    WorkloadSpec,
    generate_workload,
)
from flatcake.traces.load import read_trace
from flatcake.traces.model import SESSION_SHIFT, SubAgent, Trace, build_trace
from flatcake.traces.readers.native import read_native, write_native
from flatcake.traces.recommend import Recommendation, recommend
from flatcake.traces.source import FORMATS, TraceFormatError, detect_format

__all__ = [
    "FORMATS",
    "SESSION_SHIFT",
    "AgentParams",
    "ChatParams",
    "LogNormal",
    "Recommendation",
    "ServiceParams",
    "SubAgent",
    "Trace",
    "TraceAnalysis",
    "TraceFormatError",
    "TraceStats",
    "WorkloadSpec",
    "analyze_trace",
    "build_trace",
    "detect_format",
    "generate_workload",
    "read_native",
    "read_trace",
    "recommend",
    "write_native",
]
