"""The bench's JVM profile: JFR's printed samples and collections, read and grouped by kind of work."""

from __future__ import annotations

import sys
import time
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "benchmarks"))

from jvm_profile import (
    DRIVER_THREADS,
    OTHER,
    OTHER_SITES,
    STAGE_CODE,
    FlightRecordingError,
    Sample,
    Window,
    allocation_line,
    allocation_sites,
    collections,
    gc_line,
    kind_of,
    merged,
    parse_samples,
    recording_options,
    render,
    site_of,
)

TASK = "Executor task launch worker for task 3.0 in stage 7.0 (TID 12)"

PRINTED = """
jdk.ExecutionSample {
  startTime = 07:04:06.101
  sampledThread = "Executor task launch worker for task 3.0 in stage 7.0 (TID 12)" (javaThreadId = 88)
  state = "STATE_RUNNABLE"
  stackTrace = [
    com.fasterxml.jackson.core.sym.CharsToNameCanonicalizer.findSymbol(char[], int, int, int) line: 601
    org.apache.spark.sql.catalyst.json.JacksonParser.parse(Object, Function2, Function1) line: 640
    org.apache.spark.sql.catalyst.expressions.GeneratedClass$GeneratedIteratorForCodegenStage1.processNext() line: -1
    ...
  ]
}

jdk.ExecutionSample {
  startTime = 07:04:06.121
  sampledThread = "stream execution thread for live.rsvps.bronze [id = 1]" (javaThreadId = 90)
  state = "STATE_RUNNABLE"
  stackTrace = [
    org.apache.spark.sql.catalyst.rules.RuleExecutor.execute(LogicalPlan) line: 210
  ]
}
"""

GC_PRINTED = """
jdk.GarbageCollection {
  startTime = 07:04:06.200
  duration = 14.1 ms
  gcId = 1
  name = "DefNew"
  cause = "Allocation Failure"
  sumOfPauses = 14.1 ms
  longestPause = 14.1 ms
}

jdk.GarbageCollection {
  startTime = 07:04:07.300
  duration = 1.2 s
  gcId = 2
  name = "SerialOld"
  cause = "Allocation Failure"
  sumOfPauses = 1.2 s
  longestPause = 1.2 s
}

jdk.GarbageCollection {
  startTime = 07:04:07.900
  gcId = 3
  name = "DefNew"
  sumOfPauses = 850 us
}
"""


def test_printed_samples_are_read_with_their_thread_and_frames_running_first() -> None:
    samples = list(parse_samples(PRINTED.splitlines(keepends=True)))
    assert [s.thread for s in samples] == [TASK, "stream execution thread for live.rsvps.bronze [id = 1]"]
    assert samples[0].frames == [
        "com.fasterxml.jackson.core.sym.CharsToNameCanonicalizer.findSymbol",
        "org.apache.spark.sql.catalyst.json.JacksonParser.parse",
        "org.apache.spark.sql.catalyst.expressions.GeneratedClass$GeneratedIteratorForCodegenStage1.processNext",
    ]
    assert [kind_of(s) for s in samples] == ["JSON parse (from_json)", DRIVER_THREADS]
    assert [s.at for s in samples] == ["07:04:06.101", "07:04:06.121"]


def test_a_sample_belongs_to_the_innermost_kind_of_work_named_in_its_stack() -> None:
    sorting = Sample(
        TASK,
        [
            "org.apache.spark.unsafe.array.ByteArrayMethods.arrayEquals",
            "org.apache.spark.sql.catalyst.expressions.BaseOrdering.compare",
            "org.apache.spark.sql.execution.UnsafeExternalRowSorter$RowComparator.compare",
            "org.apache.spark.sql.execution.aggregate.SortAggregateExec.$anonfun$doExecute$1",
        ],
    )
    assert kind_of(sorting) == "sort (for sort-based aggregates)"
    # the parse pulled by an aggregate is still the parse
    pulled = Sample(TASK, ["com.fasterxml.jackson.core.json.ReaderBasedJsonParser.nextToken", *sorting.frames[3:]])
    assert kind_of(pulled) == "JSON parse (from_json)"


