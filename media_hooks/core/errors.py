"""The two kinds of failure a user sees, and how the CLI reports them."""


class UserError(Exception):
    """Bad usage or invalid input: one clear line, exit status 2, nothing written."""

    exit_code = 2


class RuntimeFailure(Exception):
    """The environment failed (database unreachable, schema missing...): exit status 1."""

    exit_code = 1


def first_line(exc: BaseException) -> str:
    """An exception's first line (a driver's message can run to a hint and a context), or its
    type's name when it has no text: what a one-line error shows."""
    return (str(exc).strip().splitlines() or [type(exc).__name__])[0]
