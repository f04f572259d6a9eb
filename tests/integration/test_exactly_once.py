"""Chaos: exactly-once into Delta while the streaming driver is killed with SIGKILL, again and again.

The real entry point (spark-submit spark_jobs/stream.py) runs against the real broker while a
producer sends valid events, re-sends, late and out-of-order events, conflicting copies (same event
id, another day or another answer) and hostile records (the regression corpus of tests/hostile.py).
It is killed three times: once by fault injection right after bronze's Delta commit and before
Spark's checkpoint commit, once right after silver's commit (same micro-batch, still before the
checkpoint commit), and once at a random moment (starting up, reading or committing). A final
Trigger.AvailableNow run drains the rest. Then, read with an independent reader (delta-rs to
pyarrow, not the project's read path): bronze holds every produced record exactly once, silver
every distinct valid event exactly once (the first copy), quarantine every malformed or hostile
record once with its reason, conflicts every conflicting copy once, and gold lies between the
on-time events' aggregate and silver's (late events may or may not have made it before the
watermark, depending on where the kills cut the micro-batches).
"""

from __future__ import annotations

import dataclasses
import datetime as dt
import json
import os
import random
import signal
import subprocess
import threading
import time
from collections import Counter
from pathlib import Path

import pyarrow as pa
import pytest
from deltalake import DeltaTable

from hostile import NOW_MS, corpus
from pipeline_helpers import gold_as_streamed, kill_job, send
from tidewater.faults import CRASH_AFTER_COMMIT
from tidewater.generator.events import GeneratedRecord, GeneratorConfig, expected_events, generate, parse_ts
from tidewater.generator.producer import ensure_topic
from tidewater.lake.reads import read_table
from tidewater.lake.tables import LakeTable
from tidewater.pipelines import get_pipeline
from tidewater.pipelines.layout import PipelineLayout
from tidewater.processes import stop_process_group
from tidewater.streaming.checkpoint import IDENTITY_FILE, CheckpointError, claim
from tidewater.streaming.jobs import launch_stream_job

pytestmark = pytest.mark.slow

RSVPS = get_pipeline("rsvps")
TOTAL = 6_000
RANDOM_KILLS = 1
STORED_CORPUS_IDS = {"corpus-y999", "corpus-tsmax", "corpus-tsmin", "corpus-hugekey", "corpus-nul\x00"}


def hostile_records(valid: list[GeneratedRecord]) -> tuple[list[GeneratedRecord], list[GeneratedRecord]]:
    """(corpus records, conflicting copies of some valid events) as generator records."""
    template = valid[0]
    cases = [  # a negative CreateTime is not sendable: such a case is sent at NOW_MS instead
        dataclasses.replace(
            template,
            key=c.key or b"",
            value=c.value or b"",
            timestamp_ms=c.timestamp_ms if c.timestamp_ms >= 0 else NOW_MS,
        )
        for c in corpus()
    ]
    conflicts = []
    for i, record in enumerate(r for r in valid if r.kind == "ok"):
        if i >= 6:
            break
        payload = json.loads(record.value)
        when = dt.datetime.fromisoformat(payload["event_time"].replace("Z", "+00:00"))
        if i % 2:  # the same event id on another day (earlier: later would be from the future)
            payload["event_time"] = (when - dt.timedelta(days=1)).isoformat().replace("+00:00", "Z")
        else:  # twenty minutes apart, another answer
            payload["event_time"] = (when - dt.timedelta(minutes=20)).isoformat().replace("+00:00", "Z")
            payload["response"] = "no" if payload["response"] != "no" else "yes"
        conflicts.append(dataclasses.replace(record, value=json.dumps(payload).encode()))
    return cases, conflicts


def coordinates(table: pa.Table, partition: str, offset: str) -> Counter[tuple[int, int]]:
    return Counter(zip(table[partition].to_pylist(), table[offset].to_pylist(), strict=True))


