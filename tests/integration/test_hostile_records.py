"""No record stops the stream or poisons a result: property-based and fuzz tests of the real writers.

Hostile records (``tests/hostile.py``: every field over its type's whole domain, lenient spellings
the strict contract refuses, random bytes, extreme Kafka timestamps, huge keys and headers) go
through the stream's own micro-batch writer (bronze, then silver + quarantine + conflicts from
those bronze rows, on real Spark and real Delta files), and the batch path's transform over the
bronze table. Every example asserts: nothing raised; bronze holds every record once; every record
is in exactly one of silver or quarantine, or is a copy of a key silver holds; silver has one row
per key; and the batch transform over bronze gives the stream's silver. Tables are read back with
an independent reader (delta-rs to pyarrow, not the project's Spark read path).
"""

from __future__ import annotations

import datetime as dt
import json
from collections import Counter
from functools import partial
from pathlib import Path
from typing import Any

import pyarrow as pa
import pyarrow.parquet as pq
import pytest
from deltalake import DeltaTable
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from hostile import Hostile, corpus, kafka_batch, records
from tidewater.config import Settings
from tidewater.connectors.kafka_source import checked, stamped
from tidewater.generator.events import GeneratorConfig, generate
from tidewater.lake.key_index import KeyIndex
from tidewater.lake.reads import read_table
from tidewater.lake.tables import LakeTable
from tidewater.pipelines import get_pipeline
from tidewater.pipelines.layout import PipelineLayout
from tidewater.streaming.writers import BronzeSilverWriter, SilverWriter

RSVPS = get_pipeline("rsvps")
LOCAL_RELATION_RULE = "org.apache.spark.sql.catalyst.optimizer.ConvertToLocalRelation"


def make_lake(spark, state_dir: str) -> PipelineLayout:
    layout = PipelineLayout.of(Settings(state_dir=state_dir), RSVPS)
    schemas = RSVPS.schemas(spark)
    for name in ("bronze", "silver", "quarantine", "conflicts"):
        LakeTable(layout.table_uri(name)).ensure(schemas[name], partition_by=RSVPS.partitioning(name))
    return layout


def silver_writer(layout: PipelineLayout) -> SilverWriter:
    table = layout.table
    return SilverWriter(
        RSVPS.source(),
        silver=table("silver"),
        quarantine=table("quarantine"),
        conflicts=table("conflicts"),
        app_id="fuzz",
        query="fuzz.silver",
    )


def write_batch(spark, layout: PipelineLayout, items: list[Hostile], batch_id: int = 0, first_offset: int = 0) -> None:
    """One micro-batch through the streaming job's writer, exactly as the bronze query calls it: with each
    payload checked, typed and stamped as the Kafka source does it (``payloadContract``, ``payloadParsed``,
    ``ingestTime``). (The batch transform :func:`check_lake` compares silver with types payloads too, in
    its Arrow UDF: :func:`test_any_records_typed_by_the_reader_parse_as_from_json_parses_them` holds the
    typing itself to Spark's ``from_json``.)"""
    contract = RSVPS.source().payload_schema.json()
    records = checked(kafka_batch(items, first_offset=first_offset), contract, parsed=True)
    records = stamped(records, int(dt.datetime.now(dt.UTC).timestamp() * 1_000_000))
    frame = spark.createDataFrame(pa.Table.from_batches([records]))
    writer = BronzeSilverWriter(
        bronze=layout.table("bronze"), silver=silver_writer(layout), app_id="fuzz", query="fuzz.bronze"
    )
    # The stream's input is a scan. Over a local relation Spark's optimizer would run the parse as it plans
    # (ConvertToLocalRelation), even in a plan of bronze columns alone that never reads it.
    spark.conf.set("spark.sql.optimizer.excludedRules", LOCAL_RELATION_RULE)
    try:
        writer(writer.input_of(frame), batch_id)  # the parse in the query's plan, as the stream has it
    finally:
        spark.conf.unset("spark.sql.optimizer.excludedRules")


def independent(layout: PipelineLayout, name: str) -> pa.Table:
    """A table read by delta-rs alone (not tidewater's read path)."""
    return DeltaTable(layout.table_uri(name)).to_pyarrow_dataset().to_table()


