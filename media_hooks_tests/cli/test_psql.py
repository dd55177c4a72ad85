"""Which psql `db shell` runs: fake psql programs on a PATH of the test's own say their
version, as the real one does."""

from __future__ import annotations

import pytest

from media_hooks.cli.psql import choose
from media_hooks.core.errors import RuntimeFailure
from media_hooks_tests.cli.test_db_cli import _fake_psql


def test_the_psql_on_path_serves_servers_up_to_its_own_version(tmp_path):
    on_path = _fake_psql(tmp_path / "path", 18)
    bundled = _fake_psql(tmp_path / "wheel", 18)
    for server in (15, 18):
        chosen = choose(server, search_path=str(tmp_path / "path"), bundled=bundled)
        assert (chosen.executable, chosen.major, chosen.bundled) == (on_path, 18, False)


def test_an_older_psql_on_path_gives_way_to_the_wheels(tmp_path):
    _fake_psql(tmp_path / "path", 15)
    bundled = _fake_psql(tmp_path / "wheel", 18)
    chosen = choose(18, search_path=str(tmp_path / "path"), bundled=bundled)
    assert (chosen.executable, chosen.bundled) == (bundled, True)


def test_without_the_wheels_psql_an_older_one_still_serves(tmp_path):
    on_path = _fake_psql(tmp_path / "path", 15)
    chosen = choose(18, search_path=str(tmp_path / "path"), bundled=tmp_path / "none" / "psql")
    assert chosen.executable == on_path


def test_no_psql_at_all_is_one_clear_error(tmp_path):
    with pytest.raises(RuntimeFailure, match="psql is not installed"):
        choose(18, search_path=str(tmp_path), bundled=tmp_path / "none" / "psql")
