"""Airflow plugin: the lake's tables, read-only SQL, audits and Data Docs inside the Airflow UI.

Thin on purpose: everything lives in :mod:`tidewater.ui` (installed with the project). Airflow loads
this file from ``[core] plugins_folder``, which tidewater's Airflow environment points here.
"""

from __future__ import annotations

from airflow.plugins_manager import AirflowPlugin

from tidewater.ui.plugin import EXTERNAL_VIEWS, FASTAPI_APPS, operator_extra_links


class TidewaterPlugin(AirflowPlugin):
    name = "tidewater"
    fastapi_apps = FASTAPI_APPS
    external_views = EXTERNAL_VIEWS
    operator_extra_links = operator_extra_links()