def independent(layout: PipelineLayout, table: str) -> pa.Table:
    """A table as delta-rs alone reads it (not tidewater's Spark read path)."""
    return DeltaTable(layout.table_uri(table)).to_pyarrow_dataset().to_table()


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
        # The writers compact a table's partitions holding 2+ small files after every commit: the fault runs
        # below die right after a round of bronze's (batch 1) and of silver's (batch 2), the random kills
        # land wherever.
        stream_compaction_files=1,
    )
    topic = settings.topic(RSVPS.source().topic)
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
        late_fraction=0.01,
        late_delay_ms=300_000,
    )
    generated = list(generate(config, TOTAL))
    cases, conflicting = hostile_records(generated)
    # Hostile records and conflicting copies arrive in the second half, among the rest.
    records = generated[: TOTAL // 2] + cases + generated[TOTAL // 2 :]
    records[-1000:-1000] = conflicting
    send(settings, topic, records[: TOTAL // 2])

    def trickle() -> None:  # the rest arrives while the driver is being killed at random
        for start in range(TOTAL // 2, len(records), 250):
            send(settings, topic, records[start : start + 250])
            time.sleep(1.0)

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

        # 3, 4: kill -9 the whole driver (JVM and Python) at random moments while events arrive: every
        # other round once the restarted job has made progress, the rest wherever it happens to be.
        producer.start()
        for round_no in range(RANDOM_KILLS):
            launched = time.time()
            job = launch(f"random-{round_no}")
            if round_no % 2 == 0:
                wait_for(lambda t=launched: heartbeat_after(layout, t), timeout_s=240, what="a batch of the job")
            else:
                time.sleep(chaos.uniform(2.0, 12.0))
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
            time.sleep(chaos.uniform(0.0, 3.0))
            kill_job(job)

        producer.join(timeout=120)
        final = launch("final", "--available-now")
        assert final.wait(timeout=600) == 0, (logs / "final.log").read_text()[-3000:]
    finally:
        for job in running:
            stop_process_group(job, timeout_s=10)

    for table in ("bronze", "silver"):  # the stream's own compaction ran (and, below, changed no row)
        operations = [commit.get("operation") for commit in DeltaTable(layout.table_uri(table)).history()]
        assert "OPTIMIZE" in operations, (table, Counter(operations))

    bronze = independent(layout, "bronze")
    assert coordinates(bronze, "partition", "offset").most_common(1)[0][1] == 1
    assert bronze.num_rows == len(records)
    assert sorted(bronze["value"].to_pylist()) == sorted(r.value for r in records)

    silver = independent(layout, "silver")
    expected = expected_events(config, TOTAL)
    assert Counter(silver["event_id"].to_pylist()) == Counter([*expected.keys(), *STORED_CORPUS_IDS])
    by_id = {r["event_id"]: r for r in silver.select(["event_id", "event_time", "response"]).to_pylist()}
    for copy in conflicting:  # the first copy is the one kept
        original = json.loads(expected[copy.event_id].value)
        assert by_id[copy.event_id]["response"] == original["response"]

    conflicts = independent(layout, "conflicts")
    assert sorted(conflicts["key"].to_pylist()) == sorted(c.event_id for c in conflicting)
    assert coordinates(conflicts, "copy_kafka_partition", "copy_kafka_offset").most_common(1)[0][1] == 1

    quarantine = independent(layout, "quarantine")
    assert coordinates(quarantine, "kafka_partition", "kafka_offset").most_common(1)[0][1] == 1
    malformed = sum(r.kind == "malformed" for r in generated)
    assert quarantine.num_rows == malformed + len(cases) - len(STORED_CORPUS_IDS)
    assert all(quarantine["reason"].to_pylist())
    kept_cases = {c.value for c in cases} - set(quarantine["raw_value"].to_pylist())
    assert {json.loads(v)["event_id"] for v in kept_cases} == STORED_CORPUS_IDS

    # Gold: never more than silver holds, never less than the on-time events.
    all_silver = read_table(spark, layout.table_uri("silver"))
    late_ids = [r.event_id for r in generated if r.kind == "late"] + sorted(STORED_CORPUS_IDS)
    on_time = all_silver.where(~all_silver.event_id.isin(late_ids))
    for gold in RSVPS.gold:
        columns = gold.build(all_silver.limit(0)).columns  # the order gold_as_streamed returns
        keys = [columns.index(k) for k in gold.keys]
        measures = [i for i, c in enumerate(columns) if c.endswith("_count")]

        def by_key(rows, keys=keys, measures=measures):
            return {tuple(row[i] for i in keys): [row[i] for i in measures] for row in rows}

        streamed = by_key(gold_as_streamed(spark, settings, gold.name))
        ceiling = by_key([tuple(r) for r in gold.build(all_silver).collect()])
        floor = by_key([tuple(r) for r in gold.build(on_time).collect()])
        assert set(floor) <= set(streamed) <= set(ceiling), gold.name
        for key, counts in streamed.items():
            assert all(c <= h for c, h in zip(counts, ceiling[key], strict=True)), (gold.name, key, counts)
            low = floor.get(key, [0] * len(counts))
            assert all(c >= lo for c, lo in zip(counts, low, strict=True)), (gold.name, key, counts, low)
