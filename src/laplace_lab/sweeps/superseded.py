"""What an earlier attempt of a job leaves that must not stand beside the rerun's outputs.

A job killed mid-run (or failed) and run again by the next launch would keep the earlier
attempt's wandb offline run beside the new one in ``<job>/wandb/``: ``wandb sync
<job>/wandb/offline-run-*`` would then upload two runs for one job. ``set_aside_earlier_runs``
moves them to ``<job>/superseded/<time>/wandb/`` before the rerun starts (kept, not deleted, and
out of the ``wandb/offline-run-*`` glob).
"""

from __future__ import annotations

import logging
import os
import time
import uuid
from pathlib import Path

log = logging.getLogger(__name__)
SUPERSEDED_DIR = "superseded"
WANDB_RUN_GLOBS = ("offline-run-*", "run-*", "latest-run")


def set_aside_earlier_runs(job_dir: str | Path) -> list[Path]:
    """Move the wandb runs of earlier attempts out of ``<job>/wandb``; returns their new paths."""
    wandb_dir = Path(job_dir) / "wandb"
    found = sorted({p for pattern in WANDB_RUN_GLOBS for p in wandb_dir.glob(pattern)}) if wandb_dir.is_dir() else []
    if not found:
        return []
    dest = Path(job_dir) / SUPERSEDED_DIR / f"{time.strftime('%Y%m%d-%H%M%S')}-{uuid.uuid4().hex[:6]}" / "wandb"
    dest.mkdir(parents=True)
    moved = []
    for path in found:
        os.replace(path, dest / path.name)
        moved.append(dest / path.name)
    log.warning("%s: the wandb run(s) of an earlier attempt of this job (%s) moved to %s, so that only this "
                "attempt's run is synced", job_dir, ", ".join(p.name for p in found), dest)
    return moved
