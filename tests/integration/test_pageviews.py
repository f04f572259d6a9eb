"""pageviews: hourly counts that survive a kill at minute 59, sessions, parity, and sessions a late view bridges.

Real broker, real Spark (the spark-submit streaming job for the kill), real Delta. The views are a
fixed, seeded script (not the sample generator) so every expected figure is computed here in plain
Python, independently of Spark: the hourly counts per visitor and the sessions (views closer than
30 minutes to each other), with landing and exit pages. The tests share one lake and run in order:

1. "An in-memory hourly count that fails at minute 59 is lost": the job has processed every view
   of 10:00-10:59 when it is killed with SIGKILL (the hour is still open: watermark 10:57). Views of
   11:00-11:40 follow; the restarted stream closes the hour, and its counts are exact.
2. Stream/batch parity for both kinds (window and session): the same transforms over silver as a
   batch, and the batch recompute of the hour, give the rows the stream published.
3. A late view between two sessions of a visitor bridges them: the stream drops it (behind the
   watermark); the late-data correction merges the two sessions into one (ledger: one changed, one
   removed) and fixes the hour's count; a rerun changes nothing.
4. The parity audit (what the batch DAG runs after publishing gold) passes, and names a row that
   drifts from what the transforms give.
"""

from __future__ import annotations

import datetime as dt
import json
import random
import signal
import uuid
from collections import defaultdict
from dataclasses import dataclass
from typing import Any

import pyarrow as pa
import pytest
from deltalake import DeltaTable

from pipeline_helpers import kill_job, run_stream, send, wait_for
from tidewater.batch.correction import correct_late_data
from tidewater.batch.interval import Interval
from tidewater.batch.ledger import Ledger
from tidewater.batch.recompute import recompute_interval
from tidewater.config import Settings
from tidewater.generator.producer import ensure_topic
from tidewater.pipelines import get_pipeline
from tidewater.pipelines.layout import PipelineLayout
from tidewater.processes import stop_process_group
from tidewater.quality.audit import AuditRequest, run_audit
from tidewater.streaming.jobs import launch_stream_job

pytestmark = pytest.mark.slow

PAGEVIEWS = get_pipeline("pageviews")
HOUR = dt.datetime(2026, 11, 21, 10, 0, tzinfo=dt.UTC)
GAP = dt.timedelta(minutes=30)
WATERMARK = dt.timedelta(minutes=2)
KILLED_AT = HOUR + dt.timedelta(minutes=59)  # the last view the job saw before it was killed
RESUMED_UNTIL = HOUR + dt.timedelta(minutes=100)  # 11:40: the hour closes, so do many sessions
PAGES = ("/", "/docs", "/pricing", "/blog", "/signup")
BRIDGE = "v-bridge"  # two visits 35 minutes apart; a late view at 10:28 joins them
JOINER = "v-join"  # views pricing at 10:05, signs up at 10:20, but that sign-up arrives late


@dataclass(frozen=True)
class View:
    key: bytes
    value: bytes
    timestamp_ms: int  # Kafka CreateTime: when it was sent
    view_id: str
    visitor: str
    page: str
    at: dt.datetime
    resend: bool = False


def view(visitor: str, at: dt.datetime, page: str, *, view_id: str, sent: dt.datetime | None = None) -> View:
    payload = {
        "view_id": view_id,
        "viewed_at": at.isoformat().replace("+00:00", "Z"),
        "visitor_id": visitor,
        "page": page,
        "referrer": "search",
        "device": "mobile",
    }
    when = int((sent or at).timestamp() * 1000)
    return View(visitor.encode(), json.dumps(payload).encode(), when, view_id, visitor, page, at)


def script(seed: int = 5) -> list[View]:
    """Eight visitors browsing 10:00-11:40 in visits (views 20 s to 9 min apart, visits 31-50 minutes
    apart), a visitor active at minute 59 and at 11:40, the bridge visitor, and some re-sends."""
    rng = random.Random(seed)
    views: list[View] = []

    def add(visitor: str, at: dt.datetime) -> None:
        views.append(view(visitor, at, rng.choice(PAGES), view_id=str(uuid.UUID(int=rng.getrandbits(128), version=4))))

    for n in range(8):
        at = HOUR + dt.timedelta(seconds=rng.randrange(0, 1200))
        while at < RESUMED_UNTIL - dt.timedelta(minutes=1):
            for _ in range(rng.randrange(2, 8)):
                add(f"v-{n}", at)
                at += dt.timedelta(seconds=rng.randrange(20, 540))
            at += dt.timedelta(seconds=rng.randrange(31 * 60, 50 * 60))
    add("v-clock", KILLED_AT)
    add("v-clock", RESUMED_UNTIL)
    for minute in (0, 10, 45, 50):
        add(BRIDGE, HOUR + dt.timedelta(minutes=minute))
    views.append(view(JOINER, HOUR + dt.timedelta(minutes=5), "/pricing", view_id="join-pricing"))
    views = [v for v in views if v.at <= RESUMED_UNTIL]
    resends = [View(**{**v.__dict__, "resend": True}) for v in rng.sample(views, 12)]
    return sorted(views + resends, key=lambda v: (v.at, v.resend))


