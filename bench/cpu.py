"""Where a run's CPU went: the whole machine, the database server, the receiver, the rest.

On a machine of two cores the server, the receiver and the delivering process share the CPUs,
so a run's deliveries/s is bound by their CPU per delivery together. Each is read before and
after the run; the differences are the run's:

- the machine: every CPU's busy time (user, nice, system, interrupts; not idle, I/O wait or
  time stolen by the hypervisor), whatever ran: nothing else should run during a benchmark;
- the server, when it runs on this machine: the postmaster's own time, the time of the backends
  and workers it has reaped (an exited backend's time moves to its parent), and that of the
  children still running. A server elsewhere (``MEDIA_HOOKS_DATABASE_URL`` on another host)
  gives no figure: a backend's process id means nothing here. The postmaster is recognised by
  its start time, so a local process that merely has the remote backend's number is not
  mistaken for it;
- the receiver: its own account (``GET /stats``);
- the delivering side (the engine, the job with Dagster's processes, a peer): the machine's
  less the server's and the receiver's; the harness's own sampling is in it, a small part;
- the measured process itself: the CPU time of the harness's children reaped during the run
  (the measured processes, and whatever they reaped of their own). Unlike the delivering
  side's figure, another load on the machine does not add to it.
"""

from __future__ import annotations

import resource
from dataclasses import dataclass

import psutil
import psycopg

from bench.fast_receiver import receiver_cpu_seconds

METRICS = {
    "machine_cpu_ms_per_delivery": "machine CPU per delivery, ms",
    "client_cpu_ms_per_delivery": "the path's own CPU per delivery, ms",
    "server_cpu_ms_per_delivery": "the server's CPU per delivery, ms",
}
PROCESS_METRICS = {
    "process_cpu_ms_per_delivery": "the measured process tree's own CPU per delivery, ms",
}
# The server's start time as PostgreSQL and the operating system see it may differ by clock
# granularity and the time the postmaster takes to record it.
START_TOLERANCE_SECONDS = 5.0


def postmaster(url: str) -> psutil.Process | None:
    """The server's postmaster process, if it runs on this machine."""
    with psycopg.connect(url) as conn:
        pid, started = conn.execute(
            "SELECT pg_backend_pid(), extract(epoch FROM pg_postmaster_start_time())"
        ).fetchone()
        try:
            # While connected: the backend ends with the connection.
            parent = psutil.Process(pid).parent()
        except psutil.Error:
            return None
    try:
        if parent is None or abs(parent.create_time() - float(started)) > START_TOLERANCE_SECONDS:
            return None
    except psutil.Error:
        return None
    return parent


def cpu_seconds(server: psutil.Process | None) -> float | None:
    """CPU seconds (user + system) the server has used so far, reaped children included."""
    if server is None:
        return None
    try:
        own = server.cpu_times()
        total = own.user + own.system + own.children_user + own.children_system
        children = server.children()
    except psutil.Error:
        return None
    for child in children:
        try:
            times = child.cpu_times()
        except psutil.Error:
            continue  # it exited meanwhile: its time is counted at the next reading
        total += times.user + times.system
    return total


def machine_busy_seconds() -> float:
    """Every CPU's busy time so far (the fields Linux has; others have fewer)."""
    times = psutil.cpu_times()
    return sum(getattr(times, name, 0.0) for name in ("user", "nice", "system", "irq", "softirq"))


def reaped_children_seconds() -> float:
    """CPU seconds (user + system) of this process's children reaped so far."""
    used = resource.getrusage(resource.RUSAGE_CHILDREN)
    return used.ru_utime + used.ru_stime


@dataclass(frozen=True)
class Reading:
    machine: float
    server: float | None
    receiver: float
    children: float


def read(server: psutil.Process | None, receiver: str) -> Reading:
    return Reading(
        machine_busy_seconds(),
        cpu_seconds(server),
        receiver_cpu_seconds(receiver),
        reaped_children_seconds(),
    )


def spent(before: Reading, after: Reading) -> dict[str, float | None]:
    """CPU seconds of the run between two readings: the machine's, the server's (None when it
    is not on this machine), the receiver's, the delivering side's (the rest) and the measured
    processes' own (the children reaped meanwhile)."""
    server = None if before.server is None or after.server is None else after.server - before.server
    machine = after.machine - before.machine
    receiver = after.receiver - before.receiver
    return {
        "machine": machine,
        "server": server,
        "receiver": receiver,
        "client": None if server is None else max(machine - server - receiver, 0.0),
        "process": after.children - before.children,
    }
