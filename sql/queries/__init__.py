"""The named statements (``-- name:`` blocks) the engine, the CLI and the checks run."""