def test_the_search_stops_at_a_stage_s_generated_code() -> None:
    # A projection's row writer inside stage 3, which an aggregate above it pulls: the stage's own work.
    projection = Sample(
        TASK,
        [
            "org.apache.spark.sql.catalyst.expressions.codegen.UnsafeWriter.writeUnalignedBytes",
            "org.apache.spark.sql.catalyst.expressions.GeneratedClass$GeneratedIteratorForCodegenStage3.processNext",
            "org.apache.spark.sql.execution.aggregate.SortAggregateExec.$anonfun$doExecute$1",
        ],
    )
    assert kind_of(projection) == STAGE_CODE
    assert kind_of(Sample(TASK, ["java.lang.Thread.run"])) == OTHER


def _epoch(clock: str) -> float:
    """Today's ``HH:MM:SS.mmm`` on this machine's clock, in epoch seconds."""
    day = time.strftime("%Y-%m-%d")
    whole, _, ms = clock.partition(".")
    return time.mktime(time.strptime(f"{day} {whole}", "%Y-%m-%d %H:%M:%S")) + int(ms or 0) / 1000


def test_collections_are_counted_by_collector_with_their_pauses_in_ms_within_the_window() -> None:
    assert collections(GC_PRINTED.splitlines()) == {"DefNew": [2, 14.9], "SerialOld": [1, 1200.0]}
    # the measured stretch: the first two collections, not the third
    within = Window(_epoch("07:04:06.000"), _epoch("07:04:07.500"))
    assert collections(GC_PRINTED.splitlines(), within) == {"DefNew": [1, 14.1], "SerialOld": [1, 1200.0]}
    assert within.holds("07:04:06.000") and within.holds("07:04:07.500") and not within.holds("07:04:07.900")
    assert not within.holds("")


def test_a_window_across_midnight_holds_both_ends_of_the_clock() -> None:
    before = _epoch("23:59:59.000")
    across = Window(before, before + 2.0)
    assert across.holds("23:59:59.500") and across.holds("00:00:00.500")
    assert not across.holds("12:00:00.000")
    assert across.seconds == 2.0


def test_the_recording_starts_with_the_jvm_and_is_written_as_it_exits(tmp_path) -> None:
    path = tmp_path / "drain.jfr"
    assert recording_options(path) == f"-XX:StartFlightRecording=filename={path},settings=default,dumponexit=true"
    with pytest.raises(FlightRecordingError, match="comma or a space"):
        recording_options(tmp_path / "a b.jfr")


def test_runs_merge_and_the_collections_say_how_long_the_jvm_stood_paused() -> None:
    one = {"samples": {"sort (for sort-based aggregates)": 30, STAGE_CODE: 10}, "collections": {"DefNew": [2, 500.0]}}
    two = {"samples": {STAGE_CODE: 60}, "collections": {"DefNew": [1, 250.0], "SerialOld": [1, 1250.0]}}
    both = merged([one | {"seconds": 4.0}, two | {"seconds": 6.0}])
    assert both["samples"] == {STAGE_CODE: 70, "sort (for sort-based aggregates)": 30}
    assert both["collections"] == {"DefNew": [3, 750.0], "SerialOld": [1, 1250.0]}
    assert both["seconds"] == 10.0
    assert gc_line(both) == (
        "DefNew 3 collections, 750 ms; SerialOld 1 collections, 1,250 ms: the JVM paused 20% of 10 s"
    )
    table = render("the JVM's CPU draining", both)
    assert f"| {STAGE_CODE} | 70 | 70% |" in table
    assert "| **all** | **100** | |" in table
    assert render("nothing", {"samples": {}}) == []


