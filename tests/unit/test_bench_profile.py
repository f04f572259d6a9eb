"""The benchmark's profile report: each phase under its parent, whichever thread timed it."""

from __future__ import annotations

import json
import os
import sys
from pathlib import Path
from types import SimpleNamespace

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "benchmarks"))

from bench_stream import (
    CpuWindow,
    MemorySampler,
    attempt,
    backlog_hour,
    batch_label,
    by_role,
    compiles_per_trigger,
    cpu_line,
    cpu_seconds,
    keep_roles,
    loop_seconds,
    machine_line,
    main,
    minute_line,
    process_role,
    render_memory,
    spawning,
    summarize_runs,
    touch_seconds,
    tree_order,
)

from tidewater.runner_forkserver import WAITER_SCRIPT


def test_a_phase_timed_on_another_thread_is_listed_under_its_parent() -> None:
    ran = ["bronze", "bronze/read", "silver", "silver/already committed?", "bronze/commit", "silver/parse"]
    assert tree_order(ran) == [
        "bronze",
        "bronze/read",
        "bronze/commit",
        "silver",
        "silver/already committed?",
        "silver/parse",
    ]
    # Phases of one thread keep the order they ran in; a child whose parent was not timed comes last.
    assert tree_order(["b", "a", "a/x", "c/y"]) == ["b", "a", "a/x", "c/y"]


PY = "/venv/bin/python"
JVM = ["/usr/lib/jvm/bin/java", "-cp", "jars/*", "org.apache.spark.deploy.SparkSubmit", "spark_jobs/stream.py"]


def test_each_process_of_a_streaming_job_is_named_by_its_role() -> None:
    daemon = [PY, "-m", "pyspark.daemon", "pyspark.worker"]
    planner = [PY, "-m", "pyspark.daemon", "pyspark.sql.worker.plan_data_source_read"]
    assert process_role(JVM, ["bash"]) == "JVM"
    assert process_role([PY, "/repo/spark_jobs/stream.py", "rsvps"], JVM) == "Python driver"
    # A forked worker has its daemon's command line: the parent's tells them apart.
    assert process_role(daemon, JVM) == "Python daemon"
    assert process_role(daemon, daemon) == "task worker"
    assert process_role(planner, planner) == "read-planning worker"
    assert process_role(planner, JVM) == "Python daemon"
    other = [PY, "-m", "pyspark.daemon", "pyspark.sql.worker.some_new_module"]
    assert process_role(other, other) == "pyspark.sql.worker.some_new_module worker"
    runner = [PY, "-m", "pyspark.sql.streaming.python_streaming_source_runner"]
    assert process_role(runner, JVM) == "streaming-source runner"
    waiting = ["/bin/sh", "-c", WAITER_SCRIPT]  # the same process once its fork serves the JVM
    assert process_role(waiting, JVM) == "streaming-source runner"
    assert process_role([], JVM) == "other"


def test_memory_by_role_sums_each_role_and_the_report_takes_medians_over_runs() -> None:
    mib = 2**20
    run = by_role([("JVM", 600 * mib), ("task worker", 140 * mib), ("task worker", 150 * mib)])
    assert run == {"JVM": [1, 600.0], "task worker": [2, 290.0]}
    assert list(run) == ["JVM", "task worker"]  # largest first
    other = by_role([("JVM", 700 * mib), ("task worker", 100 * mib)])
    third = by_role([("JVM", 650 * mib), ("Python daemon", 30 * mib)])
    lines = render_memory("memory at the offered rate", [run, other, third])
    assert lines[0].startswith("### memory at the offered rate: the job's process tree at its PSS peak (3 run(s)")
    rows = [line for line in lines if line.startswith("| ") and not line.startswith("| process")]
    # medians: JVM 650; task workers 1 process / 100 MiB (runs without any count as 0); daemon 0
    assert rows[0] == "| JVM | 1 | 650 |"
    assert rows[1] == "| task worker | 1 | 100 |"
    assert rows[2] == "| Python daemon | 0 | 0 |"
    assert rows[3] == "| **total** | | **800** |"  # the median of the runs' totals 890, 800, 680