def best_effort_event_id(value: bytes | None) -> Any:
    try:
        return json.loads(value)["event_id"]  # type: ignore[arg-type]
    except Exception:
        return None


def check_lake(spark, layout: PipelineLayout, sent: list[Hostile]) -> dict[str, int]:
    bronze = independent(layout, "bronze")
    silver = independent(layout, "silver")
    quarantine = independent(layout, "quarantine")
    conflicts = independent(layout, "conflicts")

    coordinates = list(zip(bronze["partition"].to_pylist(), bronze["offset"].to_pylist(), strict=True))
    assert len(coordinates) == len(set(coordinates)) == len(sent), "bronze holds every record exactly once"
    assert sorted(v or b"" for v in bronze["value"].to_pylist()) == sorted(h.value or b"" for h in sent)

    def lineage(table: pa.Table) -> set[tuple[int, int]]:
        return set(zip(table["kafka_partition"].to_pylist(), table["kafka_offset"].to_pylist(), strict=True))

    in_silver, in_quarantine = lineage(silver), lineage(quarantine)
    assert not in_silver & in_quarantine, "a record is in silver or in quarantine, never both"
    keys = silver[RSVPS.source().key].to_pylist()
    assert len(keys) == len(set(keys)), "one silver row per key"
    value_of = dict(zip(coordinates, bronze["value"].to_pylist(), strict=True))
    copies = set(coordinates) - in_silver - in_quarantine
    for coordinate in copies:  # neither stored nor quarantined: a copy of an event silver holds
        assert best_effort_event_id(value_of[coordinate]) in set(keys), (coordinate, value_of[coordinate][:200])
    conflicted = set(
        zip(conflicts["copy_kafka_partition"].to_pylist(), conflicts["copy_kafka_offset"].to_pylist(), strict=True)
    )
    assert conflicted <= copies
    assert all(quarantine["reason"].to_pylist()), "every quarantined record has its reason"

    # Batch is a bounded stream: the batch path's transform over bronze gives the same silver (keeping, as a
    # recompute does, the copies silver holds: the stream's first is the first it processed).
    kept = read_table(spark, layout.table_uri("silver"))
    batch = RSVPS.source().silver_from_bronze(read_table(spark, layout.table_uri("bronze")), kept=kept).toArrow()
    streamed = sorted(zip(keys, silver["kafka_partition"].to_pylist(), silver["kafka_offset"].to_pylist(), strict=True))
    recomputed = sorted(
        zip(
            batch[RSVPS.source().key].to_pylist(),
            batch["kafka_partition"].to_pylist(),
            batch["kafka_offset"].to_pylist(),
            strict=True,
        )
    )
    assert recomputed == streamed
    return {"silver": len(in_silver), "quarantine": len(in_quarantine), "copies": len(copies)}


def valid_events(count: int, seed: int) -> list[Hostile]:
    config = GeneratorConfig(seed=seed, start_time_ms=1_763_719_200_000, rate=50, duplicate_rate=0.1)
    return [Hostile(r.value, r.key, r.timestamp_ms) for r in generate(config, count)]


