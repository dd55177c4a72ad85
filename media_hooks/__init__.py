"""media_hooks: webhook delivery through a PostgreSQL transactional outbox.

The delivery engine (everything outside ``media_hooks.orchestration``) imports no Dagster.
"""
