"""media_hooks: webhook delivery through a PostgreSQL transactional outbox.

The package is layered; a module imports only from its own folder and the layers below it
(``media_hooks_tests/test_layers.py`` fails on an import that goes up):

    cli/            the ``media-hooks`` command line
    devtools/       the test receiver, the demo and its chart: tooling, not the product
    orchestration/  the Dagster layer: definitions, jobs and ops, schedules, sensors, resources
    engine/         the delivery worker and a whole run without Dagster
    observe/        the operator's views: figures, metrics, a delivery's story, invariant checks
    outbox/maintenance/  sweeps, retention, requeue, discard: named, bounded, counted
    outbox/         the row protocol: emit, destinations, claims, leases, limits, cohorts
    http/           the HTTP side: sender, its event loop, outcome classes, signing, SSRF guard
    store/          PostgreSQL: connections by role, migrations, the embedded server, the SQL files
    core/           settings from the environment, numbers and identifiers, errors, crash points

``engine`` and ``observe`` stand side by side, as do ``http`` and ``store``: neither imports
the other. Nothing below ``orchestration`` imports Dagster. The state machine itself is SQL:
``sql/queries`` (the named statements) and ``sql/migrations`` (the schema and its functions).
"""
