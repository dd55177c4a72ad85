"""Where a delivery run's steps execute: a choice made by configuration, never in code.

The delivery job's executor (``jobs.delivery_executor``) offers Dagster's own engines:

- ``in_process``: every step in the run's process (the local default);
- ``multiprocess``: each step in a process of its own on the run's host;
- ``celery`` (the ``celery`` extra): each step a Celery task on a ``media-hooks worker``
  (``orchestration/celery``);
- ``k8s`` (the ``k8s`` extra): each step a Kubernetes Job (dagster-k8s's ``k8s_job_executor``).

A run's config may name one (``execution: config: <choice>: {...}``). A run that names none
(the schedule's, the sensors', ``media-hooks run``'s) takes ``MEDIA_HOOKS_EXECUTOR``, or
``celery`` when ``MEDIA_HOOKS_CELERY_BROKER_URL`` is set, else ``in_process``. The row protocol,
not the executor, keeps deliveries single: every choice runs the same steps on the same rows.
"""

from __future__ import annotations

import os
from importlib.util import find_spec

from dagster import (
    Executor,
    Field,
    InitExecutorContext,
    Selector,
    multi_or_in_process_executor,
    multiple_process_executor_requirements,
)

from media_hooks.core.errors import UserError
from media_hooks.orchestration.celery import settings as celery_settings
from media_hooks.orchestration.celery.settings import CelerySettings

EXECUTOR_VARIABLE = "MEDIA_HOOKS_EXECUTOR"
CELERY = "celery"
K8S = "k8s"
_LOCAL = ("in_process", "multiprocess")


def _k8s_installed() -> bool:
    return find_spec("dagster_k8s") is not None


def default_choice() -> str:
    """The executor of a run whose config names none."""
    raw = (os.environ.get(EXECUTOR_VARIABLE) or "").strip()
    if not raw:
        raw = CELERY if CelerySettings.from_env() is not None else "in_process"
    if raw not in (*_LOCAL, CELERY, K8S):
        raise UserError(
            f"{EXECUTOR_VARIABLE} must be one of in_process, multiprocess, celery, k8s "
            f"(got {raw[:40]!r})"
        )
    if raw == CELERY:
        if CelerySettings.from_env() is None:
            raise celery_settings.missing_broker()
        celery_settings.require_extra()
    if raw == K8S and not _k8s_installed():
        raise UserError(
            f"{EXECUTOR_VARIABLE}=k8s needs dagster-k8s: pip install 'media-hooks[k8s]'"
        )
    return raw


def config_field() -> Field:
    """The executor's config: a choice of the executors installed, defaulting to
    ``default_choice()``."""
    fields = dict(multi_or_in_process_executor.config_schema.config_type.fields)
    if celery_settings.installed():
        from dagster_celery.executor import CELERY_CONFIG

        fields[CELERY] = Field(
            CELERY_CONFIG,
            is_required=False,
            description="Each step a Celery task on a `media-hooks worker` (broker: "
            "MEDIA_HOOKS_CELERY_BROKER_URL unless given here).",
        )
    if _k8s_installed():
        from dagster_k8s import k8s_job_executor

        fields[K8S] = Field(
            k8s_job_executor.config_schema.config_type,
            is_required=False,
            description="Each step a Kubernetes Job (dagster-k8s's k8s_job_executor).",
        )
    return Field(Selector(fields), default_value={default_choice(): {}})


def requirements(config: dict) -> list:
    if CELERY in config or K8S in config:
        return multiple_process_executor_requirements()
    return multi_or_in_process_executor.get_requirements(config)


def create(init_context: InitExecutorContext) -> Executor:
    """The executor the run's config chose."""
    config = init_context.executor_config
    if CELERY in config:
        from media_hooks.orchestration.celery.executor import create_executor

        return create_executor(config[CELERY])
    if K8S in config:
        from dagster_k8s import k8s_job_executor

        return k8s_job_executor.executor_creation_fn(
            InitExecutorContext(
                job=init_context.job,
                executor_def=k8s_job_executor,
                executor_config=config[K8S],
                instance=init_context.instance,
            )
        )
    return multi_or_in_process_executor.executor_creation_fn(init_context)
