"""Bad input gets one actionable line on stderr, exit status 2, and no Java stack trace.

Every case runs the real command (``tidewater stream rsvps``) as a user would; all of them are
caught by the preflight, before a JVM starts.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import time
from pathlib import Path

import pytest

from pipeline_helpers import streamed_lake
from tidewater.broker import free_port
from tidewater.config import Settings
from tidewater.errors import CheckpointError
from tidewater.generator.producer import ensure_topic
from tidewater.pipelines import get_pipeline
from tidewater.pipelines.layout import PipelineLayout
from tidewater.streaming.checkpoint import IDENTITY_FILE, check_spark_logs, claim

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
    ensure_topic(Settings.from_env(env), prefix + RSVPS.source().topic, 2)
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
    assert_one_line(run_cli(live_env, "stream", "billing"), "PipelineError", "'billing'", "rsvps")


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
        source=f"kafka:{Settings.from_env(live_env).topic(RSVPS.source().topic)}",
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
                "pipeline": "billing",
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


# ---- settings: every one validated before a JVM starts (issue 9 item 8) ---------------------------


@pytest.mark.parametrize(
    ("name", "value", "fragment"),
    [
        ("TRIGGER_SECONDS", "-1", "must be > 0"),
        ("TRIGGER_SECONDS", "0", "must be > 0"),
        ("TRIGGER_SECONDS", "nan", "finite"),
        ("SPARK_DRIVER_MEMORY", "lots", "JVM memory size such as 512m, 2g"),
        ("MAX_OFFSETS_PER_TRIGGER", "-5", "from 1 to"),
        ("AIRFLOW_PORT", "70000", "from 1 to 65535"),
        ("KAFKA_BOOTSTRAP_SERVERS", "127.0.0.1:99999", "ports 1 to 65535"),
        ("STREAM_STOP_TIMEOUT_SECONDS", "-1", "from 0 to"),
        ("SPARK_SHUFFLE_PARTITIONS", "0", "from 1 to"),
    ],
)
def test_bad_setting_is_refused_before_a_jvm_starts(env, tmp_path, name, value, fragment):
    # No JVM can start here (JAVA_HOME points nowhere): had the command got that far, it would fail
    # differently, and slowly, instead of with the setting's one line.
    env = {**env, f"TIDEWATER_{name}": value, "JAVA_HOME": str(tmp_path / "no-java")}
    began = time.monotonic()
    result = run_cli(env, "stream", "rsvps", "--available-now")
    line = assert_one_line(result, "ConfigError", f"TIDEWATER_{name}=", fragment)
    assert "unset it for the default" in line
    assert time.monotonic() - began < 30


# ---- a stateful (gold) query's state store, checked before a JVM starts ---------------------------

GOLD = "gold_venue_response_counts"


@pytest.fixture(scope="module")
def gold_lake(spark, broker, tmp_path_factory):
    """A lake and checkpoints written by a short real stream (RocksDB state store with changelogs),
    and a pristine copy of the gold query's checkpoint that the tests restore before damaging it."""
    state_dir = str(tmp_path_factory.mktemp("gold-state") / "state")
    settings = streamed_lake(spark, broker.bootstrap_servers, state_dir, prefix="cli-state", seed=5, count=400)
    path = PipelineLayout.of(settings, RSVPS).checkpoint(GOLD)
    pristine = tmp_path_factory.mktemp("gold-pristine") / GOLD
    shutil.copytree(path, pristine)
    return settings, path, pristine


def restored(gold_lake) -> Path:
    _, path, pristine = gold_lake
    shutil.rmtree(path)
    shutil.copytree(pristine, path)
    return path


def latest_changelog(path: Path) -> Path:
    """The state file the latest committed batch wrote for partition 0 of the aggregation."""
    latest = max(int(p.name) for p in (path / "commits").iterdir() if p.name.isdigit())
    changelog = path / "state" / "0" / "0" / f"{latest + 1}.changelog"
    assert changelog.stat().st_size > 0, sorted(p.name for p in changelog.parent.iterdir())
    return changelog


def test_truncated_state_store_file_is_refused_before_a_jvm_starts(gold_lake):
    settings, _, _ = gold_lake
    path = restored(gold_lake)
    changelog = latest_changelog(path)
    data = changelog.read_bytes()
    changelog.write_bytes(data[: len(data) // 2])  # e.g. a disk that filled up, or a partial copy
    env = {
        "TIDEWATER_STATE_DIR": settings.state_dir,
        "TIDEWATER_KAFKA_BOOTSTRAP_SERVERS": settings.kafka_bootstrap_servers,
        "TIDEWATER_KAFKA_TOPIC_PREFIX": settings.kafka_topic_prefix,
        "TIDEWATER_KAFKA_REQUEST_TIMEOUT_MS": "5000",
    }
    result = run_cli(env, "stream", "rsvps", "--available-now")
    # Spark would have said "[CANNOT_LOAD_STATE_STORE.UNCATEGORIZED] An error occurred during loading
    # state" (EOFException: Stream ended prematurely) in the first micro-batch, after starting.
    assert_one_line(
        result,
        "CheckpointError",
        str(path),
        f"state file {changelog.relative_to(path)} is truncated",
        "move it aside and rebuild the affected tables with a replay",
    )


def test_damaged_or_missing_state_store_files_are_named(gold_lake):
    path = restored(gold_lake)
    check_spark_logs(path)  # an intact checkpoint passes
    changelog = latest_changelog(path)
    data = bytearray(changelog.read_bytes())
    data[len(data) // 2] ^= 0xFF  # same size, one byte flipped: Hadoop's .crc file catches it
    changelog.write_bytes(bytes(data))
    with pytest.raises(CheckpointError, match=rf"{changelog.name} does not match its checksum file"):
        check_spark_logs(path)

    path = restored(gold_lake)
    changelog = latest_changelog(path)
    changelog.write_bytes(b"")
    with pytest.raises(CheckpointError, match=rf"{changelog.name} is empty"):
        check_spark_logs(path)

    path = restored(gold_lake)
    first = path / "state" / "0" / "0" / "1.changelog"  # a gold query has one state partition
    assert first != latest_changelog(path)
    first.unlink()
    with pytest.raises(CheckpointError, match=r"state/0/0/1.changelog is missing"):
        check_spark_logs(path)
