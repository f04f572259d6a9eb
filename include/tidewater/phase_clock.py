"""Where a micro-batch's time goes: wall time per phase of a writer, per batch.

Spark's progress says how long each part of a trigger took (``durationMs``: ``latestOffset``,
``walCommit``, ``addBatch``, ``commitOffsets``), but ``addBatch`` is one figure, and inside it runs
all of tidewater's work for the batch (the foreachBatch writer: Kafka read and bronze Parquet, the
bronze commit, parse and validation, quarantine, the silver key lookup, de-duplication, the silver
commit, gold state and MERGE, lock waits). The writer that runs a batch opens :func:`batch`; code
below it, at any layer, marks its parts with :func:`phase`; the progress listener then takes the
batch's phases (:func:`take`) and writes them beside Spark's figures in ``progress.jsonl``, where
``./tw bench --profile`` reads them.

Phases nest, and a nested phase is named by its path: ``phase("bronze")`` around ``writes.append``,
which times ``phase("write files")`` and ``phase("commit")``, gives ``bronze``, ``bronze/write files``
and ``bronze/commit``. So a lake helper names its own steps and the writer says which table it is.
An outer phase's time includes its inner ones'; a phase run twice in a batch adds up.

A foreachBatch call runs on one driver thread from start to end, so the batch being timed is kept
per thread; a step the writer hands to a thread of its own takes the batch along with :func:`carry`.
Outside a batch (a batch job, a test) :func:`phase` only costs two clock reads.
"""

from __future__ import annotations

import threading
import time
from collections import OrderedDict
from collections.abc import Callable, Iterator, Mapping
from contextlib import AbstractContextManager, contextmanager

# Batches whose phases no listener took (a query without one, a listener that fell behind): only the
# newest are kept.
KEPT_BATCHES = 256

_current = threading.local()
_finished: OrderedDict[tuple[str, int], dict[str, float]] = OrderedDict()
_finished_lock = threading.Lock()


@contextmanager
def batch(query: str, batch_id: int) -> Iterator[None]:
    """Time the phases of ``query``'s micro-batch ``batch_id`` run on this thread (``total`` is the
    whole block). A batch opened inside another (a writer that calls another writer) joins it."""
    if getattr(_current, "phases", None) is not None:
        yield
        return
    phases: dict[str, float] = {}
    _current.phases = phases
    _current.path = []
    started = time.perf_counter()
    try:
        yield
    finally:
        phases["total"] = round((time.perf_counter() - started) * 1000, 1)
        _current.phases = None
        with _finished_lock:
            _finished[(query, batch_id)] = phases
            while len(_finished) > KEPT_BATCHES:
                _finished.popitem(last=False)


@contextmanager
def phase(name: str) -> Iterator[None]:
    """Add the block's wall time (ms) to phase ``name`` (under the phases open around it) of the batch
    open on this thread, if any."""
    phases = getattr(_current, "phases", None)
    if phases is None:
        yield
        return
    path: list[str] = _current.path
    path.append(name)
    full = "/".join(path)
    phases.setdefault(full, 0.0)  # in the order phases start: a parent before its children
    started = time.perf_counter()
    try:
        yield
    finally:
        path.pop()
        phases[full] = round(phases.get(full, 0.0) + (time.perf_counter() - started) * 1000, 1)


def carry() -> Callable[[], AbstractContextManager[None]]:
    """The batch open on this thread, and the phases open in it, for another thread to time its part
    in: that thread runs it inside the returned context (no batch open here: it times nothing). The
    writer that hands work to a thread must wait for it before its batch ends."""
    phases = getattr(_current, "phases", None)
    path = list(getattr(_current, "path", None) or [])

    @contextmanager
    def on_this_thread() -> Iterator[None]:
        if phases is None or getattr(_current, "phases", None) is not None:
            yield
            return
        _current.phases, _current.path = phases, list(path)
        try:
            yield
        finally:
            _current.phases, _current.path = None, []

    return on_this_thread


def described(phases: Mapping[str, float]) -> str:
    """``silver 34.5 s, silver/sort 1.7 s, ...``: a job's phases (ms) as its log line gives them."""
    return ", ".join(f"{name} {ms / 1000:.1f} s" for name, ms in phases.items())


def take(query: str, batch_id: int) -> dict[str, float] | None:
    """The phases (ms) of a finished batch, once: None if it was not timed (or is long gone)."""
    with _finished_lock:
        return _finished.pop((query, batch_id), None)
