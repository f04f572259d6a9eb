"""ads: two topics joined under kill -9; every click credited to its impression once, or an orphan with its reason.

Real broker, real Spark (the spark-submit streaming job for the kill), real Delta. The events are the
pipeline's own sample events (impressions, and the clicks each causes through ``follow_ups``), with
re-sends and malformed impressions; the expected figures are computed here in plain Python from what
was generated, independently of Spark. The tests share one lake and run in order:

1. The job is killed with SIGKILL after its first gold commits, more events follow, and the restarted
   stream finishes: each valid click is in ``clicked_impressions`` or in ``orphan_clicks`` exactly
   once, with the reason the impressions give; every impression nobody clicked whose bound has passed
   is there once, unclicked; the click-through counts are exact.
2. Stream/batch parity: the batch recompute of the first half hour changes no published row, and
   the scheduled audit (suites and reconciliation of both sources, gold, parity) passes.
3. A late click on an impression already published as unclicked: the stream drops it (behind both
   watermarks); the late-data correction turns the row into a match (ledger: one removed, one new).
"""

from __future__ import annotations

import datetime as dt
import json
import signal
import uuid
from collections import Counter, defaultdict
from typing import Any

import pytest
from deltalake import DeltaTable

from pipeline_helpers import kill_job, run_stream, send, wait_for
from tidewater.batch.correction import correct_late_data
from tidewater.batch.interval import Interval
from tidewater.batch.ledger import Ledger
from tidewater.batch.recompute import recompute_interval, replay
from tidewater.config import Settings
from tidewater.generator.producer import ensure_topic
from tidewater.pipelines import ads, get_pipeline
from tidewater.pipelines.layout import PipelineLayout
from tidewater.pipelines.samples import FollowUp, GeneratedRecord, GeneratorConfig, format_ts, generate, parse_ts
from tidewater.processes import stop_process_group
from tidewater.quality.audit import AuditRequest, run_audit
from tidewater.query.sql import run_sql
from tidewater.streaming.jobs import launch_stream_job

pytestmark = pytest.mark.slow

ADS = get_pipeline("ads")
START = dt.datetime(2026, 11, 21, 10, 0, tzinfo=dt.UTC)
BOUND = dt.timedelta(minutes=10)
LOOKBACK = dt.timedelta(hours=1)
WATERMARK = dt.timedelta(minutes=2)
COUNT = 5400  # impressions: 45 minutes at 2/s
CONFIG = GeneratorConfig(
    seed=11,
    rate=2,
    start_time_ms=parse_ts("2026-11-21T10:00:00Z"),
    duplicate_rate=0.02,
    out_of_order_fraction=0.05,
    out_of_order_max_ms=20_000,
    malformed_rate=0.005,
)


def _utc(value: dt.datetime) -> dt.datetime:
    return value.replace(tzinfo=dt.UTC) if value.tzinfo is None else value.astimezone(dt.UTC)


def published(layout: PipelineLayout, table: str) -> list[dict[str, Any]]:
    """A gold table as delta-rs alone reads it, timestamps as aware UTC."""
    rows = DeltaTable(layout.table_uri(f"gold/{table}")).to_pyarrow_table().to_pylist()
    return [{k: _utc(v) if isinstance(v, dt.datetime) else v for k, v in row.items()} for row in rows]


def at(text: str) -> dt.datetime:
    return dt.datetime.fromisoformat(text.replace("Z", "+00:00"))


def valid(records: list[GeneratedRecord], source: str | None) -> dict[str, dict[str, Any]]:
    """The first valid copy of each event of ``source`` (None: impressions), as its payload."""
    out: dict[str, dict[str, Any]] = {}
    for r in records:
        if r.source == source and r.kind not in ("malformed", "lost") and r.event_id is not None:
            out.setdefault(r.event_id, json.loads(r.value))
    return out


def classify(clicks: dict[str, dict], impressions: dict[str, dict]) -> dict[str, str]:
    """click id -> "matched", ads.TOO_OLD or ads.MISSING, from the impressions as the pipeline defines it."""
    out = {}
    for click_id, click in clicks.items():
        clicked = at(click["clicked_at"])
        shown = impressions.get(click["impression_id"])
        shown_at = at(shown["shown_at"]) if shown else None
        if shown_at is not None and shown_at <= clicked <= shown_at + BOUND:
            out[click_id] = "matched"
        elif shown_at is not None and clicked - LOOKBACK <= shown_at < clicked - BOUND:
            out[click_id] = ads.TOO_OLD
        else:
            out[click_id] = ads.MISSING
    return out


