"""Maintenance services, each named, bounded and counted (their figures are evidence), each
callable from a Dagster op, the CLI or a test: ``sweeps`` (expired leases, stale enqueues,
failed runs, the circuit breaker, the previous layout's pending deliveries moved in),
``retention`` (terminal history out, identities kept), ``partitions`` (the history's ranges,
made ahead and dropped whole), ``requeue`` and ``discard`` (an operator's audited decisions).
Imports ``outbox`` and below.
"""
