"""A DAG of your own that runs whenever a gold table of ``rsvps`` changes (an Airflow asset event).

Copy it into the DAGs folder (``dags/``) to use it. Each batch ``publish_gold``, late-data correction
and replay that writes ``rsvps.gold.*`` emits an asset event whose extra says what changed (``mode``,
``interval``, ``namespace``, ``rows``, ``version``); the scheduler starts one run of this DAG for the
events that arrived since its last run, and the task reads them from ``triggering_asset_events``.
The streaming job's own commits (every few seconds) are not asset events. ``tests/ui`` runs this file.
"""

from __future__ import annotations

import datetime as dt
from typing import Any

from airflow.sdk import DAG, AssetAny, task

from tidewater.orchestration.assets import gold_assets

with DAG(
    dag_id="rsvps_gold_consumer",
    description="Runs when any rsvps.gold.* table changes; lists what changed",
    schedule=AssetAny(*gold_assets("rsvps")),
    start_date=dt.datetime(2026, 1, 1, tzinfo=dt.UTC),
    catchup=False,
    tags=["example", "rsvps"],
):

    @task
    def what_changed(triggering_asset_events: Any = None) -> list[dict[str, Any]]:
        """One line per triggering event: the table and the version, interval and rows it names."""
        changes = []
        for asset in triggering_asset_events or []:
            for event in triggering_asset_events[asset]:
                changes.append({"table": asset.name, "at": str(event.timestamp), **(event.extra or {})})
                print(f"{asset.name}: {event.extra}")
        return changes

    what_changed()
