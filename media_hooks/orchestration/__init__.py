"""The Dagster layer: thin ops over the delivery engine, schedules, sensors and alerts.

Everything a reader needs is listed in ``definitions.py``. The only layer below the command
line and the dev tools that imports Dagster: the engine, the row protocol and the operator's
views run the same without it, so a host timer, the CLI and a schedule drive the same code.
May import every layer below it.
"""
