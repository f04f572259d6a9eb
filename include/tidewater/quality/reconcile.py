"""Reconciliation of one arrival interval: every record Kafka took is accounted for, exactly once.

* **offsets**: per partition, the offsets of the interval's bronze rows span ``max - min + 1``
  offsets; bronze must hold exactly that many distinct rows in the span (a hole is a record the
  stream lost, a surplus a duplicate write). Kafka offsets of a non-transactional topic are dense.
* **bronze = silver + duplicates removed + quarantined**: each record is followed by its lineage
  (topic, partition, offset): kept in silver, or a re-send of an event silver holds from another
  record, or quarantined. What is none of these was lost between bronze and silver; a quarantine
  row without a rejected record (or a rejected record without its row) is counted too.
* **the declared promise** (:class:`tidewater.pipelines.base.Delivery`): exactly-once fails on a loss
  (an offset bronze never received, a valid record in neither silver nor the re-sends) and on a
  duplicate (a Kafka record in bronze twice, a key twice in silver); at-least-once fails on a loss and
  reports the copies silver kept (``duplicate_copies_kept``); at-most-once fails on a duplicate and
  reports the losses (``lost_records``: offsets never read plus records of an interrupted batch that
  reached bronze but neither silver nor quarantine).
* **sequence gaps** (only for a source that declares ``sequence=(producer, seq)``): per producer,
  sequence numbers missing between the lowest and highest of the interval's first copies: records
  lost upstream of Kafka (or unreadable ones: records whose producer/sequence did not parse cannot
  be attributed and are counted beside the gaps).
"""

from __future__ import annotations

import datetime as dt
from dataclasses import dataclass, field
from typing import Any

from pyspark.sql import DataFrame, SparkSession
from pyspark.sql import functions as F

from tidewater import phase_clock
from tidewater.batch import sources
from tidewater.batch.interval import Interval
from tidewater.pipelines.base import Source
from tidewater.pipelines.layout import PipelineLayout
from tidewater.quality import frames as fr

_LINEAGE = ("kafka_topic", "kafka_partition", "kafka_offset")


@dataclass(frozen=True)
class Reconciliation:
    counts: dict[str, Any]
    failures: list[str] = field(default_factory=list)
    checks: int = 4  # offsets, bronze = silver + duplicates + quarantine, stray rows, the promise (+ sequence gaps)

    @property
    def success(self) -> bool:
        return not self.failures


def reconcile(
    spark: SparkSession, layout: PipelineLayout, frames: fr.SourceFrames, interval: Interval
) -> Reconciliation:
    """Reconcile one source's records of ``interval`` (its bronze, silver, quarantine)."""
    source = frames.source
    records = frames.records.select(*_LINEAGE, source.key, *(source.sequence or ()), "_error")
    counts: dict[str, Any] = {}
    failures: list[str] = []

    # Offsets: the span the interval's records cover per partition, and bronze rows inside it.
    with phase_clock.phase("offsets"):
        spans = frames.bronze.groupBy("partition").agg(F.min("offset").alias("lo"), F.max("offset").alias("hi"))
        spans = spans.collect()
        in_span = _bronze_in_spans(spark, layout, source, interval, spans)
        counts["bronze_rows"] = frames.bronze.count()
    span = sum(r["hi"] - r["lo"] + 1 for r in spans)
    counts["offset_span"] = span
    counts["bronze_rows_in_span"] = in_span["rows"]
    counts["bronze_distinct_offsets_in_span"] = in_span["distinct"]
    delivery = layout.pipeline.delivery
    counts["delivery"] = delivery.value
    never_read = span - in_span["distinct"]
    if never_read and not delivery.may_lose:
        failures.append(
            f"offsets: bronze holds {in_span['distinct']} of the {span} offsets Kafka assigned (records lost)"
        )
    if in_span["rows"] != in_span["distinct"]:
        failures.append(f"offsets: {in_span['rows'] - in_span['distinct']} Kafka records are in bronze more than once")

    # Bronze = silver + duplicates removed + quarantined.
    valid = records.where(F.col("_error").isNull())
    rejected = records.where(F.col("_error").isNotNull())
    silver = fr.silver_of_records(spark, layout, source, frames.records)
    valid_count = valid.count()
    kept = dup = phantom = 0
    resent = None  # the valid records whose event silver holds from another record
    if silver is not None:
        with phase_clock.phase("silver"):
            kept, resent, dup, phantom = _followed_to_silver(silver, valid, valid_count, records, source.key, interval)
    missing = valid_count - kept - dup
    with phase_clock.phase("quarantine"):
        rejected_count = rejected.count()
        quarantined, stray = _followed_to_quarantine(
            fr.quarantine_of(spark, layout, source, interval), rejected, rejected_count, records
        )
    counts.update(
        silver_rows=kept,
        duplicates_removed=dup,
        quarantined=quarantined,
        rejected_records=rejected_count,
        lost_before_silver=missing,
        silver_rows_without_bronze=phantom,
        quarantine_rows_without_bronze=stray,
    )
    accounted = kept + dup + quarantined
    with phase_clock.phase("copies kept"):
        copies = _copies_kept(silver, valid, source.key) if silver is not None else 0
    counts["duplicate_copies_kept"] = copies
    if copies and not delivery.may_repeat:
        failures.append(
            f"silver holds {copies} extra row(s) for keys it holds already: {delivery.value} keeps one per key"
        )
    unquarantined = rejected_count - quarantined
    if delivery.may_lose:
        # An interrupted batch that reached bronze is never re-run: its valid records miss silver and
        # its rejected ones miss quarantine. Reported, not a failure: the promise allows it.
        counts["lost_records"] = never_read + missing + unquarantined
        accounted += missing + unquarantined
    if accounted != counts["bronze_rows"]:
        failures.append(
            f"bronze {counts['bronze_rows']} != silver {kept} + duplicates removed {dup} + quarantined {quarantined}"
            f" ({missing} valid records missing from silver, {unquarantined} rejected records "
            "missing from quarantine)"
        )
    if phantom or stray:
        failures.append(f"{phantom} silver and {stray} quarantine rows point at records bronze does not hold")

    checks = 4
    if source.sequence is not None:
        checks += 1
        with phase_clock.phase("sequence gaps"):
            failures += _sequence_gaps(records, resent, source.sequence, counts)
    return Reconciliation(counts=counts, failures=failures, checks=checks)