def test_a_jvms_child_before_its_exec_is_not_counted_as_a_second_jvm() -> None:
    daemon = [PY, "-m", "pyspark.daemon", "pyspark.worker"]
    assert spawning(JVM, JVM)  # shares the JVM's memory until it runs the new program
    assert not spawning(JVM, ["bash", "spark-submit"])  # the JVM itself
    assert not spawning(daemon, daemon)  # a forked Python worker holds memory of its own
    assert not spawning(daemon, JVM)
    assert not spawning([], JVM)


def test_compiles_per_trigger_counts_from_each_runs_first_progress_record(tmp_path: Path) -> None:
    """JVM-wide totals: the start-up's compiles (before the first record) are not counted; a record
    without the figure (no SparkContext) is skipped; runs add up."""
    first, second, empty = tmp_path / "1.jsonl", tmp_path / "2.jsonl", tmp_path / "3.jsonl"
    first.write_text("".join(json.dumps({"codegen_compiles_total": n}) + "\n" for n in (120, 122, 124, 126)))
    second.write_text(
        "".join(json.dumps(r) + "\n" for r in ({"codegen_compiles_total": 90}, {}, {"codegen_compiles_total": 90}))
    )
    empty.write_text(json.dumps({"codegen_compiles_total": 7}) + "\n")
    assert compiles_per_trigger([first]) == 2.0
    assert compiles_per_trigger([first, second, empty, tmp_path / "missing.jsonl"]) == 6 / 4
    assert compiles_per_trigger([empty]) is None


def test_the_steady_peak_counts_only_samples_after_the_start_up_workers_exited() -> None:
    """Before Spark starts them the tree is small anyway; while they live only the overall peak moves."""
    sampler = MemorySampler(sid=0)
    mib = 2**20
    sampler.observe([("JVM", 300 * mib)])
    assert sampler.steady_pss == 0
    sampler.observe([("JVM", 500 * mib), ("read-planning worker", 60 * mib), ("source-lookup worker", 40 * mib)])
    assert (sampler.peak_pss, sampler.steady_pss) == (600 * mib, 0)
    sampler.observe([("JVM", 520 * mib), ("task worker", 30 * mib)])
    sampler.observe([("JVM", 510 * mib)])
    assert (sampler.peak_pss, sampler.steady_pss) == (600 * mib, 550 * mib)
    assert sampler.peak_roles["read-planning worker"] == [1, 60.0]


def test_each_minute_keeps_its_own_pss_peak_so_a_long_run_shows_growth() -> None:
    sampler = MemorySampler(sid=0)
    mib, t0 = 2**20, sampler.started
    sampler.observe([("JVM", 400 * mib)], at=t0 + 5)
    sampler.observe([("JVM", 450 * mib)], at=t0 + 50)
    sampler.observe([("JVM", 420 * mib)], at=t0 + 61)
    sampler.observe([("JVM", 700 * mib)], at=t0 + 245)  # minute 4; minutes 2 and 3 had no sample
    assert sampler.minute_peaks == [450 * mib, 420 * mib, 0, 0, 700 * mib]
    runs = [
        {"pss_by_minute_gb": [1.0, 1.2, 1.4, 1.6, 1.8]},
        {"pss_by_minute_gb": [1.2, 1.4, 1.6, 1.8, 2.0, 2.2]},
        {"pss_by_minute_gb": [1.1, 1.3, 1.5, 1.7, 1.9]},
    ]
    assert minute_line(runs) == "  PSS peak in each minute of the job at that rate: 1.10, 1.30, 1.50, 1.70, 1.90 GB"
    assert minute_line([{"pss_by_minute_gb": [1.0, 1.1, 1.2]}, {}]) == ""


def test_the_machine_probe_scales_each_sample_to_the_reported_loop() -> None:
    samples = loop_seconds(samples=3, steps=20_000)
    assert len(samples) == 3
    # 20k steps take well under a millisecond; scaled to 10M steps that is tenths of a second, not microseconds
    assert all(0.01 < s < 60 for s in samples)


