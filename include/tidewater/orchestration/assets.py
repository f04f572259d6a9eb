"""Lake tables as Airflow Assets: the lineage Airflow draws, and what a DAG can be scheduled on.

Every table a pipeline declares is an Asset named ``<pipeline>.<table>`` (``rsvps.bronze``,
``rsvps.silver``, ``ads.clicks.silver``, ``rsvps.gold.venue_response_counts``; a namespace other than
the configured one comes first: ``try1.rsvps.silver``), its URI the table's (``file://`` or ``s3://``),
its group ``tidewater``. Names come from the declaration, so a new pipeline's tables appear without
code here.

The DAG tasks that write tables declare them as outlets: the batch DAG's ``recompute_silver`` (the
sources' silver) and ``publish_gold`` (gold), the late-data DAG's ``correct_<pipeline>`` (gold), and
the replay DAG's ``replay`` through the alias :func:`replay_alias` (its namespace is a run param). So
the Assets view shows each pipeline's lineage, and each successful run adds an asset event whose extra
says what the job did: the interval, the run id, and per table the rows written and the version
committed (:func:`event_extras`, from the job's ``tidewater: result`` line). The streaming job is not a
task: its commits, one every few seconds, are not asset events (the streams' progress is).

A DAG of your own runs when gold changes::

    from airflow.sdk import DAG, Asset

    with DAG("my_report", schedule=Asset.ref(name="rsvps.gold.venue_response_counts")): ...
    # any gold table of rsvps ("rsvps.gold.*"):
    with DAG("my_report", schedule=AssetAny(*gold_assets("rsvps"))): ...
"""

from __future__ import annotations

import json
from collections.abc import Iterable, Mapping
from typing import TYPE_CHECKING, Any

from tidewater.batch.result import RESULT_PREFIX
from tidewater.config import Settings
from tidewater.pipelines import get_pipeline
from tidewater.pipelines.base import Pipeline
from tidewater.pipelines.layout import PipelineLayout

if TYPE_CHECKING:
    from airflow.sdk import Asset, AssetAlias

GROUP = "tidewater"
REPLAY_ALIAS_NAME = "tidewater.replay"

# Airflow is imported by the functions that build its objects, so the names and extras below stay
# plain Python that tests (and the CLI) use without importing Airflow.


def replay_alias() -> AssetAlias:
    """The replay DAG's outlet: the tables it wrote, in the namespace its run chose, are added per run."""
    from airflow.sdk import AssetAlias

    return AssetAlias(name=REPLAY_ALIAS_NAME, group=GROUP)


def asset_name(settings: Settings, pipeline: str, table: str, namespace: str | None = None) -> str:
    """``<pipeline>.<table>`` with ``/`` as ``.``; another namespace than the configured one first."""
    name = f"{pipeline}.{table.replace('/', '.')}"
    return name if namespace in (None, settings.namespace) else f"{namespace}.{name}"


def table_asset(settings: Settings, pipeline: Pipeline, table: str, namespace: str | None = None) -> Asset:
    """The Asset of one of ``pipeline``'s tables (a name of :attr:`PipelineLayout.table_names`)."""
    from airflow.sdk import Asset

    uri = PipelineLayout.of(settings, pipeline, namespace).table_uri(table)
    return Asset(name=asset_name(settings, pipeline.name, table, namespace), uri=uri, group=GROUP)


def tier_assets(settings: Settings, pipeline: Pipeline, tier: str, namespace: str | None = None) -> list[Asset]:
    """The Assets of a tier: ``gold`` (every gold table) or a source tier (``silver``: every source's)."""
    if tier == "gold":
        tables = [f"gold/{gold.name}" for gold in pipeline.gold]
    else:
        tables = [name for _, of_tier, name in pipeline.source_tables() if of_tier == tier]
    return [table_asset(settings, pipeline, table, namespace) for table in tables]


def gold_assets(pipeline: str, settings: Settings | None = None) -> list[Asset]:
    """Every gold table of ``pipeline`` as an Asset: ``schedule=AssetAny(*gold_assets("rsvps"))``."""
    return tier_assets(settings or Settings.from_env(), get_pipeline(pipeline), "gold")


def job_result(lines: Iterable[str]) -> dict[str, Any] | None:
    """The ``tidewater: result {json}`` a batch job printed last, or None (a job that printed none)."""
    found = None
    for line in lines:
        text = line.strip()
        if text.startswith(RESULT_PREFIX):
            try:
                found = json.loads(text.removeprefix(RESULT_PREFIX))
            except ValueError:
                continue
    return found


def _committed(result: Mapping[str, Any]) -> dict[str, Mapping[str, Any]]:
    """The tables a job's result says it committed to, with their outcomes."""
    return {table: outcome for table, outcome in (result.get("tables") or {}).items() if outcome.get("committed")}


def event_extras(settings: Settings, result: Mapping[str, Any]) -> dict[str, dict[str, Any]]:
    """Per Asset name: the extra of its event, for each table the job committed to."""
    pipeline, namespace = str(result["pipeline"]), result.get("namespace")
    common = {
        "mode": result.get("mode"),
        "run_id": result.get("run_id"),
        "interval": result.get("interval"),
        "namespace": namespace,
    }
    return {
        asset_name(settings, pipeline, table, namespace): {
            **common,
            "rows": outcome.get("rows"),
            "version": outcome.get("version"),
        }
        for table, outcome in _committed(result).items()
    }


def written_assets(settings: Settings, result: Mapping[str, Any]) -> list[Asset]:
    """The Assets of the tables a job committed to, in the namespace it wrote (the replay alias's events)."""
    pipeline = get_pipeline(str(result["pipeline"]))
    return [table_asset(settings, pipeline, table, result.get("namespace")) for table in _committed(result)]


def annotate_events(
    outlet_events: Any, outlets: Iterable[Any], settings: Settings, result: Mapping[str, Any] | None
) -> None:
    """Give the task's asset events what its job did: an Asset outlet's event gets its table's extra; an
    alias outlet (the replay's) gets an event per table the job committed to. Without a result (a job
    that printed none) the events stay as Airflow makes them."""
    if result is None:
        return
    from airflow.sdk import Asset, AssetAlias

    extras = event_extras(settings, result)
    for outlet in outlets:
        if isinstance(outlet, AssetAlias):
            for asset in written_assets(settings, result):
                outlet_events[outlet].add(asset, extra=extras.get(asset.name, {}))
        elif isinstance(outlet, Asset) and outlet.name in extras:
            outlet_events[outlet].extra = extras[outlet.name]
