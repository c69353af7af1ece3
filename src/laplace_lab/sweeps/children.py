"""Stop means stop: a launch that is stopped stops the worker processes it started, and waits for them.

A multirun under a launcher that runs its jobs in other processes (``submitit_local``: a controller
process per job and the job's task process; Ray: its local cluster and workers) used to exit on
SIGTERM and release the sweep lock while its workers ran on, so an immediate relaunch ran the same
jobs a second time beside them. ``stop_descendants(signum)`` sends the signal to every process
below this one, deepest first (read from ``/proc``: Linux; elsewhere none are found and a warning says so), waits
up to ``wait_s`` seconds for them to end (a job marks itself ``interrupted`` in that time:
``sweeps.jobs``), then kills what is left with SIGKILL, so that nothing of the launch runs once it
has released its lock. ``SweepSummary`` calls it before it writes the summary and releases the lock.
"""

from __future__ import annotations

import contextlib
import logging
import os
import signal
import time
from pathlib import Path

log = logging.getLogger(__name__)
STOP_WAIT_S = 120.0  # how long the workers (the deepest processes) get to mark their jobs and exit
PARENT_WAIT_S = 10.0  # how long each level above them gets after its signal
PROC = Path("/proc")


def _stat(pid: int) -> tuple[str, int] | None:
    """(state, parent pid) of ``pid`` from ``/proc/<pid>/stat``; None when it is gone."""
    try:
        text = (PROC / str(pid) / "stat").read_text()
    except OSError:
        return None
    fields = text[text.rindex(")") + 2:].split()  # after "pid (comm) ": state, ppid, ...
    return fields[0], int(fields[1])


def descendants(pid: int | None = None) -> list[int]:
    """Every living process below ``pid`` (default: this one), parents before their children."""
    return [child for level in _levels(pid) for child in level]


def _levels(pid: int | None = None) -> list[list[int]]:
    """The processes below ``pid`` by depth: its children, their children, ..."""
    root = os.getpid() if pid is None else pid
    if not PROC.is_dir():
        log.warning("No /proc here: the processes this launch started cannot be listed, nor stopped")
        return []
    children: dict[int, list[int]] = {}
    for entry in PROC.iterdir():
        if entry.name.isdigit() and (stat := _stat(int(entry.name))) is not None and stat[0] != "Z":
            children.setdefault(stat[1], []).append(int(entry.name))
    levels, level = [], [root]
    while level := sorted(child for parent in level for child in children.get(parent, [])):
        levels.append(level)
    return levels


def alive(pid: int) -> bool:
    """Whether ``pid`` still runs (a zombie does not; a child of this process is reaped here)."""
    with contextlib.suppress(ChildProcessError, OSError):
        if os.waitpid(pid, os.WNOHANG)[0] == pid:
            return False
    stat = _stat(pid)
    return stat is not None and stat[0] != "Z"


def command_line(pid: int) -> list[str]:
    """The arguments ``pid`` was started with (``/proc/<pid>/cmdline``); [] when it is gone."""
    try:
        return [a for a in (PROC / str(pid) / "cmdline").read_bytes().decode(errors="replace").split("\0") if a]
    except OSError:
        return []


def signal_and_wait(pids: list[int], signum: int, wait_s: float, poll_s: float = 0.2) -> list[int]:
    """Send ``signum`` to ``pids`` and wait up to ``wait_s`` s for them to end; returns those still running."""
    for pid in pids:
        with contextlib.suppress(ProcessLookupError, PermissionError):
            os.kill(pid, signum)
    deadline = time.monotonic() + wait_s
    while any(alive(p) for p in pids) and time.monotonic() < deadline:
        time.sleep(poll_s)
    return [p for p in pids if alive(p)]


def stop_descendants(signum: int, wait_s: float = STOP_WAIT_S, poll_s: float = 0.2) -> list[int]:
    """Send ``signum`` to every process below this one, deepest first (a worker marks its job before
    the process that started it, e.g. Ray's raylet, goes away): the deepest get up to ``wait_s`` s to
    end, each level above ``PARENT_WAIT_S``; SIGKILL the rest; returns the pids it signalled."""
    levels = _levels()
    pids = [pid for level in levels for pid in level]
    if not pids:
        return []
    name = signal.Signals(signum).name
    log.warning("Forwarding %s to the %d process(es) this launch started (%s) and waiting up to %g s for them to "
                "end before the sweep folder is released", name, len(pids), ", ".join(map(str, pids)), wait_s)
    for depth, level in enumerate(reversed(levels)):
        signal_and_wait(level, signum, wait_s if depth == 0 else min(PARENT_WAIT_S, wait_s), poll_s)
    running = [p for p in pids if alive(p)]
    deadline = time.monotonic()
    for pid in running:
        with contextlib.suppress(ProcessLookupError, PermissionError):
            os.kill(pid, signal.SIGKILL)
    if running:
        log.error("Killed (SIGKILL) %d process(es) still running %g s after %s: %s; their jobs stay unfinished",
                  len(running), wait_s, name, ", ".join(map(str, running)))
        for pid in running:
            while alive(pid) and time.monotonic() < deadline + 5:
                time.sleep(poll_s)
    return pids