def late_bridge() -> View:
    """10:28, sent at 11:45: 18 minutes after the bridge visitor's 10:10 view and 17 before 10:45."""
    sent = HOUR.replace(hour=11, minute=45)
    return view(BRIDGE, HOUR + dt.timedelta(minutes=28), "/docs", view_id="late-bridge", sent=sent)


def late_signup() -> View:
    """10:20, sent at 11:46: the sign-up that converts JOINER's 10:05 pricing view."""
    sent = HOUR.replace(hour=11, minute=46)
    return view(JOINER, HOUR + dt.timedelta(minutes=20), "/signup", view_id="late-signup", sent=sent)


# ---- the expected figures, in plain Python -----------------------------------------------------------


def unique(views: list[View]) -> list[View]:
    return [v for v in views if not v.resend]


def hourly(views: list[View]) -> dict[tuple[dt.datetime, str], tuple[int, int]]:
    """(window_start, visitor) -> (views, distinct pages)."""
    groups: dict[tuple[dt.datetime, str], list[View]] = defaultdict(list)
    for v in unique(views):
        groups[(v.at.replace(minute=0, second=0), v.visitor)].append(v)
    return {k: (len(vs), len({v.page for v in vs})) for k, vs in groups.items()}


def sessions(views: list[View]) -> dict[tuple[dt.datetime, str], tuple[Any, ...]]:
    """(session start, visitor) -> (end, views, distinct pages, landing, exit, last view)."""
    by_visitor: dict[str, list[View]] = defaultdict(list)
    for v in unique(views):
        by_visitor[v.visitor].append(v)
    out = {}
    for visitor, vs in by_visitor.items():
        vs.sort(key=lambda v: (v.at, v.view_id))
        current = [vs[0]]
        for v in [*vs[1:], None]:
            if v is not None and v.at < current[-1].at + GAP:
                current.append(v)
                continue
            first, last = current[0], current[-1]
            pages = len({c.page for c in current})
            out[(first.at, visitor)] = (last.at + GAP, len(current), pages, first.page, last.page, last.at)
            if v is not None:
                current = [v]
    return out


# ---- reading what the platform published ---------------------------------------------------------------


def _utc(value: dt.datetime) -> dt.datetime:
    return value.replace(tzinfo=dt.UTC) if value.tzinfo is None else value.astimezone(dt.UTC)


def published(layout: PipelineLayout, table: str) -> list[dict[str, Any]]:
    """A gold table as delta-rs alone reads it, timestamps as aware UTC."""
    rows = DeltaTable(layout.table_uri(f"gold/{table}")).to_pyarrow_table().to_pylist()
    return [{k: _utc(v) if isinstance(v, dt.datetime) else v for k, v in row.items()} for row in rows]


def published_hourly(layout: PipelineLayout) -> dict[tuple[dt.datetime, str], tuple[int, int]]:
    return {
        (r["window_start"], r["visitor_id"]): (r["views"], r["distinct_pages"])
        for r in published(layout, "views_per_visitor_hour")
    }


def conversions(views: list[View]) -> dict[tuple[dt.datetime, str, str], tuple[Any, ...]]:
    """(pricing time, pricing view, sign-up view or "") -> (end, visitor, sign-up time, converted)."""
    seen = unique(views)
    out = {}
    for p in (v for v in seen if v.page == "/pricing"):
        matches = [s for s in seen if s.page == "/signup" and s.visitor == p.visitor and p.at <= s.at <= p.at + GAP]
        for s in matches:
            out[(p.at, p.view_id, s.view_id)] = (p.at + GAP, p.visitor, s.at, True)
        if not matches:
            out[(p.at, p.view_id, "")] = (p.at + GAP, p.visitor, None, False)
    return out


