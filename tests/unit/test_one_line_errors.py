"""``errors.one_line`` names the cause of a query that failed for a data reason in Python code.

The fixtures are trimmed copies of messages PySpark 4.2 really produced (captured from a UDF that
raises, a foreachBatch function that raises, a foreachBatch function whose job hit a raising UDF,
and a foreachBatch function whose job could not load a truncated state-store file); the last test
produces one for real.
"""

# ruff: noqa: E501 - the fixtures keep Spark's long lines as it wrote them

from __future__ import annotations

import pytest

from tidewater.errors import CheckpointError, one_line

VENV = "/opt/tidewater/.venv/lib/python3.11/site-packages"

# A UDF raising in a Python worker, as a batch job's PythonException (str of the captured exception).
UDF_BATCH = """An exception was thrown from the Python worker:
Traceback (most recent call last):
  File "/opt/tidewater/include/tidewater/transforms.py", line 21, in boom
    raise ValueError(f"bad value {x!r}: cannot parse")
ValueError: bad value 1: cannot parse
"""

# The same UDF in a streaming query: the line used to end at "Traceback (most recent call last):".
UDF_STREAM = """[STREAM_FAILED] Query [id = 8fcd22f7-3e2e-4287-9b2b-bb88aa3cbedc, runId = 5ef83300-aa04-480d-a40c-0f37a8e2e267] \
terminated with exception: [PYTHON_EXCEPTION] An exception was thrown from the Python worker: Traceback (most recent call last):
  File "/opt/tidewater/include/tidewater/transforms.py", line 21, in boom
    raise ValueError(f"bad value {x!r}: cannot parse")
ValueError: bad value 1: cannot parse
 SQLSTATE: 38000 SQLSTATE: XXKST
=== Streaming Query ===
Identifier: [id = 8fcd22f7-3e2e-4287-9b2b-bb88aa3cbedc, runId = 5ef83300-aa04-480d-a40c-0f37a8e2e267]
Current Committed Offsets: {RateStreamV2[rowsPerSecond=5, rampUpTimeSeconds=0, numPartitions=default: 0}

Current State: ACTIVE
Thread State: RUNNABLE

Logical Plan:
WriteToMicroBatchDataSource noop-table
+- ~Project [boom(value#2013L)#2014 AS boom(value)#2015]
"""

# A foreachBatch function raising: Py4J's "Return Message" carries the driver-side traceback.
FOREACH_BATCH = f"""[STREAM_FAILED] Query [id = a3338cf6-e625-4a7d-8b7b-729a672a2467, runId = 3912c7e4-585e-4a17-9c21-8dfea94f5c63] \
terminated with exception: [FOREACH_BATCH_USER_FUNCTION_ERROR] An error occurred in the user provided function in foreach \
batch sink. Reason: An exception was raised by the Python Proxy. Return Message: Traceback (most recent call last):
  File "{VENV}/py4j/clientserver.py", line 644, in _call_proxy
    return_value = getattr(self.pool[obj_id], method)(*params)
                   ^^^^^^^^^^^^^^^^^^^^^^^^^^^^^^^^^^^^^^^^^^^
  File "{VENV}/pyspark/sql/utils.py", line 166, in call
    raise e
  File "{VENV}/pyspark/sql/utils.py", line 163, in call
    self.func(DataFrame(jdf, wrapped_session_jdf), batch_id)
  File "/opt/tidewater/include/tidewater/streaming/writers.py", line 52, in __call__
    raise ValueError(f"batch {{i}} has a bad row: venue_id missing")
ValueError: batch 0 has a bad row: venue_id missing
 SQLSTATE: 39000 SQLSTATE: XXKST
=== Streaming Query ===
Identifier: [id = a3338cf6-e625-4a7d-8b7b-729a672a2467, runId = 3912c7e4-585e-4a17-9c21-8dfea94f5c63]
Current Committed Offsets: {{}}
"""

