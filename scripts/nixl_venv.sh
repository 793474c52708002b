#!/usr/bin/env bash
# Builds ./.venv-nixl: NIXL 1.5.1 (UCX inside the wheel) beside an editable FlatCake, for the
# remote-memory and remote-SSD paths (flatcake.cio.remote) and their tests.
#
# `pip install nixl` pulls a CUDA build of torch (~6 GB); `nixl==1.5.1` and `nixl-cu12==1.5.1`
# with --no-deps plus numpy is a ~340 MB venv that imports without CUDA. pip prints a
# dependency-conflict line about torch; nothing uses it. Idempotent through a stamp file.
#
#   scripts/nixl_venv.sh                 # build or refresh ./.venv-nixl
#   NIXL_VENV=/path scripts/nixl_venv.sh
set -euo pipefail
cd "$(dirname "$0")/.."
# shellcheck source=venv_lib.sh
source scripts/venv_lib.sh

PY="${PY:-python3}"
VENV="${NIXL_VENV:-.venv-nixl}"
NIXL_VERSION="1.5.1"
WANT="nixl==$NIXL_VERSION $(venv_want_hash "$0")"

if venv_current; then
    exit 0
fi
venv_begin
PIP=("$VENV/bin/python" -m pip install -q --disable-pip-version-check)
"${PIP[@]}" --no-deps "nixl==$NIXL_VERSION" "nixl-cu12==$NIXL_VERSION"
"${PIP[@]}" numpy "redis>=5" "pytest>=7" "pytest-timeout>=2"
"${PIP[@]}" --no-deps -e .
"$VENV/bin/python" -c "from nixl._api import nixl_agent, nixl_agent_config"
venv_done nixl
