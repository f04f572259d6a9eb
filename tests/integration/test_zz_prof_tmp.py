import time, datetime as dt
from pathlib import Path
from test_delta_spark import *  # noqa

def test_prof(spark, tmp_path: Path):
    t = time.monotonic()
    def lap(msg):
        nonlocal t
        now = time.monotonic(); print(f"{now-t:6.2f} {msg}"); t = now
    table = new_table(unique(tmp_path, "read")); lap("ensure")
    content(read_table(spark, table.uri)); lap("empty read")
    writes.append(frame(spark, [1, 2], DAY1), table); lap("append1")
    writes.append(frame(spark, [3], DAY2), table); lap("append2")
    writes.append(frame(spark, [3], DAY2), table); lap("append3")
    content(read_table(spark, table.uri)); lap("read")
    content(read_table(spark, table.uri)); lap("read2")
    content(read_table(spark, table.uri, version=1)); lap("read v1")
    df = read_table(spark, table.uri, partition_filter={"day": ["2026-11-21"]}); lap("df")
    df.inputFiles(); lap("inputFiles")
    source_stream(spark, table.uri, tmp_path / "cp"); lap("stream1")
    source_stream(spark, table.uri, tmp_path / "cp"); lap("stream2")
    source_stream(spark, table.uri, tmp_path / "cp2"); lap("stream3")