def test_regression_corpus_with_valid_events(spark, tmp_path: Path) -> None:
    """Every input that once broke a writer or a query, among valid events and their re-sends."""
    layout = make_lake(spark, str(tmp_path))
    cases = corpus()
    sent = valid_events(200, seed=3) + cases + valid_events(100, seed=4)
    write_batch(spark, layout, sent)
    counts = check_lake(spark, layout, sent)
    quarantine = independent(layout, "quarantine")
    reasons = dict(zip(quarantine["raw_value"].to_pylist(), quarantine["reason"].to_pylist(), strict=True))
    expected = {
        "issue 9: a valid timestamp before the year 1000": None,  # a valid event: stored
        "issue 9: event time and Kafka CreateTime both 9999-12-31": "ahead of the record's arrival",
        "year 1 event": "outside the years 0001-9999",
        "beyond what Spark parses": "ahead of the record's arrival",  # Spark reads year 10000 after all
        "a number where the contract declares a string": "got `int` - at `$.event_id`",
        "an object where the contract declares a string": "got `object` - at `$.event_id`",
        "lat given as a string": "got `str` - at `$.venue.lat`",
        "trailing garbage": "malformed JSON: trailing characters",
        "two concatenated objects": "malformed JSON: trailing characters",
        "duplicate keys": "duplicate key 'response'",
        "invalid UTF-8": "not valid UTF-8",
        "NaN and infinity": "malformed JSON",
        "64-bit overflow": "at `$.seq_no`",
        "empty payload": "malformed JSON",
        "a JSON array": "Expected `object`, got `array`",
        "deep nesting": "nested too deeply",
    }
    for case in cases:
        for prefix, reason in expected.items():
            if case.note.startswith(prefix):
                if reason is None:
                    assert case.value not in reasons, case.note
                else:
                    assert reason in reasons.get(case.value, ""), (case.note, reasons.get(case.value))
    silver_ids = set(independent(layout, "silver")["event_id"].to_pylist())
    stored = {"corpus-y999", "corpus-tsmax", "corpus-tsmin", "corpus-hugekey"}
    assert stored <= silver_ids, (stored - silver_ids, {r.decode(errors="replace")[:80]: q for r, q in reasons.items()})
    assert "corpus-nul\x00" in silver_ids  # stored as it is
    assert counts["copies"] > 0

    # The raw payloads are bytes: a payload that is not UTF-8 stays queryable (it used to fail the SQL).
    from tidewater.query.sql import run_sql

    result = run_sql(layout.settings, "SELECT count(raw_value) FROM rsvps.quarantine")
    assert result.rows[0][0] == quarantine.num_rows
    utf8 = run_sql(layout.settings, "SELECT raw_value FROM rsvps.quarantine WHERE reason LIKE '%UTF-8%'")
    assert any(b"\xff" in row[0] or b"\xed" in row[0] for row in utf8.rows)


@pytest.fixture(scope="module")
def shared_lake(spark, tmp_path_factory) -> dict[str, Any]:
    """One lake that every generated example appends a micro-batch to (a lake per example costs seconds)."""
    return {"layout": make_lake(spark, str(tmp_path_factory.mktemp("fuzz"))), "sent": [], "batch": 0}


@settings(
    max_examples=8,
    derandomize=True,  # seeded: the same examples on every run
    database=None,
    deadline=None,
    suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large, HealthCheck.function_scoped_fixture],
)
@given(batch=st.lists(records(), min_size=1, max_size=60), resend=st.integers(0, 5))
def test_any_records_keep_every_promise(spark, shared_lake: dict[str, Any], batch: list[Hostile], resend: int) -> None:
    """Random hostile micro-batches (some records re-sent, as producer retries do), one after another on
    one lake: after each, every promise holds for everything sent so far."""
    layout, sent = shared_lake["layout"], shared_lake["sent"]
    items = batch + batch[:resend]
    write_batch(spark, layout, items, batch_id=shared_lake["batch"], first_offset=len(sent))
    shared_lake["batch"] += 1
    sent += items
    check_lake(spark, layout, sent)


def test_a_record_that_breaks_the_transforms_is_quarantined_and_the_batch_goes_on(spark, tmp_path, monkeypatch, caplog):
    """Poison isolation: the batch's one Spark job fails, so it is written apart (bronze, then the parse
    over it), where a record some function cannot handle is found by bisection and quarantined with the
    error; the rest of the batch is written. A failure every record shares is raised."""
    from pyspark.sql import functions as F

    from tidewater.pipelines import base

    poisoned = "poison-" + "x" * 8
    original = base.Source.parse

    def parse_that_fails_on_poison(self, bronze, **options):
        parsed = original(self, bronze, **options)
        boom = F.raise_error(F.lit("cannot handle this value"))
        return parsed.withColumn("event_id", F.when(F.col("event_id") == poisoned, boom).otherwise(F.col("event_id")))

    monkeypatch.setattr(base.Source, "parse", parse_that_fails_on_poison)
    layout = make_lake(spark, str(tmp_path))
    good = valid_events(24, seed=9)
    bad = Hostile(good[0].value.replace(json.loads(good[0].value)["event_id"].encode(), poisoned.encode()))
    with caplog.at_level("WARNING", logger="tidewater.streaming.writers"):
        write_batch(spark, layout, [*good[:10], bad, *good[10:]])
    assert "bronze and silver apart" in caplog.text
    assert independent(layout, "bronze").num_rows == len(good) + 1
    quarantine = independent(layout, "quarantine")
    pairs = zip(quarantine["raw_value"].to_pylist(), quarantine["reason"].to_pylist(), strict=True)
    (reason,) = [r for v, r in pairs if v == bad.value]
    assert reason.startswith("record could not be processed:") and "cannot handle this value" in reason
    silver = independent(layout, "silver")
    assert len(set(silver["event_id"].to_pylist())) == len({json.loads(g.value)["event_id"] for g in good})

    def parse_that_always_fails(self, bronze, **options):
        return original(self, bronze, **options).withColumn("event_id", F.raise_error(F.lit("storage is down")))

    monkeypatch.setattr(base.Source, "parse", parse_that_always_fails)
    with pytest.raises(Exception, match="storage is down"):
        write_batch(spark, layout, valid_events(8, seed=10), batch_id=1, first_offset=100)


