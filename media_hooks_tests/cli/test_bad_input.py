"""Every command, every kind of bad input (issue 11, part 3): exit 2 (1 for an unreachable
database), one line on stderr naming the problem, no traceback, no secret echoed, and every
table's content unchanged.

The cases run in-process through ``media_hooks.cli.main`` (bad input is refused before anything
starts, so this stays fast); the process boundary itself (exit status, stderr of a real
process, bounded memory, a killed connection) is covered by the per-command subprocess tests.
"""

from __future__ import annotations

import base64
import os
from dataclasses import dataclass, field
from pathlib import Path

import psycopg
import pytest

from media_hooks.cli import main
from media_hooks.store.db import with_database
from media_hooks_tests.conftest import create_database, drop_database
from media_hooks_tests.factories import add_deliveries, add_destination
from media_hooks_tests.fingerprints import content_fingerprint

SECRET = "whsec_" + base64.b64encode(b"table-driven-secret-0123456789ab").decode()
PASSWORD = "hunter2-db-password"
LEAKS = ("hunter2", SECRET, "s3cr3t!value", PASSWORD)
UNREACHABLE = f"postgresql://postgres:{PASSWORD}@127.0.0.1:1/nowhere"
DEEP = "[" * 2000 + "]" * 2000
NUMBER = "9" * 5000
ADD = ["destination", "add", "pub2", "--url", "https://p.example/"]
EMIT = ["emit", "--destination", "pub", "--asset-id", "a", "--event-type", "t"]


@dataclass(frozen=True)
class Case:
    args: list[str]
    problem: str
    env: dict[str, str] = field(default_factory=dict)
    file: bytes | None = None  # written to a file whose path replaces "{file}" in args
    exit_code: int = 2
    # A status report may print what it found (to stdout) before saying what failed.
    reports: bool = False


