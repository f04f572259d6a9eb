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
