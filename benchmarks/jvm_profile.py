"""Where a Spark JVM's CPU goes, by kind of work: JDK Flight Recorder samples, grouped.

The writers' phases (``tidewater.phase_clock``) time a micro-batch from Python, so a Spark job is
one opaque figure there (``read and parse``, ``rows to driver``). This opens it: the bench starts
the streaming job's JVM with a flight recording (:func:`recording_options`, JFR's ``default``
settings: an execution sample per running thread every 20 ms), the JVM writes it as the bench stops
the job, and :func:`summarize` reads back, with the JDK's ``jfr`` tool, what fell in the stretch the
drain rate is measured over. Started from the command line it costs little; started in a running JVM
(``jcmd JFR.start``) it took rsvps' drain from ~33k to ~22k events/s over the next half minute (the
JIT's code made again, it seems), so the bench does not do that.

Spark pulls rows through a chain of iterators, so every frame of an operator's stack includes the
work of the operators below it. A sample is therefore put under the *innermost* frame that names a
kind of work (:data:`KINDS`, searched from the top of the stack down): a sample inside Jackson's
parser is JSON parsing even though a sort-based aggregate pulled the row that holds it. The search
stops at the generated code of a whole-stage-codegen stage (its ``processNext``): what no frame above
it names is that stage's own work (projections, filters, the windows' expansion). Samples of
threads that run no Spark task (the stream's planning thread, py4j's threads, RPC) are counted
apart as driver threads. Garbage collection is not sampled (its threads run no Java code): the
recording's collections and their pauses are counted beside the samples. A serial collector stops
every thread while it runs, so its pauses are time no task ran.

What fills the heap, and so sets how often it is collected, is read from the same recording: JFR's
allocation samples (``jdk.ObjectAllocationSample``, throttled to ~150 a second, each weighted with the
bytes its thread allocated since the one before) are added up by the class allocated and the
innermost frame of its stack outside the JDK's, Scala's and Netty's own code (:func:`site_of`): the
code that asked for the memory. The twenty-sixth stop found that way that Spark's ``from_json``
allocates an 8 KiB reader buffer for every record it parses (nearly a third of what ads' drain allocated).
"""

from __future__ import annotations

import re
import shutil
import subprocess
import time
from collections import Counter
from collections.abc import Iterable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

# (kind of work, substrings of a frame's class and method that belong to it), the first to match a
# frame wins; frames are matched from the top of the stack (the running method) down.
KINDS: tuple[tuple[str, tuple[str, ...]], ...] = (
    ("JSON parse (from_json)", ("com.fasterxml.jackson.", ".JacksonParser", ".JsonToStructs", "FailureSafeParser")),
    ("sort (for sort-based aggregates)", ("UnsafeExternalRowSorter", "unsafe.sort.", ".TimSort", "Sorter.sort")),
    ("sort-based aggregate", ("SortAggregateExec", "SortBasedAggregationIterator")),
    ("object-hash aggregate", ("ObjectHashAggregateExec", "ObjectAggregationIterator", "ObjectAggregationMap")),
    ("hash aggregate", ("HashAggregateExec", "UnsafeFixedWidthAggregationMap", "BytesToBytesMap", ".agg_doAggregate")),
    ("state store", (".state.", "org.rocksdb.", "StateStoreSaveExec", "StateStoreRestoreExec")),
    ("shuffle", (".shuffle.", "ShuffleBlockFetcherIterator", "UnsafeRowSerializer", "ShuffleWriteProcessor")),
    (
        "rows to Arrow (results to Python)",
        ("arrow.ArrowWriter", "arrow.ArrowFieldWriter", "arrow.StringWriter", "ArrowConverters", "vector.ipc."),
    ),
    (
        "Arrow to rows (Python sources and UDFs)",
        ("ArrowColumnVector", "PythonArrowOutput", "BasePythonRunner", "PythonDataSource", "ColumnarBatchRow"),
    ),
)
STAGE_CODE = "generated code (projections, filters, windows)"
STAGE_FRAME = ("GeneratedIteratorForCodegenStage", ".processNext")
DRIVER_THREADS = "driver threads (planning, scheduling, py4j)"
OTHER = "other task work"
TASK_THREAD = "Executor task launch worker"


