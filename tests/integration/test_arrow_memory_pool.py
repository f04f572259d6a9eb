"""A session's Python workers allocate Arrow's buffers with the allocator tidewater gives Spark's
processes (:data:`tidewater.processes.ARROW_MEMORY_POOL`), as a streaming job's do."""

from __future__ import annotations

from collections.abc import Iterator

import pyarrow as pa

from tidewater.processes import ARROW_MEMORY_POOL


def test_the_workers_of_a_session_allocate_with_the_c_library_s_allocator(spark) -> None:
    def backend(batches: Iterator[pa.RecordBatch]) -> Iterator[pa.RecordBatch]:  # pickled by value, for the worker
        import pyarrow as pa

        for batch in batches:
            yield pa.RecordBatch.from_pydict({"backend": [pa.default_memory_pool().backend_name] * batch.num_rows})

    rows = spark.range(0, 8, 1, 2).mapInArrow(backend, "backend string").toArrow()
    assert rows.num_rows == 8
    assert set(rows.column("backend").to_pylist()) == {ARROW_MEMORY_POOL}
