"""The Celery deployment's settings, from the environment (no Celery import: the base install
reads them too, to say that the ``celery`` extra is missing)."""

from __future__ import annotations

import os
import re
import sys
from dataclasses import dataclass
from importlib.util import find_spec
from typing import Any
from urllib.parse import urlsplit, urlunsplit

from media_hooks.core.errors import UserError

BROKER_VARIABLE = "MEDIA_HOOKS_CELERY_BROKER_URL"
QUEUE_VARIABLE = "MEDIA_HOOKS_CELERY_QUEUE"
DEFAULT_QUEUE = "media_hooks"
# kombu's transports a deployment of this project would use (RabbitMQ, Redis, SQS).
_SCHEMES = {"amqp", "amqps", "pyamqp", "redis", "rediss", "sqs"}
# The Celery worker whose process executes a run, recorded on the run (jobs.py) for the
# launcher's health check (launcher.py).
NODE_TAG = "media_hooks/celery_worker"
_QUEUE_NAME = re.compile(r"^[A-Za-z0-9_.-]{1,100}$")


def shown(url: str) -> str:
    """A broker URL without its password, for every message and log line."""
    parts = urlsplit(url)
    if parts.password is None:
        return url
    host = parts.hostname or ""
    if ":" in host:
        host = f"[{host}]"
    user = f"{parts.username}@" if parts.username else ""
    port = f":{parts.port}" if parts.port else ""
    return urlunsplit((parts.scheme, f"{user}{host}{port}", parts.path, parts.query, ""))


@dataclass(frozen=True)
class CelerySettings:
    broker_url: str
    # Every queue of the deployment starts with it: two deployments (or test sessions) on one
    # broker never take each other's tasks.
    queue_prefix: str = DEFAULT_QUEUE

    @property
    def steps_queue(self) -> str:
        return f"{self.queue_prefix}_steps"

    @property
    def runs_queue(self) -> str:
        return f"{self.queue_prefix}_runs"

    @property
    def shown_broker(self) -> str:
        return shown(self.broker_url)

    @classmethod
    def from_env(cls) -> CelerySettings | None:
        """The settings, or None when no broker is configured (the local default)."""
        url = (os.environ.get(BROKER_VARIABLE) or "").strip()
        if not url:
            return None
        try:
            scheme = urlsplit(url).scheme
            urlsplit(url).port  # noqa: B018 - raises on a port that is not a number
        except ValueError:
            scheme = ""
        if scheme not in _SCHEMES or "://" not in url:
            # Not echoed: a malformed URL may hold its password anywhere.
            raise UserError(
                f"{BROKER_VARIABLE} must be a broker URL such as "
                f"amqp://user:password@host:5672// (schemes: {', '.join(sorted(_SCHEMES))})"
            )
        prefix = (os.environ.get(QUEUE_VARIABLE) or DEFAULT_QUEUE).strip()
        if not _QUEUE_NAME.match(prefix):
            raise UserError(
                f"{QUEUE_VARIABLE} must be 1-100 letters, digits, '_', '.' or '-' "
                f"(got {prefix[:40]!r})"
            )
        return cls(broker_url=url, queue_prefix=prefix)

    @classmethod
    def required(cls) -> CelerySettings:
        """The settings where Celery is the point (a worker, the Celery launcher)."""
        settings = cls.from_env()
        if settings is None:
            raise missing_broker()
        require_extra()
        return settings


def missing_broker() -> UserError:
    return UserError(
        f"{BROKER_VARIABLE} is not set: Celery workers, the Celery executor and the Celery "
        "launcher need the broker's URL (e.g. amqp://guest:guest@127.0.0.1:5672//)"
    )


def installed() -> bool:
    return find_spec("dagster_celery") is not None


def require_extra() -> None:
    if not installed():
        raise UserError(
            f"{BROKER_VARIABLE} is set, but dagster-celery is not installed: "
            "pip install 'media-hooks[celery]'"
        )


def current_task() -> Any | None:
    """The Celery task this thread executes, or None (Celery not even imported: none)."""
    celery = sys.modules.get("celery")
    if celery is None:
        return None
    task = celery.current_task
    return task if task and task.request.id else None


def node_tag() -> dict[str, str]:
    """The tag naming this process's Celery worker, when it executes a Celery task."""
    task = current_task()
    return {NODE_TAG: task.request.hostname} if task is not None else {}