# Frames of code that allocates on someone else's behalf: an allocation's site is the first frame below them.
LIBRARY_FRAMES = ("java.", "javax.", "jdk.", "sun.", "scala.", "io.netty.", "com.google.")
ALLOCATION_SITES_KEPT = 12  # per recording; the rest are added up as OTHER_SITES
OTHER_SITES = "other sites"


@dataclass
class Sample:
    thread: str
    frames: list[str] = field(default_factory=list)  # "package.Class.method", the running one first
    at: str = ""  # the JVM's local time of day, "HH:MM:SS.mmm" (jfr print's startTime)
    allocated: str = ""  # an allocation sample's class ("byte[]")
    weight: float = 0.0  # an allocation sample's bytes


def kind_of(sample: Sample) -> str:
    """The kind of work of one execution sample (see the module's docstring)."""
    if not sample.thread.startswith(TASK_THREAD):
        return DRIVER_THREADS
    for frame in sample.frames:
        for kind, marks in KINDS:
            if any(mark in frame for mark in marks):
                return kind
        if STAGE_FRAME[0] in frame and frame.endswith(STAGE_FRAME[1]):
            return STAGE_CODE
    return OTHER


def site_of(sample: Sample) -> str:
    """Where an allocation sample's memory was asked for: its class and the innermost frame outside the
    libraries that allocate for their callers (``byte[] in CreateJacksonParser$.utf8String``), the
    frame's package and a codegen stage's number left out."""
    frames = [f for f in sample.frames if not f.startswith(LIBRARY_FRAMES) and "$$Lambda" not in f]
    frame = frames[0] if frames else (sample.frames[0] if sample.frames else "?")
    method_of_class = frame.rsplit(".", 2)[-2:]
    where = re.sub(r"CodegenStage\d+", "CodegenStage", ".".join(method_of_class))
    return f"{sample.allocated or '?'} in {where}"


SIZES = {"bytes": 1.0, "byte": 1.0, "kB": 1024.0, "MB": 1024.0**2, "GB": 1024.0**3, "TB": 1024.0**4}
DURATIONS_MS = {"s": 1000.0, "ms": 1.0, "us": 0.001, "ns": 0.000001}


def _quantity(text: str, units: dict[str, float]) -> float | None:
    """``jfr print``'s ``<number> <unit>`` (``12.3 ms``, ``42.8 MB``; sizes in powers of 1024) in the
    unit ``units`` scales to; None when the number or the unit is not one it knows."""
    value, _, unit = text.strip().partition(" ")
    scale = units.get(unit.strip())
    try:
        return float(value.replace(",", "")) * scale if scale is not None else None
    except ValueError:
        return None


def parse_samples(lines: Iterable[str]) -> Iterator[Sample]:
    """``jfr print --events jdk.ExecutionSample`` (or ``jdk.ObjectAllocationSample``) output, one
    :class:`Sample` per event."""
    sample: Sample | None = None
    in_stack = False
    for raw in lines:
        line = raw.strip()
        if line.startswith(("jdk.ExecutionSample", "jdk.ObjectAllocationSample")):
            sample, in_stack = Sample(thread=""), False
        elif sample is None:
            continue
        elif line.startswith("startTime = "):
            sample.at = line.removeprefix("startTime = ").split(" ")[0]
        elif line.startswith(("sampledThread = ", "eventThread = ")):
            name = line.split(" = ", 1)[1]
            sample.thread = line.split('"')[1] if line.count('"') >= 2 else name
        elif line.startswith("objectClass = "):
            sample.allocated = line.removeprefix("objectClass = ").split(" (", 1)[0]
        elif line.startswith("weight = "):
            sample.weight = _quantity(line.removeprefix("weight = "), SIZES) or 0.0
        elif line.startswith("stackTrace = ["):
            in_stack = True
        elif in_stack and line == "]":
            in_stack = False
        elif in_stack and line != "...":
            sample.frames.append(line.split("(", 1)[0])
        elif line == "}":
            yield sample
            sample = None