def published_conversions(layout: PipelineLayout) -> dict[tuple[dt.datetime, str, str], tuple[Any, ...]]:
    return {
        (r["window_start"], r["pricing_view_id"], r["signup_view_id"]): (
            r["window_end"],
            r["visitor_id"],
            r["signup_at"],
            r["converted"],
        )
        for r in published(layout, "pricing_conversions")
    }


def published_sessions(layout: PipelineLayout) -> dict[tuple[dt.datetime, str], tuple[Any, ...]]:
    return {
        (r["window_start"], r["visitor_id"]): (
            r["window_end"],
            r["views"],
            r["distinct_pages"],
            r["landing_page"],
            r["exit_page"],
            r["last_view_at"],
        )
        for r in published(layout, "visitor_sessions")
    }


def closed(expected: dict[tuple[dt.datetime, str], tuple[Any, ...]], watermark: dt.datetime) -> dict:
    return {k: v for k, v in expected.items() if v[0] <= watermark}


@pytest.fixture(scope="module")
def lake(spark, broker, tmp_path_factory) -> dict[str, Any]:
    """The stream killed at minute 59 and resumed (test 1 checks what it left)."""
    state = tmp_path_factory.mktemp("pageviews")
    settings = Settings(
        state_dir=str(state / "state"),
        kafka_request_timeout_ms=5000,
        kafka_bootstrap_servers=broker.bootstrap_servers,
        kafka_topic_prefix=f"pv-{uuid.uuid4().hex[:8]}-",
        max_offsets_per_trigger=400,
    )
    topic = settings.topic(PAGEVIEWS.source().topic)
    ensure_topic(settings, topic, 2)
    layout = PipelineLayout.of(settings, PAGEVIEWS)
    views = script()
    before = [v for v in views if v.at <= KILLED_AT]
    send(settings, topic, before)

    log = state / "job.log"
    job = launch_stream_job(settings, "pageviews", log)
    try:
        counted = sum(n for n, _ in hourly(before).values())

        def hour_counted() -> bool:  # the job's hourly state holds every view of the hour so far
            table = layout.table("gold/views_per_visitor_hour")
            return table.exists() and sum(r["views"] for r in published(layout, "views_per_visitor_hour")) == counted

        wait_for(hour_counted, timeout_s=300, what="the hour's views in gold", log=log)
        hour_open = published_hourly(layout)
        assert kill_job(job) == -signal.SIGKILL
    finally:
        stop_process_group(job, timeout_s=10)

    send(settings, topic, [v for v in views if v.at > KILLED_AT])
    run_stream(spark, settings, "pageviews")  # resumes the killed job's checkpoints
    return {"settings": settings, "layout": layout, "views": views, "hour_open": hour_open}


def test_an_hour_killed_at_minute_59_counts_exactly(lake):
    layout, views = lake["layout"], lake["views"]
    expected = {k: v for k, v in hourly(views).items() if k[0] == HOUR}
    # Before the kill the hour was open and already counted every view it had seen ...
    assert lake["hour_open"] == {k: v for k, v in hourly([v for v in views if v.at <= KILLED_AT]).items()}
    # ... and after the restart it holds every view of the hour exactly once.
    assert {k: v for k, v in published_hourly(layout).items() if k[0] == HOUR} == expected
    assert sum(n for n, _ in expected.values()) == sum(1 for v in unique(views) if v.at < HOUR.replace(hour=11))


def test_signups_are_every_signup_view_as_it_happened(lake):
    """A projection holds no state and waits for no watermark: every sign-up view is there, once."""
    rows = published(lake["layout"], "signups")
    expected = {(v.view_id, v.at, v.visitor) for v in unique(lake["views"]) if v.page == "/signup"}
    assert len(expected) > 5
    assert sorted((r["view_id"], r["viewed_at"], r["visitor_id"]) for r in rows) == sorted(expected)


def test_conversions_join_pricing_views_to_later_signups(lake):
    """A match is written as soon as both sides are in; a pricing view nobody converted only once the
    watermark has passed it + 30 minutes (each at most once)."""
    streamed = published_conversions(lake["layout"])
    expected = conversions(lake["views"])
    assert {k: v for k, v in streamed.items() if k in expected} == streamed  # nothing the views do not give
    matched = {k: v for k, v in expected.items() if v[3]}
    assert matched and all(k in streamed for k in matched)
    unmatched_closed = {k: v for k, v in expected.items() if not v[3] and v[0] < HOUR.replace(hour=11)}
    assert unmatched_closed and all(k in streamed for k in unmatched_closed)
    assert all(end <= RESUMED_UNTIL - WATERMARK for end, _, _, converted in streamed.values() if not converted)


