"""Resuming from checkpoints: which checkpoint a run resumes, and that it may.

``checkpoint.resume_from`` is null (start afresh), a ``.ckpt`` path, or ``last``: the run's own
``last.ckpt`` (``<checkpoint.dirpath or the run dir/checkpoints>/last.ckpt``; for ``map_grid``
each grid point's own) when it exists, else a fresh start. With ``checkpoint.enabled=true`` a
multirun job cut off mid-training (a session's end, a killed process) then continues from its
last saved epoch when the same launch command runs again (``resume_path``).

A path starts a new run from the checkpoint: it must share the seed, data and model
(``run_identity``); other options (more epochs, another learning rate) may change. ``last``
continues the same run: the checkpoint must also carry this run's config hash (less run-only
keys) and code hash (``run_fingerprint``), so a resumed run is one config on one version of the
code, and the commit its job records describes all of its training.

``run_identity(run)`` is what a resumed run must share with the checkpoint's run: the seed, the
data config (name, split, sizes, ...; not where the files live) and the model config. train.py
stores it in every checkpoint (``MAPModule.on_save_checkpoint``) and ``check_resume`` compares
it before training, so resuming under another seed or data split (which could leak test data
into training) fails with the differing options named.
"""

from __future__ import annotations

import json
import logging
from pathlib import Path
from typing import Any

import torch

from laplace_lab.config.schema import RunConfig
from laplace_lab.sweeps.run_only import RUN_ONLY_SUBKEYS
from laplace_lab.sweeps.status import config_fingerprint
from laplace_lab.training.map_cache import code_fingerprint
from laplace_lab.training.module import RUN_FINGERPRINT_KEY, RUN_IDENTITY_KEY

log = logging.getLogger(__name__)
LAST = "last"  # checkpoint.resume_from=last: the run's own last.ckpt, if any


def checkpoint_dir(run: RunConfig, output_dir: Path) -> Path:
    """Where the run at ``output_dir`` writes its checkpoints."""
    return Path(run.checkpoint.dirpath) if run.checkpoint.dirpath else Path(output_dir) / "checkpoints"


def resume_path(run: RunConfig, output_dir: Path) -> str | None:
    """The checkpoint the run at ``output_dir`` resumes (None: it starts afresh); see the module doc."""
    resume = run.checkpoint.resume_from
    if not resume:
        return None
    if resume != LAST:
        return str(resume)
    path = checkpoint_dir(run, output_dir) / "last.ckpt"
    if not path.exists():
        log.info("checkpoint.resume_from=last: no %s yet, training from the start", path)
        return None
    log.info("checkpoint.resume_from=last: resuming from %s", path)
    return str(path)


def run_identity(run: RunConfig) -> dict[str, Any]:
    """``{"seed", "data", "model"}`` of the resolved config (``data`` less its run-only keys)."""
    data = {k: v for k, v in run.data.items() if k not in RUN_ONLY_SUBKEYS.get("data", ())}
    return json.loads(json.dumps({"seed": run.seed, "data": data, "model": run.model}, default=str))


def run_fingerprint(run: RunConfig) -> dict[str, Any]:
    """``{"config", "code"}``: the config hash less run-only keys and the package's code hash."""
    code = {k: str(v) for k, v in code_fingerprint().items()}  # plain str: torch.__version__ is a str subclass
    return {"config": config_fingerprint(run.raw), "code": code}


def _differences(saved: Any, current: Any, prefix: str) -> list[str]:
    if isinstance(saved, dict) and isinstance(current, dict):
        out = []
        for key in sorted(set(saved) | set(current)):
            out += _differences(saved.get(key), current.get(key), f"{prefix}.{key}" if prefix else key)
        return out
    return [] if saved == current else [f"{prefix}: checkpoint {saved!r}, this run {current!r}"]


def check_resume(run: RunConfig, path: str | Path) -> None:
    """Raise ``ValueError`` if the checkpoint at ``path`` was written by a run with another seed,
    data config or model config (or carries no identity to compare); with
    ``checkpoint.resume_from=last`` also if it was written by another config or code."""
    try:
        checkpoint = torch.load(path, map_location="cpu", weights_only=True)
    except Exception as err:  # noqa: BLE001 - e.g. a file cut off by a killed process
        raise ValueError(f"checkpoint {str(path)!r} cannot be read ({type(err).__name__}: {err}); delete it to "
                         "start the run afresh") from err
    if run.checkpoint.resume_from == LAST:
        saved, current = checkpoint.get(RUN_FINGERPRINT_KEY), run_fingerprint(run)
        if saved != current:
            raise ValueError(
                f"checkpoint.resume_from=last: {str(path)!r} was written by {'another config or code' if saved else 'a run that recorded no config and code hashes'} "
                f"(saved {saved}, this run {current}); continuing it would make one run of two. Allowed: the "
                "same config and code as the launch that wrote it. Delete the checkpoint (or set "
                "checkpoint.resume_from=null) to start afresh, or pass its path to start a new run from it")
    saved = checkpoint.get(RUN_IDENTITY_KEY)
    if saved is None:
        raise ValueError(f"checkpoint.resume_from={str(path)!r} carries no run identity (seed, data, model): it "
                         "was not written by laplace_lab.train of this version, so it cannot be checked; start "
                         "the run afresh (checkpoint.resume_from=null)")
    diffs = _differences(saved, run_identity(run), "")
    if diffs:
        raise ValueError(f"checkpoint.resume_from={str(path)!r} was written by a different run; resuming it would "
                         f"mix runs (test data could leak into training). Differences: {'; '.join(diffs)}. "
                         "Allowed: the same seed, data and model options as the checkpoint's run")
