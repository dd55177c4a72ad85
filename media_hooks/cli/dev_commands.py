"""``media-hooks dev``: the Dagster UI and daemon on this project, on the embedded default."""

from __future__ import annotations

import argparse
import os
import signal
import socket
import subprocess
import sys
import time
from collections.abc import Callable

import psutil
import requests

from media_hooks.core import numeric
from media_hooks.core.config import Settings
from media_hooks.core.errors import RuntimeFailure, UserError, first_line
from media_hooks.http import ssrf
from media_hooks.observe.health import disabled_cause
from media_hooks.outbox import destinations
from media_hooks.store import db
from media_hooks.store.secret_store import SecretBox

STARTUP_SECONDS = 180.0
# How long runs canceled at Ctrl-C may take to hand back what they hold.
RUN_STOP_SECONDS = 30.0


def register(commands: argparse._SubParsersAction) -> None:
    dev = commands.add_parser(
        "dev", help="the Dagster UI and daemon (schedules, sensors) on this project"
    )
    dev.add_argument("--host", default="127.0.0.1", help="address the UI listens on")
    dev.add_argument(
        "--port",
        type=numeric.argument(numeric.PORT),
        default=3000,
        help="port the UI listens on",
    )
    dev.set_defaults(handler=run_dev)


def dagster_environment(settings: Settings) -> dict[str, str]:
    """This process's environment plus a ready database and a Dagster home using it."""
    from media_hooks.orchestration.instance import prepare_home

    url = db.ready_url(settings)
    return {**os.environ, **prepare_home(settings), "MEDIA_HOOKS_DATABASE_URL": url}


def start_dagster_dev(env: dict[str, str], host: str, port: int) -> subprocess.Popen:
    """``dagster dev`` (webserver + daemon) in a process group of its own."""
    from media_hooks.orchestration.instance import WORKSPACE

    # Dagster 1.13 marks `dagster dev` superseded by `dg dev` (SupersessionWarning). `dg dev -w`
    # runs this very command's implementation, but needs dagster-dg-cli and ~30 more packages
    # (dagster-cloud-cli, GitPython, cryptography, typer...) in every install. So this one
    # warning is silenced, in the `dagster dev` process only (-W is not inherited by the
    # webserver, daemon or code servers it starts); move to `dg dev` before Dagster 2.0.
    quiet = ["-W", "ignore:Function `dev_command` is superseded:FutureWarning"]
    return subprocess.Popen(
        [sys.executable, *quiet, "-m", "dagster", "dev", "-w", str(WORKSPACE)]
        + ["-h", host, "-p", str(port)],
        env=env,
        # Dagster writes scratch files to its working folder: keep them in its home.
        cwd=env.get("DAGSTER_HOME"),
        # Its own group: a background `dagster dev` ignores SIGINT, so it is stopped as a group.
        start_new_session=True,
    )


def _group_alive(group: int) -> bool:
    try:
        os.killpg(group, 0)
    except ProcessLookupError:
        return False
    return True


def _group_pids(group: int) -> set[int]:
    pids = set()
    for process in psutil.process_iter():
        try:
            if os.getpgid(process.pid) == group:
                pids.add(process.pid)
        except (ProcessLookupError, psutil.Error):
            continue
    return pids


def stop_group(
    process: subprocess.Popen,
    timeout: float = 20.0,
    on_stopped: Callable[[set[int]], None] | None = None,
) -> None:
    """Stop a process started by ``start_dagster_dev`` and everything it started.

    ``dagster dev`` alone gets SIGINT first: it stops the UI and the daemon (which finishes a
    launch under way, so no run is left "failed to start"), then asks its code servers to shut
    down once their runs end. ``on_stopped`` then gets the pids still in its process group (the
    runs' workers among them), to cancel those runs cleanly; SIGTERM and SIGKILL to the group
    are the last word. Signalling the whole group at once interrupted every process mid-step:
    tracebacks, and runs failed or left STARTED.
    """
    group = process.pid
    try:
        process.send_signal(signal.SIGINT)
        process.wait(timeout=3 * timeout)
    except subprocess.TimeoutExpired:
        pass
    if on_stopped is not None and _group_alive(group):
        on_stopped(_group_pids(group))
    for sig in (signal.SIGTERM, signal.SIGKILL):
        try:
            os.killpg(group, sig)
        except ProcessLookupError:
            break
        deadline = time.monotonic() + timeout
        while _group_alive(group) and time.monotonic() < deadline:
            time.sleep(0.1)  # processes that are not our children: nothing to wait on
        if not _group_alive(group):
            break
    if process.poll() is None:
        process.wait()


def wait_until_serving(url: str, process: subprocess.Popen, timeout: float) -> bool:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if process.poll() is not None:
            return False
        try:
            if requests.get(f"{url}/server_info", timeout=2).ok:
                return True
        except requests.RequestException:
            pass
        time.sleep(0.5)  # polling a server that is starting: there is no event to wait on
    return False