def test_sessions_are_emitted_once_closed_and_exact(lake):
    layout, views = lake["layout"], lake["views"]
    watermark = RESUMED_UNTIL - WATERMARK
    streamed = published_sessions(layout)
    assert all(end <= watermark for end, *_ in streamed.values())  # append mode: only closed sessions
    expected = closed(sessions(views), watermark - dt.timedelta(minutes=1))  # the last batch may close no later
    assert {k: v for k, v in streamed.items() if k in expected} == expected
    assert set(streamed) <= set(sessions(views))
    bridge = {k: v for k, v in streamed.items() if k[1] == BRIDGE}
    assert sorted(k[0].minute for k in bridge) == [0, 45]  # two visits, 35 minutes apart


def test_batch_equals_stream_for_windows_and_sessions(lake, spark):
    settings, layout = lake["settings"], lake["layout"]
    tables = ("views_per_visitor_hour", "visitor_sessions", "pricing_conversions", "signups")
    before = {t: published(layout, t) for t in tables}
    result = recompute_interval(spark, settings, PAGEVIEWS, HOUR, HOUR.replace(hour=11), run_id="pv-parity")
    assert result.ledger_entries == 0
    for table, rows in before.items():
        after = published(layout, table)
        keys = PAGEVIEWS.gold_table(table).keys
        start = PAGEVIEWS.gold_table(table).span[0]
        in_hour = {tuple(r[k] for k in keys): r for r in rows if r[start] < HOUR.replace(hour=11)}
        recomputed = {tuple(r[k] for k in keys): r for r in after if r[start] < HOUR.replace(hour=11)}
        assert set(recomputed) >= set(in_hour) and in_hour, table
        for key, row in in_hour.items():  # every row the stream published, unchanged but for its status
            measures = {c: v for c, v in row.items() if c not in ("status", "revision")}
            assert {c: v for c, v in recomputed[key].items() if c not in ("status", "revision")} == measures, key
    # The recompute also owns the sessions of the hour that the stream has not closed yet.
    all_sessions = sessions(lake["views"])
    recomputed_sessions = published_sessions(layout)
    for key, value in all_sessions.items():
        if key[0] < HOUR.replace(hour=11):
            assert recomputed_sessions[key] == value, key
    in_hour = {k: v for k, v in conversions(lake["views"]).items() if k[0] < HOUR.replace(hour=11)}
    assert {k: v for k, v in published_conversions(layout).items() if k[0] < HOUR.replace(hour=11)} == in_hour


def test_a_late_view_bridging_two_sessions_is_corrected_with_a_ledger(lake, spark):
    settings, layout, views = lake["settings"], lake["layout"], lake["views"]
    late = late_bridge()
    send(settings, settings.topic(PAGEVIEWS.source().topic), [late])
    run_stream(spark, settings, "pageviews")  # silver keeps it; the stream's gold drops it (behind the watermark)
    assert {k[0].minute for k in published_sessions(layout) if k[1] == BRIDGE} == {0, 45}

    result = correct_late_data(spark, settings, PAGEVIEWS, HOUR, HOUR.replace(hour=12), run_id="pv-late")
    entries = [e for e in Ledger(layout.ledger_uri()).rows(spark) if e["dag_run_id"] == "pv-late"]
    by_table = defaultdict(list)
    for entry in entries:
        if json.loads(entry["keys"]).get("visitor_id") == BRIDGE:
            by_table[entry["table"]].append(entry)
    # Besides the bridge: rows the batch's watermark closes that the stream, a batch behind, had not
    # emitted yet (within seconds of the end) are inserted, each with its entry.
    others = [e for e in entries if json.loads(e["keys"]).get("visitor_id") != BRIDGE]
    edge = RESUMED_UNTIL - WATERMARK - dt.timedelta(minutes=1)
    assert all(e["old_value"] is None and _utc(e["window_end"]) > edge for e in others), others
    sessions_changed = by_table["gold/visitor_sessions"]
    assert sorted((_utc(e["window_start"]).minute, e["new_value"] is None) for e in sessions_changed) == [
        (0, False),  # the 10:00 visit now runs to 10:50 + 30 min
        (45, True),  # the 10:45 visit is gone: part of it
    ]
    assert all(json.loads(e["keys"]) == {"visitor_id": BRIDGE} for e in sessions_changed)
    merged = next(e for e in sessions_changed if e["new_value"] is not None)
    assert json.loads(merged["new_value"])["views"] == 5 and merged["late_events"] == 1
    assert [json.loads(e["keys"]) for e in by_table["gold/views_per_visitor_hour"]] == [{"visitor_id": BRIDGE}]
    assert sum(len(v) for v in by_table.values()) == 3 and result.ledger_entries == len(entries)

    everything = [*views, late]
    bridge = {k: v for k, v in published_sessions(layout).items() if k[1] == BRIDGE}
    assert bridge == {k: v for k, v in sessions(everything).items() if k[1] == BRIDGE}
    assert len(bridge) == 1
    assert {k: v for k, v in published_hourly(layout).items() if k[0] == HOUR} == {
        k: v for k, v in hourly(everything).items() if k[0] == HOUR
    }
    rows = {r["visitor_id"]: r for r in published(layout, "visitor_sessions") if r["visitor_id"] == BRIDGE}
    assert rows[BRIDGE]["status"] == "final" and rows[BRIDGE]["revision"] == 1

    again = correct_late_data(spark, settings, PAGEVIEWS, HOUR, HOUR.replace(hour=12), run_id="pv-late-2")
    assert again.ledger_entries == 0


