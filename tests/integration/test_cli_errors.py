"""Bad input gets one actionable line on stderr, exit status 2, and no Java stack trace.

Every case runs the real command (``tidewater stream rsvps``) as a user would; all of them are
caught by the preflight, before a JVM starts.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from tidewater.broker import free_port
from tidewater.config import Settings
from tidewater.generator.producer import ensure_topic
from tidewater.lake.layout import PipelineLayout
from tidewater.pipelines import get_pipeline
from tidewater.streaming.checkpoint import IDENTITY_FILE, claim

RSVPS = get_pipeline("rsvps")


def run_cli(env: dict[str, str], *args: str) -> subprocess.CompletedProcess[str]:
    clean = {k: v for k, v in os.environ.items() if not k.startswith(("TIDEWATER_", "AWS_"))}
    return subprocess.run(
        [sys.executable, "-m", "tidewater.cli", *args],
        env={**clean, **env},
        capture_output=True,
        text=True,
        timeout=120,
    )


def assert_one_line(result: subprocess.CompletedProcess[str], kind: str, *fragments: str) -> str:
    lines = [line for line in result.stderr.splitlines() if line.strip()]
    assert result.returncode == 2, result.stderr
    assert len(lines) == 1, result.stderr
    assert lines[0].startswith(f"tidewater: {kind}: "), lines[0]
    assert "\tat " not in result.stderr and "Traceback" not in result.stderr
    for fragment in fragments:
        assert fragment in lines[0], lines[0]
    return lines[0]


@pytest.fixture
def env(tmp_path: Path) -> dict[str, str]:
    return {"TIDEWATER_STATE_DIR": str(tmp_path / "state"), "TIDEWATER_KAFKA_REQUEST_TIMEOUT_MS": "3000"}


@pytest.fixture
def live_env(env: dict[str, str], broker, make_topic) -> dict[str, str]:
    """A reachable broker with the rsvps topic under a unique prefix."""
    prefix = make_topic(partitions=1, prefix="cli") + "-"
    env = {**env, "TIDEWATER_KAFKA_BOOTSTRAP_SERVERS": broker.bootstrap_servers, "TIDEWATER_KAFKA_TOPIC_PREFIX": prefix}
    ensure_topic(Settings.from_env(env), prefix + RSVPS.topic, 2)
    return env


def layout_for(env: dict[str, str]) -> PipelineLayout:
    return PipelineLayout.of(Settings.from_env(env), RSVPS)


def test_wrong_broker_address(env):
    address = f"127.0.0.1:{free_port()}"
    result = run_cli({**env, "TIDEWATER_KAFKA_BOOTSTRAP_SERVERS": address}, "stream", "rsvps", "--available-now")
    assert_one_line(result, "BrokerUnreachableError", address, "TIDEWATER_KAFKA_BOOTSTRAP_SERVERS")


def test_missing_topic(env, broker):
    env = {
        **env,
        "TIDEWATER_KAFKA_BOOTSTRAP_SERVERS": broker.bootstrap_servers,
        "TIDEWATER_KAFKA_TOPIC_PREFIX": "nope-",
    }
    result = run_cli(env, "stream", "rsvps", "--available-now")
    assert_one_line(result, "TopicNotFoundError", "'nope-rsvps'", "create it")


def test_unknown_pipeline(env, live_env):
    assert_one_line(run_cli(live_env, "stream", "payments"), "PipelineError", "'payments'", "rsvps")


def test_malformed_setting(env):
    assert_one_line(run_cli({**env, "TIDEWATER_TRIGGER_SECONDS": "soon"}, "tables"), "ConfigError", "TRIGGER_SECONDS")


def test_s3_lake_without_credentials(env):
    result = run_cli({**env, "TIDEWATER_LAKE_ROOT": "s3://lake/tidewater"}, "tables")
    assert_one_line(result, "ConfigError", "AWS_ACCESS_KEY_ID", "s3://lake/tidewater")


def test_unwritable_lake_root(live_env, tmp_path):
    blocker = tmp_path / "not-a-directory"
    blocker.write_text("a file where the lake should be")
    env = {**live_env, "TIDEWATER_LAKE_ROOT": (blocker / "lake").as_uri()}
    assert_one_line(run_cli(env, "stream", "rsvps", "--available-now"), "LakePathError", "TIDEWATER_LAKE_ROOT")


def test_corrupt_checkpoint(live_env):
    layout = layout_for(live_env)
    path = layout.checkpoint("bronze")
    checkpoint = claim(
        path,
        pipeline="rsvps",
        namespace=layout.namespace,
        query="bronze",
        source=f"kafka:{Settings.from_env(live_env).topic(RSVPS.topic)}",
        target=layout.table_uri("bronze"),
    )
    checkpoint.release()
    (path / "offsets").mkdir()
    (path / "offsets" / "0").write_text("v1\n{not json")
    result = run_cli(live_env, "stream", "rsvps", "--available-now")
    assert_one_line(result, "CheckpointError", "is corrupt", "offsets/0")


def test_foreign_checkpoint(live_env):
    path = layout_for(live_env).checkpoint("gold_venue_response_counts")
    path.mkdir(parents=True)
    (path / IDENTITY_FILE).write_text(
        json.dumps(
            {
                "pipeline": "payments",
                "namespace": "live",
                "query": "gold_venue_response_counts",
                "source": "s",
                "target": "t",
                "stream_id": "x",
                "created_at": "2026-01-01T00:00:00+00:00",
            }
        )
    )
    assert_one_line(run_cli(live_env, "stream", "rsvps", "--available-now"), "CheckpointError", "belongs to")


def test_checkpoint_of_another_tool(live_env):
    path = layout_for(live_env).checkpoint("bronze")
    (path / "offsets").mkdir(parents=True)
    result = run_cli(live_env, "stream", "rsvps", "--available-now")
    assert_one_line(result, "CheckpointError", "not created by this tidewater query")
