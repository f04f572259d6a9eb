"""``tidewater_replay``: recompute a pipeline's silver and gold for a time range, on demand.

Params: pipeline, time range, optional entity filter, source (``kafka`` by event time while the
topic still retains it, or ``bronze``) and target (a ``sandbox`` namespace, or the ``live`` tables).
They are validated, together with what the source still holds, before any Spark job starts. A
sandbox replay writes only its own namespace; a live replay holds each table's lock from reading
its input to its commit, so it never interleaves with the running stream's commits.
"""

from __future__ import annotations

import datetime as dt

from airflow.sdk import DAG, Param, task

from tidewater.config import NAMESPACE_PATTERN
from tidewater.orchestration import tasks
from tidewater.orchestration.assets import replay_alias
from tidewater.orchestration.operators import TidewaterAuditOperator, TidewaterSparkJobOperator
from tidewater.pipelines import all_pipelines

PIPELINES = sorted(all_pipelines())

with DAG(
    dag_id="tidewater_replay",
    description="Replay a time range of a pipeline from Kafka or bronze into a sandbox or the live tables",
    schedule=None,
    start_date=dt.datetime(2026, 1, 1, tzinfo=dt.UTC),
    catchup=False,
    is_paused_upon_creation=False,
    params={
        "pipeline": Param(PIPELINES[0] if PIPELINES else "", enum=PIPELINES),
        "start": Param("", type="string", description="ISO-8601 event time, inclusive (UTC if no offset)"),
        "end": Param("", type="string", description="ISO-8601 event time, exclusive"),
        "entities": Param([], type="array", description="only these entity ids (e.g. venue ids); empty: all"),
        "source": Param("bronze", enum=["bronze", "kafka"]),
        "target": Param("sandbox", enum=["sandbox", "live"]),
        "sandbox_namespace": Param("sandbox", type="string", pattern=f"^{NAMESPACE_PATTERN}$"),
    },
    default_args={"retries": 0},
    tags=["tidewater", "replay"],
    doc_md=__doc__,
):

    @task(task_id="validate", multiple_outputs=True)
    def validate(params: dict | None = None, run_id: str | None = None) -> dict[str, list[str]]:
        assert params is not None and run_id is not None
        return tasks.replay_plan(params, run_id, dag_id="tidewater_replay")

    planned = validate()
    # Its tables' namespace is a param: each run adds the Assets it wrote to the alias.
    replay = TidewaterSparkJobOperator(
        task_id="replay", job="batch", job_args=planned["replay"], outlets=[replay_alias()]
    )
    replay >> TidewaterAuditOperator(task_id="audit", job_args=planned["audit"])