def test_a_late_signup_turns_an_unmatched_pricing_view_into_a_conversion(lake, spark):
    settings, layout = lake["settings"], lake["layout"]
    assert published_conversions(layout)[(HOUR + dt.timedelta(minutes=5), "join-pricing", "")][3] is False
    send(settings, settings.topic(PAGEVIEWS.source().topic), [late_signup()])
    run_stream(spark, settings, "pageviews")  # the join drops it (behind the watermark); silver keeps it
    assert (HOUR + dt.timedelta(minutes=5), "join-pricing", "late-signup") not in published_conversions(layout)

    correct_late_data(spark, settings, PAGEVIEWS, HOUR, HOUR.replace(hour=12), run_id="pv-late-signup")
    entries = [
        e
        for e in Ledger(layout.ledger_uri()).rows(spark)
        if e["dag_run_id"] == "pv-late-signup" and e["table"] == "gold/pricing_conversions"
    ]
    changes = sorted((json.loads(e["keys"])["signup_view_id"], e["old_value"] is None) for e in entries)
    assert changes == [("", False), ("late-signup", True)]  # the unmatched row removed, the conversion new
    assert [e["new_value"] is None for e in sorted(entries, key=lambda e: json.loads(e["keys"])["signup_view_id"])] == [
        True,
        False,
    ]
    everything = [*lake["views"], late_bridge(), late_signup()]
    joined = {k: v for k, v in published_conversions(layout).items() if v[1] == JOINER}
    assert joined == {k: v for k, v in conversions(everything).items() if v[1] == JOINER}
    assert [v[3] for v in joined.values()] == [True]


def test_the_parity_audit_passes_and_names_a_row_that_drifts(lake, spark):
    settings, layout = lake["settings"], lake["layout"]
    request = AuditRequest(pipeline=PAGEVIEWS, interval=Interval(HOUR, HOUR.replace(hour=12)), checks=("parity",))
    result = run_audit(spark, settings, request)
    assert {r.suite: r.success for r in result.rows} == {
        "pageviews.parity.gold.views_per_visitor_hour": True,
        "pageviews.parity.gold.visitor_sessions": True,
        "pageviews.parity.gold.pricing_conversions": True,
        "pageviews.parity.gold.signups": True,
    }
    sessions_row = next(r for r in result.rows if r.table_name == "gold/visitor_sessions")
    assert sessions_row.rows == sum(
        1
        for end, *_ in sessions([*lake["views"], late_bridge(), late_signup()]).values()
        if end <= RESUMED_UNTIL - WATERMARK
    )

    # A published session whose views no run of the transforms explains: the audit names it.
    table = layout.table("gold/visitor_sessions")
    drifted = [r for r in DeltaTable(table.uri).to_pyarrow_table().to_pylist() if r["visitor_id"] == BRIDGE]
    table.merge(pa.Table.from_pylist([{**drifted[0], "views": 99}]), keys=PAGEVIEWS.gold_table("visitor_sessions").keys)
    failed = run_audit(spark, settings, request)
    outcome = {r.suite: r for r in failed.rows}["pageviews.parity.gold.visitor_sessions"]
    assert not outcome.success and outcome.counts["differing_rows"] == 1
    assert "visitor_id='v-bridge'" in outcome.failures[0] and "views published 99 vs batch 5" in outcome.failures[0]
