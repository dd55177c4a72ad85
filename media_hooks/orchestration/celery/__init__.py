"""Dagster's Celery engines, configured for media_hooks (the ``celery`` extra, issue 31).

Set ``MEDIA_HOOKS_CELERY_BROKER_URL`` and the delivery job's steps execute as Celery tasks on
``media-hooks worker`` processes (``executor``), its shards one per worker process; with the
instance ``dagster-celery.yaml`` launched runs execute as Celery tasks too, on ``media-hooks
worker --runs`` processes, watched by Dagster's run monitoring (``launcher``). Workers share
nothing but PostgreSQL and the broker. ``settings`` reads the configuration without importing
Celery; ``app`` builds the Celery application every side uses, and starts a worker.
"""
