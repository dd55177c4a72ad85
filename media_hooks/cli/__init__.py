"""``media-hooks``: the command line (docs/contract.md, "Command line").

Each command is a module ``media_hooks/cli/NAME_commands.py`` whose ``register(subparsers)``
adds the command ``NAME``, found by name; a command line that names a command loads only that
module (a command starts with its own imports, not every command's). A command's handler takes
the parsed arguments and returns an exit status. User mistakes are one line on stderr and exit 2,
environment failures one line and exit 1; neither prints a stack trace.
"""

from __future__ import annotations

import argparse
import gc
import importlib
import logging
import os
import pkgutil
import sys
from collections.abc import Iterator, Sequence
from functools import cache

from media_hooks.core.errors import RuntimeFailure, UserError, first_line

_MODULE_SUFFIX = "_commands"


@cache
def _command_names() -> tuple[str, ...]:
    """Every command, by its module ``media_hooks.cli.NAME_commands``, in name order (the
    folder is listed once per process)."""
    package = importlib.import_module("media_hooks.cli")
    return tuple(
        sorted(
            m.name.removesuffix(_MODULE_SUFFIX)
            for m in pkgutil.iter_modules(package.__path__)
            if m.name.endswith(_MODULE_SUFFIX)
        )
    )


def _named_command(argv: Sequence[str]) -> str | None:
    """The command a command line names, when its first word is one (else None: the whole
    parser then answers `--help`, a misspelt command or none with every command listed)."""
    first = argv[0] if argv else None
    return first if first in _command_names() else None


class _Parser(argparse.ArgumentParser):
    """argparse, but a usage error is one line (and exit 2), not a usage dump."""

    def error(self, message: str):  # noqa: D401 - argparse's name
        raise UserError(f"{message} (see `{self.prog} --help`)")


def subcommands(parser: argparse.ArgumentParser) -> Iterator[tuple[str, argparse.ArgumentParser]]:
    """(one-line help, parser) of every command and command group below ``parser``, depth
    first."""
    for action in parser._actions:
        if isinstance(action, argparse._SubParsersAction):
            # argparse keeps each command's one-line help on a pseudo-action of its own.
            for choice in action._choices_actions:
                sub = action.choices[choice.dest]
                yield choice.help or "", sub
                yield from subcommands(sub)


def build_parser(command: str | None = None) -> argparse.ArgumentParser:
    """The parser of every command, or of ``command`` alone."""
    parser = _Parser(
        prog="media-hooks",
        description="Deliver media-pipeline webhooks to rate-limited publishers through a "
        "PostgreSQL transactional outbox, orchestrated by Dagster.",
    )
    commands = parser.add_subparsers(dest="command", required=True, parser_class=_Parser)
    for name in [command] if command else _command_names():
        importlib.import_module(f"media_hooks.cli.{name}{_MODULE_SUFFIX}").register(commands)
    # `media-hooks COMMAND --help` opens with what the command does: its one-line help, unless
    # the command gives a longer description of its own.
    for summary, sub in subcommands(parser):
        if not sub.description and summary:
            sub.description = f"{summary[0].upper()}{summary[1:]}."
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    if argv is not None:  # a program's call: its process goes on afterwards
        return _run(argv)
    code = _run(None)
    # The process ends now. Its last garbage collection would walk every object the imports
    # made (Dagster's are many): a second of `media-hooks run`'s wall time on 2 cores, for
    # nothing the exit needs.
    gc.freeze()
    return code


def _run(argv: Sequence[str] | None) -> int:
    import psycopg

    # psycopg logs what it ignores while cleaning up after a lost connection ("error ignored
    # terminating <psycopg.Copy [BAD]>"); the one line below says what failed.
    logging.getLogger("psycopg").addHandler(logging.NullHandler())
    try:
        words = sys.argv[1:] if argv is None else argv
        parser = build_parser(_named_command(words))
        args = parser.parse_args(words)
        return int(args.handler(args) or 0)
    except (UserError, RuntimeFailure) as exc:
        print(f"media-hooks: {exc}", file=sys.stderr)
        return exc.exit_code
    except psycopg.OperationalError as exc:
        # The server went away, a timeout fired, a lock was not to be had: the environment
        # failed, not the user. (Other database errors are bugs and keep their traceback.)
        print(f"media-hooks: database error: {first_line(exc)}", file=sys.stderr)
        return RuntimeFailure.exit_code
    except KeyboardInterrupt:
        print("media-hooks: interrupted", file=sys.stderr)
        return 130
    except BrokenPipeError:
        # The reader went away (`media-hooks status --json | head`): not an error of ours.
        # Point stdout at /dev/null so the interpreter's final flush does not fail again.
        os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())
        return 141
