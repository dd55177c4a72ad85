"""The row protocol, as Python calls into the statements of ``sql/queries``: producers record
deliveries (``emit``), operators describe where they go (``destinations``), runs claim due
pages into the outbox (``claims``), workers lease with permits and record fenced outcomes
(``leases``) under limits kept in PostgreSQL (``rate_limits``), all scoped by a ``cohort``.
Every function runs named statements; no state is decided in Python that a statement could
decide. Imports ``core``, ``store`` and ``http`` (the SSRF guard checks a destination's URL).
"""