def collections(lines: Iterable[str], within: Window | None = None) -> dict[str, list[float]]:
    """``jfr print --events jdk.GarbageCollection`` output: collector -> [collections, ms paused]."""
    found: dict[str, list[float]] = {}
    name, at = "", ""
    for raw in lines:
        line = raw.strip()
        if line.startswith("jdk.GarbageCollection"):
            name, at = "", ""
        elif line.startswith("startTime = "):
            at = line.removeprefix("startTime = ").split(" ")[0]
        elif line.startswith("name = "):
            name = line.removeprefix("name = ").strip('"')
        elif line.startswith("sumOfPauses = ") and name and (within is None or within.holds(at)):
            entry = found.setdefault(name, [0, 0.0])
            entry[0] += 1
            entry[1] = round(entry[1] + (_quantity(line.removeprefix("sumOfPauses = "), DURATIONS_MS) or 0.0), 1)
    return found


@dataclass(frozen=True)
class Window:
    """A stretch of wall time (epoch seconds), matched against JFR's local times of day."""

    start: float
    end: float

    @staticmethod
    def _clock(epoch: float) -> str:
        return time.strftime("%H:%M:%S", time.localtime(epoch)) + f".{int(epoch % 1 * 1000):03d}"

    def holds(self, at: str) -> bool:
        if not at:
            return False
        start, end = self._clock(self.start), self._clock(self.end)
        return start <= at <= end if start <= end else at >= start or at <= end  # across midnight

    @property
    def seconds(self) -> float:
        return self.end - self.start


class FlightRecordingError(RuntimeError):
    """A recording could not be set up or read (the bench goes on without it)."""


def _jdk_tool(name: str) -> str:
    found = shutil.which(name)
    if not found:
        raise FlightRecordingError(f"the JDK's {name} is not on PATH: no JVM profile")
    return found


def recording_options(path: Path) -> str:
    """JVM options that record the JVM from its start and write the recording to ``path`` at its exit
    (a job stopped with SIGTERM exits through its shutdown hooks, which write it)."""
    if "," in str(path) or " " in str(path):
        raise FlightRecordingError(f"a flight recording's path cannot hold a comma or a space: {path}")
    return f"-XX:StartFlightRecording=filename={path},settings=default,dumponexit=true"


