"""The Dagster instance media_hooks runs on: PostgreSQL storage beside the deliveries.

With ``DAGSTER_HOME`` set, the operator owns the instance and it is used as it is. Otherwise
``$MEDIA_HOOKS_HOME/dagster`` gets the repository's ``dagster.yaml`` (``dagster-celery.yaml``
when ``MEDIA_HOOKS_CELERY_BROKER_URL`` is set: runs launched onto Celery workers), and its
storage is ``MEDIA_HOOKS_DAGSTER_STORAGE_URL`` or, by default, a database of its own on the
deliveries' server (``dagster`` on the embedded one, ``<name>_dagster`` beside a configured
one), so runs from ``media-hooks run`` and ``media-hooks dev`` share one history.
"""

from __future__ import annotations

import os
import shutil
from pathlib import Path
from urllib.parse import quote, urlencode

from dagster import DagsterInstance
from psycopg import conninfo

from media_hooks.core.config import Settings
from media_hooks.core.errors import RuntimeFailure
from media_hooks.orchestration.celery.settings import CelerySettings
from media_hooks.store import db, embedded
from media_hooks.store.db import redact

# Shipped inside the package (the repository's top-level files link here), so an installed
# wheel finds them too.
HERE = Path(__file__).resolve().parent
INSTANCE_TEMPLATE = HERE / "dagster.yaml"
CELERY_INSTANCE_TEMPLATE = HERE / "dagster-celery.yaml"
WORKSPACE = HERE / "workspace.yaml"
STORAGE_VARIABLE = "MEDIA_HOOKS_DAGSTER_STORAGE_URL"
# Dagster's storage connections a run's process keeps: one, and a few more while threads need
# them.
STORAGE_POOL_OVERFLOW = 4
STORAGE_POOL_RECYCLE_SECONDS = 3600


def as_url(libpq: str) -> str:
    """A libpq connection string (URL or key=value) as the URL SQLAlchemy (Dagster) parses."""
    params = conninfo.conninfo_to_dict(libpq)
    user = quote(params.pop("user", "") or "", safe="")
    password = params.pop("password", None)
    userinfo = f"{user}:{quote(password, safe='')}@" if password else (f"{user}@" if user else "")
    host = params.pop("host", "") or ""
    if host.startswith("/"):
        # A Unix socket folder (the embedded server) goes in the query, not the authority.
        params["host"] = host
        host = ""
    port = params.pop("port", None)
    authority = f"{host}:{port}" if host and port else host
    if port and not host:
        params["port"] = port
    dbname = quote(params.pop("dbname", "") or "", safe="")
    query = f"?{urlencode(params)}" if params else ""
    return f"postgresql://{userinfo}{authority}/{dbname}{query}"


def storage_url(settings: Settings) -> str:
    """The URL of Dagster's own database (created when it is the default one)."""
    configured = os.environ.get(STORAGE_VARIABLE)
    if configured:
        return as_url(configured)
    if settings.embedded:
        return as_url(embedded.embedded_url(settings.home, "dagster"))
    params = conninfo.conninfo_to_dict(settings.database_url)
    name = f"{params.get('dbname') or 'postgres'}_dagster"
    try:
        embedded.ensure_database(settings.database_url, name)
    except Exception as exc:
        raise RuntimeFailure(
            f"cannot create Dagster's database {name!r} on {redact(settings.database_url)} "
            f"({type(exc).__name__}); create it or set {STORAGE_VARIABLE}"
        ) from None
    return as_url(conninfo.make_conninfo(**{**params, "dbname": name}))


def prepare_home(settings: Settings) -> dict[str, str]:
    """The environment a Dagster process needs: DAGSTER_HOME and the storage URL."""
    home = os.environ.get("DAGSTER_HOME")
    if not home:
        template = CELERY_INSTANCE_TEMPLATE if CelerySettings.from_env() else INSTANCE_TEMPLATE
        if not template.exists():
            raise RuntimeFailure(f"the instance template {template} is missing")
        folder = settings.home / "dagster"
        folder.mkdir(parents=True, exist_ok=True)
        shutil.copyfile(template, folder / "dagster.yaml")
        home = str(folder)
    return {"DAGSTER_HOME": home, STORAGE_VARIABLE: storage_url(settings)}


def open_instance(settings: Settings) -> DagsterInstance:
    """The persistent instance, with this process's environment pointing at it."""
    os.environ.update(prepare_home(settings))
    return DagsterInstance.get()


def keep_storage_connections(instance: DagsterInstance, settings: Settings) -> None:
    """Has a run's process keep its connections to Dagster's storage, bounded by the
    operator role's statement timeout. Dagster's PostgreSQL storage otherwise opens a
    connection per operation (its webserver keeps them, this way): a run stores some 30
    events, and those connections were up to a second of a small run's wall time."""
    instance.optimize_for_webserver(
        statement_timeout=round(db.bounds(db.Role.OPERATOR, settings).statement_seconds * 1000),
        pool_recycle=STORAGE_POOL_RECYCLE_SECONDS,
        max_overflow=STORAGE_POOL_OVERFLOW,
    )
