"""Pipelines of several sources: table and query names, gold inputs, suites and follow-up sample events (no Spark)."""

from __future__ import annotations

import dataclasses
import json

import pytest

from tidewater.errors import PipelineError
from tidewater.pipelines import ads, get_pipeline
from tidewater.pipelines.graph import describe
from tidewater.pipelines.samples import GeneratorConfig, generate, parse_ts
from tidewater.quality import suites

ADS = get_pipeline("ads")
RSVPS = get_pipeline("rsvps")
CONFIG = GeneratorConfig(seed=3, rate=5, start_time_ms=parse_ts("2026-11-21T10:00:00Z"), duplicate_rate=0.02)


def test_each_source_has_its_own_tables_and_queries_named_after_it():
    clicks = ADS.source("clicks")
    assert ADS.table_of(clicks, "silver") == "clicks/silver"
    assert ADS.query_of(clicks, "bronze") == "bronze_clicks"
    assert [name for _, _, name in ADS.source_tables()][:4] == [
        "impressions/bronze",
        "impressions/silver",
        "impressions/quarantine",
        "impressions/conflicts",
    ]
    assert ADS.partitioning("clicks/silver") == ("click_date",)
    assert ADS.partitioning("impressions/bronze") == ("ingest_date",)
    assert ADS.partitioning("gold/ctr_per_campaign") == ()
    # one source: the names the platform always had
    assert RSVPS.table_of(RSVPS.source(), "silver") == "silver" and RSVPS.query_of(RSVPS.source(), "bronze") == "bronze"


def test_gold_inputs_are_sources_in_build_order():
    assert [s.name for s in ADS.inputs(ADS.gold_table("orphan_clicks"))] == ["clicks", "impressions"]
    assert [s.name for s in ADS.inputs(ADS.gold_table("clicked_impressions"))] == ["impressions", "clicks"]
    assert RSVPS.inputs(RSVPS.gold[0]) == RSVPS.sources


def test_a_declaration_that_cannot_be_wired_is_refused_in_one_line():
    gold = ADS.gold_table("ctr_per_campaign")
    with pytest.raises(PipelineError, match="reads unknown source"):
        dataclasses.replace(ADS, gold=(dataclasses.replace(gold, inputs=("impressions", "views")),))
    with pytest.raises(PipelineError, match="must name its inputs"):
        dataclasses.replace(ADS, gold=(dataclasses.replace(gold, inputs=()),))
    with pytest.raises(PipelineError, match=r"history \['views'\] must be among its inputs"):
        dataclasses.replace(ADS, gold=(dataclasses.replace(gold, history=("views",)),))
    with pytest.raises(PipelineError, match="unique"):
        dataclasses.replace(ADS, sources=(ADS.sources[0], ADS.sources[0]))
    with pytest.raises(PipelineError, match="has 2 sources: name one"):
        ADS.source()
    with pytest.raises(PipelineError, match="no source 'views'"):
        ADS.source("views")


def test_suites_are_per_source_and_sequence_checks_only_where_declared():
    layers = suites.layers_of(ADS)
    assert "clicks/silver" in layers and "impressions/records" in layers and "silver" not in layers
    assert suites.suite_name(ADS, "clicks/silver") == "ads.clicks.silver"
    silver = suites.derive(ADS, "clicks/silver")
    unique = [e for e in silver["expectations"] if e["type"] == "expect_column_values_to_be_unique"]
    assert [e["kwargs"]["column"] for e in unique] == ["click_id"]
    assert suites.source_layer(ADS, "impressions/bronze")[1] == "bronze"
    assert ADS.source("impressions").sequence == ("producer_id", "seq_no") and ADS.source("clicks").sequence is None


def test_the_graph_describes_each_source_and_what_each_gold_table_reads():
    lines = describe(ADS)
    assert "  kafka topic ad-clicks (source clicks)" in lines
    orphans = next(line for line in lines if "gold/orphan_clicks" in line)
    assert (
        "(from clicks/silver, impressions/silver)" in orphans
        and "join from 1 hour before to 0 seconds after" in orphans
    )


