"""PostgreSQL: connections by role with bounded timeouts (``db``), the migrations and the
named statements of ``sql/`` (``sqlfiles``, ``migrations``), the embedded server that is the
default (``embedded``), signing secrets at rest (``secret_store``), who is connected
(``sessions``), and what ``media-hooks db status`` reports. Imports only ``core``.
"""
