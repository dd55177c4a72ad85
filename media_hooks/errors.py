"""The two kinds of failure a user sees, and how the CLI reports them."""


class UserError(Exception):
    """Bad usage or invalid input: one clear line, exit status 2, nothing written."""

    exit_code = 2


class RuntimeFailure(Exception):
    """The environment failed (database unreachable, schema missing...): exit status 1."""

    exit_code = 1


def first_line(exc: BaseException) -> str:
    """An exception as one line for a person: its type and the first line of its message."""
    text = str(exc).strip()
    return f"{type(exc).__name__}: {text.splitlines()[0]}" if text else type(exc).__name__