def watermark(records: list[GeneratedRecord]) -> dt.datetime:
    """The stream's final watermark: the lowest of the two inputs' (latest event time - 2 minutes)."""
    highs = [
        max(at(p["shown_at"]) for p in valid(records, None).values()),
        max(at(p["clicked_at"]) for p in valid(records, "clicks").values()),
    ]
    return min(highs) - WATERMARK


@pytest.fixture(scope="module")
def lake(spark, broker, tmp_path_factory) -> dict[str, Any]:
    """The stream killed after its first gold commits, then resumed to the end (test 1 checks it)."""
    state = tmp_path_factory.mktemp("ads")
    settings = Settings(
        state_dir=str(state / "state"),
        kafka_request_timeout_ms=5000,
        kafka_bootstrap_servers=broker.bootstrap_servers,
        kafka_topic_prefix=f"ads-{uuid.uuid4().hex[:8]}-",
        max_offsets_per_trigger=800,
    )
    topics = {s.name: settings.topic(s.topic) for s in ADS.sources}
    for topic in topics.values():
        ensure_topic(settings, topic, 2)
    layout = PipelineLayout.of(settings, ADS)
    records = list(generate(CONFIG, COUNT, ads.SAMPLE_EVENTS))

    def send_all(part: list[GeneratedRecord]) -> None:
        for name, topic in topics.items():
            send(settings, topic, [r for r in part if (r.source or "impressions") == name])

    half = len(records) // 2
    send_all(records[:half])
    log = state / "job.log"
    job = launch_stream_job(settings, "ads", log)
    try:

        def clicks_credited() -> bool:
            table = layout.table("gold/clicked_impressions")
            return table.exists() and any(r["clicked"] for r in published(layout, "clicked_impressions"))

        wait_for(clicks_credited, timeout_s=300, what="the first credited clicks in gold", log=log)
        assert kill_job(job) == -signal.SIGKILL
    finally:
        stop_process_group(job, timeout_s=10)

    send_all(records[half:])
    run_stream(spark, settings, "ads")  # resumes the killed job's checkpoints
    return {"settings": settings, "layout": layout, "records": records, "topics": topics}


def test_the_generator_clicks_only_impressions_it_made_and_a_few_it_did_not(lake):
    records = lake["records"]
    impressions, clicks = valid(records, None), valid(records, "clicks")
    kinds = Counter(classify(clicks, impressions).values())
    assert kinds["matched"] > 200 and kinds[ads.TOO_OLD] >= 3 and kinds[ads.MISSING] >= 3, kinds
    sent_ids = {r.event_id for r in records if r.source is None}  # malformed ones too
    forged = [c for c in clicks.values() if c["impression_id"] not in sent_ids]
    assert 0 < len(forged) < len(clicks) / 20  # the rare click on an impression nobody showed


def test_every_click_is_credited_once_or_an_orphan_with_its_reason(lake):
    layout, records = lake["layout"], lake["records"]
    impressions, clicks = valid(records, None), valid(records, "clicks")
    expected = classify(clicks, impressions)
    closed = watermark(records) - dt.timedelta(minutes=1)  # the last batch may close no later
    credited = [r for r in published(layout, "clicked_impressions") if r["clicked"]]
    orphans = published(layout, "orphan_clicks")
    seen = Counter([r["click_id"] for r in credited] + [r["click_id"] for r in orphans])
    assert seen and max(seen.values()) == 1, [k for k, n in seen.items() if n > 1]  # never twice, never both
    assert set(seen) <= set(clicks)  # no click that was not sent
    for row in credited:
        assert expected[row["click_id"]] == "matched", row
        assert row["impression_id"] == clicks[row["click_id"]]["impression_id"]
        assert row["seconds_to_click"] == (row["clicked_at"] - row["window_start"]).total_seconds()
    for row in orphans:
        assert expected[row["click_id"]] == row["reason"], row
        assert (row["shown_at"] is None) == (row["reason"] == ads.MISSING)
    due = {c for c, p in clicks.items() if at(p["clicked_at"]) <= closed}
    assert due - set(seen) == set(), "clicks behind the watermark neither credited nor orphaned"
    reasons = Counter(r["reason"] for r in orphans)
    assert reasons[ads.TOO_OLD] >= 3 and reasons[ads.MISSING] >= 3, reasons


