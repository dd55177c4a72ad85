"""The HTTP side of a delivery: the request exactly as the contract describes it (``sender``,
``signing``), the event loop every request of a run waits on (``send_loop``), what a
receiver's answer means (``outcomes``), and the SSRF guard that judges every address before a
connection is made (``ssrf``). Knows nothing of the database. Imports only ``core``.
"""
