"""Payments benchmark: events/s through the fraud pipeline, the per-card state store, peak memory.

Produces ``--events`` payments of the pipeline's own sample events (cards drawn from a pool of
``--cards``; the rate is chosen so that :func:`tidewater.pipelines.payments.samples.cards_for` picks
exactly that pool) into a topic of the embedded broker, then runs the streaming job's code
(:class:`tidewater.streaming.runner.PipelineStreams`) tier by tier with Trigger.AvailableNow, as
``run_available_now`` does, on local[2], and prints:

1. events/s of each tier, timed separately: Kafka -> bronze + silver (micro-batches of
   ``--max-offsets`` records) and silver -> ``fraud_alerts`` gold (``transformWithState``
   per card, RocksDB state, event-time timers, MERGE into Delta and the transactional publish to
   Kafka), and overall; each as wall time of the tier (query start-up included) and as the rate
   within its micro-batches (sum of rows / sum of ``triggerExecution``);
2. the state store of the gold query: keys in state (read back with Spark's state data source),
   size of ``<checkpoint>/state`` on disk, and the state operator metrics of the last progress
   (numRowsTotal, memoryUsedBytes, commitTimeMs, RocksDB custom metrics), plus the state commit
   time of every gold micro-batch;
3. peak RSS of the Spark side (Python driver + JVM + Python workers): the Spark part runs in a child
   process in a session of its own, sampled with bench_stream's helper.

    .venv/bin/python benchmarks/bench_payments.py [--events 200000] [--cards 100000] [--max-offsets 50000]

The broker and the Spark child are stopped (by PID / their own process group) also when it fails.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path
from typing import Any

from bench_stream import MemorySampler

from tidewater.broker import EmbeddedBroker
from tidewater.config import Settings
from tidewater.connectors.kafka_client import kafka_python_config
from tidewater.connectors.kafka_publish import read_committed
from tidewater.generator.producer import ensure_topic, produce
from tidewater.pipelines import get_pipeline
from tidewater.pipelines.samples import GeneratorConfig
from tidewater.processes import exit_on_sigterm, spark_child_env, stop_process_group

PAYMENTS = get_pipeline("payments")
GOLD = "fraud_alerts"
STREAMED_MARKER = "streamed"  # touched by the Spark child once every tier has run
# Metrics of a state operator worth a line (those that exist are printed; Spark versions differ).
STATE_FIELDS = (
    "numRowsTotal",
    "numRowsUpdated",
    "numRowsRemoved",
    "numRowsDroppedByWatermark",
    "memoryUsedBytes",
    "commitTimeMs",
    "allUpdatesTimeMs",
    "allRemovalsTimeMs",
    "numStateStoreInstances",
)
CUSTOM_FIELDS = (
    "rocksdbTotalSSTFilesSize",
    "rocksdbCommitCheckpointLatency",
    "rocksdbCommitFlushLatency",
    "rocksdbCommitCompactLatency",
    "rocksdbCommitWriteBatchLatency",
    "rocksdbCommitFileSyncLatencyMs",
    "rocksdbChangeLogWriterCommitLatencyMs",
    "rocksdbSaveZipFilesLatencyMs",
    "rocksdbCommitPauseLatency",
    "rocksdbPinnedBlocksMemoryUsage",
    "rocksdbSstFileSize",
    "numValueStateVars",
    "numListStateVars",
    "numRegisteredTimers",
    "numDeletedTimers",
    "numExpiredTimers",
    "timerProcessingTimeMs",
)

# Per gold micro-batch: column -> RocksDB custom metric (state commit steps; those that exist are shown).
BATCH_CUSTOM = {
    "flush_ms": "rocksdbCommitFlushLatency",
    "rocksdb_checkpoint_ms": "rocksdbCommitCheckpointLatency",
    "changelog_ms": "rocksdbChangeLogWriterCommitLatencyMs",
    "file_sync_ms": "rocksdbCommitFileSyncLatencyMs",
    "timers_registered": "numRegisteredTimers",
    "timers_deleted": "numDeletedTimers",
}


# ---- the Spark side (child process) ---------------------------------------------------------------


def folder_size(path: Path) -> tuple[int, int, dict[str, int]]:
    """(bytes, files, bytes by kind) under ``path``; kinds: sst, changelog, zip, crc, other."""
    size = files = 0
    kinds: dict[str, int] = {}
    for root, _, names in os.walk(path):
        for name in names:
            try:
                length = (Path(root) / name).stat().st_size
            except OSError:
                continue
            size, files = size + length, files + 1
            kind = next((k for k in ("crc", "sst", "changelog", "zip") if name.endswith(f".{k}")), "other")
            kinds[kind] = kinds.get(kind, 0) + length
    return size, files, kinds


def watch_parent(parent: int) -> None:
    """Exit if the benchmark that started us is gone (its JVM then ends with our stdin)."""
    while True:
        if os.getppid() != parent:
            os._exit(3)
        time.sleep(1.0)


def keys_in_state(spark: Any, checkpoint: Path) -> dict[str, Any]:
    """What the gold query's state holds, read back with Spark's state data source: cards with a
    machine state, buffered time slots, and the buckets of cards (see tidewater.keyed_state)."""
    from tidewater.keyed_state import stream_states

    out: dict[str, Any] = {}
    try:
        out["cards"] = len(stream_states(spark, str(checkpoint)))
        for var, name in (("pending", "slots"), ("slots", "buckets")):
            frame = spark.read.format("statestore").option("path", str(checkpoint)).option("stateVarName", var).load()
            out[name] = frame.count()
    except Exception as exc:  # not every Spark reads a Python processor's state
        out.setdefault("cards", f"unreadable: {str(exc).strip().splitlines()[0][:200]}")
    return out


def worker(result_path: Path, parent: int) -> int:
    from tidewater.lake.reads import read_table
    from tidewater.spark import build_session
    from tidewater.streaming.runner import PipelineStreams

    threading.Thread(target=watch_parent, args=(parent,), daemon=True).start()
    settings = Settings.from_env()
    began = time.monotonic()
    spark = build_session(settings, "tidewater-bench-payments")
    # Keep every progress of a query (default 100), so many small micro-batches are all seen.
    spark.conf.set("spark.sql.streaming.numRecentProgressUpdates", "100000")
    result: dict[str, Any] = {"session_start_s": time.monotonic() - began, "tiers": []}
    print(f"  SparkSession ({settings.spark_master}) in {result['session_start_s']:.1f} s", flush=True)
    streams = PipelineStreams(settings, PAYMENTS)
    try:
        streams.prepare(spark)
        for tier in streams.tiers:
            began = time.monotonic()
            query = streams.start(tier, {"availableNow": True})
            query.awaitTermination()
            wall = time.monotonic() - began
            progress = [json.loads(p.json) for p in query.recentProgress]
            rows = sum(int(p.get("numInputRows") or 0) for p in progress)
            busy_ms = sum(int((p.get("durationMs") or {}).get("triggerExecution") or 0) for p in progress)
            result["tiers"].append(
                {"query": tier.query, "wall_s": wall, "rows": rows, "busy_s": busy_ms / 1000, "progress": progress}
            )
            print(
                f"  {tier.query}: {rows:,} rows in {len(progress)} micro-batches, {wall:.1f} s "
                f"({rows / wall:,.0f} rows/s)",
                flush=True,
            )
        (result_path.parent / STREAMED_MARKER).touch()  # the parent's memory peak of the streaming ends here
        layout = streams.layout
        checkpoint = layout.checkpoint(f"gold_{GOLD}")
        state_bytes, state_files, state_kinds = folder_size(checkpoint / "state")
        silver = read_table(spark, layout.table_uri(PAYMENTS.table_of(PAYMENTS.source(), "silver")))
        result |= {
            "checkpoint": str(checkpoint),
            "state_dir_bytes": state_bytes,
            "state_dir_files": state_files,
            "state_dir_kinds": state_kinds,
            "checkpoint_bytes": folder_size(checkpoint)[0],
            "silver_rows": silver.count(),
            "silver_cards": silver.select("card_id").distinct().count(),
            "gold_rows": layout.table(f"gold/{GOLD}").row_count(),
        }
        began = time.monotonic()
        result["state_keys"] = keys_in_state(spark, checkpoint)
        result["state_read_s"] = time.monotonic() - began
    finally:
        streams.close()
        spark.stop()
    result_path.write_text(json.dumps(result))
    return 0


# ---- the benchmark (parent process) ---------------------------------------------------------------


def run_spark_child(settings: Settings, work: Path, timeout_s: float) -> tuple[dict[str, Any], int, int]:
    """Run :func:`worker` in a session of its own; returns its result and the session's peak RSS while
    the queries ran and over the whole child (with the read-backs of silver and the state after them)."""
    result_path, log_path = work / "spark-result.json", work / "spark.log"
    for stale in (result_path, work / STREAMED_MARKER):
        stale.unlink(missing_ok=True)
    with open(log_path, "ab") as log:
        child = subprocess.Popen(
            [sys.executable, str(Path(__file__).resolve()), "--worker", str(result_path), "--parent", str(os.getpid())],
            stdout=None,  # its progress lines go to our stdout
            stderr=log,  # Spark's and the workers' logs
            stdin=subprocess.DEVNULL,
            env={**os.environ, **spark_child_env(), **settings.to_env()},
            start_new_session=True,
        )
    sampler = MemorySampler(child.pid)
    sampler.start()
    streaming_peak = None
    deadline = time.monotonic() + timeout_s
    try:
        while child.poll() is None:
            if time.monotonic() > deadline:
                raise SystemExit(f"bench_payments: the Spark run took over {timeout_s:.0f} s; see {log_path}")
            if streaming_peak is None and (work / STREAMED_MARKER).exists():
                streaming_peak = sampler.peak
            time.sleep(0.25)
    finally:
        sampler.stopped.set()
        stop_process_group(child, timeout_s=30)
    if child.returncode != 0 or not result_path.exists():
        tail = "\n".join(log_path.read_text(errors="replace").splitlines()[-40:])
        raise SystemExit(f"bench_payments: the Spark run failed (exit {child.returncode}); {log_path}:\n{tail}")
    return json.loads(result_path.read_text()), streaming_peak or sampler.peak, sampler.peak


def state_metrics(progress: list[dict[str, Any]]) -> dict[str, Any]:
    """The state operator of the last progress that has one: the fields that exist."""
    for p in reversed(progress):
        for op in p.get("stateOperators") or []:
            fields = {k: op[k] for k in STATE_FIELDS if k in op}
            custom = op.get("customMetrics") or {}
            fields |= {k: custom[k] for k in CUSTOM_FIELDS if k in custom}
            fields["operatorName"] = op.get("operatorName")
            fields["batchId"] = p.get("batchId")
            return fields
    return {}


def batch_commits(progress: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """Per micro-batch: rows, duration, and the state store's commit figures (those that exist)."""
    out = []
    for p in progress:
        ops = p.get("stateOperators") or []
        custom = [op.get("customMetrics") or {} for op in ops]
        durations = p.get("durationMs") or {}
        out.append(
            {
                "batch": p.get("batchId"),
                "rows": p.get("numInputRows", 0),
                "trigger_ms": durations.get("triggerExecution"),
                "add_batch_ms": durations.get("addBatch"),
                "commit_ms": sum(op.get("commitTimeMs", 0) for op in ops) if ops else None,
                "all_updates_ms": sum(op.get("allUpdatesTimeMs", 0) for op in ops) if ops else None,
                **{
                    column: (sum(c.get(metric, 0) for c in custom) if any(metric in c for c in custom) else None)
                    for column, metric in BATCH_CUSTOM.items()
                },
                "state_rows": sum(op.get("numRowsTotal", 0) for op in ops) if ops else None,
            }
        )
    return out


