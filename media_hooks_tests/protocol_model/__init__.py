"""A model-based test of the row protocol against real PostgreSQL (docs/protocol-model.md).

``machine`` drives the production statements from several sessions at once (``sessions``),
``model`` holds what each delivery may be, ``invariants`` checks the tables after every step,
and ``trace`` records what every session ran, printed for a counterexample.
"""
