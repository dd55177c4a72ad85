"""media_hooks benchmarks: ``python -m bench`` (see ``__main__``) and a few micro-benchmarks.

The suite (``suite``) runs one measurement module per section of the report:

- ``emit_rate`` (1), ``claim_rate`` (2), ``deliver_rate`` (3, and the job's fixed cost),
  ``publishers`` (4), ``fidelity`` (5), ``memory`` (6), ``latency`` (7);

on shared parts:

- ``session``: the size, scratch databases (``scratch``), the receiver (``fast_receiver``),
  Dagster storage, time slices and interleaved rounds;
- ``paths``: the job (``media-hooks run``), the engine and the peers (``peers``, run by
  ``run_peer``; a sensor's runs by ``launch_run``), each a measured process (``processes``);
- ``stats``: medians and ranges, ratios, steady state, the rate envelope;
- ``plots`` and ``report``: the PNGs and the Markdown, from the JSON alone.

On request only (``--only sustained``, and its own command ``python -m bench.sustained``):
``sustained`` (8), emit, delivery and retention at once for weeks' worth of deliveries
(``sustained_roles`` its processes, ``sustained_report`` its targets, plots and summary,
``sustained_history`` the deep history ``--history`` writes before a run).
``python -m bench.hot_path_prototype`` measures what a delivery writes in today's layout and in
the one docs/design/hot-path.md proposes.

Micro-benchmarks, each writing ``bench/results/<name>.json``: ``python -m bench.http_send``
(the sender against the fast receiver), ``python -m bench.rate_limits`` (permits per second),
``python -m bench.statements`` (the database's CPU per hot statement).
"""
