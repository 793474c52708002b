# Steps the side virtualenvs share (engine_venv.sh, sglang_venv.sh, nixl_venv.sh); sourced,
# never run. The caller sets PY, VENV and WANT (what the build depends on) first:
#
#   venv_current || { venv_begin; ...installs...; venv_done NAME; }
#
# venv_current: the stamp $VENV/.installed holds WANT, so nothing changed since the last build.
# venv_begin:   the venv exists; with UV=1, uv is in it and UV=(uv pip install ...) uses pip's
#               configured find-links or TORCH_FIND_LINKS (where the CPU torch wheel lives).
# venv_done:    writes the stamp and says how long the build took.

venv_want_hash() {  # the inputs every stamp covers: the project, the caller and this file
    cat pyproject.toml "$1" scripts/venv_lib.sh | sha256sum | cut -c1-16
}

venv_current() {
    [[ -f "$VENV/.installed" && "$(cat "$VENV/.installed")" == "$WANT" ]]
}

venv_begin() {
    venv_start_s=$(date +%s)
    test -x "$VENV/bin/python" || "$PY" -m venv "$VENV"
    if [[ "${1:-}" == "uv" ]]; then
        "$VENV/bin/python" -m pip install -q --disable-pip-version-check uv
        local links
        links="${TORCH_FIND_LINKS:-$("$VENV/bin/python" -m pip config get global.find-links 2>/dev/null || true)}"
        UV=("$VENV/bin/uv" pip install --quiet --python "$VENV/bin/python")
        if [[ -n "$links" ]]; then
            UV+=(--find-links "$links")
        fi
    fi
}

venv_done() {
    echo "$WANT" > "$VENV/.installed"
    echo "$1 venv built in $(( $(date +%s) - venv_start_s )) s"
}