def test_a_micro_batch_is_one_spark_job_and_its_bronze_rows_are_the_kafka_records(spark, tmp_path) -> None:
    """The stream's writer reads Kafka, parses and brings every table's rows to the driver in one Spark
    job; the bronze rows it splits off are exactly :func:`transforms.to_bronze`'s (hostile records too)."""
    from tidewater import transforms

    layout = make_lake(spark, str(tmp_path))
    sent = valid_events(50, seed=5) + corpus()
    context = spark.sparkContext
    context.setJobGroup("one micro-batch", "the stream's writer")
    try:
        write_batch(spark, layout, sent)
    finally:
        context.setJobGroup(None, None)  # type: ignore[arg-type]
    assert len(context.statusTracker().getJobIdsForGroup("one micro-batch")) == 1

    records = checked(kafka_batch(sent), RSVPS.source().payload_schema.json())
    stamped_at = independent(layout, "bronze")["ingest_time"][0].value
    frame = spark.createDataFrame(pa.Table.from_batches([stamped(records, stamped_at)]))
    written = independent(layout, "bronze")
    expected = transforms.to_bronze(frame).toArrow().select(written.column_names)  # the table's columns

    def in_order(table: pa.Table) -> list[dict[str, Any]]:
        return sorted(table.to_pylist(), key=lambda row: (row["partition"], row["offset"]))

    assert in_order(written.cast(expected.schema)) == in_order(expected)
    check_lake(spark, layout, sent)


def test_a_batch_written_apart_reads_its_bronze_columns_without_the_parse(spark, tmp_path) -> None:
    """The stream's input carries the parse in its plan (``BronzeSilverWriter.input_of``); the poison
    path reads the same batch's bronze columns alone (``transforms.bronze_of``), and Spark's optimizer
    prunes every parsed column from that plan, so a record the parse cannot handle cannot fail it."""
    from tidewater import transforms

    records = checked(kafka_batch(valid_events(5, seed=12)), RSVPS.source().payload_schema.json())
    pq.write_table(pa.Table.from_batches([stamped(records, 1_763_719_200_000_000)]), tmp_path / "batch.parquet")
    kafka = spark.read.parquet(str(tmp_path / "batch.parquet"))  # a scan, as the stream's source is
    rows = RSVPS.source().outcomes_with_bronze(transforms.to_bronze(kafka))
    bronze = transforms.bronze_of(rows)

    def optimized(frame) -> str:
        return frame._jdf.queryExecution().optimizedPlan().toString()

    assert "from_json" in optimized(rows) and "AS _error#" in optimized(rows)
    plan = optimized(bronze)
    assert "from_json" not in plan and "AS _error#" not in plan, plan
    assert bronze.columns == transforms.to_bronze(kafka).columns
    assert bronze.toArrow() == transforms.to_bronze(kafka).toArrow()


