"""Numbers an operator gives (environment variables, command-line options, API values): finite,
of the right kind, inside a documented range, or one clear error naming the setting.

Every number the configuration and the command line accept goes through here, so ``nan``,
``inf``, ``-5`` and ``1e300`` get the same treatment everywhere: a value that PostgreSQL would
overflow on (an interval of 1e300 seconds) or that would silently mean "never" is refused where
it is given, not discovered later by a worker. ``Range`` says what is allowed, and the error
says it back.
"""

from __future__ import annotations

import argparse
import math
import os
from collections.abc import Callable
from dataclasses import dataclass

from media_hooks.core.errors import UserError

Number = int | float
DAY_SECONDS = 86400.0


@dataclass(frozen=True)
class Range:
    """``low`` < value (or <= with ``low_inclusive``) and value <= ``high``."""

    low: float
    high: float
    low_inclusive: bool = False
    integer: bool = False
    unit: str = ""  # e.g. "seconds", for the message

    def describe(self) -> str:
        kind = "a whole number" if self.integer else "a number"
        if self.unit:
            kind = f"{kind} of {self.unit}"
        low = plain(self.low)
        low = f"at least {low}" if self.low_inclusive else f"greater than {low}"
        return f"{kind} {low} and at most {plain(self.high)}"

    def contains(self, value: Number) -> bool:
        above = value >= self.low if self.low_inclusive else value > self.low
        return above and value <= self.high

    def problem(self, value: object, what: str) -> str | None:
        """Why ``value`` (already a number, or not) is refused as ``what``; None if allowed."""
        kind_ok = isinstance(value, int) if self.integer else isinstance(value, int | float)
        if isinstance(value, bool) or not kind_ok:
            return f"{what} must be {self.describe()}, got {value!r}"
        if not math.isfinite(value) or not self.contains(value):
            return f"{what} must be {self.describe()}, got {plain(value)}"
        return None


# Ranges used in more than one place.
SECONDS_UP_TO_A_DAY = Range(0, DAY_SECONDS, unit="seconds")
SECONDS_UP_TO_30_DAYS = Range(0, 30 * DAY_SECONDS, unit="seconds")
PORT = Range(1, 65535, low_inclusive=True, integer=True)
PORT_OR_ANY = Range(0, 65535, low_inclusive=True, integer=True)
COUNT = Range(1, 2**31 - 1, low_inclusive=True, integer=True)  # a PostgreSQL integer
FRACTION = Range(0, 1, low_inclusive=True)


def check(value: object, what: str, allowed: Range) -> Number:
    """``value`` (already a number) if it is in ``allowed``; UserError otherwise."""
    problem = allowed.problem(value, what)
    if problem is not None:
        raise UserError(problem)
    return value


def parse(raw: str, what: str, allowed: Range) -> Number:
    """The number written in ``raw`` if it is in ``allowed``; UserError otherwise."""
    text = raw.strip()
    try:
        value: Number = int(text) if allowed.integer else float(text)
    except ValueError:
        value = math.nan
    if not math.isfinite(value) or not allowed.contains(value):
        raise UserError(f"{what} must be {allowed.describe()}, got {_excerpt(raw)}")
    return value


def from_env(name: str, default: Number, allowed: Range) -> Number:
    """The variable ``name`` as a number in ``allowed``; ``default`` when unset or empty."""
    raw = os.environ.get(name)
    if raw is None or not raw.strip():
        return default
    return parse(raw, name, allowed)


def argument(allowed: Range) -> Callable[[str], Number]:
    """An argparse ``type=``: the option's value parsed, or argparse's one-line usage error."""

    def convert(raw: str) -> Number:
        try:
            return parse(raw, "the value", allowed)
        except UserError as exc:
            raise argparse.ArgumentTypeError(str(exc).removeprefix("the value ")) from None

    return convert


def plain(value: Number) -> str:
    """86400 rather than 86400.0 or 8.64e+04; other values as %g."""
    if isinstance(value, int) or (
        math.isfinite(value) and value.is_integer() and abs(value) < 1e15
    ):
        return str(int(value))
    return f"{value:g}"


def _excerpt(raw: str) -> str:
    # A value may be pasted garbage of any length: show its start only.
    return repr(raw if len(raw) <= 40 else raw[:40] + "…")