# A foreachBatch function whose job ran a raising UDF: a worker traceback inside the driver's.
FOREACH_BATCH_UDF = f"""[STREAM_FAILED] Query [id = 833c09b5-1911-4055-bf29-724bd9ef25be, runId = 8db6e99b-8053-405c-aae2-afd233cc3edf] \
terminated with exception: [FOREACH_BATCH_USER_FUNCTION_ERROR] An error occurred in the user provided function in foreach \
batch sink. Reason: An exception was raised by the Python Proxy. Return Message: Traceback (most recent call last):
  File "{VENV}/py4j/clientserver.py", line 644, in _call_proxy
    return_value = getattr(self.pool[obj_id], method)(*params)
                   ^^^^^^^^^^^^^^^^^^^^^^^^^^^^^^^^^^^^^^^^^^^
  File "{VENV}/pyspark/sql/utils.py", line 163, in call
    self.func(DataFrame(jdf, wrapped_session_jdf), batch_id)
  File "/opt/tidewater/include/tidewater/streaming/writers.py", line 59, in __call__
    d.select(boom("n")).collect()
  File "{VENV}/pyspark/sql/classic/dataframe.py", line 503, in collect
    sock_info = self._jdf.collectToPython()
                ^^^^^^^^^^^^^^^^^^^^^^^^^^^
  File "{VENV}/pyspark/errors/exceptions/captured.py", line 257, in deco
    raise converted from None
  File "/opt/tidewater/include/tidewater/transforms.py", line 57, in boom
    raise KeyError(f"no such venue {{x}}")
      ^^^^^^^^^^^^^^^^^
pyspark.errors.exceptions.captured.PythonException: An exception was thrown from the Python worker:
Traceback (most recent call last):
  File "/opt/tidewater/include/tidewater/transforms.py", line 57, in boom
    raise KeyError(f"no such venue {{x}}")
KeyError: 'no such venue 861'
 SQLSTATE: 39000 SQLSTATE: XXKST
=== Streaming Query ===
Identifier: [id = 833c09b5-1911-4055-bf29-724bd9ef25be, runId = 8db6e99b-8053-405c-aae2-afd233cc3edf]
"""

# A foreachBatch function whose job failed in the JVM (a truncated state-store changelog).
FOREACH_BATCH_JAVA = f"""[STREAM_FAILED] Query [id = f3e98e6f-cb64-441b-8c05-a7becc1522b8, runId = e9e760fb-7934-47c4-837f-7505a12ec995] \
terminated with exception: [FOREACH_BATCH_USER_FUNCTION_ERROR] An error occurred in the user provided function in foreach \
batch sink. Reason: An exception was raised by the Python Proxy. Return Message: Traceback (most recent call last):
  File "{VENV}/py4j/clientserver.py", line 644, in _call_proxy
    return_value = getattr(self.pool[obj_id], method)(*params)
                   ^^^^^^^^^^^^^^^^^^^^^^^^^^^^^^^^^^^^^^^^^^^
  File "{VENV}/pyspark/sql/utils.py", line 163, in call
    self.func(DataFrame(jdf, wrapped_session_jdf), batch_id)
  File "/opt/tidewater/include/tidewater/streaming/writers.py", line 20, in __call__
    rows = batch.collect()
  File "{VENV}/pyspark/sql/classic/dataframe.py", line 503, in collect
    sock_info = self._jdf.collectToPython()
                ^^^^^^^^^^^^^^^^^^^^^^^^^^^
  File "{VENV}/py4j/protocol.py", line 327, in get_return_value
    raise Py4JJavaError(
py4j.protocol.Py4JJavaError: An error occurred while calling o173.collectToPython.
: org.apache.spark.SparkException: [CANNOT_LOAD_STATE_STORE.UNCATEGORIZED] An error occurred during loading state.  \
SQLSTATE: 58030
\tat org.apache.spark.sql.errors.QueryExecutionErrors$.cannotLoadStore(QueryExecutionErrors.scala:2846)
\tat org.apache.spark.sql.execution.streaming.state.RocksDBStateStoreProvider.loadStateStore(RocksDBStateStoreProvider.scala:970)
\tat java.base/java.lang.Thread.run(Thread.java:1583)
Caused by: java.io.EOFException: Stream ended prematurely
\tat net.jpountz.lz4.LZ4BlockInputStream.readFully(LZ4BlockInputStream.java:335)
\t... 3 more

 SQLSTATE: 39000 SQLSTATE: XXKST
=== Streaming Query ===
"""