def test_a_pipeline_may_opt_into_lenient_parsing(spark) -> None:
    """``strict_json=False`` hands payloads to Spark's lenient reader: what it accepts, it keeps."""
    import dataclasses

    from tidewater import transforms

    valid = valid_events(1, seed=11)[0].value
    lenient_spellings = [valid + b" trailing", valid[:-1] + b',"response":"no"}']
    items = [Hostile(v) for v in lenient_spellings]
    bronze = transforms.to_bronze(spark.createDataFrame(pa.Table.from_batches([kafka_batch(items)])))
    strict = RSVPS.source().parse(bronze).select("_error").toArrow().column(0).to_pylist()
    assert all(reason and reason.startswith("malformed JSON") for reason in strict), strict
    lenient = dataclasses.replace(RSVPS.source(), strict_json=False)
    parsed = lenient.parse(bronze).select("_error", "response").toArrow().to_pylist()
    assert [row["_error"] for row in parsed] == [None, None]
    assert parsed[1]["response"] == "no"  # Spark keeps the last of duplicate keys


def test_parse_plan_reads_each_payload_once_under_a_filter(spark) -> None:
    """The batch path filters parsed rows (silver: no error). Spark must not push that filter below
    the JSON parse: it would inline the parse once per field the rules read (25 parses of every rsvps
    record) and run the strict check twice, 3x slower recomputes (tidewater.transforms.parse_payload)."""
    from tidewater import transforms

    items = valid_events(20, seed=13)
    bronze = transforms.to_bronze(spark.createDataFrame(pa.Table.from_batches([kafka_batch(items)])))
    source = RSVPS.source()
    for rows in (source.silver(source.parse(bronze)), source.quarantine(source.parse(bronze))):
        plan = rows._jdf.queryExecution().executedPlan().toString()
        assert plan.count("from_json(") == 1, plan
        assert plan.count("ArrowEvalPython") == 1, plan
    silver, quarantine = source.silver(source.parse(bronze)).count(), source.quarantine(source.parse(bronze)).count()
    assert silver + quarantine == len(items) and silver > 0


def test_payloads_checked_by_the_reader_parse_in_the_jvm_alone_with_the_same_outcome(spark) -> None:
    """The stream's Kafka source checks each payload's strict contract as it decodes the records
    (``payloadContract``); the parse then runs no Python worker, and every hostile and valid record
    gets the outcome the batch path's UDF gives it."""
    from tidewater import transforms

    items = [*valid_events(30, seed=17), *[Hostile(v) for v in (b"{", b'{"a":1}{"a":2}', b"\xff\xfe", None)]]
    source = RSVPS.source()
    contract = source.payload_schema.json()
    plain = pa.Table.from_batches([kafka_batch(items)])
    reader_checked = pa.Table.from_batches([checked(kafka_batch(items), contract)])
    reader_typed = pa.Table.from_batches([checked(kafka_batch(items), contract, parsed=True)])
    assert reader_typed.column("_parsed").null_count == 4  # the valid events typed, the others left to Spark
    outcomes = {}
    for label, kafka in (("udf", plain), ("reader", reader_checked), ("typed", reader_typed)):
        parsed = source.outcomes(source.parse(transforms.to_bronze(spark.createDataFrame(kafka))))
        plan = parsed._jdf.queryExecution().executedPlan().toString()
        assert plan.count("ArrowEvalPython") == (1 if label == "udf" else 0), plan
        outcomes[label] = parsed.drop("ingest_time", "_quarantine_ingest_time", "_quarantine_quarantine_date")
        outcomes[label] = (
            outcomes[label].toArrow().sort_by([("kafka_partition", "ascending"), ("kafka_offset", "ascending")])
        )
    assert outcomes["reader"].equals(outcomes["udf"])
    assert outcomes["typed"].equals(outcomes["udf"])
    reasons = [r for r in outcomes["reader"].column("_quarantine_reason").to_pylist() if r]
    assert len(reasons) == 4 and any("UTF-8" in r for r in reasons), reasons