def test_each_pipelines_summary_says_how_fast_the_machine_was_around_its_runs() -> None:
    runs = [
        {"loop_s": {"before": [0.7, 0.72], "after the drain": [2.1]}, "touch_s": {"before": [0.5]}},
        {"loop_s": {"before": [1.9]}, "touch_s": {"before": [0.1, 0.2]}, "failed": ["latency: boom"]},
    ]
    lines = summarize_runs("rsvps", runs)
    assert lines[2] == (
        "  machine around these runs: 10M-step Python loop in 1.31 s [0.70-2.10 s], "
        "256 MiB of fresh memory touched in 0.20 s [0.10-0.50 s] (4 + 3 samples)"
    )
    assert lines[1] == "  FAILED latency: boom"
    assert machine_line([{}]) is None


def test_the_touch_probe_times_each_pass_over_fresh_memory() -> None:
    samples = touch_seconds(samples=2, mib=4)
    assert len(samples) == 2 and all(0 < s < 30 for s in samples)


def test_the_latency_summary_reports_the_brokers_share_of_a_core() -> None:
    latency = {
        "achieved_rate": 300.0,
        "p50_s": 1.0,
        "p95_s": 2.0,
        "gold_p95_s": {},
        "peak_rss_gb": 1.0,
        "peak_pss_gb": 0.8,
        "executor_peak_rss_gb": 0.0,
    }
    runs = [
        {"latency": {**latency, "broker_core_share": share, "broker_cpu_s": share * 100}} for share in (0.1, 0.25, 0.4)
    ]
    lines = summarize_runs("ads", runs)
    assert (
        "  the embedded broker over the latency run (start-up included): 25.0 s [10.0-40.0 s] of CPU, "
        "25% of a core [10-40% of a core]"
    ) in lines
    assert cpu_seconds(os.getpid()) is not None and cpu_seconds(None) is None


def test_the_cpu_window_counts_each_role_from_its_start_and_a_process_born_inside_from_zero() -> None:
    window = CpuWindow()
    window.start, window.end = 10.0, 20.0
    window.sample(5.0, {1: ("JVM", 30.0), 2: ("task worker", 4.0)})  # before the window: a baseline only
    window.sample(10.5, {1: ("JVM", 31.0), 2: ("task worker", 4.5)})
    window.sample(15.0, {1: ("JVM", 35.0), 2: ("task worker", 5.0), 3: ("task worker", 1.0)})  # 3 was born
    window.sample(20.5, {1: ("JVM", 99.0), 3: ("task worker", 9.0)})  # after the window: not counted
    assert window.by_role() == {"JVM": [1, 4.0], "task worker": [2, 1.5]}
    assert window.seconds() == 4.5
    latency = {"cpu_by_role": window.by_role(), "cpu_seconds": window.seconds()}
    assert cpu_line([latency], "over the measured seconds at that rate") == [
        "  CPU over the measured seconds at that rate, % of a core (median): 122% in all; JVM 89%, task worker 33%"
    ]


def test_a_drain_says_where_its_cpu_went_and_an_older_result_says_nothing() -> None:
    """The drain's CPU is of the stretch its rate is measured over; results from before it have no line."""
    window = CpuWindow()
    window.start, window.end = 100.0, 111.0
    window.sample(99.0, {1: ("JVM", 50.0), 2: ("Python driver", 5.0)})
    window.sample(100.5, {1: ("JVM", 50.5), 2: ("Python driver", 5.2)})
    window.sample(110.5, {1: ("JVM", 66.5), 2: ("Python driver", 9.2)})
    drained = {"events_per_s": 30_000.0, "peak_rss_gb": 2.5, "peak_pss_gb": 2.1, "executor_peak_rss_gb": 0.0}
    drained |= {"cpu_by_role": window.by_role(), "cpu_seconds": window.seconds(), "drain_batch": 200_000}
    lines = summarize_runs("rsvps", [{"throughput": drained}])
    assert (
        "  CPU between 20% and 90% of the drain, % of a core (median): 200% in all; JVM 160%, Python driver 40%"
        in lines
    )
    older = {k: v for k, v in drained.items() if not k.startswith("cpu")}
    assert not [line for line in summarize_runs("rsvps", [{"throughput": older}]) if "CPU" in line]


