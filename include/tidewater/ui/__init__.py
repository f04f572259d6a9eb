"""The lake in the Airflow UI: tables, read-only SQL, audits and Data Docs reports.

An Airflow 3 plugin (``plugins/tidewater_plugin.py``) mounts the FastAPI app of :mod:`tidewater.ui.app`
under :data:`URL_PREFIX` in Airflow's api-server and adds nav entries for it. Airflow does not
authenticate plugin apps, so every route of this app depends on Airflow's own JWT check (see
:mod:`tidewater.ui.auth`). Pure helpers (paths, formatting, HTML) are kept apart from lake I/O so
they can be tested without a server.
"""

from __future__ import annotations

URL_PREFIX = "/tidewater"
