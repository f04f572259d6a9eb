"""Errors a user can act on, and how they survive the trip through Spark.

Every error tidewater raises for bad input is a ``TidewaterError`` whose message is one line that
says what is wrong and what to do. Errors raised inside Spark Python data sources, UDFs and
foreachBatch functions reach the driver wrapped in Java exceptions with long stack traces (and
Python tracebacks inside them); :func:`one_line` digs the original message back out so the command
line never shows a bare Java trace, or a line ending in "Traceback (most recent call last):", as
its only output.
"""

from __future__ import annotations

import argparse
import re
from typing import NoReturn


class TidewaterError(Exception):
    """Base class: the message is a single actionable line."""


class ConfigError(TidewaterError):
    """A setting is missing or malformed."""


class BrokerUnreachableError(TidewaterError):
    """No Kafka broker answered at the configured bootstrap servers."""


class TopicNotFoundError(TidewaterError):
    """The topic a query reads does not exist."""


class DataLossError(TidewaterError):
    """Offsets a query needs are gone (retention) or the source went backwards."""


class LakePathError(TidewaterError):
    """The lake root or a table path cannot be read or written."""


class CheckpointError(TidewaterError):
    """A streaming checkpoint is corrupt, foreign, or already in use."""


class DeltaSourceError(TidewaterError):
    """A Delta table read as a stream changed in a way a stream cannot follow."""


class PipelineError(TidewaterError):
    """A pipeline declaration or name is wrong."""


_ERROR_NAMES = "|".join(
    cls.__name__
    for cls in (
        TidewaterError,
        ConfigError,
        BrokerUnreachableError,
        TopicNotFoundError,
        DataLossError,
        LakePathError,
        CheckpointError,
        DeltaSourceError,
        PipelineError,
    )
)
# A TidewaterError inside a Python traceback embedded in a Java exception message.
_EMBEDDED = re.compile(rf"(?:tidewater\.errors\.)?({_ERROR_NAMES}): ([^\n]+)")
_TRACEBACK = "Traceback (most recent call last):"
_FRAME = re.compile(r'^\s*File "([^"]+)", line (\d+), in (\S+)')
# The last line of a traceback: ``ValueError: message``, ``pkg.mod.SomeError: message`` or a bare name.
_RAISED = re.compile(r"^([A-Za-z_][\w.]*)(?:: ?(.*))?$")
# A Java exception line in a Py4J message: ``: org.apache.spark.SparkException: ...`` / ``Caused by: ...``.
_JAVA = re.compile(r"^(?:: |Caused by: )([a-z][\w$]*(?:\.[\w$]+)+)(?:: (.*))?$")
_SQLSTATE = re.compile(r"\s*SQLSTATE: \w+")
_LIBRARY_FRAME = re.compile(r"[/\\](?:pyspark|py4j)[/\\]")


def one_line(exc: BaseException) -> str:
    """Return the most useful single line describing ``exc``.

    Prefers a TidewaterError found anywhere in the exception chain or embedded in a Spark/Java
    error message; then the cause of a Python traceback embedded in it (a UDF or data source in a
    Python worker, a foreachBatch function: ``ValueError: message (at file.py:12 in func)``); then
    the Java exception of a Py4J error with its root cause; falls back to the first line of the
    outermost message.
    """
    seen: set[int] = set()
    current: BaseException | None = exc
    while current is not None and id(current) not in seen:
        seen.add(id(current))
        if isinstance(current, TidewaterError):
            return f"{type(current).__name__}: {current}"
        text = str(current)
        matches = list(_EMBEDDED.finditer(text))
        if matches:  # the last occurrence is the innermost one
            return f"{matches[-1].group(1)}: {matches[-1].group(2).strip()}"
        cause = _python_cause(text) or _java_cause(text.splitlines())
        if cause:
            return f"{type(current).__name__}: {cause}"
        current = current.__cause__ or current.__context__
    text = str(exc).strip().splitlines()
    first = text[0] if text else type(exc).__name__
    return f"{type(exc).__name__}: {first}"


def _python_cause(text: str) -> str | None:
    """``SomeError: message (at file.py:12 in func)`` from the innermost Python traceback in ``text``
    (a Python worker's or a foreachBatch function's, as Spark and Py4J embed them), or None."""
    start = text.rfind(_TRACEBACK)
    if start < 0:
        return None
    lines = text[start + len(_TRACEBACK) :].splitlines()
    where = ""
    for i, line in enumerate(lines):
        frame = _FRAME.match(line)
        if frame:  # the innermost frame of our code, not of pyspark's or py4j's plumbing
            if not where or not _LIBRARY_FRAME.search(frame.group(1)):
                where = f" (at {frame.group(1).rsplit('/', 1)[-1]}:{frame.group(2)} in {frame.group(3)})"
            continue
        if not line.strip() or line[0].isspace():
            continue  # a frame's source line, a caret line, or a blank line
        raised = _RAISED.match(line.rstrip())
        if raised is None:
            return None
        name = raised.group(1).rsplit(".", 1)[-1]
        if name == "Py4JJavaError":  # the Python side called into the JVM, which failed
            java = _java_cause(lines[i + 1 :])
            return f"{java}{where}" if java else None
        message = _SQLSTATE.sub("", raised.group(2) or "").strip()
        return f"{name}: {message}{where}" if message else f"{name}{where}"
    return None


def _java_cause(lines: list[str]) -> str | None:
    """The Java exception of a Py4J error message, with its root cause: ``SparkException: ... (caused by
    EOFException: Stream ended prematurely)``, or None."""
    found = [m for m in (_JAVA.match(line.rstrip()) for line in lines) if m]
    if not found or not found[0].group(0).startswith(": "):
        return None

    def describe(match: re.Match[str]) -> str:
        message = _SQLSTATE.sub("", match.group(2) or "").strip()
        name = match.group(1).rsplit(".", 1)[-1]
        return f"{name}: {message}" if message else name

    first, root = describe(found[0]), describe(found[-1])
    return first if root == first else f"{first} (caused by {root})"


class OneLineParser(argparse.ArgumentParser):
    """Usage errors in the one-line form of every other tidewater error (exit status 2)."""

    def error(self, message: str) -> NoReturn:
        self.exit(2, f"tidewater: ConfigError: {self.prog}: {message} (see --help)\n")