def test_a_drain_with_a_jvm_profile_says_what_the_jvm_did_and_why_a_run_has_none() -> None:
    """--jvm-profile: every run's samples, collections and allocation in three lines; a run it could not
    record, one line."""
    drained = {"events_per_s": 30_000.0, "peak_rss_gb": 2.5, "peak_pss_gb": 2.1, "executor_peak_rss_gb": 0.0}
    recorded = {
        "samples": {"JSON parse (from_json)": 30, "sort (for sort-based aggregates)": 10},
        "collections": {"DefNew": [40, 400.0], "SerialOld": [2, 600.0]},
        "allocated": {"byte[] in CreateJacksonParser$.utf8String": 3 * 2**30, "other sites": 2**30},
        "seconds": 5.0,
    }
    runs = [
        {"throughput": drained | {"jvm_profile": recorded}},
        {"throughput": drained | {"jvm_profile": recorded | {"samples": {"JSON parse (from_json)": 10}}}},
        {"throughput": drained | {"jvm_profile_problem": "no JVM in the job's process tree to record"}},
    ]
    lines = summarize_runs("rsvps", runs)
    assert "  JVM profile left out: no JVM in the job's process tree to record" in lines
    assert (
        "  the JVM's CPU samples over the measured drain (50, JFR): JSON parse (from_json) 80%,"
        " sort (for sort-based aggregates) 20%" in lines
    )
    assert (
        "  the JVM's garbage collection over the measured drain: DefNew 80 collections, 800 ms;"
        " SerialOld 4 collections, 1,200 ms: the JVM paused 20% of 10 s" in lines
    )
    assert (
        "  the JVM's allocation over the measured drain: 8.0 GiB allocated (JFR's estimate):"
        " byte[] in CreateJacksonParser$.utf8String 75%" in lines
    )
    assert not [line for line in summarize_runs("rsvps", [{"throughput": drained}]) if "JVM" in line]


def test_a_process_keeps_its_role_when_its_command_line_is_gone() -> None:
    """A sample that cannot read a process's command line (an exiting one has none) reads it as "other"."""
    known: dict[int, str] = {}
    assert keep_roles(known, {1: "JVM", 2: "task worker"}) == {1: "JVM", 2: "task worker"}
    assert keep_roles(known, {1: "other", 2: "task worker", 3: "other"}) == {1: "JVM", 2: "task worker", 3: "other"}
    assert keep_roles(known, {1: "Python driver"}) == {1: "Python driver"}  # a pid used again: read afresh
    assert known == {1: "Python driver", 2: "task worker", 3: "other"}


def test_a_measure_records_the_brokers_cpu_meanwhile_and_the_drain_summary_reports_it() -> None:
    figures: dict[str, dict[str, float]] = {}
    drain = {"events_per_s": 1000.0, "peak_rss_gb": 1.0, "peak_pss_gb": 0.8, "executor_peak_rss_gb": 0.0}
    got = attempt(figures, "throughput", lambda: dict(drain), broker_pid=os.getpid())  # this process stands in
    assert got is figures["throughput"] and got["broker_cpu_s"] >= 0 and 0 <= got["broker_core_share"] < 4
    lines = summarize_runs("rsvps", [figures])
    assert any(
        line.startswith("  the embedded broker over the drain (the backlog's preload included): ") for line in lines
    )
    assert "broker_cpu_s" not in (attempt({}, "x", lambda: {}) or {})  # no broker: nothing recorded


