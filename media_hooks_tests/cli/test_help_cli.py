"""Every command explains itself: each command and option has a help line, and `--help` opens
with what the command does."""

from __future__ import annotations

import argparse

import pytest

from media_hooks.cli import build_parser, subcommands
from media_hooks_tests.conftest import run_cli


def _every_parser() -> list[argparse.ArgumentParser]:
    root = build_parser()
    return [root, *(parser for _, parser in subcommands(root))]


def test_the_walk_reaches_every_command_of_every_group():
    progs = {parser.prog for parser in _every_parser()}
    assert {
        "media-hooks db migrate",
        "media-hooks db status",
        "media-hooks destination add",
        "media-hooks run",
        "media-hooks demo",
    } <= progs


@pytest.mark.parametrize("parser", _every_parser(), ids=lambda p: p.prog)
def test_every_argument_and_option_has_a_help_line(parser):
    missing = [
        "/".join(action.option_strings) or action.dest
        for action in parser._actions
        if not isinstance(action, argparse._SubParsersAction)
        and (action.help is None or not action.help.strip())
    ]
    assert not missing, f"{parser.prog}: no help for {missing}"


@pytest.mark.parametrize("parser", _every_parser(), ids=lambda p: p.prog)
def test_every_command_has_a_one_line_help_and_a_description(parser):
    assert parser.description and parser.description.strip(), parser.prog
    for summary, sub in subcommands(parser):
        assert summary.strip(), f"{sub.prog} has no one-line help in `{parser.prog} --help`"


def test_demo_help_says_what_it_does_as_a_real_process():
    result = run_cli("demo", "--help", env={})
    assert result.returncode == 0, result.stderr
    description = result.stdout.split("\n\n")[1]
    assert "receiver" in description and "request_rate.png" in description
