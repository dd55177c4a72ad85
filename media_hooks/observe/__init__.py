"""What an operator reads: the figures (oldest due age, relay lag, expired leases, dead
letters; ``figures``), the same as Prometheus gauges (``metrics``), one delivery's story and
verdict (``inspection``), and the invariants checked on a live database (``checks``).
Read-only. Imports ``outbox``, ``store`` and ``core``.
"""