def test_the_drain_summary_says_the_micro_batch_size_and_a_bad_size_is_refused(capsys) -> None:
    drain = {"events_per_s": 45_000.0, "peak_rss_gb": 2.6, "peak_pss_gb": 2.1, "executor_peak_rss_gb": 0.0}
    lines = summarize_runs("payments", [{"throughput": drain | {"drain_batch": 200_000}}])
    assert (
        "  Kafka -> silver while draining (200,000-record micro-batches): 45,000 events/s (target >= 40,000)" in lines
    )
    older = summarize_runs("payments", [{"throughput": drain}])  # a result from before the field: 100k
    assert any(line.startswith("  Kafka -> silver while draining (100,000-record micro-batches):") for line in older)
    assert batch_label(200_000) == "200k-record" and batch_label(12_345) == "12,345-record"  # the profile's titles
    for argv, problem in (
        (["--drain-batch", "0"], "--drain-batch must be at least 1"),
        (["--drain-batch", "400000", "--backlog", "1000000"], "--backlog must be at least 1,200,000"),
    ):
        with pytest.raises(SystemExit):
            main(argv)
        assert problem in capsys.readouterr().err


def test_silver_latency_counts_each_event_at_the_commit_that_made_it_visible_not_at_a_compaction(tmp_path) -> None:
    import datetime as dt

    import pyarrow as pa
    from bench_stream import commit_latencies

    from tidewater.lake.compaction import StreamCompaction
    from tidewater.lake.tables import LakeTable

    schema = pa.schema([("kafka_timestamp", pa.timestamp("us", tz="UTC")), ("day", pa.date32())])
    table = LakeTable((tmp_path / "silver").as_uri())
    table.ensure(schema, partition_by=["day"])
    compaction = StreamCompaction(every=3, query="q", stagger=False)
    produced = dt.datetime(2026, 11, 29, 1, 0, tzinfo=dt.UTC)
    rounds = []
    for batch_id in range(1, 4):  # the third commit compacts the partition's three files
        stamp = produced + dt.timedelta(seconds=batch_id)
        rows = pa.table({"kafka_timestamp": [stamp] * 2, "day": [stamp.date()] * 2}, schema=schema)
        rounds.append(compaction.after_commit(table, table.append_arrow(rows, app_id="q", batch_id=batch_id)))
    assert rounds[-1] is not None and rounds[-1].files_removed == 3  # the compaction did run

    commits = commit_latencies(table, produced_after=produced.timestamp())

    assert [len(stamps) for _, stamps in commits] == [2, 2, 2]  # six events, each once
    assert sorted(t for _, stamps in commits for t in stamps) == [produced.timestamp() + s for s in (1, 1, 2, 2, 3, 3)]


def test_the_audit_summary_gives_the_hours_audit_rate_and_names_the_suites_that_failed() -> None:
    def audit(seconds: float, failed: list[str]) -> dict:
        return {
            "events_per_s": 1_000_000 / seconds,
            "wall_events_per_s": 1_000_000 / (seconds + 8),
            "peak_rss_gb": 3.0,
            "failed_suites": failed,
        }

    runs = [{"audit": audit(50, [])}, {"audit": audit(40, ["rsvps.silver"])}, {"audit": audit(100, [])}]
    (line,) = [line for line in summarize_runs("rsvps", runs) if "audit" in line]
    assert line == (
        "  audit of that hour (every suite, the reconciliation, parity): 20,000 events/s [10,000-25,000 events/s]"
        " in the job, 17,241 events/s [9,259-20,833 events/s] with Spark's start; peak RSS 3.00 GB [3.00-3.00 GB];"
        " suites that failed: rsvps.silver"
    )
    # The recomputed (and audited) hour: the drained events' hour, and the next when they begin at :55 or later.
    rsvps = SimpleNamespace(name="rsvps")
    assert backlog_hour(rsvps, {"events_from_ms": 1_795_965_600_000}) == [
        "--pipeline",
        "rsvps",
        "--start",
        "2026-11-29T15:00:00+00:00",
        "--end",
        "2026-11-29T16:00:00+00:00",
    ]
    assert backlog_hour(rsvps, {"events_from_ms": 1_795_967_820_000})[-1] == "2026-11-29T17:00:00+00:00"
