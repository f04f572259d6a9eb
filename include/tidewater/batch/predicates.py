"""One selection, three spellings: the Spark filter that picks rows to recompute, the delta-rs
predicate that replaces exactly those rows, and the Arrow filter that reads what a table holds there.

A recompute reads ``rows matching P`` and atomically replaces ``rows matching P`` in the target, so
the spellings must select the same rows; keeping them side by side (and pure) is how they stay
in step. Entity values arrive as command-line strings and are converted to the column's type here.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import pyarrow as pa
import pyarrow.compute as pc
from pyspark.sql import Column
from pyspark.sql import functions as F

from tidewater.batch.interval import Interval
from tidewater.errors import ConfigError
from tidewater.lake.sql import sql_literal, sql_timestamp


def coerce_entities(values: Sequence[str], column: str, kind: pa.DataType) -> tuple[Any, ...]:
    """Command-line entity values -> values of the column's Arrow type (one-line error if they do not fit)."""
    out: list[Any] = []
    for value in values:
        try:
            if pa.types.is_integer(kind):
                out.append(int(value))
            elif pa.types.is_floating(kind):
                out.append(float(value))
            elif pa.types.is_string(kind) or pa.types.is_large_string(kind):
                out.append(str(value))
            else:
                raise ConfigError(f"entity column {column} has type {kind}, which --entity cannot filter on")
        except ValueError:
            raise ConfigError(f"--entity {value!r} is not a valid {kind} value of {column}") from None
    return tuple(dict.fromkeys(out))  # unique, in the order given


@dataclass(frozen=True)
class Selection:
    """Rows whose ``time_column`` lies in ``interval`` and, if ``entities`` is set, whose ``entity_column``
    is one of them."""

    time_column: str
    interval: Interval
    entity_column: str | None = None
    entities: tuple[Any, ...] = ()

    def column(self) -> Column:
        """The Spark filter."""
        c = F.col(self.time_column)
        return (c >= F.lit(self.interval.start)) & (c < F.lit(self.interval.end)) & self.entity_filter()

    def entity_filter(self) -> Column:
        """The Spark filter on the entities alone (true when the selection names none)."""
        if self.entities and self.entity_column:
            return F.col(self.entity_column).isin(list(self.entities))
        return F.lit(True)

    def arrow(self) -> pc.Expression:
        """The Arrow dataset filter (reads with delta-rs, no Spark)."""
        time = pc.field(self.time_column)
        expression = (time >= pa.scalar(self.interval.start, pa.timestamp("us", "UTC"))) & (
            time < pa.scalar(self.interval.end, pa.timestamp("us", "UTC"))
        )
        if self.entities and self.entity_column:
            expression &= pc.field(self.entity_column).isin(list(self.entities))
        return expression

    def sql(self, alias: str | None = None) -> str:
        """The delta-rs predicate (optionally on a MERGE alias such as ``t``)."""
        prefix = f"{alias}." if alias else ""
        time = f"{prefix}`{self.time_column}`"
        text = f"{time} >= {sql_timestamp(self.interval.start)} AND {time} < {sql_timestamp(self.interval.end)}"
        if self.entities and self.entity_column:
            listed = ", ".join(sql_literal(v) for v in self.entities)
            text += f" AND {prefix}`{self.entity_column}` IN ({listed})"
        return text
