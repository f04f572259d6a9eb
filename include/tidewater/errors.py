"""Errors a user can act on, and how they survive the trip through Spark.

Every error tidewater raises for bad input is a ``TidewaterError`` whose message is one line that
says what is wrong and what to do. Errors raised inside Spark Python data sources reach the
driver wrapped in Java exceptions with long stack traces; :func:`one_line` digs the original
message back out so the command line never shows a bare Java trace as its only output.
"""

from __future__ import annotations

import re


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


def one_line(exc: BaseException) -> str:
    """Return the most useful single line describing ``exc``.

    Prefers a TidewaterError found anywhere in the exception chain or embedded in a Spark/Java
    error message; falls back to the first line of the outermost message.
    """
    seen: set[int] = set()
    current: BaseException | None = exc
    while current is not None and id(current) not in seen:
        seen.add(id(current))
        if isinstance(current, TidewaterError):
            return f"{type(current).__name__}: {current}"
        matches = list(_EMBEDDED.finditer(str(current)))
        if matches:  # the last occurrence is the innermost one
            return f"{matches[-1].group(1)}: {matches[-1].group(2).strip()}"
        current = current.__cause__ or current.__context__
    text = str(exc).strip().splitlines()
    first = text[0] if text else type(exc).__name__
    return f"{type(exc).__name__}: {first}"