ALLOCATIONS_PRINTED = """
jdk.ObjectAllocationSample {
  startTime = 09:51:30.158
  objectClass = byte[] (classLoader = bootstrap)
  weight = 8.0 kB
  eventThread = "Executor task launch worker for task 1.0 in stage 4.0 (TID 9)" (javaThreadId = 71)
  stackTrace = [
    java.nio.HeapByteBuffer.<init>(int, int, MemorySegment) line: 71
    java.nio.ByteBuffer.allocate(int) line: 391
    sun.nio.cs.StreamDecoder.<init>(InputStream, Object, CharsetDecoder) line: 254
    java.io.InputStreamReader.<init>(InputStream, Charset) line: 115
    org.apache.spark.sql.catalyst.json.CreateJacksonParser$.utf8String(JsonFactory, UTF8String) line: 43
    org.apache.spark.sql.catalyst.expressions.JsonToStructsEvaluator.$anonfun$parser$2(JsonFactory) line: 145
    ...
  ]
}

jdk.ObjectAllocationSample {
  startTime = 09:51:30.210
  objectClass = byte[] (classLoader = bootstrap)
  weight = 1.5 MB
  eventThread = "task-result-getter-0" (javaThreadId = 80)
  stackTrace = [
    java.nio.HeapByteBuffer.<init>(int, int, MemorySegment) line: 71
    io.netty.buffer.CompositeByteBuf.nioBuffer(int, int) line: 1699
    org.apache.spark.network.buffer.NettyManagedBuffer.nioByteBuffer() line: 44
    ...
  ]
}

jdk.ObjectAllocationSample {
  startTime = 09:51:31.000
  objectClass = org.apache.spark.unsafe.types.UTF8String (classLoader = app)
  weight = 512 bytes
  eventThread = "Executor task launch worker for task 0.0 in stage 4.0 (TID 8)" (javaThreadId = 70)
  stackTrace = [
    org.apache.spark.unsafe.types.UTF8String.fromAddress(Object, long, int) line: 150
    org.apache.spark.sql.catalyst.expressions.GeneratedClass$GeneratedIteratorForCodegenStage12.processNext() line: -1
    ...
  ]
}
"""


def test_allocation_samples_are_added_up_by_class_and_the_code_that_asked_for_the_memory() -> None:
    samples = list(parse_samples(ALLOCATIONS_PRINTED.splitlines()))
    assert [s.weight for s in samples] == [8 * 1024, 1.5 * 1024**2, 512]
    assert samples[0].thread.startswith(TASK.split(" for ")[0]) and samples[1].thread == "task-result-getter-0"
    # below the JDK's reader and Netty's buffers: Spark's code; a stage's number left out
    assert [site_of(s) for s in samples] == [
        "byte[] in CreateJacksonParser$.utf8String",
        "byte[] in NettyManagedBuffer.nioByteBuffer",
        "org.apache.spark.unsafe.types.UTF8String in UTF8String.fromAddress",
    ]
    assert site_of(Sample("main", ["java.lang.Thread.run"], allocated="int[]")) == "int[] in Thread.run"
    parser = Sample(TASK, samples[0].frames, allocated="byte[]", weight=8192.0)
    sites = allocation_sites([parser, parser, samples[1], samples[2]], kept=1)
    assert sites == {"byte[] in NettyManagedBuffer.nioByteBuffer": 1.5 * 1024**2, OTHER_SITES: 2 * 8192 + 512}


def test_the_allocation_of_several_runs_is_added_up_and_shown_largest_first() -> None:
    one = {"samples": {STAGE_CODE: 1}, "allocated": {"byte[] in A.a": 3 * 1024**3, OTHER_SITES: 1024**3}}
    two = {"samples": {STAGE_CODE: 1}, "allocated": {"byte[] in B.b": 4 * 1024**3, "byte[] in A.a": 2 * 1024**3}}
    both = merged([one, two])
    assert list(both["allocated"]) == ["byte[] in A.a", "byte[] in B.b", OTHER_SITES]  # the rest last
    assert allocation_line(both) == "10.0 GiB allocated (JFR's estimate): byte[] in A.a 50%, byte[] in B.b 40%"
    table = render("the JVM draining", both)
    assert "| byte[] in A.a | 5.00 | 50% |" in table and "| **all** | **10.00** | |" in table
    assert allocation_line({"allocated": {}}) == "no allocation recorded"
