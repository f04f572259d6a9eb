"""Runs inside a subprocess that has the Airflow environment (AIRFLOW_HOME, AIRFLOW__*, TIDEWATER_*).

    python tests/airflow_runner.py integrity            import every DAG file; report errors and I/O
    python tests/airflow_runner.py test DAG_ID CONF     dag.test() with run conf (JSON); prints task states
    python tests/airflow_runner.py test DAG_ID CONF --logical-date ISO

The pytest process never imports Airflow itself, so its configuration cannot leak between tests.
The last stdout line is one JSON object.
"""

from __future__ import annotations

import datetime as dt
import importlib.util
import json
import os
import sys
from pathlib import Path


def integrity(dags_folder: Path) -> dict:
    import airflow.sdk  # noqa: F401 - imported before the audit window: not the DAG files' own I/O
    from airflow.dag_processing.dagbag import DagBag

    from tidewater.pipelines import all_pipelines

    all_pipelines()
    io_events: list[str] = []
    watching = False
    allowed = (sys.prefix, sys.base_prefix, str(Path(__file__).resolve().parents[1] / "include"), "/proc/")

    def hook(event: str, args: tuple) -> None:
        if not watching:
            return
        if event == "open" and args and isinstance(args[0], str | bytes | os.PathLike):
            path = os.fsdecode(args[0])
            if not path.startswith(allowed) and not path.endswith((".py", ".pyc")):
                io_events.append(f"open {path}")
        elif event in ("socket.connect", "subprocess.Popen", "os.system"):
            io_events.append(f"{event} {args[:2]!r}")

    sys.addaudithook(hook)
    dag_ids: dict[str, list[str]] = {}
    outlets: dict[str, dict[str, list[list[str]]]] = {}  # dag -> task -> [[kind, name, uri]]
    inlets: dict[str, dict[str, list[list[str]]]] = {}
    import_errors: dict[str, str] = {}
    for path in sorted(dags_folder.glob("*.py")):
        watching = True
        try:
            spec = importlib.util.spec_from_file_location(f"dagfile_{path.stem}", path)
            assert spec and spec.loader
            module = importlib.util.module_from_spec(spec)
            spec.loader.exec_module(module)
        except Exception as exc:
            import_errors[path.name] = f"{type(exc).__name__}: {exc}"
        finally:
            watching = False
    bag = DagBag(dag_folder=str(dags_folder))
    for dag_id, dag in bag.dags.items():
        dag_ids[dag_id] = sorted(dag.task_ids)
        for task in dag.tasks:
            for declared, found in ((task.outlets, outlets), (task.inlets, inlets)):
                if declared:
                    described = [[type(o).__name__, o.name, getattr(o, "uri", "")] for o in declared]
                    found.setdefault(dag_id, {})[task.task_id] = described
    import_errors.update({Path(k).name: v.splitlines()[-1] for k, v in bag.import_errors.items()})
    return {
        "dags": dag_ids,
        "outlets": outlets,
        "inlets": inlets,
        "import_errors": import_errors,
        "io_at_import": io_events,
    }


def run_dag_test(dags_folder: Path, dag_id: str, conf: dict, logical_date: str | None) -> dict:
    from airflow.dag_processing.dagbag import DagBag

    bag = DagBag(dag_folder=str(dags_folder))
    if dag_id not in bag.dags:
        return {"error": f"no DAG {dag_id}; import errors: {bag.import_errors}"}
    dag = bag.dags[dag_id]
    when = dt.datetime.fromisoformat(logical_date) if logical_date else None
    dag_run = dag.test(logical_date=when, run_conf=conf or None)
    instances = dag_run.get_task_instances()
    states = {ti.task_id: str(ti.state) for ti in instances}
    seconds = {ti.task_id: round(ti.duration, 1) for ti in instances if ti.duration is not None}
    return {
        "dag_run_state": str(dag_run.state),
        "run_id": dag_run.run_id,
        "task_states": states,
        "task_seconds": seconds,
        "asset_events": asset_events(dag_id, dag_run.run_id),
    }


def asset_events(dag_id: str, run_id: str) -> list[dict]:
    """The asset events the run's tasks emitted, as Airflow recorded them."""
    from airflow.models.asset import AssetEvent, AssetModel
    from airflow.utils.session import create_session

    with create_session() as session:
        rows = (
            session.query(AssetEvent, AssetModel)
            .join(AssetModel, AssetModel.id == AssetEvent.asset_id)
            .filter(AssetEvent.source_dag_id == dag_id, AssetEvent.source_run_id == run_id)
            .all()
        )
        return [
            {"asset": asset.name, "uri": asset.uri, "task_id": event.source_task_id, "extra": dict(event.extra or {})}
            for event, asset in rows
        ]


def main() -> None:
    dags_folder = Path(os.environ["AIRFLOW__CORE__DAGS_FOLDER"])
    command = sys.argv[1]
    if command == "integrity":
        result = integrity(dags_folder)
    else:
        logical = sys.argv[sys.argv.index("--logical-date") + 1] if "--logical-date" in sys.argv else None
        result = run_dag_test(dags_folder, sys.argv[2], json.loads(sys.argv[3]), logical)
    print(json.dumps(result, default=str), flush=True)


if __name__ == "__main__":
    main()
