"""The state machine in SQL: ``migrations/`` (the schema and its functions, ordered, released
files never edited), ``queries/`` (every statement that moves a delivery, by name, with the
invariant it keeps) and ``schema.sql`` (the schema as the migrations leave it, generated).
Read by ``media_hooks.store.sqlfiles``; imports nothing."""