def test_follow_ups_reference_generated_events_and_come_in_send_order():
    records = list(generate(CONFIG, 3000, ads.SAMPLE_EVENTS))
    assert records == list(generate(CONFIG, 3000, ads.SAMPLE_EVENTS))  # reproducible
    impressions = {r.event_id: json.loads(r.value) for r in records if r.source is None and r.kind != "malformed"}
    clicks = [r for r in records if r.source == "clicks" and r.kind != "duplicate"]
    # count: the first source's events and the re-sends; follow-ups come on top
    assert len(clicks) > 100 and len([r for r in records if r.source is None or r.kind == "duplicate"]) == 3000
    known = [c for c in clicks if json.loads(c.value)["impression_id"] in impressions]
    assert len(known) > 0.9 * len(clicks)
    for click in known:
        payload = json.loads(click.value)
        shown = parse_ts(impressions[payload["impression_id"]]["shown_at"])
        assert parse_ts(payload["clicked_at"]) > shown and click.seq_no == -1
        assert payload["campaign_id"] == impressions[payload["impression_id"]]["campaign_id"]
    sent = [r.timestamp_ms for r in records if r.kind == "ok"]
    assert sent == sorted(sent)  # a click is yielded when the clock reaches it, not with its impression
    assert any(r.kind == "duplicate" and r.source == "clicks" for r in records)  # re-sends of clicks too


def test_a_source_runs_on_the_trigger_it_declares_and_the_others_on_the_jobs(tmp_path):
    from tidewater.config import Settings
    from tidewater.streaming.runner import PipelineStreams

    vending = get_pipeline("vending")
    assert vending.source("machines").trigger_seconds == 5.0 and vending.source("telemetry").trigger_seconds is None
    for split in (False, True):  # bronze and silver in one query, or each its own
        settings = Settings(state_dir=str(tmp_path), silver_query=split, gold_trigger_seconds=7.0)
        job = PipelineStreams(settings, vending)
        every = {tier.query: job.trigger_seconds(tier, 1.5) for tier in job.tiers}
        sources = {q: s for q, s in every.items() if not q.startswith("gold_")}
        assert len(sources) == (4 if split else 2)
        assert all(s == (5.0 if q.endswith("_machines") else 1.5) for q, s in sources.items()), sources
        assert all(s == 7.0 for q, s in every.items() if q.startswith("gold_")), every


@pytest.mark.parametrize(
    ("interval", "error"),
    [
        ("soon", "trigger_interval: duration 'soon' must look like"),
        ("0 seconds", "must be above 0"),
        ("5 minutes", "at most 60"),
    ],
)
def test_a_trigger_interval_out_of_bounds_is_refused_in_one_line(interval, error):
    vending = get_pipeline("vending")
    machines = dataclasses.replace(vending.source("machines"), trigger_interval=interval)
    with pytest.raises(PipelineError, match=error):
        dataclasses.replace(vending, sources=(vending.sources[0], machines))


def test_a_gold_table_runs_on_the_trigger_it_declares_and_a_shared_query_on_the_shortest(tmp_path):
    from tidewater.config import Settings
    from tidewater.streaming.runner import PipelineStreams

    ads_pipeline = get_pipeline("ads")
    shared = ads_pipeline.gold_query_of("clicked_impressions")
    assert shared.shared, "clicked_impressions shares its query (with orphan_clicks)"
    declared = {shared.tables[0].name: "3 seconds", shared.tables[1].name: "2 seconds"}
    gold = tuple(
        dataclasses.replace(g, trigger_interval=declared[g.name]) if g.name in declared else g
        for g in ads_pipeline.gold
    )
    pipeline = dataclasses.replace(ads_pipeline, gold=gold)
    settings = Settings(state_dir=str(tmp_path), gold_trigger_seconds=7.0)
    job = PipelineStreams(settings, pipeline)
    every = {tier.query: job.trigger_seconds(tier, 1.5) for tier in job.tiers}
    assert every[shared.name] == 2.0, every  # the shortest of the tables sharing it
    others = {q: s for q, s in every.items() if q.startswith("gold_") and q != shared.name}
    assert others and all(s == 7.0 for s in others.values()), every  # undeclared: the gold trigger
    assert all(s == 1.5 for q, s in every.items() if not q.startswith("gold_")), every
    assert any(line.endswith("; a micro-batch every 2 seconds") for line in describe(pipeline))
    assert get_pipeline("payments").gold_query_of("fraud_alerts").trigger_seconds == 2.0  # its alerts are waited on


@pytest.mark.parametrize(("interval", "error"), [("later", "must look like"), ("2 minutes", "at most 60")])
def test_a_gold_trigger_interval_out_of_bounds_is_refused_in_one_line(interval, error):
    ads_pipeline = get_pipeline("ads")
    gold = (dataclasses.replace(ads_pipeline.gold[0], trigger_interval=interval), *ads_pipeline.gold[1:])
    with pytest.raises(PipelineError, match=f"gold {ads_pipeline.gold[0].name} trigger_interval"):
        dataclasses.replace(ads_pipeline, gold=gold)
    with pytest.raises(PipelineError, match=error):
        dataclasses.replace(ads_pipeline, gold=gold)
