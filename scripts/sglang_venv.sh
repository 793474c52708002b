#!/usr/bin/env bash
# Builds ./.venv-sglang: SGLang 0.5.23's Python package on CPU torch 2.13.0 beside an editable
# FlatCake, for the HiCache L3 backend tests (tests/connectors/test_sglang*.py), which drive
# flatcake.connectors.sglang through SGLang's own host pool and cache controller.
#
# `pip install sglang==0.5.23` pins a CUDA torch and ~33 NVIDIA packages, so this installs the
# CPU torch first, then the part of SGLang's requirements that is CPU-safe and needed to import
# its memory-cache modules, then sglang itself without dependencies. No CUDA package is
# installed. Idempotent: a stamp records the inputs, so a rerun with nothing changed returns
# at once.
#
#   scripts/sglang_venv.sh                 # build or refresh ./.venv-sglang
#   SGLANG_VENV=/path scripts/sglang_venv.sh
#
# torch==2.13.0+cpu comes from pip's configured find-links (this machine keeps the CPU wheel on
# disk) or from TORCH_FIND_LINKS; uv installs in parallel and comes from PyPI through pip.
set -euo pipefail
cd "$(dirname "$0")/.."
# shellcheck source=venv_lib.sh
source scripts/venv_lib.sh

PY="${PY:-python3}"
VENV="${SGLANG_VENV:-.venv-sglang}"
SGLANG_VERSION="0.5.23"
TORCH_VERSION="2.13.0"
# SGLang's own requirements that are pure Python or ship CPU wheels, pinned as SGLang pins them,
# enough to import srt.mem_cache and srt.managers.cache_controller.
REQS=(
    aiohttp "blobfile==3.0.0" distro einops fastapi interegular msgspec ninja numpy
    "openai==2.8.0" orjson packaging partial_json_parser pillow "prometheus-client>=0.20.0"
    psutil pybase64 pydantic "python-dateutil<3" python-multipart "pyzmq>=25.1.2" regex
    requests scipy "sentencepiece==0.2.1" setproctitle tiktoken "tokenizers==0.23.2"
    "transformers==5.19.0" "uvicorn>=0.51" uvloop watchfiles xxhash zstandard nvidia-ml-py
    gguf "llguidance>=1.7.6,<2.0.0" "compressed-tensors==0.18.0" "apache-tvm-ffi==0.1.11"
    triton ipython dill pytest
)
WANT="sglang==$SGLANG_VERSION torch==$TORCH_VERSION $(venv_want_hash "$0")"

if venv_current; then
    exit 0
fi
venv_begin uv
# The CPU torch first and kept: every later step names it so nothing swaps in a CUDA build.
"${UV[@]}" "torch==$TORCH_VERSION+cpu"
"${UV[@]}" "torch==$TORCH_VERSION+cpu" "${REQS[@]}"
"${UV[@]}" --no-deps "sglang==$SGLANG_VERSION"
"${UV[@]}" -e '.[dev]' "torch==$TORCH_VERSION+cpu"
# PyPI's torchvision is a CUDA build that fails to import beside the CPU torch; SGLang
# imports it unconditionally, so the tests stand in for it (tests/connectors/sglang_stubs.py).
"$VENV/bin/uv" pip uninstall --quiet --python "$VENV/bin/python" torchvision torchaudio \
    torchcodec 2>/dev/null || true
if "$VENV/bin/python" -m pip list 2>/dev/null | grep -qi '^nvidia-cu\|^nvidia-cuda'; then
    echo "sglang venv: a CUDA package was installed" >&2
    exit 1
fi
# Importing once compiles the modules the tests load (uv writes no .pyc files).
"$VENV/bin/python" -c '
from tests.connectors.sglang_stubs import install_torchvision_stub
install_torchvision_stub()
import torch, sglang, flatcake.connectors.sglang
from sglang.srt.mem_cache.pool_host.mha import MHATokenToKVPoolHost
print("sglang venv: torch", torch.__version__, "sglang", sglang.__version__)'
venv_done sglang
