"""A finished online-marglik job's final Laplace, rebuilt from its folder (for analyses after the run).

The job must have run with ``method=online_kron`` (or any ``marglik=online`` method with early
stopping) and ``checkpoint.enabled=true``: its ``checkpoints/last.ckpt`` holds the online-marglik
callback's best-marglik weights and prior precisions, the state the run's final Laplace was fitted
at. ``final_laplace`` fits that Laplace again exactly as the run did (``fit_posthoc_laplace`` on
the same training rows), so its metrics are the run's ``laplace/...`` metrics.

A job folder may come from elsewhere (restored records, a shared disk): its config's ``_target_``
values are checked against ``config.targets`` before anything is built, and the checkpoint is read
with ``weights_only=True`` (tensors and plain containers only; no pickle payload runs).
"""

from __future__ import annotations

from pathlib import Path

import torch

from laplace_lab.config.load import load_run_config, replaced
from laplace_lab.config.schema import RunConfig
from laplace_lab.config.targets import check_targets
from laplace_lab.data.base import LabDataModule
from laplace_lab.laplace import Laplace
from laplace_lab.training.loops import PLAIN
from laplace_lab.training.module import MAPCore


def best_state(job: Path) -> dict:
    """The online-marglik callback's best-marglik state in ``<job>/checkpoints/last.ckpt``:
    ``{"model": state_dict, "prior_precision": tensor, ...}``."""
    path = Path(job) / "checkpoints" / "last.ckpt"
    if not path.is_file():
        raise FileNotFoundError(f"{path} not found: the job must have run with checkpoint.enabled=true")
    try:
        checkpoint = torch.load(path, map_location="cpu", weights_only=True)
    except Exception as err:  # noqa: BLE001 - cut off, or holds more than tensors and plain containers
        raise ValueError(f"{path} cannot be read as a checkpoint of laplace_lab.train with weights_only=True "
                         f"({type(err).__name__}: {err})") from err
    states = [v for k, v in checkpoint.get("callbacks", {}).items() if "OnlineMarglik" in k]
    if not states or states[0].get("best_state") is None:
        raise ValueError(f"{path} holds no online-marglik best state (a marglik=online method with early stopping)")
    return states[0]["best_state"]


def load_job(job: Path, data_dir: str | None = None) -> tuple[RunConfig, LabDataModule, MAPCore]:
    """The job's resolved config, its data module (set up for fit) and its module at the best state
    (eval mode). ``data_dir`` replaces the job's ``paths.data_dir`` and ``data.data_dir`` (a job run on
    another machine)."""
    from omegaconf import OmegaConf  # (the job's resolved config: a yaml file)

    from laplace_lab.training.build import build  # (imports Hydra): only when called

    path = Path(job) / "config_resolved.yaml"
    cfg = OmegaConf.load(path)
    check_targets(cfg, where=str(path))  # a config is code: only the allowlist's classes are built
    run = load_run_config(cfg)
    if data_dir:  # the saved config is resolved: data.data_dir holds the old path too
        run = replaced(run, {"paths.data_dir": data_dir} | ({"data.data_dir": data_dir} if "data_dir" in run.data else {}))
    datamodule, module = build(run, PLAIN)
    datamodule.setup("fit")
    state = best_state(job)
    module.model.load_state_dict(state["model"])
    module.set_prior_precision(state["prior_precision"])
    module.eval()
    return run, datamodule, module


def final_laplace(job: Path, data_dir: str | None = None
                  ) -> tuple[RunConfig, LabDataModule, MAPCore, Laplace, dict[str, float]]:
    """``load_job`` plus the run's final Laplace fitted again: ``(cfg, datamodule, module, la, metrics)``
    with the ``laplace/...`` metrics of ``fit_posthoc_laplace`` (log marglik and its terms)."""
    from laplace_lab.training.posthoc import fit_posthoc_laplace

    run, datamodule, module = load_job(job, data_dir)
    la, metrics = fit_posthoc_laplace(run, module, datamodule)
    return run, datamodule, module, la, metrics
