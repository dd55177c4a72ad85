"""The two kinds of failure a user sees, and how the CLI reports them."""


class UserError(Exception):
    """Bad usage or invalid input: one clear line, exit status 2, nothing written."""

    exit_code = 2


class RuntimeFailure(Exception):
    """The environment failed (database unreachable, schema missing...): exit status 1."""

    exit_code = 1