def _jfr_print(path: Path, events: str, *, depth: int = 64) -> Iterator[str]:
    process = subprocess.Popen(
        [_jdk_tool("jfr"), "print", "--events", events, "--stack-depth", str(depth), str(path)],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    assert process.stdout is not None
    try:
        yield from process.stdout
    finally:
        process.stdout.close()
        _, error = process.communicate(timeout=120)
        if process.returncode != 0:
            raise FlightRecordingError(f"jfr print {path.name} failed: {error.strip()[:200]}")


def summarize(path: Path, within: Window) -> dict[str, Any]:
    """The recording's execution samples ``within`` the window by kind of work, and its collections."""
    if not path.is_file():
        raise FlightRecordingError(f"no flight recording at {path}: the JVM did not write one as it exited")
    samples = (s for s in parse_samples(_jfr_print(path, "jdk.ExecutionSample")) if within.holds(s.at))
    kinds = Counter(kind_of(sample) for sample in samples)
    printed = _jfr_print(path, "jdk.ObjectAllocationSample", depth=24)  # an allocation's site is near the top
    allocations = (sample for sample in parse_samples(printed) if within.holds(sample.at))
    return {
        "samples": dict(kinds.most_common()),
        "collections": collections(_jfr_print(path, "jdk.GarbageCollection"), within),
        "allocated": allocation_sites(allocations),
        "seconds": round(within.seconds, 1),
    }


def allocation_sites(samples: Iterable[Sample], *, kept: int = ALLOCATION_SITES_KEPT) -> dict[str, float]:
    """Bytes allocated by :func:`site_of`, the largest first: the ``kept`` largest, the rest as one."""
    sites: Counter[str] = Counter()
    for sample in samples:
        sites[site_of(sample)] += sample.weight
    top = dict(sites.most_common(kept))
    rest = sum(sites.values()) - sum(top.values())
    return top | ({OTHER_SITES: rest} if rest > 0 else {})


def merged(profiles: Iterable[dict[str, Any]]) -> dict[str, Any]:
    """Several runs' summaries as one: samples, collections, pauses and seconds added up."""
    samples: Counter[str] = Counter()
    allocated: Counter[str] = Counter()
    gcs: dict[str, list[float]] = {}
    seconds = 0.0
    for profile in profiles:
        samples.update(profile.get("samples") or {})
        allocated.update(profile.get("allocated") or {})
        for name, (count, paused) in (profile.get("collections") or {}).items():
            entry = gcs.setdefault(name, [0, 0.0])
            entry[0] += count
            entry[1] = round(entry[1] + paused, 1)
        seconds += float(profile.get("seconds") or 0.0)
    return {
        "samples": dict(samples.most_common()),
        "collections": gcs,
        "allocated": _largest_first(allocated),
        "seconds": round(seconds, 1),
    }


def _largest_first(sites: Counter[str]) -> dict[str, float]:
    """Sites by bytes, the largest first and the other sites last whatever their sum."""
    ordered = {site: size for site, size in sites.most_common() if site != OTHER_SITES}
    return ordered | ({OTHER_SITES: sites[OTHER_SITES]} if sites.get(OTHER_SITES) else {})


def allocation_line(profile: dict[str, Any], *, sites: int = 4) -> str:
    """``27.1 GiB allocated (JFR's estimate): byte[] in CreateJacksonParser$.utf8String 30%, ...``"""
    allocated: dict[str, float] = profile.get("allocated") or {}
    total = sum(allocated.values())
    if not total:
        return "no allocation recorded"
    largest = [(site, size) for site, size in allocated.items() if site != OTHER_SITES][:sites]
    return f"{total / 1024**3:,.1f} GiB allocated (JFR's estimate): " + ", ".join(
        f"{site} {size / total:.0%}" for site, size in largest
    )


def gc_line(profile: dict[str, Any]) -> str:
    """``DefNew 693 collections, 2,352 ms; SerialOld 34 collections, 5,015 ms: the JVM paused 35% of 21 s``."""
    gcs = profile.get("collections") or {}
    if not gcs:
        return "no collection recorded"
    parts = [f"{name} {int(count):,} collections, {paused:,.0f} ms" for name, (count, paused) in gcs.items()]
    seconds = float(profile.get("seconds") or 0.0)
    paused = sum(entry[1] for entry in gcs.values())
    share = f": the JVM paused {paused / 1000 / seconds:.0%} of {seconds:.0f} s" if seconds else ""
    return "; ".join(parts) + share


def render(title: str, profile: dict[str, Any]) -> list[str]:
    """A markdown table of the kinds of work, the busiest first, and the collections below it."""
    samples: dict[str, int] = profile.get("samples") or {}
    total = sum(samples.values())
    if not total:
        return []
    lines = [f"### {title}", "", "| kind of work | samples | share |", "|---|---:|---:|"]
    lines += [f"| {kind} | {count:,} | {count / total:.0%} |" for kind, count in samples.items()]
    lines.append(f"| **all** | **{total:,}** | |")
    lines += ["", f"Garbage collection (not in the samples: its threads run no Java code): {gc_line(profile)}.", ""]
    allocated: dict[str, float] = profile.get("allocated") or {}
    if everything := sum(allocated.values()):
        lines += ["What the JVM allocated, by class and the code that asked for it (JFR's allocation samples):", ""]
        lines += ["| allocated | GiB | share |", "|---|---:|---:|"]
        lines += [f"| {site} | {size / 1024**3:,.2f} | {size / everything:.0%} |" for site, size in allocated.items()]
        lines += [f"| **all** | **{everything / 1024**3:,.2f}** | |", ""]
    return lines