CASES = {
    # No command, unknown command, unknown option, missing option.
    "no command": Case([], "required: command"),
    "unknown command": Case(["deliver"], "invalid choice: 'deliver'"),
    "unknown option": Case(["status", "--all"], "unrecognized arguments: --all"),
    "status: unknown grouping": Case(["status", "--by", "asset"], "invalid choice: 'asset'"),
    # db migrate
    "migrate: lock timeout nan": Case(["db", "migrate", "--lock-timeout", "nan"], "--lock-timeout"),
    "migrate: max wait inf": Case(["db", "migrate", "--max-wait", "inf"], "--max-wait"),
    "migrate: unreachable": Case(
        ["db", "migrate"], "cannot connect to PostgreSQL", {"MEDIA_HOOKS_DATABASE_URL": UNREACHABLE}, exit_code=1
    ),
    "migrate: malformed url": Case(
        ["db", "migrate"], "not a valid PostgreSQL URL", {"MEDIA_HOOKS_DATABASE_URL": "host=x port=1 what"}
    ),
    # db status, url, stop, shell
    "db status: unreachable": Case(
        ["db", "status"], "cannot connect to PostgreSQL", {"MEDIA_HOOKS_DATABASE_URL": UNREACHABLE}, exit_code=1,
        reports=True,
    ),
    "db status: unknown option": Case(["db", "status", "--all"], "unrecognized arguments: --all"),
    "db url: unknown option": Case(["db", "url", "--password"], "unrecognized arguments: --password"),
    "db url: malformed url": Case(
        ["db", "url"], "not a valid PostgreSQL URL", {"MEDIA_HOOKS_DATABASE_URL": "host=x port=1 what"}
    ),
    "db stop: configured server": Case(["db", "stop"], "only the embedded server is managed"),
    "db shell: unreachable": Case(
        ["db", "shell"], "cannot connect to PostgreSQL", {"MEDIA_HOOKS_DATABASE_URL": UNREACHABLE}, exit_code=1
    ),
    # destination add
    "add: no url": Case(["destination", "add", "pub2"], "--url"),
    "add: empty id": Case(["destination", "add", "", "--url", "https://p.example/"], "must not be empty"),
    "add: dotted id": Case(["destination", "add", "pub.2", "--url", "https://p.example/"], "'.'"),
    "add: wrong alphabet": Case(["destination", "add", "pub☃", "--url", "https://p.example/"], "contains '☃'"),
    "add: overlong id": Case(["destination", "add", "p" * 201, "--url", "https://p.example/"], "201 characters"),
    "add: ftp url": Case(["destination", "add", "pub2", "--url", "ftp://p.example/"], "http:// or https://"),
    "add: credentials": Case(["destination", "add", "pub2", "--url", "ftp://u:hunter2@p.example/"], "credentials"),
    "add: bad ipv6": Case(["destination", "add", "pub2", "--url", "http://[::1/"], "not a valid URL"),
    "add: private address": Case(
        [*ADD[:3], "--url", "http://10.1.2.3/"], "10.0.0.0/8 (private use", {"MEDIA_HOOKS_ALLOW_PRIVATE_URLS": ""}
    ),
    "add: metadata address": Case(
        [*ADD[:3], "--url", "http://100.100.100.200/latest/meta-data/"], "100.64.0.0/10",
        {"MEDIA_HOOKS_ALLOW_PRIVATE_URLS": ""},
    ),
    "add: unresolvable name": Case(
        [*ADD[:3], "--url", "https://no-such-host.invalid/"], "does not resolve",
        {"MEDIA_HOOKS_ALLOW_PRIVATE_URLS": ""},
    ),
    "add: bad secret": Case([*ADD, "--secret", "whsec_s3cr3t!value"], "whsec_<base64>"),
    "add: not a secret": Case([*ADD, "--secret", "s3cr3t!value"], "whsec_<base64>"),
    "add: rate nan": Case([*ADD, "--rate", "nan"], "rate must be a number of starts per second"),
    "add: rate inf": Case([*ADD, "--rate", "inf"], "rate must be a number of starts per second"),
    "add: rate negative": Case([*ADD, "--rate", "-1"], "rate must be a number of starts per second at least 0.001 and at most 1000000, got -1"),
    "add: burst zero": Case([*ADD, "--burst", "0"], "burst must be a whole number at least 1"),
    "add: burst not whole": Case([*ADD, "--burst", "1e3"], "invalid int value"),
    "add: timeout absurd": Case([*ADD, "--timeout", "1e308"], "timeout must be a number of seconds at least 0.1 and at most 600"),
    "add: attempts negative": Case([*ADD, "--max-attempts", "-1"], "max attempts must be a whole number at least"),
    "add: backoff nan": Case([*ADD, "--backoff-base", "nan"], "backoff base must be a number of seconds at least 0.1 and at most 86400, got nan"),
    "add: star inside a type": Case([*ADD, "--event-type", "rights*.x"], "'*' may only end a pattern"),
    "add: bare prefix star": Case([*ADD, "--event-type", ".*"], "'*' may only end a pattern"),
    "add: space in a type": Case([*ADD, "--event-type", "rights updated"], "whitespace"),
    "add: every type and more": Case([*ADD, "--event-type", "*", "--event-type", "a.b"], "cannot be combined"),
    "add: unknown ordering": Case([*ADD, "--ordering", "global"], "invalid choice: 'global'"),
    "add: unknown coalesce": Case([*ADD, "--coalesce", "event"], "invalid choice: 'event'"),
    "add: cap below base": Case([*ADD, "--backoff-base", "9", "--backoff-cap", "3"], "backoff cap"),
    "add: bad secret key": Case(
        [*ADD, "--secret", SECRET], "MEDIA_HOOKS_SECRET_KEY: key 1 of 1 is not a Fernet key",
        {"MEDIA_HOOKS_SECRET_KEY": "hunter2"},
    ),
    # destination list / enable / disable
    "list: unknown option": Case(["destination", "list", "--secrets"], "unrecognized arguments"),
    "enable: no id": Case(["destination", "enable"], "required: ID"),
    "enable: unknown": Case(["destination", "enable", "nope"], "no destination 'nope'"),
    "disable: no reason": Case(["destination", "disable", "pub"], "--reason"),
    "disable: blank reason": Case(["destination", "disable", "pub", "--reason", "  "], "needs a reason"),
    "disable: unknown": Case(["destination", "disable", "nope", "--reason", "x"], "no destination 'nope'"),
    # emit
    "emit: missing fields": Case(["emit", "--destination", "pub"], "emit needs --asset-id"),
    "emit: not json": Case([*EMIT, "--payload", "{nope"], "--payload is not valid JSON"),
    "emit: array": Case([*EMIT, "--payload", "[1, 2]"], "payload must be a JSON object, got an array"),
    "emit: null": Case([*EMIT, "--payload", "null"], "got null"),
    "emit: long number": Case([*EMIT, "--payload", '{"n": ' + NUMBER + "}"], "more than 4300 digits"),
    "emit: deep": Case([*EMIT, "--payload", '{"d": ' + DEEP + "}"], "nested too deeply"),
    "emit: NUL": Case([*EMIT, "--payload", '{"a": "\\u0000"}'], "NUL character"),
    "emit: NaN": Case([*EMIT, "--payload", '{"a": NaN}'], "NaN or Infinity"),
    "emit: dotted id": Case([*EMIT, "--payload", "{}", "--delivery-id", "a.b"], "'.'"),
    "emit: empty id": Case([*EMIT, "--payload", "{}", "--delivery-id", ""], "delivery_id must not be empty"),
    "emit: overlong id": Case([*EMIT, "--payload", "{}", "--delivery-id", "k" * 201], "201 characters"),
    "emit: unknown destination": Case(
        ["emit", "--destination", "nope", "--asset-id", "a", "--event-type", "t", "--payload", "{}"],
        "unknown destination 'nope'",
    ),
    "emit: overlong asset": Case(
        ["emit", "--destination", "pub", "--asset-id", "a" * 2000, "--event-type", "t", "--payload", "{}"],
        "asset_id is 2000 characters long",
    ),
    "emit: overlong type": Case(
        ["emit", "--destination", "pub", "--asset-id", "a", "--event-type", "t" * 300, "--payload", "{}"],
        "event_type is 300 characters long",
    ),
    "emit: event id and destination": Case(
        [*EMIT, "--payload", "{}", "--event-id", "e1"], "--event-id goes to every subscribed destination"
    ),
    "emit: event missing fields": Case(["emit", "--event-id", "e1", "--asset-id", "a"], "emit needs --event-type, --payload"),
    "emit: dotted event id": Case(
        ["emit", "--event-id", "e.1", "--asset-id", "a", "--event-type", "t", "--payload", "{}"], "'.'"
    ),
    "emit: event line with destination": Case(
        ["emit", "--file", "{file}"], "line 1: field 'destination_id' does not go with event_id",
        file=b'{"event_id": "e1", "destination_id": "pub", "asset_id": "a", "event_type": "t", "payload": {}}\n',
    ),
    "emit: event reused in a file": Case(
        ["emit", "--file", "{file}"], "line 2: event_id 'e1' is already used by line 1",
        file=b'{"event_id": "e1", "asset_id": "a", "event_type": "t", "payload": {}}\n'
        b'{"event_id": "e1", "asset_id": "b", "event_type": "t", "payload": {}}\n',
    ),
    "discard: no reason": Case(["discard", "d-1", "--reason", " "], "needs a reason"),
    "discard: dotted id": Case(["discard", "d.1", "--reason", "obsolete"], "'.'"),
    "discard: unknown delivery": Case(["discard", "nope", "--reason", "obsolete"], "no delivery 'nope'"),
    "emit: no such file": Case(["emit", "--file", "/nonexistent/events.jsonl"], "cannot read"),
    "emit: a folder": Case(["emit", "--file", "/tmp"], "cannot read /tmp"),
    "emit: empty file": Case(["emit", "--file", "{file}"], "is empty", file=b""),
    "emit: binary file": Case(["emit", "--file", "{file}"], "line 1: not UTF-8 text", file=b"\x89PNG\r\n\x1a\n\xff"),
    "emit: NUL bytes": Case(["emit", "--file", "{file}"], "line 1: not valid JSON", file=b"\x00" * 64 + b"\n"),
    "emit: file and options": Case(["emit", "--file", "{file}", "--destination", "pub"], "drop --destination", file=b"{}\n"),
    "emit: conflicting duplicate": Case(
        ["emit", "--file", "{file}"], "line 2: delivery_id 'k' is already used by line 1",
        file=b'{"destination_id": "pub", "asset_id": "a", "event_type": "t", "payload": {}, "delivery_id": "k"}\n'
        b'{"destination_id": "pub", "asset_id": "b", "event_type": "t", "payload": {}, "delivery_id": "k"}\n',
    ),
    "emit: unreachable": Case(
        [*EMIT, "--payload", "{}"], "cannot connect to PostgreSQL", {"MEDIA_HOOKS_DATABASE_URL": UNREACHABLE}, exit_code=1
    ),
    # run
    "run: max seconds nan": Case(["run", "--until-idle", "--max-seconds", "nan"], "--max-seconds"),
    "run: max seconds negative": Case(["run", "--max-seconds", "-5"], "--max-seconds"),
    "run: page size zero": Case(["run", "--page-size", "0"], "--page-size"),
    "run: page size absurd": Case(["run", "--page-size", "100000000"], "at most 10000"),
    "run: max rows text": Case(["run", "--max-rows", "many"], "--max-rows"),
    "run: shards setting zero": Case(["run"], "MEDIA_HOOKS_SHARDS", {"MEDIA_HOOKS_SHARDS": "0"}),
    "run: lease nan": Case(["run"], "MEDIA_HOOKS_LEASE_SECONDS must be", {"MEDIA_HOOKS_LEASE_SECONDS": "nan"}),
    "run: lease absurd": Case(["run"], "at most 86400", {"MEDIA_HOOKS_LEASE_SECONDS": "1e300"}),
    "run: enqueue timeout inf": Case(
        ["run"], "MEDIA_HOOKS_ENQUEUE_TIMEOUT_SECONDS", {"MEDIA_HOOKS_ENQUEUE_TIMEOUT_SECONDS": "inf"}
    ),
    "run: breaker attempts fraction": Case(
        ["run"], "MEDIA_HOOKS_BREAKER_MIN_ATTEMPTS", {"MEDIA_HOOKS_BREAKER_MIN_ATTEMPTS": "2.5"}
    ),
    "run: delivery cpu": Case(["run"], "MEDIA_HOOKS_DELIVERY_CPU", {"MEDIA_HOOKS_DELIVERY_CPU": "fastest"}),
    "run: secret key": Case(["run"], "MEDIA_HOOKS_SECRET_KEY", {"MEDIA_HOOKS_SECRET_KEY": "hunter2,x"}),
    # status / inspect / metrics
    "status: private urls yes": Case(
        ["status"], "MEDIA_HOOKS_ALLOW_PRIVATE_URLS must be 1", {"MEDIA_HOOKS_ALLOW_PRIVATE_URLS": "yes"}
    ),
    "status: unreachable": Case(
        ["status"], "cannot connect", {"MEDIA_HOOKS_DATABASE_URL": UNREACHABLE}, exit_code=1
    ),
    "inspect: no id": Case(["inspect"], "required: DELIVERY_ID"),
    "inspect: unknown": Case(["inspect", "nope"], "no delivery 'nope'"),
    "inspect: wrong alphabet": Case(["inspect", "a b"], "contains ' '"),
    "inspect: overlong": Case(["inspect", "k" * 5000], "5000 characters long"),
    "metrics: no port": Case(["metrics"], "required: --port"),
    "metrics: port": Case(["metrics", "--port", "-1"], "--port: must be a whole number"),
    # requeue
    "requeue: no reason": Case(["requeue"], "--reason"),
    "requeue: bad date": Case(["requeue", "--reason", "x", "--since", "yesterday"], "--since must be an ISO"),
    "requeue: bad month": Case(["requeue", "--reason", "x", "--until", "2024-13-01"], "--until must be"),
    "requeue: reversed": Case(
        ["requeue", "--reason", "x", "--since", "2024-02-01", "--until", "2024-01-01"], "--since must be before"
    ),
    "requeue: dotted destination": Case(["requeue", "--reason", "x", "--destination", "a.b"], "'.'"),
    "requeue: bad state": Case(["requeue", "--reason", "x", "--state", "lost"], "lost"),
    "requeue: blank reason": Case(["requeue", "--reason", " "], "reason"),
    # receiver / demo / dev
    "receiver: fail rate": Case(["receiver", "--fail-rate", "2"], "--fail-rate"),
    "receiver: delay nan": Case(["receiver", "--delay", "nan"], "--delay"),
    "receiver: tolerance inf": Case(["receiver", "--tolerance", "inf"], "--tolerance"),
    "receiver: bad secret": Case(["receiver", "--secret", "whsec_###hunter2###"], "webhook secret"),
    "demo: unknown option": Case(["demo", "--fast"], "unrecognized arguments"),
    "demo: lease inf": Case(["demo"], "MEDIA_HOOKS_LEASE_SECONDS", {"MEDIA_HOOKS_LEASE_SECONDS": "inf"}),
    "dev: port zero": Case(["dev", "--port", "0"], "--port: must be a whole number at least 1"),
    "dev: private urls": Case(["dev"], "MEDIA_HOOKS_ALLOW_PRIVATE_URLS", {"MEDIA_HOOKS_ALLOW_PRIVATE_URLS": "true"}),
    # check
    "check: window nan": Case(["check", "--window", "nan"], "--window"),
    "check: negative lease margin": Case(["check", "--lease-margin", "-1"], "--lease-margin: must be"),
    "check: unreachable": Case(
        ["check"], "cannot connect to PostgreSQL", {"MEDIA_HOOKS_DATABASE_URL": UNREACHABLE}, exit_code=1
    ),
    # secrets
    "secrets: no subcommand": Case(["secrets"], "required: secrets_command"),
    "secrets: generate-key unknown option": Case(
        ["secrets", "generate-key", "--bits", "128"], "unrecognized arguments: --bits"
    ),
    "secrets: rekey without key": Case(["secrets", "rekey"], "MEDIA_HOOKS_SECRET_KEY is not set"),
    "secrets: status bad key": Case(["secrets", "status"], "not a Fernet key", {"MEDIA_HOOKS_SECRET_KEY": "x" * 44}),
    # worker (its broker's exit statuses: media_hooks_tests/orchestration/celery)
    "worker: concurrency zero": Case(["worker", "--concurrency", "0"], "--concurrency: must be a whole number at least 1"),
    "worker: no broker": Case(["worker"], "MEDIA_HOOKS_CELERY_BROKER_URL is not set"),
    "worker: broker not a URL": Case(
        ["worker"], "MEDIA_HOOKS_CELERY_BROKER_URL must be a broker URL", {"MEDIA_HOOKS_CELERY_BROKER_URL": f"guest:{PASSWORD}@mq:5672"}
    ),
}  # fmt: skip


