"""The data contract a pipeline declares once, enforced twice.

Each constraint yields a quarantine :class:`~tidewater.transforms.Rule` (the stream and every batch
job keep violating records out of silver, with a reason) and Great Expectations expectations (the
audits prove, per interval, that silver holds the contract and measure how often arriving records
broke it; see :mod:`tidewater.quality.suites`). One declaration, so the two can never disagree.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from tidewater.times import parse_duration
from tidewater.transforms import Rule

Expectation = dict[str, Any]  # {"type": "expect_...", "kwargs": {...}, "meta": {...}}


def expectation(kind: str, *, meta: dict[str, Any] | None = None, **kwargs: Any) -> Expectation:
    """One expectation in Great Expectations' JSON form (``None`` options left out)."""
    return {"type": kind, "kwargs": {k: v for k, v in kwargs.items() if v is not None}, "meta": meta or {}}


@dataclass(frozen=True)
class Required:
    """Columns that must be present (not null; strings also non-empty when ``non_empty``)."""

    columns: tuple[str, ...]
    reason: str = ""
    non_empty: bool = False

    def rule(self) -> Rule:
        checks = [f"{c} IS NOT NULL" + (f" AND length({c}) > 0" if self.non_empty else "") for c in self.columns]
        return Rule(self.reason or f"{' or '.join(self.columns)} missing", " AND ".join(checks))

    def expectations(self) -> list[Expectation]:
        out = [expectation("expect_column_values_to_not_be_null", column=c) for c in self.columns]
        if self.non_empty:
            out += [
                expectation("expect_column_value_lengths_to_be_between", column=c, min_value=1) for c in self.columns
            ]
        return out


@dataclass(frozen=True)
class OneOf:
    """An enumeration, e.g. an RSVP's response."""

    column: str
    values: tuple[str, ...]

    def rule(self) -> Rule:
        return Rule(f"{self.column} not one of {'/'.join(self.values)}", f"{self.column} IN {tuple(self.values)!r}")

    def expectations(self) -> list[Expectation]:
        return [expectation("expect_column_values_to_be_in_set", column=self.column, value_set=list(self.values))]


@dataclass(frozen=True)
class Between:
    """A closed numeric range (latitude, longitude, an amount)."""

    column: str
    low: float | None
    high: float | None
    label: str = ""

    def rule(self) -> Rule:
        parts = [f"{self.column} >= {self.low}"] if self.low is not None else []
        parts += [f"{self.column} <= {self.high}"] if self.high is not None else []
        low = "-inf" if self.low is None else f"{self.low:g}"
        high = "inf" if self.high is None else f"{self.high:g}"
        return Rule(f"{self.label or self.column} outside [{low}, {high}]", " AND ".join(parts))

    def expectations(self) -> list[Expectation]:
        return [
            expectation(
                "expect_column_values_to_be_between", column=self.column, min_value=self.low, max_value=self.high
            )
        ]


@dataclass(frozen=True)
class NotAfterArrival:
    """Event time no later than the record's arrival plus a clock-skew tolerance.

    Arrival is the earlier of the Kafka timestamp and ``ingest_time``: a producer sets its record's
    CreateTime (one that stamps year 9999 would otherwise pass any "not in the future" check and drag
    a watermark along), but not the platform's clock when the stream read the record. The earlier of
    the two also keeps the decision reproducible: a replay from bronze has both as they were, and a
    replay from Kafka reads later, so the Kafka timestamp decides as it did live. The audit compares
    with ``ingest_time`` alone.
    """

    column: str
    tolerance: str  # e.g. "5 minutes"

    def rule(self) -> Rule:
        return Rule(
            f"{self.column} more than {self.tolerance} ahead of the record's arrival",
            f"{self.column} <= least(kafka_timestamp, ingest_time) + INTERVAL {self.tolerance}",
        )

    @property
    def lead_column(self) -> str:
        """The derived column the audit validates: seconds the event time runs ahead of ingestion."""
        return f"{self.column}_ahead_of_ingest_seconds"

    def expectations(self) -> list[Expectation]:
        return [
            expectation(
                "expect_column_values_to_be_between",
                column=self.lead_column,
                max_value=int(parse_duration(self.tolerance).total_seconds()),
                meta={"notes": f"{self.column} must not be more than {self.tolerance} in the future"},
            )
        ]


Constraint = Required | OneOf | Between | NotAfterArrival


@dataclass(frozen=True, kw_only=True)
class Quality:
    """What the audits hold a pipeline to beyond its constraints.

    * ``rows_per_hour``: bounds on silver rows per hour of event time (scaled to the audited interval;
      ``None`` = unbounded). A silent producer shows up as an interval below the minimum.
    * ``tolerated_invalid_fraction``: share of an interval's arriving records that may break a
      constraint (they are quarantined) before the records suite fails.
    * ``tolerated_duplicate_fraction``: share of arriving records that may be re-sends.
    * ``blocking_suites``: suites whose failure holds back the interval's gold (``bronze``, ``records``,
      ``silver``, ``reconciliation``); the gate task fails and gold is not published.
    """

    rows_per_hour: tuple[int, int | None] = (1, None)
    tolerated_invalid_fraction: float = 0.01
    tolerated_duplicate_fraction: float = 0.02
    blocking_suites: tuple[str, ...] = ()
