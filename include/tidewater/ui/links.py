"""Operator extra link from an audit task to the Data Docs its run produced.

Airflow 3 computes operator links on the worker when the task finishes and keeps the URL in XCom
(the api-server shows it as a button on the task instance), so :class:`AuditReportLink` must be
pure: it builds the by-run URL from the task instance key. The by-run page finds the audit rows of
that DAG run and redirects to their report, so the link works before and after the report exists.
"""

from __future__ import annotations

from typing import Any
from urllib.parse import urlencode

from airflow.sdk import BaseOperatorLink

from tidewater.ui import URL_PREFIX

BY_RUN_PATH = f"{URL_PREFIX}/reports/by-run"


def by_run_url(dag_id: str, run_id: str, task_id: str = "", *, base_url: str = "") -> str:
    """The by-run page of one DAG run (narrowed to one task's report when given); absolute when
    Airflow's ``[api] base_url`` is known."""
    params = {"dag_id": dag_id, "run_id": run_id, **({"task_id": task_id} if task_id else {})}
    return f"{base_url.rstrip('/')}{BY_RUN_PATH}?{urlencode(params)}"


def _base_url() -> str:
    try:
        from airflow.configuration import conf

        return conf.get("api", "base_url", fallback="") or ""
    except Exception:  # no Airflow configuration in this process: a root-relative URL still works
        return ""


class AuditReportLink(BaseOperatorLink):
    """The "Data quality report" button of an audit task instance."""

    name = "Data quality report"

    def get_link(self, operator: Any, *, ti_key: Any) -> str:
        return by_run_url(ti_key.dag_id, ti_key.run_id, getattr(ti_key, "task_id", ""), base_url=_base_url())
