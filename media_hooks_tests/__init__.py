"""The tests, one folder per layer of the package (``core/`` ... ``cli/``), each against real
PostgreSQL (``conftest.py``: a fresh migrated database per test) and real HTTP on 127.0.0.1.
The modules here are shared helpers: table data (``factories``), two sessions interleaved at
an exact statement (``interleaving``), a prepared operator's database (``operator_data``), a
TCP proxy that cuts connections (``outage``). Tests may import anything of the package.
"""
