#!/usr/bin/env bash
# Restore paths into GPU memory next to the disk's limit, in one go, on a machine with a
# GPU: O_DIRECT -> pinned host -> GPU and kvikio -> GPU, each in GB/s and as a fraction
# of the disk's sequential O_DIRECT read, bytes checked (src/flatcake/bench/gpu_check.py).
# Without CUDA (or kvikio) those lines say "skipped" and the exit status is 0.
#   usage: scripts/gpu_check.sh [DIR] [SIZE_MIB]      (defaults: . and 1024)
#   PYTHON=/path/to/python to use another interpreter than .venv/bin/python
set -euo pipefail
repo="$(cd "$(dirname "$0")/.." && pwd)"
dir="${1:-.}"
size="${2:-1024}"
exec env PYTHONPATH="$repo/src${PYTHONPATH:+:$PYTHONPATH}" "${PYTHON:-$repo/.venv/bin/python}" \
    -m flatcake.bench.gpu_check --dir "$dir" --size-mib "$size"
