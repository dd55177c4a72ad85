"""``media-hooks worker``: a Celery worker of the deployment (the ``celery`` extra).

One command starts one worker, in the foreground, with its own home folder
(``MEDIA_HOOKS_HOME``): it shares nothing with the other workers but PostgreSQL
(``MEDIA_HOOKS_DATABASE_URL``) and the broker (``MEDIA_HOOKS_CELERY_BROKER_URL``), as on
separate hosts. By default it executes the delivery job's steps (each shard of a run one task);
with ``--runs`` it executes launched runs instead (the instance ``dagster-celery.yaml``). A
worker never serves both: a run waiting for its steps must never hold the process a step needs.
Stop it with SIGTERM or Ctrl-C (it finishes the task in hand); a worker killed mid-step loses
nothing: its task goes back to the queue, to another worker.
"""

from __future__ import annotations

import argparse
import os

from media_hooks.core import numeric
from media_hooks.core.config import Settings
from media_hooks.core.errors import UserError
from media_hooks.store import db
from media_hooks.store.secret_store import SecretBox

CONCURRENCY = numeric.Range(1, 256, low_inclusive=True, integer=True)
LOG_LEVELS = ("debug", "info", "warning", "error")


def register(commands: argparse._SubParsersAction) -> None:
    worker = commands.add_parser(
        "worker",
        help="a Celery worker: executes delivery steps (or, with --runs, launched runs) sent "
        "through MEDIA_HOOKS_CELERY_BROKER_URL, until stopped",
    )
    worker.add_argument(
        "--runs",
        action="store_true",
        help="execute launched runs (CeleryRunLauncher, dagster-celery.yaml) instead of steps",
    )
    worker.add_argument(
        "--concurrency",
        type=numeric.argument(CONCURRENCY),
        default=1,
        metavar="N",
        help="processes, each executing one task at a time (default 1; a run's default number "
        "of shards is the processes of every steps worker)",
    )
    worker.add_argument(
        "--name",
        metavar="NAME",
        help="the worker's node name (default media_hooks_steps_<pid>@<host>; Celery expands %%h to the host)",
    )
    worker.add_argument(
        "--loglevel", choices=LOG_LEVELS, default="info", help="the worker's log level"
    )
    worker.set_defaults(handler=run_worker)


def run_worker(args: argparse.Namespace) -> int:
    settings = Settings.from_env()
    SecretBox.from_env()  # a malformed key is refused here, not by every step
    # Dagster and Celery load only for a configuration that can work: usage errors stay fast.
    from media_hooks.orchestration.celery.settings import CelerySettings

    celery = CelerySettings.required()
    if settings.embedded:
        raise UserError(
            "a worker needs MEDIA_HOOKS_DATABASE_URL: workers share one PostgreSQL, and the "
            "embedded server is one folder's own"
        )
    url = db.ready_url(settings)
    from media_hooks.orchestration.celery import app as celery_app
    from media_hooks.orchestration.instance import prepare_home

    os.environ.update(prepare_home(settings))
    os.environ["MEDIA_HOOKS_DATABASE_URL"] = url
    app = celery_app.make(celery)
    celery_app.check_broker(app, celery)
    name = args.name or celery_app.default_name(args.runs)
    queue = celery.runs_queue if args.runs else celery.steps_queue
    print(
        f"worker {name}: {queue} on {celery.shown_broker}, {args.concurrency} process(es), "
        f"DAGSTER_HOME={os.environ['DAGSTER_HOME']}",
        flush=True,
    )
    celery_app.run_worker(
        app, celery, runs=args.runs, concurrency=args.concurrency, name=name, loglevel=args.loglevel
    )
    return 0
