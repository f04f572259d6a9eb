"""Exactly-once into Delta while the streaming driver is killed with SIGKILL.

The real entry point (spark-submit spark_jobs/stream.py) runs against the real broker while
events keep arriving. It is killed four times: once by fault injection right after bronze's Delta
commit and before Spark's checkpoint commit, once right after silver's commit (same micro-batch,
still before the checkpoint commit), and twice at random moments. A final Trigger.AvailableNow
run drains the rest. Then: bronze holds every produced offset exactly once, silver every distinct
valid event exactly once, quarantine every malformed record once, and gold equals a from-scratch
batch computation over silver.
"""

from __future__ import annotations

import json
import os
import random
import signal
import subprocess
import threading
import time
from collections import Counter
from pathlib import Path

import pytest

from pipeline_helpers import gold_as_streamed, gold_from_silver, send, table_rows
from tidewater.cli import launch_stream_job, stop_process_group
from tidewater.generator.events import GeneratorConfig, expected_events, generate, parse_ts
from tidewater.generator.producer import ensure_topic
from tidewater.lake.layout import PipelineLayout
from tidewater.lake.tables import LakeTable
from tidewater.pipelines import get_pipeline
from tidewater.streaming.checkpoint import IDENTITY_FILE, CheckpointError, claim
from tidewater.streaming.faults import CRASH_AFTER_COMMIT

pytestmark = pytest.mark.slow

RSVPS = get_pipeline("rsvps")
TOTAL = 12_000


def wait_for(predicate, *, timeout_s: float, what: str) -> None:
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        if predicate():
            return
        time.sleep(0.5)
    raise AssertionError(f"timed out after {timeout_s:.0f} s waiting for {what}")


def heartbeat_after(layout: PipelineLayout, since: float) -> bool:
    """True once any query of the job wrote progress (a batch or an idle heartbeat) after ``since``."""
    return any(p.stat().st_mtime > since for p in layout.progress_dir().glob("*.json"))


def app_id(layout: PipelineLayout, query: str) -> str:
    identity = json.loads((layout.checkpoint(query) / IDENTITY_FILE).read_text())
    return f"tidewater/{identity['namespace']}/{identity['pipeline']}/{query}/{identity['stream_id']}"


def test_exactly_once_under_kill_9(spark, kafka_settings, make_topic, tmp_path: Path):
    settings = kafka_settings.replace(
        kafka_topic_prefix=make_topic(partitions=1, prefix="eo") + "-",
        max_offsets_per_trigger=1500,
        trigger_seconds=1.0,
    )
    topic = settings.topic(RSVPS.topic)
    ensure_topic(settings, topic, 4)
    layout = PipelineLayout.of(settings, RSVPS)
    config = GeneratorConfig(
        seed=99,
        start_time_ms=parse_ts("2026-11-21T10:00:00.000Z"),
        rate=50,
        duplicate_rate=0.03,
        out_of_order_fraction=0.1,
        out_of_order_max_ms=20_000,
        malformed_rate=0.02,
    )
    records = list(generate(config, TOTAL))
    send(settings, topic, records[: TOTAL // 2])

    def trickle() -> None:  # the rest arrives while the driver is being killed at random
        for start in range(TOTAL // 2, TOTAL, 250):
            send(settings, topic, records[start : start + 250])
            time.sleep(1.5)

    producer = threading.Thread(target=trickle, daemon=True)
    seed = int(os.environ.get("TIDEWATER_CHAOS_SEED", time.time()))
    chaos = random.Random(seed)
    print(f"chaos seed {seed} (set TIDEWATER_CHAOS_SEED to replay)")
    logs = tmp_path / "logs"
    logs.mkdir()
    running: list[subprocess.Popen[bytes]] = []

    def launch(name: str, *args: str, env: dict[str, str] | None = None) -> subprocess.Popen[bytes]:
        job = launch_stream_job(settings, "rsvps", logs / f"{name}.log", extra_args=args, extra_env=env)
        running.append(job)
        return job

    try:
        # 1 + 2: crash between the Delta commit and Spark's checkpoint commit, in bronze then in silver.
        for query, batch in (("bronze", 1), ("silver", 2)):
            job = launch(f"fault-{query}", env={CRASH_AFTER_COMMIT: f"{layout.namespace}.rsvps.{query}:{batch}"})
            assert job.wait(timeout=240) == -signal.SIGKILL, (logs / f"fault-{query}.log").read_text()[-3000:]
            # silver is written by the bronze query's micro-batch (the default topology)
            assert LakeTable(layout.table_uri(query)).committed_version(app_id(layout, "bronze")) == batch
            assert not (layout.checkpoint("bronze") / "commits" / str(batch)).exists()

        # 3 + 4: kill -9 the whole driver (JVM and Python) at random moments while events arrive.
        producer.start()
        for round_no in range(2):
            launched = time.time()
            job = launch(f"random-{round_no}")
            wait_for(lambda t=launched: heartbeat_after(layout, t), timeout_s=240, what="a batch of the restarted job")
            if round_no == 0:  # meanwhile a second driver on the same checkpoint is refused
                with pytest.raises(CheckpointError, match="in use by a running driver"):
                    claim(
                        layout.checkpoint("bronze"),
                        pipeline="rsvps",
                        namespace=layout.namespace,
                        query="bronze",
                        source=f"kafka:{topic}",
                        target=layout.table_uri("bronze"),
                    )
            time.sleep(chaos.uniform(0.0, 4.0))
            os.killpg(job.pid, signal.SIGKILL)
            job.wait(timeout=30)

        producer.join(timeout=120)
        final = launch("final", "--available-now")
        assert final.wait(timeout=600) == 0, (logs / "final.log").read_text()[-3000:]
    finally:
        for job in running:
            stop_process_group(job, timeout_s=10)

    bronze = table_rows(spark, settings, "bronze")
    assert Counter((r["partition"], r["offset"]) for r in bronze).most_common(1)[0][1] == 1
    assert len(bronze) == TOTAL
    assert sorted(r["value"] for r in bronze) == sorted(r.value for r in records)

    silver = table_rows(spark, settings, "silver")
    assert Counter(r["event_id"] for r in silver) == Counter(expected_events(config, TOTAL).keys())

    quarantine = table_rows(spark, settings, "quarantine")
    assert len(quarantine) == sum(r.kind == "malformed" for r in records)
    assert len({(r["kafka_partition"], r["kafka_offset"]) for r in quarantine}) == len(quarantine)

    for gold in RSVPS.gold:
        assert gold_as_streamed(spark, settings, gold.name) == gold_from_silver(spark, settings, gold.name)
