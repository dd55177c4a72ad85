"""The Dagster layer: thin ops over the delivery engine, schedules, sensors and alerts.

Everything a reader needs is listed in ``definitions.py``; the engine outside this package
imports no Dagster, so a host timer, the CLI and a schedule drive the same code.
"""