# Timestamps around every edge of the one spelling the reader types (json_columns._TIMESTAMP), and others.
TIMESTAMP_EDGES = [
    "2026-11-21T10:00:00Z",
    "2026-11-21T10:00:00.1Z",
    "2026-11-21T10:00:00.123456Z",
    "2026-11-21T10:00:00.1234567Z",
    "2026-11-21T10:00:00.123+05:30",
    "2026-11-21T10:00:00-00:00",
    "2026-11-21T10:00:00+17:59",
    "2026-11-21T10:00:00+18:00",
    "2026-11-21T10:00:00+19:00",
    "2026-11-21T10:00:00+0530",
    "2026-11-21T10:00:00z",
    "2026-11-21t10:00:00Z",
    "2026-11-21 10:00:00Z",
    "2026-11-21T10:00:00",
    "2026-11-21T10:00Z",
    "2026-11-21",
    "2024-02-29T00:00:00Z",
    "2023-02-29T00:00:00Z",
    "1900-02-29T00:00:00Z",
    "2000-02-29T23:59:59.999999Z",
    "2026-04-31T00:00:00Z",
    "2026-13-01T00:00:00Z",
    "2026-11-21T24:00:00Z",
    "2026-11-21T23:60:00Z",
    "2026-11-21T23:59:60Z",
    "1000-01-01T00:00:00Z",
    "0999-12-31T23:59:59Z",
    "1582-10-10T00:00:00Z",
    "9999-12-31T23:59:59.999999Z",
    "9999-12-31T23:59:59.999999-17:59",
    "\uff12\uff10\uff12\uff16-11-21T10:00:00Z",  # full-width digits
    " 2026-11-21T10:00:00Z",
    "2026-11-21T10:00:00Z ",
    "",
]


def test_the_reader_types_each_payload_exactly_as_spark_parses_it(spark) -> None:
    """What the Kafka source types (``payloadParsed``) equals what ``from_json`` gives, value for value:
    timestamps at every edge of the spelling it types, integers at a 32-bit field's bounds (vending's
    counts), doubles spelled as integers, -0, nulls and missing fields, keys in another case, nested
    structs. Random hostile batches: the property test below."""
    rsvp = json.loads(valid_events(1, seed=19)[0].value)
    rsvps = [json.dumps({**rsvp, "event_time": text}).encode() for text in TIMESTAMP_EDGES]
    rsvps += [json.dumps({**rsvp, "venue": None}).encode(), json.dumps({**rsvp, "member": {}}).encode()]
    rsvps += [json.dumps({**rsvp, "venue": {**rsvp["venue"], "lat": lat}}).encode() for lat in (-0, 12, 2**53 + 1)]
    other_case = {("Event_Time" if key == "event_time" else key): value for key, value in rsvp.items()}
    rsvps += [json.dumps(other_case).encode(), json.dumps({**other_case, "event_time": rsvp["event_time"]}).encode()]
    readings = [
        json.dumps({"machine_id": "m-1", "read_at": "2026-11-21T10:00:00Z", "sales_count": count}).encode()
        for count in (2**31 - 1, 2**31, -(2**31), -(2**31) - 1, 0, None)
    ]
    cases = [(RSVPS.source(), rsvps), (get_pipeline("vending").source("telemetry"), readings)]
    for source, payloads in cases:
        batch = kafka_batch([Hostile(value) for value in payloads])
        typed = checked(batch, source.payload_schema.json(), parsed=True)
        assert 0 < typed.column("_parsed").null_count < len(payloads)  # some typed, some left to Spark
        by_spark, by_reader = typed_and_not(spark, source, batch)
        assert by_reader.equals(by_spark), (by_spark.to_pylist(), by_reader.to_pylist())


def typed_and_not(spark, source, batch: pa.RecordBatch) -> tuple[pa.Table, pa.Table]:
    """The parsed rows of ``batch`` as the Kafka source checks it alone (``from_json`` parses every payload)
    and as it checks and types it (``payloadParsed``)."""
    from tidewater import transforms

    contract = source.payload_schema.json()
    results = []
    for kafka in (checked(batch, contract), checked(batch, contract, parsed=True)):
        parsed = source.parse(transforms.to_bronze(spark.createDataFrame(pa.Table.from_batches([kafka]))))
        rows = parsed.drop("ingest_time").toArrow()
        results.append(rows.sort_by([("kafka_partition", "ascending"), ("kafka_offset", "ascending")]))
    return results[0], results[1]


@settings(
    max_examples=10,
    derandomize=True,
    database=None,
    deadline=None,
    suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large, HealthCheck.function_scoped_fixture],
)
@given(batch=st.lists(records(), min_size=1, max_size=60))
def test_any_records_typed_by_the_reader_parse_as_from_json_parses_them(spark, batch: list[Hostile]) -> None:
    """Random hostile batches (every field over its type's whole domain): the rows the parse gives with the
    reader's typing are the rows ``from_json`` gives."""
    by_spark, by_reader = typed_and_not(spark, RSVPS.source(), kafka_batch(batch))
    assert by_reader.equals(by_spark), (by_spark.to_pylist(), by_reader.to_pylist())