# A TidewaterError raised in a foreachBatch writer still wins over the generic cause.
FOREACH_BATCH_TIDEWATER = f"""[STREAM_FAILED] Query [id = 1, runId = 2] terminated with exception: \
[FOREACH_BATCH_USER_FUNCTION_ERROR] An error occurred in the user provided function in foreach batch sink. Reason: An \
exception was raised by the Python Proxy. Return Message: Traceback (most recent call last):
  File "{VENV}/pyspark/sql/utils.py", line 163, in call
    self.func(DataFrame(jdf, wrapped_session_jdf), batch_id)
  File "/opt/tidewater/include/tidewater/lake/locks.py", line 90, in acquire
    raise LakePathError(f"table lock {{path}} held for 900 s by pid 12: stop it or raise the timeout")
tidewater.errors.LakePathError: table lock /lake/_locks/silver held for 900 s by pid 12: stop it or raise the timeout
"""


class StreamingQueryException(Exception):
    """Stands in for pyspark's captured exception class: one_line reads only the name and the text."""


class PythonException(Exception):
    pass


class Py4JJavaError(Exception):
    pass


@pytest.mark.parametrize(
    ("exc", "expected"),
    [
        (
            PythonException(UDF_BATCH),
            "PythonException: ValueError: bad value 1: cannot parse (at transforms.py:21 in boom)",
        ),
        (
            StreamingQueryException(UDF_STREAM),
            "StreamingQueryException: ValueError: bad value 1: cannot parse (at transforms.py:21 in boom)",
        ),
        (
            StreamingQueryException(FOREACH_BATCH),
            "StreamingQueryException: ValueError: batch 0 has a bad row: venue_id missing (at writers.py:52 in __call__)",
        ),
        (
            StreamingQueryException(FOREACH_BATCH_UDF),
            "StreamingQueryException: KeyError: 'no such venue 861' (at transforms.py:57 in boom)",
        ),
        (
            StreamingQueryException(FOREACH_BATCH_JAVA),
            "StreamingQueryException: SparkException: [CANNOT_LOAD_STATE_STORE.UNCATEGORIZED] An error occurred during "
            "loading state. (caused by EOFException: Stream ended prematurely) (at writers.py:20 in __call__)",
        ),
        (
            StreamingQueryException(FOREACH_BATCH_TIDEWATER),
            "LakePathError: table lock /lake/_locks/silver held for 900 s by pid 12: stop it or raise the timeout",
        ),
    ],
    ids=["udf-batch", "udf-stream", "foreach-batch", "foreach-batch-udf", "foreach-batch-java", "tidewater-error"],
)
def test_one_line_names_the_python_cause(exc: BaseException, expected: str) -> None:
    line = one_line(exc)
    assert line == expected
    assert "\n" not in line and "Traceback" not in line


def test_py4j_java_error_names_the_java_exception_and_its_root_cause() -> None:
    text = (
        "An error occurred while calling o42.start.\n"
        ": org.apache.spark.sql.AnalysisException: [PATH_NOT_FOUND] Path does not exist: file:/lake/x. SQLSTATE: 42K03\n"
        "\tat org.apache.spark.sql.errors.QueryCompilationErrors$.dataPathNotExistError(QueryCompilationErrors.scala:1)\n"
    )
    assert one_line(Py4JJavaError(text)) == (
        "Py4JJavaError: AnalysisException: [PATH_NOT_FOUND] Path does not exist: file:/lake/x."
    )


def test_plain_errors_keep_their_first_line() -> None:
    assert one_line(RuntimeError("first line\nsecond line")) == "RuntimeError: first line"
    assert one_line(ValueError("")) == "ValueError: ValueError"
    assert one_line(CheckpointError("checkpoint x is corrupt")) == "CheckpointError: checkpoint x is corrupt"
    # A traceback whose last line is not an exception line: fall back rather than guess.
    assert one_line(RuntimeError('boom: Traceback (most recent call last):\n  File "x.py", line 1, in f\n')) == (
        "RuntimeError: boom: Traceback (most recent call last):"
    )


def test_a_real_python_worker_failure_names_its_cause(spark) -> None:
    from pyspark.sql.functions import udf

    @udf("int")
    def parse_venue(value):  # no type hints: pyspark would read them as a pandas UDF's
        raise ValueError(f"venue {value} has no id")

    with pytest.raises(Exception) as caught:  # pyspark's captured PythonException
        spark.range(1).select(parse_venue("id")).collect()
    line = one_line(caught.value)
    assert line.startswith("PythonException: ValueError: venue 0 has no id (at test_one_line_errors.py:"), line
    assert line.endswith("in parse_venue)"), line
