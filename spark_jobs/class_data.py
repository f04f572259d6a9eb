"""spark-submit entry point: the workload whose loaded classes become the class-data archive.

    python -m tidewater.class_data      (runs this with -XX:ArchiveClassesAtExit; see that module)

What a tidewater driver does, small: a session as every job builds it, a Delta table read through the
platform's data source, SQL with an Arrow UDF, rows to Arrow, Parquet, and streaming queries with the
state the pipelines keep (a windowed aggregation and a stream-stream join in RocksDB, foreachBatch).
"""

import sys
import tempfile

from tidewater.streaming.class_data_workload import run

if __name__ == "__main__":
    with tempfile.TemporaryDirectory(prefix="tidewater-class-data-") as folder:
        run(folder)
    sys.exit(0)