def test_a_recompute_keeps_the_copy_the_stream_kept(spark, tmp_path: Path) -> None:
    """First arrival wins in the batch recompute too: a conflicting copy processed later, on a lower
    partition, with its event time on the previous day, neither replaces nor duplicates the original."""
    import dataclasses

    from tidewater.batch.recompute import recompute_interval

    layout = make_lake(spark, str(tmp_path))
    events = [e for e in valid_events(40, seed=12) if e.value.startswith(b"{")]
    ids = Counter(json.loads(e.value)["event_id"] for e in events)
    unique = [e for e in events if ids[json.loads(e.value)["event_id"]] == 1]
    original, others = unique[-1], unique[:3]
    payload = json.loads(original.value)
    when = dt.datetime.fromisoformat(payload["event_time"].replace("Z", "+00:00"))
    payload["event_time"] = (when - dt.timedelta(days=1)).isoformat().replace("+00:00", "Z")
    copy = dataclasses.replace(original, value=json.dumps(payload).encode())
    first = [*others, original]  # the original on partition 3
    write_batch(spark, layout, first, batch_id=0)
    write_batch(spark, layout, [copy], batch_id=1, first_offset=100)  # the copy on partition 0, later

    def silver_copies() -> list[tuple[int, int]]:
        silver = independent(layout, "silver")
        rows = silver.filter(pa.compute.equal(silver["event_id"], payload["event_id"]))
        return list(zip(rows["kafka_partition"].to_pylist(), rows["kafka_offset"].to_pylist(), strict=True))

    assert silver_copies() == [(3, 0)]
    assert independent(layout, "conflicts")["key"].to_pylist() == [payload["event_id"]]
    hour = when.replace(minute=0, second=0, microsecond=0)
    for start in (hour, hour - dt.timedelta(days=1)):  # the original's hour, then the copy's
        end = start + dt.timedelta(hours=1)
        recompute_interval(spark, layout.settings, RSVPS, start, end, run_id=f"r-{start:%Y%m%d}", layers=("silver",))
        assert silver_copies() == [(3, 0)], start


@pytest.mark.parametrize("where", ["file", "s3"])
def test_silver_key_lookup_reads_the_log_not_the_folder(where: str, lake_uri: str, request) -> None:
    """The stream's key lookup (LakeTable.lookup, KeyIndex) on the local file system and on S3 (moto): it sees the
    current snapshot only, never files an overwrite removed."""
    root = request.getfixturevalue("s3_lake_uri") if where == "s3" else lake_uri
    table = LakeTable(f"{root}/silver")
    schema = pa.schema([("event_id", pa.string()), ("n", pa.int64())])
    table.ensure(schema)
    table.append_arrow(pa.table({"event_id": ["a", "b"], "n": [1, 2]}, schema=schema))
    table.replace_where(pa.table({"event_id": ["b"], "n": [3]}, schema=schema), "event_id = 'b'")
    index = KeyIndex(table, "event_id")  # the stream's way: only the files whose key hashes match
    for lookup in (partial(table.lookup, "event_id"), index.lookup):
        found = lookup(pa.array(["b", "c"]))
        assert found.to_pylist() == [{"event_id": "b", "n": 3}]
        assert lookup(pa.array([], pa.string())).num_rows == 0


