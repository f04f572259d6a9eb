"""Authentication of every route of the plugin app, by Airflow's own JWT check.

Airflow mounts plugin FastAPI apps with ``app.mount()``; the core API's router-level auth does not
reach them and no middleware authenticates them, so an unprotected plugin route is public. Rather
than re-implementing JWT validation, :func:`require_reader` depends on Airflow's ``get_user``
(``GetUserDep``), which accepts the token exactly the way the Airflow UI and API clients send it:

* ``Authorization: Bearer <jwt>`` (REST clients, ``POST /auth/token``) - wins when present;
* the ``_token`` cookie the login page sets (a browser, including pages opened in the UI's iframe).

No token: 401; an invalid or forged token: 403; expired: 401 (all raised by Airflow). An authenticated
user must also be allowed the custom view :data:`RESOURCE_NAME` by the configured auth manager (with
SimpleAuthManager: any role from viewer up; with FAB it is a permission admins grant).

Imports Airflow's API-server modules: import this only inside the api-server (see tidewater.ui.plugin).
"""

from __future__ import annotations

from typing import Annotated

from airflow.api_fastapi.app import get_auth_manager
from airflow.api_fastapi.auth.managers.models.base_user import BaseUser
from airflow.api_fastapi.core_api.security import GetUserDep
from fastapi import Depends, HTTPException, Request, status

RESOURCE_NAME = "Tidewater"


def require_reader(user: GetUserDep) -> BaseUser:
    """The signed-in user, if the auth manager lets them read the lake pages; else 403."""
    if not get_auth_manager().is_authorized_custom_view(method="GET", resource_name=RESOURCE_NAME, user=user):
        raise HTTPException(status.HTTP_403_FORBIDDEN, f"user may not read {RESOURCE_NAME} pages")
    return user


ReaderDep = Annotated[BaseUser, Depends(require_reader)]


def may_trigger(user: BaseUser, dag_id: str) -> bool:
    """Whether the auth manager lets ``user`` create runs of ``dag_id`` (the streams page's buttons)."""
    from airflow.api_fastapi.auth.managers.models.resource_details import DagAccessEntity, DagDetails

    return get_auth_manager().is_authorized_dag(
        method="POST", access_entity=DagAccessEntity.RUN, details=DagDetails(id=dag_id), user=user
    )


def login_url(request: Request) -> str:
    """Airflow's login page, coming back to the requested page afterwards."""
    try:
        return get_auth_manager().get_url_login(next_url=str(request.url))
    except Exception:  # an auth manager without a login page
        return ""
