#!/usr/bin/env bash
# Creates .venv and installs the frozen dependency set plus the project (editable).
# Re-runs only when requirements.lock or pyproject.toml changed, so repeated commands start fast.
set -euo pipefail
cd "$(dirname "$0")/.."
PY="${TIDEWATER_PYTHON:-python3.11}"
command -v "$PY" >/dev/null 2>&1 || PY=python3
stamp=.venv/.tidewater-installed
want="$(cat requirements.lock pyproject.toml | sha256sum | cut -d' ' -f1)"
if [[ -f "$stamp" && "$(cat "$stamp")" == "$want" ]]; then exit 0; fi
echo "tidewater: setting up .venv (first run takes a minute or two)" >&2
[[ -x .venv/bin/python ]] || "$PY" -m venv .venv
.venv/bin/python -m pip install --quiet --disable-pip-version-check "uv==0.13.9"
.venv/bin/uv pip install --python .venv/bin/python --compile-bytecode --quiet \
  -r requirements.lock -e ".[dev]"
echo "$want" > "$stamp"