def test_unclicked_impressions_appear_once_after_their_bound(lake):
    layout, records = lake["layout"], lake["records"]
    impressions, clicks = valid(records, None), valid(records, "clicks")
    kinds = classify(clicks, impressions)
    matched = {p["impression_id"] for c, p in clicks.items() if kinds[c] == "matched"}
    unclicked = [r for r in published(layout, "clicked_impressions") if not r["clicked"]]
    ids = Counter(r["impression_id"] for r in unclicked)
    assert max(ids.values()) == 1 and not set(ids) & matched
    closed = watermark(records) - dt.timedelta(minutes=1)
    due = {i for i, p in impressions.items() if at(p["shown_at"]) + BOUND <= closed and i not in matched}
    assert due and due <= set(ids)
    final_watermark = watermark(records)
    assert all(r["window_end"] <= final_watermark and r["click_id"] == "" for r in unclicked)


def test_click_through_rates_are_exact_for_closed_windows(lake):
    layout, records = lake["layout"], lake["records"]
    counts: dict[tuple[dt.datetime, str], list[int]] = defaultdict(lambda: [0, 0])

    def window(t: dt.datetime) -> dt.datetime:
        return t.replace(minute=t.minute - t.minute % 5, second=0, microsecond=0)

    for p in valid(records, None).values():
        counts[(window(at(p["shown_at"])), p["campaign_id"])][0] += 1
    for p in valid(records, "clicks").values():
        counts[(window(at(p["clicked_at"])), p["campaign_id"])][1] += 1
    closed = watermark(records) - dt.timedelta(minutes=1)
    rows = {(r["window_start"], r["campaign_id"]): r for r in published(layout, "ctr_per_campaign")}
    due = {k: v for k, v in counts.items() if k[0] + dt.timedelta(minutes=5) <= closed}
    assert len(due) > 100
    for key, (shown, clicked) in due.items():
        row = rows[key]
        assert (row["impressions"], row["clicks"]) == (shown, clicked), key
        assert row["ctr"] == (clicked / shown if shown else None)


def test_batch_equals_stream_and_the_audit_passes(lake, spark):
    settings, layout = lake["settings"], lake["layout"]
    end = START + dt.timedelta(minutes=30)
    before = {g.name: published(layout, g.name) for g in ADS.gold}
    result = recompute_interval(spark, settings, ADS, START, end, run_id="ads-parity")
    assert result.ledger_entries == 0, result
    assert set(result.tables) == {"impressions/silver", "clicks/silver", *(f"gold/{g.name}" for g in ADS.gold)}
    for gold in ADS.gold:

        def key(r: dict, g=gold) -> tuple:
            return tuple(r[k] for k in g.keys)

        def measures(r: dict) -> dict:
            return {c: v for c, v in r.items() if c not in ("status", "revision")}

        streamed = {key(r): measures(r) for r in before[gold.name] if r["window_start"] < end}
        batch = {key(r): measures(r) for r in published(layout, gold.name) if r["window_start"] < end}
        assert streamed and all(batch[k] == v for k, v in streamed.items()), gold.name

    audit = run_audit(spark, settings, AuditRequest(pipeline=ADS, interval=Interval(START, end)))
    suites = {r.suite: r for r in audit.rows}
    assert audit.success, audit.summary()
    assert {"ads.impressions.reconciliation", "ads.clicks.reconciliation", "ads.clicks.silver"} <= set(suites)
    assert {f"ads.parity.gold.{g.name}" for g in ADS.gold} <= set(suites)
    assert "seq_gaps" in suites["ads.impressions.reconciliation"].counts
    assert "seq_gaps" not in suites["ads.clicks.reconciliation"].counts  # clicks declare no sequence

    # Each source's tables in SQL under <pipeline>.<source>.<table>, joinable with gold.
    credited = run_sql(
        settings,
        "SELECT count(*) FROM ads.clicks.silver c JOIN ads.gold.clicked_impressions g ON g.click_id = c.click_id",
    )
    assert credited.rows[0][0] == sum(1 for r in published(layout, "clicked_impressions") if r["clicked"])


