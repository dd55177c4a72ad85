"""The delivery engine: a worker per destination that claims pages, takes permits, leases,
sends on the run's event loop and records outcomes (``delivery``), and a whole run without
Dagster (``delivery_run``), which a host timer, a test or the benchmark can drive. Imports
``outbox`` (and its maintenance), ``http``, ``store`` and ``core``; no Dagster.
"""
