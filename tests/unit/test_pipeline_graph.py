"""What ``tidewater pipelines`` shows of a declaration: every table, and each gold table's kind (no Spark)."""

from __future__ import annotations

from tidewater.pipelines import get_pipeline
from tidewater.pipelines.graph import describe, mermaid


def test_the_description_names_each_kind_with_its_mode_and_feed():
    lines = describe(get_pipeline("pageviews"))
    assert lines[1] == "  kafka topic pageviews (source pageviews)"
    gold = {line.split()[0]: line for line in lines if line.strip().startswith("gold/")}
    assert all("(from silver): " in line for line in gold.values())
    assert "window 1 hour; keys window_start, visitor_id; stream update" in gold["gold/views_per_visitor_hour"]
    sessions = gold["gold/visitor_sessions"]
    assert sessions.endswith("batch reads 30 min before / 30 min after the interval (widened while rows grow)")
    signups = "projection; keys view_id; stream append (one query with visitor_sessions, pricing_conversions); "
    assert signups + "batch reads 0 before / 0 after" in gold["gold/signups"]
    alone = {line.split()[0]: line for line in describe(get_pipeline("pageviews"), shared_queries=False)}
    assert "stream append; batch reads 0 before" in alone["gold/signups"]
    assert gold["gold/pricing_conversions"].split("): ", 1)[1].startswith("join within 30 minutes; keys window_start")


def test_the_flowchart_has_an_edge_per_table():
    chart = mermaid(get_pipeline("rsvps")).splitlines()
    assert chart[0] == "flowchart LR"
    assert 'rsvps_topic[("kafka: rsvps")] --> rsvps_bronze["bronze"]' in chart[1]
    edges = [line for line in chart if line.strip().startswith("rsvps_silver -- ")]
    assert all(e.endswith(("rsvps_venue_response_counts", "rsvps_trending_venues")) for e in edges)
    assert [e.split('"')[1] for e in edges] == ["window 1 minute", "window 5 minutes"]


def test_the_description_shows_a_source_that_runs_on_its_own_trigger():
    lines = describe(get_pipeline("vending"))
    assert "  kafka topic vending-machines (source machines), a micro-batch every 5 seconds" in lines
    assert "  kafka topic vending-telemetry (source telemetry)" in lines  # the job's trigger: not repeated
