"""Maintenance services, each named, bounded and counted (their figures are evidence), each
callable from a Dagster op, the CLI or a test: ``sweeps`` (expired leases, stale enqueues,
failed runs, the circuit breaker), ``retention`` (terminal history out, tombstones kept),
``requeue`` and ``discard`` (an operator's audited decisions). Imports ``outbox`` and below.
"""