def test_the_one_pass_split_gives_what_the_table_transforms_select(spark) -> None:
    """The stream divides one parse into quarantine and silver rows on the driver; the batch path selects
    them with Spark filters (Source.quarantine, Source.silver). Both give the same rows, column for column."""
    from tidewater import transforms

    source = RSVPS.source()
    items = valid_events(40, seed=12) + corpus()
    bronze = transforms.to_bronze(spark.createDataFrame(pa.Table.from_batches([kafka_batch(items)])))
    parsed = source.parse(bronze).persist()
    try:
        quarantine, silver = source.split_outcomes(source.outcomes(parsed).toArrow())
        expected_quarantine, expected_silver = source.quarantine(parsed).toArrow(), source.silver(parsed).toArrow()
    finally:
        parsed.unpersist()
    assert quarantine.num_rows > 0 and silver.num_rows > 0
    assert quarantine.num_rows + silver.num_rows == len(items)
    for got, expected in ((quarantine, expected_quarantine), (silver, expected_silver)):
        # Names and types; not nullability: the one pass computes a quarantine column only for rows with
        # a reason (null otherwise), and the table's schema is applied when the rows are written.
        assert [(f.name, f.type) for f in got.schema] == [(f.name, f.type) for f in expected.schema]
        assert got.sort_by("kafka_offset").to_pylist() == expected.sort_by("kafka_offset").to_pylist()


def test_reasons_and_names_with_quotes_survive_the_sql_plan(spark) -> None:
    """The parse plan is SQL text: a rule's reason and a column name with quotes, backticks and
    backslashes come out exactly as declared."""
    from pyspark.sql.types import LongType, StructField, StructType

    from tidewater import transforms

    reason = 'it\'s `odd` \\ "very" odd'
    bronze = transforms.to_bronze(
        spark.createDataFrame(pa.Table.from_batches([kafka_batch([Hostile(b'{"n": 1}'), Hostile(b'{"n": 2}')])]))
    )
    parsed = transforms.parse_payload(
        bronze,
        payload_schema=StructType([StructField("n", LongType())]),
        flatten={"a `b` 'c'": "p.n"},
        rules=[transforms.Rule(reason=reason, check="`a ``b`` 'c'` < 2")],
        derived={"twice": "`a ``b`` 'c'` * 2"},
    )
    rows = parsed.toArrow().select(["a `b` 'c'", "_error", "twice"]).sort_by("twice").to_pylist()
    assert rows == [{"a `b` 'c'": 1, "_error": None, "twice": 2}, {"a `b` 'c'": 2, "_error": reason, "twice": 4}]


def test_silver_commits_nothing_before_bronze_has_and_then_quarantine_before_silver(spark, tmp_path) -> None:
    """The bronze commit runs on its own thread while silver's rows are divided; silver waits for it
    before its key lookup and any commit, then commits quarantine before silver, so every crash point
    between the commits is the one the exactly-once tests cover. Re-sent copies are dropped."""
    from tidewater import transforms

    layout = make_lake(spark, str(tmp_path))
    write_batch(spark, layout, valid_events(30, seed=11))  # silver holds keys the next batch re-sends
    again = valid_events(60, seed=11)  # the first 30 again (copies), then 30 new events
    items = [*again, *corpus()]  # and records quarantine takes
    records = checked(kafka_batch(items, first_offset=1_000), RSVPS.source().payload_schema.json())
    frame = spark.createDataFrame(pa.Table.from_batches([stamped(records, 1_763_719_300_000_000)]))
    rows = RSVPS.source().outcomes_with_bronze(transforms.to_bronze(frame)).toArrow()
    rejected, valid = RSVPS.source().split_outcomes(rows)
    assert rejected.num_rows and valid.num_rows
    table = layout.table
    writer = silver_writer(layout)
    seen: list[str] = []
    lookup = writer.silver_keys.lookup
    writer.silver_keys.lookup = lambda keys: seen.append("lookup") or lookup(keys)  # type: ignore[method-assign]
    versions = {name: table(name).version() for name in ("silver", "quarantine")}

    def bronze_committed() -> None:  # what BronzeSilverWriter passes: the wait for its bronze commit
        seen.append("bronze")
        assert {name: table(name).version() for name in versions} == versions  # nothing of the batch yet

    writer.write_outcomes((rejected, valid), 1, before_commits=bronze_committed)
    assert seen == ["bronze", "lookup"]
    assert all(table(name).version() == version + 1 for name, version in versions.items())
    order = sorted(("silver", "quarantine"), key=lambda name: table(name).history(limit=1)[0]["timestamp"])
    assert order == ["quarantine", "silver"]
    held = independent(layout, "silver")["event_id"].to_pylist()
    assert len(held) == len(set(held))  # one row per key: the re-sent copies dropped
    assert {json.loads(item.value)["event_id"] for item in again} <= set(held)
