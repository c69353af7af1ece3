"""One launch at a time per sweep folder (and one single run per run folder): ``<folder>/.lock``.

``acquire`` takes an exclusive ``flock`` on the file and writes the holder (pid, host, launch id,
start time, command) into it; a second launch into the folder gets ``SweepLocked`` naming the
holder and the folder (after waiting up to ``wait_s`` seconds for it). The kernel drops the lock
when the holding process exits, however it ends (``kill -9`` included), so a lock never goes
stale; the file itself stays, holding the last holder's line. (On network file systems ``flock``
relies on the NFS lock service, which NFSv4 provides.)
"""

from __future__ import annotations

import fcntl
import json
import logging
import os
import time
from pathlib import Path
from typing import Any

log = logging.getLogger(__name__)
LOCK_FILE = ".lock"


class SweepLocked(RuntimeError):
    """Another launch holds the sweep folder."""


def _holder(path: Path) -> dict[str, Any]:
    for _ in range(20):  # the holder writes its line right after locking
        try:
            text = path.read_text().strip()
            if text:
                return json.loads(text)
        except (OSError, ValueError):
            pass
        time.sleep(0.05)
    return {}


def describe(holder: dict[str, Any]) -> str:
    """``pid <pid> on host <host> (launch <id>, started <time>: <command>)``."""
    get = holder.get
    return (f"pid {get('pid', '?')} on host {get('host', '?')} (launch {get('launch_id', '?')}, "
            f"started {get('started', '?')}: {get('command', '?')})")


SWEEP_ADVICE = ("Wait until it ends and run the command again (finished jobs are skipped), or set "
                "hydra.callbacks.sweep_summary.lock_wait_s=<seconds> to wait")
RUN_ADVICE = ("Two runs in one folder would overwrite each other's files: give this run its own folder "
              "(hydra.run.dir=...), or wait until that run ends")


def acquire(sweep_dir: str | Path, holder: dict[str, Any], wait_s: float = 0.0, poll_s: float = 1.0,
            what: str = "sweep folder", advice: str = SWEEP_ADVICE) -> int:
    """Lock ``sweep_dir`` for this launch; returns the lock's file descriptor (``release`` it).

    Raises ``SweepLocked`` when another process still holds it after ``wait_s`` seconds (the message
    calls the folder ``what`` and ends with ``advice``; a single run's folder: ``RUN_ADVICE``)."""
    sweep_dir = Path(sweep_dir)
    sweep_dir.mkdir(parents=True, exist_ok=True)
    path = sweep_dir / LOCK_FILE
    fd = os.open(path, os.O_RDWR | os.O_CREAT, 0o644)
    deadline = time.monotonic() + max(float(wait_s), 0.0)
    waiting = False
    while True:
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
            break
        except BlockingIOError:
            if time.monotonic() >= deadline:
                os.close(fd)
                waited = f" after waiting {wait_s:g} s" if wait_s else ""
                raise SweepLocked(
                    f"{what} {sweep_dir} is in use by another launch{waited}: {describe(_holder(path))}. "
                    f"{advice}; the lock ({path}) is released when that process exits.") from None
            if not waiting:
                log.info("Waiting up to %g s for %s %s, in use by %s", wait_s, what, sweep_dir,
                         describe(_holder(path)))
                waiting = True
            time.sleep(poll_s)
    os.ftruncate(fd, 0)
    os.write(fd, (json.dumps(holder, default=str) + "\n").encode())
    os.fsync(fd)
    return fd


def release(fd: int | None) -> None:
    """Drop the lock taken by ``acquire`` (the file stays, with the last holder's line)."""
    if fd is None:
        return
    try:
        fcntl.flock(fd, fcntl.LOCK_UN)
    finally:
        os.close(fd)
