"""Time you can plan with: durations in words, the run's ``progress.json``, and whether output
goes to a terminal (progress bars there, one log line per phase otherwise).

``progress.json`` (``ProgressFile``) sits in the run folder (a ``map_grid`` point or ensemble
member: in its own subfolder) and is rewritten atomically whenever the run reports progress:

- ``phase``: ``MAP training`` | ``Laplace fit`` | ``evaluation`` | ``finished``, with
  ``phase_started_unix``;
- training: ``epoch`` (epochs completed), ``max_epochs``, ``epoch_s`` (mean seconds per epoch of
  this launch);
- ``eta_s``: the estimated seconds left in the phase (absent when there is no estimate), and
  ``eta_unix`` (when the phase should end);
- ``updated_unix``, ``pid``, ``host``.

``python -m laplace_lab.sweeps.progress`` reads it for the epoch and ETA of running jobs.
``PhaseLog`` logs one line as each phase of a run starts and records the phase.
"""

from __future__ import annotations

import json
import logging
import os
import socket
import sys
import time
from pathlib import Path
from typing import Any

PROGRESS_FILE = "progress.json"
log = logging.getLogger(__name__)


def format_duration(seconds: float) -> str:
    """``0 s``, ``0.04 s``, ``4.2 s``, ``42 s``, ``3 min 05 s``, ``2 h 07 min`` (negative: ``0 s``)."""
    if seconds < 0.005:
        return "0 s"
    if seconds < 10:
        return f"{seconds:.2f} s" if seconds < 1 else f"{seconds:.1f} s"
    s = int(round(seconds))
    if s < 60:
        return f"{s} s"
    if s < 3600:
        return f"{s // 60} min {s % 60:02d} s"
    return f"{s // 3600} h {s % 3600 // 60:02d} min"


def clock_time(unix: float) -> str:
    """``14:05`` (local time) of a Unix time."""
    return time.strftime("%H:%M", time.localtime(unix))


def attached_to_terminal(stream=None) -> bool:
    """True when ``stream`` (default: stderr, where progress bars go) is a terminal."""
    stream = sys.stderr if stream is None else stream
    try:
        return bool(stream.isatty())
    except (AttributeError, ValueError):
        return False


class ProgressFile:
    """``<folder>/progress.json`` (see the module docstring); ``update`` merges fields into what the
    file holds (several writers of one run take turns: the phases, the training's epochs) and
    rewrites it."""

    def __init__(self, folder: str | Path):
        self.path = Path(folder) / PROGRESS_FILE

    def update(self, **fields: Any) -> dict[str, Any]:
        self.record = read_progress(self.path.parent) or {}
        if "phase" in fields and fields["phase"] != self.record.get("phase"):
            self.record = {k: v for k, v in self.record.items() if k in ("epoch", "max_epochs", "epoch_s")}
            fields.setdefault("phase_started_unix", time.time())
        if fields.get("eta_s") is None:
            self.record.pop("eta_s", None)
            self.record.pop("eta_unix", None)
            fields.pop("eta_s", None)
        else:
            fields["eta_unix"] = time.time() + float(fields["eta_s"])
        self.record.update(fields, updated_unix=time.time(), pid=os.getpid(), host=socket.gethostname())
        self.path.parent.mkdir(parents=True, exist_ok=True)
        tmp = self.path.with_name(f".{self.path.name}.{os.getpid()}.tmp")
        tmp.write_text(json.dumps(self.record, indent=2))
        os.replace(tmp, self.path)
        return self.record


def read_progress(folder: str | Path) -> dict[str, Any] | None:
    """The ``progress.json`` of ``folder``, or None (absent or unreadable)."""
    try:
        return json.loads((Path(folder) / PROGRESS_FILE).read_text())
    except (OSError, ValueError):
        return None


class PhaseLog:
    """The phases of one run: ``start(phase, detail)`` logs one line (with the time since the run
    started) and records the phase in the run's ``progress.json``; ``eta(seconds)`` records an
    estimate of the time the phase has left.

        Laplace fit starts, 1 min 04 s into the run: last_layer kron ggn, one pass over 55000 rows
    """

    def __init__(self, folder: str | Path | None, clock=time.monotonic):
        self.progress = ProgressFile(folder) if folder is not None else None
        self.clock, self.started = clock, clock()

    def elapsed(self) -> float:
        return self.clock() - self.started

    def start(self, phase: str, detail: str = "") -> None:
        log.info("%s starts, %s into the run%s", phase, format_duration(self.elapsed()), f": {detail}" if detail else "")
        if self.progress is not None:
            self.progress.update(phase=phase, eta_s=None)

    def eta(self, seconds: float | None) -> None:
        if self.progress is not None:
            self.progress.update(eta_s=seconds)

    def finish(self) -> None:
        log.info("Run done in %s", format_duration(self.elapsed()))
        if self.progress is not None:
            self.progress.update(phase="finished", eta_s=None)
