"""Where a job is now, from its ``progress.json`` (``laplace_lab.io.eta``), for ``sweeps.progress``.

A job's trainings each write their own file (a ``map_grid`` point or ensemble member in its
subfolder; the job's phases in its own folder): the most recently updated one tells where the job is.
A single run (``python -m laplace_lab.train`` without ``-m``) records no ``state`` in its
``status.json``: it is finished when it holds ``metrics.json``, running while the process that
writes its ``progress.json`` is alive on this host, and cut off otherwise.
"""

from __future__ import annotations

import os
import socket
import time
from pathlib import Path

from laplace_lab.io.eta import PROGRESS_FILE, clock_time, format_duration, read_progress


def latest_progress(job_dir: Path) -> tuple[str, dict] | None:
    """(folder relative to the job, record) of the most recently updated ``progress.json`` under
    ``job_dir``, or None."""
    found = []
    for path in job_dir.glob(f"**/{PROGRESS_FILE}"):
        record = read_progress(path.parent)
        if record:
            found.append((float(record.get("updated_unix", 0.0)), str(path.parent.relative_to(job_dir)), record))
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
    text = str(p.get("phase", "?")) + ("" if where == "." else f" ({where})")
    if p.get("phase") == "MAP training" and p.get("epoch") is not None:
        text += f": epoch {p['epoch']}/{p.get('max_epochs', '?')}"
        if p.get("epoch_s") is not None:
            text += f", {format_duration(float(p['epoch_s']))} per epoch"
    if state == "running" and p.get("eta_unix") is not None:
        text += f", about {format_duration(float(p['eta_unix']) - now)} left (~{clock_time(float(p['eta_unix']))})"
    if state == "cut off" and p.get("updated_unix"):
        text = f"last progress at {clock_time(float(p['updated_unix']))}: {text}"
    return text