def warm_rate(progress: list[dict[str, Any]]) -> float | None:
    """Rows/s within the micro-batches after the first (JVM, Python workers and caches warm), if
    at least two of them carry rows."""
    later = [p for p in progress[1:] if p.get("numInputRows")]
    if len(later) < 2:
        return None
    busy_ms = sum(int((p.get("durationMs") or {}).get("triggerExecution") or 0) for p in later)
    return sum(int(p["numInputRows"]) for p in later) / (busy_ms / 1000) if busy_ms else None


def fmt(value: Any) -> str:
    if value is None:
        return "-"
    if isinstance(value, float):
        return f"{value:,.1f}"
    if isinstance(value, int):
        return f"{value:,}"
    return str(value)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--events", type=int, default=200_000, help="payments produced")
    parser.add_argument("--cards", type=int, default=100_000, help="card pool of the generator")
    parser.add_argument("--max-offsets", type=int, default=50_000, help="Kafka records per bronze+silver micro-batch")
    parser.add_argument("--rate", type=float, help="simulated events/s (default: cards / 1200, i.e. pool = --cards)")
    parser.add_argument("--timeout", type=float, default=1800.0, help="give up on the Spark run after this many s")
    parser.add_argument("--work-dir", help="keep logs, checkpoints and tables here (default: a temp dir)")
    parser.add_argument("--worker", help=argparse.SUPPRESS)
    parser.add_argument("--parent", type=int, help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    if args.worker:
        return worker(Path(args.worker), args.parent)

    exit_on_sigterm()  # the clean-up below (broker and Spark child stopped) runs instead of leaving them behind
    started = time.monotonic()
    memory_gib = os.sysconf("SC_PHYS_PAGES") * os.sysconf("SC_PAGE_SIZE") / 2**30
    machine = f"{os.cpu_count()} cores, {memory_gib:.0f} GiB, {platform.platform()}"
    rate = args.rate or args.cards / 1200
    span_s = args.events / rate
    print(f"machine: {machine}", flush=True)
    print(
        f"payments: {args.events:,} events, {args.cards:,} cards, {rate:g} events/s simulated "
        f"({span_s / 60:.0f} min of event time), {args.max_offsets:,} records per micro-batch",
        flush=True,
    )
    results: dict[str, Any] = {
        "machine": machine,
        "load_average_at_start": round(os.getloadavg()[0], 2),
        "events": args.events,
        "cards": args.cards,
        "max_offsets_per_trigger": args.max_offsets,
    }
    with tempfile.TemporaryDirectory(prefix="tidewater-bench-payments-") as tmp, EmbeddedBroker() as broker:
        work = Path(args.work_dir or tmp)
        work.mkdir(parents=True, exist_ok=True)
        if (work / "state").exists():  # its checkpoints would resume: nothing left to measure
            raise SystemExit(f"bench_payments: {work / 'state'} exists from an earlier run; give an empty --work-dir")
        settings = Settings.from_env(
            state_dir=str(work / "state"),
            kafka_bootstrap_servers=broker.bootstrap_servers,
            kafka_topic_prefix="bench-",
            max_offsets_per_trigger=args.max_offsets,
        )
        topic = settings.topic(PAYMENTS.source().topic)
        ensure_topic(settings, topic, settings.kafka_topic_partitions)
        # Event time ends two minutes ago: nothing is ahead of the clock or after its arrival.
        start_ms = int(time.time() * 1000) - int(span_s * 1000) - 120_000
        config = GeneratorConfig(seed=11, members=args.cards, rate=rate, venues=2000, start_time_ms=start_ms)
        report = produce(settings, topic, config, count=args.events, realtime=False, events=PAYMENTS.sample_events)
        results["produce"] = {"sent": report.sent, "seconds": report.elapsed_s, "rate": report.rate}
        print(f"  produced {report.sent:,} payments in {report.elapsed_s:.1f} s ({report.rate:,.0f}/s)", flush=True)

        print("Spark (local run of the streaming job's queries, tier by tier, availableNow):", flush=True)
        spark, peak_rss, peak_rss_all = run_spark_child(settings, work, args.timeout)
        published = read_committed(
            kafka_python_config(settings), settings.topic(PAYMENTS.gold_table(GOLD).publish.topic)
        )

    tiers = spark["tiers"]
    silver_tiers = [t for t in tiers if not t["query"].startswith("gold_")]
    gold = next(t for t in tiers if t["query"] == f"gold_{GOLD}")
    silver_wall = sum(t["wall_s"] for t in silver_tiers)
    silver_busy = sum(t["busy_s"] for t in silver_tiers)
    kafka_rows = silver_tiers[0]["rows"]
    total_wall = silver_wall + gold["wall_s"]
    results["tiers"] = {
        "bronze_silver": {
            "rows": kafka_rows,
            "micro_batches": sum(len(t["progress"]) for t in silver_tiers),
            "wall_s": silver_wall,
            "events_per_s": kafka_rows / silver_wall,
            "in_batch_events_per_s": kafka_rows / silver_busy if silver_busy else None,
            "warm_events_per_s": warm_rate([p for t in silver_tiers for p in t["progress"]]),
        },
        "gold_fraud_alerts": {
            "rows": gold["rows"],
            "micro_batches": len(gold["progress"]),
            "wall_s": gold["wall_s"],
            "events_per_s": gold["rows"] / gold["wall_s"],
            "in_batch_events_per_s": gold["rows"] / gold["busy_s"] if gold["busy_s"] else None,
            "warm_events_per_s": warm_rate(gold["progress"]),
        },
        "overall": {"wall_s": total_wall, "events_per_s": kafka_rows / total_wall},
    }
    results["lake"] = {
        "silver_rows": spark["silver_rows"],
        "silver_cards": spark["silver_cards"],
        "alerts_in_gold": spark["gold_rows"],
        "alerts_published": len(published),
    }
    results["state"] = {
        "keys": spark["state_keys"],
        "state_dir_bytes": spark["state_dir_bytes"],
        "state_dir_files": spark["state_dir_files"],
        "state_dir_bytes_by_kind": spark["state_dir_kinds"],
        "checkpoint_bytes": spark["checkpoint_bytes"],
        "last_progress": state_metrics(gold["progress"]),
        "batches": batch_commits(gold["progress"]),
    }
    results["spark_session_start_s"] = spark["session_start_s"]
    results["peak_rss_gib"] = peak_rss / 2**30
    results["peak_rss_with_read_back_gib"] = peak_rss_all / 2**30
    results["run_s"] = time.monotonic() - started
    # Other work on the machine (a test run) skews every figure: say how busy it was.
    results["load_average_at_end"] = round(os.getloadavg()[0], 2)

    mib = 2**20
    t = results["tiers"]
    print()
    print(f"{'tier':<34} {'rows':>9} {'batches':>7} {'wall s':>7} {'events/s':>9} {'in-batch/s':>10} {'warm/s':>8}")
    for name, label in (
        ("bronze_silver", "Kafka -> bronze + silver"),
        ("gold_fraud_alerts", "silver -> fraud_alerts (+publish)"),
    ):
        row = t[name]
        in_batch, warm = row["in_batch_events_per_s"], row["warm_events_per_s"]
        print(
            f"{label:<34} {row['rows']:>9,} {row['micro_batches']:>7} {row['wall_s']:>7.1f} "
            f"{row['events_per_s']:>9,.0f} {fmt(in_batch and round(in_batch)):>10} {fmt(warm and round(warm)):>8}"
        )
    print(
        f"{'overall Kafka -> gold':<34} {kafka_rows:>9,} {'':>7} {total_wall:>7.1f} "
        f"{t['overall']['events_per_s']:>9,.0f}"
    )
    print()
    lake = results["lake"]
    state = results["state"]
    print(f"{'measure':<56} figure")
    figures = [
        ("silver rows / distinct cards in silver", f"{lake['silver_rows']:,} / {lake['silver_cards']:,}"),
        ("alerts in gold / published (committed)", f"{lake['alerts_in_gold']:,} / {lake['alerts_published']:,}"),
        (
            "in state: cards / buffered slots / buckets",
            " / ".join(fmt(state["keys"].get(v, "n/a")) for v in ("cards", "slots", "buckets")),
        ),
        (
            "gold checkpoint state/ on disk",
            f"{state['state_dir_bytes'] / mib:,.1f} MiB in {state['state_dir_files']:,} files "
            f"(whole checkpoint {state['checkpoint_bytes'] / mib:,.1f} MiB)",
        ),
        (
            "  of which (MiB)",
            ", ".join(f"{k} {v / mib:,.1f}" for k, v in sorted(state["state_dir_bytes_by_kind"].items())),
        ),
    ]
    figures += [(f"last progress: {k}", fmt(v)) for k, v in state["last_progress"].items()]
    figures += [
        ("SparkSession start", f"{results['spark_session_start_s']:.1f} s"),
        ("peak RSS (Python driver + JVM + workers), queries", f"{peak_rss / mib:,.0f} MiB"),
        ("  with the read-back of silver and state after them", f"{peak_rss_all / mib:,.0f} MiB"),
        ("produce", f"{report.sent:,} in {report.elapsed_s:.1f} s"),
        ("whole run", f"{results['run_s']:.0f} s"),
        (
            "load average (1 min) at start / end",
            f"{results['load_average_at_start']:g} / {results['load_average_at_end']:g} on {os.cpu_count()} cores",
        ),
    ]
    for label, value in figures:
        print(f"{label:<56} {value}")
    print()
    print("gold micro-batches (state figures: Spark's sums over the state store instances, one per shuffle partition):")
    columns = (
        "batch",
        "rows",
        "trigger_ms",
        "add_batch_ms",
        "commit_ms",
        "all_updates_ms",
        *BATCH_CUSTOM,
        "state_rows",
    )
    widths = [max(len(c), 8) for c in columns]
    print(" ".join(f"{c:>{w}}" for c, w in zip(columns, widths, strict=True)))
    for b in state["batches"]:
        print(" ".join(f"{fmt(b[c]):>{w}}" for c, w in zip(columns, widths, strict=True)))
    print()
    print(json.dumps(results, separators=(",", ":")))
    return 0


if __name__ == "__main__":
    sys.exit(main())
