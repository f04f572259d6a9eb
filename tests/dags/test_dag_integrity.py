"""Every DAG file imports without errors and does no I/O at import time; the expected DAGs exist."""

from __future__ import annotations

from typing import Any

import pytest

from tidewater.pipelines import all_pipelines


@pytest.fixture(scope="module")
def integrity(airflow_home: Any, settings_module: Any) -> dict[str, Any]:
    return airflow_home.run("integrity", settings=settings_module)


@pytest.fixture(scope="module")
def settings_module(tmp_path_factory: pytest.TempPathFactory):
    from tidewater.config import Settings

    return Settings(state_dir=str(tmp_path_factory.mktemp("state")))


def test_no_import_errors(integrity: dict[str, Any]) -> None:
    assert integrity["import_errors"] == {}


def test_no_io_at_import_time(integrity: dict[str, Any]) -> None:
    assert integrity["io_at_import"] == []


def test_expected_dags_and_tasks(integrity: dict[str, Any]) -> None:
    dags = integrity["dags"]
    pipelines = sorted(all_pipelines())
    assert dags["tidewater_supervise_streams"] == [f"supervise_{p}" for p in pipelines]
    assert dags["tidewater_stream_control"] == ["control"]
    assert dags["tidewater_replay"] == ["audit", "replay", "validate"]
    assert dags["tidewater_maintenance"] == [f"maintain_{p}" for p in pipelines]
    assert sorted(dags["tidewater_correct_late_data"]) == sorted(
        [f"plan_{p}" for p in pipelines] + [f"correct_{p}" for p in pipelines] + [f"audit_{p}" for p in pipelines]
    )
    for pipeline in pipelines:
        assert dags[f"tidewater_batch_{pipeline}"] == sorted(
            [
                "wait_for_late_data",
                "plan_interval",
                "recompute_silver",
                "audit_interval",
                "gold_gate",
                "publish_gold",
                "audit_gold",
            ]
        )


def test_tasks_that_write_lake_tables_declare_them_as_assets(integrity: dict[str, Any], settings_module) -> None:
    """The lineage Airflow draws: each writing task's outlets are the tables it writes, named and
    located as the declaration says (tidewater.orchestration.assets)."""
    from tidewater.pipelines.layout import PipelineLayout

    outlets, inlets = integrity["outlets"], integrity["inlets"]
    for name, pipeline in sorted(all_pipelines().items()):
        layout = PipelineLayout.of(settings_module, pipeline)

        bronze, silver = (
            [
                ["Asset", f"{name}.{t.replace('/', '.')}", layout.table_uri(t)]
                for _, of, t in pipeline.source_tables()
                if of == tier
            ]
            for tier in ("bronze", "silver")
        )
        gold = [["Asset", f"{name}.gold.{g.name}", layout.table_uri(f"gold/{g.name}")] for g in pipeline.gold]
        assert outlets[f"tidewater_batch_{name}"] == {"recompute_silver": silver, "publish_gold": gold}
        assert outlets["tidewater_correct_late_data"][f"correct_{name}"] == gold
        # Inlets draw the lineage upstream (bronze -> silver -> gold); they emit no events.
        assert inlets[f"tidewater_batch_{name}"] == {"recompute_silver": bronze, "publish_gold": silver}
        assert inlets["tidewater_correct_late_data"][f"correct_{name}"] == silver
    assert outlets["tidewater_replay"] == {"replay": [["AssetAlias", "tidewater.replay", ""]]}
    assert set(outlets) == {"tidewater_correct_late_data", "tidewater_replay"} | {
        f"tidewater_batch_{name}" for name in all_pipelines()
    }
