"""Which gold tables share a streaming query (no Spark): append-mode tables over the same inputs do;
an update-mode or published table keeps a query of its own."""

from __future__ import annotations

import dataclasses

import pytest

from tidewater.config import Settings
from tidewater.pipelines import get_pipeline
from tidewater.pipelines.base import Publish
from tidewater.pipelines.layout import PipelineLayout


def names(pipeline: str, *, shared: bool = True) -> list[str]:
    return [query.name for query in get_pipeline(pipeline).gold_queries(shared=shared)]


def test_append_mode_tables_over_the_same_inputs_share_a_query():
    assert names("ads") == ["gold_clicked_impressions__orphan_clicks", "gold_ctr_per_campaign"]
    assert names("pageviews") == [
        "gold_views_per_visitor_hour",
        "gold_visitor_sessions__pricing_conversions__signups",
    ]
    # machines reads the changelog alone, temperature_alerts the readings alone: not the same inputs
    assert names("vending") == [
        "gold_machines",
        "gold_sales_by_location_hour__silent_machines",
        "gold_temperature_alerts",
    ]


def test_update_mode_and_published_tables_keep_a_query_each():
    assert names("rsvps") == ["gold_venue_response_counts", "gold_trending_venues"]  # two aggregations
    assert names("payments") == ["gold_fraud_alerts"]  # published
    ads = get_pipeline("ads")
    published = dataclasses.replace(ads.gold_table("orphan_clicks"), publish=Publish(topic="orphans", key="click_id"))
    gold = tuple(published if g.name == "orphan_clicks" else g for g in ads.gold)
    queries = dataclasses.replace(ads, gold=gold).gold_queries()
    assert [q.name for q in queries] == ["gold_clicked_impressions", "gold_orphan_clicks", "gold_ctr_per_campaign"]


def test_a_shared_query_reads_each_input_once_and_feeds_each_build_in_its_order():
    query = get_pipeline("ads").gold_queries()[0]
    assert query.shared
    assert [s.name for s in query.inputs] == ["impressions", "clicks"]
    assert query.table_inputs == (("impressions", "clicks"), ("clicks", "impressions"))


def test_without_sharing_every_table_has_its_own_query():
    pageviews = get_pipeline("pageviews")
    assert names("pageviews", shared=False) == [f"gold_{g.name}" for g in pageviews.gold]
    assert not any(q.shared for q in pageviews.gold_queries(shared=False))


def test_the_layout_finds_a_tables_query_as_the_settings_group_them(tmp_path):
    vending = get_pipeline("vending")
    shared = PipelineLayout.of(Settings(state_dir=str(tmp_path)), vending)
    assert shared.gold_query_of("silent_machines").name == "gold_sales_by_location_hour__silent_machines"
    alone = PipelineLayout.of(Settings(state_dir=str(tmp_path), gold_shared_queries=False), vending)
    assert alone.gold_query_of("silent_machines").name == "gold_silent_machines"
    with pytest.raises(KeyError, match="no gold table 'nope'"):
        shared.gold_query_of("nope")
