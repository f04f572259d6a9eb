# syntax=docker/dockerfile:1
# tidewater's image: the checkout, its venv with exactly the pinned dependency set (requirements.lock)
# and the project installed the way ./tw installs it (scripts/bootstrap.sh), and a Java 17 runtime for
# Spark. docker-compose.yml runs every Spark and Airflow process, the topic creation and the generator
# from it; any `tidewater` command runs too, e.g. `docker compose run --rm generator tidewater tables`.
FROM python:3.11-slim-bookworm

ARG DEBIAN_FRONTEND=noninteractive
ENV PYTHONUNBUFFERED=1 \
    PIP_NO_CACHE_DIR=1 \
    PIP_DISABLE_PIP_VERSION_CHECK=1 \
    UV_NO_CACHE=1

# Java 17 (Debian's OpenJDK) for Spark; tini as PID 1 reaps the detached spark-submit drivers the
# scheduler's tasks start and forwards stop signals; procps for Spark's scripts and for looking around;
# npm fetches the Data Docs' CSS/JS/fonts once, at build (bootstrap.sh; served offline afterwards).
RUN mkdir -p /usr/share/man/man1 \
 && apt-get update \
 && apt-get install -y --no-install-recommends openjdk-17-jre-headless procps tini npm \
 && rm -rf /var/lib/apt/lists/*

# Not root. /var/lib/tidewater is where the compose file mounts the shared state volume (a new named
# volume takes this ownership).
RUN useradd --create-home --uid 10001 --shell /bin/bash tidewater \
 && mkdir -p /opt/tidewater /var/lib/tidewater/state /var/lib/tidewater/checkpoints /var/lib/tidewater/spark-work \
 && chown -R tidewater:tidewater /opt/tidewater /var/lib/tidewater
USER tidewater
WORKDIR /opt/tidewater

# The pinned dependencies first, in a layer of their own (rebuilt only when the lock changes), with the
# uv version scripts/bootstrap.sh pins.
COPY --chown=tidewater:tidewater requirements.lock ./
COPY --chown=tidewater:tidewater scripts/bootstrap.sh scripts/
RUN python3.11 -m venv .venv \
 && .venv/bin/python -m pip install --quiet "$(grep -o 'uv==[0-9.]*' scripts/bootstrap.sh)" \
 && .venv/bin/uv pip install --python .venv/bin/python --compile-bytecode --quiet -r requirements.lock

# Then the project, by the script ./tw runs: the same lock plus the project, editable, so dags/,
# plugins/ and spark_jobs/ are found beside include/. As a non-root user without sudo, bootstrap.sh skips
# the Chromium install of the UI tests (and says so in one line).
COPY --chown=tidewater:tidewater . .
RUN scripts/bootstrap.sh

ENV VIRTUAL_ENV=/opt/tidewater/.venv \
    PATH=/opt/tidewater/.venv/bin:$PATH \
    PYSPARK_PYTHON=/opt/tidewater/.venv/bin/python \
    PYSPARK_DRIVER_PYTHON=/opt/tidewater/.venv/bin/python

# Airflow API and UI, Spark master RPC and web UIs (docker-compose.yml publishes them on 127.0.0.1).
EXPOSE 8080 7077 8090 8091
ENTRYPOINT ["/usr/bin/tini", "--"]
CMD ["tidewater", "--help"]
