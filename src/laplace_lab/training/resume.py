"""Resume checks: a checkpoint may only continue the run that wrote it.

``run_identity(cfg)`` is what a resumed run must share with the checkpoint's run: the seed, the
data config (name, split, sizes, ...; not where the files live) and the model config. train.py
stores it in every checkpoint (``MAPModule.on_save_checkpoint``) and ``check_resume`` compares
it before training, so resuming under another seed or data split (which could leak test data
into training) fails with the differing options named.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import torch
from omegaconf import DictConfig, OmegaConf

from laplace_lab.sweeps.run_only import RUN_ONLY_SUBKEYS
from laplace_lab.training.module import RUN_IDENTITY_KEY


def run_identity(cfg: DictConfig) -> dict[str, Any]:
    """``{"seed", "data", "model"}`` of the resolved config (``data`` less its run-only keys)."""
    data = OmegaConf.to_container(cfg.data, resolve=True)
    data = {k: v for k, v in data.items() if k not in RUN_ONLY_SUBKEYS.get("data", ())}
    return json.loads(json.dumps({"seed": cfg.seed, "data": data,
                                  "model": OmegaConf.to_container(cfg.model, resolve=True)}, default=str))


def _differences(saved: Any, current: Any, prefix: str) -> list[str]:
    if isinstance(saved, dict) and isinstance(current, dict):
        out = []
        for key in sorted(set(saved) | set(current)):
            out += _differences(saved.get(key), current.get(key), f"{prefix}.{key}" if prefix else key)
        return out
    return [] if saved == current else [f"{prefix}: checkpoint {saved!r}, this run {current!r}"]


def check_resume(cfg: DictConfig, path: str | Path) -> None:
    """Raise ``ValueError`` if the checkpoint at ``path`` was written by a run with another seed,
    data config or model config (or carries no identity to compare)."""
    checkpoint = torch.load(path, map_location="cpu", weights_only=True)
    saved = checkpoint.get(RUN_IDENTITY_KEY)
    if saved is None:
        raise ValueError(f"checkpoint.resume_from={str(path)!r} carries no run identity (seed, data, model): it "
                         "was not written by laplace_lab.train of this version, so it cannot be checked; start "
                         "the run afresh (checkpoint.resume_from=null)")
    diffs = _differences(saved, run_identity(cfg), "")
    if diffs:
        raise ValueError(f"checkpoint.resume_from={str(path)!r} was written by a different run; resuming it would "
                         f"mix runs (test data could leak into training). Differences: {'; '.join(diffs)}. "
                         "Allowed: the same seed, data and model options as the checkpoint's run")