@pytest.fixture(scope="module")
def seeded(server_url, template_name):
    """One database with a little of everything, shared by every case (none may change it)."""
    name = create_database(server_url, template=template_name)
    url = with_database(server_url, name)
    with psycopg.connect(url, autocommit=True) as conn:
        add_destination(conn, "pub", "https://p.example/", secrets=[SECRET])
        add_deliveries(conn, "pub", 3)
        add_deliveries(conn, "pub", 2, state="dead")
    yield url
    drop_database(server_url, name)


@pytest.fixture
def env(seeded, monkeypatch, tmp_path):
    for variable in [v for v in os.environ if v.startswith("MEDIA_HOOKS_")]:
        monkeypatch.delenv(variable)
    monkeypatch.setenv("MEDIA_HOOKS_DATABASE_URL", seeded)
    monkeypatch.setenv("MEDIA_HOOKS_HOME", str(tmp_path / "home"))
    monkeypatch.setenv("MEDIA_HOOKS_ALLOW_PRIVATE_URLS", "1")
    return monkeypatch


def _args(case: Case, tmp_path: Path) -> list[str]:
    if case.file is None:
        return case.args
    path = tmp_path / "events.jsonl"
    path.write_bytes(case.file)
    return [str(path) if arg == "{file}" else arg for arg in case.args]


