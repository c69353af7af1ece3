"""Where a run's offline W&B runs are, and the one command that uploads them.

A run with ``logger.wandb.enabled=true`` in offline mode (the default) writes
``<output_dir>/wandb/offline-run-<date>_<time>-<id>/``; ``wandb sync <that folder>`` uploads it
later from any machine with a network and a W&B login. ``sync_hint`` is the line the end of a run
logs (``sweeps.jobs.run_tracked``). Importing this module does not import wandb.
"""

from __future__ import annotations

import shlex
from pathlib import Path

OFFLINE_GLOB = "offline-run-*"


def offline_runs(output_dir: str | Path) -> list[Path]:
    """The offline W&B run folders of a run's output folder, oldest first (a resumed run has several)."""
    return sorted(p for p in (Path(output_dir) / "wandb").glob(OFFLINE_GLOB) if p.is_dir())


def sync_hint(output_dir: str | Path) -> str | None:
    """``W&B offline run: <folder>; upload it with: wandb sync <folder>`` (several folders: one
    command with a shell glob over them); None when the run wrote no offline W&B run."""
    runs = offline_runs(output_dir)
    if not runs:
        return None
    if len(runs) == 1:
        folder = runs[0].resolve()
        return f"W&B offline run: {folder}; upload it with: wandb sync {shlex.quote(str(folder))}"
    parent = (Path(output_dir) / "wandb").resolve()
    return (f"W&B offline runs: {len(runs)} in {parent}; upload them with: "
            f"wandb sync {shlex.quote(str(parent))}/{OFFLINE_GLOB}")
