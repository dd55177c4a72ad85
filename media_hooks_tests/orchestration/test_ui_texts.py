"""What the Dagster UI shows of this project, beyond the jobs: every help text (jobs, ops,
config fields, resources, sensors, schedules, assets and their checks) names only files a
reader of the repository finds, and the instance opens on the UI itself, with no dialog over
it."""

from __future__ import annotations

import re
from collections.abc import Iterator

from dagster import DagsterInstance

from media_hooks.orchestration import instance as instance_module
from media_hooks.orchestration.definitions import defs
from media_hooks_tests.conftest import REPO

# A file a text points to: a path ending in one of the repository's own kinds of file.
CITED_FILE = re.compile(r"[\w./-]+\.(?:md|py|sql|yaml|toml)\b")


def _config_texts(config_type, where: str) -> Iterator[tuple[str, str]]:
    if config_type is None:
        return
    if getattr(config_type, "description", None):
        yield where, config_type.description
    for name, field in (getattr(config_type, "fields", None) or {}).items():
        if field.description:
            yield f"{where}.{name}", field.description
        yield from _config_texts(field.config_type, f"{where}.{name}")
    for inner in ("inner_type", "scalar_type", "non_scalar_type"):
        yield from _config_texts(getattr(config_type, inner, None), where)


def ui_texts() -> Iterator[tuple[str, str]]:
    """(where, text) for every description the UI can show of these definitions."""
    repo = defs.get_repository_def()
    for job in repo.get_all_jobs():
        yield job.name, job.description or ""
        for node in job.graph.node_defs:
            yield f"{job.name}/{node.name}", node.description or ""
        yield from _config_texts(job.run_config_schema.config_type, job.name)
    for sensor in repo.sensor_defs:
        yield sensor.name, sensor.description or ""
    for schedule in repo.schedule_defs:
        yield schedule.name, schedule.description or ""
    for key, resource in repo.get_top_level_resources().items():
        yield key, resource.description or ""
    graph = repo.asset_graph
    for key in graph.get_all_asset_keys():
        yield key.to_user_string(), graph.get(key).description or ""
    for check in graph.asset_check_keys:
        yield check.to_user_string(), graph.get(check).description or ""


def test_every_help_text_points_only_inside_the_repository():
    texts = list(ui_texts())
    assert len(texts) > 100  # the walk reaches the config fields, not only the jobs
    outside = [
        (where, cited)
        for where, text in texts
        for cited in CITED_FILE.findall(text)
        if not (REPO / cited).exists()
    ]
    assert outside == []


def test_the_instance_shows_no_community_dialog(tmp_path, dagster_storage_url, monkeypatch):
    home = tmp_path / "dagster"
    home.mkdir()
    (home / "dagster.yaml").write_text(instance_module.INSTANCE_TEMPLATE.read_text())
    monkeypatch.setenv(instance_module.STORAGE_VARIABLE, dagster_storage_url)
    with DagsterInstance.from_config(str(home)) as instance:
        assert instance.nux_enabled is False