@pytest.mark.parametrize("name", list(CASES))
def test_bad_input_is_one_line_and_writes_nothing(name, env, seeded, tmp_path, capsys):
    case = CASES[name]
    for variable, value in case.env.items():
        env.setenv(variable, value)
    with psycopg.connect(seeded) as conn:
        before = content_fingerprint(conn)
    status = main(_args(case, tmp_path))
    out, err = capsys.readouterr()
    assert status == case.exit_code, (out, err)
    lines = err.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("media-hooks: "), err
    assert case.problem in lines[0], lines[0]
    assert case.reports or out == ""
    for leak in LEAKS:
        assert leak not in err and leak not in out, f"{name} echoed a secret"
    with psycopg.connect(seeded) as conn:
        assert content_fingerprint(conn) == before, f"{name} wrote to the database"


def test_every_command_has_a_case():
    from media_hooks.cli import build_parser

    def leaves(parser, prefix: tuple[str, ...]) -> set[tuple[str, ...]]:
        if parser._subparsers is None:
            return {prefix}
        choices = parser._subparsers._group_actions[0].choices
        return {leaf for name, sub in choices.items() for leaf in leaves(sub, (*prefix, name))}

    commands = leaves(build_parser(), ())
    covered = {tuple(case.args[: len(leaf)]) for leaf in commands for case in CASES.values()}
    assert commands <= covered, f"no bad-input case for {sorted(commands - covered)}"
