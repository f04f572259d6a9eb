#!/usr/bin/env bash
# Creates .venv and installs the frozen dependency set plus the project (editable).
# Re-runs only when requirements.lock or pyproject.toml changed, so repeated commands start fast.
set -euo pipefail
cd "$(dirname "$0")/.."
PY="${TIDEWATER_PYTHON:-python3.11}"
command -v "$PY" >/dev/null 2>&1 || PY=python3

# Debian packages that live outside .venv, checked on every run (a fresh machine has the venv stamp's
# inputs but not these): headless Chromium and its WebDriver for the UI tests, redis-server, the
# queue of the cluster profile's CeleryExecutor option (the profile starts its own, on a free port),
# and npm, which fetches the Data Docs' CSS/JS/fonts (see vendor_assets).
ensure_debian_packages() {
  local missing=()
  command -v chromium >/dev/null 2>&1 || missing+=(chromium)
  command -v chromedriver >/dev/null 2>&1 || missing+=(chromium-driver)
  command -v redis-server >/dev/null 2>&1 || [[ -x /usr/bin/redis-server ]] || missing+=(redis-server)
  command -v npm >/dev/null 2>&1 || missing+=(npm)
  [[ ${#missing[@]} -eq 0 ]] && return 0
  local sudo=""
  if [[ "$(id -u)" != 0 ]]; then
    if command -v sudo >/dev/null 2>&1; then sudo="sudo -n"; else
      echo "tidewater: ${missing[*]} missing and not root: the UI and Celery tests will fail" >&2; return 0
    fi
  fi
  if ! command -v apt-get >/dev/null 2>&1; then
    echo "tidewater: ${missing[*]} missing and no apt-get: the UI and Celery tests will fail" >&2; return 0
  fi
  echo "tidewater: installing ${missing[*]} (Debian packages)" >&2
  local install=(env DEBIAN_FRONTEND=noninteractive apt-get install -y -q --no-install-recommends "${missing[@]}")
  $sudo "${install[@]}" >/dev/null 2>&1 || { $sudo env DEBIAN_FRONTEND=noninteractive apt-get update -q >/dev/null 2>&1 \
    && $sudo "${install[@]}" >/dev/null; } \
    || echo "tidewater: could not install ${missing[*]}: the UI and Celery tests will fail" >&2
}
ensure_debian_packages

# GX Data Docs load Bootstrap, jQuery, Font Awesome and Vega from CDNs: the same files, from the npm
# packages that ship them (pinned by digest in include/tidewater/ui/vendor.py), go under .venv/share so
# reports render styled offline. Quick when done; a failure leaves reports unstyled, not the platform down.
vendor_assets() {
  .venv/bin/python -m tidewater.ui.vendor install \
    || echo "tidewater: Data Docs assets not vendored: reports render unstyled without internet" >&2
}

# Spark's classes archived once per install (HotSpot AppCDS), so every driver JVM starts seconds
# faster: see include/tidewater/class_data.py. Quick when done; a failure only leaves JVMs as they were.
class_data_archive() {
  .venv/bin/python -m tidewater.class_data \
    || echo "tidewater: no class-data archive: Spark JVMs start without it" >&2
}

# Spark's Python processes import the install's compiled pyspark instead of compiling Spark's pyspark.zip,
# and connect back to the JVM before their imports (Spark gives them a fixed 10 s, too short on a busy
# 2-core host): a .pth file, see include/tidewater/worker_start.py. Quick and idempotent.
worker_start() {
  .venv/bin/python -m tidewater.worker_start || true
}

stamp=.venv/.tidewater-installed
want="$(cat requirements.lock pyproject.toml | sha256sum | cut -d' ' -f1)"
if [[ -f "$stamp" && "$(cat "$stamp")" == "$want" ]]; then worker_start; vendor_assets; class_data_archive; exit 0; fi
echo "tidewater: setting up .venv (first run takes a minute or two)" >&2
[[ -x .venv/bin/python ]] || "$PY" -m venv .venv
.venv/bin/python -m pip install --quiet --disable-pip-version-check "uv==0.13.9"
.venv/bin/uv pip install --python .venv/bin/python --compile-bytecode --quiet \
  -r requirements.lock -e ".[dev]"
# pyspark ships as an sdist: every fresh clone builds a ~1.4 GB wheel into uv's cache and leaves the
# previous build unreachable there. Pruning drops only unreachable entries (tens of GB after a few dozen clones).
.venv/bin/uv cache prune --quiet || true
echo "$want" > "$stamp"
worker_start
vendor_assets
class_data_archive