def _followed_to_silver(
    silver: DataFrame, valid: DataFrame, valid_count: int, records: DataFrame, key: str, interval: Interval
) -> tuple[int, DataFrame | None, int, int]:
    """(valid records silver keeps, the re-sent ones or None when there is none, how many, silver rows
    of the interval's arrivals that no record of bronze explains). A join is skipped when an earlier
    count says it can find nothing: every valid record kept leaves no re-send to look for."""
    not_kept = valid.join(silver.select(*_LINEAGE), on=list(_LINEAGE), how="left_anti")
    not_kept_count = not_kept.count()
    resent, dup = None, 0
    if not_kept_count:
        # Not kept, but silver holds the event (from another record): a re-send removed by de-duplication.
        resent = not_kept.join(silver.select(key).distinct(), on=key, how="left_semi")
        dup = resent.count()
        resent = resent if dup else None
    arrived = silver.where(fr.arrived_in(interval))
    phantom = arrived.select(*_LINEAGE).join(records, on=list(_LINEAGE), how="left_anti").count()
    return valid_count - not_kept_count, resent, dup, phantom


def _followed_to_quarantine(
    quarantine: DataFrame | None, rejected: DataFrame, rejected_count: int, records: DataFrame
) -> tuple[int, int]:
    """(rejected records the quarantine holds, quarantine rows no record of bronze explains); no join
    when the interval has no quarantine row."""
    q = None if quarantine is None else quarantine.select(*_LINEAGE).distinct()
    if q is None or not q.count():
        return 0, 0
    quarantined = 0
    if rejected_count:
        quarantined = rejected.select(*_LINEAGE).join(q, on=list(_LINEAGE), how="left_semi").count()
    stray = q.join(records.select(*_LINEAGE), on=list(_LINEAGE), how="left_anti").count()
    return quarantined, stray


def _copies_kept(silver: DataFrame, valid: DataFrame, key: str) -> int:
    """Silver rows beyond the first of each key the interval's valid records carry."""
    keys = valid.select(key).distinct()
    per_key = silver.join(keys, on=key, how="left_semi").groupBy(key).count()
    row = per_key.agg(F.sum(F.col("count") - 1).alias("extra")).collect()[0]
    return int(row["extra"] or 0)


def _sequence_gaps(
    records: DataFrame, resent: DataFrame | None, sequence: tuple[str, str], counts: dict[str, Any]
) -> list[str]:
    """Per-producer sequence gaps over first copies (a re-send repeats an old sequence number);
    ``resent`` None: the interval has no re-sent record (no join needed to leave them out)."""
    producer, seq = sequence
    firsts = records.where(F.col(producer).isNotNull() & F.col(seq).isNotNull())
    if resent is not None:
        firsts = firsts.join(resent.select(*_LINEAGE), on=list(_LINEAGE), how="left_anti")
    per_producer = (
        firsts.groupBy(producer)
        .agg(F.min(seq).alias("first"), F.max(seq).alias("last"), F.countDistinct(seq).alias("seen"))
        .collect()
    )
    gaps = {r[producer]: int(r["last"] - r["first"] + 1 - r["seen"]) for r in per_producer}
    unattributed = records.where(F.col(producer).isNull() | F.col(seq).isNull()).count()
    counts["seq_gaps"] = {p: g for p, g in sorted(gaps.items()) if g}
    counts["seq_ranges"] = {r[producer]: [int(r["first"]), int(r["last"])] for r in per_producer}
    counts["records_without_producer_seq"] = unattributed
    total_gaps = sum(gaps.values())
    if total_gaps <= unattributed:
        return []
    detail = ", ".join(f"{p}: {g}" for p, g in sorted(gaps.items()) if g)
    return [
        f"{seq} gaps: {total_gaps} sequence numbers never reached Kafka ({detail}); "
        f"only {unattributed} unreadable records could explain them: data lost upstream of Kafka"
    ]


def _bronze_in_spans(
    spark: SparkSession, layout: PipelineLayout, source: Source, interval: Interval, spans: list[Any]
) -> dict[str, int]:
    """Rows and distinct offsets bronze holds inside each partition's span, whatever their timestamps
    (records of a producer whose clock lags can sit inside the span with older timestamps)."""
    if not spans:
        return {"rows": 0, "distinct": 0}
    cond = None
    for r in spans:
        part = (F.col("partition") == r["partition"]) & F.col("offset").between(r["lo"], r["hi"])
        cond = part if cond is None else cond | part
    since = interval.start - (interval.end - interval.start) - dt.timedelta(days=1)
    bronze = sources.bronze_since(spark, layout.source_table(source, "bronze"), since).where(cond)
    row = bronze.agg(
        F.count(F.lit(1)).alias("rows"), F.countDistinct("partition", "offset").alias("distinct")
    ).collect()[0]
    return {"rows": int(row["rows"]), "distinct": int(row["distinct"])}
