"""The jobs' ops: a few lines each over the engine and the maintenance services, reporting what
they did as metadata. Imports the engine, the row protocol and the other Dagster modules."""
