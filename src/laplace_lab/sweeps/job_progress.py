"""Where a job is now, from its ``progress.json`` (``laplace_lab.io.eta``), for ``sweeps.progress``.

A job's trainings each write their own file (a ``map_grid`` point or ensemble member in its
subfolder; the job's phases in its own folder): the most recently updated one tells where the job is.
A single run (``python -m laplace_lab.train`` without ``-m``) records no ``state`` in its
``status.json``: it is finished when it holds ``metrics.json``, running while the process that
writes its ``progress.json`` is alive on this host, and cut off otherwise.
"""

from __future__ import annotations

import math
import os
import socket
import time
from pathlib import Path

from laplace_lab.io.eta import PROGRESS_FILE, clock_time, format_duration, read_progress


def number(record: dict, key: str) -> float | None:
    """``record[key]`` as a finite float; None when absent or malformed (a bad field is left out,
    the rest of the record is still shown)."""
    value = record.get(key)
    if isinstance(value, bool):
        return None
    try:
        value = float(value)
    except (TypeError, ValueError):
        return None
    return value if math.isfinite(value) else None


def _clock(unix: float) -> str:
    try:
        return clock_time(unix)
    except (OverflowError, OSError, ValueError):  # a time no clock shows
        return "?"


def latest_progress(job_dir: Path) -> tuple[str, dict] | None:
    """(folder relative to the job, record) of the most recently updated ``progress.json`` under
    ``job_dir``, or None; a file that is not a JSON object is skipped."""
    found = []
    for path in job_dir.glob(f"**/{PROGRESS_FILE}"):
        record = read_progress(path.parent)
        if record and isinstance(record, dict):
            found.append((number(record, "updated_unix") or 0.0, str(path.parent.relative_to(job_dir)), record))
    if not found:
        return None
    _, where, record = max(found, key=lambda item: item[0])
    return where, record


def job_dirs(root: Path, status_file: str) -> list[Path]:
    """The job folders under ``root``: those holding ``status_file``, and those holding a
    ``progress.json`` (a single run writes its ``status.json`` only once trained); a folder inside
    another one (a ``map_grid`` point, an ensemble member) is part of that job."""
    found = {p.parent for p in root.glob(f"**/{status_file}")} | {p.parent for p in root.glob(f"**/{PROGRESS_FILE}")}
    return sorted(d for d in found if not any(parent in found for parent in d.parents))


def single_run_state(job_dir: Path) -> str:
    """``finished`` | ``running`` | ``cut off`` of a folder whose ``status.json`` has no ``state``
    (or that has none yet)."""
    if (job_dir / "metrics.json").is_file():
        return "finished"
    found = latest_progress(job_dir)
    record = found[1] if found else {}
    if record.get("host") == socket.gethostname() and record.get("pid"):
        try:
            os.kill(int(record["pid"]), 0)
            return "running"
        except (OSError, ValueError):
            pass
    return "cut off"


def progress_text(job_dir: Path, state: str, now: float | None = None) -> str:
    """``MAP training (grid_0.1): epoch 12/100, 58 s per epoch, about 1 h 25 min left (~14:02)`` for
    a running job; ``last progress at 13:05: MAP training: epoch 12/100, ...`` for a cut-off one;
    "" without a ``progress.json``."""
    found = latest_progress(job_dir)
    if found is None:
        return ""
    where, p = found
    now = time.time() if now is None else now
    phase = p.get("phase") if isinstance(p.get("phase"), str) else "?"
    text = phase + ("" if where == "." else f" ({where})")
    epoch, total, epoch_s = number(p, "epoch"), number(p, "max_epochs"), number(p, "epoch_s")
    if phase == "MAP training" and epoch is not None:
        text += f": epoch {epoch:.0f}/{'?' if total is None else f'{total:.0f}'}"
        if epoch_s is not None:
            text += f", {format_duration(epoch_s)} per epoch"
    eta, updated = number(p, "eta_unix"), number(p, "updated_unix")
    if state == "running" and eta is not None:
        text += f", about {format_duration(eta - now)} left (~{_clock(eta)})"
    if state == "cut off" and updated:
        text = f"last progress at {_clock(updated)}: {text}"
    return text