def test_a_late_click_turns_an_unclicked_impression_into_a_credited_one(lake, spark):
    settings, layout = lake["settings"], lake["layout"]
    impressions = valid(lake["records"], None)
    unclicked = sorted(
        (r for r in published(layout, "clicked_impressions") if not r["clicked"] and r["status"] == "final"),
        key=lambda r: r["window_start"],
    )
    target = unclicked[0]
    shown_at = at(impressions[target["impression_id"]]["shown_at"])
    late = FollowUp(
        source="clicks",
        event_id="late-click",
        key=b"u-late",
        payload={
            "click_id": "late-click",
            "clicked_at": format_ts(int((shown_at + dt.timedelta(minutes=3)).timestamp() * 1000)),
            "impression_id": target["impression_id"],
            "campaign_id": target["campaign_id"],
            "user_id": "u-late",
        },
        at_ms=0,
    )
    sent_ms = int((START + dt.timedelta(minutes=55)).timestamp() * 1000)
    record = GeneratedRecord(
        key=late.key,
        value=json.dumps(late.payload).encode(),
        timestamp_ms=sent_ms,
        kind="late",
        event_id="late-click",
        producer_id="test",
        seq_no=-1,
        event_time_ms=None,
    )
    send(settings, lake["topics"]["clicks"], [record])
    run_stream(spark, settings, "ads")  # silver keeps it; both joins drop it (behind the watermark)
    assert "late-click" not in {r["click_id"] for r in published(layout, "clicked_impressions")}
    assert "late-click" not in {r["click_id"] for r in published(layout, "orphan_clicks")}

    end = START + dt.timedelta(hours=1)
    correct_late_data(spark, settings, ADS, START, end, run_id="ads-late")
    entries = [
        e
        for e in Ledger(layout.ledger_uri()).rows(spark)
        if e["dag_run_id"] == "ads-late" and json.loads(e["keys"]).get("impression_id") == target["impression_id"]
    ]
    changes = sorted(
        (json.loads(e["keys"])["click_id"], e["old_value"] is None, e["new_value"] is None) for e in entries
    )
    assert changes == [("", False, True), ("late-click", True, False)]  # the unclicked row removed, the match new
    rows = [r for r in published(layout, "clicked_impressions") if r["impression_id"] == target["impression_id"]]
    assert [(r["click_id"], r["clicked"], r["status"]) for r in rows] == [("late-click", True, "final")]
    again = correct_late_data(spark, settings, ADS, START, end, run_id="ads-late-2")
    assert again.ledger_entries == 0


def test_a_sandbox_replay_of_one_campaign_reproduces_its_rows(lake, spark):
    """Replay from both bronze tables into a sandbox, restricted to one campaign (the entity column every
    source and gold table carries): its gold rows are the live ones, the live tables are untouched."""
    settings, layout = lake["settings"], lake["layout"]
    end = START + dt.timedelta(minutes=30)
    live_versions = {g.name: layout.table(f"gold/{g.name}").version() for g in ADS.gold}
    result = replay(
        spark, settings, ADS, START, end, run_id="ads-replay", sandbox_namespace="ads_sandbox", entities=["c-000"]
    )
    assert result.namespace == "ads_sandbox" and result.entities == ("c-000",)
    sandbox = PipelineLayout.of(settings, ADS, "ads_sandbox")
    for gold in ADS.gold:

        def rows(where: PipelineLayout, g=gold) -> set[tuple]:
            measures = [c for c in published(where, g.name)[0] if c not in ("status", "revision")]
            return {
                tuple(r[c] for c in measures)
                for r in published(where, g.name)
                if r["campaign_id"] == "c-000" and r["window_start"] < end
            }

        assert rows(sandbox) == rows(layout) and rows(layout), gold.name
        assert {r["campaign_id"] for r in published(sandbox, gold.name)} == {"c-000"}
        assert layout.table(f"gold/{gold.name}").version() == live_versions[gold.name]