def _check_port_free(host: str, port: int) -> None:
    with socket.socket() as probe:
        try:
            probe.bind((host, port))
        except OSError:
            raise UserError(f"{host}:{port} is already in use: choose another --port") from None


def guard_notes(settings: Settings, database_url: str) -> list[str]:
    """The SSRF guard's setting, the destinations allowed private addresses, and those it
    disabled, with how to send to them again."""
    with db.connect(database_url) as conn:
        rows = destinations.list_destinations(conn)
    allowed = [r["destination_id"] for r in rows if r["allow_private_url"]]
    notes = [ssrf.describe_setting(settings.allow_private_urls, allowed)]
    for row in rows:
        if row["state"] == "disabled" and disabled_cause(row["disabled_reason"])[0] == "ssrf_guard":
            notes.append(
                f"  destination {row['destination_id']} is disabled by the SSRF guard; to send "
                f"to {row['url']} from here: `media-hooks destination add {row['destination_id']} "
                f"--url {row['url']} --allow-private-url`, then `media-hooks destination enable "
                f"{row['destination_id']}`"
            )
    return notes


def _interrupt(signum: int, frame: object) -> None:
    raise KeyboardInterrupt


def run_dev(args: argparse.Namespace) -> int:
    # A configuration mistake is reported before anything starts.
    settings = Settings.from_env()
    secrets_at_rest = SecretBox.from_env()
    # SIGTERM (and SIGINT, which a shell's background job ignores) both stop Dagster cleanly.
    signal.signal(signal.SIGTERM, _interrupt)
    signal.signal(signal.SIGINT, _interrupt)
    _check_port_free(args.host, args.port)
    env = dagster_environment(settings)
    url = f"http://{args.host}:{args.port}"
    # What every send of this deployment will be held to (the worker inherits the environment).
    for line in guard_notes(settings, env["MEDIA_HOOKS_DATABASE_URL"]):
        print(line, flush=True)
    print(secrets_at_rest.describe(), flush=True)
    print(
        f"starting the Dagster UI and daemon (DAGSTER_HOME={env['DAGSTER_HOME']}) ...", flush=True
    )
    process = start_dagster_dev(env, args.host, args.port)
    try:
        if not wait_until_serving(url, process, STARTUP_SECONDS):
            raise RuntimeFailure(f"dagster dev did not start serving {url}; see its output above")
        print(f"Dagster UI: {url}  (jobs, schedules, sensors; Ctrl-C stops it)", flush=True)
        process.wait()
    except KeyboardInterrupt:
        print("stopping Dagster ...", file=sys.stderr)
    finally:
        # A second Ctrl-C (or SIGTERM) while stopping would interrupt the stopping itself.
        signal.signal(signal.SIGINT, signal.SIG_IGN)
        signal.signal(signal.SIGTERM, signal.SIG_IGN)
        stop_group(process, on_stopped=lambda pids: cancel_runs(env, pids))
        recover_runs(env)
    return 0


def _instance(env: dict[str, str]):
    from media_hooks.orchestration.instance import open_instance

    os.environ.update(env)  # the Dagster home and database that dagster dev used
    return open_instance(Settings.from_env())


def cancel_runs(env: dict[str, str], pids: set[int]) -> None:
    """Cancels, through their launcher, the runs these processes still execute."""
    from media_hooks.orchestration import shutdown

    try:
        canceled = shutdown.cancel_runs_in(_instance(env), pids, timeout_seconds=RUN_STOP_SECONDS)
    except Exception as exc:  # Dagster's storage is gone: the next start recovers the runs
        print(f"stopping Dagster: {first_line(exc)}", file=sys.stderr)
        return
    for run in canceled:
        print(f"stopping Dagster: canceled run {run.run_id}", file=sys.stderr)


def recover_runs(env: dict[str, str]) -> None:
    """Once every process is gone: runs that did not stop are marked failed (or canceled), and
    the rows of every run that ended are released (orchestration.recovery)."""
    from media_hooks.orchestration import recovery
    from media_hooks.orchestration.jobs import deliver_webhooks

    settings = Settings.from_env()
    try:
        with db.connect(env["MEDIA_HOOKS_DATABASE_URL"], autocommit=True) as conn:
            recovered = recovery.recover(
                _instance(env),
                conn,
                deliver_webhooks.name,
                window_seconds=recovery.window_seconds(settings.enqueue_timeout_seconds),
            )
    except Exception as exc:  # the database is gone too: the next start recovers the runs
        print(
            f"stopping Dagster: runs left for the next start ({first_line(exc)})", file=sys.stderr
        )
        return
    for done in recovered:
        print(f"stopping Dagster: {done.describe()}", file=sys.stderr)
