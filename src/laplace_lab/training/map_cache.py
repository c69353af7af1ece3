"""Cache of trained MAP networks, so runs that differ only in their post-hoc Laplace reuse one
training (e.g. the methods of a paper table that share the MAP network of a seed).

The key is a hash of every config value that influences MAP training: data, model, optimizer,
lr_scheduler, trainer, seed, likelihood, prior (less ``prior.structure``, which only shapes the
Laplace's prior: training starts every tensor at ``prior.prior_precision``), sigma_noise,
temperature, prior_in_map_loss. Runs with online marglik (which changes training) are never cached.
"""

from __future__ import annotations

import hashlib
import json
import logging
from pathlib import Path

import torch
from omegaconf import DictConfig, OmegaConf

from laplace_lab.sweeps.status import RUN_ONLY_SUBKEYS
from laplace_lab.training.module import MAPModule

log = logging.getLogger(__name__)
TRAINING_KEYS = ("data", "model", "optimizer", "lr_scheduler", "trainer", "seed", "likelihood", "prior",
                 "sigma_noise", "temperature", "prior_in_map_loss")


def cache_key(cfg: DictConfig) -> str:
    """Stable hash of the training-relevant part of ``cfg``."""
    relevant = {k: OmegaConf.to_container(cfg, resolve=True).get(k) for k in TRAINING_KEYS}
    relevant["prior"] = {k: v for k, v in (relevant["prior"] or {}).items() if k != "structure"}
    relevant["trainer"] = {k: v for k, v in (relevant["trainer"] or {}).items()
                           if k not in RUN_ONLY_SUBKEYS["trainer"]}
    return hashlib.sha256(json.dumps(relevant, sort_keys=True, default=str).encode()).hexdigest()[:16]


def cache_path(cfg: DictConfig) -> Path | None:
    """Where this config's MAP network is cached, or ``None`` if caching does not apply."""
    if not cfg.map_cache.enabled or cfg.marglik.mode == "online":
        return None
    return Path(cfg.map_cache.dir) / f"{cache_key(cfg)}.pt"


def load(module: MAPModule, path: Path | None) -> bool:
    """Load the cached weights and hyperparameter buffers into ``module``; ``False`` if absent."""
    if path is None or not path.exists():
        return False
    module.load_state_dict(torch.load(path, map_location="cpu", weights_only=True))
    log.info("loaded the cached MAP network %s (training skipped)", path)
    return True


def save(module: MAPModule, path: Path | None) -> None:
    if path is None:
        return
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_suffix(".tmp")
    torch.save(module.state_dict(), tmp)
    tmp.replace(path)
